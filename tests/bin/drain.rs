//! `wal2delta-drain TOPIC`: reads every message of a topic up to its high watermarks and
//! prints `{"messages": N, "bytes": B, "seconds": S}`. The floor of `ops/bench bronze`:
//! what the same Kafka client library takes just to fetch the events, with no decoding
//! and no writing.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

fn main() -> anyhow::Result<()> {
    let topic = std::env::args()
        .nth(1)
        .context("usage: wal2delta-drain TOPIC")?;
    let brokers =
        std::env::var("WAL2DELTA__KAFKA__BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set(
            "group.id",
            format!("wal2delta-drain-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .create()?;
    let started = Instant::now();
    let md = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
    let mut expected = 0i64;
    let mut tpl = TopicPartitionList::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(&topic, p.id(), Duration::from_secs(10))?;
            expected += high - low;
            tpl.add_partition_offset(&topic, p.id(), Offset::Offset(low))?;
        }
    }
    consumer.assign(&tpl)?;
    let (mut n, mut bytes) = (0i64, 0usize);
    let mut last_progress = Instant::now();
    while n < expected {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                n += 1;
                bytes += m.payload().map_or(0, <[u8]>::len);
                last_progress = Instant::now();
            }
            Some(Err(e)) => bail!("consuming {topic}: {e}"),
            None if last_progress.elapsed() > Duration::from_secs(30) => {
                bail!("no message for 30 s after {n} of {expected}")
            }
            None => {}
        }
    }
    println!(
        "{}",
        serde_json::json!({ "messages": n, "bytes": bytes, "seconds": started.elapsed().as_secs_f64() })
    );
    Ok(())
}
