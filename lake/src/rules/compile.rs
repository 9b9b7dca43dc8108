//! Compiling a rule: parsed and type-checked once against its table's Silver schema, then
//! evaluated vectorised, one boolean per row, over Arrow batches.

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::arrow::array::{Array, BooleanArray, RecordBatch};
use deltalake::arrow::datatypes::{DataType, SchemaRef};
use deltalake::arrow::datatypes::{Field, Schema};
use deltalake::datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use deltalake::datafusion::common::DFSchema;
use deltalake::datafusion::logical_expr::utils::{conjunction, split_conjunction};
use deltalake::datafusion::logical_expr::{lit, BinaryExpr, Expr, ExprSchemable};
use deltalake::datafusion::physical_plan::PhysicalExpr;
use deltalake::datafusion::prelude::SessionContext;

use super::{Lookup, Rule};

/// The Silver schemas of the tables rules look up, by lake name (`schema.table` with the
/// lake's parts, [`lake_name`]).
pub type Related = HashMap<String, SchemaRef>;

/// `table` as the lake names it (the key of [`Related`] and of the rule source).
pub fn lake_name(table: &wal2delta_model::TableName) -> String {
    let (schema, name) = table.ident_parts();
    format!("{schema}.{name}")
}

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
    /// For a rule with lookups: the conditions on the row's own columns (phase one; `true`
    /// when it has none), and the whole condition in [`LookupPlan`].
    pub(super) logical: Expr,
    pub(super) expr: Arc<dyn PhysicalExpr>,
    pub(super) lookup: Option<Arc<LookupPlan>>,
}

