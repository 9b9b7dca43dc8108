//! Change envelopes read from their bytes straight into Bronze's columns.

use std::sync::Arc;

use apache_avro::schema::Schema;
use arrow::array::{ArrayRef, Int32Array, ListArray};
use arrow::buffer::{OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{DataType, Field, TimeUnit};

use wal2delta_model::bronze::{
    AFTER, BEFORE, COMMIT_LSN, COMMIT_TS, EVENT_TS, KEY, LSN, OP, ORDINAL, OUT_OF_RANGE_VALUES,
    SCHEMA_ID, SNAPSHOT, TOKEN_KEY_ID, TX_ID, UNCHANGED_TOAST_COLUMNS,
};

use super::buffers::{Buffer, Scalars, Varlen};
use super::plan::{Compiler, Node, Shape};
use super::read::{out_of_range_entries, read, scalar, skip, texts, Context, ReadError, Scalar};
use crate::avro::arrow::{ArrowMappingError, LIST_ITEM};
use crate::avro::columns::{out_of_range_list, EnvelopeColumns};
use crate::avro::cursor::Cursor;
use crate::avro::envelope::OUT_OF_RANGE_VALUES as ENVELOPE_OUT_OF_RANGE;

fn not_envelope(reason: &str) -> ArrowMappingError {
    ArrowMappingError::Unsupported {
        path: "value".into(),
        kind: format!("record that is not a wal2delta change envelope ({reason})"),
    }
}

/// A field of the envelope and what it becomes.
#[derive(Debug)]
enum Slot {
    Image(usize),
    Source(SourcePlan),
    Op(Shape),
    EventTs(Shape),
    Ordinal(Shape),
    Toast(Shape),
    TokenKeyId(Shape),
    OutOfRange(Shape),
    Skip(Shape),
}

/// The `source` block: which of its fields give columns. `nullable` is the branch count and
/// null branch of a `["null", Source]` union.
#[derive(Debug)]
struct SourcePlan {
    nullable: Option<(usize, Option<usize>)>,
    fields: Vec<(SourceField, Shape)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceField {
    TsMs,
    Snapshot,
    TxId,
    Lsn,
    CommitLsn,
    Other,
}

/// How events of one value schema are read: compiled once per schema id.
#[derive(Debug)]
pub struct EnvelopePlan {
    schema_id: u32,
    slots: Vec<Slot>,
    /// `before` and `after`.
    images: [(Node, DataType); 2],
}

impl EnvelopePlan {
    /// The plan of envelopes written with `schema` (the lake's view), registered as
    /// `schema_id`. Fails for a schema that is not a change envelope or holds a type Bronze
    /// has no column for, as [`crate::avro::columns::envelope_columns`] does.
    pub fn new(schema: &Schema, schema_id: u32) -> Result<Self, ArrowMappingError> {
        let compiler = Compiler::new(schema)?;
        let Schema::Record(envelope) = schema else {
            return Err(not_envelope("not a record"));
        };
        let mut images: [Option<(Node, DataType)>; 2] = [None, None];
        let mut slots = Vec::with_capacity(envelope.fields.len());
        let (mut has_op, mut has_source) = (false, false);
        for f in &envelope.fields {
            let shape = || compiler.shape(&f.schema, &f.name);
            slots.push(match f.name.as_str() {
                n @ (BEFORE | AFTER) => {
                    let i = usize::from(n == AFTER);
                    let node = compiler.node(&f.schema, n)?;
                    images[i] = Some((node.clone(), node.data_type()));
                    Slot::Image(i)
                }
                "source" => {
                    has_source = true;
                    Slot::Source(SourcePlan::new(&compiler, &f.schema)?)
                }
                OP => {
                    has_op = true;
                    Slot::Op(shape()?)
                }
                "ts_ms" => Slot::EventTs(shape()?),
                ORDINAL => Slot::Ordinal(shape()?),
                UNCHANGED_TOAST_COLUMNS => Slot::Toast(shape()?),
                TOKEN_KEY_ID => Slot::TokenKeyId(shape()?),
                ENVELOPE_OUT_OF_RANGE => Slot::OutOfRange(shape()?),
                _ => Slot::Skip(shape()?),
            });
        }
        let [Some(before), Some(after)] = images else {
            return Err(not_envelope("no `before` or no `after` field"));
        };
        if !has_source {
            return Err(not_envelope("no `source` field"));
        }
        if !has_op {
            return Err(not_envelope("no `op` field"));
        }
        Ok(EnvelopePlan {
            schema_id,
            slots,
            images: [before, after],
        })
    }
}

impl SourcePlan {
    fn new<'s>(c: &Compiler<'s>, schema: &'s Schema) -> Result<Self, ArrowMappingError> {
        let not_record = || not_envelope("`source` is not a record");
        let (nullable, record) = match c.resolve(schema)? {
            Schema::Union(u) => {
                let variants = u.variants();
                let null = variants.iter().position(|v| matches!(v, Schema::Null));
                let others: Vec<&Schema> = variants
                    .iter()
                    .filter(|v| !matches!(v, Schema::Null))
                    .collect();
                match others.as_slice() {
                    [only] => (Some((variants.len(), null)), c.resolve(only)?),
                    _ => return Err(not_record()),
                }
            }
            other => (None, other),
        };
        let Schema::Record(r) = record else {
            return Err(not_record());
        };
        let mut fields = Vec::with_capacity(r.fields.len());
        for f in &r.fields {
            let which = match f.name.as_str() {
                "ts_ms" => SourceField::TsMs,
                "snapshot" => SourceField::Snapshot,
                "txId" => SourceField::TxId,
                "lsn" => SourceField::Lsn,
                "commit_lsn" => SourceField::CommitLsn,
                _ => SourceField::Other,
            };
            fields.push((which, c.shape(&f.schema, &format!("source.{}", f.name))?));
        }
        Ok(SourcePlan { nullable, fields })
    }
}

/// Where a change sits in its transaction, as read: what a quarantined event keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventPosition {
    pub lsn: Option<i64>,
    pub commit_lsn: Option<i64>,
    pub ordinal: Option<i64>,
}

