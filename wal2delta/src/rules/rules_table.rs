//! The rules table (docs/rules.md, "The rules table"): rules kept in a table of the source
//! database, named by `[rules] table` and captured like any other table, so that changing
//! a rule is a committed change in the business system, which stays the source of truth.
//!
//! The rules are read from that table's **Silver** table: the rule set the daemon runs is
//! the rules table as Silver holds it at one version (current state per primary key, after
//! capture, Bronze and Silver). [`rules_of`] turns the rows into rules; the silver stage
//! reads them again after each round that changed the rules table and records a new set,
//! in effect after the edit's commit position, only when every rule of it is valid
//! (`crate::silver`'s rules edits).
//!
//! Unlike a bad rules file, a bad rules table at startup does not stop the start: its fix
//! is a committed change that reaches Silver only through the daemon itself. The start
//! goes on with the valid rules and the bad ones are reported.

use std::collections::BTreeSet;
use std::process::ExitCode;

use tokio::sync::watch;
use wal2delta_lake::deltalake::arrow::array::{Array, AsArray, RecordBatch};
use wal2delta_lake::deltalake::arrow::compute::cast;
use wal2delta_lake::deltalake::arrow::datatypes::{DataType, Int64Type, Schema};
use wal2delta_lake::reconcile::SilverRead;
use wal2delta_lake::rules::{versions, Rule, RuleError, RuleSource, FROM_THE_START};
use wal2delta_lake::Lake;
use wal2delta_model::TableName;

use crate::config::{path, Config, RULE_COLUMNS};
use crate::metrics as m;
use crate::supervisor::Supervisor;

/// Why the rules table's Silver table cannot be read as rules at all: the whole set is
/// refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    #[error("the rules table has no column {0:?} (docs/rules.md gives its DDL)")]
    MissingColumn(&'static str),
    #[error("column {column:?} of the rules table is {found} in Silver; it must be {want} (docs/rules.md gives the DDL)")]
    ColumnType {
        column: &'static str,
        found: DataType,
        want: &'static str,
    },
    #[error("column {column:?} of the rules table cannot be read: {reason}")]
    Unreadable {
        column: &'static str,
        reason: String,
    },
}

/// The rules table's rows as rules, and the rows that cannot be rules (each naming its id).
pub type Rows = Result<(Vec<Rule>, Vec<RuleError>), ShapeError>;

/// The rows of the rules table at one Silver version.
#[derive(Debug)]
pub struct Snapshot {
    pub version: u64,
    pub rows: Rows,
}

/// The rules table's rows, as its Silver table holds them now; `None` while Silver has no
/// such table.
pub async fn read(lake: &Lake, table: &TableName) -> anyhow::Result<Option<Snapshot>> {
    match open(lake, table).await? {
        Some(silver) => Ok(Some(read_from(&silver).await?)),
        None => Ok(None),
    }
}

async fn open(lake: &Lake, table: &TableName) -> anyhow::Result<Option<SilverRead>> {
    let (schema, name) = table.ident_parts();
    Ok(SilverRead::open(lake, &schema, &name).await?)
}

/// The rows of the opened Silver table, at the version it was opened at.
async fn read_from(silver: &SilverRead) -> anyhow::Result<Snapshot> {
    let version = silver.version();
    let schema = silver.schema()?;
    let present: Vec<String> = RULE_COLUMNS
        .iter()
        .filter(|c| schema.field_with_name(c).is_ok())
        .map(|c| (*c).to_owned())
        .collect();
    let mut batches = Vec::new();
    if !present.is_empty() {
        let mut scan = silver.scan(&present).await?;
        while let Some(b) = scan.next().await {
            batches.push(b?);
        }
    }
    Ok(Snapshot {
        version,
        rows: rules_of(&schema, &batches),
    })
}

