//! `[silver]`: the Bronze → Silver stage, its masking policies and quality checks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use wal2delta_lake::silver::mask::{MaskPolicy, Masking};
use wal2delta_lake::silver::Check;

use wal2delta_model::TableName;
use wal2delta_stream::avro::envelope::field_names;

use super::secret::load_key;
use super::{invalid, path, ConfigError};

/// `[silver]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SilverConfig {
    /// Milliseconds between rounds; a round applies what Bronze gained since the last.
    #[serde(default = "SilverConfig::default_interval_ms")]
    pub interval_ms: u64,
    /// Most Bronze rows read per Kafka partition and table in one round (bounds memory).
    #[serde(default = "SilverConfig::default_max_rows_per_partition")]
    pub max_rows_per_partition: i64,
    /// Changes above which one source transaction is applied in pieces of the read
    /// window, in successive commits, instead of whole in one commit: bounds a round's
    /// memory whatever the transaction's size, at the cost of readers seeing such a
    /// transaction partly applied until its last piece (docs/silver.md).
    #[serde(default = "SilverConfig::default_max_atomic_transaction_rows")]
    pub max_atomic_transaction_rows: u64,
    /// Hours a delete tombstone is kept once the watermark has passed it (`docs/silver.md`).
    #[serde(default = "SilverConfig::default_tombstone_retention_hours")]
    pub tombstone_retention_hours: u64,
    /// Seconds between compaction + checkpoint passes over the Silver tables, their
    /// tombstones and the quarantine tables (run between rounds); 0 disables.
    #[serde(default = "SilverConfig::default_maintenance_interval_s")]
    pub maintenance_interval_s: u64,
    /// Target size of the files compaction and the MERGE write. A MERGE rewrites every
    /// file holding a changed key, so smaller files cost less per round when the changed
    /// keys are close together (recent rows) and the files hold key ranges.
    #[serde(default = "SilverConfig::default_target_file_bytes")]
    pub target_file_bytes: u64,
    /// `"schema.table.column" = "policy"`: hash, redact, keep_last:N or null; parsed while
    /// the file is read (an unknown policy is named with its entry there).
    #[serde(default, deserialize_with = "mask_policies")]
    pub mask: BTreeMap<String, MaskPolicy>,
    /// Environment variable holding the key of the `hash` policy (at least 16 bytes).
    #[serde(default)]
    pub mask_key_env: Option<String>,
    /// File holding the key of the `hash` policy.
    #[serde(default)]
    pub mask_key_file: Option<PathBuf>,
    /// `[[silver.checks]]`: quality checks; a row that fails one goes to quarantine.
    #[serde(default)]
    pub checks: Vec<CheckConfig>,
}

fn mask_policies<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, MaskPolicy>, D::Error> {
    BTreeMap::<String, String>::deserialize(d)?
        .into_iter()
        .map(|(column, policy)| {
            MaskPolicy::parse(&policy)
                .map(|p| (column.clone(), p))
                .map_err(|e| serde::de::Error::custom(format!("\"{column}\": {e}")))
        })
        .collect()
}

/// One quality check: a name, a table and exactly one condition, checked while the file
/// is read (an error names the check and the field at fault).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "CheckEntry")]
pub struct CheckConfig {
    pub name: String,
    /// `schema.table`.
    pub table: String,
    pub condition: Condition,
}

/// What a check requires of each row.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// A SQL boolean expression over the table's columns.
    Sql(String),
    /// The column must not be NULL.
    NotNull(String),
    /// The column, as a number, within the bounds given (finite).
    Range {
        column: String,
        min: Option<f64>,
        max: Option<f64>,
    },
    /// The column is one of these SQL literals.
    Allowed { column: String, values: Vec<String> },
    /// The column, as text, matches this (valid) regex.
    Regex { column: String, pattern: String },
}

