//! Lookups, phase two (docs/rules.md, "Lookups"; seed 000): a rule over a related table's
//! columns is evaluated first on the conditions that read only the row's own columns
//! (phase one, with every other rule, vectorised); only the rows that pass are looked
//! up, once per related table and batch, and the whole condition evaluated over the row
//! joined with its related row. A row whose phase one fails costs no lookup: counted as
//! avoided.
//!
//! **Which state a lookup sees.** The related table as of the change's commit: a change
//! committed at LSN L sees every related change committed up to L (a related row changed
//! in the same transaction included), none after. The silver stage applies a related table
//! before the tables that look it up, never past their next change
//! (`wal2delta/src/silver/lookups.rs`), and reads its unapplied changes right after
//! ([`UnappliedTables`], [`crate::silver::Unapplied`]): the related row of a key as of L is
//! its latest unapplied version at or below L, else its Silver row. A table whose related
//! table's unapplied changes are not known (the related table failed, or is in the middle
//! of a transaction applied in pieces) goes in lock-step with it instead, one related
//! change at a time. Only after `[rules] lookup_timeout_ms` (a table that cannot keep step)
//! may a row see a related table behind its commit (counted as stale) or a related row
//! changed after it (counted as newer).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use deltalake::arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, UInt32Array};
use deltalake::arrow::compute::{cast, concat_batches, take, take_record_batch};
use deltalake::arrow::datatypes::{Int64Type, Schema, SchemaRef};
use deltalake::arrow::row::{RowConverter, Rows, SortField};

use super::compile::{evaluate_expr, lake_name, LookupPlan};
use super::table::{RulesReport, TableRules};
use super::walk::KeyHits;
use super::{CompiledRule, Evaluator, Lookup};
use crate::delta::{self, ident};
use crate::silver::{Progress, Unapplied, COMMIT_LSN, OP};
use crate::LakeError;

/// The looked-up tables' unapplied changes, by lake name, as the silver stage read them
/// right after each one's round ([`crate::silver::Unapplied`]); one for every table's
/// rules, set by the stage and read by the lookups of the tables that follow.
#[derive(Clone, Default)]
pub struct UnappliedTables(Arc<RwLock<HashMap<String, Arc<Unapplied>>>>);

impl UnappliedTables {
    /// Records table `name`'s unapplied changes (`None`: not known; its lookups then need
    /// it in lock-step).
    pub fn set(&self, name: &str, unapplied: Option<Unapplied>) {
        let mut m = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match unapplied {
            Some(u) => m.insert(name.to_owned(), Arc::new(u)),
            None => m.remove(name),
        };
    }

    /// Table `name`'s unapplied changes, when known.
    pub fn get(&self, name: &str) -> Option<Arc<Unapplied>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }
}

/// A related table's rows fetched for one batch: its Silver rows whose `on` columns equal
/// a row's that needs them, then its unapplied versions, all as the lookup's schema.
struct Fetched {
    rows: RecordBatch,
    /// Each row's `_commit_lsn` (NULL when unknown).
    lsn: Int64Array,
    /// Silver rows by their `on` values (arrow row format).
    by_key: HashMap<Vec<u8>, Vec<u32>>,
    converter: RowConverter,
    /// Every row's `on` values (row format).
    on_rows: Rows,
    /// The related table's Silver watermark when read.
    watermark: i64,
    /// Its unapplied changes over those rows, when known.
    ahead: Option<Ahead>,
}

/// A related table's unapplied versions, indexed for lookups as of a position.
struct Ahead {
    /// Lookups as of a position up to here are exact ([`Unapplied::reach`]).
    reach: i64,
    /// Per primary key (row format), its versions in position order: (commit LSN, row
    /// of [`Fetched::rows`], deleted).
    by_pk: HashMap<Vec<u8>, Vec<(i64, u32, bool)>>,
    /// Per `on` value, the primary keys some version of which has it.
    by_on: HashMap<Vec<u8>, Vec<Vec<u8>>>,
    /// The primary key of each Silver row of [`Fetched::rows`].
    silver_pk: Vec<Vec<u8>>,
}

