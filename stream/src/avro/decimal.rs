//! Bounded numerics as Avro `decimal` (docs/types.md, "numeric").
//!
//! A `numeric(p,s)` column with `1 <= p <= 38` and `0 <= s <= p` is, in the `precise`
//! encoding ([`Decimals::Precise`], the default), an Avro `bytes` with logical type
//! `decimal`, precision `p` and scale `s`: the unscaled value as big-endian two's
//! complement in the fewest bytes, as Debezium's `decimal.handling.mode=precise` writes it.
//! Every finite value of such a column fits an `i128` (38 digits), and so Arrow's
//! `Decimal128(p,s)` in the lake.
//!
//! Invariants:
//! * nothing is rounded: PostgreSQL prints a `numeric(p,s)` value with exactly `s`
//!   fraction digits; text with more digits than the scale, or more integer digits than
//!   `p - s`, is refused ([`unscaled`] returns an error), never cut;
//! * the values the type cannot hold (`NaN`; `Infinity` and `-Infinity`, which PostgreSQL
//!   refuses in a bounded column but an unconstrained domain could carry) are *special*:
//!   [`unscaled`] gives `None`, the field is null and the envelope's `out_of_range_values`
//!   names the field and keeps the text;
//! * unbounded `numeric`, `p > 38`, a negative scale or `s > p` keep the exact text;
//! * arrays of numerics keep the exact text (their elements have no field of their own to
//!   be null in without losing a NaN).

pub use wal2delta_model::decimal::{text, unscaled, NotDecimal};
use wal2delta_model::{BaseType, ColumnType, TypeKind};

/// The widest precision an `i128` (Arrow's `Decimal128`, Delta's `DECIMAL`) holds.
pub const MAX_PRECISION: u32 = 38;

/// How bounded numerics travel on Kafka (`[kafka] decimal_handling`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Decimals {
    /// Avro `decimal` (bytes): the default.
    #[default]
    Precise,
    /// PostgreSQL's exact text in a `string`, as releases before 0.2 wrote every numeric:
    /// for consumers of topics already written that way.
    String,
}

/// The `(precision, scale)` a column of type `ty` is carried with as an Avro `decimal`, or
/// `None` when it travels as text.
pub fn decimal_type(ty: &ColumnType, decimals: Decimals) -> Option<(u8, u8)> {
    if decimals == Decimals::String {
        return None;
    }
    let base = ty.resolved();
    if !matches!(base.kind, TypeKind::Base(BaseType::Numeric)) {
        return None;
    }
    let (p, s) = base.numeric_precision_scale()?;
    ((1..=MAX_PRECISION).contains(&p) && s <= p).then_some((p as u8, s as u8))
}

/// The fewest big-endian two's-complement bytes of `v` (at least one), as Avro's `decimal`
/// and Java's `BigInteger.toByteArray` write it.
pub fn be_bytes(v: i128) -> Vec<u8> {
    let all = v.to_be_bytes();
    let mut start = 0;
    // Drop a leading byte while the next one still carries the sign.
    while start < all.len() - 1 {
        let (b, next) = (all[start], all[start + 1]);
        if (b == 0x00 && next & 0x80 == 0) || (b == 0xFF && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    all[start..].to_vec()
}

/// The value of big-endian two's-complement bytes; `None` when they do not fit an `i128`
/// (more than 16 significant bytes) or are empty.
pub fn from_be_bytes(bytes: &[u8]) -> Option<i128> {
    let (&first, _) = bytes.split_first()?;
    let fill = if first & 0x80 != 0 { 0xFF } else { 0x00 };
    let significant = match bytes.iter().position(|&b| b != fill) {
        // Keep one byte of the sign when the first significant byte's top bit disagrees.
        Some(i) if i > 0 && (bytes[i] & 0x80 != 0) != (fill == 0xFF) => &bytes[i - 1..],
        Some(i) => &bytes[i..],
        None => &bytes[bytes.len() - 1..],
    };
    if significant.len() > 16 {
        return None;
    }
    let mut all = [fill; 16];
    all[16 - significant.len()..].copy_from_slice(significant);
    Some(i128::from_be_bytes(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_the_fewest_twos_complement_and_read_back() {
        assert_eq!(be_bytes(0), [0x00]);
        assert_eq!(be_bytes(127), [0x7F]);
        assert_eq!(be_bytes(128), [0x00, 0x80]);
        assert_eq!(be_bytes(-1), [0xFF]);
        assert_eq!(be_bytes(-128), [0x80]);
        assert_eq!(be_bytes(-129), [0xFF, 0x7F]);
        for v in [
            0,
            1,
            -1,
            127,
            128,
            -128,
            -129,
            255,
            256,
            i128::MAX,
            i128::MIN,
            10i128.pow(37),
        ] {
            assert_eq!(from_be_bytes(&be_bytes(v)), Some(v), "{v}");
        }
        // Redundant sign bytes (other writers may pad) read the same.
        assert_eq!(from_be_bytes(&[0x00, 0x00, 0x7F]), Some(127));
        assert_eq!(from_be_bytes(&[0xFF, 0xFF, 0x80]), Some(-128));
        assert_eq!(from_be_bytes(&[0x00; 20]), Some(0));
        assert_eq!(from_be_bytes(&[0x01; 17]), None);
        assert_eq!(from_be_bytes(&[]), None);
    }

    #[test]
    fn only_bounded_columns_that_fit_are_decimals() {
        let n = |typmod: i32| ColumnType {
            typmod,
            ..ColumnType::base(BaseType::Numeric, "numeric")
        };
        let typmod = |p: i32, s: i32| ((p << 16) | s) + 4;
        assert_eq!(
            decimal_type(&n(typmod(18, 2)), Decimals::Precise),
            Some((18, 2))
        );
        assert_eq!(
            decimal_type(&n(typmod(38, 10)), Decimals::Precise),
            Some((38, 10))
        );
        assert_eq!(decimal_type(&n(typmod(18, 2)), Decimals::String), None);
        assert_eq!(decimal_type(&n(-1), Decimals::Precise), None);
        assert_eq!(decimal_type(&n(typmod(39, 2)), Decimals::Precise), None);
        assert_eq!(decimal_type(&n(typmod(2, 5)), Decimals::Precise), None);
        assert_eq!(
            decimal_type(&ColumnType::array_of(n(typmod(18, 2))), Decimals::Precise),
            None
        );
    }
}
