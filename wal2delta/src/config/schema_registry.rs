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
        if password_set && url.starts_with("http://") {
            tracing::warn!(
                "[schema_registry] sends the basic-auth password unencrypted (an http:// url); use https:// outside a trusted network"
            );
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
            c = c.with_ca_pem(read_ca_file(path)?);
        }
        Ok(c)
    }
}

/// The most a CA file may hold: a system bundle is about 200 KiB. The bound keeps a config
/// naming the wrong file (a device such as `/dev/zero`, a log) from reading without end.
const MAX_CA_FILE_BYTES: u64 = 4 * 1024 * 1024;

fn read_ca_file(path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let field = "schema_registry.ca_file";
    let mut pem = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CA_FILE_BYTES + 1).read_to_end(&mut pem))
        .map_err(|e| invalid(field, format!("cannot be read ({}): {e}", path.display())))?;
    if pem.len() as u64 > MAX_CA_FILE_BYTES {
        return Err(invalid(
            field,
            format!(
                "{} holds more than {MAX_CA_FILE_BYTES} bytes: name a PEM file of certificates",
                path.display()
            ),
        ));
    }
    Ok(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_never_ends_is_refused_and_credentials_go_together() {
        let c = |extra: &str| -> Result<SchemaRegistryConfig, String> {
            let c: SchemaRegistryConfig =
                toml::from_str(&format!("url = \"https://r:8081\"\n{extra}"))
                    .map_err(|e| e.to_string())?;
            c.validate().map(|_| c).map_err(|e| e.to_string())
        };
        let err = c("ca_file = \"/dev/zero\"").unwrap_err();
        assert!(
            err.contains("schema_registry.ca_file") && err.contains("more than"),
            "{err}"
        );
        let err = c("username = \"u\"").unwrap_err();
        assert!(err.contains("schema_registry.username"), "{err}");
        let err = c("password_env = \"PATH\"").unwrap_err();
        assert!(err.contains("schema_registry.username"), "{err}");
        let plain: SchemaRegistryConfig =
            toml::from_str("url = \"http://user:pw@r:8081\"").unwrap();
        let err = plain.validate().unwrap_err().to_string();
        assert!(
            err.contains("schema_registry.url") && !err.contains("pw@"),
            "{err}"
        );
        assert!(c("username = \"u\"\npassword_env = \"PATH\"").is_ok());
    }
}
