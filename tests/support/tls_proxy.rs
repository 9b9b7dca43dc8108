//! A TLS terminator: accepts TLS with a server certificate and forwards the plain bytes to
//! one upstream address. tansu 0.6 takes `--cert`/`--key` but never uses them, so the Kafka
//! TLS tests put this in front of it (the broker advertises the terminator's port): the
//! client's TLS, certificate checks and SASL run exactly as against a managed service.
//! Dropping it stops accepting and closes its connections.

use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Result;
use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_openssl::SslStream;

pub struct TlsTerminator {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    handshakes: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl TlsTerminator {
    /// Listens on `port` of 127.0.0.1 with `cert`/`key` (PEM) and forwards to `upstream`.
    pub async fn start(port: u16, upstream: String, cert: &Path, key: &Path) -> Result<Self> {
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
        b.set_certificate_chain_file(cert)?;
        b.set_private_key_file(key, SslFiletype::PEM)?;
        b.check_private_key()?;
        let acceptor = Arc::new(b.build());
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let handshakes = Arc::new(AtomicU64::new(0));
        let count = handshakes.clone();
        let accept = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, upstream, count) =
                    (acceptor.clone(), upstream.clone(), count.clone());
                connections.spawn(async move {
                    let Ok(ssl) = Ssl::new(acceptor.context()) else {
                        return;
                    };
                    let Ok(mut tls) = SslStream::new(ssl, client) else {
                        return;
                    };
                    if Pin::new(&mut tls).accept().await.is_err() {
                        return; // a client that refused our certificate
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut server).await;
                });
            }
        });
        Ok(TlsTerminator {
            port,
            handshakes,
            accept,
        })
    }

    /// Connections whose TLS handshake completed.
    pub fn handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }
}

impl Drop for TlsTerminator {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection.
        self.accept.abort();
    }
}
