//! Column buffers a run of events is read into, one per [`Node`], turned into Arrow arrays
//! at the end of the run.
//!
//! Plain vectors rather than Arrow's builders, because an event is read field by field and
//! may turn out malformed halfway: [`Buffer::truncate`] takes every column back to the
//! rows before it, so a bad event leaves nothing behind.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Float32Array, Float64Array,
    Int32Array, Int64Array, ListArray, StringArray, StructArray, TimestampMicrosecondArray,
};
use arrow::buffer::{Buffer as ArrowBuffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::DataType;

use super::plan::Node;
use crate::avro::arrow::ArrowMappingError;

/// Values and validity of a column of fixed-width values.
#[derive(Debug, Default)]
pub struct Scalars<T> {
    pub values: Vec<T>,
    pub valid: Vec<bool>,
}

impl<T: Default> Scalars<T> {
    pub fn push(&mut self, v: T) {
        self.values.push(v);
        self.valid.push(true);
    }

    pub fn push_null(&mut self) {
        self.values.push(T::default());
        self.valid.push(false);
    }

    pub fn truncate(&mut self, rows: usize) {
        self.values.truncate(rows);
        self.valid.truncate(rows);
    }

    fn nulls(&mut self) -> Option<NullBuffer> {
        nulls(std::mem::take(&mut self.valid))
    }
}

/// A validity vector as Arrow's null buffer (none when every row is valid).
fn nulls(valid: Vec<bool>) -> Option<NullBuffer> {
    if valid.iter().all(|v| *v) {
        None
    } else {
        Some(NullBuffer::from(valid))
    }
}

/// Variable-length values (text, bytes): concatenated, with offsets.
#[derive(Debug)]
pub struct Varlen {
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
    pub valid: Vec<bool>,
}

impl Default for Varlen {
    fn default() -> Self {
        Varlen {
            offsets: vec![0],
            data: Vec::new(),
            valid: Vec::new(),
        }
    }
}

/// A run's values would not fit one Arrow array (2 GiB of text in one column): the run
/// must end before the event and the event go into the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl Varlen {
    fn end(&mut self) -> Result<(), Full> {
        let end = i32::try_from(self.data.len()).map_err(|_| Full)?;
        self.offsets.push(end);
        self.valid.push(true);
        Ok(())
    }

    pub fn push(&mut self, v: &[u8]) -> Result<(), Full> {
        self.data.extend_from_slice(v);
        self.end()
    }

    pub fn push_null(&mut self) {
        let end = *self.offsets.last().unwrap_or(&0);
        self.offsets.push(end);
        self.valid.push(false);
    }

    pub fn len(&self) -> usize {
        self.valid.len()
    }

    pub fn truncate(&mut self, rows: usize) {
        self.offsets.truncate(rows + 1);
        let end = *self.offsets.last().unwrap_or(&0);
        self.data.truncate(end as usize);
        self.valid.truncate(rows);
    }

    fn parts(&mut self) -> (OffsetBuffer<i32>, ArrowBuffer, Option<NullBuffer>) {
        let offsets = std::mem::replace(&mut self.offsets, vec![0]);
        (
            // Offsets start at 0 and never decrease: `end` pushes the data length.
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            ArrowBuffer::from_vec(std::mem::take(&mut self.data)),
            nulls(std::mem::take(&mut self.valid)),
        )
    }

    pub fn finish_text(&mut self) -> Result<StringArray, String> {
        let (offsets, data, nulls) = self.parts();
        StringArray::try_new(offsets, data, nulls).map_err(|e| e.to_string())
    }
}

/// The buffer of one [`Node`]'s column.
#[derive(Debug)]
pub enum Buffer {
    Boolean(Scalars<bool>),
    I32(Scalars<i32>),
    I64(Scalars<i64>),
    F32(Scalars<f32>),
    F64(Scalars<f64>),
    /// Decimals' unscaled values.
    I128(Scalars<i128>),
    /// Text and bytes.
    Varlen(Varlen),
    List {
        offsets: Vec<i32>,
        valid: Vec<bool>,
        items: Box<Buffer>,
    },
    Struct {
        valid: Vec<bool>,
        children: Vec<Buffer>,
    },
}

impl Buffer {
    pub fn new(node: &Node) -> Buffer {
        match node {
            Node::Boolean => Buffer::Boolean(Scalars::default()),
            Node::Int | Node::Date => Buffer::I32(Scalars::default()),
            Node::Long | Node::Timestamp { .. } => Buffer::I64(Scalars::default()),
            Node::Float => Buffer::F32(Scalars::default()),
            Node::Double => Buffer::F64(Scalars::default()),
            Node::Decimal { .. } => Buffer::I128(Scalars::default()),
            Node::String | Node::Uuid(_) | Node::Enum(_) | Node::Bytes | Node::Fixed(_) => {
                Buffer::Varlen(Varlen::default())
            }
            Node::Nullable { inner, .. } => Buffer::new(inner),
            Node::Array { item, .. } => Buffer::List {
                offsets: vec![0],
                valid: Vec::new(),
                items: Box::new(Buffer::new(item)),
            },
            Node::Record(fields) => Buffer::Struct {
                valid: Vec::new(),
                children: fields.iter().map(|f| Buffer::new(&f.node)).collect(),
            },
        }
    }

