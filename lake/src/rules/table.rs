//! The rules of one Silver table, evaluated inside its rounds.
//!
//! Rules see what Silver stores (masked, TOAST values filled) and exactly the changes a
//! Silver round applies, so they run in the round, between the fold and the Silver commit
//! ([`crate::silver::SilverTable::apply`]): per source transaction, the state of every
//! changed key ([`crate::silver::versions`]) is evaluated against every rule at once and
//! compared with the key's hits ([`super::walk`]). The transitions are appended before
//! the Silver commit, which records their seq, and `rules/hits` follows every
//! `hits_interval`; see [`super::store`] for why a crash anywhere repeats nothing and
//! loses nothing.
//!
//! A new, changed or removed rule (and the first round after a start, and a Silver table
//! rebuilt under the rules) is a backfill: the rules are evaluated over every current
//! Silver row and the result compared with the hits, at the Silver watermark.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deltalake::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, SchemaRef};
use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use wal2delta_model::ChangeOp;
use wal2delta_quarantine::QuarantineRecord;

use super::evaluate::{key_json, rows_json, value_schema, with_column};
use super::output::{FilterEvent, RulesOutput, RulesRound};
use super::store::{changes_of, Loaded, Origin, RulesStore};
use super::walk::{walk_pieces, Event, KeyHits, OpenTx, Transition, What};
use super::{compile_with, Evaluator, Related, Rule, RuleError, RuleSource};
use crate::delta;
use crate::silver::{versions, BronzeRows, Position, Progress, COMMIT_LSN, COMMIT_TS, OP, ORDINAL};
use crate::stopwatch::Stopwatch;
use crate::LakeError;

/// What the rules did in one round.
#[derive(Debug, Clone, Default)]
pub struct RulesReport {
    /// Row versions evaluated, and rules evaluated on each.
    pub rows: usize,
    pub rules: usize,
    /// Transitions per rule id.
    pub transitions: BTreeMap<String, usize>,
    /// Rows whose evaluation failed, per rule id (quarantined; counted as no hit).
    pub errors: BTreeMap<String, usize>,
    pub quarantined: Vec<QuarantineRecord>,
    pub eval_time: Duration,
    /// Per rule id, the time its condition took over the round's rows (phase one and, with
    /// lookups, phase two; casts shared between rules are in no rule's time).
    pub rule_time: BTreeMap<String, Duration>,
    /// Per rule id, the time its condition took over the round's rows (phase one only:
    /// what its budget is judged on, [`super::budget`]).
    pub condition_time: BTreeMap<String, Duration>,
    /// The rules this round disabled, past their budget ([`super::budget`]).
    pub disabled: Vec<RuleError>,
    /// A backfill ran (a rule set installed).
    pub backfill: bool,
    /// The rules that could not be compiled against the table (skipped).
    pub invalid: Vec<RuleError>,
    /// The newest source commit time among the transitions (for the rules lag).
    pub newest_commit_ts: Option<i64>,
    /// Early filter: the change events of the stream the round saw (row versions,
    /// deletes included, the covered ones not), and those that matched a rule and were
    /// published. Both 0 when no output takes filter events.
    pub filter_in: usize,
    pub filter_out: usize,
    /// Lookups (docs/rules.md, "Lookups"): rows looked up in a related table (per row and
    /// related table), rows whose own conditions failed so no lookup was needed, and rows
    /// looked up while the related table's watermark was behind their commit; and rows
    /// whose related row had changed again after their commit (per rule and lookup).
    pub lookups: usize,
    pub lookups_avoided: usize,
    pub lookups_stale: usize,
    pub lookups_newer: usize,
    /// Where a streamed round spent its time.
    pub steps: RulesSteps,
}

/// Where one streamed round of rules spent its time (logged at debug with the Silver
/// round's steps). Steps a round did not reach stay zero.
#[derive(Debug, Clone, Copy, Default)]
pub struct RulesSteps {
    /// The round's row versions, and the Silver values of their unchanged (TOASTed)
    /// columns or a snapshot's tombstones.
    pub settle: Duration,
    /// The active rules compiled, or checked against the table's and the looked-up
    /// tables' schemas.
    pub compile: Duration,
    /// Every rule over the row versions, lookups included.
    pub evaluate: Duration,
    /// The keys, the events and the walk to transitions.
    pub walk: Duration,
    /// Publishing to the Kafka outputs.
    pub publish: Duration,
    /// Appending to `rules/transitions`.
    pub append: Duration,
    /// Gathering the hits changes for `rules/hits`, and starting its commit beside the
    /// rounds when due ([`TableRules::flush_hits`]).
    pub hits: Duration,
}

