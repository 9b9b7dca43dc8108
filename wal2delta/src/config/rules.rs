//! `[rules]`: where the rule set comes from (docs/rules.md).

use std::path::PathBuf;

use serde::Deserialize;

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RulesConfig {
    /// A TOML file of `[[rule]]` tables.
    pub file: Option<PathBuf>,
    /// A rules table in the source database, `schema.table` (not built yet).
    pub table: Option<String>,
}

impl RulesConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(f) = &self.file {
            if !f.is_file() {
                return Err(invalid(
                    "rules.file",
                    format!("{} is not a file", f.display()),
                ));
            }
        }
        if self.table.is_some() {
            return Err(invalid(
                "rules.table",
                "rules from a source table are not built yet; use [rules] file",
            ));
        }
        Ok(())
    }
}
