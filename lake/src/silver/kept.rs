//! The Delta tables a Silver table keeps open between its rounds: Silver itself, and
//! Bronze, followed from its log, with what its files' footers say.

use std::collections::BTreeMap;
use std::sync::Arc;

use deltalake::arrow::array::AsArray;
use deltalake::arrow::datatypes::{Int64Type, Schema};
use deltalake::DeltaTable;
use url::Url;
use wal2delta_model::bronze;

use super::window::{Selection, COORDINATES};
use crate::delta;
use crate::follow::{Followed, Listing};
use crate::LakeError;

/// A Silver table's Delta tables kept open between its rounds: Silver ([`delta::Kept`])
/// and Bronze, whose files are followed from its log ([`Followed`]).
pub(super) struct KeptTables {
    pub(super) silver: delta::Kept,
    pub(super) bronze: Followed,
    /// Bronze's files in this round (cleared before the next look: following the log
    /// then updates the kept list in place).
    listing: Option<Listing>,
    /// What the Bronze files' footers say of their Kafka coordinates.
    pub(super) footers: super::files::Footers,
}

impl Default for KeptTables {
    fn default() -> Self {
        KeptTables {
            silver: delta::Kept::default(),
            bronze: Followed::new(COORDINATES),
            listing: None,
            footers: super::files::Footers::default(),
        }
    }
}

impl KeptTables {
    /// Bronze's files now; `None` when it has no table yet.
    pub(super) async fn bronze_latest(
        &mut self,
        name: &str,
        url: &Url,
    ) -> Result<Option<Listing>, LakeError> {
        self.listing = None;
        self.listing = self.bronze.latest(name, url).await?;
        Ok(self.listing.clone())
    }

    /// The version of Bronze this round reads.
    pub(super) fn bronze_version(&self) -> Option<u64> {
        self.bronze.version()
    }

    /// Bronze at the version this round reads, for a query.
    pub(super) async fn bronze_table(&mut self, name: &str) -> Result<DeltaTable, LakeError> {
        self.bronze.table(name).await
    }

    /// The smallest offset above `after` that Bronze holds in `partition` (`None`: none),
    /// from the files that can hold one: a partition's files are its own until
    /// compaction, so for an idle partition this reads nothing but footers already known.
    /// Through a query when only a query can read them exactly.
    pub(super) async fn next_offset(
        &mut self,
        name: &str,
        partition: i32,
        after: i64,
    ) -> Result<Option<i64>, LakeError> {
        if let Some(listing) = &self.listing {
            let fields = delta::plain_fields(&listing.schema, COORDINATES);
            let beyond = Selection {
                ranges: BTreeMap::from([(partition, (after, i64::MAX))]),
                others_below: 0,
            };
            if fields.len() == COORDINATES.len() {
                let schema = Arc::new(Schema::new(fields));
                let footers = &mut self.footers;
                if let Some(rows) =
                    super::files::read(name, listing, &beyond, &schema, footers).await
                {
                    // Ordered by partition and offset: the first is the smallest.
                    return Ok(rows
                        .column_by_name(bronze::KAFKA_OFFSET)
                        .and_then(|c| c.as_primitive_opt::<Int64Type>())
                        .and_then(|c| c.iter().flatten().next()));
                }
            }
        }
        let sql = format!(
            "SELECT MIN(kafka_offset) FROM t WHERE kafka_partition = {partition} AND kafka_offset > {after}"
        );
        let table = self.bronze.table(name).await?;
        Ok(delta::query(name, &table, &sql)
            .await?
            .iter()
            .filter_map(|b| b.column(0).as_primitive_opt::<Int64Type>().cloned())
            .flat_map(|a| a.iter().flatten().collect::<Vec<_>>())
            .min())
    }
}