/// A key schema's column: its node and whether the key is a primary key the lake gets a
/// `key` column for (see [`crate::avro::columns::key_column`]). A key without one is still
/// read, for its out-of-range dates.
#[derive(Debug)]
pub struct KeyPlan {
    node: Node,
    data_type: DataType,
    column: bool,
}

impl KeyPlan {
    pub fn new(schema: &Schema) -> Result<Self, ArrowMappingError> {
        let primary = !matches!(schema, Schema::Record(r)
            if r.attributes.get("pg.primary_key") == Some(&serde_json::Value::Bool(false)));
        let node = Compiler::new(schema)?.node(schema, KEY)?;
        let data_type = node.data_type();
        let empty = matches!(&data_type, DataType::Struct(f) if f.is_empty());
        Ok(KeyPlan {
            node,
            data_type,
            column: primary && !empty,
        })
    }
}

/// The columns of one run of events (one value schema, one key schema), read event by
/// event.
pub struct EnvelopeReader {
    plan: Arc<EnvelopePlan>,
    key: Option<(Arc<KeyPlan>, Buffer)>,
    images: [Buffer; 2],
    op: Varlen,
    lsn: Scalars<i64>,
    commit_lsn: Scalars<i64>,
    ordinal: Scalars<i64>,
    tx_id: Scalars<i64>,
    commit_ts: Scalars<i64>,
    snapshot: Scalars<bool>,
    toast_offsets: Vec<i32>,
    toast: Varlen,
    token_key_id: Varlen,
    event_ts: Scalars<i64>,
    oor_offsets: Vec<i32>,
    oor_valid: Vec<bool>,
    oor_columns: Varlen,
    oor_values: Varlen,
    rows: usize,
    ctx: Context,
}

/// Metadata of one envelope, collected while its images are read.
#[derive(Default)]
struct Meta<'b> {
    op: Option<&'b str>,
    event_ts: Option<i64>,
    ordinal: Option<i64>,
    token_key_id: Option<&'b str>,
    toast: Vec<&'b str>,
    source: Option<SourceMeta>,
}

#[derive(Default)]
struct SourceMeta {
    ts_ms: Option<i64>,
    snapshot: bool,
    tx_id: Option<i64>,
    lsn: Option<i64>,
    commit_lsn: Option<i64>,
}

fn long_of(s: Scalar) -> Option<i64> {
    match s {
        Scalar::Long(l) => Some(l),
        _ => None,
    }
}

