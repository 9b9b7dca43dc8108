//! The Silver tables a table's rules look up, kept open between rounds.
//!
//! Every round needs them twice: their schemas, to know whether the compiled rules still
//! hold, and their rows, for the lookups. Opening a Silver table replays its log from the
//! last checkpoint, and an idle Silver table still commits its progress every round, so
//! that replay grew through a run (docs/benchmarks.md). Kept open, each round reads only
//! the commits since ([`delta::Kept`]); a round that fails forgets them ([`Self::forget`]),
//! so a table removed and made again is opened afresh.

use std::collections::HashMap;

use deltalake::DeltaTable;

use super::compile::{lake_name, Related};
use super::Rule;
use crate::{delta, Lake, LakeError};

#[derive(Default)]
pub(super) struct RelatedTables {
    kept: HashMap<String, delta::Kept>,
    /// The latest state of each, as of the last [`Self::refresh`] (by lake name); a table
    /// with no Silver table yet is absent.
    latest: HashMap<String, DeltaTable>,
}

impl RelatedTables {
    /// Brings every Silver table `rules` look up to its latest state; returns their
    /// schemas (of those that exist).
    pub(super) async fn refresh(
        &mut self,
        lake: &Lake,
        rules: &[Rule],
    ) -> Result<Related, LakeError> {
        let mut schemas = Related::new();
        let mut seen = std::collections::HashSet::new();
        self.latest.clear();
        for l in rules.iter().flat_map(|r| &r.lookups) {
            let name = lake_name(&l.table);
            if !seen.insert(name.clone()) {
                continue;
            }
            let (schema, table) = l.table.ident_parts();
            let label = format!("silver/{}", l.table);
            let kept = self.kept.entry(name.clone()).or_default();
            if let Some(t) = kept.latest(&label, &lake.silver(&schema, &table)).await? {
                schemas.insert(name.clone(), delta::arrow_schema(&label, &t)?);
                self.latest.insert(name, t);
            }
        }
        // Tables no rule looks up any more (or that are gone) are let go.
        self.kept.retain(|n, _| self.latest.contains_key(n));
        Ok(schemas)
    }

    /// The Silver table of the related table named `name` (its lake name), as of the last
    /// refresh.
    pub(super) fn get(&self, name: &str) -> Option<&DeltaTable> {
        self.latest.get(name)
    }

    /// Drops every kept table: the next refresh opens them afresh.
    pub(super) fn forget(&mut self) {
        self.kept.clear();
        self.latest.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deltalake::arrow::array::{ArrayRef, Int64Array, StringArray};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::arrow::record_batch::RecordBatch;
    use deltalake::protocol::SaveMode;
    use wal2delta_model::TableName;

    use super::*;
    use crate::rules::Lookup;

    fn rule(id: &str, looks_up: Option<&TableName>) -> Rule {
        Rule {
            id: id.into(),
            table: TableName::new("s", "orders"),
            when: "true".into(),
            version: 1,
            active: true,
            lookups: looks_up
                .map(|t| Lookup {
                    name: "m".into(),
                    table: t.clone(),
                    on: vec![("merchant_id".into(), "id".into())],
                })
                .into_iter()
                .collect(),
        }
    }

    /// Appends one row to the table at `url`; `category` adds that column.
    async fn append(url: &url::Url, category: bool) {
        let mut fields = vec![Field::new("id", DataType::Int64, true)];
        let mut cols: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(vec![1]))];
        if category {
            fields.push(Field::new("category", DataType::Utf8, true));
            cols.push(Arc::new(StringArray::from(vec!["retail"])));
        }
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap();
        delta::handle("m", url)
            .unwrap()
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_schema_mode(deltalake::operations::write::SchemaMode::Merge)
            .with_commit_properties(delta::commit_properties())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn related_tables_follow_new_commits_and_a_table_made_later_or_removed() {
        let dir = std::env::temp_dir().join(format!("w2d-related-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let merchants = TableName::new("s", "merchants");
        let name = lake_name(&merchants);
        let url = lake.silver("s", "merchants");
        // Two rules looking up the same table, one looking up nothing.
        let rules = [
            rule("a", Some(&merchants)),
            rule("b", Some(&merchants)),
            rule("c", None),
        ];
        let mut related = RelatedTables::default();

        // No Silver table yet: no schema, nothing to look up in.
        assert!(related.refresh(&lake, &rules).await.unwrap().is_empty());
        assert!(related.get(&name).is_none());

        append(&url, false).await;
        let schemas = related.refresh(&lake, &rules).await.unwrap();
        assert_eq!(schemas.keys().collect::<Vec<_>>(), [&name]);
        assert!(schemas[&name].field_with_name("category").is_err());
        let first = related.get(&name).unwrap().version();

        // A new column: the next refresh has it, at the table's latest version.
        append(&url, true).await;
        let schemas = related.refresh(&lake, &rules).await.unwrap();
        assert!(schemas[&name].field_with_name("category").is_ok());
        let latest = delta::open("m", &url).await.unwrap().unwrap().version();
        assert_eq!(related.get(&name).unwrap().version(), latest);
        assert!(latest > first);

        // No rule looks it up any more: let go.
        assert!(related
            .refresh(&lake, &rules[2..])
            .await
            .unwrap()
            .is_empty());
        assert!(related.get(&name).is_none());

        // Removed: gone on the next refresh; and forget() drops what a refresh kept.
        related.refresh(&lake, &rules).await.unwrap();
        assert!(related.get(&name).is_some());
        related.forget();
        assert!(related.get(&name).is_none());
        std::fs::remove_dir_all(url.to_file_path().unwrap()).unwrap();
        assert!(related.refresh(&lake, &rules).await.unwrap().is_empty());
        assert!(related.get(&name).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
