//! The primary key of each Bronze change, as Silver uses it.
//!
//! Bronze's `key` column is the decoded Kafka key. Two kinds of rows need more than that:
//!
//! - Rows stored while the source table had no primary key (it gained one later) have no
//!   key. Their row image holds the key columns, so the key is taken from `after` (or
//!   `before` for a delete). A row whose key cannot be found that way is reported, never
//!   dropped: the caller quarantines it.
//! - A key change (a `c` or, from earlier releases, a `u` whose `before` names another
//!   key) that fails a quality check still deletes its old key: the
//!   source no longer has that row, whatever is wrong with the new one (issue 11 #8).
//!   [`old_key_deletes`] turns such rows into deletes of the old key at the same
//!   position.

use std::sync::Arc;

use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, BooleanArray, RecordBatch, StringArray, StructArray,
    UInt32Array,
};
use deltalake::arrow::compute::kernels::zip::zip;
use deltalake::arrow::compute::{cast, is_null, nullif, take};
use deltalake::arrow::datatypes::DataType;
use deltalake::arrow::row::{RowConverter, SortField};
use wal2delta_model::{bronze, ChangeOp};

use super::rows::BronzeRows;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Column `name` of row image `image` (Bronze's `after` or `before`), cast to `ty`, null
/// where the image is null. `None` when the image or the column is absent.
fn image_column(
    image: Option<&StructArray>,
    name: &str,
    ty: &DataType,
) -> Result<Option<ArrayRef>, String> {
    let Some(s) = image else {
        return Ok(None);
    };
    let Some(c) = s.column_by_name(name) else {
        return Ok(None);
    };
    let c = if c.data_type() == ty {
        c.clone()
    } else {
        cast(c, ty).map_err(err)?
    };
    let parent_null = is_null(s as &dyn Array).map_err(err)?;
    Ok(Some(nullif(&c, &parent_null).map_err(err)?))
}

/// `rows` with every missing key taken from the row image, and which rows still have no
/// key (a TRUNCATE has none and needs none; it is never listed).
pub fn fill_missing_keys(rows: &BronzeRows) -> Result<(RecordBatch, Vec<usize>), String> {
    let batch = rows.batch();
    let (Some(key), Ok(idx)) = (rows.key(), batch.schema().index_of(bronze::KEY)) else {
        return Ok((batch.clone(), Vec::new()));
    };
    let no_key = |i: usize| !key.is_valid(i) && rows.op(i) != Some(ChangeOp::Truncate);
    if !(0..rows.num_rows()).any(no_key) {
        return Ok((batch.clone(), Vec::new()));
    }
    let has_key = BooleanArray::from_iter((0..key.len()).map(|i| Some(key.is_valid(i))));
    let mut children = Vec::with_capacity(key.num_columns());
    for (f, child) in key.fields().iter().zip(key.columns()) {
        let ty = f.data_type();
        let after = image_column(rows.after().ok(), f.name(), ty)?;
        let before = image_column(rows.before(), f.name(), ty)?;
        let fallback = match (after, before) {
            (Some(a), Some(b)) => {
                let a_valid = BooleanArray::from_iter((0..a.len()).map(|i| Some(a.is_valid(i))));
                zip(&a_valid, &a, &b).map_err(err)?
            }
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => new_null_array(ty, rows.num_rows()),
        };
        children.push(zip(&has_key, child, &fallback).map_err(err)?);
    }
    let valid: Vec<bool> = (0..rows.num_rows())
        .map(|i| key.is_valid(i) || children.iter().all(|c| c.is_valid(i)))
        .collect();
    let missing = (0..rows.num_rows())
        .filter(|&i| !valid[i] && rows.op(i) != Some(ChangeOp::Truncate))
        .collect();
    let filled =
        StructArray::try_new(key.fields().clone(), children, Some(valid.into())).map_err(err)?;
    let mut columns = batch.columns().to_vec();
    columns[idx] = Arc::new(filled);
    let out = RecordBatch::try_new(batch.schema(), columns).map_err(err)?;
    Ok((out, missing))
}

/// For each of `candidates` (row indices of `rows`) that is an update or create moving its
/// row to a new key (its `before` names another key), a delete of the old key at the same
/// position: `op` `d`, `key` from `before`.
/// Rows that are not key moves yield nothing.
pub fn old_key_deletes(
    rows: &BronzeRows,
    candidates: &[usize],
) -> Result<Option<RecordBatch>, String> {
    let Some(key) = rows.key() else {
        return Ok(None);
    };
    let mut old_cols = Vec::with_capacity(key.num_columns());
    for f in key.fields() {
        match image_column(rows.before(), f.name(), f.data_type())? {
            Some(c) => old_cols.push(c),
            None => return Ok(None),
        }
    }
    let types: Vec<SortField> = key
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let converter = RowConverter::new(types).map_err(err)?;
    let new_rows = converter.convert_columns(key.columns()).map_err(err)?;
    let old_rows = converter.convert_columns(&old_cols).map_err(err)?;
    let moves: Vec<u32> = candidates
        .iter()
        .copied()
        .filter(|&i| {
            matches!(rows.op(i), Some(ChangeOp::Update | ChangeOp::Insert))
                && key.is_valid(i)
                && old_cols.iter().all(|c| c.is_valid(i))
                && old_rows.row(i) != new_rows.row(i)
        })
        .map(|i| i as u32)
        .collect();
    if moves.is_empty() {
        return Ok(None);
    }
    let idx = UInt32Array::from(moves);
    let picked: Vec<ArrayRef> = rows
        .batch()
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &idx, None).map_err(err))
        .collect::<Result<_, _>>()?;
    let n = idx.len();
    let old_key: Vec<ArrayRef> = old_cols
        .iter()
        .map(|c| take(c.as_ref(), &idx, None).map_err(err))
        .collect::<Result<_, _>>()?;
    let schema = rows.batch().schema();
    let mut columns = picked;
    for (j, f) in schema.fields().iter().enumerate() {
        match f.name().as_str() {
            bronze::OP => {
                columns[j] = Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                    ChangeOp::Delete.code(),
                    n,
                )))
            }
            bronze::KEY => {
                columns[j] = Arc::new(
                    StructArray::try_new(key.fields().clone(), old_key.clone(), None)
                        .map_err(err)?,
                )
            }
            bronze::AFTER => columns[j] = new_null_array(f.data_type(), n),
            _ => {}
        }
    }
    RecordBatch::try_new(schema, columns).map(Some).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::array::{AsArray, Int32Array, Int64Array};
    use deltalake::arrow::datatypes::{Field, Fields};

    use crate::silver::rows::test_rows;
    use crate::silver::Position;

    /// A Bronze row: op, key id, after id, before id (None: no such image).
    type Row<'a> = (&'a str, Option<i32>, Option<i32>, Option<i32>);

    fn rows(r: &[Row]) -> RecordBatch {
        let image = |ids: Vec<Option<i32>>| -> ArrayRef {
            let nulls: Vec<bool> = ids.iter().map(Option::is_some).collect();
            Arc::new(StructArray::new(
                Fields::from(vec![Field::new("id", DataType::Int64, true)]),
                vec![Arc::new(Int64Array::from(
                    ids.iter().map(|x| x.map(i64::from)).collect::<Vec<_>>(),
                ))],
                Some(nulls.into()),
            ))
        };
        let key_ids: Vec<Option<i32>> = r.iter().map(|x| x.1).collect();
        let key: ArrayRef = Arc::new(StructArray::new(
            Fields::from(vec![Field::new("id", DataType::Int32, false)]),
            vec![Arc::new(Int32Array::from(
                key_ids.iter().map(|k| k.unwrap_or(0)).collect::<Vec<_>>(),
            ))],
            Some(
                key_ids
                    .iter()
                    .map(Option::is_some)
                    .collect::<Vec<_>>()
                    .into(),
            ),
        ));
        let after = image(r.iter().map(|x| x.2).collect());
        let before = image(r.iter().map(|x| x.3).collect());
        let ops: Vec<&str> = r.iter().map(|x| x.0).collect();
        let positions: Vec<Position> = (0..r.len() as i64).map(|i| Position(i, 0)).collect();
        test_rows(&ops, [before, after, key], &positions, vec![])
    }

    fn key_ids(b: &RecordBatch) -> Vec<Option<i32>> {
        let k = b.column_by_name(bronze::KEY).unwrap().as_struct();
        let ids = k
            .column(0)
            .as_primitive::<deltalake::arrow::datatypes::Int32Type>();
        (0..b.num_rows())
            .map(|i| k.is_valid(i).then(|| ids.value(i)))
            .collect()
    }

    #[test]
    fn rows_stored_before_the_table_had_a_key_take_it_from_their_image() {
        let b = rows(&[
            ("c", None, Some(1), None),    // insert before the key existed
            ("d", None, None, Some(2)),    // delete (REPLICA IDENTITY FULL) before it
            ("c", Some(3), Some(3), None), // after the key was added
            ("t", None, None, None),       // a TRUNCATE needs no key
            ("d", None, None, None),       // nothing to take it from
        ]);
        let (filled, missing) = fill_missing_keys(&BronzeRows::new(&b).unwrap()).unwrap();
        assert_eq!(
            key_ids(&filled),
            vec![Some(1), Some(2), Some(3), None, None]
        );
        assert_eq!(missing, vec![4]);
    }

    #[test]
    fn a_failing_key_move_still_deletes_its_old_key() {
        let b = rows(&[
            ("u", Some(5), Some(5), Some(4)), // moved 4 -> 5
            ("u", Some(6), Some(6), None),    // plain update
            ("u", Some(7), Some(7), Some(7)), // identity FULL, same key
        ]);
        let b = BronzeRows::new(&b).unwrap();
        let d = old_key_deletes(&b, &[0, 1, 2]).unwrap().unwrap();
        assert_eq!(d.num_rows(), 1);
        assert_eq!(key_ids(&d), vec![Some(4)]);
        assert_eq!(
            d.column_by_name(bronze::OP)
                .unwrap()
                .as_string::<i32>()
                .value(0),
            "d"
        );
        assert!(old_key_deletes(&b, &[1, 2]).unwrap().is_none());
    }
}
