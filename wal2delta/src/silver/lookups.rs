//! The silver stage's side of rule lookups (docs/rules.md, "Lookups"): a table whose rules
//! look up another is applied after it, and sees it as of each change's commit:
//!
//! - the looked-up table applies a change only once every table looking it up applied all
//!   below it ([`looked_up_cap`]), so its Silver rows are never newer than a reader's next
//!   change;
//! - right after its round, the stage reads its unapplied changes
//!   (`wal2delta_lake::silver::Unapplied`: what its next round will apply, whole
//!   transactions up to a `reach`), and a table looking it up applies everything up to
//!   that reach in one round, its lookups seeing those changes over the Silver rows
//!   ([`lookup_cap`]);
//! - when they are not known (the looked-up table failed, or is in the middle of a
//!   transaction applied in pieces), a table looking it up applies only up to just below
//!   its next change, in lock-step with it: one looked-up change per round.
//!
//! So a lookup sees the related rows exactly as of the change's commit (a related row
//! changed in the change's own transaction included), never older, never newer, and a
//! replay gives the same lookups.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use wal2delta_lake::silver::TransactionCounts;

/// `names` with every table after the tables its rules look up (`targets`), otherwise in
/// their order. Lookup cycles are refused when rules are loaded; should one remain, its
/// tables keep their order (and wait for each other until the lookup timeout).
pub(super) fn lookups_first(
    names: Vec<String>,
    targets: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    let mut left = names;
    while !left.is_empty() {
        let ready = |n: &String, left: &[String]| {
            targets
                .get(n)
                .is_none_or(|ts| ts.iter().all(|t| t == n || !left.contains(t)))
        };
        let i = (0..left.len())
            .find(|&i| ready(&left[i], &left))
            .unwrap_or(0);
        out.push(left.remove(i));
    }
    out
}

/// The first transaction of a table above `after` in its transaction records.
fn next_change(counts: Option<&TransactionCounts>, after: i64) -> Option<i64> {
    counts?
        .events
        .range(after.saturating_add(1)..)
        .next()
        .map(|(l, _)| *l)
}

/// How far a table whose rules look up the tables `related` ((watermark, transaction
/// records, the reach of their unapplied changes read this round)) may apply: up to the
/// reach of each one's unapplied changes, or, when they are not known, in lock-step with
/// it: up to just below its first change above its watermark (`None`: no limit). Either
/// way every related change at or below the cap is known, so a lookup sees the related
/// rows as of the change's own commit.
pub(super) fn lookup_cap<'c>(
    related: impl IntoIterator<Item = (i64, Option<&'c TransactionCounts>, Option<i64>)>,
) -> Option<i64> {
    related
        .into_iter()
        .map(|(watermark, counts, reach)| match reach {
            Some(r) => next_change(counts, r).map_or(i64::MAX, |_| r),
            None => next_change(counts, watermark).map_or(i64::MAX, |l| l.saturating_sub(1)),
        })
        .min()
        .filter(|c| *c < i64::MAX)
}

/// How far a looked-up table may apply in lock-step with the tables whose rules look it
/// up (their watermarks `readers`): a change of it at `e` only once every reader applied
/// everything below `e` (`None`: no limit). Its later changes wait, so no reader's lookup
/// sees a related row newer than the reader's change.
pub(super) fn looked_up_cap(
    own: Option<&TransactionCounts>,
    readers: impl IntoIterator<Item = i64>,
) -> Option<i64> {
    readers
        .into_iter()
        .map(|w| next_change(own, w.saturating_add(1)).map_or(i64::MAX, |l| l.saturating_sub(1)))
        .min()
        .filter(|c| *c < i64::MAX)
}

/// What a table's round may apply.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// Everything the transaction records reach.
    Free,
    /// The transactions up to `top` only; `waiting`: some of this table's transactions
    /// lie past it (the hold has a cost, and its timer runs).
    Capped { top: i64, waiting: bool },
    /// Held past the timeout: everything, the lookups see the related tables as they are.
    TimedOut,
}

/// The hold of a table at watermark `before` that may apply up to `cap` (`None`: no
/// limit; [`lookup_cap`], [`looked_up_cap`], the rules table's position), given the
/// transaction records `counts` and how long it has been held with changes waiting.
pub(super) fn hold(
    cap: Option<i64>,
    before: i64,
    counts: &TransactionCounts,
    held_for: Option<Duration>,
    timeout: Duration,
) -> Hold {
    let Some(cap) = cap.filter(|&c| c < counts.top) else {
        return Hold::Free;
    };
    let top = cap.max(before);
    // The table may stand past the records read this round (they are read above the
    // lowest watermark of the tables not backing off): then nothing of it waits.
    let waiting = top < counts.top
        && counts
            .events
            .range(top.saturating_add(1)..=counts.top)
            .next()
            .is_some();
    if waiting && held_for.is_some_and(|h| h >= timeout) {
        return Hold::TimedOut;
    }
    Hold::Capped { top, waiting }
}

