//! `[rules]`: where the rule set comes from, and the optional Kafka outputs of the rules
//! stage (docs/rules.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Deserialize;
use wal2delta_model::TableName;

use super::{invalid, path, ConfigError, KafkaConfig, SilverConfig, TokenizeConfig};

/// The columns a row of a rules table is read from (docs/rules.md, "The rules table").
pub const RULE_COLUMNS: [&str; 6] = ["id", "table", "when", "version", "active", "lookups"];

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RulesConfig {
    /// A TOML file of `[[rule]]` tables.
    pub file: Option<PathBuf>,
    /// A rules table in the source database, `schema.table`, captured like any other
    /// table; the rules are read from its Silver table. Exclusive with `file`.
    pub table: Option<String>,
    /// A Kafka topic (on `[kafka] brokers`) receiving every transition appended to
    /// `rules/transitions`, as JSON.
    pub transitions_topic: Option<String>,
    /// The early filter: a Kafka topic receiving only the change events whose new row
    /// matches at least one active rule, with the matching rule ids, as JSON.
    pub filter_topic: Option<String>,
    /// What the filter topic's events may carry of each table's row (`after`): per
    /// `schema.table`, the columns (as Silver names them); a table not listed carries no
    /// row. Absent: every column (masked as in Silver). Required with `table`: a writer
    /// of the rules table decides which rows pass (docs/rules.md, "Kafka outputs").
    pub filter_columns: Option<BTreeMap<String, Vec<String>>>,
    /// How long the silver stage holds a table's changes for a table its rules look up to
    /// catch up (docs/rules.md, "Lookups"); then they are evaluated against the related
    /// table as it is, counted in `wal2delta_rules_lookup_timeouts_total`. Default
    /// [`DEFAULT_LOOKUP_TIMEOUT_MS`].
    pub lookup_timeout_ms: Option<u64>,
    /// How often `rules/hits` is committed, per table (docs/rules.md, "Exactly once"):
    /// it trails `rules/transitions` by about this much plus the commit's own time, and
    /// its MERGE runs once per interval, beside the Silver rounds, instead of in every
    /// round. 0: as often as the commits finish. Default 5,000.
    pub hits_interval_ms: Option<u64>,
    /// A rule whose condition costs more than this per row (microseconds; judged in
    /// rounds where it took at least 100 ms) is disabled with the reason, never the stage
    /// (docs/rules.md, "Limits"). Default 1,000.
    pub max_eval_us_per_row: Option<u64>,
}

/// The default `[rules] lookup_timeout_ms`: long enough for a related table's round after
/// a transient failure, short enough that a stuck one delays the rules by seconds.
pub const DEFAULT_LOOKUP_TIMEOUT_MS: u64 = 30_000;

