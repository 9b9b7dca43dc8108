//! Avro's binary encoding, written straight from a change into the bytes capture sends.
//!
//! [`super::envelope::encode_change`] builds an `apache_avro` `Value` tree that the
//! library then validates against the schema and encodes, looking every record field up
//! by name. That costs capture several allocations and hash lookups per column of every
//! event. [`frame_change`] writes the same bytes in one pass over the change, in the
//! field order [`super::envelope::table_schemas`] gives the schemas, with the datums
//! mapped by [`super::types::write_avro`] (the byte-level twin of `to_avro`).
//!
//! Invariant: for every change, the bytes equal apache-avro's validated encoding of
//! `encode_change`'s values with the table's schemas (`proptests.rs` checks it for every
//! column type, operation, NULL, unchanged TOAST value and keyless table), so a consumer
//! reads them with the registered schema exactly as before.

use wal2delta_model::{Change, ChangeOp, ColumnValue, TableSchema};

use super::decimal::{decimal_type, Decimals};
use super::envelope::{field_names, has_decimals, has_primary_key, SourceInfo, CONNECTOR_VERSION};
use super::types::{decimal_of, write_avro};
use crate::StreamError;

/// Appends a `long` (zig-zag, then variable length).
pub(crate) fn long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Appends an `int` (encoded as a `long`).
pub(crate) fn int(out: &mut Vec<u8>, v: i32) {
    long(out, i64::from(v));
}

/// Appends `bytes`: the length, then the bytes.
pub(crate) fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// Appends a `string` (UTF-8 `bytes`).
pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    bytes(out, s.as_bytes());
}

/// Appends the branch index of a union.
fn branch(out: &mut Vec<u8>, index: i64) {
    long(out, index);
}

/// A change framed in the Confluent wire format (magic byte, schema id, Avro datum): what
/// capture sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramedChange {
    /// `None` for a TRUNCATE and the end of a snapshot, which have no key.
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    /// The old key of a create that is the new half of a primary-key change (see
    /// [`super::envelope::OLD_KEY_HEADER`]).
    pub old_key: Option<Vec<u8>>,
}

/// The registry ids the framed key and value name.
#[derive(Debug, Clone, Copy)]
pub struct SchemaIds {
    pub key: u32,
    pub value: u32,
}

fn header(out: &mut Vec<u8>, schema_id: u32) {
    out.push(0);
    out.extend_from_slice(&schema_id.to_be_bytes());
}

fn encode_err(table: &TableSchema, reason: String) -> StreamError {
    StreamError::Encode {
        table: table.table.to_string(),
        reason,
    }
}

