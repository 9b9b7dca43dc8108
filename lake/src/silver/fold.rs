//! Folding a batch of Bronze changes into one change per primary key.
//!
//! Changes are ordered by their position `(commit_lsn, ordinal)`; per key the highest wins.
//! Duplicates (the same change delivered twice) have the same position and the same
//! content, so which copy wins does not matter: the fold is idempotent.
//!
//! - `c`, `r` (snapshot read) and `u` are upserts of the row in `after`; `d` deletes the
//!   key in `key`. A create or update whose `before` holds a different key (the primary
//!   key was changed) also deletes the old key, at the same position. Capture sends a key
//!   change as `d` (old key, ordinal n) then `c` (new key, `before` = old row, ordinal
//!   n + 1); earlier releases sent one `u`. Both fold to: old key deleted, new key present.
//! - `t` (TRUNCATE) removes every change positioned before it; the caller also removes
//!   every Silver row positioned before it ([`Folded::truncate`]).
//! - A column an update left unchanged (unchanged TOAST) takes its value from the key's
//!   latest earlier upsert in the batch that carried it, following key moves back to the
//!   old key (past the move's own delete of it). When the batch has none, the
//!   column is listed in `_unchanged` and MERGE keeps the Silver value.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
    TimestampMicrosecondArray, UInt32Array,
};
use deltalake::arrow::buffer::OffsetBuffer;
use deltalake::arrow::compute::{cast, interleave, take};
use deltalake::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use deltalake::arrow::row::{RowConverter, SortField};

use super::{Position, COMMIT_LSN, COMMIT_TS, MOVED_FROM, OP, ORDINAL, UNCHANGED};

/// Why a batch could not be folded (the Bronze rows are not what Silver expects).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FoldError(pub String);

/// The result of folding one batch.
pub struct Folded {
    /// One row per key: the value columns (key columns taken from the key), then
    /// `_commit_lsn`, `_ordinal`, `_commit_ts`, `_op` (`u` upsert, `d` delete) and
    /// `_unchanged` (columns whose Silver value must be kept). `None` when no change
    /// survived.
    pub rows: Option<RecordBatch>,
    /// The latest TRUNCATE in the batch, if any.
    pub truncate: Option<Position>,
    /// Columns that appear in some `_unchanged` list.
    pub unchanged_columns: BTreeSet<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Upsert,
    Delete,
}

#[derive(Clone, Copy)]
struct Action {
    row: usize,
    /// The key is in `before` (the old key of a key update), not in `key`.
    old_key: bool,
    kind: Kind,
    pos: Position,
}

fn struct_col<'a>(
    batch: &'a RecordBatch,
    name: &str,
) -> Result<Option<&'a StructArray>, FoldError> {
    match batch.column_by_name(name) {
        None => Ok(None),
        Some(a) => a
            .as_struct_opt()
            .map(Some)
            .ok_or_else(|| FoldError(format!("Bronze column `{name}` is not a struct"))),
    }
}

fn i64_col<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a Int64Array, FoldError> {
    batch
        .column_by_name(name)
        .and_then(|a| a.as_primitive_opt())
        .ok_or_else(|| FoldError(format!("Bronze column `{name}` is missing or not int64")))
}

