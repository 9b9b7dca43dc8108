//! Type widening: a column whose source type grew (`int` → `bigint`, `real` → `double
//! precision`, a decimal's precision or scale up) takes the wider type in the lake, with
//! every row it already holds cast, and the stream goes on.
//!
//! Delta's own type-widening table feature would change the column in the log alone, but
//! delta-rs 1.1 writes no table with it, and the readers this project supports (DuckDB's
//! delta extension, the `deltalake` package) cannot be assumed to read it. So a table is
//! **rewritten under the wider type in one commit**: the commit removes every data file
//! and adds the same rows cast, with the new schema in its metadata. Every version stays
//! readable by every reader: versions before the rewrite hold the old type in their files
//! and their schema, versions from it on the new type in both. The `txn` actions a table
//! records (Bronze's Kafka offsets, Silver's progress) are log state, not file state, so
//! the rewrite keeps them; writers that read their progress from the last commit's info
//! pass it in `props` (the rewrite carries it forward as compaction does).
//!
//! A rewrite reads and writes the table once, streaming (DataFusion scan → cast →
//! delta-rs writer), so its memory does not grow with the table. A writer that commits
//! to the table meanwhile makes the rewrite conflict; the caller's round is retried.
//!
//! Only widening is automatic. A narrowing (`bigint` → `int`) needs nothing: the lake
//! keeps the wider type and the narrower values cast into it. Any other change (`int` →
//! `text`, `boolean` → `int`) is a conflict the caller reports with [`refusal`].

use std::sync::Arc;

use deltalake::arrow::datatypes::{DataType, Fields, Schema, SchemaRef};
use deltalake::datafusion::logical_expr::{cast, Expr};
use deltalake::datafusion::prelude::ident;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::operations::write::SchemaMode;
use deltalake::protocol::SaveMode;
use deltalake::{DeltaTable, DeltaTableError};

use crate::delta;

/// Commit info key of a rewrite's reason and columns.
pub const REWRITE_KEY: &str = "wal2delta.rewrite";

/// The widest decimal precision Delta holds.
const MAX_DECIMAL_PRECISION: u8 = 38;

/// The type that holds every value of `a` and of `b` without loss, when one of them widens
/// the other: signed integers to the larger, floats to the larger, decimals to the
/// precision and scale holding both (at most 38 digits). `None` for any other pair,
/// including equal types.
pub fn wider(a: &DataType, b: &DataType) -> Option<DataType> {
    use DataType::*;
    fn int_rank(t: &DataType) -> Option<u8> {
        match t {
            Int8 => Some(1),
            Int16 => Some(2),
            Int32 => Some(3),
            Int64 => Some(4),
            _ => None,
        }
    }
    fn float_rank(t: &DataType) -> Option<u8> {
        match t {
            Float16 => Some(1),
            Float32 => Some(2),
            Float64 => Some(3),
            _ => None,
        }
    }
    if a == b {
        return None;
    }
    if let (Some(x), Some(y)) = (int_rank(a), int_rank(b)) {
        return Some(if x >= y { a.clone() } else { b.clone() });
    }
    if let (Some(x), Some(y)) = (float_rank(a), float_rank(b)) {
        return Some(if x >= y { a.clone() } else { b.clone() });
    }
    match (a, b) {
        (Decimal128(p1, s1), Decimal128(p2, s2)) if *s1 >= 0 && *s2 >= 0 => {
            let scale = (*s1).max(*s2);
            let digits = (*p1 as i16 - *s1 as i16).max(*p2 as i16 - *s2 as i16);
            let precision = digits + scale as i16;
            (precision <= MAX_DECIMAL_PRECISION as i16)
                .then_some(Decimal128(precision as u8, scale))
        }
        _ => None,
    }
}

/// The reason a column's type change cannot be taken automatically: names the column, both
/// types, and what to do.
pub fn refusal(path: &str, table: &DataType, events: &DataType) -> String {
    format!(
        "column {path} is {table} in the table but {events} in the events; the lake widens \
         a column (a larger integer or float, a decimal with more digits) but cannot change \
         its type otherwise: rebuild the table under the new type, then re-drive the \
         quarantined events (docs/bronze.md, \"Schema evolution\")"
    )
}

