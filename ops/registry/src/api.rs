//! The HTTP API: Confluent Schema Registry's REST routes, as far as this development
//! registry supports them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Mutex;

use crate::compat::Compatibility;
use crate::error::RegistryError;
use crate::registry::{Registration, Registry, VersionSelector};
use crate::schema::{self, ParsedSchema};
use crate::store::Store;

/// The content type of every response.
pub const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// The registry and where it is kept. Changes are made on a copy, saved, and only then
/// become visible, so a failed save changes nothing.
pub struct AppState {
    registry: Mutex<Registry>,
    store: Store,
}

impl AppState {
    pub fn new(registry: Registry, store: Store) -> Self {
        AppState {
            registry: Mutex::new(registry),
            store,
        }
    }

    /// Applies `change` to a copy of the registry and saves it; `change` says whether it
    /// changed anything (nothing is written otherwise).
    async fn update<T>(
        &self,
        change: impl FnOnce(&mut Registry) -> Result<(T, bool), RegistryError>,
    ) -> Result<T, RegistryError> {
        let mut current = self.registry.lock().await;
        let mut next = current.clone();
        let (out, changed) = change(&mut next)?;
        if changed {
            self.store.save(&next).await.inspect_err(|e| {
                tracing::error!(error = %e, "saving the registry failed; the change is discarded");
            })?;
            *current = next;
        }
        Ok(out)
    }
}

type Shared = State<Arc<AppState>>;
type ApiResult = Result<Response, RegistryError>;

/// All routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(root))
        .route("/subjects", get(list_subjects))
        .route(
            "/subjects/{subject}",
            axum::routing::post(lookup).delete(delete_subject),
        )
        .route(
            "/subjects/{subject}/versions",
            get(list_versions).post(register),
        )
        .route("/subjects/{subject}/versions/{version}", get(get_version))
        .route(
            "/subjects/{subject}/versions/{version}/schema",
            get(get_version_schema),
        )
        .route("/schemas/ids/{id}", get(schema_by_id))
        .route("/schemas/ids/{id}/schema", get(raw_schema_by_id))
        .route("/schemas/ids/{id}/versions", get(versions_by_id))
        .route("/schemas/ids/{id}/subjects", get(subjects_by_id))
        .route("/config", get(get_global_config).put(put_global_config))
        .route(
            "/config/{subject}",
            get(get_subject_config)
                .put(put_subject_config)
                .delete(delete_subject_config),
        )
        .route(
            "/compatibility/subjects/{subject}/versions",
            axum::routing::post(check_subject),
        )
        .route(
            "/compatibility/subjects/{subject}/versions/{version}",
            axum::routing::post(check_version),
        )
        .fallback(|| async { RegistryError::RouteNotFound })
        .method_not_allowed_fallback(|| async { RegistryError::MethodNotAllowed })
        .with_state(state)
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, "request refused");
        }
        let body = json!({ "error_code": self.error_code(), "message": self.to_string() });
        reply(status, &body)
    }
}

fn reply<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut response = (status, bytes).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            response
        }
        Err(e) => {
            RegistryError::Unprocessable(format!("cannot encode response: {e}")).into_response()
        }
    }
}

fn ok<T: Serialize>(body: &T) -> ApiResult {
    Ok(reply(StatusCode::OK, body))
}

/// `Path`, with Confluent-shaped errors.
struct ApiPath<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = RegistryError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| ApiPath(value))
            .map_err(|e| RegistryError::Unprocessable(e.body_text()))
    }
}

/// Query flags such as `deleted=true`; anything but `true` is false.
struct Flags(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Flags {
    type Rejection = RegistryError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map(|Query(map)| Flags(map))
            .map_err(|e| RegistryError::Unprocessable(e.body_text()))
    }
}

impl Flags {
    fn get(&self, name: &str) -> bool {
        self.0
            .get(name)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }
}

