//! Which Bronze rows one Silver round reads.
//!
//! A round reads, per Bronze partition, the offsets after the partition's cursor up to
//! `cursor + size` (a range the files' offset statistics prune cheaply). Three things can
//! stop such a window from ever moving, and each widens it just enough (issue 11 #1):
//!
//! - **A transaction larger than the window.** Its events in one partition span more than
//!   `size` offsets, so it is never whole inside the window and its rows wait forever.
//!   When the first waiting transaction is whole in Bronze (counted by an aggregate over
//!   its commit LSN, which reads no row values), the window of every partition it touches
//!   reaches to its last event. Memory then holds that transaction's rows at once: Silver
//!   applies a source transaction in one commit, so a reader never sees part of it.
//!   Beyond `[silver] max_atomic_transaction_rows` events it does not widen: the
//!   transaction is applied in pieces of the window instead ([`super::Pieces`]).
//! - **A gap in a partition's offsets wider than the window** (events Bronze quarantined
//!   or the topic dropped): the range holds no row. When a partition reads nothing while
//!   the Bronze table has moved on, the next stored offset is looked up and the window
//!   reaches past the gap. Bronze commits each partition's offsets in order, so offsets
//!   below a stored one that Bronze does not hold never arrive later.
//! - **A partition Silver has not read yet whose first stored offset is past the window.**
//!   Partitions are discovered with a scan of the partition column when the table is
//!   first read and every few minutes after (new partitions are rare); the cheap
//!   per-round check only sees new partitions with an offset below the window.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::datatypes::{Int32Type, Int64Type};

use super::kept::KeptTables;
use super::rows::BronzeRows;
use super::{Plan, Progress, TransactionCounts};
use wal2delta_model::bronze;

use crate::{delta, LakeError};

/// The Bronze columns a window selects by: the log's statistics of these are followed
/// ([`crate::follow`]) and the files' footers read ([`super::files`]).
pub(super) const COORDINATES: &[&str] = &[bronze::KAFKA_PARTITION, bronze::KAFKA_OFFSET];

/// How often partitions are discovered by a scan.
const DISCOVER_EVERY: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub(super) struct Window {
    /// Most Bronze offsets read per partition in one round, unless a reach says more.
    size: i64,
    /// Per partition: read at least through this offset (a large transaction or a gap).
    reach: BTreeMap<i32, i64>,
    /// Partitions found by the last scan, and when it ran.
    discovered: BTreeSet<i32>,
    discovered_at: Option<Instant>,
    /// Per partition that read nothing: the cursor and Bronze version last checked for a
    /// gap, so an idle partition of an idle table costs no query.
    gap_checked: HashMap<i32, (i64, Option<u64>)>,
}

/// The Bronze rows one round reads: in each partition read by range, the offsets after
/// the cursor through the window's end; in any other partition (one not seen yet), the
/// offsets below the window's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Selection {
    /// Per partition: (after, through).
    pub(super) ranges: BTreeMap<i32, (i64, i64)>,
    pub(super) others_below: i64,
}

impl Selection {
    /// Whether the row at `offset` of `partition` is selected.
    pub(super) fn contains(&self, partition: i32, offset: i64) -> bool {
        match self.ranges.get(&partition) {
            Some((after, through)) => offset > *after && offset <= *through,
            None => offset < self.others_below,
        }
    }

    /// Whether a file whose rows lie in partitions `partitions` and offsets `offsets`
    /// (its statistics) may hold a selected row.
    pub(super) fn may_hold(&self, partitions: (i32, i32), offsets: (i64, i64)) -> bool {
        let (low, high) = partitions;
        if low > high {
            return false;
        }
        let mut listed = 0i64;
        for (after, through) in self.ranges.range(low..=high).map(|(_, r)| r) {
            listed += 1;
            if offsets.1 > *after && offsets.0 <= *through {
                return true;
            }
        }
        // A partition in the file's span that is not read by range.
        listed < i64::from(high) - i64::from(low) + 1 && offsets.0 < self.others_below
    }

    /// The same rows as an SQL condition over the Bronze table.
    pub(super) fn sql(&self) -> String {
        let mut terms: Vec<String> = self
            .ranges
            .iter()
            .map(|(part, (after, through))| {
                format!(
                    "(kafka_partition = {part} AND kafka_offset > {after} AND kafka_offset <= {through})"
                )
            })
            .collect();
        terms.push(if self.ranges.is_empty() {
            format!("kafka_offset < {}", self.others_below)
        } else {
            format!(
                "(kafka_partition NOT IN ({}) AND kafka_offset < {})",
                self.ranges
                    .keys()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                self.others_below
            )
        });
        terms.join(" OR ")
    }
}

impl Window {
    pub(super) fn new(size: i64) -> Self {
        Window {
            size: size.max(1),
            reach: BTreeMap::new(),
            discovered: BTreeSet::new(),
            discovered_at: None,
            gap_checked: HashMap::new(),
        }
    }

    pub(super) fn size(&self) -> i64 {
        self.size
    }

    /// The last offset of `partition` this round reads after `cursor`.
    fn end(&self, partition: i32, cursor: i64) -> i64 {
        let own = cursor.saturating_add(self.size);
        self.reach.get(&partition).map_or(own, |r| own.max(*r))
    }

    /// Partitions read by range this round.
    fn partitions(&self, p: &Progress) -> BTreeSet<i32> {
        p.cursors
            .keys()
            .chain(self.reach.keys())
            .chain(self.discovered.iter())
            .copied()
            .collect()
    }

