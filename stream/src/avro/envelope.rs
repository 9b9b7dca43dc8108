//! The key and value schemas of a table's topic, and the encoding of one change.
//!
//! The value is shaped like Debezium's envelope (`before`, `after`, `source`, `op`,
//! `ts_ms`) so that consumers of Debezium's Avro can read it, plus what Debezium lacks:
//! `ordinal` (position in the transaction; Silver orders by `(source.lsn, ordinal)`) and
//! `token_key_id` (the key that tokenized this table's sensitive columns, so keys can
//! rotate) and `unchanged_toast_columns` (columns whose TOASTed value the update did not change: their
//! `after` field is null and consumers must keep the previous value), and, when the table
//! has a column carried as an Avro `decimal` ([`super::decimal`]), `out_of_range_values`:
//! the fields that are null because their value (`NaN`) has no decimal, each with its path
//! (`after.amount`) and PostgreSQL's text of the value; null when there is none.

use apache_avro::types::Value;
use apache_avro::Schema;
use serde_json::{json, Value as Json};
use wal2delta_model::names::avro_part;
use wal2delta_model::{Change, ColumnValue, TableSchema};

use super::decimal::{decimal_type, Decimals};
use super::types::{column_schema, special_numeric, to_avro};
use crate::StreamError;

/// The envelope field naming the values a row image's types cannot hold.
pub const OUT_OF_RANGE_VALUES: &str = "out_of_range_values";

/// Version string written in `source.version`.
pub const CONNECTOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Avro schemas of one version of a table.
#[derive(Debug, Clone)]
pub struct TableSchemas {
    /// The schemas capture registers and writes with.
    pub key: Schema,
    pub value: Schema,
    /// The same schemas as the lake reads them: with the logical types of temporal columns
    /// ([`super::temporal::with_logical_types`]). They read the bytes written with `key` /
    /// `value` unchanged; use them to decode events and to build Arrow columns.
    pub lake_key: Schema,
    pub lake_value: Schema,
    pub key_json: String,
    pub value_json: String,
    /// Avro field name of each column (sanitized, unique).
    pub field_names: Vec<String>,
    /// How bounded numerics are carried.
    pub decimals: Decimals,
    /// Whether the envelope has the `out_of_range_values` field (a column is a decimal).
    pub out_of_range: bool,
}

/// Whether a column of `table` is carried as an Avro `decimal`: then the envelope has an
/// `out_of_range_values` field.
pub fn has_decimals(table: &TableSchema, decimals: Decimals) -> bool {
    table
        .columns
        .iter()
        .any(|c| decimal_type(&c.ty, decimals).is_some())
}

/// Turns a PostgreSQL identifier into a valid, unique Avro name.
fn avro_names(columns: impl Iterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in columns {
        let mut s: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
            s.insert(0, '_');
        }
        let base = s.clone();
        let mut n = 1;
        while out.contains(&s) {
            n += 1;
            s = format!("{base}_{n}");
        }
        out.push(s);
    }
    out
}

/// The Avro field name (and so the Bronze and Silver column name) of each of a table's
/// columns, given all its published columns in order: what capture names them.
pub fn field_names(columns: &[String]) -> Vec<String> {
    avro_names(columns.iter().cloned())
}

fn namespace_part(s: &str) -> String {
    avro_names(std::iter::once(s.to_owned())).remove(0)
}

/// Whether the table's key columns are a primary key. The decoder marks the primary-key
/// columns when the table has one, else the replica identity's, which pgoutput makes
/// every column under REPLICA IDENTITY FULL: a table whose key is empty, or is every
/// column under FULL, has no primary key (a primary key over every column of a FULL table
/// reads the same, and is taken as none).
pub fn has_primary_key(table: &TableSchema) -> bool {
    table.has_primary_key()
}

