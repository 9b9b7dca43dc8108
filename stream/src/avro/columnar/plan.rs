//! What a writer schema's bytes become: a tree of [`Node`]s, compiled once per schema id.
//!
//! A node says how to read one value and which Arrow column it lands in, following the
//! mapping of [`crate::avro::arrow`] (the node's [`Node::data_type`] is
//! [`ArrowTypes::data_type`] of its schema, which the tests hold equal). Parts of a schema
//! Bronze has no column for are compiled into [`Shape`]s, which only skip their bytes or
//! yield the scalars the envelope's metadata columns take.

use std::sync::Arc;

use apache_avro::schema::{InnerDecimalSchema, Schema, SchemaKind, UuidSchema};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};

use crate::avro::arrow::{ArrowMappingError, ArrowTypes, LIST_ITEM};

/// Nesting deeper than this is refused: it bounds the recursion of compiling and reading
/// (a recursive named type would otherwise never end).
const MAX_DEPTH: usize = 64;

/// How one value is read into its column.
#[derive(Debug, Clone)]
pub enum Node {
    Boolean,
    /// `int` and `time-millis`.
    Int,
    /// `long` and `time-micros`.
    Long,
    Float,
    Double,
    /// Kept inside the lake's calendar (`crate::avro::dates`).
    Date,
    /// A timestamp into microseconds; `millis` multiplies (checked) by 1,000.
    Timestamp {
        millis: bool,
        utc: bool,
    },
    String,
    /// Text in Arrow; the Avro value may be text, 16 raw bytes, or a fixed of 16.
    Uuid(UuidForm),
    /// The symbol's name.
    Enum(Arc<[String]>),
    Bytes,
    Fixed(usize),
    /// An Avro `decimal` (bytes) of at most 38 digits: `Decimal128(precision, scale)`.
    Decimal {
        precision: u8,
        scale: i8,
    },
    /// A union of `null` and one other type: `null_branch` is the index of `null` (none
    /// for a union of the other type alone).
    Nullable {
        branches: usize,
        null_branch: Option<usize>,
        inner: Box<Node>,
    },
    Array {
        item: Box<Node>,
        /// Whether a date can be in an item ([`Node::has_dates`]).
        dates: bool,
    },
    Record(Vec<FieldNode>),
}

/// A field of a record.
#[derive(Debug, Clone)]
pub struct FieldNode {
    pub name: Arc<str>,
    pub node: Node,
    /// Whether a date can be in the field ([`Node::has_dates`]).
    pub dates: bool,
}

/// How a uuid is written: as text, as 16 length-prefixed bytes, as a fixed of 16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UuidForm {
    Text,
    Bytes,
    Fixed,
}

impl Node {
    /// The Arrow type of the column the node fills.
    pub fn data_type(&self) -> DataType {
        match self {
            Node::Boolean => DataType::Boolean,
            Node::Int => DataType::Int32,
            Node::Long => DataType::Int64,
            Node::Float => DataType::Float32,
            Node::Double => DataType::Float64,
            Node::Date => DataType::Date32,
            Node::Timestamp { utc, .. } => {
                DataType::Timestamp(TimeUnit::Microsecond, utc.then(|| "UTC".into()))
            }
            Node::String | Node::Uuid(_) | Node::Enum(_) => DataType::Utf8,
            Node::Bytes | Node::Fixed(_) => DataType::Binary,
            Node::Decimal { precision, scale } => DataType::Decimal128(*precision, *scale),
            Node::Nullable { inner, .. } => inner.data_type(),
            Node::Array { item, .. } => {
                DataType::List(Arc::new(Field::new(LIST_ITEM, item.data_type(), true)))
            }
            Node::Record(fields) => DataType::Struct(Fields::from(
                fields
                    .iter()
                    .map(|f| Field::new(f.name.as_ref(), f.node.data_type(), true))
                    .collect::<Vec<_>>(),
            )),
        }
    }

