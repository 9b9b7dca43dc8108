//! Tokenization of sensitive columns before an event leaves the capture process
//! (promise 5).
//!
//! A configured column's value is replaced by `tok1:{key_id}:{hmac}` where `hmac` is the
//! first 128 bits, hex, of HMAC-SHA256 over the value's PostgreSQL text under a secret key.
//! The same value always gives the same token under the same key, so joins and group-bys
//! on tokens still work; without the key a token cannot be reversed or recomputed.
//! `:last4` keeps the last four characters as a suffix (`...:1111`) when the value is
//! longer than eight characters, so short values are never revealed. The key comes from an
//! environment variable or a file, never from the config file; events carry the key id
//! (`token_key_id`) so keys can rotate.
//!
//! Tokenized columns are typed as text in the Avro schema (`pg.type` = `token(<type>)`),
//! in both row images and in the key. Dead letters of such tables carry tokens too.

use std::collections::HashMap;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wal2delta_cdc::decoder::RawRow;
use wal2delta_cdc::value::render_text;
use wal2delta_model::{
    BaseType, Change, ColumnType, ColumnValue, Datum, TableName, TableSchema, TypeKind,
};

use crate::config::{ConfigError, TokenizeConfig};

const KEEP_LAST: usize = 4;

/// One sensitive column.
#[derive(Debug, Clone)]
struct Rule {
    column: String,
    keep_last: bool,
}

/// Replaces sensitive values with keyed deterministic tokens.
pub struct Tokenizer {
    mac: Hmac<Sha256>,
    key_id: String,
    rules: HashMap<TableName, Vec<Rule>>,
    /// Relation OID → (schema as decoded, schema as published).
    views: HashMap<u32, (Arc<TableSchema>, Arc<TableSchema>)>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("key_id", &self.key_id)
            .field("rules", &self.rules)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer, reading the key; `None` when no column is configured.
    pub fn from_config(cfg: &TokenizeConfig) -> Result<Option<Tokenizer>, ConfigError> {
        if cfg.columns.is_empty() {
            return Ok(None);
        }
        let key = cfg.load_key()?;
        let mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|_| ConfigError::Invalid {
            field: "tokenize.key_env/key_file".into(),
            constraint: "holds a key HMAC cannot use".into(),
        })?;
        let mut rules: HashMap<TableName, Vec<Rule>> = HashMap::new();
        for spec in &cfg.columns {
            let Some((table, column, keep_last)) = cfg.entry(spec) else {
                return Err(ConfigError::Invalid {
                    field: "tokenize.columns".into(),
                    constraint: format!(
                        "entry {spec:?} must look like schema.table.column[:last4]"
                    ),
                });
            };
            rules
                .entry(table)
                .or_default()
                .push(Rule { column, keep_last });
        }
        Ok(Some(Tokenizer {
            mac,
            key_id: cfg.key_id.clone(),
            rules,
            views: HashMap::new(),
        }))
    }

    /// The token of one value's text.
    pub fn token(&self, text: &str, keep_last: bool) -> String {
        let mut mac = self.mac.clone();
        mac.update(text.as_bytes());
        let digest = mac.finalize().into_bytes();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        let mut out = format!("tok1:{}:{hex}", self.key_id);
        let chars = text.chars().count();
        if keep_last && chars > 2 * KEEP_LAST {
            out.push(':');
            out.extend(text.chars().skip(chars - KEEP_LAST));
        }
        out
    }

    /// The key id to record in events of `table`, when it has tokenized columns.
    pub fn key_id_for(&self, table: &TableName) -> Option<&str> {
        self.rules
            .contains_key(table)
            .then_some(self.key_id.as_str())
    }

    /// The schema as published: tokenized columns become text.
    pub fn schema(&mut self, decoded: &Arc<TableSchema>) -> Arc<TableSchema> {
        let Some(rules) = self.rules.get(&decoded.table) else {
            return decoded.clone();
        };
        if let Some((orig, view)) = self.views.get(&decoded.relation_oid) {
            if Arc::ptr_eq(orig, decoded) {
                return view.clone();
            }
        }
        let mut view = (**decoded).clone();
        for col in &mut view.columns {
            if rules.iter().any(|r| r.column == col.name) {
                col.ty = ColumnType {
                    oid: 25,
                    typmod: -1,
                    name: format!("token({})", col.ty.name),
                    kind: TypeKind::Base(BaseType::Text),
                };
            }
        }
        let view = Arc::new(view);
        self.views
            .insert(decoded.relation_oid, (decoded.clone(), view.clone()));
        view
    }

    /// Replaces the sensitive values of both row images. `decoded` is the schema the
    /// values were decoded with (its types render the canonical text that is hashed).
    pub fn change(&self, decoded: &TableSchema, change: &mut Change) {
        let Some(rules) = self.rules.get(&decoded.table) else {
            return;
        };
        for (i, col) in decoded.columns.iter().enumerate() {
            let Some(rule) = rules.iter().find(|r| r.column == col.name) else {
                continue;
            };
            for row in [change.before.as_mut(), change.after.as_mut()]
                .into_iter()
                .flatten()
            {
                if let Some(v @ ColumnValue::Value(_)) = row.values.get_mut(i) {
                    if let ColumnValue::Value(d) = v {
                        let text = render_text(&col.ty, d);
                        *v = ColumnValue::Value(Datum::Text(self.token(&text, rule.keep_last)));
                    }
                }
            }
        }
    }

    /// The dead-letter text of a raw row, with sensitive columns tokenized.
    pub fn raw(&self, table: &TableName, raw: &RawRow) -> String {
        let rules = self.rules.get(table);
        raw.render(
            |column, text| match rules.and_then(|r| r.iter().find(|r| r.column == column)) {
                Some(rule) => self.token(text, rule.keep_last),
                None => text.to_owned(),
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        Tokenizer {
            mac: Hmac::<Sha256>::new_from_slice(b"0123456789abcdef0123456789abcdef").unwrap(),
            key_id: "k1".into(),
            rules: HashMap::new(),
            views: HashMap::new(),
        }
    }

    #[test]
    fn tokens_are_deterministic_keyed_and_hide_the_value() {
        let t = tokenizer();
        let a = t.token("4111111111111111", false);
        assert_eq!(a, t.token("4111111111111111", false));
        assert_ne!(a, t.token("4111111111111112", false));
        assert!(a.starts_with("tok1:k1:") && !a.contains("4111"));
        let mut other = tokenizer();
        other.mac = Hmac::<Sha256>::new_from_slice(b"another key of thirty-two bytes!").unwrap();
        assert_ne!(a, other.token("4111111111111111", false));
    }

    #[test]
    fn last_four_only_for_long_values() {
        let t = tokenizer();
        assert!(t.token("4111111111111234", true).ends_with(":1234"));
        assert!(
            !t.token("12345678", true).contains(":5678"),
            "8 characters would reveal half"
        );
    }
}
