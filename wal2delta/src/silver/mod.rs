//! The silver stage: Bronze → Silver, one round every `[silver] interval_ms`.
//!
//! Each round reads the transaction records once (END counts and watermarks above the
//! lowest Silver watermark), then applies every table in turn (`wal2delta_lake::silver`).
//! A table's failure is logged and counted, and the table is retried after its own
//! backoff; the other tables go on. A round that fails as a whole is handled by the
//! stage's [`Supervisor`]. Progress lives in the Silver tables' commits, so a killed stage
//! resumes where its last commit left off.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod lookups;
pub mod replay;
mod rules_edits;
mod rules_report;

use tokio::sync::watch;
use wal2delta_lake::rules::{RuleSource, RulesOutput, TableRules, UnappliedTables, Untagged};
use wal2delta_lake::silver::{SilverTable, TransactionCounts, TransactionLog};
use wal2delta_lake::{Lake, LakeError};

use crate::config::{Config, Policies};
use crate::events::{
    class_label, InternalEvent, QuarantineOpenCounted, SilverRowsQuarantined, SilverTableFailed,
    SilverTableHeld,
};
use crate::maintenance::{maintain_tables, Schedule};
use crate::metrics as m;
use crate::supervisor::{Next, OperatorErrors, Supervisor, TableNext, TableRetries};
use lookups::lookups_first;
use wal2delta_lake::Url;

/// `policies`: the masking and checks resolved against the source at startup
/// ([`crate::policies`]).
/// `rules`: the running rule set when rules are configured (evaluated in every round of
/// the tables they name, docs/rules.md).
pub async fn run(
    config: &Config,
    policies: Policies,
    rules: Option<RuleSource>,
    supervisor: Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(lake) = supervisor
        .writable_lake(&config.lake, &mut shutdown)
        .await?
    else {
        return Ok(());
    };
    // The rules' Kafka outputs (docs/rules.md): published before each round's commits.
    let output = match &rules {
        Some(_) => match crate::rules::output::from_config(config) {
            Ok(o) => o,
            Err(e) => {
                return supervisor.stop_now(&LakeError::Output {
                    output: "Kafka producer".into(),
                    table: "-".into(),
                    reason: e.to_string(),
                    transient: false,
                })
            }
        },
        None => None,
    };
    // A rules table's edits take effect at their own commit positions (rules_edits).
    let edits = match (&rules, config.rules.table_name()) {
        (Some(source), Some(table)) => Some(rules_edits::RulesEdits::new(table, source.clone())),
        _ => None,
    };
    let mut stage = Stage {
        config,
        policies: &policies,
        rules,
        edits,
        output,
        lake: &lake,
        supervisor: &supervisor,
        tables: HashMap::new(),
        watermarks: HashMap::new(),
        keyless: HashMap::new(),
        // An operator error of a table is about its own checks and policies: the other
        // tables go on.
        failing: TableRetries::new(OperatorErrors::HoldTheTable),
        held: lookups::Holds::default(),
        unapplied: UnappliedTables::default(),
        listed: None,
        transactions: TransactionLog::default(),
        more: false,
    };
    let every = Duration::from_millis(config.silver.interval_ms.max(10));
    tracing::info!("silver stage started");
    supervisor.started();
    let mut counted: Option<Instant> = None;
    let mut maintenance = Schedule::every_s(config.silver.maintenance_interval_s);
    loop {
        if *shutdown.borrow() {
            break;
        }
        let started = Instant::now();
        match stage.round().await {
            Ok(()) => supervisor.healthy(),
            Err(e) => match supervisor.failed(&e, &mut shutdown).await {
                Next::Retry => continue,
                Next::Shutdown => return Ok(()),
                Next::Stop(e) => return Err(e),
            },
        }
        if counted.is_none_or(|at| at.elapsed() >= Duration::from_secs(30)) {
            counted = Some(Instant::now());
            report_open_quarantine(&lake).await;
        }
        if maintenance.due() {
            stage.maintain().await;
        }
        // A table with more to apply at once (the next piece of a transaction applied in
        // pieces, a widened read window) does not wait for the interval.
        let rest = if std::mem::take(&mut stage.more) {
            Duration::ZERO
        } else {
            every.saturating_sub(started.elapsed())
        };
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(rest) => {}
        }
    }
    stage.flush_rules_hits().await;
    supervisor.stopped();
    tracing::info!("silver stage stopped");
    Ok(())
}

