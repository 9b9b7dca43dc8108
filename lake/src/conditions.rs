//! What rule and check conditions share before DataFusion compiles them (a condition is
//! compiled to a physical expression directly, without the optimizer that, in a whole
//! query such as a Gold model, would unwrap a cast of a column compared with a literal).

use deltalake::arrow::datatypes::{DataType, TimeUnit};
use deltalake::datafusion::common::tree_node::{Transformed, TreeNode};
use deltalake::datafusion::common::DFSchema;
use deltalake::datafusion::logical_expr::{Cast, Expr, ExprSchemable, TryCast};

/// `expr` with every timestamp it computes in microseconds, the unit of the lake's
/// timestamp columns (PostgreSQL's precision).
///
/// DataFusion's SQL gives nanoseconds to `TIMESTAMP '…'`, `CAST(… AS TIMESTAMP)` and
/// `now()`, and a comparison with a microsecond column then casts the column to
/// nanoseconds, which hold only the years 1677 to 2262: the `infinity` sentinels, and any
/// ordinary far date such as `9999-12-31` as a "valid until" marker, would fail the
/// condition on that row. In microseconds every lake timestamp compares as PostgreSQL
/// orders it. Columns are left as they are; an expression whose type cannot be
/// determined is left for DataFusion to report.
pub(crate) fn in_microseconds(expr: Expr, schema: &DFSchema) -> Expr {
    let micros = |tz| DataType::Timestamp(TimeUnit::Microsecond, tz);
    let result = expr.clone().transform_up(|e| {
        Ok(match e {
            Expr::Cast(c) => match c.field.data_type() {
                DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
                    Transformed::yes(Expr::Cast(Cast::new(c.expr, micros(tz.clone()))))
                }
                _ => Transformed::no(Expr::Cast(c)),
            },
            Expr::TryCast(c) => match c.field.data_type() {
                DataType::Timestamp(TimeUnit::Nanosecond, tz) => {
                    Transformed::yes(Expr::TryCast(TryCast::new(c.expr, micros(tz.clone()))))
                }
                _ => Transformed::no(Expr::TryCast(c)),
            },
            Expr::Column(_) => Transformed::no(e),
            e => match e.get_type(schema) {
                Ok(DataType::Timestamp(TimeUnit::Nanosecond, tz)) => {
                    Transformed::yes(Expr::Cast(Cast::new(Box::new(e), micros(tz))))
                }
                _ => Transformed::no(e),
            },
        })
    });
    result.map_or(expr, |t| t.data)
}

