//! One quarantine record and its Arrow columns.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// The stage that quarantined a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    Bronze,
    Silver,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Bronze => "bronze",
            Stage::Silver => "silver",
        }
    }

    pub fn parse(s: &str) -> Option<Stage> {
        match s {
            "bronze" => Some(Stage::Bronze),
            "silver" => Some(Stage::Silver),
            _ => None,
        }
    }
}

/// One quarantined event or row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineRecord {
    /// Stable identity: the same event quarantined twice has the same id
    /// (`{stage}/{topic}/{partition}/{offset}` for events read from Kafka).
    pub id: String,
    pub stage: Stage,
    /// Machine-readable reason (`not_framed`, `unknown_schema`, `corrupt_payload`,
    /// `schema_conflict`, `not_an_envelope`, ...).
    pub reason_code: String,
    /// What went wrong, for people. Never contains a row value.
    pub detail: String,
    /// `schema.table` of the source table, when known.
    pub table: Option<String>,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// The change's source LSN, when known.
    pub source_lsn: Option<i64>,
    /// The commit LSN of the change's source transaction and the change's position in it,
    /// when known (the event could be decoded). With them Silver counts a resolved Bronze
    /// record as one of its transaction's events (docs/silver.md).
    pub commit_lsn: Option<i64>,
    pub ordinal: Option<i64>,
    /// Kafka key and value bytes exactly as read.
    pub key: Option<Vec<u8>>,
    pub raw: Option<Vec<u8>>,
    /// Microseconds since the Unix epoch.
    pub quarantined_at_us: i64,
    /// The quality check a Silver row failed (`reason_code` = `check_failed`).
    pub check: Option<String>,
}

impl QuarantineRecord {
    /// The id of an event read from Kafka.
    pub fn event_id(stage: Stage, topic: &str, partition: i32, offset: i64) -> String {
        format!("{}/{topic}/{partition}/{offset}", stage.as_str())
    }

