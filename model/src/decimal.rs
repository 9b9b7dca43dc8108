//! The exact text of a bounded numeric (`numeric(p,s)`, `p <= 38`) and its unscaled
//! `i128` value, both ways: what capture encodes as an Avro `decimal` and what the lake
//! reads from a text column an earlier release wrote (docs/types.md, "numeric").
//!
//! Nothing is rounded: PostgreSQL prints a `numeric(p,s)` value with exactly `s` fraction
//! digits; text with more fraction digits than the scale, or more integer digits than
//! `p - s`, is refused, never cut.

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
}
