//! The object store under the lake: `file://`, `s3://`, `gs://`, `az://` (and `abfss://`),
//! `memory://`.
//!
//! Every table handle is built by [`builder`], which gives delta-rs the storage options
//! registered for the lake root the table lives under ([`register`]); every listing,
//! existence check and removal of lake paths goes through [`store`] rather than
//! `std::fs`, so the same code runs on a local disk and on object storage.
//!
//! # Why commits are safe on object storage
//! A Delta commit is the creation of `_delta_log/<version>.json`: of two writers racing for
//! one version exactly one may create it. On a local filesystem delta-rs creates the file
//! with an atomic rename that fails when the target exists. On S3 it sends
//! `PUT` with `If-None-Match: *` (object_store's conditional put, on by default); AWS S3,
//! Cloudflare R2, MinIO and most current S3-compatible servers honour it, but a server
//! that ignores the header lets the second commit silently replace the first.
//! [`probe_conditional_put`] asks the store before a stage writes: it creates one object
//! twice with `If-None-Match: *` and requires the second attempt to be refused. GCS and
//! Azure have native preconditions and pass the same probe.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::SystemTime;

use deltalake::logstore::object_store::memory::InMemory;
use deltalake::logstore::object_store::{
    self, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use deltalake::{DeltaTableBuilder, DeltaTableError, Path};
use futures::{StreamExt, TryStreamExt};
use url::Url;

use crate::LakeError;

/// Storage options of one lake root (object_store / delta-rs keys such as
/// `aws_endpoint_url`, `aws_region`, `allow_http`). Values may be credentials: `Debug`
/// prints the keys only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StorageOptions(pub HashMap<String, String>);

impl std::fmt::Debug for StorageOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        f.debug_tuple("StorageOptions").field(&keys).finish()
    }
}

/// The schemes a lake root may use.
pub const SCHEMES: &[&str] = &["file", "s3", "s3a", "gs", "az", "abfs", "abfss", "memory"];

/// Lake roots and their options, longest root first. Process-wide because delta-rs builds
/// a table from its URL alone: every handle of a table under a root must see that root's
/// options, wherever in the code it is opened.
type Roots = RwLock<Vec<(String, Arc<StorageOptions>)>>;

fn registry() -> &'static Roots {
    static REGISTRY: OnceLock<Roots> = OnceLock::new();
    REGISTRY.get_or_init(|| RwLock::new(Vec::new()))
}

/// The one in-memory store of this process (`memory://` lakes): delta-rs would otherwise
/// give every handle a new, empty store.
fn memory() -> Arc<InMemory> {
    static MEMORY: OnceLock<Arc<InMemory>> = OnceLock::new();
    MEMORY.get_or_init(|| Arc::new(InMemory::new())).clone()
}

/// Records the options of the lake rooted at `root`; later calls for the same root
/// replace them.
pub(crate) fn register(root: &Url, options: StorageOptions) {
    let mut roots = registry().write().unwrap_or_else(|p| p.into_inner());
    roots.retain(|(r, _)| r != root.as_str());
    roots.push((root.to_string(), Arc::new(options)));
    roots.sort_by_key(|(r, _)| std::cmp::Reverse(r.len()));
}

fn options_for(url: &Url) -> Option<Arc<StorageOptions>> {
    let roots = registry().read().unwrap_or_else(|p| p.into_inner());
    roots
        .iter()
        .find(|(root, _)| url.as_str().starts_with(root.as_str()))
        .map(|(_, o)| o.clone())
}

/// A delta-rs builder for the table (or any lake path) at `url`, with its root's options.
pub(crate) fn builder(url: &Url) -> Result<DeltaTableBuilder, DeltaTableError> {
    let mut b = DeltaTableBuilder::from_url(url.clone())?;
    if url.scheme() == "memory" {
        let root = Url::parse("memory:///").map_err(|e| DeltaTableError::Generic(e.to_string()))?;
        b = b.with_storage_backend(memory(), root);
    }
    if let Some(options) = options_for(url) {
        b = b.with_storage_options(options.0.clone());
    }
    Ok(b)
}

/// The object store rooted at `url` (paths are relative to it).
pub(crate) fn store(url: &Url) -> Result<Arc<dyn ObjectStore>, DeltaTableError> {
    Ok(builder(url)?.build_storage()?.object_store(None))
}

fn failed(url: &Url) -> impl Fn(DeltaTableError) -> LakeError + '_ {
    move |e| LakeError::delta(&url.as_str())(e)
}

