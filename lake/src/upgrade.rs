//! `wal2delta upgrade`: the lake's tables and their formats, and the explicit migration of
//! tables an earlier release wrote (docs/upgrading.md, "Format versions").
//!
//! The stages refuse a table whose format is not this binary's ([`crate::LakeError::Format`]),
//! so nothing is migrated behind an operator's back: `upgrade --dry-run` lists what would
//! change, `upgrade` changes it, table by table, each in one commit of its own. A run
//! stopped half-way is run again: migrated tables are current and left alone.

use std::collections::HashMap;

use url::Url;
use wal2delta_model::format::{check_lake, FormatCheck, LAKE_FORMAT, LAKE_FORMAT_PROPERTY};

use crate::{delta, storage, Lake, LakeError};

/// How deep tables lie under the root: `silver/_wal2delta/tombstones/{schema}/{table}`.
const MAX_DEPTH: usize = 6;

/// One table of the lake and the format it records.
#[derive(Debug, Clone)]
pub struct TableFormat {
    /// The table's path under the lake root (`silver/public/orders`).
    pub path: String,
    pub url: Url,
    /// The format its commits record (`None`: an earlier release's table, format 0).
    pub recorded: Option<String>,
    pub check: FormatCheck,
}

impl TableFormat {
    /// What `upgrade` does with this table, in words.
    pub fn plan(&self) -> String {
        match self.check {
            FormatCheck::Current => format!("format {LAKE_FORMAT}: current, left alone"),
            FormatCheck::Older(n) => format!(
                "format {n}: migrate to {LAKE_FORMAT} (records the format; no data file changes: format {LAKE_FORMAT} reads what format {n} wrote)"
            ),
            FormatCheck::Newer(n) => format!(
                "format {n}: written by a newer release; this binary (format {LAKE_FORMAT}) cannot migrate it back"
            ),
            FormatCheck::Unreadable => format!(
                "format {:?}: not a format number (docs/upgrading.md)",
                self.recorded.as_deref().unwrap_or_default()
            ),
        }
    }
}

