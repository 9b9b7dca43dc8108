//! Gold models: SQL files, what each reads, and the order they are refreshed in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use deltalake::datafusion::common::TableReference;
use deltalake::datafusion::sql::parser::{DFParser, Statement as DfStatement};
use deltalake::datafusion::sql::resolve::resolve_table_references;
use deltalake::datafusion::sql::sqlparser::ast::{Expr, SelectItem, SetExpr, Statement};
use sha2::{Digest, Sha256};
use wal2delta_model::TableName;

use crate::LakeError;

/// What a model reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Input {
    /// A Silver table, named in the SQL by its source name (`public.transactions`).
    Silver(TableName),
    /// Another model, named by its model name.
    Model(String),
}

/// One model: `{models_dir}/{name}.sql`, materialised as `gold/{name}`.
#[derive(Debug, Clone)]
pub struct Model {
    pub name: String,
    pub sql: String,
    /// The inputs the SQL names (CTE names are not inputs).
    pub inputs: BTreeSet<Input>,
    /// SHA-256 of the SQL text (its key header included): a changed model is refreshed
    /// even when its inputs are not.
    pub sql_hash: String,
    /// The key the model declares in its header, `None` when it declares none (it is then
    /// rewritten whole at each refresh).
    pub key: Option<ModelKey>,
}

/// A model's declared key (docs/gold.md, "Keyed models"):
///
/// ```sql
/// -- key: account_id, currency
/// -- key of public.transactions: account_id, currency
/// ```
///
/// **The promise the author makes:** every output row whose key is `k` is computed only
/// from the rows of each keyed input whose key expressions give `k` (and from any rows of
/// the inputs not keyed). The incremental refresh relies on it: it recomputes the keys
/// whose rows changed in a keyed input, reading only those rows of the keyed inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelKey {
    /// The model's key columns, as DataFusion names the output columns (unquoted names in
    /// lowercase).
    pub columns: Vec<String>,
    /// Per keyed input, one SQL expression over its columns for each key column.
    pub inputs: BTreeMap<Input, Vec<String>>,
}

fn invalid(model: &str, reason: impl Into<String>) -> LakeError {
    LakeError::Model {
        model: model.to_owned(),
        reason: reason.into(),
    }
}

impl Model {
    /// Parses a model's SQL and resolves the tables it names: a schema-qualified name is a
    /// Silver table and must be one of `tables`; a bare name is another model and must be
    /// one of `models`.
    pub fn parse(
        name: &str,
        sql: &str,
        tables: &BTreeSet<TableName>,
        models: &BTreeSet<String>,
    ) -> Result<Model, LakeError> {
        let mut statements =
            DFParser::parse_sql(sql).map_err(|e| invalid(name, format!("SQL syntax: {e}")))?;
        let statement = match (statements.pop_front(), statements.is_empty()) {
            (Some(s), true) => s,
            _ => return Err(invalid(name, "a model is exactly one SELECT statement")),
        };
        if !matches!(&statement, DfStatement::Statement(s) if matches!(**s, Statement::Query(_))) {
            return Err(invalid(name, "a model is a SELECT (a query), nothing else"));
        }
        let (references, _ctes) =
            resolve_table_references(&statement, true).map_err(|e| invalid(name, e.to_string()))?;
        let mut inputs = BTreeSet::new();
        for r in references {
            inputs.insert(input_of(name, &r, tables, models)?);
        }
        let key = parse_key(name, sql, &inputs, tables, models)?;
        Ok(Model {
            name: name.to_owned(),
            sql: sql.to_owned(),
            inputs,
            sql_hash: format!("{:x}", Sha256::digest(sql.as_bytes())),
            key,
        })
    }
}

/// What a table reference of a model's SQL names: a schema-qualified name is a Silver
/// table and must be one of `tables`; a bare name is another model and must be one of
/// `models`.
fn input_of(
    name: &str,
    r: &TableReference,
    tables: &BTreeSet<TableName>,
    models: &BTreeSet<String>,
) -> Result<Input, LakeError> {
    match (r.catalog(), r.schema()) {
        (None, None) => {
            let m = r.table().to_owned();
            if !models.contains(&m) {
                return Err(invalid(name, format!("it reads {m:?}, which is no model in the models directory (a Silver table is named with its schema, e.g. public.{m})")));
            }
            Ok(Input::Model(m))
        }
        (None, Some(schema)) => {
            let t = TableName::new(schema, r.table());
            if !tables.contains(&t) {
                return Err(invalid(name, format!("it reads {t}, which is not a captured table (names are as in PostgreSQL; quote capitals and spaces: \"Order Items\")")));
            }
            Ok(Input::Silver(t))
        }
        _ => Err(invalid(
            name,
            format!("{r}: a model names a Silver table as schema.table and a model by its name, without a catalog"),
        )),
    }
}