/// A row image as the envelope's `["null", Value]` fields, one per column; the names of
/// columns whose unchanged TOAST value the image lacks go to `toast`, the indexes of
/// decimal columns whose value has no decimal (`NaN`, written as null) to `special`.
fn row(
    out: &mut Vec<u8>,
    table: &TableSchema,
    values: &[ColumnValue],
    toast: &mut Vec<usize>,
    decimals: Decimals,
    special: &mut Vec<usize>,
) -> Result<(), StreamError> {
    if values.len() != table.columns.len() {
        return Err(encode_err(
            table,
            format!(
                "the row has {} values for {} columns",
                values.len(),
                table.columns.len()
            ),
        ));
    }
    for (i, (col, v)) in table.columns.iter().zip(values).enumerate() {
        match v {
            ColumnValue::Null => branch(out, 0),
            ColumnValue::UnchangedToast => {
                toast.push(i);
                branch(out, 0);
            }
            ColumnValue::Value(d) => {
                let column_err = |e| encode_err(table, format!("column {}: {e}", col.name));
                match decimal_type(&col.ty, decimals) {
                    // Parsed once: the unscaled value is written, or the field is null.
                    Some(ps) => match decimal_of(&col.ty, ps, d).map_err(column_err)? {
                        Some(v) => {
                            branch(out, 1);
                            bytes(out, &super::decimal::be_bytes(v));
                        }
                        None => {
                            special.push(i);
                            branch(out, 0);
                        }
                    },
                    None => {
                        branch(out, 1);
                        write_avro(&col.ty, d, out, decimals).map_err(column_err)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The key record of a row image (see `key_record` in the envelope module): a primary
/// key's columns, each required, or the whole-row key of a keyless table, each nullable.
fn key(
    schema_id: u32,
    table: &TableSchema,
    values: &[ColumnValue],
    decimals: Decimals,
) -> Result<Vec<u8>, StreamError> {
    let keyless = !has_primary_key(table);
    let mut out = Vec::with_capacity(16);
    header(&mut out, schema_id);
    for (i, col) in table.columns.iter().enumerate().filter(|(_, c)| c.is_key) {
        match values.get(i) {
            // A keyless table's whole-row key holds a NaN as null, as the row image does.
            Some(ColumnValue::Value(d))
                if keyless
                    && matches!(
                        super::types::special_numeric(&col.ty, d, decimals),
                        Ok(Some(_))
                    ) =>
            {
                branch(&mut out, 0)
            }
            Some(ColumnValue::Value(d)) => {
                if keyless {
                    branch(&mut out, 1);
                }
                write_avro(&col.ty, d, &mut out, decimals)
                    .map_err(|e| encode_err(table, format!("key column {}: {e}", col.name)))?;
            }
            _ if keyless => branch(&mut out, 0),
            _ => {
                return Err(encode_err(
                    table,
                    format!("key column {} has no value", col.name),
                ))
            }
        }
    }
    Ok(out)
}

/// Encodes and frames one change: the same bytes as framing `encode_change`'s key, value
/// and old key with the table's schemas (built with `decimals`), in one pass and without
/// building Avro values.
pub fn frame_change(
    table: &TableSchema,
    ids: SchemaIds,
    source: &SourceInfo,
    change: &Change,
    now_ms: i64,
    token_key_id: Option<&str>,
    decimals: Decimals,
) -> Result<FramedChange, StreamError> {
    let mut value = Vec::with_capacity(256);
    header(&mut value, ids.value);
    // `before` and `after`: ["null", Value].
    let mut toast_before = Vec::new();
    let mut toast = Vec::new();
    let (mut special_before, mut special_after) = (Vec::new(), Vec::new());
    for (image, toast, special) in [
        (&change.before, &mut toast_before, &mut special_before),
        (&change.after, &mut toast, &mut special_after),
    ] {
        match image {
            Some(r) => {
                branch(&mut value, 1);
                row(&mut value, table, &r.values, toast, decimals, special)?;
            }
            None => branch(&mut value, 0),
        }
    }
    // `source`.
    let pos = &change.position;
    string(&mut value, CONNECTOR_VERSION);
    string(&mut value, "postgresql");
    string(&mut value, &source.name);
    long(&mut value, pos.commit_ts_us.div_euclid(1000));
    branch(&mut value, 1);
    string(
        &mut value,
        match change.op {
            ChangeOp::Read => "true",
            ChangeOp::SnapshotEnd => "last",
            _ => "false",
        },
    );
    string(&mut value, &source.db);
    string(&mut value, &change.table.schema);
    string(&mut value, &change.table.name);
    for n in [
        i64::from(pos.xid),
        pos.lsn.0 as i64,
        pos.commit_lsn.0 as i64,
    ] {
        branch(&mut value, 1);
        long(&mut value, n);
    }
    // `op`, `ts_ms`, `ordinal`.
    string(&mut value, change.op.code());
    branch(&mut value, 1);
    long(&mut value, now_ms);
    long(&mut value, pos.ordinal as i64);
    // `unchanged_toast_columns`: one block, then the end of the array.
    if !toast.is_empty() {
        long(&mut value, toast.len() as i64);
        for &i in &toast {
            string(&mut value, &table.columns[i].name);
        }
    }
    long(&mut value, 0);
    // `token_key_id`: ["null", "string"].
    match token_key_id {
        Some(k) => {
            branch(&mut value, 1);
            string(&mut value, k);
        }
        None => branch(&mut value, 0),
    }
    // `out_of_range_values`, when the table has a decimal column: ["null", array].
    if has_decimals(table, decimals) {
        out_of_range_values(&mut value, table, change, &[special_before, special_after]);
    }
    // The key comes from the new row, or from the old key for deletes; a create that
    // names an old row carries that row's key as its old key.
    let keyed = !matches!(change.op, ChangeOp::Truncate | ChangeOp::SnapshotEnd);
    let key_row = change.after.as_ref().or(change.before.as_ref());
    let framed_key = match key_row {
        Some(r) if keyed => Some(key(ids.key, table, &r.values, decimals)?),
        _ => None,
    };
    let old_key = match (&change.op, &change.before, &change.after) {
        (ChangeOp::Insert, Some(b), Some(_)) => Some(key(ids.key, table, &b.values, decimals)?),
        _ => None,
    };
    Ok(FramedChange {
        key: framed_key,
        value,
        old_key,
    })
}

/// The envelope's `out_of_range_values`: each special decimal value of `before`, then of
/// `after`, as `{column: "after.amount", value: "NaN"}`; null when there is none.
fn out_of_range_values(
    out: &mut Vec<u8>,
    table: &TableSchema,
    change: &Change,
    special: &[Vec<usize>; 2],
) {
    let count = special[0].len() + special[1].len();
    if count == 0 {
        branch(out, 0);
        return;
    }
    branch(out, 1);
    long(out, count as i64);
    // Rare (a NaN): the field names are computed only here.
    let names = field_names(
        &table
            .columns
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>(),
    );
    for (image, row, indexes) in [
        ("before", &change.before, &special[0]),
        ("after", &change.after, &special[1]),
    ] {
        for &i in indexes {
            string(out, &format!("{image}.{}", names[i]));
            let text = match row.as_ref().and_then(|r| r.values.get(i)) {
                Some(ColumnValue::Value(wal2delta_model::Datum::Numeric(t))) => t.as_str(),
                _ => "",
            };
            string(out, text);
        }
    }
    long(out, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs_are_zigzag_varints() {
        for (v, expected) in [
            (0i64, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
            (
                i64::MAX,
                vec![0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
            (
                i64::MIN,
                vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
            ),
        ] {
            let mut out = Vec::new();
            long(&mut out, v);
            assert_eq!(out, expected, "{v}");
            let lib =
                apache_avro::writer::datum::GenericDatumWriter::builder(&apache_avro::Schema::Long)
                    .build()
                    .unwrap()
                    .write_value_to_vec(apache_avro::types::Value::Long(v))
                    .unwrap();
            assert_eq!(out, lib, "{v}");
        }
    }
}
