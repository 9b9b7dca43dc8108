//! Property tests: arbitrary values of every supported column type travel
//! `Datum` → Avro (binary, as capture writes and Bronze reads it) → Arrow (Bronze's
//! columns) and read back from Arrow to the same `Datum`, following `docs/types.md`.
//! Dates the lake cannot hold as sent are mapped into range, and the original is kept in
//! `out_of_range_values`; infinities of timestamps keep their sentinels.

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use arrow::array::{
    Array, ArrayRef, AsArray, BinaryArray, BooleanArray, Date32Array, Decimal128Array,
    Float32Array, Float64Array, Int32Array, Int64Array, ListArray, StringArray, StructArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::DataType;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use wal2delta_model::{
    BaseType, Change, ChangeOp, Column, ColumnType, ColumnValue, Datum, Lsn, ReplicaIdentity, Row,
    Special, TableName, TableSchema, TxPosition, TypeKind,
};

use super::binary::{frame_change, SchemaIds};
use super::columnar::{EnvelopePlan, EnvelopeReader, KeyPlan};
use super::columns::{envelope_columns, key_column, out_of_range_column, EnvelopeColumns};
use super::dates::{lake_date, pg_date_text};
use super::decimal::Decimals;
use super::envelope::{encode_change, table_schemas, SourceInfo};
use super::types::{from_avro, special_numeric, to_avro};
use crate::registry::{frame, unframe};

/// PostgreSQL's date range: 4714-11-24 BC to 5874897-12-31, in days since 1970-01-01.
const PG_DATE_MIN: i32 = -2_440_588;
const PG_DATE_MAX: i32 = 2_145_042_905;
/// PostgreSQL's timestamp range starts at 4714-11-24 BC; the top is bounded by i64 µs.
const PG_TS_MIN: i64 = -210_866_803_200_000_000;

fn special<T: std::fmt::Debug + Clone + 'static>(
    finite: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Special<T>> {
    prop_oneof![
        8 => finite.prop_map(Special::Value),
        1 => Just(Special::Infinity),
        1 => Just(Special::NegInfinity),
    ]
    .boxed()
}

/// Dates everywhere in PostgreSQL's range, with the edges and the lake's limits weighted.
fn date() -> BoxedStrategy<Datum> {
    let (lake_min, lake_max) = (super::dates::DATE_MIN, super::dates::DATE_MAX);
    special(prop_oneof![
        PG_DATE_MIN..=PG_DATE_MAX,
        -800_000..800_000i32,
        Just(PG_DATE_MIN),
        Just(PG_DATE_MAX),
        (lake_max - 2)..=(lake_max + 2),
        (lake_min - 2)..=(lake_min + 2),
    ])
    .prop_map(Datum::Date)
    .boxed()
}

fn timestamp(tz: bool) -> BoxedStrategy<Datum> {
    special(prop_oneof![
        PG_TS_MIN..i64::MAX,
        Just(PG_TS_MIN),
        Just(i64::MAX - 1),
        -4_000_000_000_000_000..4_000_000_000_000_000i64,
    ])
    .prop_map(move |t| {
        if tz {
            Datum::TimestampTz(t)
        } else {
            Datum::Timestamp(t)
        }
    })
    .boxed()
}

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// `numeric(p,s)`.
fn bounded(p: i32, s: i32) -> ColumnType {
    ColumnType {
        typmod: ((p << 16) | s) + 4,
        ..ColumnType::base(BaseType::Numeric, "numeric")
    }
}

/// A column type and a strategy for its non-NULL values.
fn scalar_cases() -> Vec<(ColumnType, BoxedStrategy<Datum>)> {
    use BaseType::*;
    vec![
        (
            ColumnType::base(Bool, "boolean"),
            any::<bool>().prop_map(Datum::Bool).boxed(),
        ),
        (
            ColumnType::base(Int2, "smallint"),
            any::<i16>().prop_map(Datum::Int16).boxed(),
        ),
        (
            ColumnType::base(Int4, "integer"),
            any::<i32>().prop_map(Datum::Int32).boxed(),
        ),
        (
            ColumnType::base(Int8, "bigint"),
            any::<i64>().prop_map(Datum::Int64).boxed(),
        ),
        (
            ColumnType::base(Oid, "oid"),
            any::<u32>()
                .prop_map(|o| Datum::Int64(i64::from(o)))
                .boxed(),
        ),
        (
            ColumnType::base(Float4, "real"),
            any::<f32>().prop_map(Datum::Float32).boxed(),
        ),
        (
            ColumnType::base(Float8, "double precision"),
            any::<f64>().prop_map(Datum::Float64).boxed(),
        ),
        (
            ColumnType::base(Numeric, "numeric"),
            "-?[0-9]{1,60}(\\.[0-9]{1,30})?|NaN|Infinity|-Infinity"
                .prop_map(Datum::Numeric)
                .boxed(),
        ),
        // Bounded numerics: Avro decimals, NaN null with its text kept aside. PostgreSQL
        // prints exactly the scale's digits and no `-0`.
        (
            bounded(18, 2),
            "-?[1-9][0-9]{0,15}\\.[0-9]{2}|-?0\\.[0-9][1-9]|0\\.00|NaN"
                .prop_map(Datum::Numeric)
                .boxed(),
        ),
        (
            bounded(38, 10),
            "-?[1-9][0-9]{0,27}\\.[0-9]{10}|0\\.0000000000|NaN"
                .prop_map(Datum::Numeric)
                .boxed(),
        ),
        (
            bounded(5, 0),
            "-?[1-9][0-9]{0,4}|0|NaN".prop_map(Datum::Numeric).boxed(),
        ),
        (
            ColumnType::base(Text, "text"),
            any::<String>().prop_map(Datum::Text).boxed(),
        ),
        (
            ColumnType::base(Bytea, "bytea"),
            vec(any::<u8>(), 0..64).prop_map(Datum::Bytes).boxed(),
        ),
        (
            ColumnType::base(Uuid, "uuid"),
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
                .prop_map(Datum::Uuid)
                .boxed(),
        ),
        (
            ColumnType::base(Jsonb, "jsonb"),
            any::<String>().prop_map(Datum::Json).boxed(),
        ),
        (ColumnType::base(Date, "date"), date()),
        (
            ColumnType::base(Time, "time without time zone"),
            (0..=MICROS_PER_DAY).prop_map(Datum::Time).boxed(),
        ),
        (
            ColumnType::base(TimeTz, "time with time zone"),
            (0..=MICROS_PER_DAY, -57_599..=57_599i32)
                .prop_map(|(micros, offset_seconds)| Datum::TimeTz {
                    micros,
                    offset_seconds,
                })
                .boxed(),
        ),
        (
            ColumnType::base(Timestamp, "timestamp without time zone"),
            timestamp(false),
        ),
        (
            ColumnType::base(TimestampTz, "timestamp with time zone"),
            timestamp(true),
        ),
        (
            ColumnType::base(Interval, "interval"),
            (any::<i32>(), any::<i32>(), any::<i64>())
                .prop_map(|(months, days, micros)| Datum::Interval {
                    months,
                    days,
                    micros,
                })
                .boxed(),
        ),
        (
            ColumnType::base(Inet, "inet"),
            any::<String>().prop_map(Datum::PgText).boxed(),
        ),
        (
            ColumnType {
                oid: 0,
                typmod: -1,
                name: "public.mood".into(),
                kind: TypeKind::Enum {
                    labels: vec!["sad".into(), "ok".into()],
                },
            },
            "sad|ok".prop_map(Datum::PgText).boxed(),
        ),
        (
            ColumnType {
                oid: 0,
                typmod: -1,
                name: "public.valid_until".into(),
                kind: TypeKind::Domain {
                    base: Box::new(ColumnType::base(Date, "date")),
                },
            },
            date(),
        ),
    ]
}

/// Every scalar case, and a one-dimensional array of each (nullable elements).
fn cases() -> Vec<(ColumnType, BoxedStrategy<Datum>)> {
    let mut out = scalar_cases();
    for (ty, strategy) in scalar_cases() {
        if matches!(ty.kind, TypeKind::Domain { .. } | TypeKind::Enum { .. }) {
            continue;
        }
        out.push((
            ColumnType::array_of(ty),
            vec(option::of(strategy), 0..5)
                .prop_map(Datum::Array)
                .boxed(),
        ));
    }
    out
}

/// A type and a batch of values (`None` is NULL) of it.
fn batch() -> impl Strategy<Value = (ColumnType, Vec<Option<Datum>>)> {
    let cases = cases();
    (0..cases.len()).prop_flat_map(move |i| {
        let (ty, strategy) = cases[i].clone();
        (Just(ty), vec(option::weighted(0.9, strategy), 1..6))
    })
}

fn same(a: &Datum, b: &Datum) -> bool {
    match (a, b) {
        (Datum::Float32(x), Datum::Float32(y)) => x.to_bits() == y.to_bits(),
        (Datum::Float64(x), Datum::Float64(y)) => x.to_bits() == y.to_bits(),
        (Datum::Array(x), Datum::Array(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(p, q)| match (p, q) {
                    (Some(p), Some(q)) => same(p, q),
                    (None, None) => true,
                    _ => false,
                })
        }
        _ => a == b,
    }
}

fn special_i64(v: i64) -> Special<i64> {
    match v {
        i64::MAX => Special::Infinity,
        i64::MIN => Special::NegInfinity,
        v => Special::Value(v),
    }
}

/// The lake's value of a date as sent (what Bronze's `Date32` holds).
fn lake_datum(d: &Datum) -> Datum {
    match d {
        Datum::Date(s) => {
            let sent = match s {
                Special::Infinity => i32::MAX,
                Special::NegInfinity => i32::MIN,
                Special::Value(v) => *v,
            };
            Datum::Date(Special::Value(lake_date(sent).0))
        }
        Datum::Array(items) => {
            Datum::Array(items.iter().map(|i| i.as_ref().map(lake_datum)).collect())
        }
        other => other.clone(),
    }
}

/// Reads row `i` of a Bronze column back as the `Datum` of a column of type `ty`, by the
/// mapping of `docs/types.md` (dates as the lake holds them, see [`lake_datum`]).
fn datum_from_arrow(ty: &ColumnType, array: &ArrayRef, i: usize) -> Option<Datum> {
    if array.is_null(i) {
        return None;
    }
    let a = array.as_any();
    let resolved = ty.resolved();
    Some(match &resolved.kind {
        TypeKind::Array { element } => {
            let list = a.downcast_ref::<ListArray>().expect("List");
            let items = list.value(i);
            Datum::Array(
                (0..items.len())
                    .map(|j| datum_from_arrow(element, &items, j))
                    .collect(),
            )
        }
        TypeKind::Base(b) => {
            use BaseType::*;
            match b {
                Bool => Datum::Bool(a.downcast_ref::<BooleanArray>().unwrap().value(i)),
                Int2 => Datum::Int16(
                    i16::try_from(a.downcast_ref::<Int32Array>().unwrap().value(i)).unwrap(),
                ),
                Int4 => Datum::Int32(a.downcast_ref::<Int32Array>().unwrap().value(i)),
                Int8 | Oid => Datum::Int64(a.downcast_ref::<Int64Array>().unwrap().value(i)),
                Float4 => Datum::Float32(a.downcast_ref::<Float32Array>().unwrap().value(i)),
                Float8 => Datum::Float64(a.downcast_ref::<Float64Array>().unwrap().value(i)),
                Bytea => Datum::Bytes(a.downcast_ref::<BinaryArray>().unwrap().value(i).to_vec()),
                Date => Datum::Date(Special::Value(
                    a.downcast_ref::<Date32Array>().unwrap().value(i),
                )),
                Time => Datum::Time(a.downcast_ref::<Int64Array>().unwrap().value(i)),
                Timestamp | TimestampTz => {
                    let ts = a.downcast_ref::<TimestampMicrosecondArray>().unwrap();
                    let v = special_i64(ts.value(i));
                    if *b == Timestamp {
                        assert!(ts.timezone().is_none());
                        Datum::Timestamp(v)
                    } else {
                        assert_eq!(ts.timezone(), Some("UTC"));
                        Datum::TimestampTz(v)
                    }
                }
                TimeTz | Interval => {
                    let s = a.downcast_ref::<StructArray>().unwrap();
                    let long = |name| {
                        s.column_by_name(name)
                            .unwrap()
                            .as_primitive::<arrow::datatypes::Int64Type>()
                            .value(i)
                    };
                    let int = |name| {
                        s.column_by_name(name)
                            .unwrap()
                            .as_primitive::<arrow::datatypes::Int32Type>()
                            .value(i)
                    };
                    if *b == TimeTz {
                        Datum::TimeTz {
                            micros: long("micros"),
                            offset_seconds: int("offset_seconds"),
                        }
                    } else {
                        Datum::Interval {
                            months: int("months"),
                            days: int("days"),
                            micros: long("micros"),
                        }
                    }
                }
                Numeric if matches!(array.data_type(), DataType::Decimal128(..)) => {
                    let d = a.downcast_ref::<Decimal128Array>().unwrap();
                    Datum::Numeric(crate::avro::decimal::text(d.value(i), d.scale() as u8))
                }
                _ => {
                    let s = a.downcast_ref::<StringArray>().unwrap().value(i).to_owned();
                    match b {
                        Numeric => Datum::Numeric(s),
                        Uuid => Datum::Uuid(s),
                        Json | Jsonb => Datum::Json(s),
                        Text | Varchar | Bpchar | Name | Char | Xml => Datum::Text(s),
                        _ => Datum::PgText(s),
                    }
                }
            }
        }
        _ => Datum::PgText(a.downcast_ref::<StringArray>().unwrap().value(i).to_owned()),
    })
}

/// The dates of `d` the lake holds mapped, as (path, PostgreSQL text of the original).
fn mapped_dates(path: &str, d: &Datum, out: &mut Vec<(String, String)>) {
    match d {
        Datum::Date(s) => {
            let sent = match s {
                Special::Infinity => i32::MAX,
                Special::NegInfinity => i32::MIN,
                Special::Value(v) => *v,
            };
            if lake_date(sent).1 {
                out.push((path.to_owned(), pg_date_text(sent)));
            }
        }
        Datum::Array(items) => {
            for (j, item) in items.iter().enumerate() {
                if let Some(item) = item {
                    mapped_dates(&format!("{path}[{}]", j + 1), item, out);
                }
            }
        }
        _ => {}
    }
}

fn table(ty: &ColumnType) -> TableSchema {
    TableSchema {
        relation_oid: 1,
        table: TableName::new("public", "t"),
        columns: vec![
            Column {
                name: "id".into(),
                ty: ColumnType::base(BaseType::Int8, "bigint"),
                is_key: true,
            },
            Column {
                name: "col".into(),
                ty: ty.clone(),
                is_key: false,
            },
        ],
        replica_identity: ReplicaIdentity::Default,
    }
}

/// The registry ids the equivalence tests frame with.
const IDS: SchemaIds = SchemaIds { key: 8, value: 7 };

/// `t (id, col)` under REPLICA IDENTITY FULL without a primary key: both columns are key
/// columns and the key is the whole row, each field nullable.
fn keyless_table(ty: &ColumnType) -> TableSchema {
    let mut t = table(ty);
    for c in &mut t.columns {
        c.is_key = true;
    }
    t.replica_identity = ReplicaIdentity::Full;
    t
}

/// Every kind of change capture frames for one row `(i, d)` and the row before it.
fn changes_of(t: &TableSchema, i: usize, d: &Option<Datum>) -> Vec<Change> {
    let value = |d: &Option<Datum>| d.clone().map_or(ColumnValue::Null, ColumnValue::Value);
    let row = |id: i64, v: ColumnValue| Row {
        values: vec![ColumnValue::Value(Datum::Int64(id)), v],
    };
    let position = |ordinal: u64| TxPosition {
        lsn: Lsn(100 + ordinal),
        commit_lsn: Lsn(u64::MAX / 2 + ordinal),
        xid: u32::MAX - ordinal as u32,
        commit_ts_us: -1_700_000_000_000_123 + ordinal as i64,
        ordinal,
    };
    let change = |op, before: Option<Row>, after: Option<Row>, ordinal| Change {
        table: t.table.clone(),
        op,
        before,
        after,
        position: position(ordinal),
    };
    let id = i as i64 - 3;
    vec![
        change(ChangeOp::Insert, None, Some(row(id, value(d))), 0),
        change(ChangeOp::Read, None, Some(row(id, value(d))), 1),
        change(
            ChangeOp::Update,
            Some(row(id, value(d))),
            Some(row(id, ColumnValue::UnchangedToast)),
            2,
        ),
        change(ChangeOp::Update, None, Some(row(id, value(d))), 3),
        change(ChangeOp::Delete, Some(row(id, value(d))), None, 4),
        // The new half of a primary-key change names the old row: an old key.
        change(
            ChangeOp::Insert,
            Some(row(id + 1, ColumnValue::UnchangedToast)),
            Some(row(id, value(d))),
            5,
        ),
        change(
            ChangeOp::Delete,
            Some(row(id, ColumnValue::UnchangedToast)),
            None,
            6,
        ),
        change(ChangeOp::Truncate, None, None, 7),
        change(ChangeOp::SnapshotEnd, None, None, 8),
    ]
}

/// Bronze's columns of framed events (value, key) as the reference builds them: each datum
/// decoded by apache-avro with the lake's view of its schema, the `Value` trees walked
/// into columns.
fn columns_through_values(
    schemas: &super::envelope::TableSchemas,
    events: &[(Vec<u8>, Option<Vec<u8>>)],
) -> EnvelopeColumns {
    let values = GenericDatumReader::builder(&schemas.lake_value)
        .build()
        .unwrap();
    let keys = GenericDatumReader::builder(&schemas.lake_key)
        .build()
        .unwrap();
    let decoded: Vec<(Value, Option<Value>)> = events
        .iter()
        .map(|(v, k)| {
            let (_, v) = unframe(v).unwrap();
            let k = k.as_ref().map(|k| {
                let (_, k) = unframe(k).unwrap();
                keys.read_value(&mut &k[..]).unwrap()
            });
            (values.read_value(&mut &v[..]).unwrap(), k)
        })
        .collect();
    let vs: Vec<&Value> = decoded.iter().map(|(v, _)| v).collect();
    let ks: Vec<Option<&Value>> = decoded.iter().map(|(_, k)| k.as_ref()).collect();
    let mut cols = envelope_columns(&schemas.lake_value, IDS.value, &vs).unwrap();
    if ks.iter().any(Option::is_some) {
        if let Some((f, a)) = key_column(&schemas.lake_key, &ks).unwrap() {
            cols.fields.push(f);
            cols.arrays.push(a);
        }
    }
    let (f, a) = out_of_range_column(&vs, &ks).unwrap();
    cols.fields.push(f);
    cols.arrays.push(a);
    cols
}

/// The same columns read straight from the bytes ([`super::columnar`]).
fn columns_read_directly(
    schemas: &super::envelope::TableSchemas,
    events: &[(Vec<u8>, Option<Vec<u8>>)],
) -> EnvelopeColumns {
    let plan = std::sync::Arc::new(EnvelopePlan::new(&schemas.lake_value, IDS.value).unwrap());
    let key = events
        .iter()
        .any(|(_, k)| k.is_some())
        .then(|| std::sync::Arc::new(KeyPlan::new(&schemas.lake_key).unwrap()));
    let mut reader = EnvelopeReader::new(plan, key);
    for (v, k) in events {
        let (_, v) = unframe(v).unwrap();
        let k = k.as_ref().map(|k| unframe(k).unwrap().1);
        reader.read_event(v, k).unwrap();
    }
    reader.finish().unwrap()
}

fn assert_same_columns(a: &EnvelopeColumns, b: &EnvelopeColumns) -> Result<(), TestCaseError> {
    prop_assert_eq!(&a.fields, &b.fields);
    for (i, f) in a.fields.iter().enumerate() {
        prop_assert_eq!(
            a.arrays[i].to_data(),
            b.arrays[i].to_data(),
            "column {}",
            f.name()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// What capture sends ([`frame_change`], written directly) is byte for byte what
    /// apache-avro writes, with validation, for `encode_change`'s values and the table's
    /// registered schemas: for every column type, operation, NULL, unchanged TOAST value,
    /// primary-key and keyless table, with and without a token key. Where one refuses a
    /// change, so does the other.
    #[test]
    fn framed_changes_equal_apache_avro_encoding((ty, values) in batch()) {
        let source = SourceInfo { name: "cdc \u{e9}".into(), db: "app".into() };
        for t in [table(&ty), keyless_table(&ty)] {
            let schemas = table_schemas("cdc", &t).unwrap();
            for (i, d) in values.iter().enumerate() {
                for (n, change) in changes_of(&t, i, d).into_iter().enumerate() {
                    let token = (n % 2 == 0).then_some("key-2026");
                    let now = i64::MIN / 3 + n as i64;
                    let direct = frame_change(&t, IDS, &source, &change, now, token, Decimals::default());
                    let expected = encode_change(&t, &schemas, &source, &change, now, token)
                        .map_err(|e| e.to_string())
                        .and_then(|e| {
                            let framed = |id, schema, v: Option<Value>| {
                                v.map(|v| frame(id, schema, v)).transpose().map_err(|e| e.to_string())
                            };
                            Ok((
                                framed(IDS.key, &schemas.key, e.key)?,
                                frame(IDS.value, &schemas.value, e.value).map_err(|e| e.to_string())?,
                                framed(IDS.key, &schemas.key, e.old_key)?,
                            ))
                        });
                    match (direct, expected) {
                        (Ok(direct), Ok((key, value, old_key))) => {
                            prop_assert_eq!(&direct.value, &value, "{}: value of {:?}", ty.name, change);
                            prop_assert_eq!(&direct.key, &key, "{}: key of {:?}", ty.name, change);
                            prop_assert_eq!(&direct.old_key, &old_key, "{}: old key of {:?}", ty.name, change);
                        }
                        (Err(_), Err(_)) => {}
                        (direct, expected) => prop_assert!(
                            false,
                            "{}: {:?} framed as {:?}, apache-avro gave {:?}",
                            ty.name, change, direct.map(|_| ()), expected.map(|_| ())
                        ),
                    }
                }
            }
        }
    }

    /// Bronze reading events straight from their bytes ([`super::columnar`]) builds the
    /// columns the reference builds from apache-avro's `Value`s, for every column type,
    /// operation, NULL, unchanged TOAST value, out-of-range date, primary-key and keyless
    /// table, with and without a token key.
    #[test]
    fn columns_read_directly_equal_columns_through_values((ty, values) in batch()) {
        let source = SourceInfo { name: "cdc".into(), db: "app".into() };
        for t in [table(&ty), keyless_table(&ty)] {
            let schemas = table_schemas("cdc", &t).unwrap();
            let mut events = Vec::new();
            for (i, d) in values.iter().enumerate() {
                for (n, change) in changes_of(&t, i, d).into_iter().enumerate() {
                    let token = (n % 2 == 0).then_some("key-2026");
                    if let Ok(f) = frame_change(&t, IDS, &source, &change, 1_700_000_000_000 + n as i64, token, Decimals::default()) {
                        events.push((f.value, f.key));
                    }
                }
            }
            if events.is_empty() {
                continue;
            }
            let expected = columns_through_values(&schemas, &events);
            let direct = columns_read_directly(&schemas, &events);
            assert_same_columns(&direct, &expected)?;
        }
    }

    /// Events with bytes changed at random never make the direct reader panic, and where
    /// apache-avro and the direct reader both read one, they give the same columns.
    #[test]
    fn damaged_events_fail_alone_or_read_as_through_values(
        (ty, values) in batch(),
        damage in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let t = table(&ty);
        let schemas = table_schemas("cdc", &t).unwrap();
        let source = SourceInfo { name: "cdc".into(), db: "app".into() };
        let plan = std::sync::Arc::new(EnvelopePlan::new(&schemas.lake_value, IDS.value).unwrap());
        let key = std::sync::Arc::new(KeyPlan::new(&schemas.lake_key).unwrap());
        let values_reader = GenericDatumReader::builder(&schemas.lake_value).build().unwrap();
        for (i, d) in values.iter().enumerate() {
            for change in changes_of(&t, i, d) {
                let Ok(f) = frame_change(&t, IDS, &source, &change, 5, None, Decimals::default()) else { continue };
                let mut datum = unframe(&f.value).unwrap().1.to_vec();
                for (at, byte) in &damage {
                    let at = at.index(datum.len());
                    datum[at] = *byte;
                }
                let mut reader = EnvelopeReader::new(plan.clone(), Some(key.clone()));
                let direct = reader.read_event(&datum, None).map(|_| reader.finish().unwrap());
                if let (Ok(direct), Ok(v)) = (direct, values_reader.read_value(&mut &datum[..])) {
                    if let Ok(mut expected) = envelope_columns(&schemas.lake_value, IDS.value, &[&v]) {
                        let (kf, ka) = key_column(&schemas.lake_key, &[None]).unwrap().unwrap();
                        let (of, oa) = out_of_range_column(&[&v], &[None]).unwrap();
                        expected.fields.extend([kf, of]);
                        expected.arrays.extend([ka, oa]);
                        assert_same_columns(&direct, &expected)?;
                    }
                }
            }
        }
    }

    /// Datum → Avro → Datum is exact for every type.
    #[test]
    fn avro_round_trip((ty, values) in batch()) {
        for d in values.iter().flatten() {
            let v = to_avro(&ty, d, Decimals::String).unwrap();
            let back = from_avro(&ty, &v).unwrap();
            prop_assert!(same(&back, d), "{}: {d:?} came back as {back:?}", ty.name);
        }
    }

    /// Datum → Avro binary (as capture frames it) → Bronze's Arrow columns → Datum: equal,
    /// dates as the lake holds them with every mapped original in `out_of_range_values`.
    #[test]
    fn avro_arrow_round_trip((ty, values) in batch()) {
        let t = table(&ty);
        let schemas = table_schemas("cdc", &t).unwrap();
        let source = SourceInfo { name: "cdc".into(), db: "app".into() };
        // Bronze reads with the lake's view of the writer schema (`decode`).
        let reader = GenericDatumReader::builder(&schemas.lake_value).build().unwrap();
        let mut decoded: Vec<Value> = Vec::new();
        for (i, d) in values.iter().enumerate() {
            let change = Change {
                table: t.table.clone(),
                op: ChangeOp::Insert,
                before: None,
                after: Some(Row {
                    values: vec![
                        ColumnValue::Value(Datum::Int64(i as i64)),
                        d.clone().map_or(ColumnValue::Null, ColumnValue::Value),
                    ],
                }),
                position: TxPosition {
                    lsn: Lsn(100 + i as u64),
                    commit_lsn: Lsn(200),
                    xid: 9,
                    commit_ts_us: 1_700_000_000_000_000,
                    ordinal: i as u64,
                },
            };
            let framed = frame_change(&t, IDS, &source, &change, 5, None, Decimals::default()).unwrap();
            let (_, datum) = unframe(&framed.value).unwrap();
            decoded.push(reader.read_value(&mut &datum[..]).unwrap());
        }
        let refs: Vec<&Value> = decoded.iter().collect();
        let cols = envelope_columns(&schemas.lake_value, 1, &refs).unwrap();
        let at = cols.fields.iter().position(|f| f.name() == wal2delta_model::bronze::AFTER).unwrap();
        let after = cols.arrays[at].as_any().downcast_ref::<StructArray>().unwrap();
        let col = after.column_by_name("col").unwrap().clone();
        let nones: Vec<Option<&Value>> = vec![None; refs.len()];
        let (_, out_of_range) = out_of_range_column(&refs, &nones).unwrap();
        let out_of_range = out_of_range.as_any().downcast_ref::<ListArray>().unwrap();
        for (i, d) in values.iter().enumerate() {
            let back = datum_from_arrow(&ty, &col, i);
            // A NaN of a decimal column is null in the lake, its text in `out_of_range_values`.
            let special = d
                .as_ref()
                .and_then(|d| special_numeric(&ty, d, Decimals::default()).unwrap())
                .map(str::to_owned);
            match (d, &back) {
                (None, None) => {}
                (Some(_), None) if special.is_some() => {}
                (Some(d), Some(b)) => prop_assert!(
                    same(b, &lake_datum(d)),
                    "{}: {d:?} came back from Arrow as {b:?}", ty.name
                ),
                _ => prop_assert!(false, "{}: {d:?} came back from Arrow as {back:?}", ty.name),
            }
            let mut expected = Vec::new();
            if let Some(d) = d {
                mapped_dates("after.col", d, &mut expected);
            }
            if let Some(text) = special {
                expected.push(("after.col".to_owned(), text));
            }
            let kept: Vec<(String, String)> = if out_of_range.is_null(i) {
                Vec::new()
            } else {
                let entries = out_of_range.value(i);
                let entries = entries.as_any().downcast_ref::<StructArray>().unwrap();
                let text = |name: &str, j| entries.column_by_name(name).unwrap().as_string::<i32>().value(j).to_owned();
                (0..entries.len()).map(|j| (text("column", j), text("value", j))).collect()
            };
            prop_assert_eq!(kept, expected, "{}: originals of {:?}", ty.name, d);
        }
    }
}

/// A malformed event read among good ones fails alone and leaves nothing in the columns:
/// the run's columns are those of the good events.
#[test]
fn a_malformed_event_leaves_nothing_behind() {
    let ty = ColumnType::base(BaseType::Date, "date");
    let t = table(&ty);
    let schemas = table_schemas("cdc", &t).unwrap();
    let source = SourceInfo {
        name: "cdc".into(),
        db: "app".into(),
    };
    let framed: Vec<(Vec<u8>, Option<Vec<u8>>)> =
        changes_of(&t, 1, &Some(Datum::Date(Special::Infinity)))
            .iter()
            .map(|c| {
                let f =
                    frame_change(&t, IDS, &source, c, 5, Some("k"), Decimals::default()).unwrap();
                (f.value, f.key)
            })
            .collect();
    let good = [framed[0].clone(), framed[2].clone()];
    let plan = std::sync::Arc::new(EnvelopePlan::new(&schemas.lake_value, IDS.value).unwrap());
    let key = std::sync::Arc::new(KeyPlan::new(&schemas.lake_key).unwrap());
    let mut reader = EnvelopeReader::new(plan, Some(key));
    let datum = |b: &[u8]| unframe(b).unwrap().1.to_vec();
    let key_of = |e: &(Vec<u8>, Option<Vec<u8>>)| e.1.as_deref().map(datum);
    reader
        .read_event(&datum(&good[0].0), key_of(&good[0]).as_deref())
        .unwrap();
    // An update with its datum cut short after the images, a delete whose last varint
    // runs past the end, garbage, a good value with its key cut short.
    let update = datum(&framed[2].0);
    let mut bad_op = datum(&framed[4].0);
    let at = bad_op.len() - 1;
    bad_op[at] = 0x80;
    let cases: Vec<(Vec<u8>, Option<Vec<u8>>)> = vec![
        (update[..update.len() - 3].to_vec(), key_of(&framed[2])),
        (bad_op, key_of(&framed[4])),
        (vec![0xff; 40], None),
        (
            update.clone(),
            key_of(&framed[2]).map(|k| k[..k.len() - 1].to_vec()),
        ),
    ];
    for (v, k) in &cases {
        assert!(reader.read_event(v, k.as_deref()).is_err());
        assert_eq!(reader.rows(), 1);
    }
    reader
        .read_event(&datum(&good[1].0), key_of(&good[1]).as_deref())
        .unwrap();
    let direct = reader.finish().unwrap();
    let expected = columns_through_values(&schemas, &good);
    assert_same_columns(&direct, &expected).unwrap();
    assert!(
        !direct.arrays.last().unwrap().is_null(0),
        "the infinite date is kept in out_of_range_values"
    );
}
