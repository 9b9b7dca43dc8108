//! `[schema_registry]`: where the Avro schemas are registered.

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[schema_registry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    pub url: String,
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
        Ok(())
    }
}