impl Condition {
    /// The source column the condition names and the field that names it, if any.
    fn column_mut(&mut self) -> Option<(&'static str, &mut String)> {
        match self {
            Condition::Sql(_) => None,
            Condition::NotNull(c) => Some(("not_null", c)),
            Condition::Range { column, .. }
            | Condition::Allowed { column, .. }
            | Condition::Regex { column, .. } => Some(("column", column)),
        }
    }
}

/// `[[silver.checks]]` as written: every condition's fields optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckEntry {
    name: String,
    table: String,
    #[serde(default)]
    sql: Option<String>,
    #[serde(default)]
    not_null: Option<String>,
    /// The column `min`, `max`, `allowed` and `regex` apply to.
    #[serde(default)]
    column: Option<String>,
    #[serde(default)]
    min: Option<f64>,
    #[serde(default)]
    max: Option<f64>,
    #[serde(default)]
    allowed: Option<Vec<toml::Value>>,
    #[serde(default)]
    regex: Option<String>,
}

/// A check refused while the file is read: the field at fault and why.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckError {
    pub check: String,
    pub field: &'static str,
    pub why: String,
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "check {:?}: {} {}", self.check, self.field, self.why)
    }
}

impl SilverConfig {
    fn default_interval_ms() -> u64 {
        2_000
    }
    fn default_maintenance_interval_s() -> u64 {
        3_600
    }
    /// 64 MiB. Smaller files make key-local rounds on large tables cheaper (1.2 s with
    /// 8 MiB files against 2.0 s with 32 MiB on 10M rows) but cost more per round on a
    /// small table changed at random (Silver 90 against 67 µs per change at 5,000/s):
    /// docs/benchmarks.md, "Silver file layout".
    fn default_target_file_bytes() -> u64 {
        64 << 20
    }
    fn default_max_rows_per_partition() -> i64 {
        100_000
    }
    fn default_max_atomic_transaction_rows() -> u64 {
        wal2delta_lake::silver::Pieces::DEFAULT_LIMIT
    }
    fn default_tombstone_retention_hours() -> u64 {
        168
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.interval_ms == 0 {
            return Err(invalid("silver.interval_ms", "must be greater than 0"));
        }
        if self.target_file_bytes < (1 << 20) {
            return Err(invalid(
                "silver.target_file_bytes",
                "must be at least 1048576 (1 MiB)",
            ));
        }
        if self.max_rows_per_partition <= 0 {
            return Err(invalid(
                "silver.max_rows_per_partition",
                "must be greater than 0",
            ));
        }
        if self.max_atomic_transaction_rows == 0 {
            return Err(invalid(
                "silver.max_atomic_transaction_rows",
                "must be greater than 0",
            ));
        }
        for column in self.mask.keys() {
            let field = format!("silver.mask.\"{column}\"");
            if path::parse(column, 3).is_none() {
                return Err(invalid(
                    &field,
                    "must name a column as schema.table.column (double-quote a part holding a '.')",
                ));
            }
        }
        self.mask_key()?;
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.checks.iter().enumerate() {
            if !names.insert((c.table.clone(), c.name.clone())) {
                return Err(invalid(
                    &format!("silver.checks[{i}].name"),
                    format!("{:?} is used twice for table {}", c.name, c.table),
                ));
            }
        }
        Ok(())
    }

    /// The `hash` key, when some column uses `hash`.
    fn mask_key(&self) -> Result<Option<Arc<[u8]>>, ConfigError> {
        if !self.mask.values().any(|p| *p == MaskPolicy::Hash) {
            return Ok(None);
        }
        let key = load_key(
            "silver.mask",
            self.mask_key_env.as_deref(),
            self.mask_key_file.as_deref(),
        )
        .map_err(|e| match e {
            ConfigError::Invalid { field, constraint } => ConfigError::Invalid {
                field: field.replace("silver.mask.key", "silver.mask_key"),
                constraint: constraint.replace(
                    "key_env or key_file when columns are listed",
                    "mask_key_env or mask_key_file when a column uses the hash policy",
                ),
            },
            other => other,
        })?;
        Ok(Some(Arc::from(key)))
    }