async fn report_open_quarantine(lake: &Lake) {
    match crate::quarantine::open_counts(lake).await {
        Ok(counts) => {
            for stage in ["bronze", "silver"] {
                let open = counts.get(stage).copied().unwrap_or(0);
                QuarantineOpenCounted { stage, open }.emit();
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot count open quarantine records"),
    }
}

/// The stage's working state between rounds.
struct Stage<'a> {
    config: &'a Config,
    policies: &'a Policies,
    rules: Option<RuleSource>,
    /// The rules table, when the rules come from one.
    edits: Option<rules_edits::RulesEdits>,
    /// Where the rules publish their rounds (`[rules] transitions_topic`, `filter_topic`).
    output: Option<Arc<dyn RulesOutput>>,
    lake: &'a Lake,
    supervisor: &'a Supervisor,
    tables: HashMap<String, Tracked>,
    watermarks: HashMap<String, i64>,
    /// Bronze tables without a `key` column, and when they were last looked at.
    keyless: HashMap<String, Instant>,
    /// Tables whose last open or round failed: retried after their own backoff.
    failing: TableRetries,
    /// Tables held for the tables their rules look up ([`lookups::Holds`]).
    held: lookups::Holds,
    /// The looked-up tables' unapplied changes, read after each one's round this round
    /// (what their readers' lookups see beyond their Silver rows).
    unapplied: UnappliedTables,
    /// The Bronze tables as last listed, and when ([`LIST_EVERY`]).
    listed: Option<(Instant, Vec<BronzeTable>)>,
    /// The transaction records, kept open between rounds.
    transactions: TransactionLog,
    /// A round of this pass said another round at once gets further.
    more: bool,
}

impl Stage<'_> {
    /// The Bronze tables, listed again at most every [`LIST_EVERY`]: on object storage a
    /// listing is several billed requests per table, and a round runs every 2 s.
    async fn bronze_tables(&mut self) -> Result<Vec<BronzeTable>, LakeError> {
        if let Some((at, tables)) = &self.listed {
            if at.elapsed() < LIST_EVERY {
                return Ok(tables.clone());
            }
        }
        let tables = self.lake.bronze_tables().await?;
        self.listed = Some((Instant::now(), tables.clone()));
        Ok(tables)
    }

    /// Compacts and checkpoints the Silver tables the stage works on, their tombstones,
    /// the quarantine tables and, with rules, `rules/transitions` and `rules/hits` (see
    /// [`crate::maintenance`]): between rounds, never beside a MERGE of the same table.
    /// `rules/transitions` gains a file in every round with transitions, and every append
    /// refreshes it at a cost that grows with its files.
    async fn maintain(&self) {
        let target = self.config.silver.target_file_bytes;
        let mut silver = Vec::new();
        for name in self.tables.keys() {
            let Some((schema, table)) = name.split_once('.') else {
                continue;
            };
            silver.push((name.clone(), self.lake.silver(schema, table)));
            silver.push((
                format!("{name} (tombstones)"),
                self.lake.silver_tombstones(schema, table),
            ));
        }
        silver.sort();
        let retention = self.config.lake.log_retention();
        maintain_tables("silver", silver, target, retention).await;
        let quarantine = vec![
            ("records".to_owned(), self.lake.quarantine_records()),
            ("resolutions".to_owned(), self.lake.quarantine_resolutions()),
        ];
        maintain_tables("quarantine", quarantine, target, retention).await;
        if self.rules.is_some() {
            let rules = vec![
                ("transitions".to_owned(), self.lake.rules_transitions()),
                ("hits".to_owned(), self.lake.rules_hits()),
            ];
            // Never beside a rules/hits MERGE: the compaction's commit would fail it.
            let _paused = wal2delta_lake::rules::hits_commits_paused().await;
            maintain_tables("rules", rules, target, retention).await;
        }
    }

    /// On a clean stop: commits each table's pending `rules/hits` changes, so the lake's
    /// hits are current while the daemon is down (a failure is only logged: the next
    /// start rolls them forward from the transitions).
    async fn flush_rules_hits(&mut self) {
        for (name, t) in &mut self.tables {
            if let Err(e) = t.table.flush_hooks().await {
                tracing::warn!(table = %name, error = %e, "could not commit rules/hits at stop; the next start rolls it forward from rules/transitions");
            }
        }
    }
}

