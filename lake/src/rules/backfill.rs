//! Backfill: a table's new, changed or removed rules brought in line with its current
//! Silver rows (docs/rules.md, "Rule changes without restart").

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::DataType;
use deltalake::DeltaTable;

use super::store::{fingerprint, HitChange, Origin};
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
        let mut fresh: HashMap<String, (KeyHits, Option<i64>)> = HashMap::new();
        if !to_eval.is_empty() {
            let ev = Evaluator::new(to_eval, &schema);
            for b in delta::query(&self.name, silver, "SELECT * FROM t").await? {
                report.rows += b.num_rows();
                let row_hits = self.evaluate_rows(&ev, &b, &schema, &mut report).await?;
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
        let ruleset = fingerprint(&desired);
        // Published before the commits, acknowledged, or the round fails (super::output).
        self.publish(Origin::Backfill, seq, &transitions, &[])
            .await?;
        let state = self.state.as_mut().expect("loaded in start");
        self.store
            .append(
                &self.name,
                seq,
                ruleset,
                before,
                &transitions,
                Origin::Backfill,
            )
            .await?;
        state.seq = seq;
        state.progress = before.clone();
        state.ruleset = Some(ruleset);
        // Committed now, with the changes pending before it: a rule's new version on a
        // row that still matches changes the hits without a transition, which a roll
        // forward from the transitions would not see.
        self.add_pending(changes);
        self.flush_hits(true).await?;
        tracing::info!(table = %self.name, rules = report.rules, rows = report.rows, transitions = transitions.len(), elapsed_ms = started.elapsed().as_millis() as u64, "rules installed: backfilled over the current Silver rows");
        self.installed = Some(desired);
        Ok(report)
    }
}