impl RulesConfig {
    pub fn lookup_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.lookup_timeout_ms.unwrap_or(DEFAULT_LOOKUP_TIMEOUT_MS),
        )
    }

    pub fn hits_interval(&self) -> std::time::Duration {
        self.hits_interval_ms.map_or(
            wal2delta_lake::rules::DEFAULT_HITS_INTERVAL,
            std::time::Duration::from_millis,
        )
    }

    pub fn max_eval_per_row(&self) -> std::time::Duration {
        self.max_eval_us_per_row.map_or(
            wal2delta_lake::rules::DEFAULT_MAX_EVAL_PER_ROW,
            std::time::Duration::from_micros,
        )
    }

    /// Whether a rule source is configured (`file` or `table`): the rules stage runs.
    pub fn is_set(&self) -> bool {
        self.file.is_some() || self.table.is_some()
    }

    /// `table` as a source table name (validated when the config is loaded).
    pub fn table_name(&self) -> Option<TableName> {
        let parts = path::parse(self.table.as_deref()?, 2)?;
        Some(TableName::new(&parts[0], &parts[1]))
    }

    /// `filter_columns` by the table's name in the lake (`schema.table` of its identity
    /// parts, as a filter round names it); `None`: every column passes.
    pub fn filter_columns(&self) -> Option<BTreeMap<String, BTreeSet<String>>> {
        let columns = self.filter_columns.as_ref()?;
        Some(
            columns
                .iter()
                .filter_map(|(t, cols)| {
                    let parts = path::parse(t, 2)?;
                    let name = TableName::new(&parts[0], &parts[1]).ident();
                    Some((name, cols.iter().cloned().collect()))
                })
                .collect(),
        )
    }

    /// `kafka`: the `[kafka]` section the topics are written with (it is required by the
    /// config, so a topic always has brokers). `silver` and `tokenize`: their policies
    /// must leave the rules table's columns readable.
    pub(super) fn validate(
        &self,
        kafka: &KafkaConfig,
        silver: &SilverConfig,
        tokenize: &TokenizeConfig,
    ) -> Result<(), ConfigError> {
        if let Some(f) = &self.file {
            if !f.is_file() {
                return Err(invalid(
                    "rules.file",
                    format!("{} is not a file", f.display()),
                ));
            }
        }
        if self.max_eval_us_per_row == Some(0) {
            return Err(invalid(
                "rules.max_eval_us_per_row",
                "must be at least 1 (microseconds per row)",
            ));
        }
        if self.lookup_timeout_ms == Some(0) {
            return Err(invalid(
                "rules.lookup_timeout_ms",
                "must be at least 1 (milliseconds)",
            ));
        }
        if let Some(t) = &self.table {
            if self.file.is_some() {
                return Err(invalid(
                    "rules.table",
                    "set either [rules] file or [rules] table, not both",
                ));
            }
            let Some(parts) = path::parse(t, 2) else {
                return Err(invalid(
                    "rules.table",
                    format!("{t:?} is not schema.table (as in PostgreSQL; double-quote a part holding a `.`)"),
                ));
            };
            check_readable(&parts, silver, tokenize)?;
        }
        for (field, topic) in [
            ("rules.transitions_topic", &self.transitions_topic),
            ("rules.filter_topic", &self.filter_topic),
        ] {
            let Some(topic) = topic else { continue };
            check_topic(field, topic, kafka)?;
            if !self.is_set() {
                return Err(invalid(
                    field,
                    "needs rules: set [rules] file or [rules] table (the rules stage publishes it)",
                ));
            }
        }
        match (&self.filter_columns, &self.filter_topic) {
            (Some(_), None) => {
                return Err(invalid(
                    "rules.filter_columns",
                    "needs [rules] filter_topic (it says what that topic's events carry)",
                ))
            }
            (None, Some(_)) if self.table.is_some() => {
                return Err(invalid(
                    "rules.filter_columns",
                    "with [rules] table and filter_topic, list the columns the filter topic may carry per table (`\"public.payments\" = [\"id\", \"amount\"]`): whoever may write the rules table chooses which rows pass, and `when = 'true'` would publish a whole table",
                ))
            }
            _ => {}
        }
        for (t, cols) in self.filter_columns.iter().flatten() {
            if path::parse(t, 2).is_none() {
                return Err(invalid(
                    "rules.filter_columns",
                    format!("{t:?} is not schema.table (as in PostgreSQL; double-quote a part holding a `.`)"),
                ));
            }
            if let Some(c) = cols.iter().find(|c| c.is_empty()) {
                return Err(invalid(
                    "rules.filter_columns",
                    format!("{t:?} lists an empty column name {c:?}"),
                ));
            }
        }
        if self.transitions_topic.is_some() && self.transitions_topic == self.filter_topic {
            return Err(invalid(
                "rules.filter_topic",
                "must differ from [rules] transitions_topic",
            ));
        }
        Ok(())
    }
}

/// Refuses a masking or tokenizing policy on a column of the rules table (`parts`:
/// schema and table): the rules would be read masked (a hashed condition, a redacted
/// table name) and every rule would be refused.
fn check_readable(
    parts: &[String],
    silver: &SilverConfig,
    tokenize: &TokenizeConfig,
) -> Result<(), ConfigError> {
    let masked = silver.mask.keys().filter_map(|k| path::parse(k, 3)).chain(
        tokenize.columns.iter().filter_map(|c| {
            let (t, column, _) = tokenize.entry(c)?;
            Some(vec![t.schema, t.name, column])
        }),
    );
    for p in masked {
        if p[..2] == parts[..2] && RULE_COLUMNS.contains(&p[2].as_str()) {
            return Err(invalid(
                "rules.table",
                format!(
                    "column {:?} of the rules table is masked or tokenized ([silver.mask] or [tokenize] columns): the rules would be read masked; remove that policy",
                    p[2]
                ),
            ));
        }
    }
    Ok(())
}

