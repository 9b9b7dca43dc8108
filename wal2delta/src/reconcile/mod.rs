//! `wal2delta reconcile [--table T] [--json]`: the source and Silver compared at one LSN
//! (docs/architecture.md, promise 6). See docs/reconcile.md for what is compared and what the output
//! and exit codes mean.
//!
//! 1. Take one source snapshot at LSN `L` ([`source::Snapshot`]) and write a heartbeat so
//!    an idle source's watermark moves past it.
//! 2. Per table: wait (bounded) until Silver's watermark is at or above `L`; read the
//!    source rows in the snapshot into `key hash → row hash`; stream Silver at one version
//!    against them, leaving out keys Silver changed at or after `L` (rows, tombstones, a
//!    TRUNCATE), quarantined keys and undecodable source rows; compare counts, checksums
//!    and keys.
//! 3. When keys differ, read both sides once more to name the first `--max-keys` keys
//!    (in key order) and the columns that differ.

mod compare;
mod quarantined;
mod report;
mod source;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use wal2delta_lake::deltalake::arrow::array::AsArray;
use wal2delta_lake::deltalake::arrow::datatypes::{Int64Type, Schema};
use wal2delta_lake::quarantine::{QuarantineTable, Resolutions};
use wal2delta_lake::reconcile::{tombstones_from, SilverRead};
use wal2delta_lake::silver::{SilverTable, COMMIT_LSN};
use wal2delta_lake::Lake;
use wal2delta_model::{Lsn, TableName};
use wal2delta_quarantine::QuarantineRecord;

use crate::capture::tokenize::Tokenizer;
use crate::config::{Config, Policies};
use compare::{commit_lsns, hex, Exclusions, Picker, Shape, Tally};
use report::{Differences, Excluded, Report, TableReport};
use source::{Decoder, Snapshot, SourceTable};

/// The command's options.
#[derive(Debug, Clone)]
pub struct Options {
    /// `schema.table`: only this table.
    pub table: Option<String>,
    pub json: bool,
    /// How long, in all, to wait for Silver's watermarks to reach the snapshot.
    pub wait_secs: u64,
    /// How many differing keys to list per table.
    pub max_keys: usize,
}

/// Runs the command: exit 0 when every table is equal, 1 when one differs, 2 when one
/// (or the whole run) could not be compared.
pub async fn run(config: &Config, options: &Options) -> ExitCode {
    let report = match reconcile(config, options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wal2delta: error: reconcile failed: {e:#}");
            return ExitCode::from(2);
        }
    };
    if options.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("wal2delta: error: cannot print the report: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", report.text());
    }
    let failed: Vec<&TableReport> = report.tables.iter().filter(|t| t.error.is_some()).collect();
    if let Some(first) = failed.first() {
        eprintln!(
            "wal2delta: error: {} table(s) could not be compared; {}: {}",
            failed.len(),
            first.name,
            first.error.as_deref().unwrap_or_default()
        );
        return ExitCode::from(2);
    }
    if report.equal {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

async fn reconcile(config: &Config, options: &Options) -> Result<Report> {
    let lake = config
        .lake
        .open()
        .map_err(|e| anyhow!("{e} ([lake] uri)"))?;
    let dsn = config.source.effective_dsn()?;
    let tokenizer = Tokenizer::from_config(&config.tokenize)?;
    let policies = crate::policies::silver(config).await?;
    let wanted = match &options.table {
        Some(t) => Some(parse_table(t)?),
        None => None,
    };
    let mut snapshot = Snapshot::take(&dsn).await.map_err(hint)?;
    let lsn = snapshot.lsn;
    source::heartbeat(&dsn).await;
    let deadline = Instant::now() + Duration::from_secs(options.wait_secs);

    let captured = snapshot.captured_tables(&config.source.publication).await?;
    let mut tables = Vec::new();
    let mut not_in_silver = Vec::new();
    let mut keyless = Vec::new();
    for t in captured {
        if wanted.as_ref().is_some_and(|w| w != &t) {
            continue;
        }
        if has_silver(&lake, &t).await? {
            tables.push(t);
        } else if is_keyless(&lake, &t).await {
            keyless.push(t.to_string());
        } else {
            not_in_silver.push(t.to_string());
        }
    }
    if let Some(w) = &wanted {
        if tables.is_empty() {
            snapshot.close().await;
            if !keyless.is_empty() {
                bail!(
                    "{w} is not compared: {}; Silver does not hold it",
                    crate::status::KEYLESS
                );
            }
            if not_in_silver.is_empty() {
                bail!(
                    "{w} is not captured: publication {:?} does not include it (`wal2delta setup` lists the captured tables)",
                    config.source.publication
                );
            }
            bail!("{w} has no Silver table yet: run the silver stage (`wal2delta run`) until it has applied the table's changes");
        }
    }
    // Capture's initial snapshot rows reach Silver outside the watermark: a table whose
    // snapshot is still running cannot be compared yet.
    let snapshots = match crate::status::snapshot_progress(config).await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the snapshot progress from Kafka; assuming every initial snapshot is done");
            Default::default()
        }
    };
    let quarantine = quarantine_records(&lake)
        .await
        .context("cannot read the quarantine tables")?;
    let job = Job {
        config,
        options,
        lake: &lake,
        lsn,
        deadline,
        quarantine: &quarantine,
        policies: &policies,
    };
    let mut decoder = Decoder::new(tokenizer, &config.kafka.topic_prefix);
    let mut reports = Vec::new();
    for t in &tables {
        let name = t.to_string();
        let outcome = match snapshots.get(&name).filter(|p| !p.is_done()) {
            Some(p) => Err(anyhow!(
                "the initial snapshot of the table is still running ({} of about {} rows in Kafka); reconcile once `wal2delta status` shows it done",
                p.rows_done,
                p.rows_estimate
            )),
            None => job.table(&mut snapshot, &mut decoder, t).await,
        };
        reports.push(match outcome {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(table = %name, error = %format!("{e:#}"), "table not compared");
                TableReport::failed(name, lsn.to_string(), format!("{e:#}"))
            }
        });
    }
    snapshot.close().await;
    Ok(Report {
        lsn: lsn.to_string(),
        equal: reports.iter().all(|r| r.equal),
        tables: reports,
        tables_not_in_silver: not_in_silver,
        tables_without_primary_key: keyless,
    })
}

