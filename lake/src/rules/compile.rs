//! Compiling a rule: parsed and type-checked once against its table's Silver schema, then
//! evaluated vectorised, one boolean per row, over Arrow batches.

use std::sync::Arc;

use deltalake::arrow::array::{Array, BooleanArray, RecordBatch};
use deltalake::arrow::datatypes::{DataType, SchemaRef};
use deltalake::datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use deltalake::datafusion::common::DFSchema;
use deltalake::datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable};
use deltalake::datafusion::physical_plan::PhysicalExpr;
use deltalake::datafusion::prelude::SessionContext;

use super::Rule;

/// Why a rule cannot be used; names the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {id:?}: {reason}")]
pub struct RuleError {
    pub id: String,
    pub reason: String,
}

/// A rule ready to evaluate.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    pub rule: Rule,
    /// The checked condition (for [`super::Evaluator`], which shares casts between rules).
    pub(super) logical: Expr,
    pub(super) expr: Arc<dyn PhysicalExpr>,
}

pub(super) fn refuse(rule: &Rule, reason: impl Into<String>) -> RuleError {
    RuleError {
        id: rule.id.clone(),
        reason: reason.into(),
    }
}

/// Parses and checks `rule.when` against `schema` (the table's Silver columns): a syntax
/// error, an unknown column, a type error, a result that is not boolean, or a text column
/// compared with a number (Silver keeps `numeric` as exact text: the comparison would be
/// between strings) is refused with the rule's id and the reason.
pub fn compile(rule: &Rule, schema: &SchemaRef) -> Result<CompiledRule, RuleError> {
    if rule.when.trim().is_empty() {
        return Err(refuse(rule, "`when` is empty"));
    }
    let df_schema =
        DFSchema::try_from(schema.as_ref().clone()).map_err(|e| refuse(rule, e.to_string()))?;
    let ctx = SessionContext::new();
    let expr = ctx
        .parse_sql_expr(&rule.when, &df_schema)
        .map_err(|e| refuse(rule, first_line(&e.to_string())))?;
    let ty = expr
        .get_type(&df_schema)
        .map_err(|e| refuse(rule, first_line(&e.to_string())))?;
    if ty != DataType::Boolean {
        return Err(refuse(
            rule,
            format!("`when` must be a condition (boolean), but it is {ty}"),
        ));
    }
    check_text_number_comparisons(rule, &expr, &df_schema)?;
    let physical = ctx
        .create_physical_expr(expr.clone(), &df_schema)
        .map_err(|e| refuse(rule, first_line(&e.to_string())))?;
    Ok(CompiledRule {
        rule: rule.clone(),
        logical: expr,
        expr: physical,
    })
}

pub(super) fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_owned()
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_number(t: &DataType) -> bool {
    t.is_numeric()
}

