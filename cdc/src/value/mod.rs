//! Exact decoding of the column values pgoutput sends, and the inverse rendering.
//!
//! pgoutput sends every column value in its *text* form, produced by the type's output
//! function in the walsender session. The decoder relies on the session settings the
//! replication connection always sets:
//!
//! | setting | value | why |
//! | --- | --- | --- |
//! | `DateStyle` | `ISO, MDY` | dates as `YYYY-MM-DD`, BC as a ` BC` suffix |
//! | `IntervalStyle` | `iso_8601` | intervals as `P1Y2M3DT4H5M6.789S`, one unambiguous form |
//! | `TimeZone` | `UTC` | `timestamptz` printed with a `+00` offset |
//! | `extra_float_digits` | `3` | floats printed as the shortest exact round-trip text |
//! | `bytea_output` | `hex` | bytea as `\x0a1b...` |
//!
//! [`parse_text`] never panics: any text it cannot decode exactly gives a [`ValueError`]
//! whose message names the type and the problem but never contains the value (values may be
//! sensitive). Such a record goes to the DLQ (docs/architecture.md, promise 4).
//!
//! [`render_text`] is the inverse: it prints a [`Datum`] exactly as PostgreSQL's output
//! function prints the value in such a session (which is also what `array::text` and
//! `format('%s', v)` print; note that the `::text` *cast* differs from the output function
//! for `bool` (`true`), `char(n)` (trailing blanks trimmed) and `inet` (netmask always shown)).
//!
//! `docs/types.md` lists which PostgreSQL type becomes which [`Datum`] variant.

mod array;
mod cursor;
mod datetime;
mod float;
mod interval;
mod scalar;
mod shortest;
#[cfg(test)]
mod tests;

use wal2delta_model::{BaseType, ColumnType, Datum, ErrorClass, TypeKind};

/// Why a column value could not be decoded. The message names the type and the problem,
/// never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// The text is not a valid value of the type.
    #[error("invalid {type_name} value: {reason}")]
    Invalid {
        type_name: String,
        reason: &'static str,
    },
    /// A valid PostgreSQL value that the exact target representation cannot hold (for
    /// example a timestamp beyond 294247-01-10, where microseconds since 1970 overflow i64).
    #[error("{type_name} value out of range: {reason}")]
    OutOfRange {
        type_name: String,
        reason: &'static str,
    },
    /// A valid PostgreSQL value of a shape that is deliberately not captured
    /// (multi-dimensional arrays, arrays with explicit lower bounds). Goes to the DLQ.
    #[error("unsupported {type_name} value: {reason}")]
    Unsupported {
        type_name: String,
        reason: &'static str,
    },
}

impl ValueError {
    /// An undecodable value is a problem of one record: it goes to the DLQ.
    pub fn class(&self) -> ErrorClass {
        ErrorClass::Record
    }

    /// A stable, machine-readable reason code for the DLQ record.
    pub fn code(&self) -> &'static str {
        match self {
            ValueError::Invalid { .. } => "invalid_value",
            ValueError::OutOfRange { .. } => "value_out_of_range",
            ValueError::Unsupported { .. } => "unsupported_value",
        }
    }

    /// The PostgreSQL type the error is about.
    pub fn type_name(&self) -> &str {
        match self {
            ValueError::Invalid { type_name, .. }
            | ValueError::OutOfRange { type_name, .. }
            | ValueError::Unsupported { type_name, .. } => type_name,
        }
    }

    fn with_type_name(self, type_name: String) -> ValueError {
        match self {
            ValueError::Invalid { reason, .. } => ValueError::Invalid { type_name, reason },
            ValueError::OutOfRange { reason, .. } => ValueError::OutOfRange { type_name, reason },
            ValueError::Unsupported { reason, .. } => ValueError::Unsupported { type_name, reason },
        }
    }
}

