//! bool, integers, numeric, bytea and uuid.

use std::num::{IntErrorKind, ParseIntError};
use std::str::FromStr;

use super::Bad;

/// `t` / `f` as `boolout` prints them (the spelled-out forms are accepted too).
pub(crate) fn parse_bool(text: &str) -> Result<bool, Bad> {
    match text {
        "t" | "true" | "TRUE" | "True" => Ok(true),
        "f" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(Bad::Invalid("expected t or f")),
    }
}

/// A decimal integer as the integer output functions print it.
pub(crate) fn parse_int<T: FromStr<Err = ParseIntError>>(text: &str) -> Result<T, Bad> {
    if text.starts_with('+') {
        return Err(Bad::Invalid("not a decimal integer"));
    }
    text.parse::<T>().map_err(|e| match e.kind() {
        IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => {
            Bad::OutOfRange("integer does not fit the type")
        }
        _ => Bad::Invalid("not a decimal integer"),
    })
}

/// Validates `numeric_out` text (`-12.3400`, `NaN`, `Infinity`, `-Infinity`) and keeps it
/// exactly, whatever the number of digits.
pub(crate) fn parse_numeric(text: &str) -> Result<String, Bad> {
    if matches!(text, "NaN" | "Infinity" | "-Infinity") {
        return Ok(text.to_owned());
    }
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (int_part, frac_part) = match unsigned.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (unsigned, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int_part) || frac_part.is_some_and(|f| !all_digits(f)) {
        return Err(Bad::Invalid(
            "not a decimal number, NaN, Infinity or -Infinity",
        ));
    }
    Ok(text.to_owned())
}

/// bytea in hex format (`\x0a1b`), as `bytea_output=hex` prints it. The escape format is
/// accepted as well, should a session ever print it.
pub(crate) fn parse_bytea(text: &str) -> Result<Vec<u8>, Bad> {
    match text.strip_prefix("\\x") {
        Some(hex) => parse_hex(hex),
        None => parse_escaped(text),
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_hex(hex: &str) -> Result<Vec<u8>, Bad> {
    let mut out = Vec::with_capacity(hex.len() / 2);
    let mut bytes = hex.bytes().filter(|b| !b.is_ascii_whitespace());
    while let Some(hi) = bytes.next() {
        let lo = bytes
            .next()
            .ok_or(Bad::Invalid("odd number of hex digits"))?;
        match (hex_value(hi), hex_value(lo)) {
            (Some(h), Some(l)) => out.push(h << 4 | l),
            _ => return Err(Bad::Invalid("invalid hex digit")),
        }
    }
    Ok(out)
}

fn parse_escaped(text: &str) -> Result<Vec<u8>, Bad> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'\\') => out.push(b'\\'),
            Some(d0 @ b'0'..=b'3') => match (bytes.next(), bytes.next()) {
                (Some(d1 @ b'0'..=b'7'), Some(d2 @ b'0'..=b'7')) => {
                    out.push((d0 - b'0') << 6 | (d1 - b'0') << 3 | (d2 - b'0'));
                }
                _ => return Err(Bad::Invalid("invalid escape sequence")),
            },
            _ => return Err(Bad::Invalid("invalid escape sequence")),
        }
    }
    Ok(out)
}

/// `\x` followed by lower-case hex, as `byteaout` prints with `bytea_output=hex`.
pub(crate) fn render_bytea(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("\\x");
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

/// The canonical `8-4-4-4-12` form (any case) or 32 bare hex digits, returned in the
/// canonical lower-case form `uuid_out` prints.
pub(crate) fn parse_uuid(text: &str) -> Result<String, Bad> {
    const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
    let hyphenated = text.len() == 36;
    if !hyphenated && text.len() != 32 {
        return Err(Bad::Invalid("not a uuid in canonical form"));
    }
    let mut digits = text.bytes();
    let mut out = String::with_capacity(36);
    for (i, n) in GROUPS.iter().enumerate() {
        if i > 0 {
            if hyphenated && digits.next() != Some(b'-') {
                return Err(Bad::Invalid("not a uuid in canonical form"));
            }
            out.push('-');
        }
        for _ in 0..*n {
            match digits.next() {
                Some(b) if b.is_ascii_hexdigit() => out.push(char::from(b.to_ascii_lowercase())),
                _ => return Err(Bad::Invalid("not a uuid in canonical form")),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_validation() {
        for ok in [
            "0",
            "-0",
            "12.3400",
            "-0.00001",
            "NaN",
            "Infinity",
            "-Infinity",
            "00.5",
        ] {
            assert_eq!(parse_numeric(ok).as_deref(), Ok(ok));
        }
        for bad in [
            "", "-", ".5", "5.", "1e5", "+1", "nan", "inf", "1.2.3", "1 ", "١٢",
        ] {
            assert!(parse_numeric(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bytea_forms() {
        assert_eq!(parse_bytea("\\x"), Ok(vec![]));
        assert_eq!(parse_bytea("\\x00fFa0"), Ok(vec![0, 255, 160]));
        assert_eq!(
            parse_bytea("ab\\\\\\001\\377"),
            Ok(vec![b'a', b'b', b'\\', 1, 255])
        );
        assert!(parse_bytea("\\x0").is_err());
        assert!(parse_bytea("\\xzz").is_err());
        assert!(parse_bytea("\\400").is_err());
        assert!(parse_bytea("\\").is_err());
        assert_eq!(render_bytea(&[0, 255, 160]), "\\x00ffa0");
    }

    #[test]
    fn uuid_forms() {
        let canonical = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11";
        assert_eq!(
            parse_uuid("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11").as_deref(),
            Ok(canonical)
        );
        assert_eq!(
            parse_uuid("a0eebc999c0b4ef8bb6d6bb9bd380a11").as_deref(),
            Ok(canonical)
        );
        for bad in [
            "",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
            "a0eebc99x9c0b-4ef8-bb6d-6bb9bd380a11",
            "g0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11é",
        ] {
            assert!(parse_uuid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers() {
        assert_eq!(parse_int::<i16>("-32768"), Ok(i16::MIN));
        assert!(matches!(parse_int::<i16>("32768"), Err(Bad::OutOfRange(_))));
        assert!(matches!(parse_int::<i64>("1.0"), Err(Bad::Invalid(_))));
        assert!(parse_int::<i32>("+1").is_err());
        assert!(parse_int::<u32>("-1").is_err());
        assert_eq!(parse_int::<u32>("4294967295"), Ok(u32::MAX));
    }
}
