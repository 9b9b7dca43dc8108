//! Publishing decoded changes: schemas registered per table version, events encoded in
//! the Confluent wire format, dead letters for what cannot be published.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use wal2delta_cdc::decoder::Decoded;
use wal2delta_cdc::value::render_text;
use wal2delta_model::{
    Change, ChangeOp, ColumnValue, ErrorClass, TableName, TableSchema, TxPosition,
};
use wal2delta_stream::avro::binary::{frame_change, FramedChange, SchemaIds};
use wal2delta_stream::avro::decimal::Decimals;
use wal2delta_stream::avro::envelope::{
    table_schemas_with, SourceInfo, TableSchemas, OLD_KEY_HEADER,
};
use wal2delta_stream::dlq::{DeadLetter, TooLarge};
use wal2delta_stream::producer::{headers_bytes, EventProducer};
use wal2delta_stream::registry::Registry;
use wal2delta_stream::topic::{key_subject, table_topic, value_subject};
use wal2delta_stream::transaction_acks::{AckToken, DeliveryTag};
use wal2delta_stream::transactions::{TransactionEnd, Watermark};
use wal2delta_stream::StreamError;

use super::tokenize::Tokenized;
use crate::events::{DeadLetterCause, DeadLettered, InternalEvent};
use crate::metrics as m;

/// How many messages a publishing call queued under its token: the caller records them
/// with [`super::acks::Acks::sent`], so the slot waits for every one of them.
#[must_use = "the messages sent must be recorded with Acks::sent, or the slot may move past them"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent(pub usize);

/// A table version ready to publish, or the reason it cannot be.
struct Published {
    schema: Arc<TableSchema>,
    topic: String,
    /// The registry ids of the table version's key and value schemas, which
    /// [`frame_change`] frames its events with (writing the Avro bytes in the field order
    /// of those schemas), or why the version cannot be published.
    state: Result<SchemaIds, String>,
    /// How the version's bounded numerics travel: `[kafka] decimal_handling`, or text when
    /// the registry refused the decimal schema of a subject written with text.
    decimals: Decimals,
    /// `wal2delta_capture_events_total` handles per op code, so the hot path does not
    /// build label sets for every event.
    counters: HashMap<&'static str, metrics::Counter>,
}

pub struct Publisher {
    pub producer: EventProducer,
    registry: Registry,
    prefix: String,
    dlq_topic: String,
    transactions_topic: String,
    source: SourceInfo,
    tables: HashMap<u32, Published>,
    /// Table-topic messages of the source transaction being published.
    open_tx: Option<OpenTransaction>,
    /// `[kafka] decimal_handling`.
    decimals: Decimals,
    /// The source identity recorded in position records
    /// ([`crate::config::SourceConfig::identity`]).
    identity: String,
}

/// What the END record of the transaction being published will say.
struct OpenTransaction {
    xid: u32,
    commit_lsn: u64,
    commit_ts_us: i64,
    counts: BTreeMap<String, u64>,
}

impl Publisher {
    pub fn new(
        producer: EventProducer,
        registry: Registry,
        prefix: String,
        dlq_topic: String,
        transactions_topic: String,
        source: SourceInfo,
    ) -> Self {
        Publisher {
            producer,
            registry,
            prefix,
            dlq_topic,
            transactions_topic,
            source,
            tables: HashMap::new(),
            open_tx: None,
            decimals: Decimals::default(),
            identity: String::new(),
        }
    }

    /// Bounded numerics travel as `decimals` says (`[kafka] decimal_handling`).
    /// The source identity its position records carry.
    pub fn with_identity(mut self, identity: String) -> Self {
        self.identity = identity;
        self
    }

    pub fn with_decimals(mut self, decimals: Decimals) -> Self {
        self.decimals = decimals;
        self
    }

    /// Counts `n` messages of `change` on its table topic for the transaction's END record.
    /// Snapshot reads belong to no source transaction and are not counted.
    fn count(&mut self, change: &Change, n: u64) {
        if matches!(change.op, ChangeOp::Read | ChangeOp::SnapshotEnd) {
            return;
        }
        let pos = &change.position;
        let tx = self.open_tx.get_or_insert_with(|| OpenTransaction {
            xid: pos.xid,
            commit_lsn: pos.commit_lsn.0,
            commit_ts_us: pos.commit_ts_us,
            counts: BTreeMap::new(),
        });
        // Under the table's identity, as its topic and lake tables are named: the consumer
        // (Silver) looks the count up by its lake path.
        *tx.counts.entry(change.table.ident()).or_insert(0) += n;
    }

