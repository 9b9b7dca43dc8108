//! One capture session: connect, settle the slot, start the snapshot and the stream, then
//! read, publish and confirm until shutdown or a failure.

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use wal2delta_cdc::decoder::{Decoded, Decoder};
use wal2delta_cdc::replication::{
    ConnectParams, ReplicationConnection, ReplicationMessage, ReplicationStream,
};
use wal2delta_cdc::snapshot::create_slot_exporting_snapshot;
use wal2delta_cdc::stream_buffer::{Routed, StreamBuffer};
use wal2delta_cdc::{slot, source, CdcError};
use wal2delta_model::table::quote_ident;
use wal2delta_model::Lsn;
use wal2delta_stream::avro::envelope::SourceInfo;
use wal2delta_stream::producer::{Delivery, EventProducer, ProducerSettings};
use wal2delta_stream::registry::Registry;

use super::acks::{Acks, Delivered};
use super::error::SessionError;
use super::publisher::Publisher;
use super::snapshot::{SnapshotChunk, SnapshotPlan};
use super::startup::{
    check_slot_position, load_snapshot_progress, open_sealed_keys, quote_literal, record_new_slot,
    recorded_position, resume_point,
};
use super::state::State;
use super::tokenize::Tokenizer;
use super::{exclude, snapshot, Limits};
use crate::config::Config;
use crate::config::{OnSlotLost, SnapshotMode};
use crate::metrics as m;
use crate::supervisor::Supervisor;

/// A session's connections and topics, before streaming starts.
struct Setup<'a> {
    config: &'a Config,
    dsn: String,
    params: ConnectParams,
    catalog: tokio_postgres::Client,
    tokenizer: Option<Tokenizer>,
    publisher: Publisher,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    positions_topic: String,
    snapshots_topic: String,
    status_every: Duration,
}

/// Where streaming starts, and what the slot decision left to do.
struct SlotStart {
    start: Lsn,
    /// The snapshot a newly created slot exported (its connection must stay open until
    /// the snapshot task imported it).
    exported: Option<wal2delta_cdc::snapshot::ExportedSlot>,
    /// The slot was re-created: every table is snapshotted again.
    reset_progress: bool,
}

/// The snapshot task's chunks, while it runs.
struct SnapshotFeed {
    rx: mpsc::Receiver<SnapshotChunk>,
    task: Option<tokio::task::JoinHandle<Result<(), CdcError>>>,
    open: bool,
}

/// A streaming session.
pub(super) struct Session<'a> {
    config: &'a Config,
    pub(super) catalog: tokio_postgres::Client,
    pub(super) publisher: Publisher,
    pub(super) deliveries: mpsc::UnboundedReceiver<Delivery>,
    pub(super) state: State,
    pub(super) stream: ReplicationStream,
    buffer: StreamBuffer,
    snapshot: SnapshotFeed,
    pub(super) status_every: Duration,
    pub(super) max_in_flight: usize,
    /// Gauges set after every message, looked up once (a registry lookup per message
    /// was 1.5% of capture's CPU).
    gauges: Gauges,
}

struct Gauges {
    in_flight: metrics::Gauge,
    stream_buffer_bytes: metrics::Gauge,
}

/// `connected` turns true once streaming started: the session was healthy, and its end
/// is a new failure (the supervisor's backoff starts over).
pub(super) async fn session(
    config: &Config,
    supervisor: &Supervisor,
    shutdown: &mut watch::Receiver<bool>,
    connected: &mut bool,
    allow_slot_ahead: bool,
    limits: Limits,
) -> Result<(), SessionError> {
    let start = async {
        let mut setup = Setup::connect(config, limits).await?;
        let slot = setup.open_slot(allow_slot_ahead).await?;
        let snapshot = setup
            .start_snapshot(slot.exported, slot.reset_progress)
            .await?;
        setup.start_streaming(slot.start, snapshot).await
    };
    // Until streaming starts nothing is in flight, so a shutdown request simply ends the
    // session: connecting, creating topics or registering schemas against a service that
    // does not answer must not hold the daemon past SIGTERM.
    let mut session = tokio::select! {
        biased;
        _ = shutdown.changed() => {
            tracing::info!("shutdown requested while capture was starting; nothing in flight");
            return Ok(());
        }
        s = start => s?,
    };
    *connected = true;
    supervisor.healthy();
    session.run(shutdown).await
}