/// How a round starts.
pub struct Start {
    /// Changes at or below this progress are tagged already (a round repeated after a
    /// crash between the transitions commit and the Silver commit).
    pub covered: Option<Progress>,
    pub report: Option<RulesReport>,
}

/// The rules a table's evaluator was built from, the schemas (its own and the looked-up
/// tables'), the evaluator and the rules
/// that could not be compiled.
type Compiled = (
    Vec<Rule>,
    SchemaRef,
    Related,
    Arc<Evaluator>,
    Vec<RuleError>,
);

/// A `rules/hits` commit running beside the rounds.
struct Committing {
    task: tokio::task::JoinHandle<Result<(), LakeError>>,
    /// The seq it records.
    seq: i64,
    changes: usize,
    started: Instant,
}

pub struct TableRules {
    pub(super) name: String,
    /// Where the related tables of lookups are read.
    pub(super) lake: crate::Lake,
    pub(super) source: RuleSource,
    pub(super) store: RulesStore,
    pub(super) state: Option<Loaded>,
    /// The rules the hits reflect (`None` until the first backfill after a load).
    pub(super) installed: Option<Vec<Rule>>,
    /// The rule set of the round under way, read once at its start ([`Self::start`]): an
    /// edit that lands during the round waits for the next one, whose start backfills it,
    /// so no round evaluates rules that were never backfilled.
    round_rules: Option<Vec<Rule>>,
    /// The next backfill compares every rule even when the hits were built with the same
    /// rule set (rows changed, or were tagged, without some rule).
    force_backfill: bool,
    compiled: Option<Compiled>,
    /// The Silver tables the rules look up, kept open between rounds.
    pub(super) related: super::related::RelatedTables,
    /// The looked-up tables' unapplied changes, as the silver stage reads them
    /// ([`super::lookup::UnappliedTables`]).
    pub(super) unapplied: super::lookup::UnappliedTables,
    /// Where each round is published before its commits ([`super::output`]).
    pub(super) output: Option<Arc<dyn RulesOutput>>,
    /// Told what each round did ([`super::hook`]).
    pub(super) observer: Option<super::hook::RulesObserver>,
    /// The table's primary-key columns (Silver's names), as the last round gave them.
    pub(super) keys: Vec<String>,
    /// How often `rules/hits` is committed ([`super::store`]); zero: every round.
    hits_interval: Duration,
    /// The hits changes of the rounds appended since the last `rules/hits` commit, the
    /// last change per (key, rule), and when the first of them was appended.
    pending: BTreeMap<(String, String), super::store::Hit>,
    pending_since: Option<Instant>,
    /// The seq of the backfill whose changes are among those pending.
    pub(super) pending_backfill: Option<i64>,
    /// The `rules/hits` commit running beside the rounds, and the seq it records.
    committing: Option<Committing>,
    /// A source transaction Silver applies in pieces whose last piece has not come yet
    /// ([`super::walk::OpenTx`]; rebuilt from Silver after a restart, [`super::pieces`]).
    pub(super) open: Option<OpenTx>,
    /// The rules disabled past their evaluation budget ([`super::budget`]).
    pub(super) budget: super::budget::Budget,
}

/// The default `[rules] hits_interval_ms`: `rules/hits` trails `rules/transitions` by a
/// few seconds, and its MERGE (which rewrites every hits file a round touches) runs once
/// per interval, not once per Silver round.
pub const DEFAULT_HITS_INTERVAL: Duration = Duration::from_secs(5);

/// Pending hits changes that force a `rules/hits` commit before the interval ends (memory:
/// about 100 bytes each).
const MAX_PENDING: usize = 250_000;

/// The Silver `txn` app id recording the rules seq a Silver commit follows.
fn silver_app(table: &str) -> String {
    format!("wal2delta-silver/{table}/rules")
}

/// The `txn` action of a Silver commit written without rules: -1, which no rules seq
/// equals, so rules started later backfill instead of trusting a seq from before.
pub(super) fn untagged_silver_txn(table: &str) -> Transaction {
    Transaction::new(silver_app(table), -1)
}

