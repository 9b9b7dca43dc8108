//! TLS to PostgreSQL with libpq's semantics, for the query and the replication connection.
//!
//! The DSN's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` mean what they mean to libpq:
//!
//! | sslmode | TLS | chain checked against `sslrootcert` | host name checked |
//! | --- | --- | --- | --- |
//! | `disable` | never | - | - |
//! | `prefer` (default) | if the server offers it, else plain | only if `sslrootcert` is set | no |
//! | `require` | always; refused without | only if `sslrootcert` is set | no |
//! | `verify-ca` | always | yes | no |
//! | `verify-full` | always | yes | yes (subjectAltName DNS or IP, else CN) |
//!
//! Invariant: when a chain is checked, only the certificates in `sslrootcert` are trusted
//! (never the system store as well), except with `sslrootcert=system`, which trusts the
//! system store alone and, as in libpq 16, is allowed with `verify-full` only.
//!
//! Built on OpenSSL, the library libpq uses and one the binary already links (reqwest's
//! native-tls), through `postgres-openssl` for tokio-postgres and `tokio-openssl` for the
//! hand-written replication connection.

use std::path::{Path, PathBuf};
use std::pin::Pin;

use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslRef, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::CdcError;

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(value: &str) -> Result<Self, CdcError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's `allow` tries plain first: a downgrade wal2delta does not offer.
            other => {
                return Err(CdcError::Dsn(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            )))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a server without TLS is refused.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

/// Where trusted root certificates come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's trust store.
    System,
}

/// The TLS settings of a DSN, as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    pub root_cert: Option<RootCert>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// [`TlsSettings`] checked and with their files loaded: what a connection needs.
#[derive(Clone)]
pub struct Tls {
    pub settings: TlsSettings,
    /// `None` with `sslmode=disable`.
    connector: Option<SslConnector>,
    verify_host: bool,
}

impl Tls {
    /// Checks the settings against each other and loads the certificate files, so a bad
    /// path or a wrong key fails once, at startup, naming the DSN parameter.
    pub fn load(settings: TlsSettings) -> Result<Self, CdcError> {
        let verify_chain = matches!(settings.mode, SslMode::VerifyCa | SslMode::VerifyFull)
            || (settings.mode != SslMode::Disable && settings.root_cert.is_some());
        let verify_host = settings.mode == SslMode::VerifyFull;
        if settings.root_cert == Some(RootCert::System) && settings.mode != SslMode::VerifyFull {
            return Err(CdcError::Dsn(format!(
                "sslrootcert=system needs sslmode=verify-full (not {}): a public CA signs certificates for anyone, so only the host name check makes it safe",
                settings.mode.as_str()
            )));
        }
        if verify_chain && settings.root_cert.is_none() {
            return Err(CdcError::Dsn(format!(
                "sslmode={} needs sslrootcert: name the CA file that signed the server's certificate (RDS: global-bundle.pem; Cloud SQL: the instance's server-ca.pem), or sslrootcert=system for a publicly signed server",
                settings.mode.as_str()
            )));
        }
        if settings.client_cert.is_some() != settings.client_key.is_some() {
            return Err(CdcError::Dsn(
                "sslcert and sslkey go together: name both the client certificate and its key"
                    .into(),
            ));
        }
        if settings.mode == SslMode::Disable {
            return Ok(Tls {
                settings,
                connector: None,
                verify_host,
            });
        }
        let ssl = |what: &str, e: openssl::error::ErrorStack| {
            CdcError::Dsn(format!("{what}: {}", first_reason(&e)))
        };
        let mut builder = SslConnector::builder(SslMethod::tls_client())
            .map_err(|e| ssl("cannot set up TLS", e))?;
        match &settings.root_cert {
            Some(RootCert::File(path)) => {
                let pem = read(path, "sslrootcert")?;
                let certs = X509::stack_from_pem(&pem)
                    .map_err(|e| ssl(&format!("sslrootcert={}", path.display()), e))?;
                if certs.is_empty() {
                    return Err(CdcError::Dsn(format!(
                        "sslrootcert={} holds no PEM certificate",
                        path.display()
                    )));
                }
                let mut store = X509StoreBuilder::new().map_err(|e| ssl("sslrootcert", e))?;
                for cert in certs {
                    store
                        .add_cert(cert)
                        .map_err(|e| ssl(&format!("sslrootcert={}", path.display()), e))?;
                }
                // Replaces the system store SslConnector::builder loaded: only this CA.
                builder.set_cert_store(store.build());
            }
            Some(RootCert::System) | None => {}
        }
        builder.set_verify(if verify_chain {
            SslVerifyMode::PEER
        } else {
            SslVerifyMode::NONE
        });
        if let (Some(cert), Some(key)) = (&settings.client_cert, &settings.client_key) {
            read(cert, "sslcert")?;
            read(key, "sslkey")?;
            builder
                .set_certificate_chain_file(cert)
                .map_err(|e| ssl(&format!("sslcert={}", cert.display()), e))?;
            builder
                .set_private_key_file(key, SslFiletype::PEM)
                .map_err(|e| {
                    ssl(
                        &format!("sslkey={} (an unencrypted PEM key)", key.display()),
                        e,
                    )
                })?;
            builder.check_private_key().map_err(|e| {
                ssl(
                    &format!(
                        "sslkey={} is not the key of sslcert={}",
                        key.display(),
                        cert.display()
                    ),
                    e,
                )
            })?;
        }
        Ok(Tls {
            settings,
            connector: Some(builder.build()),
            verify_host,
        })
    }