    /// Publishes the END record of the transaction whose changes were just published, under
    /// its token (so the slot does not move past it before Kafka holds the record). A
    /// transaction with no message on a table topic has no END record.
    pub async fn transaction_end(&mut self, token: AckToken) -> Result<Sent, StreamError> {
        let Some(tx) = self.open_tx.take() else {
            return Ok(Sent(0));
        };
        let end = TransactionEnd::new(
            tx.xid,
            tx.commit_lsn,
            tx.commit_ts_us.div_euclid(1000),
            &tx.counts,
        );
        self.producer
            .send(
                &self.transactions_topic,
                Some(0),
                Some(end.id.as_bytes()),
                &end.to_json(),
                DeliveryTag::Event(token),
            )
            .await?;
        Ok(Sent(1))
    }

    /// Publishes a watermark at `lsn` (see [`Watermark`]). Sent only when nothing is open
    /// or in flight; its delivery does not hold the slot, so it carries no transaction's
    /// token.
    pub async fn watermark(&mut self, lsn: u64) -> Result<(), StreamError> {
        self.producer
            .send(
                &self.transactions_topic,
                Some(0),
                None,
                &Watermark::new(lsn).to_json(),
                DeliveryTag::Watermark,
            )
            .await
    }

    pub async fn ensure_transactions_topic(&mut self) -> Result<(), StreamError> {
        let t = self.transactions_topic.clone();
        self.producer.ensure_topic(&t).await
    }

    /// Writes `lsn` to the position log; its delivery comes back as [`DeliveryTag::Position`].
    pub async fn record_position(
        &self,
        topic: &str,
        slot: &str,
        lsn: wal2delta_model::Lsn,
        now_ms: i64,
    ) -> Result<(), StreamError> {
        let record =
            wal2delta_stream::positions::PositionRecord::new(slot, &self.identity, lsn, now_ms);
        self.producer
            .send(
                topic,
                Some(0),
                Some(slot.as_bytes()),
                &record.to_json(),
                DeliveryTag::Position,
            )
            .await
    }

    pub async fn ensure_dlq_topic(&mut self) -> Result<(), StreamError> {
        let t = self.dlq_topic.clone();
        self.producer.ensure_topic(&t).await
    }

    /// Prepares a table version: topic, Avro schemas, registration. A registry refusal is
    /// remembered (the table's events then go to the DLQ with the reason); a registry
    /// outage is returned as a transient error.
    async fn prepare(&mut self, schema: &Arc<TableSchema>) -> Result<(), StreamError> {
        if let Some(p) = self.tables.get(&schema.relation_oid) {
            if Arc::ptr_eq(&p.schema, schema) || *p.schema == **schema {
                return Ok(());
            }
        }
        let topic = table_topic(&self.prefix, &schema.table);
        self.producer.ensure_topic(&topic).await?;
        let mut decimals = self.decimals;
        let state = match table_schemas_with(&self.prefix, schema, decimals) {
            Err(e) => Err(e.to_string()),
            Ok(avro) => {
                let mut ids = self.register(&topic, schema, &avro).await;
                if matches!(&ids, Err(e) if e.class() != ErrorClass::Transient) && avro.out_of_range
                {
                    // A subject whose compatibility refuses the decimal schema (one written
                    // with text under a registry that does not read text as bytes, or a
                    // decimal whose precision changed): the table version keeps the text
                    // rather than filling the DLQ (docs/upgrading.md).
                    if let Ok(text) = table_schemas_with(&self.prefix, schema, Decimals::String) {
                        if let Ok(text_ids) = self.register(&topic, schema, &text).await {
                            tracing::warn!(table = %schema.table, subject = %value_subject(&topic), "the registry refused the table's schema with its bounded numerics as Avro decimals; they travel as exact text for this table version (docs/upgrading.md)");
                            metrics::counter!(m::CAPTURE_SCHEMA_REFUSED, "table" => schema.table.to_string()).increment(1);
                            decimals = Decimals::String;
                            ids = Ok(text_ids);
                        }
                    }
                }
                match ids {
                    Ok(ids) => Ok(ids),
                    Err(e) if e.class() == ErrorClass::Transient => return Err(e),
                    Err(e) => {
                        metrics::counter!(m::CAPTURE_SCHEMA_REFUSED, "table" => schema.table.to_string()).increment(1);
                        tracing::error!(table = %schema.table, error = %e, "schema refused by the registry; events of this table version go to the DLQ");
                        Err(e.to_string())
                    }
                }
            }
        };
        if let Ok(r) = &state {
            tracing::info!(table = %schema.table, topic = %topic, key_schema_id = r.key, value_schema_id = r.value, columns = schema.columns.len(), "table schema ready");
        }
        self.tables.insert(
            schema.relation_oid,
            Published {
                decimals,
                counters: ["c", "u", "d", "t", "r"]
                    .into_iter()
                    .map(|op| (op, metrics::counter!(m::CAPTURE_EVENTS, "table" => schema.table.to_string(), "op" => op)))
                    .collect(),
                schema: schema.clone(),
                topic,
                state,
            },
        );
        Ok(())
    }

