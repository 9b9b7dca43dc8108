//! Reading a round's Bronze rows (and transaction records) straight from the files that
//! can hold them.
//!
//! A round reads a narrow range of offsets per Kafka partition. A DataFusion query over
//! the Bronze table opens the footer of every file the table holds: the log's statistics,
//! which would let it skip files, cover only a table's first 32 columns by default, and a
//! Bronze table's row images come first, so for most tables the log says nothing of the
//! Kafka coordinates. Bronze gains files with every batch until compaction packs them
//! (hourly by default; four times a second with `[bronze] max_batch_ms` 250): measured
//! under a steady load, the query's time grew from 10 ms to 250 ms within two minutes,
//! and each round then read more rows, which made the next one slower still.
//!
//! Here each file's footer is read once ([`Footers`]: a file never changes) and its row
//! groups' statistics (smallest and largest `kafka_partition` and `kafka_offset`) name the
//! few row groups that can hold the window; those are read with the Parquet reader, only
//! the columns Silver reads, and their rows filtered to the window exactly, so the result
//! is the query's. The transaction records a round counts (`commit_lsn` above the lowest
//! watermark) are read the same way. Which files the table holds comes from its log,
//! followed commit by commit ([`crate::follow`]), not from a refreshed `DeltaTable`.
//!
//! Whatever this path cannot read exactly as the query would gives `None`, and the round
//! reads through DataFusion instead: a table with column mapping, a file with a deletion
//! vector, a file column it cannot convert to the table's type, a file it cannot read,
//! a window inside large row groups.

// `ParquetObjectReader` is deprecated in parquet 59 in favour of a reader of one's own;
// delta-rs 1.1 reads its data files with it too.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::Arc;

use deltalake::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StructArray,
};
use deltalake::arrow::compute::{
    cast, concat_batches, filter_record_batch, lexsort_to_indices, take_record_batch, SortColumn,
};
use deltalake::arrow::datatypes::{DataType, Fields, Int64Type, SchemaRef};
use deltalake::arrow::error::ArrowError;
use deltalake::parquet::arrow::async_reader::ParquetObjectReader;
use deltalake::parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use deltalake::parquet::arrow::ProjectionMask;
use deltalake::parquet::file::statistics::Statistics;
use deltalake::{ObjectStore, Path};
use futures::TryStreamExt;

use super::window::Selection;
use crate::follow::Listing;

/// Why the direct read gave way to the query (logged at debug).
type Fallback = String;

/// Which rows a direct read keeps, decided by the values of a few integer columns.
pub(super) trait Pick {
    /// The integer columns it decides by; the rows come ordered by them.
    fn columns(&self) -> &'static [&'static str];
    /// Whether a file or row group whose `columns` span `ranges` (smallest, largest) may
    /// hold a row it keeps.
    fn may_hold(&self, ranges: &[(i64, i64)]) -> bool;
    /// Whether it keeps a row whose `columns` hold `values`.
    fn keeps(&self, values: &[i64]) -> bool;
}

impl Pick for Selection {
    fn columns(&self) -> &'static [&'static str] {
        super::window::COORDINATES
    }

    fn may_hold(&self, ranges: &[(i64, i64)]) -> bool {
        self.may_hold((clamp(ranges[0].0), clamp(ranges[0].1)), ranges[1])
    }

    fn keeps(&self, values: &[i64]) -> bool {
        self.contains(clamp(values[0]), values[1])
    }
}

/// The rows of the listed table that `pick` keeps, with `schema`'s columns (typed as the
/// table has them), ordered by the pick's columns; `None` when only a query can read them
/// exactly.
pub(super) async fn read(
    name: &str,
    listing: &Listing,
    pick: &dyn Pick,
    schema: &SchemaRef,
    footers: &mut Footers,
) -> Option<RecordBatch> {
    match try_read(listing, pick, schema, footers).await {
        Ok(read) => {
            tracing::trace!(table = %name, version = listing.version, files = read.files, rows = read.rows.num_rows(), "Bronze files read");
            Some(read.rows)
        }
        Err(why) => {
            tracing::debug!(table = %name, version = listing.version, reason = %why, "reading Bronze through a query");
            None
        }
    }
}

