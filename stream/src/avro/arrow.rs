//! Avro schemas and values as Arrow types and arrays (what the bronze stage writes).
//!
//! The mapping follows the Avro types capture registers (`docs/types.md`):
//!
//! | Avro | Arrow |
//! | --- | --- |
//! | `boolean`, `int`, `long`, `float`, `double` | `Boolean`, `Int32`, `Int64`, `Float32`, `Float64` |
//! | `string` (also `uuid`, enums) | `Utf8` |
//! | `bytes`, `fixed` | `Binary` |
//! | `date` | `Date32`; `±infinity` and years past 262,142 mapped into range ([`super::dates`]) |
//! | `time-micros` / `time-millis` | `Int64` / `Int32` (Delta has no time type) |
//! | `timestamp-micros` / `-millis` | `Timestamp(µs, "UTC")` |
//! | `local-timestamp-micros` / `-millis` | `Timestamp(µs)` (Delta `timestamp_ntz`) |
//! | record | `Struct` |
//! | array | `List` (item field `element`) |
//! | `["null", T]` | `T` |
//!
//! Every Arrow field is nullable: Bronze keeps values as they arrived and must never refuse
//! a row because a later schema version relaxed a constraint. Other Avro shapes (maps,
//! unions of several types, decimals, nanosecond timestamps) are refused with
//! [`ArrowMappingError::Unsupported`]; capture never registers them.

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::schema::{Name, ResolvedSchema, Schema, SchemaKind};
use apache_avro::types::Value;
use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
    Int32Array, Int64Array, ListArray, StringArray, StructArray, TimestampMicrosecondArray,
};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};

use super::types::value_kind;

/// Why a schema or value has no Arrow form. Messages name types and paths, never values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrowMappingError {
    #[error("Avro type {kind} at {path} has no Arrow mapping")]
    Unsupported { path: String, kind: String },
    #[error("Avro schema names an undefined type {name}")]
    Unresolved { name: String },
    #[error("Avro value at {path} is a {found}, its schema says {expected}")]
    Mismatch {
        path: String,
        expected: String,
        found: &'static str,
    },
    #[error("cannot build the Arrow array at {path}: {reason}")]
    Build { path: String, reason: String },
}

/// The item field of every list.
pub const LIST_ITEM: &str = "element";

/// The Arrow types of one Avro schema, with its named types resolved.
pub struct ArrowTypes<'s> {
    names: HashMap<Name, &'s Schema>,
}

impl<'s> ArrowTypes<'s> {
    pub fn new(schema: &'s Schema) -> Result<Self, ArrowMappingError> {
        let resolved =
            ResolvedSchema::try_from(schema).map_err(|e| ArrowMappingError::Unresolved {
                name: e.to_string(),
            })?;
        Ok(ArrowTypes {
            names: resolved.get_names().clone(),
        })
    }