fn parse_table(t: &str) -> Result<TableName> {
    match t.split_once('.') {
        Some((s, n)) if !s.is_empty() && !n.is_empty() && !n.contains('.') => {
            Ok(TableName::new(s, n))
        }
        _ => bail!("--table {t:?} must look like schema.table"),
    }
}

fn hint(e: anyhow::Error) -> anyhow::Error {
    match e
        .downcast_ref::<wal2delta_cdc::CdcError>()
        .and_then(|c| c.hint())
    {
        Some(h) => anyhow!("{e:#} (hint: {h})"),
        None => e,
    }
}

/// The table's Bronze rows have no `key`: its source table has no primary key, so Silver
/// does not hold it (it is kept in Bronze only).
async fn is_keyless(lake: &Lake, t: &TableName) -> bool {
    let url = lake.bronze(&t.schema, &t.name);
    matches!(
        wal2delta_lake::bronze::BronzeTable::has_key_at(&t.to_string(), &url).await,
        Ok(Some(false))
    )
}

async fn has_silver(lake: &Lake, t: &TableName) -> Result<bool> {
    let (schema, table) = t.ident_parts();
    Ok(lake.table_exists(&lake.silver(&schema, &table)).await?)
}

/// Every quarantine record, and the resolved ids.
async fn quarantine_records(lake: &Lake) -> Result<Quarantine> {
    let mut q = QuarantineTable::new(lake.quarantine_records());
    Ok(Quarantine {
        records: q.read_all().await?,
        resolved: Resolutions::new(lake.quarantine_resolutions())
            .read()
            .await?,
    })
}

struct Quarantine {
    records: Vec<QuarantineRecord>,
    resolved: BTreeMap<String, String>,
}

/// What comparing one table needs.
struct Job<'a> {
    config: &'a Config,
    options: &'a Options,
    lake: &'a Lake,
    lsn: Lsn,
    deadline: Instant,
    quarantine: &'a Quarantine,
    /// Silver's policies, resolved against the source's names.
    policies: &'a Policies,
}

/// The columns compared, and those only one side has.
struct Columns {
    shape: Shape,
    only_in_source: Vec<String>,
    only_in_silver: Vec<String>,
}

impl Columns {
    /// Compared: the source's columns that Silver has, typed as the source decodes them.
    fn of(src: &SourceTable, silver: &SilverRead) -> Result<Columns> {
        let silver_schema = silver.schema()?;
        let mut compared = Vec::new();
        let mut only_in_source = Vec::new();
        for f in src.schema.fields() {
            if silver_schema.field_with_name(f.name()).is_ok() {
                compared.push(f.as_ref().clone());
            } else {
                only_in_source.push(f.name().clone());
            }
        }
        let only_in_silver: Vec<String> = silver_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .filter(|n| !n.starts_with('_') && src.schema.field_with_name(n).is_err())
            .collect();
        if let Some(k) = src.key.iter().find(|k| only_in_source.contains(k)) {
            bail!("Silver has no primary-key column `{k}`");
        }
        let shape =
            Shape::new(Arc::new(Schema::new(compared)), &src.key).map_err(|e| anyhow!(e))?;
        Ok(Columns {
            shape,
            only_in_source,
            only_in_silver,
        })
    }
}

