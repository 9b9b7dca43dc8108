//! The Avro mapping of each PostgreSQL column type (docs/architecture.md, promise 7, `docs/types.md`).
//!
//! [`column_schema`] gives the schema of a *non-NULL* value (the caller wraps it in a
//! `["null", ...]` union), [`to_avro`] the value for a [`Datum`], and [`from_avro`] the
//! exact inverse. Nothing is approximated:
//!
//! * every schema carries `"pg.type"` (the PostgreSQL type name) and, when the column has a
//!   type modifier, `"pg.typmod"`, so the source type is always known;
//! * a bounded `numeric(p,s)` (`p <= 38`, `0 <= s <= p`) is an Avro `decimal` (bytes) in
//!   the `precise` encoding ([`super::decimal`]; `NaN` is a null field named in the
//!   envelope's `out_of_range_values`); every other `numeric`, and every numeric in the
//!   `string` encoding, is a plain Avro `string` holding PostgreSQL's exact decimal text
//!   (`-12.3400`, `NaN`, `Infinity`, `-Infinity`), with `"pg.precision"` / `"pg.scale"`
//!   when the column is bounded. Avro's `decimal` cannot hold NaN, the infinities, nor an
//!   unbounded numeric (up to 131 072 digits before the point);
//! * `date`, `time`, `timestamp` and `timestamptz` are a plain `int` (days since
//!   1970-01-01) or `long` (µs since midnight, since 1970-01-01, since 1970-01-01 UTC)
//!   named by `"connect.name"`, without an Avro logical type, so that every Avro client can
//!   read every PostgreSQL value, including those outside its calendar ([`super::temporal`]);
//! * for `date`, PostgreSQL's `infinity` / `-infinity` become `i32::MAX` / `i32::MIN`
//!   (PostgreSQL dates end at 5874897-12-31, day 2 145 042 905, so the sentinels never
//!   collide with a real date); for `timestamp` / `timestamptz` they become `i64::MAX` /
//!   `i64::MIN`, which is how PostgreSQL itself stores them (`DT_NOEND` / `DT_NOBEGIN`). The
//!   decoder refuses finite values at `i64::MAX` microseconds, so the sentinels are
//!   unambiguous;
//! * `timetz` is a record `{micros: long, offset_seconds: int}` (offset east of UTC; micros
//!   may be 86 400 000 000 for 24:00:00, so it is a plain long rather than `time-micros`);
//! * `interval` is a record `{months: int, days: int, micros: long}`: PostgreSQL's three
//!   independent fields. Avro's `duration` (milliseconds, unsigned) would lose precision and
//!   signs;
//! * arrays are Avro arrays of `["null", element]`;
//! * domains map like their base type, with `"pg.type"` naming the domain;
//! * enums are strings listing their labels in `"pg.enum.labels"` (a string, not an Avro
//!   enum, so `ALTER TYPE ... ADD VALUE` never breaks schema compatibility);
//! * everything else (ranges, composites, inet, cidr, macaddr, macaddr8, money, bit, varbit,
//!   xml, extension types) travels as PostgreSQL's own text in a `string`.
//!
//! Record type names are derived from the namespace and the column name, so they are unique
//! within one table schema.

use apache_avro::types::Value;
use serde_json::{json, Map, Value as Json};
use wal2delta_model::{BaseType, ColumnType, Datum, ErrorClass, Special, TypeKind};

use super::decimal::{self, Decimals};
use super::temporal;

/// Why a value could not be mapped. Messages name the type, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    /// The datum's variant is not the one the column type maps from.
    #[error("a {found} datum cannot be written as PostgreSQL type {pg_type}")]
    DatumMismatch {
        pg_type: String,
        found: &'static str,
    },
    /// The Avro value's variant is not the one the column type maps to.
    #[error("an Avro {found} value cannot be read as PostgreSQL type {pg_type}")]
    AvroMismatch {
        pg_type: String,
        found: &'static str,
    },
    /// The value cannot be represented (e.g. a finite timestamp equal to a sentinel).
    #[error("{pg_type} value out of range: {reason}")]
    OutOfRange {
        pg_type: String,
        reason: &'static str,
    },
    /// A null where a value was required (NULL column values are handled by the caller).
    #[error("unexpected null for PostgreSQL type {pg_type}")]
    UnexpectedNull { pg_type: String },
}

impl MappingError {
    /// A value that cannot be mapped is a problem of one record.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Record
    }
}

/// How a type's values are represented, after resolving domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repr {
    Boolean,
    Int16,
    Int32,
    /// int8 and oid.
    Int64,
    Float,
    Double,
    Numeric,
    /// `Datum::Text`: text, varchar, char(n), name, "char", xml.
    Text,
    /// `Datum::PgText`: enums, ranges, composites, network and money types, bit strings,
    /// anything without a native mapping.
    PgText,
    Bytes,
    Uuid,
    Json,
    Date,
    Time,
    TimeTz,
    Timestamp,
    TimestampTz,
    Interval,
    Array,
}

fn repr(ty: &ColumnType) -> Repr {
    match &ty.resolved().kind {
        TypeKind::Base(b) => match b {
            BaseType::Bool => Repr::Boolean,
            BaseType::Int2 => Repr::Int16,
            BaseType::Int4 => Repr::Int32,
            BaseType::Int8 | BaseType::Oid => Repr::Int64,
            BaseType::Float4 => Repr::Float,
            BaseType::Float8 => Repr::Double,
            BaseType::Numeric => Repr::Numeric,
            BaseType::Text
            | BaseType::Varchar
            | BaseType::Bpchar
            | BaseType::Name
            | BaseType::Char
            | BaseType::Xml => Repr::Text,
            BaseType::Bytea => Repr::Bytes,
            BaseType::Uuid => Repr::Uuid,
            BaseType::Json | BaseType::Jsonb => Repr::Json,
            BaseType::Date => Repr::Date,
            BaseType::Time => Repr::Time,
            BaseType::TimeTz => Repr::TimeTz,
            BaseType::Timestamp => Repr::Timestamp,
            BaseType::TimestampTz => Repr::TimestampTz,
            BaseType::Interval => Repr::Interval,
            BaseType::Inet
            | BaseType::Cidr
            | BaseType::Macaddr
            | BaseType::Macaddr8
            | BaseType::Money
            | BaseType::Bit
            | BaseType::Varbit => Repr::PgText,
        },
        TypeKind::Array { .. } => Repr::Array,
        TypeKind::Enum { .. }
        | TypeKind::Range { .. }
        | TypeKind::Composite
        | TypeKind::Other
        | TypeKind::Domain { .. } => Repr::PgText,
    }
}

// ---- schemas ----------------------------------------------------------------------------

