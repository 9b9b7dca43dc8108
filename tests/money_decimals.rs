//! Money is a number (issue 40, docs/types.md "numeric"): bounded numerics are Avro
//! decimals on Kafka and `DECIMAL(p,s)` in Bronze, Silver and Gold, `NaN` is NULL there and
//! kept exactly in `out_of_range_values`, unbounded numerics stay exact text, and a rule
//! `amount > 10000` works as written. Checked on the real stack with independent readers:
//! DuckDB and the `deltalake` package (sums equal PostgreSQL's exactly) and Python's
//! confluent-kafka Avro deserializer (each value a `Decimal` equal to PostgreSQL's).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{ensure, Result};
use serde_json::{json, Value as Json};
use wal2delta_tests::kafka::read_topic_with_python;
use wal2delta_tests::lake::{deltalake_sums, duckdb, scan, transitions};
use wal2delta_tests::{Scenario, Stack};

const TABLES: &str = "CREATE TABLE {s}.pay (id bigint PRIMARY KEY, amount numeric(18,2), \
     big numeric(38,10), small numeric(5,0), free numeric, note text);";

/// Bounded columns, each with its precision and scale.
const DECIMALS: [(&str, &str); 3] = [
    ("amount", "DECIMAL(18,2)"),
    ("big", "DECIMAL(38,10)"),
    ("small", "DECIMAL(5,0)"),
];

/// The hostile values: the ends of each type, the smallest step, NaN, NULL, and the
/// unbounded column's infinities and more than 38 digits.
const INSERT: &str = "INSERT INTO {s}.pay VALUES
    (1, 12345.67, 1234567890123456789012345678.1234567890, 99999,
        3.14159265358979323846264338327950288419716939937510, 'a'),
    (2, -0.01, -9999999999999999999999999999.9999999999, -99999, 'NaN', 'b'),
    (3, 'NaN', 'NaN', 'NaN', 'Infinity', 'c'),
    (4, 10000.00, 0.0000000001, 0, '-Infinity', 'd'),
    (5, NULL, NULL, NULL, NULL, 'e'),
    (6, 9999999999999999.99, 1, 1, 1e-40, 'f')";

/// Each row of the source as text, PostgreSQL's own output (NULL as JSON null).
async fn source_rows(pg: &tokio_postgres::Client, s: &str) -> Result<BTreeMap<i64, Json>> {
    let rows = pg
        .query(
            &format!(
                "SELECT id, amount::text, big::text, small::text, free::text FROM {s}.pay ORDER BY id"
            ),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let t = |i: usize| json!(r.get::<_, Option<String>>(i));
            (
                r.get::<_, i64>(0),
                json!({"amount": t(1), "big": t(2), "small": t(3), "free": t(4)}),
            )
        })
        .collect())
}