    /// Whether a date can be inside: only then does reading track the value's path (for
    /// `out_of_range_values`).
    pub fn has_dates(&self) -> bool {
        match self {
            Node::Date => true,
            Node::Nullable { inner, .. } => inner.has_dates(),
            Node::Array { dates, .. } => *dates,
            Node::Record(fields) => fields.iter().any(|f| f.dates),
            _ => false,
        }
    }
}

/// A value Bronze has no column for: read only to skip it, or for a scalar of the
/// envelope's metadata.
#[derive(Debug, Clone)]
pub enum Shape {
    Null,
    Boolean,
    /// A plain `int`.
    Int,
    /// A plain `long`.
    Long,
    /// An `int` or `long` with a logical type: skipped, as the decoded value is not a
    /// plain number.
    OtherVarint,
    Float,
    Double,
    /// A plain `string`.
    String,
    /// `bytes`, a `string` with a logical type (uuid), a `bytes` decimal.
    OtherBytes,
    Fixed(usize),
    Enum,
    Array(Box<Shape>),
    Map(Box<Shape>),
    Union(Vec<Shape>),
    Record(Vec<Shape>),
}

/// Compiles nodes and shapes from one schema, its named types resolved.
pub struct Compiler<'s> {
    types: ArrowTypes<'s>,
}

impl<'s> Compiler<'s> {
    pub fn new(schema: &'s Schema) -> Result<Self, ArrowMappingError> {
        Ok(Compiler {
            types: ArrowTypes::new(schema)?,
        })
    }