/// What a table's round did, as the rules table's follower needs it.
pub(super) struct Applied {
    /// The Silver version it committed.
    pub version: Option<u64>,
    /// The Bronze rows it read.
    pub read: usize,
}

/// A Silver table the stage works on, and when its tombstones were last pruned.
struct Tracked {
    table: SilverTable,
    pruned: Option<Instant>,
}

const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// A Bronze table as listed: schema and table identity parts, and its URL.
type BronzeTable = (String, String, url::Url);

/// How long a listing of the Bronze tables is used before the lake is listed again: a
/// new table waits at most this long for its first Silver round.
const LIST_EVERY: Duration = Duration::from_secs(10);

/// How often a Bronze table without a `key` column is looked at again (it gains one when
/// its source table gains a primary key).
const KEYLESS_RECHECK: Duration = Duration::from_secs(60);

/// The Silver table of `schema.table` (identity parts, as in the lake) with its masking
/// and checks.
pub fn silver_table(
    config: &Config,
    policies: &Policies,
    lake: &Lake,
    schema: &str,
    table: &str,
) -> SilverTable {
    let policy = policies.of(&format!("{schema}.{table}"));
    SilverTable::new(lake, schema, table, config.silver.max_rows_per_partition)
        // Without rules, its commits say so: rules started later backfill it.
        .with_hooks(vec![Box::new(Untagged::new(&format!("{schema}.{table}")))])
        .with_policy(policy.masking, policy.checks)
        .with_file_size(config.silver.target_file_bytes)
        .with_atomic_limit(config.silver.max_atomic_transaction_rows)
}

/// Opens a table for the stage. When the masking its last commit recorded differs from
/// the config, the table is rebuilt from Bronze under the new policies and the files of
/// earlier versions are deleted, so no file keeps values masked the old way.
async fn open_table(
    config: &Config,
    policies: &Policies,
    lake: &Lake,
    schema: &str,
    table: &str,
) -> Result<SilverTable, LakeError> {
    let mut t = silver_table(config, policies, lake, schema, table);
    let wanted = t.masking_description();
    let recorded = t.recorded_masking().await?;
    let exists = t.progress().await? != Default::default();
    let empty = serde_json::json!({});
    if exists && recorded.as_ref().unwrap_or(&empty) != &wanted {
        tracing::warn!(table = %t.name(), from = %recorded.unwrap_or(empty), to = %wanted, "masking policy changed: rebuilding the Silver table from Bronze");
        let r = t.rebuild(lake, schema, table).await?;
        let purged = t.purge_history().await?;
        tracing::info!(table = %t.name(), rows = r.rows, version = ?r.version, files_deleted = purged, "Silver table rebuilt under the new masking policy");
    }
    Ok(t)
}

