//! Reading existing rows: the initial snapshot, consistent with the slot.
//!
//! Consistency. A change carries the position it is ordered by: `(commit LSN, ordinal)`
//! for streamed changes; for a snapshot row, the LSN of the snapshot it was read in.
//! Consumers keep, per key, the change with the highest position.
//!
//! - The first snapshot of a new slot is read inside the snapshot the slot exported when
//!   it was created ([`create_slot_exporting_snapshot`]): it holds exactly the commits
//!   before the slot's consistent point, and the slot streams exactly the commits after it
//!   — no gap, no overlap. Its rows carry the consistent point.
//! - A snapshot resumed after a crash, or of a table added later, reads each chunk in a
//!   fresh snapshot exported by a *temporary* slot created for it ([`begin_fresh`]). Such
//!   a snapshot, like the first one, holds exactly the commits whose commit record starts
//!   before the temporary slot's consistent point `C`, and misses exactly those at or
//!   after it; and the capture slot, confirmed at or before the WAL position when the
//!   temporary slot was created (≤ `C`), streams every commit at or after `C`.
//!   A position merely read before taking a snapshot (`pg_current_wal_insert_lsn()`)
//!   does not have this property: a transaction whose commit record is already written
//!   but which is not yet visible (it is still ending, or waiting for a synchronous
//!   standby) is missing from the snapshot although its commit lies before that
//!   position, so its change would rank below the stale snapshot row — a deleted row
//!   would come back.
//!
//! Snapshot rows carry `C − 1` ([`rows_position`]) rather than `C`: the first commit
//! streamed after the consistent point can start exactly at `C`, and it must outrank the
//! rows whatever their ordinals (snapshot rows number their ordinals by row). Every commit
//! the snapshot holds starts before `C`, so at or below `C − 1`, and its effect is in the
//! row. Rows seen twice are harmless under the highest-position rule.
//!
//! Chunks follow the primary key (keyset pagination), or `ctid` for tables without one, so
//! progress is a key and a killed snapshot resumes after the last finished chunk.
//! Values are read with the simple-query protocol, i.e. as the types' output functions
//! print them — the same text pgoutput sends — and decoded by [`crate::value`].

use std::sync::Arc;

use tokio_postgres::{Client, SimpleQueryMessage};
use wal2delta_model::table::quote_ident;
use wal2delta_model::{Column, ColumnValue, ReplicaIdentity, Row, TableName, TableSchema};

use crate::catalog::TypeCatalog;
use crate::decoder::RawRow;
use crate::replication::{ConnectParams, ReplicationConnection};
use crate::{value, CdcError, Lsn};

/// A slot created over the replication protocol, with the snapshot it exported.
pub struct ExportedSlot {
    /// Keep this connection open and idle until the snapshot has been imported.
    pub connection: ReplicationConnection,
    pub consistent_point: Lsn,
    pub snapshot_name: String,
}

/// Creates the slot and exports its snapshot (`CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')`).
/// `failover` makes it a failover slot (PostgreSQL 17; `setup` has checked the version).
pub async fn create_slot_exporting_snapshot(
    params: &ConnectParams,
    slot: &str,
    failover: bool,
) -> Result<ExportedSlot, CdcError> {
    create_exporting(params, slot, "", if failover { ", FAILOVER" } else { "" }).await
}

/// Like [`create_slot_exporting_snapshot`], with a `TEMPORARY` slot: PostgreSQL drops it
/// when `connection` closes, and it never streams. Used to read the source at an exact
/// point in the commit order (`reconcile`): the snapshot holds exactly the commits whose
/// commit record starts before `consistent_point`.
pub async fn create_temporary_slot_exporting_snapshot(
    params: &ConnectParams,
    slot: &str,
) -> Result<ExportedSlot, CdcError> {
    create_exporting(params, slot, " TEMPORARY", "").await
}