/// What the footers of a table's files say about a pick's columns: per file, per row
/// group, the smallest and largest value of each column and the group's compressed size.
/// A file never changes once written, so its footer is read once; a file the table no
/// longer holds (compacted away) is forgotten. The log's own statistics cover only the
/// first 32 columns by default, and a Bronze table's row images come first, so for most
/// tables the log says nothing of the Kafka coordinates: without these, every round would
/// read every file's footer, as the query does.
#[derive(Default)]
pub(super) struct Footers {
    files: HashMap<String, Arc<[RowGroup]>>,
}

struct RowGroup {
    /// Per pick column; `None` when the footer has no statistics for one.
    ranges: Option<Vec<(i64, i64)>>,
    bytes: i64,
}

impl Footers {
    /// The row groups of the file the log names `key` (at `path`), its footer read if
    /// not known yet.
    async fn row_groups(
        &mut self,
        store: &Arc<dyn ObjectStore>,
        key: &str,
        path: &Path,
        size: u64,
        pick: &dyn Pick,
    ) -> Result<Arc<[RowGroup]>, Fallback> {
        if let Some(known) = self.files.get(key) {
            return Ok(known.clone());
        }
        let mut reader = ParquetObjectReader::new(store.clone(), path.clone());
        if size > 0 {
            reader = reader.with_file_size(size);
        }
        let meta = reader
            .get_metadata(None)
            .await
            .map_err(|e| format!("reading the footer of {path}: {e}"))?;
        let d = meta.file_metadata().schema_descr();
        let leaves: Vec<Option<usize>> = pick
            .columns()
            .iter()
            .map(|n| (0..d.num_columns()).find(|&i| d.column(i).path().string() == *n))
            .collect();
        let groups: Arc<[RowGroup]> = meta
            .row_groups()
            .iter()
            .map(|g| {
                let range = |c: &Option<usize>| match g.column((*c)?).statistics()? {
                    Statistics::Int32(v) => {
                        Some((i64::from(*v.min_opt()?), i64::from(*v.max_opt()?)))
                    }
                    Statistics::Int64(v) => Some((*v.min_opt()?, *v.max_opt()?)),
                    _ => None,
                };
                RowGroup {
                    ranges: leaves.iter().map(range).collect(),
                    bytes: g.compressed_size(),
                }
            })
            .collect();
        self.files.insert(key.to_owned(), groups.clone());
        Ok(groups)
    }
}

/// The rows read, and from how many files.
struct Read {
    rows: RecordBatch,
    files: usize,
}

async fn try_read(
    listing: &Listing,
    pick: &dyn Pick,
    schema: &SchemaRef,
    footers: &mut Footers,
) -> Result<Read, Fallback> {
    if listing.mapped {
        return Err("the table maps its column names".into());
    }
    // The log's statistics, where it has them for every pick column, skip files without
    // reading their footers.
    let logged = listing.columns == pick.columns();
    let store = &listing.store;
    let mut wanted = Vec::new();
    let mut bytes = 0;
    for (key, file) in listing.files.iter() {
        let path = &file.path;
        let ranges = file.ranges.as_ref().filter(|_| logged);
        if ranges.is_some_and(|r| !pick.may_hold(r)) {
            continue;
        }
        if file.deletion_vector {
            return Err("a file has a deletion vector".into());
        }
        // A row group without statistics for a column may hold anything: it is read.
        let groups = footers
            .row_groups(store, key, path, file.size, pick)
            .await?;
        let chosen: Vec<usize> = groups
            .iter()
            .enumerate()
            .filter(|(_, g)| g.ranges.as_ref().is_none_or(|r| pick.may_hold(r)))
            .map(|(i, _)| i)
            .collect();
        if chosen.is_empty() {
            continue;
        }
        bytes += chosen.iter().map(|&i| groups[i].bytes).sum::<i64>();
        if bytes > MOST_BYTES {
            return Err(format!(
                "the window's row groups hold more than {} MiB",
                MOST_BYTES >> 20
            ));
        }
        wanted.push((path.clone(), file.size, chosen));
    }
    // Footers are keyed as the listing keys files: those of files compacted away go.
    footers
        .files
        .retain(|key, _| listing.files.contains_key(key));
    let read = wanted.len();
    let mut batches = Vec::new();
    for (path, size, row_groups) in wanted {
        read_file(store, path, size, row_groups, pick, schema, &mut batches).await?;
    }
    let rows = concat_batches(schema, &batches).map_err(|e| e.to_string())?;
    let rows = ordered(&rows, pick).map_err(|e| e.to_string())?;
    Ok(Read { rows, files: read })
}