/// `table`'s columns, each with the type of the same column in `wanted` where that type
/// is wider (through structs and lists), and the paths of the columns that widen; `None`
/// when none does. Columns only `wanted` has are not added: adding is the writers' own
/// schema merge.
pub fn widened(table: &Schema, wanted: &Fields) -> Option<(Schema, Vec<String>)> {
    let mut paths = Vec::new();
    let fields = widen_fields(table.fields(), wanted, "", &mut paths);
    (!paths.is_empty()).then(|| {
        (
            Schema::new_with_metadata(fields, table.metadata().clone()),
            paths,
        )
    })
}

fn widen_fields(table: &Fields, wanted: &Fields, path: &str, paths: &mut Vec<String>) -> Fields {
    table
        .iter()
        .map(|t| {
            let Some(w) = wanted.iter().find(|w| w.name() == t.name()) else {
                return t.as_ref().clone();
            };
            let here = format!("{path}{}", t.name());
            let ty = widen_type(t.data_type(), w.data_type(), &here, paths);
            t.as_ref().clone().with_data_type(ty)
        })
        .collect()
}

fn widen_type(
    table: &DataType,
    wanted: &DataType,
    path: &str,
    paths: &mut Vec<String>,
) -> DataType {
    match (table, wanted) {
        (DataType::Struct(t), DataType::Struct(w)) => {
            DataType::Struct(widen_fields(t, w, &format!("{path}."), paths))
        }
        (DataType::List(t), DataType::List(w) | DataType::LargeList(w)) => {
            let item = widen_type(t.data_type(), w.data_type(), &format!("{path}[]"), paths);
            DataType::List(Arc::new(t.as_ref().clone().with_data_type(item)))
        }
        (t, w) => match wider(t, w) {
            Some(ty) if &ty != t => {
                paths.push(path.to_owned());
                ty
            }
            _ => t.clone(),
        },
    }
}

/// Rewrites table `name` (a `layer` table: `Bronze`, `Silver`, `tombstones`) when
/// `wanted` widens some of its columns ([`widened`], then [`rewrite`]), logging it; the commit carries `info` (the `wal2delta.*` commit info its
/// readers need) and [`REWRITE_KEY`] with the columns. The table rewritten and the
/// columns that widened, or `None` when none does.
pub(crate) async fn widen_table(
    layer: &str,
    name: &str,
    table: &DeltaTable,
    wanted: &Fields,
    partition_columns: &[&str],
    mut info: Vec<(String, serde_json::Value)>,
) -> Result<Option<(DeltaTable, Vec<String>)>, DeltaTableError> {
    let have = table.snapshot()?.snapshot().arrow_schema();
    let Some((schema, paths)) = widened(&have, wanted) else {
        return Ok(None);
    };
    tracing::info!(table = %name, columns = ?paths, "a column's type widened; rewriting the {layer} table under the wider type");
    let started = std::time::Instant::now();
    info.retain(|(k, _)| k != REWRITE_KEY);
    info.push((
        REWRITE_KEY.to_owned(),
        serde_json::json!({ "reason": "type widening", "columns": paths }),
    ));
    let props = delta::commit_metadata(info);
    let table = rewrite(table.clone(), Arc::new(schema), partition_columns, props).await?;
    tracing::info!(table = %name, columns = ?paths, version = table.version(), ms = started.elapsed().as_millis() as u64, "{layer} table rewritten under the wider type");
    Ok(Some((table, paths)))
}

