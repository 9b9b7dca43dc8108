//! Transaction metadata: one END record per source transaction on
//! `{prefix}.transactions`, shaped like Debezium's (`status`, `id`, `event_count`,
//! `data_collections`), written as JSON.
//!
//! Why: a transaction's events for one table are spread over the table topic's partitions
//! (they are keyed by primary key), and each partition reaches the lake in its own
//! micro-batches. The END record says how many events of each table the transaction has,
//! so a consumer (Silver) can tell when all of them have arrived and apply the transaction
//! whole. It is published under the transaction's acknowledgement token, so the slot moves
//! past a transaction only once its END record is in Kafka too.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, Int64Array, Int64Builder, ListBuilder, StringArray, StringBuilder,
    StructBuilder, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};

use serde::{Deserialize, Serialize};

/// Events of one table in a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCollection {
    /// The table's identity, `schema.table` escaped one-to-one as in its topic name and
    /// lake path ([`wal2delta_model::TableName::ident`]); for names of `[a-z0-9_]` only,
    /// the plain `schema.table`.
    pub data_collection: String,
    /// Messages of this transaction on the table's topic (a TRUNCATE counts once per
    /// partition, as it is sent to every partition).
    pub event_count: u64,
}

/// The END record of one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransactionEnd {
    /// Always `END`.
    pub status: String,
    /// `{xid}:{commit_lsn}` (Debezium's PostgreSQL form).
    pub id: String,
    pub tx_id: u32,
    /// The commit LSN every event of the transaction carries in `source.commit_lsn`.
    pub commit_lsn: u64,
    /// Commit time, milliseconds since the epoch.
    pub ts_ms: i64,
    pub event_count: u64,
    pub data_collections: Vec<DataCollection>,
}