fn push_opt(s: &mut Scalars<i64>, v: Option<i64>) {
    match v {
        Some(v) => s.push(v),
        None => s.push_null(),
    }
}

impl EnvelopeReader {
    pub fn new(plan: Arc<EnvelopePlan>, key: Option<Arc<KeyPlan>>) -> Self {
        let images = [
            Buffer::new(&plan.images[0].0),
            Buffer::new(&plan.images[1].0),
        ];
        EnvelopeReader {
            key: key.map(|k| {
                let buf = Buffer::new(&k.node);
                (k, buf)
            }),
            plan,
            images,
            op: Varlen::default(),
            lsn: Scalars::default(),
            commit_lsn: Scalars::default(),
            ordinal: Scalars::default(),
            tx_id: Scalars::default(),
            commit_ts: Scalars::default(),
            snapshot: Scalars::default(),
            toast_offsets: vec![0],
            toast: Varlen::default(),
            token_key_id: Varlen::default(),
            event_ts: Scalars::default(),
            oor_offsets: vec![0],
            oor_valid: Vec::new(),
            oor_columns: Varlen::default(),
            oor_values: Varlen::default(),
            rows: 0,
            ctx: Context::default(),
        }
    }

    /// Events read so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Reads one event: its value's Avro datum and its key's (none for a TRUNCATE). On an
    /// error nothing of the event stays in the columns.
    pub fn read_event(
        &mut self,
        value: &[u8],
        key: Option<&[u8]>,
    ) -> Result<EventPosition, ReadError> {
        let rows = self.rows;
        self.ctx.out_of_range.clear();
        match self.read_inner(value, key) {
            Ok(p) => {
                self.rows += 1;
                Ok(p)
            }
            Err(e) => {
                self.truncate(rows);
                Err(e)
            }
        }
    }

    fn read_inner(&mut self, value: &[u8], key: Option<&[u8]>) -> Result<EventPosition, ReadError> {
        let plan = self.plan.clone();
        let mut cur = Cursor::new(value);
        let mut meta = Meta::default();
        for slot in &plan.slots {
            match slot {
                Slot::Image(i) => {
                    self.ctx.path.clear();
                    self.ctx.path.push_str(if *i == 0 { BEFORE } else { AFTER });
                    read(
                        &plan.images[*i].0,
                        &mut self.images[*i],
                        &mut cur,
                        &mut self.ctx,
                    )?;
                }
                Slot::Source(s) => meta.source = s.read(&mut cur)?,
                Slot::Op(shape) => meta.op = text_of(scalar(shape, &mut cur)?),
                Slot::EventTs(shape) => meta.event_ts = long_of(scalar(shape, &mut cur)?),
                Slot::Ordinal(shape) => meta.ordinal = long_of(scalar(shape, &mut cur)?),
                Slot::Toast(shape) => texts(shape, &mut cur, &mut meta.toast)?,
                Slot::TokenKeyId(shape) => meta.token_key_id = text_of(scalar(shape, &mut cur)?),
                Slot::OutOfRange(shape) => {
                    out_of_range_entries(shape, &mut cur, &mut self.ctx.out_of_range)?
                }
                Slot::Skip(shape) => skip(shape, &mut cur)?,
            }
        }
        let Some(source) = meta.source else {
            return Err(ReadError::Unrepresentable(
                "the event has no `source` record",
            ));
        };
        let Some(op) = meta.op else {
            return Err(ReadError::Unrepresentable("the event has no `op`"));
        };
        match (&mut self.key, key) {
            (Some((plan, buf)), Some(datum)) => {
                self.ctx.path.clear();
                self.ctx.path.push_str(KEY);
                read(&plan.node, buf, &mut Cursor::new(datum), &mut self.ctx).map_err(
                    |e| match e {
                        ReadError::Malformed(m) => ReadError::MalformedKey(m),
                        other => other,
                    },
                )?;
            }
            (Some((_, buf)), None) => buf.push_null(),
            (None, Some(_)) => {
                return Err(ReadError::Unrepresentable(
                    "a keyed event in a run read without a key schema",
                ))
            }
            (None, None) => {}
        }
        // Everything read: the event's scalar columns.
        self.op.push(op.as_bytes())?;
        match meta.token_key_id {
            Some(t) => self.token_key_id.push(t.as_bytes())?,
            None => self.token_key_id.push_null(),
        }
        for name in &meta.toast {
            self.toast.push(name.as_bytes())?;
        }
        self.toast_offsets
            .push(i32::try_from(self.toast.len()).map_err(|_| ReadError::Full)?);
        push_opt(&mut self.lsn, source.lsn);
        push_opt(&mut self.commit_lsn, source.commit_lsn);
        push_opt(&mut self.ordinal, meta.ordinal);
        push_opt(&mut self.tx_id, source.tx_id);
        push_opt(
            &mut self.commit_ts,
            source.ts_ms.and_then(|ms| ms.checked_mul(1000)),
        );
        self.snapshot.push(source.snapshot);
        push_opt(
            &mut self.event_ts,
            meta.event_ts.and_then(|ms| ms.checked_mul(1000)),
        );
        for f in &self.ctx.out_of_range {
            self.oor_columns.push(f.column.as_bytes())?;
            self.oor_values.push(f.value.as_bytes())?;
        }
        self.oor_valid.push(!self.ctx.out_of_range.is_empty());
        self.oor_offsets
            .push(i32::try_from(self.oor_columns.len()).map_err(|_| ReadError::Full)?);
        Ok(EventPosition {
            lsn: source.lsn,
            commit_lsn: source.commit_lsn,
            ordinal: meta.ordinal,
        })
    }

