//! The capture stage: PostgreSQL slot → Avro events on Kafka.
//!
//! One session reads the slot from its confirmed position, publishes every change, and
//! confirms to PostgreSQL only what [`acks::Acks`] releases: the end LSN of transactions
//! whose every event (dead letters included) Kafka acknowledged. Any transient failure
//! (broker or registry down, connection lost, a delivery that timed out) ends the session
//! without confirming anything more; the next session starts again from the slot's
//! confirmed position, so a change is published at least once and never skipped.

mod acks;
mod publisher;
pub(crate) mod snapshot;
mod startup;
mod state;
mod streamed;
pub(crate) mod tokenize;

use std::time::{Duration, Instant};

use anyhow::anyhow;
use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot, watch};
use wal2delta_cdc::decoder::{Decoded, Decoder};
use wal2delta_cdc::replication::{
    ConnectParams, ReplicationConnection, ReplicationMessage, ReplicationStream,
};
use wal2delta_cdc::snapshot::create_slot_exporting_snapshot;
use wal2delta_cdc::stream_buffer::{CommittedTx, Routed, StreamBuffer};
use wal2delta_cdc::{slot, source, CdcError};
use wal2delta_model::table::quote_ident;
use wal2delta_model::{ErrorClass, Lsn};
use wal2delta_stream::avro::envelope::SourceInfo;
use wal2delta_stream::producer::{
    is_too_large, Delivery, EventProducer, ProducerSettings, RECORD_OVERHEAD_BYTES,
};
use wal2delta_stream::registry::Registry;
use wal2delta_stream::snapshots::SnapshotProgress;
use wal2delta_stream::StreamError;

