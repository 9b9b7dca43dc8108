//! The rules stage's Kafka outputs (docs/rules.md, "Kafka outputs") on the real stack: a
//! scripted workload (inserts, updates entering and leaving rules, a row matching two
//! rules, rows matching none, a delete, a TRUNCATE, then a rule added without restart)
//! through the daemon with `[rules] transitions_topic` and `filter_topic` set. Then:
//! - the transitions topic holds exactly the rows of `rules/transitions` (read by DuckDB);
//! - the filter topic holds exactly the change events whose row after the transaction
//!   matches a rule, with the rule ids and the row PostgreSQL itself evaluated and
//!   returned after each transaction, in commit order;
//! - the early filter's metrics count the events in and out, and the reduction is in ÷ out,
//!   also as `wal2delta status --json` reports them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use tokio_postgres::Client;
use wal2delta_tests::kafka::read_topic;
use wal2delta_tests::lake::duckdb;
use wal2delta_tests::metrics::{free_port, of, of_table, text};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.payments (id bigint PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, note text);";

/// The rules, as TOML and as the SQL PostgreSQL evaluates them (same conditions).
const RULES: [(&str, &str); 2] = [("big", "amount > 1000"), ("usd", "currency = 'USD'")];

fn rules_toml(s: &str, rules: &[(&str, &str)]) -> String {
    rules
        .iter()
        .map(|(id, when)| {
            format!("[[rule]]\nid = \"{id}\"\ntable = \"{s}.payments\"\nwhen = \"{when}\"\n\n")
        })
        .collect()
}

/// One source transaction of the workload: its SQL, and the keys it changes with the op
/// the change event carries for each (`c` or `u`; a deleted key has no event).
struct Step {
    sql: &'static str,
    keys: &'static [(i64, &'static str)],
}

const WORKLOAD: &[Step] = &[
    Step { sql: "INSERT INTO {s}.payments VALUES (1, 2000, 'EUR', 'a')", keys: &[(1, "c")] },
    // Matches no rule.
    Step { sql: "INSERT INTO {s}.payments VALUES (2, 50, 'EUR', NULL)", keys: &[(2, "c")] },
    // Matches two rules.
    Step { sql: "INSERT INTO {s}.payments VALUES (3, 5000, 'USD', 'c')", keys: &[(3, "c")] },
    // Leaves `big`: matches nothing any more.
    Step { sql: "UPDATE {s}.payments SET amount = 500 WHERE id = 1", keys: &[(1, "u")] },
    // Enters `big`.
    Step { sql: "UPDATE {s}.payments SET amount = 3000 WHERE id = 2", keys: &[(2, "u")] },
    // Still matches both: an event, no transition.
    Step { sql: "UPDATE {s}.payments SET note = 'x' WHERE id = 3", keys: &[(3, "u")] },
    Step { sql: "DELETE FROM {s}.payments WHERE id = 3", keys: &[] },
    // Two changes of one key in one transaction: one event, the row at its end.
    Step {
        sql: "BEGIN; UPDATE {s}.payments SET currency = 'USD' WHERE id = 2; UPDATE {s}.payments SET amount = 10 WHERE id = 2; COMMIT",
        keys: &[(2, "u")],
    },
    Step { sql: "TRUNCATE {s}.payments", keys: &[] },
    Step {
        sql: "INSERT INTO {s}.payments VALUES (4, 1500, 'USD', 'd'), (5, 1, 'EUR', 'e')",
        keys: &[(4, "c"), (5, "c")],
    },
];

/// The change events of the workload's row versions (deletes included): the early
/// filter's events in: 8 transactions of one key each, one of two keys (the TRUNCATE is
/// no row version).
const EVENTS_IN: u64 = 10;

/// An expected filter event: key, op, matching rules, the row.
type Expected = (String, String, Vec<String>, Value);

