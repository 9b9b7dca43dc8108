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

/// Why text could not be read as a decimal of the column's type. Never names the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotDecimal(pub &'static str);

/// The unscaled value of PostgreSQL's text of a `numeric(p,s)` value (`-12.30` with scale
/// 2 is -1230); `None` for `NaN`, `Infinity` and `-Infinity`. Fewer fraction digits than
/// the scale are padded with zeros (exact); more, or more than `p` digits, are refused.
pub fn unscaled(text: &str, precision: u8, scale: u8) -> Result<Option<i128>, NotDecimal> {
    if matches!(text, "NaN" | "Infinity" | "-Infinity") {
        return Ok(None);
    }
    let (negative, digits) = match text.as_bytes() {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        all => (false, all),
    };
    let (int, frac) = match digits.iter().position(|&b| b == b'.') {
        Some(i) => (&digits[..i], &digits[i + 1..]),
        None => (digits, &digits[digits.len()..]),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(NotDecimal("no digits"));
    }
    if frac.len() > usize::from(scale) {
        return Err(NotDecimal("more fraction digits than the column's scale"));
    }
    let int = match int.iter().position(|&b| b != b'0') {
        Some(i) => &int[i..],
        None => &int[int.len()..],
    };
    if int.len() > usize::from(precision - scale) {
        return Err(NotDecimal("more digits than the column's precision"));
    }
    let mut v: i128 = 0;
    for &b in int.iter().chain(frac) {
        if !b.is_ascii_digit() {
            return Err(NotDecimal("a character that is not a digit"));
        }
        // At most 38 digits: cannot overflow.
        v = v * 10 + i128::from(b - b'0');
    }
    for _ in frac.len()..usize::from(scale) {
        v *= 10;
    }
    Ok(Some(if negative { -v } else { v }))
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

/// PostgreSQL's text of the unscaled value `v` with `scale` fraction digits: `-12.30`,
/// `0.05`, `7`.
pub fn text(v: i128, scale: u8) -> String {
    let digits = v.unsigned_abs().to_string();
    let scale = usize::from(scale);
    let mut out = String::with_capacity(digits.len() + scale + 3);
    if v < 0 {
        out.push('-');
    }
    if scale == 0 {
        out.push_str(&digits);
        return out;
    }
    if digits.len() <= scale {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', scale - digits.len()));
        out.push_str(&digits);
    } else {
        let (int, frac) = digits.split_at(digits.len() - scale);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_through_the_unscaled_value() {
        for (t, p, s, v) in [
            ("-12.30", 18, 2, -1230i128),
            ("0.05", 5, 2, 5),
            ("-0.05", 5, 2, -5),
            ("7", 5, 0, 7),
            ("0", 5, 0, 0),
            ("0.00", 5, 2, 0),
            ("99999", 5, 0, 99_999),
            (
                "9999999999999999999999999999.9999999999",
                38,
                10,
                99_999_999_999_999_999_999_999_999_999_999_999_999,
            ),
            (
                "-9999999999999999999999999999.9999999999",
                38,
                10,
                -99_999_999_999_999_999_999_999_999_999_999_999_999,
            ),
        ] {
            assert_eq!(unscaled(t, p, s), Ok(Some(v)), "{t}");
            assert_eq!(text(v, s), t);
        }
        assert_eq!(unscaled("1.5", 5, 2), Ok(Some(150)));
        assert_eq!(unscaled(".5", 5, 2), Ok(Some(50)));
    }

    #[test]
    fn specials_are_none_and_nothing_is_rounded() {
        for t in ["NaN", "Infinity", "-Infinity"] {
            assert_eq!(unscaled(t, 5, 2), Ok(None));
        }
        assert!(unscaled("1.234", 5, 2).is_err());
        assert!(unscaled("100000", 5, 0).is_err());
        assert!(unscaled("1e5", 5, 0).is_err());
        assert!(unscaled("", 5, 0).is_err());
        assert!(unscaled("-", 5, 0).is_err());
        assert!(unscaled("1.2.3", 5, 2).is_err());
    }

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