async fn create_exporting(
    params: &ConnectParams,
    slot: &str,
    temporary: &str,
    options: &str,
) -> Result<ExportedSlot, CdcError> {
    let mut connection = ReplicationConnection::connect(params).await?;
    let rows = connection
        .simple_query(&format!(
            "CREATE_REPLICATION_SLOT {}{temporary} LOGICAL pgoutput (SNAPSHOT 'export'{options})",
            quote_ident(slot)
        ))
        .await?;
    let row = rows
        .first()
        .ok_or_else(|| CdcError::Protocol("CREATE_REPLICATION_SLOT returned no row".into()))?;
    let field = |i: usize| row.get(i).cloned().flatten();
    let consistent_point = field(1).and_then(|s| s.parse().ok()).ok_or_else(|| {
        CdcError::Protocol("CREATE_REPLICATION_SLOT returned no consistent point".into())
    })?;
    let snapshot_name = field(2)
        .ok_or_else(|| CdcError::Protocol("CREATE_REPLICATION_SLOT exported no snapshot".into()))?;
    Ok(ExportedSlot {
        connection,
        consistent_point,
        snapshot_name,
    })
}

/// The position of rows read in a snapshot exported at `consistent_point`: one below it,
/// so that a commit starting exactly at the consistent point (streamed, not in the
/// snapshot) outranks them (see the module docs).
pub fn rows_position(consistent_point: Lsn) -> Lsn {
    Lsn(consistent_point.0.saturating_sub(1))
}

/// The schema of a table as the stream would describe it (same relation OID, columns,
/// types and key — the primary key, or for tables without one the replica identity's
/// columns, as pgoutput flags them), built from the catalog, and its primary key.
pub async fn table_schema(
    client: &Client,
    types: &mut TypeCatalog,
    table: &TableName,
) -> Result<(TableSchema, Vec<String>), CdcError> {
    let rel = client
        .query_one(
            "SELECT c.oid, c.relreplident::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.name],
        )
        .await?;
    let oid: u32 = rel.get(0);
    let ident: String = rel.get(1);
    let pk = crate::catalog::primary_key_columns(client, oid).await?;
    let identity = ReplicaIdentity::from_code(ident.bytes().next().unwrap_or(b'd'));
    let ident_index: Vec<String> = client
        .query(
            "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = $1 AND i.indisreplident",
            &[&oid],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let cols = client
        .query(
            "SELECT attname::text, atttypid, atttypmod FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            &[&oid],
        )
        .await?;
    let mut columns = Vec::with_capacity(cols.len());
    for c in cols {
        let name: String = c.get(0);
        let ty = types.resolve(client, c.get(1), c.get(2)).await?;
        let is_key = if !pk.is_empty() {
            pk.contains(&name)
        } else {
            match identity {
                ReplicaIdentity::Full => true,
                ReplicaIdentity::Index => ident_index.contains(&name),
                _ => false,
            }
        };
        columns.push(Column { is_key, name, ty });
    }
    Ok((
        TableSchema {
            relation_oid: oid,
            table: table.clone(),
            columns,
            replica_identity: identity,
        },
        pk,
    ))
}

/// The planner's row estimate (`reltuples`), 0 when unknown.
pub async fn estimate_rows(client: &Client, table: &TableName) -> Result<i64, CdcError> {
    let row = client
        .query_one(
            "SELECT GREATEST(c.reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.name],
        )
        .await?;
    Ok(row.get(0))
}

/// One chunk read from a table.
#[derive(Debug)]
pub struct Chunk {
    pub rows: Vec<Row>,
    /// The key of the last row, where the next chunk starts (`None` when the table ended).
    pub next_after: Option<Vec<String>>,
    /// Rows that could not be decoded: the reason and the row as read.
    pub undecodable: Vec<(String, RawRow)>,
}

/// Reads a table in key order, chunk by chunk, on one connection.
pub struct Chunker {
    schema: Arc<TableSchema>,
    /// Key columns: the primary key, or `ctid` when there is none.
    key: Vec<String>,
    /// Their type names for literals (`int4`, `text`, `tid`...).
    key_types: Vec<String>,
    uses_ctid: bool,
    /// Only rows matching this SQL condition are read (`snapshot --where`).
    condition: Option<String>,
}

/// Whether `condition` stays one expression when written between parentheses into a
/// larger query: its parentheses balance outside quoted text, and it has no `;`, comment
/// or dollar quote there (so it cannot end the expression, the statement or the rest of
/// the line). The database checks the rest ([`Chunker::check_condition`]).
fn one_expression(condition: &str) -> Result<(), &'static str> {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut chars = condition.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == q {
                // A doubled quote stays inside the quoted text.
                if chars.peek() == Some(&q) {
                    chars.next();
                } else {
                    quote = None;
                }
            }
            continue;
        }
        match c {
            '\'' | '"' => quote = Some(c),
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("closes a parenthesis it did not open");
                }
            }
            ';' => return Err("holds a ';': write one condition, no statement after it"),
            '$' => return Err("holds a '$': write the condition without dollar quoting"),
            '-' if chars.peek() == Some(&'-') => {
                return Err("holds a comment ('--'): write the condition without one")
            }
            '/' if chars.peek() == Some(&'*') => {
                return Err("holds a comment ('/*'): write the condition without one")
            }
            _ => {}
        }
    }
    if quote.is_some() {
        return Err("leaves a quote open");
    }
    if depth != 0 {
        return Err("leaves a parenthesis open");
    }
    if condition.trim().is_empty() {
        return Err("is empty");
    }
    Ok(())
}

