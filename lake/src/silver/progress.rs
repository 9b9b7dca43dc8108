//! Silver's progress through Bronze, and which read changes may be applied now.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use deltalake::arrow::array::BooleanArray;
use deltalake::kernel::Transaction;
use deltalake::DeltaTable;
use wal2delta_model::ChangeOp;

use super::rows::{BronzeError, BronzeRows};
use super::Position;
use crate::{delta, LakeError};

/// Where a Silver table stands, stored as `txn` actions in its commits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every source transaction with a commit LSN at or below this is applied whole.
    pub watermark: i64,
    /// Per Bronze partition (= Kafka partition), the last offset read.
    pub cursors: BTreeMap<i32, i64>,
    /// The latest TRUNCATE applied.
    pub truncated: Option<Position>,
    /// A source transaction above the watermark applied in pieces ([`Pieces`]): its
    /// events at or below the cursors are applied, the rest are not yet.
    pub partial: Option<i64>,
}

/// The `txn` app id prefix of Silver's own progress.
const SILVER: &str = "wal2delta-silver";

impl Progress {
    /// Reads the progress recorded in `silver` (the table's loaded state).
    pub async fn load(table: &str, silver: &DeltaTable) -> Result<Self, LakeError> {
        Self::load_as(SILVER, table, silver).await
    }

    /// Reads the progress recorded under app ids `{prefix}/{table}/...` in `delta`.
    pub(crate) async fn load_as(
        prefix: &str,
        table: &str,
        delta: &DeltaTable,
    ) -> Result<Self, LakeError> {
        let app = |what: &str| format!("{prefix}/{table}/{what}");
        let get = |what: &str| delta::txn_version(table, delta, app(what));
        let watermark = get("watermark").await?.unwrap_or(0);
        let partitions = get("partitions").await?.unwrap_or(0);
        let mut cursors = BTreeMap::new();
        for p in 0..partitions {
            if let Some(o) = get(&format!("offset/{p}")).await? {
                cursors.insert(p as i32, o);
            }
        }
        let truncated = match (get("truncate_lsn").await?, get("truncate_ordinal").await?) {
            (Some(l), Some(o)) => Some(Position(l, o)),
            _ => None,
        };
        // Written as 0 once the transaction is whole; a value the watermark passed is
        // stale in the same way.
        let partial = get("partial_lsn").await?.filter(|l| *l > watermark);
        Ok(Progress {
            watermark,
            cursors,
            truncated,
            partial,
        })
    }

    /// The `txn` actions that record this progress.
    pub fn transactions(&self, table: &str) -> Vec<Transaction> {
        self.transactions_as(SILVER, table)
    }

    /// The `txn` actions that record this progress under app ids `{prefix}/{table}/...`.
    pub(crate) fn transactions_as(&self, prefix: &str, table: &str) -> Vec<Transaction> {
        let app = |table: &str, what: &str| format!("{prefix}/{table}/{what}");
        let mut out = vec![
            Transaction::new(app(table, "watermark"), self.watermark),
            Transaction::new(
                app(table, "partitions"),
                self.cursors.keys().max().map_or(0, |p| i64::from(*p) + 1),
            ),
        ];
        for (p, o) in &self.cursors {
            out.push(Transaction::new(app(table, &format!("offset/{p}")), *o));
        }
        if let Some(Position(l, o)) = self.truncated {
            out.push(Transaction::new(app(table, "truncate_lsn"), l));
            out.push(Transaction::new(app(table, "truncate_ordinal"), o));
        }
        // Always written, so that the commit which completes the transaction clears it.
        out.push(Transaction::new(
            app(table, "partial_lsn"),
            self.partial.unwrap_or(0),
        ));
        out
    }

    /// Whether every change applied in `other` is applied in this progress too.
    pub fn covers(&self, other: &Progress) -> bool {
        if other.watermark > self.watermark {
            return false;
        }
        match other.partial {
            Some(lsn) if lsn > self.watermark => {
                self.partial == Some(lsn)
                    && other
                        .cursors
                        .iter()
                        .all(|(p, c)| self.cursors.get(p).is_some_and(|s| s >= c))
            }
            _ => true,
        }
    }