/// Runs the workload; after each transaction PostgreSQL evaluates the rules on the rows
/// it changed, which gives the events the filter must pass.
async fn run_workload(pg: &Client, s: &str) -> Result<Vec<Expected>> {
    let cases: Vec<String> = RULES
        .iter()
        .map(|(id, when)| format!("CASE WHEN {when} THEN '{id}' END"))
        .collect();
    let mut want = Vec::new();
    for step in WORKLOAD {
        pg.batch_execute(&step.sql.replace("{s}", s)).await?;
        for (id, op) in step.keys {
            let row = pg
                .query_opt(
                    &format!(
                        "SELECT array_remove(ARRAY[{}]::text[], NULL), row_to_json(p)::text FROM {s}.payments p WHERE id = $1",
                        cases.join(", ")
                    ),
                    &[id],
                )
                .await?
                .context("the workload's key exists after its transaction")?;
            let rules: Vec<String> = row.get(0);
            let after: String = row.get(1);
            if !rules.is_empty() {
                want.push((
                    format!("{{\"id\":{id}}}"),
                    (*op).to_owned(),
                    rules,
                    serde_json::from_str(&after)?,
                ));
            }
        }
    }
    Ok(want)
}

/// The JSON values of a topic's messages, in offset order.
fn topic_values(brokers: &str, topic: &str) -> Result<Vec<(String, Value)>> {
    read_topic(brokers, topic, None, Duration::from_secs(3))?
        .into_iter()
        .map(|r| {
            let key = String::from_utf8(r.key.unwrap_or_default())?;
            Ok((key, serde_json::from_slice(&r.payload)?))
        })
        .collect()
}