/// The SQL expressions of `list` (`a, lower(b), CAST(c AS DATE)`), each as SQL text.
fn expressions(list: &str) -> Result<Vec<Expr>, String> {
    let sql = format!("SELECT {list}");
    let mut statements = DFParser::parse_sql(&sql).map_err(|e| e.to_string())?;
    let Some(DfStatement::Statement(s)) = statements.pop_front() else {
        return Err("not a list of expressions".into());
    };
    let Statement::Query(q) = *s else {
        return Err("not a list of expressions".into());
    };
    let SetExpr::Select(select) = *q.body else {
        return Err("not a list of expressions".into());
    };
    if !statements.is_empty() || !select.from.is_empty() {
        return Err("not a list of expressions".into());
    }
    select
        .projection
        .into_iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) => Ok(e),
            other => Err(format!("{other}: an expression without alias is expected")),
        })
        .collect()
}

/// The key header of a model's SQL (`-- key: ...` and `-- key of INPUT: ...` comment
/// lines), checked against the model's inputs.
fn parse_key(
    name: &str,
    sql: &str,
    inputs: &BTreeSet<Input>,
    tables: &BTreeSet<TableName>,
    models: &BTreeSet<String>,
) -> Result<Option<ModelKey>, LakeError> {
    let mut columns: Option<Vec<String>> = None;
    let mut keyed: Vec<(String, String)> = Vec::new();
    for line in sql.lines() {
        let Some(comment) = line.trim().strip_prefix("--") else {
            continue;
        };
        let comment = comment.trim();
        if let Some(list) = comment.strip_prefix("key:") {
            if columns.is_some() {
                return Err(invalid(name, "it declares `-- key:` twice"));
            }
            let mut cols = Vec::new();
            for e in expressions(list).map_err(|e| invalid(name, format!("-- key: {e}")))? {
                let Expr::Identifier(id) = e else {
                    return Err(invalid(name, format!("-- key: {e} is not a column name: the key names the model's output columns")));
                };
                let col = if id.quote_style.is_some() {
                    id.value
                } else {
                    id.value.to_lowercase()
                };
                if cols.contains(&col) {
                    return Err(invalid(name, format!("-- key: {col} is named twice")));
                }
                cols.push(col);
            }
            columns = Some(cols);
        } else if let Some(rest) = comment.strip_prefix("key of ") {
            let Some((input, list)) = split_unquoted(rest, ':') else {
                return Err(invalid(
                    name,
                    format!("-- key of {rest}: expected `-- key of INPUT: expression, ...`"),
                ));
            };
            keyed.push((input.trim().to_owned(), list.to_owned()));
        }
    }
    let Some(columns) = columns else {
        if let Some((input, _)) = keyed.first() {
            return Err(invalid(
                name,
                format!("-- key of {input}: the model declares no `-- key:` columns"),
            ));
        }
        return Ok(None);
    };
    let mut by_input = BTreeMap::new();
    for (input, list) in keyed {
        let reference =
            reference_of(&input).map_err(|e| invalid(name, format!("-- key of {input}: {e}")))?;
        let resolved = input_of(name, &reference, tables, models)?;
        if !inputs.contains(&resolved) {
            return Err(invalid(
                name,
                format!("-- key of {input}: the model's SQL does not read it"),
            ));
        }
        let exprs =
            expressions(&list).map_err(|e| invalid(name, format!("-- key of {input}: {e}")))?;
        if exprs.len() != columns.len() {
            return Err(invalid(
                name,
                format!(
                    "-- key of {input}: {} expressions for {} key columns ({})",
                    exprs.len(),
                    columns.len(),
                    columns.join(", ")
                ),
            ));
        }
        if by_input
            .insert(resolved, exprs.iter().map(|e| e.to_string()).collect())
            .is_some()
        {
            return Err(invalid(name, format!("-- key of {input}: declared twice")));
        }
    }
    if by_input.is_empty() {
        return Err(invalid(name, "-- key: a keyed model needs `-- key of INPUT: expression, ...` for at least one input (how that input's rows map to the key); without it every change recomputes the whole model"));
    }
    Ok(Some(ModelKey {
        columns,
        inputs: by_input,
    }))
}

