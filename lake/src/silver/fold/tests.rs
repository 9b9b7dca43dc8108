use std::sync::Arc;

use deltalake::arrow::array::{
    Array, ArrayRef, AsArray, Int32Array, RecordBatch, StringArray, StringBuilder, StructArray,
};
use deltalake::arrow::datatypes::{DataType, Field, Fields};
use wal2delta_model::bronze;

use super::{FoldError, Folded};
use crate::silver::rows::{test_rows, BronzeRows};
use crate::silver::{Position, MOVED_FROM, OP, UNCHANGED};

/// [`super::fold`] of a batch.
fn fold(b: &RecordBatch, truncated: Option<Position>) -> Result<Folded, FoldError> {
    super::fold(&BronzeRows::new(b)?, truncated)
}

/// One Bronze change: op, key id, value (None = null), unchanged columns, old key.
struct C {
    op: &'static str,
    id: i32,
    v: Option<&'static str>,
    lsn: i64,
    ord: i64,
    toast: Vec<&'static str>,
    old_id: Option<i32>,
}

fn c(op: &'static str, id: i32, v: Option<&'static str>, lsn: i64, ord: i64) -> C {
    C {
        op,
        id,
        v,
        lsn,
        ord,
        toast: vec![],
        old_id: None,
    }
}

fn batch(changes: &[C]) -> RecordBatch {
    let row_fields = Fields::from(vec![
        Field::new("id", DataType::Int32, true),
        Field::new("v", DataType::Utf8, true),
    ]);
    let image = |vals: Vec<Option<(i32, Option<&str>)>>| -> ArrayRef {
        let ids: Int32Array = vals.iter().map(|x| x.map(|(i, _)| i)).collect();
        let vs: StringArray = vals.iter().map(|x| x.and_then(|(_, v)| v)).collect();
        let nulls: Vec<bool> = vals.iter().map(Option::is_some).collect();
        Arc::new(StructArray::new(
            row_fields.clone(),
            vec![Arc::new(ids), Arc::new(vs)],
            Some(nulls.into()),
        ))
    };
    let after = image(
        changes
            .iter()
            .map(|c| matches!(c.op, "c" | "u" | "r").then_some((c.id, c.v)))
            .collect(),
    );
    let before = image(
        changes
            .iter()
            .map(|c| c.old_id.map(|o| (o, None)))
            .collect(),
    );
    let key_fields = Fields::from(vec![Field::new("id", DataType::Int32, false)]);
    let key_nulls: Vec<bool> = changes.iter().map(|c| c.op != "t").collect();
    let key: ArrayRef = Arc::new(StructArray::new(
        key_fields,
        vec![Arc::new(Int32Array::from(
            changes.iter().map(|c| c.id).collect::<Vec<_>>(),
        ))],
        Some(key_nulls.into()),
    ));
    let mut toast = deltalake::arrow::array::ListBuilder::new(StringBuilder::new());
    for c in changes {
        for t in &c.toast {
            toast.values().append_value(t);
        }
        toast.append(true);
    }
    let toast: ArrayRef = Arc::new(toast.finish());
    let ops: Vec<&str> = changes.iter().map(|c| c.op).collect();
    let positions: Vec<Position> = changes.iter().map(|c| Position(c.lsn, c.ord)).collect();
    let toast_field = Field::new(
        bronze::UNCHANGED_TOAST_COLUMNS,
        toast.data_type().clone(),
        true,
    );
    test_rows(
        &ops,
        [before, after, key],
        &positions,
        vec![(toast_field, toast)],
    )
}

