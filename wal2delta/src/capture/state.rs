//! The capture session's state, and how each decoded message is published: tokenized,
//! sent, and counted on the acknowledgement path ([`Acks`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use wal2delta_cdc::decoder::{Decoded, Decoder};
use wal2delta_cdc::replication::ReplicationStream;
use wal2delta_model::clock::unix_ms as now_ms;
use wal2delta_model::Lsn;
use wal2delta_model::{Change, TableSchema};
use wal2delta_stream::snapshots::SnapshotProgress;
use wal2delta_stream::transaction_acks::{AckToken, DeliveryTag};

use super::acks::Acks;
use super::error::SessionError;
use super::exclude::Exclusions;
use super::publisher::Publisher;
use super::snapshot::SnapshotChunk;
use super::tokenize::Tokenizer;
use super::tokenize::{tokenized, tokenized_raw};
use crate::metrics as m;

pub(super) struct State {
    /// The acknowledgement path: what the slot may be confirmed to.
    pub(super) acks: Acks,
    pub(super) decoder: Decoder,
    /// Replaces sensitive values before anything is encoded (promise 5).
    pub(super) tokenizer: Option<Tokenizer>,
    /// `[source] exclude_columns`: dropped before anything is encoded.
    pub(super) exclusions: Exclusions,
    /// `[capture] skip_truncate`: TRUNCATEs are counted and logged, not published.
    pub(super) skip_truncate: bool,
    pub(super) slot: String,
    pub(super) positions_topic: String,
    pub(super) snapshots_topic: String,
    pub(super) received: Lsn,
    pub(super) sent_flush: Lsn,
    pub(super) last_status: Instant,
    pub(super) events: u64,
}

impl State {
    pub(super) async fn handle(
        &mut self,
        decoded: Decoded,
        publisher: &mut Publisher,
    ) -> Result<(), SessionError> {
        match decoded {
            Decoded::Begin { .. } => {
                self.acks.begin();
            }
            Decoded::Commit { end_lsn, .. } => self.commit(end_lsn, publisher).await?,
            Decoded::Relation(schema) => {
                let view = self.published_schema(&schema)?;
                publisher.relation(&view).await?
            }
            Decoded::Change { schema, change } => {
                let token = self.acks.open_token()?;
                self.publish(token, &schema, change, publisher).await?;
            }
            Decoded::KeyChange {
                schema,
                delete,
                create,
            } => {
                // A primary-key change: the delete of the old key (and its tombstone), then
                // the create of the new key naming the old one (docs/capture.md).
                let token = self.acks.open_token()?;
                for change in [delete, create] {
                    self.publish(token, &schema, change, publisher).await?;
                }
            }
            Decoded::Truncate(changes) if self.skip_truncate => {
                for (schema, _) in changes {
                    let table = schema.table.to_string();
                    tracing::warn!(table = %table, "TRUNCATE not published ([capture] skip_truncate): Silver keeps the table's rows");
                    metrics::counter!(m::CAPTURE_TRUNCATES_SKIPPED, "table" => table).increment(1);
                }
            }
            Decoded::Truncate(changes) => {
                let token = self.acks.open_token()?;
                for (schema, change) in changes {
                    self.publish(token, &schema, change, publisher).await?;
                }
            }
            ref d @ Decoded::Undecodable {
                ref table, ref raw, ..
            } => {
                let token = self.acks.open_token()?;
                let raw = self.exclusions.raw(table, raw);
                let raw = tokenized_raw(self.tokenizer.as_ref(), table, &raw);
                let sent = publisher.undecodable(token, d, raw).await?;
                self.acks.sent(token, sent.0);
            }
            Decoded::Message { .. } | Decoded::Nothing => {}
        }
        Ok(())
    }

    /// Publishes one change under `token`, tokenized, and records what was sent.
    async fn publish(
        &mut self,
        token: AckToken,
        schema: &Arc<TableSchema>,
        change: Change,
        publisher: &mut Publisher,
    ) -> Result<(), SessionError> {
        let (shown, view) = self.views(schema)?;
        let change = self.exclusions.change(schema, change);
        let change = tokenized(self.tokenizer.as_ref(), &shown, change);
        let sent = publisher.change(token, &view, &change, now_ms()).await?;
        self.acks.sent(token, sent.0);
        self.events += 1;
        Ok(())
    }

    /// Ends the open source transaction: its END record (under its token, so the slot
    /// does not move past it before Kafka holds the record), then the commit. Every path
    /// that reads a commit ends here, a streamed transaction's replay included.
    pub(super) async fn commit(
        &mut self,
        end_lsn: Lsn,
        publisher: &mut Publisher,
    ) -> Result<(), SessionError> {
        let token = self.acks.open_token()?;
        let sent = publisher.transaction_end(token).await?;
        self.acks.sent(token, sent.0);
        self.acks.commit(end_lsn)
    }