    /// Resolves a reference to a named type.
    pub fn resolve(&self, schema: &'s Schema) -> Result<&'s Schema, ArrowMappingError> {
        match schema {
            Schema::Ref { name } => {
                self.names
                    .get(name)
                    .copied()
                    .ok_or_else(|| ArrowMappingError::Unresolved {
                        name: name.fullname(None),
                    })
            }
            other => Ok(other),
        }
    }

    /// The Arrow type of values of `schema` (a `["null", T]` union maps to `T`).
    pub fn data_type(&self, schema: &'s Schema, path: &str) -> Result<DataType, ArrowMappingError> {
        let unsupported = || ArrowMappingError::Unsupported {
            path: path.to_owned(),
            kind: format!("{:?}", SchemaKind::from(schema)),
        };
        Ok(match self.resolve(schema)? {
            Schema::Boolean => DataType::Boolean,
            Schema::Int | Schema::TimeMillis => DataType::Int32,
            Schema::Long | Schema::TimeMicros => DataType::Int64,
            Schema::Float => DataType::Float32,
            Schema::Double => DataType::Float64,
            Schema::String | Schema::Uuid(_) | Schema::Enum(_) => DataType::Utf8,
            Schema::Bytes | Schema::Fixed(_) => DataType::Binary,
            Schema::Date => DataType::Date32,
            Schema::Decimal(d) => decimal128(d).ok_or_else(|| ArrowMappingError::Unsupported {
                path: path.to_owned(),
                kind: format!("decimal({}, {})", d.precision, d.scale),
            })?,
            Schema::TimestampMillis | Schema::TimestampMicros => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
            Schema::LocalTimestampMillis | Schema::LocalTimestampMicros => {
                DataType::Timestamp(TimeUnit::Microsecond, None)
            }
            Schema::Union(u) => {
                let non_null: Vec<&Schema> = u
                    .variants()
                    .iter()
                    .filter(|v| !matches!(v, Schema::Null))
                    .collect();
                match non_null.as_slice() {
                    [only] => self.data_type(only, path)?,
                    _ => return Err(unsupported()),
                }
            }
            Schema::Array(a) => {
                let item = self.data_type(&a.items, &format!("{path}[]"))?;
                DataType::List(Arc::new(Field::new(LIST_ITEM, item, true)))
            }
            Schema::Record(r) => {
                let mut fields = Vec::with_capacity(r.fields.len());
                for f in &r.fields {
                    let ty = self.data_type(&f.schema, &format!("{path}.{}", f.name))?;
                    fields.push(Field::new(&f.name, ty, true));
                }
                DataType::Struct(Fields::from(fields))
            }
            _ => return Err(unsupported()),
        })
    }
}

/// A value with its `["null", T]` union wrapper removed; `None` for null.
pub fn present(v: &Value) -> Option<&Value> {
    match v {
        Value::Null => None,
        Value::Union(_, inner) => present(inner),
        other => Some(other),
    }
}

/// The Arrow type of an Avro `decimal` written as `bytes` (a bounded numeric,
/// `super::decimal`): `Decimal128(p, s)` when `1 <= p <= 38` and `s <= p`, else none (a
/// fixed-size decimal or one wider than 38 digits has no lake column).
pub fn decimal128(d: &apache_avro::schema::DecimalSchema) -> Option<DataType> {
    let bytes = matches!(d.inner, apache_avro::schema::InnerDecimalSchema::Bytes);
    let p = u8::try_from(d.precision).ok()?;
    let s = i8::try_from(d.scale).ok()?;
    (bytes && (1..=38).contains(&p) && (0..=p as i8).contains(&s))
        .then_some(DataType::Decimal128(p, s))
}

/// Builds the Arrow array of type `ty` holding `values` (`None` is null).
pub fn build_array(
    ty: &DataType,
    values: &[Option<&Value>],
    path: &str,
) -> Result<ArrayRef, ArrowMappingError> {
    let mismatch = |v: &Value| ArrowMappingError::Mismatch {
        path: path.to_owned(),
        expected: ty.to_string(),
        found: value_kind(v),
    };
    // Collects one scalar per value, failing on the first value of the wrong kind.
    macro_rules! scalars {
        ($array:ty, $pat:pat => $out:expr) => {{
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                out.push(match v {
                    None => None,
                    Some($pat) => Some($out),
                    Some(other) => return Err(mismatch(other)),
                });
            }
            Arc::new(<$array>::from(out)) as ArrayRef
        }};
    }
    Ok(match ty {
        DataType::Boolean => scalars!(BooleanArray, Value::Boolean(b) => *b),
        DataType::Int32 => scalars!(Int32Array, Value::Int(i) | Value::TimeMillis(i) => *i),
        DataType::Int64 => scalars!(Int64Array, Value::Long(i) | Value::TimeMicros(i) => *i),
        DataType::Float32 => scalars!(Float32Array, Value::Float(f) => *f),
        DataType::Float64 => scalars!(Float64Array, Value::Double(f) => *f),
        DataType::Decimal128(p, s) => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                out.push(match v {
                    None => None,
                    Some(Value::Decimal(d)) => Some(
                        Vec::<u8>::try_from(d)
                            .ok()
                            .and_then(|b| super::decimal::from_be_bytes(&b))
                            .filter(|v| v.unsigned_abs() < 10u128.pow(u32::from(*p)))
                            .ok_or_else(|| ArrowMappingError::Build {
                                path: path.to_owned(),
                                reason: "a decimal with more digits than its precision".into(),
                            })?,
                    ),
                    Some(other) => return Err(mismatch(other)),
                });
            }
            Arc::new(
                Decimal128Array::from(out)
                    .with_precision_and_scale(*p, *s)
                    .map_err(|e| ArrowMappingError::Build {
                        path: path.to_owned(),
                        reason: e.to_string(),
                    })?,
            )
        }
        // Kept inside the calendar Delta writers can describe (`super::dates`).
        DataType::Date32 => {
            scalars!(Date32Array, Value::Date(d) | Value::Int(d) => super::dates::lake_date(*d).0)
        }
        DataType::Utf8 => {
            let mut out: Vec<Option<String>> = Vec::with_capacity(values.len());
            for v in values {
                out.push(match v {
                    None => None,
                    Some(Value::String(s)) | Some(Value::Enum(_, s)) => Some(s.clone()),
                    Some(Value::Uuid(u)) => Some(u.to_string()),
                    Some(other) => return Err(mismatch(other)),
                });
            }
            Arc::new(StringArray::from(out))
        }
        DataType::Binary => {
            let mut out: Vec<Option<&[u8]>> = Vec::with_capacity(values.len());
            for v in values {
                out.push(match v {
                    None => None,
                    Some(Value::Bytes(b)) | Some(Value::Fixed(_, b)) => Some(b.as_slice()),
                    Some(other) => return Err(mismatch(other)),
                });
            }
            Arc::new(BinaryArray::from(out))
        }
        DataType::Timestamp(TimeUnit::Microsecond, tz) => {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                out.push(match v {
                    None => None,
                    Some(
                        Value::TimestampMicros(t) | Value::LocalTimestampMicros(t) | Value::Long(t),
                    ) => Some(*t),
                    Some(Value::TimestampMillis(t) | Value::LocalTimestampMillis(t)) => Some(
                        t.checked_mul(1000)
                            .ok_or_else(|| ArrowMappingError::Build {
                                path: path.to_owned(),
                                reason: "millisecond timestamp out of the microsecond range".into(),
                            })?,
                    ),
                    Some(other) => return Err(mismatch(other)),
                });
            }
            Arc::new(TimestampMicrosecondArray::from(out).with_timezone_opt(tz.clone()))
        }
        DataType::List(item) => {
            let mut offsets = Vec::with_capacity(values.len() + 1);
            offsets.push(0i32);
            let mut items: Vec<Option<&Value>> = Vec::new();
            let mut valid = Vec::with_capacity(values.len());
            for v in values {
                match v {
                    None => valid.push(false),
                    Some(Value::Array(elems)) => {
                        valid.push(true);
                        items.extend(elems.iter().map(present));
                    }
                    Some(other) => return Err(mismatch(other)),
                }
                let len = i32::try_from(items.len()).map_err(|_| ArrowMappingError::Build {
                    path: path.to_owned(),
                    reason: "more than 2^31 list items in one batch".into(),
                })?;
                offsets.push(len);
            }
            let child = build_array(item.data_type(), &items, &format!("{path}[]"))?;
            Arc::new(
                ListArray::try_new(
                    item.clone(),
                    OffsetBuffer::new(offsets.into()),
                    child,
                    Some(NullBuffer::from(valid)),
                )
                .map_err(|e| ArrowMappingError::Build {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?,
            )
        }
        DataType::Struct(fields) => {
            let mut records: Vec<Option<&[(String, Value)]>> = Vec::with_capacity(values.len());
            for v in values {
                records.push(match v {
                    None => None,
                    Some(Value::Record(fs)) => Some(fs.as_slice()),
                    Some(other) => return Err(mismatch(other)),
                });
            }
            let mut children = Vec::with_capacity(fields.len());
            for (i, field) in fields.iter().enumerate() {
                let column: Vec<Option<&Value>> = records
                    .iter()
                    .map(|r| {
                        r.and_then(|fs| record_field(fs, i, field.name()))
                            .and_then(present)
                    })
                    .collect();
                children.push(build_array(
                    field.data_type(),
                    &column,
                    &format!("{path}.{}", field.name()),
                )?);
            }
            let valid: Vec<bool> = records.iter().map(Option::is_some).collect();
            Arc::new(
                StructArray::try_new(fields.clone(), children, Some(NullBuffer::from(valid)))
                    .map_err(|e| ArrowMappingError::Build {
                        path: path.to_owned(),
                        reason: e.to_string(),
                    })?,
            )
        }
        other => {
            return Err(ArrowMappingError::Unsupported {
                path: path.to_owned(),
                kind: other.to_string(),
            })
        }
    })
}

