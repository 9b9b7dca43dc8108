//! One typed view of a batch of Bronze rows, as Silver reads them.
//!
//! The columns are named in `wal2delta_model::bronze` (the writer,
//! `wal2delta_stream::avro::columns`, uses the same names). [`BronzeRows::new`] checks the
//! batch's schema once: `op`, `commit_lsn` and `ordinal` must be there, and every other
//! column Silver reads must have the type Bronze writes when it is there. After that the
//! readers (plan, window, screen, keys, fold) use typed accessors and never look a column
//! up by name again.

use deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
    StructArray,
};
use deltalake::arrow::datatypes::{Int32Type, Int64Type};
use wal2delta_model::bronze;
use wal2delta_model::ChangeOp;

use super::Position;

/// A Bronze column Silver needs is missing, or is not of the type Bronze writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BronzeError {
    #[error("Bronze column `{0}` is missing")]
    Missing(&'static str),
    #[error("Bronze column `{column}` is not {expected}")]
    Mistyped {
        column: &'static str,
        expected: &'static str,
    },
}

/// A batch of Bronze rows with its columns checked and typed.
#[derive(Clone)]
pub struct BronzeRows<'a> {
    batch: &'a RecordBatch,
    op: &'a StringArray,
    /// `op` parsed once; `None` for a null or unknown code.
    ops: Vec<Option<ChangeOp>>,
    commit_lsn: &'a Int64Array,
    ordinal: &'a Int64Array,
    before: Option<&'a StructArray>,
    after: Option<&'a StructArray>,
    key: Option<&'a StructArray>,
    /// A list whose items are text.
    unchanged_toast: Option<&'a ListArray>,
    commit_ts: Option<&'a ArrayRef>,
    kafka_topic: Option<&'a StringArray>,
    kafka_partition: Option<&'a Int32Array>,
    kafka_offset: Option<&'a Int64Array>,
}

/// Column `name` of `batch`, when present, as `T` (`expected` names the type).
fn typed<'a, T: ?Sized>(
    batch: &'a RecordBatch,
    name: &'static str,
    expected: &'static str,
    as_t: impl FnOnce(&'a ArrayRef) -> Option<&'a T>,
) -> Result<Option<&'a T>, BronzeError> {
    match batch.column_by_name(name) {
        None => Ok(None),
        Some(a) => as_t(a).map(Some).ok_or(BronzeError::Mistyped {
            column: name,
            expected,
        }),
    }
}

fn required<'a, T: ?Sized>(
    column: Result<Option<&'a T>, BronzeError>,
    name: &'static str,
) -> Result<&'a T, BronzeError> {
    column?.ok_or(BronzeError::Missing(name))
}

impl<'a> BronzeRows<'a> {
    /// Checks `batch`'s columns: `op` (text), `commit_lsn` and `ordinal` (int64) must be
    /// there; `before`, `after`, `key` (structs), `unchanged_toast_columns` (list of text),
    /// `kafka_topic` (text), `kafka_partition` (int32) and `kafka_offset` (int64) must have
    /// that type when they are there. `commit_ts` may have any type (the fold casts it).
    pub fn new(batch: &'a RecordBatch) -> Result<Self, BronzeError> {
        let text = |name: &'static str| typed(batch, name, "text", |a| a.as_string_opt::<i32>());
        let int64 =
            |name: &'static str| typed(batch, name, "int64", |a| a.as_primitive_opt::<Int64Type>());
        let strukt = |name: &'static str| typed(batch, name, "a struct", |a| a.as_struct_opt());
        let op = required(text(bronze::OP), bronze::OP)?;
        let unchanged_toast = typed(
            batch,
            bronze::UNCHANGED_TOAST_COLUMNS,
            "a list of text",
            |a| {
                a.as_list_opt::<i32>()
                    .filter(|l| l.values().as_string_opt::<i32>().is_some())
            },
        )?;
        Ok(BronzeRows {
            batch,
            op,
            ops: (0..op.len())
                .map(|i| {
                    op.is_valid(i)
                        .then(|| op.value(i))
                        .and_then(ChangeOp::from_code)
                })
                .collect(),
            commit_lsn: required(int64(bronze::COMMIT_LSN), bronze::COMMIT_LSN)?,
            ordinal: required(int64(bronze::ORDINAL), bronze::ORDINAL)?,
            before: strukt(bronze::BEFORE)?,
            after: strukt(bronze::AFTER)?,
            key: strukt(bronze::KEY)?,
            unchanged_toast,
            commit_ts: batch.column_by_name(bronze::COMMIT_TS),
            kafka_topic: text(bronze::KAFKA_TOPIC)?,
            kafka_partition: typed(batch, bronze::KAFKA_PARTITION, "int32", |a| {
                a.as_primitive_opt::<Int32Type>()
            })?,
            kafka_offset: int64(bronze::KAFKA_OFFSET)?,
        })
    }

