//! `[schema_registry]`: where the Avro schemas are registered, and how to reach it (HTTP
//! basic authentication, the CAs trusted for `https://`).

use std::path::PathBuf;

use serde::Deserialize;
use wal2delta_stream::registry_connection::RegistryConnection;

use super::{invalid, secret, ConfigError};

/// `[schema_registry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    pub url: String,
    /// HTTP basic authentication (Confluent Cloud: the API key; its secret is the password).
    pub username: Option<String>,
    /// The environment variable holding the password (or `password_file`).
    pub password_env: Option<String>,
    /// A file whose first line is the password.
    pub password_file: Option<PathBuf>,
    /// PEM file of the certificate authorities trusted for an `https://` URL, added to the
    /// system's.
    pub ca_file: Option<PathBuf>,
}

impl SchemaRegistryConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let url = &self.url;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
            return Err(invalid(
                "schema_registry.url",
                "must be an http:// or https:// URL",
            ));
        }
        if url.contains('@') {
            return Err(invalid(
                "schema_registry.url",
                "must not carry credentials: set username and password_env or password_file",
            ));
        }
        let password_set = self.password_env.is_some() || self.password_file.is_some();
        if self.username.is_some() != password_set {
            return Err(invalid(
                "schema_registry.username",
                "and a password (password_env or password_file) go together",
            ));
        }
        if self.ca_file.is_some() && !url.starts_with("https://") {
            return Err(invalid(
                "schema_registry.ca_file",
                "is used only with an https:// url",
            ));
        }
        self.connection()?;
        Ok(())
    }

    /// The connection, its password and CA file read from their sources.
    pub fn connection(&self) -> Result<RegistryConnection, ConfigError> {
        let mut c = RegistryConnection::plain(&self.url);
        if let (Some(user), Some(password)) = (
            &self.username,
            secret::load_password(
                "schema_registry.password",
                self.password_env.as_deref(),
                self.password_file.as_deref(),
            )?,
        ) {
            c = c.with_basic_auth(user, password);
        }
        if let Some(path) = &self.ca_file {
            let pem = std::fs::read(path).map_err(|e| {
                invalid(
                    "schema_registry.ca_file",
                    format!("cannot be read ({}): {e}", path.display()),
                )
            })?;
            c = c.with_ca_pem(pem);
        }
        Ok(c)
    }
}
