//! Type fidelity (promise 7), end to end: every type's edge values travel through
//! pgoutput, Avro, the broker and the registry, and decode back to exactly what
//! PostgreSQL holds — compared with PostgreSQL's own rendering of the stored value.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use apache_avro::types::Value;
use wal2delta_cdc::catalog::TypeCatalog;
use wal2delta_cdc::value::render_text;
use wal2delta_model::ColumnType;
use wal2delta_stream::avro::types::from_avro;
use wal2delta_tests::kafka::{field, read_topic, string, unwrap_union, AvroDecoder};
use wal2delta_tests::{Scenario, Stack, World};

/// (column type, values as SQL literals). Each value becomes one row; the other columns
/// of that row stay NULL.
fn cases() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("bool", vec!["true", "false"]),
        ("int2", vec!["-32768", "32767", "0"]),
        ("int4", vec!["-2147483648", "2147483647"]),
        ("int8", vec!["-9223372036854775808", "9223372036854775807"]),
        (
            "float4",
            vec![
                "'NaN'",
                "'Infinity'",
                "'-Infinity'",
                "1.17549435e-38",
                "3.4028235e+38",
                "-0",
                "0.1",
            ],
        ),
        (
            "float8",
            vec![
                "'NaN'",
                "'Infinity'",
                "'-Infinity'",
                "2.2250738585072014e-308",
                "1.7976931348623157e+308",
                "0.1",
                "-1e-300",
            ],
        ),
        (
            "numeric(12,2)",
            vec!["1234567890.12", "-0.01", "'NaN'", "0"],
        ),
        (
            "numeric",
            vec![
                "'NaN'",
                "'Infinity'",
                "'-Infinity'",
                "0.000000000000000000000000000001",
                "repeat('9', 1100)::numeric",
                "-123.4500",
            ],
        ),
        (
            "text",
            vec![
                "''",
                "'with \"quotes\", commas and é ü 漢字'",
                "E'tab\\tnewline\\n'",
            ],
        ),
        ("varchar(10)", vec!["'abc'"]),
        ("char(5)", vec!["'ab'"]),
        ("bytea", vec!["'\\x00ff10'::bytea", "''::bytea"]),
        ("uuid", vec!["'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
        ("json", vec![r#"'{"b": [1, 2.50, null], "a": "x"}'"#]),
        ("jsonb", vec![r#"'{"b": [1, 2.50, null], "a": "x"}'"#]),
        (
            "date",
            vec![
                "'infinity'",
                "'-infinity'",
                "'4714-11-24 BC'",
                "'5874897-12-31'",
                "'2024-02-29'",
            ],
        ),
        (
            "time",
            vec!["'00:00:00'", "'24:00:00'", "'13:14:15.123456'"],
        ),
        ("timetz", vec!["'13:14:15.5+05:30'", "'00:00:00-12'"]),
        (
            "timestamp",
            vec![
                "'infinity'",
                "'-infinity'",
                "'4713-01-01 00:00:00 BC'",
                "'294246-12-31 23:59:59.999999'",
                "'2024-01-02 03:04:05.678901'",
            ],
        ),
        (
            "timestamptz",
            vec![
                "'infinity'",
                "'-infinity'",
                "'2024-01-02 03:04:05.678901+02'",
                "'1900-01-01 00:00:00+00'",
            ],
        ),
        (
            "interval",
            vec![
                "'1 year 2 months 3 days 04:05:06.789'",
                "'-1 months 30 days'",
                "'-178000000 years'",
                "'0'",
                "'1 day -00:00:00.000001'",
            ],
        ),
        ("inet", vec!["'192.168.1.5/24'", "'::1'"]),
        ("cidr", vec!["'10.0.0.0/8'"]),
        ("macaddr", vec!["'08:00:2b:01:02:03'"]),
        ("money", vec!["12345.67", "-0.01"]),
        ("bit(4)", vec!["B'1010'"]),
        ("varbit", vec!["B'1'", "B''"]),
        ("{schema}.mood", vec!["'happy'", "'sad'"]),
        ("{schema}.positive", vec!["42"]),
        ("int4[]", vec!["'{1,NULL,-3}'", "'{}'"]),
        (
            "text[]",
            vec![r#"ARRAY['a', 'b,c', '"q"', '', 'NULL', NULL]"#],
        ),
        ("numeric[]", vec!["'{NaN,1.50}'"]),
        (
            "timestamptz[]",
            vec!["ARRAY['infinity'::timestamptz, '2024-01-01 00:00:00+00']"],
        ),
        ("int4range", vec!["'[1,10)'", "'empty'"]),
        ("tstzrange", vec!["'[2024-01-01 00:00:00+00,infinity)'"]),
        ("{schema}.pair", vec!["ROW(1, 'x y')"]),
        ("point", vec!["'(1.5,2)'"]),
        ("tsvector", vec!["'a fat cat'"]),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_type_round_trips_exactly() -> Result<()> {
    let stack = Stack::from_env();
    let cases = cases();
    let cols: Vec<String> = (0..cases.len()).map(|i| format!("c{i}")).collect();
    let defs: Vec<String> = cases
        .iter()
        .zip(&cols)
        .map(|((ty, _), c)| format!("{c} {}", ty.replace("{schema}", "{s}")))
        .collect();
    let tables = format!(
        "CREATE TYPE {{s}}.mood AS ENUM ('sad', 'ok', 'happy');
         CREATE DOMAIN {{s}}.positive AS int CHECK (VALUE > 0);
         CREATE TYPE {{s}}.pair AS (a int, b text);
         CREATE TABLE {{s}}.t (id int PRIMARY KEY, {})",
        defs.join(", ")
    );
    let World {
        name, pg, mut d, ..
    } = Scenario::new(&stack, "types", &tables).build().await?;
    d.start()?;

    let mut rows = Vec::new(); // (id, column index)
    let mut id = 0;
    for (i, (_, values)) in cases.iter().enumerate() {
        for v in values {
            id += 1;
            pg.batch_execute(&format!(
                "INSERT INTO {name}.t (id, {}) VALUES ({id}, {v})",
                cols[i]
            ))
            .await
            .with_context(|| format!("inserting {v} into {}", cases[i].0))?;
            rows.push((id, i));
        }
    }
    id += 1;
    pg.batch_execute(&format!("INSERT INTO {name}.t (id) VALUES ({id})"))
        .await?; // all NULL
    d.wait_caught_up(&pg, Duration::from_secs(60)).await?;

    // Column types as capture resolves them.
    let mut catalog = TypeCatalog::default();
    let mut types: Vec<ColumnType> = Vec::new();
    for c in &cols {
        let r = pg
            .query_one(
                "SELECT atttypid, atttypmod FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = $2",
                &[&format!("{name}.t"), c],
            )
            .await?;
        types.push(catalog.resolve(&pg, r.get(0), r.get(1)).await?);
    }

    let recs = read_topic(
        &stack.brokers,
        &format!("{name}.{name}.t"),
        Some(rows.len() + 1),
        Duration::from_secs(20),
    )?;
    ensure!(
        recs.len() == rows.len() + 1,
        "expected {} events, got {}",
        rows.len() + 1,
        recs.len()
    );
    let mut dec = AvroDecoder::new(&stack.registry);
    let mut checked = 0;
    for (rec, (row_id, col)) in recs.iter().zip(&rows) {
        let v = dec.decode(&rec.payload)?;
        let after = field(&v, "after").cloned().unwrap_or(Value::Null);
        ensure!(
            matches!(field(&after, "id"), Some(Value::Int(i)) if *i == *row_id),
            "events out of order at id {row_id}"
        );
        let value =
            field(&after, &cols[*col]).with_context(|| format!("no field {}", cols[*col]))?;
        // A bounded numeric's NaN is a null field, its text named in the envelope's
        // `out_of_range_values` (docs/types.md, "numeric").
        let path = format!("after.{}", cols[*col]);
        let kept = match field(&v, "out_of_range_values").map(unwrap_union) {
            Some(Value::Array(entries)) => entries.iter().find_map(|e| {
                (string(field(e, "column")).as_deref() == Some(path.as_str()))
                    .then(|| string(field(e, "value")))
                    .flatten()
            }),
            _ => None,
        };
        let ours = match (unwrap_union(value), kept) {
            (Value::Null, Some(text)) => text,
            (value, _) => {
                let datum = from_avro(&types[*col], value)
                    .with_context(|| format!("decoding {} (row {row_id})", cases[*col].0))?;
                render_text(&types[*col], &datum)
            }
        };
        // format('%s', v) prints the type's output function, as pgoutput does.
        let theirs: String = pg
            .query_one(
                &format!(
                    "SELECT format('%s', {}) FROM {name}.t WHERE id = $1",
                    cols[*col]
                ),
                &[row_id],
            )
            .await?
            .get(0);
        ensure!(
            ours == theirs,
            "{} row {row_id}: decoded {ours:?}, PostgreSQL holds {theirs:?}",
            cases[*col].0
        );
        // Every other column of the row is NULL, not a placeholder.
        for (j, c) in cols.iter().enumerate() {
            if j != *col {
                ensure!(
                    matches!(field(&after, c), Some(Value::Null)),
                    "{c} should be null in row {row_id}"
                );
            }
        }
        checked += 1;
    }
    ensure!(checked == rows.len());
    d.stop()?;
    Ok(())
}

/// Temporal values outside the calendars of Avro clients (`±infinity`, years past 9999,
/// `24:00:00`) reach a Python consumer (confluent-kafka's `AvroDeserializer`, i.e. fastavro)
/// as the plain integers `docs/types.md` documents, and Bronze still holds them with the
/// same Arrow types and values as before temporal columns dropped their Avro logical types.
#[tokio::test(flavor = "multi_thread")]
async fn temporal_edge_values_reach_python_consumers_and_bronze() -> Result<()> {
    let stack = Stack::from_env();
    let World { name, pg, d, .. } = Scenario::new(
        &stack,
        "pytemporal",
        "CREATE TABLE {s}.edge (id int PRIMARY KEY, d date, t time, ts timestamp, tz timestamptz)",
    )
    .toml("[bronze]\ngroup_id = \"{s}\"\nmax_batch_ms = 300\ntopic_refresh_ms = 500\n")
    .build()
    .await?;
    let mut run = d.spawn_stage("capture,bronze", "run")?;
    let result = temporal_edges(&stack, &name, &pg, &d, &mut run).await;
    if result.is_ok() {
        ensure!(run.stop()?.success(), "clean stop: {}", run.log_text());
    }
    drop(run);
    result
}

async fn temporal_edges(
    stack: &Stack,
    name: &str,
    pg: &tokio_postgres::Client,
    d: &wal2delta_tests::daemon::Daemon,
    run: &mut wal2delta_tests::daemon::StageProcess,
) -> Result<()> {
    use serde_json::{json, Value as Json};
    use wal2delta_tests::kafka::read_topic_with_python;
    use wal2delta_tests::lake::{duckdb, scan};

    pg.batch_execute(&format!(
        "INSERT INTO {name}.edge VALUES
           (1, 'infinity', '24:00:00', 'infinity', 'infinity'),
           (2, '-infinity', '00:00:00', '-infinity', '-infinity'),
           (3, '10000-01-01', '13:14:15.123456', '10000-01-01 00:00:00', '10000-01-01 00:00:00+00'),
           (4, '5874897-12-31', '23:59:59.999999', '294246-12-31 23:59:59.999999', '294246-12-31 23:59:59.999999+00'),
           (5, '2024-02-29', '12:00:00', '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789012+02'),
           (6, '0044-03-15 BC', NULL, '0044-03-15 12:00:00 BC', NULL),
           (7, NULL, NULL, NULL, NULL);"
    ))
    .await?;

    // What every value must arrive as: PostgreSQL's own arithmetic for finite values, the
    // documented sentinels for the infinities.
    let expected = pg
        .query(
            &format!(
                "SELECT id,
                   CASE WHEN d = 'infinity' THEN 2147483647 WHEN d = '-infinity' THEN -2147483648
                        ELSE d - DATE '1970-01-01' END,
                   (EXTRACT(epoch FROM t) * 1000000)::bigint,
                   CASE WHEN ts = 'infinity' THEN 9223372036854775807
                        WHEN ts = '-infinity' THEN -9223372036854775808
                        ELSE (EXTRACT(epoch FROM ts) * 1000000)::bigint END,
                   CASE WHEN tz = 'infinity' THEN 9223372036854775807
                        WHEN tz = '-infinity' THEN -9223372036854775808
                        ELSE (EXTRACT(epoch FROM tz) * 1000000)::bigint END
                 FROM {name}.edge ORDER BY id"
            ),
            &[],
        )
        .await?;
    let expected: Vec<Json> = expected
        .iter()
        .map(|r| {
            json!({"id": r.get::<_, i32>(0), "d": r.get::<_, Option<i32>>(1),
                   "t": r.get::<_, Option<i64>>(2), "ts": r.get::<_, Option<i64>>(3),
                   "tz": r.get::<_, Option<i64>>(4)})
        })
        .collect();
    ensure!(
        expected[0]
            == json!({"id": 1, "d": i32::MAX, "t": 86_400_000_000i64, "ts": i64::MAX, "tz": i64::MAX}),
        "{:?}",
        expected[0]
    );

    d.wait_caught_up(pg, Duration::from_secs(60)).await?;
    let topic = format!("{name}.{name}.edge");
    let records = read_topic_with_python(
        &stack.brokers,
        &stack.registry,
        &topic,
        expected.len(),
        Duration::from_secs(60),
    )?;
    let got: Vec<Json> = records
        .iter()
        .map(|r| r["value"]["after"].clone())
        .collect();
    ensure!(
        got == expected,
        "Python read:\n{got:#?}\nwanted:\n{expected:#?}"
    );
    for r in &records {
        ensure!(
            r["value"]["op"] == "c" && r["key"]["id"] == r["value"]["after"]["id"],
            "{r}"
        );
    }

    // Bronze: the same Arrow types as with the logical types (DuckDB's names) and values.
    let edge = scan(&d.bronze("edge"));
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        run.assert_running()?;
        let n = duckdb(&format!("SELECT count(*) FROM {edge}"))
            .ok()
            .and_then(|rows| rows.first().and_then(|r| r.first()).and_then(Json::as_i64));
        if n == Some(expected.len() as i64) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "Bronze holds {n:?} rows; log: {}",
            run.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let types = duckdb(&format!(
        "SELECT DISTINCT typeof(after.d), typeof(after.t), typeof(after.ts), typeof(after.tz) FROM {edge}"
    ))?;
    ensure!(
        types
            == vec![vec![
                json!("DATE"),
                json!("BIGINT"),
                json!("TIMESTAMP"),
                json!("TIMESTAMP WITH TIME ZONE")
            ]],
        "Bronze column types: {types:?}"
    );
    let us = |c: &str| {
        format!("CASE WHEN isinf(after.{c}) THEN after.{c}::VARCHAR ELSE epoch_us(after.{c})::VARCHAR END")
    };
    let rows = duckdb(&format!(
        "SELECT after.id, after.d::VARCHAR, after.t, {}, {}, out_of_range_values::VARCHAR
         FROM {edge} ORDER BY after.id",
        us("ts"),
        us("tz")
    ))?;
    let text = |v: &Json| match v {
        Json::Null => Json::Null,
        other => json!(other.to_string()),
    };
    let want: Vec<Vec<Json>> = expected
        .iter()
        .zip([
            ("262142-12-31", "[{'column': after.d, 'value': infinity}]"),
            (
                "262144-01-01 (BC)",
                "[{'column': after.d, 'value': -infinity}]",
            ),
            ("10000-01-01", ""),
            (
                "262142-12-30",
                "[{'column': after.d, 'value': 5874897-12-31}]",
            ),
            ("2024-02-29", ""),
            ("0044-03-15 (BC)", ""),
            ("", ""),
        ])
        .map(|(e, (day, mapped))| {
            // The Arrow value is the integer sent; DuckDB shows `i64::MAX` as `infinity` and
            // gives the others' microseconds (its own -infinity is `i64::MIN + 1`).
            let inf = |c: &str| match e[c].as_i64() {
                Some(i64::MAX) => json!("infinity"),
                _ => text(&e[c]),
            };
            let opt = |s: &str| if s.is_empty() { Json::Null } else { json!(s) };
            vec![
                e["id"].clone(),
                opt(day),
                e["t"].clone(),
                inf("ts"),
                inf("tz"),
                opt(mapped),
            ]
        })
        .collect();
    ensure!(rows == want, "Bronze rows:\n{rows:#?}\nwanted:\n{want:#?}");
    Ok(())
}
