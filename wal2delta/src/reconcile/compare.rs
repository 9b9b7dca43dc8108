//! Comparing one table's rows: canonical bytes, hashes, exclusions and differences.
//!
//! A row's canonical form is its Arrow row-format encoding (`arrow::row`) over the compared
//! columns, all cast to one set of types, so equal values give equal bytes whichever side
//! they come from. Each row contributes two 128-bit hashes (the first 16 bytes of SHA-256):
//! one of its key columns, one of all its compared columns. A side's checksum is the sum
//! of its row hashes modulo 2^128: independent of order, and a duplicated row changes it
//! (unlike XOR).
//!
//! Memory: the source side is held as one `key hash → row hash` map (32 bytes of hashes
//! per row, about 40 with the map's overhead); Silver is streamed against it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wal2delta_lake::deltalake::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, UInt32Array};
use wal2delta_lake::deltalake::arrow::compute::{cast, take};
use wal2delta_lake::deltalake::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use wal2delta_lake::deltalake::arrow::row::{OwnedRow, RowConverter, SortField};
use wal2delta_lake::deltalake::arrow::util::display::{ArrayFormatter, FormatOptions};

/// A 128-bit hash of a key's or a row's canonical bytes.
pub type Hash = u128;

fn digest(bytes: &[u8]) -> Hash {
    let d = Sha256::digest(bytes);
    let mut h = [0u8; 16];
    h.copy_from_slice(&d[..16]);
    u128::from_be_bytes(h)
}

/// The compared columns of one table, their types, and which of them form the key.
pub struct Shape {
    schema: SchemaRef,
    key: Vec<usize>,
    keys: RowConverter,
    values: RowConverter,
}

impl Shape {
    /// `schema`: the compared columns as the source decodes and masks them; `key`: the
    /// names of the primary-key columns among them.
    pub fn new(schema: SchemaRef, key: &[String]) -> Result<Shape, String> {
        let key: Vec<usize> = key
            .iter()
            .map(|k| {
                schema
                    .index_of(k)
                    .map_err(|_| format!("key column `{k}` is not among the compared columns"))
            })
            .collect::<Result<_, _>>()?;
        if key.is_empty() {
            return Err("the table has no key columns".into());
        }
        let field = |i: usize| SortField::new(schema.field(i).data_type().clone());
        let keys = RowConverter::new(key.iter().map(|&i| field(i)).collect())
            .map_err(|e| format!("the key columns have no canonical form: {e}"))?;
        let values = RowConverter::new((0..schema.fields().len()).map(field).collect())
            .map_err(|e| format!("the columns have no canonical form: {e}"))?;
        Ok(Shape {
            schema,
            key,
            keys,
            values,
        })
    }