    pub fn resolve(&self, schema: &'s Schema) -> Result<&'s Schema, ArrowMappingError> {
        self.types.resolve(schema)
    }

    /// The node of a value of `schema` at `path` (named in errors).
    pub fn node(&self, schema: &'s Schema, path: &str) -> Result<Node, ArrowMappingError> {
        self.node_at(schema, path, 0)
    }

    fn node_at(
        &self,
        schema: &'s Schema,
        path: &str,
        depth: usize,
    ) -> Result<Node, ArrowMappingError> {
        let unsupported = |kind: String| ArrowMappingError::Unsupported {
            path: path.to_owned(),
            kind,
        };
        if depth > MAX_DEPTH {
            return Err(unsupported(format!("nesting deeper than {MAX_DEPTH}")));
        }
        let schema = self.resolve(schema)?;
        Ok(match schema {
            Schema::Boolean => Node::Boolean,
            Schema::Int | Schema::TimeMillis => Node::Int,
            Schema::Long | Schema::TimeMicros => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::String => Node::String,
            Schema::Uuid(UuidSchema::String) => Node::Uuid(UuidForm::Text),
            Schema::Uuid(UuidSchema::Bytes) => Node::Uuid(UuidForm::Bytes),
            Schema::Uuid(UuidSchema::Fixed(f)) if f.size == 16 => Node::Uuid(UuidForm::Fixed),
            Schema::Enum(e) => Node::Enum(e.symbols.clone().into()),
            Schema::Bytes => Node::Bytes,
            Schema::Fixed(f) => Node::Fixed(f.size),
            Schema::Date => Node::Date,
            Schema::Decimal(d) => match crate::avro::arrow::decimal128(d) {
                Some(DataType::Decimal128(precision, scale)) => Node::Decimal { precision, scale },
                _ => return Err(unsupported(format!("{:?}", SchemaKind::from(schema)))),
            },
            Schema::TimestampMillis => Node::Timestamp {
                millis: true,
                utc: true,
            },
            Schema::TimestampMicros => Node::Timestamp {
                millis: false,
                utc: true,
            },
            Schema::LocalTimestampMillis => Node::Timestamp {
                millis: true,
                utc: false,
            },
            Schema::LocalTimestampMicros => Node::Timestamp {
                millis: false,
                utc: false,
            },
            Schema::Union(u) => {
                let variants = u.variants();
                let null_branch = variants.iter().position(|v| matches!(v, Schema::Null));
                let others: Vec<&'s Schema> = variants
                    .iter()
                    .filter(|v| !matches!(v, Schema::Null))
                    .collect();
                let [only] = others.as_slice() else {
                    return Err(unsupported(format!("{:?}", SchemaKind::from(schema))));
                };
                Node::Nullable {
                    branches: variants.len(),
                    null_branch,
                    inner: Box::new(self.node_at(only, path, depth + 1)?),
                }
            }
            Schema::Array(a) => {
                let item = self.node_at(&a.items, &format!("{path}[]"), depth + 1)?;
                Node::Array {
                    dates: item.has_dates(),
                    item: Box::new(item),
                }
            }
            Schema::Record(r) => {
                let mut fields = Vec::with_capacity(r.fields.len());
                for f in &r.fields {
                    let node = self.node_at(&f.schema, &format!("{path}.{}", f.name), depth + 1)?;
                    fields.push(FieldNode {
                        name: Arc::from(f.name.as_str()),
                        dates: node.has_dates(),
                        node,
                    });
                }
                Node::Record(fields)
            }
            _ => return Err(unsupported(format!("{:?}", SchemaKind::from(schema)))),
        })
    }

    /// The shape of a value of `schema` that has no column.
    pub fn shape(&self, schema: &'s Schema, path: &str) -> Result<Shape, ArrowMappingError> {
        self.shape_at(schema, path, 0)
    }

    fn shape_at(
        &self,
        schema: &'s Schema,
        path: &str,
        depth: usize,
    ) -> Result<Shape, ArrowMappingError> {
        if depth > MAX_DEPTH {
            return Err(ArrowMappingError::Unsupported {
                path: path.to_owned(),
                kind: format!("nesting deeper than {MAX_DEPTH}"),
            });
        }
        let inner = |s: &'s Schema| self.shape_at(s, path, depth + 1);
        Ok(match self.resolve(schema)? {
            Schema::Null => Shape::Null,
            Schema::Boolean => Shape::Boolean,
            Schema::Int => Shape::Int,
            Schema::Long => Shape::Long,
            Schema::Date
            | Schema::TimeMillis
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => Shape::OtherVarint,
            Schema::Float => Shape::Float,
            Schema::Double => Shape::Double,
            Schema::String => Shape::String,
            Schema::Bytes
            | Schema::BigDecimal
            | Schema::Uuid(UuidSchema::String | UuidSchema::Bytes) => Shape::OtherBytes,
            Schema::Decimal(d) => match &d.inner {
                InnerDecimalSchema::Fixed(f) => Shape::Fixed(f.size),
                InnerDecimalSchema::Bytes => Shape::OtherBytes,
            },
            Schema::Uuid(UuidSchema::Fixed(f)) | Schema::Fixed(f) | Schema::Duration(f) => {
                Shape::Fixed(f.size)
            }
            Schema::Enum(_) => Shape::Enum,
            Schema::Array(a) => Shape::Array(Box::new(inner(&a.items)?)),
            Schema::Map(m) => Shape::Map(Box::new(inner(&m.types)?)),
            Schema::Union(u) => {
                Shape::Union(u.variants().iter().map(inner).collect::<Result<_, _>>()?)
            }
            Schema::Record(r) => Shape::Record(
                r.fields
                    .iter()
                    .map(|f| inner(&f.schema))
                    .collect::<Result<_, _>>()?,
            ),
            other => {
                return Err(ArrowMappingError::Unsupported {
                    path: path.to_owned(),
                    kind: format!("{:?}", SchemaKind::from(other)),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recursive named type (a linked list) is refused with an error, not a stack
    /// overflow, both as a column and as a skipped value.
    #[test]
    fn recursive_types_are_refused() {
        let s = Schema::parse_str(
            r#"{"type":"record","name":"L","fields":[{"name":"v","type":"long"},{"name":"next","type":["null","L"]}]}"#,
        )
        .unwrap();
        let c = Compiler::new(&s).unwrap();
        assert!(matches!(
            c.node(&s, "after"),
            Err(ArrowMappingError::Unsupported { kind, .. }) if kind.contains("nesting")
        ));
        assert!(c.shape(&s, "x").is_err());
    }
}