impl TableRules {
    pub fn new(lake: &crate::Lake, table: &str, source: RuleSource) -> Self {
        TableRules {
            name: table.to_owned(),
            lake: lake.clone(),
            source,
            store: RulesStore::new(lake),
            state: None,
            installed: None,
            round_rules: None,
            force_backfill: false,
            compiled: None,
            related: Default::default(),
            unapplied: Default::default(),
            output: None,
            observer: None,
            keys: Vec::new(),
            hits_interval: DEFAULT_HITS_INTERVAL,
            open: None,
            pending: BTreeMap::new(),
            pending_since: None,
            pending_backfill: None,
            committing: None,
            budget: Default::default(),
        }
    }

    /// Has the lookups see the looked-up tables' unapplied changes in `unapplied` (the
    /// silver stage's; without it a lookup sees the related Silver rows alone).
    pub fn with_unapplied(mut self, unapplied: super::lookup::UnappliedTables) -> Self {
        self.unapplied = unapplied;
        self
    }

    /// Disables a rule whose condition costs more than `per_row` per row
    /// ([`super::budget`]); default [`super::DEFAULT_MAX_EVAL_PER_ROW`].
    pub fn with_eval_budget(mut self, per_row: Duration) -> Self {
        self.budget = super::budget::Budget::new(per_row);
        self
    }

    /// Commits `rules/hits` at most every `interval` ([`super::store`]); zero: every round.
    pub fn with_hits_interval(mut self, interval: Duration) -> Self {
        self.hits_interval = interval;
        self
    }

    /// Adds a round's hits changes (appended as the state's seq) to those pending.
    pub(super) fn add_pending(&mut self, changes: Vec<super::store::HitChange>) {
        if changes.is_empty() {
            return;
        }
        self.pending_since.get_or_insert_with(Instant::now);
        for (key, rule, hit) in changes {
            self.pending.insert((key, rule), hit);
        }
    }

    /// Commits the pending hits changes to `rules/hits` when `force`, when the interval
    /// has passed since the first of them, or when there are many.
    ///
    /// The commit runs in a task of its own, and unless `force` the call does not wait
    /// for it: a MERGE rewrites every hits file the changes touch, and the rounds need
    /// not wait for it, because nothing reads `rules/hits` without rolling it forward
    /// with the transitions of later seqs ([`super::store`]). One runs at a time; the
    /// next call takes its outcome. A failed commit resets the state, so the next round
    /// loads it again and the changes that commit carried are rolled forward from the
    /// transitions.
    pub async fn flush_hits(&mut self, force: bool) -> Result<(), LakeError> {
        // Many changes pending wait for the running commit rather than grow.
        self.committed(force || self.pending.len() >= MAX_PENDING)
            .await?;
        let due = self
            .pending_since
            .is_some_and(|s| s.elapsed() >= self.hits_interval)
            || self.pending.len() >= MAX_PENDING;
        if self.pending.is_empty() || !(force || due) || self.committing.is_some() {
            return Ok(());
        }
        let Some(state) = self.state.as_ref() else {
            return Ok(());
        };
        let changes: Vec<_> = std::mem::take(&mut self.pending)
            .into_iter()
            .map(|((key, rule), hit)| (key, rule, hit))
            .collect();
        self.pending_since = None;
        let (seq, n) = (state.seq, changes.len());
        let backfill = self.pending_backfill.take();
        self.committing = Some(Committing {
            task: tokio::spawn(self.store.merge_hits(&self.name, seq, changes, backfill)),
            seq,
            changes: n,
            started: Instant::now(),
        });
        if force {
            self.committed(true).await?;
        }
        Ok(())
    }

