//! TLS: `rediss://` to a TLS-only redis-server with certificates made at test time. A hand-off
//! works over it; an untrusted, expired or misnamed certificate, a missing client certificate, and
//! a server that does not speak TLS are each a clear error within the connect timeout, never a
//! hang; the command-line tool takes the same settings.

use crate::support::tls as tls_support;

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{queued, RedisServer};
use fairlock::{Error, ErrorKind, LockClient, LockClientBuilder};
use tls_support::{certs, ServerCert, TlsServer};

const CONNECT: Duration = Duration::from_millis(1500);
/// How long a refused connection may take: the connect timeout and a read timeout, plus slack
/// for a loaded 2-core machine.
const REFUSED_WITHIN: Duration = Duration::from_secs(5);

fn trusting_ca(url: &str) -> LockClientBuilder {
    LockClient::builder(url)
        .connect_timeout(CONNECT)
        .read_timeout(CONNECT)
        .tls_ca_file(&certs().ca)
}

/// `builder` fails to build, with a TLS error, soon.
fn refused_tls(builder: LockClientBuilder, what: &str) -> String {
    let started = Instant::now();
    let e = builder.build().expect_err(what);
    let took = started.elapsed();
    assert!(took < REFUSED_WITHIN, "{what}: refused after {took:?}");
    assert!(matches!(e, Error::Tls { .. }), "{what}: {e:?}");
    assert_eq!(e.kind(), ErrorKind::Server, "{what}");
    e.to_string()
}

#[test]
fn a_hand_off_over_tls_between_two_clients_keeps_fifo_and_tokens() {
    let server = TlsServer::start(ServerCert::Good, false);
    let holder = trusting_ca(&server.url()).build().expect("TLS client");
    let waiter_client = trusting_ca(&server.url()).build().unwrap();
    let lock = holder.fair_lock("tls-hand-off").unwrap();
    let held = lock.lock().unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let lock = waiter_client.fair_lock("tls-hand-off").unwrap();
            let tx = tx.clone();
            let probe = holder.fair_lock("tls-hand-off").unwrap();
            let w = thread::spawn(move || {
                let g = lock.lock().unwrap();
                tx.send((i, g.fencing_token())).unwrap();
                g.unlock().unwrap();
            });
            assert!(
                queued(&probe, i + 1, Duration::from_secs(10)),
                "waiter {i} queued"
            );
            w
        })
        .collect();
    let first = held.fencing_token();
    held.unlock().unwrap();
    let mut served = vec![];
    for _ in 0..3 {
        served.push(rx.recv_timeout(Duration::from_secs(10)).expect("served"));
    }
    for w in waiters {
        w.join().unwrap();
    }
    let order: Vec<usize> = served.iter().map(|s| s.0).collect();
    assert_eq!(order, vec![0, 1, 2], "FIFO over TLS");
    let tokens: Vec<u64> = served.iter().map(|s| s.1).collect();
    assert!(
        tokens[0] > first && tokens.windows(2).all(|w| w[0] < w[1]),
        "{tokens:?}"
    );
    // the server speaks nothing but TLS: a plain URL to its port fails, soon
    let started = Instant::now();
    let plain = LockClient::builder(&format!("redis://127.0.0.1:{}/", server.port))
        .connect_timeout(CONNECT)
        .read_timeout(CONNECT)
        .build();
    assert!(plain.is_err(), "plain text to a TLS port");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}",
        started.elapsed()
    );
    // the server's own view: every connection it had was TLS
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.conn())
        .unwrap();
    assert!(info.contains("total_connections_received:"), "{info}");
}

#[test]
fn a_certificate_the_client_does_not_trust_is_a_tls_error() {
    let server = TlsServer::start(ServerCert::Good, false);
    // another CA, and the system's roots (no CA given): neither signed it
    let text = refused_tls(
        LockClient::builder(&server.url())
            .connect_timeout(CONNECT)
            .read_timeout(CONNECT)
            .tls_ca_file(&certs().other_ca),
        "another CA",
    );
    assert!(text.contains("CA bundle"), "says what to check: {text}");
    refused_tls(
        LockClient::builder(&server.url())
            .connect_timeout(CONNECT)
            .read_timeout(CONNECT),
        "system roots",
    );
}

#[test]
fn an_expired_certificate_is_a_tls_error() {
    let server = TlsServer::start(ServerCert::Expired, false);
    let text = refused_tls(trusting_ca(&server.url()), "expired");
    assert!(text.to_lowercase().contains("expired"), "{text}");
}

