//! Quality checks: SQL conditions every row entering Silver must meet.
//!
//! A check is a DataFusion SQL boolean expression over the table's columns, evaluated
//! vectorised on the `after` images of a round's upserts (raw values, before masking, so a
//! regex can see the real text). A row fails when the condition is not true (false or
//! NULL). A row whose unchanged-TOAST columns include a column the check reads is not
//! checked by it: its value is not in the change. When a check cannot be evaluated on the
//! whole batch (a cast error on one row's value), it is evaluated row by row and the rows
//! where it errs fail it, so one bad value never stops the table.

use std::collections::BTreeSet;
use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray, BooleanArray, RecordBatch, StructArray};
use deltalake::arrow::datatypes::Schema;
use deltalake::datafusion::common::DFSchema;
use deltalake::datafusion::physical_expr::PhysicalExpr;
use deltalake::datafusion::prelude::SessionContext;

/// One configured check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Unique per table; recorded in quarantine.
    pub name: String,
    /// The condition, as DataFusion SQL.
    pub sql: String,
    /// The condition as people read it (for quarantine records).
    pub description: String,
}

/// A check that cannot run at all (names a column the table does not have, bad SQL):
/// an operator must fix the config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("check {name:?} ({sql}) cannot be evaluated: {reason}")]
pub struct CheckError {
    pub name: String,
    pub sql: String,
    pub reason: String,
}

/// The first check a row failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub check: String,
    pub reason: String,
}

struct Compiled<'a> {
    check: &'a Check,
    expr: Arc<dyn PhysicalExpr>,
    columns: BTreeSet<String>,
}

fn compile<'a>(
    ctx: &SessionContext,
    check: &'a Check,
    schema: &Schema,
) -> Result<Compiled<'a>, CheckError> {
    let fail = |reason: String| CheckError {
        name: check.name.clone(),
        sql: check.sql.clone(),
        reason,
    };
    let df_schema = DFSchema::try_from(schema.clone()).map_err(|e| fail(e.to_string()))?;
    let expr = ctx
        .parse_sql_expr(&check.sql, &df_schema)
        .map_err(|e| fail(e.to_string()))?;
    if let Some(f) = crate::conditions::time_or_chance(&expr) {
        return Err(fail(format!(
            "uses {f}(), whose result depends on when it runs: a check must give the same answer for a row whenever Silver applies it (a replay included)"
        )));
    }
    let expr = crate::conditions::in_microseconds(expr, &df_schema);
    let columns = expr
        .column_refs()
        .into_iter()
        .map(|c| c.name.clone())
        .collect();
    let expr = ctx
        .create_physical_expr(expr, &df_schema)
        .map_err(|e| fail(e.to_string()))?;
    Ok(Compiled {
        check,
        expr,
        columns,
    })
}

fn eval(expr: &Arc<dyn PhysicalExpr>, rows: &RecordBatch) -> Result<BooleanArray, String> {
    let v = expr
        .evaluate(rows)
        .and_then(|v| v.into_array(rows.num_rows()))
        .map_err(|e| e.to_string())?;
    v.as_boolean_opt()
        .cloned()
        .ok_or_else(|| format!("the condition is {}, not a boolean", v.data_type()))
}

