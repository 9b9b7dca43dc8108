//! Re-driving one quarantined change (`quarantine redrive`): checked again, and merged
//! like any change when it passes, unless something newer of its key is in Silver. The
//! commit is marked as one the round hooks did not see ([`super::hook::RoundHook::untagged_actions`]):
//! the rules compare every row at their next round and tag the re-driven ones.

use deltalake::arrow::array::RecordBatch;
use deltalake::DeltaTable;

use super::columns::{COMMIT_LSN, MASKING_KEY};
use super::table::{Redrive, SilverTable};
use super::tombstones::{keys_equal, newer};
use super::{fold, Progress};
use crate::delta;
use crate::LakeError;

impl SilverTable {
    /// Re-drives the Bronze change at `partition`/`offset` (a quarantined row): checks it
    /// again with the current checks and, when it passes, merges it like any change (it
    /// enters only if no newer change of its key is in Silver or the tombstones). Progress
    /// does not move.
    pub async fn redrive(&mut self, partition: i32, offset: i64) -> Result<Redrive, LakeError> {
        let Some(bronze) = delta::open(&self.name, &self.bronze_url).await? else {
            return Ok(Redrive::NotInBronze);
        };
        let silver = delta::open(&self.name, &self.url).await?;
        let rows = self
            .select_bronze(
                &bronze,
                &format!("kafka_partition = {partition} AND kafka_offset = {offset}"),
                silver.as_ref(),
            )
            .await?;
        if rows.num_rows() == 0 {
            return Ok(Redrive::NotInBronze);
        }
        let progress = match &silver {
            Some(t) => Progress::load(&self.name, t).await?,
            None => Progress::default(),
        };
        // Re-driven on purpose: nothing is dropped as a copy.
        let screened = self.screen(&self.view(&rows)?, i64::MIN)?;
        if let Some(r) = screened.quarantined.first() {
            // Still failing; but when the source row has changed since (the data was
            // fixed at the source), the record is superseded.
            let masked = self
                .masking
                .mask_bronze(&rows)
                .map_err(|e| self.policy_error(e.to_string()))?;
            let masked = self.view(&masked)?;
            let folded = fold(&masked, progress.truncated).map_err(|e| self.rows_error(e.0))?;
            let Some(folded) = folded.rows else {
                return Ok(Redrive::Superseded);
            };
            let keys = masked.key_names();
            return Ok(if self.superseded(silver.as_ref(), &keys, folded).await? {
                Redrive::Superseded
            } else {
                Redrive::StillFails(r.detail.clone())
            });
        }
        let screened_rows = self.view(&screened.rows)?;
        let folded = fold(&screened_rows, progress.truncated).map_err(|e| self.rows_error(e.0))?;
        let Some(source) = folded.rows else {
            return Ok(Redrive::Superseded);
        };
        // The hooks took no part in this commit (the rules never saw the row): it says so,
        // and their next round compares every row again (a rules backfill), so a re-driven
        // row is tagged like any other.
        let untagged: Vec<_> = self
            .hooks
            .iter()
            .flat_map(|h| h.untagged_actions())
            .collect();
        let props = delta::commit_metadata([
            ("wal2delta.stage".to_owned(), serde_json::json!("silver")),
            (
                "wal2delta.redrive".to_owned(),
                serde_json::json!(format!("{partition}/{offset}")),
            ),
            (MASKING_KEY.to_owned(), self.masking.describe()),
        ])
        .with_application_transactions(untagged);
        let keys = screened_rows.key_names();
        let written = self
            .write_folded(
                silver,
                source,
                &keys,
                &folded.unchanged_columns,
                None,
                props,
            )
            .await?;
        Ok(if written.touched > 0 {
            Redrive::Applied
        } else {
            Redrive::Superseded
        })
    }

    /// Whether Silver or the tombstones hold a change newer than every row of `folded`.
    async fn superseded(
        &self,
        silver: Option<&DeltaTable>,
        keys: &[String],
        folded: RecordBatch,
    ) -> Result<bool, LakeError> {
        let n = folded.num_rows();
        let survivors: usize = self
            .tombstones
            .filter(keys, folded.clone())
            .await?
            .iter()
            .map(RecordBatch::num_rows)
            .sum();
        if survivors < n {
            return Ok(true);
        }
        let Some(silver) = silver else {
            return Ok(false);
        };
        let err = |e: deltalake::datafusion::error::DataFusionError| {
            LakeError::delta(&self.name)(e.into())
        };
        let ctx = delta::session();
        ctx.register_batch("s", folded).map_err(err)?;
        let provider = silver.table_provider().await.map_err(err)?;
        ctx.register_table("t", provider).map_err(err)?;
        let sql = format!(
            "SELECT s.{COMMIT_LSN} FROM s JOIN t ON {} WHERE {}",
            keys_equal(keys, "s", "t"),
            newer("t", "s")
        );
        let newer_rows: usize = delta::collect(&self.name, &ctx, &sql)
            .await?
            .iter()
            .map(RecordBatch::num_rows)
            .sum();
        Ok(newer_rows >= n)
    }
}