    /// Registers a table version's key and value schemas under the topic's subjects.
    async fn register(
        &mut self,
        topic: &str,
        schema: &TableSchema,
        avro: &TableSchemas,
    ) -> Result<SchemaIds, StreamError> {
        let key = self
            .registry
            .key_id_for(&key_subject(topic), &avro.key_json)
            .await;
        if let Ok((_, true)) = key {
            tracing::warn!(table = %schema.table, subject = %key_subject(topic), "the table's key changed shape (a primary key added, removed or changed) and the registry refused the new key schema as incompatible: the key subject's compatibility is now NONE (docs/capture.md, \"Schema changes\")");
        }
        let (key, _) = key?;
        let value = self
            .registry
            .id_for(&value_subject(topic), &avro.value_json)
            .await?;
        Ok(SchemaIds { key, value })
    }

    /// Handles a Relation message (new table or DDL).
    pub async fn relation(&mut self, schema: &Arc<TableSchema>) -> Result<(), StreamError> {
        self.prepare(schema).await
    }

    /// Publishes the end of a table's re-snapshot (`op` = `s`, no key, no row images) to
    /// every partition of its topic, at position (`from`, number of partitions): the
    /// consumer knows how many partitions must hold it before it may act on it.
    pub async fn snapshot_end(
        &mut self,
        token: AckToken,
        schema: &Arc<TableSchema>,
        from: wal2delta_model::Lsn,
        now_ms: i64,
    ) -> Result<Sent, StreamError> {
        self.prepare(schema).await?;
        let Some(p) = self.tables.get(&schema.relation_oid) else {
            return Ok(Sent(0));
        };
        let n = self.producer.partition_count(&p.topic.clone())?;
        let change = Change {
            table: schema.table.clone(),
            op: ChangeOp::SnapshotEnd,
            before: None,
            after: None,
            position: wal2delta_model::TxPosition {
                commit_lsn: from,
                lsn: from,
                ordinal: n.max(0) as u64,
                xid: 0,
                commit_ts_us: now_ms.saturating_mul(1000),
            },
        };
        // No row image: nothing to tokenize.
        self.publish(token, schema, &change, now_ms, None).await
    }

    /// Publishes one change under `token`. Record-level failures become dead letters.
    /// Only a [`Tokenized`] change is accepted: sensitive values never leave unreplaced.
    pub async fn change(
        &mut self,
        token: AckToken,
        schema: &Arc<TableSchema>,
        change: &Tokenized<'_, Change>,
        now_ms: i64,
    ) -> Result<Sent, StreamError> {
        self.publish(token, schema, change.get(), now_ms, change.key_id())
            .await
    }