/// `rules/transitions` as the transitions topic carries it, sorted.
fn delta_transitions(lake: &std::path::Path) -> Result<Vec<Value>> {
    let path = lake.join("rules/transitions");
    if !path.join("_delta_log").is_dir() {
        return Ok(Vec::new());
    }
    let rows = duckdb(&format!(
        "SELECT rule_id, rule_version, \"table\", key, transition, lsn, epoch_us(commit_ts), origin, seq FROM delta_scan('{}')",
        path.display()
    ))?;
    let mut out: Vec<Value> = rows
        .into_iter()
        .map(|r| {
            json!({
                "rule_id": r[0], "rule_version": r[1], "table": r[2], "key": r[3],
                "transition": r[4], "lsn": r[5], "commit_ts": r[6], "origin": r[7], "seq": r[8],
            })
        })
        .collect();
    out.sort_by_key(Value::to_string);
    Ok(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn transitions_and_filter_topics_hold_exactly_what_the_rules_say() -> Result<()> {
    let stack = Stack::from_env();
    let port = free_port()?;
    let w = Scenario::new(&stack, "rulesout", TABLES)
        .env("WAL2DELTA__RULES__FILE", "{dir}/rules.toml")
        .env(
            "WAL2DELTA__RULES__TRANSITIONS_TOPIC",
            "{s}-rules-transitions",
        )
        .env("WAL2DELTA__RULES__FILTER_TOPIC", "{s}-rules-filter")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .env("WAL2DELTA__METRICS__LISTEN", &format!("127.0.0.1:{port}"))
        .without_setup()
        .build()
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let table = format!("{s}.payments");
    let (transitions_topic, filter_topic) = (
        format!("{s}-rules-transitions"),
        format!("{s}-rules-filter"),
    );
    std::fs::write(d.dir.join("rules.toml"), rules_toml(&s, &RULES))?;
    d.setup()?;
    let mut run = d.spawn_stage("capture,bronze,silver,rules", "run")?;
    let want_events = run_workload(&pg, &s).await?;
    ensure!(
        want_events.len() == 6,
        "the workload passes 6 events: {want_events:?}"
    );

    // The stream's transitions (the Delta table is checked against the topic below).
    let k = |id: i64| format!("{{\"id\":{id}}}");
    let tr = |id: i64, rule: &str, t: &str| (k(id), rule.to_owned(), t.to_owned());
    let mut want_transitions = vec![
        tr(1, "big", "entered"),
        tr(3, "big", "entered"),
        tr(3, "usd", "entered"),
        tr(1, "big", "left"),
        tr(2, "big", "entered"),
        tr(3, "big", "left"),
        tr(3, "usd", "left"),
        tr(2, "big", "left"),
        tr(2, "usd", "entered"),
        tr(2, "usd", "left"),
        tr(4, "big", "entered"),
        tr(4, "usd", "entered"),
    ];
    let lake = d.lake();
    let ordered = |lake: &std::path::Path| -> Result<Vec<(String, String, String)>> {
        let mut rows = delta_transitions(lake)?;
        rows.sort_by_key(|v| {
            (
                v["lsn"].as_i64(),
                v["transition"] == "entered",
                v["key"].to_string(),
                v["rule_id"].to_string(),
            )
        });
        Ok(rows
            .iter()
            .map(|v| {
                let t = |f: &str| v[f].as_str().unwrap_or_default().to_owned();
                (t("key"), t("rule_id"), t("transition"))
            })
            .collect())
    };
    run.wait_for("stream transitions", &want_transitions, || ordered(&lake))
        .await?;

    // A rule added without restart: its backfill's transitions are published too.
    let mut more = RULES.to_vec();
    more.push(("eur", "currency = 'EUR'"));
    std::fs::write(d.dir.join("rules.toml"), rules_toml(&s, &more))?;
    want_transitions.push(tr(5, "eur", "entered"));
    run.wait_for("backfill transitions", &want_transitions, || ordered(&lake))
        .await?;

    // The transitions topic holds exactly the rows of rules/transitions.
    let delta = delta_transitions(&lake)?;
    let topic = || -> Result<Vec<Value>> {
        let mut v: Vec<Value> = topic_values(&stack.brokers, &transitions_topic)?
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        v.sort_by_key(Value::to_string);
        Ok(v)
    };
    run.wait_for(
        "the transitions topic equals rules/transitions",
        &delta,
        topic,
    )
    .await?;
    ensure!(
        delta.iter().any(|v| v["origin"] == "backfill")
            && delta.iter().any(|v| v["origin"] == "stream")
    );
    for (key, v) in topic_values(&stack.brokers, &transitions_topic)? {
        ensure!(
            key == format!("{table}/{}", v["key"].as_str().unwrap_or_default()),
            "a transition is keyed by table and key: {key} {v}"
        );
    }

    // The filter topic holds exactly the events PostgreSQL's evaluation expects, in commit
    // order, each with the row as Silver stores it.
    let events = topic_values(&stack.brokers, &filter_topic)?;
    let mut got: Vec<(i64, i64, Expected)> = Vec::new();
    for (key, v) in &events {
        ensure!(v["table"] == table.as_str(), "{v}");
        ensure!(
            key == &format!("{table}/{}", v["key"].as_str().unwrap_or_default()),
            "{key} {v}"
        );
        ensure!(v.get("after_omitted").is_none(), "{v}");
        let rules: Vec<String> = serde_json::from_value(v["rules"].clone())?;
        got.push((
            v["lsn"].as_i64().context("lsn")?,
            v["ordinal"].as_i64().context("ordinal")?,
            (
                v["key"].as_str().unwrap_or_default().to_owned(),
                v["op"].as_str().unwrap_or_default().to_owned(),
                rules,
                v["after"].clone(),
            ),
        ));
        ensure!(v["commit_ts"].as_i64().is_some(), "{v}");
    }
    got.sort_by_key(|(lsn, ord, _)| (*lsn, *ord));
    let got_events: Vec<Expected> = got.iter().map(|(_, _, e)| e.clone()).collect();
    ensure!(
        got_events == want_events,
        "filter topic:\n got {got_events:?}\nwant {want_events:?}"
    );
    // An event carries its transaction's commit LSN: the transitions of the same
    // transaction have it too.
    let lsn_of = |key: &str, rule: &str, t: &str| {
        delta
            .iter()
            .find(|v| {
                v["key"] == key
                    && v["rule_id"] == rule
                    && v["transition"] == t
                    && v["origin"] == "stream"
            })
            .and_then(|v| v["lsn"].as_i64())
    };
    ensure!(Some(got[0].0) == lsn_of(&k(1), "big", "entered"), "{got:?}");
    ensure!(Some(got[1].0) == lsn_of(&k(3), "usd", "entered"), "{got:?}");

    // Metrics: events in, out, and the reduction in ÷ out; `status` reports the three.
    let (events_in, events_out) = (EVENTS_IN as f64, want_events.len() as f64);
    let start = Instant::now();
    let body = loop {
        let body = text(port).await?;
        if of_table(&body, "wal2delta_rules_filter_events_in_total", &table) == Some(events_in) {
            break body;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("events in never reached {events_in}:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(
        of_table(&body, "wal2delta_rules_filter_events_out_total", &table) == Some(events_out),
        "{body}"
    );
    let reduction =
        of_table(&body, "wal2delta_rules_filter_reduction", &table).context("reduction gauge")?;
    ensure!(
        (reduction - events_in / events_out).abs() < 1e-9,
        "reduction {reduction}"
    );
    let published = |topic: &str| of(&body, "wal2delta_rules_published_total", "topic", topic);
    ensure!(published(&filter_topic) == Some(events_out), "{body}");
    ensure!(
        published(&transitions_topic) == Some(delta.len() as f64),
        "{body}"
    );
    let out = d.command(&["status", "--json"])?;
    let doc: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("status --json: {}", String::from_utf8_lossy(&out.stderr)))?;
    let filter = &doc["stages"]["rules"]["filter"][&table];
    ensure!(
        filter
            == &json!({ "events_in": events_in, "events_out": events_out, "reduction": reduction }),
        "status: {doc}"
    );
    let counts: BTreeMap<&str, usize> = events.iter().fold(BTreeMap::new(), |mut m, (_, v)| {
        *m.entry(v["op"].as_str().unwrap_or("?")).or_default() += 1;
        m
    });
    ensure!(counts == BTreeMap::from([("c", 3), ("u", 3)]), "{counts:?}");
    ensure!(run.stop()?.success());
    Ok(())
}

/// Every message of a topic, dropped to its identity (docs/rules.md): the identities in
/// topic order, repeats included.
fn identities(brokers: &str, topic: &str, fields: &[&str]) -> Result<Vec<String>> {
    Ok(topic_values(brokers, topic)?
        .into_iter()
        .map(|(_, v)| {
            let id: Vec<&Value> = fields.iter().map(|f| &v[*f]).collect();
            serde_json::to_string(&id).unwrap_or_default()
        })
        .collect())
}

/// At-least-once under SIGKILL: the Silver + rules process is killed at random moments of
/// a randomised workload and restarted. Afterwards the transitions topic, its repeats
/// dropped by (rule_id, table, key, lsn, transition), equals `rules/transitions`; and every
/// stream `entered` transition has its filter event (same key and LSN, naming the rule).
#[tokio::test(flavor = "multi_thread")]
async fn outputs_lose_nothing_when_the_rules_process_is_killed() -> Result<()> {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "rulesoutkill", TABLES)
        // What a filter event may carry of the row: `id` and `amount`, never the rest.
        .toml("[rules]\nfilter_columns = { \"{s}.payments\" = [\"id\", \"amount\"] }\n")
        .env("WAL2DELTA__RULES__FILE", "{dir}/rules.toml")
        .env(
            "WAL2DELTA__RULES__TRANSITIONS_TOPIC",
            "{s}-rules-transitions",
        )
        .env("WAL2DELTA__RULES__FILTER_TOPIC", "{s}-rules-filter")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "200")
        .without_setup()
        .build()
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    let (transitions_topic, filter_topic) = (
        format!("{s}-rules-transitions"),
        format!("{s}-rules-filter"),
    );
    std::fs::write(d.dir.join("rules.toml"), rules_toml(&s, &RULES))?;
    d.setup()?;
    let lake = d.lake();
    let mut feed = d.spawn_stage("capture,bronze", "feed")?;
    let mut silver = d.spawn_stage("silver,rules", "silver-0")?;
    let load = {
        let pg = stack.connect().await?;
        let s = s.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(5);
            for _ in 0..400 {
                let id = rng.random_range(1..=40);
                let amount = rng.random_range(0..2000);
                let sql = match rng.random_range(0..6) {
                    0 => format!("DELETE FROM {s}.payments WHERE id = {id}"),
                    1 => format!("UPDATE {s}.payments SET currency = CASE currency WHEN 'USD' THEN 'EUR' ELSE 'USD' END WHERE id = {id}"),
                    _ => format!("INSERT INTO {s}.payments VALUES ({id}, {amount}, 'EUR', NULL) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount"),
                };
                pg.batch_execute(&sql).await?;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            anyhow::Ok(())
        })
    };
    let mut rng = StdRng::seed_from_u64(9);
    let mut kills = 0;
    while !load.is_finished() || kills < 3 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(700..2500))).await;
        feed.assert_running()?;
        silver.kill9();
        kills += 1;
        silver = d.spawn_stage("silver,rules", &format!("silver-{kills}"))?;
    }
    load.await??;
    // Caught up: the hits are the rules PostgreSQL evaluates on the source rows.
    let want_hits: Vec<(String, String)> = pg
        .query(
            &format!(
                "SELECT key, r FROM (SELECT '{{\"id\":' || id || '}}' AS key, r FROM (SELECT id, 'big' AS r FROM {s}.payments WHERE amount > 1000 UNION ALL SELECT id, 'usd' FROM {s}.payments WHERE currency = 'USD') x) y ORDER BY key COLLATE \"C\", r COLLATE \"C\""
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    silver
        .wait_for("hits equal the source", &want_hits, || {
            wal2delta_tests::lake::rule_hits(&lake)
        })
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(silver.stop()?.success());
    ensure!(feed.stop()?.success());

    let fields = ["rule_id", "table", "key", "lsn", "transition"];
    let delta: std::collections::BTreeSet<String> = delta_transitions(&lake)?
        .iter()
        .map(|v| {
            let id: Vec<&Value> = fields.iter().map(|f| &v[*f]).collect();
            serde_json::to_string(&id).unwrap_or_default()
        })
        .collect();
    let published = identities(&stack.brokers, &transitions_topic, &fields)?;
    let deduped: std::collections::BTreeSet<String> = published.iter().cloned().collect();
    ensure!(
        delta.len() > 100,
        "a workload worth the name: {}",
        delta.len()
    );
    if deduped != delta {
        bail!(
            "after {kills} kills: {} distinct published, {} in rules/transitions; only published: {:?}; only in Delta: {:?}",
            deduped.len(),
            delta.len(),
            deduped.difference(&delta).take(5).collect::<Vec<_>>(),
            delta.difference(&deduped).take(5).collect::<Vec<_>>()
        );
    }
    // Every stream `entered` has its filter event, naming the rule.
    let events = topic_values(&stack.brokers, &filter_topic)?;
    // `[rules] filter_columns`: each event's row holds the listed columns and no other.
    for (_, e) in &events {
        let cols: Vec<&String> = e["after"]
            .as_object()
            .map(|a| a.keys().collect())
            .unwrap_or_default();
        ensure!(cols == ["amount", "id"], "{e}");
    }
    for v in delta_transitions(&lake)?
        .iter()
        .filter(|v| v["transition"] == "entered" && v["origin"] == "stream")
    {
        ensure!(
            events.iter().any(|(_, e)| e["key"] == v["key"]
                && e["lsn"] == v["lsn"]
                && e["rules"]
                    .as_array()
                    .is_some_and(|r| r.contains(&v["rule_id"]))),
            "no filter event for {v}"
        );
    }
    eprintln!(
        "{kills} kills: {} transitions published ({} repeats), {} filter events",
        published.len(),
        published.len() - deduped.len(),
        events.len()
    );
    Ok(())
}
