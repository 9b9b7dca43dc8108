//! Bronze: every change as it arrived, once, in one append-only Delta table per source
//! table at `bronze/{schema}/{table}`, partitioned by ingestion date, with the Kafka offsets
//! it holds recorded in the same commits (see [`table`]).

mod direct;
mod rows;
mod schema;
mod table;

pub use rows::{bronze_batch, KafkaCoordinates, PARTITION_COLUMN};
pub use schema::{adds_nothing, merge_schemas, text_decimals, TEXT_DECIMAL_PROPERTY};
pub use table::{app_id, Append, AppendOutcome, BronzeTable, OffsetRange};
