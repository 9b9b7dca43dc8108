//! The capture session's state: the acknowledgement tracker, the open transaction, the
//! position log and snapshot chunks in flight, and how each decoded message is published.

use super::*;

pub(super) struct State {
    pub(super) tracker: AckTracker,
    pub(super) decoder: Decoder,
    /// Replaces sensitive values before anything is encoded (promise 5).
    pub(super) tokenizer: Option<Tokenizer>,
    pub(super) slot: String,
    pub(super) positions_topic: String,
    /// The highest LSN the position log holds (acknowledged by Kafka); PostgreSQL is
    /// never told more than this.
    pub(super) position_acked: Lsn,
    /// A position record sent and not yet acknowledged.
    pub(super) position_in_flight: Option<Lsn>,
    pub(super) snapshots_topic: String,
    /// Snapshot chunks not yet fully acknowledged: events pending and the progress to
    /// record once they are.
    pub(super) snapshot_chunks: std::collections::VecDeque<(AckToken, usize, SnapshotProgress)>,
    /// Progress of chunks that are in Kafka, to record.
    pub(super) progress_ready: Vec<SnapshotProgress>,
    /// The open transaction's token, between Begin and Commit.
    pub(super) token: Option<AckToken>,
    pub(super) received: Lsn,
    pub(super) sent_flush: Lsn,
    pub(super) last_status: Instant,
    pub(super) events: u64,
    pub(super) watch: DeliveryWatch,
}

/// Capture's own delivery timeout. librdkafka never times a message out (that would skip
/// it and let later END records through: see `wal2delta_stream::producer`), so capture
/// ends the session when Kafka acknowledges nothing for `[kafka] delivery_timeout_ms`
/// while something waits; the dropped producer purges what it still holds.
pub(super) struct DeliveryWatch {
    pub(super) timeout: Duration,
    /// Delivery reports received, and how many there were when the clock was last reset.
    reports: u64,
    at_reset: u64,
    since: Instant,
}

impl DeliveryWatch {
    pub(super) fn new(timeout: Duration) -> Self {
        DeliveryWatch {
            timeout,
            reports: 0,
            at_reset: 0,
            since: Instant::now(),
        }
    }

    pub(super) fn report(&mut self) {
        self.reports += 1;
    }

    /// Fails when `waiting` has lasted `timeout` without a single delivery report.
    pub(super) fn check(&mut self, waiting: bool) -> Result<(), SessionError> {
        if !waiting || self.reports != self.at_reset {
            self.at_reset = self.reports;
            self.since = Instant::now();
            return Ok(());
        }
        if self.since.elapsed() >= self.timeout {
            return Err(SessionError::Delivery(format!(
                "Kafka acknowledged nothing for {} ms while events were in flight ([kafka] delivery_timeout_ms)",
                self.timeout.as_millis()
            )));
        }
        Ok(())
    }
}

impl State {
    pub(super) fn ack(&mut self, token: AckToken) {
        if let Some((_, pending, _)) = self
            .snapshot_chunks
            .iter_mut()
            .find(|(t, _, _)| *t == token)
        {
            *pending = pending.saturating_sub(1);
            self.complete_snapshot_chunks();
        }
        let before = self.tracker.open_transactions();
        if let Some(lsn) = self.tracker.acked(token) {
            metrics::gauge!(m::CAPTURE_CONFIRMED_LSN).set(lsn.0 as f64);
        }
        let released = before - self.tracker.open_transactions();
        if released > 0 {
            metrics::counter!(m::CAPTURE_TRANSACTIONS).increment(released as u64);
        }
    }

