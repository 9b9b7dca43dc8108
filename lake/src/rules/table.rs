//! The rules of one Silver table, evaluated inside its rounds.
//!
//! Rules see what Silver stores (masked, TOAST values filled) and exactly the changes a
//! Silver round applies, so they run in the round, between the fold and the Silver commit
//! ([`crate::silver::SilverTable::apply`]): per source transaction, the state of every
//! changed key ([`crate::silver::versions`]) is evaluated against every rule at once and
//! compared with the key's hits ([`super::walk`]). The rules tables are committed before
//! the Silver commit, which records their seq; see [`super::store`] for why a crash
//! anywhere repeats nothing and loses nothing.
//!
//! A new, changed or removed rule (and the first round after a start, and a Silver table
//! rebuilt under the rules) is a backfill: the rules are evaluated over every current
//! Silver row and the result compared with the hits, at the Silver watermark.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array,
};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use wal2delta_model::ChangeOp;
use wal2delta_quarantine::{QuarantineRecord, Stage};

use super::store::{changes_of, fingerprint, HitChange, Loaded, Origin, RulesStore};
use super::walk::{diff, walk, Event, KeyHits, Transition, What};
use super::{compile, evaluate, CompiledRule, Evaluator, Rule, RuleError};
use crate::delta::{self, ident, literal};
use crate::silver::{
    versions, BronzeRows, Position, Progress, COMMIT_LSN, COMMIT_TS, MOVED_FROM, OP, ORDINAL,
    UNCHANGED,
};
use crate::LakeError;

/// The running rule set, shared by the rules stage (which replaces it when a valid new
/// set is loaded) and every Silver table (which installs it at its next round).
#[derive(Clone, Default)]
pub struct RuleSource(Arc<RwLock<Arc<BTreeMap<String, Vec<Rule>>>>>);

impl RuleSource {
    /// `rules` grouped by Silver table name (`schema.table` with the lake's parts); only
    /// active rules, sorted by id.
    pub fn new(rules: &[Rule]) -> Self {
        let s = RuleSource::default();
        s.replace(rules);
        s
    }

    pub fn replace(&self, rules: &[Rule]) {
        let mut by_table: BTreeMap<String, Vec<Rule>> = BTreeMap::new();
        for r in rules.iter().filter(|r| r.active) {
            let (schema, table) = r.table.ident_parts();
            by_table
                .entry(format!("{schema}.{table}"))
                .or_default()
                .push(r.clone());
        }
        for v in by_table.values_mut() {
            v.sort_by(|a, b| a.id.cmp(&b.id));
        }
        let mut guard = self.0.write().unwrap_or_else(|e| e.into_inner());
        *guard = Arc::new(by_table);
    }

    /// The active rules of Silver table `table`.
    pub fn of(&self, table: &str) -> Vec<Rule> {
        let guard = self.0.read().unwrap_or_else(|e| e.into_inner());
        guard.get(table).cloned().unwrap_or_default()
    }
}

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
    /// A backfill ran (a rule set installed).
    pub backfill: bool,
    /// The rules that could not be compiled against the table (skipped).
    pub invalid: Vec<RuleError>,
    /// The newest source commit time among the transitions (for the rules lag).
    pub newest_commit_ts: Option<i64>,
}

/// How a round starts.
pub struct Start {
    /// Changes at or below this progress are tagged already (a round repeated after a
    /// crash between the rules commits and the Silver commit).
    pub covered: Option<Progress>,
    pub report: Option<RulesReport>,
}

pub struct TableRules {
    name: String,
    source: RuleSource,
    store: RulesStore,
    state: Option<Loaded>,
    /// The rules the hits reflect (`None` until the first backfill after a load).
    installed: Option<Vec<Rule>>,
    compiled: Option<(Vec<Rule>, SchemaRef, Arc<Evaluator>, Vec<RuleError>)>,
}

/// The Silver `txn` app id recording the rules seq a Silver commit follows.
fn silver_app(table: &str) -> String {
    format!("wal2delta-silver/{table}/rules")
}

