//! Rules (docs/rules.md): the rules file, and `wal2delta rules validate`.
//!
//! Built so far: reading a rules file and checking every rule against its table's Silver
//! schema (`wal2delta_lake::rules::compile`). The rules stage (evaluation on every change,
//! transitions, hits) is not built yet.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use serde::Deserialize;
use wal2delta_lake::rules::{compile, silver_schema, Rule, RuleError};
use wal2delta_lake::Lake;
use wal2delta_model::TableName;

use crate::config::{path, Config};

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
        rules.push(Rule {
            id: e.id,
            table: TableName::new(parts[0].clone(), parts[1].clone()),
            when: e.when,
            version: e.version,
            active: e.active,
        });
    }
    Ok((rules, errors))
}

/// Every rule checked against its table's Silver schema; the errors, one per bad rule.
pub async fn check(lake: &Lake, rules: &[Rule]) -> anyhow::Result<Vec<RuleError>> {
    let mut errors = Vec::new();
    for rule in rules {
        match silver_schema(lake, &rule.table).await? {
            None => errors.push(RuleError {
                id: rule.id.clone(),
                reason: format!("{} has no Silver table (is it captured, with a primary key, and has the silver stage run?)", rule.table),
            }),
            Some(schema) => {
                if let Err(e) = compile(rule, &schema) {
                    errors.push(e);
                }
            }
        }
    }
    Ok(errors)
}

/// `wal2delta rules validate [FILE]`: exit 0 when every rule is valid, 1 naming each bad
/// rule and why, 2 when the file cannot be read.
pub async fn validate(config: &Config, file: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let Some(file) = file.or_else(|| config.rules.file.clone()) else {
        eprintln!(
            "wal2delta: name a rules file (`wal2delta rules validate FILE`) or set [rules] file"
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
    let lake = Lake::new(&config.lake.uri).map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    errors.extend(check(&lake, &rules).await?);
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