/// Checks the rows of `after` marked in `checked`; returns, per row, the first failed
/// check. `unchanged(i)` lists row i's unchanged-TOAST columns.
pub fn evaluate(
    checks: &[Check],
    after: &StructArray,
    checked: &[bool],
    unchanged: impl Fn(usize) -> Vec<String>,
) -> Result<Vec<Option<Failure>>, CheckError> {
    let n = after.len();
    let mut out: Vec<Option<Failure>> = vec![None; n];
    if checks.is_empty() || !checked.iter().any(|c| *c) {
        return Ok(out);
    }
    let schema = Arc::new(Schema::new(after.fields().clone()));
    let rows =
        RecordBatch::try_new(schema.clone(), after.columns().to_vec()).map_err(|e| CheckError {
            name: "-".into(),
            sql: "-".into(),
            reason: e.to_string(),
        })?;
    let ctx = SessionContext::new();
    for check in checks {
        let c = compile(&ctx, check, &schema)?;
        let results: Vec<Result<bool, String>> = match eval(&c.expr, &rows) {
            Ok(b) => (0..n).map(|i| Ok(b.is_valid(i) && b.value(i))).collect(),
            Err(_) => (0..n)
                .map(|i| {
                    if !checked[i] {
                        return Ok(true);
                    }
                    eval(&c.expr, &rows.slice(i, 1)).map(|b| b.is_valid(0) && b.value(0))
                })
                .collect(),
        };
        for (i, r) in results.into_iter().enumerate() {
            if !checked[i] || out[i].is_some() {
                continue;
            }
            let reason = match r {
                Ok(true) => continue,
                Ok(false) => format!("not true: {}", c.check.description),
                // The engine's message may quote the value: never copy it.
                Err(_) => format!(
                    "cannot be evaluated on this row (a value the condition cannot cast or compute): {}",
                    c.check.description
                ),
            };
            if !c.columns.is_empty() && unchanged(i).iter().any(|u| c.columns.contains(u)) {
                continue;
            }
            out[i] = Some(Failure {
                check: c.check.name.clone(),
                reason,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{ArrayRef, Int64Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field};

    fn after() -> StructArray {
        StructArray::from(vec![
            (
                Arc::new(Field::new("amount", DataType::Int64, true)),
                Arc::new(Int64Array::from(vec![Some(5), Some(-1), Some(-2), None])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("type", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec!["pay", "pay", "refund", "pay"])) as ArrayRef,
            ),
            (
                Arc::new(Field::new("note", DataType::Utf8, true)),
                Arc::new(StringArray::from(vec!["1", "x", "2", "3"])) as ArrayRef,
            ),
        ])
    }

    fn check(name: &str, sql: &str) -> Check {
        Check {
            name: name.into(),
            sql: sql.into(),
            description: sql.into(),
        }
    }

    #[test]
    fn rows_that_are_not_true_fail_the_first_check() {
        let checks = [
            check("signed", "amount >= 0 OR type = 'refund'"),
            check("present", "amount IS NOT NULL"),
        ];
        let out = evaluate(&checks, &after(), &[true; 4], |_| vec![]).unwrap();
        let names: Vec<Option<&str>> = out
            .iter()
            .map(|f| f.as_ref().map(|f| f.check.as_str()))
            .collect();
        // Row 3: NULL >= 0 is NULL, which is not true.
        assert_eq!(names, vec![None, Some("signed"), None, Some("signed")]);
    }

    #[test]
    fn unchecked_rows_and_unchanged_columns_pass() {
        let checks = [check("present", "amount IS NOT NULL")];
        let out = evaluate(&checks, &after(), &[true, true, true, false], |_| vec![]).unwrap();
        assert!(out.iter().all(Option::is_none));
        let out = evaluate(&checks, &after(), &[true; 4], |i| {
            if i == 3 {
                vec!["amount".into()]
            } else {
                vec![]
            }
        })
        .unwrap();
        assert!(out[3].is_none());
    }

    #[test]
    fn a_row_that_breaks_the_expression_fails_alone() {
        let checks = [check("numeric_note", "CAST(note AS BIGINT) > 0")];
        let out = evaluate(&checks, &after(), &[true; 4], |_| vec![]).unwrap();
        assert!(out[0].is_none() && out[2].is_none() && out[3].is_none());
        let f = out[1].as_ref().expect("row 1 cannot be cast");
        assert!(f.reason.contains("cannot be evaluated"), "{}", f.reason);
    }

    #[test]
    fn an_unknown_column_is_an_operator_error() {
        let e = evaluate(&[check("c", "nope > 1")], &after(), &[true; 4], |_| vec![]).unwrap_err();
        assert_eq!(e.name, "c");
    }
}
