//! What a session checks before streaming: the position log, snapshot progress, slot
//! health figures.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use wal2delta_cdc::{slot, CdcError};
use wal2delta_model::clock::unix_ms as now_ms;
use wal2delta_model::Lsn;
use wal2delta_stream::snapshots::SnapshotProgress;

use super::error::SessionError;
use super::publisher::Publisher;
use super::tokenize::Tokenizer;
use crate::config::Config;
use crate::metrics as m;

/// What the slot watch saw last, so each change is logged once, not every sample.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotSeen {
    #[default]
    NotYet,
    Present,
    Lost,
    Missing,
}

pub(super) async fn report_slot_health(
    catalog: &tokio_postgres::Client,
    slot_name: &str,
    rate: &mut slot::WalRate,
    seen: &mut SlotSeen,
) {
    let now = match slot::slot_info(catalog, slot_name).await {
        Ok(Some(info)) => {
            let wal_rate = rate.sample(Instant::now(), info.current_wal);
            crate::health::export(&info, wal_rate);
            if info.is_lost() {
                SlotSeen::Lost
            } else {
                SlotSeen::Present
            }
        }
        Ok(None) => {
            // Nothing serves a slot that is not there.
            metrics::gauge!(m::SLOT_ACTIVE).set(0.0);
            SlotSeen::Missing
        }
        Err(error) => {
            tracing::warn!(error = %error, "cannot read slot health");
            return;
        }
    };
    match (*seen, now) {
        (before, SlotSeen::Lost) if before != SlotSeen::Lost => {
            tracing::error!(slot = %slot_name, "replication slot invalidated (wal_status = lost)")
        }
        (SlotSeen::Present | SlotSeen::Lost, SlotSeen::Missing) => {
            tracing::error!(slot = %slot_name, "replication slot disappeared")
        }
        (SlotSeen::NotYet, SlotSeen::Missing) => {
            tracing::info!(slot = %slot_name, "the replication slot does not exist yet (capture creates it)")
        }
        _ => {}
    }
    *seen = now;
}

/// The last position capture recorded for this slot in the position log.
pub(super) async fn recorded_position(
    config: &Config,
    topic: &str,
) -> Result<Option<Lsn>, SessionError> {
    let (kafka, t, slot, source) = (
        config.kafka.connection()?,
        topic.to_owned(),
        config.source.slot.clone(),
        config.source.identity(),
    );
    Ok(tokio::task::spawn_blocking(move || {
        wal2delta_stream::positions::last_position(&kafka, &t, &slot, &source)
    })
    .await
    .map_err(SessionError::task("position check"))??)
}

/// Snapshot progress recorded in Kafka, by table.
pub(super) async fn load_snapshot_progress(
    config: &Config,
    topic: &str,
) -> Result<HashMap<String, SnapshotProgress>, SessionError> {
    let (kafka, t, slot) = (
        config.kafka.connection()?,
        topic.to_owned(),
        config.source.slot.clone(),
    );
    Ok(
        tokio::task::spawn_blocking(move || wal2delta_stream::snapshots::load(&kafka, &t, &slot))
            .await
            .map_err(SessionError::task("snapshot progress"))??,
    )
}

/// Opens sealed last keys (tables with tokenized columns). A key that cannot be opened
/// (the tokenization key was rotated, or no tokenizer is configured any more) restarts
/// that table's snapshot from its first row: reading rows twice is harmless, skipping
/// them is not.
pub(super) fn open_sealed_keys(
    progress: &mut HashMap<String, SnapshotProgress>,
    slot: &str,
    tokenizer: Option<&Tokenizer>,
) {
    for p in progress.values_mut() {
        let Some(sealed) = p.last_key_sealed.take() else {
            continue;
        };
        let aad = SnapshotProgress::key(slot, &p.table);
        let opened = tokenizer
            .and_then(|t| t.open(&aad, &sealed))
            .and_then(|plain| serde_json::from_slice::<Vec<String>>(&plain).ok());
        match opened {
            Some(key) => p.last_key = Some(key),
            None if p.is_done() => {}
            None => {
                tracing::warn!(table = %p.table, "cannot open the sealed snapshot position (tokenization key changed?): the table's snapshot starts again from its first row");
                p.last_key = None;
                p.rows_done = 0;
            }
        }
    }
}

/// Refuses to start when the slot is ahead of the last position capture recorded in Kafka
/// (see `wal2delta_stream::positions`), unless `allow` (`run --allow-slot-ahead`).
pub(super) fn check_slot_position(
    config: &Config,
    topic: &str,
    slot_confirmed: Lsn,
    recorded: Option<Lsn>,
    allow: bool,
) -> Result<(), SessionError> {
    match recorded {
        None => {
            tracing::info!(topic = %topic, "no position recorded yet for this slot; first start")
        }
        Some(recorded) if slot_confirmed > recorded => {
            if !allow {
                return Err(SessionError::SlotAhead {
                    slot: config.source.slot.clone(),
                    confirmed: slot_confirmed,
                    recorded,
                    topic: topic.to_owned(),
                });
            }
            tracing::warn!(slot_confirmed = %slot_confirmed, recorded = %recorded, "slot ahead of the position log; continuing because --allow-slot-ahead was given");
        }
        Some(recorded) => {
            tracing::info!(slot_confirmed = %slot_confirmed, recorded = %recorded, "slot position matches the position log")
        }
    }
    Ok(())
}