/// Field `name` of a record, looked up at its expected position first.
pub fn record_field<'v>(fields: &'v [(String, Value)], at: usize, name: &str) -> Option<&'v Value> {
    match fields.get(at) {
        Some((n, v)) if n == name => Some(v),
        _ => fields.iter().find(|(n, _)| n == name).map(|(_, v)| v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Array;

    fn schema() -> Schema {
        Schema::parse_str(
            r#"{"type":"record","name":"R","namespace":"t","fields":[
                {"name":"before","type":["null",{"type":"record","name":"Value","fields":[
                    {"name":"id","type":"long"},
                    {"name":"tags","type":["null",{"type":"array","items":["null","string"]}]},
                    {"name":"at","type":["null",{"type":"long","logicalType":"timestamp-micros"}]},
                    {"name":"day","type":["null",{"type":"int","logicalType":"date"}]},
                    {"name":"iv","type":["null",{"type":"record","name":"iv_interval","fields":[
                        {"name":"months","type":"int"},{"name":"days","type":"int"},{"name":"micros","type":"long"}]}]}
                ]}]},
                {"name":"after","type":["null","t.Value"]}
            ]}"#,
        )
        .unwrap()
    }

    #[test]
    fn named_references_resolve_and_types_map() {
        let s = schema();
        let types = ArrowTypes::new(&s).unwrap();
        let Schema::Record(r) = &s else { panic!() };
        let before = types.data_type(&r.fields[0].schema, "before").unwrap();
        let after = types.data_type(&r.fields[1].schema, "after").unwrap();
        assert_eq!(before, after, "the reference resolves to the same record");
        let DataType::Struct(fields) = before else {
            panic!("{before}")
        };
        assert_eq!(fields[0].data_type(), &DataType::Int64);
        assert!(
            matches!(fields[1].data_type(), DataType::List(f) if f.data_type() == &DataType::Utf8)
        );
        assert_eq!(
            fields[2].data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert_eq!(fields[3].data_type(), &DataType::Date32);
        assert!(matches!(fields[4].data_type(), DataType::Struct(f) if f.len() == 3));
    }

    #[test]
    fn values_build_nested_arrays_with_nulls() {
        let s = schema();
        let types = ArrowTypes::new(&s).unwrap();
        let Schema::Record(r) = &s else { panic!() };
        let ty = types.data_type(&r.fields[0].schema, "before").unwrap();
        let row = Value::Record(vec![
            ("id".into(), Value::Long(7)),
            (
                "tags".into(),
                Value::Union(
                    1,
                    Box::new(Value::Array(vec![
                        Value::Union(1, Box::new(Value::String("a".into()))),
                        Value::Union(0, Box::new(Value::Null)),
                    ])),
                ),
            ),
            (
                "at".into(),
                Value::Union(1, Box::new(Value::TimestampMicros(i64::MAX))),
            ),
            ("day".into(), Value::Union(0, Box::new(Value::Null))),
            (
                "iv".into(),
                Value::Union(
                    1,
                    Box::new(Value::Record(vec![
                        ("months".into(), Value::Int(-1)),
                        ("days".into(), Value::Int(2)),
                        ("micros".into(), Value::Long(3)),
                    ])),
                ),
            ),
        ]);
        let array = build_array(&ty, &[Some(&row), None], "before").unwrap();
        assert_eq!(array.len(), 2);
        assert!(array.is_valid(0) && array.is_null(1));
        let s = array.as_any().downcast_ref::<StructArray>().unwrap();
        let ids = s.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(ids.value(0), 7);
        let tags = s.column(1).as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(tags.value(0).len(), 2);
        assert!(tags.value(0).is_null(1));
        let at = s
            .column(2)
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        assert_eq!(
            at.value(0),
            i64::MAX,
            "infinity keeps PostgreSQL's sentinel"
        );
        assert!(s.column(3).is_null(0));
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_an_error_naming_the_path() {
        let err = build_array(
            &DataType::Int64,
            &[Some(&Value::String("x".into()))],
            "after.id",
        )
        .unwrap_err();
        assert_eq!(
            err,
            ArrowMappingError::Mismatch {
                path: "after.id".into(),
                expected: "Int64".into(),
                found: "string"
            }
        );
        let map = Schema::parse_str(r#"{"type":"map","values":"long"}"#).unwrap();
        let types = ArrowTypes::new(&map).unwrap();
        assert!(matches!(
            types.data_type(&map, "x"),
            Err(ArrowMappingError::Unsupported { .. })
        ));
    }
}