/// PostgreSQL's exact sum of each bounded column over its non-NaN values (the lake holds
/// NaN as NULL, which sums skip).
async fn source_sums(pg: &tokio_postgres::Client, s: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (c, _) in DECIMALS {
        let row = pg
            .query_one(
                &format!("SELECT sum({c}) FILTER (WHERE {c} <> 'NaN')::text FROM {s}.pay"),
                &[],
            )
            .await?;
        out.insert(c.to_owned(), row.get::<_, String>(0));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn bounded_numerics_are_decimals_from_kafka_to_gold() -> Result<()> {
    let stack = Stack::from_env();
    let w = Scenario::new(&stack, "money", TABLES)
        .env("WAL2DELTA__RULES__FILE", "{dir}/rules.toml")
        .env("WAL2DELTA__GOLD__MODELS_DIR", "{dir}/models")
        .env("WAL2DELTA__GOLD__INTERVAL_MS", "300")
        .env("WAL2DELTA__SILVER__INTERVAL_MS", "300")
        .without_setup()
        .build()
        .await?;
    let (s, pg, d) = (w.name, w.pg, w.d);
    std::fs::write(
        d.dir.join("rules.toml"),
        format!("[[rule]]\nid = \"big\"\ntable = \"{s}.pay\"\nwhen = \"amount > 10000\"\n"),
    )?;
    std::fs::create_dir_all(d.dir.join("models"))?;
    std::fs::write(
        d.dir.join("models/totals.sql"),
        format!("SELECT count(*) AS payments, sum(amount) AS amount, sum(big) AS big, sum(small) AS small FROM {s}.pay"),
    )?;
    d.setup()?;
    let mut run = d.spawn_stage("capture,bronze,silver,gold,rules", "run")?;

    pg.batch_execute(&INSERT.replace("{s}", &s)).await?;
    let first = source_rows(&pg, &s).await?;
    let history = [
        // 10000.00 is not above 10000; 10000.01 is.
        "UPDATE {s}.pay SET amount = 10000.01 WHERE id = 4",
        // A NaN compares as NULL in the lake: the row leaves.
        "UPDATE {s}.pay SET amount = 'NaN' WHERE id = 1",
        "UPDATE {s}.pay SET amount = 20000 WHERE id = 2",
    ];
    for sql in history {
        pg.batch_execute(&sql.replace("{s}", &s)).await?;
    }
    let k = |id: i64| format!("{{\"id\":{id}}}");
    let tr = |id: i64, t: &str| (k(id), "big".to_owned(), t.to_owned());
    // Rows 1 (12345.67) and 6 enter with the insert, ordered by key within its
    // transaction; 4 at 10000.00 only with its update; 3 (NaN) and 5 (NULL) never.
    let want = vec![
        tr(1, "entered"),
        tr(6, "entered"),
        tr(4, "entered"),
        tr(1, "left"),
        tr(2, "entered"),
    ];
    let lake = d.lake();
    run.wait_for("the rule's transitions", &want, || {
        transitions(&lake, "stream")
    })
    .await?;

    let rows = source_rows(&pg, &s).await?;
    let sums = source_sums(&pg, &s).await?;
    let silver = d.silver("pay");
    wait_silver_equals(&mut run, &silver, &rows).await?;

    // Silver's types and exact sums, by DuckDB and by the deltalake package.
    let types = duckdb(&format!(
        "SELECT typeof(amount), typeof(big), typeof(small), typeof(free) FROM {} LIMIT 1",
        scan(&silver)
    ))?;
    ensure!(
        types
            == vec![vec![
                json!("DECIMAL(18,2)"),
                json!("DECIMAL(38,10)"),
                json!("DECIMAL(5,0)"),
                json!("VARCHAR")
            ]],
        "Silver types: {types:?}"
    );
    for (c, _) in DECIMALS {
        let got = duckdb(&format!("SELECT sum({c})::VARCHAR FROM {}", scan(&silver)))?;
        ensure!(
            got == vec![vec![json!(sums[c])]],
            "DuckDB sum({c}) = {got:?}, PostgreSQL {}",
            sums[c]
        );
    }
    let dl = deltalake_sums(&silver)?;
    for (c, ty) in [
        ("amount", "decimal128(18, 2)"),
        ("big", "decimal128(38, 10)"),
        ("small", "decimal128(5, 0)"),
    ] {
        ensure!(dl["types"][c] == ty, "deltalake type of {c}: {dl}");
    }
    ensure!(
        dl["types"]["free"]
            .as_str()
            .is_some_and(|t| t.contains("string")),
        "deltalake type of free: {dl}"
    );
    for (c, _) in DECIMALS {
        ensure!(
            dl["sums"][c] == json!(sums[c]),
            "deltalake sum({c}): {dl}, PostgreSQL {}",
            sums[c]
        );
    }

    // Bronze: the same decimal columns, NaN NULL with its text kept in the row.
    let bronze = scan(&d.bronze("pay"));
    let kept = duckdb(&format!(
        "SELECT after.amount IS NULL, after.big IS NULL, after.small IS NULL, after.free, out_of_range_values::VARCHAR
         FROM {bronze} WHERE op = 'c' AND after.id = 3"
    ))?;
    ensure!(
        kept == vec![vec![
            json!(true),
            json!(true),
            json!(true),
            json!("Infinity"),
            json!("[{'column': after.amount, 'value': NaN}, {'column': after.big, 'value': NaN}, {'column': after.small, 'value': NaN}]")
        ]],
        "Bronze row 3: {kept:?}"
    );
    let types = duckdb(&format!(
        "SELECT DISTINCT typeof(after.amount), typeof(after.big), typeof(after.small), typeof(after.free) FROM {bronze}"
    ))?;
    ensure!(
        types
            == vec![vec![
                json!("DECIMAL(18,2)"),
                json!("DECIMAL(38,10)"),
                json!("DECIMAL(5,0)"),
                json!("VARCHAR")
            ]],
        "Bronze types: {types:?}"
    );

    // Gold: sums without a cast, exactly PostgreSQL's.
    let gold = lake.join("gold/totals");
    let want_gold = vec![vec![
        json!(rows.len() as i64),
        json!(sums["amount"]),
        json!(sums["big"]),
        json!(sums["small"]),
    ]];
    run.wait_for("gold/totals", &want_gold, || {
        if !gold.join("_delta_log").is_dir() {
            return Ok(Vec::new());
        }
        duckdb(&format!(
            "SELECT payments, amount::VARCHAR, big::VARCHAR, small::VARCHAR FROM {}",
            scan(&gold)
        ))
    })
    .await?;

    // Kafka, as a Python consumer reads it: each bounded value a Decimal equal to
    // PostgreSQL's, NaN null and named with its text; the unbounded column exact text.
    let events = read_topic_with_python(
        &stack.brokers,
        &stack.registry,
        &format!("{s}.{s}.pay"),
        6 + history.len(),
        std::time::Duration::from_secs(60),
    )?;
    let inserts: Vec<&Json> = events.iter().filter(|e| e["value"]["op"] == "c").collect();
    ensure!(inserts.len() == 6, "{events:#?}");
    for e in inserts {
        let after = &e["value"]["after"];
        let id = after["id"].as_i64().unwrap_or(-1);
        let want = &first[&id];
        let mut nan = Vec::new();
        for (c, _) in DECIMALS {
            match want[c].as_str() {
                None => ensure!(after[c].is_null(), "{c} of {id}: {after}"),
                Some("NaN") => {
                    ensure!(after[c].is_null(), "{c} of {id}: {after}");
                    nan.push(json!({"column": format!("after.{c}"), "value": "NaN"}));
                }
                Some(v) => ensure!(
                    after[c] == json!({"decimal": v}),
                    "{c} of {id}: {} is not the Decimal {v}",
                    after[c]
                ),
            }
        }
        ensure!(after["free"] == want["free"], "free of {id}: {after}");
        let listed = &e["value"]["out_of_range_values"];
        if nan.is_empty() {
            ensure!(listed.is_null(), "{id}: {listed}");
        } else {
            ensure!(*listed == json!(nan), "{id}: {listed}");
        }
    }

    ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    Ok(())
}

/// Waits until Silver holds exactly the source's rows (values as text: DuckDB prints a
/// decimal with its scale's digits, as PostgreSQL does; NaN is NULL).
async fn wait_silver_equals(
    run: &mut wal2delta_tests::daemon::StageProcess,
    silver: &Path,
    rows: &BTreeMap<i64, Json>,
) -> Result<()> {
    let want: Vec<Vec<Json>> = rows
        .iter()
        .map(|(id, r)| {
            let v = |c: &str| match r[c].as_str() {
                Some("NaN") => Json::Null,
                other => json!(other),
            };
            vec![
                json!(id),
                v("amount"),
                v("big"),
                v("small"),
                r["free"].clone(),
            ]
        })
        .collect();
    run.wait_for("Silver equals the source", &want, || {
        if !silver.join("_delta_log").is_dir() {
            return Ok(Vec::new());
        }
        duckdb(&format!(
            "SELECT id, amount::VARCHAR, big::VARCHAR, small::VARCHAR, free FROM {} ORDER BY id",
            scan(silver)
        ))
    })
    .await
}
