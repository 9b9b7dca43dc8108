//! `[tokenize]`: sensitive columns replaced by keyed tokens in capture.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use wal2delta_model::TableName;

use super::{invalid, path, secret, ConfigError};

/// `[tokenize]`: sensitive columns replaced by keyed deterministic tokens before any
/// event leaves capture. The key is read from `key_env` or `key_file`, never from here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeConfig {
    /// `schema.table.column`, with `:last4` to keep the last four characters.
    #[serde(default)]
    pub columns: Vec<String>,
    /// Environment variable holding the key (at least 16 bytes).
    #[serde(default)]
    pub key_env: Option<String>,
    /// File holding the key (at least 16 bytes; one trailing newline is ignored).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Identifier of the key, written in every tokenized event; change it when the key
    /// rotates.
    #[serde(default = "TokenizeConfig::default_key_id")]
    pub key_id: String,
}

impl TokenizeConfig {
    fn default_key_id() -> String {
        "k1".into()
    }

    /// Reads the key from the environment or the file.
    pub fn load_key(&self) -> Result<Vec<u8>, ConfigError> {
        secret::load_key(
            "tokenize",
            self.key_env.as_deref(),
            self.key_file.as_deref(),
        )
    }

    /// An entry's table, column and whether it keeps the last four characters; `None`
    /// when it is not `schema.table.column[:last4]` (parts as in [`path`]).
    pub fn entry(&self, spec: &str) -> Option<(TableName, String, bool)> {
        let (p, keep_last) = match spec.strip_suffix(":last4") {
            Some(p) => (p, true),
            None => (spec, false),
        };
        let mut parts = path::parse(p, 3)?;
        let column = parts.pop()?;
        Some((TableName::new(&parts[0], &parts[1]), column, keep_last))
    }

    /// Refuses an entry naming a table or column the source does not publish (`catalog`:
    /// the published tables with their columns): such an entry would tokenize nothing and
    /// raw values would leave capture.
    pub fn check_names(
        &self,
        catalog: &BTreeMap<TableName, Vec<String>>,
    ) -> Result<(), ConfigError> {
        for spec in &self.columns {
            let Some((table, column, _)) = self.entry(spec) else {
                continue; // validate() refused it already
            };
            let Some(columns) = catalog.get(&table) else {
                return Err(invalid(
                    "tokenize.columns",
                    format!("entry {spec:?} names the table {}, which is not among the published tables (a table that does not exist yet is an error too: create it and run `wal2delta setup` first)", table.quoted()),
                ));
            };
            if !columns.contains(&column) {
                return Err(invalid(
                    "tokenize.columns",
                    format!(
                        "entry {spec:?} names the column {}, which the table {} does not have",
                        wal2delta_model::table::quote_ident(&column),
                        table.quoted()
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.columns.is_empty() {
            return Ok(());
        }
        for c in &self.columns {
            if self.entry(c).is_none() {
                return Err(invalid(
                    "tokenize.columns",
                    format!("entry {c:?} must look like schema.table.column[:last4]"),
                ));
            }
        }
        if self.key_id.is_empty()
            || !self
                .key_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "tokenize.key_id",
                "must be non-empty and use only letters, digits, '.', '_' and '-'",
            ));
        }
        self.load_key().map(|_| ())
    }
}
