//! Optional HTTP basic authentication (`--basic-auth-file`), so that wal2delta's
//! `[schema_registry] username`/`password_*` can be tested against this registry the way a
//! hosted registry (Confluent Cloud, Aiven) asks for them. Every route then needs
//! `Authorization: Basic base64(user:password)`; anything else gets 401 in Confluent's
//! error shape.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;

/// The one accepted user and password.
#[derive(Clone)]
pub struct BasicAuth {
    /// `base64(user:password)`, as the header carries it.
    expected: String,
}

impl BasicAuth {
    pub fn new(user: &str, password: &str) -> Self {
        BasicAuth {
            expected: base64::engine::general_purpose::STANDARD
                .encode(format!("{user}:{password}")),
        }
    }

    /// Reads `user:password` from the first line of `text`.
    pub fn parse(text: &str) -> Option<Self> {
        let (user, password) = text.lines().next()?.split_once(':')?;
        (!user.is_empty()).then(|| Self::new(user, password))
    }
}

pub(crate) async fn require(
    State(auth): State<Arc<BasicAuth>>,
    request: Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .map(str::trim);
    if given == Some(auth.expected.as_str()) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"schema-registry\"")],
        Json(serde_json::json!({"error_code": 401, "message": "Unauthorized"})),
    )
        .into_response()
}