/// Builds the key and value schemas for a table version. Their namespace is
/// `{prefix}.{schema}.{table}` with the parts escaped one-to-one for Avro
/// ([`avro_part`]), so two tables never share a schema name.
pub fn table_schemas(topic_prefix: &str, table: &TableSchema) -> Result<TableSchemas, StreamError> {
    table_schemas_with(topic_prefix, table, Decimals::default())
}

/// [`table_schemas`] with bounded numerics carried as `decimals` says.
pub fn table_schemas_with(
    topic_prefix: &str,
    table: &TableSchema,
    decimals: Decimals,
) -> Result<TableSchemas, StreamError> {
    let ns = format!(
        "{}.{}.{}",
        namespace_part(topic_prefix),
        avro_part(&table.table.schema),
        avro_part(&table.table.name)
    );
    let field_names = avro_names(table.columns.iter().map(|c| c.name.clone()));
    let mut value_fields = Vec::new();
    let mut key_fields = Vec::new();
    let keyless = !has_primary_key(table);
    for (col, field) in table.columns.iter().zip(&field_names) {
        let ty = column_schema(&col.ty, &ns, field, decimals);
        value_fields.push(json!({"name": field, "type": ["null", ty.clone()], "default": null, "pg.column": col.name}));
        if col.is_key {
            // Key column types live in their own namespace so record names cannot clash
            // with those of the value schema.
            let kty = column_schema(&col.ty, &format!("{ns}.key"), field, decimals);
            if keyless {
                // The whole row under REPLICA IDENTITY FULL: any column may be NULL (or an
                // unchanged TOAST value the new image does not carry).
                key_fields.push(json!({"name": field, "type": ["null", kty], "default": null, "pg.column": col.name}));
            } else {
                key_fields.push(json!({"name": field, "type": kty, "pg.column": col.name}));
            }
        }
    }
    let mut key_json =
        json!({"type": "record", "name": "Key", "namespace": ns, "fields": key_fields});
    if keyless {
        // The key is the replica identity (the whole row under REPLICA IDENTITY FULL, or
        // nothing): consumers must not merge rows by it. Only set when true, so tables with
        // a primary key keep their registered key schema.
        key_json["pg.primary_key"] = json!(false);
    }
    let mut value_json = json!({
        "type": "record", "name": "Envelope", "namespace": ns,
        "connect.name": format!("{ns}.Envelope"),
        "fields": [
            {"name": "before", "type": ["null", {"type": "record", "name": "Value", "namespace": ns, "fields": value_fields}], "default": null},
            {"name": "after", "type": ["null", format!("{ns}.Value")], "default": null},
            {"name": "source", "type": source_schema()},
            {"name": "op", "type": "string"},
            {"name": "ts_ms", "type": ["null", "long"], "default": null},
            {"name": "ordinal", "type": "long", "default": 0},
            {"name": "unchanged_toast_columns", "type": {"type": "array", "items": "string"}, "default": []},
            {"name": "token_key_id", "type": ["null", "string"], "default": null}
        ]
    });
    let out_of_range = has_decimals(table, decimals);
    if let (true, Some(fields)) = (out_of_range, value_json["fields"].as_array_mut()) {
        fields.push(
            json!({"name": OUT_OF_RANGE_VALUES, "type": ["null", {"type": "array", "items": {
            "type": "record", "name": "OutOfRangeValue", "namespace": ns,
            "fields": [{"name": "column", "type": "string"}, {"name": "value", "type": "string"}]
        }}], "default": null}),
        );
    }
    let parse = |j: &Json| {
        Schema::parse(j).map_err(|e| StreamError::Schema {
            table: table.table.to_string(),
            reason: e.to_string(),
        })
    };
    Ok(TableSchemas {
        key: parse(&key_json)?,
        value: parse(&value_json)?,
        lake_key: parse(&super::temporal::with_logical_types(&key_json))?,
        lake_value: parse(&super::temporal::with_logical_types(&value_json))?,
        key_json: key_json.to_string(),
        value_json: value_json.to_string(),
        field_names,
        decimals,
        out_of_range,
    })
}