impl Fetched {
    /// The rows related to a row whose `on` values are `key`, as of LSN `at`: per primary
    /// key, its latest unapplied version at or below `at` if it has one (none if that
    /// version deletes it, or its `on` values differ), else its Silver row.
    fn related_as_of(&self, key: &[u8], at: Option<i64>) -> Vec<u32> {
        let silver = self.by_key.get(key).map(Vec::as_slice).unwrap_or_default();
        let (Some(ahead), Some(at)) = (&self.ahead, at) else {
            return silver.to_vec();
        };
        let latest = |pk: &[u8]| {
            ahead
                .by_pk
                .get(pk)
                .and_then(|v| v.iter().take_while(|(l, _, _)| *l <= at).last())
        };
        let mut out: Vec<u32> = silver
            .iter()
            .copied()
            .filter(|&j| {
                ahead
                    .silver_pk
                    .get(j as usize)
                    .is_none_or(|pk| latest(pk).is_none())
            })
            .collect();
        for pk in ahead.by_on.get(key).into_iter().flatten() {
            if let Some(&(_, j, false)) = latest(pk) {
                // Its `on` values as of `at` are this version's.
                if self.on_of(j) == key {
                    out.push(j);
                }
            }
        }
        out
    }

    /// Row `j`'s `on` values (row format).
    fn on_of(&self, j: u32) -> Vec<u8> {
        self.on_rows.row(j as usize).as_ref().to_vec()
    }
}

/// What a fetch is for: the related table and the columns matched.
type Target = (String, Vec<(String, String)>);

fn target(l: &Lookup) -> Target {
    (lake_name(&l.table), l.on.clone())
}