/// The `txn` action of a Silver commit written without rules: -1, which no rules seq
/// equals, so rules started later backfill instead of trusting a seq from before.
pub(crate) fn untagged_silver_txn(table: &str) -> Transaction {
    Transaction::new(silver_app(table), -1)
}

impl TableRules {
    pub fn new(lake: &crate::Lake, table: &str, source: RuleSource) -> Self {
        TableRules {
            name: table.to_owned(),
            source,
            store: RulesStore::new(lake),
            state: None,
            installed: None,
            compiled: None,
        }
    }

    /// The `txn` action the round's Silver commit carries.
    pub fn silver_txn(&self) -> Option<Transaction> {
        let seq = self.state.as_ref()?.seq;
        Some(Transaction::new(silver_app(&self.name), seq))
    }

    /// Forgets the loaded state (after a failure: the next round loads it again).
    pub fn reset(&mut self) {
        self.state = None;
    }

    /// The next round compares every rule with every Silver row (after a re-snapshot
    /// removed the rows the source no longer has).
    pub fn backfill_next(&mut self) {
        self.installed = None;
    }

    /// Called at the start of a round with the Silver table as it is before the round:
    /// loads the state, and backfills when the rule set changed.
    pub async fn start(
        &mut self,
        silver: Option<&DeltaTable>,
        before: &Progress,
        keys: &[String],
    ) -> Result<Start, LakeError> {
        if self.state.is_none() {
            self.state = Some(self.store.load(&self.name).await?);
            self.installed = None;
        }
        let t_seq = self.state.as_ref().map_or(0, |s| s.seq);
        // A Silver table that does not exist yet follows seq 0: when the rules committed
        // seq 1 and the round's first Silver commit did not happen, the repeated round
        // skips what they covered like any other.
        let s_seq = match silver {
            Some(s) => delta::txn_version(&self.name, s, silver_app(&self.name)).await?,
            None => Some(0),
        };
        if t_seq > 0 && s_seq == Some(t_seq - 1) {
            let covered = self.state.as_ref().map(|s| s.progress.clone());
            return Ok(Start {
                covered,
                report: None,
            });
        }
        let desired = self.source.of(&self.name);
        let in_sync = s_seq == Some(t_seq) || (s_seq.is_none() && t_seq == 0);
        if !in_sync {
            // Silver was rebuilt (its commits lost the seq): compare everything.
            self.installed = None;
        } else if self.installed.is_none()
            && self.state.as_ref().and_then(|s| s.ruleset) == Some(fingerprint(&desired))
        {
            // A restart with the rules the hits were built with: no backfill needed.
            self.installed = Some(desired.clone());
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
        Ok(Start {
            covered: None,
            report: Some(report),
        })
    }

    /// The active rules compiled for `schema` (compiled again when either changed), and
    /// the rules that cannot be.
    fn compiled(&mut self, schema: &SchemaRef) -> (Arc<Evaluator>, Vec<RuleError>) {
        let desired = self.source.of(&self.name);
        let fresh = self
            .compiled
            .as_ref()
            .is_some_and(|(r, s, _, _)| r == &desired && s == schema);
        if !fresh {
            let mut ok = Vec::new();
            let mut bad = Vec::new();
            for r in &desired {
                match compile(r, schema) {
                    Ok(c) => ok.push(c),
                    Err(e) => bad.push(e),
                }
            }
            let evaluator = Arc::new(Evaluator::new(ok, schema));
            self.compiled = Some((desired, schema.clone(), evaluator, bad));
        }
        let (_, _, ev, bad) = self.compiled.as_ref().expect("set above");
        (ev.clone(), bad.clone())
    }

    /// Evaluates the rules over every Silver row and brings the hits in line.
    async fn backfill(
        &mut self,
        silver: &DeltaTable,
        desired: Vec<Rule>,
        before: &Progress,
        keys: &[String],
    ) -> Result<RulesReport, LakeError> {
        let started = Instant::now();
        let schema = delta::arrow_schema(&self.name, silver)?;
        let (compiled, invalid) = self.compiled(&schema);
        // Which rules to evaluate: all after a load, else the new and changed ones.
        let to_eval: Vec<CompiledRule> = match &self.installed {
            None => compiled.rules().to_vec(),
            Some(old) => compiled
                .rules()
                .iter()
                .filter(|c| !old.contains(&c.rule))
                .cloned()
                .collect(),
        };
        let eval_ids: BTreeSet<String> = to_eval.iter().map(|c| c.rule.id.clone()).collect();
        let invalid_ids: BTreeSet<&str> = invalid.iter().map(|e| e.id.as_str()).collect();
        let desired_ids: BTreeSet<&str> = desired.iter().map(|r| r.id.as_str()).collect();
        let mut report = RulesReport {
            backfill: true,
            rules: to_eval.len(),
            invalid: invalid.clone(),
            ..RulesReport::default()
        };
        let mut fresh: HashMap<String, (KeyHits, Option<i64>)> = HashMap::new();
        if !to_eval.is_empty() {
            let ev = Evaluator::new(to_eval, &schema);
            for b in delta::query(&self.name, silver, "SELECT * FROM t").await? {
                report.rows += b.num_rows();
                let row_hits = self.evaluate_rows(&ev, &b, &schema, &mut report)?;
                let keys_json = key_json(&b, keys).map_err(|e| self.error(e))?;
                let ts = b
                    .column_by_name(COMMIT_TS)
                    .and_then(|a| cast(a, &DataType::Int64).ok());
                for ((i, key), hits) in keys_json.into_iter().enumerate().zip(row_hits) {
                    if !hits.is_empty() {
                        let t = ts.as_ref().and_then(|a| {
                            let a = a.as_primitive::<deltalake::arrow::datatypes::Int64Type>();
                            a.is_valid(i).then(|| a.value(i))
                        });
                        fresh.insert(key, (hits, t));
                    }
                }
            }
        }
        let state = self.state.as_mut().expect("loaded in start");
        // Per key: the hits of the rules re-evaluated or removed are replaced.
        let replaced = |id: &str| {
            eval_ids.contains(id) || (!desired_ids.contains(id) && !invalid_ids.contains(id))
        };
        let mut keys_seen: BTreeSet<String> = fresh.keys().cloned().collect();
        for (k, h) in &state.hits {
            if h.keys().any(|id| replaced(id)) {
                keys_seen.insert(k.clone());
            }
        }
        let mut transitions = Vec::new();
        let mut changes: Vec<HitChange> = Vec::new();
        for key in keys_seen {
            let old: KeyHits = state
                .hits
                .get(&key)
                .map(|h| {
                    h.iter()
                        .filter(|(id, _)| replaced(id))
                        .map(|(a, b)| (a.clone(), *b))
                        .collect()
                })
                .unwrap_or_default();
            let (new, ts) = fresh.remove(&key).unwrap_or_default();
            let n = transitions.len();
            diff(
                &key,
                Some(&old),
                Some(&new),
                before.watermark,
                ts,
                &mut transitions,
            );
            for t in &mut transitions[n..] {
                if !t.entered {
                    t.commit_ts = None;
                }
            }
            for (id, v) in &new {
                if old.get(id) != Some(v) {
                    changes.push((key.clone(), id.clone(), Some((*v, before.watermark, ts))));
                }
            }
            for id in old.keys().filter(|id| !new.contains_key(*id)) {
                changes.push((key.clone(), id.clone(), None));
            }
            let entry = state.hits.entry(key.clone()).or_default();
            entry.retain(|id, _| !replaced(id));
            entry.extend(new);
            if entry.is_empty() {
                state.hits.remove(&key);
            }
        }
        transitions.sort();
        report.eval_time = started.elapsed();
        count(&mut report, &transitions);
        // Committed even when nothing changed: the commit records the rule set, so a
        // restart with the same rules skips this backfill.
        let seq = state.seq + 1;
        let ruleset = fingerprint(&desired);
        self.store
            .commit(
                &self.name,
                seq,
                ruleset,
                before,
                &transitions,
                &changes,
                Origin::Backfill,
            )
            .await?;
        state.seq = seq;
        state.progress = before.clone();
        state.ruleset = Some(ruleset);
        tracing::info!(table = %self.name, rules = report.rules, rows = report.rows, transitions = transitions.len(), elapsed_ms = started.elapsed().as_millis() as u64, "rules installed: backfilled over the current Silver rows");
        self.installed = Some(desired);
        Ok(report)
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
        let mut report = RulesReport::default();
        let uncovered = |i: usize| match covered {
            None => true,
            Some(p) if rows.op(i) == Some(ChangeOp::Read) => {
                match (rows.partition(i), rows.offset(i)) {
                    (Some(part), Some(o)) => p.cursors.get(&part).is_none_or(|c| o > *c),
                    _ => true,
                }
            }
            Some(p) => rows.commit_lsn(i) > p.watermark,
        };
        let keys = rows.key_names();
        let v = versions(rows, truncated).map_err(|e| self.error(e.0))?;
        let mut events = Vec::new();
        if let Some(batch) = v.rows {
            let sources = UInt32Array::from_iter_values(v.sources.iter().map(|&s| s as u32));
            let batch =
                with_column(&batch, SOURCE, Arc::new(sources)).map_err(|e| self.error(e))?;
            let reads = (0..rows.num_rows()).any(|i| rows.op(i) == Some(ChangeOp::Read));
            let batch = self.settle(batch, silver, tombstones, &keys, reads).await?;
            let schema = match silver {
                Some(s) => delta::arrow_schema(&self.name, s)?,
                None => value_schema(&batch),
            };
            let (compiled, invalid) = self.compiled(&schema);
            report.invalid = invalid;
            report.rules = compiled.rules().len();
            report.rows = batch.num_rows();
            let mut row_hits = self.evaluate_rows(&compiled, &batch, &schema, &mut report)?;
            let keys_json = key_json(&batch, &keys).map_err(|e| self.error(e))?;
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
            for (i, key) in keys_json.into_iter().enumerate() {
                if !uncovered(src.value(i) as usize) {
                    continue;
                }
                let commit_ts = ts.as_ref().and_then(|a| {
                    let a = a.as_primitive::<deltalake::arrow::datatypes::Int64Type>();
                    a.is_valid(i).then(|| a.value(i))
                });
                let what = if op.value(i) == "d" {
                    What::Delete { key }
                } else {
                    What::Row {
                        key,
                        hits: std::mem::take(&mut row_hits[i]),
                    }
                };
                events.push(Event {
                    pos: Position(lsn.value(i), ord.value(i)),
                    commit_ts,
                    what,
                });
            }
        }
        let ts = rows
            .commit_ts()
            .and_then(|a| cast(a, &DataType::Int64).ok());
        for i in 0..rows.num_rows() {
            let pos = rows.position(i);
            if rows.op(i) == Some(ChangeOp::Truncate)
                && truncated.is_none_or(|t| pos > t)
                && uncovered(i)
            {
                let commit_ts = ts.as_ref().and_then(|a| {
                    let a = a.as_primitive::<deltalake::arrow::datatypes::Int64Type>();
                    a.is_valid(i).then(|| a.value(i))
                });
                events.push(Event {
                    pos,
                    commit_ts,
                    what: What::Truncate,
                });
            }
        }
        let state = self.state.as_mut().ok_or_else(|| LakeError::Rows {
            table: self.name.clone(),
            reason: "rules state not loaded".into(),
        })?;
        let walked = walk(&mut state.hits, events);
        report.eval_time = started.elapsed();
        count(&mut report, &walked.transitions);
        if !walked.transitions.is_empty() {
            let changes = changes_of(&walked.transitions);
            let seq = state.seq + 1;
            let ruleset = state
                .ruleset
                .unwrap_or_else(|| fingerprint(&self.source.of(&self.name)));
            self.store
                .commit(
                    &self.name,
                    seq,
                    ruleset,
                    after,
                    &walked.transitions,
                    &changes,
                    Origin::Stream,
                )
                .await?;
            state.seq = seq;
            state.progress = after.clone();
        }
        Ok(report)
    }

    /// Fills the values versions left unchanged (TOAST) from the Silver row before the
    /// round, and drops the versions Silver will not apply: older than the Silver row, or
    /// than a tombstone (a snapshot row arriving after later changes).
    async fn settle(
        &self,
        batch: RecordBatch,
        silver: Option<&DeltaTable>,
        tombstones: &crate::silver::Tombstones,
        keys: &[String],
        reads: bool,
    ) -> Result<RecordBatch, LakeError> {
        let unchanged = batch
            .column_by_name(UNCHANGED)
            .and_then(|a| a.as_list_opt::<i32>().map(|l| l.values().len() > 0))
            .unwrap_or(false);
        let mut batch = batch;
        if reads {
            let kept = tombstones.filter(keys, batch.clone()).await?;
            batch = deltalake::arrow::compute::concat_batches(&batch.schema(), &kept)
                .map_err(|e| self.error(e))?;
        }
        let Some(silver) = silver else {
            return Ok(batch);
        };
        if !(unchanged || reads) || batch.num_rows() == 0 {
            return Ok(batch);
        }
        let have = delta::arrow_schema(&self.name, silver)?;
        let schema = batch.schema();
        let moved = |k: &str| schema.field_with_name(&format!("{MOVED_FROM}{k}")).is_ok();
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                let n = f.name();
                let q = ident(n);
                if n.starts_with('_') || keys.contains(n) || have.field_with_name(n).is_err() {
                    format!("s.{q}")
                } else {
                    format!(
                        "CASE WHEN array_has(s.{UNCHANGED}, {}) THEN f.{q} ELSE s.{q} END AS {q}",
                        literal(n)
                    )
                }
            })
            .collect();
        let own = crate::silver::keys_equal(keys, "s", "m");
        let fill = keys
            .iter()
            .map(|k| {
                let q = ident(k);
                if moved(k) {
                    format!(
                        "f.{q} = COALESCE(s.{}, s.{q})",
                        ident(&format!("{MOVED_FROM}{k}"))
                    )
                } else {
                    format!("f.{q} = s.{q}")
                }
            })
            .collect::<Vec<_>>()
            .join(" AND ");
        let sql = format!(
            "SELECT {} FROM s LEFT JOIN m ON {own} LEFT JOIN m f ON {fill} WHERE s.{OP} = 'd' OR m.{l} IS NULL OR {newer}",
            columns.join(", "),
            l = COMMIT_LSN,
            newer = crate::silver::newer("s", "m"),
        );
        let err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        ctx.register_batch("s", batch.clone()).map_err(err)?;
        ctx.register_table("m", silver.table_provider().await.map_err(err)?)
            .map_err(err)?;
        let out = delta::collect(&self.name, &ctx, &sql).await?;
        deltalake::arrow::compute::concat_batches(&schema, &out).map_err(|e| self.error(e))
    }

    /// Every rule of `ev` over `batch` as `schema` (the schema the rules were compiled
    /// against): the rules each row matches. A rule that fails on the batch is evaluated
    /// row by row; each failing row is quarantined for that rule and counts as no hit.
    fn evaluate_rows(
        &self,
        ev: &Evaluator,
        batch: &RecordBatch,
        schema: &SchemaRef,
        report: &mut RulesReport,
    ) -> Result<Vec<KeyHits>, LakeError> {
        let input = conform(batch, schema).map_err(|e| self.error(e))?;
        let mut hits = vec![KeyHits::new(); input.num_rows()];
        for (rule, result) in ev.rules().iter().zip(ev.evaluate(&input)) {
            let bits = match result {
                Ok(b) => b,
                Err(e) => {
                    let mut bits = Vec::with_capacity(input.num_rows());
                    for i in 0..input.num_rows() {
                        let one = input.slice(i, 1);
                        match evaluate(std::slice::from_ref(rule), &one).remove(0) {
                            Ok(b) => bits.push(b.value(0)),
                            Err(row_error) => {
                                bits.push(false);
                                *report.errors.entry(rule.rule.id.clone()).or_default() += 1;
                                report
                                    .quarantined
                                    .push(self.failed(rule, &one, &row_error.reason));
                            }
                        }
                    }
                    tracing::warn!(table = %self.name, rule = %rule.rule.id, error = %e.reason, "a rule failed on some rows: they are quarantined for that rule and count as no hit");
                    BooleanArray::from(bits)
                }
            };
            for i in bits.values().set_indices() {
                hits[i].insert(rule.rule.id.clone(), rule.rule.version);
            }
        }
        Ok(hits)
    }

    /// The quarantine record of a row a rule failed on.
    fn failed(&self, rule: &CompiledRule, row: &RecordBatch, reason: &str) -> QuarantineRecord {
        let int = |n: &str| {
            row.column_by_name(n)
                .and_then(|a| a.as_primitive_opt::<deltalake::arrow::datatypes::Int64Type>())
                .filter(|a| a.is_valid(0))
                .map(|a| a.value(0))
        };
        let (lsn, ord) = (int(COMMIT_LSN), int(ORDINAL));
        QuarantineRecord {
            id: format!(
                "rules/{}/{}/{}/{}/{}",
                self.name,
                rule.rule.id,
                rule.rule.version,
                lsn.unwrap_or(0),
                ord.unwrap_or(0)
            ),
            stage: Stage::Silver,
            reason_code: RULE_FAILED.into(),
            detail: format!(
                "rule {:?} (version {}): {reason}",
                rule.rule.id, rule.rule.version
            ),
            table: Some(self.name.clone()),
            topic: None,
            partition: None,
            offset: None,
            source_lsn: lsn,
            commit_lsn: lsn,
            ordinal: ord,
            key: None,
            raw: None,
            quarantined_at_us: wal2delta_model::clock::unix_us(),
            check: Some(rule.rule.id.clone()),
        }
    }

    fn error(&self, e: impl std::fmt::Display) -> LakeError {
        LakeError::Rows {
            table: self.name.clone(),
            reason: format!("rules: {e}"),
        }
    }
}

