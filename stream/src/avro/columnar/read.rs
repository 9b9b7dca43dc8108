//! Reading one value's bytes into its column buffer ([`Node`]), or past them ([`Shape`]).

use std::fmt::Write;

use super::buffers::{Buffer, Full};
use super::plan::{Node, Shape, UuidForm};
use crate::avro::cursor::{Cursor, Malformed};
use crate::avro::dates::{lake_date, pg_date_text, OutOfRange};

/// Why an event's bytes could not be read into the run's columns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The bytes are not a datum of the schema they name: the event's fault.
    #[error("Avro datum does not match its schema: {0}")]
    Malformed(#[from] Malformed),
    /// The key's bytes are not a datum of its schema: the event's fault.
    #[error("key: Avro datum does not match its schema: {0}")]
    MalformedKey(Malformed),
    /// The datum is well formed but holds a value the lake cannot (a millisecond
    /// timestamp beyond the microsecond range): the event's fault.
    #[error("{0}")]
    Unrepresentable(&'static str),
    /// The run's columns are full (2 GiB of text in one column): not the event's fault;
    /// the run ends before it and the event starts the next one.
    #[error("the batch's columns are full")]
    Full,
}

impl ReadError {
    /// The quarantine reason code of an event that failed alone.
    pub fn reason_code(&self) -> &'static str {
        match self {
            ReadError::Malformed(_) | ReadError::MalformedKey(_) => "corrupt_payload",
            ReadError::Unrepresentable(_) | ReadError::Full => "unsupported_schema",
        }
    }
}

impl From<Full> for ReadError {
    fn from(_: Full) -> Self {
        ReadError::Full
    }
}

/// Where reading is in the event: the path of the value being read, kept only inside
/// values that can hold dates, and the dates mapped into the lake's calendar so far.
#[derive(Default)]
pub struct Context {
    pub path: String,
    pub out_of_range: Vec<OutOfRange>,
}

impl Context {
    /// Runs `f` with `segment` appended to the path.
    fn within<T>(
        &mut self,
        segment: impl FnOnce(&mut String),
        f: impl FnOnce(&mut Self) -> T,
    ) -> T {
        let len = self.path.len();
        segment(&mut self.path);
        let out = f(self);
        self.path.truncate(len);
        out
    }
}

