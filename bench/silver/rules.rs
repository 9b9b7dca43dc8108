//! `ops/bench rules` workers: the rule set, the rules stage alone over merged rows, and
//! backfills over a Silver table (see ops/bench-rules).

use std::path::Path;
use std::time::Instant;

use serde_json::{json, Value};
use wal2delta_lake::rules::walk::{rule_id, walk, Event, Hits, KeyHits, What};
use wal2delta_lake::rules::{compile, key_json, Evaluator, Rule, RuleSource};
use wal2delta_lake::silver::{transaction_counts, Position, SilverTable, TransactionCounts};
use wal2delta_model::TableName;

use crate::synth;

/// `n` rules of the shapes business rules take over the payments table: amount
/// thresholds (numeric is exact text in Silver: compared after a cast), currency and
/// status lists, merchant ranges, LIKE on the note, AND/OR mixes. Deterministic.
pub fn rule_set(n: usize) -> Vec<Rule> {
    const CURRENCIES: [&str; 5] = ["EUR", "USD", "GBP", "CHF", "PLN"];
    const STATUSES: [&str; 5] = ["authorized", "captured", "settled", "refunded", "failed"];
    let mut rng = synth::Rng::new(300);
    (0..n)
        .map(|i| {
            let t = 1_000 + rng.below(98_000);
            let c = CURRENCIES[rng.below(5) as usize];
            let s = STATUSES[rng.below(5) as usize];
            let m = rng.below(5_000);
            // Each rule matches well under 1% of the rows, as business rules do.
            let when = match i % 6 {
                0 => format!("CAST(amount AS DECIMAL(18, 2)) > {}", 99_000 + t % 900),
                1 => format!(
                    "currency = '{c}' AND CAST(amount AS DECIMAL(18, 2)) > {}",
                    97_000 + t % 2_000
                ),
                2 => format!("status IN ('{s}', 'failed') AND merchant_id BETWEEN {m} AND {}", m + 20),
                3 => format!("merchant_id = {m} OR (account_id < {} AND currency <> '{c}')", t % 400),
                4 => format!("note LIKE '%revision {}{}%' AND status <> '{s}'", 7 + t % 3, t % 10),
                _ => format!(
                    "(currency <> 'EUR' AND status = '{s}' AND CAST(amount AS DECIMAL(18, 2)) > 99500) OR CAST(amount AS DECIMAL(18, 2)) BETWEEN {t} AND {}",
                    t + 100
                ),
            };
            rule(&format!("r{i:03}"), &when)
        })
        .collect()
}

fn rule(id: &str, when: &str) -> Rule {
    Rule {
        id: id.to_owned(),
        table: TableName::new(synth::SCHEMA, synth::TABLE),
        when: when.to_owned(),
        version: 1,
        active: true,
        lookups: Vec::new(),
    }
}

/// The rule the backfill benchmark adds: about 10% of the rows match.
pub fn new_rule() -> Rule {
    rule("tenth", "CAST(amount AS DECIMAL(18, 2)) < 10000")
}

/// What the rules' rounds reported, as the benchmark adds them up.
pub type Reports = std::sync::Arc<std::sync::Mutex<Vec<wal2delta_lake::rules::RulesReport>>>;

/// The Silver table with `rules` evaluated in its rounds (committing `rules/hits` every
/// `hits_interval`), and where their reports go.
pub fn silver_with_rules(
    lake: &wal2delta_lake::Lake,
    window: i64,
    rules: usize,
    hits_interval: std::time::Duration,
) -> (SilverTable, Reports) {
    let t = SilverTable::new(lake, synth::SCHEMA, synth::TABLE, window);
    let reports = Reports::default();
    if rules == 0 {
        return (t, reports);
    }
    let mut set = rule_set(rules);
    set.push(new_rule());
    let seen = reports.clone();
    let r = wal2delta_lake::rules::TableRules::new(lake, synth::TABLE_NAME, RuleSource::new(&set))
        .with_hits_interval(hits_interval)
        .with_observer(std::sync::Arc::new(
            move |_: &str, r: &wal2delta_lake::rules::RulesReport| {
                if let Ok(mut v) = seen.lock() {
                    v.push(r.clone());
                }
            },
        ));
    (t.with_hooks(vec![Box::new(r)]), reports)
}

