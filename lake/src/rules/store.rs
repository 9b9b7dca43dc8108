//! The rules tables: `rules/transitions` (append-only) and `rules/hits` (current state).
//!
//! Exactly once. Per source table, every commit of either table carries the `txn` action
//! `wal2delta-rules/{table}/seq` = n: each round appends its transitions as seq n, one
//! more than the last, then the Silver commit of the round records n too
//! (`wal2delta-silver/{table}/rules`). `rules/hits` follows: it is changed at most every
//! `[rules] hits_interval_ms` (a MERGE rewrites every hits file a round touches, the
//! costliest commit of a round), with every change since its last commit, recording the
//! seq of the newest transitions it reflects. That commit runs beside the rounds, which
//! do not wait for it ([`super::table::TableRules::flush_hits`]); the commits of the
//! process take turns ([`HITS_COMMITS`]). The transitions carry everything the hits
//! need, so loading reads the hits and rolls them forward with the transitions of every
//! later seq ([`RulesStore::read`]; whether the hits commit was not due yet or a crash
//! came between), and the rules' progress (the Silver progress the last transitions were
//! computed up to), so a Silver round repeated after a crash emits nothing for changes
//! already tagged.

use std::sync::Arc;

use deltalake::arrow::array::{
    Array, AsArray, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use deltalake::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use deltalake::kernel::Transaction;
use deltalake::protocol::SaveMode;
use url::Url;

use super::walk::{rule_id, Hits, Transition};
use crate::delta::{self, literal};
use crate::silver::Progress;
use crate::LakeError;

const APP: &str = "wal2delta-rules";

/// Where a transition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A committed source change.
    Stream,
    /// A rule added, changed or removed, evaluated over the current Silver rows.
    Backfill,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Stream => "stream",
            Origin::Backfill => "backfill",
        }
    }
}

/// What the rules tables record for one source table.
#[derive(Debug, Default)]
pub struct Loaded {
    pub hits: Hits,
    /// The last seq committed (0: none).
    pub seq: i64,
    /// The seq `rules/hits` reflects (at most `seq`: the transitions of later seqs are
    /// rolled forward into `hits`, and are still to be committed to `rules/hits`).
    pub hits_seq: i64,
    /// The Silver progress the last transitions were computed up to.
    pub progress: Progress,
    /// The fingerprint of the rules the hits reflect ([`fingerprint`]), when recorded.
    pub ruleset: Option<i64>,
    /// A backfill's transitions are committed, but not the `rules/hits` commit that
    /// carries its other changes: a rule's new version on the rows it still matches
    /// changes their hits without a transition, so no roll-forward from the transitions
    /// can restore it. The rules backfill again (which emits no transition twice: the
    /// state holds the rolled-forward ones) and commit the hits with it.
    pub backfill_pending: bool,
}

