//! Rules (docs/rules.md): the rules file, the rules stage and `wal2delta rules
//! list|validate|apply`.
//!
//! Rules are evaluated inside Silver's rounds (`wal2delta_lake::rules::TableRules`): they
//! see exactly what Silver applies. The rules stage here owns the rule set: it loads the
//! file at startup (a bad rule stops the start, naming it), then watches it and installs
//! every valid new version without a restart; a file with a bad rule is refused and the
//! running set goes on. With `[rules] table` the rules come from a table of the source
//! database instead ([`table`]). [`output`] publishes the rounds to the optional Kafka
//! topics.

pub mod output;
pub mod rules_table;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use serde::Deserialize;
use wal2delta_lake::rules::{
    compile_with, lake_name, related_schemas, silver_schema, Lookup, Rule, RuleError,
};
use wal2delta_lake::Lake;
use wal2delta_model::TableName;

use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use wal2delta_lake::rules::{hit_counts, RuleSource};

use crate::config::{path, Config};
use crate::metrics as m;
use crate::supervisor::Supervisor;

/// A rules file: `[[rule]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default)]
    rule: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: String,
    table: String,
    when: String,
    #[serde(default = "first_version")]
    version: i64,
    #[serde(default = "active")]
    active: bool,
    /// Related tables the condition reads, by the name it qualifies their columns with.
    #[serde(default)]
    lookup: BTreeMap<String, LookupEntry>,
}

/// `lookup.NAME = { table = "public.merchants", on = { merchant_id = "id" } }` in a rules
/// file; the same object per name in the rules table's `lookups` column (JSON).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LookupEntry {
    table: String,
    /// Column of the rule's table = column of the related table.
    on: BTreeMap<String, String>,
}

/// The lookups a rule declares, by name, or why they are not valid.
pub(crate) fn lookups_of(entries: BTreeMap<String, LookupEntry>) -> Result<Vec<Lookup>, String> {
    entries
        .into_iter()
        .map(|(name, l)| {
            let parts = path::parse(&l.table, 2).ok_or_else(|| {
                format!("lookup `{name}`: table {:?} is not schema.table", l.table)
            })?;
            Ok(Lookup {
                name,
                table: TableName::new(parts[0].clone(), parts[1].clone()),
                on: l.on.into_iter().collect(),
            })
        })
        .collect()
}

fn first_version() -> i64 {
    1
}

fn active() -> bool {
    true
}

/// Reads a rules file. A file that cannot be read or is not TOML of `[[rule]]` tables is
/// an error; a rule with a bad id or table name, or an id used twice, is a [`RuleError`]
/// of that rule.
pub fn load(file: &Path) -> anyhow::Result<(Vec<Rule>, Vec<RuleError>)> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the rules file {}", file.display()))?;
    let parsed: RulesFile = toml::from_str(&text)
        .map_err(|e| anyhow!("the rules file {} is not valid: {e}", file.display()))?;
    let mut rules = Vec::new();
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for e in parsed.rule {
        let refuse = |reason: String| RuleError {
            id: e.id.clone(),
            reason,
        };
        if e.id.is_empty()
            || !e
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            errors.push(refuse(
                "an id is made of letters, digits, `_`, `-` and `.`".into(),
            ));
            continue;
        }
        if !seen.insert(e.id.clone()) {
            errors.push(refuse("this id is used by another rule of the file".into()));
            continue;
        }
        let Some(parts) = path::parse(&e.table, 2) else {
            errors.push(refuse(format!(
                "table {:?} is not schema.table (as in PostgreSQL; double-quote a part holding a `.`)",
                e.table
            )));
            continue;
        };
        let lookups = match lookups_of(e.lookup) {
            Ok(l) => l,
            Err(reason) => {
                errors.push(refuse(reason));
                continue;
            }
        };
        rules.push(Rule {
            id: e.id,
            table: TableName::new(parts[0].clone(), parts[1].clone()),
            when: e.when,
            version: e.version,
            active: e.active,
            lookups,
        });
    }
    Ok((rules, errors))
}

