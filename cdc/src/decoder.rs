//! Turning pgoutput messages into change events.
//!
//! The decoder keeps the relation cache (one [`TableSchema`] per relation OID, replaced on
//! each Relation message) and the current transaction's position.
//!
//! A Relation message inside a stream block (a large transaction still in progress) is
//! only noted ([`Decoder::stream_schema`]): its column types may have been created by that
//! very transaction, which the catalog connection cannot see before it commits, and what
//! it describes may yet be rolled back. It is resolved when a change first needs it after
//! the commit; normally the replayed Relation message itself replaces it first. A row whose value
//! cannot be decoded does not stop anything: it becomes [`Decoded::Undecodable`] with the
//! reason and the raw text, for the dead-letter topic.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_postgres::Client;
use wal2delta_model::dead_letter::DeadLetterKind;
use wal2delta_model::{
    Change, ChangeOp, Column, ColumnValue, Lsn, ReplicaIdentity, Row, TableName, TableSchema,
    TxPosition,
};

use crate::pgoutput::{PgOutputMessage, TupleValue};
use crate::replication::pg_ts_to_unix_us;
use crate::{catalog::TypeCatalog, value, CdcError};

/// What one pgoutput message amounts to.
#[derive(Debug)]
pub enum Decoded {
    Begin {
        xid: u32,
        final_lsn: Lsn,
    },
    Change {
        schema: Arc<TableSchema>,
        change: Change,
    },
    /// An UPDATE that changed the primary key, as Debezium emits it: a delete of the old
    /// key, then a create of the new key whose `before` is the old row image (the old key
    /// under REPLICA IDENTITY DEFAULT, the whole old row under FULL), so consumers keyed by
    /// the primary key drop the old key and Silver can fill unchanged TOAST columns from
    /// it. Two changes with consecutive ordinals, in that order (docs/capture.md).
    KeyChange {
        schema: Arc<TableSchema>,
        delete: Change,
        create: Change,
    },
    /// Every change of the transaction has been emitted; `end_lsn` may be confirmed once
    /// all of them are acknowledged by Kafka.
    Commit {
        commit_lsn: Lsn,
        end_lsn: Lsn,
    },
    /// A row that could not be decoded: goes to the DLQ, the stream goes on.
    Undecodable {
        table: TableName,
        position: TxPosition,
        op: ChangeOp,
        /// The dead letter's `reason_kind`: a value the decoder cannot represent exactly
        /// ([`DeadLetterKind::UndecodableValue`]) or a DELETE of a table whose replica
        /// identity is an index without the primary key, whose old row carries the
        /// index's columns, not the key the events are keyed by
        /// ([`DeadLetterKind::IdentityWithoutKey`]).
        kind: DeadLetterKind,
        reason: String,
        raw: RawRow,
    },
    /// A new relation description (after DDL) — the schemas must follow.
    Relation(Arc<TableSchema>),
    /// A TRUNCATE, one change per table it names.
    Truncate(TruncateChanges),
    /// A logical message (`pg_logical_emit_message`), e.g. a heartbeat.
    Message {
        prefix: String,
        transactional: bool,
    },
    Nothing,
}

#[derive(Default)]
struct TxState {
    xid: u32,
    final_lsn: Lsn,
    commit_ts_us: i64,
    ordinal: u64,
}

