//! Key extraction: every row's primary key as the fold compares and writes it.

use deltalake::arrow::array::{Array, ArrayRef, StructArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::DataType;
use deltalake::arrow::row::{Row, RowConverter, Rows, SortField};
use wal2delta_model::ChangeOp;

use super::{arrow, FoldError};
use crate::silver::rows::BronzeRows;

/// The key columns of a batch: the fields of Bronze's `key`, typed as in `after`.
pub(super) struct Keys {
    pub names: Vec<String>,
    /// Per key column, every row's key (from `key`).
    pub new: Vec<ArrayRef>,
    /// Per key column, every row's old key (from `before`), when `before` has every key
    /// column.
    pub old: Option<Vec<ArrayRef>>,
    /// `new` as comparable rows.
    new_rows: Rows,
    /// `old` as comparable rows.
    old_rows: Option<Rows>,
}

/// `array` as `ty`.
fn typed(array: &ArrayRef, ty: &DataType) -> Result<ArrayRef, FoldError> {
    if array.data_type() == ty {
        Ok(array.clone())
    } else {
        cast(array, ty).map_err(|e| FoldError(format!("key column: {e}")))
    }
}

impl Keys {
    /// The keys of `rows`, whose row images are `after`. Refuses a batch with changes but
    /// no `key` column, and a key column `after` does not have.
    pub fn extract(rows: &BronzeRows, after: &StructArray) -> Result<Self, FoldError> {
        let key = rows.key();
        let names = rows.key_names();
        let types: Vec<DataType> = names
            .iter()
            .map(|name| {
                after
                    .fields()
                    .iter()
                    .find(|f| f.name() == name)
                    .map(|f| f.data_type().clone())
                    .ok_or_else(|| {
                        FoldError(format!("key column `{name}` is not a column of `after`"))
                    })
            })
            .collect::<Result<_, _>>()?;
        let new: Vec<ArrayRef> = match key {
            Some(k) => k
                .columns()
                .iter()
                .zip(&types)
                .map(|(a, t)| typed(a, t))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let old: Option<Vec<ArrayRef>> = match rows.before() {
            Some(b) if !names.is_empty() => names
                .iter()
                .zip(&types)
                .map(|(name, t)| b.column_by_name(name).map(|a| typed(a, t)))
                .collect::<Option<Result<Vec<_>, _>>>()
                .transpose()?,
            _ => None,
        };
        if names.is_empty() && (0..rows.num_rows()).any(|i| rows.op(i) != Some(ChangeOp::Truncate))
        {
            return Err(FoldError(
                "Bronze rows have no `key` column: the table has no primary key, or was stored before keys were".into(),
            ));
        }
        let converter =
            RowConverter::new(types.into_iter().map(SortField::new).collect()).map_err(arrow)?;
        let new_rows = converter.convert_columns(&new).map_err(arrow)?;
        let old_rows = match &old {
            Some(cols) => Some(converter.convert_columns(cols).map_err(arrow)?),
            None => None,
        };
        Ok(Keys {
            names,
            new,
            old,
            new_rows,
            old_rows,
        })
    }

    /// Row `i`'s key.
    pub fn new_key(&self, i: usize) -> Row<'_> {
        self.new_rows.row(i)
    }

    /// Row `i`'s old key when its `before` names a key other than its own (a key move).
    pub fn moved_from(&self, rows: &BronzeRows, i: usize) -> Option<Row<'_>> {
        let (Some(old_rows), Some(old), Some(before)) = (&self.old_rows, &self.old, rows.before())
        else {
            return None;
        };
        let old_key = old_rows.row(i);
        let has_old = before.is_valid(i) && old.iter().all(|c| c.is_valid(i));
        (has_old && old_key != self.new_key(i)).then_some(old_key)
    }
}
