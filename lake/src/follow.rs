//! A table's data files followed from its log: each look reads only the commit files
//! written since the last one, instead of refreshing the whole state.
//!
//! Silver reads a round's Bronze rows (and transaction records) straight from the files
//! that can hold them (`silver/files.rs`): of the table's state it needs only the list of
//! data files, their sizes and the log's statistics of a few columns. delta-rs 1.1
//! rebuilds that whole list on every refresh of a kept `DeltaTable`
//! (`lake/examples/refresh_cost.rs`), so refreshing Bronze grew with the files Bronze gains
//! between two compactions: 21 → 72 ms per round within two minutes at 250 ms batches
//! (docs/benchmarks.md), most of a second by the end of an hour. Here the list is kept,
//! and each look reads `_delta_log/<version>.json` for the versions after its own, applying
//! their `add` and `remove` actions: the cost follows the commits since the last look,
//! not the files the table holds.
//!
//! Invariants:
//! - The list at version `v` is the one delta-rs gives for `v`: it was taken from a state
//!   delta-rs loaded at some version `u ≤ v`, and the commits `u+1..=v` were applied in
//!   order, each whole. A commit that cannot be read or parsed drops the list; it is loaded
//!   again by delta-rs. So does a next commit that maintenance removed (older than the
//!   log retention, before a checkpoint): missing, with a checkpoint past it, it is gone,
//!   not yet to come.
//! - A commit that changes the table's metadata or protocol (a new column, other settings,
//!   a new reader feature) is not applied here: the state is loaded again, so the schema
//!   and the settings a reader sees are always delta-rs' own.
//! - The `DeltaTable` for queries ([`Followed::table`]) is brought to the listing's
//!   version when asked, so a query sees the rows the list holds.
//! - As with [`crate::delta::Kept`], a table removed is seen at the next look; one removed
//!   and made again between two looks is not, so callers drop what they follow after a
//!   failed round.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use deltalake::arrow::array::{Array, ArrayRef, AsArray};
use deltalake::arrow::compute::cast;
use deltalake::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use deltalake::datafusion::common::Column;
use deltalake::datafusion::physical_optimizer::pruning::PruningStatistics;
use deltalake::kernel::{Action, Add};
use deltalake::logstore::LogStore;
use deltalake::{DeltaTable, DeltaTableError, ObjectStore, Path};
use percent_encoding::percent_decode_str;
use url::Url;

use crate::{delta, LakeError};

/// Commits read at once after the first new one (a look usually finds a few).
const READ_AHEAD: u64 = 16;

/// More new commits than this in one look: loading the table from its last checkpoint
/// (delta-rs writes one every 100 commits) reads less.
const MAX_CATCH_UP: u64 = 200;

/// A table followed from its log; [`Followed::latest`] gives its data files now.
pub(crate) struct Followed {
    /// The columns whose log statistics each file's entry keeps.
    columns: &'static [&'static str],
    state: Option<State>,
    /// How many times delta-rs loaded the table (the first look, and each time the log
    /// could not be followed).
    loads: u64,
}

struct State {
    /// Loaded by delta-rs at a version at or below `version`; brought up when queried.
    table: DeltaTable,
    url: Url,
    version: u64,
    files: Arc<HashMap<String, LoggedFile>>,
    schema: SchemaRef,
    mapped: bool,
    text_decimals: Arc<BTreeMap<String, (u8, i8)>>,
    store: Arc<dyn ObjectStore>,
}

/// One data file of the table, as its `add` action describes it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoggedFile {
    pub(crate) path: Path,
    pub(crate) size: u64,
    pub(crate) deletion_vector: bool,
    /// Per followed column, the smallest and largest value the log's statistics give;
    /// `None` when they lack one.
    pub(crate) ranges: Option<Vec<(i64, i64)>>,
}

/// The table's data files at one version.
#[derive(Clone)]
pub(crate) struct Listing {
    pub(crate) version: u64,
    /// By path as the log names them (percent-decoded).
    pub(crate) files: Arc<HashMap<String, LoggedFile>>,
    /// The table's whole schema.
    pub(crate) schema: SchemaRef,
    /// Whether the table maps its column names (`delta.columnMapping.mode`).
    pub(crate) mapped: bool,
    /// The decimal types recorded for text columns an earlier release wrote
    /// ([`crate::bronze::TEXT_DECIMAL_PROPERTY`]).
    pub(crate) text_decimals: Arc<BTreeMap<String, (u8, i8)>>,
    /// The columns whose ranges [`LoggedFile::ranges`] holds.
    pub(crate) columns: &'static [&'static str],
    pub(crate) store: Arc<dyn ObjectStore>,
}