/// The Avro schema (as JSON) of a non-NULL value of a column of type `ty`.
///
/// `namespace` is the namespace record types are created in and `column` the column's name;
/// together they make record names (`timetz`, `interval`) unique within one schema.
///
/// `decimals` says how a bounded numeric travels ([`decimal::decimal_type`]).
pub fn column_schema(ty: &ColumnType, namespace: &str, column: &str, decimals: Decimals) -> Json {
    let mut schema = match &ty.kind {
        TypeKind::Base(base) => base_schema(*base, ty, namespace, column, decimals),
        TypeKind::Domain { base } => {
            let mut schema = column_schema(base, namespace, column, decimals);
            if let Some(obj) = schema.as_object_mut() {
                obj.insert("pg.domain.base".into(), json!(base.name));
            }
            schema
        }
        TypeKind::Array { element } => json!({
            "type": "array",
            // Elements keep the text: a NaN element has no field of its own to be null in.
            "items": ["null", column_schema(element, namespace, column, Decimals::String)],
        }),
        TypeKind::Enum { labels } => json!({"type": "string", "pg.enum.labels": labels}),
        TypeKind::Range { subtype } => json!({"type": "string", "pg.range.subtype": subtype.name}),
        TypeKind::Composite | TypeKind::Other => json!({"type": "string"}),
    };
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("pg.type".into(), json!(ty.name));
        if ty.typmod != -1 {
            obj.insert("pg.typmod".into(), json!(ty.typmod));
        }
    }
    schema
}

fn base_schema(
    base: BaseType,
    ty: &ColumnType,
    namespace: &str,
    column: &str,
    decimals: Decimals,
) -> Json {
    match base {
        BaseType::Bool => json!({"type": "boolean"}),
        BaseType::Int2 | BaseType::Int4 => json!({"type": "int"}),
        BaseType::Int8 | BaseType::Oid => json!({"type": "long"}),
        BaseType::Float4 => json!({"type": "float"}),
        BaseType::Float8 => json!({"type": "double"}),
        BaseType::Numeric => {
            if let Some((p, s)) = decimal::decimal_type(ty, decimals) {
                // Debezium's `precise` shape, which Kafka Connect, Flink and ksqlDB read as a
                // decimal, and Avro's own logical type, which every Avro client reads.
                return json!({
                    "type": "bytes", "logicalType": "decimal", "precision": p, "scale": s,
                    "connect.name": "org.apache.kafka.connect.data.Decimal",
                    "connect.version": 1,
                    "connect.parameters": {"scale": s.to_string(), "connect.decimal.precision": p.to_string()},
                    "pg.precision": p, "pg.scale": s,
                });
            }
            let mut schema = json!({"type": "string"});
            if let (Some((precision, scale)), Some(obj)) =
                (ty.numeric_precision_scale(), schema.as_object_mut())
            {
                obj.insert("pg.precision".into(), json!(precision));
                obj.insert("pg.scale".into(), json!(scale));
            }
            schema
        }
        BaseType::Bytea => json!({"type": "bytes"}),
        BaseType::Uuid => json!({"type": "string", "logicalType": "uuid"}),
        BaseType::Json | BaseType::Jsonb => {
            json!({"type": "string", "connect.name": "io.debezium.data.Json"})
        }
        BaseType::Date => temporal::schema(temporal::DATE),
        BaseType::Time => temporal::schema(temporal::MICRO_TIME),
        BaseType::Timestamp => temporal::schema(temporal::MICRO_TIMESTAMP),
        BaseType::TimestampTz => temporal::schema(temporal::MICRO_TIMESTAMP_UTC),
        BaseType::TimeTz => record(
            namespace,
            column,
            "timetz",
            json!([
                {"name": "micros", "type": "long", "doc": "microseconds since midnight, 0 ..= 86400000000"},
                {"name": "offset_seconds", "type": "int", "doc": "zone offset in seconds east of UTC"},
            ]),
        ),
        BaseType::Interval => record(
            namespace,
            column,
            "interval",
            json!([
                {"name": "months", "type": "int"},
                {"name": "days", "type": "int"},
                {"name": "micros", "type": "long"},
            ]),
        ),
        BaseType::Text
        | BaseType::Varchar
        | BaseType::Bpchar
        | BaseType::Name
        | BaseType::Char
        | BaseType::Xml
        | BaseType::Inet
        | BaseType::Cidr
        | BaseType::Macaddr
        | BaseType::Macaddr8
        | BaseType::Money
        | BaseType::Bit
        | BaseType::Varbit => json!({"type": "string"}),
    }
}

fn record(namespace: &str, column: &str, kind: &str, fields: Json) -> Json {
    let mut obj = Map::new();
    obj.insert("type".into(), json!("record"));
    obj.insert(
        "name".into(),
        json!(format!("{}_{kind}", avro_name(column))),
    );
    let namespace = avro_namespace(namespace);
    if !namespace.is_empty() {
        obj.insert("namespace".into(), json!(namespace));
    }
    obj.insert("fields".into(), fields);
    Json::Object(obj)
}

/// A valid Avro name (`[A-Za-z_][A-Za-z0-9_]*`). When characters had to be replaced, a hash
/// of the original is appended so that distinct columns keep distinct names.
fn avro_name(raw: &str) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    if name != raw {
        // FNV-1a, 32 bits: stable across builds and platforms.
        let hash = raw.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        name.push_str(&format!("_{hash:08x}"));
    }
    name
}

fn avro_namespace(raw: &str) -> String {
    raw.split('.')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut s: String = part
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if s.starts_with(|c: char| c.is_ascii_digit()) {
                s.insert(0, '_');
            }
            s
        })
        .collect::<Vec<_>>()
        .join(".")
}

// ---- values -----------------------------------------------------------------------------

fn datum_kind(d: &Datum) -> &'static str {
    match d {
        Datum::Bool(_) => "Bool",
        Datum::Int16(_) => "Int16",
        Datum::Int32(_) => "Int32",
        Datum::Int64(_) => "Int64",
        Datum::Float32(_) => "Float32",
        Datum::Float64(_) => "Float64",
        Datum::Numeric(_) => "Numeric",
        Datum::Text(_) => "Text",
        Datum::Bytes(_) => "Bytes",
        Datum::Uuid(_) => "Uuid",
        Datum::Json(_) => "Json",
        Datum::Date(_) => "Date",
        Datum::Time(_) => "Time",
        Datum::TimeTz { .. } => "TimeTz",
        Datum::Timestamp(_) => "Timestamp",
        Datum::TimestampTz(_) => "TimestampTz",
        Datum::Interval { .. } => "Interval",
        Datum::Array(_) => "Array",
        Datum::PgText(_) => "PgText",
    }
}

