//! `[source] exclude_columns` and `include_columns`: columns that never leave capture.
//! Their values are dropped from every event (before and after images, snapshot rows,
//! dead letters) and the columns from the published schema, so neither Kafka, the
//! registry nor the lake ever holds them. A primary-key column cannot be excluded (Silver
//! could not place the row): such an entry stops capture with the fix. A table with
//! `include_columns` keeps its primary key and the columns named; any other column,
//! one added later included, stays out.

use std::collections::HashMap;
use std::sync::Arc;

use wal2delta_cdc::decoder::RawRow;
use wal2delta_model::{Change, Row, TableName, TableSchema};

use super::error::SessionError;
use crate::config::ColumnFilter;

/// The column filter of each table, and the published view of each table version seen.
#[derive(Default)]
pub struct Exclusions {
    by_table: HashMap<TableName, ColumnFilter>,
    /// Per relation: the decoded schema and its view without the excluded columns.
    views: HashMap<u32, (Arc<TableSchema>, Arc<TableSchema>)>,
}

impl Exclusions {
    pub fn new(by_table: HashMap<TableName, ColumnFilter>) -> Self {
        Exclusions {
            by_table,
            views: HashMap::new(),
        }
    }

    fn excluded(&self, table: &TableName) -> Option<&ColumnFilter> {
        self.by_table.get(table)
    }

    /// Whether `column` of `table` is a key column, as the last schema seen of the table
    /// says (for raw rows, which carry names only).
    fn is_key(&self, table: &TableName, column: &str) -> bool {
        self.views
            .values()
            .filter(|(seen, _)| &seen.table == table)
            .any(|(seen, _)| seen.columns.iter().any(|c| c.is_key && c.name == column))
    }

    /// The schema as published: `decoded` without its excluded columns.
    pub fn schema(&mut self, decoded: &Arc<TableSchema>) -> Result<Arc<TableSchema>, SessionError> {
        let Some(excluded) = self.excluded(&decoded.table) else {
            return Ok(decoded.clone());
        };
        if let Some((seen, view)) = self.views.get(&decoded.relation_oid) {
            if Arc::ptr_eq(seen, decoded) || **seen == **decoded {
                return Ok(view.clone());
            }
        }
        if let (ColumnFilter::Exclude(out), true) = (excluded, decoded.has_primary_key()) {
            if let Some(c) = decoded
                .columns
                .iter()
                .find(|c| c.is_key && out.contains(&c.name))
            {
                return Err(SessionError::ExcludedKey {
                    table: decoded.table.to_string(),
                    column: c.name.clone(),
                });
            }
        }
        let mut view = (**decoded).clone();
        view.columns.retain(|c| excluded.keeps(&c.name, c.is_key));
        let view = Arc::new(view);
        self.views
            .insert(decoded.relation_oid, (decoded.clone(), view.clone()));
        Ok(view)
    }

    /// `change` (decoded under `decoded`) without the values of excluded columns.
    pub fn change(&self, decoded: &TableSchema, mut change: Change) -> Change {
        let Some(excluded) = self.excluded(&decoded.table) else {
            return change;
        };
        let keep: Vec<bool> = decoded
            .columns
            .iter()
            .map(|c| excluded.keeps(&c.name, c.is_key))
            .collect();
        let strip = |row: &mut Row| {
            let mut i = 0;
            row.values.retain(|_| {
                let k = keep.get(i).copied().unwrap_or(true);
                i += 1;
                k
            });
        };
        change.before.as_mut().map(strip);
        change.after.as_mut().map(strip);
        change
    }

    /// A raw (undecodable) row without the excluded columns, for its dead letter.
    pub fn raw(&self, table: &TableName, raw: &RawRow) -> RawRow {
        let Some(excluded) = self.excluded(table) else {
            return raw.clone();
        };
        let strip = |image: &Option<Vec<(String, Option<String>)>>| {
            image.as_ref().map(|cols| {
                cols.iter()
                    .filter(|(name, _)| excluded.keeps(name, self.is_key(table, name)))
                    .cloned()
                    .collect()
            })
        };
        RawRow {
            old: strip(&raw.old),
            new: strip(&raw.new),
        }
    }
}

#[cfg(test)]
mod tests {
    use wal2delta_model::{
        BaseType, ChangeOp, Column, ColumnType, ColumnValue, Datum, Lsn, ReplicaIdentity,
        TxPosition,
    };

