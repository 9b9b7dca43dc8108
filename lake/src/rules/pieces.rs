//! A transaction applied in pieces, after a restart: the open transaction's per-key
//! state ([`OpenTx`]) lives in memory from piece to piece, and no transition of it is
//! committed before its last piece (docs/rules.md, "Guarantees"). A restart, or a reset
//! after a failed rules step, between two pieces loses it; the hits loaded from
//! `rules/hits` and `rules/transitions` are then the hits *before* the transaction, since
//! none of its transitions was committed.
//!
//! What the pieces applied so far did is in Silver: every key they upserted holds a row
//! with `_commit_lsn` = the transaction's LSN, every key they deleted a tombstone with it
//! (the transaction is Silver's newest, so nothing later overwrote them). Evaluating the
//! rules on those rows gives the keys' hits now; the loaded hits are their hits before.
//! That is exactly the state the pieces had built in memory.

use std::collections::{BTreeMap, BTreeSet};

use deltalake::arrow::array::{Array, AsArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Int64Type};
use deltalake::DeltaTable;

use super::key_json;
use super::table::{RulesReport, TableRules};
use super::walk::{KeyHits, OpenTx};
use crate::delta;
use crate::silver::{Progress, Tombstones, COMMIT_LSN, COMMIT_TS};
use crate::LakeError;

impl TableRules {
    /// Rebuilds the open transaction Silver's progress `before` records as applied in
    /// part, when this process does not hold it (see the module doc). `backfilled`: the
    /// round's start just evaluated every Silver row (the hits already hold what the
    /// pieces did, and the transitions the backfill emitted say so): the transaction is
    /// opened with no key, and only the pieces still to come change it.
    pub(super) async fn reopen(
        &mut self,
        silver: Option<&DeltaTable>,
        before: &Progress,
        keys: &[String],
        tombstones: &Tombstones,
        backfilled: bool,
    ) -> Result<Option<usize>, LakeError> {
        let Some(lsn) = before.partial else {
            return Ok(None);
        };
        if self.open.as_ref().is_some_and(|o| o.lsn == lsn) {
            return Ok(None);
        }
        let (Some(silver), false, false) = (silver, keys.is_empty(), backfilled) else {
            self.open = Some(OpenTx {
                lsn,
                ..OpenTx::default()
            });
            return Ok(None);
        };
        let schema = delta::arrow_schema(&self.name, silver)?;
        let (compiled, _) = self.compiled(&schema).await?;
        let mut report = RulesReport::default();
        let mut now: BTreeMap<String, KeyHits> = BTreeMap::new();
        let mut commit_ts = None;
        let rows = delta::query(
            &self.name,
            silver,
            &format!("SELECT * FROM t WHERE {COMMIT_LSN} = {lsn}"),
        )
        .await?;
        for b in rows {
            let hits = self
                .evaluate_rows(&compiled, &b, &schema, &mut report, None)
                .await?;
            if commit_ts.is_none() {
                commit_ts = b
                    .column_by_name(COMMIT_TS)
                    .and_then(|a| cast(a, &DataType::Int64).ok())
                    .and_then(|a| {
                        let a = a.as_primitive::<Int64Type>();
                        (0..a.len()).find(|&i| a.is_valid(i)).map(|i| a.value(i))
                    });
            }
            let keys_json = key_json(&b, keys).map_err(|e| self.error(e))?;
            now.extend(keys_json.into_iter().zip(hits));
        }
        let mut deleted: BTreeSet<String> = BTreeSet::new();
        for b in tombstones.at_lsn(lsn).await? {
            deleted.extend(key_json(&b, keys).map_err(|e| self.error(e))?);
        }
        let state = self.state.as_mut().ok_or_else(|| LakeError::Rows {
            table: self.name.clone(),
            reason: "rules state not loaded".into(),
        })?;
        // A TRUNCATE inside the transaction removed every key it had not written since.
        if before.truncated.is_some_and(|t| t.0 == lsn) {
            deleted.extend(state.hits.keys().cloned());
        }
        let mut start = BTreeMap::new();
        for key in deleted.into_iter().filter(|k| !now.contains_key(k)) {
            start.insert(key.clone(), state.hits.remove(&key));
        }
        let touched = now.len() + start.len();
        for (key, hits) in now {
            let before = if hits.is_empty() {
                state.hits.remove(&key)
            } else {
                state.hits.insert(key.clone(), hits.shrunk())
            };
            start.insert(key, before);
        }
        tracing::info!(table = %self.name, lsn, keys = touched, "rules: the transaction applied in pieces taken up again from Silver");
        self.open = Some(OpenTx {
            lsn,
            commit_ts,
            start,
        });
        Ok(Some(touched))
    }
}