/// The rules of the rules table's Silver rows (`schema`: the Silver table's, `batches`:
/// its rows with at least the columns [`RULE_COLUMNS`] it has), sorted by id. `version`
/// and `active` may be absent or NULL (1 and true). A row with a bad id, a NULL or bad
/// `table`, a NULL `when` or a `version` that is no integer is a [`RuleError`] naming its
/// id; a missing or mistyped column refuses the whole table.
pub fn rules_of(schema: &Schema, batches: &[RecordBatch]) -> Rows {
    for (column, want) in [
        ("id", Want::Text),
        ("table", Want::Text),
        ("when", Want::Text),
    ] {
        let Ok(field) = schema.field_with_name(column) else {
            return Err(ShapeError::MissingColumn(column));
        };
        want.check(column, field.data_type())?;
    }
    for (column, want) in [
        ("version", Want::Integer),
        ("active", Want::Boolean),
        ("lookups", Want::Text),
    ] {
        if let Ok(field) = schema.field_with_name(column) {
            want.check(column, field.data_type())?;
        }
    }
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    for batch in batches {
        let text = |column: &'static str| -> Result<_, ShapeError> {
            let a = batch
                .column_by_name(column)
                .ok_or(ShapeError::MissingColumn(column))?;
            cast(a, &DataType::Utf8).map_err(|e| ShapeError::Unreadable {
                column,
                reason: e.to_string(),
            })
        };
        let (ids, tables, whens) = (text("id")?, text("table")?, text("when")?);
        let (ids, tables, whens) = (
            ids.as_string::<i32>(),
            tables.as_string::<i32>(),
            whens.as_string::<i32>(),
        );
        let versions = batch.column_by_name("version");
        let actives = batch
            .column_by_name("active")
            .and_then(|a| a.as_boolean_opt());
        let lookups = match batch.column_by_name("lookups") {
            Some(_) => Some(text("lookups")?),
            None => None,
        };
        let lookups = lookups.as_ref().map(|a| a.as_string::<i32>());
        for i in 0..batch.num_rows() {
            let id = if ids.is_null(i) { "" } else { ids.value(i) };
            let row = Row {
                id,
                table: (!tables.is_null(i)).then(|| tables.value(i)),
                when: (!whens.is_null(i)).then(|| whens.value(i)),
                version: versions.and_then(|v| version_at(v, i)),
                active: actives.and_then(|a| (!a.is_null(i)).then(|| a.value(i))),
                lookups: lookups.and_then(|a| (!a.is_null(i)).then(|| a.value(i))),
            };
            match row.rule() {
                Ok(rule) => rules.push(rule),
                Err(reason) => errors.push(RuleError {
                    id: id.to_owned(),
                    reason,
                }),
            }
        }
    }
    rules.sort_by(|a, b| a.id.cmp(&b.id));
    // The id is the primary key: a repeat means the table was declared otherwise.
    let mut seen = BTreeSet::new();
    let mut unique = Vec::with_capacity(rules.len());
    for r in rules {
        if seen.insert(r.id.clone()) {
            unique.push(r);
        } else {
            errors.push(RuleError {
                id: r.id,
                reason:
                    "this id is used by another row of the rules table (make `id` its primary key)"
                        .into(),
            });
        }
    }
    errors.sort_by(|a, b| a.id.cmp(&b.id));
    Ok((unique, errors))
}

/// The Arrow types a rules table column may have in Silver.
#[derive(Clone, Copy)]
enum Want {
    Text,
    /// `smallint`, `integer`, `bigint`, or `numeric` (exact text in Silver).
    Integer,
    Boolean,
}

impl Want {
    fn check(self, column: &'static str, found: &DataType) -> Result<(), ShapeError> {
        let text = matches!(
            found,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        );
        let (ok, want) = match self {
            Want::Text => (text, "text"),
            Want::Integer => (
                text || matches!(found, DataType::Int16 | DataType::Int32 | DataType::Int64),
                "an integer (smallint, integer, bigint or numeric)",
            ),
            Want::Boolean => (found == &DataType::Boolean, "boolean"),
        };
        if ok {
            Ok(())
        } else {
            Err(ShapeError::ColumnType {
                column,
                found: found.clone(),
                want,
            })
        }
    }
}

