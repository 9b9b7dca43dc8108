//! `wal2delta-peek TOPIC [N]`: prints the last N events of a topic as JSON, decoded through
//! the schema registry. A development tool used by `ops/quickstart`.

use std::time::Duration;

use wal2delta_tests::kafka::{read_topic, AvroDecoder};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let topic = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: wal2delta-peek TOPIC [N]"))?;
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let brokers =
        std::env::var("WAL2DELTA__KAFKA__BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let registry = std::env::var("WAL2DELTA__SCHEMA_REGISTRY__URL")
        .unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let records = read_topic(&brokers, &topic, None, Duration::from_secs(3))?;
    println!("{topic}: {} events", records.len());
    let mut decoder = AvroDecoder::new(&registry);
    for r in records.iter().rev().take(n).rev() {
        if r.tombstone {
            // A key with a null value, after a delete (docs/capture.md).
            println!("{{\"tombstone\": true, \"offset\": {}}}", r.offset);
            continue;
        }
        let v = decoder.decode(&r.payload)?;
        let json: serde_json::Value = v.try_into().unwrap_or(serde_json::Value::Null);
        println!("{}", serde_json::to_string(&json)?);
    }
    Ok(())
}
