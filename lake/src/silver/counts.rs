//! What Silver knows about source transactions: the END records' per-table event counts
//! (`bronze/_wal2delta/transactions`), and the Bronze events an operator resolved in
//! quarantine, which count as held.

use std::collections::HashMap;

use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray, RecordBatch};
use deltalake::arrow::datatypes::{Schema, SchemaRef};

use super::files::{self, Pick};
use super::TransactionCounts;
use crate::delta;
use crate::follow::Followed;
use crate::{Lake, LakeError};

/// The Bronze quarantine records a resolution names, of changes committed above `after`:
/// (`schema.table`, commit LSN, (Kafka partition, ordinal)). Records without a commit LSN
/// (the event could not be decoded) cannot be placed in a transaction and are left out.
pub async fn resolved_bronze_events(
    lake: &Lake,
    after: i64,
) -> Result<Vec<(String, i64, (i32, i64))>, LakeError> {
    use crate::quarantine::{QuarantineTable, Resolutions};
    let records = QuarantineTable::new(lake.quarantine_records())
        .read_all()
        .await?;
    let placed: Vec<_> = records
        .into_iter()
        .filter(|r| r.stage == wal2delta_quarantine::Stage::Bronze)
        .filter_map(|r| match (r.table, r.commit_lsn, r.partition, r.ordinal) {
            (Some(t), Some(l), Some(p), Some(o)) if l > after => Some((r.id, t, l, (p, o))),
            _ => None,
        })
        .collect();
    if placed.is_empty() {
        return Ok(Vec::new());
    }
    let resolved = Resolutions::new(lake.quarantine_resolutions())
        .read()
        .await?;
    Ok(placed
        .into_iter()
        .filter(|(id, ..)| resolved.contains_key(id))
        .map(|(_, t, l, e)| (t, l, e))
        .collect())
}

/// The END counts of every table, and how far the records reach, read from
/// `bronze/_wal2delta/transactions` above `after` (the table opened for this call; a
/// stage that counts every round keeps a [`TransactionLog`]).
pub async fn transaction_counts(
    lake: &Lake,
    after: i64,
) -> Result<(i64, HashMap<String, TransactionCounts>), LakeError> {
    TransactionLog::default().counts(lake, after).await
}

const NAME: &str = "_wal2delta.transactions";
const READS: [&str; 3] = ["status", "commit_lsn", "data_collections"];

/// The transaction records table followed from its log between rounds ([`Followed`]);
/// its records above a watermark are read from the files that can hold them ([`files`]).
pub struct TransactionLog {
    followed: Followed,
    footers: files::Footers,
}

impl Default for TransactionLog {
    fn default() -> Self {
        TransactionLog {
            followed: Followed::new(Above::COLUMNS),
            footers: files::Footers::default(),
        }
    }
}

/// Transaction records committed above an LSN.
struct Above(i64);

impl Above {
    const COLUMNS: &[&str] = &["commit_lsn"];
}

impl Pick for Above {
    fn columns(&self) -> &'static [&'static str] {
        Self::COLUMNS
    }

    fn may_hold(&self, ranges: &[(i64, i64)]) -> bool {
        ranges[0].1 > self.0
    }

    fn keeps(&self, values: &[i64]) -> bool {
        values[0] > self.0
    }
}

impl TransactionLog {
    /// [`transaction_counts`], with the table kept open (dropped after a failure: the
    /// next call opens it afresh).
    pub async fn counts(
        &mut self,
        lake: &Lake,
        after: i64,
    ) -> Result<(i64, HashMap<String, TransactionCounts>), LakeError> {
        let counted = self.read(lake, after).await;
        if counted.is_err() {
            *self = Self::default();
        }
        counted
    }

    async fn read(
        &mut self,
        lake: &Lake,
        after: i64,
    ) -> Result<(i64, HashMap<String, TransactionCounts>), LakeError> {
        let url = lake.bronze_transactions();
        let Some(listing) = self.followed.latest(NAME, &url).await? else {
            return Ok((after, HashMap::new()));
        };
        let batches = match read_schema(&listing.schema) {
            Some(schema) => files::read(NAME, &listing, &Above(after), &schema, &mut self.footers)
                .await
                .map(|b| vec![b]),
            None => None,
        };
        let batches = match batches {
            Some(b) => b,
            None => {
                delta::query(
                    NAME,
                    &self.followed.table(NAME).await?,
                    &format!(
                        "SELECT {} FROM t WHERE commit_lsn > {after}",
                        READS.join(", ")
                    ),
                )
                .await?
            }
        };
        count(lake, after, &batches).await
    }
}

/// The columns counted, typed as the table has them; `None` when it lacks one (the query
/// then says which).
fn read_schema(schema: &Schema) -> Option<SchemaRef> {
    let fields = delta::plain_fields(schema, &READS);
    (fields.len() == READS.len()).then(|| Arc::new(Schema::new(fields)))
}

/// The counts of the records in `batches` (above `after`).
async fn count(
    lake: &Lake,
    after: i64,
    batches: &[RecordBatch],
) -> Result<(i64, HashMap<String, TransactionCounts>), LakeError> {
    let mut top = after;
    let mut by_table: HashMap<String, TransactionCounts> = HashMap::new();
    let bad = |what: &str| LakeError::Rows {
        table: NAME.into(),
        reason: format!("unexpected type of {what}"),
    };
    use deltalake::arrow::datatypes::Int64Type;
    for b in batches {
        let lsn = b
            .column(1)
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| bad("commit_lsn"))?;
        let lists = b
            .column(2)
            .as_list_opt::<i32>()
            .ok_or_else(|| bad("data_collections"))?;
        for i in 0..b.num_rows() {
            if lsn.is_null(i) {
                continue;
            }
            let l = lsn.value(i);
            top = top.max(l);
            if lists.is_null(i) {
                continue; // a watermark
            }
            let entries = lists.value(i);
            let entries = entries
                .as_struct_opt()
                .ok_or_else(|| bad("data_collections"))?;
            let names = entries
                .column(0)
                .as_string_opt::<i32>()
                .ok_or_else(|| bad("data_collection"))?;
            let counts = entries
                .column(1)
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| bad("event_count"))?;
            for j in 0..entries.len() {
                by_table
                    .entry(names.value(j).to_owned())
                    .or_default()
                    .events
                    .insert(l, counts.value(j) as u64);
            }
        }
    }
    // Bronze events quarantined and then resolved by an operator count as held: the END
    // record counts them, Bronze never will.
    if !by_table.is_empty() {
        for (table, lsn, event) in resolved_bronze_events(lake, after).await? {
            if let Some(c) = by_table.get_mut(&table) {
                c.resolved.entry(lsn).or_default().insert(event);
            }
        }
    }
    for c in by_table.values_mut() {
        c.top = top;
    }
    Ok((top, by_table))
}
