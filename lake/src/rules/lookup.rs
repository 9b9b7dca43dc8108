//! Lookups, phase two (docs/rules.md, "Lookups"; seed 000): a rule over a related table's
//! columns is evaluated first on the conditions that read only the row's own columns
//! (phase one, with every other rule, vectorised); only the rows that pass are looked
//! up, once per related table and batch, and the whole condition evaluated over the row
//! joined with its related row. A row whose phase one fails costs no lookup: counted as
//! avoided.
//!
//! **Which state a lookup sees.** The related table's current Silver rows. The silver
//! stage applies a related table before the tables that look it up and keeps them in
//! lock-step (`wal2delta/src/silver/lookups.rs`): a change committed at LSN L is looked up
//! while the related table holds exactly its changes committed up to L, a related row
//! changed in the same transaction included. Only after `[rules] lookup_timeout_ms` (a
//! table that cannot keep step) may a row see a related table behind its commit (counted
//! as stale) or a related row changed after it (counted as newer).

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use deltalake::arrow::compute::{cast, concat_batches, take, take_record_batch};
use deltalake::arrow::datatypes::{Int64Type, Schema, SchemaRef};
use deltalake::arrow::row::{RowConverter, SortField};

use super::compile::{evaluate_expr, lake_name, LookupPlan};
use super::table::{RulesReport, TableRules};
use super::walk::KeyHits;
use super::{CompiledRule, Evaluator, Lookup};
use crate::delta::{self, ident};
use crate::silver::{Progress, COMMIT_LSN};
use crate::LakeError;

/// A related table's rows fetched for one batch: those whose `on` columns equal a row's
/// that needs them.
struct Fetched {
    rows: RecordBatch,
    /// Related rows by their `on` values (arrow row format).
    by_key: HashMap<Vec<u8>, Vec<u32>>,
    converter: RowConverter,
    /// The related table's Silver watermark when read.
    watermark: i64,
}

/// What a fetch is for: the related table and the columns matched.
type Target = (String, Vec<(String, String)>);

fn target(l: &Lookup) -> Target {
    (lake_name(&l.table), l.on.clone())
}

/// The related tables a round read: the rows fetched per related table, and the reason
/// per related table that could not be read.
struct Related {
    fetched: HashMap<Target, Fetched>,
    unreadable: HashMap<Target, String>,
}

impl TableRules {
    /// Phase two over `input` (rows with the rules' schema; `hits` holds phase one's
    /// result): for each rule with lookups, the rows it passed are joined with their
    /// related rows and the whole condition decides. A row whose lookup fails (several
    /// related rows match) or whose condition fails is quarantined for that rule and is no
    /// hit.
    pub(super) async fn look_up(
        &self,
        ev: &Evaluator,
        input: &RecordBatch,
        hits: &mut [KeyHits],
        report: &mut RulesReport,
    ) -> Result<(), LakeError> {
        let rules: Vec<(&CompiledRule, &Arc<LookupPlan>)> = ev
            .rules()
            .iter()
            .filter_map(|r| r.lookup.as_ref().map(|p| (r, p)))
            .collect();
        if rules.is_empty() || input.num_rows() == 0 {
            return Ok(());
        }
        let lsn = input
            .column_by_name(COMMIT_LSN)
            .and_then(|a| cast(a, &deltalake::arrow::datatypes::DataType::Int64).ok());
        let related = self
            .fetch_needed(&rules, input, hits, lsn.as_ref(), report)
            .await?;
        for (rule, plan) in rules {
            self.judge(rule, plan, input, hits, &related, lsn.as_ref(), report)?;
        }
        Ok(())
    }

