//! Synthetic Bronze for a payments-like table, column for column what the bronze stage
//! writes, so that Silver can be measured on millions of rows without PostgreSQL and Kafka.
//!
//! Exactness: the schema is not written down here. [`reference_schema`] encodes one change
//! with capture's own encoder (`stream::avro::envelope`) and converts it with the bronze
//! stage's own converters (`stream::avro::columns`, `lake::bronze::bronze_batch`); every
//! synthetic batch is built against that schema and refused if it differs. Transaction END
//! records are built with `stream::transactions::transaction_columns`, and both tables are
//! appended with `lake::bronze::BronzeTable` (partitioned by ingest date, Kafka offsets as
//! `txn` actions in the same commit), as the bronze stage does.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use wal2delta_lake::bronze::{bronze_batch, KafkaCoordinates};
use wal2delta_lake::deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, BooleanArray, Decimal128Builder, Int32Array, Int64Array,
    Int64Builder, ListArray, RecordBatch, StringArray, StringBuilder, StructArray,
    TimestampMicrosecondArray, TimestampMicrosecondBuilder,
};
use wal2delta_lake::deltalake::arrow::buffer::{NullBuffer, OffsetBuffer};
use wal2delta_lake::deltalake::arrow::datatypes::{DataType, Fields, SchemaRef};
use wal2delta_model::{
    BaseType, Change, ChangeOp, Column, ColumnType, ColumnValue, Datum, Lsn, ReplicaIdentity, Row,
    Special, TableName, TableSchema, TxPosition, TypeKind,
};
use wal2delta_stream::avro::columns::{envelope_columns, key_column};
use wal2delta_stream::avro::envelope::{encode_change, table_schemas, SourceInfo};
use wal2delta_stream::transactions::{transaction_columns, TransactionEnd, TransactionRecord};

pub const SCHEMA: &str = "public";
pub const TABLE: &str = "payments";
pub const PREFIX: &str = "cdc";
/// `[kafka] topic_prefix` = `cdc`: the table's topic and the transactions topic.
pub const TOPIC: &str = "cdc.public.payments";
pub const TRANSACTIONS_TOPIC: &str = "cdc.transactions";
/// The Bronze table names the bronze stage gives them.
pub const TABLE_NAME: &str = "public.payments";
pub const TRANSACTIONS_TABLE: &str = "_wal2delta.transactions";
/// The registry id synthetic events claim to be written with.
const SCHEMA_ID: i32 = 1;

/// `CREATE TABLE public.payments (id bigint PRIMARY KEY, account_id bigint, merchant_id
/// bigint, amount numeric(18,2), currency text, status text, created_at timestamptz, note
/// text)` as capture sees it.
fn payments() -> TableSchema {
    let ty = |oid: u32, name: &str, typmod: i32, base: BaseType| ColumnType {
        oid,
        typmod,
        name: name.into(),
        kind: TypeKind::Base(base),
    };
    let col = |name: &str, ty: ColumnType, is_key: bool| Column {
        name: name.into(),
        ty,
        is_key,
    };
    let int8 = || ty(20, "bigint", -1, BaseType::Int8);
    let text = || ty(25, "text", -1, BaseType::Text);
    TableSchema {
        relation_oid: 16_384,
        table: TableName::new(SCHEMA, TABLE),
        columns: vec![
            col("id", int8(), true),
            col("account_id", int8(), false),
            col("merchant_id", int8(), false),
            col(
                "amount",
                ty(1700, "numeric", ((18 << 16) | 2) + 4, BaseType::Numeric),
                false,
            ),
            col("currency", text(), false),
            col("status", text(), false),
            col(
                "created_at",
                ty(1184, "timestamp with time zone", -1, BaseType::TimestampTz),
                false,
            ),
            col("note", text(), false),
        ],
        replica_identity: ReplicaIdentity::Default,
    }
}

