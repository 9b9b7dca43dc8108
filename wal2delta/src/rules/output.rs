//! The rules stage's Kafka outputs (docs/rules.md, "Kafka outputs"): `[rules]
//! transitions_topic` receives every transition appended to `rules/transitions`, `[rules]
//! filter_topic` the change events that match at least one active rule (the early
//! filter). Both are JSON, keyed by `{table}/{key}` so one row's messages stay in order
//! in one partition.
//!
//! Delivery: each Silver round's rules publish here **before** their Delta commits and
//! wait for Kafka's acknowledgement of every message (`wal2delta_lake::rules::output`);
//! a failure fails the round, which Silver runs again, so nothing is lost. A crash
//! between publishing and the commits publishes the same messages again: at-least-once.
//! Consumers drop repeats by (rule_id, table, key, lsn, transition) for transitions and
//! (table, key, lsn, ordinal) for filter events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use wal2delta_lake::rules::{FilterEvent, RulesOutput, RulesRound};
use wal2delta_lake::LakeError;
use wal2delta_model::ErrorClass;
use wal2delta_stream::batch_producer::{AckedProducer, AckedSettings, Outgoing};
use wal2delta_stream::StreamError;

use crate::config::Config;
use crate::metrics as m;

/// What a filter event carries instead of `after` when it is left out.
const TOO_LARGE: &str = "too large";
const NOT_JSON: &str = "not representable as JSON";
const NOT_LISTED: &str = "not in [rules] filter_columns";

/// What the filter topic may carry of a table's rows (`[rules] filter_columns`).
#[derive(Debug, Clone, Copy)]
enum Allowed<'a> {
    /// Every column (no `filter_columns`).
    All,
    /// These columns only.
    Columns(&'a BTreeSet<String>),
    /// No row: the table is not listed.
    Nothing,
}

/// Publishes rules rounds to the configured topics with an idempotent producer.
pub struct KafkaOutput {
    producer: AckedProducer,
    transitions_topic: Option<String>,
    filter_topic: Option<String>,
    /// `[rules] filter_columns` by lake table name; `None`: every column.
    filter_columns: Option<BTreeMap<String, BTreeSet<String>>>,
}

/// The output `[rules]` configures: `None` without `transitions_topic` and
/// `filter_topic`.
pub fn from_config(config: &Config) -> anyhow::Result<Option<Arc<dyn RulesOutput>>> {
    let r = &config.rules;
    if r.transitions_topic.is_none() && r.filter_topic.is_none() {
        return Ok(None);
    }
    let k = &config.kafka;
    let producer = AckedProducer::new(AckedSettings {
        connection: k.connection()?,
        delivery_timeout: Duration::from_millis(k.delivery_timeout_ms),
        topics: k.topic_settings(),
        message_max_bytes: k.message_max_bytes,
        extra: k.producer.clone(),
        client_id: "wal2delta-rules".into(),
    })?;
    Ok(Some(Arc::new(KafkaOutput {
        producer,
        transitions_topic: r.transitions_topic.clone(),
        filter_topic: r.filter_topic.clone(),
        filter_columns: r.filter_columns(),
    })))
}

impl RulesOutput for KafkaOutput {
    fn wants_events(&self) -> bool {
        self.filter_topic.is_some()
    }

    fn publish<'a>(&'a self, round: RulesRound<'a>) -> BoxFuture<'a, Result<(), LakeError>> {
        Box::pin(self.send(round))
    }
}

impl KafkaOutput {
    async fn send(&self, round: RulesRound<'_>) -> Result<(), LakeError> {
        let mut messages = Vec::new();
        if let Some(topic) = &self.transitions_topic {
            if !round.transitions.is_empty() {
                self.producer
                    .ensure_topic(topic)
                    .await
                    .map_err(|e| failed(topic, round.table, &e))?;
            }
            for t in round.transitions {
                messages.push(Outgoing {
                    topic: topic.clone(),
                    key: message_key(round.table, &t.key),
                    payload: transition_json(&round, t).to_string().into_bytes(),
                });
            }
        }
        if let Some(topic) = &self.filter_topic {
            if !round.events.is_empty() {
                self.producer
                    .ensure_topic(topic)
                    .await
                    .map_err(|e| failed(topic, round.table, &e))?;
            }
            let allowed = match &self.filter_columns {
                None => Allowed::All,
                Some(by_table) => by_table
                    .get(round.table)
                    .map_or(Allowed::Nothing, Allowed::Columns),
            };
            for e in round.events {
                let key = message_key(round.table, &e.key);
                let mut payload = filter_json(round.table, e, allowed)
                    .to_string()
                    .into_bytes();
                if !self.producer.fits(key.len() + payload.len()) {
                    payload = too_large(round.table, e).to_string().into_bytes();
                }
                messages.push(Outgoing {
                    topic: topic.clone(),
                    key,
                    payload,
                });
            }
        }
        if messages.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.producer.send_all(&messages).await {
            let topic = match &e {
                StreamError::TooLarge { topic, .. } => topic.clone(),
                _ => self
                    .transitions_topic
                    .clone()
                    .or_else(|| self.filter_topic.clone())
                    .unwrap_or_default(),
            };
            return Err(failed(&topic, round.table, &e));
        }
        for topic in [&self.transitions_topic, &self.filter_topic]
            .into_iter()
            .flatten()
        {
            let n = messages.iter().filter(|m| &m.topic == topic).count();
            if n > 0 {
                metrics::counter!(m::RULES_PUBLISHED, "topic" => topic.clone()).increment(n as u64);
            }
        }
        Ok(())
    }
}

