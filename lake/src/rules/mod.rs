//! Rules: business conditions as SQL boolean expressions over a table's Silver columns
//! (docs/rules.md). [`compile`] checks each rule against the table's Silver schema once and
//! turns it into a vectorised expression evaluated over Arrow batches; [`TableRules`]
//! evaluates them in every Silver round and emits the transitions ([`walk`]) to
//! `rules/transitions` and `rules/hits` ([`store`]), after publishing them to the
//! optional outputs ([`output`]).

mod backfill;
mod budget;
pub mod compile;
mod evaluate;
mod hook;
mod lookup;
pub mod output;
mod pieces;
mod related;
mod shared;
mod source;
pub mod store;
mod table;
pub mod versions;
pub mod walk;

pub use budget::DEFAULT_MAX_EVAL_PER_ROW;
pub use compile::{compile, compile_with, evaluate, lake_name, CompiledRule, Related, RuleError};
pub use evaluate::key_json;
pub use hook::{RulesObserver, Untagged};
pub use lookup::UnappliedTables;
pub use output::{FilterEvent, RulesOutput, RulesRound};
pub use shared::Evaluator;
pub use source::{RuleSource, FROM_THE_START};
pub use store::{hit_counts, hits_commits_paused};
pub use table::{RulesReport, RulesSteps, Start, TableRules, DEFAULT_HITS_INTERVAL, RULE_FAILED};

use wal2delta_model::TableName;

/// One rule as its source (the rules file or the rules table) states it. Serialised as
/// JSON in `rules/versions` ([`versions`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    pub id: String,
    /// The source table it applies to (`public.transactions`).
    pub table: TableName,
    /// A SQL boolean expression over the table's columns, as Silver stores them.
    pub when: String,
    pub version: i64,
    pub active: bool,
    /// Related tables the condition reads through a lookup (`merchant.category`), in
    /// name order; empty for a rule over the row's own columns.
    pub lookups: Vec<Lookup>,
}

/// A related table a rule reads (docs/rules.md, "Lookups"): the rule's condition names its
/// columns qualified by `name`, and a row of the rule's table finds its related row where
/// each `on` pair is equal (at most one row may match: a lookup names the related
/// table's key). Evaluated in two phases: the conditions on the row's own columns first,
/// the lookup only for the rows that pass them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Lookup {
    /// The qualifier the condition uses: lowercase letters, digits and `_`.
    pub name: String,
    /// The related source table.
    pub table: TableName,
    /// (column of the rule's table, column of the related table), in column order.
    pub on: Vec<(String, String)>,
}

/// The Arrow schema of `table`'s Silver table (what its rules see), `None` when Silver has
/// no such table yet.
pub async fn silver_schema(
    lake: &crate::Lake,
    table: &TableName,
) -> Result<Option<deltalake::arrow::datatypes::SchemaRef>, crate::LakeError> {
    let (schema, name) = table.ident_parts();
    let label = format!("silver/{table}");
    match crate::delta::open(&label, &lake.silver(&schema, &name)).await? {
        Some(t) => Ok(Some(crate::delta::arrow_schema(&label, &t)?)),
        None => Ok(None),
    }
}

/// The Silver schemas of the tables `rules` look up (those that have a Silver table), as
/// a round reads them ([`related::RelatedTables`]), without keeping the tables.
pub async fn related_schemas(
    lake: &crate::Lake,
    rules: &[Rule],
) -> Result<Related, crate::LakeError> {
    related::RelatedTables::default().refresh(lake, rules).await
}