/// The holds of the tables whose rules look others up: since when each holds changes back,
/// and whether it was released past the timeout.
///
/// A hold is released once: past `[rules] lookup_timeout_ms` the table applies everything
/// its transaction records reach, round after round, until the looked-up tables catch up
/// with the transaction records; only then can a new hold begin. (Releasing one round and
/// holding again would advance such a table one round per timeout, falling behind without
/// bound while a looked-up table keeps failing.)
#[derive(Debug, Default)]
pub(super) struct Holds {
    began: HashMap<String, Began>,
}

#[derive(Debug)]
struct Began {
    at: Instant,
    released: bool,
}

/// What a table's round may apply, as [`Holds::decide`] decided.
#[derive(Debug)]
pub(super) struct Decision {
    pub counts: TransactionCounts,
    /// The hold was released in this round, past the timeout, after this long (once per
    /// hold: what to log and count).
    pub released_after: Option<Duration>,
}

impl Holds {
    /// The transaction records table `name` (at watermark `before`) may apply this round
    /// when the tables it looks up stand at `cap` ([`hold`]).
    pub(super) fn decide(
        &mut self,
        name: &str,
        cap: Option<i64>,
        before: i64,
        counts: TransactionCounts,
        timeout: Duration,
        now: Instant,
    ) -> Decision {
        let held_for = self
            .began
            .get(name)
            .map(|b| now.saturating_duration_since(b.at));
        let free = |counts| Decision {
            counts,
            released_after: None,
        };
        match hold(cap, before, &counts, held_for, timeout) {
            Hold::Free => {
                self.began.remove(name);
                free(counts)
            }
            Hold::Capped { top, waiting } => {
                let released = self.began.get(name).is_some_and(|b| b.released);
                if waiting {
                    self.began.entry(name.to_owned()).or_insert(Began {
                        at: now,
                        released: false,
                    });
                } else if !released {
                    // Nothing waits: the next wait is a new hold.
                    self.began.remove(name);
                }
                free(TransactionCounts { top, ..counts })
            }
            Hold::TimedOut => {
                let began = self.began.entry(name.to_owned()).or_insert(Began {
                    at: now,
                    released: false,
                });
                let first = !began.released;
                began.released = true;
                Decision {
                    counts,
                    released_after: first.then(|| held_for.unwrap_or_default()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(top: i64, txns: &[i64]) -> TransactionCounts {
        TransactionCounts {
            top,
            events: txns.iter().map(|&l| (l, 1)).collect(),
            ..TransactionCounts::default()
        }
    }

    #[test]
    fn a_table_waits_for_the_tables_it_looks_up_until_the_timeout() {
        let t = Duration::from_secs(30);
        let c = counts(100, &[40, 90]);
        // Nothing looked up, or the related table caught up: everything.
        assert_eq!(hold(None, 0, &c, None, t), Hold::Free);
        assert_eq!(hold(Some(100), 0, &c, None, t), Hold::Free);
        assert_eq!(hold(Some(150), 0, &c, None, t), Hold::Free);
        // The related table reached 50: the transaction at 90 waits.
        assert_eq!(
            hold(Some(50), 0, &c, None, t),
            Hold::Capped {
                top: 50,
                waiting: true
            }
        );
        assert_eq!(
            hold(Some(50), 0, &c, Some(Duration::from_secs(29)), t),
            Hold::Capped {
                top: 50,
                waiting: true
            }
        );
        assert_eq!(
            hold(Some(50), 0, &c, Some(Duration::from_secs(30)), t),
            Hold::TimedOut
        );
        // Nothing of this table past the cap: capped, but no wait to time.
        assert_eq!(
            hold(Some(95), 0, &c, Some(Duration::from_secs(99)), t),
            Hold::Capped {
                top: 95,
                waiting: false
            }
        );
        // A table past the records read this round is not held, and does not panic.
        assert_eq!(
            hold(Some(10), 150, &c, None, t),
            Hold::Capped {
                top: 150,
                waiting: false
            }
        );
        // A related table behind this one never moves it back.
        assert_eq!(
            hold(Some(10), 60, &c, None, t),
            Hold::Capped {
                top: 60,
                waiting: true
            }
        );
    }

    /// Issue 38, defect 7: past the timeout a hold is released until the looked-up table
    /// catches up, not for one round.
    #[test]
    fn a_hold_is_released_once_until_the_related_table_catches_up() {
        let timeout = Duration::from_secs(30);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut holds = Holds::default();
        let round = |holds: &mut Holds, secs, cap, before, c: &TransactionCounts| {
            holds.decide("s.orders", Some(cap), before, c.clone(), timeout, at(secs))
        };
        // The related table is stuck at 50; this table's transactions keep coming.
        let c = counts(100, &[40, 90]);
        let d = round(&mut holds, 0, 50, 0, &c);
        assert_eq!(d.counts.top, 50, "held");
        let d = round(&mut holds, 10, 50, 40, &c);
        assert_eq!(d.counts.top, 50, "still held");
        let d = round(&mut holds, 30, 50, 40, &c);
        assert_eq!(d.counts.top, 100, "released past the timeout");
        assert_eq!(d.released_after, Some(Duration::from_secs(30)));
        // The next rounds go on at once: no new 30 s hold per round.
        let c = counts(200, &[40, 90, 150]);
        let d = round(&mut holds, 31, 50, 90, &c);
        assert_eq!((d.counts.top, d.released_after), (200, None));
        // A round with nothing of its own past the cap does not start the hold over.
        let d = round(&mut holds, 32, 50, 150, &counts(200, &[40, 90, 150]));
        assert_eq!(d.counts.top, 150);
        let d = round(&mut holds, 33, 50, 150, &counts(300, &[40, 90, 150, 250]));
        assert_eq!(
            (d.counts.top, d.released_after),
            (300, None),
            "still released"
        );
        // The related table catches up: the next wait is a new hold, with its own timeout.
        let d = round(&mut holds, 40, 300, 250, &counts(300, &[250]));
        assert_eq!(d.counts.top, 300);
        let c = counts(400, &[250, 350]);
        let d = round(&mut holds, 41, 320, 300, &c);
        assert_eq!(d.counts.top, 320, "held again");
        let d = round(&mut holds, 70, 320, 300, &c);
        assert_eq!(d.counts.top, 320);
        let d = round(&mut holds, 71, 320, 300, &c);
        assert_eq!(
            (d.counts.top, d.released_after),
            (400, Some(Duration::from_secs(30)))
        );
    }

    #[test]
    fn lookups_go_in_lock_step_with_the_looked_up_tables_changes() {
        // merchants change at 100 and 200; payments at 50, 150, 250.
        let m = counts(300, &[100, 200]);
        // payments (at 0) may go up to just below merchants' next change above merchants'
        // watermark; merchants may apply a change only once payments is below it.
        assert_eq!(lookup_cap([(0, Some(&m), None)]), Some(99));
        assert_eq!(looked_up_cap(Some(&m), [0]), Some(99));
        // payments reached 99: merchants applies 100, not 200.
        assert_eq!(looked_up_cap(Some(&m), [99]), Some(199));
        // merchants at 199 (holds 100): payments goes up to 199.
        assert_eq!(lookup_cap([(199, Some(&m), None)]), Some(199));
        assert_eq!(looked_up_cap(Some(&m), [199]), None);
        assert_eq!(lookup_cap([(300, Some(&m), None)]), None);
        // Several: the lowest.
        assert_eq!(looked_up_cap(Some(&m), [199, 40]), Some(99));
        assert_eq!(
            lookup_cap([(300, Some(&m), None), (0, Some(&m), None)]),
            Some(99)
        );
        assert_eq!(
            lookup_cap([(0, None, None)]),
            None,
            "no records: no change to wait for"
        );
    }

    #[test]
    fn unapplied_changes_let_a_table_pass_the_looked_up_tables_changes() {
        // merchants (at 0) change at 100, 200 and 280; their unapplied changes read this
        // round reach 250: payments goes up to 250 in one round, past two changes, and
        // stops below the change at 280 it does not know yet.
        let m = counts(300, &[100, 200, 280]);
        assert_eq!(lookup_cap([(0, Some(&m), Some(250))]), Some(250));
        // Reaching the last change of the records (or their top): no limit.
        assert_eq!(lookup_cap([(0, Some(&m), Some(280))]), None);
        assert_eq!(lookup_cap([(0, Some(&m), Some(300))]), None);
        // Reaching only to 150 (the change at 200 not whole in Bronze yet): up to 150.
        assert_eq!(lookup_cap([(0, Some(&m), Some(150))]), Some(150));
        // Not known for one of two looked-up tables: lock-step with that one.
        assert_eq!(
            lookup_cap([(0, Some(&m), Some(250)), (0, Some(&m), None)]),
            Some(99)
        );
    }

    #[test]
    fn looked_up_tables_come_first_whatever_the_lake_order() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut targets = BTreeMap::new();
        targets.insert(
            "s.orders".to_owned(),
            BTreeSet::from(["s.shops".to_owned()]),
        );
        targets.insert(
            "s.audit".to_owned(),
            BTreeSet::from(["s.orders".to_owned(), "s.shops".to_owned()]),
        );
        assert_eq!(
            lookups_first(
                names(&["s.audit", "s.orders", "s.other", "s.shops"]),
                &targets
            ),
            names(&["s.other", "s.shops", "s.orders", "s.audit"])
        );
        // A cycle keeps its order instead of looping.
        targets.insert(
            "s.shops".to_owned(),
            BTreeSet::from(["s.orders".to_owned()]),
        );
        assert_eq!(
            lookups_first(names(&["s.orders", "s.shops"]), &targets).len(),
            2
        );
    }
}
