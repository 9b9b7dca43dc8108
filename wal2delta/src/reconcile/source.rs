//! The source side of `reconcile`: every captured table read in one snapshot at a known
//! LSN, each row decoded as capture decodes and publishes it and masked as Silver masks it.
//!
//! **The snapshot.** A temporary logical replication slot is created with an exported
//! snapshot (`CREATE_REPLICATION_SLOT ... TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')`,
//! the code capture's initial snapshot uses). The snapshot holds exactly the transactions
//! whose commit record starts before the slot's consistent point `L`; every later commit
//! has a commit LSN at or above `L`. One REPEATABLE READ transaction imports it and reads
//! every table; the slot is dropped as soon as the snapshot is imported (it never
//! streams, so it holds no WAL).
//!
//! **The rows.** Read in key order and chunks by `wal2delta_cdc::snapshot::Chunker`, as
//! text decoded by `wal2delta_cdc::value` (capture's snapshot path); tokenized with
//! capture's `[tokenize]` tokenizer; encoded into the Avro envelope capture publishes,
//! written to Avro bytes and read back; turned into Bronze's `after` column by
//! `wal2delta_stream::avro::columns::envelope_columns` (what the bronze stage writes); and
//! masked with the table's `[silver.mask]` policies. Values are never logged.

use std::sync::Arc;

use crate::config::ColumnFilter;
use anyhow::{anyhow, Context, Result};
use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use tokio_postgres::Client;
use wal2delta_cdc::catalog::TypeCatalog;
use wal2delta_cdc::replication::ConnectParams;
use wal2delta_cdc::snapshot::{create_temporary_slot_exporting_snapshot, table_schema, Chunker};
use wal2delta_cdc::{source, value};
use wal2delta_lake::deltalake::arrow::array::{Array, AsArray, RecordBatch, RecordBatchOptions};
use wal2delta_lake::deltalake::arrow::datatypes::{Schema, SchemaRef};
use wal2delta_lake::silver::mask::Masking;
use wal2delta_model::{
    Change, ChangeOp, ColumnValue, Lsn, Row, TableName, TableSchema, TxPosition,
};
use wal2delta_stream::avro::binary::{frame_change, SchemaIds};
use wal2delta_stream::avro::columns::envelope_columns;
use wal2delta_stream::avro::envelope::{table_schemas, SourceInfo, TableSchemas};
use wal2delta_stream::registry::unframe;

use crate::capture::tokenize::{tokenized, Tokenizer};

/// The snapshot every table is read in: an open REPEATABLE READ transaction.
pub struct Snapshot {
    client: Client,
    /// The slot's consistent point.
    pub lsn: Lsn,
    types: TypeCatalog,
}

impl Snapshot {
    /// Creates a temporary slot exporting its snapshot, imports the snapshot into a new
    /// transaction, and lets the slot go.
    pub async fn take(dsn: &str) -> Result<Snapshot> {
        let params = ConnectParams::from_dsn(dsn)?;
        let client = source::connect(dsn).await?;
        // As the replication session prints bytea (`source::connect` leaves the server's
        // default, which may be `escape`).
        client.batch_execute("SET bytea_output = hex").await?;
        let nanos = wal2delta_model::clock::subsec_nanos();
        let slot = format!("wal2delta_reconcile_{}_{nanos}", std::process::id());
        tracing::info!(slot = %slot, "creating a temporary replication slot for the snapshot (waits for transactions in progress to end)");
        let exported = create_temporary_slot_exporting_snapshot(&params, &slot)
            .await
            .context("cannot create a temporary replication slot (it needs a free slot in max_replication_slots and a free max_wal_senders connection, and the REPLICATION attribute)")?;
        Chunker::begin_exported(&client, &exported.snapshot_name).await?;
        // The snapshot is imported: the slot (temporary) goes with its connection.
        drop(exported.connection);
        tracing::info!(lsn = %exported.consistent_point, "source snapshot taken");
        Ok(Snapshot {
            client,
            lsn: exported.consistent_point,
            types: TypeCatalog::default(),
        })
    }

    /// The tables the publication captures.
    pub async fn captured_tables(&self, publication: &str) -> Result<Vec<TableName>> {
        Ok(crate::capture::snapshot::publication_tables(&self.client, publication).await?)
    }