    /// Reads, once per related table, the related rows of the rows that some rule using
    /// it passed in phase one; a related table that cannot be read for good is named with
    /// the reason (a transient failure fails the round).
    async fn fetch_needed(
        &self,
        rules: &[(&CompiledRule, &Arc<LookupPlan>)],
        input: &RecordBatch,
        hits: &[KeyHits],
        lsn: Option<&ArrayRef>,
        report: &mut RulesReport,
    ) -> Result<Related, LakeError> {
        // Which rows need each related table: those some rule using it passed.
        let mut needed: HashMap<Target, (Lookup, SchemaRef, Vec<bool>)> = HashMap::new();
        for (rule, plan) in rules {
            for (l, schema) in &plan.lookups {
                let e = needed
                    .entry(target(l))
                    .or_insert_with(|| (l.clone(), schema.clone(), vec![false; hits.len()]));
                for (i, h) in hits.iter().enumerate() {
                    e.2[i] |= h.contains_key(&rule.rule.id);
                }
            }
        }
        let mut fetched: HashMap<Target, Fetched> = HashMap::new();
        let mut unreadable: HashMap<Target, String> = HashMap::new();
        for (t, (l, schema, rows)) in needed {
            let rows: Vec<u32> = (0..rows.len() as u32)
                .filter(|&i| rows[i as usize])
                .collect();
            report.lookups += rows.len();
            report.lookups_avoided += hits.len() - rows.len();
            if rows.is_empty() {
                continue;
            }
            let f = match self.fetch(&l, &schema, input, &rows).await {
                Ok(f) => f,
                // Storage briefly unavailable (a timeout, an object store 503): the round
                // fails and is retried, nothing committed. Taken as "no related row" it
                // would commit a `left` (or lose an `entered`) for good.
                Err(e) if e.class() == wal2delta_model::ErrorClass::Transient => return Err(e),
                Err(e) => {
                    // The related table cannot be read: the rows that need it are no hit
                    // for the rules using it, quarantined with the reason; the rest goes on.
                    tracing::warn!(table = %self.name, related = %l.table, error = %e, "a looked-up table cannot be read: the rows needing it are quarantined for their rules");
                    unreadable.insert(
                        t,
                        format!("lookup `{}`: cannot read {}: {e}", l.name, l.table),
                    );
                    continue;
                }
            };
            if let Some(lsn) = lsn {
                let lsn = lsn.as_primitive::<Int64Type>();
                report.lookups_stale += rows
                    .iter()
                    .filter(|&&i| lsn.is_valid(i as usize) && lsn.value(i as usize) > f.watermark)
                    .count();
            }
            fetched.insert(t, f);
        }
        Ok(Related {
            fetched,
            unreadable,
        })
    }