/// The most compressed bytes of row groups a direct read takes on. A window inside large
/// files (compacted Bronze, read while Silver catches up or is rebuilt) is read through
/// the query, whose page index reads less of a large row group.
const MOST_BYTES: i64 = 64 << 20;

fn clamp(v: i64) -> i32 {
    i32::try_from(v).unwrap_or(if v < 0 { i32::MIN } else { i32::MAX })
}

/// The rows of the file's `row_groups` that `pick` keeps, with `schema`'s columns,
/// appended to `out` batch by batch (a row group's other rows are never all in memory).
async fn read_file(
    store: &Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    row_groups: Vec<usize>,
    pick: &dyn Pick,
    schema: &SchemaRef,
    out: &mut Vec<RecordBatch>,
) -> Result<(), Fallback> {
    let name = path.to_string();
    let failed = |e: deltalake::parquet::errors::ParquetError| format!("reading {name}: {e}");
    let mut reader = ParquetObjectReader::new(store.clone(), path);
    if size > 0 {
        reader = reader.with_file_size(size);
    }
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(failed)?;
    let roots: Vec<usize> = builder
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| schema.field_with_name(f.name()).is_ok())
        .map(|(i, _)| i)
        .collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let mut stream = builder
        .with_projection(mask)
        .with_row_groups(row_groups)
        .build()
        .map_err(failed)?;
    while let Some(b) = stream.try_next().await.map_err(failed)? {
        let b = select(&b, pick).map_err(|e| e.to_string())?;
        if b.num_rows() > 0 {
            out.push(conform_batch(&b, schema).map_err(|e| e.to_string())?);
        }
    }
    Ok(())
}

/// The rows of `batch` that `pick` keeps.
fn select(batch: &RecordBatch, pick: &dyn Pick) -> Result<RecordBatch, ArrowError> {
    let columns = pick
        .columns()
        .iter()
        .map(|n| {
            let a = batch.column_by_name(n).ok_or_else(|| {
                ArrowError::SchemaError(format!("a Bronze file has no column {n}"))
            })?;
            cast(a, &DataType::Int64)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let columns: Vec<_> = columns
        .iter()
        .map(|a| a.as_primitive::<Int64Type>())
        .collect();
    let mut values = vec![0; columns.len()];
    let keep: BooleanArray = (0..batch.num_rows())
        .map(|i| {
            for (v, c) in values.iter_mut().zip(&columns) {
                if c.is_null(i) {
                    return Some(false);
                }
                *v = c.value(i);
            }
            Some(pick.keeps(&values))
        })
        .collect();
    filter_record_batch(batch, &keep)
}

/// `batch` with `schema`'s columns: a column the file lacks (it was written before the
/// table gained it) is null, a struct field it lacks likewise, other types are cast.
pub(super) fn conform_batch(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let columns = conform_all(schema.fields(), batch.num_rows(), |n| {
        batch.column_by_name(n)
    })?;
    RecordBatch::try_new(schema.clone(), columns)
}

/// For each of `fields`, the column `named` gives, conformed to its type; null when it
/// gives none and the field may be null.
fn conform_all<'a>(
    fields: &Fields,
    rows: usize,
    named: impl Fn(&str) -> Option<&'a ArrayRef>,
) -> Result<Vec<ArrayRef>, ArrowError> {
    fields
        .iter()
        .map(|f| match named(f.name()) {
            Some(a) => conform(a, f.data_type()).map_err(|e| match e {
                // Names the column (never a value).
                ArrowError::CastError(m) => {
                    ArrowError::CastError(format!("column {}: {m}", f.name()))
                }
                other => other,
            }),
            None if f.is_nullable() => Ok(new_null_array(f.data_type(), rows)),
            None => Err(ArrowError::SchemaError(format!(
                "a Bronze file lacks the required column {}",
                f.name()
            ))),
        })
        .collect()
}

fn conform(array: &ArrayRef, to: &DataType) -> Result<ArrayRef, ArrowError> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    match (array.data_type(), to) {
        (DataType::Struct(_), DataType::Struct(fields)) => {
            let s = array.as_struct();
            let children = conform_all(fields, s.len(), |n| s.column_by_name(n))?;
            Ok(Arc::new(StructArray::try_new(
                fields.clone(),
                children,
                s.nulls().cloned(),
            )?))
        }
        // A bounded numeric in a text column an earlier release wrote: exactly.
        (DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View, DataType::Decimal128(p, s)) => {
            super::text_decimals::to_decimal(array, *p, *s)
        }
        _ => cast(array, to),
    }
}