    /// Whether any masking policy or check is configured.
    pub fn has_policies(&self) -> bool {
        !self.mask.is_empty() || !self.checks.is_empty()
    }

    /// The masking and checks of every table a policy names, by the table's identity (its
    /// lake name, [`TableName::ident`]). Entries name the real (source) tables and columns;
    /// they are matched against `catalog` (the published tables, their columns in order)
    /// and turned into Silver's column names (the Avro field names capture gives them). A
    /// table or column the catalog does not have is an error naming the entry: a policy
    /// that silently matches nothing would let raw values into Silver.
    pub fn resolve(
        &self,
        catalog: &BTreeMap<TableName, Vec<String>>,
    ) -> Result<Policies, ConfigError> {
        let mut masks: BTreeMap<String, BTreeMap<String, MaskPolicy>> = BTreeMap::new();
        for (entry, policy) in &self.mask {
            let field = format!("silver.mask.\"{entry}\"");
            let parts = path::parse(entry, 3)
                .ok_or_else(|| invalid(&field, "must name a column as schema.table.column"))?;
            let table = TableName::new(&parts[0], &parts[1]);
            let column = silver_column(catalog, &field, &table, &parts[2])?;
            masks
                .entry(table.ident())
                .or_default()
                .insert(column, *policy);
        }
        let key = if self.mask.values().any(|p| *p == MaskPolicy::Hash) {
            self.mask_key()?
        } else {
            None
        };
        let mut tables: BTreeMap<String, TablePolicy> = BTreeMap::new();
        for (ident, columns) in masks {
            let masking = Masking::new(columns, key.clone())
                .map_err(|e| invalid("silver.mask", e.to_string()))?;
            tables.entry(ident).or_default().masking = masking;
        }
        for (i, c) in self.checks.iter().enumerate() {
            let at = |f: &str| format!("silver.checks[{i}].{f}");
            let parts = path::parse(&c.table, 2)
                .ok_or_else(|| invalid(&at("table"), "must look like schema.table"))?;
            let table = TableName::new(&parts[0], &parts[1]);
            if !catalog.contains_key(&table) {
                return Err(unpublished(&at("table"), &table));
            }
            let mut c = c.clone();
            if let Some((field, col)) = c.condition.column_mut() {
                *col = silver_column(catalog, &at(field), &table, col)?;
            }
            tables
                .entry(table.ident())
                .or_default()
                .checks
                .push(c.compile());
        }
        Ok(Policies { tables })
    }
}

/// The masking and checks of one Silver table.
#[derive(Debug, Clone, Default)]
pub struct TablePolicy {
    pub masking: Masking,
    pub checks: Vec<Check>,
}

/// The Silver policies of every table, resolved against the source's names
/// ([`SilverConfig::resolve`]).
#[derive(Debug, Clone, Default)]
pub struct Policies {
    tables: BTreeMap<String, TablePolicy>,
}

impl Policies {
    /// The policy of the table with identity `ident` (`schema.table` as in its lake path);
    /// none when no entry names it.
    pub fn of(&self, ident: &str) -> TablePolicy {
        self.tables.get(ident).cloned().unwrap_or_default()
    }
}

/// The error for an entry naming a table that is not published.
fn unpublished(field: &str, table: &TableName) -> ConfigError {
    invalid(
        field,
        format!(
            "names the table {}, which is not among the published tables (a table that does not exist yet is an error too: create it and run `wal2delta setup` first)",
            table.quoted()
        ),
    )
}

