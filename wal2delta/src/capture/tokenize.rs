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

    /// Seals `plain` (a snapshot chunk's last key, in clear) for the snapshots topic:
    /// `seal1:{key_id}:{hex(nonce ‖ ciphertext ‖ tag)}`, ChaCha20-Poly1305 under a key
    /// derived from the tokenization secret, bound to `aad` (the record's key) so a sealed
    /// value cannot be moved to another table.
    ///
    /// Why not a token: the snapshot resumes *after* this key (`WHERE key > last`), so it
    /// must come back exactly, and a token cannot be reversed. Why not `ctid` or a row
    /// count: VACUUM FULL, CLUSTER and concurrent deletes move or renumber rows, and a
    /// resumed chunk would skip some.
    pub fn seal(&self, aad: &str, plain: &[u8]) -> Option<String> {
        use ring::aead::{Aad, LessSafeKey, Nonce, NONCE_LEN};
        use ring::rand::{SecureRandom, SystemRandom};
        let key = self.sealing_key()?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut data = plain.to_vec();
        LessSafeKey::new(key)
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .ok()?;
        let hex: String = nonce
            .iter()
            .chain(&data)
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(format!("seal1:{}:{hex}", self.key_id))
    }

    /// Opens what [`Tokenizer::seal`] sealed; `None` under another key (rotated) or for
    /// anything altered.
    pub fn open(&self, aad: &str, sealed: &str) -> Option<Vec<u8>> {
        use ring::aead::{Aad, LessSafeKey, Nonce, NONCE_LEN};
        let hex = sealed
            .strip_prefix("seal1:")?
            .strip_prefix(self.key_id.as_str())?
            .strip_prefix(':')?;
        if hex.len() % 2 != 0 || !hex.is_ascii() {
            return None;
        }
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect::<Option<_>>()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, data) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut data = data.to_vec();
        let plain = LessSafeKey::new(self.sealing_key()?)
            .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut data)
            .ok()?;
        Some(plain.to_vec())
    }

    /// A key for [`Tokenizer::seal`], derived from the secret with HMAC under a label
    /// starting with a NUL byte: PostgreSQL text never holds one, so no token (the HMAC of
    /// a value's text) can ever equal the derived key.
    fn sealing_key(&self) -> Option<ring::aead::UnboundKey> {
        let mut mac = self.mac.clone();
        mac.update(b"\0wal2delta/snapshot-progress/v1");
        let key = mac.finalize().into_bytes();
        ring::aead::UnboundKey::new(&ring::aead::CHACHA20_POLY1305, &key).ok()
    }

    /// Whether `table` (`schema.table`, as displayed) has tokenized columns.
    pub fn covers(&self, table: &str) -> bool {
        self.rules.keys().any(|t| t.to_string() == table)
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
    fn change(&self, decoded: &TableSchema, change: &mut Change) {
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
    fn raw(&self, table: &TableName, raw: &RawRow) -> String {
        let rules = self.rules.get(table);
        raw.render(
            |column, text| match rules.and_then(|r| r.iter().find(|r| r.column == column)) {
                Some(rule) => self.token(text, rule.keep_last),
                None => text.to_owned(),
            },
        )
    }
}

/// A value that has been through the tokenizer: what may leave the process. The field is
/// private to this module, so the only way to make one is [`tokenized`] or [`tokenized_raw`],
/// and the publisher accepts nothing else: no new call site can publish a raw value.
#[derive(Debug)]
pub struct Tokenized<'a, T> {
    value: T,
    /// The key id to record in the event (`token_key_id`), when the table has tokenized
    /// columns.
    key_id: Option<&'a str>,
}

impl<T> Tokenized<'_, T> {
    pub fn get(&self) -> &T {
        &self.value
    }

    pub fn key_id(&self) -> Option<&str> {
        self.key_id
    }

    pub fn into_inner(self) -> T {
        self.value
    }
}

/// `change` of a table shaped by `decoded`, its sensitive columns replaced (as is when no
/// tokenizer is configured or the table has no tokenized column).
pub fn tokenized<'a>(
    tokenizer: Option<&'a Tokenizer>,
    decoded: &TableSchema,
    mut change: Change,
) -> Tokenized<'a, Change> {
    let key_id = tokenizer.and_then(|t| {
        t.change(decoded, &mut change);
        t.key_id_for(&decoded.table)
    });
    Tokenized {
        value: change,
        key_id,
    }
}

/// The text of a row that could not be decoded, for a dead letter, tokenized columns
/// replaced.
pub fn tokenized_raw<'a>(
    tokenizer: Option<&'a Tokenizer>,
    table: &TableName,
    raw: &RawRow,
) -> Tokenized<'a, String> {
    match tokenizer {
        Some(t) => Tokenized {
            value: t.raw(table, raw),
            key_id: t.key_id_for(table),
        },
        None => Tokenized {
            value: raw.render(|_, text| text.to_owned()),
            key_id: None,
        },
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
    fn sealed_keys_open_only_under_the_same_key_and_record() {
        let t = tokenizer();
        let sealed = t.seal("slot/public.t", br#"["4111111111111111"]"#).unwrap();
        assert!(sealed.starts_with("seal1:k1:") && !sealed.contains("4111"));
        assert_ne!(
            sealed,
            t.seal("slot/public.t", br#"["4111111111111111"]"#).unwrap()
        );
        assert_eq!(
            t.open("slot/public.t", &sealed).unwrap(),
            br#"["4111111111111111"]"#
        );
        assert!(
            t.open("slot/public.u", &sealed).is_none(),
            "bound to its record"
        );
        let mut other = tokenizer();
        other.mac = Hmac::<Sha256>::new_from_slice(b"another key of thirty-two bytes!").unwrap();
        assert!(other.open("slot/public.t", &sealed).is_none());
        let mut bad = sealed.clone();
        let last = bad.pop().unwrap();
        bad.push(if last == '0' { '1' } else { '0' });
        assert!(
            t.open("slot/public.t", &bad).is_none(),
            "tampering is detected"
        );
        assert!(t.open("slot/public.t", "seal1:k1:zz").is_none());
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