    /// Takes every column back to its first `rows` rows.
    fn truncate(&mut self, rows: usize) {
        for b in &mut self.images {
            b.truncate(rows);
        }
        if let Some((_, b)) = &mut self.key {
            b.truncate(rows);
        }
        self.op.truncate(rows);
        self.token_key_id.truncate(rows);
        for s in [
            &mut self.lsn,
            &mut self.commit_lsn,
            &mut self.ordinal,
            &mut self.tx_id,
            &mut self.commit_ts,
            &mut self.event_ts,
        ] {
            s.truncate(rows);
        }
        self.snapshot.truncate(rows);
        self.toast_offsets.truncate(rows + 1);
        self.toast
            .truncate(*self.toast_offsets.last().unwrap_or(&0) as usize);
        self.oor_valid.truncate(rows);
        self.oor_offsets.truncate(rows + 1);
        let entries = *self.oor_offsets.last().unwrap_or(&0) as usize;
        self.oor_columns.truncate(entries);
        self.oor_values.truncate(entries);
    }

    /// The columns of the events read, in the order of
    /// [`crate::avro::columns::envelope_columns`], then `key` (for a run with a primary
    /// key) and `out_of_range_values`; the reader is left empty.
    pub fn finish(&mut self) -> Result<EnvelopeColumns, ArrowMappingError> {
        let out = self.take_columns();
        if out.is_err() {
            // Columns half taken: start afresh rather than read on into them.
            *self =
                EnvelopeReader::new(self.plan.clone(), self.key.as_ref().map(|(k, _)| k.clone()));
        }
        self.rows = 0;
        out
    }