impl Chunker {
    /// Chunks by `primary_key` (column names in key order), or by `ctid` when empty.
    pub fn new(schema: Arc<TableSchema>, primary_key: &[String]) -> Chunker {
        let uses_ctid = primary_key.is_empty();
        let (key, key_types) = if uses_ctid {
            (vec!["ctid".to_owned()], vec!["tid".to_owned()])
        } else {
            primary_key
                .iter()
                .map(|k| {
                    let ty = schema
                        .columns
                        .iter()
                        .find(|c| &c.name == k)
                        .map(|c| c.ty.name.clone())
                        .unwrap_or_else(|| "text".into());
                    (k.clone(), ty)
                })
                .unzip()
        };
        Chunker {
            schema,
            key,
            key_types,
            uses_ctid,
            condition: None,
        }
    }

    /// Reads only the rows matching `condition` (SQL over the table's columns), checked
    /// first by [`Chunker::check_condition`].
    pub fn with_condition(mut self, condition: Option<String>) -> Chunker {
        self.condition = condition;
        self
    }

    /// Refuses a condition that is not one valid SQL expression over `table`'s rows:
    /// prepared (one statement only, so nothing can follow it), never run.
    pub async fn check_condition(
        client: &Client,
        table: &TableName,
        condition: &str,
    ) -> Result<(), CdcError> {
        if let Err(why) = one_expression(condition) {
            return Err(CdcError::Check(format!(
                "the condition {condition:?} on {table} {why}"
            )));
        }
        client
            .prepare(&format!(
                "SELECT 1 FROM {} WHERE ({condition})",
                table.quoted()
            ))
            .await
            .map(|_| ())
            .map_err(|e| {
                let reason = e
                    .as_db_error()
                    .map(|d| d.message().to_owned())
                    .unwrap_or_else(|| e.to_string());
                CdcError::Check(format!(
                    "the condition {condition:?} is not a valid SQL condition on {table}: {reason}"
                ))
            })
    }

    /// Opens a REPEATABLE READ transaction importing an exported snapshot.
    pub async fn begin_exported(client: &Client, snapshot_name: &str) -> Result<(), CdcError> {
        client
            .batch_execute(&format!(
                "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{}'",
                snapshot_name.replace('\'', "''")
            ))
            .await?;
        Ok(())
    }

    /// Opens a REPEATABLE READ transaction in a fresh snapshot exported by a temporary
    /// slot named `slot`; returns the position its rows carry (see the module docs).
    /// Creating the slot waits for the transactions in progress to end.
    pub async fn begin_fresh(
        client: &Client,
        params: &ConnectParams,
        slot: &str,
    ) -> Result<Lsn, CdcError> {
        let exported = create_temporary_slot_exporting_snapshot(params, slot).await?;
        Self::begin_exported(client, &exported.snapshot_name).await?;
        // Imported: the temporary slot goes with its connection.
        drop(exported.connection);
        Ok(rows_position(exported.consistent_point))
    }

