//! The Bronze table on the real local filesystem: offsets in the commit, stale batches
//! refused, schema evolution by merge, a type change refused, quarantine de-duplication.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use wal2delta_lake::bronze::{Append, AppendOutcome, BronzeTable, OffsetRange};
use wal2delta_lake::deltalake::arrow::array::{
    Array, Int64Array, RecordBatch, StringArray, StructArray,
};
use wal2delta_lake::deltalake::arrow::datatypes::{DataType, Field, Fields, Schema};
use wal2delta_lake::deltalake::datafusion::prelude::SessionContext;
use wal2delta_lake::quarantine::QuarantineTable;
use wal2delta_lake::{Lake, LakeError};
use wal2delta_model::bronze;
use wal2delta_quarantine::{QuarantineRecord, Stage};

fn lake() -> (Lake, std::path::PathBuf) {
    common::temp_lake("w2d-bronze")
}

/// A batch shaped like Bronze's: op, after{...}, kafka_offset, ingest_date-free.
fn batch(after_fields: Vec<(&str, DataType)>, offsets: &[i64]) -> RecordBatch {
    let n = offsets.len();
    let fields: Vec<Field> = after_fields
        .iter()
        .map(|(n, t)| Field::new(*n, t.clone(), true))
        .collect();
    let children: Vec<Arc<dyn Array>> = after_fields
        .iter()
        .map(|(_, t)| match t {
            DataType::Int64 => Arc::new(Int64Array::from(offsets.to_vec())) as Arc<dyn Array>,
            DataType::Utf8 => Arc::new(StringArray::from(vec!["x"; n])) as Arc<dyn Array>,
            other => panic!("{other}"),
        })
        .collect();
    let after = StructArray::new(Fields::from(fields.clone()), children, None);
    let day = wal2delta_lake::deltalake::arrow::array::Date32Array::from(vec![20_000; n]);
    RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new(bronze::OP, DataType::Utf8, true),
            Field::new(bronze::AFTER, DataType::Struct(Fields::from(fields)), true),
            Field::new(bronze::KAFKA_OFFSET, DataType::Int64, true),
            Field::new(bronze::INGEST_DATE, DataType::Date32, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec!["c"; n])),
            Arc::new(after),
            Arc::new(Int64Array::from(offsets.to_vec())),
            Arc::new(day),
        ],
    )
    .unwrap()
}

fn ranges(p: i32, first: i64, last: i64) -> BTreeMap<i32, OffsetRange> {
    BTreeMap::from([(p, OffsetRange { first, last })])
}