impl Followed {
    /// Follows a table keeping the log's statistics of `columns` (integer columns).
    pub(crate) fn new(columns: &'static [&'static str]) -> Self {
        Followed {
            columns,
            state: None,
            loads: 0,
        }
    }

    /// The table's data files now, or `None` when no table exists at `url` (whatever was
    /// followed is dropped then: a table made there later is loaded afresh).
    pub(crate) async fn latest(
        &mut self,
        name: &str,
        url: &Url,
    ) -> Result<Option<Listing>, LakeError> {
        if !crate::storage::table_exists(url).await? {
            self.state = None;
            return Ok(None);
        }
        if let Some(s) = &mut self.state {
            match s.follow(self.columns).await {
                Ok(()) => return Ok(Some(s.listing(self.columns))),
                Err(why) => {
                    tracing::debug!(table = %name, reason = %why, "loading the table again instead of following its log");
                    self.state = None;
                }
            }
        }
        let Some(table) = delta::open(name, url).await? else {
            return Ok(None);
        };
        self.loads += 1;
        let state = State::loaded(table, url, self.columns).map_err(LakeError::delta(&name))?;
        let listing = state.listing(self.columns);
        self.state = Some(state);
        Ok(Some(listing))
    }

    /// The version of the last [`Followed::latest`] (`None` when it found no table).
    pub(crate) fn version(&self) -> Option<u64> {
        self.state.as_ref().map(|s| s.version)
    }

    /// The version of the table kept for queries.
    #[cfg(test)]
    pub(crate) fn queried_version(&self) -> Option<u64> {
        self.state.as_ref().and_then(|s| s.table.version())
    }

    /// How many times delta-rs loaded the table.
    #[cfg(test)]
    pub(crate) fn loads(&self) -> u64 {
        self.loads
    }

    /// The table at the version of the last [`Followed::latest`], for a query. Far
    /// behind that version, the table is loaded at it afresh (from the last checkpoint
    /// before it) rather than brought forward commit by commit.
    pub(crate) async fn table(&mut self, name: &str) -> Result<DeltaTable, LakeError> {
        let Some(s) = &mut self.state else {
            return Err(LakeError::delta(&name)(DeltaTableError::NotATable(
                "no table followed: look for its latest state first".into(),
            )));
        };
        let at = s.table.version().unwrap_or(0);
        if at + MAX_CATCH_UP < s.version {
            let mut fresh = delta::handle(name, &s.url)?;
            fresh
                .load_version(s.version)
                .await
                .map_err(LakeError::delta(&name))?;
            s.table = fresh;
        } else if at < s.version {
            s.table
                .update_incremental(Some(s.version))
                .await
                .map_err(LakeError::delta(&name))?;
        }
        Ok(s.table.clone())
    }
}

impl State {
    /// The state delta-rs loaded into `table`.
    fn loaded(table: DeltaTable, url: &Url, columns: &[&str]) -> Result<State, DeltaTableError> {
        let snapshot = table.snapshot()?;
        let version = snapshot.version();
        let schema = snapshot.snapshot().arrow_schema();
        let configuration = snapshot.metadata().configuration();
        let mapped = configuration
            .get("delta.columnMapping.mode")
            .is_some_and(|m| m != "none");
        let text_decimals = Arc::new(crate::bronze::text_decimals(configuration));
        let data = snapshot.log_data();
        let int = |a: Option<ArrayRef>| cast(&a?, &DataType::Int64).ok();
        let stats: Option<Vec<(ArrayRef, ArrayRef)>> = columns
            .iter()
            .map(|c| {
                let column = Column::from_name(*c);
                Some((
                    int(data.min_values(&column))?,
                    int(data.max_values(&column))?,
                ))
            })
            .collect();
        let mut files = HashMap::new();
        for (i, file) in data.iter().enumerate() {
            let ranges = stats.as_ref().and_then(|stats| {
                stats
                    .iter()
                    .map(|(low, high)| {
                        let (low, high) = (
                            low.as_primitive::<Int64Type>(),
                            high.as_primitive::<Int64Type>(),
                        );
                        (i < low.len() && low.is_valid(i) && i < high.len() && high.is_valid(i))
                            .then(|| (low.value(i), high.value(i)))
                    })
                    .collect()
            });
            files.insert(
                file.path().into_owned(),
                LoggedFile {
                    path: file.object_store_path(),
                    size: u64::try_from(file.size()).unwrap_or(0),
                    deletion_vector: file.deletion_vector_descriptor().is_some(),
                    ranges,
                },
            );
        }
        let store = table.log_store().object_store(None);
        Ok(State {
            version,
            files: Arc::new(files),
            schema,
            mapped,
            text_decimals,
            store,
            table,
            url: url.clone(),
        })
    }

