//! TLS settings of a client: which certificate authorities it trusts, its own certificate for
//! mutual TLS, and whether it checks the server's host name; and how they become the redis
//! crate's clients (feature `tls`, on by default: rustls).
//!
//! A `rediss://` URL alone trusts the system's roots. A CA bundle replaces them (a private CA, as
//! the managed services' and most self-hosted TLS setups use). Certificates and keys are read
//! when the client is built, never printed: `Debug` shows where they come from, not what they
//! hold.

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// PEM text given as bytes, or the file that holds it (read by `build()`).
#[derive(Clone)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pem::Bytes(_) => f.write_str("<PEM given>"),
            Pem::File(path) => write!(f, "{}", path.display()),
        }
    }
}

#[cfg_attr(not(feature = "tls"), allow(dead_code))]
impl Pem {
    /// The PEM text; `setting` names it in the error for an unreadable file or one that holds
    /// no `what` (e.g. "CERTIFICATE", "PRIVATE KEY").
    fn read(&self, setting: &'static str, what: &str) -> Result<Vec<u8>> {
        let (bytes, from) = match self {
            Pem::Bytes(b) => (b.clone(), "the PEM given".to_string()),
            Pem::File(path) => (
                std::fs::read(path).map_err(|e| Error::InvalidConfig {
                    setting,
                    reason: format!("cannot read {}: {e}", path.display()),
                })?,
                path.display().to_string(),
            ),
        };
        let text = String::from_utf8_lossy(&bytes);
        if !text.contains("-----BEGIN ") || !text.contains(what) {
            return Err(Error::InvalidConfig {
                setting,
                reason: format!("{from} holds no PEM {what}"),
            });
        }
        Ok(bytes)
    }
}

/// What a client's TLS connections trust and present (see the module's doc).
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsSettings {
    /// Certificate authorities to trust instead of the system's roots.
    pub ca: Option<Pem>,
    /// The client's certificate chain and private key, for servers that ask for one.
    pub client: Option<(Pem, Pem)>,
    /// Skip the host-name check (the certificate must still be signed by a trusted CA).
    pub accept_invalid_hostnames: bool,
}

impl TlsSettings {
    /// Whether anything was set (which needs a TLS URL).
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some() || self.accept_invalid_hostnames
    }

    /// The settings read and checked, as the redis crate takes them.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a file that cannot be read or holds no PEM of its kind;
    /// without the `tls` feature, for any setting at all.
    pub fn resolve(&self) -> Result<Tls> {
        #[cfg(feature = "tls")]
        {
            let ca = match &self.ca {
                Some(pem) => Some(pem.read("tls_ca", "CERTIFICATE")?),
                None => None,
            };
            let client = match &self.client {
                Some((cert, key)) => Some(redis::ClientTlsConfig {
                    client_cert: cert.read("tls_client_cert", "CERTIFICATE")?,
                    client_key: key.read("tls_client_cert", "PRIVATE KEY")?,
                }),
                None => None,
            };
            let certificates =
                (ca.is_some() || client.is_some()).then_some(redis::TlsCertificates {
                    client_tls: client,
                    root_cert: ca,
                });
            Ok(Tls {
                certificates,
                accept_invalid_hostnames: self.accept_invalid_hostnames,
            })
        }
        #[cfg(not(feature = "tls"))]
        {
            if self.is_set() {
                return Err(Error::InvalidConfig {
                    setting: "tls",
                    reason: "fairlock was built without its `tls` feature".into(),
                });
            }
            Ok(Tls {})
        }
    }
}

/// [`TlsSettings`] read and checked.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    #[cfg(feature = "tls")]
    certificates: Option<redis::TlsCertificates>,
    #[cfg(feature = "tls")]
    accept_invalid_hostnames: bool,
}

impl Tls {
    /// A client for `info` (a TLS address or not): with the CA and the client certificate on a
    /// TLS address, and the host-name check as set.
    pub fn client(&self, info: redis::ConnectionInfo) -> redis::RedisResult<redis::Client> {
        let info = info.set_tcp_settings(super::tcp_settings());
        #[cfg(feature = "tls")]
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            install_crypto_provider();
            let client = match &self.certificates {
                Some(certificates) => redis::Client::build_with_tls(info, certificates.clone())?,
                None => redis::Client::open(info)?,
            };
            if !self.accept_invalid_hostnames {
                return Ok(client);
            }
            let info = client.get_connection_info().clone();
            let mut addr = info.addr().clone();
            addr.set_danger_accept_invalid_hostnames(true);
            return redis::Client::open(info.set_addr(addr));
        }
        redis::Client::open(info)
    }

    /// The certificates, for the redis crate's Cluster and Sentinel clients.
    #[cfg(feature = "tls")]
    pub fn certificates(&self) -> Option<&redis::TlsCertificates> {
        self.certificates.as_ref()
    }

    /// Whether the host-name check is skipped.
    #[cfg(feature = "tls")]
    pub fn accepts_invalid_hostnames(&self) -> bool {
        self.accept_invalid_hostnames
    }
}

/// rustls needs a process-wide crypto provider; when the application has not installed one
/// (and none can be picked from rustls' features alone, e.g. when another crate enables a
/// second provider), install ring's rather than let the redis crate panic (redis-rs #1812).
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // another thread may install one at the same moment: theirs stays, which is fine
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_sources_but_never_their_contents() {
        let settings = TlsSettings {
            ca: Some(Pem::File("/etc/ssl/private-ca.pem".into())),
            client: Some((
                Pem::Bytes(b"-----BEGIN CERTIFICATE-----cert".to_vec()),
                Pem::Bytes(b"-----BEGIN PRIVATE KEY-----s3cr3t".to_vec()),
            )),
            accept_invalid_hostnames: false,
        };
        let shown = format!("{settings:?}");
        assert!(shown.contains("private-ca.pem"), "{shown}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("BEGIN"),
            "{shown}"
        );
    }

    #[test]
    fn a_file_without_pem_or_missing_is_an_invalid_setting() {
        let dir = std::env::temp_dir().join(format!("fairlock-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        for pem in [
            Pem::File(not_pem.clone()),
            Pem::File(dir.join("missing.pem")),
        ] {
            match pem.read("tls_ca", "CERTIFICATE") {
                Err(Error::InvalidConfig { setting, reason }) => {
                    assert_eq!(setting, "tls_ca");
                    assert!(reason.contains(dir.to_str().unwrap()), "{reason}");
                }
                other => panic!("{other:?}"),
            }
        }
        let key_as_ca = Pem::Bytes(b"-----BEGIN PRIVATE KEY-----\n".to_vec());
        assert!(key_as_ca.read("tls_ca", "CERTIFICATE").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