    /// Rows in the buffer.
    pub fn len(&self) -> usize {
        match self {
            Buffer::Boolean(s) => s.valid.len(),
            Buffer::I32(s) => s.valid.len(),
            Buffer::I64(s) => s.valid.len(),
            Buffer::F32(s) => s.valid.len(),
            Buffer::F64(s) => s.valid.len(),
            Buffer::I128(s) => s.valid.len(),
            Buffer::Varlen(v) => v.len(),
            Buffer::List { valid, .. } | Buffer::Struct { valid, .. } => valid.len(),
        }
    }

    /// Appends a null row (for a struct, null in every child too).
    pub fn push_null(&mut self) {
        match self {
            Buffer::Boolean(s) => s.push_null(),
            Buffer::I32(s) => s.push_null(),
            Buffer::I64(s) => s.push_null(),
            Buffer::F32(s) => s.push_null(),
            Buffer::F64(s) => s.push_null(),
            Buffer::I128(s) => s.push_null(),
            Buffer::Varlen(v) => v.push_null(),
            Buffer::List { offsets, valid, .. } => {
                let end = *offsets.last().unwrap_or(&0);
                offsets.push(end);
                valid.push(false);
            }
            Buffer::Struct { valid, children } => {
                valid.push(false);
                for c in children {
                    c.push_null();
                }
            }
        }
    }

    /// Takes the buffer back to its first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        match self {
            Buffer::Boolean(s) => s.truncate(rows),
            Buffer::I32(s) => s.truncate(rows),
            Buffer::I64(s) => s.truncate(rows),
            Buffer::F32(s) => s.truncate(rows),
            Buffer::F64(s) => s.truncate(rows),
            Buffer::I128(s) => s.truncate(rows),
            Buffer::Varlen(v) => v.truncate(rows),
            Buffer::List {
                offsets,
                valid,
                items,
            } => {
                offsets.truncate(rows + 1);
                valid.truncate(rows);
                items.truncate(*offsets.last().unwrap_or(&0) as usize);
            }
            Buffer::Struct { valid, children } => {
                valid.truncate(rows);
                for c in children {
                    c.truncate(rows);
                }
            }
        }
    }

    /// The Arrow array of the rows read, of type `ty` (the node's [`Node::data_type`]);
    /// the buffer is left empty. `path` names the column in errors.
    pub fn finish(&mut self, ty: &DataType, path: &str) -> Result<ArrayRef, ArrowMappingError> {
        let build = |reason: String| ArrowMappingError::Build {
            path: path.to_owned(),
            reason,
        };
        let mismatch = || build(format!("no {ty} column was read"));
        macro_rules! scalars {
            ($s:expr, $array:ty) => {{
                let values = ScalarBuffer::from(std::mem::take(&mut $s.values));
                Arc::new(<$array>::new(values, $s.nulls())) as ArrayRef
            }};
        }
        Ok(match (self, ty) {
            (Buffer::Boolean(s), DataType::Boolean) => {
                let values = std::mem::take(&mut s.values);
                Arc::new(BooleanArray::new(values.into(), s.nulls()))
            }
            (Buffer::I32(s), DataType::Int32) => scalars!(s, Int32Array),
            (Buffer::I32(s), DataType::Date32) => scalars!(s, Date32Array),
            (Buffer::I64(s), DataType::Int64) => scalars!(s, Int64Array),
            (Buffer::I64(s), DataType::Timestamp(_, tz)) => {
                let values = ScalarBuffer::from(std::mem::take(&mut s.values));
                Arc::new(
                    TimestampMicrosecondArray::new(values, s.nulls()).with_timezone_opt(tz.clone()),
                )
            }
            (Buffer::F32(s), DataType::Float32) => scalars!(s, Float32Array),
            (Buffer::F64(s), DataType::Float64) => scalars!(s, Float64Array),
            (Buffer::I128(s), DataType::Decimal128(p, sc)) => {
                let values = ScalarBuffer::from(std::mem::take(&mut s.values));
                Arc::new(
                    Decimal128Array::new(values, s.nulls())
                        .with_precision_and_scale(*p, *sc)
                        .map_err(|e| build(e.to_string()))?,
                )
            }
            (Buffer::Varlen(v), DataType::Utf8) => Arc::new(v.finish_text().map_err(build)?),
            (Buffer::Varlen(v), DataType::Binary) => {
                let (offsets, data, nulls) = v.parts();
                Arc::new(
                    BinaryArray::try_new(offsets, data, nulls).map_err(|e| build(e.to_string()))?,
                )
            }
            (
                Buffer::List {
                    offsets,
                    valid,
                    items,
                },
                DataType::List(item),
            ) => {
                let child = items.finish(item.data_type(), &format!("{path}[]"))?;
                let offsets = std::mem::replace(offsets, vec![0]);
                Arc::new(
                    ListArray::try_new(
                        item.clone(),
                        OffsetBuffer::new(ScalarBuffer::from(offsets)),
                        child,
                        nulls(std::mem::take(valid)),
                    )
                    .map_err(|e| build(e.to_string()))?,
                )
            }
            (Buffer::Struct { valid, children }, DataType::Struct(fields)) => {
                if children.len() != fields.len() {
                    return Err(mismatch());
                }
                let rows = valid.len();
                let mut arrays = Vec::with_capacity(children.len());
                for (c, f) in children.iter_mut().zip(fields.iter()) {
                    arrays.push(c.finish(f.data_type(), &format!("{path}.{}", f.name()))?);
                }
                let nulls = nulls(std::mem::take(valid));
                Arc::new(if fields.is_empty() {
                    StructArray::new_empty_fields(rows, nulls)
                } else {
                    StructArray::try_new(fields.clone(), arrays, nulls)
                        .map_err(|e| build(e.to_string()))?
                })
            }
            _ => return Err(mismatch()),
        })
    }
}