/// Reads one value of `node` into `buf`.
pub fn read(
    node: &Node,
    buf: &mut Buffer,
    cur: &mut Cursor,
    ctx: &mut Context,
) -> Result<(), ReadError> {
    let mismatch = || ReadError::Malformed(Malformed("the column buffer does not fit the schema"));
    match (node, buf) {
        (
            Node::Nullable {
                branches,
                null_branch,
                inner,
            },
            buf,
        ) => {
            let b = cur.branch(*branches)?;
            if Some(b) == *null_branch {
                buf.push_null();
            } else {
                read(inner, buf, cur, ctx)?;
            }
        }
        (Node::Boolean, Buffer::Boolean(s)) => s.push(cur.boolean()?),
        (Node::Int, Buffer::I32(s)) => s.push(cur.int()?),
        (Node::Long, Buffer::I64(s)) => s.push(cur.long()?),
        (Node::Float, Buffer::F32(s)) => s.push(cur.float()?),
        (Node::Double, Buffer::F64(s)) => s.push(cur.double()?),
        (Node::Decimal { precision, .. }, Buffer::I128(s)) => {
            let v = crate::avro::decimal::from_be_bytes(cur.bytes()?)
                .filter(|v| v.unsigned_abs() < 10u128.pow(u32::from(*precision)))
                .ok_or(ReadError::Unrepresentable(
                    "a decimal with more digits than its precision",
                ))?;
            s.push(v);
        }
        (Node::Date, Buffer::I32(s)) => {
            let days = cur.int()?;
            let (lake, mapped) = lake_date(days);
            if mapped {
                ctx.out_of_range.push(OutOfRange {
                    column: ctx.path.clone(),
                    value: pg_date_text(days),
                });
            }
            s.push(lake);
        }
        (Node::Timestamp { millis, .. }, Buffer::I64(s)) => {
            let t = cur.long()?;
            s.push(if *millis {
                t.checked_mul(1000).ok_or(ReadError::Unrepresentable(
                    "a millisecond timestamp out of the microsecond range",
                ))?
            } else {
                t
            });
        }
        (Node::String, Buffer::Varlen(v)) => v.push(cur.str()?.as_bytes())?,
        (Node::Bytes, Buffer::Varlen(v)) => v.push(cur.bytes()?)?,
        (Node::Fixed(size), Buffer::Varlen(v)) => v.push(cur.fixed(*size)?)?,
        (Node::Enum(symbols), Buffer::Varlen(v)) => {
            v.push(symbols[cur.branch(symbols.len())?].as_bytes())?
        }
        (Node::Uuid(form), Buffer::Varlen(v)) => {
            let bad = Malformed("a uuid that does not parse");
            let u = match form {
                UuidForm::Text => uuid::Uuid::parse_str(cur.str()?),
                UuidForm::Bytes => uuid::Uuid::from_slice(cur.bytes()?),
                UuidForm::Fixed => uuid::Uuid::from_slice(cur.fixed(16)?),
            }
            .map_err(|_| bad)?;
            let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
            v.push(u.hyphenated().encode_lower(&mut text).as_bytes())?;
        }
        (
            Node::Array { item, dates },
            Buffer::List {
                offsets,
                valid,
                items,
            },
        ) => {
            let mut n = 0usize;
            each_item(cur, |cur| {
                n += 1;
                if *dates {
                    // PostgreSQL's array indexes start at 1.
                    ctx.within(
                        |p| {
                            let _ = write!(p, "[{n}]");
                        },
                        |ctx| read(item, items, cur, ctx),
                    )
                } else {
                    read(item, items, cur, ctx)
                }
            })?;
            offsets.push(i32::try_from(items.len()).map_err(|_| ReadError::Full)?);
            valid.push(true);
        }
        (Node::Record(fields), Buffer::Struct { valid, children }) => {
            if fields.len() != children.len() {
                return Err(mismatch());
            }
            for (f, child) in fields.iter().zip(children.iter_mut()) {
                if f.dates {
                    ctx.within(
                        |p| {
                            p.push('.');
                            p.push_str(&f.name);
                        },
                        |ctx| read(&f.node, child, cur, ctx),
                    )?;
                } else {
                    read(&f.node, child, cur, ctx)?;
                }
            }
            valid.push(true);
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// A scalar of the envelope's metadata, as [`super::super::arrow::present`] would see it:
/// a union's branch, a plain number or text; anything else is [`Scalar::Other`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar<'b> {
    Null,
    Long(i64),
    Text(&'b str),
    Boolean(bool),
    Other,
}

/// Reads one value of `shape` and returns it if it is a [`Scalar`].
pub fn scalar<'b>(shape: &Shape, cur: &mut Cursor<'b>) -> Result<Scalar<'b>, ReadError> {
    Ok(match shape {
        Shape::Null => Scalar::Null,
        Shape::Boolean => Scalar::Boolean(cur.boolean()?),
        Shape::Int => Scalar::Long(i64::from(cur.int()?)),
        Shape::Long => Scalar::Long(cur.long()?),
        Shape::String => Scalar::Text(cur.str()?),
        Shape::Union(variants) => scalar(&variants[cur.branch(variants.len())?], cur)?,
        other => {
            skip(other, cur)?;
            Scalar::Other
        }
    })
}

/// Reads past one value of `shape`.
pub fn skip(shape: &Shape, cur: &mut Cursor) -> Result<(), ReadError> {
    match shape {
        Shape::Null => {}
        Shape::Boolean => {
            cur.boolean()?;
        }
        Shape::Int | Shape::Long | Shape::OtherVarint | Shape::Enum => {
            cur.long()?;
        }
        Shape::Float => {
            cur.float()?;
        }
        Shape::Double => {
            cur.double()?;
        }
        Shape::String => {
            cur.str()?;
        }
        Shape::OtherBytes => {
            cur.bytes()?;
        }
        Shape::Fixed(n) => {
            cur.fixed(*n)?;
        }
        Shape::Union(variants) => skip(&variants[cur.branch(variants.len())?], cur)?,
        Shape::Record(fields) => {
            for f in fields {
                skip(f, cur)?;
            }
        }
        Shape::Array(item) => each_item(cur, |cur| skip(item, cur))?,
        Shape::Map(values) => each_item(cur, |cur| {
            cur.str()?;
            skip(values, cur)
        })?,
    }
    Ok(())
}

/// Reads a list of texts (`unchanged_toast_columns`): the present texts of an array, in
/// order; nothing for a null or a value of another shape.
pub fn texts<'b>(
    shape: &Shape,
    cur: &mut Cursor<'b>,
    out: &mut Vec<&'b str>,
) -> Result<(), ReadError> {
    match shape {
        Shape::Union(variants) => texts(&variants[cur.branch(variants.len())?], cur, out),
        Shape::Array(item) => each_item(cur, |cur| {
            if let Scalar::Text(s) = scalar(item, cur)? {
                out.push(s);
            }
            Ok(())
        }),
        other => skip(other, cur),
    }
}

/// Reads the envelope's `out_of_range_values` (`["null", [{column, value}]]`): each entry
/// whose two fields are texts goes to `out`; anything else is read past.
pub fn out_of_range_entries(
    shape: &Shape,
    cur: &mut Cursor,
    out: &mut Vec<OutOfRange>,
) -> Result<(), ReadError> {
    match shape {
        Shape::Union(variants) => {
            out_of_range_entries(&variants[cur.branch(variants.len())?], cur, out)
        }
        Shape::Array(item) => match item.as_ref() {
            Shape::Record(fields) if fields.len() == 2 => each_item(cur, |cur| {
                let column = scalar(&fields[0], cur)?;
                let value = scalar(&fields[1], cur)?;
                if let (Scalar::Text(column), Scalar::Text(value)) = (column, value) {
                    out.push(OutOfRange {
                        column: column.to_owned(),
                        value: value.to_owned(),
                    });
                }
                Ok(())
            }),
            _ => skip(shape, cur),
        },
        other => skip(other, cur),
    }
}

/// Reads the items of an array or map (blocks of items, a count of 0 ending them), each
/// with `item`.
fn each_item<'b>(
    cur: &mut Cursor<'b>,
    mut item: impl FnMut(&mut Cursor<'b>) -> Result<(), ReadError>,
) -> Result<(), ReadError> {
    loop {
        let n = cur.block()?;
        if n == 0 {
            return Ok(());
        }
        for _ in 0..n {
            item(cur)?;
        }
    }
}
