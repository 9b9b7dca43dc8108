//! Keys with an unresolved Silver quarantine record: left out of the comparison, because
//! Silver deliberately does not hold their latest change.
//!
//! A Silver record (`stage = silver`, `table_name = schema.table`, written when a row fails
//! a quality check) holds the primary key in `key` as a JSON object of text values, masked
//! as Silver masks it (`{"id": "42"}`). It is open while `quarantine/resolutions` names no
//! resolution for its id. How a record's key and status are read is kept to
//! [`record_key`] and [`is_open`], should the record shape change.
//!
//! A record whose key cannot be read is counted (`unreadable`); its key, if any, is then
//! compared like any other.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use wal2delta_lake::deltalake::arrow::array::{ArrayRef, RecordBatch, StringArray};
use wal2delta_lake::deltalake::arrow::datatypes::{DataType, Field, Schema};
use wal2delta_quarantine::{QuarantineRecord, Stage};

use super::compare::{Hash, Shape};

/// The primary key a Silver quarantine record names, as column → value.
pub fn record_key(r: &QuarantineRecord) -> Option<serde_json::Map<String, serde_json::Value>> {
    let bytes = r.key.as_deref()?;
    match serde_json::from_slice(bytes).ok()? {
        serde_json::Value::Object(m) => Some(m),
        _ => None,
    }
}

/// Whether the record still stands: no resolution names it.
pub fn is_open(r: &QuarantineRecord, resolved: &BTreeMap<String, String>) -> bool {
    !resolved.contains_key(&r.id)
}

/// The key hashes of `table`'s unresolved Silver records, and how many records name no
/// key that could be read.
pub fn quarantined_keys(
    records: &[QuarantineRecord],
    resolved: &BTreeMap<String, String>,
    table: &str,
    shape: &Shape,
) -> (HashSet<Hash>, usize) {
    let mut keys = HashSet::new();
    let mut unreadable = 0;
    for r in records {
        if r.stage != Stage::Silver || r.table.as_deref() != Some(table) || !is_open(r, resolved) {
            continue;
        }
        match record_key(r).and_then(|k| key_hash(&k, shape)) {
            Some(h) => {
                keys.insert(h);
            }
            None => unreadable += 1,
        }
    }
    (keys, unreadable)
}

/// The key hash of a JSON key: each value as text, cast to its key column's type.
fn key_hash(key: &serde_json::Map<String, serde_json::Value>, shape: &Shape) -> Option<Hash> {
    let names = shape.key_names();
    let mut fields = Vec::with_capacity(names.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(names.len());
    for n in &names {
        let text = match key.get(n)? {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        };
        fields.push(Field::new(n, DataType::Utf8, true));
        columns.push(Arc::new(StringArray::from(vec![text])));
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).ok()?;
    let keys = shape.conform_keys(&batch).ok()?;
    shape.key_hashes(&keys).ok()?.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal2delta_lake::deltalake::arrow::array::Int64Array;

    fn record(id: &str, stage: Stage, table: &str, key: &str) -> QuarantineRecord {
        QuarantineRecord {
            id: id.into(),
            stage,
            reason_code: "check_failed".into(),
            detail: String::new(),
            table: Some(table.into()),
            topic: None,
            partition: None,
            offset: None,
            source_lsn: Some(1),
            commit_lsn: Some(1),
            ordinal: None,
            key: Some(key.as_bytes().to_vec()),
            raw: None,
            quarantined_at_us: 0,
            check: Some("c".into()),
        }
    }

    #[test]
    fn silver_records_of_the_table_name_keys_by_value() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ]));
        let shape = Shape::new(schema.clone(), &["id".into()]).unwrap();
        let records = vec![
            record("a", Stage::Silver, "public.t", r#"{"id": 7}"#),
            record("b", Stage::Silver, "public.t", r#"{"id": "8"}"#),
            record("c", Stage::Silver, "public.t", "not json"),
            record("d", Stage::Silver, "public.other", r#"{"id": 9}"#),
            record("e", Stage::Bronze, "public.t", r#"{"id": 10}"#),
            record("f", Stage::Silver, "public.t", r#"{"id": "11"}"#),
        ];
        let resolved = BTreeMap::from([("f".to_string(), "resolved".to_string())]);
        let (keys, unreadable) = quarantined_keys(&records, &resolved, "public.t", &shape);
        assert_eq!(unreadable, 1);
        let b = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from(vec![7, 8, 9, 10, 11]))],
        )
        .unwrap();
        let want = shape.key_hashes(&shape.conform_keys(&b).unwrap()).unwrap();
        assert!(keys.contains(&want[0]) && keys.contains(&want[1]));
        assert!(!keys.contains(&want[2]) && !keys.contains(&want[3]));
        assert!(
            !keys.contains(&want[4]),
            "a resolved record no longer counts"
        );
        assert_eq!(keys.len(), 2);
    }
}
