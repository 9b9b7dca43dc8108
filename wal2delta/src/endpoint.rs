//! The daemon's HTTP listener (`[metrics] listen`):
//!
//! - `/metrics`: the Prometheus text of every metric;
//! - `/healthz`: liveness, 200 while the process serves requests;
//! - `/readyz`: readiness, 200 when every stage runs without repeated failures, else 503;
//!   the body (JSON) gives each stage's state, its last error and, for a stopped stage,
//!   the fix ([`crate::supervisor::stages`]);
//! - any other path: 404 with the list of these, so a mistyped probe fails instead of
//!   passing on the metrics text.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::supervisor::Stages;

/// How often histograms are folded into their summaries (what `install()` of the
/// exporter would schedule).
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the metrics recorder and serves the endpoints until the process ends.
pub async fn serve(addr: SocketAddr, stages: Stages) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr} ([metrics] listen): {e}"))?;
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::debug!(error = %e, "metrics listener: accept failed");
                    continue;
                }
            };
            let (handle, stages) = (handle.clone(), stages.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let (handle, stages) = (handle.clone(), stages.clone());
                    async move { Ok::<_, Infallible>(respond(&req, &handle, &stages).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "metrics listener: connection failed");
                }
            });
        }
    });
    Ok(())
}

async fn respond(
    req: &Request<Incoming>,
    handle: &PrometheusHandle,
    stages: &Stages,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match req.uri().path() {
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => {
            let doc = stages.to_json();
            let status = if doc["ready"] == true {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (status, "application/json", format!("{doc:#}\n"))
        }
        "/metrics" => {
            let handle = handle.clone();
            let text = tokio::task::spawn_blocking(move || handle.render())
                .await
                .unwrap_or_default();
            (StatusCode::OK, "text/plain; version=0.0.4", text)
        }
        other => (
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no such path: {other}; this listener serves /metrics, /healthz and /readyz\n"),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
