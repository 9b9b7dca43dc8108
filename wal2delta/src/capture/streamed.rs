//! Publishing streamed (large) transactions at their commit, and the graceful drain.

use std::time::{Duration, Instant};

use wal2delta_cdc::stream_buffer::CommittedTx;

use super::error::SessionError;
use super::session::Session;

impl Session<'_> {
    /// Publishes a streamed transaction at its commit, reading it back from the buffer.
    ///
    /// Deliveries are handled while replaying so at most `max_in_flight` events wait for
    /// Kafka, and status updates keep the walsender from timing out on a long replay.
    pub(super) async fn replay_streamed(
        &mut self,
        mut tx: CommittedTx,
    ) -> Result<(), SessionError> {
        tracing::info!(
            xid = tx.xid,
            messages = tx.message_count(),
            spilled = tx.spilled(),
            "publishing a streamed transaction"
        );
        self.state
            .decoder
            .begin_transaction(tx.xid, tx.commit_lsn, tx.commit_ts);
        self.state.acks.begin();
        let mut last_status = Instant::now();
        while let Some(item) = tx.next_message() {
            let (lsn, msg) = item?;
            let decoded = self.state.decoder.decode(&self.catalog, msg, lsn).await?;
            self.state.handle(decoded, &mut self.publisher).await?;
            // Take what Kafka acknowledged; wait when too much is in flight.
            loop {
                while let Ok(d) = self.deliveries.try_recv() {
                    self.state.acks.on_delivery(d)?;
                }
                if self.state.acks.in_flight() < self.max_in_flight {
                    break;
                }
                // librdkafka never times out (see `acks::DeliveryWatch`): bound the wait here.
                let limit = self.state.acks.watch.timeout;
                match tokio::time::timeout(limit, self.deliveries.recv()).await {
                    Ok(Some(d)) => {
                        self.state.acks.on_delivery(d)?;
                    }
                    Ok(None) => return Err(SessionError::DeliveriesClosed),
                    Err(_) => return Err(SessionError::DeliveryTimeout(limit)),
                }
            }
            if last_status.elapsed() >= self.status_every {
                self.state
                    .status(&mut self.stream, true, self.status_every)
                    .await?;
                last_status = Instant::now();
            }
        }
        self.state.commit(tx.end_lsn, &mut self.publisher).await
    }

    /// Graceful stop: read nothing more, wait for outstanding deliveries, confirm what is
    /// acknowledged, and return.
    pub(super) async fn drain(&mut self) -> Result<(), SessionError> {
        tracing::info!(in_flight = self.state.acks.in_flight(), "draining capture");
        self.publisher.producer.flush(Duration::from_secs(30));
        // A failed delivery acknowledges nothing, and the slot stays behind it: the next
        // start sends it again. The drain goes on with the rest.
        self.take_deliveries_while_draining();
        // Record the final position, wait for it, then confirm it.
        self.state.record_position(&self.publisher).await?;
        self.publisher
            .producer
            .flush(wal2delta_stream::KAFKA_REQUEST_TIMEOUT);
        self.take_deliveries_while_draining();
        self.state
            .status(&mut self.stream, true, Duration::ZERO)
            .await?;
        tracing::info!(confirmed_lsn = %self.state.acks.confirmed(), "capture stopped");
        Ok(())
    }

    fn take_deliveries_while_draining(&mut self) {
        while let Ok(d) = self.deliveries.try_recv() {
            if let Err(e) = self.state.acks.on_delivery(d) {
                tracing::warn!(error = %e, "a delivery failed while draining; the slot stays behind it");
            }
        }
    }
}