/// An error inside a submodule, before the type name is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bad {
    Invalid(&'static str),
    OutOfRange(&'static str),
    Unsupported(&'static str),
}

impl Bad {
    fn named(self, type_name: &str) -> ValueError {
        let type_name = type_name.to_owned();
        match self {
            Bad::Invalid(reason) => ValueError::Invalid { type_name, reason },
            Bad::OutOfRange(reason) => ValueError::OutOfRange { type_name, reason },
            Bad::Unsupported(reason) => ValueError::Unsupported { type_name, reason },
        }
    }
}

/// Decodes the text form pgoutput sends for a non-NULL value of a column of type `ty`.
///
/// See the module documentation for the session settings this relies on.
pub fn parse_text(ty: &ColumnType, text: &str) -> Result<Datum, ValueError> {
    match &ty.kind {
        TypeKind::Base(base) => parse_base(*base, text).map_err(|e| e.named(&ty.name)),
        TypeKind::Domain { base } => parse_text(base, text).map_err(|e| {
            let name = format!("{} (domain over {})", ty.name, e.type_name());
            e.with_type_name(name)
        }),
        TypeKind::Array { element } => {
            let items =
                array::parse(text, array::delimiter(element)).map_err(|e| e.named(&ty.name))?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                out.push(match item {
                    None => None,
                    Some(t) => Some(parse_text(element, &t)?),
                });
            }
            Ok(Datum::Array(out))
        }
        TypeKind::Enum { .. } | TypeKind::Range { .. } | TypeKind::Composite | TypeKind::Other => {
            Ok(Datum::PgText(text.to_owned()))
        }
    }
}

fn parse_base(base: BaseType, text: &str) -> Result<Datum, Bad> {
    use datetime::{parse_date, parse_time, parse_timestamp, parse_timetz};
    Ok(match base {
        BaseType::Bool => Datum::Bool(scalar::parse_bool(text)?),
        BaseType::Int2 => Datum::Int16(scalar::parse_int(text)?),
        BaseType::Int4 => Datum::Int32(scalar::parse_int(text)?),
        BaseType::Int8 => Datum::Int64(scalar::parse_int(text)?),
        BaseType::Oid => Datum::Int64(i64::from(scalar::parse_int::<u32>(text)?)),
        BaseType::Float4 => Datum::Float32(float::parse_f32(text)?),
        BaseType::Float8 => Datum::Float64(float::parse_f64(text)?),
        BaseType::Numeric => Datum::Numeric(scalar::parse_numeric(text)?),
        BaseType::Text
        | BaseType::Varchar
        | BaseType::Bpchar
        | BaseType::Name
        | BaseType::Char
        | BaseType::Xml => Datum::Text(text.to_owned()),
        BaseType::Bytea => Datum::Bytes(scalar::parse_bytea(text)?),
        BaseType::Uuid => Datum::Uuid(scalar::parse_uuid(text)?),
        BaseType::Json | BaseType::Jsonb => Datum::Json(text.to_owned()),
        BaseType::Date => Datum::Date(parse_date(text)?),
        BaseType::Time => Datum::Time(parse_time(text)?),
        BaseType::TimeTz => {
            let (micros, offset_seconds) = parse_timetz(text)?;
            Datum::TimeTz {
                micros,
                offset_seconds,
            }
        }
        BaseType::Timestamp => Datum::Timestamp(parse_timestamp(text, false)?),
        BaseType::TimestampTz => Datum::TimestampTz(parse_timestamp(text, true)?),
        BaseType::Interval => {
            let (months, days, micros) = interval::parse(text)?;
            Datum::Interval {
                months,
                days,
                micros,
            }
        }
        BaseType::Inet
        | BaseType::Cidr
        | BaseType::Macaddr
        | BaseType::Macaddr8
        | BaseType::Money
        | BaseType::Bit
        | BaseType::Varbit => Datum::PgText(text.to_owned()),
    })
}

/// Renders `datum` exactly as PostgreSQL's output function prints it in a session with the
/// settings listed in the module documentation (timestamptz in UTC with a `+00` suffix).
///
/// The rendering follows the datum; `ty` is only needed for arrays (element delimiter).
pub fn render_text(ty: &ColumnType, datum: &Datum) -> String {
    match datum {
        Datum::Bool(b) => (if *b { "t" } else { "f" }).to_owned(),
        Datum::Int16(v) => v.to_string(),
        Datum::Int32(v) => v.to_string(),
        Datum::Int64(v) => v.to_string(),
        Datum::Float32(v) => float::render_f32(*v),
        Datum::Float64(v) => float::render_f64(*v),
        Datum::Numeric(s) | Datum::Text(s) | Datum::Uuid(s) | Datum::Json(s) | Datum::PgText(s) => {
            s.clone()
        }
        Datum::Bytes(b) => scalar::render_bytea(b),
        Datum::Date(d) => datetime::render_date(*d),
        Datum::Time(micros) => datetime::render_time(*micros),
        Datum::TimeTz {
            micros,
            offset_seconds,
        } => datetime::render_timetz(*micros, *offset_seconds),
        Datum::Timestamp(v) => datetime::render_timestamp(*v, false),
        Datum::TimestampTz(v) => datetime::render_timestamp(*v, true),
        Datum::Interval {
            months,
            days,
            micros,
        } => interval::render(*months, *days, *micros),
        Datum::Array(items) => {
            let element = match &ty.resolved().kind {
                TypeKind::Array { element } => element.as_ref(),
                _ => ty,
            };
            let rendered: Vec<Option<String>> = items
                .iter()
                .map(|item| item.as_ref().map(|d| render_text(element, d)))
                .collect();
            array::render(&rendered, array::delimiter(element))
        }
    }
}
