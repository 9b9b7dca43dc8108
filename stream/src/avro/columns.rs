//! Change envelopes as Arrow columns: the part of a Bronze row that comes from the event.
//!
//! One call converts events written with one schema version. The columns, in order:
//!
//! | column | type | from |
//! | --- | --- | --- |
//! | `op` | Utf8 | `op` (`c`, `u`, `d`, `r`, `t`) |
//! | `before`, `after` | Struct | the row images, typed per [`super::arrow`] |
//! | `lsn`, `commit_lsn` | Int64 | `source.lsn`, `source.commit_lsn` |
//! | `ordinal` | Int64 | position in the transaction |
//! | `tx_id` | Int64 | `source.txId` |
//! | `commit_ts` | Timestamp(µs, UTC) | `source.ts_ms` |
//! | `snapshot` | Boolean | `source.snapshot == "true"` (or `"last"`) |
//! | `unchanged_toast_columns` | List(Utf8) | columns whose value the update left unchanged |
//! | `token_key_id` | Utf8 | key that tokenized sensitive columns |
//! | `event_ts` | Timestamp(µs, UTC) | `ts_ms`: when capture produced the event |
//! | `schema_id` | Int32 | the registry id the event was written with |
//!
//! [`key_column`] adds `key`, the decoded Kafka key (the primary key; no column for a
//! table without one), and [`out_of_range_column`] `out_of_range_values`, the original of
//! every value the lake holds mapped (`List(Struct{column, value})`, see [`super::dates`]).

use std::sync::Arc;

use apache_avro::schema::Schema;
use apache_avro::types::Value;
use arrow::array::{
    Array, ArrayRef, BooleanArray, Int32Array, Int64Array, ListArray, StringArray, StructArray,
    TimestampMicrosecondArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};

use wal2delta_model::bronze::{
    AFTER, BEFORE, COMMIT_LSN, COMMIT_TS, EVENT_TS, KEY, LSN, OP, ORDINAL, OUT_OF_RANGE_VALUES,
    SCHEMA_ID, SNAPSHOT, TOKEN_KEY_ID, TX_ID, UNCHANGED_TOAST_COLUMNS,
};

use super::arrow::{present, record_field, ArrowMappingError, ArrowTypes, LIST_ITEM};

/// The Arrow columns of a batch of envelopes.
#[derive(Debug, Clone)]
pub struct EnvelopeColumns {
    pub fields: Vec<Field>,
    pub arrays: Vec<ArrayRef>,
}

fn utc_micros() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn not_envelope(reason: &str) -> ArrowMappingError {
    ArrowMappingError::Unsupported {
        path: "value".into(),
        kind: format!("record that is not a wal2delta change envelope ({reason})"),
    }
}

fn field<'v>(fs: &'v [(String, Value)], name: &str) -> Option<&'v Value> {
    record_field(fs, 0, name).and_then(present)
}

/// The fields of one decoded record.
type Record = [(String, Value)];

fn long_of(v: Option<&Value>) -> Option<i64> {
    match v {
        Some(Value::Long(l)) => Some(*l),
        Some(Value::Int(i)) => Some(i64::from(*i)),
        _ => None,
    }
}

/// Field `name` of every record, as text (null where it is not text).
fn text_column(records: &[&Record], name: &str) -> StringArray {
    records
        .iter()
        .map(|fs| match field(fs, name) {
            Some(Value::String(s)) => Some(s.as_str()),
            _ => None,
        })
        .collect()
}

/// `ts_ms` (milliseconds) of every record, as a UTC timestamp in microseconds.
fn ts_column<'v>(records: impl Iterator<Item = Option<&'v Record>>) -> TimestampMicrosecondArray {
    records
        .map(|fs| long_of(fs.and_then(|fs| field(fs, "ts_ms"))).and_then(|ms| ms.checked_mul(1000)))
        .collect::<TimestampMicrosecondArray>()
        .with_timezone("UTC")
}

/// `unchanged_toast_columns`: the list of column names of every record.
fn toast_column(records: &[&Record]) -> Result<(Field, ArrayRef), ArrowMappingError> {
    let build = |reason: String| ArrowMappingError::Build {
        path: UNCHANGED_TOAST_COLUMNS.into(),
        reason,
    };
    let mut offsets = vec![0i32];
    let mut names: Vec<&str> = Vec::new();
    for fs in records {
        if let Some(Value::Array(items)) = field(fs, UNCHANGED_TOAST_COLUMNS) {
            for item in items {
                if let Some(Value::String(s)) = present(item) {
                    names.push(s);
                }
            }
        }
        offsets.push(
            i32::try_from(names.len()).map_err(|_| build("too many items in one batch".into()))?,
        );
    }
    let item = Arc::new(Field::new(LIST_ITEM, DataType::Utf8, true));
    let toast = ListArray::try_new(
        item.clone(),
        OffsetBuffer::new(offsets.into()),
        Arc::new(StringArray::from(names)),
        None::<NullBuffer>,
    )
    .map_err(|e| build(e.to_string()))?;
    Ok((
        Field::new(UNCHANGED_TOAST_COLUMNS, DataType::List(item), true),
        Arc::new(toast),
    ))
}

