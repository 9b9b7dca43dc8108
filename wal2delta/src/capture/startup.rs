//! What a session checks before streaming: the position log, snapshot progress, slot
//! health figures.

use super::*;

pub(super) async fn report_slot_health(
    catalog: &tokio_postgres::Client,
    slot_name: &str,
    rate: &mut slot::WalRate,
) {
    match slot::slot_info(catalog, slot_name).await {
        Ok(Some(info)) => {
            let wal_rate = rate.sample(Instant::now(), info.current_wal);
            crate::health::export(&info, wal_rate);
            if info.is_lost() {
                tracing::error!(slot = %slot_name, "replication slot invalidated (wal_status = lost)");
            }
        }
        Ok(None) => tracing::error!(slot = %slot_name, "replication slot disappeared"),
        Err(error) => tracing::warn!(error = %error, "cannot read slot health"),
    }
}

/// The last position capture recorded for this slot in the position log.
pub(super) async fn recorded_position(
    config: &Config,
    topic: &str,
) -> Result<Option<Lsn>, SessionError> {
    let (brokers, t, slot) = (
        config.kafka.brokers.clone(),
        topic.to_owned(),
        config.source.slot.clone(),
    );
    Ok(tokio::task::spawn_blocking(move || {
        wal2delta_stream::positions::last_position(&brokers, &t, &slot)
    })
    .await
    .map_err(|e| SessionError::Operator(format!("position check failed: {e}")))??)
}

/// Snapshot progress recorded in Kafka, by table.
pub(super) async fn load_snapshot_progress(
    config: &Config,
    topic: &str,
) -> Result<HashMap<String, SnapshotProgress>, SessionError> {
    let (brokers, t, slot) = (
        config.kafka.brokers.clone(),
        topic.to_owned(),
        config.source.slot.clone(),
    );
    Ok(
        tokio::task::spawn_blocking(move || wal2delta_stream::snapshots::load(&brokers, &t, &slot))
            .await
            .map_err(|e| {
                SessionError::Operator(format!("reading snapshot progress failed: {e}"))
            })??,
    )
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
            let msg = format!(
                "slot {:?} is confirmed at {slot_confirmed}, ahead of the last position wal2delta recorded in Kafka ({recorded}, topic {topic}): \
                 changes in between may never have reached Kafka (another consumer used the slot, the slot was advanced by hand, or Kafka lost data). \
                 Check, then start once with `wal2delta run --allow-slot-ahead` to accept the gap",
                config.source.slot
            );
            if !allow {
                return Err(SessionError::Operator(msg));
            }
            tracing::warn!(slot_confirmed = %slot_confirmed, recorded = %recorded, "slot ahead of the position log; continuing because --allow-slot-ahead was given");
        }
        Some(recorded) => {
            tracing::info!(slot_confirmed = %slot_confirmed, recorded = %recorded, "slot position matches the position log")
        }
    }
    Ok(())
}

pub(super) fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
