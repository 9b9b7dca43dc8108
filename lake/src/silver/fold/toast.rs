//! TOAST fill: per key, the winning change and, for each column it left unchanged, the
//! earlier row of the batch that supplies the value (or that Silver must keep its own).

use deltalake::arrow::datatypes::Fields;

use super::groups::Groups;
use super::{Action, Kind};
use crate::silver::rows::BronzeRows;
use crate::silver::Position;

/// Per key, in [`Groups::order`].
pub(super) struct Winners {
    /// The change that decides the key's row.
    pub actions: Vec<Action>,
    /// Per `after` column, per key: the row that supplies the value.
    pub supplier: Vec<Vec<usize>>,
    /// The unchanged columns no row of the batch supplies (Silver keeps its value).
    pub unresolved: Vec<Vec<String>>,
    /// The key-move row whose old key Silver must supply unchanged values from.
    pub moves_out: Vec<Option<usize>>,
}

/// Not found, and no key move on the way.
const NO_MOVE: usize = usize::MAX;

/// The latest upsert of `key` before `pos` that carried column `name`, following the key
/// back through key moves; or (`Err`) the row of the last move when the chain leaves the
/// batch ([`NO_MOVE`] when there was none). A key reached through a move (`moved`) skips
/// the move's own delete of it: capture sends a primary-key change as a delete of the old
/// key right before the create of the new one (ordinals n and n + 1 of one transaction),
/// and the old key's history before that delete is what the create's unchanged columns
/// come from.
fn find(
    rows: &BronzeRows,
    groups: &Groups,
    key: &[u8],
    pos: Position,
    name: &str,
    moved: bool,
) -> Result<usize, usize> {
    let mut key = key.to_vec();
    let mut pos = pos;
    let mut moved = moved;
    let mut last_move = None;
    for _ in 0..64 {
        let Some(actions) = groups.by_key.get(&key) else {
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
            if !rows.unchanged(a.row).contains(&name.to_owned()) {
                return Ok(a.row);
            }
            if let Some(old) = groups.moved_from.get(&a.row) {
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
    Err(last_move.unwrap_or(NO_MOVE))
}

/// Where the value of column `name`, left unchanged by winner `w` of `key`, comes from.
/// The winner itself may be a key move: its old key's history counts first.
fn supplier_of(
    rows: &BronzeRows,
    groups: &Groups,
    key: &[u8],
    w: &Action,
    name: &str,
) -> Result<usize, usize> {
    match groups.moved_from.get(&w.row) {
        Some(old) => find(rows, groups, old, w.pos, name, true).or_else(|m| {
            find(rows, groups, key, w.pos, name, false).map_err(|_| {
                if m == NO_MOVE {
                    w.row
                } else {
                    m
                }
            })
        }),
        None => find(rows, groups, key, w.pos, name, false),
    }
}

impl Winners {
    /// The winner of every key of `groups` and the rows that supply each of the `fields`
    /// (of `after`) for it.
    pub fn pick(rows: &BronzeRows, fields: &Fields, groups: &Groups) -> Self {
        let n = groups.order.len();
        let mut out = Winners {
            actions: Vec::with_capacity(n),
            supplier: vec![Vec::with_capacity(n); fields.len()],
            unresolved: Vec::with_capacity(n),
            moves_out: Vec::with_capacity(n),
        };
        for k in &groups.order {
            let w = *groups.by_key[k].last().expect("non-empty group");
            out.push(rows, fields, groups, k, w);
        }
        out
    }

    /// Every key's state after each source transaction that changed it: per key, the
    /// last action of each commit LSN, in position order (the rules stage's input: a key
    /// that changes in two transactions of one round has two versions).
    pub fn versions(rows: &BronzeRows, fields: &Fields, groups: &Groups) -> Self {
        let mut out = Winners {
            actions: Vec::new(),
            supplier: vec![Vec::new(); fields.len()],
            unresolved: Vec::new(),
            moves_out: Vec::new(),
        };
        for k in &groups.order {
            let actions = &groups.by_key[k];
            for (i, w) in actions.iter().enumerate() {
                let last_of_tx = actions.get(i + 1).is_none_or(|n| n.pos.0 != w.pos.0);
                if last_of_tx {
                    out.push(rows, fields, groups, k, *w);
                }
            }
        }
        out
    }

    /// Adds action `w` of key `k` with the rows that supply each of its columns.
    fn push(&mut self, rows: &BronzeRows, fields: &Fields, groups: &Groups, k: &[u8], w: Action) {
        let mut missing = Vec::new();
        let mut rows_for = vec![w.row; fields.len()];
        let mut from_silver = None;
        if w.kind == Kind::Upsert {
            for name in rows.unchanged(w.row) {
                let Some(j) = fields.iter().position(|f| f.name() == &name) else {
                    continue;
                };
                match supplier_of(rows, groups, k, &w, &name) {
                    Ok(r) => rows_for[j] = r,
                    Err(m) => {
                        if m != NO_MOVE && groups.moved_from.contains_key(&m) {
                            from_silver = Some(m);
                        }
                        missing.push(name);
                    }
                }
            }
        }
        for (j, r) in rows_for.into_iter().enumerate() {
            self.supplier[j].push(r);
        }
        self.actions.push(w);
        self.unresolved.push(missing);
        self.moves_out.push(from_silver);
    }
}