/// Silver's name (the Avro field name) of the source column `column` of `table`.
fn silver_column(
    catalog: &BTreeMap<TableName, Vec<String>>,
    field: &str,
    table: &TableName,
    column: &str,
) -> Result<String, ConfigError> {
    let columns = catalog
        .get(table)
        .ok_or_else(|| unpublished(field, table))?;
    let i = columns.iter().position(|c| c == column).ok_or_else(|| {
        invalid(
            field,
            format!(
                "names the column {}, which the table {} does not have (its columns: {})",
                quote(column),
                table.quoted(),
                columns
                    .iter()
                    .map(|c| quote(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    Ok(field_names(columns).swap_remove(i))
}

impl Default for SilverConfig {
    fn default() -> Self {
        SilverConfig {
            interval_ms: Self::default_interval_ms(),
            max_rows_per_partition: Self::default_max_rows_per_partition(),
            max_atomic_transaction_rows: Self::default_max_atomic_transaction_rows(),
            tombstone_retention_hours: Self::default_tombstone_retention_hours(),
            maintenance_interval_s: Self::default_maintenance_interval_s(),
            target_file_bytes: Self::default_target_file_bytes(),
            mask: BTreeMap::new(),
            mask_key_env: None,
            mask_key_file: None,
            checks: Vec::new(),
        }
    }
}

/// A SQL identifier, quoted.
fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(format!("'{}'", s.replace('\'', "''"))),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) if f.is_finite() => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        other => Err(format!(
            "holds {other}, which is not a string, number or boolean"
        )),
    }
}

impl TryFrom<CheckEntry> for CheckConfig {
    type Error = CheckError;

    fn try_from(e: CheckEntry) -> Result<Self, CheckError> {
        let refuse = |field: &'static str, why: &str| CheckError {
            check: e.name.clone(),
            field,
            why: why.to_owned(),
        };
        if e.name.is_empty()
            || !e
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(refuse(
                "name",
                "must be non-empty and use only letters, digits, '_', '-' and '.'",
            ));
        }
        if path::parse(&e.table, 2).is_none() {
            return Err(refuse("table", "must look like schema.table"));
        }
        let ranged = e.min.is_some() || e.max.is_some();
        let kinds = [
            e.sql.is_some(),
            e.not_null.is_some(),
            ranged,
            e.allowed.is_some(),
            e.regex.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(refuse(
                "sql",
                "each check needs exactly one of sql, not_null, min/max, allowed or regex",
            ));
        }
        if e.column.is_some() && (e.sql.is_some() || e.not_null.is_some()) {
            return Err(refuse("column", "is only for min/max, allowed and regex"));
        }
        let column = || {
            e.column
                .clone()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| refuse("column", "is required for min/max, allowed and regex"))
        };
        let condition = if let Some(sql) = &e.sql {
            if sql.trim().is_empty() {
                return Err(refuse("sql", "must not be empty"));
            }
            Condition::Sql(sql.clone())
        } else if let Some(c) = &e.not_null {
            Condition::NotNull(c.clone())
        } else if ranged {
            if [e.min, e.max].iter().flatten().any(|b| !b.is_finite()) {
                return Err(refuse("min", "bounds must be finite numbers"));
            }
            Condition::Range {
                column: column()?,
                min: e.min,
                max: e.max,
            }
        } else if let Some(values) = &e.allowed {
            if values.is_empty() {
                return Err(refuse("allowed", "must list at least one value"));
            }
            let values = values
                .iter()
                .map(literal)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|why| refuse("allowed", &why))?;
            Condition::Allowed {
                column: column()?,
                values,
            }
        } else {
            let pattern = e.regex.clone().unwrap_or_default();
            regex::Regex::new(&pattern)
                .map_err(|err| refuse("regex", &format!("is not a valid regex: {err}")))?;
            Condition::Regex {
                column: column()?,
                pattern,
            }
        };
        Ok(CheckConfig {
            name: e.name,
            table: e.table,
            condition,
        })
    }
}