/// Every rule checked against its table's Silver schema (and those of the tables it looks
/// up); the errors, one per bad rule. A table without a Silver table yet is an error
/// unless `pending_ok` (the daemon then compiles the rule when the table appears, and
/// skips it, counted, if it is bad). Lookups that form a cycle are refused.
pub async fn check(
    lake: &Lake,
    rules: &[Rule],
    pending_ok: bool,
) -> anyhow::Result<Vec<RuleError>> {
    let mut errors = Vec::new();
    let related = related_schemas(lake, rules).await?;
    for rule in rules {
        let missing = rule
            .lookups
            .iter()
            .find(|l| !related.contains_key(&lake_name(&l.table)));
        match silver_schema(lake, &rule.table).await? {
            None if pending_ok => {
                tracing::info!(rule = %rule.id, table = %rule.table, "the rule's table has no Silver table yet: the rule is checked when it appears");
            }
            None => errors.push(RuleError {
                id: rule.id.clone(),
                reason: format!("{} has no Silver table (is it captured, with a primary key, and has the silver stage run?)", rule.table),
            }),
            Some(_) if missing.is_some() && pending_ok => {
                tracing::info!(rule = %rule.id, table = %missing.map(|l| l.table.to_string()).unwrap_or_default(), "the table the rule looks up has no Silver table yet: the rule is checked when it appears");
            }
            Some(schema) => {
                if let Err(e) = compile_with(rule, &schema, &related) {
                    errors.push(e);
                }
            }
        }
    }
    errors.extend(lookup_cycles(rules));
    Ok(errors)
}

/// A rule whose lookups lead back to its own table (through other rules' lookups): the
/// silver stage applies a looked-up table first, which a cycle makes impossible.
fn lookup_cycles(rules: &[Rule]) -> Vec<RuleError> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in rules.iter().filter(|r| r.active) {
        for l in &r.lookups {
            edges
                .entry(lake_name(&r.table))
                .or_default()
                .insert(lake_name(&l.table));
        }
    }
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(t) = stack.pop() {
            if t == to {
                return true;
            }
            if seen.insert(t.clone()) {
                stack.extend(edges.get(&t).into_iter().flatten().cloned());
            }
        }
        false
    };
    rules
        .iter()
        .filter(|r| r.active)
        .filter_map(|r| {
            let own = lake_name(&r.table);
            let l = r.lookups.iter().find(|l| {
                let other = lake_name(&l.table);
                other != own && reaches(&other, &own)
            })?;
            Some(RuleError {
                id: r.id.clone(),
                reason: format!(
                    "lookup `{}`: {} looks up {} in turn (a cycle of lookups): the silver stage applies a looked-up table first, which a cycle makes impossible",
                    l.name, l.table, r.table
                ),
            })
        })
        .collect()
}

/// `wal2delta rules validate [FILE]`: exit 0 when every rule is valid, 1 naming each bad
/// rule and why, 2 when the file cannot be read.
pub async fn validate(config: &Config, file: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    if let (None, Some(t)) = (&file, config.rules.table_name()) {
        return rules_table::validate(config, &t).await;
    }
    let Some(file) = file.or_else(|| config.rules.file.clone()) else {
        eprintln!(
            "wal2delta: name a rules file (`wal2delta rules validate FILE`) or set [rules] file or table"
        );
        return Ok(ExitCode::from(2));
    };
    let (rules, mut errors) = match load(&file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wal2delta: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    let total = rules.len() + errors.len();
    let lake = crate::quarantine::lake(config)?;
    errors.extend(check(&lake, &rules, false).await?);
    for e in &errors {
        eprintln!("{e}");
    }
    if errors.is_empty() {
        println!("{}: {} rules, all valid", file.display(), rules.len());
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "{}: {} of {total} rules are not valid",
            file.display(),
            errors.len()
        );
        Ok(ExitCode::from(1))
    }
}

/// The rule set at startup ([`at_startup`]): Silver evaluates `source`, [`run`] keeps it
/// current.
pub struct Startup {
    pub source: RuleSource,
    /// What was read from the rules table (with `[rules] table`).
    seen: rules_table::Seen,
}

/// The rule set at startup, from `[rules] file` or `[rules] table`: `None` when neither is
/// configured. A rule of the file that is not valid stops the start, naming it (for the
/// rules table, see [`rules_table::at_startup`]).
pub async fn at_startup(config: &Config) -> anyhow::Result<Option<Startup>> {
    if let Some(t) = config.rules.table_name() {
        let lake = crate::quarantine::lake(config)?;
        let (source, seen) = rules_table::at_startup(&lake, &t).await?;
        return Ok(Some(Startup { source, seen }));
    }
    let Some(file) = &config.rules.file else {
        return Ok(None);
    };
    let lake = crate::quarantine::lake(config)?;
    let rules = load_valid(&lake, file).await?;
    tracing::info!(rules = rules.len(), file = %file.display(), "rules loaded");
    Ok(Some(Startup {
        source: RuleSource::new(&rules),
        seen: rules_table::Seen::default(),
    }))
}

/// The rules of `file`, or an error naming every bad rule.
async fn load_valid(lake: &Lake, file: &Path) -> anyhow::Result<Vec<Rule>> {
    let (rules, mut errors) = load(file)?;
    errors.extend(check(lake, &rules, true).await?);
    if errors.is_empty() {
        return Ok(rules);
    }
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    anyhow::bail!(
        "{}: {} rule(s) are not valid: {} (fix them; `wal2delta rules validate` checks a file)",
        file.display(),
        errors.len(),
        list.join("; ")
    )
}