fn source_schema() -> Json {
    json!({
        "type": "record", "name": "Source", "namespace": "io.wal2delta.postgresql",
        "fields": [
            {"name": "version", "type": "string"},
            {"name": "connector", "type": "string"},
            {"name": "name", "type": "string"},
            {"name": "ts_ms", "type": "long"},
            {"name": "snapshot", "type": ["null", "string"], "default": null},
            {"name": "db", "type": "string"},
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
            {"name": "txId", "type": ["null", "long"], "default": null},
            {"name": "lsn", "type": ["null", "long"], "default": null},
            {"name": "commit_lsn", "type": ["null", "long"], "default": null}
        ]
    })
}

/// Context every event's `source` block carries.
#[derive(Debug, Clone)]
pub struct SourceInfo {
    /// Logical name of the source (the topic prefix).
    pub name: String,
    pub db: String,
}

/// Key and value of one change, as Avro values (not yet framed).
pub struct EncodedChange {
    /// `None` for a TRUNCATE, which has no key.
    pub key: Option<Value>,
    pub value: Value,
    /// The old key of a create that is the new half of a primary-key change (the create's
    /// `before` names the old row): sent in the `__debezium.oldkey` header.
    pub old_key: Option<Value>,
}

/// The Kafka header naming the old key of a create that moved a row from it (Debezium's
/// name, which Debezium consumers look for). Its value is the old key as the Kafka key of
/// the old key's events is written (Confluent-framed Avro).
pub const OLD_KEY_HEADER: &str = "__debezium.oldkey";

/// A row image's record; a decimal column's value that has no decimal (`NaN`) is a null
/// field, and `(image.field, text)` goes to `special`.
fn row_record(
    table: &TableSchema,
    names: &[String],
    row: &[ColumnValue],
    toast: &mut Vec<String>,
    (image, decimals): (&str, Decimals),
    special: &mut Vec<(String, String)>,
) -> Result<Value, StreamError> {
    let encode =
        |col: &wal2delta_model::Column, e: super::types::MappingError| StreamError::Encode {
            table: table.table.to_string(),
            reason: format!("column {}: {e}", col.name),
        };
    let mut fields = Vec::with_capacity(row.len());
    for ((col, name), v) in table.columns.iter().zip(names).zip(row) {
        let value = match v {
            ColumnValue::Null => Value::Union(0, Box::new(Value::Null)),
            ColumnValue::UnchangedToast => {
                toast.push(col.name.clone());
                Value::Union(0, Box::new(Value::Null))
            }
            ColumnValue::Value(d) => {
                match special_numeric(&col.ty, d, decimals).map_err(|e| encode(col, e))? {
                    Some(text) => {
                        special.push((format!("{image}.{name}"), text.to_owned()));
                        Value::Union(0, Box::new(Value::Null))
                    }
                    None => Value::Union(
                        1,
                        Box::new(to_avro(&col.ty, d, decimals).map_err(|e| encode(col, e))?),
                    ),
                }
            }
        };
        fields.push((name.clone(), value));
    }
    Ok(Value::Record(fields))
}

