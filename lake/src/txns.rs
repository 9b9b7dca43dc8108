//! The versions of applications' `txn` actions in a table, kept up to date from the
//! commits a process sees instead of replaying the log for every lookup.
//!
//! delta-rs answers "the last version of app id X" by replaying the table's log segment
//! (every JSON commit since the last checkpoint, and the checkpoint) on every call. Bronze
//! asks it for each partition before each commit, Silver and the rules for their progress
//! every round: with commits a few times a second, `perf` on Bronze in the low-latency
//! setting showed those replays (JSON decoding, schema conversions, the allocator behind
//! them) among its costs. So each table's answers are kept in memory, and when the table
//! has moved on, only the commits since are read and their `txn` actions applied. (In
//! the whole chain at 250 ms batches Bronze's CPU per change stayed within the runs'
//! spread, 70 before and 69 after: docs/benchmarks.md.)
//!
//! Invariant: an answer is given for version `v` of a table only when it was read from
//! that table at `v` (an answer from a full replay) or derived from such an answer and
//! the commit files after it, in order. A table replaced at the same location (a new
//! table whose versions restart) is told apart by the modification time of the commit
//! file the answers were read at; when that commit is no longer in the loaded log
//! segment (a checkpoint since), when the commits to read are many, or when one cannot
//! be read, the answers are dropped and rebuilt by replay.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use deltalake::{DeltaTable, DeltaTableError};

/// More commits than this since the answers were read: replaying the log is cheaper than
/// reading them one by one (delta-rs checkpoints every 100 commits).
const MAX_CATCH_UP: u64 = 100;

/// The answers for one table, as of one version.
#[derive(Clone)]
struct Known {
    version: u64,
    /// The modification time of commit `version`'s file: identifies the table.
    stamp: i64,
    apps: HashMap<String, Option<i64>>,
}

/// Per table URI.
static KNOWN: LazyLock<Mutex<HashMap<String, Known>>> = LazyLock::new(Default::default);

fn known() -> std::sync::MutexGuard<'static, HashMap<String, Known>> {
    KNOWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// The version of `app_id`'s last `txn` action in the loaded state of `table`.
pub(crate) async fn version(
    table: &DeltaTable,
    app_id: &str,
) -> Result<Option<i64>, DeltaTableError> {
    let state = table.snapshot()?;
    let v = state.version();
    let Some(stamp) = state.version_timestamp(v) else {
        return replay(table, app_id).await;
    };
    let key = table.table_url().to_string();
    let cached = known().get(&key).cloned();
    let current = match cached {
        Some(k) if k.version == v && k.stamp == stamp => Some(k),
        Some(k) if k.version < v && v - k.version <= MAX_CATCH_UP => {
            // The answers must have been read from this table: its commit at their
            // version is still in the loaded segment with the same file time.
            if state.version_timestamp(k.version) == Some(k.stamp) {
                catch_up(table, k, v, stamp).await
            } else {
                None
            }
        }
        // Older than the answers (another handle is ahead), or too far behind.
        Some(k) if k.version > v => return replay(table, app_id).await,
        _ => None,
    };
    let mut current = current.unwrap_or(Known {
        version: v,
        stamp,
        apps: HashMap::new(),
    });
    let answer = match current.apps.get(app_id) {
        Some(a) => *a,
        None => {
            let a = replay(table, app_id).await?;
            current.apps.insert(app_id.to_owned(), a);
            a
        }
    };
    let mut all = known();
    match all.get(&key) {
        Some(k) if k.version > current.version => {}
        _ => {
            all.insert(key, current);
        }
    }
    Ok(answer)
}

/// The answers `k` moved on to version `v` by the `txn` actions of the commits after it;
/// `None` if one of them cannot be read.
async fn catch_up(table: &DeltaTable, mut k: Known, v: u64, stamp: i64) -> Option<Known> {
    let store = table.log_store();
    for version in k.version + 1..=v {
        let bytes = store.read_commit_entry(version).await.ok()??;
        for (app, txn) in txn_actions(&bytes)? {
            k.apps.insert(app, Some(txn));
        }
    }
    k.version = v;
    k.stamp = stamp;
    Some(k)
}

