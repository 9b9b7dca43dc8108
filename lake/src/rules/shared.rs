//! Evaluating a table's rules together: a column cast that several rules make (Silver
//! keeps `numeric` as exact text, so most amount rules start with `CAST(amount AS
//! DECIMAL(18, 2))`) is computed once per batch, not once per rule. With 300 rules the
//! casts are most of the work.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltalake::arrow::array::{BooleanArray, RecordBatch};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::datafusion::common::tree_node::{Transformed, TreeNode};
use deltalake::datafusion::common::{Column, DFSchema};
use deltalake::datafusion::logical_expr::{Cast, Expr};
use deltalake::datafusion::physical_plan::PhysicalExpr;
use deltalake::datafusion::prelude::SessionContext;

use super::compile::{evaluate, CompiledRule};
use super::evaluate::conform;
use super::RuleError;

/// The rules of one table, compiled against one schema, evaluated together.
pub struct Evaluator {
    rules: Vec<CompiledRule>,
    /// The rules' schema, every column nullable: each batch is conformed to it first, so
    /// a batch read with other but castable types (DataFusion's `Utf8View`, inside lists
    /// too) still takes the shared path rather than one rule at a time.
    schema: SchemaRef,
    /// Each shared cast, as an expression over the rules' schema.
    casts: Vec<Arc<dyn PhysicalExpr>>,
    /// The rules' schema followed by one column per shared cast.
    extended: SchemaRef,
    /// Per rule, its condition over the extended batch (`None`: its own expression).
    shared: Vec<Option<Arc<dyn PhysicalExpr>>>,
}

fn cast_column(i: usize) -> String {
    format!("__wal2delta_cast_{i}")
}

impl Evaluator {
    /// `rules`, compiled against `schema`.
    pub fn new(rules: Vec<CompiledRule>, schema: &SchemaRef) -> Self {
        let ctx = SessionContext::new();
        let mut found: HashMap<(String, DataType), usize> = HashMap::new();
        let mut cast_exprs: Vec<Expr> = Vec::new();
        let rewritten: Vec<Option<Expr>> = rules
            .iter()
            .map(|r| {
                r.logical
                    .clone()
                    .transform_up(|e| match &e {
                        Expr::Cast(Cast { expr, field }) => match expr.as_ref() {
                            Expr::Column(c) => {
                                let n = found.len();
                                let i = *found
                                    .entry((c.name.clone(), field.data_type().clone()))
                                    .or_insert_with(|| {
                                        cast_exprs.push(e.clone());
                                        n
                                    });
                                Ok(Transformed::yes(Expr::Column(Column::from_name(
                                    cast_column(i),
                                ))))
                            }
                            _ => Ok(Transformed::no(e)),
                        },
                        _ => Ok(Transformed::no(e)),
                    })
                    .ok()
                    .map(|t| t.data)
            })
            .collect();
        let base = DFSchema::try_from(schema.as_ref().clone());
        let casts: Option<Vec<Arc<dyn PhysicalExpr>>> = base.as_ref().ok().and_then(|base| {
            cast_exprs
                .iter()
                .map(|e| ctx.create_physical_expr(e.clone(), base).ok())
                .collect()
        });
        let mut fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let conformed = Arc::new(Schema::new(fields.clone()));
        for (i, e) in cast_exprs.iter().enumerate() {
            if let Expr::Cast(Cast { field, .. }) = e {
                fields.push(Field::new(cast_column(i), field.data_type().clone(), true));
            }
        }
        let extended = Arc::new(Schema::new(fields));
        let (casts, shared) = match (casts, DFSchema::try_from(extended.as_ref().clone())) {
            (Some(casts), Ok(ext)) if !casts.is_empty() => {
                let shared = rewritten
                    .into_iter()
                    .map(|e| e.and_then(|e| ctx.create_physical_expr(e, &ext).ok()))
                    .collect();
                (casts, shared)
            }
            _ => (Vec::new(), vec![None; rules.len()]),
        };
        Evaluator {
            rules,
            schema: conformed,
            casts,
            extended,
            shared,
        }
    }

    pub fn rules(&self) -> &[CompiledRule] {
        &self.rules
    }