/// `text` split at the first `sep` outside double quotes.
fn split_unquoted(text: &str, sep: char) -> Option<(&str, &str)> {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => return Some((&text[..i], &text[i + c.len_utf8()..])),
            _ => {}
        }
    }
    None
}

/// The table reference `name` (`public.transactions`, `public."Order Items"`, `balances`).
fn reference_of(name: &str) -> Result<TableReference, String> {
    let sql = format!("SELECT * FROM {name}");
    let mut statements = DFParser::parse_sql(&sql).map_err(|e| e.to_string())?;
    let statement = statements.pop_front().ok_or("not a table name")?;
    let (mut references, _) =
        resolve_table_references(&statement, true).map_err(|e| e.to_string())?;
    match (
        references.pop(),
        references.is_empty(),
        statements.is_empty(),
    ) {
        (Some(r), true, true) => Ok(r),
        _ => Err("not a table name".into()),
    }
}

/// Every model of a directory, in an order where each comes after what it reads.
#[derive(Debug, Clone, Default)]
pub struct Models {
    ordered: Vec<Model>,
}

/// A model name: the file's stem, lowercase (an unquoted SQL name), so that the SQL of
/// other models can name it as written.
fn model_name(stem: &str) -> bool {
    let mut chars = stem.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl Models {
    /// Reads `dir/*.sql`. Refused, naming the model: a name that is not a lowercase SQL
    /// name, SQL that is not one SELECT, a table that is not captured, a model that does
    /// not exist, a cycle.
    pub fn load(dir: &Path, tables: &BTreeSet<TableName>) -> Result<Models, LakeError> {
        let unreadable = |e: std::io::Error| {
            invalid(
                "-",
                format!(
                    "cannot read the models directory {}: {e} ([gold] models_dir)",
                    dir.display()
                ),
            )
        };
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(unreadable)? {
            let path = entry.map_err(unreadable)?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("sql") {
                continue;
            }
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_owned();
            if !model_name(&stem) {
                return Err(invalid(&stem, format!("{}: a model's file name is its table name and must be a lowercase SQL name ([a-z_][a-z0-9_]*)", path.display())));
            }
            let sql = std::fs::read_to_string(&path)
                .map_err(|e| invalid(&stem, format!("cannot read {}: {e}", path.display())))?;
            files.insert(stem, sql);
        }
        let names: BTreeSet<String> = files.keys().cloned().collect();
        let mut models = BTreeMap::new();
        for (name, sql) in &files {
            models.insert(name.clone(), Model::parse(name, sql, tables, &names)?);
        }
        Ok(Models {
            ordered: order(models)?,
        })
    }

    /// In dependency order.
    pub fn iter(&self) -> impl Iterator<Item = &Model> {
        self.ordered.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }

    pub fn len(&self) -> usize {
        self.ordered.len()
    }
}

/// Orders the models so that each comes after the models it reads; a cycle is refused
/// naming its models.
fn order(mut pending: BTreeMap<String, Model>) -> Result<Vec<Model>, LakeError> {
    let mut done = BTreeSet::new();
    let mut ordered = Vec::new();
    while !pending.is_empty() {
        let ready: Vec<String> = pending
            .values()
            .filter(|m| {
                m.inputs.iter().all(|i| match i {
                    Input::Model(n) => done.contains(n),
                    Input::Silver(_) => true,
                })
            })
            .map(|m| m.name.clone())
            .collect();
        if ready.is_empty() {
            let cycle: Vec<&str> = pending.keys().map(String::as_str).collect();
            return Err(invalid(
                cycle[0],
                format!("the models {} read each other in a cycle", cycle.join(", ")),
            ));
        }
        for name in ready {
            if let Some(m) = pending.remove(&name) {
                done.insert(name);
                ordered.push(m);
            }
        }
    }
    Ok(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> BTreeSet<TableName> {
        [
            TableName::new("public", "transactions"),
            TableName::new("public", "Order Items"),
        ]
        .into_iter()
        .collect()
    }

    fn names(n: &[&str]) -> BTreeSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn inputs_are_silver_tables_by_source_name_and_models_by_name() {
        let m = Model::parse(
            "daily",
            "WITH x AS (SELECT * FROM public.transactions) SELECT x.*, i.qty FROM x JOIN public.\"Order Items\" i ON true JOIN balances b ON true",
            &tables(),
            &names(&["balances", "daily"]),
        )
        .unwrap();
        let want: BTreeSet<Input> = [
            Input::Silver(TableName::new("public", "transactions")),
            Input::Silver(TableName::new("public", "Order Items")),
            Input::Model("balances".into()),
        ]
        .into_iter()
        .collect();
        assert_eq!(m.inputs, want);
    }

    #[test]
    fn unknown_tables_models_and_non_queries_are_refused_naming_the_model() {
        for (sql, needle) in [
            ("SELECT * FROM public.nope", "public.nope"),
            ("SELECT * FROM nope", "\"nope\""),
            // Unquoted names fold to lowercase, as in PostgreSQL; quoted ones are exact.
            (
                "SELECT * FROM public.\"Transactions\"",
                "public.Transactions",
            ),
            ("DELETE FROM public.transactions", "a SELECT"),
            ("SELECT 1; SELECT 2", "exactly one"),
            ("SELEC 1", "syntax"),
        ] {
            let e = Model::parse("m", sql, &tables(), &names(&["m"])).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("gold model m") && text.contains(needle),
                "{sql}: {text}"
            );
        }
    }

    #[test]
    fn models_are_ordered_after_what_they_read_and_cycles_are_refused() {
        let parse =
            |n: &str, sql: &str| Model::parse(n, sql, &tables(), &names(&["a", "b", "c"])).unwrap();
        let models: BTreeMap<String, Model> = [
            parse("a", "SELECT * FROM b JOIN c ON true"),
            parse("b", "SELECT * FROM c"),
            parse("c", "SELECT * FROM public.transactions"),
        ]
        .into_iter()
        .map(|m| (m.name.clone(), m))
        .collect();
        let names: Vec<String> = order(models).unwrap().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["c", "b", "a"]);
        let cyclic: BTreeMap<String, Model> = [
            parse("a", "SELECT * FROM b"),
            parse("b", "SELECT * FROM a"),
            parse("c", "SELECT * FROM public.transactions"),
        ]
        .into_iter()
        .map(|m| (m.name.clone(), m))
        .collect();
        let e = order(cyclic).unwrap_err().to_string();
        assert!(e.contains("a, b") && e.contains("cycle"), "{e}");
    }

    #[test]
    fn a_key_header_names_output_columns_and_each_keyed_inputs_expressions() {
        let sql = "-- Settlement per merchant and day.\n-- key: merchant_id, \"Day\"\n-- key of public.transactions: merchant_id, date_trunc('day', created_at)\nSELECT merchant_id, date_trunc('day', created_at) AS \"Day\" FROM public.transactions t JOIN public.\"Order Items\" i ON true GROUP BY 1, 2";
        let m = Model::parse("daily", sql, &tables(), &names(&["daily"])).unwrap();
        let key = m.key.unwrap();
        assert_eq!(key.columns, ["merchant_id", "Day"]);
        let t = Input::Silver(TableName::new("public", "transactions"));
        assert_eq!(
            key.inputs[&t],
            ["merchant_id", "date_trunc('day', created_at)"]
        );
        // The other input is not keyed: a change there recomputes the whole model.
        assert_eq!(key.inputs.len(), 1);
        let plain = Model::parse(
            "p",
            "SELECT 1 AS x FROM public.transactions",
            &tables(),
            &names(&["p"]),
        )
        .unwrap();
        assert!(plain.key.is_none());
    }

    #[test]
    fn bad_key_headers_are_refused_naming_the_model_and_the_line() {
        let body = "SELECT account_id FROM public.transactions";
        for (header, needle) in [
            ("-- key: lower(a)", "not a column name"),
            (
                "-- key: a, a\n-- key of public.transactions: a, a",
                "named twice",
            ),
            (
                "-- key: a\n-- key of public.transactions: a, b",
                "2 expressions for 1 key columns",
            ),
            (
                "-- key: a\n-- key of public.\"Order Items\": a",
                "does not read it",
            ),
            ("-- key: a\n-- key of public.nope: a", "public.nope"),
            ("-- key: a", "at least one input"),
            ("-- key of public.transactions: a", "no `-- key:`"),
            ("-- key: a\n-- key of public.transactions a", "expected"),
            (
                "-- key: a\n-- key of public.transactions: a +",
                "key of public.transactions",
            ),
        ] {
            let sql = format!("{header}\n{body}");
            let e = Model::parse("m", &sql, &tables(), &names(&["m"]))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("gold model m") && e.contains(needle),
                "{header}: {e}"
            );
        }
    }

    #[test]
    fn file_names_must_be_lowercase_sql_names() {
        assert!(model_name("daily_settlement_2"));
        assert!(!model_name("Daily"));
        assert!(!model_name("daily-settlement"));
        assert!(!model_name("2daily"));
    }
}