impl Job<'_> {
    async fn table(
        &self,
        snapshot: &mut Snapshot,
        decoder: &mut Decoder,
        t: &TableName,
    ) -> Result<TableReport> {
        let name = t.to_string();
        let l = self.lsn.0 as i64;
        // Lake tables are named by the table's identity (its escaped name).
        let (schema, table) = t.ident_parts();
        let masking = self.policies.of(&t.ident()).masking;
        let stage =
            crate::silver::silver_table(self.config, self.policies, self.lake, &schema, &table);
        let recorded = stage
            .recorded_masking()
            .await?
            .unwrap_or_else(|| serde_json::json!({}));
        if recorded != masking.describe() {
            bail!(
                "Silver was written under masking policies {recorded}, and [silver.mask] now says {}: the silver stage rebuilds the table under the new policies when it (re)starts; reconcile after that",
                masking.describe()
            );
        }
        let filters = self.config.source.column_filters();
        let Some(src) = SourceTable::open(snapshot, decoder, t, masking, filters.get(t)).await?
        else {
            bail!("the source table has no primary key; Silver only holds tables with one");
        };
        let watermark = self.wait_for_watermark(&stage, l).await?;
        let silver = SilverRead::open(self.lake, &schema, &table)
            .await?
            .ok_or_else(|| anyhow!("the Silver table disappeared"))?;
        let columns = Columns::of(&src, &silver)?;
        let shape = &columns.shape;
        let (mut ex, without_key) = self.exclusions(t, &silver, &src, shape).await?;

        let mut tally = Tally::default();
        let undecodable = self
            .tally_source(snapshot, decoder, &src, shape, &mut ex, &mut tally)
            .await?;
        tracing::info!(table = %name, rows = tally.held(), undecodable, "source rows read");
        tally_silver(&silver, shape, &ex, &mut tally).await?;
        let counts = tally.finish(&ex, undecodable);
        tracing::info!(table = %name, silver_rows = tally.silver_rows, differing = tally.differences.len(), "silver rows compared");
        let differing_keys = self
            .differing_keys(snapshot, decoder, &src, &silver, shape, &tally)
            .await?;

        let equal = tally.differences.is_empty() && columns.only_in_source.is_empty();
        Ok(TableReport {
            name,
            lsn: self.lsn.to_string(),
            equal,
            error: None,
            silver_version: Some(silver.version()),
            silver_watermark: Some(Lsn(watermark.max(0) as u64).to_string()),
            source_rows: Some(tally.source_rows),
            silver_rows: Some(tally.silver_rows),
            source_checksum: Some(hex(tally.source_sum)),
            silver_checksum: Some(hex(tally.silver_sum)),
            excluded: Some(Excluded {
                changed_after_snapshot: counts.changed_after_snapshot,
                quarantined: counts.quarantined,
                quarantine_records_without_key: without_key as u64,
                undecodable: counts.undecodable,
            }),
            differences: Some(Differences {
                missing_in_silver: counts.missing_in_silver,
                extra_in_silver: counts.extra_in_silver,
                values_differ: counts.values_differ,
            }),
            columns: shape.names(),
            columns_only_in_source: columns.only_in_source,
            columns_excluded: src.excluded.clone(),
            columns_only_in_silver: columns.only_in_silver,
            differing_keys,
        })
    }

    /// What the comparison leaves out: keys deleted or changed after the snapshot, keys
    /// with open quarantine records (and how many records name no key).
    async fn exclusions(
        &self,
        t: &TableName,
        silver: &SilverRead,
        src: &SourceTable,
        shape: &Shape,
    ) -> Result<(Exclusions, usize)> {
        let l = self.lsn.0 as i64;
        let (schema, table) = t.ident_parts();
        let mut ex = Exclusions {
            lsn: l,
            truncated_after: silver.progress().truncated.is_some_and(|p| p.0 >= l),
            ..Exclusions::default()
        };
        for b in tombstones_from(self.lake, &schema, &table, &src.key, l).await? {
            let keys = shape
                .conform_keys(&b)
                .map_err(|e| anyhow!("tombstones: {e}"))?;
            ex.tombstoned
                .extend(shape.key_hashes(&keys).map_err(|e| anyhow!(e))?);
        }
        let (quarantined, without_key) = quarantined::quarantined_keys(
            &self.quarantine.records,
            &self.quarantine.resolved,
            // Silver's records name the table by its identity, as its lake path does.
            &t.ident(),
            shape,
        );
        ex.quarantined = quarantined;
        Ok((ex, without_key))
    }

    /// The source in the snapshot: only the hashes are kept. Returns the rows that could
    /// not be decoded (their keys are excluded).
    async fn tally_source(
        &self,
        snapshot: &mut Snapshot,
        decoder: &mut Decoder,
        src: &SourceTable,
        shape: &Shape,
        ex: &mut Exclusions,
        tally: &mut Tally,
    ) -> Result<u64> {
        let mut undecodable = 0u64;
        let mut rows = src.rows();
        let chunk_rows = self.config.snapshot.chunk_rows;
        while let Some(chunk) = rows.next(snapshot, decoder, src, chunk_rows).await? {
            undecodable += chunk.undecodable as u64;
            if chunk.undecodable_keys.num_rows() > 0 {
                let keys = shape
                    .conform_keys(&chunk.undecodable_keys)
                    .map_err(|e| anyhow!(e))?;
                ex.undecodable
                    .extend(shape.key_hashes(&keys).map_err(|e| anyhow!(e))?);
            }
            let b = shape.conform(&chunk.rows).map_err(|e| anyhow!(e))?;
            for (k, r) in shape.hashes(&b).map_err(|e| anyhow!(e))? {
                tally.source(k, r).map_err(|e| anyhow!(e))?;
            }
        }
        Ok(undecodable)
    }

    /// Names the first differing keys (`--max-keys`): both sides read once more.
    async fn differing_keys(
        &self,
        snapshot: &mut Snapshot,
        decoder: &mut Decoder,
        src: &SourceTable,
        silver: &SilverRead,
        shape: &Shape,
        tally: &Tally,
    ) -> Result<Vec<report::DifferingKey>> {
        if tally.differences.is_empty() || self.options.max_keys == 0 {
            return Ok(Vec::new());
        }
        let mut picker = Picker::new(shape, &tally.differences, self.options.max_keys);
        let mut rows = src.rows();
        let chunk_rows = self.config.snapshot.chunk_rows;
        while let Some(chunk) = rows.next(snapshot, decoder, src, chunk_rows).await? {
            let b = shape.conform(&chunk.rows).map_err(|e| anyhow!(e))?;
            picker.offer(&b, false).map_err(|e| anyhow!(e))?;
        }
        let mut scan = silver.scan(&shape.names()).await?;
        while let Some(b) = scan.next().await {
            let b = shape.conform(&b?).map_err(|e| anyhow!(e))?;
            picker.offer(&b, true).map_err(|e| anyhow!(e))?;
        }
        Ok(picker.finish().into_iter().map(Into::into).collect())
    }

    /// Waits until Silver's watermark of `t` is at or above `lsn` (every transaction
    /// committed before the snapshot applied), until the run's deadline.
    async fn wait_for_watermark(&self, silver: &SilverTable, lsn: i64) -> Result<i64> {
        let mut logged = Instant::now();
        loop {
            let w = silver.progress().await?.watermark;
            if w >= lsn {
                return Ok(w);
            }
            if Instant::now() >= self.deadline {
                bail!(
                    "Silver's watermark is {}, short of the snapshot LSN {} after waiting {} s: Silver has not applied every change committed before the snapshot (is `wal2delta run` with capture, bronze and silver running and keeping up? `wal2delta status` shows each stage; --wait-secs waits longer)",
                    Lsn(w.max(0) as u64),
                    self.lsn,
                    self.options.wait_secs
                );
            }
            if logged.elapsed() >= Duration::from_secs(10) {
                tracing::info!(table = %silver.name(), watermark = %Lsn(w.max(0) as u64), snapshot_lsn = %self.lsn, "waiting for Silver to reach the snapshot");
                logged = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Silver, streamed against the source's hashes.
async fn tally_silver(
    silver: &SilverRead,
    shape: &Shape,
    ex: &Exclusions,
    tally: &mut Tally,
) -> Result<()> {
    let mut columns = shape.names();
    columns.push(COMMIT_LSN.to_owned());
    let mut scan = silver.scan(&columns).await?;
    while let Some(b) = scan.next().await {
        let b = b?;
        let lsns = commit_lsns(&b, COMMIT_LSN).map_err(|e| anyhow!(e))?;
        let lsns = lsns.as_primitive::<Int64Type>();
        let b = shape.conform(&b).map_err(|e| anyhow!(e))?;
        let hashes = shape.hashes(&b).map_err(|e| anyhow!(e))?;
        for (i, (k, r)) in hashes.into_iter().enumerate() {
            tally.silver(ex, k, r, lsns.value(i));
        }
    }
    Ok(())
}
