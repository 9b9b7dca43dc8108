//! Entry point of the Kafka-record fuzz target (`fuzz/`, cargo-fuzz on nightly) and of the
//! corpus regression test (`stream/tests/fuzz_corpus.rs`, stable): both feed bytes
//! through [`kafka_record`], so the committed corpus guards the code the fuzzer explores.
//!
//! The input is a Kafka record value or key as Bronze receives it: Confluent-framed Avro
//! (magic byte 0, schema id, datum). It is decoded with the writer schemas capture
//! registers for [`fixture_table`] (a table with a column of every mapped type), the way
//! `decode::EventDecoder` decodes it once the registry returned the schema, then turned
//! into Bronze's Arrow columns; and read straight into those columns as Bronze reads it
//! (`avro::columnar`). Where both readings succeed, their columns must be equal.

use std::sync::OnceLock;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::Schema;
use wal2delta_model::{
    bronze, BaseType, Change, ChangeOp, Column, ColumnType, ColumnValue, Datum, Lsn,
    ReplicaIdentity, Row, Special, TableName, TableSchema, TxPosition, TypeKind,
};

use crate::avro::arrow::present;
use crate::avro::columnar::{EnvelopePlan, EnvelopeReader, KeyPlan};
use crate::avro::columns::{envelope_columns, key_column, out_of_range_column};
use crate::avro::envelope::{encode_change, table_schemas, SourceInfo, TableSchemas};
use crate::avro::types::from_avro;
use crate::registry::{frame, unframe};

/// A table with a column of every mapped type (and arrays, a domain, an enum), keyed by
/// `(id, day)` so a key holds a date too.
pub fn fixture_table() -> TableSchema {
    use BaseType::*;
    let cols: Vec<(&str, ColumnType)> = vec![
        ("id", ColumnType::base(Int8, "bigint")),
        ("day", ColumnType::base(Date, "date")),
        ("b", ColumnType::base(Bool, "boolean")),
        ("i2", ColumnType::base(Int2, "smallint")),
        ("i4", ColumnType::base(Int4, "integer")),
        ("o", ColumnType::base(Oid, "oid")),
        ("f4", ColumnType::base(Float4, "real")),
        ("f8", ColumnType::base(Float8, "double precision")),
        ("n", ColumnType::base(Numeric, "numeric")),
        ("t", ColumnType::base(Text, "text")),
        ("by", ColumnType::base(Bytea, "bytea")),
        ("u", ColumnType::base(Uuid, "uuid")),
        ("j", ColumnType::base(Jsonb, "jsonb")),
        ("d", ColumnType::base(Date, "date")),
        ("tm", ColumnType::base(Time, "time without time zone")),
        ("ttz", ColumnType::base(TimeTz, "time with time zone")),
        (
            "ts",
            ColumnType::base(Timestamp, "timestamp without time zone"),
        ),
        (
            "tstz",
            ColumnType::base(TimestampTz, "timestamp with time zone"),
        ),
        ("iv", ColumnType::base(Interval, "interval")),
        ("ip", ColumnType::base(Inet, "inet")),
        (
            "ia",
            ColumnType::array_of(ColumnType::base(Int4, "integer")),
        ),
        ("ta", ColumnType::array_of(ColumnType::base(Text, "text"))),
        ("da", ColumnType::array_of(ColumnType::base(Date, "date"))),
        (
            "tsa",
            ColumnType::array_of(ColumnType::base(TimestampTz, "timestamp with time zone")),
        ),
        (
            "iva",
            ColumnType::array_of(ColumnType::base(Interval, "interval")),
        ),
        (
            "dom",
            ColumnType {
                oid: 0,
                typmod: -1,
                name: "public.valid_until".into(),
                kind: TypeKind::Domain {
                    base: Box::new(ColumnType::base(Date, "date")),
                },
            },
        ),
        (
            "mood",
            ColumnType {
                oid: 0,
                typmod: -1,
                name: "public.mood".into(),
                kind: TypeKind::Enum {
                    labels: vec!["sad".into(), "ok".into()],
                },
            },
        ),
    ];
    TableSchema {
        relation_oid: 16384,
        table: TableName::new("public", "fuzz"),
        columns: cols
            .into_iter()
            .enumerate()
            .map(|(i, (name, ty))| Column {
                name: name.into(),
                ty,
                is_key: i < 2,
            })
            .collect(),
        replica_identity: ReplicaIdentity::Default,
    }
}