/// Converts `events` (envelope records decoded with `schema`, registered as `schema_id`).
pub fn envelope_columns(
    schema: &Schema,
    schema_id: u32,
    events: &[&Value],
) -> Result<EnvelopeColumns, ArrowMappingError> {
    let types = ArrowTypes::new(schema)?;
    let Schema::Record(envelope) = schema else {
        return Err(not_envelope("not a record"));
    };
    let image_schema = |name: &str| {
        envelope
            .lookup
            .get(name)
            .map(|&i| &envelope.fields[i].schema)
            .ok_or_else(|| not_envelope(&format!("no `{name}` field")))
    };
    let before_ty = types.data_type(image_schema(BEFORE)?, BEFORE)?;
    let after_ty = types.data_type(image_schema(AFTER)?, AFTER)?;

    let mut records = Vec::with_capacity(events.len());
    for v in events {
        match v {
            Value::Record(fs) => records.push(fs.as_slice()),
            _ => return Err(not_envelope("value is not a record")),
        }
    }
    let image =
        |name: &str| -> Vec<Option<&Value>> { records.iter().map(|fs| field(fs, name)).collect() };
    let source: Vec<Option<&Record>> = records
        .iter()
        .map(|fs| match field(fs, "source") {
            Some(Value::Record(s)) => Some(s.as_slice()),
            _ => None,
        })
        .collect();
    if source.iter().any(Option::is_none) {
        return Err(not_envelope("an event has no `source` record"));
    }
    let source_long = |name: &str| -> Int64Array {
        source
            .iter()
            .map(|s| long_of(s.and_then(|s| field(s, name))))
            .collect()
    };

    let op = text_column(&records, OP);
    if op.null_count() > 0 {
        return Err(not_envelope("an event has no `op`"));
    }
    let before = super::arrow::build_array(&before_ty, &image(BEFORE), BEFORE)?;
    let after = super::arrow::build_array(&after_ty, &image(AFTER), AFTER)?;
    let ordinal: Int64Array = records
        .iter()
        .map(|fs| long_of(field(fs, ORDINAL)))
        .collect();
    let commit_ts = ts_column(source.iter().copied());
    let snapshot: BooleanArray = source
        .iter()
        .map(|s| match s.and_then(|s| field(s, "snapshot")) {
            Some(Value::String(flag)) => Some(flag == "true" || flag == "last"),
            Some(Value::Boolean(b)) => Some(*b),
            _ => Some(false),
        })
        .collect();
    let token_key_id = text_column(&records, TOKEN_KEY_ID);
    let event_ts = ts_column(records.iter().map(|fs| Some(*fs)));
    let schema_ids = Int32Array::from(vec![schema_id as i32; records.len()]);

    let columns: Vec<(Field, ArrayRef)> = vec![
        (Field::new(OP, DataType::Utf8, true), Arc::new(op)),
        (Field::new(BEFORE, before_ty, true), before),
        (Field::new(AFTER, after_ty, true), after),
        (
            Field::new(LSN, DataType::Int64, true),
            Arc::new(source_long("lsn")),
        ),
        (
            Field::new(COMMIT_LSN, DataType::Int64, true),
            Arc::new(source_long("commit_lsn")),
        ),
        (
            Field::new(ORDINAL, DataType::Int64, true),
            Arc::new(ordinal),
        ),
        (
            Field::new(TX_ID, DataType::Int64, true),
            Arc::new(source_long("txId")),
        ),
        (
            Field::new(COMMIT_TS, utc_micros(), true),
            Arc::new(commit_ts),
        ),
        (
            Field::new(SNAPSHOT, DataType::Boolean, true),
            Arc::new(snapshot),
        ),
        toast_column(&records)?,
        (
            Field::new(TOKEN_KEY_ID, DataType::Utf8, true),
            Arc::new(token_key_id),
        ),
        (Field::new(EVENT_TS, utc_micros(), true), Arc::new(event_ts)),
        (
            Field::new(SCHEMA_ID, DataType::Int32, true),
            Arc::new(schema_ids),
        ),
    ];
    let (fields, arrays) = columns.into_iter().unzip();
    Ok(EnvelopeColumns { fields, arrays })
}