/// A short name of an Avro value's kind, for error messages (never the value).
pub(crate) fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Boolean(_) => "boolean",
        Value::Int(_) => "int",
        Value::Long(_) => "long",
        Value::Float(_) => "float",
        Value::Double(_) => "double",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "string",
        Value::Fixed(..) => "fixed",
        Value::Enum(..) => "enum",
        Value::Union(..) => "union",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        Value::Record(_) => "record",
        Value::Date(_) => "date",
        Value::Decimal(_) | Value::BigDecimal(_) => "decimal",
        Value::TimeMillis(_) | Value::TimeMicros(_) => "time",
        Value::TimestampMillis(_) | Value::TimestampMicros(_) | Value::TimestampNanos(_) => {
            "timestamp"
        }
        Value::LocalTimestampMillis(_)
        | Value::LocalTimestampMicros(_)
        | Value::LocalTimestampNanos(_) => "local-timestamp",
        Value::Duration(_) => "duration",
        Value::Uuid(_) => "uuid",
    }
}

fn is_canonical_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

fn out_of_range(ty: &ColumnType, reason: &'static str) -> MappingError {
    MappingError::OutOfRange {
        pg_type: ty.name.clone(),
        reason,
    }
}

/// The unscaled value of a datum of a column carried as a decimal of `(precision, scale)`;
/// `None` for a value the decimal cannot hold (`NaN`, the infinities), which the caller
/// writes as a null field and names in the envelope's `out_of_range_values`.
pub fn decimal_of(
    ty: &ColumnType,
    (precision, scale): (u8, u8),
    datum: &Datum,
) -> Result<Option<i128>, MappingError> {
    match datum {
        Datum::Numeric(s) => decimal::unscaled(s, precision, scale)
            .map_err(|decimal::NotDecimal(reason)| out_of_range(ty, reason)),
        other => Err(MappingError::DatumMismatch {
            pg_type: ty.name.clone(),
            found: datum_kind(other),
        }),
    }
}

/// The text of `datum` when its column is carried as a decimal (`decimals`) and the
/// decimal cannot hold it (`NaN`): the field is then null and the text goes to the
/// envelope's `out_of_range_values`. `None` for every other value.
pub fn special_numeric<'d>(
    ty: &ColumnType,
    datum: &'d Datum,
    decimals: Decimals,
) -> Result<Option<&'d str>, MappingError> {
    match (decimal::decimal_type(ty, decimals), datum) {
        (Some(ps), Datum::Numeric(text)) => Ok(decimal_of(ty, ps, datum)?
            .is_none()
            .then_some(text.as_str())),
        _ => Ok(None),
    }
}

/// The unscaled value of a decimal column's datum that must have one (a key column).
fn required_decimal(ty: &ColumnType, ps: (u8, u8), datum: &Datum) -> Result<i128, MappingError> {
    decimal_of(ty, ps, datum)?.ok_or_else(|| {
        out_of_range(
            ty,
            "NaN or infinity in a column carried as an Avro decimal where it cannot be null (a key)",
        )
    })
}

/// The Avro value of a non-NULL datum of a column of type `ty`; it validates against
/// [`column_schema`] (not wrapped in the nullable union). A column carried as a decimal
/// must hold a finite value here ([`decimal_of`] says which do not).
pub fn to_avro(ty: &ColumnType, datum: &Datum, decimals: Decimals) -> Result<Value, MappingError> {
    if let Some(ps) = decimal::decimal_type(ty, decimals) {
        let v = required_decimal(ty, ps, datum)?;
        return Ok(Value::Decimal(apache_avro::Decimal::from(
            decimal::be_bytes(v),
        )));
    }
    let mismatch = || MappingError::DatumMismatch {
        pg_type: ty.name.clone(),
        found: datum_kind(datum),
    };
    Ok(match (repr(ty), datum) {
        (Repr::Boolean, Datum::Bool(b)) => Value::Boolean(*b),
        (Repr::Int16, Datum::Int16(v)) => Value::Int(i32::from(*v)),
        (Repr::Int32, Datum::Int32(v)) => Value::Int(*v),
        (Repr::Int64, Datum::Int64(v)) => Value::Long(*v),
        (Repr::Float, Datum::Float32(v)) => Value::Float(*v),
        (Repr::Double, Datum::Float64(v)) => Value::Double(*v),
        (Repr::Numeric, Datum::Numeric(s))
        | (Repr::Text | Repr::PgText, Datum::Text(s) | Datum::PgText(s))
        | (Repr::Json, Datum::Json(s)) => Value::String(s.clone()),
        (Repr::Uuid, Datum::Uuid(s)) => Value::String(uuid_text(ty, s)?.to_owned()),
        (Repr::Bytes, Datum::Bytes(b)) => Value::Bytes(b.clone()),
        (Repr::Date, Datum::Date(d)) => Value::Int(date_days(ty, *d)?),
        (Repr::Time, Datum::Time(micros)) => Value::Long(*micros),
        (
            Repr::TimeTz,
            Datum::TimeTz {
                micros,
                offset_seconds,
            },
        ) => Value::Record(vec![
            ("micros".into(), Value::Long(*micros)),
            ("offset_seconds".into(), Value::Int(*offset_seconds)),
        ]),
        (Repr::Timestamp, Datum::Timestamp(t)) | (Repr::TimestampTz, Datum::TimestampTz(t)) => {
            Value::Long(timestamp_micros(ty, *t)?)
        }
        (
            Repr::Interval,
            Datum::Interval {
                months,
                days,
                micros,
            },
        ) => Value::Record(vec![
            ("months".into(), Value::Int(*months)),
            ("days".into(), Value::Int(*days)),
            ("micros".into(), Value::Long(*micros)),
        ]),
        (Repr::Array, Datum::Array(items)) => {
            let element = array_element(ty).ok_or_else(mismatch)?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(match item {
                    None => Value::Union(0, Box::new(Value::Null)),
                    Some(d) => Value::Union(1, Box::new(to_avro(element, d, Decimals::String)?)),
                });
            }
            Value::Array(out)
        }
        _ => return Err(mismatch()),
    })
}