struct Fixture {
    table: TableSchema,
    schemas: TableSchemas,
    plan: std::sync::Arc<EnvelopePlan>,
    key_plan: std::sync::Arc<KeyPlan>,
    /// The datum of a TRUNCATE's value: read with the input as its key.
    truncate: Vec<u8>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let table = fixture_table();
        let schemas = table_schemas("cdc", &table).expect("the fixture table has schemas");
        let plan = EnvelopePlan::new(&schemas.lake_value, 7).expect("the envelope has a plan");
        let key_plan = KeyPlan::new(&schemas.lake_key).expect("the key has a plan");
        let change = Change {
            table: table.table.clone(),
            op: ChangeOp::Truncate,
            before: None,
            after: None,
            position: TxPosition {
                lsn: Lsn(1),
                commit_lsn: Lsn(2),
                xid: 3,
                commit_ts_us: 4,
                ordinal: 0,
            },
        };
        let source = SourceInfo {
            name: "cdc".into(),
            db: "app".into(),
        };
        let encoded =
            encode_change(&table, &schemas, &source, &change, 5, None).expect("a truncate encodes");
        let framed = frame(7, &schemas.value, encoded.value).expect("a truncate frames");
        Fixture {
            plan: plan.into(),
            key_plan: key_plan.into(),
            truncate: framed[5..].to_vec(),
            table,
            schemas,
        }
    })
}

/// The registered value and key schemas of [`fixture_table`] (JSON), for the corpus.
pub fn fixture_schemas_json() -> (String, String) {
    let f = fixture();
    (f.schemas.value_json.clone(), f.schemas.key_json.clone())
}

fn read(schema: &Schema, datum: &[u8]) -> Option<Value> {
    GenericDatumReader::builder(schema)
        .build()
        .and_then(|r| r.read_value(&mut &datum[..]))
        .ok()
}

/// The Kafka-record target: unframes the payload, decodes the datum as an envelope (the
/// value schema) and as a key (the key schema), and builds Bronze's columns from
/// whatever decodes; every column value of a decoded row image is also read back to a
/// `Datum` ([`from_avro`]). Errors are expected; panics are findings.
pub fn kafka_record(data: &[u8]) {
    let f = fixture();
    let Some((id, datum)) = unframe(data) else {
        return;
    };
    // Read straight into columns, as Bronze reads: the datum as a value without a key.
    let mut reader = EnvelopeReader::new(f.plan.clone(), Some(f.key_plan.clone()));
    let direct = reader
        .read_event(datum, None)
        .ok()
        .and_then(|_| reader.finish().ok());
    // With the lake's view of the schemas (temporal logical types added), through values.
    if let Some(value) = read(&f.schemas.lake_value, datum) {
        let columns = envelope_columns(&f.schemas.lake_value, 7, &[&value]);
        let key = key_column(&f.schemas.lake_key, &[None]);
        let out_of_range = out_of_range_column(&[&value], &[None]);
        if let (Some(direct), Ok(mut columns), Ok(Some(key)), Ok(out_of_range)) =
            (direct, columns, key, out_of_range)
        {
            columns.fields.extend([key.0, out_of_range.0]);
            columns.arrays.extend([key.1, out_of_range.1]);
            assert_eq!(direct.fields, columns.fields, "schema id {id}");
            for (a, b) in direct.arrays.iter().zip(&columns.arrays) {
                assert_eq!(
                    a.to_data(),
                    b.to_data(),
                    "columns read directly and through values differ"
                );
            }
        }
        if let Value::Record(fields) = &value {
            for (name, image) in fields {
                if name != bronze::BEFORE && name != bronze::AFTER {
                    continue;
                }
                if let Some(Value::Record(cols)) = present(image) {
                    for (col, (_, v)) in f.table.columns.iter().zip(cols) {
                        if let Some(v) = present(v) {
                            let _ = from_avro(&col.ty, v).map_err(|e| e.to_string());
                        }
                    }
                }
            }
        }
    }
    // The datum as a key, read straight into the `key` column.
    let _ = reader
        .read_event(&f.truncate, Some(datum))
        .map(|_| reader.finish());
    if let Some(key) = read(&f.schemas.lake_key, datum) {
        let _ = key_column(&f.schemas.lake_key, &[Some(&key)]);
        let _ = out_of_range_column(&[&Value::Null], &[Some(&key)]);
    }
}

fn row(values: Vec<Option<Datum>>) -> Row {
    Row {
        values: values
            .into_iter()
            .map(|v| v.map_or(ColumnValue::Null, ColumnValue::Value))
            .collect(),
    }
}

