//! Publishing streamed (large) transactions at their commit, and the graceful drain.

use super::*;

/// Publishes a streamed transaction at its commit, reading it back from the buffer.
///
/// Deliveries are handled while replaying so at most `max_in_flight` events wait for
/// Kafka, and status updates keep the walsender from timing out on a long replay.
#[allow(clippy::too_many_arguments)]
pub(super) async fn replay_streamed(
    mut tx: CommittedTx,
    state: &mut State,
    catalog: &tokio_postgres::Client,
    publisher: &mut Publisher,
    stream: &mut ReplicationStream,
    deliveries: &mut tokio::sync::mpsc::UnboundedReceiver<wal2delta_stream::producer::Delivery>,
    max_in_flight: usize,
    status_every: Duration,
) -> Result<(), SessionError> {
    tracing::info!(
        xid = tx.xid,
        messages = tx.message_count(),
        spilled = tx.spilled(),
        "publishing a streamed transaction"
    );
    state
        .decoder
        .begin_transaction(tx.xid, tx.commit_lsn, tx.commit_ts);
    state.acks.begin();
    let mut last_status = Instant::now();
    while let Some(item) = tx.next_message() {
        let (lsn, msg) = item.map_err(|e| match e.class() {
            ErrorClass::Transient => SessionError::Delivery(e.to_string()),
            _ => SessionError::Cdc(CdcError::Protocol(e.to_string())),
        })?;
        let decoded = state.decoder.decode(catalog, msg, lsn).await?;
        state.handle(decoded, publisher).await?;
        // Take what Kafka acknowledged; wait when too much is in flight.
        loop {
            while let Ok(d) = deliveries.try_recv() {
                state.acks.on_delivery(d)?;
            }
            if state.acks.in_flight() < max_in_flight {
                break;
            }
            // librdkafka never times out (see `acks::DeliveryWatch`): bound the wait here.
            match tokio::time::timeout(state.acks.watch.timeout, deliveries.recv()).await {
                Ok(Some(d)) => {
                    state.acks.on_delivery(d)?;
                }
                Ok(None) => return Err(SessionError::Delivery("delivery channel closed".into())),
                Err(_) => {
                    return Err(SessionError::Delivery(format!(
                        "Kafka acknowledged nothing for {} ms while events were in flight ([kafka] delivery_timeout_ms)",
                        state.acks.watch.timeout.as_millis()
                    )))
                }
            }
        }
        if last_status.elapsed() >= status_every {
            state.status(stream, true, status_every).await?;
            last_status = Instant::now();
        }
    }
    state.commit(tx.end_lsn, publisher).await
}

/// Graceful stop: read nothing more, wait for outstanding deliveries, confirm what is
/// acknowledged, and return.
pub(super) async fn drain(
    state: &mut State,
    stream: &mut ReplicationStream,
    deliveries: &mut tokio::sync::mpsc::UnboundedReceiver<wal2delta_stream::producer::Delivery>,
    publisher: &Publisher,
) -> Result<(), SessionError> {
    tracing::info!(in_flight = state.acks.in_flight(), "draining capture");
    publisher.producer.flush(Duration::from_secs(30));
    // A failed delivery acknowledges nothing, and the slot stays behind it: the next start
    // sends it again. The drain goes on with the rest.
    let mut take = |state: &mut State| {
        while let Ok(d) = deliveries.try_recv() {
            if let Err(e) = state.acks.on_delivery(d) {
                tracing::warn!(error = %e, "a delivery failed while draining; the slot stays behind it");
            }
        }
    };
    take(state);
    // Record the final position, wait for it, then confirm it.
    state.record_position(publisher).await?;
    publisher.producer.flush(Duration::from_secs(10));
    take(state);
    state.status(stream, true, Duration::ZERO).await?;
    tracing::info!(confirmed_lsn = %state.acks.confirmed(), "capture stopped");
    Ok(())
}