    pub async fn commit(client: &Client) -> Result<(), CdcError> {
        client.batch_execute("COMMIT").await?;
        Ok(())
    }

    /// Reads up to `limit` rows after `after` (a key as text) in key order.
    pub async fn read(
        &self,
        client: &Client,
        after: Option<&[String]>,
        limit: usize,
    ) -> Result<Chunk, CdcError> {
        let cols: Vec<String> = self
            .schema
            .columns
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect();
        let key_cols: Vec<String> = self
            .key
            .iter()
            .map(|k| {
                if self.uses_ctid {
                    k.clone()
                } else {
                    quote_ident(k)
                }
            })
            .collect();
        let mut sql = format!(
            "SELECT {}, {} FROM {}",
            key_list(&key_cols),
            cols.join(", "),
            self.schema.table.quoted()
        );
        if let Some(after) = after {
            if after.len() != self.key.len() {
                return Err(CdcError::Check(format!(
                    "snapshot progress of {} has a key of the wrong shape",
                    self.schema.table
                )));
            }
            let literals: Vec<String> = after
                .iter()
                .zip(&self.key_types)
                .map(|(v, t)| format!("'{}'::{}", v.replace('\'', "''"), t))
                .collect();
            sql += &format!(
                " WHERE ({}) > ({})",
                key_cols.join(", "),
                literals.join(", ")
            );
        }
        if let Some(condition) = &self.condition {
            sql += if after.is_some() { " AND " } else { " WHERE " };
            sql += &format!("({condition})");
        }
        sql += &format!(" ORDER BY {} LIMIT {limit}", key_cols.join(", "));
        let nkey = self.key.len();
        let mut rows = Vec::new();
        let mut undecodable = Vec::new();
        let mut last_key = None;
        for msg in client.simple_query(&sql).await? {
            let SimpleQueryMessage::Row(r) = msg else {
                continue;
            };
            let key: Vec<String> = (0..nkey)
                .map(|i| r.get(i).unwrap_or("").to_owned())
                .collect();
            let mut values = Vec::with_capacity(self.schema.columns.len());
            let mut error = None;
            for (i, col) in self.schema.columns.iter().enumerate() {
                values.push(match r.get(nkey + i) {
                    None => ColumnValue::Null,
                    Some(text) => match value::parse_text(&col.ty, text) {
                        Ok(d) => ColumnValue::Value(d),
                        Err(e) => {
                            error.get_or_insert_with(|| format!("column {}: {e}", col.name));
                            ColumnValue::Null
                        }
                    },
                });
            }
            match error {
                None => rows.push(Row { values }),
                Some(reason) => {
                    let image = self
                        .schema
                        .columns
                        .iter()
                        .enumerate()
                        .map(|(i, c)| (c.name.clone(), r.get(nkey + i).map(str::to_owned)))
                        .collect();
                    undecodable.push((
                        reason,
                        RawRow {
                            old: None,
                            new: Some(image),
                        },
                    ));
                }
            }
            last_key = Some(key);
        }
        let full = rows.len() + undecodable.len() == limit;
        Ok(Chunk {
            rows,
            next_after: if full { last_key } else { None },
            undecodable,
        })
    }

    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }
}

fn key_list(cols: &[String]) -> String {
    cols.join(", ")
}

#[cfg(test)]
mod tests {
    use super::one_expression;

    #[test]
    fn a_condition_must_stay_one_expression() {
        for ok in [
            "id < 100",
            "status = 'it''s (open'",
            "\"Weird ) Name\" > 3 AND (a OR b)",
            "created_at >= now() - interval '1 day'",
            "note = 'a; b -- c /* d'",
        ] {
            assert_eq!(one_expression(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "true) OR (true",
            "(id < 3",
            "id < 3; DELETE FROM t",
            "true -- rest",
            "true /* x */",
            "name = $$x$$",
            "name = 'open",
            "\"open",
        ] {
            assert!(one_expression(bad).is_err(), "{bad:?} accepted");
        }
    }
}
