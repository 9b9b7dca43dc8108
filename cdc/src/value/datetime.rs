//! date, time, timetz, timestamp and timestamptz in `DateStyle=ISO` text.
//!
//! Dates and timestamps use the proleptic Gregorian calendar, as PostgreSQL does; year 1 BC
//! is astronomical year 0. Values are counted from 1970-01-01 (days or microseconds).
//! PostgreSQL's own range is kept: dates 4714-11-24 BC ..= 5874897-12-31, timestamps from
//! 4714-11-24 BC. Timestamps after 294247-01-10 04:00:54.775806 (PostgreSQL allows up to
//! 294276-12-31) do not fit microseconds since 1970 in an i64 next to the infinity sentinel
//! and are reported as out of range.

use std::fmt::Write as _;

use super::cursor::Cursor;
use super::Bad;
use wal2delta_model::Special;

pub(crate) const USECS_PER_SEC: i64 = 1_000_000;
pub(crate) const USECS_PER_MINUTE: i64 = 60 * USECS_PER_SEC;
pub(crate) const USECS_PER_HOUR: i64 = 60 * USECS_PER_MINUTE;
pub(crate) const USECS_PER_DAY: i64 = 24 * USECS_PER_HOUR;
/// Julian day number of 1970-01-01.
const UNIX_EPOCH_JDATE: i64 = 2_440_588;
/// First Julian day past PostgreSQL's date range (5874898-01-01).
const DATE_END_JULIAN: i64 = 2_147_483_494;
/// 4714-11-24 BC, Julian day 0: the first day PostgreSQL accepts.
const MIN_DAY: i64 = -UNIX_EPOCH_JDATE;
/// 5874897-12-31, the last day PostgreSQL accepts.
const MAX_DAY: i64 = DATE_END_JULIAN - UNIX_EPOCH_JDATE - 1;
const MIN_TIMESTAMP: i64 = MIN_DAY * USECS_PER_DAY;
/// The largest zone offset PostgreSQL accepts (15:59:59).
const MAX_TZ_SECONDS: i64 = 16 * 3600 - 1;

// ---- calendar -------------------------------------------------------------------------

fn is_leap(year: i64) -> bool {
    year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0)
}

