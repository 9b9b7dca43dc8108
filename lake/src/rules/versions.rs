//! `rules/versions`: the rule set's versions read from the rules table, each with the
//! source position (LSN) after which it is in effect ([`super::source`]).
//!
//! The silver stage appends a version before any table applies a change above its
//! position, so a restart (or a replay of Silver from Bronze) tags every change under the
//! rules that were in effect at its commit, and an operator can read which rules were in
//! effect when. Append-only: each row is one version (`seq` in the order recorded, `rules`
//! the whole set as JSON); a later row at or below an earlier one's position replaces it
//! from there on, as [`super::RuleSource::record`] does.

use std::sync::Arc;

use deltalake::arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use deltalake::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use deltalake::protocol::SaveMode;

use super::Rule;
use crate::{delta, Lake, LakeError};

const NAME: &str = "rules/versions";

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("seq", DataType::Int64, false),
        Field::new("position", DataType::Int64, false),
        Field::new("rules", DataType::Utf8, false),
    ]))
}

fn corrupt(reason: impl std::fmt::Display) -> LakeError {
    LakeError::Rows {
        table: NAME.into(),
        reason: format!("cannot be read as rule versions: {reason} (restore the table from a backup, or remove it: the rules table's current content is then recorded as in effect from the start)"),
    }
}

/// The recorded versions, in the order recorded: (seq, position, rules).
async fn rows(lake: &Lake) -> Result<Vec<(i64, i64, Vec<Rule>)>, LakeError> {
    let Some(t) = delta::open(NAME, &lake.rules_versions()).await? else {
        return Ok(Vec::new());
    };
    let batches = delta::query(NAME, &t, "SELECT seq, position, rules FROM t ORDER BY seq").await?;
    let mut out = Vec::new();
    for b in &batches {
        let (Some(seq), Some(pos), Some(rules)) = (
            b.column(0).as_primitive_opt::<Int64Type>(),
            b.column(1).as_primitive_opt::<Int64Type>(),
            b.column(2).as_string_opt::<i32>(),
        ) else {
            return Err(corrupt("unexpected column types"));
        };
        for i in 0..b.num_rows() {
            if seq.is_null(i) || pos.is_null(i) || rules.is_null(i) {
                return Err(corrupt(format!("row {i} has a NULL")));
            }
            let set: Vec<Rule> = serde_json::from_str(rules.value(i))
                .map_err(|e| corrupt(format!("seq {}: {e}", seq.value(i))))?;
            out.push((seq.value(i), pos.value(i), set));
        }
    }
    Ok(out)
}

/// The history as [`super::RuleSource::with_history`] takes it: ascending positions, a
/// later version replacing the ones at or after its position.
pub async fn load(lake: &Lake) -> Result<Vec<(i64, Vec<Rule>)>, LakeError> {
    let mut history: Vec<(i64, Vec<Rule>)> = Vec::new();
    for (_, position, rules) in rows(lake).await? {
        history.retain(|(p, _)| *p < position);
        history.push((position, rules));
    }
    Ok(history)
}

/// Appends `rules` as in effect after `position`.
pub async fn append(lake: &Lake, position: i64, rules: &[Rule]) -> Result<(), LakeError> {
    // Each append is one commit of the table, so its next version orders the rows
    // without reading them (gaps, after a maintenance commit, are harmless).
    let (t, seq) = match delta::open(NAME, &lake.rules_versions()).await? {
        Some(t) => {
            let seq = t.version().map_or(1, |v| v as i64 + 2);
            (t, seq)
        }
        None => (delta::handle(NAME, &lake.rules_versions())?, 1),
    };
    let json = serde_json::to_string(rules).map_err(corrupt)?;
    let batch = RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from(vec![seq])),
            Arc::new(Int64Array::from(vec![position])),
            Arc::new(StringArray::from(vec![json])),
        ],
    )
    .map_err(corrupt)?;
    t.write(vec![batch])
        .with_save_mode(SaveMode::Append)
        .with_commit_properties(delta::commit_properties())
        .await
        .map_err(LakeError::delta(&NAME))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use wal2delta_model::TableName;

    use super::*;

    fn rule(when: &str) -> Rule {
        Rule {
            id: "r".into(),
            table: TableName::new("s", "t"),
            when: when.into(),
            version: 1,
            active: true,
            lookups: vec![super::super::Lookup {
                name: "m".into(),
                table: TableName::new("s", "m"),
                on: vec![("m_id".into(), "id".into())],
            }],
        }
    }

    #[tokio::test]
    async fn versions_read_back_in_order_and_a_later_one_replaces_from_its_position() {
        let dir = std::env::temp_dir().join(format!("w2d-versions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        assert!(load(&lake).await.unwrap().is_empty());
        append(&lake, super::super::FROM_THE_START, &[rule("x > 1")])
            .await
            .unwrap();
        append(&lake, 100, &[rule("x > 2")]).await.unwrap();
        append(&lake, 200, &[]).await.unwrap();
        // Recorded again from 150 (a replay that read the rules table differently).
        append(&lake, 150, &[rule("x > 3")]).await.unwrap();
        let h = load(&lake).await.unwrap();
        let got: Vec<(i64, Option<&str>)> = h
            .iter()
            .map(|(p, r)| (*p, r.first().map(|r| r.when.as_str())))
            .collect();
        assert_eq!(
            got,
            vec![
                (i64::MIN, Some("x > 1")),
                (100, Some("x > 2")),
                (150, Some("x > 3"))
            ]
        );
        assert_eq!(h[0].1[0].lookups[0].on[0].1, "id", "lookups round-trip");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