    /// Every rule over `batch` (its columns cast to the schema the rules were compiled
    /// against), as [`evaluate`] gives it. When a shared cast fails on the batch (a value
    /// that does not convert), each rule is evaluated on its own, so only the rules making
    /// that cast report the error.
    pub fn evaluate(&self, batch: &RecordBatch) -> Vec<Result<BooleanArray, RuleError>> {
        self.evaluate_timed(batch)
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// [`Self::evaluate`], with the time each rule took (the shared casts, computed once
    /// for all, are counted in no rule's time).
    pub fn evaluate_timed(
        &self,
        batch: &RecordBatch,
    ) -> Vec<(Result<BooleanArray, RuleError>, Duration)> {
        let alone = |r: &CompiledRule, batch: &RecordBatch| {
            let started = Instant::now();
            let out = evaluate(std::slice::from_ref(r), batch).remove(0);
            (out, started.elapsed())
        };
        // A column that cannot take the rules' type: each rule reports it on its own.
        let conformed = conform(batch, &self.schema);
        let batch = conformed.as_ref().unwrap_or(batch);
        let Some(extended) = self.with_casts(batch) else {
            return self.rules.iter().map(|r| alone(r, batch)).collect();
        };
        self.rules
            .iter()
            .zip(&self.shared)
            .map(|(r, shared)| match shared {
                Some(expr) => {
                    let started = Instant::now();
                    let out = super::compile::evaluate_expr(&r.rule, expr, &extended);
                    (out, started.elapsed())
                }
                None => alone(r, batch),
            })
            .collect()
    }

    /// `batch` (conformed to the rules' schema) with one column per shared cast; `None`
    /// when there is none or one fails on the batch.
    fn with_casts(&self, batch: &RecordBatch) -> Option<RecordBatch> {
        if self.casts.is_empty() {
            return None;
        }
        let mut columns = batch.columns().to_vec();
        for c in &self.casts {
            columns.push(
                c.evaluate(batch)
                    .and_then(|v| v.into_array(batch.num_rows()))
                    .ok()?,
            );
        }
        RecordBatch::try_new(self.extended.clone(), columns).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};
    use deltalake::arrow::compute::cast;
    use wal2delta_model::TableName;

    #[test]
    fn shared_casts_give_the_same_results_as_each_rule_alone() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("amount", DataType::Utf8, true),
            Field::new("currency", DataType::Utf8, true),
        ]));
        let rule = |id: &str, when: &str| super::super::Rule {
            id: id.into(),
            table: TableName::new("public", "t"),
            when: when.into(),
            version: 1,
            active: true,
            lookups: Vec::new(),
        };
        let rules: Vec<CompiledRule> = [
            ("a", "CAST(amount AS DECIMAL(18, 2)) > 100"),
            (
                "b",
                "CAST(amount AS DECIMAL(18, 2)) BETWEEN 5 AND 200 AND currency = 'EUR'",
            ),
            ("c", "currency IN ('USD')"),
            ("d", "CAST(amount AS DOUBLE) < 6"),
        ]
        .iter()
        .map(|(i, w)| super::super::compile(&rule(i, w), &schema).unwrap())
        .collect();
        let ev = Evaluator::new(rules.clone(), &schema);
        assert_eq!(ev.casts.len(), 2, "two distinct casts");
        let batch = |amounts: Vec<Option<&str>>| {
            let n = amounts.len();
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..n as i64)),
                    Arc::new(StringArray::from(amounts)),
                    Arc::new(StringArray::from(vec![Some("EUR"); n])),
                ],
            )
            .unwrap()
        };
        let good = batch(vec![Some("150.00"), Some("5.50"), None, Some("1000")]);
        let shared: Vec<_> = ev.evaluate(&good).into_iter().map(Result::unwrap).collect();
        let alone: Vec<_> = evaluate(&rules, &good)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(shared, alone);
        // Read back by DataFusion, strings are views (in lists too): still shared.
        let views = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("amount", DataType::Utf8View, true),
                Field::new("currency", DataType::Utf8View, true),
            ])),
            good.columns()
                .iter()
                .map(|c| match c.data_type() {
                    DataType::Utf8 => cast(c, &DataType::Utf8View).unwrap(),
                    _ => c.clone(),
                })
                .collect(),
        )
        .unwrap();
        let conformed = conform(&views, &ev.schema).unwrap();
        assert!(
            ev.with_casts(&conformed).is_some(),
            "the shared path is taken"
        );
        let viewed: Vec<_> = ev
            .evaluate(&views)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(viewed, alone);
        // A value that does not convert: the casting rules fail, `c` goes on.
        let bad = batch(vec![Some("150.00"), Some("abc")]);
        let out = ev.evaluate(&bad);
        assert!(out[0].is_err() && out[1].is_err() && out[3].is_err());
        assert_eq!(out[2].as_ref().unwrap().len(), 2);
    }
}
