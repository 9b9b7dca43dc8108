//! Typed column values, decoded from PostgreSQL and independent of any output format.
//!
//! The variants are chosen so that no value is ever approximated: numerics keep their
//! exact decimal text, time values keep microseconds plus the ±infinity specials, intervals
//! keep PostgreSQL's three separate fields. `docs/types.md` lists which PostgreSQL type
//! becomes which variant and how each variant maps to Avro and Arrow.

/// A value that may also be one of PostgreSQL's infinities (dates and timestamps).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Special<T> {
    Value(T),
    Infinity,
    NegInfinity,
}

/// One non-NULL column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Datum {
    Bool(bool),
    Int16(i16),
    Int32(i32),
    Int64(i64),
    Float32(f32),
    Float64(f64),
    /// An exact decimal in PostgreSQL's canonical text (`-12.3400`, `NaN`, `Infinity`,
    /// `-Infinity`), any number of digits.
    Numeric(String),
    /// text, varchar, char(n) (padding kept), name, "char", xml.
    Text(String),
    Bytes(Vec<u8>),
    /// Lower-case hyphenated form.
    Uuid(String),
    /// json or jsonb exactly as PostgreSQL rendered it.
    Json(String),
    /// Days since 1970-01-01.
    Date(Special<i32>),
    /// Microseconds since midnight (24:00:00 is 86 400 000 000).
    Time(i64),
    /// Microseconds since midnight and the zone offset in seconds east of UTC.
    TimeTz {
        micros: i64,
        offset_seconds: i32,
    },
    /// Microseconds since 1970-01-01 00:00:00, no time zone.
    Timestamp(Special<i64>),
    /// Microseconds since 1970-01-01 00:00:00 UTC.
    TimestampTz(Special<i64>),
    /// PostgreSQL's three independent interval fields, never folded together.
    Interval {
        months: i32,
        days: i32,
        micros: i64,
    },
    /// A one-dimensional array with lower bound 1; `None` is a NULL element.
    Array(Vec<Option<Datum>>),
    /// PostgreSQL's own text rendering, for types that travel as text (enums, ranges,
    /// inet/cidr, macaddr, money, bit strings, composites and anything without a native
    /// mapping).
    PgText(String),
}