/// Rewrites `table` under `schema` (its own columns, some wider) in one commit: every row
/// cast, partitioned by `partition_columns`, committed with `props`. See the module doc.
pub async fn rewrite(
    table: DeltaTable,
    schema: SchemaRef,
    partition_columns: &[&str],
    props: CommitProperties,
) -> Result<DeltaTable, DeltaTableError> {
    let ctx = delta::session();
    let df = ctx.read_table(table.table_provider().await?)?;
    let have = df.schema().clone();
    let columns: Vec<Expr> = schema
        .fields()
        .iter()
        .map(|f| {
            let c = ident(f.name());
            match have.field_with_unqualified_name(f.name()) {
                Ok(h) if h.data_type() != f.data_type() => {
                    cast(c, f.data_type().clone()).alias(f.name())
                }
                _ => c,
            }
        })
        .collect();
    let plan = df.select(columns)?.logical_plan().clone();
    table
        .write(Vec::new())
        .with_input_plan(plan)
        .with_save_mode(SaveMode::Overwrite)
        .with_schema_mode(SchemaMode::Overwrite)
        .with_partition_columns(partition_columns.iter().map(|c| c.to_string()))
        .with_session_state(delta::merge_session())
        .with_commit_properties(props)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake::arrow::datatypes::Field;
    use DataType::*;

    #[test]
    fn integers_floats_and_decimals_widen_either_way() {
        assert_eq!(wider(&Int32, &Int64), Some(Int64));
        assert_eq!(wider(&Int64, &Int16), Some(Int64));
        assert_eq!(wider(&Float32, &Float64), Some(Float64));
        assert_eq!(
            wider(&Decimal128(10, 2), &Decimal128(14, 4)),
            Some(Decimal128(14, 4))
        );
        // 8 integer digits and 4 of scale: both hold.
        assert_eq!(
            wider(&Decimal128(10, 2), &Decimal128(6, 4)),
            Some(Decimal128(12, 4))
        );
        assert_eq!(wider(&Decimal128(38, 0), &Decimal128(38, 10)), None);
        assert_eq!(wider(&Int32, &Int32), None);
        assert_eq!(wider(&Int32, &Utf8), None);
        assert_eq!(wider(&Int64, &Float64), None);
        assert_eq!(wider(&Boolean, &Int32), None);
    }

    #[test]
    fn widened_names_nested_columns_and_adds_none() {
        let after = |n: DataType, extra: bool| {
            let mut f = vec![Field::new("id", n, true), Field::new("s", Utf8, true)];
            if extra {
                f.push(Field::new("new", Boolean, true));
            }
            Field::new("after", Struct(Fields::from(f)), true)
        };
        let table = Schema::new(vec![Field::new("op", Utf8, true), after(Int32, false)]);
        let events = Schema::new(vec![Field::new("op", Utf8, true), after(Int64, true)]);
        let (schema, paths) = widened(&table, events.fields()).unwrap();
        assert_eq!(paths, ["after.id"]);
        assert_eq!(
            schema,
            Schema::new(vec![Field::new("op", Utf8, true), after(Int64, false)])
        );
        // Narrower events change nothing.
        assert!(widened(&schema, table.fields()).is_none());
    }

    #[tokio::test]
    async fn a_rewrite_casts_every_row_nested_and_partitioned_in_one_commit() {
        use deltalake::arrow::array::{
            Array, AsArray, Int32Array, RecordBatch, StringArray, StructArray,
        };
        use deltalake::arrow::datatypes::Int64Type;
        let url = url::Url::parse("memory:///widen/rewrite/").unwrap();
        let after = |t: DataType| {
            Field::new(
                "after",
                Struct(Fields::from(vec![Field::new("id", t, true)])),
                true,
            )
        };
        let narrow = Arc::new(Schema::new(vec![
            Field::new("day", Utf8, true),
            after(Int32),
        ]));
        let ids = Arc::new(Int32Array::from(vec![1, 2, i32::MAX]));
        let structs = StructArray::from(vec![(Arc::new(Field::new("id", Int32, true)), ids as _)]);
        let batch = RecordBatch::try_new(
            narrow.clone(),
            vec![
                Arc::new(StringArray::from(vec!["a", "b", "a"])),
                Arc::new(structs),
            ],
        )
        .unwrap();
        let table = delta::handle("t", &url)
            .unwrap()
            .write(vec![batch])
            .with_partition_columns(["day"])
            .await
            .unwrap();
        let (wide, paths) = widened(&narrow, Schema::new(vec![after(Int64)]).fields()).unwrap();
        assert_eq!(paths, ["after.id"]);
        let table = rewrite(table, Arc::new(wide), &["day"], delta::commit_properties())
            .await
            .unwrap();
        assert_eq!(table.version(), Some(1));
        let schema = delta::arrow_schema("t", &table).unwrap();
        let Struct(f) = schema.field_with_name("after").unwrap().data_type() else {
            panic!()
        };
        assert_eq!(f[0].data_type(), &Int64);
        let ctx = delta::session();
        ctx.register_table("t", table.table_provider().await.unwrap())
            .unwrap();
        let out = ctx
            .sql("SELECT after.id AS id, day FROM t ORDER BY 1")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let ids: Vec<i64> = out
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        assert_eq!(ids, [1, 2, i32::MAX as i64]);
        assert_eq!(out.iter().map(|b| b.column(1).len()).sum::<usize>(), 3);
        let files: Vec<String> = table.get_file_uris().unwrap().collect();
        assert_eq!(files.len(), 2, "one file per partition: {files:?}");
        assert!(files.iter().all(|f| f.contains("day=")), "{files:?}");
    }
}