/// The quarantine `reason_code` of a row a rule could not be evaluated on.
pub const RULE_FAILED: &str = "rule_failed";

/// Column carrying each version's input row.
const SOURCE: &str = "_source";

fn count(report: &mut RulesReport, transitions: &[Transition]) {
    for t in transitions {
        *report.transitions.entry(t.rule_id.clone()).or_default() += 1;
        report.newest_commit_ts = report.newest_commit_ts.max(t.commit_ts);
    }
}

fn with_column(b: &RecordBatch, name: &str, a: ArrayRef) -> Result<RecordBatch, String> {
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(name, a.data_type().clone(), true));
    let mut cols = b.columns().to_vec();
    cols.push(a);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| e.to_string())
}

/// The columns of versions a rule may read (no fold bookkeeping).
fn value_schema(b: &RecordBatch) -> SchemaRef {
    let fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .filter(|f| {
            let n = f.name();
            n != OP && n != UNCHANGED && n != SOURCE && !n.starts_with(MOVED_FROM)
        })
        .map(|f| f.as_ref().clone())
        .collect();
    Arc::new(Schema::new(fields))
}

/// `b` with exactly `schema`'s columns (by name, cast to its types; absent ones NULL).
fn conform(b: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let cols: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match b.column_by_name(f.name()) {
            Some(a) if a.data_type() == f.data_type() => Ok(a.clone()),
            Some(a) => cast(a, f.data_type()).map_err(|e| format!("column {}: {e}", f.name())),
            None => Ok(new_null_array(f.data_type(), b.num_rows())),
        })
        .collect::<Result<_, _>>()?;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        cols,
        &deltalake::arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
    )
    .map_err(|e| e.to_string())
}

/// Every row's primary key as JSON text (`{"id":42}`), key columns in key order.
pub fn key_json(b: &RecordBatch, keys: &[String]) -> Result<Vec<String>, String> {
    let idx: Vec<usize> = keys
        .iter()
        .map(|k| {
            b.schema()
                .index_of(k)
                .map_err(|_| format!("no key column {k}"))
        })
        .collect::<Result<_, _>>()?;
    let projected = b.project(&idx).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    {
        let mut w = deltalake::arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(&projected).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
    }
    let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
    let out: Vec<String> = text.lines().map(str::to_owned).collect();
    if out.len() != b.num_rows() {
        return Err(format!("{} keys for {} rows", out.len(), b.num_rows()));
    }
    Ok(out)
}
