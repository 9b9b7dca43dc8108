//! `[source]`: the PostgreSQL database to capture.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use serde::Deserialize;

use wal2delta_cdc::replication::ConnectParams;
use wal2delta_cdc::CdcError;
use wal2delta_model::TableName;

use super::{invalid, secret, ConfigError};

/// `[source]`: the PostgreSQL database to capture.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// libpq-style DSN of a role with the REPLICATION attribute. May carry the password;
    /// it is never logged.
    pub dsn: String,
    /// A file whose first line is the password, used when the DSN has none.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// A name for this source database, unique among the sources that share a lake and a
    /// Kafka cluster (Debezium's `topic.prefix` role): the lake keeps its tables under
    /// `{[lake] uri}/{name}/`, and `[kafka] topic_prefix` and `[bronze] group_id` default
    /// to it (docs/operations.md, "Several databases, one lake"). Unset: one source per
    /// lake, at the lake's root.
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "SourceConfig::default_slot")]
    pub slot: String,
    #[serde(default = "SourceConfig::default_publication")]
    pub publication: String,
    /// `schema.table` patterns; `*` matches any run of characters.
    #[serde(default = "SourceConfig::default_tables")]
    pub tables: Vec<String>,
    /// What capture does when its slot is invalidated or was dropped ([`OnSlotLost`]).
    #[serde(default)]
    pub on_slot_lost: OnSlotLost,
    /// Create the slot as a failover slot (PostgreSQL 17 and later; `setup` refuses it on
    /// older servers): standbys with `sync_replication_slots = on` keep a synchronized copy,
    /// so capture continues on the promoted standby (docs/operations.md). Default false.
    #[serde(default)]
    pub failover_slot: bool,
    /// `schema.table.column` entries: columns that never leave capture (dropped from
    /// events, schemas and dead letters; docs/capture.md). Not a primary-key column.
    #[serde(default)]
    pub exclude_columns: Vec<String>,
    /// `schema.table.column` entries: for each table named, only these columns and its
    /// primary key leave capture (a column added later too stays out). A table is named
    /// in `exclude_columns` or here, not both.
    #[serde(default)]
    pub include_columns: Vec<String>,
    /// `schema.table` patterns (`*` as in `tables`) left out even when `tables` matches
    /// them: setup does not publish them and capture does not add them.
    #[serde(default)]
    pub exclude_tables: Vec<String>,
    /// Capture adds tables created after `setup` that match `tables` (less
    /// `exclude_tables`) to the publication, snapshots and streams them (docs/capture.md,
    /// "Tables created later"). Default true; false when the publication is managed by
    /// hand.
    #[serde(default = "SourceConfig::default_add_new_tables")]
    pub add_new_tables: bool,
}

impl std::fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceConfig")
            .field("dsn", &"<redacted>")
            .field("name", &self.name)
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("tables", &self.tables)
            .field("exclude_tables", &self.exclude_tables)
            .field("add_new_tables", &self.add_new_tables)
            .finish_non_exhaustive()
    }
}

impl SourceConfig {
    /// `[source] exclude_columns` and `include_columns` by table (entries `validate`
    /// accepted).
    pub fn column_filters(&self) -> HashMap<TableName, ColumnFilter> {
        let mut excluded = HashMap::<TableName, BTreeSet<String>>::new();
        let mut included = HashMap::<TableName, BTreeSet<String>>::new();
        for (specs, into) in [
            (&self.exclude_columns, &mut excluded),
            (&self.include_columns, &mut included),
        ] {
            for spec in specs {
                if let Some((table, column)) = column_entry(spec) {
                    into.entry(table).or_default().insert(column);
                }
            }
        }
        let mut out: HashMap<TableName, ColumnFilter> = excluded
            .into_iter()
            .map(|(t, c)| (t, ColumnFilter::Exclude(c)))
            .collect();
        out.extend(
            included
                .into_iter()
                .map(|(t, c)| (t, ColumnFilter::Include(c))),
        );
        out
    }

    /// Who writes this deployment's lake tables and state records: `[source] name`, else
    /// `{database}/{slot}` (the DSN's database and the slot). Recorded in every Bronze
    /// commit and position record, so that a second source configured onto the same lake
    /// or topics is refused instead of mixing its rows in.
    pub fn identity(&self) -> String {
        match &self.name {
            Some(n) => n.clone(),
            None => {
                let db = ConnectParams::from_dsn(&self.dsn)
                    .map(|p| p.dbname)
                    .unwrap_or_default();
                format!("{db}/{}", self.slot)
            }
        }
    }