    pub fn names(&self) -> Vec<String> {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    pub fn key_names(&self) -> Vec<String> {
        self.key
            .iter()
            .map(|&i| self.schema.field(i).name().clone())
            .collect()
    }

    /// The compared columns of `batch`, found by name and cast to this shape's types.
    pub fn conform(&self, batch: &RecordBatch) -> Result<RecordBatch, String> {
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|f| {
                let c = batch
                    .column_by_name(f.name())
                    .ok_or_else(|| format!("column `{}` is missing", f.name()))?;
                typed(c, f.data_type(), f.name())
            })
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &wal2delta_lake::deltalake::arrow::array::RecordBatchOptions::new()
                .with_row_count(Some(batch.num_rows())),
        )
        .map_err(|e| e.to_string())
    }

    /// Only the key columns of `batch` (found by name), cast to the key types.
    pub fn conform_keys(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>, String> {
        self.key
            .iter()
            .map(|&i| {
                let f = self.schema.field(i);
                let c = batch
                    .column_by_name(f.name())
                    .ok_or_else(|| format!("key column `{}` is missing", f.name()))?;
                typed(c, f.data_type(), f.name())
            })
            .collect()
    }

    /// The key hash of every row of `keys` (from [`Shape::conform_keys`]).
    pub fn key_hashes(&self, keys: &[ArrayRef]) -> Result<Vec<Hash>, String> {
        let rows = self.keys.convert_columns(keys).map_err(|e| e.to_string())?;
        Ok(rows.iter().map(|r| digest(r.as_ref())).collect())
    }

    /// `(key hash, row hash)` of every row of a conformed batch.
    pub fn hashes(&self, b: &RecordBatch) -> Result<Vec<(Hash, Hash)>, String> {
        let keys: Vec<ArrayRef> = self.key.iter().map(|&i| b.column(i).clone()).collect();
        let key_hashes = self.key_hashes(&keys)?;
        let rows = self
            .values
            .convert_columns(b.columns())
            .map_err(|e| e.to_string())?;
        Ok(key_hashes
            .into_iter()
            .zip(rows.iter().map(|r| digest(r.as_ref())))
            .collect())
    }

    /// The key of row `i` of a conformed batch in the row format, which sorts like the key.
    fn key_row(&self, b: &RecordBatch, i: usize) -> Result<OwnedRow, String> {
        let keys: Vec<ArrayRef> = self.key.iter().map(|&k| b.column(k).slice(i, 1)).collect();
        let rows = self
            .keys
            .convert_columns(&keys)
            .map_err(|e| e.to_string())?;
        Ok(rows.row(0).owned())
    }

    /// The key of row `i` as JSON: `{"column": value}`, integers as numbers and everything
    /// else as text. Key columns that are masked or tokenized show the masked value.
    fn key_json(&self, b: &RecordBatch, i: usize) -> serde_json::Value {
        let options = FormatOptions::default().with_null("null");
        let mut out = serde_json::Map::new();
        for &k in &self.key {
            let c = b.column(k);
            let name = self.schema.field(k).name().clone();
            let v = if c.is_null(i) {
                serde_json::Value::Null
            } else {
                match c.data_type() {
                    DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                        cast(&c.slice(i, 1), &DataType::Int64)
                            .ok()
                            .map(|a| {
                                serde_json::Value::from(a.as_primitive::<Int64Type>().value(0))
                            })
                            .unwrap_or(serde_json::Value::Null)
                    }
                    _ => ArrayFormatter::try_new(c.as_ref(), &options)
                        .map(|f| serde_json::Value::from(f.value(i).to_string()))
                        .unwrap_or(serde_json::Value::Null),
                }
            };
            out.insert(name, v);
        }
        serde_json::Value::Object(out)
    }

    /// The names of the columns whose values differ between one-row batches `a` and `b`.
    fn differing_columns(&self, a: &RecordBatch, b: &RecordBatch) -> Vec<String> {
        let mut out = Vec::new();
        for (i, f) in self.schema.fields().iter().enumerate() {
            let same = RowConverter::new(vec![SortField::new(f.data_type().clone())])
                .and_then(|c| {
                    let x = c.convert_columns(&[a.column(i).clone()])?;
                    let y = c.convert_columns(&[b.column(i).clone()])?;
                    Ok(x.row(0) == y.row(0))
                })
                .unwrap_or(false);
            if !same {
                out.push(f.name().clone());
            }
        }
        out
    }
}

fn typed(c: &ArrayRef, ty: &DataType, name: &str) -> Result<ArrayRef, String> {
    if c.data_type() == ty {
        return Ok(c.clone());
    }
    // The cast error is left out: it may quote a value.
    cast(c, ty).map_err(|_| {
        format!(
            "column `{name}` is {} in Silver and {ty} from the source, and its values cannot be cast to compare them",
            c.data_type()
        )
    })
}

/// How a key differs between the source and Silver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Difference {
    MissingInSilver,
    ExtraInSilver,
    ValuesDiffer,
}

impl Difference {
    pub fn as_str(self) -> &'static str {
        match self {
            Difference::MissingInSilver => "missing_in_silver",
            Difference::ExtraInSilver => "extra_in_silver",
            Difference::ValuesDiffer => "values_differ",
        }
    }
}

/// Why a key is left out of the comparison on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    /// Silver holds a change committed at or after the snapshot LSN (a row, a delete
    /// tombstone, or a TRUNCATE).
    ChangedAfterSnapshot,
    /// An unresolved Silver quarantine record names the key.
    Quarantined,
    /// The source row does not decode (capture sends such rows to the DLQ).
    Undecodable,
}

/// What is known before Silver's rows are read.
#[derive(Debug, Default)]
pub struct Exclusions {
    /// The snapshot LSN: Silver rows with a `_commit_lsn` at or above it changed after.
    pub lsn: i64,
    /// Keys with a delete tombstone at or above the snapshot LSN.
    pub tombstoned: HashSet<Hash>,
    /// A TRUNCATE at or above the snapshot LSN emptied Silver of every older row.
    pub truncated_after: bool,
    pub quarantined: HashSet<Hash>,
    /// Keys of source rows that do not decode.
    pub undecodable: HashSet<Hash>,
}

