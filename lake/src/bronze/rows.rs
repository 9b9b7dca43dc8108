//! Bronze rows: the event's envelope columns plus where and when it was read.

use std::sync::Arc;

use deltalake::arrow::array::{
    ArrayRef, Date32Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use deltalake::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use wal2delta_model::bronze;

use crate::LakeError;

/// The partition column: the UTC date the rows were ingested.
pub const PARTITION_COLUMN: &str = bronze::INGEST_DATE;

/// Kafka coordinates of one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaCoordinates {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
}

/// Builds one Bronze record batch: `envelope` columns (from
/// `wal2delta_stream::avro::columns`), then `kafka_topic`, `kafka_partition`,
/// `kafka_offset`, `kafka_timestamp`, `ingested_at` and `ingest_date`.
pub fn bronze_batch(
    table: &str,
    topic: &str,
    envelope_fields: Vec<Field>,
    envelope_arrays: Vec<ArrayRef>,
    coordinates: &[KafkaCoordinates],
    ingested_at_us: i64,
) -> Result<RecordBatch, LakeError> {
    let n = coordinates.len();
    let utc = || DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let day = i32::try_from(ingested_at_us.div_euclid(86_400_000_000)).unwrap_or(i32::MAX);
    let mut fields = envelope_fields;
    let mut arrays = envelope_arrays;
    let extra: Vec<(Field, ArrayRef)> = vec![
        (
            Field::new(bronze::KAFKA_TOPIC, DataType::Utf8, true),
            Arc::new(StringArray::from(vec![topic; n])),
        ),
        (
            Field::new(bronze::KAFKA_PARTITION, DataType::Int32, true),
            Arc::new(
                coordinates
                    .iter()
                    .map(|c| Some(c.partition))
                    .collect::<Int32Array>(),
            ),
        ),
        (
            Field::new(bronze::KAFKA_OFFSET, DataType::Int64, true),
            Arc::new(
                coordinates
                    .iter()
                    .map(|c| Some(c.offset))
                    .collect::<Int64Array>(),
            ),
        ),
        (
            Field::new(bronze::KAFKA_TIMESTAMP, utc(), true),
            Arc::new(
                coordinates
                    .iter()
                    .map(|c| c.timestamp_ms.and_then(|ms| ms.checked_mul(1000)))
                    .collect::<TimestampMicrosecondArray>()
                    .with_timezone("UTC"),
            ),
        ),
        (
            Field::new(bronze::INGESTED_AT, utc(), true),
            Arc::new(TimestampMicrosecondArray::from(vec![ingested_at_us; n]).with_timezone("UTC")),
        ),
        (
            Field::new(PARTITION_COLUMN, DataType::Date32, true),
            Arc::new(Date32Array::from(vec![day; n])),
        ),
    ];
    for (f, a) in extra {
        fields.push(f);
        arrays.push(a);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(|e| LakeError::Rows {
        table: table.to_owned(),
        reason: e.to_string(),
    })
}