    /// Ends the snapshot transaction.
    pub async fn close(self) {
        let _ = Chunker::commit(&self.client).await;
    }
}

/// Writes one heartbeat message (as capture's heartbeats do), so that an idle source's
/// Silver watermark moves past the snapshot within one capture → Silver round instead of
/// waiting for capture's next heartbeat. Best effort.
pub async fn heartbeat(dsn: &str) {
    let result = async {
        let c = source::connect(dsn).await?;
        c.execute(
            "SELECT pg_logical_emit_message(false, 'wal2delta.heartbeat', now()::text)",
            &[],
        )
        .await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(error) = result {
        tracing::debug!(error = %error, "cannot write a heartbeat after the snapshot; Silver's watermark waits for capture's own");
    }
}

/// How the source's rows become what Silver holds.
pub struct Decoder {
    tokenizer: Option<Tokenizer>,
    prefix: String,
    source: SourceInfo,
}

impl Decoder {
    pub fn new(tokenizer: Option<Tokenizer>, prefix: &str) -> Decoder {
        Decoder {
            tokenizer,
            prefix: prefix.to_owned(),
            source: SourceInfo {
                name: prefix.to_owned(),
                db: String::new(),
            },
        }
    }
}

/// One source table, ready to be read.
pub struct SourceTable {
    pub name: TableName,
    decoded: Arc<TableSchema>,
    published: Arc<TableSchema>,
    avro: TableSchemas,
    chunker: Chunker,
    key_id: Option<String>,
    masking: Masking,
    /// The primary key's column names as Silver names them (Avro field names).
    pub key: Vec<String>,
    /// The columns as Silver would hold them (after masking).
    pub schema: SchemaRef,
    /// The source's columns `[source] exclude_columns` keeps out of capture: not read, not
    /// compared.
    pub excluded: Vec<String>,
}

impl SourceTable {
    /// `None` when the table has no primary key (Silver does not hold such tables).
    pub async fn open(
        snapshot: &mut Snapshot,
        decoder: &mut Decoder,
        name: &TableName,
        masking: Masking,
        filter: Option<&ColumnFilter>,
    ) -> Result<Option<SourceTable>> {
        let (mut decoded, pk) = table_schema(&snapshot.client, &mut snapshot.types, name).await?;
        if pk.is_empty() {
            return Ok(None);
        }
        // As capture publishes it: without the excluded columns, which are then never read.
        let mut excluded = Vec::new();
        if let Some(filter) = filter {
            decoded.columns.retain(|c| {
                let out = !filter.keeps(&c.name, c.is_key || pk.contains(&c.name));
                if out {
                    excluded.push(c.name.clone());
                }
                !out
            });
        }
        let decoded = Arc::new(decoded);
        let published = match &mut decoder.tokenizer {
            Some(t) => t.schema(&decoded),
            None => decoded.clone(),
        };
        let avro = table_schemas(&decoder.prefix, &published)?;
        let key = pk
            .iter()
            .map(|k| {
                decoded
                    .columns
                    .iter()
                    .position(|c| &c.name == k)
                    .map(|i| avro.field_names[i].clone())
                    .ok_or_else(|| anyhow!("primary-key column {k} is not a column of {name}"))
            })
            .collect::<Result<Vec<_>>>()?;
        masking
            .check_keys(&key)
            .map_err(|e| anyhow!("[silver.mask] of {name}: {e}"))?;
        let key_id = decoder
            .tokenizer
            .as_ref()
            .and_then(|t| t.key_id_for(name))
            .map(str::to_owned);
        let mut table = SourceTable {
            name: name.clone(),
            chunker: Chunker::new(decoded.clone(), &pk),
            decoded,
            published,
            avro,
            key_id,
            masking,
            key,
            schema: Arc::new(Schema::empty()),
            excluded,
        };
        table.schema = table.decode(decoder, Vec::new())?.schema();
        Ok(Some(table))
    }

    /// Decodes rows into the batch Silver would hold for them (without its `_` columns).
    fn decode(&self, decoder: &Decoder, rows: Vec<Row>) -> Result<RecordBatch> {
        let what = || format!("the rows of {}", self.name);
        // Read back as Bronze reads: with the lake's view of the schema (the same bytes,
        // temporal columns as their logical types, `stream::decode`).
        let reader = GenericDatumReader::builder(&self.avro.lake_value)
            .build()
            .with_context(what)?;
        let mut values: Vec<Value> = Vec::with_capacity(rows.len());
        for row in rows {
            let change = Change {
                table: self.name.clone(),
                op: ChangeOp::Read,
                before: None,
                after: Some(row),
                position: TxPosition {
                    commit_lsn: Lsn::ZERO,
                    lsn: Lsn::ZERO,
                    ordinal: 0,
                    xid: 0,
                    commit_ts_us: 0,
                },
            };
            let change = tokenized(decoder.tokenizer.as_ref(), &self.decoded, change).into_inner();
            // Through the Avro bytes capture sends, as Bronze receives them (the schema
            // ids are not read here).
            let framed = frame_change(
                &self.published,
                SchemaIds { key: 0, value: 0 },
                &decoder.source,
                &change,
                0,
                self.key_id.as_deref(),
                // Silver's text columns of a lake written with text cast to the decimal
                // for the comparison (`compare.rs`), so one encoding serves both.
                self.avro.decimals,
            )?;
            let (_, datum) =
                unframe(&framed.value).ok_or_else(|| anyhow!("{} is not framed", what()))?;
            values.push(reader.read_value(&mut &datum[..]).with_context(what)?);
        }
        let refs: Vec<&Value> = values.iter().collect();
        let columns = envelope_columns(&self.avro.lake_value, 0, &refs).with_context(what)?;
        let after = columns
            .fields
            .iter()
            .position(|f| f.name() == wal2delta_model::bronze::AFTER)
            .map(|i| columns.arrays[i].clone())
            .ok_or_else(|| anyhow!("the envelope of {} has no `after`", self.name))?;
        let after = after
            .as_struct_opt()
            .ok_or_else(|| anyhow!("`after` of {} is not a struct", self.name))?;
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::new(after.fields().clone())),
            after.columns().to_vec(),
            &RecordBatchOptions::new().with_row_count(Some(Array::len(after))),
        )
        .with_context(what)?;
        self.masking
            .mask_batch(&batch)
            .map_err(|e| anyhow!("cannot mask {}: {e}", self.name))
    }

    /// Reads the table from the start, chunk by chunk.
    pub fn rows(&self) -> SourceRows {
        SourceRows {
            after: None,
            done: false,
        }
    }
}