async fn rows(table: &BronzeTable, sql: &str) -> Vec<RecordBatch> {
    let ctx = SessionContext::new();
    let t = wal2delta_lake::deltalake::open_table(table.url().clone())
        .await
        .unwrap();
    ctx.register_table("t", t.table_provider().await.unwrap())
        .unwrap();
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

fn single_i64(batches: &[RecordBatch]) -> i64 {
    batches[0]
        .column(0)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .value(0)
}

#[tokio::test]
async fn offsets_commit_with_rows_and_stale_batches_are_refused() {
    let (lake, dir) = lake();
    let mut t = BronzeTable::new("public.t", lake.bronze("public", "t"));
    assert_eq!(
        t.stored_offsets("cdc.public.t", &[0]).await.unwrap()[&0],
        None
    );
    let out = t
        .append(Append {
            topic: "cdc.public.t".into(),
            batches: vec![batch(vec![("id", DataType::Int64)], &[0, 1, 2])],
            ranges: ranges(0, 0, 2),
        })
        .await
        .unwrap();
    assert!(
        matches!(out, AppendOutcome::Committed { rows: 3, .. }),
        "{out:?}"
    );
    // A second writer (its own handle) replays offsets 1..3: stale, nothing written.
    let mut other = BronzeTable::new("public.t", lake.bronze("public", "t"));
    let out = other
        .append(Append {
            topic: "cdc.public.t".into(),
            batches: vec![batch(vec![("id", DataType::Int64)], &[1, 2, 3])],
            ranges: ranges(0, 1, 3),
        })
        .await
        .unwrap();
    assert_eq!(
        out,
        AppendOutcome::Stale {
            stored: BTreeMap::from([(0, Some(2))])
        }
    );
    // Offsets only (every event of the range quarantined): the position still moves.
    let out = t
        .append(Append {
            topic: "cdc.public.t".into(),
            batches: vec![],
            ranges: ranges(0, 3, 5),
        })
        .await
        .unwrap();
    assert!(
        matches!(out, AppendOutcome::Committed { rows: 0, .. }),
        "{out:?}"
    );
    assert_eq!(
        t.stored_offsets("cdc.public.t", &[0, 1]).await.unwrap(),
        BTreeMap::from([(0, Some(5)), (1, None)])
    );
    assert_eq!(single_i64(&rows(&t, "select count(*) from t").await), 3);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_writer_not_refreshed_since_its_commit_meets_another_writers_commits() {
    // A writer keeps the state of its own last commit and does not refresh before the
    // next one: what another writer committed since reaches it through the commit's
    // conflict check (lake/src/bronze/table.rs, module docs).
    let (lake, dir) = lake();
    let topic = "cdc.public.t".to_owned();
    let append = |p: i32, first: i64, last: i64, fields: Vec<(&'static str, DataType)>| {
        let offsets: Vec<i64> = (first..=last).collect();
        Append {
            topic: topic.clone(),
            batches: vec![batch(fields, &offsets)],
            ranges: ranges(p, first, last),
        }
    };
    let id = || vec![("id", DataType::Int64)];
    let mut a = BronzeTable::new("public.t", lake.bronze("public", "t"));
    let mut b = BronzeTable::new("public.t", lake.bronze("public", "t"));
    let out = a.append(append(0, 0, 2, id())).await.unwrap();
    assert!(
        matches!(out, AppendOutcome::Committed { version: 0, .. }),
        "{out:?}"
    );
    // b stores partition 1, then takes partition 0 over and stores 3..4 of it.
    for (p, first, last) in [(1, 0, 1), (0, 3, 4)] {
        let out = b.append(append(p, first, last, id())).await.unwrap();
        assert!(matches!(out, AppendOutcome::Committed { .. }), "{out:?}");
    }
    // a, still at version 0, replays 3..5 of partition 0: b's commit of the same
    // partition is a conflict, a loads the table and finds the batch stale.
    let out = a.append(append(0, 3, 5, id())).await.unwrap();
    assert_eq!(
        out,
        AppendOutcome::Stale {
            stored: BTreeMap::from([(0, Some(4))])
        }
    );
    assert_eq!(
        a.conflicts(),
        1,
        "the other writer's commit was met at commit time"
    );
    // b adds a column; a, behind again, appends partition 2 with the old shape: the
    // schema change is a conflict too, and a's rows go in under the new schema.
    let note = || vec![("id", DataType::Int64), ("note", DataType::Utf8)];
    let out = b.append(append(1, 2, 2, note())).await.unwrap();
    assert!(
        matches!(
            out,
            AppendOutcome::Committed {
                schema_changed: true,
                ..
            }
        ),
        "{out:?}"
    );
    let out = a.append(append(2, 0, 1, id())).await.unwrap();
    assert!(
        matches!(
            out,
            AppendOutcome::Committed {
                version: 4,
                rows: 2,
                ..
            }
        ),
        "{out:?}"
    );
    assert_eq!(a.conflicts(), 2);
    assert_eq!(
        a.stored_offsets(&topic, &[0, 1, 2]).await.unwrap(),
        BTreeMap::from([(0, Some(4)), (1, Some(2)), (2, Some(1))])
    );
    // Every offset once: 0..4 of partition 0, 0..2 of 1, 0..1 of 2.
    assert_eq!(single_i64(&rows(&a, "select count(*) from t").await), 10);
    let _ = std::fs::remove_dir_all(dir);
}

/// The actions of commit `version` of the table at `url` (a local path), one JSON value
/// per line.
fn log_entry(table: &BronzeTable, version: u64) -> Vec<serde_json::Value> {
    let path = table
        .url()
        .to_file_path()
        .unwrap()
        .join(format!("_delta_log/{version:020}.json"));
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test]
async fn direct_commits_carry_offsets_statistics_and_checkpoints() {
    // After its first commit a writer commits directly (lake/src/bronze/direct.rs): the
    // log entries must be what delta-rs would have written.
    let (lake, dir) = lake();
    let topic = "cdc.public.t".to_owned();
    let mut t = BronzeTable::new("public.t", lake.bronze("public", "t"));
    for (first, last) in [(0, 2), (3, 5)] {
        let offsets: Vec<i64> = (first..=last).collect();
        let out = t
            .append(Append {
                topic: topic.clone(),
                batches: vec![batch(vec![("id", DataType::Int64)], &offsets)],
                ranges: ranges(0, first, last),
            })
            .await
            .unwrap();
        assert!(
            matches!(out, AppendOutcome::Committed { rows: 3, .. }),
            "{out:?}"
        );
    }
    let entry = log_entry(&t, 1);
    let txn = entry
        .iter()
        .find_map(|a| a.get("txn"))
        .expect("a txn action");
    assert_eq!(txn["appId"], "wal2delta-bronze/cdc.public.t/0");
    assert_eq!(txn["version"], 5);
    let add = entry
        .iter()
        .find_map(|a| a.get("add"))
        .expect("an add action");
    assert_eq!(add["dataChange"], true);
    let stats: serde_json::Value =
        serde_json::from_str(add["stats"].as_str().expect("statistics")).unwrap();
    assert_eq!(stats["numRecords"], 3);
    assert_eq!(stats["minValues"][bronze::KAFKA_OFFSET], 3);
    assert_eq!(stats["maxValues"][bronze::KAFKA_OFFSET], 5);
    let info = entry
        .iter()
        .find_map(|a| a.get("commitInfo"))
        .expect("commit info");
    assert_eq!(info["wal2delta.topic"], "cdc.public.t");
    assert!(info.get("wal2delta.format").is_some(), "{info}");
    // Offsets only (every event of a range quarantined), up to a checkpoint's version.
    let mut last = 5;
    for _ in 2..=100 {
        let out = t
            .append(Append {
                topic: topic.clone(),
                batches: vec![],
                ranges: ranges(0, last + 1, last + 2),
            })
            .await
            .unwrap();
        assert!(
            matches!(out, AppendOutcome::Committed { rows: 0, .. }),
            "{out:?}"
        );
        last += 2;
    }
    let log = t.url().to_file_path().unwrap().join("_delta_log");
    assert!(
        log.join(format!("{:020}.checkpoint.parquet", 100)).exists(),
        "a checkpoint at version 100, as delta-rs writes one"
    );
    // A reader loading the table afresh sees every row and the last offset.
    let mut reader = BronzeTable::new("public.t", lake.bronze("public", "t"));
    assert_eq!(
        reader.stored_offsets(&topic, &[0]).await.unwrap(),
        BTreeMap::from([(0, Some(last))])
    );
    assert_eq!(
        single_i64(&rows(&reader, "select count(*) from t").await),
        6
    );
    assert_eq!(reader.version(), Some(100));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn added_columns_merge_and_a_type_change_is_a_schema_conflict() {
    let (lake, dir) = lake();
    let mut t = BronzeTable::new("public.t", lake.bronze("public", "t"));
    let topic = "cdc.public.t".to_owned();
    t.append(Append {
        topic: topic.clone(),
        batches: vec![batch(vec![("id", DataType::Int64)], &[0])],
        ranges: ranges(0, 0, 0),
    })
    .await
    .unwrap();
    // Version 2 adds after.note; version 3 drops it again; one commit holds both shapes.
    let out = t
        .append(Append {
            topic: topic.clone(),
            batches: vec![
                batch(
                    vec![("id", DataType::Int64), ("note", DataType::Utf8)],
                    &[1],
                ),
                batch(vec![("id", DataType::Int64)], &[2]),
            ],
            ranges: ranges(0, 1, 2),
        })
        .await
        .unwrap();
    assert!(
        matches!(
            out,
            AppendOutcome::Committed {
                rows: 2,
                schema_changed: true,
                ..
            }
        ),
        "{out:?}"
    );
    let notes = rows(&t, "select count(*) from t where after.note is null").await;
    assert_eq!(
        single_i64(&notes),
        2,
        "rows written before and after the column read NULL"
    );
    // after.id as text cannot be merged into a long column.
    let err = t
        .append(Append {
            topic,
            batches: vec![batch(vec![("id", DataType::Utf8)], &[3])],
            ranges: ranges(0, 3, 3),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, LakeError::SchemaConflict { .. }), "{err}");
    assert!(err.to_string().contains("after.id"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn quarantine_records_are_stored_once_per_offset() {
    let (lake, dir) = lake();
    let record = |offset: i64| QuarantineRecord {
        id: QuarantineRecord::event_id(Stage::Bronze, "cdc.public.t", 0, offset),
        stage: Stage::Bronze,
        reason_code: "not_framed".into(),
        detail: "payload is not Confluent-framed Avro".into(),
        table: Some("public.t".into()),
        topic: Some("cdc.public.t".into()),
        partition: Some(0),
        offset: Some(offset),
        source_lsn: None,
        commit_lsn: None,
        ordinal: None,
        key: None,
        raw: Some(vec![1, 2, 3]),
        quarantined_at_us: 0,
        check: None,
    };
    let mut q = QuarantineTable::new(lake.quarantine_records());
    assert_eq!(
        q.append(Stage::Bronze, vec![record(3), record(7)])
            .await
            .unwrap(),
        2
    );
    // A re-read after a crash offers 3 and 7 again, and 9 for the first time.
    let mut again = QuarantineTable::new(lake.quarantine_records());
    assert_eq!(
        again
            .append(Stage::Bronze, vec![record(3), record(7), record(9)])
            .await
            .unwrap(),
        1
    );
    let all = q.read_all().await.unwrap();
    let mut offsets: Vec<i64> = all.iter().filter_map(|r| r.offset).collect();
    offsets.sort();
    assert_eq!(offsets, vec![3, 7, 9]);
    assert_eq!(all[0].raw.as_deref(), Some(&[1u8, 2, 3][..]));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn silver_quarantine_records_are_stored_once_per_id_whatever_the_offset_order() {
    let (lake, dir) = lake();
    let record = |offset: i64| QuarantineRecord {
        id: QuarantineRecord::event_id(Stage::Silver, "cdc.public.t", 0, offset),
        stage: Stage::Silver,
        reason_code: "check_failed".into(),
        detail: "check c: not true: v > 0".into(),
        table: Some("public.t".into()),
        topic: Some("cdc.public.t".into()),
        partition: Some(0),
        offset: Some(offset),
        source_lsn: Some(10),
        commit_lsn: Some(10),
        ordinal: Some(1),
        key: Some(b"{\"id\":\"1\"}".to_vec()),
        raw: None,
        quarantined_at_us: 0,
        check: Some("c".into()),
    };
    let mut q = QuarantineTable::new(lake.quarantine_records());
    // A snapshot row at offset 50 first, then the streamed row at 30 ahead of it.
    assert_eq!(
        q.append_new(Stage::Silver, vec![record(50)]).await.unwrap(),
        1
    );
    assert_eq!(
        q.append_new(Stage::Silver, vec![record(30), record(50)])
            .await
            .unwrap(),
        1
    );
    let all = q.read_all().await.unwrap();
    let mut offsets: Vec<i64> = all.iter().filter_map(|r| r.offset).collect();
    offsets.sort();
    assert_eq!(offsets, vec![30, 50]);
    assert_eq!(all[0].check.as_deref(), Some("c"));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn maintenance_compacts_small_files_and_checkpoints_without_losing_rows() {
    let (lake, dir) = lake();
    let mut t = BronzeTable::new("public.t", lake.bronze("public", "t"));
    for i in 0..5i64 {
        t.append(Append {
            topic: "cdc.public.t".into(),
            batches: vec![batch(vec![("id", DataType::Int64)], &[i * 2, i * 2 + 1])],
            ranges: ranges(0, i * 2, i * 2 + 1),
        })
        .await
        .unwrap();
    }
    let report = wal2delta_lake::maintenance::maintain("public.t", t.url(), 64 << 20, None)
        .await
        .unwrap();
    assert_eq!(report.files_removed, 5, "{report:?}");
    assert_eq!(report.files_added, 1, "{report:?}");
    let version = report.checkpoint_version.unwrap();
    let checkpoint = dir.join(format!(
        "bronze/public/t/_delta_log/{version:020}.checkpoint.parquet"
    ));
    assert!(
        checkpoint.exists(),
        "checkpoint at {}",
        checkpoint.display()
    );
    assert_eq!(single_i64(&rows(&t, "select count(*) from t").await), 10);
    assert_eq!(
        single_i64(&rows(&t, "select sum(kafka_offset) from t").await),
        45
    );
    // Offsets survive compaction: the next append continues after them.
    assert_eq!(
        t.stored_offsets("cdc.public.t", &[0]).await.unwrap()[&0],
        Some(9)
    );
    let _ = std::fs::remove_dir_all(dir);
}
