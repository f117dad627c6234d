//! TLS for tests: certificates made at test time with `openssl` (and `faketime` for an expired
#![allow(dead_code)]
//! one), and a TLS-only redis-server on loopback.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A CA, certificates it signed for the server (`127.0.0.1` and `localhost`; another host; one
/// expired) and for a client, and a second CA that signed nothing of the server's.
pub struct Certs {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server: (PathBuf, PathBuf),
    pub misnamed: (PathBuf, PathBuf),
    pub expired: (PathBuf, PathBuf),
    pub client: (PathBuf, PathBuf),
}

/// Which certificate a server presents.
#[derive(Clone, Copy, Debug)]
pub enum ServerCert {
    /// Names 127.0.0.1 and localhost.
    Good,
    /// Names only `redis.internal`.
    Misnamed,
    /// Expired in 2020.
    Expired,
}

fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").args(args).current_dir(dir));
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("openssl must be installed");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A key and a certificate signed by `ca` for `san`, valid for a day (from `at`, a faketime
/// date, when given).
fn signed(dir: &Path, ca: &str, name: &str, san: &str, at: Option<&str>) -> (PathBuf, PathBuf) {
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let crt = format!("{name}.crt");
    let ext = format!("{name}.ext");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    std::fs::write(dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
    let sign = [
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &format!("{ca}.crt"),
        "-CAkey",
        &format!("{ca}.key"),
        "-CAcreateserial",
        "-out",
        &crt,
        "-days",
        "1",
        "-extfile",
        &ext,
    ];
    match at {
        None => openssl(dir, &sign),
        Some(at) => {
            // libfaketime preloaded, not the `faketime` wrapper: the wrapper needs a fresh
            // semaphore named after its pid, which a stale one of a killed process can hold
            let lib = crate::support::faketime::libfaketime()
                .expect("libfaketime (Debian's faketime package) must be installed");
            let mut cmd = Command::new("openssl");
            cmd.args(sign)
                .current_dir(dir)
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", format!("@{at}"));
            run(&mut cmd);
        }
    }
    (dir.join(crt), dir.join(key))
}

fn make_ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    dir.join(format!("{name}.crt"))
}

/// The certificates of this test binary, made once.
pub fn certs() -> &'static Certs {
    static CERTS: OnceLock<Certs> = OnceLock::new();
    CERTS.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("fairlock-tls-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        let ca = make_ca(d, "ca");
        let other_ca = make_ca(d, "other-ca");
        let server = signed(d, "ca", "server", "IP:127.0.0.1,DNS:localhost", None);
        let misnamed = signed(d, "ca", "misnamed", "DNS:redis.internal", None);
        let expired = signed(
            d,
            "ca",
            "expired",
            "IP:127.0.0.1,DNS:localhost",
            Some("2020-01-01 00:00:00"),
        );
        let client = signed(d, "ca", "client", "DNS:fairlock-client", None);
        Certs {
            _dir: dir,
            ca,
            other_ca,
            server,
            misnamed,
            expired,
            client,
        }
    })
}

/// The rustls crypto provider the test's own connections use (fairlock installs the same).
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A redis-server that speaks TLS only (`--port 0`).
pub struct TlsServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl TlsServer {
    /// Start one presenting `cert`; `auth_clients`: ask clients for a certificate.
    pub fn start(cert: ServerCert, auth_clients: bool) -> TlsServer {
        Self::start_with(cert, auth_clients, &[])
    }

    pub fn start_with(cert: ServerCert, auth_clients: bool, extra: &[&str]) -> TlsServer {
        install_provider();
        let c = certs();
        let (crt, key) = match cert {
            ServerCert::Good => &c.server,
            ServerCert::Misnamed => &c.misnamed,
            ServerCert::Expired => &c.expired,
        };
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("fairlock-tls-server-")
                .tempdir()
                .unwrap();
            let port = crate::support::free_port();
            let child = Command::new("redis-server")
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .arg("--tls-cert-file")
                .arg(crt)
                .arg("--tls-key-file")
                .arg(key)
                .arg("--tls-ca-cert-file")
                .arg(&c.ca)
                .args([
                    "--tls-auth-clients",
                    if auth_clients { "yes" } else { "no" },
                ])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            let mut server = TlsServer {
                port,
                dir,
                child: Some(child),
            };
            if server.ready() {
                return server;
            }
            server.stop();
        }
        panic!("no TLS redis-server started on 5 ports");
    }

    /// Ready when its log says so (the test's own TLS client may not be trusted by it).
    fn ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            let log =
                std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            if log.contains("Ready to accept connections") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }

    /// An admin connection (TLS, trusting the CA, with the client certificate).
    pub fn conn(&self) -> redis::Connection {
        let c = certs();
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(&c.client.0).unwrap(),
                client_key: std::fs::read(&c.client.1).unwrap(),
            }),
            root_cert: Some(std::fs::read(&c.ca).unwrap()),
        };
        let info = redis::IntoConnectionInfo::into_connection_info(format!(
            "rediss://127.0.0.1:{}/",
            self.port
        ))
        .unwrap();
        let mut addr = info.addr().clone();
        // the misnamed certificate's server is an admin connection's too
        addr.set_danger_accept_invalid_hostnames(true);
        redis::Client::build_with_tls(info.set_addr(addr), certificates)
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap()
    }

    /// Stop (SIGSTOP) or continue (SIGCONT) the server process.
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(child) = &self.child {
            unsafe {
                libc::kill(child.id() as libc::pid_t, sig);
            }
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.signal_child(&child, libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal_child(&self, child: &Child, sig: libc::c_int) {
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