/// The `txn` actions of one commit file (newline-delimited JSON actions); `None` if it
/// is not that.
fn txn_actions(commit: &[u8]) -> Option<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for line in commit.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // Only lines naming a txn action need parsing.
        if !line.windows(6).any(|w| w == b"\"txn\":") {
            continue;
        }
        let action: serde_json::Value = serde_json::from_slice(line).ok()?;
        if let Some(txn) = action.get("txn") {
            let app = txn.get("appId")?.as_str()?.to_owned();
            out.push((app, txn.get("version")?.as_i64()?));
        }
    }
    Some(out)
}

async fn replay(table: &DeltaTable, app_id: &str) -> Result<Option<i64>, DeltaTableError> {
    table
        .snapshot()?
        .snapshot()
        .transaction_version(table.log_store().as_ref(), app_id)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use deltalake::arrow::array::{Int64Array, RecordBatch};
    use deltalake::arrow::datatypes::{DataType, Field, Schema};
    use deltalake::kernel::Transaction;
    use url::Url;

    async fn commit(table: DeltaTable, txns: &[(&str, i64)]) -> DeltaTable {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1]))]).unwrap();
        let txns = txns
            .iter()
            .map(|(a, v)| Transaction::new(*a, *v))
            .collect::<Vec<_>>();
        table
            .write(vec![batch])
            .with_commit_properties(
                crate::delta::commit_properties().with_application_transactions(txns),
            )
            .await
            .unwrap()
    }

    /// Every answer equals a full replay's, whatever moved the table: its own commits,
    /// another writer's, an older handle, a table replaced at the same location.
    #[tokio::test]
    async fn answers_equal_a_replay_of_the_log() {
        let dir = std::env::temp_dir().join(format!("w2d-txns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let url = Url::from_directory_path(&dir).unwrap();
        let check = |t: &DeltaTable, app: &'static str, expected: Option<i64>| {
            let t = t.clone();
            async move {
                assert_eq!(version(&t, app).await.unwrap(), expected, "{app}");
                assert_eq!(replay(&t, app).await.unwrap(), expected, "{app} (replay)");
            }
        };
        let mut t = commit(crate::delta::handle("t", &url).unwrap(), &[("a", 1)]).await;
        check(&t, "a", Some(1)).await;
        check(&t, "b", None).await;
        // Its own commits: read from the commits since.
        t = commit(t, &[("a", 2), ("b", 5)]).await;
        t = commit(t, &[]).await;
        check(&t, "a", Some(2)).await;
        check(&t, "b", Some(5)).await;
        // Another writer's commit, seen after a refresh.
        let other = crate::delta::open("t", &url).await.unwrap().unwrap();
        commit(other, &[("a", 3)]).await;
        t.update_state().await.unwrap();
        check(&t, "a", Some(3)).await;
        // A handle at an older version.
        let mut old = crate::delta::handle("t", &url).unwrap();
        old.load_version(1).await.unwrap();
        check(&old, "a", Some(2)).await;
        check(&t, "b", Some(5)).await;
        // The table replaced by a new one whose versions pass the answers' version.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let mut fresh = commit(crate::delta::handle("t", &url).unwrap(), &[("a", 7)]).await;
        for _ in 0..4 {
            fresh = commit(fresh, &[]).await;
        }
        check(&fresh, "b", None).await;
        check(&fresh, "a", Some(7)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn txn_actions_are_read_from_a_commit() {
        let commit = br#"{"commitInfo":{"timestamp":1,"operationParameters":{"note":"\"txn\": in a string"}}}
{"txn":{"appId":"wal2delta-bronze/t/0","version":41,"lastUpdated":5}}
{"add":{"path":"a.parquet","size":1}}
{"txn":{"appId":"wal2delta-bronze/t/1","version":-1}}
"#;
        assert_eq!(
            txn_actions(commit),
            Some(vec![
                ("wal2delta-bronze/t/0".to_owned(), 41),
                ("wal2delta-bronze/t/1".to_owned(), -1)
            ])
        );
        assert_eq!(txn_actions(b"{\"txn\": nonsense"), None);
        assert_eq!(txn_actions(b"\n"), Some(vec![]));
    }
}