/// Stateful pgoutput → change decoder.
pub struct Decoder {
    relations: HashMap<u32, Arc<TableSchema>>,
    /// Relations whose replica identity is an index that leaves out primary-key columns
    /// (`setup` refuses them; one altered later is met here), with the reason.
    identity_without_key: HashMap<u32, String>,
    types: TypeCatalog,
    tx: TxState,
    /// Relation messages seen inside the stream blocks of each open streamed transaction
    /// (by top-level xid), not resolved yet. While that transaction is replayed, a change
    /// of such a relation resolves it first: when the replay skips the Relation message
    /// (it was sent by a subtransaction that rolled back) pgoutput will not send it again
    /// for that transaction, yet the transaction's later changes are shaped by it.
    /// Other transactions never see them: pgoutput sends them their own.
    /// Each is the Relation message as sent.
    streamed_relations: HashMap<u32, HashMap<u32, PgOutputMessage>>,
    /// Those of the transaction being replayed.
    replaying: HashMap<u32, PgOutputMessage>,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Decoder {
            relations: HashMap::new(),
            identity_without_key: HashMap::new(),
            types: TypeCatalog::default(),
            tx: TxState::default(),
            streamed_relations: HashMap::new(),
            replaying: HashMap::new(),
        }
    }

    /// Starts a transaction that arrives as a whole at its commit (a streamed transaction
    /// replayed from the stream buffer): its changes get this xid, commit LSN and time.
    pub fn begin_transaction(&mut self, xid: u32, commit_lsn: Lsn, commit_ts: i64) {
        self.replaying = self.streamed_relations.remove(&xid).unwrap_or_default();
        self.tx = TxState {
            xid,
            final_lsn: commit_lsn,
            commit_ts_us: pg_ts_to_unix_us(commit_ts),
            ordinal: 0,
        };
    }

    /// Notes a Relation or Type message that arrived inside a stream block of top-level
    /// transaction `xid`. Nothing is read from the catalog and nothing is returned to
    /// publish: see the module's doc.
    pub fn stream_schema(&mut self, xid: u32, msg: PgOutputMessage) {
        match msg {
            PgOutputMessage::Relation { rel_id, .. } => {
                self.streamed_relations
                    .entry(xid)
                    .or_default()
                    .insert(rel_id, msg);
            }
            PgOutputMessage::Type { type_oid, .. } => self.types.invalidate(type_oid),
            _ => {}
        }
    }

    /// Forgets what the stream blocks of `xid` described: the transaction rolled back.
    pub fn stream_aborted(&mut self, xid: u32) {
        self.streamed_relations.remove(&xid);
    }

    /// Resolves the relations that changes of `rel_ids` need and that the transaction
    /// being replayed so far described only inside its stream blocks.
    async fn settle_streamed(&mut self, catalog: &Client, rel_ids: &[u32]) -> Result<(), CdcError> {
        for rel_id in rel_ids {
            if let Some(msg) = self.replaying.remove(rel_id) {
                self.relation(catalog, msg).await?;
            }
        }
        Ok(())
    }

    /// Decodes one message. `lsn` is the XLogData start position it arrived with.
    /// `catalog` is an ordinary connection used to resolve type OIDs.
    pub async fn decode(
        &mut self,
        catalog: &Client,
        msg: PgOutputMessage,
        lsn: Lsn,
    ) -> Result<Decoded, CdcError> {
        match msg {
            PgOutputMessage::Relation { .. } => {
                Ok(Decoded::Relation(self.relation(catalog, msg).await?))
            }
            other => {
                // A change of a relation the replayed transaction described only inside
                // its stream blocks: resolve that description first.
                match &other {
                    PgOutputMessage::Insert { rel_id, .. }
                    | PgOutputMessage::Update { rel_id, .. }
                    | PgOutputMessage::Delete { rel_id, .. } => {
                        self.settle_streamed(catalog, &[*rel_id]).await?
                    }
                    PgOutputMessage::Truncate { rel_ids, .. } => {
                        self.settle_streamed(catalog, rel_ids).await?
                    }
                    _ => {}
                }
                self.decode_cached(other, lsn)
            }
        }
    }

    /// Decodes a message that needs no catalog lookup: every message but Relation, which
    /// [`Decoder::decode`] resolves against the catalog (a Relation message passed here
    /// is a protocol error). Used by `decode` and by the fuzz targets (`fuzz/`), which
    /// install relations with [`Decoder::insert_relation`] instead.
    pub fn decode_cached(&mut self, msg: PgOutputMessage, lsn: Lsn) -> Result<Decoded, CdcError> {
        Ok(match msg {
            PgOutputMessage::Begin {
                final_lsn,
                commit_ts,
                xid,
            } => {
                // What a replayed streamed transaction described is its own.
                self.replaying.clear();
                self.tx = TxState {
                    xid,
                    final_lsn,
                    commit_ts_us: pg_ts_to_unix_us(commit_ts),
                    ordinal: 0,
                };
                Decoded::Begin { xid, final_lsn }
            }
            PgOutputMessage::Commit {
                commit_lsn,
                end_lsn,
                ..
            } => Decoded::Commit {
                commit_lsn,
                end_lsn,
            },
            PgOutputMessage::Relation { rel_id, .. } => {
                return Err(CdcError::Protocol(format!(
                    "Relation message for relation {rel_id} needs the catalog (use Decoder::decode)"
                )))
            }
            PgOutputMessage::Type { type_oid, .. } => {
                self.types.invalidate(type_oid);
                Decoded::Nothing
            }
            PgOutputMessage::Insert { rel_id, new } => {
                self.row_change(rel_id, ChangeOp::Insert, None, Some(new), lsn)?
            }
            PgOutputMessage::Update { rel_id, old, new } => self.row_change(
                rel_id,
                ChangeOp::Update,
                old.map(|(_, t)| t),
                Some(new),
                lsn,
            )?,
            PgOutputMessage::Delete { rel_id, old } => {
                self.row_change(rel_id, ChangeOp::Delete, Some(old.1), None, lsn)?
            }
            PgOutputMessage::Truncate { rel_ids, .. } => {
                return Ok(self.truncate(rel_ids, lsn));
            }
            PgOutputMessage::Message {
                prefix,
                transactional,
                ..
            } => Decoded::Message {
                prefix,
                transactional,
            },
            PgOutputMessage::Origin { .. } => Decoded::Nothing,
            PgOutputMessage::StreamStart { .. }
            | PgOutputMessage::StreamStop
            | PgOutputMessage::StreamCommit { .. }
            | PgOutputMessage::StreamAbort { .. } => {
                return Err(CdcError::Protocol(
                    "streamed transaction received but streaming was not requested".into(),
                ))
            }
        })
    }

    /// Installs a relation description resolved without the catalog (the fuzz targets:
    /// `wal2delta_cdc::fuzz`), replacing any earlier one with the same OID.
    #[doc(hidden)]
    pub fn insert_relation(&mut self, schema: Arc<TableSchema>) {
        self.identity_without_key.remove(&schema.relation_oid);
        self.relations.insert(schema.relation_oid, schema);
    }

    /// Resolves a Relation message against the catalog and makes it the relation's
    /// current description (replacing one only noted in a stream block).
    async fn relation(
        &mut self,
        catalog: &Client,
        msg: PgOutputMessage,
    ) -> Result<Arc<TableSchema>, CdcError> {
        let PgOutputMessage::Relation {
            rel_id,
            namespace,
            name,
            replica_identity,
            columns,
        } = msg
        else {
            return Err(CdcError::Protocol(
                "a relation description was expected".into(),
            ));
        };
        self.replaying.remove(&rel_id);
        // The Kafka key is the primary key. pgoutput flags every column as "key" under
        // REPLICA IDENTITY FULL, so the flags are only used for tables without one.
        let pk = crate::catalog::primary_key_columns(catalog, rel_id).await?;
        let table = TableName::new(namespace, name);
        // REPLICA IDENTITY USING INDEX on an index without the whole primary key: old rows
        // carry the index's columns only, so a delete names no key. Not lost silently:
        // each such delete goes to the DLQ with the fix, and the operator hears it now.
        let identity: Vec<&str> = columns
            .iter()
            .filter(|c| c.is_key)
            .map(|c| c.name.as_str())
            .collect();
        if replica_identity == b'i' && pk.iter().any(|k| !identity.contains(&k.as_str())) {
            let reason = format!(
                "table {table} has REPLICA IDENTITY USING INDEX on ({}), which does not contain its primary key ({}): \
                 the old row names no key, so this delete cannot be applied by key. \
                 Fix: ALTER TABLE {} REPLICA IDENTITY DEFAULT (or FULL); then apply this delete by hand from `raw`",
                identity.join(", "),
                pk.join(", "),
                table.quoted()
            );
            tracing::error!(table = %table, identity_columns = ?identity, primary_key = ?pk, "replica identity index does not contain the primary key: deletes of this table go to the DLQ (reason identity_without_key) and primary-key changes cannot be seen; run ALTER TABLE ... REPLICA IDENTITY DEFAULT");
            self.identity_without_key.insert(rel_id, reason);
        } else {
            self.identity_without_key.remove(&rel_id);
        }
        let mut cols = Vec::with_capacity(columns.len());
        for c in columns {
            let ty = self.types.resolve(catalog, c.type_oid, c.typmod).await?;
            let is_key = if pk.is_empty() {
                c.is_key
            } else {
                pk.contains(&c.name)
            };
            cols.push(Column {
                name: c.name,
                ty,
                is_key,
            });
        }
        let schema = Arc::new(TableSchema {
            relation_oid: rel_id,
            table,
            columns: cols,
            replica_identity: ReplicaIdentity::from_code(replica_identity),
        });
        self.relations.insert(rel_id, schema.clone());
        Ok(schema)
    }

    fn position(&mut self, lsn: Lsn) -> TxPosition {
        self.tx.ordinal += 1;
        TxPosition {
            commit_lsn: self.tx.final_lsn,
            lsn,
            ordinal: self.tx.ordinal,
            xid: self.tx.xid,
            commit_ts_us: self.tx.commit_ts_us,
        }
    }

    fn schema(&self, rel_id: u32) -> Result<Arc<TableSchema>, CdcError> {
        self.relations.get(&rel_id).cloned().ok_or_else(|| {
            CdcError::Protocol(format!(
                "row for relation {rel_id} before its Relation message"
            ))
        })
    }

    fn row_change(
        &mut self,
        rel_id: u32,
        op: ChangeOp,
        old: Option<Vec<TupleValue>>,
        new: Option<Vec<TupleValue>>,
        lsn: Lsn,
    ) -> Result<Decoded, CdcError> {
        let schema = self.schema(rel_id)?;
        let position = self.position(lsn);
        if op == ChangeOp::Delete {
            if let Some(reason) = self.identity_without_key.get(&rel_id) {
                return Ok(Decoded::Undecodable {
                    table: schema.table.clone(),
                    position,
                    op,
                    kind: DeadLetterKind::IdentityWithoutKey,
                    reason: reason.clone(),
                    raw: RawRow::from_tuples(&schema, old.as_ref(), None),
                });
            }
        }
        let decode = |tuple: &Vec<TupleValue>| decode_row(&schema, tuple);
        let before = old.as_ref().map(decode).transpose();
        let after = new.as_ref().map(decode).transpose();
        match (before, after) {
            (Ok(Some(before)), Ok(Some(after)))
                if op == ChangeOp::Update
                    && !self.identity_without_key.contains_key(&rel_id)
                    && key_changed(&schema, &before, &after) =>
            {
                // The create takes the next ordinal: the two are distinct changes of the
                // transaction, the delete first.
                let create_position = self.position(lsn);
                Ok(Decoded::KeyChange {
                    delete: Change {
                        table: schema.table.clone(),
                        op: ChangeOp::Delete,
                        before: Some(before.clone()),
                        after: None,
                        position,
                    },
                    create: Change {
                        table: schema.table.clone(),
                        op: ChangeOp::Insert,
                        before: Some(before),
                        after: Some(after),
                        position: create_position,
                    },
                    schema,
                })
            }
            (Ok(before), Ok(after)) => Ok(Decoded::Change {
                change: Change {
                    table: schema.table.clone(),
                    op,
                    before,
                    after,
                    position,
                },
                schema,
            }),
            (Err(reason), _) | (_, Err(reason)) => Ok(Decoded::Undecodable {
                table: schema.table.clone(),
                position,
                op,
                kind: DeadLetterKind::UndecodableValue,
                reason,
                raw: RawRow::from_tuples(&schema, old.as_ref(), new.as_ref()),
            }),
        }
    }

    fn truncate(&mut self, rel_ids: Vec<u32>, lsn: Lsn) -> Decoded {
        let mut changes = Vec::new();
        for rel_id in rel_ids {
            if let Ok(schema) = self.schema(rel_id) {
                let position = self.position(lsn);
                changes.push((
                    schema.clone(),
                    Change {
                        table: schema.table.clone(),
                        op: ChangeOp::Truncate,
                        before: None,
                        after: None,
                        position,
                    },
                ));
            }
        }
        Decoded::Truncate(changes)
    }
}