/// The first function of `expr` whose result is not a function of its arguments alone
/// (`now()`, `random()`): a condition must give the same answer for the same row whenever
/// it is evaluated (a replay, a backfill), and DataFusion cannot evaluate `now()` in a
/// compiled expression at all.
pub(crate) fn time_or_chance(expr: &Expr) -> Option<String> {
    use deltalake::datafusion::common::tree_node::TreeNodeRecursion;
    use deltalake::datafusion::logical_expr::Volatility;
    let mut found = None;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e {
            if f.func.signature().volatility != Volatility::Immutable {
                found = Some(f.func.name().to_owned());
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// Arrow types written with parameters in messages; a number inside their parentheses is
/// a parameter, not a value.
const TYPES_WITH_PARAMETERS: [&str; 9] = [
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "Decimal256",
    "Timestamp",
    "Time32",
    "Time64",
    "Duration",
    "FixedSizeBinary",
];

/// `message` (an error of the engine that evaluated a condition on a row) without the
/// row's values, which such messages quote (`Cannot cast string 'NaN' to …`, `1e30 is too
/// large to store in …`): every quoted span becomes `'…'` and every number `…`, except the
/// parameters of a type (`Decimal128(38, 10)`) and a number after `precision` or
/// `scale`. What is left says what failed (a cast, an overflow, a division by zero) and
/// on which types, which is what an operator needs; logs and quarantine records never
/// hold row values.
pub(crate) fn without_values(message: &str) -> String {
    let chars: Vec<char> = message.chars().collect();
    let mut out = String::with_capacity(message.len());
    // Per open parenthesis: whether it holds a type's parameters (`Decimal128(38, 10)`),
    // as opposed to a value's (`Int64(5)`, `Some(5)`).
    let mut parens: Vec<bool> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '\'' | '"' | '`' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|&q| q == c)
                    .map_or(chars.len(), |p| i + 1 + p);
                out.push(c);
                out.push('…');
                if end < chars.len() {
                    out.push(c);
                }
                i = end + 1;
            }
            '(' => {
                let word: String = out
                    .chars()
                    .rev()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                let in_type = parens.last().is_none_or(|t| *t);
                parens.push(in_type && TYPES_WITH_PARAMETERS.contains(&word.as_str()));
                out.push(c);
                i += 1;
            }
            ')' => {
                parens.pop();
                out.push(c);
                i += 1;
            }
            c if c.is_ascii_digit()
                && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')) =>
            {
                let end = chars[i..]
                    .iter()
                    .position(|d| !(d.is_ascii_alphanumeric() || *d == '.' || *d == '_'))
                    .map_or(chars.len(), |p| i + p);
                let word: String = chars[i..end].iter().collect();
                let before: String = out.trim_end().chars().rev().take(9).collect();
                let after_kind = before.starts_with("noisicerp") || before.starts_with("elacs");
                if parens.last().is_some_and(|t| *t) || after_kind {
                    out.push_str(&word);
                } else {
                    if out.ends_with('-') {
                        out.pop();
                    }
                    out.push('…');
                }
                i = end;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deltalake::arrow::array::{BooleanArray, RecordBatch, TimestampMicrosecondArray};
    use deltalake::arrow::datatypes::{Field, Schema};
    use deltalake::datafusion::prelude::SessionContext;

    use super::*;

    /// Evaluates `sql` over a `ts` column holding PostgreSQL's `-infinity`, 1970, 9999
    /// and `infinity` (as the lake stores them).
    fn eval(sql: &str, fix: bool) -> Result<Vec<Option<bool>>, String> {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let schema = Arc::new(Schema::new(vec![Field::new("ts", utc, true)]));
        let values = vec![i64::MIN, 0, 253_402_214_400_000_000, i64::MAX];
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(
                TimestampMicrosecondArray::from(values).with_timezone("UTC"),
            )],
        )
        .map_err(|e| e.to_string())?;
        let df = DFSchema::try_from(schema.as_ref().clone()).map_err(|e| e.to_string())?;
        let ctx = SessionContext::new();
        let mut expr = ctx.parse_sql_expr(sql, &df).map_err(|e| e.to_string())?;
        if fix {
            expr = in_microseconds(expr, &df);
        }
        let phys = ctx
            .create_physical_expr(expr, &df)
            .map_err(|e| e.to_string())?;
        let out = phys
            .evaluate(&batch)
            .and_then(|v| v.into_array(batch.num_rows()))
            .map_err(|e| e.to_string())?;
        let b = out
            .as_any()
            .downcast_ref::<BooleanArray>()
            .ok_or("not boolean")?;
        Ok(b.iter().collect())
    }

    #[test]
    fn engine_messages_lose_the_values_and_keep_the_types() {
        for (message, want) in [
            (
                "Arrow error: Cast error: Cannot cast string 'NaN' to value of Decimal128(38, 10) type",
                "Arrow error: Cast error: Cannot cast string '…' to value of Decimal128(38, 10) type",
            ),
            (
                "Arrow error: Invalid argument error: 1000000000000000000000000000000.00 is too large to store in a Decimal128 of precision 20. Max is 999999999999999999.99",
                "Arrow error: Invalid argument error: … is too large to store in a Decimal128 of precision 20. Max is …",
            ),
            (
                "Arrow error: Compute error: Overflow happened on: -9223372036854775808 * 2",
                "Arrow error: Compute error: Overflow happened on: … * …",
            ),
            ("Arrow error: Divide by zero error", "Arrow error: Divide by zero error"),
            (
                "Cannot cast Timestamp(µs, \"UTC\") value -9223372036854775808 to Timestamp(ns)",
                "Cannot cast Timestamp(µs, \"…\") value … to Timestamp(ns)",
            ),
            ("unterminated 'secret", "unterminated '…"),
            ("Cannot cast Int64(5) to UInt8", "Cannot cast Int64(…) to UInt8"),
            (
                "Decimal128(Some(1000),20,2) does not fit Decimal128(3, 0)",
                "Decimal128(Some(…),20,2) does not fit Decimal128(3, 0)",
            ),
            ("value (42) out of range", "value (…) out of range"),
            ("", ""),
        ] {
            assert_eq!(without_values(message), want, "{message}");
        }
    }

    #[test]
    fn far_timestamps_compare_with_nanosecond_literals() {
        for sql in [
            "ts > TIMESTAMP '2100-01-01 00:00:00'",
            "ts > CAST('2100-01-01T00:00:00Z' AS TIMESTAMP)",
            "ts > TRY_CAST('2100-01-01T00:00:00Z' AS TIMESTAMP)",
        ] {
            assert!(eval(sql, false).is_err(), "DataFusion alone fails: {sql}");
            assert_eq!(
                eval(sql, true).unwrap(),
                vec![Some(false), Some(false), Some(true), Some(true)],
                "{sql}"
            );
        }
        let parse = |sql: &str| {
            let schema = Schema::new(vec![Field::new("n", DataType::Int64, true)]);
            let df = DFSchema::try_from(schema).unwrap();
            SessionContext::new().parse_sql_expr(sql, &df).unwrap()
        };
        assert_eq!(
            time_or_chance(&parse("n > 1 AND random() < 0.5")).as_deref(),
            Some("random")
        );
        assert_eq!(
            time_or_chance(&parse("to_timestamp(n) < now()")).as_deref(),
            Some("now")
        );
        assert_eq!(time_or_chance(&parse("abs(n) > 1")), None);
        // Nothing else changes.
        assert_eq!(eval("ts IS NULL", true).unwrap(), vec![Some(false); 4]);
    }
}