    /// The batch viewed.
    pub fn batch(&self) -> &'a RecordBatch {
        self.batch
    }

    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Row `i`'s op; `None` when its code is null or unknown ([`Self::op_code`] says which).
    pub fn op(&self, i: usize) -> Option<ChangeOp> {
        self.ops[i]
    }

    /// Row `i`'s `op` as stored (for error messages).
    pub fn op_code(&self, i: usize) -> &'a str {
        self.op.value(i)
    }

    /// Row `i`'s position `(commit_lsn, ordinal)`.
    pub fn position(&self, i: usize) -> Position {
        Position(self.commit_lsn.value(i), self.ordinal.value(i))
    }

    pub fn commit_lsn(&self, i: usize) -> i64 {
        self.commit_lsn.value(i)
    }

    pub fn ordinal(&self, i: usize) -> i64 {
        self.ordinal.value(i)
    }

    /// The `after` images.
    pub fn after(&self) -> Result<&'a StructArray, BronzeError> {
        self.after.ok_or(BronzeError::Missing(bronze::AFTER))
    }

    /// The `before` images, when the column is there.
    pub fn before(&self) -> Option<&'a StructArray> {
        self.before
    }

    /// The primary keys, when the column is there (not for a table without one).
    pub fn key(&self) -> Option<&'a StructArray> {
        self.key
    }

    /// The primary-key column names: the fields of `key` (none without it).
    pub fn key_names(&self) -> Vec<String> {
        self.key
            .map(|k| k.fields().iter().map(|f| f.name().clone()).collect())
            .unwrap_or_default()
    }

    /// Row `i`'s unchanged-TOAST column names (none without the column).
    pub fn unchanged(&self, i: usize) -> Vec<String> {
        match self.unchanged_toast {
            Some(l) if l.is_valid(i) => {
                let v = l.value(i);
                match v.as_string_opt::<i32>() {
                    Some(s) => s.iter().flatten().map(str::to_owned).collect(),
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    }

    /// The `commit_ts` column as stored, when it is there.
    pub fn commit_ts(&self) -> Option<&'a ArrayRef> {
        self.commit_ts
    }

    /// Row `i`'s Kafka topic, when the column holds one.
    pub fn topic(&self, i: usize) -> Option<&'a str> {
        self.kafka_topic
            .and_then(|a| a.is_valid(i).then(|| a.value(i)))
    }

    /// Row `i`'s Kafka partition, when the column is there.
    pub fn partition(&self, i: usize) -> Option<i32> {
        self.kafka_partition.map(|a| a.value(i))
    }

    /// Row `i`'s Kafka offset, when the column is there.
    pub fn offset(&self, i: usize) -> Option<i64> {
        self.kafka_offset.map(|a| a.value(i))
    }

    /// Every row's Kafka `(partition, offset)`; an error naming the column without it.
    pub fn coordinates(&self) -> Result<Vec<(i32, i64)>, BronzeError> {
        let partition = self
            .kafka_partition
            .ok_or(BronzeError::Missing(bronze::KAFKA_PARTITION))?;
        let offset = self
            .kafka_offset
            .ok_or(BronzeError::Missing(bronze::KAFKA_OFFSET))?;
        Ok((0..self.num_rows())
            .map(|i| (partition.value(i), offset.value(i)))
            .collect())
    }
}