/// Writes the Avro binary encoding of a non-NULL datum of a column of type `ty`: the
/// bytes apache-avro writes for [`to_avro`]'s value with [`column_schema`], with the same
/// errors, without building the value ([`super::binary`]; `proptests.rs` checks both
/// agree). On an error `out` holds a partial value and must be discarded.
pub fn write_avro(
    ty: &ColumnType,
    datum: &Datum,
    out: &mut Vec<u8>,
    decimals: Decimals,
) -> Result<(), MappingError> {
    use super::binary::{bytes, int, long, string};
    if let Some(ps) = decimal::decimal_type(ty, decimals) {
        bytes(out, &decimal::be_bytes(required_decimal(ty, ps, datum)?));
        return Ok(());
    }
    let mismatch = || MappingError::DatumMismatch {
        pg_type: ty.name.clone(),
        found: datum_kind(datum),
    };
    match (repr(ty), datum) {
        (Repr::Boolean, Datum::Bool(b)) => out.push(u8::from(*b)),
        (Repr::Int16, Datum::Int16(v)) => int(out, i32::from(*v)),
        (Repr::Int32, Datum::Int32(v)) => int(out, *v),
        (Repr::Int64, Datum::Int64(v)) => long(out, *v),
        (Repr::Float, Datum::Float32(v)) => out.extend_from_slice(&v.to_le_bytes()),
        (Repr::Double, Datum::Float64(v)) => out.extend_from_slice(&v.to_le_bytes()),
        (Repr::Numeric, Datum::Numeric(s))
        | (Repr::Text | Repr::PgText, Datum::Text(s) | Datum::PgText(s))
        | (Repr::Json, Datum::Json(s)) => string(out, s),
        (Repr::Uuid, Datum::Uuid(s)) => string(out, uuid_text(ty, s)?),
        (Repr::Bytes, Datum::Bytes(b)) => bytes(out, b),
        (Repr::Date, Datum::Date(d)) => int(out, date_days(ty, *d)?),
        (Repr::Time, Datum::Time(micros)) => long(out, *micros),
        (
            Repr::TimeTz,
            Datum::TimeTz {
                micros,
                offset_seconds,
            },
        ) => {
            long(out, *micros);
            int(out, *offset_seconds);
        }
        (Repr::Timestamp, Datum::Timestamp(t)) | (Repr::TimestampTz, Datum::TimestampTz(t)) => {
            long(out, timestamp_micros(ty, *t)?);
        }
        (
            Repr::Interval,
            Datum::Interval {
                months,
                days,
                micros,
            },
        ) => {
            int(out, *months);
            int(out, *days);
            long(out, *micros);
        }
        (Repr::Array, Datum::Array(items)) => {
            let element = array_element(ty).ok_or_else(mismatch)?;
            // One block of items (`["null", element]` each), then the end of the array.
            if !items.is_empty() {
                long(out, items.len() as i64);
                for item in items {
                    match item {
                        None => long(out, 0),
                        Some(d) => {
                            long(out, 1);
                            write_avro(element, d, out, Decimals::String)?;
                        }
                    }
                }
            }
            long(out, 0);
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// A uuid as it travels: only PostgreSQL's canonical lower-case text.
fn uuid_text<'s>(ty: &ColumnType, s: &'s str) -> Result<&'s str, MappingError> {
    if is_canonical_uuid(s) {
        Ok(s)
    } else {
        Err(out_of_range(ty, "uuid is not in canonical lower-case form"))
    }
}

/// Days since 1970-01-01, the infinities as `i32::MAX` / `i32::MIN`.
fn date_days(ty: &ColumnType, d: Special<i32>) -> Result<i32, MappingError> {
    match d {
        Special::Infinity => Ok(i32::MAX),
        Special::NegInfinity => Ok(i32::MIN),
        Special::Value(v) if v == i32::MAX || v == i32::MIN => Err(out_of_range(
            ty,
            "finite date collides with an infinity sentinel",
        )),
        Special::Value(v) => Ok(v),
    }
}

fn timestamp_micros(ty: &ColumnType, t: Special<i64>) -> Result<i64, MappingError> {
    match t {
        Special::Infinity => Ok(i64::MAX),
        Special::NegInfinity => Ok(i64::MIN),
        Special::Value(v) if v == i64::MAX || v == i64::MIN => Err(out_of_range(
            ty,
            "finite timestamp collides with an infinity sentinel",
        )),
        Special::Value(v) => Ok(v),
    }
}

/// The scale of a bounded numeric column (what an Avro decimal of it is read with).
fn decimal_scale(ty: &ColumnType) -> Option<u8> {
    let (_, s) = ty.resolved().numeric_precision_scale()?;
    u8::try_from(s).ok()
}

fn array_element(ty: &ColumnType) -> Option<&ColumnType> {
    match &ty.resolved().kind {
        TypeKind::Array { element } => Some(element),
        _ => None,
    }
}

/// The datum of a non-NULL Avro value read for a column of type `ty`; the exact inverse of
/// [`to_avro`]. Accepts the plain primitive variants [`to_avro`] produces, the logical
/// variants apache-avro produces when decoding with a schema that has logical types
/// (`Date`, `TimeMicros`, `TimestampMicros`, `LocalTimestampMicros`, `Uuid`: events
/// written before temporal columns dropped them, and any event read with
/// [`temporal::with_logical_types`]), and `Union` wrappers.
pub fn from_avro(ty: &ColumnType, value: &Value) -> Result<Datum, MappingError> {
    let mut value = value;
    while let Value::Union(_, inner) = value {
        value = inner;
    }
    if matches!(value, Value::Null) {
        return Err(MappingError::UnexpectedNull {
            pg_type: ty.name.clone(),
        });
    }
    let mismatch = || MappingError::AvroMismatch {
        pg_type: ty.name.clone(),
        found: value_kind(value),
    };
    let int_range = || out_of_range(ty, "integer does not fit the PostgreSQL type");
    Ok(match (repr(ty), value) {
        (Repr::Boolean, Value::Boolean(b)) => Datum::Bool(*b),
        (Repr::Int16, Value::Int(v)) => Datum::Int16(i16::try_from(*v).map_err(|_| int_range())?),
        (Repr::Int16, Value::Long(v)) => Datum::Int16(i16::try_from(*v).map_err(|_| int_range())?),
        (Repr::Int32, Value::Int(v)) => Datum::Int32(*v),
        (Repr::Int32, Value::Long(v)) => Datum::Int32(i32::try_from(*v).map_err(|_| int_range())?),
        (Repr::Int64, Value::Long(v)) => Datum::Int64(*v),
        (Repr::Int64, Value::Int(v)) => Datum::Int64(i64::from(*v)),
        (Repr::Float, Value::Float(v)) => Datum::Float32(*v),
        (Repr::Double, Value::Double(v)) => Datum::Float64(*v),
        (Repr::Double, Value::Float(v)) => Datum::Float64(f64::from(*v)),
        (Repr::Numeric, Value::String(s)) => Datum::Numeric(s.clone()),
        (Repr::Numeric, Value::Decimal(d)) => {
            let scale = decimal_scale(ty).ok_or_else(mismatch)?;
            let bytes = Vec::<u8>::try_from(d).map_err(|_| mismatch())?;
            let v = decimal::from_be_bytes(&bytes)
                .ok_or_else(|| out_of_range(ty, "decimal wider than 38 digits"))?;
            Datum::Numeric(decimal::text(v, scale))
        }
        (Repr::Text, Value::String(s)) => Datum::Text(s.clone()),
        (Repr::PgText, Value::String(s)) => Datum::PgText(s.clone()),
        (Repr::Json, Value::String(s)) => Datum::Json(s.clone()),
        (Repr::Uuid, Value::Uuid(u)) => Datum::Uuid(u.to_string()),
        (Repr::Uuid, Value::String(s)) => Datum::Uuid(s.to_ascii_lowercase()),
        (Repr::Bytes, Value::Bytes(b) | Value::Fixed(_, b)) => Datum::Bytes(b.clone()),
        (Repr::Date, Value::Date(d) | Value::Int(d)) => Datum::Date(match *d {
            i32::MAX => Special::Infinity,
            i32::MIN => Special::NegInfinity,
            v => Special::Value(v),
        }),
        (Repr::Time, Value::TimeMicros(v) | Value::Long(v)) => Datum::Time(*v),
        (Repr::Timestamp, Value::LocalTimestampMicros(v) | Value::Long(v)) => {
            Datum::Timestamp(special_i64(*v))
        }
        (Repr::TimestampTz, Value::TimestampMicros(v) | Value::Long(v)) => {
            Datum::TimestampTz(special_i64(*v))
        }
        (Repr::TimeTz, Value::Record(fields)) => Datum::TimeTz {
            micros: long_field(ty, fields, "micros")?,
            offset_seconds: int_field(ty, fields, "offset_seconds")?,
        },
        (Repr::Interval, Value::Record(fields)) => Datum::Interval {
            months: int_field(ty, fields, "months")?,
            days: int_field(ty, fields, "days")?,
            micros: long_field(ty, fields, "micros")?,
        },
        (Repr::Array, Value::Array(items)) => {
            let element = array_element(ty).ok_or_else(mismatch)?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let mut inner = item;
                while let Value::Union(_, v) = inner {
                    inner = v;
                }
                out.push(match inner {
                    Value::Null => None,
                    v => Some(from_avro(element, v)?),
                });
            }
            Datum::Array(out)
        }
        _ => return Err(mismatch()),
    })
}

