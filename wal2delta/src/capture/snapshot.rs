//! The snapshot task: reads existing rows of captured tables in key-ordered chunks while
//! capture streams, and hands each chunk to the capture loop, which publishes it as `r`
//! events and records the progress once Kafka acknowledged the whole chunk.
//!
//! See `wal2delta_cdc::snapshot` for why the result is consistent with the stream. The
//! first pass of a newly created slot reads inside the slot's exported snapshot (one
//! transaction); resumed snapshots and tables added later read each chunk in its own short
//! transaction, in a snapshot exported by a temporary slot created for that chunk (it
//! needs one free slot in `max_replication_slots` and one walsender while it is created),
//! so no long transaction holds back vacuum on the source.
//!
//! Throttle: before each chunk, the slot's retained WAL is compared with
//! `[snapshot] max_retained_wal_bytes`; above it the task waits while the stream catches
//! up (the stream keeps running, so the slot moves and the retained WAL shrinks).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wal2delta_model::clock::unix_ms as now_ms;

use tokio::sync::{mpsc, oneshot};
use wal2delta_cdc::catalog::TypeCatalog;
use wal2delta_cdc::replication::ConnectParams;
use wal2delta_cdc::setup::follow_tables;
use wal2delta_cdc::snapshot::{estimate_rows, rows_position, table_schema, Chunker};
use wal2delta_cdc::{source, CdcError};
use wal2delta_model::{Change, ChangeOp, Lsn, Row, TableName, TableSchema, TxPosition};
use wal2delta_stream::snapshots::SnapshotProgress;

use crate::events::{
    InternalEvent, TableAddedToPublication, TableLeftPublication, TableNotAddedToPublication,
    TableNotRemovedFromPublication, TableRemovedFromPublication,
};
use crate::metrics as m;

/// One chunk ready to publish.
pub struct SnapshotChunk {
    pub schema: Arc<TableSchema>,
    pub changes: Vec<Change>,
    /// Rows that could not be decoded, for the DLQ.
    pub undecodable: Vec<(String, wal2delta_cdc::decoder::RawRow)>,
    /// The table's progress once this chunk is in Kafka.
    pub progress: SnapshotProgress,
}

/// What the task needs.
pub struct SnapshotPlan {
    pub dsn: String,
    pub slot: String,
    pub publication: String,
    pub chunk_rows: usize,
    pub max_retained_wal_bytes: u64,
    /// Progress recorded so far, by `schema.table`.
    pub progress: HashMap<String, SnapshotProgress>,
    /// The snapshot exported by a slot this session created, with its consistent point,
    /// and who to tell once it is imported (the exporting connection may then close).
    pub exported: Option<(String, Lsn, oneshot::Sender<()>)>,
    /// The slot was re-created (`on_slot_lost = "recreate"`): the rows' position of its
    /// exported snapshot, recorded in the progress of every table snapshotted again.
    pub resnapshot_from: Option<Lsn>,
    /// `[snapshot] mode = "never"`: only re-snapshots requested with `wal2delta snapshot
    /// --table` (or resumed from such a request) run; tables without a snapshot stay so.
    pub requested_only: bool,
    /// Where requests arrive (the snapshots topic), looked at every [`RECHECK`].
    pub requests: Option<(wal2delta_stream::connection::KafkaConnection, String)>,
    /// `[source] add_new_tables`: the patterns whose new tables are added to the
    /// publication (and whose tables no longer matching are removed) at every [`RECHECK`].
    pub follow: Option<Follow>,
}

/// Tables created after `setup` that capture adds to the publication, and tables that no
/// longer match the patterns, which it removes (`wal2delta_cdc::setup::follow_tables`).
pub struct Follow {
    /// `[source] tables`.
    pub patterns: Vec<String>,
    /// `[source] exclude_tables`.
    pub exclude: Vec<String>,
    /// Tables whose refusal was told already (once per process).
    told: HashSet<TableName>,
}

impl Follow {
    pub fn new(patterns: Vec<String>, exclude: Vec<String>) -> Follow {
        Follow {
            patterns,
            exclude,
            told: HashSet::new(),
        }
    }