/// Encodes one change into key and value records of `schemas`: the reference encoding.
/// Capture writes the same bytes directly ([`super::binary::frame_change`]; a property
/// test holds the two equal), so a change here must be made there too.
pub fn encode_change(
    table: &TableSchema,
    schemas: &TableSchemas,
    source: &SourceInfo,
    change: &Change,
    now_ms: i64,
    token_key_id: Option<&str>,
) -> Result<EncodedChange, StreamError> {
    let names = &schemas.field_names;
    let decimals = schemas.decimals;
    let mut toast = Vec::new();
    let mut toast_before = Vec::new();
    let mut special = Vec::new();
    let before = match &change.before {
        Some(r) => Value::Union(
            1,
            Box::new(row_record(
                table,
                names,
                &r.values,
                &mut toast_before,
                ("before", decimals),
                &mut special,
            )?),
        ),
        None => Value::Union(0, Box::new(Value::Null)),
    };
    let after = match &change.after {
        Some(r) => Value::Union(
            1,
            Box::new(row_record(
                table,
                names,
                &r.values,
                &mut toast,
                ("after", decimals),
                &mut special,
            )?),
        ),
        None => Value::Union(0, Box::new(Value::Null)),
    };
    // The key comes from the new row, or from the old key for deletes.
    let key_row = change.after.as_ref().or(change.before.as_ref());
    let key = key_row
        .map(|row| key_record(table, names, &row.values, decimals))
        .transpose()?;
    // A create that names an old row is the new half of a primary-key change: its old key
    // goes in the `__debezium.oldkey` header.
    let old_key = match (&change.op, &change.before, &change.after) {
        (wal2delta_model::ChangeOp::Insert, Some(b), Some(_)) => {
            Some(key_record(table, names, &b.values, decimals)?)
        }
        _ => None,
    };
    let pos = &change.position;
    let source_rec = Value::Record(vec![
        ("version".into(), Value::String(CONNECTOR_VERSION.into())),
        ("connector".into(), Value::String("postgresql".into())),
        ("name".into(), Value::String(source.name.clone())),
        (
            "ts_ms".into(),
            Value::Long(pos.commit_ts_us.div_euclid(1000)),
        ),
        (
            "snapshot".into(),
            Value::Union(
                1,
                Box::new(Value::String(
                    match change.op {
                        wal2delta_model::ChangeOp::Read => "true",
                        wal2delta_model::ChangeOp::SnapshotEnd => "last",
                        _ => "false",
                    }
                    .into(),
                )),
            ),
        ),
        ("db".into(), Value::String(source.db.clone())),
        ("schema".into(), Value::String(change.table.schema.clone())),
        ("table".into(), Value::String(change.table.name.clone())),
        (
            "txId".into(),
            Value::Union(1, Box::new(Value::Long(i64::from(pos.xid)))),
        ),
        (
            "lsn".into(),
            Value::Union(1, Box::new(Value::Long(pos.lsn.0 as i64))),
        ),
        (
            "commit_lsn".into(),
            Value::Union(1, Box::new(Value::Long(pos.commit_lsn.0 as i64))),
        ),
    ]);
    let mut value = vec![
        ("before".into(), before),
        ("after".into(), after),
        ("source".into(), source_rec),
        ("op".into(), Value::String(change.op.code().into())),
        (
            "ts_ms".into(),
            Value::Union(1, Box::new(Value::Long(now_ms))),
        ),
        ("ordinal".into(), Value::Long(pos.ordinal as i64)),
        (
            "unchanged_toast_columns".into(),
            Value::Array(toast.into_iter().map(Value::String).collect()),
        ),
        (
            "token_key_id".into(),
            match token_key_id {
                Some(k) => Value::Union(1, Box::new(Value::String(k.to_owned()))),
                None => Value::Union(0, Box::new(Value::Null)),
            },
        ),
    ];
    if schemas.out_of_range {
        let entry = |(column, value): (String, String)| {
            Value::Record(vec![
                ("column".into(), Value::String(column)),
                ("value".into(), Value::String(value)),
            ])
        };
        value.push((
            OUT_OF_RANGE_VALUES.into(),
            if special.is_empty() {
                Value::Union(0, Box::new(Value::Null))
            } else {
                Value::Union(
                    1,
                    Box::new(Value::Array(special.into_iter().map(entry).collect())),
                )
            },
        ));
    }
    let value = Value::Record(value);
    Ok(EncodedChange {
        key: if matches!(
            change.op,
            wal2delta_model::ChangeOp::Truncate | wal2delta_model::ChangeOp::SnapshotEnd
        ) {
            None
        } else {
            key
        },
        value,
        old_key,
    })
}