/// Parses a JSON body whatever its declared content type, so that both
/// `application/vnd.schemaregistry.v1+json` and `application/json` (and a bare `curl -d`) work.
fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, RegistryError> {
    serde_json::from_slice(body)
        .map_err(|e| RegistryError::Unprocessable(format!("the request body is not valid: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchemaRequest {
    schema: String,
    #[serde(default)]
    schema_type: Option<String>,
    #[serde(default)]
    references: Option<Vec<serde_json::Value>>,
}

/// Reads and parses the schema in a request body.
fn schema_from(body: &Bytes) -> Result<ParsedSchema, RegistryError> {
    let request: SchemaRequest = json_body(body)?;
    if let Some(kind) = request.schema_type.as_deref() {
        if !kind.eq_ignore_ascii_case("AVRO") {
            return Err(RegistryError::InvalidSchema(format!(
                "schema type '{kind}' is not supported by this development registry (AVRO only)"
            )));
        }
    }
    if request.references.as_ref().is_some_and(|r| !r.is_empty()) {
        return Err(RegistryError::InvalidSchema(
            "schema references are not supported by this development registry".to_owned(),
        ));
    }
    schema::parse(&request.schema).map_err(|e| RegistryError::InvalidSchema(e.0))
}

fn subject_name(subject: String) -> Result<String, RegistryError> {
    if subject.is_empty() || subject.chars().any(char::is_control) {
        return Err(RegistryError::Unprocessable(format!(
            "invalid subject name {subject:?}"
        )));
    }
    Ok(subject)
}

fn schema_id(id: &str) -> Result<u32, RegistryError> {
    id.parse()
        .map_err(|_| RegistryError::SchemaIdNotFound(id.to_owned()))
}

async fn root() -> ApiResult {
    ok(&json!({}))
}

async fn register(State(app): Shared, ApiPath(subject): ApiPath<String>, body: Bytes) -> ApiResult {
    let subject = subject_name(subject)?;
    let parsed = schema_from(&body)?;
    let outcome = app
        .update(|registry| {
            let outcome = registry.register(&subject, &parsed)?;
            Ok((outcome, matches!(outcome, Registration::Added { .. })))
        })
        .await
        .inspect_err(|e| {
            if let RegistryError::Incompatible { level, .. } = e {
                tracing::info!(%subject, %level, "refused an incompatible schema");
            }
        })?;
    match outcome {
        Registration::Added { id, version } => {
            tracing::info!(%subject, version, id, "registered a new schema version");
            tracing::debug!(%subject, canonical = parsed.identity.canonical(), "registered schema");
        }
        Registration::Existing { id, version } => {
            tracing::debug!(%subject, version, id, "schema already registered");
        }
    }
    ok(&json!({ "id": outcome.id() }))
}

async fn lookup(
    State(app): Shared,
    ApiPath(subject): ApiPath<String>,
    flags: Flags,
    body: Bytes,
) -> ApiResult {
    let parsed = schema_from(&body)?;
    let registry = app.registry.lock().await;
    ok(&registry.lookup(&subject, &parsed, flags.get("deleted"))?)
}

async fn delete_subject(
    State(app): Shared,
    ApiPath(subject): ApiPath<String>,
    flags: Flags,
) -> ApiResult {
    let permanent = flags.get("permanent");
    let versions = app
        .update(|registry| Ok((registry.delete_subject(&subject, permanent)?, true)))
        .await?;
    tracing::info!(%subject, permanent, ?versions, "deleted subject");
    ok(&versions)
}

async fn list_subjects(State(app): Shared, flags: Flags) -> ApiResult {
    let registry = app.registry.lock().await;
    ok(&registry.subject_names(flags.get("deleted")))
}

async fn list_versions(
    State(app): Shared,
    ApiPath(subject): ApiPath<String>,
    flags: Flags,
) -> ApiResult {
    let registry = app.registry.lock().await;
    ok(&registry.versions(&subject, flags.get("deleted"))?)
}

async fn get_version(
    State(app): Shared,
    ApiPath((subject, version)): ApiPath<(String, String)>,
    flags: Flags,
) -> ApiResult {
    let selector: VersionSelector = version.parse()?;
    let registry = app.registry.lock().await;
    ok(&registry.version(&subject, selector, flags.get("deleted"))?)
}

async fn get_version_schema(
    State(app): Shared,
    ApiPath((subject, version)): ApiPath<(String, String)>,
    flags: Flags,
) -> ApiResult {
    let selector: VersionSelector = version.parse()?;
    let registry = app.registry.lock().await;
    let info = registry.version(&subject, selector, flags.get("deleted"))?;
    raw_schema(info.schema)
}

/// A schema's own JSON as the body (the `/schema` routes).
fn raw_schema(text: String) -> ApiResult {
    let mut response = (StatusCode::OK, text).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Ok(response)
}

async fn schema_by_id(State(app): Shared, ApiPath(id): ApiPath<String>) -> ApiResult {
    let id = schema_id(&id)?;
    let registry = app.registry.lock().await;
    ok(&json!({ "schema": registry.schema_text(id)? }))
}

async fn raw_schema_by_id(State(app): Shared, ApiPath(id): ApiPath<String>) -> ApiResult {
    let id = schema_id(&id)?;
    let registry = app.registry.lock().await;
    raw_schema(registry.schema_text(id)?.to_owned())
}

async fn versions_by_id(
    State(app): Shared,
    ApiPath(id): ApiPath<String>,
    flags: Flags,
) -> ApiResult {
    let id = schema_id(&id)?;
    let registry = app.registry.lock().await;
    let usages: Vec<_> = registry
        .usages(id, flags.get("deleted"))?
        .into_iter()
        .map(|(subject, version)| json!({ "subject": subject, "version": version }))
        .collect();
    ok(&usages)
}

async fn subjects_by_id(
    State(app): Shared,
    ApiPath(id): ApiPath<String>,
    flags: Flags,
) -> ApiResult {
    let id = schema_id(&id)?;
    let registry = app.registry.lock().await;
    let mut subjects: Vec<String> = registry
        .usages(id, flags.get("deleted"))?
        .into_iter()
        .map(|(subject, _)| subject)
        .collect();
    subjects.dedup();
    ok(&subjects)
}

#[derive(Deserialize)]
struct ConfigRequest {
    #[serde(alias = "compatibilityLevel")]
    compatibility: String,
}

fn level_from(body: &Bytes) -> Result<Compatibility, RegistryError> {
    let request: ConfigRequest = json_body(body)?;
    request
        .compatibility
        .parse()
        .map_err(|_| RegistryError::InvalidCompatibility(request.compatibility))
}

/// `GET /config` answers with Confluent's `compatibilityLevel` and, for symmetry with `PUT`,
/// `compatibility`.
fn config_reply(level: Compatibility) -> ApiResult {
    ok(&json!({ "compatibilityLevel": level, "compatibility": level }))
}

async fn get_global_config(State(app): Shared) -> ApiResult {
    let registry = app.registry.lock().await;
    config_reply(registry.global_compatibility())
}

async fn put_global_config(State(app): Shared, body: Bytes) -> ApiResult {
    let level = level_from(&body)?;
    app.update(|registry| {
        let changed = registry.global_compatibility() != level;
        registry.set_global_compatibility(level);
        Ok(((), changed))
    })
    .await?;
    tracing::info!(%level, "set global compatibility");
    ok(&json!({ "compatibility": level }))
}

async fn get_subject_config(
    State(app): Shared,
    ApiPath(subject): ApiPath<String>,
    flags: Flags,
) -> ApiResult {
    let registry = app.registry.lock().await;
    match registry.subject_compatibility(&subject) {
        Some(level) => config_reply(level),
        None if flags.get("defaultToGlobal") => config_reply(registry.global_compatibility()),
        None => Err(RegistryError::SubjectCompatibilityNotConfigured(subject)),
    }
}

async fn put_subject_config(
    State(app): Shared,
    ApiPath(subject): ApiPath<String>,
    body: Bytes,
) -> ApiResult {
    let subject = subject_name(subject)?;
    let level = level_from(&body)?;
    app.update(|registry| {
        let changed = registry.subject_compatibility(&subject) != Some(level);
        registry.set_subject_compatibility(&subject, level);
        Ok(((), changed))
    })
    .await?;
    tracing::info!(%subject, %level, "set subject compatibility");
    ok(&json!({ "compatibility": level }))
}

async fn delete_subject_config(State(app): Shared, ApiPath(subject): ApiPath<String>) -> ApiResult {
    let previous = app
        .update(|registry| Ok((registry.clear_subject_compatibility(&subject)?, true)))
        .await?;
    tracing::info!(%subject, "removed subject compatibility");
    config_reply(previous)
}

fn compatibility_reply(messages: Vec<String>) -> ApiResult {
    ok(&json!({ "is_compatible": messages.is_empty(), "messages": messages }))
}

async fn check_subject(
    State(app): Shared,
    ApiPath(subject): ApiPath<String>,
    body: Bytes,
) -> ApiResult {
    let parsed = schema_from(&body)?;
    let registry = app.registry.lock().await;
    compatibility_reply(registry.check_against_subject(&subject, &parsed))
}

async fn check_version(
    State(app): Shared,
    ApiPath((subject, version)): ApiPath<(String, String)>,
    body: Bytes,
) -> ApiResult {
    let selector: VersionSelector = version.parse()?;
    let parsed = schema_from(&body)?;
    let registry = app.registry.lock().await;
    compatibility_reply(registry.check_against_version(&subject, selector, &parsed)?)
}