#[test]
fn a_certificate_for_another_host_is_refused_unless_host_names_are_not_checked() {
    let server = TlsServer::start(ServerCert::Misnamed, false);
    refused_tls(trusting_ca(&server.url()), "names another host");
    let client = trusting_ca(&server.url())
        .danger_accept_invalid_hostnames(true)
        .build()
        .expect("the host name unchecked, the CA still checked");
    let lock = client.fair_lock("misnamed").unwrap();
    lock.lock().unwrap().unlock().unwrap();
    // not checking the name does not mean trusting any CA
    refused_tls(
        LockClient::builder(&server.url())
            .connect_timeout(CONNECT)
            .read_timeout(CONNECT)
            .tls_ca_file(&certs().other_ca)
            .danger_accept_invalid_hostnames(true),
        "another CA, names unchecked",
    );
}

#[test]
fn mutual_tls_needs_the_client_certificate() {
    let server = TlsServer::start(ServerCert::Good, true);
    // without it the server ends the handshake (TLS 1.3: at the first read)
    let started = Instant::now();
    let e = trusting_ca(&server.url())
        .build()
        .expect_err("no client certificate");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(e, Error::Tls { .. } | Error::Connection { .. }),
        "{e:?}"
    );
    let (cert, key) = &certs().client;
    let client = trusting_ca(&server.url())
        .tls_client_cert_files(cert, key)
        .build()
        .expect("with the client certificate");
    let lock = client.fair_lock("mtls").unwrap();
    let g = lock.lock().unwrap();
    assert!(g.is_held_in_redis().unwrap());
    g.unlock().unwrap();
    // a key that is not one, or a file that is not there: the setting is named
    let e = trusting_ca(&server.url())
        .tls_client_cert_files(cert, cert)
        .build()
        .expect_err("a certificate as the key");
    assert!(
        matches!(
            e,
            Error::InvalidConfig {
                setting: "tls_client_cert",
                ..
            }
        ),
        "{e:?}"
    );
    let e = LockClient::builder(&server.url())
        .tls_ca_file("/nonexistent/ca.pem")
        .build()
        .expect_err("no such file");
    assert!(
        matches!(
            e,
            Error::InvalidConfig {
                setting: "tls_ca",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_server_without_tls_on_a_tls_url_fails_soon_and_tls_settings_need_a_tls_url() {
    let plain = RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}/", plain.port);
    // the server waits for the rest of what it takes for a request: the handshake times out
    let started = Instant::now();
    let e = trusting_ca(&url).build().expect_err("a plain server");
    assert!(
        started.elapsed() < REFUSED_WITHIN,
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(e, Error::Tls { .. } | Error::Connection { .. }) && e.to_string().contains("TLS"),
        "{e}"
    );
    let e = trusting_ca(&plain.url())
        .build()
        .expect_err("TLS settings on redis://");
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e:?}");
    assert!(e.to_string().contains("rediss://"), "{e}");
}

#[test]
fn a_stopped_tls_server_is_a_connection_error_within_the_timeouts() {
    let server = TlsServer::start(ServerCert::Good, false);
    server.signal(libc::SIGSTOP);
    let started = Instant::now();
    let e = trusting_ca(&server.url())
        .build()
        .expect_err("a stopped server");
    let took = started.elapsed();
    server.signal(libc::SIGCONT);
    assert!(took < REFUSED_WITHIN, "{took:?}");
    assert!(e.is_retryable(), "{e:?}");
}

#[test]
fn the_cli_takes_the_ca_and_the_client_certificate() {
    let server = TlsServer::start(ServerCert::Good, true);
    let (cert, key) = &certs().client;
    let bin = env!("CARGO_BIN_EXE_fairlock");
    let out = Command::new(bin)
        .args(["--redis", &server.url(), "--tls-ca"])
        .arg(&certs().ca)
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .args(["run", "--no-wait", "tls-cli", "--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the same from the environment; a wrong CA exits 69 with one line that says TLS
    let out = Command::new(bin)
        .env("FAIRLOCK_REDIS_URL", server.url())
        .env("FAIRLOCK_TLS_CA", &certs().other_ca)
        .env("FAIRLOCK_TLS_CERT", cert)
        .env("FAIRLOCK_TLS_KEY", key)
        .args(["status", "tls-cli"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("fairlock: TLS failed"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
