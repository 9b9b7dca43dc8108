//! The rows of a round as rules read them: versions settled against Silver (TOAST values
//! filled, stale versions dropped), evaluated with every rule, failures quarantined.

use std::sync::Arc;

use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch,
};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{Field, Schema, SchemaRef};
use deltalake::DeltaTable;
use wal2delta_quarantine::{QuarantineRecord, Stage};

use super::table::{RulesReport, TableRules, RULE_FAILED, SOURCE};
use super::walk::{rule_id, KeyHits, RuleId};
use super::{evaluate, CompiledRule, Evaluator};
use crate::conditions::without_values;
use crate::silver::{COMMIT_LSN, COMMIT_TS, MOVED_FROM, OP, ORDINAL, UNCHANGED, UNRESOLVED};
use crate::LakeError;

impl TableRules {
    /// [`crate::silver::settle`] for this table.
    pub(super) async fn settle(
        &self,
        batch: RecordBatch,
        silver: Option<&DeltaTable>,
        tombstones: &crate::silver::Tombstones,
        keys: &[String],
        reads: bool,
    ) -> Result<RecordBatch, LakeError> {
        crate::silver::settle(&self.name, batch, silver, tombstones, keys, reads)
            .await
            .map_err(|e| match e {
                LakeError::Rows { table, reason } => LakeError::Rows {
                    table,
                    reason: format!("rules: {reason}"),
                },
                other => other,
            })
    }

    /// Every rule of `ev` over `batch` as `schema` (the schema the rules were compiled
    /// against): the rules each row matches. A rule that fails on the batch is evaluated
    /// row by row; each failing row is quarantined for that rule and counts as no hit.
    /// Rules with lookups finish with their related rows ([`super::lookup`]), as of each
    /// row's commit or as of `as_of` (a backfill's position).
    pub(super) async fn evaluate_rows(
        &self,
        ev: &Evaluator,
        batch: &RecordBatch,
        schema: &SchemaRef,
        report: &mut RulesReport,
        as_of: Option<i64>,
    ) -> Result<Vec<KeyHits>, LakeError> {
        let input = conform(batch, schema).map_err(|e| self.error(e))?;
        let mut hits = vec![KeyHits::new(); input.num_rows()];
        // Each rule's matches, added to the rows' hits in rule id order below: every
        // hit then appends to its row's sorted hits instead of searching them.
        let mut matched: Vec<(RuleId, i64, BooleanArray)> = Vec::with_capacity(ev.rules().len());
        for (rule, (result, took)) in ev.rules().iter().zip(ev.evaluate_timed(&input)) {
            *report.rule_time.entry(rule.rule.id.clone()).or_default() += took;
            *report
                .condition_time
                .entry(rule.rule.id.clone())
                .or_default() += took;
            let bits = match result {
                Ok(b) => b,
                Err(e) => {
                    let mut bits = Vec::with_capacity(input.num_rows());
                    for i in 0..input.num_rows() {
                        let one = input.slice(i, 1);
                        match evaluate(std::slice::from_ref(rule), &one).remove(0) {
                            Ok(b) => bits.push(b.value(0)),
                            Err(row_error) => {
                                bits.push(false);
                                *report.errors.entry(rule.rule.id.clone()).or_default() += 1;
                                report.quarantined.push(self.failed(
                                    rule,
                                    &one,
                                    &without_values(&row_error.reason),
                                ));
                            }
                        }
                    }
                    tracing::warn!(table = %self.name, rule = %rule.rule.id, error = %without_values(&e.reason), "a rule failed on some rows: they are quarantined for that rule and count as no hit");
                    BooleanArray::from(bits)
                }
            };
            matched.push((rule_id(&rule.rule.id), rule.rule.version, bits));
        }
        matched.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, version, bits) in matched {
            for i in bits.values().set_indices() {
                hits[i].push_in_order(id.clone(), version);
            }
        }
        self.look_up(ev, &input, &mut hits, report, as_of).await?;
        Ok(hits)
    }

    /// The quarantine record of a row a rule failed on (`reason` holds no row value), with
    /// the row's primary key as JSON text in `key`.
    pub(super) fn failed(
        &self,
        rule: &CompiledRule,
        row: &RecordBatch,
        reason: &str,
    ) -> QuarantineRecord {
        let int = |n: &str| {
            row.column_by_name(n)
                .and_then(|a| a.as_primitive_opt::<deltalake::arrow::datatypes::Int64Type>())
                .filter(|a| a.is_valid(0))
                .map(|a| a.value(0))
        };
        let (lsn, ord) = (int(COMMIT_LSN), int(ORDINAL));
        QuarantineRecord {
            id: format!(
                "rules/{}/{}/{}/{}/{}",
                self.name,
                rule.rule.id,
                rule.rule.version,
                lsn.unwrap_or(0),
                ord.unwrap_or(0)
            ),
            stage: Stage::Silver,
            reason_code: RULE_FAILED.into(),
            detail: format!(
                "rule {:?} (version {}): {reason}",
                rule.rule.id, rule.rule.version
            ),
            table: Some(self.name.clone()),
            topic: None,
            partition: None,
            offset: None,
            source_lsn: lsn,
            commit_lsn: lsn,
            ordinal: ord,
            key: key_json(row, &self.keys)
                .ok()
                .and_then(|k| k.into_iter().next())
                .map(String::into_bytes),
            raw: None,
            quarantined_at_us: wal2delta_model::clock::unix_us(),
            check: Some(rule.rule.id.clone()),
        }
    }
}