/// The comparison of one table, fed the source rows and then the Silver rows.
#[derive(Debug, Default)]
pub struct Tally {
    source: HashMap<Hash, Hash>,
    excluded: HashMap<Hash, Exclusion>,
    pub source_rows: u64,
    pub silver_rows: u64,
    pub source_sum: Hash,
    pub silver_sum: Hash,
    pub differences: HashMap<Hash, Difference>,
}

/// The outcome counts of a finished [`Tally`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub changed_after_snapshot: u64,
    pub quarantined: u64,
    pub undecodable: u64,
    pub missing_in_silver: u64,
    pub extra_in_silver: u64,
    pub values_differ: u64,
}

impl Tally {
    /// One source row. A key seen twice is an error (the source key is not unique).
    pub fn source(&mut self, key: Hash, row: Hash) -> Result<(), String> {
        if self.source.insert(key, row).is_some() {
            return Err("two source rows have the same key after masking".into());
        }
        Ok(())
    }

    /// How many source rows are held.
    pub fn held(&self) -> usize {
        self.source.len()
    }

    /// One Silver row with its `_commit_lsn`.
    pub fn silver(&mut self, ex: &Exclusions, key: Hash, row: Hash, commit_lsn: i64) {
        let reason = if commit_lsn >= ex.lsn || ex.tombstoned.contains(&key) {
            Some(Exclusion::ChangedAfterSnapshot)
        } else if ex.quarantined.contains(&key) {
            Some(Exclusion::Quarantined)
        } else if ex.undecodable.contains(&key) {
            Some(Exclusion::Undecodable)
        } else {
            None
        };
        if let Some(r) = reason {
            self.source.remove(&key);
            self.excluded.entry(key).or_insert(r);
            return;
        }
        self.silver_rows += 1;
        self.silver_sum = self.silver_sum.wrapping_add(row);
        match self.source.remove(&key) {
            Some(s) => {
                self.source_rows += 1;
                self.source_sum = self.source_sum.wrapping_add(s);
                if s != row {
                    self.differences.insert(key, Difference::ValuesDiffer);
                }
            }
            None => {
                self.differences.insert(key, Difference::ExtraInSilver);
            }
        }
    }

    /// Settles the source rows Silver did not have; returns the counts.
    pub fn finish(&mut self, ex: &Exclusions, undecodable_rows: u64) -> Counts {
        for (key, row) in std::mem::take(&mut self.source) {
            let reason = if ex.truncated_after || ex.tombstoned.contains(&key) {
                Some(Exclusion::ChangedAfterSnapshot)
            } else if ex.quarantined.contains(&key) {
                Some(Exclusion::Quarantined)
            } else {
                None
            };
            match reason {
                Some(r) => {
                    self.excluded.entry(key).or_insert(r);
                }
                None => {
                    self.source_rows += 1;
                    self.source_sum = self.source_sum.wrapping_add(row);
                    self.differences.insert(key, Difference::MissingInSilver);
                }
            }
        }
        let mut c = Counts {
            undecodable: undecodable_rows,
            ..Counts::default()
        };
        for r in self.excluded.values() {
            match r {
                Exclusion::ChangedAfterSnapshot => c.changed_after_snapshot += 1,
                Exclusion::Quarantined => c.quarantined += 1,
                // Counted as source rows above (a key may be unknown).
                Exclusion::Undecodable => {}
            }
        }
        for d in self.differences.values() {
            match d {
                Difference::MissingInSilver => c.missing_in_silver += 1,
                Difference::ExtraInSilver => c.extra_in_silver += 1,
                Difference::ValuesDiffer => c.values_differ += 1,
            }
        }
        c
    }
}

/// One differing key, as reported.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDifference {
    pub key: serde_json::Value,
    pub difference: Difference,
    /// For `values_differ`: the columns that differ (names only, never values).
    pub columns: Vec<String>,
}

/// The first `max` differing keys in key order, gathered in a second pass over both sides.
pub struct Picker<'a> {
    shape: &'a Shape,
    wanted: &'a HashMap<Hash, Difference>,
    max: usize,
    picked: BTreeMap<OwnedRow, Picked>,
}

struct Picked {
    difference: Difference,
    key: serde_json::Value,
    source: Option<RecordBatch>,
    silver: Option<RecordBatch>,
}

impl<'a> Picker<'a> {
    pub fn new(shape: &'a Shape, wanted: &'a HashMap<Hash, Difference>, max: usize) -> Self {
        Picker {
            shape,
            wanted,
            max,
            picked: BTreeMap::new(),
        }
    }