    fn listing(&self, columns: &'static [&'static str]) -> Listing {
        Listing {
            version: self.version,
            files: self.files.clone(),
            schema: self.schema.clone(),
            mapped: self.mapped,
            text_decimals: self.text_decimals.clone(),
            columns,
            store: self.store.clone(),
        }
    }

    /// Applies the commits after `version`, in order; an error says why the state must
    /// be loaded again (it may be partly applied then, and is dropped).
    async fn follow(&mut self, columns: &[&str]) -> Result<(), String> {
        let log = self.table.log_store();
        let mut ahead = 1;
        let mut applied = 0;
        loop {
            let reads = (1..=ahead).map(|i| log.read_commit_entry(self.version + i));
            let commits = futures::future::try_join_all(reads)
                .await
                .map_err(|e| format!("reading the log after version {}: {e}", self.version))?;
            for commit in commits {
                // Commits are written in order: a later one read while this one was not
                // there yet is read at the next look. Unless it was removed: maintenance
                // removes expired entries before the latest checkpoint, so a checkpoint
                // past this version means the commits after it are gone, not to come.
                let Some(bytes) = commit else {
                    if applied > 0 {
                        return Ok(());
                    }
                    return match crate::storage::last_checkpoint(self.store.as_ref()).await {
                        Some(c) if c > self.version => Err(format!(
                            "the log after version {} was removed (checkpoint at {c})",
                            self.version
                        )),
                        _ => Ok(()),
                    };
                };
                let next = self.version + 1;
                let actions =
                    deltalake::logstore::get_actions(next, &bytes).map_err(|e| e.to_string())?;
                apply(Arc::make_mut(&mut self.files), actions, columns)
                    .map_err(|why| format!("version {next} {why}"))?;
                self.version = next;
                applied += 1;
            }
            if applied > MAX_CATCH_UP {
                return Err(format!(
                    "more than {MAX_CATCH_UP} commits since the last look"
                ));
            }
            ahead = READ_AHEAD;
        }
    }
}

/// Applies one commit's actions to `files`; an error for an action it does not apply.
fn apply(
    files: &mut HashMap<String, LoggedFile>,
    actions: Vec<Action>,
    columns: &[&str],
) -> Result<(), &'static str> {
    for action in actions {
        match action {
            Action::Add(add) => {
                let (key, file) = logged(&add, columns);
                files.insert(key, file);
            }
            Action::Remove(remove) => {
                files.remove(
                    percent_decode_str(&remove.path)
                        .decode_utf8_lossy()
                        .as_ref(),
                );
            }
            Action::Metadata(_) => return Err("changes the table's metadata"),
            Action::Protocol(_) => return Err("changes the table's protocol"),
            Action::Cdc(_) => return Err("adds change data files"),
            Action::Txn(_) | Action::CommitInfo(_) | Action::DomainMetadata(_) => {}
        }
    }
    Ok(())
}

/// The entry of an `add` action: its key (the percent-decoded path) and file, with the
/// object store path delta-rs would read it at.
fn logged(add: &Add, columns: &[&str]) -> (String, LoggedFile) {
    let key = percent_decode_str(&add.path)
        .decode_utf8_lossy()
        .into_owned();
    let path = Path::parse(&key).unwrap_or_else(|_| Path::from(key.as_str()));
    let file = LoggedFile {
        path,
        size: u64::try_from(add.size).unwrap_or(0),
        deletion_vector: add.deletion_vector.is_some(),
        ranges: add.stats.as_deref().and_then(|s| ranges(s, columns)),
    };
    (key, file)
}

/// The smallest and largest value of each of `columns` in an `add` action's statistics
/// (JSON: `minValues`, `maxValues`); `None` when they lack one or are not JSON.
fn ranges(stats: &str, columns: &[&str]) -> Option<Vec<(i64, i64)>> {
    let stats: serde_json::Value = serde_json::from_str(stats).ok()?;
    let (low, high) = (stats.get("minValues")?, stats.get("maxValues")?);
    columns
        .iter()
        .map(|c| Some((low.get(*c)?.as_i64()?, high.get(*c)?.as_i64()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_give_ranges_only_when_every_column_has_both_ends() {
        let cols = &["p", "o"];
        let s = r#"{"numRecords":3,"minValues":{"p":0,"o":12,"x":"a"},"maxValues":{"p":2,"o":40},"nullCount":{}}"#;
        assert_eq!(ranges(s, cols), Some(vec![(0, 2), (12, 40)]));
        let no_max = r#"{"numRecords":3,"minValues":{"p":0,"o":12},"maxValues":{"p":2}}"#;
        assert_eq!(ranges(no_max, cols), None);
        assert_eq!(ranges(r#"{"numRecords":3}"#, cols), None);
        assert_eq!(ranges("not json", cols), None);
        let text = r#"{"minValues":{"p":"0","o":1},"maxValues":{"p":"2","o":2}}"#;
        assert_eq!(ranges(text, cols), None, "not integers");
    }
}
