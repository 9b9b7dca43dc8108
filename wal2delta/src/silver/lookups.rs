//! The silver stage's side of rule lookups (docs/rules.md, "Lookups"): a table whose rules
//! look up another is applied after it, and holds its changes until the looked-up table
//! holds every change up to theirs, so a lookup never sees a state older than the change's
//! commit (a related row changed in the change's own transaction included).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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

/// The hold of a table at watermark `before` whose looked-up tables' lowest watermark is
/// `cap` (`None`: it looks nothing up, or they have no Silver table), given the
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
    let waiting = counts
        .events
        .range(top.saturating_add(1)..=counts.top)
        .next()
        .is_some();
    if waiting && held_for.is_some_and(|h| h >= timeout) {
        return Hold::TimedOut;
    }
    Hold::Capped { top, waiting }
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
        // A related table behind this one never moves it back.
        assert_eq!(
            hold(Some(10), 60, &c, None, t),
            Hold::Capped {
                top: 60,
                waiting: true
            }
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