    /// The Arrow schema of the quarantine table.
    pub fn schema() -> SchemaRef {
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, true),
            Field::new("stage", DataType::Utf8, true),
            Field::new("reason_code", DataType::Utf8, true),
            Field::new("detail", DataType::Utf8, true),
            Field::new("table_name", DataType::Utf8, true),
            Field::new("kafka_topic", DataType::Utf8, true),
            Field::new("kafka_partition", DataType::Int32, true),
            Field::new("kafka_offset", DataType::Int64, true),
            Field::new("source_lsn", DataType::Int64, true),
            Field::new("key", DataType::Binary, true),
            Field::new("raw", DataType::Binary, true),
            Field::new("quarantined_at", utc, true),
            Field::new("check_name", DataType::Utf8, true),
            Field::new("commit_lsn", DataType::Int64, true),
            Field::new("ordinal", DataType::Int64, true),
        ]))
    }

    /// The records as one record batch of [`Self::schema`].
    pub fn to_batch(records: &[QuarantineRecord]) -> Result<RecordBatch, arrow::error::ArrowError> {
        let s = |f: fn(&QuarantineRecord) -> Option<&str>| -> ArrayRef {
            Arc::new(records.iter().map(f).collect::<StringArray>())
        };
        let columns: Vec<ArrayRef> = vec![
            s(|r| Some(r.id.as_str())),
            s(|r| Some(r.stage.as_str())),
            s(|r| Some(r.reason_code.as_str())),
            s(|r| Some(r.detail.as_str())),
            s(|r| r.table.as_deref()),
            s(|r| r.topic.as_deref()),
            Arc::new(records.iter().map(|r| r.partition).collect::<Int32Array>()),
            Arc::new(records.iter().map(|r| r.offset).collect::<Int64Array>()),
            Arc::new(records.iter().map(|r| r.source_lsn).collect::<Int64Array>()),
            Arc::new(
                records
                    .iter()
                    .map(|r| r.key.as_deref())
                    .collect::<BinaryArray>(),
            ),
            Arc::new(
                records
                    .iter()
                    .map(|r| r.raw.as_deref())
                    .collect::<BinaryArray>(),
            ),
            Arc::new(
                records
                    .iter()
                    .map(|r| Some(r.quarantined_at_us))
                    .collect::<TimestampMicrosecondArray>()
                    .with_timezone("UTC"),
            ),
            s(|r| r.check.as_deref()),
            Arc::new(records.iter().map(|r| r.commit_lsn).collect::<Int64Array>()),
            Arc::new(records.iter().map(|r| r.ordinal).collect::<Int64Array>()),
        ];
        RecordBatch::try_new(Self::schema(), columns)
    }

    /// Reads records back from a batch with the quarantine table's columns.
    pub fn from_batch(batch: &RecordBatch) -> Result<Vec<QuarantineRecord>, RecordsError> {
        let col = |name: &'static str| {
            batch
                .column_by_name(name)
                .ok_or(RecordsError::MissingColumn(name))
        };
        fn cast<'a, T: 'static>(
            a: &'a ArrayRef,
            name: &'static str,
        ) -> Result<&'a T, RecordsError> {
            a.as_any()
                .downcast_ref::<T>()
                .ok_or(RecordsError::WrongType(name))
        }
        let text = |name: &'static str| -> Result<Vec<Option<String>>, RecordsError> {
            let a = col(name)?;
            let a = arrow::compute::cast(a, &DataType::Utf8)
                .map_err(|_| RecordsError::WrongType(name))?;
            let a = cast::<StringArray>(&a, name)?;
            Ok((0..a.len())
                .map(|i| a.is_valid(i).then(|| a.value(i).to_owned()))
                .collect())
        };
        let bytes = |name: &'static str| -> Result<Vec<Option<Vec<u8>>>, RecordsError> {
            let a = arrow::compute::cast(col(name)?, &DataType::Binary)
                .map_err(|_| RecordsError::WrongType(name))?;
            let a = cast::<BinaryArray>(&a, name)?;
            Ok((0..a.len())
                .map(|i| a.is_valid(i).then(|| a.value(i).to_vec()))
                .collect())
        };
        let ids = text("id")?;
        let stages = text("stage")?;
        let reasons = text("reason_code")?;
        let details = text("detail")?;
        let tables = text("table_name")?;
        let topics = text("kafka_topic")?;
        let keys = bytes("key")?;
        let raws = bytes("raw")?;
        // Added after the first release: tables written before have no such column.
        let checks = match batch.column_by_name("check_name") {
            Some(_) => text("check_name")?,
            None => vec![None; batch.num_rows()],
        };
        // Added later still: absent from older tables.
        let long = |name: &'static str| -> Result<Vec<Option<i64>>, RecordsError> {
            match batch.column_by_name(name) {
                Some(a) => {
                    let a = cast::<Int64Array>(a, name)?;
                    Ok((0..a.len())
                        .map(|i| a.is_valid(i).then(|| a.value(i)))
                        .collect())
                }
                None => Ok(vec![None; batch.num_rows()]),
            }
        };
        let commit_lsns = long("commit_lsn")?;
        let ordinals = long("ordinal")?;
        let partitions = cast::<Int32Array>(col("kafka_partition")?, "kafka_partition")?;
        let offsets = cast::<Int64Array>(col("kafka_offset")?, "kafka_offset")?;
        let lsns = cast::<Int64Array>(col("source_lsn")?, "source_lsn")?;
        let at = cast::<TimestampMicrosecondArray>(col("quarantined_at")?, "quarantined_at")?;
        let opt32 = |a: &Int32Array, i: usize| a.is_valid(i).then(|| a.value(i));
        let opt64 = |a: &Int64Array, i: usize| a.is_valid(i).then(|| a.value(i));
        let mut out = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            out.push(QuarantineRecord {
                id: ids[i].clone().unwrap_or_default(),
                stage: stages[i]
                    .as_deref()
                    .and_then(Stage::parse)
                    .ok_or(RecordsError::WrongType("stage"))?,
                reason_code: reasons[i].clone().unwrap_or_default(),
                detail: details[i].clone().unwrap_or_default(),
                table: tables[i].clone(),
                topic: topics[i].clone(),
                partition: opt32(partitions, i),
                offset: opt64(offsets, i),
                source_lsn: opt64(lsns, i),
                commit_lsn: commit_lsns[i],
                ordinal: ordinals[i],
                key: keys[i].clone(),
                raw: raws[i].clone(),
                quarantined_at_us: if at.is_valid(i) { at.value(i) } else { 0 },
                check: checks[i].clone(),
            });
        }
        Ok(out)
    }
}

/// A batch that does not have the quarantine table's columns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    #[error("quarantine batch has no column {0}")]
    MissingColumn(&'static str),
    #[error("quarantine column {0} has an unexpected type")]
    WrongType(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_arrow() {
        let r = QuarantineRecord {
            id: QuarantineRecord::event_id(Stage::Bronze, "cdc.public.t", 2, 41),
            stage: Stage::Bronze,
            reason_code: "not_framed".into(),
            detail: "payload is not Confluent-framed Avro".into(),
            table: Some("public.t".into()),
            topic: Some("cdc.public.t".into()),
            partition: Some(2),
            offset: Some(41),
            source_lsn: None,
            commit_lsn: Some(400),
            ordinal: Some(3),
            key: None,
            raw: Some(vec![0xde, 0xad]),
            quarantined_at_us: 1_700_000_000_000_000,
            check: None,
        };
        let batch = QuarantineRecord::to_batch(std::slice::from_ref(&r)).unwrap();
        assert_eq!(batch.num_rows(), 1);
        assert_eq!(r.id, "bronze/cdc.public.t/2/41");
        assert_eq!(QuarantineRecord::from_batch(&batch).unwrap(), vec![r]);
    }
}
