//! Transitions: which rules a row entered or left, per committed source transaction.
//!
//! The input is every change of a round in position order, each with the rules its new
//! row matches. Per transaction, a key's state before the transaction's first change is
//! compared with its state after the last: a rule it did not match and now matches is
//! `entered`, one it matched and no longer matches (or the row was deleted, or the table
//! truncated) is `left`. A key that matches, stops matching and matches again inside one
//! transaction yields nothing. Keys and rules are visited in sorted order, so the output
//! depends only on the history, never on how it was cut into rounds.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use crate::silver::Position;

/// A rule id, interned ([`rule_id`]): every key that matches a rule shares one allocation
/// of its id.
pub type RuleId = Arc<str>;

/// The one shared copy of rule id `id`. The set only grows with the distinct ids a
/// process has seen, a few hundred.
pub fn rule_id(id: &str) -> RuleId {
    static IDS: OnceLock<Mutex<HashSet<RuleId>>> = OnceLock::new();
    let mut ids = IDS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = ids.get(id) {
        return known.clone();
    }
    let new: RuleId = Arc::from(id);
    ids.insert(new.clone());
    new
}

/// The rules a key currently matches: rule id → the rule version that matched, sorted by
/// rule id.
///
/// Why not a `BTreeMap`: the rules state holds one of these per key that matches any rule,
/// often most of a table's keys, for as long as the process runs. A map's node costs
/// hundreds of bytes and a `String` id another allocation per hit; a sorted vector of
/// interned ids costs 24 bytes per hit (issue 15: the state was most of the Silver
/// process's growth under a steady load).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyHits(Vec<(RuleId, i64)>);

impl KeyHits {
    pub fn new() -> Self {
        KeyHits(Vec::new())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(r, _)| r.as_ref().cmp(id))
    }

    /// Records that the key matches rule `id` at `version` (replacing an earlier version).
    pub fn insert(&mut self, id: RuleId, version: i64) {
        match self.find(&id) {
            Ok(i) => self.0[i].1 = version,
            Err(i) => self.0.insert(i, (id, version)),
        }
    }

    /// Forgets rule `id`; returns the version it matched at.
    pub fn remove(&mut self, id: &str) -> Option<i64> {
        self.find(id).ok().map(|i| self.0.remove(i).1)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.find(id).is_ok()
    }

    pub fn get(&self, id: &str) -> Option<i64> {
        self.find(id).ok().map(|i| self.0[i].1)
    }

    /// (rule id, version), in rule id order.
    pub fn iter(&self) -> impl Iterator<Item = (&RuleId, i64)> + '_ {
        self.0.iter().map(|(r, v)| (r, *v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &RuleId> + '_ {
        self.0.iter().map(|(r, _)| r)
    }

    /// Records rule `id` at `version` where the caller adds rules in id order: appended
    /// without a search when it sorts after every rule held (else [`Self::insert`]).
    pub fn push_in_order(&mut self, id: RuleId, version: i64) {
        match self.0.last() {
            Some((last, _)) if last.as_ref() >= id.as_ref() => self.insert(id, version),
            _ => self.0.push((id, version)),
        }
    }

    /// The (rule id, version) of `self` whose rule `other` does not hold, in id order: one
    /// pass over both sorted vectors instead of a search per rule.
    pub fn only_in_self<'a>(
        &'a self,
        other: &'a KeyHits,
    ) -> impl Iterator<Item = (&'a RuleId, i64)> + 'a {
        let mut j = 0;
        self.0.iter().filter_map(move |(r, v)| {
            while j < other.0.len() && other.0[j].0.as_ref() < r.as_ref() {
                j += 1;
            }
            let held = j < other.0.len()
                && (Arc::ptr_eq(&other.0[j].0, r) || other.0[j].0.as_ref() == r.as_ref());
            (!held).then_some((r, *v))
        })
    }

    /// Keeps the rules for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|(r, _)| keep(r));
    }

    /// Adds every hit of `other` (replacing versions of the same rules).
    pub fn extend(&mut self, other: KeyHits) {
        for (id, v) in other.0 {
            self.insert(id, v);
        }
    }

    /// Drops spare capacity: for hits kept in the state.
    pub fn shrunk(mut self) -> Self {
        self.0.shrink_to_fit();
        self
    }
}

impl FromIterator<(RuleId, i64)> for KeyHits {
    fn from_iter<I: IntoIterator<Item = (RuleId, i64)>>(iter: I) -> Self {
        let mut h = KeyHits::new();
        for (id, v) in iter {
            h.insert(id, v);
        }
        h
    }
}

/// Every key of one table that matches at least one rule (the primary key as JSON).
pub type Hits = HashMap<String, KeyHits>;

/// One change of a round.
#[derive(Debug, Clone)]
pub struct Event {
    pub pos: Position,
    /// Source commit time, microseconds since the epoch.
    pub commit_ts: Option<i64>,
    pub what: What,
}