/// Whether a Delta table exists at `url` (its `_delta_log/` holds anything).
pub(crate) async fn table_exists(url: &Url) -> Result<bool, LakeError> {
    if url.scheme() == "file" {
        if let Ok(path) = url.to_file_path() {
            return Ok(path.join("_delta_log").is_dir());
        }
    }
    let store = store(url).map_err(failed(url))?;
    let log = Path::from("_delta_log");
    match store.list_with_delimiter(Some(&log)).await {
        Ok(listing) => Ok(!listing.objects.is_empty() || !listing.common_prefixes.is_empty()),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(failed(url)(e.into())),
    }
}

/// The names of the "directories" directly under `url`, sorted.
pub(crate) async fn list_dirs(url: &Url) -> Result<Vec<String>, LakeError> {
    let store = store(url).map_err(failed(url))?;
    let listing = match store.list_with_delimiter(None).await {
        Ok(l) => l,
        Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(failed(url)(e.into())),
    };
    let mut names: Vec<String> = listing
        .common_prefixes
        .iter()
        .filter_map(|p| p.filename().map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

/// Removes every object under `url` (a table and its log). Nothing there is not an error.
pub(crate) async fn remove_all(url: &Url) -> Result<(), LakeError> {
    if url.scheme() == "file" {
        if let Ok(path) = url.to_file_path() {
            return match std::fs::remove_dir_all(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(LakeError::Uri {
                    uri: url.to_string(),
                    reason: format!("cannot remove: {e}"),
                }),
            };
        }
    }
    let store = store(url).map_err(failed(url))?;
    let locations = store.list(None).map_ok(|m| m.location).boxed();
    let removed: Vec<Path> = store
        .delete_stream(locations)
        .try_collect()
        .await
        .map_err(|e| failed(url)(e.into()))?;
    tracing::debug!(url = %url, objects = removed.len(), "removed lake path");
    Ok(())
}

/// When the object at `path` under `url` was last written (`None` when it is missing or
/// the store cannot say).
pub(crate) async fn modified(url: &Url, path: &str) -> Option<SystemTime> {
    let store = store(url).ok()?;
    let meta = store.head(&Path::from(path)).await.ok()?;
    Some(meta.last_modified.into())
}

/// The version of the latest checkpoint of the table `store` is rooted at
/// (`_delta_log/_last_checkpoint`), if it can be read.
pub(crate) async fn last_checkpoint(store: &dyn ObjectStore) -> Option<u64> {
    let bytes = store
        .get(&Path::from("_delta_log/_last_checkpoint"))
        .await
        .ok()?
        .bytes()
        .await
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()?
        .get("version")?
        .as_u64()
}

/// Where a lake records the source that writes it, relative to the lake root.
pub const SOURCE_MARKER: &str = "_wal2delta/source.json";

/// The source recorded at `root` ([`SOURCE_MARKER`]), recording `ours` when none is: the
/// first Bronze writer of a lake claims it, and every later start compares. Created with
/// `If-None-Match: *`, so of two sources starting at once on an empty lake one claims it
/// and the other reads the claim. Returns the source found (`ours` once claimed).
pub async fn claim_source(root: &Url, ours: &str) -> Result<String, LakeError> {
    let store = store(root).map_err(failed(root))?;
    let path = Path::from(SOURCE_MARKER);
    let marker = format!("{}/{SOURCE_MARKER}", root.as_str().trim_end_matches('/'));
    for _ in 0..2 {
        match store.get(&path).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(|e| failed(root)(e.into()))?;
                let found = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("source")?.as_str().map(str::to_owned))
                    .ok_or_else(|| LakeError::Uri {
                        uri: marker.clone(),
                        reason: "unreadable source marker (not JSON with a \"source\" string); it records which source writes this lake: restore it, or remove it if this lake has one source only".into(),
                    })?;
                return Ok(found);
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(failed(root)(e.into())),
        }
        let body = serde_json::json!({
            "source": ours,
            "claimed_at_ms": SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        });
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match store
            .put_opts(
                &path,
                PutPayload::from(body.to_string().into_bytes()),
                create,
            )
            .await
        {
            Ok(_) => return Ok(ours.to_owned()),
            // Another source claimed it meanwhile: read its claim.
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            Err(e) => return Err(failed(root)(e.into())),
        }
    }
    // Created and gone again between two looks: transient, the stage tries again.
    Err(failed(root)(DeltaTableError::Generic(format!(
        "{marker}: the lake's source marker was created and removed meanwhile"
    ))))
}

