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
use wal2delta_tests::kafka::{field, read_topic, unwrap_union, AvroDecoder};
use wal2delta_tests::{scenario, Stack};

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
    let (name, pg, mut d) = scenario(&stack, "types", &tables, "", 1).await?;
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
        let datum = from_avro(&types[*col], unwrap_union(value))
            .with_context(|| format!("decoding {} (row {row_id})", cases[*col].0))?;
        let ours = render_text(&types[*col], &datum);
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