/// A `version` value: NULL, an integer, or text (a `numeric`) that may not be one.
enum Version {
    Integer(i64),
    Text(String),
}

fn version_at(a: &dyn Array, i: usize) -> Option<Version> {
    if a.is_null(i) {
        return None;
    }
    Some(match a.data_type() {
        DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            let v = cast(&a.slice(i, 1), &DataType::Int64).ok()?;
            Version::Integer(v.as_primitive::<Int64Type>().value(0))
        }
        _ => {
            let v = cast(&a.slice(i, 1), &DataType::Utf8).ok()?;
            Version::Text(v.as_string::<i32>().value(0).to_owned())
        }
    })
}

/// One row of the rules table, as read.
struct Row<'a> {
    id: &'a str,
    table: Option<&'a str>,
    when: Option<&'a str>,
    version: Option<Version>,
    active: Option<bool>,
    /// JSON: `{"NAME": {"table": "schema.table", "on": {"column": "related column"}}}`.
    lookups: Option<&'a str>,
}

impl Row<'_> {
    /// The rule this row states, or why it states none. The only place a rule of the
    /// rules table is built.
    fn rule(self) -> Result<Rule, String> {
        if self.id.is_empty()
            || !self
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return Err("an id is made of letters, digits, `_`, `-` and `.`".into());
        }
        let Some(table) = self.table else {
            return Err("its table is NULL".into());
        };
        let Some(parts) = path::parse(table, 2) else {
            return Err(format!(
                "table {table:?} is not schema.table (as in PostgreSQL; double-quote a part holding a `.`)"
            ));
        };
        let Some(when) = self.when else {
            return Err("its condition (`when`) is NULL".into());
        };
        let version = match self.version {
            None => 1,
            Some(Version::Integer(v)) => v,
            Some(Version::Text(t)) => {
                integer(&t).ok_or_else(|| format!("version {t:?} is not an integer"))?
            }
        };
        let lookups = match self.lookups.map(str::trim).filter(|l| !l.is_empty()) {
            None => Vec::new(),
            Some(json) => {
                let entries = serde_json::from_str(json).map_err(|e| {
                    format!("its lookups are not a JSON object of {{\"NAME\": {{\"table\": \"schema.table\", \"on\": {{\"column\": \"related column\"}}}}}}: {e}")
                })?;
                super::lookups_of(entries)?
            }
        };
        Ok(Rule {
            id: self.id.to_owned(),
            table: TableName::new(&parts[0], &parts[1]),
            when: when.to_owned(),
            version,
            active: self.active.unwrap_or(true),
            lookups,
        })
    }
}

/// A `numeric`'s exact text as an integer: `7`, `-2`, `3.000`; not `1.5`, `NaN`, `1e3`.
fn integer(text: &str) -> Option<i64> {
    let whole = match text.split_once('.') {
        Some((w, frac)) if frac.chars().all(|c| c == '0') => w,
        Some(_) => return None,
        None => text,
    };
    whole.parse().ok()
}