/// The `key` column: the events' Kafka keys (the primary key, as a struct typed like the
/// row images), decoded with `schema`; `None` (a TRUNCATE) is null. A table without a
/// primary key has no `key` column (`Ok(None)`): its key schema says
/// `"pg.primary_key": false` (the key is the replica identity, the whole row under
/// REPLICA IDENTITY FULL, which must not be merged on), or is an empty record, which
/// neither Arrow nor Parquet can hold as a struct.
pub fn key_column(
    schema: &Schema,
    keys: &[Option<&Value>],
) -> Result<Option<(Field, ArrayRef)>, ArrowMappingError> {
    if let Schema::Record(r) = schema {
        if r.attributes.get("pg.primary_key") == Some(&serde_json::Value::Bool(false)) {
            return Ok(None);
        }
    }
    let types = ArrowTypes::new(schema)?;
    let ty = types.data_type(schema, KEY)?;
    if matches!(&ty, DataType::Struct(fields) if fields.is_empty()) {
        return Ok(None);
    }
    let array = super::arrow::build_array(&ty, keys, KEY)?;
    Ok(Some((Field::new(KEY, ty, true), array)))
}

/// The `out_of_range_values` column: per event, the values the lake holds in place of the
/// ones sent (dates outside the calendar Delta writers can describe, see
/// [`super::dates`]) as a list of `{column, value}`: the field's path
/// (`after.valid_to`, `before.days[2]`, `key.day`) and the original as PostgreSQL text.
/// Null when the event has none.
pub fn out_of_range_column(
    events: &[&Value],
    keys: &[Option<&Value>],
) -> Result<(Field, ArrayRef), ArrowMappingError> {
    let build = |reason: String| ArrowMappingError::Build {
        path: OUT_OF_RANGE_VALUES.into(),
        reason,
    };
    let mut offsets = vec![0i32];
    let mut valid = Vec::with_capacity(events.len());
    let mut columns: Vec<String> = Vec::new();
    let mut values: Vec<String> = Vec::new();
    for (i, v) in events.iter().enumerate() {
        let mut found = Vec::new();
        if let Value::Record(fs) = v {
            for image in [BEFORE, AFTER] {
                if let Some(img) = field(fs, image) {
                    super::dates::out_of_range(image, img, &mut found);
                }
            }
            // What capture could not carry in the images' own types (a NaN of a decimal).
            if let Some(Value::Array(entries)) = field(fs, super::envelope::OUT_OF_RANGE_VALUES) {
                for e in entries {
                    if let Value::Record(f) = e {
                        if let (Some(Value::String(c)), Some(Value::String(v))) =
                            (field(f, "column"), field(f, "value"))
                        {
                            found.push(super::dates::OutOfRange {
                                column: c.clone(),
                                value: v.clone(),
                            });
                        }
                    }
                }
            }
        }
        if let Some(Some(k)) = keys.get(i) {
            super::dates::out_of_range(KEY, k, &mut found);
        }
        valid.push(!found.is_empty());
        for f in found {
            columns.push(f.column);
            values.push(f.value);
        }
        offsets.push(i32::try_from(columns.len()).map_err(|_| build("too many items".into()))?);
    }
    out_of_range_list(
        StringArray::from(columns),
        StringArray::from(values),
        OffsetBuffer::new(offsets.into()),
        valid,
    )
}