/// A stable fingerprint of a table's rule set (ids, versions and conditions; FNV-1a, so
/// it is the same in every build): recorded with the transitions, it lets a restart with
/// the same rules skip the backfill.
pub fn fingerprint(rules: &[super::Rule]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for r in rules {
        for part in [
            r.id.as_bytes(),
            &r.version.to_le_bytes(),
            r.when.as_bytes(),
            &[0xff],
        ] {
            for b in part {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        // Lookups only when there are some: rule sets without keep their fingerprint.
        for l in &r.lookups {
            let text = format!("{}\u{1}{}\u{1}{:?}\u{2}", l.name, l.table, l.on);
            for b in text.as_bytes() {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    (h >> 1) as i64
}

/// A (key, rule)'s hit: `Some((version, lsn, commit_ts))` when it matches, `None` when it
/// no longer does.
pub type Hit = Option<(i64, i64, Option<i64>)>;

/// One (key, rule) of `rules/hits` after a commit, and its [`Hit`].
pub type HitChange = (String, String, Hit);

pub struct RulesStore {
    transitions: Url,
    hits: Url,
    /// Both tables kept open between rounds ([`delta::Kept`]): every round appends to
    /// `rules/transitions`, and reopening it replayed a log that grew with the run.
    kept_transitions: delta::Kept,
    /// Shared with a `rules/hits` commit running beside the rounds ([`Self::merge_hits`]).
    kept_hits: Arc<tokio::sync::Mutex<delta::Kept>>,
}

/// Waits for the `rules/hits` commit under way, if any, and keeps the next from starting
/// while the guard lives: maintenance (a compaction of `rules/hits`) takes it, so that it
/// never races a hits MERGE (which would fail on the conflict).
pub async fn hits_commits_paused() -> tokio::sync::MutexGuard<'static, ()> {
    HITS_COMMITS.lock().await
}

/// Held by every `rules/hits` commit of the process. The table is shared by every
/// source table and not partitioned, so two MERGEs at once (one table's commit running
/// beside the rounds, another's, or a load rolling forward) would conflict; in turn they
/// do not. Each refreshes the table under the lock, so each sees the one before it.
static HITS_COMMITS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn utc() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn transitions_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("rule_id", DataType::Utf8, false),
        Field::new("rule_version", DataType::Int64, false),
        Field::new("table", DataType::Utf8, false),
        Field::new("key", DataType::Utf8, false),
        Field::new("transition", DataType::Utf8, false),
        Field::new("lsn", DataType::Int64, false),
        Field::new("commit_ts", utc(), true),
        Field::new("origin", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
    ]))
}

fn hits_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("table", DataType::Utf8, false),
        Field::new("rule_id", DataType::Utf8, false),
        Field::new("rule_version", DataType::Int64, false),
        Field::new("key", DataType::Utf8, false),
        Field::new("lsn", DataType::Int64, false),
        Field::new("commit_ts", utc(), true),
        Field::new("hit", DataType::Boolean, false),
    ]))
}

impl RulesStore {
    pub fn new(lake: &crate::Lake) -> Self {
        RulesStore {
            transitions: lake.rules_transitions(),
            hits: lake.rules_hits(),
            kept_transitions: delta::Kept::default(),
            kept_hits: Default::default(),
        }
    }

    /// Drops the kept tables (after a failed round): the next commit opens them afresh.
    pub fn forget(&mut self) {
        self.kept_transitions = delta::Kept::default();
        // A commit still running keeps the table it had; the next opens it afresh.
        self.kept_hits = Default::default();
    }

    fn seq_app(table: &str) -> String {
        format!("{APP}/{table}/seq")
    }

    /// The `txn` app id of the last backfill: in `rules/transitions` the seq it appended
    /// as, in `rules/hits` the seq of the backfill whose changes the hits hold.
    fn backfill_app(table: &str) -> String {
        format!("{APP}/{table}/backfill")
    }

    /// The state of `table`'s rules: hits rolled forward to the last transitions, the
    /// rolled-forward hits committed to `rules/hits`.
    pub async fn load(&mut self, table: &str) -> Result<Loaded, LakeError> {
        let (mut out, missed) = self.read(table).await?;
        if !missed.is_empty() {
            // Not a backfill's changes: the hits' backfill seq stays as it was.
            self.merge_hits(table, out.seq, changes_of(&missed), None)
                .await?;
            tracing::info!(
                table,
                from_seq = out.hits_seq,
                to_seq = out.seq,
                "rules/hits rolled forward from rules/transitions"
            );
            out.hits_seq = out.seq;
        }
        Ok(out)
    }

