//! What happens to a round's applicable Bronze rows before the fold: stale duplicates are
//! dropped, quality checks run on the raw values, failing rows become quarantine records,
//! and every row image is masked. Nothing after this step sees a raw sensitive value.

use deltalake::arrow::array::{Array, BooleanArray, RecordBatch, StructArray};
use deltalake::arrow::compute::{concat_batches, filter_record_batch};
use deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};
use wal2delta_model::ChangeOp;
use wal2delta_quarantine::{QuarantineRecord, Stage};

use super::checks::{evaluate, Check, CheckError, Failure};
use super::key_repair::{fill_missing_keys, old_key_deletes};
use super::mask::{MaskError, Masking};
use super::rows::{BronzeError, BronzeRows};

/// Why screening stopped: a check or a mask that cannot run (an operator must fix the
/// config), or Bronze rows that are not what Silver expects.
#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    #[error(transparent)]
    Check(#[from] CheckError),
    #[error("masking: {0}")]
    Mask(#[from] MaskError),
    #[error("{0}")]
    Rows(String),
}

impl From<BronzeError> for ScreenError {
    fn from(e: BronzeError) -> Self {
        ScreenError::Rows(e.to_string())
    }
}

/// The rows that go on to the fold, masked, and what was set aside.
pub struct Screened {
    pub rows: RecordBatch,
    /// Rows that failed a check (masked).
    pub quarantined: Vec<QuarantineRecord>,
    /// Streamed changes at or below the watermark: copies of changes already applied.
    pub stale: usize,
}

/// The quarantine `reason_code` of a failed check.
pub const CHECK_FAILED: &str = "check_failed";
/// The quarantine `reason_code` (and check name) of a change without a primary key value.
pub const MISSING_KEY: &str = "missing_key";

/// Screens `rows` (applicable Bronze rows of `table`) against `checks` and `masking`.
///
/// A streamed change (not a snapshot read) at or below `watermark` is a copy of one
/// already applied: the watermark only passes transactions Bronze held whole and Silver
/// applied, so anything arriving later at or below it was delivered twice. Dropping it
/// here is what makes a late old change harmless even after its tombstone has expired.
pub fn screen(
    table: &str,
    rows: &BronzeRows,
    watermark: i64,
    checks: &[Check],
    masking: &Masking,
    now_us: i64,
) -> Result<Screened, ScreenError> {
    // Rows stored before the table had a key take it from their image; the rest are
    // quarantined below (never dropped, never a failure of the whole table).
    let (filled, no_key) = fill_missing_keys(rows).map_err(ScreenError::Rows)?;
    let rows = BronzeRows::new(&filled)?;
    let n = rows.num_rows();
    let fresh: Vec<bool> = (0..n)
        .map(|i| rows.op(i) == Some(ChangeOp::Read) || rows.commit_lsn(i) > watermark)
        .collect();
    let stale = fresh.iter().filter(|f| !**f).count();

    let mut failures: Vec<Option<Failure>> = match rows.after() {
        Ok(after) if !checks.is_empty() => {
            let checked: Vec<bool> = (0..n)
                .map(|i| fresh[i] && is_upsert(rows.op(i)) && after.is_valid(i))
                .collect();
            evaluate(checks, after, &checked, |i| rows.unchanged(i))?
        }
        _ => vec![None; n],
    };
    let check_failed: Vec<usize> = (0..n).filter(|&i| failures[i].is_some()).collect();
    for &i in no_key.iter().filter(|&&i| fresh[i]) {
        failures[i] = Some(Failure {
            check: MISSING_KEY.into(),
            reason: "the change has no primary key value: it was stored before the table had a primary key and its row image lacks the key columns".into(),
        });
    }
    let masked = masking.mask_bronze(&filled)?;
    let masked = BronzeRows::new(&masked)?;
    let mut quarantined = Vec::new();
    for (i, f) in failures.iter().enumerate() {
        if let Some(f) = f {
            let code = if f.check == MISSING_KEY {
                MISSING_KEY
            } else {
                CHECK_FAILED
            };
            quarantined.push(record(table, &masked, i, f, code, now_us)?);
        }
    }
    let keep: BooleanArray = (0..n)
        .map(|i| Some(fresh[i] && failures[i].is_none()))
        .collect();
    let rows =
        filter_record_batch(masked.batch(), &keep).map_err(|e| ScreenError::Rows(e.to_string()))?;
    // A key move that failed a check still deletes its old key (the source no longer has
    // that row); only the new row is held back.
    let rows = match old_key_deletes(&masked, &check_failed).map_err(ScreenError::Rows)? {
        Some(deletes) => concat_batches(&rows.schema(), [&rows, &deletes])
            .map_err(|e| ScreenError::Rows(e.to_string()))?,
        None => rows,
    };
    Ok(Screened {
        rows,
        quarantined,
        stale,
    })
}

/// Whether `op` writes the row in `after`: a create, an update or a snapshot read.
pub(crate) fn is_upsert(op: Option<ChangeOp>) -> bool {
    matches!(
        op,
        Some(ChangeOp::Insert | ChangeOp::Update | ChangeOp::Read)
    )
}

/// A struct row as a JSON object of text values (Arrow's rendering; NULL as null).
pub(crate) fn row_json(s: &StructArray, i: usize) -> Result<serde_json::Value, ScreenError> {
    let mut obj = serde_json::Map::new();
    if s.is_null(i) {
        return Ok(serde_json::Value::Null);
    }
    let opts = FormatOptions::default();
    for (f, c) in s.fields().iter().zip(s.columns()) {
        let v = if c.is_null(i) {
            serde_json::Value::Null
        } else {
            let fmt = ArrayFormatter::try_new(c.as_ref(), &opts)
                .map_err(|e| ScreenError::Rows(e.to_string()))?;
            serde_json::Value::String(fmt.value(i).to_string())
        };
        obj.insert(f.name().clone(), v);
    }
    Ok(serde_json::Value::Object(obj))
}

/// The quarantine record of masked Bronze row `i`: the row (`raw`) and key (`key`) as
/// JSON text, the Bronze coordinates, the check and why.
fn record(
    table: &str,
    masked: &BronzeRows,
    i: usize,
    failure: &Failure,
    reason_code: &str,
    now_us: i64,
) -> Result<QuarantineRecord, ScreenError> {
    let json = |image: Option<&StructArray>| -> Result<Option<Vec<u8>>, ScreenError> {
        match image {
            Some(a) => Ok(Some(row_json(a, i)?.to_string().into_bytes())),
            None => Ok(None),
        }
    };
    let topic = masked
        .topic(i)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("bronze/{table}"));
    let (partition, offset) = (masked.partition(i), masked.offset(i));
    let lsn = Some(masked.commit_lsn(i));
    Ok(QuarantineRecord {
        id: QuarantineRecord::event_id(
            Stage::Silver,
            &topic,
            partition.unwrap_or(-1),
            offset.unwrap_or(-1),
        ),
        stage: Stage::Silver,
        reason_code: reason_code.into(),
        detail: format!("check {}: {}", failure.check, failure.reason),
        table: Some(table.to_owned()),
        topic: Some(topic),
        partition,
        offset,
        source_lsn: lsn,
        commit_lsn: lsn,
        ordinal: Some(masked.ordinal(i)),
        key: json(masked.key())?,
        raw: json(masked.after().ok())?,
        quarantined_at_us: now_us,
        check: Some(failure.check.clone()),
    })
}