impl Stage<'_> {
    /// Applies every Bronze table once.
    async fn round(&mut self) -> Result<(), LakeError> {
        let mut names = Vec::new();
        for (schema, table, url) in self.bronze_tables().await? {
            let name = format!("{schema}.{table}");
            if self.failing.waiting(&name) {
                continue;
            }
            if !self.tables.contains_key(&name) && !self.open(&name, &schema, &table, &url).await? {
                continue;
            }
            names.push(name);
        }
        if names.is_empty() {
            return Ok(());
        }
        let lowest = names
            .iter()
            .filter_map(|n| self.watermarks.get(n))
            .copied()
            .min()
            .unwrap_or(0);
        let started = Instant::now();
        let (top, counts_all) = self.transactions.counts(self.lake, lowest).await?;
        let counts = &counts_all;
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            "transaction counts read"
        );
        let targets = self
            .rules
            .as_ref()
            .map(|r| r.lookup_targets(lowest))
            .unwrap_or_default();
        // Per looked-up table, the tables whose rules look it up.
        let mut readers: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (t, related) in &targets {
            for r in related.iter().filter(|r| *r != t) {
                readers.entry(r.clone()).or_default().insert(t.clone());
            }
        }
        let mut order = lookups_first(names, &targets);
        let rules_table = self.edits.as_ref().map(|e| e.name().to_owned());
        // The rules table first: the edits it records this round hold the others.
        if let Some(i) = order.iter().position(|n| Some(n) == rules_table.as_ref()) {
            let r = order.remove(i);
            order.insert(0, r);
        }
        for name in order {
            let counts = counts.get(&name).cloned().unwrap_or(TransactionCounts {
                top,
                ..TransactionCounts::default()
            });
            let asked = counts.top;
            let watermark = self.watermarks.get(&name).copied().unwrap_or(0);
            if Some(&name) == rules_table.as_ref() {
                if !self.sync_rules(watermark).await {
                    continue;
                }
                let counts = self
                    .edits
                    .as_ref()
                    .map_or(counts.clone(), |e| e.cap(counts, watermark));
                let applied = self.apply(&name, &counts).await;
                self.go_on_if_stopped(&name, watermark, counts.top, asked);
                if let (Some(e), Some(r)) = (self.edits.as_mut(), applied) {
                    e.applied(r);
                }
                let watermark = self.watermarks.get(&name).copied().unwrap_or(0);
                self.sync_rules(watermark).await;
                continue;
            }
            let (counts, hold) = match (&self.edits, &rules_table) {
                (Some(e), Some(r)) => (
                    e.edit_cap(counts, watermark),
                    e.hold_at(self.watermarks.get(r).copied(), counts_all.get(r.as_str())),
                ),
                _ => (counts, None),
            };
            let stop = counts.top;
            // As far as the tables its rules look up have their changes known (applied, or
            // read unapplied this round), and the tables looking it up have applied its
            // changes' positions.
            let unapplied = &self.unapplied;
            let related = targets
                .get(&name)
                .into_iter()
                .flatten()
                .filter(|t| **t != name)
                .filter_map(|t| {
                    let watermark = *self.watermarks.get(t)?;
                    let reach = unapplied
                        .get(t)
                        .filter(|u| u.from == watermark)
                        .map(|u| u.reach);
                    Some((watermark, counts_all.get(t.as_str()), reach))
                });
            let looked_up_by = readers.get(&name);
            // A table looking this one up that is not open yet (its Bronze table not
            // listed yet) while the records hold changes of it has applied none of them:
            // this table waits where it is, or the reader's first lookups would see
            // related rows newer than their commits. The Bronze tables are listed again
            // at once.
            let unopened = looked_up_by.into_iter().flatten().any(|t| {
                !self.watermarks.contains_key(t)
                    && !self.keyless.contains_key(t)
                    && counts_all
                        .get(t.as_str())
                        .is_some_and(|c| !c.events.is_empty())
            });
            if unopened {
                self.listed = None;
            }
            let reader_watermarks = looked_up_by
                .into_iter()
                .flatten()
                .filter_map(|t| self.watermarks.get(t).copied())
                .chain(unopened.then(|| watermark.saturating_sub(1)));
            let (lookup, looked_up) = (
                lookups::lookup_cap(related),
                lookups::looked_up_cap(counts_all.get(name.as_str()), reader_watermarks),
            );
            let looked_up_by = looked_up_by.is_some();
            // What holds a table back, for an operator asking why it does not move.
            tracing::debug!(table = %name, watermark, records_top = asked, edit_stop = stop, rules_table_at = ?hold, lookup_cap = ?lookup, looked_up_cap = ?looked_up, "round caps");
            let cap = [hold, lookup, looked_up].into_iter().flatten().min();
            let counts = self.hold_for_lookups(&name, counts, cap);
            self.apply(&name, &counts).await;
            self.go_on_if_stopped(&name, watermark, stop.min(counts.top), asked);
            if looked_up_by {
                self.read_unapplied(&name, counts_all.get(name.as_str()))
                    .await;
            }
        }
        Ok(())
    }

    /// Reads looked-up table `name`'s unapplied changes for the tables looking it up,
    /// which follow it in this round ([`wal2delta_lake::silver::Unapplied`]). When they
    /// cannot be read, those tables go in lock-step with it (one of its changes a round).
    async fn read_unapplied(&mut self, name: &str, counts: Option<&TransactionCounts>) {
        let Some(t) = self.tables.get_mut(name) else {
            self.unapplied.set(name, None);
            return;
        };
        let counts = counts.cloned().unwrap_or_default();
        match t.table.unapplied(&counts).await {
            Ok(u) => self.unapplied.set(name, u),
            Err(e) => {
                tracing::debug!(table = %name, error = %e, "cannot read the unapplied changes of a looked-up table; the tables looking it up go in lock-step with it this round");
                self.unapplied.set(name, None);
            }
        }
    }

    /// A table stopped at `stop` below the records' top `asked` (at an edit of the rules,
    /// in lock-step with a looked-up table, or the rules table after one transaction) that
    /// moved from `before` and reached it goes on in a round at once, not after the
    /// interval. (One that did not move waits: what it waits for did not move either.)
    fn go_on_if_stopped(&mut self, name: &str, before: i64, stop: i64, asked: i64) {
        let now = self.watermarks.get(name).copied();
        if stop < asked && now == Some(stop) && stop > before {
            self.more = true;
        }
    }

    /// Records the rules table's last change ([`rules_edits::RulesEdits::sync`]) when it
    /// may have changed; `false` when that failed (the rules table then waits).
    async fn sync_rules(&mut self, watermark: i64) -> bool {
        let Some(e) = self.edits.as_mut() else {
            return true;
        };
        match e.sync(self.lake, watermark).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(error = %format!("{err:#}"), "cannot record the rules table's rules; the rules table waits (the tables it holds stop at its watermark), retried next round");
                false
            }
        }
    }

    /// `counts` held at `cap`: in lock-step with the tables of its lookups and the tables
    /// looking it up, and at the rules table's position ([`lookups::hold`]); a hold past
    /// `[rules] lookup_timeout_ms` is counted and logged, and the changes go on.
    fn hold_for_lookups(
        &mut self,
        name: &str,
        counts: TransactionCounts,
        cap: Option<i64>,
    ) -> TransactionCounts {
        let before = self.watermarks.get(name).copied().unwrap_or(0);
        let d = self.held.decide(
            name,
            cap,
            before,
            counts,
            self.config.rules.lookup_timeout(),
            Instant::now(),
        );
        if let Some(waited) = d.released_after {
            metrics::counter!(m::RULES_LOOKUP_TIMEOUTS, "table" => name.to_owned()).increment(1);
            tracing::warn!(table = %name, related_watermark = cap.unwrap_or_default(), waited_ms = waited.as_millis() as u64, "a table this table waits for (a table its rules look up, one whose rules look it up, or the rules table) is behind past [rules] lookup_timeout_ms: applying the changes until it catches up; lookups meanwhile see the related rows as they are (counted as stale or newer)");
        }
        d.counts
    }

    /// Starts working on a Bronze table: `false` when Silver does not hold it (no primary
    /// key) or it cannot be opened yet.
    async fn open(
        &mut self,
        name: &str,
        schema: &str,
        table: &str,
        url: &Url,
    ) -> Result<bool, LakeError> {
        // Silver merges by primary key: a table without one (its Bronze rows have no `key`)
        // is kept in Bronze only, as append-only history.
        if self
            .keyless
            .get(name)
            .is_some_and(|at| at.elapsed() < KEYLESS_RECHECK)
        {
            return Ok(false);
        }
        match wal2delta_lake::bronze::BronzeTable::has_key_at(name, url).await {
            Ok(Some(false)) => {
                if self
                    .keyless
                    .insert(name.to_owned(), Instant::now())
                    .is_none()
                {
                    tracing::info!(table = %name, "no primary key: the table is kept in Bronze only (append-only history); Silver does not hold it");
                }
                return Ok(false);
            }
            Ok(_) => {
                self.keyless.remove(name);
            }
            // A table this binary must not use (another lake format): held with the fix,
            // shown in `failing_tables`, not retried silently every round.
            Err(e) if e.class() == wal2delta_model::ErrorClass::Operator => {
                self.table_failed(name, "operator", &e);
                return Ok(false);
            }
            Err(e) => {
                tracing::warn!(table = %name, error = %e, "cannot read the Bronze table's schema; retrying next round");
                return Ok(false);
            }
        }
        let t = match open_table(self.config, self.policies, self.lake, schema, table).await {
            Ok(t) => match &self.rules {
                Some(rules) => {
                    let mut r = TableRules::new(self.lake, name, rules.clone())
                        .with_hits_interval(self.config.rules.hits_interval())
                        .with_eval_budget(self.config.rules.max_eval_per_row())
                        .with_observer(rules_report::observer())
                        .with_unapplied(self.unapplied.clone());
                    if let Some(o) = &self.output {
                        r = r.with_output(o.clone());
                    }
                    t.with_hooks(vec![Box::new(r)])
                }
                None => t,
            },
            Err(e) => {
                // Counted as `operator` whatever its class: the table cannot be held under
                // its policy.
                self.table_failed(name, "operator", &e);
                return Ok(false);
            }
        };
        SilverTableHeld { table: name }.emit();
        self.watermarks
            .insert(name.to_owned(), t.progress().await?.watermark);
        self.tables.insert(
            name.to_owned(),
            Tracked {
                table: t,
                pruned: None,
            },
        );
        Ok(true)
    }

    /// One round of one table; a failure is the table's own (retried after its backoff).
    /// `Some(report)` when the round went through.
    async fn apply(&mut self, name: &str, counts: &TransactionCounts) -> Option<Applied> {
        let tracked = self.tables.get_mut(name)?;
        if tracked.pruned.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            let retention =
                Duration::from_secs(self.config.silver.tombstone_retention_hours * 3600);
            // Once an hour, whether it works or not (a failure is retried an hour later).
            tracked.pruned = Some(Instant::now());
            match tracked.table.prune_tombstones(retention).await {
                Ok(n) if n > 0 => {
                    tracing::info!(table = %name, tombstones = n, "pruned tombstones past the retention")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(table = %name, error = %e, "pruning tombstones failed; retrying in an hour")
                }
            }
        }
        let started = Instant::now();
        match tracked.table.apply(counts).await {
            Ok(r) => {
                self.watermarks.insert(name.to_owned(), r.watermark);
                self.more |= r.again || (r.partial.is_some() && r.version.is_some());
                report_applied(name, &r, started);
                if self.failing.succeeded(self.supervisor, name) {
                    tracing::info!(table = %name, "Silver table merging again");
                }
                Some(Applied {
                    version: r.version,
                    read: r.read,
                })
            }
            Err(e) => {
                self.table_failed(name, class_label(e.class()), &e);
                None
            }
        }
    }

    /// A table failed (`class` is its metric label): it waits for its own backoff; the
    /// other tables go on.
    fn table_failed(&mut self, name: &str, class: &'static str, error: &LakeError) {
        let retry_in = match self.failing.failed(self.supervisor, name, name, error) {
            TableNext::RetryIn(wait) => wait,
            // Silver holds its tables (`OperatorErrors::HoldTheTable`).
            TableNext::StopTheStage => return,
        };
        SilverTableFailed {
            table: name,
            class,
            error,
            retry_in,
        }
        .emit();
    }
}

