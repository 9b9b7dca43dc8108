//! Every metric name wal2delta exports, in one place, and the Prometheus endpoint.

use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

/// Change events published to Kafka, by table and op.
pub const CAPTURE_EVENTS: &str = "wal2delta_capture_events_total";
/// Events sent to the dead-letter topic, by table and reason kind.
pub const CAPTURE_DLQ_EVENTS: &str = "wal2delta_capture_dlq_events_total";
/// Transactions whose every event Kafka acknowledged.
pub const CAPTURE_TRANSACTIONS: &str = "wal2delta_capture_transactions_total";
/// Events sent and not yet acknowledged by Kafka.
pub const CAPTURE_IN_FLIGHT: &str = "wal2delta_capture_in_flight_events";
/// The LSN confirmed to the slot, as a number (bytes).
pub const CAPTURE_CONFIRMED_LSN: &str = "wal2delta_capture_confirmed_lsn";
/// Capture sessions restarted after a transient failure.
pub const CAPTURE_RESTARTS: &str = "wal2delta_capture_restarts_total";
/// Schemas the registry refused, by table.
pub const CAPTURE_SCHEMA_REFUSED: &str = "wal2delta_capture_schema_refused_total";
/// WAL bytes between the server's current position and the slot's confirmed position.
pub const SLOT_LAG_BYTES: &str = "wal2delta_slot_lag_bytes";
/// WAL bytes the slot makes the server retain (current − restart_lsn).
pub const SLOT_RETAINED_BYTES: &str = "wal2delta_slot_retained_bytes";
/// `safe_wal_size` of the slot: bytes that can still be written before it is invalidated
/// (absent when `max_slot_wal_keep_size` is unlimited).
pub const SLOT_SAFE_WAL_SIZE_BYTES: &str = "wal2delta_slot_safe_wal_size_bytes";
/// 1 when the slot's wal_status is `lost`.
pub const SLOT_LOST: &str = "wal2delta_slot_lost";

/// Starts the Prometheus text endpoint.
pub fn install(listen: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = listen.parse()?;
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|e| anyhow::anyhow!("cannot serve metrics on {addr} ([metrics] listen): {e}"))?;
    Ok(())
}