/// The result of a TRUNCATE of several tables.
pub type TruncateChanges = Vec<(Arc<TableSchema>, Change)>;

/// Whether an update moved its row to another primary key: the old row names every key
/// column (REPLICA IDENTITY DEFAULT sends the old key only when it changed; FULL sends the
/// whole old row every time) and some key column differs in the new row. A table without
/// a primary key has none to change: its updates stay updates.
fn key_changed(schema: &TableSchema, before: &Row, after: &Row) -> bool {
    if !schema.has_primary_key() {
        return false;
    }
    let keys = schema.key_indexes();
    let named = |row: &Row| {
        keys.iter()
            .all(|&i| matches!(row.values.get(i), Some(ColumnValue::Value(_))))
    };
    named(before)
        && named(after)
        && keys
            .iter()
            .any(|&i| before.values.get(i) != after.values.get(i))
}

fn decode_row(schema: &TableSchema, tuple: &[TupleValue]) -> Result<Row, String> {
    if tuple.len() != schema.columns.len() {
        return Err(format!(
            "tuple has {} columns but relation {} has {}",
            tuple.len(),
            schema.table,
            schema.columns.len()
        ));
    }
    let mut values = Vec::with_capacity(tuple.len());
    for (col, v) in schema.columns.iter().zip(tuple) {
        values.push(match v {
            TupleValue::Null => ColumnValue::Null,
            TupleValue::UnchangedToast => ColumnValue::UnchangedToast,
            TupleValue::Text(bytes) => {
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| format!("column {}: value is not UTF-8", col.name))?;
                ColumnValue::Value(
                    value::parse_text(&col.ty, text)
                        .map_err(|e| format!("column {}: {e}", col.name))?,
                )
            }
            TupleValue::Binary(_) => {
                return Err(format!(
                    "column {}: binary values were not requested",
                    col.name
                ))
            }
        });
    }
    Ok(Row { values })
}

