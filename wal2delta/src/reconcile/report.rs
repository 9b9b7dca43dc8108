//! What `reconcile` prints: one report per table, as text or as JSON (docs/reconcile.md
//! documents the JSON shape; fields are only ever added).

use serde::Serialize;

use super::compare::KeyDifference;

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The snapshot LSN every table was compared at (PostgreSQL's `X/X` form).
    pub lsn: String,
    /// Every compared table is equal (and none failed).
    pub equal: bool,
    pub tables: Vec<TableReport>,
    /// Captured source tables that have no Silver table (not compared).
    pub tables_not_in_silver: Vec<String>,
    /// Captured source tables without a primary key: kept in Bronze only, Silver does not
    /// hold them, so they are not compared.
    pub tables_without_primary_key: Vec<String>,
}

/// One table. Counts and checksums are `null` when the table could not be compared
/// (`error` says why).
#[derive(Debug, Serialize)]
pub struct TableReport {
    pub name: String,
    pub lsn: String,
    pub equal: bool,
    pub error: Option<String>,
    pub silver_version: Option<u64>,
    pub silver_watermark: Option<String>,
    pub source_rows: Option<u64>,
    pub silver_rows: Option<u64>,
    pub source_checksum: Option<String>,
    pub silver_checksum: Option<String>,
    pub excluded: Option<Excluded>,
    pub differences: Option<Differences>,
    pub columns: Vec<String>,
    pub columns_only_in_source: Vec<String>,
    /// Source columns `[source] exclude_columns` keeps out of capture (not compared).
    pub columns_excluded: Vec<String>,
    pub columns_only_in_silver: Vec<String>,
    pub differing_keys: Vec<DifferingKey>,
}

#[derive(Debug, Serialize)]
pub struct Excluded {
    pub changed_after_snapshot: u64,
    pub quarantined: u64,
    /// Silver quarantine records of the table whose key could not be read.
    pub quarantine_records_without_key: u64,
    pub undecodable: u64,
}

#[derive(Debug, Serialize)]
pub struct Differences {
    pub missing_in_silver: u64,
    pub extra_in_silver: u64,
    pub values_differ: u64,
}

#[derive(Debug, Serialize)]
pub struct DifferingKey {
    pub key: serde_json::Value,
    pub difference: &'static str,
    pub columns: Vec<String>,
}

impl From<KeyDifference> for DifferingKey {
    fn from(d: KeyDifference) -> Self {
        DifferingKey {
            key: d.key,
            difference: d.difference.as_str(),
            columns: d.columns,
        }
    }
}

impl TableReport {
    /// A table that could not be compared.
    pub fn failed(name: String, lsn: String, error: String) -> TableReport {
        TableReport {
            name,
            lsn,
            equal: false,
            error: Some(error),
            silver_version: None,
            silver_watermark: None,
            source_rows: None,
            silver_rows: None,
            source_checksum: None,
            silver_checksum: None,
            excluded: None,
            differences: None,
            columns: Vec::new(),
            columns_only_in_source: Vec::new(),
            columns_excluded: Vec::new(),
            columns_only_in_silver: Vec::new(),
            differing_keys: Vec::new(),
        }
    }

    fn text(&self, out: &mut String) {
        use std::fmt::Write;
        let Some(error) = &self.error else {
            return self.compared_text(out);
        };
        let _ = writeln!(out, "{}: NOT COMPARED: {error}", self.name);
    }

    fn compared_text(&self, out: &mut String) {
        use std::fmt::Write;
        let n = |v: Option<u64>| v.unwrap_or(0);
        let sum = |v: &Option<String>| v.clone().unwrap_or_default();
        let verdict = if self.equal { "equal" } else { "DIFFERENT" };
        let _ = writeln!(
            out,
            "{}: {verdict} (Silver version {}, watermark {})",
            self.name,
            self.silver_version.unwrap_or(0),
            self.silver_watermark.as_deref().unwrap_or("-")
        );
        let _ = writeln!(
            out,
            "  source {:>10} rows  checksum {}",
            n(self.source_rows),
            sum(&self.source_checksum)
        );
        let _ = writeln!(
            out,
            "  silver {:>10} rows  checksum {}",
            n(self.silver_rows),
            sum(&self.silver_checksum)
        );
        if let Some(e) = &self.excluded {
            let _ = writeln!(
                out,
                "  excluded: {} changed after the snapshot, {} quarantined, {} undecodable at the source",
                e.changed_after_snapshot, e.quarantined, e.undecodable
            );
            if e.quarantine_records_without_key > 0 {
                let _ = writeln!(
                    out,
                    "  note: {} Silver quarantine record(s) of this table name no readable key",
                    e.quarantine_records_without_key
                );
            }
        }
        if !self.columns_only_in_source.is_empty() {
            let _ = writeln!(
                out,
                "  columns in the source but not in Silver: {}",
                self.columns_only_in_source.join(", ")
            );
        }
        if !self.columns_excluded.is_empty() {
            let _ = writeln!(
                out,
                "  columns kept out of capture ([source] exclude_columns or include_columns, not compared): {}",
                self.columns_excluded.join(", ")
            );
        }
        if !self.columns_only_in_silver.is_empty() {
            let _ = writeln!(
                out,
                "  columns in Silver but no longer in the source (not compared): {}",
                self.columns_only_in_silver.join(", ")
            );
        }
        if let Some(d) = &self.differences {
            if d.missing_in_silver + d.extra_in_silver + d.values_differ > 0 {
                let _ = writeln!(
                    out,
                    "  differing keys: {} missing in Silver, {} extra in Silver, {} with different values",
                    d.missing_in_silver, d.extra_in_silver, d.values_differ
                );
            }
        }
        let total = self.differences.as_ref().map_or(0, |d| {
            d.missing_in_silver + d.extra_in_silver + d.values_differ
        });
        if total > self.differing_keys.len() as u64 {
            let _ = writeln!(
                out,
                "  the first {} in key order (--max-keys):",
                self.differing_keys.len()
            );
        }
        for k in &self.differing_keys {
            let what = match k.difference {
                "missing_in_silver" => "missing in Silver".to_owned(),
                "extra_in_silver" => "extra in Silver".to_owned(),
                _ if k.columns.is_empty() => "values differ".to_owned(),
                _ => format!("values differ in {}", k.columns.join(", ")),
            };
            let _ = writeln!(out, "    key {}: {what}", k.key);
        }
    }
}

impl Report {
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(out, "source snapshot at LSN {}", self.lsn);
        for t in &self.tables {
            t.text(&mut out);
        }
        if !self.tables_not_in_silver.is_empty() {
            let _ = writeln!(
                out,
                "captured tables without a Silver table (not compared): {}",
                self.tables_not_in_silver.join(", ")
            );
        }
        if !self.tables_without_primary_key.is_empty() {
            let _ = writeln!(
                out,
                "not compared ({}): {}",
                crate::status::KEYLESS,
                self.tables_without_primary_key.join(", ")
            );
        }
        let compared = self.tables.iter().filter(|t| t.error.is_none()).count();
        let differing = self
            .tables
            .iter()
            .filter(|t| t.error.is_none() && !t.equal)
            .count();
        let failed = self.tables.len() - compared;
        let _ = writeln!(
            out,
            "{compared} table(s) compared, {differing} different, {failed} not compared"
        );
        out
    }
}