/// The rules stage alone over `rows` merged Silver rows: every rule evaluated on every
/// row, each row's hits, its key as JSON and the transitions against an empty state.
pub async fn eval(path: &Path, rules: usize, rows: usize) -> anyhow::Result<Value> {
    let dir = crate::silver_dir(path);
    let table = crate::open(&crate::dir_url(&dir)?).await?;
    let ctx = crate::session();
    ctx.register_table("t", table.table_provider().await?)?;
    let batches = ctx
        .sql(&format!("SELECT * FROM t LIMIT {rows}"))
        .await?
        .collect()
        .await?;
    let schema = table.snapshot()?.snapshot().arrow_schema();
    let started = Instant::now();
    let compiled = rule_set(rules)
        .iter()
        .map(|r| compile(r, &schema).map_err(|e| anyhow::anyhow!("{e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ev = Evaluator::new(compiled, &schema);
    let compile_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut hits = Hits::new();
    let (mut n, mut transitions, mut matched) = (0usize, 0usize, 0usize);
    let mut lsn = 0;
    for b in &batches {
        let results = ev.evaluate(b);
        let mut row_hits = vec![KeyHits::new(); b.num_rows()];
        for (c, r) in ev.rules().iter().zip(&results) {
            let r = r.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
            let id = rule_id(&c.rule.id);
            for i in r.values().set_indices() {
                row_hits[i].insert(id.clone(), c.rule.version);
            }
        }
        let keys = key_json(b, &["id".to_owned()]).map_err(anyhow::Error::msg)?;
        let mut events = Vec::with_capacity(b.num_rows());
        for (key, h) in keys.into_iter().zip(row_hits) {
            matched += h.len();
            lsn += 1;
            events.push(Event {
                pos: Position(lsn, 0),
                commit_ts: None,
                what: What::Row { key, hits: h },
            });
        }
        transitions += walk(&mut hits, events).transitions.len();
        n += b.num_rows();
    }
    let seconds = started.elapsed().as_secs_f64();
    let (peak, _) = crate::memory_kib();
    Ok(json!({
        "rows": n, "rules": rules, "seconds": seconds, "compile_seconds": compile_s,
        "rows_per_second": n as f64 / seconds, "hits": matched, "transitions": transitions,
        "peak_rss_kib": peak,
        "cpu_seconds": crate::cpu_seconds(),
    }))
}

/// Installs `rules` rules on the lake's Silver table (a backfill of all of them over
/// every row, in a Silver round with nothing else to apply, as the daemon does at its
/// first start with rules), then adds [`new_rule`] and times its backfill alone.
pub async fn backfill(path: &Path, rules: usize) -> anyhow::Result<Value> {
    let lake = crate::lake_of(path)?;
    let set = rule_set(rules);
    let source = RuleSource::new(&set);
    let reports = Reports::default();
    let seen = reports.clone();
    let rules_hook =
        wal2delta_lake::rules::TableRules::new(&lake, synth::TABLE_NAME, source.clone())
            .with_observer(std::sync::Arc::new(
                move |_: &str, r: &wal2delta_lake::rules::RulesReport| {
                    if let Ok(mut v) = seen.lock() {
                        v.push(r.clone());
                    }
                },
            ));
    let mut silver = SilverTable::new(&lake, synth::SCHEMA, synth::TABLE, 100_000)
        .with_hooks(vec![Box::new(rules_hook)]);
    // The backfill of the round just run, as its rules report says.
    let backfill = || {
        reports
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
            .into_iter()
            .find(|x| x.backfill)
            .map(|x| (x.rows, x.transitions.values().sum::<usize>()))
    };
    let (all_s, all) = round(&lake, &mut silver).await?;
    let all_backfill = backfill();
    let mut with_new = set.clone();
    with_new.push(new_rule());
    source.replace(&with_new);
    let (one_s, one) = round(&lake, &mut silver).await?;
    let one_backfill = backfill();
    let (peak, _) = crate::memory_kib();
    let (Some((rows, all_t)), Some((_, one_t))) = (all_backfill, one_backfill) else {
        anyhow::bail!("a round did not backfill: {all:?} {one:?}");
    };
    Ok(json!({
        "rows": rows,
        "rules": rules,
        "all_rules_seconds": all_s,
        "all_rules_transitions": all_t,
        "new_rule_seconds": one_s,
        "new_rule_entered": one_t,
        "peak_rss_kib": peak,
        "cpu_seconds": crate::cpu_seconds(),
    }))
}

/// One Silver round, as the stage runs it; its time.
async fn round(
    lake: &wal2delta_lake::Lake,
    silver: &mut SilverTable,
) -> anyhow::Result<(f64, wal2delta_lake::silver::ApplyReport)> {
    let watermark = silver.progress().await?.watermark;
    let (top, counts) = transaction_counts(lake, watermark).await?;
    let counts = counts
        .get(synth::TABLE_NAME)
        .cloned()
        .unwrap_or(TransactionCounts {
            top,
            ..TransactionCounts::default()
        });
    let started = Instant::now();
    let r = silver.apply(&counts).await?;
    Ok((started.elapsed().as_secs_f64(), r))
}

/// [`rule_set`] as a rules file (docs/rules.md) for the source table `table`, its last
/// `lookups` rules replaced by rules that look the payment's merchant up in `merchants`
/// (`id bigint`, `category text`): an amount threshold first (phase one), then the
/// merchant's category (phase two). For `ops/bench rules-latency`, on the real stack.
pub fn rules_file(n: usize, table: &str, lookups: usize, merchants: &str) -> String {
    const CATEGORIES: [&str; 5] = ["retail", "travel", "gambling", "crypto", "food"];
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut out = String::new();
    for (i, r) in rule_set(n).into_iter().enumerate() {
        out.push_str(&format!(
            "[[rule]]\nid = {}\ntable = {}\n",
            quote(&r.id),
            quote(table)
        ));
        if i + lookups >= n {
            let category = CATEGORIES[i % CATEGORIES.len()];
            let when = format!(
                "CAST(amount AS DECIMAL(18, 2)) > {} AND merchant.category = '{category}'",
                90_000 + (i % 10) * 500
            );
            out.push_str(&format!(
                "when = {}\nlookup.merchant = {{ table = {}, on = {{ merchant_id = \"id\" }} }}\n\n",
                quote(&when),
                quote(merchants)
            ));
        } else {
            out.push_str(&format!("when = {}\n\n", quote(&r.when)));
        }
    }
    out
}