    /// Adds the new matching tables and returns them. A catalog that cannot be read is
    /// looked at again next time (the stream goes on meanwhile).
    async fn look(&mut self, client: &tokio_postgres::Client, publication: &str) -> Vec<TableName> {
        let followed = match follow_tables(client, publication, &self.patterns, &self.exclude).await
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for new tables to capture; looking again later");
                return Vec::new();
            }
        };
        for table in &followed.added {
            self.told.remove(table);
            TableAddedToPublication { table, publication }.emit();
        }
        for table in &followed.removed {
            TableRemovedFromPublication { table, publication }.emit();
        }
        for (table, reason) in &followed.not_removed {
            if self.told.insert(table.clone()) {
                TableNotRemovedFromPublication { table, reason }.emit();
            }
        }
        metrics::gauge!(m::CAPTURE_TABLES_NOT_ADDED).set(followed.refused.len() as f64);
        for (table, reason) in &followed.refused {
            if self.told.insert(table.clone()) {
                TableNotAddedToPublication { table, reason }.emit();
            }
        }
        followed.added
    }
}

/// What the snapshot task does with a table capture just added: a table new to it gets
/// its first snapshot; a table whose snapshot was done before is one dropped and created
/// again under the same name, whose old rows Silver still holds, so it is snapshotted
/// again as a re-snapshot from now (*P*, after the add): its rows read again and the
/// snapshot end at *P* deleting in Silver the old table's rows (docs/capture.md, "Tables
/// created later").
async fn plan_added(
    client: &tokio_postgres::Client,
    plan: &mut SnapshotPlan,
    added: &[TableName],
) -> Result<(), CdcError> {
    for table in added {
        let key = table.to_string();
        if plan.requested_only || !plan.progress.contains_key(&key) {
            continue;
        }
        let lsn: String = client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0);
        let at: Lsn = lsn.parse().map_err(|_| {
            CdcError::Check(format!(
                "the source returned an unreadable WAL position {lsn:?}"
            ))
        })?;
        tracing::info!(table = %table, resnapshot_from = %at, "a table of a name captured before was created again: it is snapshotted again, and Silver drops the old table's rows");
        plan.progress.insert(
            key.clone(),
            SnapshotProgress {
                table: key,
                state: super::request::REQUESTED.into(),
                last_key: None,
                last_key_sealed: None,
                rows_done: 0,
                rows_estimate: estimate_rows(client, table).await?.max(0) as u64,
                ts_ms: now_ms(),
                resnapshot_from: Some(rows_position(at).0),
                condition: None,
            },
        );
    }
    Ok(())
}

/// Tells of the tables that left the publication since the last look, and keeps `now`.
fn note_left(seen: &mut Option<BTreeSet<TableName>>, now: &[TableName]) {
    let now: BTreeSet<TableName> = now.iter().cloned().collect();
    if let Some(before) = seen.as_ref() {
        for table in before.difference(&now) {
            TableLeftPublication { table }.emit();
        }
    }
    metrics::gauge!(m::CAPTURE_TABLES).set(now.len() as f64);
    *seen = Some(now);
}

/// Takes in the requested re-snapshots (`wal2delta snapshot --table`) recorded in the
/// snapshots topic since the task last looked: a request newer than what the task holds
/// for the table replaces it, so the table is read again from its first row.
async fn take_requests(plan: &mut SnapshotPlan) {
    let Some((kafka, topic)) = plan.requests.clone() else {
        return;
    };
    let slot = plan.slot.clone();
    let loaded = tokio::task::spawn_blocking(move || {
        wal2delta_stream::snapshots::load(&kafka, &topic, &slot)
    })
    .await;
    let loaded = match loaded {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read snapshot requests; looking again later");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read snapshot requests; looking again later");
            return;
        }
    };
    for (table, p) in loaded {
        if p.state != super::request::REQUESTED {
            continue;
        }
        if plan
            .progress
            .get(&table)
            .is_some_and(|held| held.ts_ms >= p.ts_ms)
        {
            continue;
        }
        if p.condition.is_some()
            && plan
                .progress
                .get(&table)
                .is_some_and(|held| !held.is_done())
        {
            // Taking it would end the running snapshot early: rows it has not read yet
            // would never be read. `wal2delta snapshot` refuses such a request too.
            tracing::warn!(table = %table, "re-snapshot with a condition ignored: the table's snapshot is still running; request it again once `wal2delta status` shows it done");
            continue;
        }
        tracing::info!(table = %table, resnapshot_from = ?p.resnapshot_from.map(Lsn), conditional = p.condition.is_some(), "re-snapshot requested: the table is read again");
        plan.progress.insert(table, p);
    }
}