    pub fn mode(&self) -> SslMode {
        self.settings.mode
    }

    /// The connector for tokio-postgres (the query connection), or `None` to connect
    /// without TLS.
    pub fn make_connector(&self) -> Option<postgres_openssl::MakeTlsConnector> {
        let connector = self.connector.clone()?;
        let mut make = postgres_openssl::MakeTlsConnector::new(connector);
        let verify_host = self.verify_host;
        make.set_callback(move |config, _host| {
            config.set_verify_hostname(verify_host);
            Ok(())
        });
        Some(make)
    }

    /// Runs the TLS handshake on a socket whose SSLRequest the server accepted.
    pub(crate) async fn handshake(
        &self,
        socket: TcpStream,
        host: &str,
        target: &str,
    ) -> Result<SslStream<TcpStream>, CdcError> {
        let Some(connector) = &self.connector else {
            return Err(CdcError::Protocol(
                "TLS handshake with sslmode=disable".into(),
            ));
        };
        let setup = |e: openssl::error::ErrorStack| self.failure(target, host, &first_reason(&e));
        let mut config = connector.configure().map_err(setup)?;
        config.set_verify_hostname(self.verify_host);
        let ssl = config.into_ssl(host).map_err(setup)?;
        let mut stream = SslStream::new(ssl, socket).map_err(setup)?;
        if let Err(e) = Pin::new(&mut stream).connect().await {
            let verify = stream.ssl().verify_result();
            // The network failing mid-handshake is transient, not a TLS setting to fix.
            if verify.as_raw() == 0 {
                if let Some(io) = e.io_error() {
                    return Err(CdcError::Connect {
                        target: target.to_owned(),
                        source: std::io::Error::new(io.kind(), io.to_string()),
                    });
                }
            }
            let detail = if verify.as_raw() != 0 {
                verify.error_string().to_owned()
            } else {
                e.ssl_error()
                    .map(first_reason)
                    .unwrap_or_else(|| e.to_string())
            };
            return Err(self.failure(target, host, &detail));
        }
        Ok(stream)
    }

    /// A handshake failure, with what it means and the fix in the DSN's own terms.
    /// `detail` is OpenSSL's reason (e.g. its certificate verification result).
    pub fn failure(&self, target: &str, host: &str, detail: &str) -> CdcError {
        let mode = self.settings.mode.as_str();
        let root = match &self.settings.root_cert {
            Some(RootCert::File(p)) => p.display().to_string(),
            Some(RootCert::System) => "system".into(),
            None => "(not set)".into(),
        };
        let fix = if detail.contains("hostname mismatch") || detail.contains("IP address mismatch")
        {
            format!("the server's certificate does not name host {host:?} (sslmode=verify-full checks it): connect with a host name the certificate lists in its subjectAltName, or use sslmode=verify-ca to check the CA only")
        } else if detail.contains("local issuer")
            || detail.contains("self-signed")
            || detail.contains("self signed")
            || detail.contains("unable to get issuer")
            || detail.contains("certificate signature failure")
        {
            format!("the server's certificate is not signed by a CA in sslrootcert={root} (sslmode={mode}): set sslrootcert to the CA that signed it (RDS: global-bundle.pem from AWS; Cloud SQL: the instance's server-ca.pem)")
        } else if detail.contains("expired") || detail.contains("not yet valid") {
            "the server's certificate is outside its validity period: renew it, and check this host's clock".to_owned()
        } else {
            format!("check sslmode={mode}, sslrootcert={root}, sslcert and sslkey in [source] dsn and the server's ssl settings")
        };
        CdcError::Tls {
            target: target.to_owned(),
            message: format!("{detail}; {fix}"),
        }
    }
}