/// Test rows: `op`, `before`, `after` and `key` (`images`), `commit_lsn` and `ordinal`
/// (`positions`), then the `extra` columns.
#[cfg(test)]
pub(crate) fn test_rows(
    ops: &[&str],
    images: [ArrayRef; 3],
    positions: &[Position],
    extra: Vec<(deltalake::arrow::datatypes::Field, ArrayRef)>,
) -> RecordBatch {
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    let [before, after, key] = images;
    let mut columns: Vec<(Field, ArrayRef)> = vec![
        (
            Field::new(bronze::OP, DataType::Utf8, true),
            Arc::new(StringArray::from_iter_values(ops)),
        ),
        (
            Field::new(bronze::BEFORE, before.data_type().clone(), true),
            before,
        ),
        (
            Field::new(bronze::AFTER, after.data_type().clone(), true),
            after,
        ),
        (Field::new(bronze::KEY, key.data_type().clone(), true), key),
        (
            Field::new(bronze::COMMIT_LSN, DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values(positions.iter().map(|p| p.0))),
        ),
        (
            Field::new(bronze::ORDINAL, DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values(positions.iter().map(|p| p.1))),
        ),
    ];
    columns.extend(extra);
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = columns.into_iter().unzip();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("test rows")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deltalake::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(fields: Vec<(Field, ArrayRef)>) -> RecordBatch {
        let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = fields.into_iter().unzip();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
    }

    fn core() -> Vec<(Field, ArrayRef)> {
        vec![
            (
                Field::new(bronze::OP, DataType::Utf8, true),
                Arc::new(StringArray::from(vec![Some("c"), Some("x"), None])),
            ),
            (
                Field::new(bronze::COMMIT_LSN, DataType::Int64, true),
                Arc::new(Int64Array::from(vec![10, 10, 20])),
            ),
            (
                Field::new(bronze::ORDINAL, DataType::Int64, true),
                Arc::new(Int64Array::from(vec![1, 2, 1])),
            ),
        ]
    }

    #[test]
    fn ops_and_positions_are_typed_once() {
        let b = batch(core());
        let rows = BronzeRows::new(&b).unwrap();
        assert_eq!(rows.op(0), Some(ChangeOp::Insert));
        assert_eq!((rows.op(1), rows.op_code(1)), (None, "x"));
        assert_eq!(rows.op(2), None);
        assert_eq!(rows.position(1), Position(10, 2));
        assert!(rows.key_names().is_empty());
        assert_eq!(rows.unchanged(0), Vec::<String>::new());
        assert_eq!(
            rows.coordinates().unwrap_err(),
            BronzeError::Missing(bronze::KAFKA_PARTITION)
        );
        assert_eq!(
            rows.after().unwrap_err().to_string(),
            "Bronze column `after` is missing"
        );
    }

    #[test]
    fn one_error_names_the_missing_or_mistyped_column() {
        let mut cols = core();
        cols.remove(2);
        let b = batch(cols);
        assert_eq!(
            BronzeRows::new(&b).err(),
            Some(BronzeError::Missing(bronze::ORDINAL))
        );
        let mut cols = core();
        cols.push((
            Field::new(bronze::KAFKA_OFFSET, DataType::Int32, true),
            Arc::new(Int32Array::from(vec![1, 2, 3])),
        ));
        let b = batch(cols);
        let err = BronzeRows::new(&b).err().unwrap();
        assert_eq!(err.to_string(), "Bronze column `kafka_offset` is not int64");
    }
}
