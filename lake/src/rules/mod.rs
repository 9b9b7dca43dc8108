//! Rules: business conditions as SQL boolean expressions over a table's Silver columns
//! (docs/rules.md). [`compile`] checks each rule against the table's Silver schema once and
//! turns it into a vectorised expression evaluated over Arrow batches; [`TableRules`]
//! evaluates them in every Silver round and emits the transitions ([`walk`]) to
//! `rules/transitions` and `rules/hits` ([`store`]), after publishing them to the
//! optional outputs ([`output`]).

mod backfill;
pub mod compile;
mod evaluate;
pub mod output;
mod shared;
mod source;
pub mod store;
mod table;
pub mod walk;

pub use compile::{compile, evaluate, CompiledRule, RuleError};
pub use evaluate::key_json;
pub use output::{FilterEvent, RulesOutput, RulesRound};
pub use shared::Evaluator;
pub use source::RuleSource;
pub use store::hit_counts;
pub(crate) use table::untagged_silver_txn;
pub use table::{RulesReport, Start, TableRules, RULE_FAILED};

use wal2delta_model::TableName;

/// One rule as its source (the rules file or the rules table) states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: String,
    /// The source table it applies to (`public.transactions`).
    pub table: TableName,
    /// A SQL boolean expression over the table's columns, as Silver stores them.
    pub when: String,
    pub version: i64,
    pub active: bool,
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