/// The key record of a row image: its key columns. A primary key's are each required (the
/// database keeps them NOT NULL); the whole-row key of a table without one (REPLICA
/// IDENTITY FULL) has nullable fields, NULL for a NULL column or an unchanged TOAST value.
fn key_record(
    table: &TableSchema,
    names: &[String],
    row: &[ColumnValue],
    decimals: Decimals,
) -> Result<Value, StreamError> {
    let keyless = !has_primary_key(table);
    let mut fields = Vec::new();
    for (i, col) in table.columns.iter().enumerate().filter(|(_, c)| c.is_key) {
        let v = match row.get(i) {
            // The whole-row key of a keyless table is never merged by: a NaN is null there,
            // as in the row image.
            Some(ColumnValue::Value(d))
                if keyless && matches!(special_numeric(&col.ty, d, decimals), Ok(Some(_))) =>
            {
                Value::Union(0, Box::new(Value::Null))
            }
            Some(ColumnValue::Value(d)) => {
                let v = to_avro(&col.ty, d, decimals).map_err(|e| StreamError::Encode {
                    table: table.table.to_string(),
                    reason: format!("key column {}: {e}", col.name),
                })?;
                if keyless {
                    Value::Union(1, Box::new(v))
                } else {
                    v
                }
            }
            _ if keyless => Value::Union(0, Box::new(Value::Null)),
            _ => {
                return Err(StreamError::Encode {
                    table: table.table.to_string(),
                    reason: format!("key column {} has no value", col.name),
                })
            }
        };
        fields.push((names[i].clone(), v));
    }
    Ok(Value::Record(fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal2delta_model::{
        BaseType, Column, ColumnType, Datum, ReplicaIdentity, TableName, TypeKind,
    };

    /// `hist (a int, note text)` under REPLICA IDENTITY FULL: every column is a key column
    /// and none is a primary key.
    fn keyless() -> TableSchema {
        let col = |name: &str, b: BaseType| Column {
            name: name.into(),
            ty: ColumnType {
                oid: 0,
                name: name.into(),
                typmod: -1,
                kind: TypeKind::Base(b),
            },
            is_key: true,
        };
        TableSchema {
            table: TableName::new("public", "hist"),
            relation_oid: 1,
            columns: vec![col("a", BaseType::Int4), col("note", BaseType::Text)],
            replica_identity: ReplicaIdentity::Full,
        }
    }

    #[test]
    fn a_whole_row_key_holds_nulls_and_unchanged_toast_and_reads_the_old_key() {
        let table = keyless();
        let schemas = table_schemas("w2d", &table).unwrap();
        let names = field_names(&["a".into(), "note".into()]);
        for row in [
            vec![
                ColumnValue::Null,
                ColumnValue::Value(Datum::Text("x".into())),
            ],
            vec![
                ColumnValue::Value(Datum::Int32(1)),
                ColumnValue::UnchangedToast,
            ],
            vec![
                ColumnValue::Value(Datum::Int32(1)),
                ColumnValue::Value(Datum::Text("x".into())),
            ],
        ] {
            let key = key_record(&table, &names, &row, Decimals::default()).unwrap();
            assert!(key.validate(&schemas.key), "{row:?}");
        }
        // Keys registered before (every field required) stay readable: the change is a
        // BACKWARD-compatible evolution of the key subject.
        let old = Schema::parse_str(
            r#"{"type":"record","name":"Key","namespace":"w2d.public.hist","fields":[
                {"name":"a","type":"int"},{"name":"note","type":"string"}]}"#,
        )
        .unwrap();
        apache_avro::schema_compatibility::SchemaCompatibility::can_read(&old, &schemas.key)
            .unwrap();
    }

    #[test]
    fn avro_names_are_valid_and_unique() {
        let names = avro_names(
            ["id", "Amount USD", "1st", "amount_usd", "Amount-USD"]
                .into_iter()
                .map(String::from),
        );
        assert_eq!(
            names,
            vec!["id", "Amount_USD", "_1st", "amount_usd", "Amount_USD_2"]
        );
    }
}
