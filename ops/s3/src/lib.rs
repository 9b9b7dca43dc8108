//! A DEVELOPMENT S3-compatible object store for `ops/stack` and the tests: the S3
//! protocol from s3s (SigV4, XML, routing) over objects kept as files ([`DirStore`]), with
//! conditional writes that are atomic. Not for production.

mod listing;
mod multipart;
mod service;
mod store;

use std::future::Future;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
use tokio::net::TcpListener;

pub use store::DirStore;

/// Serves `store` on `listener` to clients signing with the one access key, until `stop`
/// completes.
pub async fn serve(
    listener: TcpListener,
    store: DirStore,
    access_key: String,
    secret_key: String,
    stop: impl Future<Output = ()>,
) {
    let service = {
        let mut b = S3ServiceBuilder::new(store);
        b.set_auth(SimpleAuth::from_single(access_key, secret_key));
        b.build()
    };
    let http = ConnBuilder::new(TokioExecutor::new());
    let mut stop = std::pin::pin!(stop);
    loop {
        let socket = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let conn = http
            .serve_connection(TokioIo::new(socket), service.clone())
            .into_owned();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}