use crate::config::Config;
use crate::metrics as m;
use acks::{Acks, Delivered};
use publisher::Publisher;
use snapshot::{SnapshotChunk, SnapshotPlan};
use tokenize::Tokenizer;

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Cdc(#[from] CdcError),
    #[error(transparent)]
    Stream(#[from] StreamError),
    #[error("Kafka did not acknowledge an event: {0}")]
    Delivery(String),
    /// The broker refused a message the producer accepted: the broker's (or the topic's)
    /// `max.message.bytes` is below `[kafka] message_max_bytes`. The next session refuses
    /// events of this size itself, so they go to the DLQ instead of failing again.
    #[error("the broker refused a message of {bytes} bytes as too large: its max.message.bytes (or the topic's) is below [kafka] message_max_bytes; capture now sends events of this size to the DLQ (set message_max_bytes to the broker's limit, see docs/capture.md)")]
    BrokerTooLarge { bytes: usize },
    #[error("{0}")]
    Operator(String),
}

impl SessionError {
    fn class(&self) -> ErrorClass {
        match self {
            SessionError::Cdc(e) => e.class(),
            SessionError::Stream(e) => e.class(),
            SessionError::Delivery(_) | SessionError::BrokerTooLarge { .. } => {
                ErrorClass::Transient
            }
            SessionError::Operator(_) => ErrorClass::Operator,
        }
    }
}

/// Runs capture until `shutdown` turns true. Transient failures restart the session with
/// backoff; operator errors end it with the reason.
pub async fn run(
    config: &Config,
    mut shutdown: watch::Receiver<bool>,
    allow_slot_ahead: bool,
) -> anyhow::Result<()> {
    let mut backoff = Duration::from_millis(500);
    let mut ever_connected = false;
    // The largest message capture sends: `[kafka] message_max_bytes`, lowered for the life
    // of the process when the broker turns out to accept less.
    let mut message_max_bytes = config.kafka.message_max_bytes;
    loop {
        let mut connected = false;
        let limits = Limits { message_max_bytes };
        match session(
            config,
            &mut shutdown,
            &mut connected,
            allow_slot_ahead,
            limits,
        )
        .await
        {
            Ok(()) => return Ok(()),
            Err(e) => {
                ever_connected |= connected;
                let hint = match &e {
                    SessionError::Cdc(c) => c
                        .hint()
                        .map(|h| format!(" (hint: {h})"))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                // At startup an unreachable database is a configuration problem: say so once
                // instead of retrying forever.
                if e.class() != ErrorClass::Transient
                    || (!ever_connected && matches!(e, SessionError::Cdc(CdcError::Connect { .. })))
                {
                    return Err(anyhow!("{e}{hint}"));
                }
                if let SessionError::BrokerTooLarge { bytes } = e {
                    // Refuse this size ourselves from now on (the record overhead is added
                    // back, so an event of exactly `bytes` no longer fits).
                    message_max_bytes = message_max_bytes
                        .min(bytes + RECORD_OVERHEAD_BYTES - 1)
                        .max(MIN_MESSAGE_MAX_BYTES);
                    tracing::error!(bytes, message_max_bytes, "the broker refused a message as too large; lowering capture's message limit for this process");
                }
                metrics::counter!(m::CAPTURE_RESTARTS).increment(1);
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "capture session ended; restarting from the slot's confirmed position");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
                backoff = if connected {
                    Duration::from_millis(500)
                } else {
                    (backoff * 2).min(Duration::from_secs(30))
                };
            }
        }
    }
}

/// Limits a session runs under that earlier sessions of this process may have lowered.
#[derive(Debug, Clone, Copy)]
struct Limits {
    message_max_bytes: usize,
}

/// librdkafka's lowest accepted `message.max.bytes`.
const MIN_MESSAGE_MAX_BYTES: usize = 1_000;

/// The session error for a failed delivery report, `None` when it succeeded.
fn delivery_failed(d: &Delivery) -> Option<SessionError> {
    let e = d.result.as_ref().err()?;
    Some(if is_too_large(e) {
        SessionError::BrokerTooLarge { bytes: d.bytes }
    } else {
        SessionError::Delivery(e.to_string())
    })
}

use wal2delta_model::clock::unix_ms as now_ms;

async fn session(
    config: &Config,
    shutdown: &mut watch::Receiver<bool>,
    connected: &mut bool,
    allow_slot_ahead: bool,
    limits: Limits,
) -> Result<(), SessionError> {
    let dsn = config
        .source
        .effective_dsn()
        .map_err(|e| SessionError::Operator(e.to_string()))?;
    let tokenizer = Tokenizer::from_config(&config.tokenize)
        .map_err(|e| SessionError::Operator(e.to_string()))?;
    let params = ConnectParams::from_dsn(&dsn)?;
    let catalog = source::connect(&dsn).await?;
    let slot_name = &config.source.slot;
    let sender_timeout_ms = slot::wal_sender_timeout_ms(&catalog).await?;
    // Status updates at least three times per wal_sender_timeout, so the server never
    // drops us for silence.
    let mut status_every = Duration::from_millis(config.capture.status_interval_ms);
    if sender_timeout_ms > 0 {
        status_every = status_every
            .min(Duration::from_millis(sender_timeout_ms / 3).max(Duration::from_millis(100)));
    }

    let (producer, mut deliveries) = EventProducer::new(ProducerSettings {
        brokers: config.kafka.brokers.clone(),
        delivery_timeout: Duration::from_millis(config.kafka.delivery_timeout_ms),
        topic_partitions: config.kafka.topic_partitions,
        message_max_bytes: limits.message_max_bytes,
        extra: config.kafka.producer.clone(),
    })?;
    let registry = Registry::new(&config.schema_registry.url)?;
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
    );
    publisher.ensure_dlq_topic().await?;
    publisher.ensure_transactions_topic().await?;
    let positions_topic = config.kafka.positions_topic();
    let snapshots_topic = config.kafka.snapshots_topic();
    publisher
        .producer
        .ensure_compacted_topic(&positions_topic)
        .await?;
    publisher
        .producer
        .ensure_compacted_topic(&snapshots_topic)
        .await?;
    let recorded = recorded_position(config, &positions_topic).await?;

    // The slot: use it, or create it (first start, or re-creation when configured), in
    // which case it exports the snapshot the initial snapshot reads.
    let snapshot_on = config.snapshot.mode == crate::config::SnapshotMode::Initial;
    let info = slot::slot_info(&catalog, slot_name).await?;
    let mut exported = None;
    let mut reset_progress = false;
    let start = match &info {
        Some(i) if !i.is_lost() => {
            let confirmed = i.confirmed_flush.unwrap_or_default();
            check_slot_position(
                config,
                &positions_topic,
                confirmed,
                recorded,
                allow_slot_ahead,
            )?;
            confirmed
        }
        _ => {
            let lost = info.is_some();
            let existed = lost || recorded.is_some();
            if existed && config.source.on_slot_lost != crate::config::OnSlotLost::Recreate {
                return Err(SessionError::Operator(if lost {
                    format!("replication slot {slot_name:?} is invalidated (wal_status = lost): PostgreSQL removed WAL it needed, so changes were lost. Refusing to continue; set [source] on_slot_lost = \"recreate\" to re-create it and re-snapshot every table")
                } else {
                    format!("replication slot {slot_name:?} is gone although wal2delta recorded positions for it (topic {positions_topic}): it was dropped, and changes since may be lost. Refusing to re-create it silently; set [source] on_slot_lost = \"recreate\" to re-create it and re-snapshot every table")
                }));
            }
            if !existed && !snapshot_on {
                return Err(SessionError::Operator(format!(
                    "replication slot {slot_name:?} does not exist: run `wal2delta setup` first"
                )));
            }
            if lost {
                tracing::warn!(slot = %slot_name, "dropping the invalidated slot to re-create it ([source] on_slot_lost = recreate)");
                catalog
                    .execute("SELECT pg_drop_replication_slot($1)", &[slot_name])
                    .await
                    .map_err(CdcError::from)?;
            }
            if existed {
                tracing::warn!(slot = %slot_name, "re-creating the replication slot; every table is snapshotted again");
                reset_progress = true;
            }
            let e = create_slot_exporting_snapshot(&params, slot_name).await?;
            tracing::info!(slot = %slot_name, consistent_point = %e.consistent_point, "created replication slot with an exported snapshot");
            let point = e.consistent_point;
            exported = Some(e);
            record_new_slot(
                config,
                &publisher,
                &mut deliveries,
                &positions_topic,
                &snapshots_topic,
                point,
                reset_progress,
            )
            .await?;
            point
        }
    };

    // The snapshot task, when there is anything to snapshot.
    let (snapshot_tx, mut snapshot_rx) = mpsc::channel::<SnapshotChunk>(2);
    let mut snapshot_task = None;
    let mut snapshot_open = true;
    if snapshot_on || exported.is_some() {
        let progress = if reset_progress {
            Default::default()
        } else {
            let mut p = load_snapshot_progress(config, &snapshots_topic).await?;
            open_sealed_keys(&mut p, slot_name, tokenizer.as_ref());
            p
        };
        let (imported_tx, imported_rx) = oneshot::channel();
        let plan = SnapshotPlan {
            dsn: dsn.clone(),
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
        };
        snapshot_task = Some(tokio::spawn(snapshot::run(plan, snapshot_tx)));
        if let Some(e) = exported.take() {
            // The exporting connection must stay open until the snapshot is imported.
            tokio::time::timeout(Duration::from_secs(60), imported_rx)
                .await
                .map_err(|_| {
                    SessionError::Operator(
                        "the initial snapshot was not imported within 60 s".into(),
                    )
                })?
                .map_err(|_| {
                    SessionError::Cdc(CdcError::Protocol(
                        "the snapshot task ended before importing the snapshot".into(),
                    ))
                })?;
            drop(e);
        }
    } else {
        drop(snapshot_tx);
        snapshot_open = false;
    }

    // Large transactions: PostgreSQL 14+ streams them while in progress (protocol 2) into
    // a disk-backed buffer instead of spilling them on the primary; nothing is published
    // before the commit, and nothing of an aborted transaction ever is.
    let server_version: i32 = catalog
        .query_one("SHOW server_version_num", &[])
        .await
        .map_err(CdcError::from)?
        .get::<_, String>(0)
        .parse()
        .unwrap_or(0);
    let streaming = config.capture.stream_in_progress && server_version >= 140_000;
    let mut buffer = StreamBuffer::new(
        config.capture.spill_dir(slot_name),
        config.capture.stream_memory_bytes,
    )
    .map_err(|e| SessionError::Operator(format!("cannot use [capture] spill_dir: {e}")))?;
    let repl = ReplicationConnection::connect(&params).await?;
    let command = format!(
        "START_REPLICATION SLOT {} LOGICAL {} (\"proto_version\" '{}', {}\"publication_names\" {}, \"messages\" 'true')",
        quote_ident(slot_name),
        start,
        if streaming { 2 } else { 1 },
        if streaming { "\"streaming\" 'on', " } else { "" },
        quote_literal(&quote_ident(&config.source.publication)),
    );
    let mut stream = repl.start_replication(&command).await?;
    *connected = true;
    tracing::info!(slot = %slot_name, start_lsn = %start, status_interval_ms = status_every.as_millis() as u64, "capture streaming");

    let mut state = State {
        acks: Acks::new(
            start,
            Duration::from_millis(config.kafka.delivery_timeout_ms),
        ),
        snapshots_topic,
        decoder: Decoder::new(),
        tokenizer,
        slot: slot_name.clone(),
        positions_topic,
        received: start,
        sent_flush: start,
        last_status: Instant::now(),
        events: 0,
    };
    let mut ticker = tokio::time::interval(status_every);
    let mut health = tokio::time::interval(Duration::from_secs(10));
    let mut wal_rate = slot::WalRate::default();
    // Heartbeats: a non-transactional logical message in the captured database, so the
    // slot has something to confirm even when the database is idle and others are busy.
    let heartbeat_every = Duration::from_millis(config.capture.heartbeat_interval_ms.max(1));
    let mut heartbeat = tokio::time::interval(heartbeat_every);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut progress_at = (Instant::now(), 0u64);
    let max_in_flight = config.capture.max_in_flight;

    loop {
        let can_read = state.acks.in_flight() < max_in_flight;
        tokio::select! {
            biased;
            _ = shutdown.changed() => {
                return drain(&mut state, &mut stream, &mut deliveries, &publisher).await;
            }
            d = deliveries.recv() => {
                let d = d.ok_or_else(|| SessionError::Delivery("delivery channel closed".into()))?;
                match state.acks.on_delivery(d)? {
                    Delivered::Position => state.status(&mut stream, false, status_every).await?,
                    Delivered::Event => state.record_progress(&publisher).await?,
                    Delivered::Other => {}
                }
            }
            _ = ticker.tick() => {
                state.acks.check_timeout()?;
                state.record_position(&publisher).await?;
                state.status(&mut stream, false, status_every).await?;
            }
            _ = health.tick() => {
                report_slot_health(&catalog, slot_name, &mut wal_rate).await;
                let (at, n) = progress_at;
                let rate = (state.events - n) as f64 / at.elapsed().as_secs_f64().max(0.001);
                tracing::info!(confirmed_lsn = %state.acks.confirmed(), in_flight = state.acks.in_flight(), events = state.events, events_per_s = rate as u64, "capture progress");
                progress_at = (Instant::now(), state.events);
            }
            chunk = snapshot_rx.recv(), if snapshot_open && !state.acks.in_transaction() && can_read => {
                match chunk {
                    Some(chunk) => {
                        state.snapshot_chunk(chunk, &mut publisher).await?;
                        // A chunk without events (the end of a table) is complete at once.
                        state.record_progress(&publisher).await?;
                    }
                    None => {
                        // The task ended: with an error, end the session (it restarts and
                        // resumes after the last recorded chunk).
                        if let Some(task) = snapshot_task.take() {
                            match task.await {
                                Ok(Ok(())) => {}
                                Ok(Err(e)) => return Err(SessionError::Cdc(e)),
                                Err(e) => return Err(SessionError::Operator(format!("snapshot task failed: {e}"))),
                            }
                        }
                        // Closed for good: stop polling it (a closed channel is always ready).
                        snapshot_open = false;
                    }
                }
            }
            _ = heartbeat.tick(), if config.capture.heartbeat_interval_ms > 0 => {
                match catalog.execute("SELECT pg_logical_emit_message(false, 'wal2delta.heartbeat', now()::text)", &[]).await {
                    Ok(_) => metrics::counter!(m::CAPTURE_HEARTBEATS).increment(1),
                    Err(error) => tracing::warn!(error = %error, "cannot write heartbeat"),
                }
            }
            msg = stream.next(), if can_read => {
                match msg? {
                    None => return Err(SessionError::Cdc(CdcError::Protocol("server ended the replication stream".into()))),
                    Some(ReplicationMessage::Keepalive { wal_end, reply_requested }) => {
                        if buffer.open_transactions() == 0 {
                            state.acks.idle_advance(wal_end);
                        }
                        state.received = state.received.max(wal_end);
                        if reply_requested {
                            state.status(&mut stream, true, status_every).await?;
                        }
                    }
                    Some(ReplicationMessage::XLogData { wal_start, wal_end, data }) => {
                        state.received = state.received.max(wal_end);
                        let routed = match buffer.on_message(wal_start, data) {
                            Ok(r) => r,
                            // Scratch-file I/O is retried with a new session; anything else
                            // means the server's stream made no sense.
                            Err(e) if e.class() == ErrorClass::Transient => return Err(SessionError::Delivery(e.to_string())),
                            Err(e) => return Err(SessionError::Cdc(CdcError::Protocol(e.to_string()))),
                        };
                        match routed {
                            Routed::Schema { xid, message } => state.decoder.stream_schema(xid, message),
                            Routed::Pass(parsed) => {
                                let decoded = state.decoder.decode(&catalog, parsed, wal_start).await?;
                                // A non-transactional message (a heartbeat) outside any transaction:
                                // everything up to it has been handled, so the slot may move there.
                                if matches!(decoded, Decoded::Message { transactional: false, .. })
                                    && !state.acks.in_transaction()
                                    && buffer.open_transactions() == 0
                                {
                                    state.acks.idle_advance(wal_end);
                                    publisher.watermark(wal_end.0).await?;
                                }
                                state.handle(decoded, &mut publisher).await?;
                            }
                            Routed::Buffered => {}
                            Routed::Aborted { xid, subxid, dropped } => {
                                if xid == subxid {
                                    state.decoder.stream_aborted(xid);
                                }
                                metrics::counter!(m::CAPTURE_STREAMED_ABORTED).increment(1);
                                tracing::debug!(dropped, "streamed transaction aborted; nothing of it is published");
                            }
                            Routed::Commit(tx) => {
                                replay_streamed(tx, &mut state, &catalog, &mut publisher, &mut stream, &mut deliveries, max_in_flight, status_every).await?;
                            }
                        }
                        metrics::gauge!(m::CAPTURE_STREAM_BUFFER_BYTES).set(buffer.buffered_bytes() as f64);
                    }
                }
            }
        }
        metrics::gauge!(m::CAPTURE_IN_FLIGHT).set(state.acks.in_flight() as f64);
    }
}

use startup::{
    check_slot_position, load_snapshot_progress, open_sealed_keys, quote_literal, record_new_slot,
    recorded_position, report_slot_health,
};
use state::State;
use streamed::{drain, replay_streamed};