/// The rule set at startup from the rules table `table`: the versions recorded in
/// `rules/versions` (each in effect after its edit's position, see
/// `wal2delta_lake::rules::versions`), or, before any was recorded, the rules table's
/// current rules, recorded as in effect from the start. Never stops the start for the
/// table's content (see the module comment): without a Silver table yet, no rules; with
/// bad rules, the valid ones, the others logged (and counted by [`run`], once the metrics
/// recorder is installed).
pub async fn at_startup(lake: &Lake, table: &TableName) -> anyhow::Result<(RuleSource, Seen)> {
    let history = versions::load(lake).await?;
    if let Some((last, rules)) = history.last() {
        tracing::info!(table = %table, versions = history.len(), rules = rules.len(), last_effective_after_lsn = *last, "rules loaded from rules/versions (the silver stage records the rules table's later edits)");
        return Ok((RuleSource::with_history(&history), Seen::default()));
    }
    // Nothing recorded yet: the first start of this lake with a rules table. Recorded now
    // even when empty, so that a later start (a crash right after the rules table's
    // first Silver commit included) finds a history and leaves the rules table's content
    // to the silver stage, which records it at its own position.
    let Some(snapshot) = read(lake, table).await? else {
        tracing::info!(table = %table, "the rules table has no Silver table yet: starting without rules; they load when it appears (is the table captured, with a primary key?)");
        versions::append(lake, FROM_THE_START, &[]).await?;
        return Ok((
            RuleSource::with_history(&[(FROM_THE_START, Vec::new())]),
            Seen::default(),
        ));
    };
    // A lake from before rules/versions (or a rules table whose Silver exists already):
    // its current rules are in effect from the start.
    let (rules, errors) = validated(lake, &snapshot.rows).await?;
    if errors.is_empty() {
        tracing::info!(rules = rules.len(), table = %table, "rules loaded from the rules table, in effect from the start");
    } else {
        tracing::error!(table = %table, invalid = errors.len(), valid = rules.len(), errors = %list(&errors), "the rules table holds rules that are not valid: starting with the valid ones; fix the others in the rules table (the whole set is installed once every rule is valid)");
    }
    versions::append(lake, FROM_THE_START, &rules).await?;
    let seen = Seen {
        refused: !errors.is_empty(),
    };
    Ok((RuleSource::with_history(&[(FROM_THE_START, rules)]), seen))
}

/// What the start read from the rules table.
#[derive(Debug, Default)]
pub struct Seen {
    /// The set read at startup was not valid as a whole (not yet counted).
    refused: bool,
}

/// The rules of `rows` that are valid, and the errors (the rows that are no rules, a
/// table that cannot be read as rules, rules that do not compile against their Silver
/// table). A rule whose table has no Silver table yet is valid until it appears.
pub(crate) async fn validated(
    lake: &Lake,
    rows: &Rows,
) -> anyhow::Result<(Vec<Rule>, Vec<String>)> {
    let (rules, row_errors) = match rows {
        Ok(r) => r,
        Err(e) => return Ok((Vec::new(), vec![e.to_string()])),
    };
    let bad = super::check(lake, rules, true).await?;
    let ids: BTreeSet<&str> = bad.iter().map(|e| e.id.as_str()).collect();
    let valid = rules
        .iter()
        .filter(|r| !ids.contains(r.id.as_str()))
        .cloned()
        .collect();
    let errors = row_errors.iter().chain(&bad).map(ToString::to_string);
    Ok((valid, errors.collect()))
}

fn list(errors: &[String]) -> String {
    errors.join("; ")
}

/// `wal2delta rules validate` with `[rules] table` and no FILE: the rules its Silver table
/// holds now. Exit 0 all valid, 1 naming each bad rule, 2 no Silver table or a table that
/// cannot be read as rules.
pub async fn validate(config: &Config, table: &TableName) -> anyhow::Result<ExitCode> {
    let lake = crate::quarantine::lake(config)?;
    let Some(snapshot) = read(&lake, table).await? else {
        eprintln!("wal2delta: the rules table {table} has no Silver table yet (is it captured, with a primary key, and has the silver stage run?)");
        return Ok(ExitCode::from(2));
    };
    let (rules, mut errors) = match snapshot.rows {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wal2delta: rules table {table}: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let total = rules.len() + errors.len();
    errors.extend(super::check(&lake, &rules, false).await?);
    for e in &errors {
        eprintln!("{e}");
    }
    if errors.is_empty() {
        println!("rules table {table}: {} rules, all valid", rules.len());
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "rules table {table}: {} of {total} rules are not valid",
            errors.len()
        );
        Ok(ExitCode::from(1))
    }
}

/// The rules of the rules table for `wal2delta rules list` (none before it has a Silver
/// table); its rows that are no rules are named on stderr.
pub async fn listed(lake: &Lake, table: &TableName) -> anyhow::Result<Vec<Rule>> {
    let Some(snapshot) = read(lake, table).await? else {
        return Ok(Vec::new());
    };
    let (rules, errors) = snapshot
        .rows
        .map_err(|e| anyhow::anyhow!("rules table {table}: {e}"))?;
    for e in &errors {
        eprintln!("{e}");
    }
    Ok(rules)
}

