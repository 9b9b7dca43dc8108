//! The optional outputs of a rules round (docs/rules.md, "Kafka outputs"): the round's
//! transitions, and the early filter's events (the changes whose new row matches at least
//! one active rule, with the ids of the rules it matches).
//!
//! The lake does not know where they go: the daemon implements [`RulesOutput`] (with a
//! Kafka producer) and gives it to every Silver table's rules. [`super::TableRules`]
//! calls [`RulesOutput::publish`] with the whole round **before** the round's
//! `rules/transitions` commit (and so before the Silver commit), and
//! goes on only when it returned `Ok`, i.e. when every message is acknowledged:
//!
//! - a failure fails the round: nothing of it is committed, and the Silver round runs
//!   again later and publishes the same messages again;
//! - a crash after publishing and before the commits also publishes them again;
//! - a round repeated after a crash between the transitions commit and the Silver commit skips
//!   what the rules progress covers (those messages were published before that commit).
//!
//! At-least-once, then. A consumer drops repeats by the messages' identity: (rule_id,
//! table, key, lsn, transition) for a transition, (table, key, lsn, ordinal) for a filter
//! event.

use futures::future::BoxFuture;

use super::store::Origin;
use super::walk::Transition;
use crate::LakeError;

/// One change event that passed the early filter: the key's row after the change (one
/// per key and source transaction, as Silver applies it) matches at least one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterEvent {
    /// The primary key as JSON text (`{"id":42}`).
    pub key: String,
    /// The change's op: `c` insert, `u` update, `r` snapshot read.
    pub op: &'static str,
    pub lsn: i64,
    pub ordinal: i64,
    /// Source commit time, microseconds since the epoch.
    pub commit_ts: Option<i64>,
    /// The ids of the rules the row matches, sorted.
    pub rules: Vec<String>,
    /// The row as Silver stores it (masked), a JSON object; never logged. `None` when a
    /// value cannot be written as JSON.
    pub after: Option<String>,
}

/// What one rules round of one table gives its outputs.
#[derive(Debug, Clone, Copy)]
pub struct RulesRound<'a> {
    /// The Silver table, `schema.table` as the lake names it.
    pub table: &'a str,
    pub origin: Origin,
    /// The rules seq the transitions are written with (`rules/transitions.seq`).
    pub seq: i64,
    pub transitions: &'a [Transition],
    /// Empty unless [`RulesOutput::wants_events`].
    pub events: &'a [FilterEvent],
}

/// Where a round's transitions and filter events are published (implemented by the
/// daemon; see the module docs for when it is called and what an error does).
pub trait RulesOutput: Send + Sync {
    /// Whether the output takes filter events (building them costs a JSON row each).
    fn wants_events(&self) -> bool;

    /// Publishes the round and returns once every message is acknowledged. An error
    /// fails the round ([`LakeError::Output`], transient when trying again may work).
    fn publish<'a>(&'a self, round: RulesRound<'a>) -> BoxFuture<'a, Result<(), LakeError>>;
}