/// The `out_of_range_values` column from its entries (`columns[i]`, `values[i]`) and each
/// event's `offsets` into them; null for an event whose `valid` is false (it has none).
pub(crate) fn out_of_range_list(
    columns: StringArray,
    values: StringArray,
    offsets: OffsetBuffer<i32>,
    valid: Vec<bool>,
) -> Result<(Field, ArrayRef), ArrowMappingError> {
    let build = |reason: String| ArrowMappingError::Build {
        path: OUT_OF_RANGE_VALUES.into(),
        reason,
    };
    let entry = Fields::from(vec![
        Field::new("column", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ]);
    let entries = StructArray::try_new(
        entry.clone(),
        vec![Arc::new(columns) as ArrayRef, Arc::new(values)],
        None,
    )
    .map_err(|e| build(e.to_string()))?;
    let item = Arc::new(Field::new(LIST_ITEM, DataType::Struct(entry), true));
    let list = ListArray::try_new(
        item.clone(),
        offsets,
        Arc::new(entries),
        Some(NullBuffer::from(valid)),
    )
    .map_err(|e| build(e.to_string()))?;
    Ok((
        Field::new(OUT_OF_RANGE_VALUES, DataType::List(item), true),
        Arc::new(list),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::avro::envelope::{encode_change, table_schemas, SourceInfo};
    use arrow::array::{Array, StructArray};
    use wal2delta_model::{
        BaseType, Change, ChangeOp, Column, ColumnType, ColumnValue, Datum, Lsn, ReplicaIdentity,
        Row, TableName, TableSchema, TxPosition, TypeKind,
    };

    fn table() -> TableSchema {
        let ty = |b: BaseType, name: &str| ColumnType {
            oid: 0,
            name: name.into(),
            typmod: -1,
            kind: TypeKind::Base(b),
        };
        TableSchema {
            table: TableName::new("public", "t"),
            relation_oid: 1,
            columns: vec![
                Column {
                    name: "id".into(),
                    ty: ty(BaseType::Int8, "int8"),
                    is_key: true,
                },
                Column {
                    name: "note".into(),
                    ty: ty(BaseType::Text, "text"),
                    is_key: false,
                },
            ],
            replica_identity: ReplicaIdentity::Default,
        }
    }

    #[test]
    fn encoded_changes_become_envelope_columns() {
        let t = table();
        let schemas = table_schemas("cdc", &t).unwrap();
        let source = SourceInfo {
            name: "cdc".into(),
            db: "app".into(),
        };
        let change = |op, after: Option<Vec<ColumnValue>>, ordinal| Change {
            table: t.table.clone(),
            op,
            before: None,
            after: after.map(|values| Row { values }),
            position: TxPosition {
                lsn: Lsn(100 + ordinal),
                commit_lsn: Lsn(200),
                xid: 9,
                commit_ts_us: 1_700_000_000_123_000,
                ordinal,
            },
        };
        let events: Vec<Value> = [
            change(
                ChangeOp::Insert,
                Some(vec![ColumnValue::Value(Datum::Int64(1)), ColumnValue::Null]),
                0,
            ),
            change(
                ChangeOp::Update,
                Some(vec![
                    ColumnValue::Value(Datum::Int64(1)),
                    ColumnValue::UnchangedToast,
                ]),
                1,
            ),
        ]
        .iter()
        .map(|c| {
            encode_change(&t, &schemas, &source, c, 5, None)
                .unwrap()
                .value
        })
        .collect();
        let refs: Vec<&Value> = events.iter().collect();
        let cols = envelope_columns(&schemas.value, 42, &refs).unwrap();
        let col = |name: &str| {
            let i = cols.fields.iter().position(|f| f.name() == name).unwrap();
            cols.arrays[i].clone()
        };
        let ops = col(OP);
        let ops = ops.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((ops.value(0), ops.value(1)), ("c", "u"));
        let lsn = col(LSN);
        assert_eq!(
            lsn.as_any().downcast_ref::<Int64Array>().unwrap().value(1),
            101
        );
        let commit_ts = col(COMMIT_TS);
        assert_eq!(
            commit_ts
                .as_any()
                .downcast_ref::<TimestampMicrosecondArray>()
                .unwrap()
                .value(0),
            1_700_000_000_123_000
        );
        let toast = col(UNCHANGED_TOAST_COLUMNS);
        let toast = toast.as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(toast.value(0).len(), 0);
        assert_eq!(
            toast
                .value(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap()
                .value(0),
            "note"
        );
        let after = col(AFTER);
        let after = after.as_any().downcast_ref::<StructArray>().unwrap();
        assert_eq!(
            after
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(1),
            1
        );
        assert!(
            after.column(1).is_null(1),
            "unchanged TOAST is null in the image, listed above"
        );
        assert!(col(BEFORE).is_null(0));
        assert_eq!(
            col(SCHEMA_ID)
                .as_any()
                .downcast_ref::<Int32Array>()
                .unwrap()
                .value(0),
            42
        );
    }

    /// An upgrade: events already in Kafka were written with the registered schemas of
    /// before (temporal columns with Avro logical types). Their bytes are the bytes capture
    /// writes today, and read as Bronze reads (each with its own writer schema, the new one
    /// through the lake's view) they give the same Arrow types and values.
    #[test]
    fn events_of_the_old_temporal_schemas_give_the_same_bronze_columns() {
        use apache_avro::reader::datum::GenericDatumReader;
        use apache_avro::writer::datum::GenericDatumWriter;
        use wal2delta_model::Special;

        let mut t = table();
        let ty = |b: BaseType, name: &str| ColumnType {
            oid: 0,
            name: name.into(),
            typmod: -1,
            kind: TypeKind::Base(b),
        };
        for (name, b, pg) in [
            ("d", BaseType::Date, "date"),
            ("tm", BaseType::Time, "time without time zone"),
            ("ts", BaseType::Timestamp, "timestamp without time zone"),
            ("tz", BaseType::TimestampTz, "timestamp with time zone"),
        ] {
            t.columns.push(Column {
                name: name.into(),
                ty: ty(b, pg),
                is_key: false,
            });
        }
        let t = t;
        let schemas = table_schemas("cdc", &t).unwrap();
        // The old registered schema: the logical types, no temporal names.
        fn old_form(j: &serde_json::Value) -> serde_json::Value {
            match j {
                serde_json::Value::Object(o) => serde_json::Value::Object(
                    o.iter()
                        .filter(|(k, _)| {
                            !k.starts_with("connect.")
                                || k.as_str() == "connect.name" && o.contains_key("fields")
                        })
                        .map(|(k, v)| (k.clone(), old_form(v)))
                        .collect(),
                ),
                serde_json::Value::Array(a) => {
                    serde_json::Value::Array(a.iter().map(old_form).collect())
                }
                other => other.clone(),
            }
        }
        let lake_json: serde_json::Value = crate::avro::temporal::with_logical_types(
            &serde_json::from_str(&schemas.value_json).unwrap(),
        );
        let old_json = old_form(&lake_json);
        assert!(old_json
            .to_string()
            .contains(r#""logicalType":"local-timestamp-micros""#));
        assert!(!old_json.to_string().contains("io.debezium.time"));
        let old = Schema::parse(&old_json).unwrap();

        let source = SourceInfo {
            name: "cdc".into(),
            db: "app".into(),
        };
        let change = Change {
            table: t.table.clone(),
            op: ChangeOp::Insert,
            before: None,
            after: Some(Row {
                values: vec![
                    ColumnValue::Value(Datum::Int64(1)),
                    ColumnValue::Null,
                    ColumnValue::Value(Datum::Date(Special::Infinity)),
                    ColumnValue::Value(Datum::Time(86_400_000_000)),
                    ColumnValue::Value(Datum::Timestamp(Special::NegInfinity)),
                    ColumnValue::Value(Datum::TimestampTz(Special::Value(253_402_300_800_000_000))),
                ],
            }),
            position: TxPosition {
                lsn: Lsn(1),
                commit_lsn: Lsn(2),
                xid: 3,
                commit_ts_us: 4,
                ordinal: 0,
            },
        };
        let encoded = encode_change(&t, &schemas, &source, &change, 5, None).unwrap();
        let bytes = GenericDatumWriter::builder(&schemas.value)
            .build()
            .unwrap()
            .write_value_to_vec(encoded.value)
            .unwrap();
        let read = |s: &Schema| {
            GenericDatumReader::builder(s)
                .build()
                .unwrap()
                .read_value(&mut &bytes[..])
                .unwrap()
        };
        let (as_old, as_new) = (read(&old), read(&schemas.lake_value));
        assert_eq!(
            as_old, as_new,
            "the old schema reads today's bytes to the same values"
        );
        let old_cols = envelope_columns(&old, 1, &[&as_old]).unwrap();
        let new_cols = envelope_columns(&schemas.lake_value, 2, &[&as_new]).unwrap();
        assert_eq!(
            old_cols.fields, new_cols.fields,
            "no type change for the schema merge"
        );
        let at = old_cols
            .fields
            .iter()
            .position(|f| f.name() == AFTER)
            .unwrap();
        assert_eq!(old_cols.arrays[at].to_data(), new_cols.arrays[at].to_data());
        let DataType::Struct(after) = old_cols.fields[at].data_type() else {
            panic!("after is a struct")
        };
        let types: Vec<&DataType> = after.iter().skip(2).map(|f| f.data_type()).collect();
        assert_eq!(
            types,
            [
                &DataType::Date32,
                &DataType::Int64,
                &DataType::Timestamp(TimeUnit::Microsecond, None),
                &utc_micros(),
            ]
        );
    }

    #[test]
    fn a_record_that_is_not_an_envelope_is_refused() {
        let s = Schema::parse_str(
            r#"{"type":"record","name":"X","fields":[{"name":"a","type":"long"}]}"#,
        )
        .unwrap();
        let v = Value::Record(vec![("a".into(), Value::Long(1))]);
        assert!(envelope_columns(&s, 1, &[&v]).is_err());
    }
}