    /// Takes the outcome of the `rules/hits` commit running beside the rounds, if it
    /// finished (waiting for it when `wait`).
    async fn committed(&mut self, wait: bool) -> Result<(), LakeError> {
        let Some(c) = self.committing.take() else {
            return Ok(());
        };
        if !wait && !c.task.is_finished() {
            self.committing = Some(c);
            return Ok(());
        }
        // A commit that panicked or was cancelled is retried like a failed one.
        let outcome = c.task.await.unwrap_or_else(|e| {
            Err(LakeError::delta(&"rules/hits")(
                deltalake::DeltaTableError::Generic(format!("the commit did not finish: {e}")),
            ))
        });
        match outcome {
            Ok(()) => {
                tracing::debug!(
                    table = %self.name,
                    seq = c.seq,
                    changes = c.changes,
                    // Until this round saw it finish: an upper bound.
                    ms = c.started.elapsed().as_millis() as u64,
                    "rules/hits committed beside the rounds"
                );
                if let Some(s) = self.state.as_mut() {
                    s.hits_seq = s.hits_seq.max(c.seq);
                }
                Ok(())
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    /// Tells `observer` what each round did (the daemon's metrics and logs).
    pub fn with_observer(mut self, observer: super::hook::RulesObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Publishes every round to `output` before committing it ([`super::output`]).
    pub fn with_output(mut self, output: Arc<dyn RulesOutput>) -> Self {
        self.output = Some(output);
        self
    }

    /// Publishes a round to the output, if any; must come before the round's commits.
    pub(super) async fn publish(
        &self,
        origin: Origin,
        seq: i64,
        transitions: &[Transition],
        events: &[FilterEvent],
    ) -> Result<(), LakeError> {
        let Some(out) = &self.output else {
            return Ok(());
        };
        if transitions.is_empty() && events.is_empty() {
            return Ok(());
        }
        out.publish(RulesRound {
            table: &self.name,
            origin,
            seq,
            transitions,
            events,
        })
        .await
    }

    /// The `txn` action the round's Silver commit carries.
    pub fn silver_txn(&self) -> Option<Transaction> {
        let seq = self.state.as_ref()?.seq;
        Some(Transaction::new(silver_app(&self.name), seq))
    }

    /// Forgets the loaded state (after a failure: the next round loads it again, the
    /// pending hits changes rolled forward from the transitions).
    pub fn reset(&mut self) {
        self.forget_tables();
        self.state = None;
        self.open = None;
        self.pending.clear();
        self.pending_since = None;
        self.pending_backfill = None;
        // A `rules/hits` commit still running is kept: the next load waits for it
        // ([`Self::start`]).
    }

    /// Drops the tables kept open between rounds (after a failed round: a table removed
    /// and made again meanwhile must be opened afresh, [`delta::Kept`]).
    pub fn forget_tables(&mut self) {
        self.related.forget();
        self.store.forget();
    }

    /// The next round compares every rule with every Silver row (after a re-snapshot
    /// removed the rows the source no longer has).
    pub fn backfill_next(&mut self) {
        self.installed = None;
        self.force_backfill = true;
    }

    /// Called at the start of a round with the Silver table as it is before the round:
    /// loads the state, and backfills when the rule set changed.
    pub async fn start(
        &mut self,
        silver: Option<&DeltaTable>,
        before: &Progress,
        keys: &[String],
    ) -> Result<Start, LakeError> {
        // The version in effect for the changes after the table's watermark: the silver
        // stage stops a table's rounds at each edit's position (super::source), so a
        // backfill of an edit runs with Silver as it is at the edit.
        let desired = self.source.at(&self.name, before.watermark);
        self.round_rules = Some(desired.clone());
        if self.state.is_none() {
            // A commit left running by a reset ends first, whatever its outcome: the load
            // must see it, or its older changes could land over the roll-forward.
            if let Err(e) = self.committed(true).await {
                tracing::debug!(table = %self.name, error = %e, "a rules/hits commit left running failed; rolling forward");
            }
            let loaded = self.store.load(&self.name).await?;
            let backfill_pending = loaded.backfill_pending;
            self.state = Some(loaded);
            self.installed = None;
            if backfill_pending {
                // A backfill whose rule-version changes never reached `rules/hits`
                // (a crash, or a failed hits commit, between its transitions and that
                // commit): do it again, whatever the recorded rule set says.
                tracing::info!(table = %self.name, "the last backfill's rules/hits commit is missing: backfilling again");
                self.backfill_next();
            }
        }
        if !keys.is_empty() {
            self.keys = keys.to_vec();
        }
        // Every round, with or without changes: a table that goes quiet still gets its
        // hits committed once the interval has passed.
        self.flush_hits(false).await?;
        let t_seq = self.state.as_ref().map_or(0, |s| s.seq);
        // A Silver table that does not exist yet follows seq 0: when the rules committed
        // seq 1 and the round's first Silver commit did not happen, the repeated round
        // skips what they covered like any other. So does one that exists but has applied
        // nothing: the first round creates it empty (a commit of its own, without any
        // `txn`) before its data commit, and a crash between the two leaves it so; taken
        // as rebuilt, it would make a backfill over no rows untag every hit.
        let s_seq = match silver {
            Some(s) => match delta::txn_version(&self.name, s, silver_app(&self.name)).await? {
                None if *before == Progress::default() => Some(0),
                seq => seq,
            },
            None => Some(0),
        };
        // What the transitions cover already. Every round appends its transitions (one
        // seq more) before its Silver commit records that seq, so a Silver commit that
        // failed or never happened (a crash, a failed write, any number of them in a row)
        // leaves Silver's seq below the rules': their transitions stand, and the rounds
        // that apply those changes again must not tag them again. A repeated round can
        // also plan less than the failed one did (its read window starts small again), so
        // the same holds with the seqs equal while the rules' progress is ahead of Silver's.
        let tagged = self.state.as_ref().map(|s| s.progress.clone());
        let behind = s_seq.is_some_and(|s| (0..t_seq).contains(&s));
        let ahead = s_seq == Some(t_seq) && tagged.as_ref().is_some_and(|p| !before.covers(p));
        // A backfill whose hits commit is missing is done again before anything else, at
        // once: Silver is still where that backfill ran (its round's Silver commit comes
        // after the hits commit), so nothing is left to cover, and a round walked first
        // would compare its changes with hits of the rule versions before the edit.
        let redo_backfill =
            self.force_backfill && behind && tagged.as_ref().is_some_and(|p| before.covers(p));
        if (behind && !redo_backfill) || ahead {
            return Ok(Start {
                covered: tagged,
                report: None,
            });
        }
        let in_sync = s_seq == Some(t_seq) || (s_seq.is_none() && t_seq == 0);
        if !in_sync {
            // Silver was rebuilt (its commits lost the seq): compare everything.
            self.installed = None;
        } else if self.installed.is_none() && !self.force_backfill {
            let built = self.state.as_ref().and_then(|s| s.ruleset);
            // The rules in effect just below the watermark: those of the edit before, when
            // the table stands at an edit's position.
            let previous = self
                .source
                .at(&self.name, before.watermark.saturating_sub(1));
            if built == Some(self.budget.fingerprint(&desired)) {
                // A restart with the rules the hits were built with: no backfill needed.
                self.installed = Some(desired.clone());
            } else if built == Some(self.budget.fingerprint(&previous)) {
                // A restart at an edit's position, before its backfill: the hits were
                // built with the rules before the edit, so the backfill evaluates only the
                // rules the edit changed, as a run without the restart does. Evaluating
                // the others again would compare their hits, streamed as of each row's
                // own commit, with lookups as of the edit's position, and tag every row
                // whose related row changed since (transitions a replay does not have).
                self.installed = Some(previous);
            }
        }
        if before.partial.is_some()
            && self.installed.is_some()
            && self.installed.as_ref() != Some(&desired)
        {
            // A transaction applied in pieces is under way: its transitions are computed
            // over the whole of it, under one rule set, so the edit waits for its last
            // piece (docs/rules.md, "Rule changes without restart").
            tracing::debug!(table = %self.name, "rule change waits for the transaction applied in pieces");
            self.round_rules = self.installed.clone();
            return Ok(Start {
                covered: None,
                report: None,
            });
        }
        let Some(silver) = silver else {
            self.installed = Some(desired);
            return Ok(Start {
                covered: None,
                report: None,
            });
        };
        if self.installed.as_ref() == Some(&desired) || keys.is_empty() {
            return Ok(Start {
                covered: None,
                report: None,
            });
        }
        let report = self.backfill(silver, desired, before, keys).await?;
        self.force_backfill = false;
        Ok(Start {
            covered: None,
            report: Some(report),
        })
    }

    /// The active rules compiled for `schema` and the Silver schemas of the tables they
    /// look up (compiled again when any of them changed), and the rules that cannot be.
    pub(super) async fn compiled(
        &mut self,
        schema: &SchemaRef,
    ) -> Result<(Arc<Evaluator>, Vec<RuleError>), LakeError> {
        let desired = self.rules_of_round();
        let related = self.related.refresh(&self.lake, &desired).await?;
        let fresh = self
            .compiled
            .as_ref()
            .is_some_and(|(r, s, rel, _, _)| r == &desired && s == schema && rel == &related);
        if !fresh {
            let mut ok = Vec::new();
            let mut bad = Vec::new();
            for r in &desired {
                if let Some(e) = self.budget.refusal(r) {
                    bad.push(e);
                    continue;
                }
                match compile_with(r, schema, &related) {
                    Ok(c) => ok.push(c),
                    Err(e) => bad.push(e),
                }
            }
            // A rule that could not be compiled before (its table or a looked-up table had
            // no Silver table yet) and can now: the rows tagged meanwhile never saw it, so
            // the next round compares every rule with every row.
            let was_bad: Vec<&str> = self
                .compiled
                .iter()
                .flat_map(|(_, _, _, _, bad)| bad.iter().map(|e| e.id.as_str()))
                .collect();
            if ok.iter().any(|c| was_bad.contains(&c.rule.id.as_str())) {
                self.backfill_next();
            }
            let evaluator = Arc::new(Evaluator::new(ok, schema));
            self.compiled = Some((desired, schema.clone(), related, evaluator, bad));
        }
        let (_, _, _, ev, bad) = self.compiled.as_ref().expect("set above");
        Ok((ev.clone(), bad.clone()))
    }

    /// Tags the changes of a round: `rows` are the round's screened (masked) Bronze rows,
    /// `truncated` the TRUNCATE applied before the round, `covered` what is tagged
    /// already, `silver` the table before the round, `after` the progress the round
    /// commits.
    #[allow(clippy::too_many_arguments)]
    pub async fn stream(
        &mut self,
        rows: &BronzeRows<'_>,
        truncated: Option<Position>,
        covered: Option<&Progress>,
        silver: Option<&DeltaTable>,
        tombstones: &crate::silver::Tombstones,
        after: &Progress,
    ) -> Result<RulesReport, LakeError> {
        let started = Instant::now();
        let mut clock = Stopwatch::start();
        let mut report = RulesReport::default();
        let keys = rows.key_names();
        let v = versions(rows, truncated).map_err(|e| self.error(e.0))?;
        let (mut events, filter_events) = match v.rows {
            Some(batch) => {
                let round = Versions {
                    rows,
                    covered,
                    silver,
                    tombstones,
                    keys: &keys,
                };
                self.tag_versions(round, batch, &v.sources, &mut report, &mut clock)
                    .await?
            }
            None => (Vec::new(), Vec::new()),
        };
        events.extend(truncations(rows, truncated, covered));
        let state = self.state.as_mut().ok_or_else(|| LakeError::Rows {
            table: self.name.clone(),
            reason: "rules state not loaded".into(),
        })?;
        let walked = walk_pieces(&mut state.hits, events, &mut self.open, after.partial);
        report.eval_time = started.elapsed();
        count(&mut report, &walked.transitions);
        report.steps.walk = clock.lap();
        self.commit_stream(
            &walked.transitions,
            &filter_events,
            after,
            &mut report,
            &mut clock,
        )
        .await?;
        Ok(report)
    }

    /// Evaluates the rules over the round's row versions (settled against Silver), and
    /// gives the walk's events and the filter topic's events of the versions not
    /// `covered` yet.
    async fn tag_versions(
        &mut self,
        round: Versions<'_, '_>,
        batch: RecordBatch,
        sources: &[usize],
        report: &mut RulesReport,
        clock: &mut Stopwatch,
    ) -> Result<(Vec<Event>, Vec<FilterEvent>), LakeError> {
        let Versions {
            rows,
            covered,
            silver,
            tombstones,
            keys,
        } = round;
        let sources = UInt32Array::from_iter_values(sources.iter().map(|&s| s as u32));
        let batch = with_column(&batch, SOURCE, Arc::new(sources)).map_err(|e| self.error(e))?;
        let reads = (0..rows.num_rows()).any(|i| rows.op(i) == Some(ChangeOp::Read));
        let batch = self.settle(batch, silver, tombstones, keys, reads).await?;
        report.steps.settle = clock.lap();
        let (schema, mut row_hits) = self
            .evaluate_versions(&batch, silver, report, clock)
            .await?;
        let keys_json = key_json(&batch, keys).map_err(|e| self.error(e))?;
        let col = |n: &str| batch.column_by_name(n).cloned();
        let (Some(src), Some(lsn), Some(ord), Some(op)) =
            (col(SOURCE), col(COMMIT_LSN), col(ORDINAL), col(OP))
        else {
            return Err(self.error("versions lack their position columns"));
        };
        let ts = col(COMMIT_TS).and_then(|a| cast(&a, &DataType::Int64).ok());
        let (src, lsn, ord, op) = (
            src.as_primitive::<deltalake::arrow::datatypes::UInt32Type>(),
            lsn.as_primitive::<deltalake::arrow::datatypes::Int64Type>(),
            ord.as_primitive::<deltalake::arrow::datatypes::Int64Type>(),
            op.as_string::<i32>(),
        );
        let filtering = self.output.as_ref().is_some_and(|o| o.wants_events());
        let skipped: std::collections::BTreeSet<String> =
            report.invalid.iter().map(|e| e.id.clone()).collect();
        let mut events = Vec::new();
        let mut filter_events: Vec<FilterEvent> = Vec::new();
        let mut passed: Vec<u32> = Vec::new();
        for (i, key) in keys_json.into_iter().enumerate() {
            if !uncovered(rows, covered, src.value(i) as usize) {
                continue;
            }
            let commit_ts = ts.as_ref().and_then(|a| {
                let a = a.as_primitive::<deltalake::arrow::datatypes::Int64Type>();
                a.is_valid(i).then(|| a.value(i))
            });
            if filtering {
                report.filter_in += 1;
                // A delete matches no rule (it makes the row leave its rules, which the
                // transitions carry).
                if op.value(i) != "d" && !row_hits[i].is_empty() {
                    passed.push(i as u32);
                    filter_events.push(FilterEvent {
                        key: key.clone(),
                        op: rows.op(src.value(i) as usize).map_or("u", ChangeOp::code),
                        lsn: lsn.value(i),
                        ordinal: ord.value(i),
                        commit_ts,
                        rules: row_hits[i].keys().map(|r| r.to_string()).collect(),
                        after: None,
                    });
                }
            }
            let what = if op.value(i) == "d" {
                What::Delete { key }
            } else {
                let mut hits = std::mem::take(&mut row_hits[i]);
                // A rule skipped this round (disabled, or not compilable) keeps the key's
                // hit as it was: no `left` for a rule that was not evaluated.
                if !skipped.is_empty() {
                    let old = self.state.as_ref().and_then(|s| s.hits.get(&key));
                    for (id, v) in old.into_iter().flat_map(|h| h.iter()) {
                        if skipped.contains(id.as_ref()) {
                            hits.insert(id.clone(), v);
                        }
                    }
                }
                What::Row { key, hits }
            };
            events.push(Event {
                pos: Position(lsn.value(i), ord.value(i)),
                commit_ts,
                what,
            });
        }
        if !passed.is_empty() {
            let json = rows_json(&batch, &schema, &passed).map_err(|e| self.error(e))?;
            for (e, after) in filter_events.iter_mut().zip(json) {
                e.after = after;
            }
            // In commit order (versions come grouped by key).
            filter_events.sort_by_key(|e| (e.lsn, e.ordinal));
        }
        report.filter_out = filter_events.len();
        Ok((events, filter_events))
    }

    /// The rules' hits of each version (with Silver's schema as it will be after the
    /// round), and that schema; rules past their budget are disabled from the next round.
    async fn evaluate_versions(
        &mut self,
        batch: &RecordBatch,
        silver: Option<&DeltaTable>,
        report: &mut RulesReport,
        clock: &mut Stopwatch,
    ) -> Result<(SchemaRef, Vec<KeyHits>), LakeError> {
        let schema = match silver {
            // Silver as it will be after this round: a column that widens this round
            // (`int` → `bigint`, crate::widen) is evaluated in the wider type.
            Some(s) => {
                let have = delta::arrow_schema(&self.name, s)?;
                match crate::widen::widened(&have, batch.schema().fields()) {
                    Some((wide, _)) => Arc::new(wide),
                    None => have,
                }
            }
            None => value_schema(batch),
        };
        let (compiled, invalid) = self.compiled(&schema).await?;
        report.invalid = invalid;
        report.rules = compiled.rules().len();
        report.rows = batch.num_rows();
        report.steps.compile = clock.lap();
        let row_hits = self
            .evaluate_rows(&compiled, batch, &schema, report, None)
            .await?;
        report.disabled = self.judge_budget(report);
        report.steps.evaluate = clock.lap();
        Ok((schema, row_hits))
    }

    /// Publishes a streamed round's transitions and filter events, then appends the
    /// transitions (before the Silver commit records their seq) and queues their hits.
    async fn commit_stream(
        &mut self,
        transitions: &[Transition],
        filter_events: &[FilterEvent],
        after: &Progress,
        report: &mut RulesReport,
        clock: &mut Stopwatch,
    ) -> Result<(), LakeError> {
        let seq = self.state.as_ref().map_or(0, |s| s.seq) + 1;
        // Published before the commits, acknowledged, or the round fails (super::output).
        self.publish(Origin::Stream, seq, transitions, filter_events)
            .await?;
        report.steps.publish = clock.lap();
        // The rule set the hits reflect: the recorded one, unless the state records none
        // (a table whose first round is this one) or this round disabled a rule.
        let disabled = !report.disabled.is_empty();
        let ruleset = match self.state.as_ref().and_then(|s| s.ruleset) {
            Some(r) if !disabled => r,
            _ => self.budget.fingerprint(&self.rules_of_round()),
        };
        // A round that disabled a rule commits even without transitions: the rule set it
        // records leaves the rule out, so a start with it enabled again backfills.
        if transitions.is_empty() && !disabled {
            return Ok(());
        }
        self.store
            .append(
                &self.name,
                seq,
                ruleset,
                after,
                transitions,
                Origin::Stream,
                false,
            )
            .await?;
        let state = self.state.as_mut().ok_or_else(|| LakeError::Rows {
            table: self.name.clone(),
            reason: "rules state not loaded".into(),
        })?;
        state.seq = seq;
        state.progress = after.clone();
        state.ruleset = Some(ruleset);
        report.steps.append = clock.lap();
        self.add_pending(changes_of(transitions));
        self.flush_hits(false).await?;
        report.steps.hits = clock.lap();
        Ok(())
    }

    /// The rules of the round past their budget, disabled from the next round on
    /// ([`super::budget`]; the evaluator is built again without them).
    pub(super) fn judge_budget(&mut self, report: &RulesReport) -> Vec<RuleError> {
        let rules = self.rules_of_round();
        let off = self
            .budget
            .judge(&rules, &report.condition_time, report.rows);
        if !off.is_empty() {
            self.compiled = None;
        }
        off
    }

    /// The rule set of the round under way (read at its start), or the source's now.
    fn rules_of_round(&self) -> Vec<Rule> {
        self.round_rules
            .clone()
            .unwrap_or_else(|| self.source.of(&self.name))
    }

    pub(super) fn error(&self, e: impl std::fmt::Display) -> LakeError {
        LakeError::Rows {
            table: self.name.clone(),
            reason: format!("rules: {e}"),
        }
    }
}

/// What [`TableRules::tag_versions`] needs of the round besides the versions.
struct Versions<'a, 'r> {
    rows: &'a BronzeRows<'r>,
    covered: Option<&'a Progress>,
    silver: Option<&'a DeltaTable>,
    tombstones: &'a crate::silver::Tombstones,
    keys: &'a [String],
}

/// Whether row `i` of the round is past what the rules `covered` already (a round
/// repeated after its Silver commit failed must not tag it again).
fn uncovered(rows: &BronzeRows<'_>, covered: Option<&Progress>, i: usize) -> bool {
    match covered {
        None => true,
        Some(p) if rows.op(i) == Some(ChangeOp::Read) => {
            match (rows.partition(i), rows.offset(i)) {
                (Some(part), Some(o)) => p.cursors.get(&part).is_none_or(|c| o > *c),
                _ => true,
            }
        }
        Some(p) => match (rows.partition(i), rows.offset(i)) {
            (Some(part), Some(o)) => !p.applied(rows.commit_lsn(i), part, o),
            _ => rows.commit_lsn(i) > p.watermark,
        },
    }
}

/// The walk's events of the round's TRUNCATEs after `truncated` not `covered` yet.
fn truncations(
    rows: &BronzeRows<'_>,
    truncated: Option<Position>,
    covered: Option<&Progress>,
) -> Vec<Event> {
    let ts = rows
        .commit_ts()
        .and_then(|a| cast(a, &DataType::Int64).ok());
    (0..rows.num_rows())
        .filter(|&i| {
            rows.op(i) == Some(ChangeOp::Truncate)
                && truncated.is_none_or(|t| rows.position(i) > t)
                && uncovered(rows, covered, i)
        })
        .map(|i| Event {
            pos: rows.position(i),
            commit_ts: ts.as_ref().and_then(|a| {
                let a = a.as_primitive::<deltalake::arrow::datatypes::Int64Type>();
                a.is_valid(i).then(|| a.value(i))
            }),
            what: What::Truncate,
        })
        .collect()
}

/// The quarantine `reason_code` of a row a rule could not be evaluated on.
pub const RULE_FAILED: &str = "rule_failed";

/// Column carrying each version's input row.
pub(super) const SOURCE: &str = "_source";

pub(super) fn count(report: &mut RulesReport, transitions: &[Transition]) {
    for t in transitions {
        *report.transitions.entry(t.rule_id.clone()).or_default() += 1;
        report.newest_commit_ts = report.newest_commit_ts.max(t.commit_ts);
    }
}
