//! What a Silver table's rules did in each round, as metrics and log lines: the observer
//! the stage gives the rules (`TableRules::with_observer`, lake/src/rules/hook.rs). Silver
//! runs the rules as a hook of its rounds and knows nothing of their reports.

use std::sync::{Arc, Mutex};

use wal2delta_lake::rules::{RulesObserver, RulesReport};

use crate::events::{InternalEvent, RuleRowsQuarantined};
use crate::metrics as m;

/// The observer of one table's rules: every round's metrics, the early filter's reduction
/// since the stage started, and where a streamed round's time went (debug).
pub(super) fn observer() -> RulesObserver {
    let filtered = Mutex::new((0u64, 0u64));
    Arc::new(move |table: &str, r: &RulesReport| {
        report_rules(table, r);
        if let Ok(mut totals) = filtered.lock() {
            report_filter(table, r, &mut totals);
        }
        if !r.backfill {
            let ms = |d: std::time::Duration| d.as_millis() as u64;
            let s = &r.steps;
            tracing::debug!(
                table,
                rows = r.rows,
                settle_ms = ms(s.settle),
                compile_ms = ms(s.compile),
                evaluate_ms = ms(s.evaluate),
                walk_ms = ms(s.walk),
                publish_ms = ms(s.publish),
                append_ms = ms(s.append),
                hits_ms = ms(s.hits),
                "rules round"
            );
        }
    })
}

/// The early filter's metrics of one round; `totals` are the table's (in, out) so far.
fn report_filter(table: &str, r: &RulesReport, totals: &mut (u64, u64)) {
    if r.filter_in == 0 {
        return;
    }
    totals.0 += r.filter_in as u64;
    totals.1 += r.filter_out as u64;
    metrics::counter!(m::RULES_FILTER_EVENTS_IN, "table" => table.to_owned())
        .increment(r.filter_in as u64);
    metrics::counter!(m::RULES_FILTER_EVENTS_OUT, "table" => table.to_owned())
        .increment(r.filter_out as u64);
    if totals.1 > 0 {
        metrics::gauge!(m::RULES_FILTER_REDUCTION, "table" => table.to_owned())
            .set(totals.0 as f64 / totals.1 as f64);
    }
}

/// The metrics of one table's rules in one round.
fn report_rules(table: &str, r: &RulesReport) {
    let origin = if r.backfill { "backfill" } else { "stream" };
    if r.backfill {
        metrics::counter!(m::RULES_BACKFILLS, "table" => table.to_owned()).increment(1);
    }
    metrics::gauge!(m::RULES_INVALID, "table" => table.to_owned()).set(r.invalid.len() as f64);
    for e in &r.invalid {
        tracing::warn!(table, rule = %e.id, reason = %e.reason, "a rule is skipped");
    }
    for e in &r.disabled {
        metrics::counter!(m::RULES_DISABLED, "rule" => e.id.clone()).increment(1);
        tracing::error!(table, rule = %e.id, reason = %e.reason, "a rule past its evaluation budget is disabled; the stage goes on");
    }
    metrics::histogram!(m::RULES_EVAL_SECONDS, "table" => table.to_owned())
        .record(r.eval_time.as_secs_f64());
    for (rule, n) in &r.transitions {
        metrics::counter!(m::RULES_TRANSITIONS, "rule" => rule.clone(), "origin" => origin)
            .increment(*n as u64);
    }
    for (rule, n) in &r.errors {
        RuleRowsQuarantined {
            rule,
            rows: *n as u64,
        }
        .emit();
    }
    if r.rows > 0 && r.rules > 0 {
        // Every evaluated rule saw every row of the round.
        metrics::counter!(m::RULES_EVALUATIONS, "table" => table.to_owned())
            .increment((r.rows * r.rules) as u64);
    }
    for (rule, took) in &r.rule_time {
        metrics::counter!(m::RULES_RULE_EVALUATIONS, "rule" => rule.clone())
            .increment(r.rows as u64);
        metrics::histogram!(m::RULES_RULE_SECONDS, "rule" => rule.clone())
            .record(took.as_secs_f64());
    }
    if r.lookups + r.lookups_avoided > 0 {
        metrics::counter!(m::RULES_LOOKUPS, "table" => table.to_owned())
            .increment(r.lookups as u64);
        metrics::counter!(m::RULES_LOOKUPS_AVOIDED, "table" => table.to_owned())
            .increment(r.lookups_avoided as u64);
    }
    if r.lookups_newer > 0 {
        metrics::counter!(m::RULES_LOOKUPS_NEWER, "table" => table.to_owned())
            .increment(r.lookups_newer as u64);
    }
    if r.lookups_stale > 0 {
        metrics::counter!(m::RULES_LOOKUPS_STALE, "table" => table.to_owned())
            .increment(r.lookups_stale as u64);
        tracing::warn!(
            table,
            rows = r.lookups_stale,
            "rows were looked up while the related table was behind their commit"
        );
    }
    if let (Some(ts), false) = (r.newest_commit_ts, r.backfill) {
        let lag = (wal2delta_model::clock::unix_us() - ts).max(0) as f64 / 1e6;
        metrics::gauge!(m::RULES_LAG_SECONDS, "table" => table.to_owned()).set(lag);
    }
}