impl<'a> Setup<'a> {
    /// Connects to PostgreSQL (catalog), Kafka and the registry, and makes sure the
    /// topics capture writes besides the change topics exist.
    async fn connect(config: &'a Config, limits: Limits) -> Result<Setup<'a>, SessionError> {
        let dsn = config.source.effective_dsn()?;
        let tokenizer = Tokenizer::from_config(&config.tokenize)?;
        let params = ConnectParams::from_dsn(&dsn)?;
        let catalog = source::connect(&dsn).await?;
        let sender_timeout_ms = slot::wal_sender_timeout_ms(&catalog).await?;
        // Status updates at least three times per wal_sender_timeout, so the server never
        // drops us for silence.
        let mut status_every = Duration::from_millis(config.capture.status_interval_ms);
        if sender_timeout_ms > 0 {
            status_every = status_every
                .min(Duration::from_millis(sender_timeout_ms / 3).max(Duration::from_millis(100)));
        }
        let kafka = config.kafka.connection()?;
        kafka.check_async().await?;
        let (producer, deliveries) = EventProducer::new(ProducerSettings {
            connection: kafka,
            delivery_timeout: Duration::from_millis(config.kafka.delivery_timeout_ms),
            topics: config.kafka.topic_settings(),
            message_max_bytes: limits.message_max_bytes,
            extra: config.kafka.producer.clone(),
        })?;
        let registry_connection = config.schema_registry.connection()?;
        if registry_connection.is_secured() {
            registry_connection.check().await?;
        }
        let registry = Registry::new(&registry_connection)?;
        let mut publisher = Publisher::new(
            producer,
            registry,
            config.kafka.topic_prefix.clone(),
            config.kafka.dlq_topic(),
            config.kafka.transactions_topic(),
            SourceInfo {
                name: config.kafka.topic_prefix.clone(),
                db: params.dbname.clone(),
            },
        )
        .with_decimals(config.kafka.decimal_handling.into())
        .with_identity(config.source.identity());
        publisher.ensure_dlq_topic().await?;
        publisher.ensure_transactions_topic().await?;
        let positions_topic = config.kafka.positions_topic();
        let snapshots_topic = config.kafka.snapshots_topic();
        for topic in [&positions_topic, &snapshots_topic] {
            publisher.producer.ensure_compacted_topic(topic).await?;
        }
        Ok(Setup {
            config,
            dsn,
            params,
            catalog,
            tokenizer,
            publisher,
            deliveries,
            positions_topic,
            snapshots_topic,
            status_every,
        })
    }

    /// Uses the slot, or creates it (first start, or re-creation when configured), in
    /// which case it exports the snapshot the initial snapshot reads. A slot that is lost,
    /// dropped behind capture's back, or ahead of the position log is refused unless the
    /// operator said otherwise.
    async fn open_slot(&mut self, allow_slot_ahead: bool) -> Result<SlotStart, SessionError> {
        let config = self.config;
        let slot_name = &config.source.slot;
        let recorded = recorded_position(config, &self.positions_topic).await?;
        let info = slot::slot_info(&self.catalog, slot_name).await?;
        if let Some(i) = info.as_ref().filter(|i| !i.is_lost()) {
            let confirmed = i.confirmed_flush.unwrap_or_default();
            check_slot_position(
                config,
                &self.positions_topic,
                confirmed,
                recorded,
                allow_slot_ahead,
            )?;
            let start = resume_point(&self.catalog, slot_name, confirmed, recorded).await?;
            return Ok(SlotStart {
                start,
                exported: None,
                reset_progress: false,
            });
        }
        let lost = info.is_some();
        let existed = lost || recorded.is_some();
        let slot = slot_name.clone();
        if existed && config.source.on_slot_lost != OnSlotLost::Recreate {
            return Err(if lost {
                SessionError::SlotLost { slot }
            } else {
                SessionError::SlotDropped {
                    slot,
                    topic: self.positions_topic.clone(),
                }
            });
        }
        if !existed && config.snapshot.mode != SnapshotMode::Initial {
            return Err(SessionError::SlotMissing { slot });
        }
        if lost {
            tracing::warn!(slot = %slot_name, "dropping the invalidated slot to re-create it ([source] on_slot_lost = recreate)");
            self.catalog
                .execute("SELECT pg_drop_replication_slot($1)", &[slot_name])
                .await
                .map_err(CdcError::from)?;
        }
        if existed {
            tracing::warn!(slot = %slot_name, "re-creating the replication slot; every table is snapshotted again");
        }
        let e =
            create_slot_exporting_snapshot(&self.params, slot_name, config.source.failover_slot)
                .await?;
        tracing::info!(slot = %slot_name, consistent_point = %e.consistent_point, "created replication slot with an exported snapshot");
        let point = e.consistent_point;
        record_new_slot(
            config,
            &self.publisher,
            &mut self.deliveries,
            &self.positions_topic,
            &self.snapshots_topic,
            point,
            existed,
        )
        .await?;
        Ok(SlotStart {
            start: point,
            exported: Some(e),
            reset_progress: existed,
        })
    }

    /// Starts the snapshot task when there is anything to snapshot, and waits until it
    /// imported a newly exported snapshot.
    async fn start_snapshot(
        &self,
        exported: Option<wal2delta_cdc::snapshot::ExportedSlot>,
        reset_progress: bool,
    ) -> Result<SnapshotFeed, SessionError> {
        let config = self.config;
        let (tx, rx) = mpsc::channel::<SnapshotChunk>(2);
        // Without an initial snapshot the task still runs, for re-snapshots requested
        // with `wal2delta snapshot --table`.
        let requested_only = config.snapshot.mode != SnapshotMode::Initial && exported.is_none();
        let slot_name = &config.source.slot;
        let progress = if reset_progress {
            Default::default()
        } else {
            let mut p = load_snapshot_progress(config, &self.snapshots_topic).await?;
            open_sealed_keys(&mut p, slot_name, self.tokenizer.as_ref());
            p
        };
        let (imported_tx, imported_rx) = oneshot::channel();
        let plan = SnapshotPlan {
            dsn: self.dsn.clone(),
            slot: slot_name.clone(),
            publication: config.source.publication.clone(),
            chunk_rows: config.snapshot.chunk_rows,
            max_retained_wal_bytes: config.snapshot.max_retained_wal_bytes,
            progress,
            exported: exported
                .as_ref()
                .map(|e| (e.snapshot_name.clone(), e.consistent_point, imported_tx)),
            resnapshot_from: exported
                .as_ref()
                .filter(|_| reset_progress)
                .map(|e| wal2delta_cdc::snapshot::rows_position(e.consistent_point)),
            requested_only,
            requests: Some((config.kafka.connection()?, self.snapshots_topic.clone())),
            follow: config.source.add_new_tables.then(|| {
                super::snapshot::Follow::new(
                    config.source.tables.clone(),
                    config.source.exclude_tables.clone(),
                )
            }),
        };
        let task = tokio::spawn(snapshot::run(plan, tx));
        if let Some(e) = exported {
            // The exporting connection must stay open until the snapshot is imported.
            let limit = Duration::from_secs(60);
            tokio::time::timeout(limit, imported_rx)
                .await
                .map_err(|_| SessionError::SnapshotNotImported(limit))?
                .map_err(|_| {
                    CdcError::Protocol(
                        "the snapshot task ended before importing the snapshot".into(),
                    )
                })?;
            drop(e);
        }
        Ok(SnapshotFeed {
            rx,
            task: Some(task),
            open: true,
        })
    }

    /// Opens the replication connection and starts streaming from `start`.
    async fn start_streaming(
        self,
        start: Lsn,
        snapshot: SnapshotFeed,
    ) -> Result<Session<'a>, SessionError> {
        let config = self.config;
        let slot_name = &config.source.slot;
        // Large transactions: PostgreSQL 14+ streams them while in progress (protocol 2)
        // into a disk-backed buffer instead of spilling them on the primary; nothing is
        // published before the commit, and nothing of an aborted transaction ever is.
        let server_version: i32 = self
            .catalog
            .query_one("SHOW server_version_num", &[])
            .await
            .map_err(CdcError::from)?
            .get::<_, String>(0)
            .parse()
            .unwrap_or(0);
        let streaming = config.capture.stream_in_progress && server_version >= 140_000;
        let spill_dir = config.capture.spill_dir(slot_name);
        let buffer = StreamBuffer::new(spill_dir.clone(), config.capture.stream_memory_bytes)
            .map_err(|source| SessionError::SpillDir {
                dir: spill_dir.display().to_string(),
                source,
            })?;
        let repl = ReplicationConnection::connect(&self.params).await?;
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (\"proto_version\" '{}', {}\"publication_names\" {}, \"messages\" 'true')",
            quote_ident(slot_name),
            start,
            if streaming { 2 } else { 1 },
            if streaming { "\"streaming\" 'on', " } else { "" },
            quote_literal(&quote_ident(&config.source.publication)),
        );
        let stream = repl.start_replication(&command).await?;
        tracing::info!(slot = %slot_name, start_lsn = %start, status_interval_ms = self.status_every.as_millis() as u64, "capture streaming");
        let state = State {
            acks: Acks::new(
                start,
                Duration::from_millis(config.kafka.delivery_timeout_ms),
            ),
            snapshots_topic: self.snapshots_topic,
            decoder: Decoder::new(),
            tokenizer: self.tokenizer,
            exclusions: exclude::Exclusions::new(config.source.column_filters()),
            skip_truncate: config.capture.skip_truncate,
            slot: slot_name.clone(),
            positions_topic: self.positions_topic,
            received: start,
            sent_flush: start,
            last_status: Instant::now(),
            events: 0,
        };
        Ok(Session {
            config,
            catalog: self.catalog,
            publisher: self.publisher,
            deliveries: self.deliveries,
            state,
            stream,
            buffer,
            snapshot,
            status_every: self.status_every,
            max_in_flight: config.capture.max_in_flight,
            gauges: Gauges {
                in_flight: metrics::gauge!(m::CAPTURE_IN_FLIGHT),
                stream_buffer_bytes: metrics::gauge!(m::CAPTURE_STREAM_BUFFER_BYTES),
            },
        })
    }
}