    /// Looks at a conformed batch of one side (`silver` says which).
    pub fn offer(&mut self, b: &RecordBatch, silver: bool) -> Result<(), String> {
        if self.max == 0 {
            return Ok(());
        }
        let hashes = self.shape.hashes(b)?;
        for (i, (key, _)) in hashes.iter().enumerate() {
            let Some(&difference) = self.wanted.get(key) else {
                continue;
            };
            // Extra rows only count from Silver, missing ones only from the source.
            let relevant = match difference {
                Difference::MissingInSilver => !silver,
                Difference::ExtraInSilver => silver,
                Difference::ValuesDiffer => true,
            };
            if !relevant {
                continue;
            }
            let row = self.shape.key_row(b, i)?;
            // Full, and not smaller than the largest kept: not among the first.
            let beyond = self
                .picked
                .last_key_value()
                .is_some_and(|(last, _)| row >= *last);
            if self.picked.len() >= self.max && beyond && !self.picked.contains_key(&row) {
                continue;
            }
            let one = take_row(b, i)?;
            let entry = self.picked.entry(row).or_insert_with(|| Picked {
                difference,
                key: self.shape.key_json(b, i),
                source: None,
                silver: None,
            });
            if silver {
                entry.silver = Some(one);
            } else {
                entry.source = Some(one);
            }
            // Keep the smallest keys of each side: the smallest of the union are among them.
            while self.picked.len() > self.max {
                self.picked.pop_last();
            }
        }
        Ok(())
    }

    pub fn finish(self) -> Vec<KeyDifference> {
        self.picked
            .into_values()
            .map(|p| KeyDifference {
                columns: match (&p.source, &p.silver) {
                    (Some(a), Some(b)) if p.difference == Difference::ValuesDiffer => {
                        self.shape.differing_columns(a, b)
                    }
                    _ => Vec::new(),
                },
                key: p.key,
                difference: p.difference,
            })
            .collect()
    }
}

fn take_row(b: &RecordBatch, i: usize) -> Result<RecordBatch, String> {
    let idx = UInt32Array::from(vec![i as u32]);
    let columns = b
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &idx, None))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    RecordBatch::try_new(b.schema(), columns).map_err(|e| e.to_string())
}

/// `_commit_lsn` of a Silver batch.
pub fn commit_lsns(b: &RecordBatch, column: &str) -> Result<Arc<dyn Array>, String> {
    let c = b
        .column_by_name(column)
        .ok_or_else(|| format!("Silver has no `{column}` column"))?;
    typed(c, &DataType::Int64, column)
}