/// A name for the temporary slot of one fresh chunk, unique across processes.
fn fresh_slot_name() -> String {
    let nanos = wal2delta_model::clock::subsec_nanos();
    format!("wal2delta_snapshot_{}_{nanos}", std::process::id())
}

/// How often the task looks for tables added to the publication.
const RECHECK: Duration = Duration::from_secs(15);

/// Runs until the receiver is gone. Returns an error only for failures of the source.
pub async fn run(mut plan: SnapshotPlan, out: mpsc::Sender<SnapshotChunk>) -> Result<(), CdcError> {
    let client = source::connect(&plan.dsn).await?;
    let mut types = TypeCatalog::default();
    let mut seen = None;
    if plan.follow.is_some() {
        metrics::gauge!(m::CAPTURE_TABLES_NOT_ADDED).set(0.0);
    }
    loop {
        if plan.exported.is_none() {
            take_requests(&mut plan).await;
            // Not during the first pass of a new slot: a table added now would be read
            // in the slot's exported snapshot, taken before the add, and the changes
            // committed between the two would be in neither.
            if let Some(follow) = plan.follow.as_mut() {
                let added = follow.look(&client, &plan.publication).await;
                plan_added(&client, &mut plan, &added).await?;
            }
        }
        let tables = publication_tables(&client, &plan.publication).await?;
        note_left(&mut seen, &tables);
        let pending: Vec<TableName> = tables
            .into_iter()
            .filter(|t| match plan.progress.get(&t.to_string()) {
                Some(p) => {
                    !p.is_done()
                        && (!plan.requested_only
                            || p.resnapshot_from.is_some()
                            || p.condition.is_some())
                }
                None => !plan.requested_only,
            })
            .collect();
        if let Some((name, lsn, imported)) = plan.exported.take() {
            // The first pass of a new slot: one transaction in the exported snapshot.
            Chunker::begin_exported(&client, &name).await?;
            let _ = imported.send(());
            tracing::info!(tables = pending.len(), consistent_point = %lsn, "initial snapshot started in the slot's exported snapshot");
            for table in &pending {
                if !snapshot_table(&client, &mut types, &mut plan, table, Some(lsn), &out).await? {
                    return Ok(());
                }
            }
            Chunker::commit(&client).await?;
            // Tables added later are first snapshots: they delete nothing.
            plan.resnapshot_from = None;
        } else if !pending.is_empty() {
            tracing::info!(
                tables = pending.len(),
                "snapshot of tables without a completed snapshot started"
            );
            for table in &pending {
                if !snapshot_table(&client, &mut types, &mut plan, table, None, &out).await? {
                    return Ok(());
                }
            }
        }
        metrics::gauge!(m::SNAPSHOT_TABLES_PENDING).set(0.0);
        tokio::select! {
            _ = tokio::time::sleep(RECHECK) => {}
            _ = out.closed() => return Ok(()),
        }
    }
}