    /// The state of `table`'s rules without changing anything: the hits rolled forward to
    /// the last transitions, and the transitions `rules/hits` does not reflect yet.
    pub async fn read(&self, table: &str) -> Result<(Loaded, Vec<Transition>), LakeError> {
        let mut out = Loaded::default();
        let mut missed = Vec::new();
        let mut hits_seq = 0;
        let mut hits_backfill = 0;
        if let Some(h) = delta::open("rules/hits", &self.hits).await? {
            hits_seq = delta::txn_version("rules/hits", &h, Self::seq_app(table))
                .await?
                .unwrap_or(0);
            hits_backfill = delta::txn_version("rules/hits", &h, Self::backfill_app(table))
                .await?
                .unwrap_or(0);
            let sql = format!(
                "SELECT key, rule_id, rule_version FROM t WHERE \"table\" = {} AND hit",
                literal(table)
            );
            for b in delta::query("rules/hits", &h, &sql).await? {
                let (k, r, v) = (
                    b.column(0).as_string::<i32>(),
                    b.column(1).as_string::<i32>(),
                    b.column(2)
                        .as_primitive::<deltalake::arrow::datatypes::Int64Type>(),
                );
                for i in 0..b.num_rows() {
                    out.hits
                        .entry(k.value(i).to_owned())
                        .or_default()
                        .insert(rule_id(r.value(i)), v.value(i));
                }
            }
        }
        out.seq = hits_seq;
        out.hits_seq = hits_seq;
        if let Some(t) = delta::open("rules/transitions", &self.transitions).await? {
            let seq = delta::txn_version("rules/transitions", &t, Self::seq_app(table))
                .await?
                .unwrap_or(0);
            out.progress = Progress::load_as(APP, table, &t).await?;
            out.ruleset =
                delta::txn_version("rules/transitions", &t, format!("{APP}/{table}/ruleset"))
                    .await?;
            let backfill = delta::txn_version("rules/transitions", &t, Self::backfill_app(table))
                .await?
                .unwrap_or(0);
            out.backfill_pending = backfill > hits_backfill;
            if seq > hits_seq {
                // Rounds whose hits are not committed yet: roll forward.
                let sql = format!(
                    "SELECT key, rule_id, rule_version, transition, lsn, CAST(commit_ts AS BIGINT) FROM t WHERE \"table\" = {} AND seq > {hits_seq} ORDER BY seq, lsn",
                    literal(table)
                );
                for b in delta::query("rules/transitions", &t, &sql).await? {
                    let int = |i: usize| {
                        b.column(i)
                            .as_primitive::<deltalake::arrow::datatypes::Int64Type>()
                    };
                    let (k, r, tr) = (
                        b.column(0).as_string::<i32>(),
                        b.column(1).as_string::<i32>(),
                        b.column(3).as_string::<i32>(),
                    );
                    let (v, lsn, ts) = (int(2), int(4), int(5));
                    for i in 0..b.num_rows() {
                        missed.push(Transition {
                            lsn: lsn.value(i),
                            key: k.value(i).to_owned(),
                            rule_id: r.value(i).to_owned(),
                            entered: tr.value(i) == "entered",
                            rule_version: v.value(i),
                            commit_ts: ts.is_valid(i).then(|| ts.value(i)),
                        });
                    }
                }
                for t in &missed {
                    if t.entered {
                        out.hits
                            .entry(t.key.clone())
                            .or_default()
                            .insert(rule_id(&t.rule_id), t.rule_version);
                    } else if let Some(h) = out.hits.get_mut(&t.key) {
                        h.remove(&t.rule_id);
                        if h.is_empty() {
                            out.hits.remove(&t.key);
                        }
                    }
                }
            }
            out.seq = seq.max(hits_seq);
        }
        for h in out.hits.values_mut() {
            *h = std::mem::take(h).shrunk();
        }
        Ok((out, missed))
    }