    fn take_columns(&mut self) -> Result<EnvelopeColumns, ArrowMappingError> {
        let build = |path: &str| {
            let path = path.to_owned();
            move |reason: String| ArrowMappingError::Build { path, reason }
        };
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let int64 =
            |s: &mut Scalars<i64>, name: &str| -> Result<(Field, ArrayRef), ArrowMappingError> {
                let mut b = Buffer::I64(std::mem::take(s));
                Ok((
                    Field::new(name, DataType::Int64, true),
                    b.finish(&DataType::Int64, name)?,
                ))
            };
        let utc_column =
            |s: &mut Scalars<i64>, name: &str| -> Result<(Field, ArrayRef), ArrowMappingError> {
                let mut b = Buffer::I64(std::mem::take(s));
                Ok((Field::new(name, utc.clone(), true), b.finish(&utc, name)?))
            };
        let rows = self.rows;
        let [before_ty, after_ty] = [&self.plan.images[0].1, &self.plan.images[1].1];
        let (before_ty, after_ty) = (before_ty.clone(), after_ty.clone());
        let item = Arc::new(Field::new(LIST_ITEM, DataType::Utf8, true));
        let toast = ListArray::try_new(
            item.clone(),
            OffsetBuffer::new(ScalarBuffer::from(std::mem::replace(
                &mut self.toast_offsets,
                vec![0],
            ))),
            Arc::new(
                self.toast
                    .finish_text()
                    .map_err(build(UNCHANGED_TOAST_COLUMNS))?,
            ),
            None,
        )
        .map_err(|e| build(UNCHANGED_TOAST_COLUMNS)(e.to_string()))?;
        let mut columns: Vec<(Field, ArrayRef)> = vec![
            (
                Field::new(OP, DataType::Utf8, true),
                Arc::new(self.op.finish_text().map_err(build(OP))?),
            ),
            (
                Field::new(BEFORE, before_ty.clone(), true),
                self.images[0].finish(&before_ty, BEFORE)?,
            ),
            (
                Field::new(AFTER, after_ty.clone(), true),
                self.images[1].finish(&after_ty, AFTER)?,
            ),
            int64(&mut self.lsn, LSN)?,
            int64(&mut self.commit_lsn, COMMIT_LSN)?,
            int64(&mut self.ordinal, ORDINAL)?,
            int64(&mut self.tx_id, TX_ID)?,
            utc_column(&mut self.commit_ts, COMMIT_TS)?,
            {
                let mut b = Buffer::Boolean(std::mem::take(&mut self.snapshot));
                (
                    Field::new(SNAPSHOT, DataType::Boolean, true),
                    b.finish(&DataType::Boolean, SNAPSHOT)?,
                )
            },
            (
                Field::new(UNCHANGED_TOAST_COLUMNS, DataType::List(item), true),
                Arc::new(toast),
            ),
            (
                Field::new(TOKEN_KEY_ID, DataType::Utf8, true),
                Arc::new(
                    self.token_key_id
                        .finish_text()
                        .map_err(build(TOKEN_KEY_ID))?,
                ),
            ),
            utc_column(&mut self.event_ts, EVENT_TS)?,
            (
                Field::new(SCHEMA_ID, DataType::Int32, true),
                Arc::new(Int32Array::from(vec![self.plan.schema_id as i32; rows])),
            ),
        ];
        if let Some((plan, buf)) = &mut self.key {
            let array = buf.finish(&plan.data_type, KEY)?;
            if plan.column {
                columns.push((Field::new(KEY, plan.data_type.clone(), true), array));
            }
        }
        columns.push(self.out_of_range()?);
        let (fields, arrays) = columns.into_iter().unzip();
        Ok(EnvelopeColumns { fields, arrays })
    }

    fn out_of_range(&mut self) -> Result<(Field, ArrayRef), ArrowMappingError> {
        let build = |e: String| ArrowMappingError::Build {
            path: OUT_OF_RANGE_VALUES.into(),
            reason: e,
        };
        out_of_range_list(
            self.oor_columns.finish_text().map_err(build)?,
            self.oor_values.finish_text().map_err(build)?,
            OffsetBuffer::new(ScalarBuffer::from(std::mem::replace(
                &mut self.oor_offsets,
                vec![0],
            ))),
            std::mem::take(&mut self.oor_valid),
        )
    }
}

fn text_of(s: Scalar<'_>) -> Option<&str> {
    match s {
        Scalar::Text(t) => Some(t),
        _ => None,
    }
}

impl SourcePlan {
    /// Reads the `source` block; `None` if it is null.
    fn read(&self, cur: &mut Cursor) -> Result<Option<SourceMeta>, ReadError> {
        if let Some((branches, null)) = self.nullable {
            if Some(cur.branch(branches)?) == null {
                return Ok(None);
            }
        }
        let mut m = SourceMeta::default();
        for (which, shape) in &self.fields {
            let v = scalar(shape, cur)?;
            match which {
                SourceField::TsMs => m.ts_ms = long_of(v),
                SourceField::TxId => m.tx_id = long_of(v),
                SourceField::Lsn => m.lsn = long_of(v),
                SourceField::CommitLsn => m.commit_lsn = long_of(v),
                SourceField::Snapshot => {
                    m.snapshot = match v {
                        Scalar::Text(flag) => flag == "true" || flag == "last",
                        Scalar::Boolean(b) => b,
                        _ => false,
                    }
                }
                SourceField::Other => {}
            }
        }
        Ok(Some(m))
    }
}