/// The Bronze schema of the payments table: one snapshot row through capture's encoder and
/// the bronze stage's converters.
pub fn reference_schema() -> anyhow::Result<SchemaRef> {
    let t = payments();
    let schemas = table_schemas(PREFIX, &t)?;
    let values = Payment::of(1, 0);
    let row = Row {
        values: vec![
            ColumnValue::Value(Datum::Int64(values.id)),
            ColumnValue::Value(Datum::Int64(values.account_id)),
            ColumnValue::Value(Datum::Int64(values.merchant_id)),
            ColumnValue::Value(Datum::Numeric(values.amount.clone())),
            ColumnValue::Value(Datum::Text(values.currency.into())),
            ColumnValue::Value(Datum::Text(values.status.into())),
            ColumnValue::Value(Datum::TimestampTz(Special::Value(values.created_at))),
            ColumnValue::Value(Datum::Text(values.note.clone())),
        ],
    };
    let change = Change {
        table: t.table.clone(),
        op: ChangeOp::Read,
        before: None,
        after: Some(row),
        position: TxPosition {
            commit_lsn: Lsn(1000),
            lsn: Lsn(1000),
            ordinal: 1,
            xid: 0,
            commit_ts_us: 1_700_000_000_000_000,
        },
    };
    let source = SourceInfo {
        name: PREFIX.into(),
        db: "app".into(),
    };
    let encoded = encode_change(&t, &schemas, &source, &change, 1_700_000_000_000, None)?;
    let mut cols = envelope_columns(&schemas.lake_value, SCHEMA_ID as u32, &[&encoded.value])?;
    let (field, array) = key_column(&schemas.lake_key, &[encoded.key.as_ref()])?
        .ok_or_else(|| anyhow::anyhow!("the synthetic table has a primary key"))?;
    cols.fields.push(field);
    cols.arrays.push(array);
    let batch = bronze_batch(
        TABLE_NAME,
        TOPIC,
        cols.fields,
        cols.arrays,
        &[KafkaCoordinates {
            partition: 0,
            offset: 0,
            timestamp_ms: Some(1_700_000_000_000),
        }],
        1_700_000_000_000_000,
    )?;
    Ok(batch.schema())
}