/// Snapshots one table; `exported` is the position of the open exported snapshot, or
/// `None` to read each chunk in a fresh transaction. False when capture went away.
async fn snapshot_table(
    client: &tokio_postgres::Client,
    types: &mut TypeCatalog,
    plan: &mut SnapshotPlan,
    table: &TableName,
    exported: Option<Lsn>,
    out: &mpsc::Sender<SnapshotChunk>,
) -> Result<bool, CdcError> {
    let params = ConnectParams::from_dsn(&plan.dsn)?;
    let (schema, pk) = table_schema(client, types, table).await?;
    let schema = Arc::new(schema);
    let key = table.to_string();
    let mut progress = match plan.progress.get(&key) {
        Some(p) => p.clone(),
        None => SnapshotProgress {
            table: key.clone(),
            state: "running".into(),
            last_key: None,
            last_key_sealed: None,
            rows_done: 0,
            rows_estimate: estimate_rows(client, table).await?.max(0) as u64,
            ts_ms: now_ms(),
            resnapshot_from: plan.resnapshot_from.map(|l| l.0),
            condition: None,
        },
    };
    progress.state = "running".into();
    if let Some(condition) = &progress.condition {
        // Checked by `wal2delta snapshot` already; checked again here because the
        // request travelled through a topic others may write.
        if let Err(e) = Chunker::check_condition(client, table, condition).await {
            tracing::warn!(table = %table, error = %e, "re-snapshot request refused: its condition is not one valid SQL condition on the table");
            progress.state = "done".into();
            let item = SnapshotChunk {
                schema: schema.clone(),
                changes: Vec::new(),
                undecodable: Vec::new(),
                progress: progress.clone(),
            };
            if out.send(item).await.is_err() {
                return Ok(false);
            }
            plan.progress.insert(key, progress);
            return Ok(true);
        }
    }
    let chunker = Chunker::new(schema.clone(), &pk).with_condition(progress.condition.clone());
    if pk.is_empty() {
        tracing::warn!(table = %table, "table has no primary key: its snapshot is chunked by ctid");
    }
    tracing::info!(table = %table, rows_estimate = progress.rows_estimate, resume_after_rows = progress.rows_done, conditional = progress.condition.is_some(), "snapshot of table started");
    let started = Instant::now();
    let mut logged = Instant::now();
    loop {
        throttle(client, &plan.slot, plan.max_retained_wal_bytes, out).await?;
        let position = match exported {
            Some(lsn) => rows_position(lsn),
            None => {
                let slot = fresh_slot_name();
                Chunker::begin_fresh(client, &params, &slot).await?
            }
        };
        let chunk = chunker
            .read(client, progress.last_key.as_deref(), plan.chunk_rows)
            .await;
        if exported.is_none() {
            // Read-only: ending it either way is fine; commit even after an error.
            let _ = Chunker::commit(client).await;
        }
        let chunk = chunk?;
        let ts = now_ms() * 1000;
        let first_ordinal = progress.rows_done;
        let changes: Vec<Change> = chunk
            .rows
            .into_iter()
            .enumerate()
            .map(|(i, row): (usize, Row)| Change {
                table: table.clone(),
                op: ChangeOp::Read,
                before: None,
                after: Some(row),
                position: TxPosition {
                    commit_lsn: position,
                    lsn: position,
                    ordinal: first_ordinal + i as u64 + 1,
                    xid: 0,
                    commit_ts_us: ts,
                },
            })
            .collect();
        progress.rows_done += (changes.len() + chunk.undecodable.len()) as u64;
        progress.ts_ms = now_ms();
        match &chunk.next_after {
            Some(k) => progress.last_key = Some(k.clone()),
            None => progress.state = "done".into(),
        }
        metrics::gauge!(m::SNAPSHOT_ROWS_READ, "table" => key.clone())
            .set(progress.rows_done as f64);
        metrics::gauge!(m::SNAPSHOT_ROWS_ESTIMATE, "table" => key.clone())
            .set(progress.rows_estimate as f64);
        let done = progress.is_done();
        let item = SnapshotChunk {
            schema: schema.clone(),
            changes,
            undecodable: chunk.undecodable,
            progress: progress.clone(),
        };
        if out.send(item).await.is_err() {
            return Ok(false);
        }
        if logged.elapsed() > Duration::from_secs(10) || done {
            tracing::info!(table = %table, rows_done = progress.rows_done, rows_estimate = progress.rows_estimate, elapsed_s = started.elapsed().as_secs(), done, "snapshot progress");
            logged = Instant::now();
        }
        if done {
            plan.progress.insert(key, progress);
            return Ok(true);
        }
    }
}

/// Waits while the slot retains more WAL than the budget.
async fn throttle(
    client: &tokio_postgres::Client,
    slot: &str,
    budget: u64,
    out: &mpsc::Sender<SnapshotChunk>,
) -> Result<(), CdcError> {
    let mut warned = false;
    loop {
        let retained: Option<i64> = client
            .query_opt(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .and_then(|r| r.get(0));
        let retained = retained.unwrap_or(0).max(0) as u64;
        if retained <= budget || out.is_closed() {
            if warned {
                tracing::info!(
                    retained_bytes = retained,
                    "snapshot resumed: retained WAL back under budget"
                );
            }
            return Ok(());
        }
        if !warned {
            tracing::warn!(
                retained_bytes = retained,
                budget_bytes = budget,
                "snapshot paused: the slot retains more WAL than [snapshot] max_retained_wal_bytes"
            );
            warned = true;
        }
        metrics::counter!(m::SNAPSHOT_THROTTLED).increment(1);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The tables `publication` captures, in name order.
pub(crate) async fn publication_tables(
    client: &tokio_postgres::Client,
    publication: &str,
) -> Result<Vec<TableName>, CdcError> {
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1, 2",
            &[&publication],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| TableName::new(r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect())
}