pub(super) fn with_column(b: &RecordBatch, name: &str, a: ArrayRef) -> Result<RecordBatch, String> {
    let mut fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(name, a.data_type().clone(), true));
    let mut cols = b.columns().to_vec();
    cols.push(a);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).map_err(|e| e.to_string())
}

/// The columns of versions a rule may read (no fold bookkeeping).
pub(super) fn value_schema(b: &RecordBatch) -> SchemaRef {
    let fields: Vec<Field> = b
        .schema()
        .fields()
        .iter()
        .filter(|f| {
            let n = f.name();
            n != OP && n != UNCHANGED && n != SOURCE && !n.starts_with(MOVED_FROM)
        })
        .map(|f| f.as_ref().clone())
        .collect();
    Arc::new(Schema::new(fields))
}

/// `b` with exactly `schema`'s columns (by name, cast to its types; absent ones NULL).
pub(super) fn conform(b: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    let cols: Vec<ArrayRef> = schema
        .fields()
        .iter()
        .map(|f| match b.column_by_name(f.name()) {
            Some(a) if a.data_type() == f.data_type() => Ok(a.clone()),
            Some(a) => cast(a, f.data_type()).map_err(|e| format!("column {}: {e}", f.name())),
            None => Ok(new_null_array(f.data_type(), b.num_rows())),
        })
        .collect::<Result<_, _>>()?;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new(fields)),
        cols,
        &deltalake::arrow::array::RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
    )
    .map_err(|e| e.to_string())
}

/// Every row's primary key as JSON text (`{"id":42}`), key columns in key order.
pub fn key_json(b: &RecordBatch, keys: &[String]) -> Result<Vec<String>, String> {
    let idx: Vec<usize> = keys
        .iter()
        .map(|k| {
            b.schema()
                .index_of(k)
                .map_err(|_| format!("no key column {k}"))
        })
        .collect::<Result<_, _>>()?;
    let projected = b.project(&idx).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    {
        let mut w = deltalake::arrow::json::LineDelimitedWriter::new(&mut buf);
        w.write(&projected).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
    }
    let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
    let out: Vec<String> = text.lines().map(str::to_owned).collect();
    if out.len() != b.num_rows() {
        return Err(format!("{} keys for {} rows", out.len(), b.num_rows()));
    }
    Ok(out)
}

/// Rows `idx` of `batch` as Silver stores them (`schema`'s columns, without Silver's
/// `_commit_lsn`, `_ordinal`, `_commit_ts` and `_unresolved`), each a JSON object with
/// every column (NULL as `null`); `None` for a row that cannot be written as JSON.
pub(super) fn rows_json(
    batch: &RecordBatch,
    schema: &SchemaRef,
    idx: &[u32],
) -> Result<Vec<Option<String>>, String> {
    let own: Vec<usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| ![COMMIT_LSN, ORDINAL, COMMIT_TS, UNRESOLVED].contains(&f.name().as_str()))
        .map(|(i, _)| i)
        .collect();
    let rows = conform(batch, schema)?
        .project(&own)
        .map_err(|e| e.to_string())?;
    let taken = deltalake::arrow::compute::take_record_batch(
        &rows,
        &deltalake::arrow::array::UInt32Array::from(idx.to_vec()),
    )
    .map_err(|e| e.to_string())?;
    let write = |b: &RecordBatch| -> Option<Vec<String>> {
        let mut buf = Vec::new();
        let mut w = deltalake::arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, deltalake::arrow::json::writer::LineDelimited>(&mut buf);
        w.write(b).ok()?;
        w.finish().ok()?;
        drop(w);
        let text = String::from_utf8(buf).ok()?;
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        (lines.len() == b.num_rows()).then_some(lines)
    };
    if let Some(all) = write(&taken) {
        return Ok(all.into_iter().map(Some).collect());
    }
    // Some row cannot be written (a type the writer does not take): row by row, so
    // only that row loses its `after`.
    Ok((0..taken.num_rows())
        .map(|i| write(&taken.slice(i, 1)).and_then(|mut v| v.pop()))
        .collect())
}