fn mix(mut x: u64) -> u64 {
    // splitmix64: cheap, well spread, reproducible.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A deterministic random generator (splitmix64 over a counter).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The Kafka partition of a key: fixed per key, as with keyed messages.
pub fn partition_of(id: i64, partitions: i32) -> i32 {
    (mix(id as u64 ^ 0x5bd1_e995) % partitions as u64) as i32
}

/// One payment row; `version` 0 is the row as inserted, each update bumps it.
pub struct Payment {
    pub id: i64,
    pub account_id: i64,
    pub merchant_id: i64,
    pub amount: String,
    pub currency: &'static str,
    pub status: &'static str,
    pub created_at: i64,
    pub note: String,
}

impl Payment {
    /// `amount` in hundredths, as a `Decimal128(18, 2)` holds it.
    fn amount_cents(&self) -> i128 {
        let (units, hundredths) = self.amount.split_once('.').unwrap_or((&self.amount, "0"));
        units.parse::<i128>().unwrap_or(0) * 100 + hundredths.parse::<i128>().unwrap_or(0)
    }

    pub fn of(id: i64, version: u32) -> Self {
        const CURRENCIES: [&str; 5] = ["EUR", "USD", "GBP", "CHF", "PLN"];
        const STATUSES: [&str; 5] = ["authorized", "captured", "settled", "refunded", "failed"];
        let h = mix(id as u64);
        let v = mix((id as u64)
            .wrapping_mul(31)
            .wrapping_add(u64::from(version)));
        Payment {
            id,
            account_id: (h % 200_000) as i64,
            merchant_id: ((h >> 20) % 5_000) as i64,
            amount: format!("{}.{:02}", v % 100_000, (v >> 32) % 100),
            currency: CURRENCIES[((h >> 40) % 5) as usize],
            status: if version == 0 {
                "pending"
            } else {
                STATUSES[(v % 5) as usize]
            },
            created_at: 1_700_000_000_000_000 + id * 1_000,
            note: format!("order {id} revision {version}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Insert,
    Update,
    Delete,
}

impl Op {
    fn code(self) -> &'static str {
        match self {
            Op::Read => "r",
            Op::Insert => "c",
            Op::Update => "u",
            Op::Delete => "d",
        }
    }
}

/// One change event and where it sits in the source and in Kafka.
#[derive(Debug, Clone, Copy)]
pub struct Event {
    pub op: Op,
    pub id: i64,
    pub version: u32,
    pub lsn: i64,
    pub commit_lsn: i64,
    pub ordinal: i64,
    pub tx_id: i64,
    pub commit_ts_us: i64,
    pub partition: i32,
    pub offset: i64,
}

/// Builds Bronze batches with the reference schema.
pub struct Synth {
    schema: SchemaRef,
}

fn struct_fields(schema: &SchemaRef, name: &str) -> anyhow::Result<Fields> {
    match schema.field_with_name(name)?.data_type() {
        DataType::Struct(f) => Ok(f.clone()),
        other => bail!("Bronze column {name} is {other}, not a struct"),
    }
}

impl Synth {
    pub fn new() -> anyhow::Result<Self> {
        Ok(Synth {
            schema: reference_schema()?,
        })
    }

    /// The row images (`after`, and `before` of deletes: key columns only, as pgoutput
    /// sends them under the default replica identity).
    fn image(&self, events: &[Event], before: bool) -> anyhow::Result<ArrayRef> {
        let fields = struct_fields(&self.schema, if before { "before" } else { "after" })?;
        let present: Vec<bool> = events
            .iter()
            .map(|e| (e.op == Op::Delete) == before)
            .collect();
        let n = events.len();
        let rows: Vec<Option<Payment>> = events
            .iter()
            .zip(&present)
            .map(|(e, &p)| (p && !before).then(|| Payment::of(e.id, e.version)))
            .collect();
        let mut children: Vec<ArrayRef> = Vec::with_capacity(fields.len());
        for f in fields.iter() {
            let ints = |get: &dyn Fn(&Payment) -> i64| -> ArrayRef {
                let mut b = Int64Builder::with_capacity(n);
                for r in &rows {
                    b.append_option(r.as_ref().map(get));
                }
                Arc::new(b.finish())
            };
            let texts = |get: &dyn Fn(&Payment) -> &str| -> ArrayRef {
                let mut b = StringBuilder::with_capacity(n, n * 16);
                for r in &rows {
                    b.append_option(r.as_ref().map(get));
                }
                Arc::new(b.finish())
            };
            let array: ArrayRef = match f.name().as_str() {
                "id" => Arc::new(
                    events
                        .iter()
                        .zip(&present)
                        .map(|(e, &p)| p.then_some(e.id))
                        .collect::<Int64Array>(),
                ),
                _ if before => new_null_array(f.data_type(), n),
                "account_id" => ints(&|p| p.account_id),
                "merchant_id" => ints(&|p| p.merchant_id),
                // numeric(18,2): a decimal in Bronze (issue 40), from the text form.
                "amount" if matches!(f.data_type(), DataType::Decimal128(..)) => {
                    let mut b = Decimal128Builder::with_capacity(n);
                    for r in &rows {
                        b.append_option(r.as_ref().map(|p| p.amount_cents()));
                    }
                    Arc::new(b.finish().with_data_type(f.data_type().clone()))
                }
                "amount" => texts(&|p| &p.amount),
                "currency" => texts(&|p| p.currency),
                "status" => texts(&|p| p.status),
                "note" => texts(&|p| &p.note),
                "created_at" => {
                    let mut b = TimestampMicrosecondBuilder::with_capacity(n);
                    for r in &rows {
                        b.append_option(r.as_ref().map(|p| p.created_at));
                    }
                    Arc::new(b.finish().with_timezone("UTC"))
                }
                other => bail!("the payments image has an unexpected column {other}"),
            };
            if array.data_type() != f.data_type() {
                bail!(
                    "synthetic {}.{} is {}, Bronze has {}",
                    if before { "before" } else { "after" },
                    f.name(),
                    array.data_type(),
                    f.data_type()
                );
            }
            children.push(array);
        }
        Ok(Arc::new(StructArray::try_new(
            fields,
            children,
            Some(NullBuffer::from(present)),
        )?))
    }

    /// One Bronze batch of `events`, ingested at `ingested_at_us`.
    pub fn batch(&self, events: &[Event], ingested_at_us: i64) -> anyhow::Result<RecordBatch> {
        let n = events.len();
        let longs = |f: &dyn Fn(&Event) -> i64| -> ArrayRef {
            Arc::new(events.iter().map(|e| Some(f(e))).collect::<Int64Array>())
        };
        let utc = |f: &dyn Fn(&Event) -> i64| -> ArrayRef {
            Arc::new(
                events
                    .iter()
                    .map(|e| Some(f(e)))
                    .collect::<TimestampMicrosecondArray>()
                    .with_timezone("UTC"),
            )
        };
        let mut fields = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for f in self.schema.fields().iter() {
            let array: ArrayRef = match f.name().as_str() {
                "op" => Arc::new(StringArray::from_iter_values(
                    events.iter().map(|e| e.op.code()),
                )),
                "before" => self.image(events, true)?,
                "after" => self.image(events, false)?,
                "lsn" => longs(&|e| e.lsn),
                "commit_lsn" => longs(&|e| e.commit_lsn),
                "ordinal" => longs(&|e| e.ordinal),
                "tx_id" => longs(&|e| e.tx_id),
                "commit_ts" => utc(&|e| e.commit_ts_us),
                "snapshot" => Arc::new(
                    events
                        .iter()
                        .map(|e| Some(e.op == Op::Read))
                        .collect::<BooleanArray>(),
                ),
                "unchanged_toast_columns" => {
                    let DataType::List(item) = f.data_type() else {
                        bail!("unchanged_toast_columns is not a list");
                    };
                    Arc::new(ListArray::try_new(
                        item.clone(),
                        OffsetBuffer::new_zeroed(n),
                        Arc::new(StringArray::from(Vec::<&str>::new())),
                        None,
                    )?)
                }
                "token_key_id" => new_null_array(&DataType::Utf8, n),
                // Capture stamps the event shortly after the commit.
                "event_ts" => utc(&|e| e.commit_ts_us + 5_000),
                "schema_id" => Arc::new(Int32Array::from(vec![SCHEMA_ID; n])),
                "key" => {
                    let key_fields = struct_fields(&self.schema, "key")?;
                    if key_fields.len() != 1 || key_fields[0].name() != "id" {
                        bail!("the payments key is not (id)");
                    }
                    Arc::new(StructArray::try_new(
                        key_fields,
                        vec![longs(&|e| e.id)],
                        None,
                    )?)
                }
                // bronze_batch adds the Kafka coordinates and ingestion columns.
                "kafka_topic" => break,
                other => bail!("Bronze has a column the benchmark does not know: {other}"),
            };
            fields.push(f.as_ref().clone());
            arrays.push(array);
        }
        let coordinates: Vec<KafkaCoordinates> = events
            .iter()
            .map(|e| KafkaCoordinates {
                partition: e.partition,
                offset: e.offset,
                timestamp_ms: Some(e.commit_ts_us / 1000 + 10),
            })
            .collect();
        let batch = bronze_batch(
            TABLE_NAME,
            TOPIC,
            fields,
            arrays,
            &coordinates,
            ingested_at_us,
        )?;
        if batch.schema().fields() != self.schema.fields() {
            return Err(anyhow!(
                "synthetic Bronze schema differs from the bronze stage's:\n{:?}\n{:?}",
                batch.schema(),
                self.schema
            ));
        }
        Ok(batch)
    }
}

/// One transaction's END record: `events` events of the payments table.
pub fn end_record(
    tx_id: i64,
    commit_lsn: i64,
    commit_ts_us: i64,
    events: u64,
) -> TransactionRecord {
    let counts = std::collections::BTreeMap::from([(TABLE_NAME.to_owned(), events)]);
    TransactionRecord::End(TransactionEnd::new(
        tx_id as u32,
        commit_lsn as u64,
        commit_ts_us / 1000,
        &counts,
    ))
}

/// A Bronze batch of transaction records (the transactions topic has one partition).
pub fn transactions_batch(
    records: &[TransactionRecord],
    first_offset: i64,
    ingested_at_us: i64,
) -> anyhow::Result<RecordBatch> {
    let refs: Vec<&TransactionRecord> = records.iter().collect();
    let (fields, arrays) = transaction_columns(&refs);
    let coordinates: Vec<KafkaCoordinates> = (0..records.len() as i64)
        .map(|i| KafkaCoordinates {
            partition: 0,
            offset: first_offset + i,
            timestamp_ms: Some(ingested_at_us / 1000),
        })
        .collect();
    bronze_batch(
        TRANSACTIONS_TABLE,
        TRANSACTIONS_TOPIC,
        fields,
        arrays,
        &coordinates,
        ingested_at_us,
    )
    .context("transaction records")
}