/// Where streaming resumes on an existing slot: the slot's confirmed position, or the
/// position log's when that is further on.
///
/// PostgreSQL 15 and older write a slot's confirmed position to disk only when its
/// `restart_lsn` or `catalog_xmin` moves too, so any restart (even `-m fast`) can rewind
/// the slot to a position capture confirmed long ago; streaming from there would publish
/// again, at new offsets, every transaction Kafka already holds (a 1,000,000-row
/// transaction included). The position log records a position only once Kafka
/// acknowledged every event of every transaction committed before it, so starting there
/// is safe: PostgreSQL skips the transactions whose commit lies before the start it is
/// given, and still decodes from the slot's `restart_lsn`, so a transaction open across
/// the position arrives whole. The one case where the recorded position is not used:
/// when it lies beyond the WAL the server has flushed (a server restored from a backup, or
/// WAL lost with its host), transactions there would be new ones under old positions, so
/// capture starts at the slot's own position and publishes copies rather than skip them.
pub(super) async fn resume_point(
    catalog: &tokio_postgres::Client,
    slot_name: &str,
    confirmed: Lsn,
    recorded: Option<Lsn>,
) -> Result<Lsn, SessionError> {
    let Some(recorded) = recorded.filter(|r| *r > confirmed) else {
        return Ok(confirmed);
    };
    let flushed: String = catalog
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
             ELSE pg_current_wal_flush_lsn() END)::text",
            &[],
        )
        .await
        .map_err(CdcError::from)?
        .get(0);
    let flushed: Option<Lsn> = flushed.parse().ok();
    if flushed.is_some_and(|f| recorded <= f) {
        tracing::info!(slot = %slot_name, slot_confirmed = %confirmed, recorded = %recorded, "the slot's confirmed position is behind the position log (PostgreSQL rewinds it on a restart); resuming at the recorded position, since Kafka holds every transaction committed before it");
        Ok(recorded)
    } else {
        tracing::warn!(slot = %slot_name, slot_confirmed = %confirmed, recorded = %recorded, server_flushed = ?flushed.map(|f| f.to_string()), "the position log is beyond the WAL this server has flushed (restored from a backup?); resuming at the slot's position, so transactions after it may be published again");
        Ok(confirmed)
    }
}

pub(super) fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// After this session created the slot: records its consistent point in the position log
/// (so a crash before the first confirmation is not mistaken, at the next start, for a
/// slot moved behind capture's back) and, when the slot was re-created, marks every
/// table's snapshot to be done again (so a crash during the re-snapshot cannot leave a
/// table counted as done from the old slot). Waits until Kafka acknowledged all of it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn record_new_slot(
    config: &Config,
    publisher: &Publisher,
    deliveries: &mut mpsc::UnboundedReceiver<wal2delta_stream::producer::Delivery>,
    positions_topic: &str,
    snapshots_topic: &str,
    point: Lsn,
    reset: bool,
) -> Result<(), SessionError> {
    let slot = &config.source.slot;
    publisher
        .record_position(positions_topic, slot, point, now_ms())
        .await?;
    let mut expected = 1;
    if reset {
        for old in load_snapshot_progress(config, snapshots_topic)
            .await?
            .into_values()
        {
            let p = SnapshotProgress {
                state: "reset".into(),
                // Kept across restarts, so that a resumed re-snapshot still ends with its
                // snapshot-end event.
                resnapshot_from: Some(wal2delta_cdc::snapshot::rows_position(point).0),
                condition: None,
                last_key: None,
                last_key_sealed: None,
                rows_done: 0,
                ts_ms: now_ms(),
                ..old
            };
            let key = SnapshotProgress::key(slot, &p.table);
            publisher
                .producer
                .send(
                    snapshots_topic,
                    Some(0),
                    Some(key.as_bytes()),
                    &p.to_json(),
                    wal2delta_stream::transaction_acks::DeliveryTag::SnapshotProgress,
                )
                .await?;
            expected += 1;
        }
    }
    publisher.producer.flush(Duration::from_secs(30));
    let mut acknowledged = 0;
    while acknowledged < expected {
        match tokio::time::timeout(Duration::from_secs(5), deliveries.recv()).await {
            Ok(Some(d)) => {
                if let Some(e) = SessionError::of_delivery(&d) {
                    return Err(e);
                }
                acknowledged += 1;
            }
            Ok(None) => return Err(SessionError::DeliveriesClosed),
            Err(_) => return Err(SessionError::DeliveryTimeout(Duration::from_secs(5))),
        }
    }
    Ok(())
}
