//! Output: the folded batch, one row per key.

use std::sync::Arc;

use deltalake::arrow::array::{
    Array, ArrayRef, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
    TimestampMicrosecondArray, UInt32Array,
};
use deltalake::arrow::buffer::OffsetBuffer;
use deltalake::arrow::compute::{cast, interleave, take};
use deltalake::arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use super::keys::Keys;
use super::toast::Winners;
use super::{arrow, FoldError, Kind};
use crate::silver::rows::BronzeRows;
use crate::silver::{COMMIT_LSN, COMMIT_TS, MOVED_FROM, OP, ORDINAL, UNCHANGED};

type Columns = Vec<(Field, ArrayRef)>;

/// The folded batch ([`super::Folded::rows`]): the value columns, Silver's own columns,
/// and the old-key columns of key moves whose unchanged values Silver supplies.
pub(super) fn build(
    rows: &BronzeRows,
    after: &StructArray,
    keys: &Keys,
    winners: &Winners,
) -> Result<RecordBatch, FoldError> {
    let mut columns = values(after, keys, winners)?;
    columns.extend(meta(rows, winners)?);
    columns.extend(moved_from(keys, winners)?);
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(arrow)
}

/// The columns of `after`; key columns come from the key (old or new), deletes carry only
/// their key.
fn values(after: &StructArray, keys: &Keys, winners: &Winners) -> Result<Columns, FoldError> {
    let mut out = Vec::with_capacity(after.num_columns());
    for (j, f) in after.fields().iter().enumerate() {
        let array = match keys.names.iter().position(|k| k == f.name()) {
            Some(ki) => {
                let mut sources: Vec<&dyn Array> = vec![keys.new[ki].as_ref()];
                if let Some(old) = &keys.old {
                    sources.push(old[ki].as_ref());
                }
                let idx: Vec<(usize, usize)> = winners
                    .actions
                    .iter()
                    .map(|w| (usize::from(w.old_key), w.row))
                    .collect();
                interleave(&sources, &idx).map_err(arrow)?
            }
            None => {
                let idx: UInt32Array = winners.supplier[j]
                    .iter()
                    .zip(&winners.actions)
                    .map(|(&r, w)| (w.kind == Kind::Upsert).then_some(r as u32))
                    .collect();
                take(after.column(j).as_ref(), &idx, None).map_err(arrow)?
            }
        };
        out.push((Field::new(f.name(), f.data_type().clone(), true), array));
    }
    Ok(out)
}

/// `_commit_lsn`, `_ordinal`, `_commit_ts`, `_op` and `_unchanged` of every winner.
fn meta(rows: &BronzeRows, winners: &Winners) -> Result<Columns, FoldError> {
    let actions = &winners.actions;
    let win_rows = UInt32Array::from(actions.iter().map(|w| w.row as u32).collect::<Vec<_>>());
    let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let ts: ArrayRef = match rows.commit_ts() {
        Some(a) => cast(&take(a.as_ref(), &win_rows, None).map_err(arrow)?, &utc).map_err(arrow)?,
        None => Arc::new(TimestampMicrosecondArray::new_null(actions.len()).with_timezone("UTC")),
    };
    let mut offsets = vec![0i32];
    let mut names: Vec<&str> = Vec::new();
    for u in &winners.unresolved {
        names.extend(u.iter().map(String::as_str));
        offsets.push(names.len() as i32);
    }
    let item = Arc::new(Field::new("element", DataType::Utf8, true));
    let unchanged = ListArray::try_new(
        item.clone(),
        OffsetBuffer::new(offsets.into()),
        Arc::new(StringArray::from(names)),
        None,
    )
    .map_err(arrow)?;
    let op = |w: &super::Action| match w.kind {
        Kind::Upsert => "u",
        Kind::Delete => "d",
    };
    Ok(vec![
        (
            Field::new(COMMIT_LSN, DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values(
                actions.iter().map(|w| w.pos.0),
            )),
        ),
        (
            Field::new(ORDINAL, DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values(
                actions.iter().map(|w| w.pos.1),
            )),
        ),
        (Field::new(COMMIT_TS, utc, true), ts),
        (
            Field::new(OP, DataType::Utf8, true),
            Arc::new(StringArray::from_iter_values(actions.iter().map(op))),
        ),
        (
            Field::new(UNCHANGED, DataType::List(item), true),
            Arc::new(unchanged),
        ),
    ])
}

/// `_moved_from_{key}`: the old key Silver must supply unchanged values from (key moves),
/// when any winner needs one.
fn moved_from(keys: &Keys, winners: &Winners) -> Result<Columns, FoldError> {
    let (true, Some(old)) = (winners.moves_out.iter().any(Option::is_some), &keys.old) else {
        return Ok(Vec::new());
    };
    let idx: UInt32Array = winners
        .moves_out
        .iter()
        .map(|m| m.map(|r| r as u32))
        .collect();
    keys.names
        .iter()
        .zip(old)
        .map(|(name, old)| {
            let a = take(old.as_ref(), &idx, None).map_err(arrow)?;
            let f = Field::new(format!("{MOVED_FROM}{name}"), a.data_type().clone(), true);
            Ok((f, a))
        })
        .collect()
}