/// For each of `rules` (in order), the rows whose phase-one hits hold it, ascending: one
/// pass over each row's hits, both lists in rule-id order, instead of a search per row
/// and rule. Phase two only ever removes a rule's own hit, so these stay each rule's rows
/// while the rules are judged one after another.
fn passed_rows(rules: &[&str], hits: &[KeyHits]) -> Vec<Vec<u32>> {
    let mut order: Vec<usize> = (0..rules.len()).collect();
    order.sort_by(|&a, &b| rules[a].cmp(rules[b]));
    let mut passed = vec![Vec::new(); rules.len()];
    for (i, h) in hits.iter().enumerate() {
        let mut wanted = order.iter().peekable();
        for (id, _) in h.iter() {
            while let Some(&&k) = wanted.peek() {
                match rules[k].cmp(&**id) {
                    std::cmp::Ordering::Less => {
                        wanted.next();
                    }
                    std::cmp::Ordering::Equal => {
                        passed[k].push(i as u32);
                        wanted.next();
                    }
                    std::cmp::Ordering::Greater => break,
                }
            }
            if wanted.peek().is_none() {
                break;
            }
        }
    }
    passed
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
    /// hit. Each row sees its related rows as of its own commit (`_commit_lsn`), or as of
    /// `as_of` when given (a backfill: every row as of the backfill's position).
    pub(super) async fn look_up(
        &self,
        ev: &Evaluator,
        input: &RecordBatch,
        hits: &mut [KeyHits],
        report: &mut RulesReport,
        as_of: Option<i64>,
    ) -> Result<(), LakeError> {
        let rules: Vec<(&CompiledRule, &Arc<LookupPlan>)> = ev
            .rules()
            .iter()
            .filter_map(|r| r.lookup.as_ref().map(|p| (r, p)))
            .collect();
        if rules.is_empty() || input.num_rows() == 0 {
            return Ok(());
        }
        let lsn: Option<ArrayRef> = match as_of {
            Some(at) => Some(Arc::new(Int64Array::from(vec![at; input.num_rows()]))),
            None => input
                .column_by_name(COMMIT_LSN)
                .and_then(|a| cast(a, &deltalake::arrow::datatypes::DataType::Int64).ok()),
        };
        let ids: Vec<&str> = rules.iter().map(|(r, _)| r.rule.id.as_str()).collect();
        let passed = passed_rows(&ids, hits);
        let related = self
            .fetch_needed(&rules, &passed, input, lsn.as_ref(), report)
            .await?;
        for ((rule, plan), rows) in rules.into_iter().zip(passed) {
            self.judge(
                rule,
                plan,
                rows,
                input,
                hits,
                &related,
                lsn.as_ref(),
                report,
            )?;
        }
        Ok(())
    }

    /// Reads, once per related table, the related rows of the rows that some rule using
    /// it passed in phase one; a related table that cannot be read for good is named with
    /// the reason (a transient failure fails the round).
    async fn fetch_needed(
        &self,
        rules: &[(&CompiledRule, &Arc<LookupPlan>)],
        passed: &[Vec<u32>],
        input: &RecordBatch,
        lsn: Option<&ArrayRef>,
        report: &mut RulesReport,
    ) -> Result<Related, LakeError> {
        // Which rows need each related table: those some rule using it passed.
        let n = input.num_rows();
        let mut needed: HashMap<Target, (Lookup, SchemaRef, Vec<bool>)> = HashMap::new();
        for ((_, plan), rows) in rules.iter().zip(passed) {
            for (l, schema) in &plan.lookups {
                let e = needed
                    .entry(target(l))
                    .or_insert_with(|| (l.clone(), schema.clone(), vec![false; n]));
                for &i in rows {
                    e.2[i as usize] = true;
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
            report.lookups_avoided += n - rows.len();
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
                // Exact up to the unapplied changes' reach, or the Silver watermark.
                let exact = f.ahead.as_ref().map_or(f.watermark, |a| a.reach);
                let lsn = lsn.as_primitive::<Int64Type>();
                report.lookups_stale += rows
                    .iter()
                    .filter(|&&i| lsn.is_valid(i as usize) && lsn.value(i as usize) > exact)
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
        rows: Vec<u32>,
        input: &RecordBatch,
        hits: &mut [KeyHits],
        related: &Related,
        lsn: Option<&ArrayRef>,
        report: &mut RulesReport,
    ) -> Result<(), LakeError> {
        let id = &rule.rule.id;
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
            let at = lsn.map(|a| a.as_primitive::<Int64Type>());
            let idx: UInt32Array = rows
                .iter()
                .map(|&i| {
                    let at = at.and_then(|a| a.is_valid(i as usize).then(|| a.value(i as usize)));
                    let m = f.related_as_of(keys.row(i as usize).as_ref(), at);
                    match m.len() {
                        0 => None,
                        1 => Some(m[0]),
                        n => {
                            failed.entry(i).or_insert_with(|| format!(
                                "lookup `{}` matched {n} rows of {}: `on` must name the related table's key",
                                l.name, l.table
                            ));
                            None
                        }
                    }
                })
                .collect();
            // A related row changed after the row's own commit: the lookup sees a later
            // state than the commit's (docs/rules.md, "Lookups", limits), counted.
            if let Some(own) = at {
                let theirs = &f.lsn;
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
        let silver = concat_batches(&related_schema, &out).map_err(|e| self.error(e))?;
        // The related table's unapplied changes, when they follow the Silver version read.
        let unapplied = self
            .unapplied
            .get(&lake_name(&l.table))
            .filter(|u| u.from == watermark);
        let on: Vec<String> = l.on.iter().map(|(_, other)| other.clone()).collect();
        Fetched::new(&silver, unapplied.as_deref(), &on, schema, watermark)
            .map_err(|e| self.error(format!("lookup `{}` of {}: {e}", l.name, l.table)))
    }
}

impl Fetched {
    /// Indexes `silver` (the related Silver rows read) and the related table's
    /// `unapplied` changes (which follow them) for lookups by the related columns `on`;
    /// both as `schema`.
    fn new(
        silver: &RecordBatch,
        unapplied: Option<&Unapplied>,
        on: &[String],
        schema: &SchemaRef,
        watermark: i64,
    ) -> Result<Fetched, String> {
        let conform = |b: &RecordBatch| super::evaluate::conform(b, schema);
        let versions = unapplied.and_then(|u| u.versions.as_ref());
        let mut parts = vec![conform(silver)?];
        let mut lsn = vec![lsn_of(silver)];
        if let Some(v) = versions {
            parts.push(conform(v)?);
            lsn.push(lsn_of(v));
        }
        let rows = concat_batches(&parts[0].schema(), &parts).map_err(|e| e.to_string())?;
        let lsn: Int64Array = lsn.into_iter().flatten().collect();
        let columns = |names: &mut dyn Iterator<Item = &String>| {
            names
                .map(|c| {
                    rows.column_by_name(c)
                        .cloned()
                        .ok_or_else(|| format!("no column {c:?}"))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let related_keys = columns(&mut on.iter())?;
        let converter = row_converter(&related_keys).map_err(|e| e.to_string())?;
        let on_rows = converter
            .convert_columns(&related_keys)
            .map_err(|e| e.to_string())?;
        let on_null = |i: usize| related_keys.iter().any(|a| a.is_null(i));
        let mut by_key: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
        for i in 0..silver.num_rows() {
            // A NULL key matches nothing (as in SQL).
            if !on_null(i) {
                by_key
                    .entry(on_rows.row(i).as_ref().to_vec())
                    .or_default()
                    .push(i as u32);
            }
        }
        let ahead = match unapplied {
            // Nothing unapplied: the Silver rows are the related table as of its reach.
            Some(u) if versions.is_none() => Some(Ahead {
                reach: u.reach,
                by_pk: HashMap::new(),
                by_on: HashMap::new(),
                silver_pk: Vec::new(),
            }),
            Some(u) => {
                let pk = columns(&mut u.keys.iter())?;
                let pk_rows = row_converter(&pk)
                    .and_then(|c| c.convert_columns(&pk))
                    .map_err(|e| e.to_string())?;
                let ops = versions
                    .and_then(|v| v.column_by_name(OP))
                    .and_then(|a| a.as_string_opt::<i32>().cloned());
                let mut ahead = Ahead {
                    reach: u.reach,
                    by_pk: HashMap::new(),
                    by_on: HashMap::new(),
                    silver_pk: (0..silver.num_rows())
                        .map(|i| pk_rows.row(i).as_ref().to_vec())
                        .collect(),
                };
                for i in silver.num_rows()..rows.num_rows() {
                    let v = i - silver.num_rows();
                    let deleted = ops
                        .as_ref()
                        .is_some_and(|o| o.is_valid(v) && o.value(v) == "d");
                    let key = pk_rows.row(i).as_ref().to_vec();
                    if !deleted && !on_null(i) {
                        let pks = ahead
                            .by_on
                            .entry(on_rows.row(i).as_ref().to_vec())
                            .or_default();
                        if !pks.contains(&key) {
                            pks.push(key.clone());
                        }
                    }
                    let at = if lsn.is_valid(i) {
                        lsn.value(i)
                    } else {
                        i64::MAX
                    };
                    ahead
                        .by_pk
                        .entry(key)
                        .or_default()
                        .push((at, i as u32, deleted));
                }
                for v in ahead.by_pk.values_mut() {
                    v.sort_by_key(|(l, _, _)| *l);
                }
                Some(ahead)
            }
            None => None,
        };
        Ok(Fetched {
            rows,
            lsn,
            by_key,
            converter,
            on_rows,
            watermark,
            ahead,
        })
    }
}

/// A converter of `columns` to arrow's row format (their values compared as bytes).
fn row_converter(
    columns: &[ArrayRef],
) -> Result<RowConverter, deltalake::arrow::error::ArrowError> {
    RowConverter::new(
        columns
            .iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect(),
    )
}

/// `b`'s `_commit_lsn` per row (NULL when it has none).
fn lsn_of(b: &RecordBatch) -> Vec<Option<i64>> {
    match b
        .column_by_name(COMMIT_LSN)
        .and_then(|a| cast(a, &deltalake::arrow::datatypes::DataType::Int64).ok())
    {
        Some(a) => a.as_primitive::<Int64Type>().iter().collect(),
        None => vec![None; b.num_rows()],
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

#[cfg(test)]
mod tests {
    use deltalake::arrow::array::{Int64Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field};

    use super::*;

    #[test]
    fn each_rule_gets_the_rows_whose_hits_hold_it() {
        use crate::rules::walk::rule_id;
        // Rules in no particular order, one listed twice, one no row matches.
        let rules = ["r07", "r02", "r11", "r02", "r99"];
        let all = ["r01", "r02", "r03", "r07", "r10", "r11", "r12"];
        let mut seed = 7u64;
        let hits: Vec<KeyHits> = (0..200)
            .map(|_| {
                let mut h = KeyHits::new();
                for id in all {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    if seed >> 62 == 0 {
                        h.insert(rule_id(id), 1);
                    }
                }
                h
            })
            .collect();
        let passed = passed_rows(&rules, &hits);
        for (k, id) in rules.iter().enumerate() {
            let expected: Vec<u32> = (0..hits.len() as u32)
                .filter(|&i| hits[i as usize].contains_key(id))
                .collect();
            assert_eq!(passed[k], expected, "rule {id}");
        }
        assert!(!passed[0].is_empty() && passed[4].is_empty());
    }

    /// Related rows (id, shop, status, _commit_lsn[, _op]).
    fn batch(rows: &[(i64, &str, &str, i64, &str)], with_op: bool) -> RecordBatch {
        let mut fields = vec![
            Field::new("id", DataType::Int64, true),
            Field::new("shop", DataType::Utf8, true),
            Field::new("status", DataType::Utf8, true),
            Field::new(COMMIT_LSN, DataType::Int64, true),
        ];
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.3))),
        ];
        if with_op {
            fields.push(Field::new(OP, DataType::Utf8, true));
            cols.push(Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r.4),
            )));
        }
        RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap()
    }

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("shop", DataType::Utf8, true),
            Field::new("status", DataType::Utf8, true),
        ]))
    }

    /// The status of the related row(s) of `on` value `key` as of `at`.
    fn status(f: &Fetched, on: ArrayRef, at: i64) -> Vec<String> {
        let key = f.converter.convert_columns(&[on]).unwrap();
        f.related_as_of(key.row(0).as_ref(), Some(at))
            .into_iter()
            .map(|j| {
                f.rows
                    .column(2)
                    .as_string::<i32>()
                    .value(j as usize)
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn a_lookup_sees_the_latest_unapplied_version_at_or_below_its_position() {
        // Silver (watermark 100): shops 1 and 2. Unapplied: shop 1 updated at 110 and
        // 130, shop 2 deleted at 120, shop 3 inserted at 115.
        let silver = batch(
            &[(1, "s1", "open", 90, ""), (2, "s2", "open", 95, "")],
            false,
        );
        let versions = batch(
            &[
                (1, "s1", "frozen", 110, "u"),
                (1, "s1", "closed", 130, "u"),
                (2, "s2", "", 120, "d"),
                (3, "s3", "new", 115, "u"),
            ],
            true,
        );
        let u = Unapplied {
            from: 100,
            reach: 140,
            keys: vec!["id".into()],
            versions: Some(versions),
        };
        let by_id = |id: i64| -> ArrayRef { Arc::new(Int64Array::from(vec![id])) };
        let f = Fetched::new(&silver, Some(&u), &["id".into()], &schema(), 100).unwrap();
        assert_eq!(
            status(&f, by_id(1), 105),
            ["open"],
            "before its first version: Silver"
        );
        assert_eq!(
            status(&f, by_id(1), 110),
            ["frozen"],
            "its own transaction included"
        );
        assert_eq!(status(&f, by_id(1), 129), ["frozen"]);
        assert_eq!(status(&f, by_id(1), 140), ["closed"]);
        assert_eq!(status(&f, by_id(2), 119), ["open"]);
        assert!(status(&f, by_id(2), 120).is_empty(), "deleted at 120");
        assert!(status(&f, by_id(3), 114).is_empty(), "not inserted yet");
        assert_eq!(status(&f, by_id(3), 115), ["new"]);

        // By another column than the key: a row whose `on` value changes moves.
        let versions = batch(&[(1, "s9", "moved", 110, "u")], true);
        let u = Unapplied {
            versions: Some(versions),
            ..u
        };
        let by_shop = |s: &str| -> ArrayRef { Arc::new(StringArray::from(vec![s])) };
        let f = Fetched::new(&silver, Some(&u), &["shop".into()], &schema(), 100).unwrap();
        assert_eq!(status(&f, by_shop("s1"), 105), ["open"]);
        assert!(
            status(&f, by_shop("s1"), 110).is_empty(),
            "shop 1 became s9"
        );
        assert_eq!(status(&f, by_shop("s9"), 110), ["moved"]);
        assert!(status(&f, by_shop("s9"), 109).is_empty());

        // Nothing unapplied: the Silver rows.
        let none = Unapplied {
            versions: None,
            keys: Vec::new(),
            ..u
        };
        let f = Fetched::new(&silver, Some(&none), &["id".into()], &schema(), 100).unwrap();
        assert_eq!(status(&f, by_id(1), 140), ["open"]);

        // Without unapplied changes: the Silver rows, whatever the position.
        let f = Fetched::new(&silver, None, &["id".into()], &schema(), 100).unwrap();
        assert_eq!(status(&f, by_id(1), 140), ["open"]);
        assert!(status(&f, by_id(3), 140).is_empty());
    }
}