impl Session<'_> {
    /// Reads, publishes and confirms until shutdown (drained) or a failure.
    async fn run(&mut self, shutdown: &mut watch::Receiver<bool>) -> Result<(), SessionError> {
        let config = self.config;
        let mut ticker = tokio::time::interval(self.status_every);
        let mut progress = tokio::time::interval(Duration::from_secs(10));
        // Heartbeats: a non-transactional logical message in the captured database, so the
        // slot has something to confirm even when the database is idle and others are busy.
        let heartbeat_on = config.capture.heartbeat_interval_ms > 0;
        let mut heartbeat = tokio::time::interval(Duration::from_millis(
            config.capture.heartbeat_interval_ms.max(1),
        ));
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut progress_at = (Instant::now(), 0u64);
        loop {
            let can_read = self.state.acks.in_flight() < self.max_in_flight;
            let snapshot_ready =
                self.snapshot.open && !self.state.acks.in_transaction() && can_read;
            tokio::select! {
                biased;
                _ = shutdown.changed() => return self.drain().await,
                d = self.deliveries.recv() => {
                    let d = d.ok_or(SessionError::DeliveriesClosed)?;
                    match self.state.acks.on_delivery(d)? {
                        Delivered::Position => self.state.status(&mut self.stream, false, self.status_every).await?,
                        Delivered::Event => self.state.record_progress(&self.publisher).await?,
                        Delivered::Other => {}
                    }
                }
                _ = ticker.tick() => {
                    self.state.acks.check_timeout()?;
                    self.state.record_position(&self.publisher).await?;
                    self.state.status(&mut self.stream, false, self.status_every).await?;
                }
                _ = progress.tick() => {
                    let (at, n) = progress_at;
                    let rate = (self.state.events - n) as f64 / at.elapsed().as_secs_f64().max(0.001);
                    tracing::info!(confirmed_lsn = %self.state.acks.confirmed(), in_flight = self.state.acks.in_flight(), events = self.state.events, events_per_s = rate as u64, "capture progress");
                    progress_at = (Instant::now(), self.state.events);
                }
                chunk = self.snapshot.rx.recv(), if snapshot_ready => self.on_snapshot_chunk(chunk).await?,
                _ = heartbeat.tick(), if heartbeat_on => {
                    match self.catalog.execute("SELECT pg_logical_emit_message(false, 'wal2delta.heartbeat', now()::text)", &[]).await {
                        Ok(_) => metrics::counter!(m::CAPTURE_HEARTBEATS).increment(1),
                        Err(error) => tracing::warn!(error = %error, "cannot write heartbeat"),
                    }
                }
                msg = self.stream.next(), if can_read => self.on_replication_message(msg?).await?,
            }
            self.gauges
                .in_flight
                .set(self.state.acks.in_flight() as f64);
        }
    }

    /// A chunk of the snapshot, or the end of the snapshot task.
    async fn on_snapshot_chunk(
        &mut self,
        chunk: Option<SnapshotChunk>,
    ) -> Result<(), SessionError> {
        match chunk {
            Some(chunk) => {
                self.state
                    .snapshot_chunk(chunk, &mut self.publisher)
                    .await?;
                // A chunk without events (the end of a table) is complete at once.
                self.state.record_progress(&self.publisher).await
            }
            None => {
                // The task ended: with an error, end the session (it restarts and resumes
                // after the last recorded chunk).
                if let Some(task) = self.snapshot.task.take() {
                    task.await.map_err(SessionError::task("snapshot"))??;
                }
                // Closed for good: stop polling it (a closed channel is always ready).
                self.snapshot.open = false;
                Ok(())
            }
        }
    }

    async fn on_replication_message(
        &mut self,
        msg: Option<ReplicationMessage>,
    ) -> Result<(), SessionError> {
        match msg {
            None => Err(CdcError::Protocol("server ended the replication stream".into()).into()),
            Some(ReplicationMessage::Keepalive {
                wal_end,
                reply_requested,
            }) => {
                if self.buffer.open_transactions() == 0 {
                    self.state.acks.idle_advance(wal_end);
                }
                self.state.received = self.state.received.max(wal_end);
                if reply_requested {
                    self.state
                        .status(&mut self.stream, true, self.status_every)
                        .await?;
                }
                Ok(())
            }
            Some(ReplicationMessage::XLogData {
                wal_start,
                wal_end,
                data,
            }) => {
                self.state.received = self.state.received.max(wal_end);
                let routed = self.buffer.on_message(wal_start, data)?;
                self.on_routed(routed, wal_start, wal_end).await?;
                self.gauges
                    .stream_buffer_bytes
                    .set(self.buffer.buffered_bytes() as f64);
                Ok(())
            }
        }
    }

    /// A pgoutput message, after the stream buffer kept what belongs to an in-progress
    /// transaction.
    async fn on_routed(
        &mut self,
        routed: Routed,
        wal_start: Lsn,
        wal_end: Lsn,
    ) -> Result<(), SessionError> {
        match routed {
            Routed::Schema { xid, message } => self.state.decoder.stream_schema(xid, message),
            Routed::Pass(parsed) => {
                let decoded = self
                    .state
                    .decoder
                    .decode(&self.catalog, parsed, wal_start)
                    .await?;
                // A non-transactional message (a heartbeat) outside any transaction:
                // everything up to it has been handled, so the slot may move there.
                if matches!(
                    decoded,
                    Decoded::Message {
                        transactional: false,
                        ..
                    }
                ) && !self.state.acks.in_transaction()
                    && self.buffer.open_transactions() == 0
                {
                    self.state.acks.idle_advance(wal_end);
                    self.publisher.watermark(wal_end.0).await?;
                }
                self.state.handle(decoded, &mut self.publisher).await?;
            }
            Routed::Buffered => {}
            Routed::Aborted {
                xid,
                subxid,
                dropped,
            } => {
                if xid == subxid {
                    self.state.decoder.stream_aborted(xid);
                }
                metrics::counter!(m::CAPTURE_STREAMED_ABORTED).increment(1);
                tracing::debug!(
                    dropped,
                    "streamed transaction aborted; nothing of it is published"
                );
            }
            Routed::Commit(tx) => self.replay_streamed(tx).await?,
        }
        Ok(())
    }
}