fn days_in_month(year: i64, month: u64) -> u64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 of a valid proleptic Gregorian date (astronomical year, |year|
/// below 10^9 so nothing can overflow).
fn days_from_civil(year: i64, month: u64, day: u64) -> i64 {
    let month = month as i64; // 1..=12
    let day = day as i64; // 1..=31
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Astronomical year, month, day of a day count since 1970-01-01 (any i64 / 86 400 000 000).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe.saturating_add(era.saturating_mul(400)) + i64::from(month <= 2);
    (year, month, day)
}

// ---- parsing --------------------------------------------------------------------------

/// `YYYY-MM-DD` (year of 4 or more digits, before any ` BC`), unvalidated.
fn read_ymd(c: &mut Cursor<'_>) -> Result<(u64, u64, u64), Bad> {
    const BAD: Bad = Bad::Invalid("expected YYYY-MM-DD");
    let (year, _) = c.digits(4, 9).ok_or(BAD)?;
    if !c.eat(b'-') {
        return Err(BAD);
    }
    let month = c.fixed(2).ok_or(BAD)?;
    if !c.eat(b'-') {
        return Err(BAD);
    }
    let day = c.fixed(2).ok_or(BAD)?;
    Ok((year, month, day))
}

/// Validates a date and returns its days since 1970-01-01.
fn ymd_to_days((year, month, day): (u64, u64, u64), bc: bool) -> Result<i64, Bad> {
    if year == 0 {
        return Err(Bad::Invalid("year 0 does not exist"));
    }
    let year = year as i64; // at most 9 digits
    let astronomical = if bc { 1 - year } else { year };
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(astronomical, month) {
        return Err(Bad::Invalid("month or day out of range"));
    }
    let days = days_from_civil(astronomical, month, day);
    if !(MIN_DAY..=MAX_DAY).contains(&days) {
        return Err(Bad::OutOfRange("date outside PostgreSQL's range"));
    }
    Ok(days)
}

fn read_bc(c: &mut Cursor<'_>) -> bool {
    c.eat_str(" BC")
}

fn expect_end(c: &Cursor<'_>) -> Result<(), Bad> {
    if c.at_end() {
        Ok(())
    } else {
        Err(Bad::Invalid("unexpected trailing characters"))
    }
}

pub(crate) fn parse_date(text: &str) -> Result<Special<i32>, Bad> {
    match text {
        "infinity" => return Ok(Special::Infinity),
        "-infinity" => return Ok(Special::NegInfinity),
        _ => {}
    }
    let mut c = Cursor::new(text);
    let ymd = read_ymd(&mut c)?;
    let bc = read_bc(&mut c);
    expect_end(&c)?;
    let days = ymd_to_days(ymd, bc)?;
    // MIN_DAY..=MAX_DAY lies strictly inside i32, so the sentinels are never produced.
    i32::try_from(days)
        .map(Special::Value)
        .map_err(|_| Bad::OutOfRange("date outside PostgreSQL's range"))
}

/// `HH:MM:SS[.ffffff]` as microseconds since midnight; `24:00:00` only when `allow_24`.
fn read_time(c: &mut Cursor<'_>, allow_24: bool) -> Result<i64, Bad> {
    const BAD: Bad = Bad::Invalid("expected HH:MM:SS[.ffffff]");
    let hour = c.fixed(2).ok_or(BAD)?;
    if !c.eat(b':') {
        return Err(BAD);
    }
    let minute = c.fixed(2).ok_or(BAD)?;
    if !c.eat(b':') {
        return Err(BAD);
    }
    let second = c.fixed(2).ok_or(BAD)?;
    let fraction = c.micros_fraction().map_err(|_| BAD)?;
    let is_24 = hour == 24 && minute == 0 && second == 0 && fraction == 0;
    if (hour > 23 && !(allow_24 && is_24)) || minute > 59 || second > 59 {
        return Err(Bad::Invalid("time field out of range"));
    }
    // All fields are small: no overflow possible.
    Ok(hour as i64 * USECS_PER_HOUR
        + minute as i64 * USECS_PER_MINUTE
        + second as i64 * USECS_PER_SEC
        + i64::from(fraction))
}

/// `+HH`, `-HH:MM`, `+HH:MM:SS` as seconds east of UTC.
fn read_offset(c: &mut Cursor<'_>) -> Result<i32, Bad> {
    const BAD: Bad = Bad::Invalid("expected a zone offset like +HH[:MM[:SS]]");
    let negative = match c.bump() {
        Some(b'+') => false,
        Some(b'-') => true,
        _ => return Err(BAD),
    };
    let hours = c.fixed(2).ok_or(BAD)?;
    let mut minutes = 0;
    let mut seconds = 0;
    if c.eat(b':') {
        minutes = c.fixed(2).ok_or(BAD)?;
        if c.eat(b':') {
            seconds = c.fixed(2).ok_or(BAD)?;
        }
    }
    if minutes > 59 || seconds > 59 {
        return Err(BAD);
    }
    let total = (hours * 3600 + minutes * 60 + seconds) as i64;
    if total > MAX_TZ_SECONDS {
        return Err(Bad::Invalid("zone offset out of range"));
    }
    let total = if negative { -total } else { total };
    i32::try_from(total).map_err(|_| BAD)
}

pub(crate) fn parse_time(text: &str) -> Result<i64, Bad> {
    let mut c = Cursor::new(text);
    let micros = read_time(&mut c, true)?;
    expect_end(&c)?;
    Ok(micros)
}

/// Returns microseconds since midnight and the offset in seconds east of UTC.
pub(crate) fn parse_timetz(text: &str) -> Result<(i64, i32), Bad> {
    let mut c = Cursor::new(text);
    let micros = read_time(&mut c, true)?;
    let offset = read_offset(&mut c)?;
    expect_end(&c)?;
    Ok((micros, offset))
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]`, `infinity`, `-infinity`. The zone
/// offset is required when `with_tz` (and then folded into UTC) and refused otherwise.
pub(crate) fn parse_timestamp(text: &str, with_tz: bool) -> Result<Special<i64>, Bad> {
    match text {
        "infinity" => return Ok(Special::Infinity),
        "-infinity" => return Ok(Special::NegInfinity),
        _ => {}
    }
    let mut c = Cursor::new(text);
    let ymd = read_ymd(&mut c)?;
    if !c.eat(b' ') {
        return Err(Bad::Invalid("expected a space between date and time"));
    }
    let time = read_time(&mut c, false)?;
    let offset = if with_tz { read_offset(&mut c)? } else { 0 };
    let bc = read_bc(&mut c);
    expect_end(&c)?;
    let days = ymd_to_days(ymd, bc)?;
    const RANGE: Bad = Bad::OutOfRange(
        "timestamp beyond 294247-01-10, not representable as microseconds since 1970",
    );
    let micros = days
        .checked_mul(USECS_PER_DAY)
        .and_then(|m| m.checked_add(time))
        .and_then(|m| m.checked_sub(i64::from(offset) * USECS_PER_SEC))
        .ok_or(RANGE)?;
    if micros == i64::MAX {
        // i64::MAX stands for +infinity downstream (PostgreSQL's own convention).
        return Err(RANGE);
    }
    if micros < MIN_TIMESTAMP {
        return Err(Bad::OutOfRange("timestamp before 4714-11-24 BC"));
    }
    Ok(Special::Value(micros))
}

// ---- rendering ------------------------------------------------------------------------

/// Appends `YYYY-MM-DD` and returns whether the date is BC.
fn write_date(out: &mut String, days: i64) -> bool {
    let (year, month, day) = civil_from_days(days);
    let bc = year <= 0;
    let year = if bc { 1i64.saturating_sub(year) } else { year };
    let _ = write!(out, "{year:04}-{month:02}-{day:02}");
    bc
}

/// Appends `HH:MM:SS[.ffffff]` (trailing fraction zeros dropped) for micros since midnight.
fn write_time(out: &mut String, micros: i64) {
    let negative = micros < 0;
    let micros = micros.unsigned_abs();
    let usecs = USECS_PER_SEC.unsigned_abs();
    let (hours, rest) = (micros / (usecs * 3600), micros % (usecs * 3600));
    let (minutes, rest) = (rest / (usecs * 60), rest % (usecs * 60));
    let (seconds, fraction) = (rest / usecs, rest % usecs);
    if negative {
        out.push('-');
    }
    let _ = write!(out, "{hours:02}:{minutes:02}:{seconds:02}");
    write_fraction(out, fraction);
}

/// Appends `.ffffff` without trailing zeros, nothing for zero.
pub(crate) fn write_fraction(out: &mut String, fraction: u64) {
    if fraction != 0 {
        let digits = format!("{fraction:06}");
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

/// Appends a zone offset the way PostgreSQL's `EncodeTimezone` does: `+HH`, `+HH:MM` or
/// `+HH:MM:SS`, only as long as needed.
fn write_offset(out: &mut String, east: i32) {
    let abs = east.unsigned_abs();
    let (hours, minutes, seconds) = (abs / 3600, abs / 60 % 60, abs % 60);
    out.push(if east >= 0 { '+' } else { '-' });
    let _ = write!(out, "{hours:02}");
    if seconds != 0 {
        let _ = write!(out, ":{minutes:02}:{seconds:02}");
    } else if minutes != 0 {
        let _ = write!(out, ":{minutes:02}");
    }
}

pub(crate) fn render_date(date: Special<i32>) -> String {
    match date {
        Special::Infinity => "infinity".to_owned(),
        Special::NegInfinity => "-infinity".to_owned(),
        Special::Value(days) => {
            let mut out = String::with_capacity(13);
            if write_date(&mut out, i64::from(days)) {
                out.push_str(" BC");
            }
            out
        }
    }
}

pub(crate) fn render_time(micros: i64) -> String {
    let mut out = String::with_capacity(15);
    write_time(&mut out, micros);
    out
}

pub(crate) fn render_timetz(micros: i64, offset_seconds: i32) -> String {
    let mut out = render_time(micros);
    write_offset(&mut out, offset_seconds);
    out
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]`, then `+00` for timestamptz (always shown in UTC), then
/// ` BC` — the order PostgreSQL's `EncodeDateTime` uses.
pub(crate) fn render_timestamp(value: Special<i64>, with_tz: bool) -> String {
    match value {
        Special::Infinity => "infinity".to_owned(),
        Special::NegInfinity => "-infinity".to_owned(),
        Special::Value(micros) => {
            let days = micros.div_euclid(USECS_PER_DAY);
            let time = micros.rem_euclid(USECS_PER_DAY);
            let mut out = String::with_capacity(32);
            let bc = write_date(&mut out, days);
            out.push(' ');
            write_time(&mut out, time);
            if with_tz {
                out.push_str("+00");
            }
            if bc {
                out.push_str(" BC");
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_round_trips_over_the_whole_date_range() {
        let mut day = MIN_DAY;
        while day <= MAX_DAY {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m as u64, d as u64), day);
            day += 9_973;
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(MIN_DAY), (-4713, 11, 24));
        assert_eq!(civil_from_days(MAX_DAY), (5_874_897, 12, 31));
    }

    #[test]
    fn dates() {
        assert_eq!(parse_date("1970-01-01"), Ok(Special::Value(0)));
        assert_eq!(parse_date("2000-01-01"), Ok(Special::Value(10_957)));
        assert_eq!(parse_date("1969-12-31"), Ok(Special::Value(-1)));
        assert_eq!(parse_date("infinity"), Ok(Special::Infinity));
        assert_eq!(parse_date("-infinity"), Ok(Special::NegInfinity));
        assert_eq!(
            parse_date("4714-11-24 BC"),
            Ok(Special::Value(MIN_DAY as i32))
        );
        assert_eq!(parse_date("4713-11-24 BC"), Ok(Special::Value(-2_440_222)));
        assert_eq!(
            parse_date("5874897-12-31"),
            Ok(Special::Value(MAX_DAY as i32))
        );
        assert!(matches!(
            parse_date("4714-11-23 BC"),
            Err(Bad::OutOfRange(_))
        ));
        assert!(matches!(
            parse_date("5874898-01-01"),
            Err(Bad::OutOfRange(_))
        ));
        for bad in [
            "2023-02-29",
            "2024-13-01",
            "2024-00-10",
            "0000-01-01",
            "24-01-01",
            "2024-1-01",
            "2024-01-01 AD",
            "2024-01-01 BC ",
            "Infinity",
            "2024-01-01T",
            "999999999999-01-01",
        ] {
            assert!(parse_date(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_date("2024-02-29"), Ok(Special::Value(19_782)));
        assert_eq!(
            parse_date("0001-02-29 BC").map(render_date),
            Ok("0001-02-29 BC".to_owned())
        );
    }

    #[test]
    fn times_and_offsets() {
        assert_eq!(parse_time("24:00:00"), Ok(USECS_PER_DAY));
        assert!(parse_time("24:00:00.000001").is_err());
        assert!(parse_time("23:60:00").is_err());
        assert!(parse_time("23:59:60").is_err());
        assert!(parse_time("23:59:59.1234567").is_err());
        assert!(parse_time("23:59:59.").is_err());
        assert_eq!(parse_time("00:00:00.5"), Ok(500_000));
        assert_eq!(
            parse_timetz("12:34:56.789+05:30"),
            Ok((45_296_789_000, 19_800))
        );
        assert_eq!(parse_timetz("00:00:00+05:30:15"), Ok((0, 19_815)));
        assert_eq!(parse_timetz("12:34:56-08"), Ok((45_296_000_000, -28_800)));
        assert!(parse_timetz("12:34:56").is_err());
        assert!(parse_timetz("12:34:56+16").is_err());
        assert!(parse_timetz("12:34:56+05:60").is_err());
        assert_eq!(render_timetz(0, -57_599), "00:00:00-15:59:59");
    }

    #[test]
    fn timestamps() {
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00", false),
            Ok(Special::Value(0))
        );
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00+00", true),
            Ok(Special::Value(0))
        );
        assert_eq!(
            parse_timestamp("1970-01-01 05:30:00+05:30", true),
            Ok(Special::Value(0))
        );
        assert!(parse_timestamp("1970-01-01 00:00:00", true).is_err());
        assert!(parse_timestamp("1970-01-01 00:00:00+00", false).is_err());
        assert!(parse_timestamp("1970-01-01 24:00:00", false).is_err());
        assert_eq!(
            parse_timestamp("1969-12-31 23:59:59.999999", false),
            Ok(Special::Value(-1))
        );
        // The last representable value sits just below the +infinity sentinel.
        assert_eq!(
            parse_timestamp("294247-01-10 04:00:54.775806", false),
            Ok(Special::Value(i64::MAX - 1))
        );
        assert!(matches!(
            parse_timestamp("294247-01-10 04:00:54.775807", false),
            Err(Bad::OutOfRange(_))
        ));
        assert!(matches!(
            parse_timestamp("294276-12-31 23:59:59.999999+00", true),
            Err(Bad::OutOfRange(_))
        ));
        assert_eq!(
            render_timestamp(Special::Value(i64::MAX - 1), false),
            "294247-01-10 04:00:54.775806"
        );
        assert_eq!(
            render_timestamp(Special::Value(MIN_TIMESTAMP), true),
            "4714-11-24 00:00:00+00 BC"
        );
        assert!(matches!(
            parse_timestamp("4714-11-24 00:00:00+00:00:01 BC", true),
            Err(Bad::OutOfRange(_))
        ));
    }
}