/// A checksum as 32 hex digits.
pub fn hex(h: Hash) -> String {
    format!("{h:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal2delta_lake::deltalake::arrow::array::{Int32Array, Int64Array, StringArray};
    use wal2delta_lake::deltalake::arrow::datatypes::{Field, Schema};

    fn shape() -> Shape {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        Shape::new(schema, &["id".into()]).unwrap()
    }

    fn batch(rows: &[(i32, Option<&str>)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    }

    fn tally(
        s: &Shape,
        source: &RecordBatch,
        silver: &RecordBatch,
        lsns: &[i64],
        ex: &Exclusions,
    ) -> (Tally, Counts) {
        let mut t = Tally::default();
        for (k, r) in s.hashes(&s.conform(source).unwrap()).unwrap() {
            t.source(k, r).unwrap();
        }
        for ((k, r), l) in s
            .hashes(&s.conform(silver).unwrap())
            .unwrap()
            .into_iter()
            .zip(lsns)
        {
            t.silver(ex, k, r, *l);
        }
        let c = t.finish(ex, 0);
        (t, c)
    }

    #[test]
    fn equal_rows_in_any_order_give_equal_checksums() {
        let s = shape();
        let ex = Exclusions {
            lsn: 100,
            ..Default::default()
        };
        let a = batch(&[(1, Some("a")), (2, None), (3, Some("c"))]);
        let b = batch(&[(3, Some("c")), (1, Some("a")), (2, None)]);
        let (t, c) = tally(&s, &a, &b, &[1, 2, 3], &ex);
        assert_eq!(c, Counts::default());
        assert_eq!(t.source_sum, t.silver_sum);
        assert_eq!((t.source_rows, t.silver_rows), (3, 3));
    }

    #[test]
    fn each_kind_of_difference_is_found() {
        let s = shape();
        let ex = Exclusions {
            lsn: 100,
            ..Default::default()
        };
        let a = batch(&[(1, Some("a")), (2, Some("b")), (3, Some("c"))]);
        // 1 differs (NULL is not ""), 2 is missing, 4 is extra.
        let b = batch(&[(1, Some("")), (3, Some("c")), (4, Some("d"))]);
        let (t, c) = tally(&s, &a, &b, &[1, 2, 3], &ex);
        assert_eq!(
            (c.values_differ, c.missing_in_silver, c.extra_in_silver),
            (1, 1, 1)
        );
        assert_ne!(t.source_sum, t.silver_sum);
        let mut p = Picker::new(&s, &t.differences, 20);
        p.offer(&s.conform(&a).unwrap(), false).unwrap();
        p.offer(&s.conform(&b).unwrap(), true).unwrap();
        let found = p.finish();
        let summary: Vec<(String, &str, Vec<String>)> = found
            .iter()
            .map(|d| (d.key.to_string(), d.difference.as_str(), d.columns.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    r#"{"id":1}"#.to_string(),
                    "values_differ",
                    vec!["name".to_string()]
                ),
                (r#"{"id":2}"#.to_string(), "missing_in_silver", vec![]),
                (r#"{"id":4}"#.to_string(), "extra_in_silver", vec![]),
            ]
        );
        // Only the first key in key order when one is asked for.
        let mut p = Picker::new(&s, &t.differences, 1);
        p.offer(&s.conform(&b).unwrap(), true).unwrap();
        p.offer(&s.conform(&a).unwrap(), false).unwrap();
        let found = p.finish();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].key.to_string(), r#"{"id":1}"#);
        assert_eq!(found[0].columns, vec!["name".to_string()]);
    }

    #[test]
    fn changes_after_the_snapshot_and_quarantined_keys_are_left_out_on_both_sides() {
        let s = shape();
        let keys = |ids: &[i32]| -> HashSet<Hash> {
            let b = batch(&ids.iter().map(|&i| (i, None)).collect::<Vec<_>>());
            s.key_hashes(&s.conform_keys(&b).unwrap())
                .unwrap()
                .into_iter()
                .collect()
        };
        let ex = Exclusions {
            lsn: 100,
            tombstoned: keys(&[5]),
            quarantined: keys(&[6]),
            ..Default::default()
        };
        // Source at the snapshot: 1, 2, 3, 5, 6. Silver later: 2 updated after (lsn 150),
        // 5 deleted after (its tombstone), 7 inserted after, 6 quarantined with old values.
        let a = batch(&[
            (1, Some("a")),
            (2, Some("b")),
            (3, Some("c")),
            (5, Some("e")),
            (6, Some("f")),
        ]);
        let b = batch(&[
            (1, Some("a")),
            (2, Some("B")),
            (3, Some("c")),
            (6, Some("old")),
            (7, Some("g")),
        ]);
        let (t, c) = tally(&s, &a, &b, &[10, 150, 10, 10, 120], &ex);
        assert_eq!(c.changed_after_snapshot, 3, "2, 5 and 7");
        assert_eq!(c.quarantined, 1);
        assert!(t.differences.is_empty(), "{:?}", t.differences);
        assert_eq!((t.source_rows, t.silver_rows), (2, 2));
        assert_eq!(t.source_sum, t.silver_sum);
    }

    #[test]
    fn a_truncate_after_the_snapshot_excuses_every_missing_row() {
        let s = shape();
        let ex = Exclusions {
            lsn: 100,
            truncated_after: true,
            ..Default::default()
        };
        let a = batch(&[(1, Some("a")), (2, Some("b"))]);
        let b = batch(&[(9, Some("z"))]);
        let (_, c) = tally(&s, &a, &b, &[130], &ex);
        assert_eq!(c.changed_after_snapshot, 3);
        assert_eq!(c.missing_in_silver, 0);
    }

    #[test]
    fn silver_columns_are_cast_to_the_source_types() {
        let s = shape();
        let wide = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("name", DataType::Utf8View, true),
                Field::new("_commit_lsn", DataType::Int64, true),
                Field::new("id", DataType::Int64, true),
            ])),
            vec![
                Arc::new(
                    wal2delta_lake::deltalake::arrow::array::StringViewArray::from(vec![Some("a")]),
                ),
                Arc::new(Int64Array::from(vec![1])),
                Arc::new(Int64Array::from(vec![1])),
            ],
        )
        .unwrap();
        let a = s
            .hashes(&s.conform(&batch(&[(1, Some("a"))])).unwrap())
            .unwrap();
        let b = s.hashes(&s.conform(&wide).unwrap()).unwrap();
        assert_eq!(a, b);
    }
}
