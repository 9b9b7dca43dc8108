//! `rules/hits` committed less often than `rules/transitions` (docs/rules.md, "Exactly
//! once"), on the real local filesystem: the rounds whose hits are not committed yet are
//! rolled forward from the transitions, by `read` (nothing written), `load` (committed)
//! and `hit_counts` (what `rules list` shows).

mod common;

use wal2delta_lake::rules::hit_counts;
use wal2delta_lake::rules::store::{Origin, RulesStore};
use wal2delta_lake::rules::walk::Transition;
use wal2delta_lake::silver::Progress;
use wal2delta_lake::Lake;

fn lake() -> (Lake, std::path::PathBuf) {
    common::temp_lake("w2d-rules-store")
}

fn tr(lsn: i64, key: &str, rule: &str, entered: bool) -> Transition {
    Transition {
        lsn,
        key: key.to_owned(),
        rule_id: rule.to_owned(),
        entered,
        rule_version: 1,
        commit_ts: Some(lsn * 1000),
    }
}

fn progress(watermark: i64) -> Progress {
    Progress {
        watermark,
        ..Progress::default()
    }
}

/// `(key, rule)` pairs of a loaded state, sorted.
fn pairs(hits: &wal2delta_lake::rules::walk::Hits) -> Vec<(String, String)> {
    let mut out: Vec<_> = hits
        .iter()
        .flat_map(|(k, h)| h.keys().map(move |r| (k.clone(), r.to_string())))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn hits_trailing_the_transitions_are_rolled_forward() {
    let (lake, dir) = lake();
    let mut store = RulesStore::new(&lake);
    let t = "public.payments";
    // Round 1: two keys enter; its hits are committed.
    let round1 = [tr(10, "a", "big", true), tr(10, "b", "big", true)];
    store
        .append(t, 1, 7, &progress(10), &round1, Origin::Stream, false)
        .await
        .unwrap();
    store
        .merge_hits(
            t,
            1,
            vec![
                ("a".into(), "big".into(), Some((1, 10, None))),
                ("b".into(), "big".into(), Some((1, 10, None))),
            ],
            None,
        )
        .await
        .unwrap();
    // Rounds 2 and 3 appended, their hits not committed: `a` leaves, `c` enters, and in
    // one transaction of round 3 `b` leaves `big` and enters `usd`.
    store
        .append(
            t,
            2,
            7,
            &progress(20),
            &[tr(20, "a", "big", false), tr(20, "c", "big", true)],
            Origin::Stream,
            false,
        )
        .await
        .unwrap();
    store
        .append(
            t,
            3,
            7,
            &progress(30),
            &[
                tr(30, "b", "big", false),
                tr(30, "b", "usd", true),
                tr(30, "c", "big", false),
                tr(31, "c", "big", true),
            ],
            Origin::Stream,
            false,
        )
        .await
        .unwrap();
    let want = vec![
        ("b".to_owned(), "usd".to_owned()),
        ("c".to_owned(), "big".to_owned()),
    ];

    let (read, missed) = store.read(t).await.unwrap();
    assert_eq!(pairs(&read.hits), want);
    assert_eq!((read.seq, read.hits_seq), (3, 1));
    assert_eq!(read.progress.watermark, 30);
    assert_eq!(missed.len(), 6, "the transitions of seqs 2 and 3");
    let counts = hit_counts(&lake).await.unwrap();
    assert_eq!(
        counts.into_iter().collect::<Vec<_>>(),
        vec![
            ((t.to_owned(), "big".to_owned()), 1),
            ((t.to_owned(), "usd".to_owned()), 1)
        ],
        "rules list counts the hits as of the last transitions"
    );

    // `read` wrote nothing; `load` commits the roll-forward, after which nothing trails.
    assert_eq!(store.read(t).await.unwrap().0.hits_seq, 1);
    let loaded = store.load(t).await.unwrap();
    assert_eq!(pairs(&loaded.hits), want);
    assert_eq!((loaded.seq, loaded.hits_seq), (3, 3));
    let (again, missed) = store.read(t).await.unwrap();
    assert!(missed.is_empty());
    assert_eq!(pairs(&again.hits), want);
    assert_eq!(again.hits_seq, 3);

    // Another table's state is its own.
    let (other, missed) = store.read("public.other").await.unwrap();
    assert!(other.hits.is_empty() && missed.is_empty() && other.seq == 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// Two tables' `rules/hits` commits at once (one running beside the rounds of its
/// table while another table's round commits): the table is one, unpartitioned, so the
/// MERGEs would rewrite the same file (compacted, it holds both tables' hits) and one
/// would fail on the conflict; they take turns instead, and both land.
#[tokio::test]
async fn hits_commits_of_two_tables_at_once_both_land() {
    let (lake, dir) = lake();
    let (a, b) = ("public.a", "public.b");
    let first = RulesStore::new(&lake);
    // One file holding both tables' hits.
    first
        .merge_hits(
            a,
            1,
            vec![("k1".into(), "big".into(), Some((1, 10, None)))],
            None,
        )
        .await
        .unwrap();
    first
        .merge_hits(
            b,
            1,
            vec![("k1".into(), "big".into(), Some((1, 10, None)))],
            None,
        )
        .await
        .unwrap();
    let compacted =
        wal2delta_lake::maintenance::maintain("rules/hits", &lake.rules_hits(), 1 << 30, None)
            .await
            .unwrap();
    assert_eq!((compacted.files_removed, compacted.files_added), (2, 1));
    for round in 2..6_i64 {
        let (sa, sb) = (RulesStore::new(&lake), RulesStore::new(&lake));
        // Each round moves `k1` (a rewrite of the file holding both tables' `k1`) and
        // adds a key.
        let change = |n: i64| {
            vec![
                ("k1".to_owned(), "big".to_owned(), Some((1, n, None))),
                (format!("k{n}"), "big".to_owned(), Some((1, n, None))),
            ]
        };
        let (ra, rb) = tokio::join!(
            tokio::spawn(sa.merge_hits(a, round, change(round), None)),
            tokio::spawn(sb.merge_hits(b, round, change(round * 10), None)),
        );
        ra.unwrap().unwrap();
        rb.unwrap().unwrap();
    }
    let (la, _) = first.read(a).await.unwrap();
    let (lb, _) = first.read(b).await.unwrap();
    assert_eq!((la.hits_seq, lb.hits_seq), (5, 5));
    let keys = |h: &wal2delta_lake::rules::walk::Hits| {
        let mut k: Vec<_> = h.keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&la.hits), ["k1", "k2", "k3", "k4", "k5"]);
    assert_eq!(keys(&lb.hits), ["k1", "k20", "k30", "k40", "k50"]);
    let (a1, b1) = (&la.hits["k1"], &lb.hits["k1"]);
    assert_eq!((a1.len(), b1.len()), (1, 1));
    let _ = std::fs::remove_dir_all(dir);
}