impl TransactionEnd {
    pub fn new(tx_id: u32, commit_lsn: u64, ts_ms: i64, counts: &BTreeMap<String, u64>) -> Self {
        TransactionEnd {
            status: "END".into(),
            id: format!("{tx_id}:{commit_lsn}"),
            tx_id,
            commit_lsn,
            ts_ms,
            event_count: counts.values().sum(),
            data_collections: counts
                .iter()
                .map(|(t, n)| DataCollection {
                    data_collection: t.clone(),
                    event_count: *n,
                })
                .collect(),
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A watermark: every transaction whose commit LSN is below `lsn` has its END record
/// earlier in the partition. Capture writes one when a heartbeat finds nothing open or in
/// flight, so consumers know how far the source has been read even when it is idle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// Always `WATERMARK`.
    pub status: String,
    pub lsn: u64,
}

impl Watermark {
    pub fn new(lsn: u64) -> Self {
        Watermark {
            status: "WATERMARK".into(),
            lsn,
        }
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A record of the transactions topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionRecord {
    End(TransactionEnd),
    Watermark(Watermark),
}

impl TransactionRecord {
    /// Parses a record; `None` for anything that is neither shape.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Status {
            status: String,
        }
        let status: Status = serde_json::from_slice(bytes).ok()?;
        match status.status.as_str() {
            "END" => serde_json::from_slice(bytes)
                .ok()
                .map(TransactionRecord::End),
            "WATERMARK" => serde_json::from_slice(bytes)
                .ok()
                .map(TransactionRecord::Watermark),
            _ => None,
        }
    }
}

/// Transaction records as Arrow columns, in this order: `status`, `tx_id`, `commit_lsn`
/// (the watermark's LSN for a watermark), `commit_ts`, `event_count`, `data_collections`
/// (list of `{data_collection, event_count}`).
pub fn transaction_columns(records: &[&TransactionRecord]) -> (Vec<Field>, Vec<ArrayRef>) {
    let status: StringArray = records
        .iter()
        .map(|r| {
            Some(match r {
                TransactionRecord::End(_) => "END",
                TransactionRecord::Watermark(_) => "WATERMARK",
            })
        })
        .collect();
    let end = |f: &dyn Fn(&TransactionEnd) -> i64| -> Int64Array {
        records
            .iter()
            .map(|r| match r {
                TransactionRecord::End(e) => Some(f(e)),
                TransactionRecord::Watermark(_) => None,
            })
            .collect()
    };
    let lsn: Int64Array = records
        .iter()
        .map(|r| {
            Some(match r {
                TransactionRecord::End(e) => e.commit_lsn as i64,
                TransactionRecord::Watermark(w) => w.lsn as i64,
            })
        })
        .collect();
    let commit_ts: TimestampMicrosecondArray = records
        .iter()
        .map(|r| match r {
            TransactionRecord::End(e) => e.ts_ms.checked_mul(1000),
            TransactionRecord::Watermark(_) => None,
        })
        .collect::<TimestampMicrosecondArray>()
        .with_timezone("UTC");
    let entry_fields = Fields::from(vec![
        Field::new("data_collection", DataType::Utf8, true),
        Field::new("event_count", DataType::Int64, true),
    ]);
    let mut collections =
        ListBuilder::new(StructBuilder::from_fields(entry_fields.clone(), 0)).with_field(Arc::new(
            Field::new("element", DataType::Struct(entry_fields.clone()), true),
        ));
    for r in records {
        if let TransactionRecord::End(e) = r {
            let entries = collections.values();
            for c in &e.data_collections {
                entries
                    .field_builder::<StringBuilder>(0)
                    .expect("field 0 is Utf8")
                    .append_value(&c.data_collection);
                entries
                    .field_builder::<Int64Builder>(1)
                    .expect("field 1 is Int64")
                    .append_value(c.event_count as i64);
                entries.append(true);
            }
            collections.append(true);
        } else {
            collections.append(false);
        }
    }
    let collections = collections.finish();
    let fields = vec![
        Field::new("status", DataType::Utf8, true),
        Field::new("tx_id", DataType::Int64, true),
        Field::new("commit_lsn", DataType::Int64, true),
        Field::new(
            "commit_ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("event_count", DataType::Int64, true),
        Field::new("data_collections", collections.data_type().clone(), true),
    ];
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(status),
        Arc::new(end(&|e| i64::from(e.tx_id))),
        Arc::new(lsn),
        Arc::new(commit_ts),
        Arc::new(end(&|e| e.event_count as i64)),
        Arc::new(collections),
    ];
    (fields, arrays)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_records_count_per_table() {
        let counts = BTreeMap::from([("public.a".to_owned(), 3), ("public.b".to_owned(), 2)]);
        let end = TransactionEnd::new(571, 53_736_280, 1_700_000_000_000, &counts);
        assert_eq!(end.id, "571:53736280");
        assert_eq!(end.event_count, 5);
        let back: TransactionEnd = serde_json::from_slice(&end.to_json()).unwrap();
        assert_eq!(back, end);
        assert_eq!(back.data_collections[1].data_collection, "public.b");
        assert_eq!(
            TransactionRecord::parse(&end.to_json()),
            Some(TransactionRecord::End(end))
        );
    }

    #[test]
    fn watermarks_parse_and_garbage_does_not() {
        let w = Watermark::new(99);
        assert_eq!(
            TransactionRecord::parse(&w.to_json()),
            Some(TransactionRecord::Watermark(w))
        );
        assert_eq!(TransactionRecord::parse(b"{\"status\":\"BEGIN\"}"), None);
        assert_eq!(TransactionRecord::parse(b"\xff\x00"), None);
        assert_eq!(TransactionRecord::parse(b"{\"status\":\"END\"}"), None);
    }

    #[test]
    fn records_become_columns() {
        use arrow::array::ListArray;
        let counts = BTreeMap::from([("public.a".to_owned(), 3), ("public.b".to_owned(), 2)]);
        let end = TransactionRecord::End(TransactionEnd::new(7, 100, 5, &counts));
        let w = TransactionRecord::Watermark(Watermark::new(200));
        let (fields, arrays) = transaction_columns(&[&end, &w]);
        assert_eq!(fields.len(), arrays.len());
        let lsn = arrays[2].as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!((lsn.value(0), lsn.value(1)), (100, 200));
        let lists = arrays[5].as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(lists.value(0).len(), 2);
        assert!(lists.is_null(1));
    }
}