#[derive(Debug, Clone)]
pub enum What {
    /// The key's row after the change, and the rules it matches.
    Row { key: String, hits: KeyHits },
    /// The key was deleted.
    Delete { key: String },
    /// Every row of the table was removed.
    Truncate,
}

/// A row entering or leaving a rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Transition {
    pub lsn: i64,
    pub key: String,
    pub rule_id: String,
    /// `true`: entered, `false`: left.
    pub entered: bool,
    pub rule_version: i64,
    pub commit_ts: Option<i64>,
}

impl Transition {
    pub fn name(&self) -> &'static str {
        if self.entered {
            "entered"
        } else {
            "left"
        }
    }
}

/// Appends to `out` the transitions of `key` going from `before` to `after`.
pub fn diff(
    key: &str,
    before: Option<&KeyHits>,
    after: Option<&KeyHits>,
    lsn: i64,
    commit_ts: Option<i64>,
    out: &mut Vec<Transition>,
) {
    let empty = KeyHits::new();
    let (before, after) = (before.unwrap_or(&empty), after.unwrap_or(&empty));
    if before == after {
        return;
    }
    for (rule, version) in before.only_in_self(after) {
        out.push(Transition {
            lsn,
            key: key.to_owned(),
            rule_id: rule.to_string(),
            entered: false,
            rule_version: version,
            commit_ts,
        });
    }
    for (rule, version) in after.only_in_self(before) {
        out.push(Transition {
            lsn,
            key: key.to_owned(),
            rule_id: rule.to_string(),
            entered: true,
            rule_version: version,
            commit_ts,
        });
    }
}

/// What a walk changed: the transitions, and the keys whose hits changed (their new
/// hits are in the state; absent = none).
#[derive(Debug, Default)]
pub struct Walked {
    pub transitions: Vec<Transition>,
    pub changed: BTreeSet<String>,
}

/// A source transaction applied to Silver in pieces (`[silver] max_atomic_transaction_rows`)
/// whose last piece has not come yet: the hits its keys had before it, carried from piece
/// to piece, so that its transitions are computed once, over the whole transaction, when
/// the last piece comes. A key that enters in one piece and leaves in the next yields
/// nothing, wherever the pieces were cut.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenTx {
    pub lsn: i64,
    pub commit_ts: Option<i64>,
    pub start: BTreeMap<String, Option<KeyHits>>,
}

/// Applies `events` to `hits` (the state before them) and returns the transitions, per
/// transaction. `events` may come in any order; they are sorted by position.
pub fn walk(hits: &mut Hits, events: Vec<Event>) -> Walked {
    walk_pieces(hits, events, &mut None, None)
}

/// [`walk`] for a round that may end inside a transaction applied in pieces: `partial` is
/// the transaction the round leaves applied in part (its transitions wait in `open`), and
/// `open` what an earlier round left open (continued when this round goes on with it,
/// closed, its transitions emitted, when this round has passed it).
pub fn walk_pieces(
    hits: &mut Hits,
    mut events: Vec<Event>,
    open: &mut Option<OpenTx>,
    partial: Option<i64>,
) -> Walked {
    events.sort_by_key(|e| e.pos);
    let mut out = Walked::default();
    let mut i = 0;
    while i < events.len() {
        let lsn = events[i].pos.0;
        let end = events[i..]
            .iter()
            .position(|e| e.pos.0 != lsn)
            .map_or(events.len(), |n| i + n);
        let tx = &events[i..end];
        // Each touched key's hits before the transaction (its earlier pieces' included).
        let mut tx_open = match open.take() {
            Some(o) if o.lsn == lsn => o,
            Some(o) => {
                close(hits, o, &mut out);
                OpenTx::default()
            }
            None => OpenTx::default(),
        };
        tx_open.lsn = lsn;
        tx_open.commit_ts = tx
            .iter()
            .rev()
            .find_map(|e| e.commit_ts)
            .or(tx_open.commit_ts);
        apply(hits, tx, &mut tx_open.start);
        if partial == Some(lsn) {
            *open = Some(tx_open);
        } else {
            close(hits, tx_open, &mut out);
        }
        i = end;
    }
    if let Some(o) = open.take() {
        if partial == Some(o.lsn) {
            *open = Some(o);
        } else {
            // The round passed the transaction without a change of it left to walk.
            close(hits, o, &mut out);
        }
    }
    out
}

