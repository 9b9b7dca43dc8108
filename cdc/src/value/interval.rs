//! interval in `IntervalStyle=iso_8601`: `P1Y2M3DT4H5M6.789S`, `P-1Y-2M3DT-4H-5M-6.789S`,
//! `PT0S`.
//!
//! PostgreSQL keeps three independent fields (months, days, microseconds) and prints them as
//! years = months / 12 and months % 12 (truncating toward zero), days, then hours, minutes
//! and seconds of the microseconds field, each component carrying its own sign and zero
//! components left out. Decoding reverses that exactly: months = Y * 12 + M, days = D,
//! micros = H * 3600 s + M * 60 s + S.

use super::cursor::Cursor;
use super::datetime::{write_fraction, USECS_PER_HOUR, USECS_PER_MINUTE, USECS_PER_SEC};
use super::Bad;

const BAD: Bad = Bad::Invalid("expected ISO 8601 interval text like P1Y2M3DT4H5M6.789S");
const RANGE: Bad = Bad::OutOfRange("interval field overflows");

/// Returns (months, days, micros).
pub(crate) fn parse(text: &str) -> Result<(i32, i32, i64), Bad> {
    let mut c = Cursor::new(text);
    if !c.eat(b'P') {
        return Err(BAD);
    }
    // Components in the order they must appear: Y M D, then after T: H M S.
    let mut values = [0i64; 6];
    let mut next_rank = 0usize;
    let mut in_time = false;
    let mut time_components = 0usize;
    let mut components = 0usize;
    while !c.at_end() {
        if c.eat(b'T') {
            if in_time {
                return Err(BAD);
            }
            in_time = true;
            next_rank = next_rank.max(3);
            continue;
        }
        let negative = c.eat(b'-');
        let (magnitude, _) = c.digits(1, 19).ok_or(BAD)?;
        let magnitude = i64::try_from(magnitude).map_err(|_| RANGE)?;
        let fraction = c.micros_fraction().map_err(|_| BAD)?;
        let rank = match (in_time, c.bump()) {
            (false, Some(b'Y')) => 0,
            (false, Some(b'M')) => 1,
            (false, Some(b'D')) => 2,
            (true, Some(b'H')) => 3,
            (true, Some(b'M')) => 4,
            (true, Some(b'S')) => 5,
            _ => return Err(BAD),
        };
        if rank < next_rank || (fraction != 0 && rank != 5) {
            return Err(BAD);
        }
        let value = if rank == 5 {
            magnitude
                .checked_mul(USECS_PER_SEC)
                .and_then(|m| m.checked_add(i64::from(fraction)))
                .ok_or(RANGE)?
        } else {
            magnitude
        };
        if let Some(slot) = values.get_mut(rank) {
            *slot = if negative { -value } else { value };
        }
        next_rank = rank + 1;
        components += 1;
        if in_time {
            time_components += 1;
        }
    }
    if components == 0 || (in_time && time_components == 0) {
        return Err(BAD);
    }
    let [years, months, days, hours, minutes, second_micros] = values;
    let months = years
        .checked_mul(12)
        .and_then(|y| y.checked_add(months))
        .and_then(|m| i32::try_from(m).ok())
        .ok_or(RANGE)?;
    let days = i32::try_from(days).map_err(|_| RANGE)?;
    let micros = hours
        .checked_mul(USECS_PER_HOUR)
        .and_then(|h| {
            minutes
                .checked_mul(USECS_PER_MINUTE)
                .and_then(|m| h.checked_add(m))
        })
        .and_then(|hm| hm.checked_add(second_micros))
        .ok_or(RANGE)?;
    Ok((months, days, micros))
}

/// Renders like PostgreSQL's `EncodeInterval` with `INTSTYLE_ISO_8601`.
pub(crate) fn render(months: i32, days: i32, micros: i64) -> String {
    if months == 0 && days == 0 && micros == 0 {
        return "PT0S".to_owned();
    }
    let years = months / 12;
    let months = months % 12;
    let hours = micros / USECS_PER_HOUR;
    let minutes = micros % USECS_PER_HOUR / USECS_PER_MINUTE;
    let seconds = micros % USECS_PER_MINUTE / USECS_PER_SEC;
    let fraction = micros % USECS_PER_SEC;

    let mut out = String::from("P");
    let part = |out: &mut String, v: i64, unit: char| {
        if v != 0 {
            out.push_str(&v.to_string());
            out.push(unit);
        }
    };
    part(&mut out, i64::from(years), 'Y');
    part(&mut out, i64::from(months), 'M');
    part(&mut out, i64::from(days), 'D');
    if micros != 0 {
        out.push('T');
    }
    part(&mut out, hours, 'H');
    part(&mut out, minutes, 'M');
    if seconds != 0 || fraction != 0 {
        if seconds < 0 || fraction < 0 {
            out.push('-');
        }
        out.push_str(&seconds.unsigned_abs().to_string());
        write_fraction(&mut out, fraction.unsigned_abs());
        out.push('S');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_samples() {
        // (PostgreSQL 15 iso_8601 text, months, days, micros)
        let cases: &[(&str, i32, i32, i64)] = &[
            ("P1Y2M3DT4H5M6.789S", 14, 3, 14_706_789_000),
            ("P-1Y-2M3DT-4H-5M-6.789S", -14, 3, -14_706_789_000),
            ("PT0S", 0, 0, 0),
            ("PT-0.5S", 0, 0, -500_000),
            ("PT1000000H", 0, 0, 1_000_000 * USECS_PER_HOUR),
            ("P-178000000Y", -2_136_000_000, 0, 0),
            ("P1DT-1S", 0, 1, -1_000_000),
            ("P2M-30D", 2, -30, 0),
            ("PT0.000001S", 0, 0, 1),
            ("PT-0.000001S", 0, 0, -1),
            ("PT1.1S", 0, 0, 1_100_000),
            ("P1D", 0, 1, 0),
            ("P-1M", -1, 0, 0),
            ("PT2562047788H54.775807S", 0, 0, i64::MAX),
            ("PT-2562047788H-54.775808S", 0, 0, i64::MIN),
            (
                "P-178956970Y-8M-2147483648DT-2562047788H-54.775808S",
                i32::MIN,
                i32::MIN,
                i64::MIN,
            ),
            (
                "P178956970Y7M2147483647DT2562047788H54.775807S",
                i32::MAX,
                i32::MAX,
                i64::MAX,
            ),
        ];
        for (text, months, days, micros) in cases {
            assert_eq!(parse(text), Ok((*months, *days, *micros)), "{text}");
            assert_eq!(render(*months, *days, *micros), *text);
        }
    }

    #[test]
    fn malformed() {
        for bad in [
            "",
            "P",
            "PT",
            "P1DT",
            "1D",
            "P1H",
            "PT1Y",
            "P1M1Y",
            "PT1S1M",
            "P1.5D",
            "PT1.1234567S",
            "P--1D",
            "P1DT1HT1M",
            "P1D ",
            "PT-S",
            "P99999999999999999999D",
            "P2147483648D",
            "P178956971Y",
            "PT2562047789H",
            "p1d",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