    /// Appends one round of `table`'s rules as `seq`: its transitions, the rule set they
    /// were computed with and the Silver progress they cover. `rules/hits` follows with
    /// [`Self::merge_hits`]; `hits_only_changes`: that commit will carry changes no
    /// transition records (a backfill's new rule versions), recorded here so that a start
    /// can tell they are missing ([`Loaded::backfill_pending`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn append(
        &mut self,
        table: &str,
        seq: i64,
        ruleset: i64,
        progress: &Progress,
        transitions: &[Transition],
        origin: Origin,
        hits_only_changes: bool,
    ) -> Result<(), LakeError> {
        let mut txns = progress.transactions_as(APP, table);
        txns.push(Transaction::new(Self::seq_app(table), seq));
        txns.push(Transaction::new(format!("{APP}/{table}/ruleset"), ruleset));
        if hits_only_changes {
            txns.push(Transaction::new(Self::backfill_app(table), seq));
        }
        let n = transitions.len();
        let batch = RecordBatch::try_new(
            transitions_schema(),
            vec![
                Arc::new(StringArray::from_iter_values(
                    transitions.iter().map(|t| t.rule_id.as_str()),
                )),
                Arc::new(Int64Array::from_iter_values(
                    transitions.iter().map(|t| t.rule_version),
                )),
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(table, n))),
                Arc::new(StringArray::from_iter_values(
                    transitions.iter().map(|t| t.key.as_str()),
                )),
                Arc::new(StringArray::from_iter_values(
                    transitions.iter().map(Transition::name),
                )),
                Arc::new(Int64Array::from_iter_values(
                    transitions.iter().map(|t| t.lsn),
                )),
                Arc::new(
                    TimestampMicrosecondArray::from(
                        transitions.iter().map(|t| t.commit_ts).collect::<Vec<_>>(),
                    )
                    .with_timezone("UTC"),
                ),
                Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    origin.as_str(),
                    n,
                ))),
                Arc::new(Int64Array::from_iter_values(std::iter::repeat_n(seq, n))),
            ],
        )
        .map_err(|e| rows_error(table, e))?;
        let props =
            delta::commit_metadata([("wal2delta.stage".to_owned(), serde_json::json!("rules"))])
                .with_application_transactions(txns);
        let t = match self
            .kept_transitions
            .latest("rules/transitions", &self.transitions)
            .await?
        {
            Some(t) => t,
            None => delta::handle("rules/transitions", &self.transitions)?,
        };
        t.write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(props)
            .await
            .map_err(LakeError::delta(&"rules/transitions"))?;
        Ok(())
    }

    /// Commits `changes` (in order: the last change of a (key, rule) decides) to
    /// `rules/hits` as reflecting the transitions up to `seq`, and the changes of the
    /// backfill appended as seq `backfill` when they are among them
    /// ([`Loaded::backfill_pending`]). The future borrows nothing, so it can run beside
    /// the rounds ([`super::table`]); it holds [`HITS_COMMITS`] while it refreshes the
    /// table and commits.
    pub fn merge_hits(
        &self,
        table: &str,
        seq: i64,
        changes: Vec<HitChange>,
        backfill: Option<i64>,
    ) -> impl std::future::Future<Output = Result<(), LakeError>> + Send + 'static {
        let (kept, url, table) = (self.kept_hits.clone(), self.hits.clone(), table.to_owned());
        async move {
            let batch = hits_batch(&table, &changes)?;
            let _one_at_a_time = HITS_COMMITS.lock().await;
            let mut kept = kept.lock().await;
            let mut txns = vec![Transaction::new(RulesStore::seq_app(&table), seq)];
            if let Some(b) = backfill {
                txns.push(Transaction::new(RulesStore::backfill_app(&table), b));
            }
            commit_hits(&mut kept, &url, &table, txns, batch).await
        }
    }
}

/// The rows `changes` give `rules/hits`; the MERGE deletes those no longer hit (`hit`
/// false).
fn hits_batch(table: &str, changes: &[HitChange]) -> Result<RecordBatch, LakeError> {
    let n = changes.len();
    let get = |f: fn(&(i64, i64, Option<i64>)) -> i64| {
        Int64Array::from_iter_values(changes.iter().map(|c| c.2.as_ref().map_or(0, f)))
    };
    RecordBatch::try_new(
        hits_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(table, n))),
            Arc::new(StringArray::from_iter_values(
                changes.iter().map(|c| c.1.as_str()),
            )),
            Arc::new(get(|h| h.0)),
            Arc::new(StringArray::from_iter_values(
                changes.iter().map(|c| c.0.as_str()),
            )),
            Arc::new(get(|h| h.1)),
            Arc::new(
                TimestampMicrosecondArray::from(
                    changes
                        .iter()
                        .map(|c| c.2.as_ref().and_then(|h| h.2))
                        .collect::<Vec<_>>(),
                )
                .with_timezone("UTC"),
            ),
            Arc::new(deltalake::arrow::array::BooleanArray::from_iter(
                changes.iter().map(|c| Some(c.2.is_some())),
            )),
        ],
    )
    .map_err(|e| rows_error(table, e))
}

