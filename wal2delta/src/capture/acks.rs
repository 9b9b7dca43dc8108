//! Capture's acknowledgement path, in one owner: what was sent under which token, what
//! Kafka acknowledged, and so which LSN the slot may be confirmed to.
//!
//! Invariant (docs/architecture.md, promise 1): PostgreSQL is told an LSN only when every
//! event of every transaction up to it is acknowledged by Kafka ([`AckTracker`]) *and* the
//! position log holds that LSN (so a restart never finds the slot ahead of the log). Every
//! path that publishes (the select loop, a streamed transaction's replay, a snapshot chunk,
//! the drain) counts what it sent with [`Acks::sent`], ends a transaction with
//! [`Acks::commit`], and hands every delivery report to [`Acks::on_delivery`]; nothing else
//! touches the tracker.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use wal2delta_model::Lsn;
use wal2delta_stream::producer::Delivery;
use wal2delta_stream::snapshots::SnapshotProgress;
use wal2delta_stream::transaction_acks::{AckToken, AckTracker, DeliveryTag};

use super::SessionError;
use crate::metrics as m;

/// What a delivery report moved, so the session knows what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivered {
    /// The position log moved: PostgreSQL may be told more.
    Position,
    /// An event: a transaction or a snapshot chunk may be complete.
    Event,
    /// A record that holds nothing (watermark, snapshot progress).
    Other,
}

pub(super) struct Acks {
    tracker: AckTracker,
    /// The open transaction's token, between Begin and Commit.
    open: Option<AckToken>,
    /// The highest LSN the position log holds (acknowledged by Kafka); PostgreSQL is
    /// never told more than this.
    position_acked: Lsn,
    /// A position record sent and not yet acknowledged.
    position_in_flight: Option<Lsn>,
    /// Snapshot chunks not yet fully acknowledged: events pending and the progress to
    /// record once they are.
    snapshot_chunks: VecDeque<(AckToken, usize, SnapshotProgress)>,
    /// Progress of chunks that are in Kafka, to record.
    progress_ready: Vec<SnapshotProgress>,
    pub(super) watch: DeliveryWatch,
}

impl Acks {
    /// Starts from the slot's confirmed position, which the position log holds already.
    pub(super) fn new(start: Lsn, delivery_timeout: Duration) -> Self {
        Acks {
            tracker: AckTracker::new(start),
            open: None,
            position_acked: start,
            position_in_flight: None,
            snapshot_chunks: VecDeque::new(),
            progress_ready: Vec::new(),
            watch: DeliveryWatch::new(delivery_timeout),
        }
    }

    /// Opens a source transaction (a Begin, or a streamed transaction's replay).
    pub(super) fn begin(&mut self) -> AckToken {
        let token = self.tracker.begin();
        self.open = Some(token);
        token
    }

    /// The open transaction's token; a change outside one is a protocol error.
    pub(super) fn open_token(&self) -> Result<AckToken, SessionError> {
        self.open.ok_or_else(|| {
            SessionError::Cdc(wal2delta_cdc::CdcError::Protocol(
                "change outside a transaction".into(),
            ))
        })
    }

    pub(super) fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Records `n` messages sent under `token`.
    pub(super) fn sent(&mut self, token: AckToken, n: usize) {
        for _ in 0..n {
            self.tracker.sent(token);
        }
    }

    /// The open transaction's commit has been read (and its END record sent): it may be
    /// released once Kafka acknowledged all of it and everything before it.
    pub(super) fn commit(&mut self, end_lsn: Lsn) -> Result<(), SessionError> {
        let token = self.open_token()?;
        self.seal(token, end_lsn);
        self.open = None;
        Ok(())
    }

    /// Seals a snapshot chunk published under `token` (from [`Self::begin_chunk`]). It never
    /// moves the slot (sealed at 0/0); `progress` is recorded once Kafka has all of it,
    /// and only after every earlier chunk's.
    pub(super) fn chunk_sent(&mut self, token: AckToken, progress: SnapshotProgress) {
        let pending = self.tracker.pending(token);
        self.seal(token, Lsn::ZERO);
        self.snapshot_chunks.push_back((token, pending, progress));
        self.complete_snapshot_chunks();
    }

