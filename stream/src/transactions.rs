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

use serde::{Deserialize, Serialize};

/// Events of one table in a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataCollection {
    /// `schema.table`.
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
    }
}