/// `rows` ordered by `pick`'s columns (as the query orders a window: partition, then
/// offset).
fn ordered(rows: &RecordBatch, pick: &dyn Pick) -> Result<RecordBatch, ArrowError> {
    let sort = pick
        .columns()
        .iter()
        .map(|n| {
            let values = rows
                .column_by_name(n)
                .cloned()
                .ok_or_else(|| ArrowError::SchemaError(format!("no column {n}")))?;
            Ok(SortColumn {
                values,
                options: None,
            })
        })
        .collect::<Result<Vec<_>, ArrowError>>()?;
    let order = lexsort_to_indices(&sort, None)?;
    take_record_batch(rows, &order)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use deltalake::arrow::array::{
        Int64Array, ListBuilder, StringArray, StringBuilder, TimestampMicrosecondArray,
    };
    use deltalake::arrow::datatypes::{Field, TimeUnit};
    use wal2delta_model::bronze;

    use super::*;
    use crate::bronze::{bronze_batch, Append, BronzeTable, KafkaCoordinates, OffsetRange};
    use crate::follow::Followed;
    use crate::silver::kept::KeptTables;
    use crate::silver::window::COORDINATES;
    use crate::silver::SilverTable;
    use crate::Lake;
    use url::Url;

    /// A row image `{id, v, c1..c<wide>}`, and with `note` once the source table gained a
    /// column.
    fn image(ids: &[i64], evolved: bool, wide: usize) -> (Field, ArrayRef) {
        let mut fields = vec![
            Field::new("id", DataType::Int64, true),
            Field::new("v", DataType::Utf8, true),
        ];
        let mut children: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(ids.to_vec())),
            Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("v{i}")),
            )),
        ];
        for c in 0..wide {
            fields.push(Field::new(format!("c{c}"), DataType::Int64, true));
            children.push(Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|i| i + c as i64),
            )));
        }
        if evolved {
            fields.push(Field::new("note", DataType::Utf8, true));
            children.push(Arc::new(StringArray::from_iter_values(
                ids.iter().map(|i| format!("n{i}")),
            )));
        }
        let a = StructArray::new(Fields::from(fields), children, None);
        (Field::new("x", a.data_type().clone(), true), Arc::new(a))
    }

    /// One Bronze batch of `partition`'s offsets `first..first + n`.
    fn batch(partition: i32, first: i64, n: i64, evolved: bool, wide: usize) -> RecordBatch {
        let offsets: Vec<i64> = (first..first + n).collect();
        let ids: Vec<i64> = offsets
            .iter()
            .map(|o| o * 10 + i64::from(partition))
            .collect();
        let (img, after) = image(&ids, evolved, wide);
        let (_, before) = image(&ids, evolved, wide);
        let key = StructArray::new(
            Fields::from(vec![Field::new("id", DataType::Int64, true)]),
            vec![Arc::new(Int64Array::from(ids.clone())) as ArrayRef],
            None,
        );
        let mut toast = ListBuilder::new(StringBuilder::new());
        for o in &offsets {
            if o % 3 == 0 {
                toast.append_value([Some("v")]);
            } else {
                toast.append_null();
            }
        }
        let toast = toast.finish();
        let n = offsets.len();
        let utc = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let fields = vec![
            Field::new(bronze::OP, DataType::Utf8, true),
            img.clone().with_name(bronze::BEFORE),
            img.with_name(bronze::AFTER),
            Field::new(bronze::KEY, key.data_type().clone(), true),
            Field::new(bronze::COMMIT_LSN, DataType::Int64, true),
            Field::new(bronze::ORDINAL, DataType::Int64, true),
            Field::new(bronze::COMMIT_TS, utc, true),
            Field::new(
                bronze::UNCHANGED_TOAST_COLUMNS,
                toast.data_type().clone(),
                true,
            ),
        ];
        let arrays: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from(vec!["u"; n])),
            before,
            after,
            Arc::new(key),
            Arc::new(Int64Array::from_iter_values(
                offsets.iter().map(|o| 1000 + o),
            )),
            Arc::new(Int64Array::from(vec![0; n])),
            Arc::new(
                TimestampMicrosecondArray::from(vec![1_700_000_000_000_000; n])
                    .with_timezone("UTC"),
            ),
            Arc::new(toast),
        ];
        let coordinates: Vec<KafkaCoordinates> = offsets
            .iter()
            .map(|&offset| KafkaCoordinates {
                partition,
                offset,
                timestamp_ms: None,
            })
            .collect();
        bronze_batch(
            "s.t",
            "topic",
            fields,
            arrays,
            &coordinates,
            1_700_000_000_000_000,
        )
        .unwrap()
    }

    /// Rows as text, column by column (the query and the direct read may differ in
    /// nullability flags only).
    fn shown(rows: &RecordBatch) -> Vec<String> {
        let mut out = vec![format!("{} rows", rows.num_rows())];
        for (f, c) in rows.schema().fields().iter().zip(rows.columns()) {
            out.push(format!("{} {}", f.name(), f.data_type()));
            let strings = deltalake::arrow::util::display::ArrayFormatter::try_new(
                c.as_ref(),
                &Default::default(),
            )
            .unwrap();
            out.extend((0..c.len()).map(|i| format!("{}[{i}] {}", f.name(), strings.value(i))));
        }
        out
    }

    /// Commit `commit` of 3 partitions, 10 offsets each.
    async fn append(table: &mut BronzeTable, commit: i64, evolved: bool, wide: usize) {
        let mut batches = Vec::new();
        let mut ranges = BTreeMap::new();
        for p in 0..3 {
            batches.push(batch(p, commit * 10, 10, evolved, wide));
            ranges.insert(
                p,
                OffsetRange {
                    first: commit * 10,
                    last: commit * 10 + 9,
                },
            );
        }
        let out = table
            .append(Append {
                topic: "topic".into(),
                batches,
                ranges,
            })
            .await
            .unwrap();
        assert!(
            matches!(out, crate::bronze::AppendOutcome::Committed { .. }),
            "{out:?}"
        );
    }

    /// A followed table's listing equals what a fresh load lists, and the followed one
    /// loaded only where the log changed more than the files.
    async fn same_as_a_fresh_load(followed: &mut Followed, url: &Url) -> Listing {
        let listing = followed.latest("s.t", url).await.unwrap().unwrap();
        let fresh = Followed::new(COORDINATES)
            .latest("s.t", url)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(listing.version, fresh.version);
        assert_eq!(listing.files, fresh.files, "at version {}", listing.version);
        assert_eq!(listing.schema, fresh.schema);
        assert_eq!(listing.mapped, fresh.mapped);
        let table = followed.table("s.t").await.unwrap();
        assert_eq!(
            table.version(),
            Some(listing.version),
            "the table for queries"
        );
        listing
    }

    #[tokio::test]
    async fn a_followed_table_lists_what_a_fresh_load_lists() {
        let dir = std::env::temp_dir().join(format!("w2d-follow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let url = lake.bronze("s", "t");
        let mut followed = Followed::new(COORDINATES);
        assert!(followed.latest("s.t", &url).await.unwrap().is_none());
        let mut table = BronzeTable::new("s.t", url.clone());
        append(&mut table, 0, false, 0).await;
        let first = same_as_a_fresh_load(&mut followed, &url).await;
        assert!(first.files.values().all(|f| f.ranges.is_some()));
        // New commits are followed, not loaded (several in one look).
        for commit in 1..4 {
            append(&mut table, commit, false, 0).await;
        }
        let later = same_as_a_fresh_load(&mut followed, &url).await;
        assert_eq!(later.files.len(), first.files.len() * 4);
        assert_eq!(followed.loads(), 1);
        // A commit that changes the schema (the row images gain a column) is loaded.
        append(&mut table, 4, true, 0).await;
        let evolved = same_as_a_fresh_load(&mut followed, &url).await;
        assert_ne!(evolved.schema, later.schema);
        assert_eq!(followed.loads(), 2);
        append(&mut table, 5, true, 0).await;
        // Compaction: its removes and adds are followed, and so is a checkpoint.
        crate::maintenance::maintain("s.t", &url, 64 << 20, None)
            .await
            .unwrap();
        append(&mut table, 6, true, 0).await;
        let compacted = same_as_a_fresh_load(&mut followed, &url).await;
        assert!(compacted.files.len() < evolved.files.len());
        assert_eq!(followed.loads(), 2);
        // Removed: nothing, and a table made there again is loaded afresh (its versions
        // start over, so following the old log would not see it).
        std::fs::remove_dir_all(url.to_file_path().unwrap()).unwrap();
        assert!(followed.latest("s.t", &url).await.unwrap().is_none());
        let mut table = BronzeTable::new("s.t", url.clone());
        append(&mut table, 0, false, 0).await;
        let again = same_as_a_fresh_load(&mut followed, &url).await;
        assert_eq!(again.files.len(), first.files.len());
        assert_eq!(followed.loads(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_follower_whose_next_commits_maintenance_removed_loads_the_table_again() {
        let dir = std::env::temp_dir().join(format!("w2d-follow-gone-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let url = lake.bronze("s", "t");
        let mut followed = Followed::new(COORDINATES);
        let mut table = BronzeTable::new("s.t", url.clone());
        append(&mut table, 0, false, 0).await;
        let first = same_as_a_fresh_load(&mut followed, &url).await;
        // The follower looks away while the table moves on and maintenance, with a log
        // retention of a second, removes the commits it would read next.
        for commit in 1..5 {
            append(&mut table, commit, false, 0).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        let report = crate::maintenance::maintain(
            "s.t",
            &url,
            64 << 20,
            Some(std::time::Duration::from_secs(1)),
        )
        .await
        .unwrap();
        assert!(report.log_entries_removed >= 4, "{report:?}");
        let log = url.to_file_path().unwrap().join("_delta_log");
        assert!(
            !log.join(format!("{:020}.json", first.version + 1)).exists(),
            "the next commit is gone"
        );
        // Not "nothing new": the table is loaded again, at its latest version.
        let later = same_as_a_fresh_load(&mut followed, &url).await;
        assert!(later.version > first.version + 4, "{}", later.version);
        assert_eq!(followed.loads(), 2);
        // And followed from there on.
        append(&mut table, 5, false, 0).await;
        same_as_a_fresh_load(&mut followed, &url).await;
        assert_eq!(followed.loads(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_next_offset_of_a_partition_is_found_without_a_query_where_files_tell() {
        let dir = std::env::temp_dir().join(format!("w2d-next-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let url = lake.bronze("s", "t");
        let mut table = BronzeTable::new("s.t", url.clone());
        // Wide row images: the log has no statistics of the Kafka columns, the footers do.
        for commit in 0..4 {
            append(&mut table, commit, false, 20).await;
        }
        let mut kept = KeptTables::default();
        kept.bronze_latest("s.t", &url).await.unwrap().unwrap();
        let cases = [
            (1, 15, Some(16)),
            (0, -1, Some(0)),
            (2, 39, None),
            (7, 0, None),
        ];
        for (partition, after, want) in cases {
            let next = kept.next_offset("s.t", partition, after).await.unwrap();
            assert_eq!(next, want, "partition {partition} after {after}");
        }
        assert_eq!(kept.bronze.loads(), 1);
        // Found from the footers alone: the table for queries was never brought forward.
        append(&mut table, 4, false, 20).await;
        kept.bronze_latest("s.t", &url).await.unwrap().unwrap();
        assert_eq!(kept.next_offset("s.t", 2, 39).await.unwrap(), Some(40));
        assert!(kept
            .bronze
            .queried_version()
            .is_some_and(|v| v < kept.bronze_version().unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_files_read_directly_give_the_rows_the_query_gives() {
        // Narrow row images: the log has statistics of the Kafka columns. Wide ones (more
        // than 32 columns before them): only the files' footers do.
        for wide in [0, 20] {
            same_rows_as_the_query(wide).await;
        }
    }

    /// Reads `selection` directly and through the query, asserts both give the same rows,
    /// and returns the direct read and how many rows the query gave.
    async fn both(
        silver: &SilverTable,
        bronze: &mut Followed,
        selection: &Selection,
        schema: &SchemaRef,
        footers: &mut Footers,
    ) -> (Read, usize) {
        let listing = bronze
            .latest("s.t", &silver.bronze_url)
            .await
            .unwrap()
            .unwrap();
        let direct = try_read(&listing, selection, schema, footers)
            .await
            .unwrap();
        let table = bronze.table("s.t").await.unwrap();
        let queried = silver
            .select_bronze(&table, &selection.sql(), None)
            .await
            .unwrap();
        let version = listing.version;
        assert_eq!(
            shown(&direct.rows),
            shown(&queried),
            "{selection:?} at version {version:?}"
        );
        (direct, queried.num_rows())
    }

    async fn same_rows_as_the_query(wide: usize) {
        let dir = std::env::temp_dir().join(format!("w2d-files-{}-{wide}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let lake = Lake::new(dir.to_str().unwrap()).unwrap();
        let url = lake.bronze("s", "t");
        let mut table = BronzeTable::new("s.t", url.clone());
        // 12 commits of 3 partitions, 10 offsets each; the row images gain a column
        // halfway (files written before lack it).
        for commit in 0..12i64 {
            append(&mut table, commit, commit >= 6, wide).await;
        }
        let silver = SilverTable::new(&lake, "s", "t", 10);
        let mut bronze = Followed::new(COORDINATES);
        let listing = bronze.latest("s.t", &url).await.unwrap().unwrap();
        let schema = silver
            .read_schema(&listing.schema, &listing.text_decimals, None)
            .unwrap();
        let total = listing.files.len();
        let logged = listing.files.values().all(|f| f.ranges.is_some());
        assert!(logged || listing.files.values().all(|f| f.ranges.is_none()));
        assert_eq!(
            logged,
            wide == 0,
            "the log's statistics of kafka_offset with {wide} extra columns"
        );
        let selections = [
            // Across the schema change, a partition not read by range, one ahead.
            Selection {
                ranges: BTreeMap::from([(0, (55, 64)), (2, (-1, 9))]),
                others_below: 10,
            },
            // Nothing read yet.
            Selection {
                ranges: BTreeMap::new(),
                others_below: 25,
            },
            // Past everything Bronze holds, and an empty range.
            Selection {
                ranges: BTreeMap::from([(0, (200, 210)), (1, (30, 30)), (2, (118, 130))]),
                others_below: 0,
            },
        ];
        let mut footers = Footers::default();
        for selection in &selections {
            let (direct, queried) =
                both(&silver, &mut bronze, selection, &schema, &mut footers).await;
            assert!(queried > 0 || selection.others_below == 0);
            assert!(
                direct.files < total,
                "{} of {total} files read for {selection:?}",
                direct.files
            );
        }
        // Where the log has statistics, files it rules out are never opened; where not,
        // every footer is read, and kept.
        if logged {
            assert!(
                footers.files.len() < total,
                "{} footers of {total} files",
                footers.files.len()
            );
        } else {
            assert_eq!(footers.files.len(), total);
        }
        // After compaction the files span every partition and offset: still the same
        // rows, and the footers of the files compacted away are forgotten.
        crate::maintenance::maintain("s.t", &url, 64 << 20, None)
            .await
            .unwrap();
        for selection in &selections {
            both(&silver, &mut bronze, selection, &schema, &mut footers).await;
        }
        let total = bronze
            .latest("s.t", &url)
            .await
            .unwrap()
            .unwrap()
            .files
            .len();
        assert!(
            footers.files.len() <= total,
            "{} footers kept for {total} files",
            footers.files.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_may_hold_a_selected_row_only_where_its_ranges_meet_the_selection() {
        let s = Selection {
            ranges: BTreeMap::from([(0, (10, 20)), (2, (5, 8))]),
            others_below: 4,
        };
        assert!(s.may_hold((0, 0), (15, 30)));
        assert!(!s.may_hold((0, 0), (0, 10)), "at or below the cursor");
        assert!(!s.may_hold((0, 0), (21, 40)), "past the window");
        assert!(s.may_hold((0, 2), (8, 8)), "partition 2's last offset");
        assert!(!s.may_hold((2, 2), (9, 12)));
        assert!(
            s.may_hold((1, 1), (0, 100)),
            "partition 1 is not read by range: below 4"
        );
        assert!(!s.may_hold((1, 1), (4, 100)));
        assert!(
            !s.may_hold((0, 2), (30, 40)),
            "1 is unread but past the window's size"
        );
        assert!(s.contains(0, 11) && !s.contains(0, 10) && s.contains(0, 20) && !s.contains(0, 21));
        assert!(s.contains(7, 3) && !s.contains(7, 4));
    }
}