/// Folds `batch` (Bronze rows: `op`, `before`, `after`, `key`, `commit_lsn`, `ordinal`,
/// `commit_ts`, `unchanged_toast_columns`), dropping every change positioned before
/// `truncated` (a TRUNCATE already applied).
pub fn fold(batch: &RecordBatch, truncated: Option<Position>) -> Result<Folded, FoldError> {
    let n = batch.num_rows();
    let op = batch
        .column_by_name("op")
        .and_then(|a| a.as_string_opt::<i32>())
        .ok_or_else(|| FoldError("Bronze column `op` is missing".into()))?;
    let lsn = i64_col(batch, "commit_lsn")?;
    let ordinal = i64_col(batch, "ordinal")?;
    let after = struct_col(batch, "after")?
        .ok_or_else(|| FoldError("Bronze column `after` is missing".into()))?;
    let before = struct_col(batch, "before")?;
    let key = struct_col(batch, "key")?;
    let toast = batch
        .column_by_name("unchanged_toast_columns")
        .and_then(|a| a.as_list_opt::<i32>());
    if toast.is_some_and(|l| l.values().as_string_opt::<i32>().is_none()) {
        return Err(FoldError(
            "Bronze column `unchanged_toast_columns` is not a list of text".into(),
        ));
    }
    let commit_ts = batch.column_by_name("commit_ts");

    let pos = |i: usize| Position(lsn.value(i), ordinal.value(i));
    let truncate = (0..n)
        .filter(|&i| op.value(i) == "t")
        .map(pos)
        .chain(truncated)
        .max();

    // The key columns: the fields of `key`, typed as in `after`.
    let key_names: Vec<String> = match key {
        Some(k) => k.fields().iter().map(|f| f.name().clone()).collect(),
        None => Vec::new(),
    };
    let after_field = |name: &str| {
        after
            .fields()
            .iter()
            .position(|f| f.name() == name)
            .ok_or_else(|| FoldError(format!("key column `{name}` is not a column of `after`")))
    };
    let key_types: Vec<DataType> = key_names
        .iter()
        .map(|k| after_field(k).map(|i| after.fields()[i].data_type().clone()))
        .collect::<Result<_, _>>()?;
    let typed = |array: &ArrayRef, ty: &DataType| -> Result<ArrayRef, FoldError> {
        if array.data_type() == ty {
            Ok(array.clone())
        } else {
            cast(array, ty).map_err(|e| FoldError(format!("key column: {e}")))
        }
    };
    let new_keys: Vec<ArrayRef> = match key {
        Some(k) => k
            .columns()
            .iter()
            .zip(&key_types)
            .map(|(a, t)| typed(a, t))
            .collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let old_keys: Option<Vec<ArrayRef>> = match before {
        Some(b) if !key_names.is_empty() => key_names
            .iter()
            .zip(&key_types)
            .map(|(name, t)| b.column_by_name(name).map(|a| typed(a, t)))
            .collect::<Option<Result<Vec<_>, _>>>()
            .transpose()?,
        _ => None,
    };
    if key_names.is_empty() && (0..n).any(|i| op.value(i) != "t") {
        return Err(FoldError(
            "Bronze rows have no `key` column: the table has no primary key, or was stored before keys were".into(),
        ));
    }
    let converter = RowConverter::new(key_types.iter().cloned().map(SortField::new).collect())
        .map_err(|e| FoldError(e.to_string()))?;
    let new_rows = converter
        .convert_columns(&new_keys)
        .map_err(|e| FoldError(e.to_string()))?;
    let old_rows = match &old_keys {
        Some(cols) => Some(
            converter
                .convert_columns(cols)
                .map_err(|e| FoldError(e.to_string()))?,
        ),
        None => None,
    };

    // Actions, grouped by key; per key-move row, the old key.
    let mut moved_from: HashMap<usize, Vec<u8>> = HashMap::new();
    let mut groups: HashMap<Vec<u8>, Vec<Action>> = HashMap::new();
    let mut order: Vec<Vec<u8>> = Vec::new();
    let mut push = |k: &[u8], a: Action| {
        groups
            .entry(k.to_vec())
            .or_insert_with(|| {
                order.push(k.to_vec());
                Vec::new()
            })
            .push(a)
    };
    for i in 0..n {
        let p = pos(i);
        if truncate.is_some_and(|t| p < t) {
            continue;
        }
        let kind = match op.value(i) {
            "t" => continue,
            "c" | "r" | "u" => Kind::Upsert,
            "d" => Kind::Delete,
            other => return Err(FoldError(format!("unknown op {other:?}"))),
        };
        if key.is_some_and(|k| k.is_null(i)) {
            return Err(FoldError(format!(
                "a change with op {:?} has no key",
                op.value(i)
            )));
        }
        let new_key = new_rows.row(i);
        // A key move: an update (earlier releases) or a create (the new half of a
        // primary-key change, after the delete of the old key) whose `before` names
        // another key.
        if kind == Kind::Upsert && matches!(op.value(i), "u" | "c") {
            if let (Some(old), Some(b)) = (&old_rows, before) {
                let old_key = old.row(i);
                let has_old = b.is_valid(i)
                    && old_keys
                        .as_ref()
                        .is_some_and(|cols| cols.iter().all(|c| c.is_valid(i)));
                if has_old && old_key != new_key {
                    moved_from.insert(i, old_key.as_ref().to_vec());
                    push(
                        old_key.as_ref(),
                        Action {
                            row: i,
                            old_key: true,
                            kind: Kind::Delete,
                            pos: p,
                        },
                    );
                }
            }
        }
        push(
            new_key.as_ref(),
            Action {
                row: i,
                old_key: false,
                kind,
                pos: p,
            },
        );
    }
    if order.is_empty() {
        return Ok(Folded {
            rows: None,
            truncate,
            unchanged_columns: BTreeSet::new(),
        });
    }

    let unchanged_of = |row: usize| -> Vec<String> {
        match toast {
            Some(l) if l.is_valid(row) => {
                let v = l.value(row);
                match v.as_string_opt::<i32>() {
                    Some(s) => (0..s.len())
                        .filter(|&j| s.is_valid(j))
                        .map(|j| s.value(j).to_owned())
                        .collect(),
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        }
    };

    // Per key: the winner, and for each column the row that supplies its value.
    let fields = after.fields();
    let mut winners: Vec<Action> = Vec::with_capacity(order.len());
    let mut supplier: Vec<Vec<usize>> = vec![Vec::with_capacity(order.len()); fields.len()];
    let mut unresolved: Vec<Vec<String>> = Vec::with_capacity(order.len());
    for k in &order {
        if let Some(a) = groups.get_mut(k) {
            a.sort_by_key(|a| a.pos);
        }
    }
    // The latest upsert of `key` before `pos` that carried column `name`, following the key
    // back through key moves; or the row of the last move when the chain leaves the batch.
    // A key reached through a move (`moved`) skips the move's own delete of it: capture
    // sends a primary-key change as a delete of the old key right before the create of the
    // new one (ordinals n and n + 1 of one transaction), and the old key's history before
    // that delete is what the create's unchanged columns come from.
    let find = |key: &[u8], pos: Position, name: &str, moved: bool| -> Result<usize, usize> {
        let mut key = key.to_vec();
        let mut pos = pos;
        let mut moved = moved;
        let mut last_move = None;
        for _ in 0..64 {
            let Some(actions) = groups.get(&key) else {
                break;
            };
            let companion = Position(pos.0, pos.1.saturating_sub(1));
            let earlier = actions
                .iter()
                .rev()
                .filter(|a| a.pos < pos && !a.old_key)
                .filter(|a| !(moved && a.kind == Kind::Delete && a.pos == companion))
                .take_while(|a| a.kind == Kind::Upsert);
            let mut next = None;
            for a in earlier {
                if !unchanged_of(a.row).contains(&name.to_owned()) {
                    return Ok(a.row);
                }
                if let Some(old) = moved_from.get(&a.row) {
                    next = Some((old.clone(), a.pos, a.row));
                    break;
                }
            }
            match next {
                Some((old, p, row)) => {
                    key = old;
                    pos = p;
                    moved = true;
                    last_move = Some(row);
                }
                None => break,
            }
        }
        Err(last_move.unwrap_or(usize::MAX))
    };
    // Per winner: the key-move row whose old key Silver must supply a value from.
    let mut moves_out: Vec<Option<usize>> = Vec::with_capacity(order.len());
    for k in &order {
        let actions = &groups[k];
        let w = *actions.last().expect("non-empty group");
        let mut missing = Vec::new();
        let mut rows_for = vec![w.row; fields.len()];
        let mut from_silver = None;
        if w.kind == Kind::Upsert {
            for name in unchanged_of(w.row) {
                let Some(j) = fields.iter().position(|f| f.name() == &name) else {
                    continue;
                };
                // The winner itself may be a key move: its old key's history counts.
                let start = match moved_from.get(&w.row) {
                    Some(old) => find(old, w.pos, &name, true).or_else(|m| {
                        find(k, w.pos, &name, false).map_err(|_| {
                            if m == usize::MAX {
                                w.row
                            } else {
                                m
                            }
                        })
                    }),
                    None => find(k, w.pos, &name, false),
                };
                match start {
                    Ok(r) => rows_for[j] = r,
                    Err(m) => {
                        if m != usize::MAX && moved_from.contains_key(&m) {
                            from_silver = Some(m);
                        }
                        missing.push(name);
                    }
                }
            }
        }
        for (j, r) in rows_for.into_iter().enumerate() {
            supplier[j].push(r);
        }
        winners.push(w);
        unresolved.push(missing);
        moves_out.push(from_silver);
    }

    // Value columns; key columns come from the key (old or new).
    let mut out_fields: Vec<Field> = Vec::new();
    let mut out_arrays: Vec<ArrayRef> = Vec::new();
    for (j, f) in fields.iter().enumerate() {
        let array = match key_names.iter().position(|k| k == f.name()) {
            Some(ki) => {
                let mut sources: Vec<&dyn Array> = vec![new_keys[ki].as_ref()];
                if let Some(old) = &old_keys {
                    sources.push(old[ki].as_ref());
                }
                let idx: Vec<(usize, usize)> = winners
                    .iter()
                    .map(|w| (usize::from(w.old_key), w.row))
                    .collect();
                interleave(&sources, &idx).map_err(|e| FoldError(e.to_string()))?
            }
            None => {
                // Deletes carry only their key.
                let idx: UInt32Array = supplier[j]
                    .iter()
                    .zip(&winners)
                    .map(|(&r, w)| (w.kind == Kind::Upsert).then_some(r as u32))
                    .collect();
                take(after.column(j).as_ref(), &idx, None).map_err(|e| FoldError(e.to_string()))?
            }
        };
        out_fields.push(Field::new(f.name(), f.data_type().clone(), true));
        out_arrays.push(array);
    }
    let win_rows = UInt32Array::from(winners.iter().map(|w| w.row as u32).collect::<Vec<_>>());
    let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let ts: ArrayRef = match commit_ts {
        Some(a) => {
            let t = take(a.as_ref(), &win_rows, None).map_err(|e| FoldError(e.to_string()))?;
            cast(&t, &utc).map_err(|e| FoldError(e.to_string()))?
        }
        None => Arc::new(TimestampMicrosecondArray::new_null(winners.len()).with_timezone("UTC")),
    };
    let unchanged_columns: BTreeSet<String> = unresolved.iter().flatten().cloned().collect();
    let mut offsets = vec![0i32];
    let mut names: Vec<&str> = Vec::new();
    for u in &unresolved {
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
    .map_err(|e| FoldError(e.to_string()))?;
    let meta: Vec<(Field, ArrayRef)> = vec![
        (
            Field::new(COMMIT_LSN, DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values(
                winners.iter().map(|w| w.pos.0),
            )),
        ),
        (
            Field::new(ORDINAL, DataType::Int64, true),
            Arc::new(Int64Array::from_iter_values(
                winners.iter().map(|w| w.pos.1),
            )),
        ),
        (Field::new(COMMIT_TS, utc, true), ts),
        (
            Field::new(OP, DataType::Utf8, true),
            Arc::new(StringArray::from_iter_values(winners.iter().map(
                |w| match w.kind {
                    Kind::Upsert => "u",
                    Kind::Delete => "d",
                },
            ))),
        ),
        (
            Field::new(UNCHANGED, DataType::List(item), true),
            Arc::new(unchanged),
        ),
    ];
    for (f, a) in meta {
        out_fields.push(f);
        out_arrays.push(a);
    }
    // The old key Silver must supply unchanged values from (key moves), when any.
    if let (true, Some(old)) = (moves_out.iter().any(Option::is_some), &old_keys) {
        let idx: UInt32Array = moves_out.iter().map(|m| m.map(|r| r as u32)).collect();
        for (ki, name) in key_names.iter().enumerate() {
            let a = take(old[ki].as_ref(), &idx, None).map_err(|e| FoldError(e.to_string()))?;
            out_fields.push(Field::new(
                format!("{MOVED_FROM}{name}"),
                a.data_type().clone(),
                true,
            ));
            out_arrays.push(a);
        }
    }
    let rows = RecordBatch::try_new(Arc::new(Schema::new(out_fields)), out_arrays)
        .map_err(|e| FoldError(e.to_string()))?;
    Ok(Folded {
        rows: Some(rows),
        truncate,
        unchanged_columns,
    })
}

#[cfg(test)]
#[path = "fold/tests.rs"]
mod tests;