    /// Phase two of `rule` over the rows that passed its own conditions: each row joined
    /// with its related rows, the whole condition decides; a row whose lookup failed is
    /// quarantined for the rule and is no hit.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        rule: &CompiledRule,
        plan: &Arc<LookupPlan>,
        input: &RecordBatch,
        hits: &mut [KeyHits],
        related: &Related,
        lsn: Option<&ArrayRef>,
        report: &mut RulesReport,
    ) -> Result<(), LakeError> {
        let id = &rule.rule.id;
        let rows: Vec<u32> = (0..hits.len() as u32)
            .filter(|&i| hits[i as usize].contains_key(id))
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let mut failed: HashMap<u32, String> = HashMap::new();
        let columns = self.joined_columns(plan, input, &rows, related, lsn, report, &mut failed)?;
        let joined = RecordBatch::try_new_with_options(
            plan.combined.clone(),
            columns,
            &deltalake::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.len())),
        )
        .map_err(|e| self.error(e))?;
        let started = std::time::Instant::now();
        let bits: Vec<bool> = match evaluate_expr(&rule.rule, &plan.full, &joined) {
            Ok(b) => (0..b.len()).map(|j| b.value(j)).collect(),
            Err(_) => (0..rows.len())
                .map(
                    |j| match evaluate_expr(&rule.rule, &plan.full, &joined.slice(j, 1)) {
                        Ok(b) => b.value(0),
                        Err(e) => {
                            failed
                                .entry(rows[j])
                                .or_insert(crate::conditions::without_values(&e.reason));
                            false
                        }
                    },
                )
                .collect(),
        };
        *report.rule_time.entry(id.clone()).or_default() += started.elapsed();
        for (j, &i) in rows.iter().enumerate() {
            if let Some(reason) = failed.get(&i) {
                *report.errors.entry(id.clone()).or_default() += 1;
                report
                    .quarantined
                    .push(self.failed(rule, &input.slice(i as usize, 1), reason));
                hits[i as usize].remove(id);
            } else if !bits[j] {
                hits[i as usize].remove(id);
            }
        }
        if !failed.is_empty() {
            tracing::warn!(table = %self.name, rule = %id, rows = failed.len(), "a rule with a lookup failed on some rows: they are quarantined for that rule and count as no hit");
        }
        Ok(())
    }

    /// The columns of `input`'s rows `rows` followed by each lookup's related row's
    /// columns (NULL: no related row); a row whose lookup failed gets its reason in
    /// `failed`.
    #[allow(clippy::too_many_arguments)]
    fn joined_columns(
        &self,
        plan: &LookupPlan,
        input: &RecordBatch,
        rows: &[u32],
        related: &Related,
        lsn: Option<&ArrayRef>,
        report: &mut RulesReport,
        failed: &mut HashMap<u32, String>,
    ) -> Result<Vec<ArrayRef>, LakeError> {
        let Related {
            fetched,
            unreadable,
        } = related;
        // Per lookup, each row's related row (None: no related row).
        let mut columns: Vec<ArrayRef> =
            take_record_batch(input, &UInt32Array::from(rows.to_vec()))
                .map_err(|e| self.error(e))?
                .columns()
                .to_vec();
        for (l, schema) in &plan.lookups {
            let Some(f) = fetched.get(&target(l)) else {
                let reason = unreadable
                    .get(&target(l))
                    .cloned()
                    .unwrap_or_else(|| format!("lookup `{}`: not fetched", l.name));
                for &i in rows {
                    failed.entry(i).or_insert_with(|| reason.clone());
                }
                for f in schema.fields() {
                    columns.push(deltalake::arrow::array::new_null_array(
                        f.data_type(),
                        rows.len(),
                    ));
                }
                continue;
            };
            let keys = f
                .converter
                .convert_columns(&own_keys(input, l, &f.rows).map_err(|e| self.error(e))?)
                .map_err(|e| self.error(e))?;
            let idx: UInt32Array = rows
                .iter()
                .map(|&i| match f.by_key.get(keys.row(i as usize).as_ref()) {
                    Some(m) if m.len() == 1 => Some(m[0]),
                    Some(m) => {
                        failed.entry(i).or_insert_with(|| format!(
                            "lookup `{}` matched {} rows of {}: `on` must name the related table's key",
                            l.name, m.len(), l.table
                        ));
                        None
                    }
                    None => None,
                })
                .collect();
            // A related row changed after the row's own commit: the lookup sees a later
            // state than the commit's (docs/rules.md, "Lookups", limits), counted.
            if let (Some(own), Some(theirs)) = (
                lsn.map(|a| a.as_primitive::<Int64Type>()),
                f.rows
                    .column_by_name(COMMIT_LSN)
                    .and_then(|a| a.as_primitive_opt::<Int64Type>()),
            ) {
                report.lookups_newer += rows
                    .iter()
                    .zip(idx.iter())
                    .filter(|(&i, j)| {
                        j.is_some_and(|j| {
                            own.is_valid(i as usize)
                                && theirs.is_valid(j as usize)
                                && theirs.value(j as usize) > own.value(i as usize)
                        })
                    })
                    .count();
            }
            let related = super::evaluate::conform(&f.rows, schema).map_err(|e| self.error(e))?;
            for c in related.columns() {
                columns.push(take(c, &idx, None).map_err(|e| self.error(e))?);
            }
        }
        Ok(columns)
    }

    /// The rows of `l`'s table whose `on` columns equal those of `input`'s rows `rows`,
    /// read from its current Silver table.
    async fn fetch(
        &self,
        l: &Lookup,
        schema: &SchemaRef,
        input: &RecordBatch,
        rows: &[u32],
    ) -> Result<Fetched, LakeError> {
        let label = format!("silver/{}", l.table);
        // As of this round's refresh (`compiled`), like the schema the rules were
        // compiled against.
        let Some(table) = self.related.get(&lake_name(&l.table)) else {
            return Err(self.error(format!(
                "lookup `{}`: {} has no Silver table",
                l.name, l.table
            )));
        };
        // Silver records its progress under the table's lake name.
        let watermark = Progress::load(&lake_name(&l.table), table).await?.watermark;
        // The needed keys, as the related columns' types.
        let wanted = take_record_batch(input, &UInt32Array::from(rows.to_vec()))
            .map_err(|e| self.error(e))?;
        let key_cols = own_keys(&wanted, l, &RecordBatch::new_empty(schema.clone()))
            .map_err(|e| self.error(e))?;
        let key_schema = Arc::new(Schema::new(
            l.on.iter()
                .zip(&key_cols)
                .enumerate()
                .map(|(i, (_, a))| {
                    deltalake::arrow::datatypes::Field::new(
                        format!("k{i}"),
                        a.data_type().clone(),
                        true,
                    )
                })
                .collect::<Vec<_>>(),
        ));
        let keys = RecordBatch::try_new(key_schema.clone(), key_cols).map_err(|e| self.error(e))?;
        let on =
            l.on.iter()
                .enumerate()
                .map(|(i, (_, other))| format!("r.{} = k.k{i}", ident(other)))
                .collect::<Vec<_>>()
                .join(" AND ");
        let err =
            |e: deltalake::datafusion::error::DataFusionError| LakeError::delta(&label)(e.into());
        let ctx = delta::session();
        ctx.register_table("r", table.table_provider().await.map_err(err)?)
            .map_err(err)?;
        ctx.register_batch("k", keys).map_err(err)?;
        let out = delta::collect(
            &label,
            &ctx,
            &format!("SELECT r.* FROM r LEFT SEMI JOIN k ON {on}"),
        )
        .await?;
        let related_schema = match out.first() {
            Some(b) => b.schema(),
            None => delta::arrow_schema(&label, table)?,
        };
        let rows = concat_batches(&related_schema, &out).map_err(|e| self.error(e))?;
        let related_keys =
            l.on.iter()
                .map(|(_, other)| {
                    rows.column_by_name(other)
                        .cloned()
                        .ok_or_else(|| self.error(format!("{} lost column {other:?}", l.table)))
                })
                .collect::<Result<Vec<_>, _>>()?;
        let converter = RowConverter::new(
            related_keys
                .iter()
                .map(|a| SortField::new(a.data_type().clone()))
                .collect(),
        )
        .map_err(|e| self.error(e))?;
        let converted = converter
            .convert_columns(&related_keys)
            .map_err(|e| self.error(e))?;
        let mut by_key: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
        for i in 0..rows.num_rows() {
            // A NULL key matches nothing (as in SQL).
            if related_keys.iter().any(|a| a.is_null(i)) {
                continue;
            }
            by_key
                .entry(converted.row(i).as_ref().to_vec())
                .or_default()
                .push(i as u32);
        }
        Ok(Fetched {
            rows,
            by_key,
            converter,
            watermark,
        })
    }
}

/// `input`'s `on` columns of lookup `l`, cast to the types of the matching columns of
/// `related` (a row whose value cannot be cast gets NULL, which matches nothing).
fn own_keys(
    input: &RecordBatch,
    l: &Lookup,
    related: &RecordBatch,
) -> Result<Vec<ArrayRef>, String> {
    l.on.iter()
        .map(|(own, other)| {
            let a = input
                .column_by_name(own)
                .ok_or_else(|| format!("no column {own:?}"))?;
            let ty = related
                .column_by_name(other)
                .map(|r| r.data_type().clone())
                .ok_or_else(|| format!("{} has no column {other:?}", l.table))?;
            cast(a, &ty).map_err(|e| format!("column {own:?}: {e}"))
        })
        .collect()
}