    pub(super) async fn handle(
        &mut self,
        decoded: Decoded,
        publisher: &mut Publisher,
    ) -> Result<(), SessionError> {
        match decoded {
            Decoded::Begin { .. } => self.token = Some(self.tracker.begin()),
            Decoded::Commit { end_lsn, .. } => {
                let token = self.open_token()?;
                publisher.transaction_end(&mut self.tracker, token).await?;
                let before = self.tracker.open_transactions();
                self.tracker.seal(token, end_lsn);
                let released = before - self.tracker.open_transactions();
                if released > 0 {
                    metrics::counter!(m::CAPTURE_TRANSACTIONS).increment(released as u64);
                }
                self.token = None;
            }
            Decoded::Relation(schema) => {
                let view = self.published_schema(&schema);
                publisher.relation(&view).await?
            }
            Decoded::Change { schema, mut change } => {
                let token = self.open_token()?;
                let view = self.published_schema(&schema);
                let key_id = match &self.tokenizer {
                    Some(t) => {
                        t.change(&schema, &mut change);
                        t.key_id_for(&schema.table)
                    }
                    None => None,
                };
                publisher
                    .change(&mut self.tracker, token, &view, &change, now_ms(), key_id)
                    .await?;
                self.events += 1;
            }
            Decoded::KeyChange {
                schema,
                delete,
                create,
            } => {
                // A primary-key change: the delete of the old key (and its tombstone), then
                // the create of the new key naming the old one (docs/capture.md).
                let token = self.open_token()?;
                let view = self.published_schema(&schema);
                for mut change in [delete, create] {
                    let key_id = match &self.tokenizer {
                        Some(t) => {
                            t.change(&schema, &mut change);
                            t.key_id_for(&schema.table)
                        }
                        None => None,
                    };
                    publisher
                        .change(&mut self.tracker, token, &view, &change, now_ms(), key_id)
                        .await?;
                    self.events += 1;
                }
            }
            Decoded::Truncate(changes) => {
                let token = self.open_token()?;
                for (schema, change) in changes {
                    let view = self.published_schema(&schema);
                    let key_id = self
                        .tokenizer
                        .as_ref()
                        .and_then(|t| t.key_id_for(&schema.table));
                    publisher
                        .change(&mut self.tracker, token, &view, &change, now_ms(), key_id)
                        .await?;
                    self.events += 1;
                }
            }
            ref d @ Decoded::Undecodable {
                ref table, ref raw, ..
            } => {
                let token = self.open_token()?;
                let raw_text = match &self.tokenizer {
                    Some(t) => t.raw(table, raw),
                    None => raw.render(|_, text| text.to_owned()),
                };
                publisher
                    .undecodable(&mut self.tracker, token, d, raw_text)
                    .await?;
            }
            Decoded::Message { .. } | Decoded::Nothing => {}
        }
        Ok(())
    }

    /// Writes the tracker's confirmable LSN to the position log when it moved and no record
    /// is on its way.
    pub(super) async fn record_position(
        &mut self,
        publisher: &Publisher,
    ) -> Result<(), SessionError> {
        let target = self.tracker.confirmed();
        if target > self.position_acked && self.position_in_flight.is_none() {
            publisher
                .record_position(&self.positions_topic, &self.slot, target, now_ms())
                .await?;
            self.position_in_flight = Some(target);
        }
        Ok(())
    }

    /// Applies one delivery report.
    pub(super) fn delivered(
        &mut self,
        d: wal2delta_stream::producer::Delivery,
    ) -> Result<(), SessionError> {
        self.watch.report();
        if let Some(e) = delivery_failed(&d) {
            return Err(e);
        }
        if d.token == POSITION_TOKEN {
            self.position_delivered();
        } else if d.token != PROGRESS_TOKEN && d.token != WATERMARK_TOKEN {
            self.ack(d.token);
        }
        Ok(())
    }