    fn default_slot() -> String {
        "wal2delta".into()
    }
    fn default_publication() -> String {
        "wal2delta".into()
    }
    fn default_tables() -> Vec<String> {
        vec!["public.*".into()]
    }
    fn default_add_new_tables() -> bool {
        true
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (field, specs) in [
            ("source.exclude_columns", &self.exclude_columns),
            ("source.include_columns", &self.include_columns),
        ] {
            if let Some(bad) = specs.iter().find(|s| column_entry(s).is_none()) {
                return Err(invalid(
                    field,
                    format!("entry {bad:?} must look like schema.table.column (quote a part with \"...\" when it holds a dot)"),
                ));
            }
        }
        let excluded: BTreeSet<TableName> = self
            .exclude_columns
            .iter()
            .filter_map(|s| column_entry(s).map(|(t, _)| t))
            .collect();
        if let Some((table, _)) = self
            .include_columns
            .iter()
            .filter_map(|s| column_entry(s))
            .find(|(t, _)| excluded.contains(t))
        {
            return Err(invalid(
                "source.include_columns",
                format!(
                    "names the table {}, which source.exclude_columns names too: say which columns leave capture in one of the two",
                    table.quoted()
                ),
            ));
        }
        if self.dsn.trim().is_empty() {
            return Err(invalid(
                "source.dsn",
                "must not be empty (e.g. postgres://replicator@127.0.0.1:5432/app)",
            ));
        }
        // Parses both DSN forms and loads sslrootcert/sslcert/sslkey, so a wrong sslmode
        // or an unreadable certificate fails here, before any stage starts.
        ConnectParams::from_dsn(&self.dsn).map_err(|e| match e {
            CdcError::Dsn(m) if m.contains("names no user") => {
                invalid("source.dsn", "must name a user")
            }
            CdcError::Dsn(m) => {
                invalid("source.dsn", format!("is not a valid PostgreSQL DSN: {m}"))
            }
            other => invalid("source.dsn", other.to_string()),
        })?;
        let name = self.name.clone().unwrap_or_else(|| "x".into());
        for (field, name) in [
            ("source.slot", &self.slot),
            ("source.publication", &self.publication),
            ("source.name", &name),
        ] {
            if name.is_empty()
                || name.len() > 63
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(invalid(
                    field,
                    "must be 1 to 63 characters of a-z, 0-9 and _",
                ));
            }
        }
        if self
            .name
            .as_ref()
            .is_some_and(|n| n.len() > wal2delta_model::names::MAX_TOPIC_PREFIX)
        {
            return Err(invalid(
                "source.name",
                format!(
                    "must be at most {} characters: it becomes the topic prefix, and every table topic must fit Kafka's 249",
                    wal2delta_model::names::MAX_TOPIC_PREFIX
                ),
            ));
        }
        if self.tables.is_empty() {
            return Err(invalid(
                "source.tables",
                "must list at least one schema.table pattern",
            ));
        }
        for (field, patterns) in [
            ("source.tables", &self.tables),
            ("source.exclude_tables", &self.exclude_tables),
        ] {
            for t in patterns {
                match t.split_once('.') {
                    Some((a, b)) if !a.is_empty() && !b.is_empty() => {}
                    _ => {
                        return Err(invalid(
                            field,
                            format!("entry {t:?} must look like schema.table (patterns may use *)"),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// The DSN with the password from `password_file` added when the DSN has none.
    pub fn effective_dsn(&self) -> Result<String, ConfigError> {
        let Some(path) = &self.password_file else {
            return Ok(self.dsn.clone());
        };
        let password =
            secret::load_password("source.password", None, Some(path))?.unwrap_or_default();
        let params = ConnectParams::from_dsn(&self.dsn)
            .map_err(|e| invalid("source.dsn", format!("is not a valid PostgreSQL DSN: {e}")))?;
        if params.password.is_some() {
            return Ok(self.dsn.clone());
        }
        // Added in the DSN's own form, so every other parameter (sslmode, options...) stays.
        Ok(wal2delta_cdc::dsn::with_password(&self.dsn, &password))
    }
}

/// `[source] on_slot_lost`: what capture does when its slot is invalidated or was dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnSlotLost {
    /// Stop and say so.
    #[default]
    Refuse,
    /// Re-create the slot and snapshot every table again.
    Recreate,
}

/// Refuses an `exclude_columns` or `include_columns` (`field`) entry naming a table or
/// column the source does not publish (`catalog`: the published tables with their
/// columns): a typo would let a column's values leave capture, or keep one out.
pub fn check_column_names(
    field: &'static str,
    entries: &[String],
    catalog: &std::collections::BTreeMap<TableName, Vec<String>>,
) -> Result<(), ConfigError> {
    for spec in entries {
        let Some((table, column)) = column_entry(spec) else {
            continue; // validate() refused it already
        };
        match catalog.get(&table) {
            None => {
                return Err(invalid(
                    field,
                    format!(
                    "entry {spec:?} names the table {}, which is not among the published tables",
                    table.quoted()
                ),
                ))
            }
            Some(columns) if !columns.contains(&column) => {
                return Err(invalid(
                    field,
                    format!(
                        "entry {spec:?} names a column the table {} does not have",
                        table.quoted()
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An `exclude_columns` or `include_columns` entry's table and column; `None` when it is
/// not `schema.table.column` (parts as in [`super::path`]).
pub fn column_entry(spec: &str) -> Option<(TableName, String)> {
    let mut parts = super::path::parse(spec, 3)?;
    let column = parts.pop()?;
    Some((TableName::new(&parts[0], &parts[1]), column))
}

/// Which columns of one table leave capture (`[source] exclude_columns`,
/// `include_columns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnFilter {
    /// Every column but these (never a primary-key column: capture refuses it).
    Exclude(BTreeSet<String>),
    /// These and the primary key only; a column added later stays out.
    Include(BTreeSet<String>),
}

impl ColumnFilter {
    /// Whether the column leaves capture.
    pub fn keeps(&self, column: &str, is_key: bool) -> bool {
        match self {
            ColumnFilter::Exclude(out) => !out.contains(column),
            ColumnFilter::Include(kept) => is_key || kept.contains(column),
        }
    }
}