    /// Whether the change at `lsn`, read at `offset` of `partition`, is applied in this
    /// progress: its transaction is at or below the watermark, or it is a piece of the
    /// partial transaction the cursor has passed.
    pub fn applied(&self, lsn: i64, partition: i32, offset: i64) -> bool {
        lsn <= self.watermark
            || (self.partial == Some(lsn)
                && self.cursors.get(&partition).is_some_and(|c| offset <= *c))
    }
}

/// How a source transaction too large for one round is applied (issue 15).
///
/// Silver applies a source transaction in one commit, so a reader never sees part of it;
/// a round then holds the whole transaction in memory. Beyond `limit` events that stops:
/// the first transaction that waits (every one below it is applied, so the watermark
/// stands right below it) is applied in pieces of the read window, in
/// successive commits (each records it as [`Progress::partial`]), and the watermark
/// passes it only when every one of its events is applied. Readers see it partly applied
/// meanwhile; promise 2 still holds, because every piece merges by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pieces {
    /// Events above which a transaction is applied in pieces.
    pub limit: u64,
    /// The partial transaction whose every event this round's cursors pass (checked
    /// against Bronze by the caller after a first plan): it now counts as whole.
    pub complete: Option<i64>,
}

impl Pieces {
    /// The default limit (`[silver] max_atomic_transaction_rows`): a round holds about
    /// 1.4 KB per change of a whole transaction (docs/benchmarks.md), so about 0.7 GB.
    pub const DEFAULT_LIMIT: u64 = 500_000;

    /// Every transaction is applied whole, whatever its size.
    pub const NEVER: Pieces = Pieces {
        limit: u64::MAX,
        complete: None,
    };
}

/// What the transaction records say, for one table.
#[derive(Debug, Clone, Default)]
pub struct TransactionCounts {
    /// The highest LSN the records reach: every transaction committed at or below it has
    /// its END record among them.
    pub top: i64,
    /// Events per transaction (commit LSN) for this table.
    pub events: BTreeMap<i64, u64>,
    /// Events Bronze quarantined and an operator resolved (`quarantine resolve`), per
    /// transaction, as (Kafka partition, ordinal): they count as held, so the watermark
    /// passes their transaction without them.
    pub resolved: BTreeMap<i64, BTreeSet<(i32, i64)>>,
}

impl TransactionCounts {
    /// How many distinct events of transaction `lsn` count as held: those in `held` (read
    /// from Bronze) and the resolved ones.
    pub fn held(&self, lsn: i64, held: Option<&BTreeSet<(i32, i64)>>) -> u64 {
        match (held, self.resolved.get(&lsn)) {
            (Some(h), Some(r)) => h.union(r).count() as u64,
            (Some(h), None) => h.len() as u64,
            (None, Some(r)) => r.len() as u64,
            (None, None) => 0,
        }
    }
}

/// What to do with the rows read in one round.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Which rows may be applied now.
    pub applicable: BooleanArray,
    /// The progress after applying them.
    pub progress: Progress,
    /// Transactions above the new watermark that Bronze does not hold whole yet.
    pub waiting: usize,
    /// The commit LSN of the first of them.
    pub first_waiting: Option<i64>,
}

