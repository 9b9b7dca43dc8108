//! `wal2delta-dev-registry`: a **development-only** schema registry.
//!
//! It speaks enough of Confluent Schema Registry's REST API (Avro schemas, subjects,
//! versions, global ids, compatibility levels and checks) for `schema_registry_converter`
//! and for people with curl, and keeps everything in one JSON data file. It exists so that
//! `ops/stack` and the tests can run the pipeline without a JVM. It has only basic
//! authentication (one user, `--basic-auth-file`),
//! no schema references, no Protobuf or JSON Schema, no modes and no clustering: it is not a
//! production registry and must never be run as one.

pub mod api;
pub mod auth;
pub mod compat;
pub mod error;
pub mod registry;
pub mod schema;
pub mod store;

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use api::{router, AppState};
pub use auth::BasicAuth;
pub use error::RegistryError;
pub use store::{Store, StoreError};

/// Loads the data file at `path` (missing: start empty) and returns the server's state.
pub fn open(path: impl Into<PathBuf>) -> Result<Arc<AppState>, StoreError> {
    let store = Store::new(path);
    let registry = store.load()?;
    Ok(Arc::new(AppState::new(registry, store)))
}

/// Serves the API on `listener` until `shutdown` completes, then finishes the requests in
/// flight.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    serve_with(listener, state, None, shutdown).await
}

/// [`serve`], requiring HTTP basic authentication when `auth` is set.
pub async fn serve_with(
    listener: TcpListener,
    state: Arc<AppState>,
    auth: Option<BasicAuth>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let mut app = router(state);
    if let Some(auth) = auth {
        app = app.layer(axum::middleware::from_fn_with_state(
            Arc::new(auth),
            auth::require,
        ));
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