/// The metrics of one applied round of a table.
fn report_applied(name: &str, r: &wal2delta_lake::silver::ApplyReport, started: Instant) {
    let name = name.to_owned();
    metrics::counter!(m::SILVER_UPSERTS, "table" => name.clone()).increment(r.upserts as u64);
    metrics::counter!(m::SILVER_DELETES, "table" => name.clone()).increment(r.deletes as u64);
    metrics::counter!(m::SILVER_ROWS_COPIED, "table" => name.clone())
        .increment(r.rewritten.copied as u64);
    metrics::counter!(m::SILVER_FILES_REWRITTEN, "table" => name.clone())
        .increment(r.rewritten.files as u64);
    metrics::gauge!(m::SILVER_WATERMARK_LSN, "table" => name.clone()).set(r.watermark as f64);
    metrics::gauge!(m::SILVER_WAITING_TRANSACTIONS, "table" => name.clone()).set(r.waiting as f64);
    metrics::counter!(m::SILVER_DUPLICATES, "table" => name.clone()).increment(r.stale as u64);
    if !r.widened.is_empty() {
        metrics::counter!(m::TYPE_WIDENINGS, "layer" => "silver", "table" => name.clone())
            .increment(1);
    }
    if r.quarantined > 0 {
        SilverRowsQuarantined {
            table: &name,
            rows: r.quarantined as u64,
        }
        .emit();
    }
    metrics::histogram!(m::SILVER_ROUND_SECONDS, "table" => name.clone())
        .record(started.elapsed().as_secs_f64());
    if let Some(v) = r.version {
        let s = &r.steps;
        tracing::debug!(table = %name, version = v, read = r.read, upserts = r.upserts, deletes = r.deletes, waiting = r.waiting, watermark = r.watermark,
            files_rewritten = r.rewritten.files, rows_copied = r.rewritten.copied,
            open_ms = s.open.as_millis() as u64, progress_ms = s.progress.as_millis() as u64, bronze_ms = s.bronze.as_millis() as u64, read_ms = s.read.as_millis() as u64, plan_ms = s.plan.as_millis() as u64,
            screen_ms = s.screen.as_millis() as u64, hooks_ms = s.hooks.as_millis() as u64, write_ms = s.write.as_millis() as u64, "silver commit");
    }
}
