//! Backfill: a table's new, changed or removed rules brought in line with its current
//! Silver rows (docs/rules.md, "Rule changes without restart").

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::DataType;
use deltalake::DeltaTable;

use super::store::{HitChange, Origin};
use super::table::{count, RulesReport, TableRules};
use super::walk::{diff, KeyHits};
use super::{key_json, CompiledRule, Evaluator, Rule};
use crate::delta;
use crate::silver::{Progress, COMMIT_TS};
use crate::LakeError;

impl TableRules {
    /// Evaluates the rules over every Silver row and brings the hits in line.
    pub(super) async fn backfill(
        &mut self,
        silver: &DeltaTable,
        desired: Vec<Rule>,
        before: &Progress,
        keys: &[String],
    ) -> Result<RulesReport, LakeError> {
        let started = Instant::now();
        let schema = delta::arrow_schema(&self.name, silver)?;
        let (compiled, invalid) = self.compiled(&schema).await?;
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
        let mut fresh = self
            .evaluate_all(
                silver,
                to_eval,
                &schema,
                keys,
                before.watermark,
                &mut report,
            )
            .await?;
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
                        .map(|(a, b)| (a.clone(), b))
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
            for (id, v) in new.iter() {
                if old.get(id) != Some(v) {
                    changes.push((key.clone(), id.to_string(), Some((v, before.watermark, ts))));
                }
            }
            for id in old.keys().filter(|id| !new.contains_key(id)) {
                changes.push((key.clone(), id.to_string(), None));
            }
            let entry = state.hits.entry(key.clone()).or_default();
            entry.retain(|id| !replaced(id));
            entry.extend(new);
            *entry = std::mem::take(entry).shrunk();
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
        // A rule the backfill itself finds over budget is disabled from the next round:
        // the rule set recorded leaves it out.
        report.disabled = self.judge_budget(&report);
        let ruleset = self.budget.fingerprint(&desired);
        // Published before the commits, acknowledged, or the round fails (super::output).
        self.publish(Origin::Backfill, seq, &transitions, &[])
            .await?;
        let state = self.state.as_mut().expect("loaded in start");
        // Hits changes that are no transition's (a rule's new version on a row it still
        // matches): until the hits commit below holds them, a start must backfill again.
        let hits_only = {
            let transitioned: std::collections::HashSet<(&str, &str)> = transitions
                .iter()
                .map(|t| (t.key.as_str(), t.rule_id.as_str()))
                .collect();
            changes.iter().any(|(key, rule, hit)| {
                hit.is_some() && !transitioned.contains(&(key.as_str(), rule.as_str()))
            })
        };
        self.store
            .append(
                &self.name,
                seq,
                ruleset,
                before,
                &transitions,
                Origin::Backfill,
                hits_only,
            )
            .await?;
        state.seq = seq;
        state.progress = before.clone();
        state.ruleset = Some(ruleset);
        // Committed now, with the changes pending before it: a rule's new version on a
        // row that still matches changes the hits without a transition, which a roll
        // forward from the transitions would not see.
        self.add_pending(changes);
        if hits_only {
            self.pending_backfill = Some(seq);
        }
        self.flush_hits(true).await?;
        tracing::info!(table = %self.name, rules = report.rules, rows = report.rows, transitions = transitions.len(), elapsed_ms = started.elapsed().as_millis() as u64, "rules installed: backfilled over the current Silver rows");
        self.installed = Some(desired);
        Ok(report)
    }