    async fn publish(
        &mut self,
        token: AckToken,
        schema: &Arc<TableSchema>,
        change: &Change,
        now_ms: i64,
        token_key_id: Option<&str>,
    ) -> Result<Sent, StreamError> {
        self.prepare(schema).await?;
        let Some(p) = self.tables.get(&schema.relation_oid) else {
            return Ok(Sent(0));
        };
        let reg = match &p.state {
            Ok(r) => r,
            Err(reason) => {
                let reason = reason.clone();
                let cause = DeadLetterCause::SchemaRefused {
                    lsn: change.position.lsn,
                    reason: &reason,
                };
                return self
                    .dead_letter(
                        token,
                        &change.table,
                        change.op,
                        &change.position,
                        cause,
                        &reason,
                        String::new(),
                    )
                    .await;
            }
        };
        let encoded = frame_change(
            schema,
            *reg,
            &self.source,
            change,
            now_ms,
            token_key_id,
            p.decimals,
        );
        let framed = match encoded {
            Ok(f) => f,
            Err(e) => {
                // The reason stays in the dead letter: an Avro error may quote the value.
                let cause = DeadLetterCause::EncodeFailed {
                    lsn: change.position.lsn,
                };
                return self
                    .dead_letter(
                        token,
                        &change.table,
                        change.op,
                        &change.position,
                        cause,
                        &e.to_string(),
                        String::new(),
                    )
                    .await;
            }
        };
        let topic = p.topic.clone();
        let counter = p.counters.get(change.op.code()).cloned();
        let tag = DeliveryTag::Event(token);
        let sent = if matches!(change.op, ChangeOp::Truncate | ChangeOp::SnapshotEnd) {
            // A TRUNCATE (and the end of a re-snapshot) goes to every partition so it is
            // ordered against the rows of each.
            let n = self.producer.partition_count(&topic)?;
            for part in 0..n {
                self.producer
                    .send(&topic, Some(part), None, &framed.value, tag)
                    .await?;
            }
            self.count(change, n.max(0) as u64);
            n.max(0) as usize
        } else {
            match self
                .send_keyed(&topic, schema, change, &framed, tag)
                .await?
            {
                Keyed::Sent(n) => n,
                Keyed::TooLarge { bytes, limit } => {
                    return self.too_large(token, schema, change, bytes, limit).await;
                }
            }
        };
        if let Some(c) = counter {
            c.increment(1);
        }
        Ok(Sent(sent))
    }

    /// Sends a row change to its key's partition, and the tombstone that follows a delete.
    async fn send_keyed(
        &mut self,
        topic: &str,
        schema: &TableSchema,
        change: &Change,
        framed: &FramedChange,
        tag: DeliveryTag,
    ) -> Result<Keyed, StreamError> {
        // An event over the message size goes to the DLQ, checked before sending so that
        // it is never counted in the END record: the count says what is on the table
        // topic, and Silver waits for exactly that many.
        let headers: Vec<(&str, &[u8])> = match &framed.old_key {
            Some(k) => vec![(OLD_KEY_HEADER, k.as_slice())],
            None => Vec::new(),
        };
        let key = framed.key.as_deref();
        let bytes = framed.value.len() + key.map_or(0, <[u8]>::len) + headers_bytes(&headers);
        if !self.producer.fits(bytes) {
            return Ok(Keyed::TooLarge {
                bytes,
                limit: self.producer.max_payload_bytes(),
            });
        }
        match self
            .producer
            .send_record(topic, None, key, Some(&framed.value), &headers, tag)
            .await
        {
            Ok(()) => {}
            Err(StreamError::TooLarge { bytes, limit, .. }) => {
                return Ok(Keyed::TooLarge { bytes, limit })
            }
            Err(e) => return Err(e),
        }
        self.count(change, 1);
        // A delete is followed by a tombstone of its key (null value), so a compacted topic
        // can drop the key. Not a change event: the END record does not count it. A table
        // without a primary key has no key to drop: no tombstone.
        if change.op == ChangeOp::Delete && schema.has_primary_key() {
            if let Some(k) = key {
                self.producer.send_tombstone(topic, k, tag).await?;
                return Ok(Keyed::Sent(2));
            }
        }
        Ok(Keyed::Sent(1))
    }

    /// Sends an event too large for Kafka to the DLQ: its key, its columns and the sizes,
    /// not its values (they would not fit either, and are not cut short silently).
    async fn too_large(
        &mut self,
        token: AckToken,
        schema: &TableSchema,
        change: &Change,
        bytes: usize,
        limit: usize,
    ) -> Result<Sent, StreamError> {
        let reason = format!(
            "the encoded event is {bytes} bytes, over the {limit}-byte limit for one Kafka message; raise [kafka] message_max_bytes together with the broker's and topic's max.message.bytes (docs/capture.md)"
        );
        let detail = TooLarge {
            key: key_text(schema, change, limit / 2),
            columns: schema.columns.iter().map(|c| c.name.clone()).collect(),
            encoded_bytes: bytes,
            limit_bytes: limit,
        };
        self.letter(
            token,
            &change.table,
            change.op,
            &change.position,
            DeadLetterCause::TooLarge {
                lsn: change.position.lsn,
                bytes,
                limit,
            },
            &reason,
            String::new(),
            Some(detail),
        )
        .await
    }

