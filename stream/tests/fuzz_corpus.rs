//! The fuzz corpus of the Kafka-record target, and the writer schemas of its seeds, on
//! stable (see the runner).

#[path = "../../fuzz/corpus_runner.rs"]
mod corpus_runner;

use corpus_runner::{files_at, run, seeds};
use wal2delta_stream::fuzz;

#[test]
fn kafka_record_corpus() {
    seeds("kafka_record", fuzz::seed_records());
    run("kafka_record", fuzz::kafka_record);
}

/// The writer schemas of the seed records, committed beside the corpus for readers.
#[test]
fn kafka_record_schemas() {
    let (value, key) = fuzz::fixture_schemas_json();
    let pretty = |s: &str| {
        serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(s).unwrap())
            .unwrap()
            + "
"
    };
    files_at(
        "schemas",
        vec![
            (
                "kafka_record.value.avsc".into(),
                pretty(&value).into_bytes(),
            ),
            ("kafka_record.key.avsc".into(), pretty(&key).into_bytes()),
        ],
    );
}
