//! `[lake]`: where the Delta tables live.

use serde::Deserialize;

use super::{invalid, ConfigError};

/// `[lake]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LakeConfig {
    pub uri: String,
}

impl LakeConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.uri.starts_with("file:///") {
            return Err(invalid(
                "lake.uri",
                "must be a file:///absolute/path URI (object stores such as s3:// are not built into this release)",
            ));
        }
        Ok(())
    }
}