/// One chunk of decoded source rows.
pub struct SourceChunk {
    pub rows: RecordBatch,
    /// Rows that do not decode: how many, and the keys of those whose key columns do.
    pub undecodable: usize,
    pub undecodable_keys: RecordBatch,
}

/// A pass over one table, in key order.
pub struct SourceRows {
    after: Option<Vec<String>>,
    done: bool,
}

impl SourceRows {
    pub async fn next(
        &mut self,
        snapshot: &Snapshot,
        decoder: &Decoder,
        table: &SourceTable,
        chunk_rows: usize,
    ) -> Result<Option<SourceChunk>> {
        if self.done {
            return Ok(None);
        }
        let chunk = table
            .chunker
            .read(&snapshot.client, self.after.as_deref(), chunk_rows.max(1))
            .await?;
        match chunk.next_after {
            Some(k) => self.after = Some(k),
            None => self.done = true,
        }
        // Rows that do not decode: their key alone, when the key columns decode.
        let mut keys = Vec::new();
        for (_, raw) in &chunk.undecodable {
            let Some(image) = &raw.new else { continue };
            let values: Option<Vec<ColumnValue>> = table
                .decoded
                .columns
                .iter()
                .map(|c| {
                    if !c.is_key {
                        return Some(ColumnValue::Null);
                    }
                    let text = image.iter().find(|(n, _)| n == &c.name)?.1.as_deref()?;
                    value::parse_text(&c.ty, text).ok().map(ColumnValue::Value)
                })
                .collect();
            if let Some(values) = values {
                keys.push(Row { values });
            }
        }
        Ok(Some(SourceChunk {
            undecodable: chunk.undecodable.len(),
            undecodable_keys: table.decode(decoder, keys)?,
            rows: table.decode(decoder, chunk.rows)?,
        }))
    }
}
