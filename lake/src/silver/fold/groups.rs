//! Grouping: the changes of a batch per key, each as an [`Action`] on that key.

use std::collections::HashMap;

use deltalake::arrow::array::Array;
use wal2delta_model::ChangeOp;

use super::keys::Keys;
use super::{Action, FoldError, Kind};
use crate::silver::rows::BronzeRows;
use crate::silver::Position;

/// The actions of a batch, per key (the key's comparable bytes).
pub(super) struct Groups {
    /// Per key: its actions, ordered by position.
    pub by_key: HashMap<Vec<u8>, Vec<Action>>,
    /// The keys in the order they first appear.
    pub order: Vec<Vec<u8>>,
    /// Per key-move row: the old key it moved from.
    pub moved_from: HashMap<usize, Vec<u8>>,
}

impl Groups {
    fn push(&mut self, key: &[u8], action: Action) {
        let order = &mut self.order;
        self.by_key
            .entry(key.to_vec())
            .or_insert_with(|| {
                order.push(key.to_vec());
                Vec::new()
            })
            .push(action)
    }

    /// Groups the changes of `rows` positioned at or after `truncate`. A key move is an
    /// upsert of its new key and a delete of its old key, at the same position.
    pub fn of(
        rows: &BronzeRows,
        keys: &Keys,
        truncate: Option<Position>,
    ) -> Result<Self, FoldError> {
        let mut groups = Groups {
            by_key: HashMap::new(),
            order: Vec::new(),
            moved_from: HashMap::new(),
        };
        for i in 0..rows.num_rows() {
            let pos = rows.position(i);
            if truncate.is_some_and(|t| pos < t) {
                continue;
            }
            let op = rows.op(i);
            let kind = match op {
                Some(ChangeOp::Truncate) => continue,
                Some(ChangeOp::Insert | ChangeOp::Read | ChangeOp::Update) => Kind::Upsert,
                Some(ChangeOp::Delete) => Kind::Delete,
                Some(ChangeOp::SnapshotEnd) | None => {
                    return Err(FoldError(format!("unknown op {:?}", rows.op_code(i))))
                }
            };
            if rows.key().is_some_and(|k| k.is_null(i)) {
                return Err(FoldError(format!(
                    "a change with op {:?} has no key",
                    rows.op_code(i)
                )));
            }
            // A key move: an update (earlier releases) or a create (the new half of a
            // primary-key change, after the delete of the old key) whose `before` names
            // another key.
            if matches!(op, Some(ChangeOp::Update | ChangeOp::Insert)) {
                if let Some(old_key) = keys.moved_from(rows, i) {
                    groups.moved_from.insert(i, old_key.as_ref().to_vec());
                    let delete = Action {
                        row: i,
                        old_key: true,
                        kind: Kind::Delete,
                        pos,
                    };
                    groups.push(old_key.as_ref(), delete);
                }
            }
            let action = Action {
                row: i,
                old_key: false,
                kind,
                pos,
            };
            groups.push(keys.new_key(i).as_ref(), action);
        }
        for actions in groups.by_key.values_mut() {
            actions.sort_by_key(|a| a.pos);
        }
        Ok(groups)
    }
}