fn typical_row(id: i64) -> Vec<Option<Datum>> {
    vec![
        Some(Datum::Int64(id)),
        Some(Datum::Date(Special::Value(19_723))),
        Some(Datum::Bool(true)),
        Some(Datum::Int16(-7)),
        Some(Datum::Int32(42)),
        Some(Datum::Int64(4_294_967_295)),
        Some(Datum::Float32(1.5)),
        Some(Datum::Float64(-0.0)),
        Some(Datum::Numeric("-12.3400".into())),
        Some(Datum::Text("héllo, wörld".into())),
        Some(Datum::Bytes(vec![0, 1, 0xfe, 0xff])),
        Some(Datum::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into())),
        Some(Datum::Json(r#"{"a": [1, 2]}"#.into())),
        Some(Datum::Date(Special::Value(-735_160))),
        Some(Datum::Time(86_400_000_000)),
        Some(Datum::TimeTz {
            micros: 3_600_000_000,
            offset_seconds: 19_815,
        }),
        Some(Datum::Timestamp(Special::Value(1_700_000_000_123_456))),
        Some(Datum::TimestampTz(Special::Value(-62_135_596_800_000_000))),
        Some(Datum::Interval {
            months: 14,
            days: -3,
            micros: 4_000_001,
        }),
        Some(Datum::PgText("10.0.0.1/8".into())),
        Some(Datum::Array(vec![
            Some(Datum::Int32(1)),
            None,
            Some(Datum::Int32(-3)),
        ])),
        Some(Datum::Array(vec![Some(Datum::Text("a,b".into())), None])),
        Some(Datum::Array(vec![Some(Datum::Date(Special::Value(
            100_000_000,
        )))])),
        Some(Datum::Array(vec![Some(Datum::TimestampTz(
            Special::Infinity,
        ))])),
        Some(Datum::Array(vec![Some(Datum::Interval {
            months: 0,
            days: 0,
            micros: 1,
        })])),
        Some(Datum::Date(Special::Value(19_000))),
        Some(Datum::PgText("ok".into())),
    ]
}

fn edge_row(id: i64) -> Vec<Option<Datum>> {
    let mut r = typical_row(id);
    r[1] = Some(Datum::Date(Special::Infinity));
    r[6] = Some(Datum::Float32(f32::NAN));
    r[7] = Some(Datum::Float64(f64::NEG_INFINITY));
    r[8] = Some(Datum::Numeric("NaN".into()));
    r[9] = Some(Datum::Text(String::new()));
    r[13] = Some(Datum::Date(Special::NegInfinity));
    r[16] = Some(Datum::Timestamp(Special::NegInfinity));
    r[17] = Some(Datum::TimestampTz(Special::Infinity));
    r[20] = Some(Datum::Array(Vec::new()));
    r[25] = Some(Datum::Date(Special::Value(2_145_042_905)));
    r
}

/// Seed inputs for the Kafka-record corpus: framed values and keys of an insert with
/// typical values, an update with edge values and an unchanged TOAST column, a delete,
/// a row of NULLs and a TRUNCATE, as capture encodes them.
pub fn seed_records() -> Vec<(String, Vec<u8>)> {
    let f = fixture();
    let source = SourceInfo {
        name: "cdc".into(),
        db: "app".into(),
    };
    let position = |ordinal| TxPosition {
        lsn: Lsn(0x1_6B37_4D48 + ordinal),
        commit_lsn: Lsn(0x1_6B37_5000),
        xid: 771,
        commit_ts_us: 1_700_000_000_123_000,
        ordinal,
    };
    let change = |op, before: Option<Row>, after: Option<Row>, ordinal| Change {
        table: f.table.table.clone(),
        op,
        before,
        after,
        position: position(ordinal),
    };
    let mut toast = row(edge_row(2));
    toast.values[9] = ColumnValue::UnchangedToast;
    let mut nulls = vec![None; f.table.columns.len()];
    nulls[0] = Some(Datum::Int64(3));
    nulls[1] = Some(Datum::Date(Special::Value(0)));
    let changes = [
        (
            "insert_typical",
            change(ChangeOp::Insert, None, Some(row(typical_row(1))), 1),
        ),
        (
            "update_edge_toast",
            change(ChangeOp::Update, None, Some(toast), 2),
        ),
        (
            "delete_key",
            change(ChangeOp::Delete, Some(row(typical_row(1))), None, 3),
        ),
        (
            "insert_nulls",
            change(ChangeOp::Insert, None, Some(row(nulls)), 4),
        ),
        ("truncate", change(ChangeOp::Truncate, None, None, 5)),
    ];
    let mut out = Vec::new();
    for (name, c) in changes {
        let encoded = encode_change(&f.table, &f.schemas, &source, &c, 1_700_000_000_999, None)
            .expect("seed changes encode");
        out.push((
            format!("{name}.value"),
            frame(7, &f.schemas.value, encoded.value).expect("seed values frame"),
        ));
        if let Some(key) = encoded.key {
            out.push((
                format!("{name}.key"),
                frame(8, &f.schemas.key, key).expect("seed keys frame"),
            ));
        }
    }
    out
}