/// A valid Kafka topic name that no other wal2delta topic uses.
fn check_topic(field: &str, topic: &str, kafka: &KafkaConfig) -> Result<(), ConfigError> {
    if topic.is_empty()
        || topic.len() > 249
        || topic == "."
        || topic == ".."
        || !topic
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(invalid(
            field,
            format!("{topic:?} is not a Kafka topic name (1 to 249 of a-z, A-Z, 0-9, '.', '_', '-'; not \".\" or \"..\")"),
        ));
    }
    if wal2delta_stream::topic::table_of_topic(&kafka.topic_prefix, topic).is_some() {
        return Err(invalid(
            field,
            format!(
                "{topic:?} has the shape of a table topic ({}.schema.table), which bronze would read as a table's changes; pick another name",
                kafka.topic_prefix
            ),
        ));
    }
    let internal = [
        kafka.dlq_topic(),
        kafka.positions_topic(),
        kafka.snapshots_topic(),
        kafka.transactions_topic(),
    ];
    if internal.iter().any(|t| t == topic) {
        return Err(invalid(
            field,
            format!("{topic:?} is one of wal2delta's own [kafka] topics"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::scratch::Scratch;
    use crate::config::{Config, ConfigError};

    fn load(rules: &str) -> Result<Config, ConfigError> {
        let file = Scratch::new("rules", "");
        let text = format!(
            "[source]\ndsn = \"postgres://r@127.0.0.1:5432/app\"\n[kafka]\nbrokers = \"127.0.0.1:9092\"\n[schema_registry]\nurl = \"http://127.0.0.1:8081\"\n[lake]\nuri = \"file:///tmp/lake\"\n[rules]\n{}",
            rules.replace("{file}", &file.0.display().to_string())
        );
        Config::from_sources(Path::new("t.toml"), &text, std::iter::empty())
    }

    fn refused(rules: &str, field: &str, why: &str) {
        let err = load(rules).expect_err(rules).to_string();
        assert!(err.contains(field), "{rules}: {err}");
        assert!(err.contains(why), "{rules}: {err}");
    }

    #[test]
    fn filter_columns_are_checked_and_required_with_a_rules_table() {
        let c = load("file = \"{file}\"\nfilter_topic = \"f\"\nfilter_columns = { \"public.Pay ments\" = [\"id\", \"amount\"], '\"a.b\".c' = [] }\n")
            .expect("valid");
        let cols = c.rules.filter_columns().expect("set");
        let pay = wal2delta_model::TableName::new("public", "Pay ments").ident();
        let dotted = wal2delta_model::TableName::new("a.b", "c").ident();
        assert_eq!(cols.len(), 2);
        assert_eq!(
            cols.get(&pay)
                .map(|c| c.iter().map(String::as_str).collect::<Vec<_>>()),
            Some(vec!["amount", "id"])
        );
        assert_eq!(cols.get(&dotted).map(|c| c.len()), Some(0));
        assert!(load("file = \"{file}\"\nfilter_topic = \"f\"\n")
            .expect("valid")
            .rules
            .filter_columns()
            .is_none());
        refused(
            "file = \"{file}\"\nfilter_columns = { \"public.t\" = [\"id\"] }\n",
            "rules.filter_columns",
            "needs [rules] filter_topic",
        );
        refused(
            "table = \"public.rules\"\nfilter_topic = \"f\"\n",
            "rules.filter_columns",
            "whoever may write the rules table",
        );
        assert!(
            load("table = \"public.rules\"\nfilter_topic = \"f\"\nfilter_columns = {}\n").is_ok()
        );
        refused(
            "file = \"{file}\"\nfilter_topic = \"f\"\nfilter_columns = { \"t\" = [\"id\"] }\n",
            "rules.filter_columns",
            "not schema.table",
        );
        refused(
            "file = \"{file}\"\nfilter_topic = \"f\"\nfilter_columns = { \"s.t\" = [\"\"] }\n",
            "rules.filter_columns",
            "empty column name",
        );
    }

    #[test]
    fn output_topics_are_checked_naming_the_field() {
        let c = load("file = \"{file}\"\ntransitions_topic = \"rules.transitions\"\nfilter_topic = \"rules-filter\"\n")
            .expect("valid");
        assert_eq!(
            c.rules.transitions_topic.as_deref(),
            Some("rules.transitions")
        );
        assert_eq!(c.rules.filter_topic.as_deref(), Some("rules-filter"));
        assert!(load("file = \"{file}\"\n").is_ok());
        refused(
            "file = \"{file}\"\ntransitions_topic = \"bad topic\"\n",
            "rules.transitions_topic",
            "not a Kafka topic name",
        );
        refused(
            "file = \"{file}\"\nfilter_topic = \"\"\n",
            "rules.filter_topic",
            "not a Kafka topic name",
        );
        refused(
            &format!(
                "file = \"{{file}}\"\nfilter_topic = \"{}\"\n",
                "x".repeat(250)
            ),
            "rules.filter_topic",
            "not a Kafka topic name",
        );
        refused(
            "file = \"{file}\"\nfilter_topic = \"..\"\n",
            "rules.filter_topic",
            "not a Kafka topic name",
        );
        refused(
            "filter_topic = \"rules-filter\"\n",
            "rules.filter_topic",
            "set [rules] file",
        );
        refused(
            "file = \"{file}\"\ntransitions_topic = \"cdc.rules.transitions\"\n",
            "rules.transitions_topic",
            "table topic",
        );
        refused(
            "file = \"{file}\"\ntransitions_topic = \"cdc.dlq\"\n",
            "rules.transitions_topic",
            "own [kafka] topics",
        );
        refused(
            "file = \"{file}\"\ntransitions_topic = \"same\"\nfilter_topic = \"same\"\n",
            "rules.filter_topic",
            "must differ",
        );
    }

    #[test]
    fn rules_table_is_schema_table_exclusive_with_file_and_unmasked() {
        let c = load("table = \"app.rules\"\ntransitions_topic = \"rules-out\"\n").expect("valid");
        assert!(c.rules.is_set());
        let t = c.rules.table_name().expect("a table");
        assert_eq!((t.schema.as_str(), t.name.as_str()), ("app", "rules"));
        let c = load("table = \"\\\"my.app\\\".\\\"Rules\\\"\"\n").expect("quoted parts");
        let t = c.rules.table_name().expect("a table");
        assert_eq!((t.schema.as_str(), t.name.as_str()), ("my.app", "Rules"));
        assert!(!load("").expect("no rules").rules.is_set());
        refused(
            "file = \"{file}\"\ntable = \"app.rules\"\n",
            "rules.table",
            "not both",
        );
        for bad in ["rules", "app.rules.x", "app.", "\\\"app.rules"] {
            refused(
                &format!("table = \"{bad}\"\n"),
                "rules.table",
                "is not schema.table",
            );
        }
        let masked = |extra: &str| {
            let err = load(&format!("table = \"app.rules\"\n{extra}"))
                .expect_err(extra)
                .to_string();
            assert!(
                err.contains("rules.table") && err.contains("masked"),
                "{extra}: {err}"
            );
        };
        masked("[silver.mask]\n\"app.rules.when\" = \"redact\"\n");
        let key = Scratch::new("rules-key", "0123456789abcdef0123456789abcdef");
        masked(&format!(
            "[tokenize]\ncolumns = [\"app.rules.id:last4\"]\nkey_file = \"{}\"\n",
            key.0.display()
        ));
        // A policy on another table, or on another column of the rules table, is fine.
        assert!(load("table = \"app.rules\"\n[silver.mask]\n\"app.pay.when\" = \"redact\"\n\"app.rules.note\" = \"redact\"\n").is_ok());
    }
}
