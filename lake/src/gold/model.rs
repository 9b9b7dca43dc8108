//! Gold models: SQL files, what each reads, and the order they are refreshed in.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use deltalake::datafusion::sql::parser::{DFParser, Statement as DfStatement};
use deltalake::datafusion::sql::resolve::resolve_table_references;
use deltalake::datafusion::sql::sqlparser::ast::Statement;
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
    /// SHA-256 of the SQL text: a changed model is refreshed even when its inputs are not.
    pub sql_hash: String,
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
            let input = match (r.catalog(), r.schema()) {
                (None, None) => {
                    let m = r.table().to_owned();
                    if !models.contains(&m) {
                        return Err(invalid(name, format!("it reads {m:?}, which is no model in the models directory (a Silver table is named with its schema, e.g. public.{m})")));
                    }
                    Input::Model(m)
                }
                (None, Some(schema)) => {
                    let t = TableName::new(schema, r.table());
                    if !tables.contains(&t) {
                        return Err(invalid(name, format!("it reads {t}, which is not a captured table (names are as in PostgreSQL; quote capitals and spaces: \"Order Items\")")));
                    }
                    Input::Silver(t)
                }
                _ => {
                    return Err(invalid(
                        name,
                        format!("{r}: a model names a Silver table as schema.table and a model by its name, without a catalog"),
                    ))
                }
            };
            inputs.insert(input);
        }
        Ok(Model {
            name: name.to_owned(),
            sql: sql.to_owned(),
            inputs,
            sql_hash: format!("{:x}", Sha256::digest(sql.as_bytes())),
        })
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
    fn file_names_must_be_lowercase_sql_names() {
        assert!(model_name("daily_settlement_2"));
        assert!(!model_name("Daily"));
        assert!(!model_name("daily-settlement"));
        assert!(!model_name("2daily"));
    }
}