    /// The hits of `to_eval` on every Silver row, per key, with the row's commit time;
    /// lookups see the related tables as of `at` (Silver's watermark: the position the
    /// backfill stands for).
    async fn evaluate_all(
        &mut self,
        silver: &DeltaTable,
        to_eval: Vec<CompiledRule>,
        schema: &deltalake::arrow::datatypes::SchemaRef,
        keys: &[String],
        at: i64,
        report: &mut RulesReport,
    ) -> Result<HashMap<String, (KeyHits, Option<i64>)>, LakeError> {
        let mut fresh: HashMap<String, (KeyHits, Option<i64>)> = HashMap::new();
        if to_eval.is_empty() {
            return Ok(fresh);
        }
        let ev = Evaluator::new(to_eval, schema);
        for b in delta::query(&self.name, silver, "SELECT * FROM t").await? {
            report.rows += b.num_rows();
            let row_hits = self
                .evaluate_rows(&ev, &b, schema, report, Some(at))
                .await?;
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
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Arc;

    use deltalake::arrow::array::{AsArray, Int64Array, RecordBatch, TimestampMicrosecondArray};
    use deltalake::arrow::datatypes::{DataType, Field, Int64Type, Schema, TimeUnit};
    use deltalake::protocol::SaveMode;
    use wal2delta_model::TableName;

    use crate::delta;
    use crate::rules::{Rule, RuleSource, TableRules};
    use crate::silver::{Progress, COMMIT_LSN, COMMIT_TS, ORDINAL};
    use crate::Lake;

    fn rule(version: i64) -> Rule {
        Rule {
            id: "big".into(),
            table: TableName::new("s", "t"),
            when: "amount > 10".into(),
            version,
            active: true,
            lookups: Vec::new(),
        }
    }

    /// `rules/hits` of `s.t`: (key, version), sorted.
    async fn hits(lake: &Lake) -> Vec<(String, i64)> {
        let t = delta::open("h", &lake.rules_hits()).await.unwrap().unwrap();
        let sql = "SELECT key, rule_version FROM t WHERE \"table\" = 's.t' ORDER BY key";
        let mut out = Vec::new();
        for b in delta::query("h", &t, sql).await.unwrap() {
            let (k, v) = (
                b.column(0).as_string::<i32>(),
                b.column(1).as_primitive::<Int64Type>(),
            );
            out.extend((0..b.num_rows()).map(|i| (k.value(i).to_owned(), v.value(i))));
        }
        out
    }

    async fn transitions(lake: &Lake) -> usize {
        let t = delta::open("t", &lake.rules_transitions())
            .await
            .unwrap()
            .unwrap();
        let sql = "SELECT count(*) FROM t";
        delta::query("t", &t, sql).await.unwrap()[0]
            .column(0)
            .as_primitive::<Int64Type>()
            .value(0) as usize
    }

    /// Silver table `s.t` at `url` created with rows of ids 1, 2, ... and `amounts`,
    /// committed at `lsn` (an empty table when `amounts` is).
    async fn silver_rows(url: &url::Url, amounts: &[i64], lsn: i64) -> deltalake::DeltaTable {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let n = amounts.len();
        let rows = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("amount", DataType::Int64, true),
                Field::new(COMMIT_LSN, DataType::Int64, true),
                Field::new(ORDINAL, DataType::Int64, true),
                Field::new(COMMIT_TS, utc, true),
            ])),
            vec![
                Arc::new(Int64Array::from_iter_values(1..=n as i64)),
                Arc::new(Int64Array::from(amounts.to_vec())),
                Arc::new(Int64Array::from(vec![lsn; n])),
                Arc::new(Int64Array::from_iter_values(0..n as i64)),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![1_700_000_000_000_000; n])
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap();
        delta::handle("s.t", url)
            .unwrap()
            .write(vec![rows])
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(delta::commit_properties())
            .await
            .unwrap();
        delta::open("s.t", url).await.unwrap().unwrap()
    }

    /// What the Silver commit of the round does: records the rules seq the hook gives.
    async fn silver_commit(url: &url::Url, rules: &TableRules) -> deltalake::DeltaTable {
        use crate::silver::hook::RoundHook;
        let t = delta::open("s.t", url).await.unwrap().unwrap();
        let props =
            delta::commit_properties().with_application_transactions(rules.commit_actions());
        delta::commit_progress_only(&t, props, "test", 10)
            .await
            .unwrap();
        delta::open("s.t", url).await.unwrap().unwrap()
    }

    /// `chattr +i` on a tree while it lives (root ignores permissions, not this).
    struct Immutable(PathBuf);
    impl Immutable {
        fn set(p: &Path) -> Immutable {
            assert!(Command::new("chattr")
                .args(["-R", "+i"])
                .arg(p)
                .status()
                .unwrap()
                .success());
            Immutable(p.to_owned())
        }
    }
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = Command::new("chattr")
                .args(["-R", "-i"])
                .arg(&self.0)
                .status();
        }
    }

    /// Issue 38, defect 6: a backfill's new rule version on rows that still match is in
    /// `rules/hits` only; when its hits commit fails (or the process dies before it), the
    /// next start backfills again and the hits take the new version, no transition twice.
    #[tokio::test]
    async fn a_backfills_new_rule_versions_survive_a_lost_hits_commit() {
        let dir = std::env::temp_dir().join(format!("w2d-backfill-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let silver_url = lake.silver("s", "t");
        let silver = silver_rows(&silver_url, &[5, 50, 500, 5000], 10).await;
        let before = Progress {
            watermark: 10,
            ..Progress::default()
        };
        let keys = vec!["id".to_owned()];
        let source = RuleSource::new(&[rule(1)]);

        let mut rules = TableRules::new(&lake, "s.t", source.clone());
        let start = rules.start(Some(&silver), &before, &keys).await.unwrap();
        assert!(start.report.is_some_and(|r| r.backfill));
        let silver = silver_commit(&silver_url, &rules).await;
        let v1: Vec<(String, i64)> = ["{\"id\":2}", "{\"id\":3}", "{\"id\":4}"]
            .map(|k| (k.to_owned(), 1))
            .to_vec();
        assert_eq!(hits(&lake).await, v1);
        assert_eq!(transitions(&lake).await, 3);

        // Version 2 of the same condition; its backfill's hits commit fails.
        source.replace(&[rule(2)]);
        {
            let _frozen = Immutable::set(&dir.join("rules/hits/_delta_log"));
            assert!(rules.start(Some(&silver), &before, &keys).await.is_err());
        }
        drop(rules);
        assert_eq!(hits(&lake).await, v1, "the hits commit did fail");

        // A new process with the same rules backfills again at once, before any round
        // walks changes against hits of the old version: Silver is still where the
        // backfill ran. The hits take version 2.
        let mut rules = TableRules::new(&lake, "s.t", source.clone());
        let start = rules.start(Some(&silver), &before, &keys).await.unwrap();
        assert!(start.covered.is_none(), "nothing to cover");
        assert!(start.report.is_some_and(|r| r.backfill), "backfilled again");
        let silver = silver_commit(&silver_url, &rules).await;
        let v2: Vec<(String, i64)> = v1.iter().map(|(k, _)| (k.clone(), 2)).collect();
        assert_eq!(hits(&lake).await, v2);
        assert_eq!(transitions(&lake).await, 3, "no transition twice");
        let start = rules.start(Some(&silver), &before, &keys).await.unwrap();
        assert!(start.report.is_none() && start.covered.is_none(), "in sync");

        // And the next start trusts the hits again.
        let (loaded, _) = crate::rules::store::RulesStore::new(&lake)
            .read("s.t")
            .await
            .unwrap();
        assert!(!loaded.backfill_pending, "nothing left to backfill");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 38 (rules_random): a process that starts with the table at an edit's
    /// position, before the edit's backfill, evaluates only the rules the edit changed, as
    /// a run without the restart does; all of them again would tag rows whose streamed
    /// hits differ from a fresh evaluation (a lookup's related row changed since).
    #[tokio::test]
    async fn a_restart_at_an_edit_backfills_only_what_the_edit_changed() {
        let dir = std::env::temp_dir().join(format!("w2d-restart-edit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let silver_url = lake.silver("s", "t");
        let silver = silver_rows(&silver_url, &[5, 50, 500], 8).await;
        let keys = vec!["id".to_owned()];
        let small = |version: i64, when: &str| Rule {
            id: "small".into(),
            when: when.into(),
            version,
            ..rule(1)
        };
        // An edit at 10 changes `small` and leaves `big` as it was.
        let source = RuleSource::with_history(&[
            (0, vec![rule(1), small(1, "amount < 10")]),
            (10, vec![rule(1), small(2, "amount < 100")]),
        ]);
        let at = |watermark: i64| Progress {
            watermark,
            ..Progress::default()
        };
        let mut rules = TableRules::new(&lake, "s.t", source.clone());
        let start = rules.start(Some(&silver), &at(9), &keys).await.unwrap();
        assert_eq!(
            start.report.map(|r| r.rules),
            Some(2),
            "the first load: all"
        );
        let silver = silver_commit(&silver_url, &rules).await;
        drop(rules);

        // The process dies; the table reaches the edit's position; a new process starts.
        let mut rules = TableRules::new(&lake, "s.t", source);
        let start = rules.start(Some(&silver), &at(10), &keys).await.unwrap();
        let report = start.report.expect("the edit's backfill");
        assert_eq!(report.rules, 1, "only the rule the edit changed");
        assert_eq!(
            report.transitions.values().sum::<usize>(),
            1,
            "small entered for id 2, nothing else"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 38: the first round creates Silver empty (a commit without any `txn`), the
    /// rules append the round's transitions, and the process dies before Silver's data
    /// commit. The restart must take the repeated round as covered, not Silver as rebuilt:
    /// a backfill over its no rows would untag every hit.
    #[tokio::test]
    async fn silver_created_empty_before_a_crash_is_not_taken_as_rebuilt() {
        use crate::rules::store::{Origin, RulesStore};
        use crate::rules::walk::Transition;
        let dir = std::env::temp_dir().join(format!("w2d-empty-silver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let silver_url = lake.silver("s", "t");
        let silver = silver_rows(&silver_url, &[], 0).await;
        let source = RuleSource::new(&[rule(1)]);
        // What the killed round appended: two keys entered, as seq 1, covering watermark 10.
        let entered = |id: i64| Transition {
            lsn: 10,
            key: format!("{{\"id\":{id}}}"),
            rule_id: "big".into(),
            entered: true,
            rule_version: 1,
            commit_ts: None,
        };
        let tagged = Progress {
            watermark: 10,
            ..Progress::default()
        };
        let ruleset = crate::rules::budget::Budget::default().fingerprint(&[rule(1)]);
        RulesStore::new(&lake)
            .append(
                "s.t",
                1,
                ruleset,
                &tagged,
                &[entered(1), entered(2)],
                Origin::Stream,
                false,
            )
            .await
            .unwrap();

        let mut rules = TableRules::new(&lake, "s.t", source);
        let keys = vec!["id".to_owned()];
        let start = rules
            .start(Some(&silver), &Progress::default(), &keys)
            .await
            .unwrap();
        assert!(start.report.is_none(), "no backfill over the empty table");
        assert_eq!(start.covered, Some(tagged), "the repeated round is covered");
        assert_eq!(transitions(&lake).await, 2, "nothing untagged");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
