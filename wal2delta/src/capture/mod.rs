//! The capture stage: PostgreSQL slot → Avro events on Kafka.
//!
//! One session reads the slot from its confirmed position, publishes every change, and
//! confirms to PostgreSQL only what [`acks::Acks`] releases: the end LSN of transactions
//! whose every event (dead letters included) Kafka acknowledged. Any transient failure
//! (broker or registry down, connection lost, a delivery that timed out) ends the session
//! without confirming anything more; the next session starts again from the slot's
//! confirmed position, so a change is published at least once and never skipped.

mod acks;
mod error;
mod exclude;
mod publisher;
pub mod request;
mod session;
pub(crate) mod snapshot;
mod startup;
mod state;
mod streamed;
pub(crate) mod tokenize;

use std::time::Duration;

use tokio::sync::watch;
use wal2delta_cdc::{slot, source, CdcError};
use wal2delta_stream::producer::RECORD_OVERHEAD_BYTES;

use crate::config::Config;
use crate::supervisor::{Next, Supervisor};
use error::SessionError;

/// Runs capture until `shutdown` turns true, under its [`Supervisor`]: transient failures
/// start a new session from the slot's confirmed position; operator errors stop the stage
/// with the reason.
pub async fn run(
    config: &Config,
    supervisor: Supervisor,
    mut shutdown: watch::Receiver<bool>,
    allow_slot_ahead: bool,
) -> anyhow::Result<()> {
    let mut ever_connected = false;
    // The largest message capture sends: `[kafka] message_max_bytes`, lowered for the life
    // of the process when the broker turns out to accept less.
    let mut message_max_bytes = config.kafka.message_max_bytes;
    loop {
        let mut connected = false;
        let limits = Limits { message_max_bytes };
        let result = session::session(
            config,
            &supervisor,
            &mut shutdown,
            &mut connected,
            allow_slot_ahead,
            limits,
        )
        .await;
        ever_connected |= connected;
        let e = match result {
            Ok(()) => {
                supervisor.stopped();
                return Ok(());
            }
            // At startup an unreachable database is a configuration problem: say so once
            // instead of retrying forever.
            Err(SessionError::Cdc(e @ CdcError::Connect { .. })) if !ever_connected => {
                SessionError::NeverConnected(e)
            }
            Err(e) => e,
        };
        if let SessionError::BrokerTooLarge { bytes } = e {
            // Refuse this size ourselves from now on (the record overhead is added back, so
            // an event of exactly `bytes` no longer fits).
            message_max_bytes = message_max_bytes
                .min(bytes + RECORD_OVERHEAD_BYTES - 1)
                .max(MIN_MESSAGE_MAX_BYTES);
            tracing::error!(bytes, message_max_bytes, "the broker refused a message as too large; lowering capture's message limit for this process");
        }
        match supervisor.failed(&e, &mut shutdown).await {
            Next::Retry => {}
            Next::Shutdown => return Ok(()),
            Next::Stop(e) => return Err(e),
        }
    }
}

/// How often [`watch_slot`] samples the slot.
const SLOT_HEALTH_EVERY: Duration = Duration::from_secs(10);

/// Samples the slot's health ([`crate::health`]) every [`SLOT_HEALTH_EVERY`] for as long as
/// the daemon runs the capture stage, whether a session runs or not: a slot nobody reads
/// (capture retrying, or stopped for an operator) shows as inactive
/// (`wal2delta_slot_active` 0) while its lag and retained WAL keep growing in the metrics.
/// Its own connection, so a session's failure never stops it.
pub async fn watch_slot(config: &Config) -> std::convert::Infallible {
    let mut every = tokio::time::interval(SLOT_HEALTH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rate = slot::WalRate::default();
    let mut catalog: Option<tokio_postgres::Client> = None;
    let mut reachable = true;
    let mut seen = SlotSeen::default();
    loop {
        every.tick().await;
        if catalog
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            let connected = match config.source.effective_dsn() {
                Ok(dsn) => source::connect(&dsn).await.map_err(anyhow::Error::from),
                Err(e) => Err(e.into()),
            };
            catalog = match connected {
                Ok(client) => Some(client),
                Err(error) => {
                    // Said once per outage: the slot metrics keep their last values meanwhile.
                    if reachable {
                        tracing::warn!(error = %error, "cannot read slot health: the slot metrics are not updated until the source is reachable");
                    }
                    None
                }
            };
            reachable = catalog.is_some();
        }
        if let Some(client) = &catalog {
            report_slot_health(client, &config.source.slot, &mut rate, &mut seen).await;
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

use startup::{report_slot_health, SlotSeen};