impl CheckConfig {
    /// The check as one SQL condition.
    pub fn compile(&self) -> Check {
        let (sql, description) = match &self.condition {
            Condition::Sql(sql) => (sql.clone(), sql.clone()),
            Condition::NotNull(c) => (
                format!("{} IS NOT NULL", quote(c)),
                format!("{c} is not null"),
            ),
            Condition::Range {
                column: c,
                min,
                max,
            } => {
                let v = format!("TRY_CAST({} AS DOUBLE)", quote(c));
                let mut parts = Vec::new();
                let mut says = Vec::new();
                for (bound, op) in [(min, ">="), (max, "<=")] {
                    if let Some(b) = bound {
                        parts.push(format!("{v} {op} {b:?}"));
                        says.push(format!("{c} {op} {b}"));
                    }
                }
                (
                    format!("{} IS NULL OR ({})", quote(c), parts.join(" AND ")),
                    says.join(" and "),
                )
            }
            Condition::Allowed { column: c, values } => (
                format!(
                    "{} IS NULL OR {} IN ({})",
                    quote(c),
                    quote(c),
                    values.join(", ")
                ),
                format!("{c} in ({})", values.join(", ")),
            ),
            Condition::Regex { column: c, pattern } => (
                format!(
                    "{} IS NULL OR regexp_like(CAST({} AS VARCHAR), '{}')",
                    quote(c),
                    quote(c),
                    pattern.replace('\'', "''")
                ),
                format!("{c} matches /{pattern}/"),
            ),
        };
        Check {
            name: self.name.clone(),
            sql,
            description,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml_text: &str) -> Result<Check, (&'static str, String)> {
        let e: CheckEntry = toml::from_str(toml_text).unwrap();
        CheckConfig::try_from(e)
            .map(|c| c.compile())
            .map_err(|e| (e.field, e.why))
    }

    #[test]
    fn each_kind_compiles_to_one_condition() {
        let c = check("name = 'nn'\ntable = 'public.p'\nnot_null = 'currency'").unwrap();
        assert_eq!(c.sql, "\"currency\" IS NOT NULL");
        let c = check("name = 'r'\ntable = 'public.p'\ncolumn = 'amount'\nmin = 0").unwrap();
        assert_eq!(
            c.sql,
            "\"amount\" IS NULL OR (TRY_CAST(\"amount\" AS DOUBLE) >= 0.0)"
        );
        let c =
            check("name = 'a'\ntable = 'public.p'\ncolumn = 'cur'\nallowed = ['EUR', \"it's\"]")
                .unwrap();
        assert_eq!(c.sql, "\"cur\" IS NULL OR \"cur\" IN ('EUR', 'it''s')");
        let c = check("name = 's'\ntable = 'public.p'\nsql = \"amount >= 0 OR type = 'refund'\"")
            .unwrap();
        assert_eq!(c.sql, "amount >= 0 OR type = 'refund'");
    }

    #[test]
    fn bad_checks_name_the_field() {
        assert_eq!(
            check("name = 'x'\ntable = 'public.p'").unwrap_err().0,
            "sql"
        );
        assert_eq!(
            check("name = 'x'\ntable = 'public.p'\nsql = 'a'\nnot_null = 'b'")
                .unwrap_err()
                .0,
            "sql"
        );
        assert_eq!(
            check("name = 'x'\ntable = 'public.p'\nmin = 1")
                .unwrap_err()
                .0,
            "column"
        );
        assert_eq!(
            check("name = 'x'\ntable = 'public.p'\ncolumn = 'c'\nregex = '('")
                .unwrap_err()
                .0,
            "regex"
        );
        assert_eq!(
            check("name = 'bad name'\ntable = 'public.p'\nsql = 'a'")
                .unwrap_err()
                .0,
            "name"
        );
        assert_eq!(
            check("name = 'x'\ntable = 'p'\nsql = 'a'").unwrap_err().0,
            "table"
        );
    }

    #[test]
    fn a_bad_check_is_refused_while_the_file_is_read_naming_it() {
        let e = toml::from_str::<SilverConfig>(
            "[[checks]]\nname = \"twice\"\ntable = \"public.p\"\nsql = \"a\"\nnot_null = \"b\"",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("check \"twice\"") && e.contains("exactly one"),
            "{e}"
        );
        let c: SilverConfig =
            toml::from_str("[[checks]]\nname = \"nn\"\ntable = \"public.p\"\nnot_null = \"c\"")
                .unwrap();
        assert_eq!(c.checks[0].condition, Condition::NotNull("c".into()));
    }

    #[test]
    fn policies_name_real_tables_and_columns() {
        let catalog = BTreeMap::from([(
            TableName::new("public", "Order Items"),
            vec!["id".to_owned(), "Card No".to_owned(), "Card_No".to_owned()],
        )]);
        let c: SilverConfig = toml::from_str(
            "[mask]\n\"public.Order Items.Card No\" = \"redact\"\n'public.\"Order Items\".Card_No' = \"null\"\n\
             [[checks]]\nname = \"nn\"\ntable = \"public.Order Items\"\nnot_null = \"Card No\"",
        )
        .unwrap();
        c.validate().unwrap();
        let p = c.resolve(&catalog).unwrap();
        // Silver's columns are the Avro field names: `Card_No`, and `Card_No_2` for the
        // second column that sanitises to it.
        let t = p.of("public.-4frder-20-49tems");
        assert_eq!(t.masking.policy("Card_No"), Some(MaskPolicy::Redact));
        assert_eq!(t.masking.policy("Card_No_2"), Some(MaskPolicy::Null));
        assert_eq!(t.checks[0].sql, "\"Card_No\" IS NOT NULL");
        assert!(p.of("public.Order_Items").masking.is_empty());

        let unknown = |toml_text: &str| {
            let c: SilverConfig = toml::from_str(toml_text).unwrap();
            c.validate().unwrap();
            c.resolve(&catalog).unwrap_err().to_string()
        };
        let e = unknown("[mask]\n\"public.Order Items.Card Number\" = \"redact\"");
        assert!(
            e.contains("silver.mask") && e.contains("\"Card Number\""),
            "{e}"
        );
        let e = unknown("[mask]\n\"public.Order_Items.Card No\" = \"redact\"");
        assert!(
            e.contains("\"Order_Items\"") && e.contains("not among the published"),
            "{e}"
        );
        let e = unknown(
            "[[checks]]\nname = \"x\"\ntable = \"public.Order Items\"\ncolumn = \"qty\"\nmin = 0",
        );
        assert!(
            e.contains("silver.checks[0].column") && e.contains("\"qty\""),
            "{e}"
        );
        let e = unknown("[[checks]]\nname = \"x\"\ntable = \"public.nope\"\nsql = \"true\"");
        assert!(e.contains("silver.checks[0].table"), "{e}");
    }

    #[test]
    fn masking_is_per_table_and_hash_needs_a_key() {
        let c: SilverConfig = toml::from_str(
            "[mask]\n\"public.c.email\" = \"redact\"\n\"public.p.card\" = \"keep_last:4\"",
        )
        .unwrap();
        c.validate().unwrap();
        let catalog = BTreeMap::from([
            (
                TableName::new("public", "c"),
                vec!["id".to_owned(), "email".to_owned(), "card".to_owned()],
            ),
            (
                TableName::new("public", "p"),
                vec!["id".to_owned(), "card".to_owned()],
            ),
        ]);
        let p = c.resolve(&catalog).unwrap();
        assert_eq!(
            p.of("public.c").masking.policy("email"),
            Some(MaskPolicy::Redact)
        );
        assert_eq!(p.of("public.c").masking.policy("card"), None);
        // A policy is parsed while the file is read, naming the entry.
        let e = toml::from_str::<SilverConfig>("[mask]\n\"public.c.email\" = \"scramble\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("public.c.email") && e.contains("keep_last"),
            "{e}"
        );
        let c: SilverConfig = toml::from_str("[mask]\n\"public.c.email\" = \"hash\"").unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("silver.mask"), "{e}");
        let c: SilverConfig = toml::from_str("[mask]\n\"email\" = \"hash\"").unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("schema.table.column"));
        let e = toml::from_str::<SilverConfig>("[mask]\n\"public.c.email\" = \"blur\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("blur") && e.contains("public.c.email"), "{e}");
    }
}