/// A row exactly as pgoutput sent it, kept for the dead-letter record of a row that
/// could not be decoded. Rendered by [`RawRow::render`], which lets the caller replace
/// sensitive columns' text (tokenization) before it leaves the process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawRow {
    pub old: Option<Vec<(String, Option<String>)>>,
    pub new: Option<Vec<(String, Option<String>)>>,
}

impl RawRow {
    fn from_tuples(
        schema: &TableSchema,
        old: Option<&Vec<TupleValue>>,
        new: Option<&Vec<TupleValue>>,
    ) -> RawRow {
        let image = |tuple: &Vec<TupleValue>| {
            tuple
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let name = schema
                        .columns
                        .get(i)
                        .map(|c| c.name.clone())
                        .unwrap_or_else(|| format!("#{i}"));
                    let text = match v {
                        TupleValue::Null => None,
                        TupleValue::UnchangedToast => Some("<unchanged-toast>".to_owned()),
                        TupleValue::Text(b) | TupleValue::Binary(b) => {
                            Some(String::from_utf8_lossy(b).into_owned())
                        }
                    };
                    (name, text)
                })
                .collect()
        };
        RawRow {
            old: old.map(image),
            new: new.map(image),
        }
    }

    /// `old: col=text ...; new: col=text ...`, passing each non-NULL value through
    /// `value(column, text)`.
    pub fn render(&self, value: impl Fn(&str, &str) -> String) -> String {
        let render = |image: &Vec<(String, Option<String>)>| {
            image
                .iter()
                .map(|(name, text)| match text {
                    None => format!("{name}=NULL"),
                    Some(t) => format!("{name}={}", value(name, t)),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut parts = Vec::new();
        if let Some(o) = &self.old {
            parts.push(format!("old: {}", render(o)));
        }
        if let Some(n) = &self.new {
            parts.push(format!("new: {}", render(n)));
        }
        parts.join("; ")
    }
}

#[cfg(test)]
mod key_change_tests {
    use super::*;
    use wal2delta_model::{BaseType, ColumnType, Datum, TypeKind};

    fn schema(identity: ReplicaIdentity, keys: [bool; 2]) -> TableSchema {
        let ty = ColumnType {
            oid: 23,
            typmod: -1,
            name: "integer".into(),
            kind: TypeKind::Base(BaseType::Int4),
        };
        TableSchema {
            relation_oid: 1,
            table: TableName::new("public", "t"),
            columns: ["id", "v"]
                .iter()
                .zip(keys)
                .map(|(n, is_key)| Column {
                    name: (*n).into(),
                    ty: ty.clone(),
                    is_key,
                })
                .collect(),
            replica_identity: identity,
        }
    }

    fn row(id: Option<i32>, v: i32) -> Row {
        Row {
            values: vec![
                id.map_or(ColumnValue::Null, |i| ColumnValue::Value(Datum::Int32(i))),
                ColumnValue::Value(Datum::Int32(v)),
            ],
        }
    }

    #[test]
    fn only_a_changed_primary_key_is_a_key_change() {
        let pk = schema(ReplicaIdentity::Default, [true, false]);
        assert!(key_changed(&pk, &row(Some(1), 5), &row(Some(2), 5)));
        assert!(!key_changed(&pk, &row(Some(1), 5), &row(Some(1), 6)));
        // An old row that does not name the key (an identity index without it).
        assert!(!key_changed(&pk, &row(None, 5), &row(Some(2), 5)));
        // FULL with a primary key: only the key columns count.
        let full = schema(ReplicaIdentity::Full, [true, false]);
        assert!(!key_changed(&full, &row(Some(1), 5), &row(Some(1), 6)));
        assert!(key_changed(&full, &row(Some(1), 5), &row(Some(2), 5)));
        // No primary key: the key is the whole row under FULL; updates stay updates.
        let keyless = schema(ReplicaIdentity::Full, [true, true]);
        assert!(!key_changed(&keyless, &row(Some(1), 5), &row(Some(2), 6)));
    }
}