    /// A token for a snapshot chunk (not a source transaction: the open one is untouched).
    pub(super) fn begin_chunk(&mut self) -> AckToken {
        self.tracker.begin()
    }

    fn seal(&mut self, token: AckToken, end_lsn: Lsn) {
        let before = self.tracker.open_transactions();
        self.tracker.seal(token, end_lsn);
        self.count_released(before);
    }

    fn count_released(&mut self, before: usize) {
        let released = before - self.tracker.open_transactions();
        if released > 0 {
            metrics::counter!(m::CAPTURE_TRANSACTIONS).increment(released as u64);
            metrics::gauge!(m::CAPTURE_CONFIRMED_LSN).set(self.tracker.confirmed().0 as f64);
        }
    }

    /// Applies one delivery report. A failed delivery ends the session (nothing after it
    /// may be confirmed; the next session resends from the slot).
    pub(super) fn on_delivery(&mut self, d: Delivery) -> Result<Delivered, SessionError> {
        self.watch.report();
        if let Some(e) = SessionError::of_delivery(&d) {
            return Err(e);
        }
        Ok(match d.tag {
            DeliveryTag::Position => {
                if let Some(lsn) = self.position_in_flight.take() {
                    self.position_acked = self.position_acked.max(lsn);
                }
                Delivered::Position
            }
            DeliveryTag::Event(token) => {
                if let Some((_, pending, _)) = self
                    .snapshot_chunks
                    .iter_mut()
                    .find(|(t, _, _)| *t == token)
                {
                    *pending = pending.saturating_sub(1);
                    self.complete_snapshot_chunks();
                }
                let before = self.tracker.open_transactions();
                self.tracker.acked(token);
                self.count_released(before);
                Delivered::Event
            }
            DeliveryTag::SnapshotProgress | DeliveryTag::Watermark => Delivered::Other,
        })
    }