/// Decides, for `rows` (Bronze rows read after `before`'s cursors; it reads their op,
/// position and Kafka coordinates), how far the watermark moves and which rows are applied.
pub fn plan(
    rows: &BronzeRows,
    before: &Progress,
    counts: &TransactionCounts,
    pieces: Pieces,
) -> Result<Plan, BronzeError> {
    let coordinates = rows.coordinates()?;
    let n = rows.num_rows();
    // Snapshot rows and snapshot ends (`s`) belong to no source transaction.
    let streamed = |i: usize| !matches!(rows.op(i), Some(ChangeOp::Read | ChangeOp::SnapshotEnd));

    // Distinct events Bronze holds per transaction above the watermark.
    let mut held: HashMap<i64, BTreeSet<(i32, i64)>> = HashMap::new();
    // (Resolved Bronze quarantine records count too: `TransactionCounts::held`.)
    for (i, &(partition, _)) in coordinates.iter().enumerate() {
        let Position(l, ordinal) = rows.position(i);
        if streamed(i) && l > before.watermark && l <= counts.top {
            held.entry(l).or_default().insert((partition, ordinal));
        }
    }
    let mut watermark = counts.top.max(before.watermark);
    let mut waiting = 0;
    let mut first_waiting_lsn = None;
    let mut partial = None;
    // `range` panics on an empty inclusive range whose start passed its end: the records
    // may reach no further than the watermark (nothing new, or counts read earlier).
    let above = counts
        .events
        .range(before.watermark.saturating_add(1)..)
        .take_while(|(l, _)| **l <= counts.top);
    for (&l, &need) in above {
        let have = counts.held(l, held.get(&l));
        if have < need && pieces.complete != Some(l) {
            if waiting == 0 {
                watermark = l - 1;
                first_waiting_lsn = Some(l);
                // Everything below the first waiting transaction applies, so it can go
                // in pieces; once in pieces it stays so (a changed limit must not strand
                // the pieces already applied behind the cursors).
                if before.partial == Some(l) || need > pieces.limit {
                    partial = Some(l);
                }
            }
            waiting += 1;
        }
    }
    let applicable: BooleanArray = (0..n)
        .map(|i| {
            let l = rows.commit_lsn(i);
            Some(!streamed(i) || l <= watermark || Some(l) == partial)
        })
        .collect();

    // Each partition's cursor stops before its first row that waits.
    let mut cursors = before.cursors.clone();
    let mut first_waiting: BTreeMap<i32, i64> = BTreeMap::new();
    let mut last_read: BTreeMap<i32, i64> = BTreeMap::new();
    for (i, &(p, o)) in coordinates.iter().enumerate() {
        let e = last_read.entry(p).or_insert(o);
        *e = (*e).max(o);
        if !applicable.value(i) {
            let w = first_waiting.entry(p).or_insert(o);
            *w = (*w).min(o);
        }
    }
    for (p, last) in last_read {
        let next = match first_waiting.get(&p) {
            Some(w) => w - 1,
            None => last,
        };
        let c = cursors.entry(p).or_insert(-1);
        *c = (*c).max(next);
    }
    let truncated = (0..n)
        .filter(|&i| applicable.value(i) && rows.op(i) == Some(ChangeOp::Truncate))
        .map(|i| rows.position(i))
        .chain(before.truncated)
        .max();
    Ok(Plan {
        applicable,
        progress: Progress {
            watermark,
            cursors,
            truncated,
            partial,
        },
        waiting,
        first_waiting: first_waiting_lsn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{Int32Array, Int64Array, RecordBatch, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    use wal2delta_model::bronze;

    #[test]
    fn a_progress_covers_what_another_applied() {
        let p = |watermark, partial, cursors: &[(i32, i64)]| Progress {
            watermark,
            partial,
            cursors: cursors.iter().copied().collect(),
            truncated: None,
        };
        let at_10 = p(10, None, &[(0, 5)]);
        assert!(at_10.covers(&at_10));
        assert!(
            at_10.covers(&p(8, None, &[(0, 9)])),
            "cursors alone apply nothing"
        );
        assert!(!at_10.covers(&p(12, None, &[(0, 5)])));
        // Pieces of transaction 20: covered only by the same transaction's cursors past them.
        let piece = p(10, Some(20), &[(0, 7), (1, 3)]);
        assert!(!at_10.covers(&piece));
        assert!(p(10, Some(20), &[(0, 7), (1, 4)]).covers(&piece));
        assert!(!p(10, Some(20), &[(0, 6), (1, 4)]).covers(&piece));
        assert!(
            p(20, None, &[]).covers(&piece),
            "the whole transaction applied"
        );
        assert!(!piece.covers(&p(20, None, &[])));
    }

    /// [`super::plan`] of a batch.
    fn plan(
        r: &RecordBatch,
        before: &Progress,
        c: &TransactionCounts,
    ) -> Result<Plan, BronzeError> {
        super::plan(&BronzeRows::new(r)?, before, c, Pieces::NEVER)
    }

    /// Rows: (op, commit_lsn, ordinal, partition, offset).
    fn rows(r: &[(&str, i64, i64, i32, i64)]) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new(bronze::OP, DataType::Utf8, true),
            Field::new(bronze::COMMIT_LSN, DataType::Int64, true),
            Field::new(bronze::ORDINAL, DataType::Int64, true),
            Field::new(bronze::KAFKA_PARTITION, DataType::Int32, true),
            Field::new(bronze::KAFKA_OFFSET, DataType::Int64, true),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(StringArray::from_iter_values(r.iter().map(|x| x.0))),
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.1))),
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.2))),
                Arc::new(Int32Array::from_iter_values(r.iter().map(|x| x.3))),
                Arc::new(Int64Array::from_iter_values(r.iter().map(|x| x.4))),
            ],
        )
        .unwrap()
    }

    fn counts(top: i64, e: &[(i64, u64)]) -> TransactionCounts {
        TransactionCounts {
            top,
            events: e.iter().copied().collect(),
            ..TransactionCounts::default()
        }
    }

    #[test]
    fn a_resolved_bronze_record_counts_as_held_and_only_once() {
        // Transaction 200 has 3 events; Bronze quarantined the one in partition 1.
        let r = rows(&[
            ("c", 200, 1, 0, 0),
            ("c", 200, 2, 0, 1),
            ("c", 300, 1, 0, 2),
        ]);
        let mut c = counts(300, &[(200, 3), (300, 1)]);
        let p = plan(&r, &Progress::default(), &c).unwrap();
        assert_eq!(p.progress.watermark, 199, "waits while the record is open");
        c.resolved.insert(200, BTreeSet::from([(1, 3)]));
        let p = plan(&r, &Progress::default(), &c).unwrap();
        assert_eq!(p.progress.watermark, 300, "passes once it is resolved");
        assert!((0..3).all(|i| p.applicable.value(i)));
        // A resolved record of an event Bronze also holds (a re-published copy) is
        // counted once: 2 distinct events of 3 do not make the transaction whole.
        c.resolved.insert(200, BTreeSet::from([(0, 2)]));
        let p = plan(&r, &Progress::default(), &c).unwrap();
        assert_eq!(p.progress.watermark, 199);
    }

    #[test]
    fn a_transaction_waits_until_every_partition_has_its_events() {
        // Transaction 100 has 2 events (one per partition), 200 has 2 in partition 0 and
        // one in partition 1 that has not arrived.
        let r = rows(&[
            ("c", 100, 1, 0, 0),
            ("c", 200, 1, 0, 1),
            ("c", 200, 2, 0, 2),
            ("c", 100, 2, 1, 0),
        ]);
        let p = plan(
            &r,
            &Progress::default(),
            &counts(200, &[(100, 2), (200, 3)]),
        )
        .unwrap();
        assert_eq!(p.progress.watermark, 199);
        assert_eq!(p.waiting, 1);
        let applied: Vec<bool> = (0..4).map(|i| p.applicable.value(i)).collect();
        assert_eq!(applied, vec![true, false, false, true]);
        // Partition 0 is re-read from its first waiting row; partition 1 moved on.
        assert_eq!(p.progress.cursors, BTreeMap::from([(0, 0), (1, 0)]));
    }

    #[test]
    fn duplicates_do_not_complete_a_transaction_and_old_ones_apply() {
        // The same event twice (re-published) counts once.
        let r = rows(&[("u", 300, 1, 0, 5), ("u", 300, 1, 0, 6), ("u", 50, 1, 1, 9)]);
        let before = Progress {
            watermark: 100,
            ..Progress::default()
        };
        let p = plan(&r, &before, &counts(300, &[(300, 2)])).unwrap();
        assert_eq!(p.progress.watermark, 299);
        assert!(
            p.applicable.value(2),
            "a duplicate below the watermark applies (idempotent)"
        );
        assert_eq!(p.progress.cursors[&0], 4);
    }

    #[test]
    fn snapshot_rows_apply_at_once_and_watermarks_advance_idle_tables() {
        let r = rows(&[("r", 10, 0, 0, 0), ("r", 10, 0, 1, 0)]);
        let p = plan(&r, &Progress::default(), &counts(500, &[])).unwrap();
        assert_eq!(p.progress.watermark, 500);
        assert!(p.applicable.value(0) && p.applicable.value(1));
        assert_eq!(p.progress.cursors, BTreeMap::from([(0, 0), (1, 0)]));
    }

    #[test]
    fn truncates_are_remembered() {
        let r = rows(&[("t", 100, 1, 0, 0), ("t", 100, 1, 1, 0)]);
        let p = plan(&r, &Progress::default(), &counts(100, &[(100, 2)])).unwrap();
        assert_eq!(p.progress.truncated, Some(Position(100, 1)));
    }

    #[test]
    fn records_that_reach_no_further_than_the_watermark_change_nothing() {
        // Counts read before a round that already passed them (a rebuild reuses them).
        let before = Progress {
            watermark: 300,
            ..Progress::default()
        };
        let r = rows(&[("u", 300, 1, 0, 5)]);
        let p = plan(&r, &before, &counts(300, &[(300, 1)])).unwrap();
        assert_eq!(p.progress.watermark, 300);
        assert_eq!(p.waiting, 0);
        let p = plan(&r, &before, &counts(200, &[(100, 1)])).unwrap();
        assert_eq!(p.progress.watermark, 300);
    }

    #[test]
    fn a_transaction_over_the_limit_is_applied_in_pieces() {
        // Transaction 200 has 5 events; the read holds 3 of them (cut off by the window
        // in partition 0) and one event of 300 behind them in partition 1.
        let r = rows(&[
            ("u", 200, 1, 0, 10),
            ("u", 200, 2, 0, 11),
            ("u", 200, 4, 1, 20),
            ("c", 300, 1, 1, 21),
        ]);
        let before = Progress {
            watermark: 100,
            ..Progress::default()
        };
        let c = counts(300, &[(200, 5), (300, 1)]);
        let whole = super::plan(&BronzeRows::new(&r).unwrap(), &before, &c, Pieces::NEVER).unwrap();
        assert!(
            (0..4).all(|i| !whole.applicable.value(i)),
            "under the limit it waits whole"
        );
        assert_eq!(whole.progress.partial, None);

        let pieces = Pieces {
            limit: 4,
            complete: None,
        };
        let p = super::plan(&BronzeRows::new(&r).unwrap(), &before, &c, pieces).unwrap();
        let applied: Vec<bool> = (0..4).map(|i| p.applicable.value(i)).collect();
        assert_eq!(applied, vec![true, true, true, false]);
        assert_eq!(
            p.progress.watermark, 199,
            "the watermark waits for its last piece"
        );
        assert_eq!(p.progress.partial, Some(200));
        assert_eq!(p.progress.cursors, BTreeMap::from([(0, 11), (1, 20)]));
        assert_eq!(p.first_waiting, Some(200));
        assert!(p.progress.applied(200, 0, 11) && !p.progress.applied(200, 0, 12));
        assert!(p.progress.applied(150, 5, 0) && !p.progress.applied(300, 1, 21));

        // Once in pieces it stays so, even when the limit is raised meanwhile.
        let next = rows(&[("u", 200, 3, 0, 12), ("u", 200, 5, 1, 22)]);
        let p2 = super::plan(
            &BronzeRows::new(&next).unwrap(),
            &p.progress,
            &c,
            Pieces::NEVER,
        )
        .unwrap();
        assert!(p2.applicable.value(0) && p2.applicable.value(1));
        assert_eq!(p2.progress.partial, Some(200));

        // The caller found every event applied: the watermark passes it, and the
        // transaction behind it applies in the same round.
        let done = Pieces {
            limit: 4,
            complete: Some(200),
        };
        let p3 = super::plan(&BronzeRows::new(&r).unwrap(), &before, &c, done).unwrap();
        assert_eq!(p3.progress.watermark, 300);
        assert_eq!(p3.progress.partial, None);
        assert!((0..4).all(|i| p3.applicable.value(i)));
    }
}