fn special_i64(v: i64) -> Special<i64> {
    match v {
        i64::MAX => Special::Infinity,
        i64::MIN => Special::NegInfinity,
        v => Special::Value(v),
    }
}

fn field<'a>(
    ty: &ColumnType,
    fields: &'a [(String, Value)],
    name: &str,
) -> Result<&'a Value, MappingError> {
    let mut value = fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
        .ok_or_else(|| MappingError::AvroMismatch {
            pg_type: ty.name.clone(),
            found: "record without a required field",
        })?;
    while let Value::Union(_, inner) = value {
        value = inner;
    }
    Ok(value)
}

fn int_field(ty: &ColumnType, fields: &[(String, Value)], name: &str) -> Result<i32, MappingError> {
    match field(ty, fields, name)? {
        Value::Int(v) => Ok(*v),
        Value::Long(v) => {
            i32::try_from(*v).map_err(|_| out_of_range(ty, "record field does not fit an int"))
        }
        other => Err(MappingError::AvroMismatch {
            pg_type: ty.name.clone(),
            found: value_kind(other),
        }),
    }
}

fn long_field(
    ty: &ColumnType,
    fields: &[(String, Value)],
    name: &str,
) -> Result<i64, MappingError> {
    match field(ty, fields, name)? {
        Value::Long(v) => Ok(*v),
        Value::Int(v) => Ok(i64::from(*v)),
        other => Err(MappingError::AvroMismatch {
            pg_type: ty.name.clone(),
            found: value_kind(other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::reader::datum::GenericDatumReader;
    use apache_avro::writer::datum::GenericDatumWriter;
    use apache_avro::Schema;

    fn encode(schema: &Schema, value: Value) -> Vec<u8> {
        GenericDatumWriter::builder(schema)
            .build()
            .unwrap()
            .write_value_to_vec(value)
            .unwrap()
    }

    fn decode(schema: &Schema, bytes: &[u8]) -> Value {
        GenericDatumReader::builder(schema)
            .build()
            .unwrap()
            .read_value(&mut &bytes[..])
            .unwrap()
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

    fn cases() -> Vec<(ColumnType, Vec<Datum>)> {
        use BaseType::*;
        let numeric_12_2 = ColumnType {
            typmod: ((12 << 16) | 2) + 4,
            ..ColumnType::base(Numeric, "numeric")
        };
        let big_numeric = format!("-{}.{}", "9".repeat(1200), "1".repeat(300));
        let mood = ColumnType {
            oid: 90_001,
            typmod: -1,
            name: "public.mood".into(),
            kind: TypeKind::Enum {
                labels: vec!["sad".into(), "ok".into()],
            },
        };
        let price = ColumnType {
            oid: 90_002,
            typmod: -1,
            name: "public.price".into(),
            kind: TypeKind::Domain {
                base: Box::new(numeric_12_2.clone()),
            },
        };
        let span = ColumnType {
            oid: 90_003,
            typmod: -1,
            name: "public.span".into(),
            kind: TypeKind::Domain {
                base: Box::new(ColumnType::base(Interval, "interval")),
            },
        };
        let range = ColumnType {
            oid: 3904,
            typmod: -1,
            name: "int4range".into(),
            kind: TypeKind::Range {
                subtype: Box::new(ColumnType::base(Int4, "integer")),
            },
        };
        let interval = |months, days, micros| Datum::Interval {
            months,
            days,
            micros,
        };
        vec![
            (
                ColumnType::base(Bool, "boolean"),
                vec![Datum::Bool(true), Datum::Bool(false)],
            ),
            (
                ColumnType::base(Int2, "smallint"),
                vec![Datum::Int16(i16::MIN), Datum::Int16(i16::MAX)],
            ),
            (
                ColumnType::base(Int4, "integer"),
                vec![Datum::Int32(i32::MIN), Datum::Int32(0)],
            ),
            (
                ColumnType::base(Int8, "bigint"),
                vec![Datum::Int64(i64::MIN), Datum::Int64(i64::MAX)],
            ),
            (
                ColumnType::base(Oid, "oid"),
                vec![Datum::Int64(4_294_967_295)],
            ),
            (
                ColumnType::base(Float4, "real"),
                vec![
                    Datum::Float32(1.1),
                    Datum::Float32(f32::NAN),
                    Datum::Float32(-0.0),
                    Datum::Float32(f32::NEG_INFINITY),
                ],
            ),
            (
                ColumnType::base(Float8, "double precision"),
                vec![
                    Datum::Float64(5e-324),
                    Datum::Float64(f64::NAN),
                    Datum::Float64(f64::INFINITY),
                ],
            ),
            (
                ColumnType::base(Numeric, "numeric"),
                vec![
                    Datum::Numeric("NaN".into()),
                    Datum::Numeric("Infinity".into()),
                    Datum::Numeric("-Infinity".into()),
                    Datum::Numeric(big_numeric),
                ],
            ),
            (numeric_12_2, vec![Datum::Numeric("1234567890.12".into())]),
            (
                ColumnType::base(Text, "text"),
                vec![Datum::Text(String::new()), Datum::Text("ünï \"x\"".into())],
            ),
            (
                ColumnType::base(Bpchar, "character"),
                vec![Datum::Text("ab   ".into())],
            ),
            (
                ColumnType::base(Xml, "xml"),
                vec![Datum::Text("<a/>".into())],
            ),
            (
                ColumnType::base(Bytea, "bytea"),
                vec![Datum::Bytes(vec![]), Datum::Bytes(vec![0, 255, 10])],
            ),
            (
                ColumnType::base(Uuid, "uuid"),
                vec![Datum::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into())],
            ),
            (
                ColumnType::base(Json, "json"),
                vec![Datum::Json("{\"a\" :  1}".into())],
            ),
            (
                ColumnType::base(Jsonb, "jsonb"),
                vec![Datum::Json("[1, 2]".into())],
            ),
            (
                ColumnType::base(Date, "date"),
                vec![
                    Datum::Date(Special::Value(-2_440_588)),
                    Datum::Date(Special::Value(2_145_042_905)),
                    Datum::Date(Special::Infinity),
                    Datum::Date(Special::NegInfinity),
                ],
            ),
            (
                ColumnType::base(Time, "time without time zone"),
                vec![Datum::Time(0), Datum::Time(86_400_000_000)],
            ),
            (
                ColumnType::base(TimeTz, "time with time zone"),
                vec![
                    Datum::TimeTz {
                        micros: 45_296_789_000,
                        offset_seconds: 19_815,
                    },
                    Datum::TimeTz {
                        micros: 86_400_000_000,
                        offset_seconds: -57_599,
                    },
                ],
            ),
            (
                ColumnType::base(Timestamp, "timestamp without time zone"),
                vec![
                    Datum::Timestamp(Special::Value(-210_866_803_200_000_000)),
                    Datum::Timestamp(Special::Value(i64::MAX - 1)),
                    Datum::Timestamp(Special::Infinity),
                    Datum::Timestamp(Special::NegInfinity),
                ],
            ),
            (
                ColumnType::base(TimestampTz, "timestamp with time zone"),
                vec![
                    Datum::TimestampTz(Special::Value(1_704_164_645_123_456)),
                    Datum::TimestampTz(Special::Infinity),
                    Datum::TimestampTz(Special::NegInfinity),
                ],
            ),
            (
                ColumnType::base(Interval, "interval"),
                vec![
                    interval(-14, 3, -14_706_789_000),
                    interval(i32::MIN, i32::MAX, i64::MIN),
                    interval(0, 0, 0),
                ],
            ),
            (
                ColumnType::base(Inet, "inet"),
                vec![Datum::PgText("192.168.0.1/24".into())],
            ),
            (
                ColumnType::base(Cidr, "cidr"),
                vec![Datum::PgText("10.0.0.0/8".into())],
            ),
            (
                ColumnType::base(Macaddr, "macaddr"),
                vec![Datum::PgText("08:00:2b:01:02:03".into())],
            ),
            (
                ColumnType::base(Macaddr8, "macaddr8"),
                vec![Datum::PgText("08:00:2b:01:02:03:04:05".into())],
            ),
            (
                ColumnType::base(Money, "money"),
                vec![Datum::PgText("$12.50".into())],
            ),
            (
                ColumnType::base(Bit, "bit"),
                vec![Datum::PgText("101".into())],
            ),
            (
                ColumnType::base(Varbit, "bit varying"),
                vec![Datum::PgText("1".into())],
            ),
            (mood.clone(), vec![Datum::PgText("sad".into())]),
            (range, vec![Datum::PgText("[1,5)".into())]),
            (
                ColumnType {
                    oid: 90_004,
                    typmod: -1,
                    name: "public.pair".into(),
                    kind: TypeKind::Composite,
                },
                vec![Datum::PgText("(1,\"a b\")".into())],
            ),
            (
                ColumnType {
                    oid: 90_005,
                    typmod: -1,
                    name: "public.geometry".into(),
                    kind: TypeKind::Other,
                },
                vec![Datum::PgText("0101000000".into())],
            ),
            (price.clone(), vec![Datum::Numeric("12.50".into())]),
            (span.clone(), vec![interval(1, 2, 3)]),
            (
                ColumnType::array_of(ColumnType::base(Int4, "integer")),
                vec![
                    Datum::Array(vec![]),
                    Datum::Array(vec![Some(Datum::Int32(1)), None, Some(Datum::Int32(-3))]),
                ],
            ),
            (
                ColumnType::array_of(ColumnType::base(Text, "text")),
                vec![Datum::Array(vec![Some(Datum::Text("NULL".into())), None])],
            ),
            (
                ColumnType::array_of(ColumnType::base(Interval, "interval")),
                vec![Datum::Array(vec![Some(interval(1, -1, 1)), None])],
            ),
            (
                ColumnType::array_of(ColumnType::base(TimeTz, "time with time zone")),
                vec![Datum::Array(vec![Some(Datum::TimeTz {
                    micros: 1,
                    offset_seconds: 3600,
                })])],
            ),
            (
                ColumnType::array_of(ColumnType::base(TimestampTz, "timestamp with time zone")),
                vec![Datum::Array(vec![
                    Some(Datum::TimestampTz(Special::Infinity)),
                    None,
                ])],
            ),
            (
                ColumnType::array_of(ColumnType::base(Uuid, "uuid")),
                vec![Datum::Array(vec![Some(Datum::Uuid(
                    "00000000-0000-0000-0000-000000000000".into(),
                ))])],
            ),
            (
                ColumnType::array_of(ColumnType::base(Float8, "double precision")),
                vec![Datum::Array(vec![Some(Datum::Float64(f64::NAN))])],
            ),
            (
                ColumnType::array_of(mood),
                vec![Datum::Array(vec![Some(Datum::PgText("ok".into()))])],
            ),
            (
                ColumnType::array_of(price),
                vec![Datum::Array(vec![Some(Datum::Numeric("NaN".into())), None])],
            ),
            (
                ColumnType::array_of(span),
                vec![Datum::Array(vec![Some(interval(0, 0, 1))])],
            ),
        ]
    }

    #[test]
    fn every_type_round_trips_through_avro_binary() {
        for ((ty, datums), decimals) in cases()
            .into_iter()
            .flat_map(|c| [(c.clone(), Decimals::String), (c, Decimals::Precise)])
        {
            let json = column_schema(&ty, "cdc.public.t", "col", decimals);
            assert_eq!(json["pg.type"], json!(ty.name), "{json}");
            let schema =
                Schema::parse(&json).unwrap_or_else(|e| panic!("{}: {e}: {json}", ty.name));
            for datum in datums {
                if let Some(ps) = decimal::decimal_type(&ty, decimals) {
                    // NaN travels as a null field: nothing to round-trip here.
                    if decimal_of(&ty, ps, &datum).unwrap().is_none() {
                        assert!(to_avro(&ty, &datum, decimals).is_err());
                        continue;
                    }
                }
                let value = to_avro(&ty, &datum, decimals).unwrap();
                let mut direct = Vec::new();
                write_avro(&ty, &datum, &mut direct, decimals).unwrap();
                assert!(
                    value.validate(&schema),
                    "{}: {value:?} against {json}",
                    ty.name
                );
                let bytes = encode(&schema, value);
                assert_eq!(bytes, direct, "{}: write_avro differs", ty.name);
                let read = decode(&schema, &bytes);
                let back =
                    from_avro(&ty, &read).unwrap_or_else(|e| panic!("{}: {e}: {read:?}", ty.name));
                assert!(
                    same(&back, &datum),
                    "{}: {datum:?} came back as {back:?}",
                    ty.name
                );
            }
        }
    }

    #[test]
    fn schema_properties() {
        use BaseType::*;
        let numeric = ColumnType {
            typmod: ((12 << 16) | 2) + 4,
            ..ColumnType::base(Numeric, "numeric")
        };
        let s = column_schema(&numeric, "ns", "amount", Decimals::String);
        assert_eq!(
            s,
            json!({"type": "string", "pg.type": "numeric", "pg.typmod": 786_438, "pg.precision": 12, "pg.scale": 2})
        );
        assert_eq!(
            column_schema(
                &ColumnType::base(Numeric, "numeric"),
                "ns",
                "n",
                Decimals::String
            ),
            json!({"type": "string", "pg.type": "numeric"})
        );
        assert_eq!(
            column_schema(
                &ColumnType::base(Uuid, "uuid"),
                "ns",
                "id",
                Decimals::String
            ),
            json!({"type": "string", "logicalType": "uuid", "pg.type": "uuid"})
        );
        assert_eq!(
            column_schema(
                &ColumnType::base(Jsonb, "jsonb"),
                "ns",
                "doc",
                Decimals::String
            ),
            json!({"type": "string", "connect.name": "io.debezium.data.Json", "pg.type": "jsonb"})
        );
        let s = column_schema(
            &ColumnType::base(Interval, "interval"),
            "cdc.public.t",
            "took",
            Decimals::String,
        );
        assert_eq!(s["type"], "record");
        assert_eq!(s["name"], "took_interval");
        assert_eq!(s["namespace"], "cdc.public.t");
        let mood = ColumnType {
            oid: 1,
            typmod: -1,
            name: "public.mood".into(),
            kind: TypeKind::Enum {
                labels: vec!["a".into(), "b".into()],
            },
        };
        assert_eq!(
            column_schema(&mood, "ns", "m", Decimals::String),
            json!({"type": "string", "pg.type": "public.mood", "pg.enum.labels": ["a", "b"]})
        );
        let domain = ColumnType {
            oid: 2,
            typmod: -1,
            name: "public.price".into(),
            kind: TypeKind::Domain {
                base: Box::new(numeric),
            },
        };
        let s = column_schema(&domain, "ns", "p", Decimals::String);
        assert_eq!(s["pg.type"], "public.price");
        assert_eq!(s["pg.domain.base"], "numeric");
        assert_eq!(s["pg.precision"], 12);
        let s = column_schema(
            &ColumnType::array_of(ColumnType::base(Int4, "integer")),
            "ns",
            "xs",
            Decimals::String,
        );
        assert_eq!(
            s,
            json!({"type": "array", "items": ["null", {"type": "int", "pg.type": "integer"}], "pg.type": "integer[]"})
        );
    }

    #[test]
    fn record_names_are_valid_and_unique_in_one_schema() {
        assert_eq!(avro_name("took"), "took");
        assert!(avro_name("1st").starts_with("_1st_"));
        assert_eq!(avro_name("1st").len(), "_1st_".len() + 8);
        let a = avro_name("a b");
        let b = avro_name("a_b");
        let c = avro_name("a-b");
        assert!(a != b && a != c && b != c);
        assert!(avro_name("").starts_with('_'));
        assert!(avro_name("é")
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_'));
        assert_eq!(avro_namespace("cdc.my-db.1x"), "cdc.my_db._1x");

        // A table with several interval / timetz columns (also inside arrays) parses as one schema.
        let ns = "cdc.public.t";
        let columns = [
            ("a", ColumnType::base(BaseType::Interval, "interval")),
            ("a b", ColumnType::base(BaseType::Interval, "interval")),
            ("a_b", ColumnType::base(BaseType::Interval, "interval")),
            (
                "b",
                ColumnType::base(BaseType::TimeTz, "time with time zone"),
            ),
            (
                "c",
                ColumnType::array_of(ColumnType::base(BaseType::Interval, "interval")),
            ),
            (
                "d",
                ColumnType::array_of(ColumnType::base(BaseType::TimeTz, "time with time zone")),
            ),
        ];
        let fields: Vec<Json> = columns
            .iter()
            .enumerate()
            .map(|(i, (name, ty))| json!({"name": format!("f{i}"), "type": ["null", column_schema(ty, ns, name, Decimals::String)], "default": null}))
            .collect();
        let record = json!({"type": "record", "name": "Value", "namespace": ns, "fields": fields});
        let schema = Schema::parse(&record).unwrap();
        let values: Vec<(String, Value)> = columns
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| {
                let datum = match repr(ty) {
                    Repr::Interval => Datum::Interval {
                        months: 1,
                        days: 2,
                        micros: 3,
                    },
                    Repr::TimeTz => Datum::TimeTz {
                        micros: 4,
                        offset_seconds: 5,
                    },
                    _ => Datum::Array(vec![None]),
                };
                (
                    format!("f{i}"),
                    Value::Union(1, Box::new(to_avro(ty, &datum, Decimals::String).unwrap())),
                )
            })
            .collect();
        let value = Value::Record(values);
        assert!(value.validate(&schema));
        let bytes = encode(&schema, value);
        assert!(matches!(decode(&schema, &bytes), Value::Record(_)));
    }

    #[test]
    fn bounded_numerics_are_debezium_decimals_and_the_rest_stay_text() {
        let n = |p: i32, s: i32| ColumnType {
            typmod: ((p << 16) | s) + 4,
            ..ColumnType::base(BaseType::Numeric, "numeric")
        };
        let s = column_schema(&n(18, 2), "ns", "amount", Decimals::Precise);
        assert_eq!(
            s,
            json!({"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2,
                "connect.name": "org.apache.kafka.connect.data.Decimal", "connect.version": 1,
                "connect.parameters": {"scale": "2", "connect.decimal.precision": "18"},
                "pg.precision": 18, "pg.scale": 2, "pg.type": "numeric", "pg.typmod": 1_179_654})
        );
        let schema = Schema::parse(&s).unwrap();
        assert!(matches!(schema, Schema::Decimal(_)), "{schema:?}");
        for (text, bytes) in [
            ("-0.01", vec![0xFF]),
            ("1.28", vec![0x00, 0x80]),
            ("0.00", vec![0]),
        ] {
            let v = to_avro(&n(18, 2), &Datum::Numeric(text.into()), Decimals::Precise).unwrap();
            assert_eq!(v, Value::Decimal(apache_avro::Decimal::from(bytes)));
            let back = from_avro(&n(18, 2), &decode(&schema, &encode(&schema, v))).unwrap();
            assert!(matches!(back, Datum::Numeric(t) if t == text));
        }
        // NaN has no decimal; rounding is refused, never done.
        assert_eq!(
            decimal_of(&n(5, 0), (5, 0), &Datum::Numeric("NaN".into())),
            Ok(None)
        );
        let err =
            to_avro(&n(5, 2), &Datum::Numeric("1.234".into()), Decimals::Precise).unwrap_err();
        assert_eq!(err.class(), ErrorClass::Record);
        // Unbounded, p > 38 and numeric arrays keep the text.
        for ty in [
            ColumnType::base(BaseType::Numeric, "numeric"),
            n(39, 2),
            ColumnType::array_of(n(18, 2)),
        ] {
            let s = column_schema(&ty, "ns", "x", Decimals::Precise);
            assert!(!s.to_string().contains("decimal"), "{s}");
        }
    }

    #[test]
    fn mismatches_and_sentinel_collisions_are_errors() {
        use BaseType::*;
        let date = ColumnType::base(Date, "date");
        assert!(matches!(
            to_avro(
                &date,
                &Datum::Date(Special::Value(i32::MAX)),
                Decimals::String
            ),
            Err(MappingError::OutOfRange { .. })
        ));
        let ts = ColumnType::base(TimestampTz, "timestamp with time zone");
        assert!(matches!(
            to_avro(
                &ts,
                &Datum::TimestampTz(Special::Value(i64::MIN)),
                Decimals::String
            ),
            Err(MappingError::OutOfRange { .. })
        ));
        assert!(matches!(
            to_avro(&ts, &Datum::Timestamp(Special::Infinity), Decimals::String),
            Err(MappingError::DatumMismatch { .. })
        ));
        let uuid = ColumnType::base(Uuid, "uuid");
        assert!(to_avro(
            &uuid,
            &Datum::Uuid("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11".into()),
            Decimals::String
        )
        .is_err());
        let secret = Datum::Text("4111111111111111".into());
        let err = to_avro(
            &ColumnType::base(Int4, "integer"),
            &secret,
            Decimals::String,
        )
        .unwrap_err();
        assert!(err.to_string().contains("integer") && !err.to_string().contains("4111"));
        assert_eq!(err.class(), ErrorClass::Record);
        let int2 = ColumnType::base(Int2, "smallint");
        assert!(matches!(
            from_avro(&int2, &Value::Int(40_000)),
            Err(MappingError::OutOfRange { .. })
        ));
        assert!(matches!(
            from_avro(&int2, &Value::Union(0, Box::new(Value::Null))),
            Err(MappingError::UnexpectedNull { .. })
        ));
        assert!(matches!(
            from_avro(&int2, &Value::String("1".into())),
            Err(MappingError::AvroMismatch { .. })
        ));
        let interval = ColumnType::base(Interval, "interval");
        let partial = Value::Record(vec![("months".into(), Value::Int(1))]);
        assert!(from_avro(&interval, &partial).is_err());
    }

    #[test]
    fn temporal_columns_are_plain_integers_with_a_semantic_name() {
        use BaseType::*;
        let cases = [
            (ColumnType::base(Date, "date"), "int", temporal::DATE),
            (
                ColumnType::base(Time, "time without time zone"),
                "long",
                temporal::MICRO_TIME,
            ),
            (
                ColumnType::base(Timestamp, "timestamp without time zone"),
                "long",
                temporal::MICRO_TIMESTAMP,
            ),
            (
                ColumnType::base(TimestampTz, "timestamp with time zone"),
                "long",
                temporal::MICRO_TIMESTAMP_UTC,
            ),
        ];
        for (ty, primitive, name) in &cases {
            let s = column_schema(ty, "ns", "c", Decimals::String);
            assert_eq!(
                s,
                json!({"type": primitive, "connect.name": name, "connect.version": 1, "pg.type": &ty.name}),
                "no logicalType: every Avro client reads the plain integer"
            );
        }
        assert_eq!(
            to_avro(
                &cases[0].0,
                &Datum::Date(Special::Infinity),
                Decimals::String
            ),
            Ok(Value::Int(i32::MAX))
        );
        assert_eq!(
            to_avro(&cases[1].0, &Datum::Time(86_400_000_000), Decimals::String),
            Ok(Value::Long(86_400_000_000))
        );
        assert_eq!(
            to_avro(
                &cases[3].0,
                &Datum::TimestampTz(Special::NegInfinity),
                Decimals::String
            ),
            Ok(Value::Long(i64::MIN))
        );
        // What was written with the plain schema reads back through the lake's view (logical
        // types added) as the logical variants, and from_avro gives the same datum.
        for (ty, _, _) in &cases {
            let plain = column_schema(ty, "ns", "c", Decimals::String);
            let lake = Schema::parse(&temporal::with_logical_types(&plain)).unwrap();
            let datum = match ty.kind {
                TypeKind::Base(Date) => Datum::Date(Special::Value(2_145_042_905)),
                TypeKind::Base(Time) => Datum::Time(86_400_000_000),
                TypeKind::Base(Timestamp) => Datum::Timestamp(Special::Infinity),
                _ => Datum::TimestampTz(Special::Value(9_214_646_400_000_000)),
            };
            let bytes = encode(
                &Schema::parse(&plain).unwrap(),
                to_avro(ty, &datum, Decimals::String).unwrap(),
            );
            let read = decode(&lake, &bytes);
            assert!(
                !matches!(read, Value::Int(_) | Value::Long(_)),
                "{}: {read:?}",
                ty.name
            );
            assert_eq!(from_avro(ty, &read), Ok(datum));
        }
    }

    #[test]
    fn from_avro_accepts_plain_and_logical_variants() {
        use BaseType::*;
        let uuid = ColumnType::base(Uuid, "uuid");
        let schema = Schema::parse(&column_schema(&uuid, "ns", "id", Decimals::String)).unwrap();
        let bytes = encode(
            &schema,
            Value::String("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into()),
        );
        let read = decode(&schema, &bytes);
        assert!(matches!(read, Value::Uuid(_)));
        assert_eq!(
            from_avro(&uuid, &read),
            Ok(Datum::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into()))
        );
        assert_eq!(
            from_avro(&ColumnType::base(Date, "date"), &Value::Int(i32::MIN)),
            Ok(Datum::Date(Special::NegInfinity))
        );
        assert_eq!(
            from_avro(
                &ColumnType::base(Timestamp, "timestamp without time zone"),
                &Value::Long(i64::MAX)
            ),
            Ok(Datum::Timestamp(Special::Infinity))
        );
        assert_eq!(
            from_avro(
                &ColumnType::base(TimestampTz, "timestamp with time zone"),
                &Value::Union(1, Box::new(Value::TimestampMicros(0)))
            ),
            Ok(Datum::TimestampTz(Special::Value(0)))
        );
        assert_eq!(
            from_avro(&ColumnType::base(Time, "time"), &Value::TimeMicros(1)),
            Ok(Datum::Time(1))
        );
    }
}