    /// The Bronze rows this round reads after `p`'s cursors.
    pub(super) fn selection(&self, p: &Progress) -> Selection {
        Selection {
            ranges: self
                .partitions(p)
                .into_iter()
                .map(|part| {
                    let c = p.cursors.get(&part).copied().unwrap_or(-1);
                    (part, (c, self.end(part, c)))
                })
                .collect(),
            others_below: self.size,
        }
    }

    /// Before a round's read: discovers partitions when due.
    pub(super) async fn discover(
        &mut self,
        name: &str,
        kept: &mut KeptTables,
        p: &Progress,
    ) -> Result<(), LakeError> {
        if self
            .discovered_at
            .is_some_and(|at| at.elapsed() < DISCOVER_EVERY)
        {
            return Ok(());
        }
        let known = self.partitions(p);
        let filter = if known.is_empty() {
            String::new()
        } else {
            format!(
                " WHERE kafka_partition NOT IN ({})",
                known
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let sql = format!("SELECT DISTINCT kafka_partition FROM t{filter}");
        let table = kept.bronze_table(name).await?;
        for b in delta::query(name, &table, &sql).await? {
            if let Some(a) = b.column(0).as_primitive_opt::<Int32Type>() {
                self.discovered.extend(a.iter().flatten());
            }
        }
        self.discovered_at = Some(Instant::now());
        Ok(())
    }

    /// After a round's read and plan: forgets reaches the cursors passed, looks past gaps
    /// of partitions that read nothing, and reaches to the end of the first waiting
    /// transaction when Bronze holds it whole. Returns whether the window changed so that
    /// reading again at once would get further.
    pub(super) async fn adjust(
        &mut self,
        name: &str,
        kept: &mut KeptTables,
        before: &Progress,
        rows: &BronzeRows<'_>,
        plan: &Plan,
        counts: &TransactionCounts,
    ) -> Result<bool, LakeError> {
        let after = &plan.progress;
        self.reach
            .retain(|part, r| after.cursors.get(part).is_none_or(|c| *c < *r));
        let read = read_per_partition(rows);
        let version = kept.bronze_version();
        let mut changed = false;

        // Gaps: a partition that read nothing although the table has rows beyond.
        for part in self.partitions(before) {
            if read.contains_key(&part) {
                self.gap_checked.remove(&part);
                continue;
            }
            let c = before.cursors.get(&part).copied().unwrap_or(-1);
            if self.gap_checked.get(&part) == Some(&(c, version)) {
                continue;
            }
            self.gap_checked.insert(part, (c, version));
            let next = kept.next_offset(name, part, c).await?;
            if let Some(next) = next {
                if next > self.end(part, c) {
                    tracing::info!(table = %name, partition = part, cursor = c, next, "Bronze offsets have a gap wider than the Silver window: reading past it");
                    self.reach.insert(part, next.saturating_add(self.size - 1));
                    changed = true;
                }
            }
        }

        // A transaction larger than the window: the first waiting one, when some
        // partition's read was cut off by the window and Bronze holds it whole.
        let Some(first) = plan.first_waiting else {
            return Ok(changed);
        };
        let cut_off = read.iter().any(|(part, (_, last))| {
            let c = before.cursors.get(part).copied().unwrap_or(-1);
            *last >= self.end(*part, c)
        });
        let need = counts.events.get(&first).copied().unwrap_or(0);
        if !cut_off || need == 0 {
            return Ok(changed);
        }
        if plan.progress.partial == Some(first) {
            // Applied in pieces of this window: the next piece is ready now.
            return Ok(true);
        }
        let sql = format!(
            "SELECT kafka_partition, MAX(kafka_offset) AS last, COUNT(DISTINCT ordinal) AS events \
             FROM t WHERE commit_lsn = {first} AND op <> 'r' GROUP BY kafka_partition"
        );
        // Resolved Bronze quarantine records of the transaction count as held.
        let mut held = counts.held(first, None);
        let mut ends = BTreeMap::new();
        let table = kept.bronze_table(name).await?;
        for b in delta::query(name, &table, &sql).await? {
            let (Some(part), Some(last), Some(events)) = (
                b.column(0).as_primitive_opt::<Int32Type>(),
                b.column(1).as_primitive_opt::<Int64Type>(),
                b.column(2).as_primitive_opt::<Int64Type>(),
            ) else {
                return Err(LakeError::Rows {
                    table: name.to_owned(),
                    reason: "unexpected types counting a transaction's Bronze events".into(),
                });
            };
            for i in 0..b.num_rows() {
                if part.is_valid(i) && last.is_valid(i) {
                    held += events.value(i).max(0) as u64;
                    ends.insert(part.value(i), last.value(i));
                }
            }
        }
        if held < need {
            return Ok(changed); // not whole in Bronze yet: it waits like any other
        }
        for (part, last) in ends {
            let c = before.cursors.get(&part).copied().unwrap_or(-1);
            if last > self.end(part, c) {
                tracing::info!(table = %name, partition = part, commit_lsn = first, events = need, "a source transaction is larger than the Silver window: reading it whole");
                self.reach.insert(part, last);
                changed = true;
            }
        }
        Ok(changed)
    }
}

/// Per partition read: (rows, highest offset).
fn read_per_partition(rows: &BronzeRows) -> BTreeMap<i32, (usize, i64)> {
    let mut out: BTreeMap<i32, (usize, i64)> = BTreeMap::new();
    for (part, off) in rows.coordinates().unwrap_or_default() {
        let e = out.entry(part).or_insert((0, i64::MIN));
        e.0 += 1;
        e.1 = e.1.max(off);
    }
    out
}