/// What identifies a version of the rules file.
fn stamp(file: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(file).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// How often the stage looks at the rules file.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// The rules stage: installs every valid new version of the rules file (or of the rules
/// table) into `source` (Silver's rounds backfill it, then follow the stream).
pub async fn run(
    config: &Config,
    startup: Startup,
    supervisor: Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Startup { source, seen } = startup;
    // At 0 from the start, so an alert on its increase sees the first failed reload.
    metrics::counter!(m::RULES_RELOAD_FAILURES).increment(0);
    if let Some(t) = config.rules.table_name() {
        return rules_table::run(t, seen, supervisor, shutdown).await;
    }
    let Some(file) = config.rules.file.clone() else {
        anyhow::bail!("the rules stage needs [rules] file or [rules] table (docs/rules.md)");
    };
    let Some(lake) = supervisor
        .writable_lake(&config.lake, &mut shutdown)
        .await?
    else {
        return Ok(());
    };
    let mut seen = stamp(&file);
    supervisor.started();
    tracing::info!(file = %file.display(), "rules stage started: watching the rules file");
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
        let now = stamp(&file);
        if now == seen {
            supervisor.healthy();
            continue;
        }
        seen = now;
        match load_valid(&lake, &file).await {
            Ok(rules) => {
                source.replace(&rules);
                tracing::info!(rules = rules.len(), file = %file.display(), "new rules installed: each table backfills them at its next Silver round");
            }
            Err(e) => {
                metrics::counter!(m::RULES_RELOAD_FAILURES).increment(1);
                tracing::error!(error = %format!("{e:#}"), "the new rules file is not installed; the running rules go on");
            }
        }
        supervisor.healthy();
    }
    supervisor.stopped();
    tracing::info!("rules stage stopped");
    Ok(())
}

/// `wal2delta rules list`: every rule of the file (or of the rules table) with its
/// version, state and hit count, and the rules that still have hits but are no longer in
/// it. Rows of the rules table that are no rules are named on stderr.
pub async fn list(config: &Config) -> anyhow::Result<ExitCode> {
    let lake = crate::quarantine::lake(config)?;
    let counts = hit_counts(&lake).await?;
    let rules = match (&config.rules.file, config.rules.table_name()) {
        (Some(f), _) => load(f)?.0,
        (None, Some(t)) => rules_table::listed(&lake, &t).await?,
        (None, None) => Vec::new(),
    };
    println!(
        "{:<24} {:<32} {:>8} {:<10} {:>10}",
        "RULE", "TABLE", "VERSION", "STATE", "HITS"
    );
    let mut listed = BTreeSet::new();
    for r in &rules {
        let (schema, table) = r.table.ident_parts();
        let key = (format!("{schema}.{table}"), r.id.clone());
        let hits = counts.get(&key).copied().unwrap_or(0);
        let state = if r.active { "active" } else { "inactive" };
        println!(
            "{:<24} {:<32} {:>8} {:<10} {:>10}",
            r.id,
            r.table.to_string(),
            r.version,
            state,
            hits
        );
        listed.insert(key);
    }
    for ((table, id), hits) in &counts {
        if !listed.contains(&(table.clone(), id.clone())) {
            println!(
                "{:<24} {:<32} {:>8} {:<10} {:>10}",
                id, table, "-", "removed", hits
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `wal2delta rules apply FILE`: validates `FILE` and installs it as `[rules] file` (the
/// running daemon picks it up within a second). Exit 1 naming each bad rule, nothing
/// installed.
pub async fn apply(config: &Config, file: PathBuf) -> anyhow::Result<ExitCode> {
    if let Some(t) = &config.rules.table {
        eprintln!("wal2delta: the rules live in the source table {t} ([rules] table): change them there (a committed change; the daemon picks it up)");
        return Ok(ExitCode::from(2));
    }
    let Some(target) = &config.rules.file else {
        eprintln!("wal2delta: `rules apply` installs into [rules] file; set it in the config");
        return Ok(ExitCode::from(2));
    };
    let lake = crate::quarantine::lake(config)?;
    let (rules, mut errors) = match load(&file) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wal2delta: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    errors.extend(check(&lake, &rules, true).await?);
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        eprintln!(
            "{}: not installed, {} rule(s) are not valid",
            file.display(),
            errors.len()
        );
        return Ok(ExitCode::from(1));
    }
    // Written beside the target and renamed over it: the daemon never reads half a file.
    let tmp = target.with_extension("toml.installing");
    std::fs::copy(&file, &tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, target)
        .with_context(|| format!("cannot install {}", target.display()))?;
    println!(
        "{}: {} rules installed as {}",
        file.display(),
        rules.len(),
        target.display()
    );
    Ok(ExitCode::SUCCESS)
}
