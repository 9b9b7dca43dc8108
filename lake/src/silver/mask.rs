//! Masking of sensitive columns before anything is written to Silver (promise 5).
//!
//! A policy replaces a column's values in every row image Silver reads (`after`, `before`
//! and `key`), so the raw value never reaches a Silver file, a tombstone or a quarantine
//! record:
//!
//! - `hash`: the first 128 bits, hex, of HMAC-SHA256 under the masking key, over the value's
//!   Arrow text rendering. Deterministic, so joins and `GROUP BY` still work, and allowed
//!   on primary-key columns (distinct values stay distinct).
//! - `redact`: the text `****`.
//! - `keep_last:N`: `****` followed by the last N characters, only when the value is longer
//!   than 2·N characters (short values are fully redacted so they are never revealed).
//! - `null`: NULL, keeping the column's type.
//!
//! NULL stays NULL under every policy. Masked columns other than `null` become `Utf8`.
//! The same [`Masking`] applied to a batch read from the source gives what Silver holds,
//! which is how `reconcile` compares masked columns.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, RecordBatch, StringArray, StructArray,
};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Field, Fields, Schema};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use wal2delta_model::bronze;

/// One column's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskPolicy {
    Hash,
    Redact,
    KeepLast(usize),
    Null,
}

const REDACTED: &str = "****";

impl MaskPolicy {
    /// Parses `hash`, `redact`, `keep_last:N` or `null`.
    pub fn parse(s: &str) -> Result<MaskPolicy, String> {
        match s {
            "hash" => Ok(MaskPolicy::Hash),
            "redact" => Ok(MaskPolicy::Redact),
            "null" => Ok(MaskPolicy::Null),
            _ => match s.strip_prefix("keep_last:").map(str::parse::<usize>) {
                Some(Ok(n)) if (1..=64).contains(&n) => Ok(MaskPolicy::KeepLast(n)),
                _ => Err(format!(
                    "{s:?} is not a masking policy: use hash, redact, keep_last:N (N from 1 to 64) or null"
                )),
            },
        }
    }

    pub fn as_string(&self) -> String {
        match self {
            MaskPolicy::Hash => "hash".into(),
            MaskPolicy::Redact => "redact".into(),
            MaskPolicy::KeepLast(n) => format!("keep_last:{n}"),
            MaskPolicy::Null => "null".into(),
        }
    }
}

/// Why values could not be masked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MaskError(pub String);

/// The masking of one table: a policy per column, and the key `hash` uses.
#[derive(Clone, Default)]
pub struct Masking {
    columns: BTreeMap<String, MaskPolicy>,
    key: Option<Arc<[u8]>>,
}

impl std::fmt::Debug for Masking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masking")
            .field("columns", &self.columns)
            .finish_non_exhaustive()
    }
}

impl Masking {
    /// `key` is required when any column uses `hash`.
    pub fn new(
        columns: BTreeMap<String, MaskPolicy>,
        key: Option<Arc<[u8]>>,
    ) -> Result<Masking, MaskError> {
        if key.is_none() && columns.values().any(|p| *p == MaskPolicy::Hash) {
            return Err(MaskError("the hash policy needs a masking key".into()));
        }
        Ok(Masking { columns, key })
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    pub fn policy(&self, column: &str) -> Option<MaskPolicy> {
        self.columns.get(column).copied()
    }

    /// The policies as recorded in Silver's commit metadata (`{"column": "policy"}`; the
    /// key is never recorded). A change of this value means existing rows were masked
    /// differently.
    pub fn describe(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.columns
                .iter()
                .map(|(c, p)| (c.clone(), serde_json::Value::String(p.as_string())))
                .collect(),
        )
    }