    /// Moves the progress of fully acknowledged chunks, in chunk order, to be recorded.
    fn complete_snapshot_chunks(&mut self) {
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

    /// Progress of chunks Kafka holds in full, to record now.
    pub(super) fn take_progress(&mut self) -> Vec<SnapshotProgress> {
        std::mem::take(&mut self.progress_ready)
    }

    /// The LSN to write to the position log now, if it moved and no record is on its way;
    /// the caller sends it and calls [`Self::position_sent`].
    pub(super) fn position_to_record(&self) -> Option<Lsn> {
        let target = self.tracker.confirmed();
        (target > self.position_acked && self.position_in_flight.is_none()).then_some(target)
    }

    pub(super) fn position_sent(&mut self, lsn: Lsn) {
        self.position_in_flight = Some(lsn);
    }

    /// The LSN PostgreSQL may be told: acknowledged by Kafka and held by the position log.
    pub(super) fn flushable(&self) -> Lsn {
        self.tracker.confirmed().min(self.position_acked)
    }

    /// When nothing is open or in flight, everything the server sent up to `wal_end` has
    /// been handled (see [`AckTracker::idle_advance`]).
    pub(super) fn idle_advance(&mut self, wal_end: Lsn) {
        if self.open.is_none() {
            self.tracker.idle_advance(wal_end);
        }
    }

    pub(super) fn confirmed(&self) -> Lsn {
        self.tracker.confirmed()
    }

    pub(super) fn in_flight(&self) -> usize {
        self.tracker.in_flight()
    }

    /// Whether anything sent waits for Kafka (for the delivery timeout).
    pub(super) fn waiting(&self) -> bool {
        self.tracker.in_flight() > 0 || self.position_in_flight.is_some()
    }

    /// Fails when something has waited `[kafka] delivery_timeout_ms` without a report.
    pub(super) fn check_timeout(&mut self) -> Result<(), SessionError> {
        let waiting = self.waiting();
        self.watch.check(waiting)
    }
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
    fn new(timeout: Duration) -> Self {
        DeliveryWatch {
            timeout,
            reports: 0,
            at_reset: 0,
            since: Instant::now(),
        }
    }

    fn report(&mut self) {
        self.reports += 1;
    }

    /// Fails when `waiting` has lasted `timeout` without a single delivery report.
    fn check(&mut self, waiting: bool) -> Result<(), SessionError> {
        if !waiting || self.reports != self.at_reset {
            self.at_reset = self.reports;
            self.since = Instant::now();
            return Ok(());
        }
        if self.since.elapsed() >= self.timeout {
            return Err(SessionError::DeliveryTimeout(self.timeout));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(tag: DeliveryTag) -> Delivery {
        Delivery {
            tag,
            result: Ok(()),
            bytes: 0,
        }
    }

    fn progress(table: &str) -> SnapshotProgress {
        SnapshotProgress {
            table: table.into(),
            state: "running".into(),
            last_key: None,
            last_key_sealed: None,
            rows_done: 1,
            rows_estimate: 2,
            ts_ms: 0,
            resnapshot_from: None,
            condition: None,
        }
    }

    #[test]
    fn postgres_is_told_only_what_kafka_and_the_position_log_hold() {
        let mut a = Acks::new(Lsn(10), Duration::from_secs(10));
        let t = a.begin();
        a.sent(t, 2);
        a.commit(Lsn(100)).unwrap();
        assert!(!a.in_transaction());
        assert_eq!(a.position_to_record(), None, "nothing acknowledged yet");
        a.on_delivery(ok(DeliveryTag::Event(t))).unwrap();
        assert_eq!(a.confirmed(), Lsn(10));
        assert_eq!(
            a.on_delivery(ok(DeliveryTag::Event(t))).unwrap(),
            Delivered::Event
        );
        assert_eq!(a.confirmed(), Lsn(100));
        // Kafka holds the transaction, the position log does not yet.
        assert_eq!(a.flushable(), Lsn(10));
        assert_eq!(a.position_to_record(), Some(Lsn(100)));
        a.position_sent(Lsn(100));
        assert_eq!(
            a.position_to_record(),
            None,
            "one record on its way at a time"
        );
        assert!(a.waiting());
        assert_eq!(
            a.on_delivery(ok(DeliveryTag::Position)).unwrap(),
            Delivered::Position
        );
        assert_eq!(a.flushable(), Lsn(100));
        assert!(!a.waiting());
    }

    #[test]
    fn a_change_outside_a_transaction_is_refused() {
        let mut a = Acks::new(Lsn(1), Duration::from_secs(10));
        assert!(a.open_token().is_err());
        assert!(a.commit(Lsn(5)).is_err());
        let t = a.begin();
        assert_eq!(a.open_token().unwrap(), t);
    }

    #[test]
    fn idle_advance_waits_for_the_open_transaction() {
        let mut a = Acks::new(Lsn(1), Duration::from_secs(10));
        a.begin();
        a.idle_advance(Lsn(50));
        assert_eq!(a.confirmed(), Lsn(1));
        a.commit(Lsn(20)).unwrap();
        a.idle_advance(Lsn(50));
        assert_eq!(a.confirmed(), Lsn(50));
    }

    #[test]
    fn snapshot_progress_is_released_in_chunk_order_and_never_moves_the_slot() {
        let mut a = Acks::new(Lsn(7), Duration::from_secs(10));
        let first = a.begin_chunk();
        a.sent(first, 1);
        a.chunk_sent(first, progress("first"));
        let second = a.begin_chunk();
        a.sent(second, 1);
        a.chunk_sent(second, progress("second"));
        a.on_delivery(ok(DeliveryTag::Event(second))).unwrap();
        assert!(
            a.take_progress().is_empty(),
            "the first chunk is not in Kafka yet"
        );
        a.on_delivery(ok(DeliveryTag::Event(first))).unwrap();
        let done: Vec<String> = a.take_progress().into_iter().map(|p| p.table).collect();
        assert_eq!(done, ["first", "second"]);
        assert_eq!(a.confirmed(), Lsn(7));
        assert_eq!(
            a.on_delivery(ok(DeliveryTag::SnapshotProgress)).unwrap(),
            Delivered::Other
        );
    }
}