/// Applies one transaction's (or piece's) events to `hits`, noting in `start` the hits
/// each key had before its first change.
fn apply(hits: &mut Hits, tx: &[Event], start: &mut BTreeMap<String, Option<KeyHits>>) {
    for e in tx {
        match &e.what {
            What::Row { key, hits: now } => {
                start
                    .entry(key.clone())
                    .or_insert_with(|| hits.get(key).cloned());
                if now.is_empty() {
                    hits.remove(key);
                } else {
                    // A clone holds no spare capacity.
                    hits.insert(key.clone(), now.clone());
                }
            }
            What::Delete { key } => {
                start
                    .entry(key.clone())
                    .or_insert_with(|| hits.get(key).cloned());
                hits.remove(key);
            }
            What::Truncate => {
                for (key, h) in hits.drain() {
                    start.entry(key).or_insert(Some(h));
                }
            }
        }
    }
}

/// The transitions of a whole transaction: each touched key's hits before it against now.
fn close(hits: &Hits, tx: OpenTx, out: &mut Walked) {
    for (key, before) in tx.start {
        let n = out.transitions.len();
        diff(
            &key,
            before.as_ref(),
            hits.get(&key),
            tx.lsn,
            tx.commit_ts,
            &mut out.transitions,
        );
        if out.transitions.len() > n || before.as_ref() != hits.get(&key) {
            out.changed.insert(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(lsn: i64, ord: i64, key: &str, rules: &[&str]) -> Event {
        Event {
            pos: Position(lsn, ord),
            commit_ts: Some(lsn * 10),
            what: What::Row {
                key: key.into(),
                hits: rules.iter().map(|r| (rule_id(r), 1)).collect(),
            },
        }
    }

    fn names(w: &Walked) -> Vec<(i64, String, String, &'static str)> {
        w.transitions
            .iter()
            .map(|t| (t.lsn, t.key.clone(), t.rule_id.clone(), t.name()))
            .collect()
    }

    fn t(
        lsn: i64,
        key: &str,
        rule: &str,
        what: &'static str,
    ) -> (i64, String, String, &'static str) {
        (lsn, key.into(), rule.into(), what)
    }

    #[test]
    fn enter_and_leave_in_one_round_give_both_transitions() {
        let mut hits = Hits::new();
        let w = walk(
            &mut hits,
            vec![row(20, 0, "k", &[]), row(10, 0, "k", &["big"])],
        );
        assert_eq!(
            names(&w),
            vec![t(10, "k", "big", "entered"), t(20, "k", "big", "left")]
        );
        assert!(hits.is_empty());
    }

    #[test]
    fn inside_one_transaction_only_the_end_state_counts() {
        let mut hits = Hits::new();
        let w = walk(
            &mut hits,
            vec![
                row(10, 0, "k", &["a"]),
                row(10, 1, "k", &[]),
                row(10, 2, "k", &["a", "b"]),
            ],
        );
        assert_eq!(
            names(&w),
            vec![t(10, "k", "a", "entered"), t(10, "k", "b", "entered")]
        );
        let w = walk(
            &mut hits,
            vec![row(11, 0, "k", &[]), row(11, 1, "k", &["a", "b"])],
        );
        assert!(w.transitions.is_empty());
        assert!(w.changed.is_empty());
    }

    #[test]
    fn a_truncate_makes_every_hit_leave_and_a_delete_its_own() {
        let mut hits = Hits::new();
        walk(
            &mut hits,
            vec![row(10, 0, "a", &["r"]), row(10, 1, "b", &["r"])],
        );
        let w = walk(
            &mut hits,
            vec![
                Event {
                    pos: Position(20, 0),
                    commit_ts: None,
                    what: What::Delete { key: "a".into() },
                },
                Event {
                    pos: Position(30, 0),
                    commit_ts: None,
                    what: What::Truncate,
                },
                row(30, 1, "c", &["r"]),
            ],
        );
        assert_eq!(
            names(&w),
            vec![
                t(20, "a", "r", "left"),
                t(30, "b", "r", "left"),
                t(30, "c", "r", "entered")
            ]
        );
        assert_eq!(hits.keys().collect::<Vec<_>>(), vec!["c"]);
    }

    #[test]
    fn the_same_history_cut_differently_gives_the_same_transitions() {
        let history: Vec<Event> = (0..40)
            .map(|i| {
                let key = format!("k{}", i % 3);
                let rules: &[&str] = match i % 4 {
                    0 => &["a"],
                    1 => &["a", "b"],
                    2 => &[],
                    _ => &["b"],
                };
                row(100 + i / 2, i % 2, &key, rules)
            })
            .collect();
        let mut one = Hits::new();
        let whole = walk(&mut one, history.clone());
        for cut in [1, 3, 7, 16] {
            let mut h = Hits::new();
            let mut got = Vec::new();
            for chunk in history.chunks(cut * 2) {
                got.extend(walk(&mut h, chunk.to_vec()).transitions);
            }
            assert_eq!(got, whole.transitions, "cut every {cut} transactions");
            assert_eq!(h, one);
        }
    }

    #[test]
    fn a_transaction_in_pieces_gives_the_transitions_of_the_whole_wherever_it_is_cut() {
        // Transaction 20 touches k1 (enters then leaves), k2 (enters), k3 (leaves then
        // comes back); 10 before it and 30 after it are whole.
        let history = vec![
            row(10, 0, "k3", &["a"]),
            row(20, 0, "k1", &["a"]),
            row(20, 1, "k3", &[]),
            row(20, 2, "k2", &["a"]),
            row(20, 3, "k1", &[]),
            row(20, 4, "k3", &["a"]),
            row(30, 0, "k2", &[]),
        ];
        let mut one = Hits::new();
        let whole = walk(&mut one, history.clone());
        assert_eq!(
            names(&whole),
            vec![
                t(10, "k3", "a", "entered"),
                t(20, "k2", "a", "entered"),
                t(30, "k2", "a", "left")
            ]
        );
        for cuts in [vec![2, 4, 6], vec![1, 2, 3, 4, 5, 6], vec![3], vec![5, 6]] {
            let mut h = Hits::new();
            let mut open = None;
            let mut got = Vec::new();
            let mut from = 0;
            for &to in cuts.iter().chain([&history.len()]) {
                let piece = history[from..to].to_vec();
                // The round ends inside transaction 20 unless its last event is in it.
                let last = piece.last().map(|e| e.pos);
                let partial = (last.is_some_and(|p| p.0 == 20) && to < 6).then_some(20);
                got.extend(walk_pieces(&mut h, piece, &mut open, partial).transitions);
                from = to;
            }
            assert_eq!(got, whole.transitions, "cut at {cuts:?}");
            assert_eq!(h, one);
            assert!(open.is_none());
        }
    }

    #[test]
    fn hits_added_in_order_or_not_stay_sorted_and_diff_in_one_pass() {
        let ids = |h: &KeyHits| h.keys().map(|r| r.to_string()).collect::<Vec<_>>();
        let mut h = KeyHits::new();
        for (r, v) in [("a", 1), ("c", 1), ("b", 2), ("c", 5), ("d", 1)] {
            h.push_in_order(rule_id(r), v);
        }
        assert_eq!(ids(&h), ["a", "b", "c", "d"]);
        assert_eq!(h.get("c"), Some(5));
        let other: KeyHits = [("b", 1), ("d", 1), ("e", 3)]
            .into_iter()
            .map(|(r, v)| (rule_id(r), v))
            .collect();
        let only = |x: &KeyHits, y: &KeyHits| {
            x.only_in_self(y)
                .map(|(r, v)| (r.to_string(), v))
                .collect::<Vec<_>>()
        };
        assert_eq!(only(&h, &other), [("a".into(), 1), ("c".into(), 5)]);
        assert_eq!(only(&other, &h), [("e".to_string(), 3)]);
        assert!(only(&h, &h).is_empty());
        assert_eq!(only(&h, &KeyHits::new()).len(), 4);
        let mut out = Vec::new();
        diff("k", Some(&h), Some(&other), 7, None, &mut out);
        let got: Vec<(String, bool)> = out.iter().map(|t| (t.rule_id.clone(), t.entered)).collect();
        assert_eq!(
            got,
            [("a".into(), false), ("c".into(), false), ("e".into(), true)]
        );
        // The same rules at another version: no transition.
        let mut bumped = h.clone();
        bumped.insert(rule_id("a"), 9);
        out.clear();
        diff("k", Some(&h), Some(&bumped), 7, None, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn key_hits_stay_sorted_and_share_interned_ids() {
        let mut h = KeyHits::new();
        h.insert(rule_id("r2"), 1);
        h.insert(rule_id("r0"), 1);
        h.insert(rule_id("r1"), 1);
        h.insert(rule_id("r1"), 3);
        let ids: Vec<&str> = h.keys().map(|r| r.as_ref()).collect();
        assert_eq!(ids, ["r0", "r1", "r2"]);
        assert_eq!((h.get("r1"), h.len()), (Some(3), 3));
        assert_eq!(h.remove("r0"), Some(1));
        assert_eq!(h.remove("r0"), None);
        assert!(!h.contains_key("r0") && h.contains_key("r2"));
        h.retain(|id| id != "r2");
        assert_eq!(h.iter().collect::<Vec<_>>(), [(&rule_id("r1"), 3)]);
        // One allocation per rule id, whatever the number of keys that match it.
        assert!(Arc::ptr_eq(&rule_id("r1"), &rule_id(&String::from("r1"))));
        let from: KeyHits = [(rule_id("b"), 1), (rule_id("a"), 2), (rule_id("b"), 4)]
            .into_iter()
            .collect();
        assert_eq!(
            from.iter()
                .map(|(r, v)| (r.to_string(), v))
                .collect::<Vec<_>>(),
            [("a".to_string(), 2), ("b".to_string(), 4)]
        );
    }
}
