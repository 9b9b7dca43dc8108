//! A small TCP proxy for fault injection (the chaos suite, docs/reliability.md): it
//! forwards every connection it accepts to one upstream address, and on demand cuts every
//! open connection at once, or stalls (keeps accepting and reading, forwards nothing) for a
//! while. Runs on the caller's tokio runtime; dropping the [`Proxy`] stops it and closes
//! its connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// Bumped by every cut; connections end when it changes.
    cuts: watch::Sender<u64>,
    /// Forwarding resumes at this instant (milliseconds on the proxy's clock); 0: not
    /// stalled.
    stalled_until_ms: Arc<AtomicU64>,
    clock: tokio::time::Instant,
    accept: JoinHandle<()>,
    /// Connections accepted so far.
    accepted: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards to `upstream` (host:port).
    pub async fn start(upstream: String) -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cuts, _) = watch::channel(0u64);
        let stalled_until_ms = Arc::new(AtomicU64::new(0));
        let clock = tokio::time::Instant::now();
        let accepted = Arc::new(AtomicU64::new(0));
        let cuts_rx = cuts.subscribe();
        let stall = stalled_until_ms.clone();
        let count = accepted.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                let upstream = upstream.clone();
                // Cuts before this connection are not its business.
                let mut cut = cuts_rx.clone();
                cut.borrow_and_update();
                let stall = stall.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return; // the client sees its connection closed
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = tokio::spawn(pipe(cr, sw, cut.clone(), stall.clone(), clock));
                    let down = tokio::spawn(pipe(sr, cw, cut, stall, clock));
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(Proxy {
            port,
            cuts,
            stalled_until_ms,
            clock,
            accept,
            accepted,
        })
    }

    /// Closes every open connection (new ones are accepted as before).
    pub fn cut(&self) {
        self.cuts.send_modify(|g| *g += 1);
    }

    /// Forwards nothing for `d`: bytes read meanwhile are held, then forwarded.
    pub fn stall(&self, d: Duration) {
        let until = self.clock.elapsed() + d;
        self.stalled_until_ms
            .store(until.as_millis() as u64, Ordering::Relaxed);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Copies one direction until EOF, an error, or a cut; holds bytes while stalled.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<u64>,
    stall: Arc<AtomicU64>,
    clock: tokio::time::Instant,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = cut.changed() => return,
        };
        loop {
            let until = stall.load(Ordering::Relaxed);
            let now = clock.elapsed().as_millis() as u64;
            if until <= now {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis((until - now).min(200))) => {}
                _ = cut.changed() => return,
            }
        }
        tokio::select! {
            r = to.write_all(&buf[..n]) => if r.is_err() { break },
            _ = cut.changed() => return,
        }
    }
    let _ = to.shutdown().await;
}