/// How a rule with lookups finishes (phase two, [`super::lookup`]): its whole condition
/// over the row's columns followed by each lookup's columns.
#[derive(Debug)]
pub(super) struct LookupPlan {
    /// Each lookup with the related table's Silver schema the rule was compiled against.
    pub lookups: Vec<(Lookup, SchemaRef)>,
    pub full: Arc<dyn PhysicalExpr>,
    /// The row's columns, then each lookup's (all nullable: no related row gives NULLs).
    pub combined: SchemaRef,
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
/// between strings) is refused with the rule's id and the reason. A rule with lookups
/// needs [`compile_with`].
pub fn compile(rule: &Rule, schema: &SchemaRef) -> Result<CompiledRule, RuleError> {
    compile_with(rule, schema, &Related::new())
}

/// [`compile`], with the Silver schemas of the tables the rule looks up (`related`): its
/// condition may name their columns qualified by the lookup's name. A lookup whose table
/// has no Silver schema in `related`, an `on` column that does not exist on either side or
/// whose types cannot be compared, and a lookup of the rule's own table are refused.
pub fn compile_with(
    rule: &Rule,
    schema: &SchemaRef,
    related: &Related,
) -> Result<CompiledRule, RuleError> {
    if rule.when.trim().is_empty() {
        return Err(refuse(rule, "`when` is empty"));
    }
    let lookups = lookup_schemas(rule, schema, related)?;
    let own_schema =
        DFSchema::try_from(schema.as_ref().clone()).map_err(|e| refuse(rule, e.to_string()))?;
    let (df_schema, combined) = if lookups.is_empty() {
        (own_schema.clone(), schema.clone())
    } else {
        combined_schema(rule, schema, &lookups)?
    };
    let ctx = SessionContext::new();
    let when = if lookups.is_empty() {
        rule.when.clone()
    } else {
        flatten_lookups(rule)?
    };
    let expr = ctx
        .parse_sql_expr(&when, &df_schema)
        .map_err(|e| refuse(rule, first_line(&e.to_string())))?;
    if let Some(f) = crate::conditions::time_or_chance(&expr) {
        return Err(refuse(
            rule,
            format!("`when` uses {f}(), whose result depends on when it runs: a rule's result must depend on the row alone (transitions are replayed and backfilled)"),
        ));
    }
    if let Some(reason) = unbounded_output(&expr) {
        return Err(refuse(rule, reason));
    }
    let expr = crate::conditions::in_microseconds(expr, &df_schema);
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
    let physical = |e: &Expr, s: &DFSchema| {
        ctx.create_physical_expr(e.clone(), s)
            .map_err(|e| refuse(rule, first_line(&e.to_string())))
    };
    if lookups.is_empty() {
        return Ok(CompiledRule {
            rule: rule.clone(),
            expr: physical(&expr, &df_schema)?,
            logical: expr,
            lookup: None,
        });
    }
    // Phase one: the conjuncts that read only the row's own columns.
    let own_only = |e: &Expr| {
        e.column_refs()
            .iter()
            .all(|c| schema.field_with_name(&c.name).is_ok())
    };
    let phase_one = conjunction(
        split_conjunction(&expr)
            .into_iter()
            .filter(|e| own_only(e))
            .cloned(),
    )
    .unwrap_or_else(|| lit(true));
    Ok(CompiledRule {
        rule: rule.clone(),
        expr: physical(&phase_one, &own_schema)?,
        logical: phase_one,
        lookup: Some(Arc::new(LookupPlan {
            full: physical(&expr, &df_schema)?,
            lookups,
            combined,
        })),
    })
}

/// Each lookup of `rule` with its table's Silver schema, checked.
fn lookup_schemas(
    rule: &Rule,
    schema: &SchemaRef,
    related: &Related,
) -> Result<Vec<(Lookup, SchemaRef)>, RuleError> {
    let mut out = Vec::new();
    for l in &rule.lookups {
        let at = |reason: String| refuse(rule, format!("lookup `{}`: {reason}", l.name));
        let ident = l
            .name
            .starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && l.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ident {
            return Err(at("a lookup's name is lowercase letters, digits and `_`, not starting with a digit (the condition qualifies its columns with it)".into()));
        }
        if out
            .iter()
            .any(|(o, _): &(Lookup, SchemaRef)| o.name == l.name)
        {
            return Err(at("the name is used by another lookup of the rule".into()));
        }
        if l.table == rule.table {
            return Err(at("a rule cannot look up its own table (its rows are being applied in the same round)".into()));
        }
        let Some(r) = related.get(&lake_name(&l.table)) else {
            return Err(at(format!(
                "{} has no Silver table (is it captured, with a primary key, and has the silver stage run?)",
                l.table
            )));
        };
        if l.on.is_empty() {
            return Err(at("`on` names no column".into()));
        }
        for (own, other) in &l.on {
            let a = schema
                .field_with_name(own)
                .map_err(|_| at(format!("{} has no column {own:?}", rule.table)))?;
            let b = r
                .field_with_name(other)
                .map_err(|_| at(format!("{} has no column {other:?}", l.table)))?;
            if join_type(a.data_type()) != join_type(b.data_type()) {
                return Err(at(format!(
                    "{own:?} ({}) cannot be matched with {other:?} ({}): the types differ",
                    a.data_type(),
                    b.data_type()
                )));
            }
        }
        out.push((l.clone(), r.clone()));
    }
    Ok(out)
}

/// The type a lookup compares `on` columns as: integers as Int64, text as Utf8, the rest
/// as they are.
pub(super) fn join_type(t: &DataType) -> DataType {
    match t {
        t if t.is_integer() => DataType::Int64,
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        t => t.clone(),
    }
}

/// The schema a rule with lookups is parsed against: the row's columns, then each
/// lookup's as `{lookup}.{column}` (one name: see [`flatten_lookups`]), nullable.
fn combined_schema(
    rule: &Rule,
    schema: &SchemaRef,
    lookups: &[(Lookup, SchemaRef)],
) -> Result<(DFSchema, SchemaRef), RuleError> {
    let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
    for (l, r) in lookups {
        for f in r.fields() {
            let name = format!("{}.{}", l.name, f.name());
            if schema.field_with_name(&name).is_ok() {
                return Err(refuse(
                    rule,
                    format!("lookup `{}`: {} has a column named {name:?}, which the lookup's column would shadow; rename the lookup", l.name, rule.table),
                ));
            }
            fields.push(Arc::new(
                f.as_ref().clone().with_name(name).with_nullable(true),
            ));
        }
    }
    let arrow = Arc::new(Schema::new(fields));
    let df = DFSchema::try_from(arrow.as_ref().clone())
        .map_err(|e| refuse(rule, first_line(&e.to_string())))?;
    Ok((df, arrow))
}

/// `rule.when` with every `lookup.column` (a lookup's name, then a column) written as the
/// one quoted name `"lookup.column"`, the name [`combined_schema`] gives the lookup's
/// column: DataFusion would find a qualified `shop.id` ambiguous with the row's own `id`.
/// Names are normalised as DataFusion does (unquoted: lowercase).
fn flatten_lookups(rule: &Rule) -> Result<String, RuleError> {
    use deltalake::datafusion::sql::sqlparser::ast::{visit_expressions_mut, Expr as Sql, Ident};
    use deltalake::datafusion::sql::sqlparser::dialect::GenericDialect;
    use deltalake::datafusion::sql::sqlparser::parser::Parser;
    use deltalake::datafusion::sql::sqlparser::tokenizer::Token;
    let syntax = |e: String| refuse(rule, format!("SQL error: {}", first_line(&e)));
    let mut parser = Parser::new(&GenericDialect {})
        .try_with_sql(&rule.when)
        .map_err(|e| syntax(e.to_string()))?;
    let mut expr = parser.parse_expr().map_err(|e| syntax(e.to_string()))?;
    if parser.peek_token().token != Token::EOF {
        return Err(syntax(format!(
            "unexpected {} after the condition",
            parser.peek_token().token
        )));
    }
    let name = |i: &Ident| match i.quote_style {
        Some(_) => i.value.clone(),
        None => i.value.to_lowercase(),
    };
    let _ = visit_expressions_mut(&mut expr, |e| {
        if let Sql::CompoundIdentifier(parts) = e {
            if let [lookup, column] = parts.as_slice() {
                if rule.lookups.iter().any(|l| l.name == name(lookup)) {
                    let flat = format!("{}.{}", name(lookup), name(column));
                    *e = Sql::Identifier(Ident::with_quote('"', flat));
                }
            }
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    Ok(expr.to_string())
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

/// The largest size a rule may ask a function to make: `repeat`, `lpad`, `rpad` and
/// `array_repeat` build a value of the size their count argument names, so a rule such as
/// `repeat(note, 2147483647) <> ''` would try to allocate gigabytes per row and take the
/// silver stage (which evaluates every rule) down with it.
pub const MAX_GROWN: i64 = 10_000;

/// Why `expr` may build values of unbounded size, if it may: a growing function whose
/// count is not a literal of at most [`MAX_GROWN`], or a function that makes a series
/// (`range`, `generate_series`).
fn unbounded_output(expr: &Expr) -> Option<String> {
    use deltalake::datafusion::scalar::ScalarValue;
    let mut found = None;
    let _ = expr.apply(|e| {
        let Expr::ScalarFunction(f) = e else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let name = f.func.name().to_lowercase();
        let why = match name.as_str() {
            "range" | "generate_series" => Some(format!(
                "`when` uses {name}(), which makes a series of any length: a rule's condition must stay small per row"
            )),
            "repeat" | "lpad" | "rpad" | "array_repeat" => {
                let count = f.args.get(1).and_then(|a| match a {
                    Expr::Literal(v, _) => match v {
                        ScalarValue::Int8(Some(n)) => Some(i64::from(*n)),
                        ScalarValue::Int16(Some(n)) => Some(i64::from(*n)),
                        ScalarValue::Int32(Some(n)) => Some(i64::from(*n)),
                        ScalarValue::Int64(Some(n)) => Some(*n),
                        ScalarValue::UInt8(Some(n)) => Some(i64::from(*n)),
                        ScalarValue::UInt16(Some(n)) => Some(i64::from(*n)),
                        ScalarValue::UInt32(Some(n)) => Some(i64::from(*n)),
                        ScalarValue::UInt64(Some(n)) => i64::try_from(*n).ok(),
                        _ => None,
                    },
                    _ => None,
                });
                match count {
                    Some(n) if n <= MAX_GROWN => None,
                    Some(n) => Some(format!(
                        "`when` asks {name}() for {n} elements; at most {MAX_GROWN} (a rule's condition must stay small per row)"
                    )),
                    None => Some(format!(
                        "`when` gives {name}() a count that is not a number written in the rule; write it as a number of at most {MAX_GROWN} (a count read from the row could ask for gigabytes)"
                    )),
                }
            }
            _ => None,
        };
        match why {
            Some(w) => {
                found = Some(w);
                Ok(TreeNodeRecursion::Stop)
            }
            None => Ok(TreeNodeRecursion::Continue),
        }
    });
    found
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
            found = Some(format!("`{e}` compares text with a number, which would compare them as strings; a bounded numeric(p,s) is a DECIMAL in Silver, but an unbounded numeric, one of more than 38 digits, or a column an earlier release wrote as text (docs/upgrading.md) is exact text: cast it, e.g. CAST(amount AS DECIMAL(38, 10)) > 10000"));
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
            lookups: Vec::new(),
        }
    }

    /// A bounded numeric is a DECIMAL in Silver: a rule compares it with a number as
    /// written, exactly (no float in between).
    #[test]
    fn decimal_columns_compare_with_numbers_as_written() {
        use deltalake::arrow::array::{Array, Decimal128Array};
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new(
            "amount",
            DataType::Decimal128(18, 2),
            true,
        )]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(
                Decimal128Array::from(vec![Some(1_000_000), Some(1_000_001), None, Some(-5)])
                    .with_precision_and_scale(18, 2)
                    .unwrap(),
            )],
        )
        .unwrap();
        let c = compile(&rule("big", "amount > 10000"), &schema).unwrap();
        let out = evaluate(&[c], &batch).remove(0).unwrap();
        let got: Vec<bool> = (0..out.len())
            .map(|i| out.is_valid(i) && out.value(i))
            .collect();
        // 10000.00 is not above 10000; 10000.01 is.
        assert_eq!(got, [false, true, false, false]);
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
            // Issue 38, item 11: nothing that can build a value of any size per row.
            ("repeat(currency, 2147483647) = ''", "at most 10000"),
            ("lpad(currency, score) = 'x'", "not a number written"),
            ("length(rpad(currency, 20000)) > 1", "at most 10000"),
            ("repeat(currency, 3) = 'EUREUREUR'", ""),
            ("cardinality(range(1, score)) > 1", "series"),
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

#[cfg(test)]
mod lookup_tests {
    use super::*;
    use deltalake::arrow::array::{Int64Array, StringArray};
    use wal2delta_model::TableName;

    #[test]
    fn a_rule_with_a_lookup_splits_its_own_conditions_from_the_related_ones() {
        let own: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("shop_id", DataType::Int64, true),
            Field::new("amount", DataType::Utf8, true),
        ]));
        let shops: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("category", DataType::Utf8, true),
        ]));
        let rule = Rule {
            id: "risky".into(),
            table: TableName::new("public", "orders"),
            when: "CAST(amount AS DECIMAL(12, 2)) > 100 AND Shop.category = 'gambling' AND shop.id > 0".into(),
            version: 1,
            active: true,
            lookups: vec![Lookup {
                name: "shop".into(),
                table: TableName::new("public", "shops"),
                on: vec![("shop_id".into(), "id".into())],
            }],
        };
        let mut related = Related::new();
        assert!(
            compile_with(&rule, &own, &related).is_err(),
            "no Silver schema for shops"
        );
        related.insert("public.shops".into(), shops);
        let c = compile_with(&rule, &own, &related).unwrap();
        assert_eq!(
            c.logical.to_string(),
            "CAST(amount AS Decimal128(12, 2)) > Int64(100)"
        );
        let plan = c.lookup.clone().unwrap();
        let batch = RecordBatch::try_new(
            plan.combined.clone(),
            vec![
                Arc::new(Int64Array::from(vec![10, 11, 13])),
                Arc::new(Int64Array::from(vec![1, 2, 1])),
                Arc::new(StringArray::from(vec!["500", "500", "5000"])),
                Arc::new(Int64Array::from(vec![Some(1), Some(2), None])),
                Arc::new(StringArray::from(vec![
                    Some("gambling"),
                    Some("books"),
                    None,
                ])),
            ],
        )
        .unwrap();
        let bits = evaluate_expr(&rule, &plan.full, &batch).unwrap();
        assert_eq!(
            (0..3).map(|i| bits.value(i)).collect::<Vec<_>>(),
            [true, false, false]
        );
    }
}
