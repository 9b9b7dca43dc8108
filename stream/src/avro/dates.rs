//! Dates the lake can hold: PostgreSQL's `date` range is wider than what Delta writers can
//! describe.
//!
//! PostgreSQL dates run to 5874897-12-31 and have `±infinity` (capture sends them as the
//! `i32::MAX`/`i32::MIN` sentinels, `docs/types.md`). Arrow's `Date32` holds all of them,
//! but a Delta writer must also write each file's min/max statistics as calendar dates, and
//! deltalake-core does that with chrono, whose calendar ends at year ±262,143: a value
//! beyond it panics inside the writer (`NaiveDate + TimeDelta` overflow), in Bronze's
//! append, in compaction and in Silver's MERGE alike. So the Arrow form of a date is kept
//! inside chrono's calendar:
//!
//! | PostgreSQL | lake value | original kept as |
//! | --- | --- | --- |
//! | `infinity` | [`DATE_MAX`] (262142-12-31) | `infinity` |
//! | `-infinity` | [`DATE_MIN`] (262143-01-01 BC, year -262143) | `-infinity` |
//! | a finite date at or after 262142-12-31 | [`DATE_MAX`] − 1 | its PostgreSQL text, `300000-01-01` |
//! | a finite date at or before [`DATE_MIN`] (PostgreSQL has none: its dates start 4714 BC) | [`DATE_MIN`] + 1 | its text |
//!
//! Order is kept (−infinity < every finite date < infinity), so range filters
//! (`valid_to > current_date`) still work on the lake value; the exact value is in the
//! Bronze row's `out_of_range_values` column ([`OutOfRange`]).

/// The last day deltalake can write statistics for: 262142-12-31 (chrono's `NaiveDate::MAX`),
/// days since 1970-01-01.
pub const DATE_MAX: i32 = days_from_civil(262_142, 12, 31);
/// The first such day: 1 January of year -262143 (chrono's `NaiveDate::MIN`).
pub const DATE_MIN: i32 = days_from_civil(-262_143, 1, 1);

/// Days since 1970-01-01 of a proleptic Gregorian date with astronomical year numbering
/// (H. Hinnant's `days_from_civil`).
const fn days_from_civil(y: i64, m: i64, d: i64) -> i32 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) as i32
}

/// The proleptic Gregorian (year, month, day) of a day number (astronomical years).
fn civil_from_days(z: i32) -> (i64, u32, u32) {
    let z = i64::from(z) + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The date as PostgreSQL prints it with `DateStyle = ISO`: `infinity`, `-infinity`,
/// `300000-01-01`, `0044-03-15 BC`.
pub fn pg_date_text(days: i32) -> String {
    match days {
        i32::MAX => "infinity".to_owned(),
        i32::MIN => "-infinity".to_owned(),
        _ => {
            let (y, m, d) = civil_from_days(days);
            if y <= 0 {
                format!("{:04}-{m:02}-{d:02} BC", 1 - y)
            } else {
                format!("{y:04}-{m:02}-{d:02}")
            }
        }
    }
}

/// A date's value in the lake, and whether it differs from the value sent.
pub fn lake_date(days: i32) -> (i32, bool) {
    match days {
        i32::MAX => (DATE_MAX, true),
        i32::MIN => (DATE_MIN, true),
        d if d >= DATE_MAX => (DATE_MAX - 1, true),
        d if d <= DATE_MIN => (DATE_MIN + 1, true),
        d => (d, false),
    }
}

/// One value the lake holds in place of the value sent: the field's path in the row
/// (`after.valid_to`, `after.days[2]` with PostgreSQL's 1-based array index, `key.day`) and
/// the original as PostgreSQL text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfRange {
    pub column: String,
    pub value: String,
}

/// Every date inside `value` (a row image or key as decoded) the lake cannot hold as sent.
/// Bronze walks every event with it, so the path of a value is built in one buffer and
/// copied only for a date that is out of range.
pub fn out_of_range(path: &str, value: &apache_avro::types::Value, out: &mut Vec<OutOfRange>) {
    let mut buf = String::with_capacity(path.len() + 32);
    buf.push_str(path);
    walk_dates(&mut buf, value, out);
}