/// (id, v, op, unchanged) per folded row, sorted by id.
fn rows(f: &Folded) -> Vec<(i32, Option<String>, String, Vec<String>)> {
    let Some(b) = &f.rows else { return vec![] };
    let id = b
        .column_by_name("id")
        .unwrap()
        .as_primitive::<deltalake::arrow::datatypes::Int32Type>();
    let v = b.column_by_name("v").unwrap().as_string::<i32>();
    let op = b.column_by_name(OP).unwrap().as_string::<i32>();
    let un = b.column_by_name(UNCHANGED).unwrap().as_list::<i32>();
    let mut out: Vec<_> = (0..b.num_rows())
        .map(|i| {
            let l = un.value(i);
            let l = l.as_string::<i32>();
            (
                id.value(i),
                v.is_valid(i).then(|| v.value(i).to_owned()),
                op.value(i).to_owned(),
                (0..l.len()).map(|j| l.value(j).to_owned()).collect(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn highest_position_wins_whatever_the_arrival_order() {
    let changes = [
        c("u", 1, Some("b"), 20, 1),
        c("c", 1, Some("a"), 10, 1),
        c("c", 2, Some("x"), 10, 2),
        c("u", 1, Some("b"), 20, 1), // duplicate
        c("d", 2, None, 30, 1),
    ];
    let f = fold(&batch(&changes), None).unwrap();
    assert_eq!(
        rows(&f),
        vec![
            (1, Some("b".into()), "u".into(), vec![]),
            (2, None, "d".into(), vec![])
        ]
    );
    // The same changes in another order fold to the same result.
    let mut reversed: Vec<C> = changes.into_iter().collect();
    reversed.reverse();
    assert_eq!(rows(&fold(&batch(&reversed), None).unwrap()), rows(&f));
}

#[test]
fn truncate_drops_earlier_changes_and_is_reported() {
    let f = fold(
        &batch(&[
            c("c", 1, Some("a"), 10, 1),
            c("t", 0, None, 20, 1),
            c("c", 2, Some("b"), 20, 2),
        ]),
        None,
    )
    .unwrap();
    assert_eq!(f.truncate, Some(Position(20, 1)));
    assert_eq!(rows(&f), vec![(2, Some("b".into()), "u".into(), vec![])]);
    // A TRUNCATE applied earlier drops a late duplicate from before it.
    let late = fold(
        &batch(&[c("c", 1, Some("a"), 10, 1)]),
        Some(Position(20, 1)),
    )
    .unwrap();
    assert!(late.rows.is_none());
}

#[test]
fn unchanged_toast_takes_the_batch_value_or_stays_unresolved() {
    let mut upd = c("u", 1, None, 20, 1);
    upd.toast = vec!["v"];
    let f = fold(&batch(&[c("c", 1, Some("big"), 10, 1), upd]), None).unwrap();
    assert_eq!(rows(&f), vec![(1, Some("big".into()), "u".into(), vec![])]);

    let mut alone = c("u", 1, None, 20, 1);
    alone.toast = vec!["v"];
    let f = fold(&batch(&[alone]), None).unwrap();
    assert_eq!(rows(&f), vec![(1, None, "u".into(), vec!["v".into()])]);
    assert!(f.unchanged_columns.contains("v"));
}

#[test]
fn key_update_deletes_the_old_key() {
    let mut moved = c("u", 2, Some("a"), 20, 1);
    moved.old_id = Some(1);
    let f = fold(&batch(&[c("c", 1, Some("a"), 10, 1), moved]), None).unwrap();
    assert_eq!(
        rows(&f),
        vec![
            (1, None, "d".into(), vec![]),
            (2, Some("a".into()), "u".into(), vec![])
        ]
    );
}

#[test]
fn a_moved_row_takes_unchanged_values_from_its_old_key() {
    // In the batch: 1 is inserted, moved to 2, then to 3, each move leaving `v` unchanged.
    let mut to2 = c("u", 2, None, 20, 1);
    to2.old_id = Some(1);
    to2.toast = vec!["v"];
    let mut to3 = c("u", 3, None, 30, 1);
    to3.old_id = Some(2);
    to3.toast = vec!["v"];
    let f = fold(&batch(&[c("c", 1, Some("big"), 10, 1), to2, to3]), None).unwrap();
    assert_eq!(
        rows(&f),
        vec![
            (1, None, "d".into(), vec![]),
            (2, None, "d".into(), vec![]),
            (3, Some("big".into()), "u".into(), vec![])
        ]
    );
    assert!(f
        .rows
        .as_ref()
        .unwrap()
        .column_by_name(&format!("{MOVED_FROM}id"))
        .is_none());

    // Not in the batch: the value is in Silver under the old key, which the fold names.
    let mut alone = c("u", 5, None, 20, 1);
    alone.old_id = Some(4);
    alone.toast = vec!["v"];
    let f = fold(&batch(&[alone]), None).unwrap();
    assert_eq!(
        rows(&f),
        vec![
            (4, None, "d".into(), vec![]),
            (5, None, "u".into(), vec!["v".into()])
        ]
    );
    let b = f.rows.unwrap();
    let id = b
        .column_by_name("id")
        .unwrap()
        .as_primitive::<deltalake::arrow::datatypes::Int32Type>();
    let from = b
        .column_by_name(&format!("{MOVED_FROM}id"))
        .expect("old key column")
        .as_primitive::<deltalake::arrow::datatypes::Int32Type>();
    for i in 0..b.num_rows() {
        if id.value(i) == 5 {
            assert_eq!(from.value(i), 4);
        } else {
            assert!(from.is_null(i));
        }
    }
}

/// A key move as capture sends it: `d` of the old key (ordinal n), then `c` of the new key
/// whose `before` names the old one (ordinal n + 1).
fn debezium_move(old: i32, new: i32, v: Option<&'static str>, lsn: i64, ord: i64) -> [C; 2] {
    let mut create = c("c", new, v, lsn, ord + 1);
    create.old_id = Some(old);
    if v.is_none() {
        create.toast = vec!["v"];
    }
    [c("d", old, None, lsn, ord), create]
}

#[test]
fn a_key_change_as_delete_then_create_moves_the_row_and_its_unchanged_values() {
    // In the batch: 1 is inserted, moved to 2 (v unchanged), then to 3 (v unchanged).
    let mut changes = vec![c("c", 1, Some("big"), 10, 1)];
    changes.extend(debezium_move(1, 2, None, 20, 1));
    changes.extend(debezium_move(2, 3, None, 30, 4));
    let f = fold(&batch(&changes), None).unwrap();
    assert_eq!(
        rows(&f),
        vec![
            (1, None, "d".into(), vec![]),
            (2, None, "d".into(), vec![]),
            (3, Some("big".into()), "u".into(), vec![])
        ]
    );

    // Not in the batch: Silver supplies the value from the old key, which the fold names.
    let f = fold(&batch(&debezium_move(4, 5, None, 20, 1)), None).unwrap();
    assert_eq!(
        rows(&f),
        vec![
            (4, None, "d".into(), vec![]),
            (5, None, "u".into(), vec!["v".into()])
        ]
    );
    let b = f.rows.unwrap();
    let from = b
        .column_by_name(&format!("{MOVED_FROM}id"))
        .expect("old key column")
        .as_primitive::<deltalake::arrow::datatypes::Int32Type>();
    assert_eq!(from.iter().flatten().collect::<Vec<_>>(), vec![4]);

    // A plain insert (no `before`) is no move, and a delete then re-insert of one key in
    // one transaction keeps the row.
    let f = fold(
        &batch(&[c("d", 7, None, 40, 1), c("c", 7, Some("x"), 40, 2)]),
        None,
    )
    .unwrap();
    assert_eq!(rows(&f), vec![(7, Some("x".into()), "u".into(), vec![])]);
}