/// The rules stage with a rules table. The silver stage follows the rules table itself
/// (its edits take effect at their own commit positions, `crate::silver`'s rules edits),
/// so this stage only counts a refused set read at startup and stays up until the stop.
pub async fn run(
    table: TableName,
    seen: Seen,
    supervisor: Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    supervisor.started();
    if seen.refused {
        metrics::counter!(m::RULES_RELOAD_FAILURES).increment(1);
    }
    tracing::info!(table = %table, "rules stage started: the silver stage follows the rules table, each edit in effect from its own commit position");
    supervisor.healthy();
    let _ = shutdown.changed().await;
    supervisor.stopped();
    tracing::info!("rules stage stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use wal2delta_lake::deltalake::arrow::array::{
        ArrayRef, BooleanArray, Int32Array, Int64Array, StringArray,
    };
    use wal2delta_lake::deltalake::arrow::datatypes::Field;

    use super::*;
    use wal2delta_lake::rules::Lookup;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> (Schema, RecordBatch) {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect();
        let schema = Schema::new(fields);
        let b = RecordBatch::try_new(
            Arc::new(schema.clone()),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .expect("batch");
        (schema, b)
    }

    fn text(v: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringArray::from(v.to_vec()))
    }

    fn reasons(errors: &[RuleError]) -> Vec<(String, String)> {
        errors
            .iter()
            .map(|e| (e.id.clone(), e.reason.clone()))
            .collect()
    }

    #[test]
    fn lookups_come_from_a_json_column_and_a_bad_one_names_the_rule() {
        let (schema, b) = batch(vec![
            (
                "id",
                text(&[
                    Some("risky"),
                    Some("plain"),
                    Some("broken"),
                    Some("bad_table"),
                ]),
            ),
            (
                "table",
                text(&[
                    Some("public.pay"),
                    Some("public.pay"),
                    Some("public.pay"),
                    Some("public.pay"),
                ]),
            ),
            (
                "when",
                text(&[Some("m.risk > 5"), Some("amount > 1"), Some("x"), Some("x")]),
            ),
            (
                "lookups",
                text(&[
                    Some(r#"{"m": {"table": "public.merchants", "on": {"merchant_id": "id"}}}"#),
                    Some(" "),
                    Some(r#"{"m": {"table": "public.merchants"}}"#),
                    Some(r#"{"m": {"table": "merchants", "on": {"a": "b"}}}"#),
                ]),
            ),
        ]);
        let (rules, errors) = rules_of(&schema, &[b]).expect("readable");
        let risky = rules.iter().find(|r| r.id == "risky").expect("risky");
        assert_eq!(
            risky.lookups,
            vec![Lookup {
                name: "m".into(),
                table: TableName::new("public", "merchants"),
                on: vec![("merchant_id".into(), "id".into())],
            }]
        );
        assert!(rules
            .iter()
            .any(|r| r.id == "plain" && r.lookups.is_empty()));
        let reasons = reasons(&errors);
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].0 == "bad_table" && reasons[0].1.contains("not schema.table"));
        assert!(reasons[1].0 == "broken" && reasons[1].1.contains("missing field `on`"));
    }

    #[test]
    fn rows_become_rules_with_defaults_and_named_errors() {
        let (schema, b) = batch(vec![
            (
                "id",
                text(&[
                    Some("big"),
                    Some("old"),
                    Some("no_when"),
                    Some("no_table"),
                    Some("bad table"),
                    Some("bad_table"),
                ]),
            ),
            (
                "table",
                text(&[
                    Some("public.pay"),
                    Some("\"a.b\".Order Items"),
                    Some("public.pay"),
                    None,
                    Some("public.pay"),
                    Some("pay"),
                ]),
            ),
            (
                "when",
                text(&[
                    Some("amount > 10"),
                    Some("x = 1"),
                    None,
                    Some("x"),
                    Some("x"),
                    Some("x"),
                ]),
            ),
            (
                "version",
                Arc::new(Int32Array::from(vec![
                    None,
                    Some(3),
                    None,
                    None,
                    None,
                    None,
                ])),
            ),
            (
                "active",
                Arc::new(BooleanArray::from(vec![
                    None,
                    Some(false),
                    None,
                    None,
                    None,
                    None,
                ])),
            ),
        ]);
        let (rules, errors) = rules_of(&schema, &[b]).expect("readable");
        assert_eq!(
            rules,
            vec![
                Rule {
                    id: "big".into(),
                    table: TableName::new("public", "pay"),
                    when: "amount > 10".into(),
                    version: 1,
                    active: true,
                    lookups: Vec::new(),
                },
                Rule {
                    id: "old".into(),
                    table: TableName::new("a.b", "Order Items"),
                    when: "x = 1".into(),
                    version: 3,
                    active: false,
                    lookups: Vec::new(),
                },
            ]
        );
        let got = reasons(&errors);
        let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["bad table", "bad_table", "no_table", "no_when"]);
        assert!(got[0].1.contains("an id is made of"), "{got:?}");
        assert!(got[1].1.contains("\"pay\" is not schema.table"), "{got:?}");
        assert!(got[2].1.contains("table is NULL"), "{got:?}");
        assert!(got[3].1.contains("`when`) is NULL"), "{got:?}");
    }

    #[test]
    fn numeric_versions_must_be_integers() {
        let (schema, b) = batch(vec![
            (
                "id",
                text(&[Some("a"), Some("b"), Some("c"), Some("d"), Some("e")]),
            ),
            ("table", text(&[Some("s.t"); 5])),
            ("when", text(&[Some("x"); 5])),
            (
                "version",
                text(&[Some("7"), Some("2.000"), Some("1.5"), Some("NaN"), None]),
            ),
        ]);
        let (rules, errors) = rules_of(&schema, &[b]).expect("readable");
        let versions: Vec<(String, i64)> =
            rules.iter().map(|r| (r.id.clone(), r.version)).collect();
        assert_eq!(
            versions,
            vec![("a".into(), 7), ("b".into(), 2), ("e".into(), 1)]
        );
        assert_eq!(
            reasons(&errors),
            vec![
                ("c".into(), "version \"1.5\" is not an integer".into()),
                ("d".into(), "version \"NaN\" is not an integer".into()),
            ]
        );
        // bigint versions are read as they are.
        let (schema, b) = batch(vec![
            ("id", text(&[Some("a")])),
            ("table", text(&[Some("s.t")])),
            ("when", text(&[Some("x")])),
            (
                "version",
                Arc::new(Int64Array::from(vec![Some(1i64 << 40)])),
            ),
        ]);
        let (rules, _) = rules_of(&schema, &[b]).expect("readable");
        assert_eq!(rules[0].version, 1 << 40);
    }

    #[test]
    fn a_missing_or_mistyped_column_refuses_the_table() {
        let (schema, b) = batch(vec![
            ("id", text(&[Some("a")])),
            ("table", text(&[Some("s.t")])),
        ]);
        assert_eq!(
            rules_of(&schema, &[b]),
            Err(ShapeError::MissingColumn("when"))
        );
        let (schema, b) = batch(vec![
            ("id", text(&[Some("a")])),
            ("table", text(&[Some("s.t")])),
            ("when", text(&[Some("x")])),
            ("active", text(&[Some("yes")])),
        ]);
        let err = rules_of(&schema, &[b]).expect_err("active is text");
        assert!(err.to_string().contains("\"active\""), "{err}");
        assert!(err.to_string().contains("boolean"), "{err}");
        // An empty table with the right columns is an empty set.
        let (schema, _) = batch(vec![
            ("id", text(&[])),
            ("table", text(&[])),
            ("when", text(&[])),
        ]);
        assert_eq!(rules_of(&schema, &[]), Ok((Vec::new(), Vec::new())));
    }
}