/// Whether the store under `root` refuses to create an object that exists
/// (`If-None-Match: *`), the guarantee concurrent Delta commits rest on (module docs).
/// Writes and removes one probe object under `_wal2delta/`.
pub async fn probe_conditional_put(root: &Url) -> Result<bool, LakeError> {
    if matches!(root.scheme(), "file" | "memory") {
        // delta-rs commits on these with an atomic rename / an in-process lock.
        return Ok(true);
    }
    let store = store(root).map_err(failed(root))?;
    let name = format!(
        "_wal2delta/commit-probe/{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let path = Path::from(name);
    let create = || PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    let first = store
        .put_opts(&path, PutPayload::from_static(b"probe"), create())
        .await;
    if let Err(e) = first {
        return Err(failed(root)(e.into()));
    }
    let second = store
        .put_opts(&path, PutPayload::from_static(b"again"), create())
        .await;
    let _ = store.delete(&path).await;
    match second {
        Err(object_store::Error::AlreadyExists { .. }) => Ok(true),
        Ok(_) => Ok(false),
        // The store refused the header itself (e.g. 501 Not Implemented).
        Err(object_store::Error::NotImplemented { .. })
        | Err(object_store::Error::NotSupported { .. }) => Ok(false),
        Err(e) => Err(failed(root)(e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_source_claims_a_lake_and_another_is_refused() {
        let dir = std::env::temp_dir().join(format!("w2d-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for uri in [
            format!("file://{}/", dir.display()),
            "memory:///claim-test/".to_owned(),
        ] {
            let lake = crate::Lake::new(&uri).unwrap();
            lake.claim_source("app/wal2delta").await.unwrap();
            // Again, as every start does: the same source passes.
            lake.claim_source("app/wal2delta").await.unwrap();
            let e = lake.claim_source("billing/wal2delta").await.unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, LakeError::Source { .. })
                    && text.contains("app/wal2delta")
                    && text.contains("billing/wal2delta"),
                "{uri}: {text}"
            );
            assert_eq!(
                claim_source(lake.root(), "other").await.unwrap(),
                "app/wal2delta"
            );
        }
        // A marker that cannot be read is named, not taken as a claim.
        std::fs::write(dir.join(SOURCE_MARKER), b"garbage").unwrap();
        let lake = crate::Lake::new(&format!("file://{}/", dir.display())).unwrap();
        let text = lake
            .claim_source("app/wal2delta")
            .await
            .unwrap_err()
            .to_string();
        assert!(text.contains("source marker"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn memory_lakes_share_one_store_and_list_their_directories() {
        let root = Url::parse("memory:///lake-a/").unwrap();
        register(&root, StorageOptions::default());
        let a = store(&root.join("bronze/public/t/").unwrap()).unwrap();
        a.put(
            &Path::from("_delta_log/0.json"),
            PutPayload::from_static(b"{}"),
        )
        .await
        .unwrap();
        // A second handle sees what the first wrote.
        assert!(table_exists(&root.join("bronze/public/t/").unwrap())
            .await
            .unwrap());
        assert!(!table_exists(&root.join("bronze/public/u/").unwrap())
            .await
            .unwrap());
        assert_eq!(
            list_dirs(&root.join("bronze/").unwrap()).await.unwrap(),
            vec!["public".to_owned()]
        );
        remove_all(&root.join("bronze/").unwrap()).await.unwrap();
        assert!(list_dirs(&root.join("bronze/").unwrap())
            .await
            .unwrap()
            .is_empty());
        assert!(probe_conditional_put(&root).await.unwrap());
    }

    #[test]
    fn options_follow_the_longest_root_and_never_print_values() {
        let a = Url::parse("s3://bucket/lake/").unwrap();
        let b = Url::parse("s3://bucket/lake/nested/").unwrap();
        let opts = |v: &str| StorageOptions(HashMap::from([("aws_region".into(), v.into())]));
        register(&a, opts("one"));
        register(&b, opts("two"));
        let got = options_for(&Url::parse("s3://bucket/lake/nested/silver/t/").unwrap());
        assert_eq!(got.unwrap().0["aws_region"], "two");
        let got = options_for(&Url::parse("s3://bucket/lake/silver/t/").unwrap());
        assert_eq!(got.unwrap().0["aws_region"], "one");
        assert!(options_for(&Url::parse("s3://other/").unwrap()).is_none());
        let secret = StorageOptions(HashMap::from([(
            "aws_secret_access_key".into(),
            "s3cr3t-value".into(),
        )]));
        assert!(!format!("{secret:?}").contains("s3cr3t"));
    }
}