    /// Writes the confirmable LSN to the position log when it moved and no record is on
    /// its way.
    pub(super) async fn record_position(
        &mut self,
        publisher: &Publisher,
    ) -> Result<(), SessionError> {
        if let Some(target) = self.acks.position_to_record() {
            publisher
                .record_position(&self.positions_topic, &self.slot, target, now_ms())
                .await?;
            self.acks.position_sent(target);
        }
        Ok(())
    }

    /// Publishes one snapshot chunk as `r` events under its own token. It never moves the
    /// slot; its progress is recorded once Kafka has all of it.
    pub(super) async fn snapshot_chunk(
        &mut self,
        chunk: SnapshotChunk,
        publisher: &mut Publisher,
    ) -> Result<(), SessionError> {
        let token = self.acks.begin_chunk();
        for change in chunk.changes {
            self.publish(token, &chunk.schema, change, publisher)
                .await?;
        }
        for (reason, raw) in chunk.undecodable {
            let raw = self.exclusions.raw(&chunk.schema.table, &raw);
            let raw = tokenized_raw(self.tokenizer.as_ref(), &chunk.schema.table, &raw);
            let sent = publisher
                .snapshot_dead_letter(token, &chunk.schema.table, &reason, raw)
                .await?;
            self.acks.sent(token, sent.0);
        }
        if let (true, Some(from)) = (chunk.progress.is_done(), chunk.progress.resnapshot_from) {
            // The last chunk of a re-snapshot: its end goes to every partition after the
            // rows, under the chunk's token, so "done" is recorded only once it is in Kafka.
            let view = self.published_schema(&chunk.schema)?;
            let sent = publisher
                .snapshot_end(token, &view, Lsn(from), now_ms())
                .await?;
            self.acks.sent(token, sent.0);
        }
        metrics::gauge!(m::SNAPSHOT_TABLES_PENDING).set(if chunk.progress.is_done() {
            0.0
        } else {
            1.0
        });
        self.acks.chunk_sent(token, chunk.progress);
        Ok(())
    }

    /// Records the progress of chunks Kafka has acknowledged.
    pub(super) async fn record_progress(
        &mut self,
        publisher: &Publisher,
    ) -> Result<(), SessionError> {
        for p in self.acks.take_progress() {
            let key = SnapshotProgress::key(&self.slot, &p.table);
            let record = self.sealed(&key, &p);
            publisher
                .producer
                .send(
                    &self.snapshots_topic,
                    Some(0),
                    Some(key.as_bytes()),
                    &record.to_json(),
                    DeliveryTag::SnapshotProgress,
                )
                .await?;
            metrics::gauge!(m::SNAPSHOT_ROWS_PUBLISHED, "table" => p.table.clone())
                .set(p.rows_done as f64);
            if p.is_done() {
                tracing::info!(table = %p.table, rows = p.rows_done, "snapshot of table complete and in Kafka");
            }
        }
        Ok(())
    }

    /// The progress record as written to the snapshots topic: for a table with tokenized
    /// columns the last key (which may be a tokenized column's raw value) is sealed, so
    /// the topic never holds it in clear (promise 5).
    fn sealed(&self, record_key: &str, p: &SnapshotProgress) -> SnapshotProgress {
        let Some(t) = self.tokenizer.as_ref().filter(|t| t.covers(&p.table)) else {
            return p.clone();
        };
        let mut out = p.clone();
        if let Some(key) = out.last_key.take() {
            let plain = serde_json::to_vec(&key).unwrap_or_default();
            // Sealing fails only without randomness; then the record carries no key and
            // a resume starts the table again (rows twice, never skipped).
            out.last_key_sealed = t.seal(record_key, &plain);
            if out.last_key_sealed.is_none() {
                out.rows_done = 0;
            }
        }
        out
    }

    /// The schema events of this table are published with (tokenized columns as text).
    pub(super) fn published_schema(
        &mut self,
        schema: &Arc<TableSchema>,
    ) -> Result<Arc<TableSchema>, SessionError> {
        Ok(self.views(schema)?.1)
    }

    /// `schema` without its excluded columns (what the row values are aligned with once
    /// excluded), and that with its tokenized columns' types (what is published).
    fn views(
        &mut self,
        schema: &Arc<TableSchema>,
    ) -> Result<(Arc<TableSchema>, Arc<TableSchema>), SessionError> {
        let shown = self.exclusions.schema(schema)?;
        let published = match &mut self.tokenizer {
            Some(t) => t.schema(&shown),
            None => shown.clone(),
        };
        Ok((shown, published))
    }

    /// Sends a standby status update: at once when the server asked, otherwise at most
    /// once per interval. The flush position comes only from the tracker and never moves
    /// backwards.
    pub(super) async fn status(
        &mut self,
        stream: &mut ReplicationStream,
        force: bool,
        every: Duration,
    ) -> Result<(), SessionError> {
        // Only what the position log already holds may be confirmed to PostgreSQL.
        let flush = self.acks.flushable().max(self.sent_flush);
        if !force && flush == self.sent_flush && self.last_status.elapsed() < every {
            return Ok(());
        }
        stream
            .send_status(self.received.max(flush), flush, false)
            .await?;
        self.sent_flush = flush;
        self.last_status = Instant::now();
        Ok(())
    }
}