    /// Publishes one snapshot chunk as `r` events under its own token. It never moves the
    /// slot (sealed at 0/0); its progress is recorded once Kafka has all of it.
    pub(super) async fn snapshot_chunk(
        &mut self,
        chunk: SnapshotChunk,
        publisher: &mut Publisher,
    ) -> Result<(), SessionError> {
        let token = self.tracker.begin();
        let view = self.published_schema(&chunk.schema);
        let key_id = self
            .tokenizer
            .as_ref()
            .and_then(|t| t.key_id_for(&chunk.schema.table))
            .map(str::to_owned);
        for mut change in chunk.changes {
            if let Some(t) = &self.tokenizer {
                t.change(&chunk.schema, &mut change);
            }
            publisher
                .change(
                    &mut self.tracker,
                    token,
                    &view,
                    &change,
                    now_ms(),
                    key_id.as_deref(),
                )
                .await?;
            self.events += 1;
        }
        for (reason, raw) in chunk.undecodable {
            let raw = match &self.tokenizer {
                Some(t) => t.raw(&chunk.schema.table, &raw),
                None => raw.render(|_, text| text.to_owned()),
            };
            publisher
                .snapshot_dead_letter(&mut self.tracker, token, &chunk.schema.table, &reason, raw)
                .await?;
        }
        if let (true, Some(from)) = (chunk.progress.is_done(), chunk.progress.resnapshot_from) {
            // The last chunk of a re-snapshot: its end goes to every partition after the
            // rows, under the chunk's token, so "done" is recorded only once it is in Kafka.
            publisher
                .snapshot_end(&mut self.tracker, token, &view, Lsn(from), now_ms())
                .await?;
        }
        let pending = self.tracker.pending(token);
        self.tracker.seal(token, Lsn::ZERO);
        metrics::gauge!(m::SNAPSHOT_TABLES_PENDING).set(if chunk.progress.is_done() {
            0.0
        } else {
            1.0
        });
        self.snapshot_chunks
            .push_back((token, pending, chunk.progress));
        self.complete_snapshot_chunks();
        Ok(())
    }

    /// Moves the progress of fully acknowledged chunks, in chunk order, to be recorded: a
    /// chunk's progress is recorded only after every earlier chunk's.
    pub(super) fn complete_snapshot_chunks(&mut self) {
        while self
            .snapshot_chunks
            .front()
            .is_some_and(|(_, pending, _)| *pending == 0)
        {
            if let Some((_, _, progress)) = self.snapshot_chunks.pop_front() {
                self.progress_ready.push(progress);
            }
        }
    }

    /// Records the progress of chunks Kafka has acknowledged.
    pub(super) async fn record_progress(
        &mut self,
        publisher: &Publisher,
    ) -> Result<(), SessionError> {
        for p in std::mem::take(&mut self.progress_ready) {
            let key = SnapshotProgress::key(&self.slot, &p.table);
            let record = self.sealed(&key, &p);
            publisher
                .producer
                .send(
                    &self.snapshots_topic,
                    Some(0),
                    Some(key.as_bytes()),
                    &record.to_json(),
                    PROGRESS_TOKEN,
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

    /// Whether anything sent waits for Kafka (for the delivery timeout).
    pub(super) fn waiting(&self) -> bool {
        self.tracker.in_flight() > 0 || self.position_in_flight.is_some()
    }

    pub(super) fn position_delivered(&mut self) {
        if let Some(lsn) = self.position_in_flight.take() {
            self.position_acked = self.position_acked.max(lsn);
        }
    }

    /// The schema events of this table are published with (tokenized columns as text).
    pub(super) fn published_schema(
        &mut self,
        schema: &std::sync::Arc<wal2delta_model::TableSchema>,
    ) -> std::sync::Arc<wal2delta_model::TableSchema> {
        match &mut self.tokenizer {
            Some(t) => t.schema(schema),
            None => schema.clone(),
        }
    }

    pub(super) fn open_token(&self) -> Result<AckToken, SessionError> {
        self.token.ok_or_else(|| {
            SessionError::Cdc(CdcError::Protocol("change outside a transaction".into()))
        })
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
        let flush = self
            .tracker
            .confirmed()
            .min(self.position_acked)
            .max(self.sent_flush);
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