/// Refuses `text_column < 10`-style comparisons: DataFusion would compare them as strings.
fn check_text_number_comparisons(
    rule: &Rule,
    expr: &Expr,
    schema: &DFSchema,
) -> Result<(), RuleError> {
    use deltalake::datafusion::logical_expr::{Between, Operator};
    let type_of = |e: &Expr| e.get_type(schema).ok();
    let mixed = |a: &Expr, b: &Expr| match (type_of(a), type_of(b)) {
        (Some(l), Some(r)) => (is_text(&l) && is_number(&r)) || (is_number(&l) && is_text(&r)),
        _ => false,
    };
    let mut found = None;
    let _ = expr.apply(|e| {
        let bad = match e {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                matches!(
                    op,
                    Operator::Eq
                        | Operator::NotEq
                        | Operator::Lt
                        | Operator::LtEq
                        | Operator::Gt
                        | Operator::GtEq
                        | Operator::IsDistinctFrom
                        | Operator::IsNotDistinctFrom
                ) && mixed(left, right)
            }
            Expr::Between(Between {
                expr, low, high, ..
            }) => mixed(expr, low) || mixed(expr, high),
            Expr::InList(l) => l.list.iter().any(|v| mixed(&l.expr, v)),
            _ => false,
        };
        if bad {
            found = Some(format!("`{e}` compares text with a number, which would compare them as strings; Silver keeps numeric columns as exact text: cast it, e.g. CAST(amount AS DECIMAL(18, 2)) > 10000"));
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    match found {
        Some(reason) => Err(refuse(rule, reason)),
        None => Ok(()),
    }
}

/// Evaluates every rule over `batch` (rows of the rules' table with its Silver columns):
/// one boolean array per rule, a NULL result counting as false. A rule that fails on
/// this batch (a cast that fails on one value) gives its error instead; the others go on.
pub fn evaluate(
    rules: &[CompiledRule],
    batch: &RecordBatch,
) -> Vec<Result<BooleanArray, RuleError>> {
    rules
        .iter()
        .map(|r| evaluate_expr(&r.rule, &r.expr, batch))
        .collect()
}

/// `expr` (rule `rule`'s condition) over `batch`; NULL is no hit.
pub(super) fn evaluate_expr(
    rule: &Rule,
    expr: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> Result<BooleanArray, RuleError> {
    let value = expr
        .evaluate(batch)
        .and_then(|v| v.into_array(batch.num_rows()))
        .map_err(|e| refuse(rule, first_line(&e.to_string())))?;
    let bools = value
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| refuse(rule, "did not evaluate to booleans"))?;
    // NULL (unknown) is not a hit.
    Ok(match bools.nulls() {
        Some(_) => deltalake::arrow::compute::prep_null_mask_filter(bools),
        None => bools.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};
    use deltalake::arrow::datatypes::{Field, Schema};
    use wal2delta_model::TableName;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Utf8, true),
            Field::new("currency", DataType::Utf8, true),
            Field::new("score", DataType::Int64, true),
        ]))
    }

    fn rule(id: &str, when: &str) -> Rule {
        Rule {
            id: id.into(),
            table: TableName::new("public", "transactions"),
            when: when.into(),
            version: 1,
            active: true,
        }
    }

    #[test]
    fn bad_rules_are_refused_with_their_id_and_reason() {
        for (when, needle) in [
            ("amount >", "SQL"),
            ("nope > 1", "nope"),
            ("score + 1", "boolean"),
            ("amount > 10000", "cast it"),
            ("amount BETWEEN 1 AND 5", "cast it"),
            ("amount IN (1, 2)", "cast it"),
            ("currency = 'EUR' AND score > 'x'", ""),
            ("", "empty"),
        ] {
            match compile(&rule("r1", when), &schema()) {
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        text.starts_with("rule \"r1\": ") && text.contains(needle),
                        "{when}: {text}"
                    );
                }
                Ok(_) if needle.is_empty() => {}
                Ok(_) => panic!("{when} compiled"),
            }
        }
    }

    #[test]
    fn rules_evaluate_vectorised_and_null_is_no_hit() {
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![
                    Some("20000.00"),
                    Some("5.10"),
                    None,
                    Some("abc"),
                ])),
                Arc::new(StringArray::from(vec![
                    Some("USD"),
                    Some("EUR"),
                    Some("USD"),
                    None,
                ])),
                Arc::new(Int64Array::from(vec![Some(90), Some(10), None, Some(50)])),
            ],
        )
        .unwrap();
        let rules = [
            compile(
                &rule(
                    "big",
                    "CAST(amount AS DECIMAL(18, 2)) > 10000 AND currency <> 'EUR'",
                ),
                &schema(),
            )
            .unwrap(),
            compile(&rule("risky", "score >= 50"), &schema()).unwrap(),
            compile(&rule("usd", "currency IN ('USD', 'GBP')"), &schema()).unwrap(),
        ];
        let out = evaluate(&rules, &batch);
        // "abc" cannot be cast: that rule's error, the other rules go on.
        assert!(out[0].is_err(), "{:?}", out[0]);
        let hits = |i: usize| -> Vec<bool> {
            out[i]
                .as_ref()
                .unwrap()
                .iter()
                .map(|b| b.unwrap())
                .collect()
        };
        assert_eq!(hits(1), [true, false, false, true]);
        assert_eq!(hits(2), [true, false, true, false]);
        let no_bad = RecordBatch::try_new(
            schema(),
            batch.columns().iter().map(|c| c.slice(0, 3)).collect(),
        )
        .unwrap();
        let out = evaluate(&rules[..1], &no_bad);
        assert_eq!(
            out[0]
                .as_ref()
                .unwrap()
                .iter()
                .map(|b| b.unwrap())
                .collect::<Vec<_>>(),
            [true, false, false]
        );
    }
}