/// `{table}/{key}`: one row's messages share a partition, so they stay in order.
fn message_key(table: &str, key: &str) -> Vec<u8> {
    format!("{table}/{key}").into_bytes()
}

/// A transition as `rules/transitions` holds it (`commit_ts` in microseconds since the
/// Unix epoch, UTC).
fn transition_json(round: &RulesRound<'_>, t: &wal2delta_lake::rules::walk::Transition) -> Value {
    json!({
        "rule_id": t.rule_id,
        "rule_version": t.rule_version,
        "table": round.table,
        "key": t.key,
        "transition": t.name(),
        "lsn": t.lsn,
        "commit_ts": t.commit_ts,
        "origin": round.origin.as_str(),
        "seq": round.seq,
    })
}

/// A filter event carrying what `allowed` lets through of its row (`after`), or why it
/// carries none (`after_omitted`).
fn filter_json(table: &str, e: &FilterEvent, allowed: Allowed<'_>) -> Value {
    let mut doc = event_doc(table, e);
    let after = e
        .after
        .as_deref()
        .and_then(|a| serde_json::from_str::<Value>(a).ok());
    match (allowed, after) {
        (Allowed::Nothing, _) => {
            doc.insert("after_omitted".into(), json!(NOT_LISTED));
        }
        (_, None) => {
            doc.insert("after_omitted".into(), json!(NOT_JSON));
        }
        (Allowed::All, Some(a)) => {
            doc.insert("after".into(), a);
        }
        (Allowed::Columns(cols), Some(mut a)) => {
            if let Value::Object(row) = &mut a {
                row.retain(|c, _| cols.contains(c));
            }
            doc.insert("after".into(), a);
        }
    }
    Value::Object(doc)
}

/// A filter event whose row would not fit in a Kafka message.
fn too_large(table: &str, e: &FilterEvent) -> Value {
    let mut doc = event_doc(table, e);
    doc.insert("after_omitted".into(), json!(TOO_LARGE));
    Value::Object(doc)
}

/// The fields of a filter event other than its row.
fn event_doc(table: &str, e: &FilterEvent) -> Map<String, Value> {
    let mut doc = Map::new();
    doc.insert("table".into(), json!(table));
    doc.insert("key".into(), json!(e.key));
    doc.insert("op".into(), json!(e.op));
    doc.insert("lsn".into(), json!(e.lsn));
    doc.insert("ordinal".into(), json!(e.ordinal));
    doc.insert("commit_ts".into(), json!(e.commit_ts));
    doc.insert("rules".into(), json!(e.rules));
    doc
}

/// A publish failure as the round's error: transient when trying again may work.
fn failed(topic: &str, table: &str, e: &StreamError) -> LakeError {
    LakeError::Output {
        output: format!("Kafka topic {topic}"),
        table: table.to_owned(),
        reason: e.to_string(),
        transient: e.class() == ErrorClass::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(after: Option<&str>) -> FilterEvent {
        FilterEvent {
            key: "{\"id\":1}".into(),
            op: "u",
            lsn: 42,
            ordinal: 3,
            commit_ts: Some(7),
            rules: vec!["a".into(), "b".into()],
            after: after.map(str::to_owned),
        }
    }

    #[test]
    fn a_filter_event_carries_the_row_or_says_why_not() {
        let e = event(Some("{\"id\":1,\"note\":null}"));
        let v = filter_json("s.t", &e, Allowed::All);
        assert_eq!(v["after"], json!({"id": 1, "note": null}));
        assert_eq!(v["rules"], json!(["a", "b"]));
        assert_eq!(v["key"], json!("{\"id\":1}"));
        assert_eq!(v["op"], json!("u"));
        assert!(v.get("after_omitted").is_none());
        let v = too_large("s.t", &e);
        assert!(v.get("after").is_none());
        assert_eq!(v["after_omitted"], json!("too large"));
        assert_eq!(v["rules"], json!(["a", "b"]));
        let v = filter_json("s.t", &event(None), Allowed::All);
        assert_eq!(v["after_omitted"], json!(NOT_JSON));
        // `[rules] filter_columns`: the listed columns only, or no row.
        let cols = BTreeSet::from(["id".to_owned(), "amount".to_owned()]);
        let v = filter_json("s.t", &e, Allowed::Columns(&cols));
        assert_eq!(v["after"], json!({"id": 1}));
        let v = filter_json("s.t", &e, Allowed::Nothing);
        assert!(v.get("after").is_none());
        assert_eq!(v["after_omitted"], json!(NOT_LISTED));
        assert_eq!(v["key"], json!("{\"id\":1}"));
        assert_eq!(message_key("s.t", &e.key), b"s.t/{\"id\":1}".to_vec());
    }
}