    use std::collections::BTreeSet;

    use super::*;

    fn schema(key: &str) -> Arc<TableSchema> {
        let col = |name: &str| Column {
            name: name.into(),
            ty: ColumnType::base(BaseType::Text, "text"),
            is_key: name == key,
        };
        Arc::new(TableSchema {
            relation_oid: 7,
            table: TableName::new("s", "t"),
            columns: vec![col("id"), col("Secret Note"), col("amount")],
            replica_identity: ReplicaIdentity::Default,
        })
    }

    fn row(values: &[&str]) -> Row {
        Row {
            values: values
                .iter()
                .map(|v| ColumnValue::Value(Datum::Text((*v).into())))
                .collect(),
        }
    }

    fn excluding(column: &str) -> Exclusions {
        Exclusions::new(HashMap::from([(
            TableName::new("s", "t"),
            ColumnFilter::Exclude(BTreeSet::from([column.to_owned()])),
        )]))
    }

    fn change_of(decoded: &TableSchema, before: Row, after: Row) -> Change {
        Change {
            table: decoded.table.clone(),
            op: ChangeOp::Update,
            before: Some(before),
            after: Some(after),
            position: TxPosition {
                commit_lsn: Lsn(1),
                lsn: Lsn(1),
                ordinal: 1,
                xid: 1,
                commit_ts_us: 0,
            },
        }
    }

    #[test]
    fn an_include_list_keeps_the_key_and_the_columns_named_and_nothing_added_later() {
        let mut ex = Exclusions::new(HashMap::from([(
            TableName::new("s", "t"),
            ColumnFilter::Include(BTreeSet::from(["amount".to_owned()])),
        )]));
        let decoded = schema("id");
        let view = ex.schema(&decoded).unwrap();
        let names: Vec<&str> = view.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "amount"]);
        let out = ex.change(
            &decoded,
            change_of(
                &decoded,
                row(&["1", "old secret", "5"]),
                row(&["1", "new", "6"]),
            ),
        );
        assert_eq!(out.after, Some(row(&["1", "6"])));
        let raw = RawRow {
            old: None,
            new: Some(vec![
                ("id".into(), Some("1".into())),
                ("Secret Note".into(), Some("secret".into())),
                ("amount".into(), None),
            ]),
        };
        let text = ex.raw(&decoded.table, &raw).render(|_, t| t.to_owned());
        assert_eq!(text, "new: id=1 amount=NULL");
        // A column added later is not in the list: it stays out.
        let mut wider = (*decoded).clone();
        wider.columns.push(Column {
            name: "added".into(),
            ty: ColumnType::base(BaseType::Text, "text"),
            is_key: false,
        });
        let wider = Arc::new(wider);
        let view = ex.schema(&wider).unwrap();
        let names: Vec<&str> = view.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "amount"]);
    }

    #[test]
    fn an_excluded_column_leaves_the_schema_the_images_and_the_raw_row() {
        let mut ex = excluding("Secret Note");
        let decoded = schema("id");
        let view = ex.schema(&decoded).unwrap();
        let names: Vec<&str> = view.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "amount"]);
        assert!(Arc::ptr_eq(&view, &ex.schema(&decoded).unwrap()), "cached");
        let change = change_of(
            &decoded,
            row(&["1", "old secret", "5"]),
            row(&["1", "new secret", "6"]),
        );
        let out = ex.change(&decoded, change);
        assert_eq!(out.before, Some(row(&["1", "5"])));
        assert_eq!(out.after, Some(row(&["1", "6"])));
        let raw = RawRow {
            old: None,
            new: Some(vec![
                ("id".into(), Some("1".into())),
                ("Secret Note".into(), Some("secret".into())),
                ("amount".into(), None),
            ]),
        };
        let text = ex.raw(&decoded.table, &raw).render(|_, t| t.to_owned());
        assert_eq!(text, "new: id=1 amount=NULL");
        // Other tables pass unchanged.
        let other = TableName::new("s", "u");
        assert_eq!(ex.raw(&other, &raw), raw);
    }

    #[test]
    fn a_primary_key_column_cannot_be_excluded() {
        let mut ex = excluding("id");
        let err = ex.schema(&schema("id")).unwrap_err();
        assert!(err.to_string().contains("primary-key"), "{err}");
    }
}
