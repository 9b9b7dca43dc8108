//! Which LSN the slot may be confirmed to.
//!
//! Invariant (promise 1): the slot's confirmed flush LSN moves past a transaction only
//! when Kafka has acknowledged *every* event of that transaction *and* of every earlier
//! transaction. Acknowledgements may arrive in any order (several partitions, several
//! topics, retries); the tracker keeps transactions in commit order and only releases the
//! longest fully-acknowledged prefix. A transaction is "sealed" when its Commit has been
//! read: before that more events may still come, so it can never be released.

use std::collections::VecDeque;

use wal2delta_model::Lsn;

struct Tx {
    end_lsn: Lsn,
    pending: usize,
    sealed: bool,
}

/// Tracks in-flight transactions. Event tokens are transaction sequence numbers.
pub struct AckTracker {
    txs: VecDeque<Tx>,
    /// Sequence number of `txs[0]`.
    base: u64,
    confirmed: Lsn,
    in_flight: usize,
}

/// The acknowledgement token of an event: the sequence number of its transaction.
pub type AckToken = u64;

/// What a message's delivery report belongs to, so each report is handled by kind rather
/// than by comparing numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryTag {
    /// An event, END record or dead letter of the transaction (or snapshot chunk) `token`:
    /// the slot waits for it.
    Event(AckToken),
    /// A record of the position log: PostgreSQL may be told up to what it holds.
    Position,
    /// A snapshot-progress record: holds nothing.
    SnapshotProgress,
    /// A watermark on the transactions topic: holds nothing.
    Watermark,
}

impl AckTracker {
    /// Starts from the slot's confirmed position.
    pub fn new(confirmed: Lsn) -> Self {
        AckTracker {
            txs: VecDeque::new(),
            base: 0,
            confirmed,
            in_flight: 0,
        }
    }

    /// Opens a transaction; returns the token its events carry.
    pub fn begin(&mut self) -> AckToken {
        self.txs.push_back(Tx {
            end_lsn: Lsn::ZERO,
            pending: 0,
            sealed: false,
        });
        self.base + self.txs.len() as u64 - 1
    }

    /// Records one event sent to Kafka for the open transaction `token`.
    pub fn sent(&mut self, token: AckToken) {
        if let Some(tx) = self.get_mut(token) {
            tx.pending += 1;
            self.in_flight += 1;
        }
    }

    /// Records that the transaction's commit has been read.
    pub fn seal(&mut self, token: AckToken, end_lsn: Lsn) {
        if let Some(tx) = self.get_mut(token) {
            tx.end_lsn = end_lsn;
            tx.sealed = true;
        }
        self.release();
    }

    /// Records one Kafka acknowledgement. Returns the new confirmable LSN if it moved.
    pub fn acked(&mut self, token: AckToken) -> Option<Lsn> {
        if let Some(tx) = self.get_mut(token) {
            if tx.pending > 0 {
                tx.pending -= 1;
                self.in_flight -= 1;
            }
        }
        let before = self.confirmed;
        self.release();
        (self.confirmed > before).then_some(self.confirmed)
    }

    /// When nothing is open or in flight, everything the server sent up to `wal_end` has
    /// been handled, so the slot may move there (this keeps it moving on idle databases and
    /// past WAL of tables not captured).
    pub fn idle_advance(&mut self, wal_end: Lsn) {
        if self.txs.is_empty() && wal_end > self.confirmed {
            self.confirmed = wal_end;
        }
    }

    /// The LSN the slot may be confirmed to.
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// Events of transaction `token` not yet acknowledged.
    pub fn pending(&self, token: AckToken) -> usize {
        token
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.txs.get(i))
            .map_or(0, |tx| tx.pending)
    }

    /// Events sent and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Transactions not yet released.
    pub fn open_transactions(&self) -> usize {
        self.txs.len()
    }

    fn get_mut(&mut self, token: AckToken) -> Option<&mut Tx> {
        let idx = token.checked_sub(self.base)?;
        self.txs.get_mut(usize::try_from(idx).ok()?)
    }

    fn release(&mut self) {
        while let Some(front) = self.txs.front() {
            if !(front.sealed && front.pending == 0) {
                break;
            }
            if front.end_lsn > self.confirmed {
                self.confirmed = front.end_lsn;
            }
            self.txs.pop_front();
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_acks_release_only_the_complete_prefix() {
        let mut t = AckTracker::new(Lsn(10));
        let a = t.begin();
        t.sent(a);
        t.sent(a);
        t.seal(a, Lsn(100));
        let b = t.begin();
        t.sent(b);
        t.seal(b, Lsn(200));
        // b's only event is acked first: nothing moves, a is still pending.
        assert_eq!(t.acked(b), None);
        assert_eq!(t.confirmed(), Lsn(10));
        assert_eq!(t.acked(a), None);
        // The last event of a releases a and b together.
        assert_eq!(t.acked(a), Some(Lsn(200)));
        assert_eq!(t.open_transactions(), 0);
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn unsealed_transaction_is_never_released() {
        let mut t = AckTracker::new(Lsn::ZERO);
        let a = t.begin();
        t.sent(a);
        assert_eq!(t.acked(a), None);
        assert_eq!(t.confirmed(), Lsn::ZERO);
        t.seal(a, Lsn(50));
        assert_eq!(t.confirmed(), Lsn(50));
    }

    #[test]
    fn empty_transactions_release_on_commit_and_idle_advances() {
        let mut t = AckTracker::new(Lsn(5));
        let a = t.begin();
        t.seal(a, Lsn(7));
        assert_eq!(t.confirmed(), Lsn(7));
        let b = t.begin();
        t.sent(b);
        t.idle_advance(Lsn(99));
        assert_eq!(
            t.confirmed(),
            Lsn(7),
            "must not move past an open transaction"
        );
        t.seal(b, Lsn(20));
        t.acked(b);
        t.idle_advance(Lsn(99));
        assert_eq!(t.confirmed(), Lsn(99));
        t.idle_advance(Lsn(50));
        assert_eq!(t.confirmed(), Lsn(99), "never moves backwards");
    }

    #[test]
    fn many_events_sharing_one_lsn() {
        let mut t = AckTracker::new(Lsn::ZERO);
        let a = t.begin();
        for _ in 0..1000 {
            t.sent(a);
        }
        t.seal(a, Lsn(1));
        for i in 0..1000 {
            let moved = t.acked(a);
            assert_eq!(moved.is_some(), i == 999);
        }
    }

    #[test]
    fn stray_tokens_are_ignored() {
        let mut t = AckTracker::new(Lsn::ZERO);
        assert_eq!(t.acked(42), None);
        let a = t.begin();
        t.seal(a, Lsn(3));
        assert_eq!(t.acked(a), None);
        assert_eq!(t.confirmed(), Lsn(3));
    }
}