/// Every Delta table under the lake's root with its format, sorted by path.
pub async fn survey(lake: &Lake) -> Result<Vec<TableFormat>, LakeError> {
    let mut found = Vec::new();
    let mut pending = vec![(String::new(), lake.root().clone(), 0usize)];
    while let Some((path, url, depth)) = pending.pop() {
        if !path.is_empty() && storage::table_exists(&url).await? {
            let Some(table) = delta::open_unchecked(&path, &url).await? else {
                continue;
            };
            let recorded = delta::recorded_format(&path, &table).await?;
            found.push(TableFormat {
                check: check_lake(recorded.as_deref()),
                path,
                url,
                recorded,
            });
            continue;
        }
        if depth == MAX_DEPTH {
            continue;
        }
        for dir in storage::list_dirs(&url).await? {
            let child = url.join(&format!("{dir}/")).map_err(|e| LakeError::Uri {
                uri: url.to_string(),
                reason: e.to_string(),
            })?;
            let path = if path.is_empty() {
                dir
            } else {
                format!("{path}/{dir}")
            };
            pending.push((path, child, depth + 1));
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// Migrates `table` to this binary's format. Only older formats are migrated; a current
/// table is left alone (`false`), a newer or unreadable one is refused.
///
/// Format 0 → 1: format 1 reads every column format 0 wrote (bounded numerics stored as
/// text stay text, `wal2delta.decimal.<column>` tells Silver their type), so the migration
/// records the format in a metadata-only commit and rewrites nothing.
pub async fn migrate(table: &TableFormat) -> Result<bool, LakeError> {
    match table.check {
        FormatCheck::Current => return Ok(false),
        FormatCheck::Older(_) => {}
        FormatCheck::Newer(_) | FormatCheck::Unreadable => {
            return Err(LakeError::Format {
                table: table.path.clone(),
                found: table.recorded.clone().unwrap_or_else(|| "0".into()),
                ours: LAKE_FORMAT,
                fix: "only an older format is migrated; run the release that wrote it",
            })
        }
    }
    let Some(t) = delta::open_unchecked(&table.path, &table.url).await? else {
        return Ok(false);
    };
    // Another upgrade may have migrated it since the survey.
    if check_lake(delta::recorded_format(&table.path, &t).await?.as_deref()) == FormatCheck::Current
    {
        return Ok(false);
    }
    let properties = HashMap::from([(LAKE_FORMAT_PROPERTY.to_owned(), LAKE_FORMAT.to_string())]);
    t.set_tbl_properties()
        .with_properties(properties)
        .with_raise_if_not_exists(false)
        .with_commit_properties(delta::commit_metadata([(
            "wal2delta.upgrade".to_owned(),
            serde_json::json!({ "from": table.recorded.clone().unwrap_or_else(|| "0".into()), "to": LAKE_FORMAT }),
        )]))
        .await
        .map_err(LakeError::delta(&table.path))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deltalake::arrow::array::{Int64Array, RecordBatch};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::kernel::transaction::CommitProperties;
    use deltalake::protocol::SaveMode;
    use deltalake::DeltaTable;
    use wal2delta_model::format::LAKE_FORMAT_COMMIT_KEY;

    use super::*;

    /// A table of one row written with `props`: this release's, or an earlier one's
    /// (`CommitProperties::default()`, no format recorded).
    async fn table(url: &Url, props: CommitProperties) -> DeltaTable {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        delta::handle("t", url)
            .unwrap()
            .write(vec![batch])
            .with_save_mode(SaveMode::Append)
            .with_commit_properties(props)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn an_earlier_releases_table_is_refused_until_upgraded_and_a_newer_one_always() {
        let lake = Lake::new("memory:///upgrade/").unwrap();
        let old = lake.silver("public", "orders");
        let new = lake.bronze("public", "orders");
        table(&old, CommitProperties::default()).await;
        table(&new, delta::commit_properties()).await;

        // The stages refuse the old table, naming it and the fix.
        let err = delta::open("silver/public/orders", &old).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("silver/public/orders")
                && text.contains("format 0")
                && text.contains("wal2delta upgrade"),
            "{text}"
        );
        assert_eq!(err.class(), wal2delta_model::ErrorClass::Operator);
        assert!(delta::open("bronze", &new).await.unwrap().is_some());

        // The survey finds both; the migration changes the old one only, once.
        let tables = survey(&lake).await.unwrap();
        let paths: Vec<_> = tables.iter().map(|t| (t.path.as_str(), t.check)).collect();
        assert_eq!(
            paths,
            vec![
                ("bronze/public/orders", FormatCheck::Current),
                ("silver/public/orders", FormatCheck::Older(0))
            ]
        );
        assert!(migrate(&tables[1]).await.unwrap());
        assert!(
            !migrate(&tables[1]).await.unwrap(),
            "a second run changes nothing"
        );
        assert!(!migrate(&tables[0]).await.unwrap());
        let t = delta::open("silver/public/orders", &old)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            delta::recorded_format("s", &t).await.unwrap(),
            Some(LAKE_FORMAT.to_string())
        );
        // A commit that records no format (another tool's) leaves the table current.
        let t = table(&old, CommitProperties::default()).await;
        assert!(delta::open("silver/public/orders", &old)
            .await
            .unwrap()
            .is_some());

        // A newer release's table: refused by the stages and by the migration.
        let newer = CommitProperties::default().with_metadata([(
            LAKE_FORMAT_COMMIT_KEY.to_owned(),
            serde_json::json!(LAKE_FORMAT + 1),
        )]);
        drop(t);
        table(&old, newer).await;
        let text = delta::open("silver/public/orders", &old)
            .await
            .unwrap_err()
            .to_string();
        assert!(text.contains("newer release"), "{text}");
        let tables = survey(&lake).await.unwrap();
        assert_eq!(tables[1].check, FormatCheck::Newer(LAKE_FORMAT + 1));
        assert!(migrate(&tables[1]).await.is_err());
    }
}