async fn commit_hits(
    kept: &mut delta::Kept,
    url: &Url,
    table: &str,
    txns: Vec<Transaction>,
    batch: RecordBatch,
) -> Result<(), LakeError> {
    let props =
        delta::commit_metadata([("wal2delta.stage".to_owned(), serde_json::json!("rules"))])
            .with_application_transactions(txns);
    let err = LakeError::delta(&"rules/hits");
    let Some(target) = kept.latest("rules/hits", url).await? else {
        // The first commit: the matching rows are the table.
        let hits =
            deltalake::arrow::compute::filter_record_batch(&batch, batch.column(6).as_boolean())
                .map_err(|e| rows_error(table, e))?;
        delta::handle("rules/hits", url)?
            .write(vec![hits])
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(props)
            .await
            .map_err(err)?;
        return Ok(());
    };
    let ctx = delta::session();
    let source = ctx
        .read_batch(batch)
        .map_err(|e| LakeError::delta(&"rules/hits")(e.into()))?;
    let on = format!(
            "target.\"table\" = {} AND target.\"table\" = source.\"table\" AND target.rule_id = source.rule_id AND target.key = source.key",
            literal(table)
        );
    let cols = [
        "table",
        "rule_id",
        "rule_version",
        "key",
        "lsn",
        "commit_ts",
        "hit",
    ];
    target
        .merge(source, on)
        .with_source_alias("source")
        .with_target_alias("target")
        .with_session_state(delta::merge_session())
        .with_commit_properties(props)
        .when_matched_delete(|d| d.predicate("NOT source.hit"))
        .and_then(|m| {
            m.when_matched_update(|u| {
                cols.iter().fold(u.predicate("source.hit"), |u, c| {
                    u.update(format!("\"{c}\""), format!("source.\"{c}\""))
                })
            })
        })
        .and_then(|m| {
            m.when_not_matched_insert(|i| {
                cols.iter().fold(i.predicate("source.hit"), |i, c| {
                    i.set(format!("\"{c}\""), format!("source.\"{c}\""))
                })
            })
        })
        .map_err(err)?
        .await
        .map_err(LakeError::delta(&"rules/hits"))?;
    Ok(())
}

/// The hits changes of `transitions` (in order): the last transition of each (key, rule)
/// decides.
pub(super) fn changes_of(transitions: &[Transition]) -> Vec<HitChange> {
    let mut last: std::collections::BTreeMap<(&str, &str), &Transition> =
        std::collections::BTreeMap::new();
    for t in transitions {
        last.insert((t.key.as_str(), t.rule_id.as_str()), t);
    }
    last.into_values()
        .map(|t| {
            let hit = t.entered.then_some((t.rule_version, t.lsn, t.commit_ts));
            (t.key.clone(), t.rule_id.clone(), hit)
        })
        .collect()
}

fn rows_error(table: &str, e: impl std::fmt::Display) -> LakeError {
    LakeError::Rows {
        table: table.to_owned(),
        reason: format!("rules: {e}"),
    }
}

/// Hit counts per (table, rule id) now (for `rules list`): `rules/hits` rolled forward
/// with the transitions it does not reflect yet ([`RulesStore::read`]).
pub async fn hit_counts(
    lake: &crate::Lake,
) -> Result<std::collections::BTreeMap<(String, String), i64>, LakeError> {
    let mut out = std::collections::BTreeMap::new();
    // Every hit entered through a transition: the transitions name every table.
    let Some(t) = delta::open("rules/transitions", &lake.rules_transitions()).await? else {
        return Ok(out);
    };
    let mut tables = Vec::new();
    let sql = "SELECT DISTINCT \"table\" FROM t";
    for b in delta::query("rules/transitions", &t, sql).await? {
        let names = b.column(0).as_string::<i32>();
        tables.extend((0..b.num_rows()).map(|i| names.value(i).to_owned()));
    }
    let store = RulesStore::new(lake);
    for table in tables {
        let (loaded, _) = store.read(&table).await?;
        for rule in loaded.hits.values().flat_map(|h| h.keys()) {
            *out.entry((table.clone(), rule.to_string())).or_insert(0) += 1;
        }
    }
    Ok(out)
}