    /// Refuses a policy that would merge distinct keys into one (everything but `hash` on
    /// a primary-key column).
    pub fn check_keys(&self, keys: &[String]) -> Result<(), MaskError> {
        for k in keys {
            match self.policy(k) {
                None | Some(MaskPolicy::Hash) => {}
                Some(p) => {
                    return Err(MaskError(format!(
                        "primary-key column `{k}` has masking policy {}, which would merge distinct keys; only hash may mask a key column",
                        p.as_string()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Masks one column's values.
    pub fn mask_array(&self, column: &str, values: &ArrayRef) -> Result<ArrayRef, MaskError> {
        let Some(policy) = self.policy(column) else {
            return Ok(values.clone());
        };
        if policy == MaskPolicy::Null {
            return Ok(new_null_array(values.data_type(), values.len()));
        }
        let text = cast(values, &DataType::Utf8)
            .map_err(|e| MaskError(format!("column `{column}` cannot be masked: {e}")))?;
        let text = text.as_string::<i32>();
        let out: StringArray = match policy {
            MaskPolicy::Hash => {
                let key = self
                    .key
                    .as_ref()
                    .ok_or_else(|| MaskError("the hash policy needs a masking key".into()))?;
                let mac = Hmac::<Sha256>::new_from_slice(key)
                    .map_err(|_| MaskError("the masking key cannot key HMAC".into()))?;
                text.iter()
                    .map(|v| {
                        v.map(|v| {
                            let mut m = mac.clone();
                            m.update(v.as_bytes());
                            hex(&m.finalize().into_bytes()[..16])
                        })
                    })
                    .collect()
            }
            MaskPolicy::Redact => text.iter().map(|v| v.map(|_| REDACTED)).collect(),
            MaskPolicy::KeepLast(n) => text
                .iter()
                .map(|v| {
                    v.map(|v| {
                        let chars = v.chars().count();
                        if chars > 2 * n {
                            let tail: String = v.chars().skip(chars - n).collect();
                            format!("{REDACTED}{tail}")
                        } else {
                            REDACTED.to_owned()
                        }
                    })
                })
                .collect(),
            MaskPolicy::Null => return Ok(new_null_array(values.data_type(), values.len())),
        };
        Ok(Arc::new(out))
    }

    /// The field a masked column has in Silver.
    fn masked_field(&self, f: &Field) -> Field {
        match self.policy(f.name()) {
            None | Some(MaskPolicy::Null) => f.clone(),
            Some(_) => Field::new(f.name(), DataType::Utf8, true),
        }
    }

    /// Masks the fields of a row-image struct (`after`, `before`, `key`).
    pub fn mask_struct(&self, s: &StructArray) -> Result<StructArray, MaskError> {
        if !s.fields().iter().any(|f| self.policy(f.name()).is_some()) {
            return Ok(s.clone());
        }
        let mut fields = Vec::with_capacity(s.num_columns());
        let mut columns = Vec::with_capacity(s.num_columns());
        for (f, c) in s.fields().iter().zip(s.columns()) {
            fields.push(Arc::new(self.masked_field(f)));
            columns.push(self.mask_array(f.name(), c)?);
        }
        StructArray::try_new(Fields::from(fields), columns, s.nulls().cloned())
            .map_err(|e| MaskError(e.to_string()))
    }

    /// Masks the top-level columns of a flat batch (rows as Silver or the source has them).
    pub fn mask_batch(&self, b: &RecordBatch) -> Result<RecordBatch, MaskError> {
        if !b
            .schema()
            .fields()
            .iter()
            .any(|f| self.policy(f.name()).is_some())
        {
            return Ok(b.clone());
        }
        let schema = b.schema();
        let mut fields = Vec::with_capacity(b.num_columns());
        let mut columns = Vec::with_capacity(b.num_columns());
        for (f, c) in schema.fields().iter().zip(b.columns()) {
            fields.push(self.masked_field(f));
            columns.push(self.mask_array(f.name(), c)?);
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| MaskError(e.to_string()))
    }

    /// Masks the row-image columns (`after`, `before`, `key`) of Bronze rows.
    pub fn mask_bronze(&self, b: &RecordBatch) -> Result<RecordBatch, MaskError> {
        if self.is_empty() {
            return Ok(b.clone());
        }
        let schema = b.schema();
        let mut fields = Vec::with_capacity(b.num_columns());
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(b.num_columns());
        for (f, c) in schema.fields().iter().zip(b.columns()) {
            match (f.name().as_str(), c.as_struct_opt()) {
                (bronze::AFTER | bronze::BEFORE | bronze::KEY, Some(s)) => {
                    let masked = self.mask_struct(s)?;
                    fields.push(Field::new(
                        f.name(),
                        masked.data_type().clone(),
                        f.is_nullable(),
                    ));
                    columns.push(Arc::new(masked));
                }
                _ => {
                    fields.push(f.as_ref().clone());
                    columns.push(c.clone());
                }
            }
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
            .map_err(|e| MaskError(e.to_string()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::Int64Array;

    fn masking(policies: &[(&str, &str)]) -> Masking {
        Masking::new(
            policies
                .iter()
                .map(|(c, p)| (c.to_string(), MaskPolicy::parse(p).unwrap()))
                .collect(),
            Some(Arc::from(&b"0123456789abcdef"[..])),
        )
        .unwrap()
    }

    fn strings(a: &ArrayRef) -> Vec<Option<String>> {
        a.as_string::<i32>()
            .iter()
            .map(|v| v.map(str::to_owned))
            .collect()
    }

    #[test]
    fn policies_replace_every_raw_value_and_keep_nulls() {
        let m = masking(&[
            ("card", "keep_last:4"),
            ("email", "redact"),
            ("ssn", "hash"),
            ("n", "null"),
        ]);
        let card: ArrayRef = Arc::new(StringArray::from(vec![
            Some("4111111111111111"),
            Some("12345678"),
            None,
        ]));
        assert_eq!(
            strings(&m.mask_array("card", &card).unwrap()),
            vec![Some("****1111".into()), Some("****".into()), None]
        );
        let email: ArrayRef = Arc::new(StringArray::from(vec![Some("a@b.c"), None]));
        assert_eq!(
            strings(&m.mask_array("email", &email).unwrap()),
            vec![Some("****".into()), None]
        );
        let ssn: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), Some("x"), Some("y")]));
        let h = strings(&m.mask_array("ssn", &ssn).unwrap());
        assert_eq!(h[0], h[1], "hash is deterministic");
        assert_ne!(h[0], h[2]);
        assert_eq!(h[0].as_ref().unwrap().len(), 32);
        assert!(!h[0].as_ref().unwrap().contains('x'));
        let n: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
        let out = m.mask_array("n", &n).unwrap();
        assert_eq!(out.data_type(), &DataType::Int64);
        assert_eq!(out.null_count(), 2);
        let other: ArrayRef = Arc::new(Int64Array::from(vec![7]));
        assert_eq!(
            m.mask_array("other", &other).unwrap().as_ref(),
            other.as_ref()
        );
    }

    #[test]
    fn a_different_key_gives_different_hashes() {
        let a = masking(&[("c", "hash")]);
        let b = Masking::new(
            [("c".to_string(), MaskPolicy::Hash)].into(),
            Some(Arc::from(&b"another key, 16+ bytes"[..])),
        )
        .unwrap();
        let v: ArrayRef = Arc::new(StringArray::from(vec!["v"]));
        assert_ne!(
            strings(&a.mask_array("c", &v).unwrap()),
            strings(&b.mask_array("c", &v).unwrap())
        );
    }

    #[test]
    fn parse_refuses_unknown_policies_and_keys_refuse_lossy_policies() {
        assert!(MaskPolicy::parse("keep_last:0").is_err());
        assert!(MaskPolicy::parse("blur").is_err());
        assert_eq!(
            MaskPolicy::parse("keep_last:4"),
            Ok(MaskPolicy::KeepLast(4))
        );
        assert!(Masking::new([("c".to_string(), MaskPolicy::Hash)].into(), None).is_err());
        let m = masking(&[("id", "redact"), ("h", "hash")]);
        assert!(m.check_keys(&["id".into()]).is_err());
        assert!(m.check_keys(&["h".into()]).is_ok());
    }
}