    /// Publishes an undecodable row to the DLQ.
    pub async fn undecodable(
        &mut self,
        token: AckToken,
        d: &Decoded,
        raw_text: Tokenized<'_, String>,
    ) -> Result<Sent, StreamError> {
        if let Decoded::Undecodable {
            table,
            position,
            op,
            kind,
            reason,
            ..
        } = d
        {
            let cause = DeadLetterCause::Undecodable {
                lsn: position.lsn,
                kind: *kind,
                reason,
            };
            return self
                .dead_letter(
                    token,
                    table,
                    *op,
                    position,
                    cause,
                    reason,
                    raw_text.into_inner(),
                )
                .await;
        }
        Ok(Sent(0))
    }

    /// Publishes a snapshot row that could not be decoded to the DLQ.
    pub async fn snapshot_dead_letter(
        &mut self,
        token: AckToken,
        table: &TableName,
        reason: &str,
        raw: Tokenized<'_, String>,
    ) -> Result<Sent, StreamError> {
        let position = TxPosition {
            commit_lsn: wal2delta_model::Lsn::ZERO,
            lsn: wal2delta_model::Lsn::ZERO,
            ordinal: 0,
            xid: 0,
            commit_ts_us: 0,
        };
        self.dead_letter(
            token,
            table,
            ChangeOp::Read,
            &position,
            DeadLetterCause::SnapshotUndecodable { reason },
            reason,
            raw.into_inner(),
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn dead_letter(
        &mut self,
        token: AckToken,
        table: &TableName,
        op: ChangeOp,
        position: &TxPosition,
        cause: DeadLetterCause<'_>,
        reason: &str,
        raw: String,
    ) -> Result<Sent, StreamError> {
        self.letter(token, table, op, position, cause, reason, raw, None)
            .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn letter(
        &mut self,
        token: AckToken,
        table: &TableName,
        op: ChangeOp,
        position: &TxPosition,
        cause: DeadLetterCause<'_>,
        reason: &str,
        raw: String,
        too_large: Option<TooLarge>,
    ) -> Result<Sent, StreamError> {
        let mut letter = DeadLetter {
            reason_kind: cause.kind(),
            reason: reason.to_owned(),
            table: table.to_string(),
            op: op.code().to_owned(),
            lsn: position.lsn.to_string(),
            commit_lsn: position.commit_lsn.to_string(),
            ordinal: position.ordinal,
            xid: position.xid,
            commit_ts_us: position.commit_ts_us,
            raw,
            too_large,
        };
        let key = table.to_string();
        let mut json = letter.to_json();
        if !self.producer.fits(json.len() + key.len()) {
            // The letter must be publishable itself: a raw row over the limit is left out
            // (and said so) rather than stopping the stream.
            let raw_bytes = letter.raw.len();
            letter.raw = String::new();
            letter.reason = format!(
                "{}; the raw row ({raw_bytes} bytes) is left out: over the Kafka message size",
                letter.reason
            );
            json = letter.to_json();
        }
        let topic = self.dlq_topic.clone();
        self.producer
            .send(
                &topic,
                None,
                Some(key.as_bytes()),
                &json,
                DeliveryTag::Event(token),
            )
            .await?;
        DeadLettered { table, cause }.emit();
        Ok(Sent(1))
    }
}

/// The key columns of `change` as `{column: text}`, or `None` when the table has no key
/// columns or the key's text is longer than `max` bytes (a dead letter must fit in one
/// message itself).
fn key_text(
    schema: &TableSchema,
    change: &Change,
    max: usize,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    let row = change.after.as_ref().or(change.before.as_ref())?;
    let mut key = serde_json::Map::new();
    let mut len = 0;
    for i in schema.key_indexes() {
        let col = &schema.columns[i];
        let v = match row.values.get(i) {
            Some(ColumnValue::Value(d)) => {
                let text = render_text(&col.ty, d);
                len += text.len();
                serde_json::Value::String(text)
            }
            _ => serde_json::Value::Null,
        };
        key.insert(col.name.clone(), v);
    }
    (!key.is_empty() && len <= max).then_some(key)
}

/// What sending a keyed change did.
enum Keyed {
    /// Messages queued (the change, and a delete's tombstone).
    Sent(usize),
    /// Over the message size: nothing was sent.
    TooLarge { bytes: usize, limit: usize },
}