/// The `tls-server-end-point` channel binding (RFC 5929): a hash of the server's
/// certificate with its signature's digest, SHA-256 for MD5 and SHA-1.
pub(crate) fn server_end_point(ssl: &SslRef) -> Option<Vec<u8>> {
    let cert = ssl.peer_certificate()?;
    let algorithms = cert
        .signature_algorithm()
        .object()
        .nid()
        .signature_algorithms()?;
    let digest = match algorithms.digest {
        Nid::MD5 | Nid::SHA1 => MessageDigest::sha256(),
        nid => MessageDigest::from_nid(nid)?,
    };
    cert.digest(digest).ok().map(|d| d.to_vec())
}

fn read(path: &Path, param: &str) -> Result<Vec<u8>, CdcError> {
    std::fs::read(path)
        .map_err(|e| CdcError::Dsn(format!("{param}={} cannot be read: {e}", path.display())))
}

/// OpenSSL's first reason, without the library's error-code prefix.
fn first_reason(e: &openssl::error::ErrorStack) -> String {
    e.errors()
        .first()
        .map(|err| {
            err.reason()
                .map(str::to_owned)
                .unwrap_or_else(|| err.to_string())
        })
        .unwrap_or_else(|| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(mode: SslMode, root: Option<RootCert>, cert: bool, key: bool) -> Result<Tls, CdcError> {
        Tls::load(TlsSettings {
            mode,
            root_cert: root,
            client_cert: cert.then(|| "/nonexistent/client.crt".into()),
            client_key: key.then(|| "/nonexistent/client.key".into()),
        })
    }

    fn message(r: Result<Tls, CdcError>) -> String {
        match r {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn settings_that_cannot_work_are_refused_naming_the_parameter() {
        let e = message(load(SslMode::VerifyCa, None, false, false));
        assert!(e.contains("sslmode=verify-ca needs sslrootcert"), "{e}");
        let e = message(load(SslMode::Require, Some(RootCert::System), false, false));
        assert!(
            e.contains("sslrootcert=system needs sslmode=verify-full"),
            "{e}"
        );
        let e = message(load(SslMode::Require, None, true, false));
        assert!(e.contains("sslcert and sslkey go together"), "{e}");
        let e = message(load(SslMode::Require, None, true, true));
        assert!(
            e.contains("sslcert=/nonexistent/client.crt cannot be read"),
            "{e}"
        );
        let e = message(load(
            SslMode::VerifyFull,
            Some(RootCert::File("/nonexistent/ca.pem".into())),
            false,
            false,
        ));
        assert!(
            e.contains("sslrootcert=/nonexistent/ca.pem cannot be read"),
            "{e}"
        );
    }

    #[test]
    fn modes_without_files_load() {
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require] {
            let tls = load(mode, None, false, false).unwrap();
            assert_eq!(tls.make_connector().is_none(), mode == SslMode::Disable);
        }
        assert!(load(SslMode::VerifyFull, Some(RootCert::System), false, false).is_ok());
    }

    #[test]
    fn failures_point_at_the_fix() {
        let tls = load(SslMode::Require, None, false, false).unwrap();
        let e = tls
            .failure("h:5432/d", "h", "hostname mismatch")
            .to_string();
        assert!(e.contains("sslmode=verify-ca"), "{e}");
        let e = tls
            .failure("h:5432/d", "h", "unable to get local issuer certificate")
            .to_string();
        assert!(
            e.contains("not signed by a CA in sslrootcert=(not set)"),
            "{e}"
        );
        let e = tls
            .failure("h:5432/d", "h", "certificate has expired")
            .to_string();
        assert!(e.contains("validity period"), "{e}");
    }
}
