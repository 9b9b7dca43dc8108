//! Where each partition continues: read from the Bronze tables' `txn` actions.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::runtime::Handle;
use wal2delta_lake::bronze::BronzeTable;
use wal2delta_lake::Lake;
use wal2delta_stream::consumer::StartOffsets;
use wal2delta_stream::topic::table_of_topic;

/// Reads start offsets from the lake for the consumer's rebalance callback. The callback
/// runs on the consumer thread, outside the runtime, so it may block on the runtime's
/// handle.
pub struct LakeOffsets {
    pub lake: Lake,
    pub topics: BronzeTopics,
    pub runtime: Handle,
}

/// Which Kafka topics Bronze stores, and where.
#[derive(Debug, Clone)]
pub struct BronzeTopics {
    pub prefix: String,
    /// `[kafka] transactions_topic`, stored in `bronze/_wal2delta/transactions`.
    pub transactions: String,
    /// The source whose tables these are ([`crate::config::SourceConfig::identity`]),
    /// recorded in every Bronze commit; a table another source writes is refused.
    pub source: Option<String>,
}

impl BronzeTopics {
    /// The table name quarantine records of `topic` carry.
    pub fn table_name(&self, topic: &str) -> Option<String> {
        if topic == self.transactions {
            return Some(TRANSACTIONS_TABLE.to_owned());
        }
        table_of_topic(&self.prefix, topic).map(|(s, t)| format!("{s}.{t}"))
    }
}

/// The name of the Bronze table of transaction records.
pub const TRANSACTIONS_TABLE: &str = "_wal2delta.transactions";

impl LakeOffsets {
    pub fn new(lake: Lake, topics: BronzeTopics, runtime: Handle) -> Arc<Self> {
        Arc::new(LakeOffsets {
            lake,
            topics,
            runtime,
        })
    }

    /// The Bronze table of a topic: a table topic's, or the transaction records'.
    pub fn table_for(lake: &Lake, topics: &BronzeTopics, topic: &str) -> Option<BronzeTable> {
        if topic == topics.transactions {
            return Some(
                BronzeTable::new(TRANSACTIONS_TABLE, lake.bronze_transactions())
                    .with_source(topics.source.clone()),
            );
        }
        let (schema, table) = table_of_topic(&topics.prefix, topic)?;
        Some(
            BronzeTable::new(format!("{schema}.{table}"), lake.bronze(schema, table))
                .with_source(topics.source.clone()),
        )
    }
}

impl StartOffsets for LakeOffsets {
    fn next_offsets(&self, partitions: &[(String, i32)]) -> Result<Vec<Option<i64>>, String> {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            by_topic.entry(t.as_str()).or_default().push(*p);
        }
        let stored = self.runtime.block_on(async {
            let mut stored: BTreeMap<(String, i32), Option<i64>> = BTreeMap::new();
            for (topic, parts) in by_topic {
                let Some(mut table) = Self::table_for(&self.lake, &self.topics, topic) else {
                    // Not a table topic (the subscription pattern excludes these).
                    for p in parts {
                        stored.insert((topic.to_owned(), p), None);
                    }
                    continue;
                };
                let offsets = table
                    .stored_offsets(topic, &parts)
                    .await
                    .map_err(|e| e.to_string())?;
                for (p, v) in offsets {
                    stored.insert((topic.to_owned(), p), v);
                }
            }
            Ok::<_, String>(stored)
        })?;
        Ok(partitions
            .iter()
            .map(|(t, p)| {
                stored
                    .get(&(t.clone(), *p))
                    .copied()
                    .flatten()
                    .map(|last| last + 1)
            })
            .collect())
    }
}