fn walk_dates(path: &mut String, value: &apache_avro::types::Value, out: &mut Vec<OutOfRange>) {
    use apache_avro::types::Value;
    use std::fmt::Write;
    match value {
        Value::Union(_, inner) => walk_dates(path, inner, out),
        Value::Record(fields) => {
            for (name, v) in fields {
                let len = path.len();
                path.push('.');
                path.push_str(name);
                walk_dates(path, v, out);
                path.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                let len = path.len();
                // Writing to a String cannot fail.
                let _ = write!(path, "[{}]", i + 1);
                walk_dates(path, v, out);
                path.truncate(len);
            }
        }
        Value::Date(d) if lake_date(*d).1 => out.push(OutOfRange {
            column: path.clone(),
            value: pg_date_text(*d),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::temporal_conversions::date32_to_datetime;

    #[test]
    fn the_bounds_are_chronos_calendar() {
        assert!(date32_to_datetime(DATE_MAX).is_some());
        assert!(date32_to_datetime(DATE_MAX + 1).is_none());
        assert!(date32_to_datetime(DATE_MIN).is_some());
        assert!(date32_to_datetime(DATE_MIN - 1).is_none());
        assert_eq!(pg_date_text(DATE_MAX), "262142-12-31");
        assert_eq!(pg_date_text(DATE_MIN), "262144-01-01 BC");
    }

    #[test]
    fn text_is_postgresqls() {
        assert_eq!(pg_date_text(0), "1970-01-01");
        assert_eq!(pg_date_text(19_782), "2024-02-29");
        assert_eq!(pg_date_text(-735_160), "0044-03-15 BC");
        assert_eq!(pg_date_text(days_from_civil(300_000, 1, 1)), "300000-01-01");
        // PostgreSQL's last date.
        assert_eq!(pg_date_text(2_145_042_905), "5874897-12-31");
        assert_eq!(pg_date_text(i32::MAX), "infinity");
        assert_eq!(pg_date_text(i32::MIN), "-infinity");
    }

    #[test]
    fn out_of_range_dates_keep_their_order_inside_the_calendar() {
        let far = days_from_civil(300_000, 1, 1);
        assert_eq!(lake_date(i32::MAX), (DATE_MAX, true));
        assert_eq!(lake_date(far), (DATE_MAX - 1, true));
        assert_eq!(lake_date(DATE_MAX), (DATE_MAX - 1, true));
        assert_eq!(lake_date(DATE_MAX - 1), (DATE_MAX - 1, false));
        assert_eq!(lake_date(i32::MIN), (DATE_MIN, true));
        assert_eq!(lake_date(-735_160), (-735_160, false));
        for d in [i32::MIN, DATE_MIN, 0, far, i32::MAX] {
            assert!(date32_to_datetime(lake_date(d).0).is_some());
        }
    }

    #[test]
    fn out_of_range_names_paths_with_one_based_array_indexes() {
        use apache_avro::types::Value;
        let row = Value::Record(vec![
            ("d".into(), Value::Union(1, Box::new(Value::Date(i32::MAX)))),
            ("ok".into(), Value::Union(1, Box::new(Value::Date(5)))),
            (
                "ds".into(),
                Value::Union(
                    1,
                    Box::new(Value::Array(vec![
                        Value::Union(1, Box::new(Value::Date(1))),
                        Value::Union(1, Box::new(Value::Date(i32::MIN))),
                    ])),
                ),
            ),
        ]);
        let mut out = Vec::new();
        out_of_range("after", &row, &mut out);
        assert_eq!(
            out,
            vec![
                OutOfRange {
                    column: "after.d".into(),
                    value: "infinity".into()
                },
                OutOfRange {
                    column: "after.ds[2]".into(),
                    value: "-infinity".into()
                },
            ]
        );
    }
}
