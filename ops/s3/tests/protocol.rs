//! The development server as delta-rs sees it: object_store's S3 client against a server
//! on a free port. What the Delta commit protocol and the lake rely on: create-only writes
//! that exactly one of many racing writers wins, updates that need the current ETag, long
//! and non-ASCII keys, listings by prefix and delimiter across pages, ranged reads,
//! multipart uploads, deletes that leave nothing behind.

use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use wal2delta_dev_s3::DirStore;

struct Server {
    root: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

async fn server() -> (Server, Arc<AmazonS3>) {
    let root = std::env::temp_dir().join(format!("dev-s3-proto-{:x}", rand::random::<u64>()));
    std::fs::create_dir_all(root.join("lake")).unwrap();
    let store = DirStore::open(&root, false).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(wal2delta_dev_s3::serve(
        listener,
        store,
        "dev".into(),
        "dev-secret".into(),
        async {
            let _ = rx.await;
        },
    ));
    let client = AmazonS3Builder::new()
        .with_endpoint(format!("http://{addr}"))
        .with_allow_http(true)
        .with_bucket_name("lake")
        .with_region("us-east-1")
        .with_access_key_id("dev")
        .with_secret_access_key("dev-secret")
        .build()
        .unwrap();
    (
        Server {
            root,
            stop: Some(tx),
        },
        Arc::new(client),
    )
}

fn create() -> PutOptions {
    PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_racing_create_only_writers_wins() {
    let (_server, s3) = server().await;
    for version in 0..5 {
        let path = Path::from(format!("t/_delta_log/{version:020}.json"));
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let s3 = s3.clone();
                let path = path.clone();
                tokio::spawn(async move {
                    s3.put_opts(&path, PutPayload::from(format!("writer {i}")), create())
                        .await
                        .map(|_| i)
                })
            })
            .collect();
        let mut won = Vec::new();
        for r in racers {
            match r.await.unwrap() {
                Ok(i) => won.push(i),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => panic!("a losing writer must be told the object exists: {e}"),
            }
        }
        assert_eq!(won.len(), 1, "version {version}: winners {won:?}");
        let body = s3.get(&path).await.unwrap().bytes().await.unwrap();
        assert_eq!(body, Bytes::from(format!("writer {}", won[0])));
    }
}

#[tokio::test]
async fn an_update_needs_the_current_etag() {
    let (_server, s3) = server().await;
    let path = Path::from("t/_last_checkpoint");
    let first = s3.put(&path, PutPayload::from_static(b"1")).await.unwrap();
    let update = |e: &Option<String>| PutOptions {
        mode: PutMode::Update(UpdateVersion {
            e_tag: e.clone(),
            version: None,
        }),
        ..Default::default()
    };
    let second = s3
        .put_opts(&path, PutPayload::from_static(b"2"), update(&first.e_tag))
        .await
        .unwrap();
    assert_ne!(first.e_tag, second.e_tag, "every write gives a new ETag");
    let stale = s3
        .put_opts(&path, PutPayload::from_static(b"3"), update(&first.e_tag))
        .await;
    assert!(
        matches!(stale, Err(object_store::Error::Precondition { .. })),
        "{stale:?}"
    );
    let body = s3.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(body, Bytes::from_static(b"2"));
}

#[tokio::test]
async fn long_non_ascii_keys_list_read_and_delete() {
    let (server, s3) = server().await;
    // 63-byte identifiers escaped three bytes per byte, under a deep prefix: far past the
    // ~160 bytes s3s-fs could hold, within S3's 1,024.
    let table = "-c3-89".repeat(31);
    let dir = format!("tenant/prod/lake/bronze/{table}/{table}");
    let names: Vec<String> = (0..2500)
        .map(|i| format!("{dir}/ingest_date=2026-12-03/part-{i:05}-é.parquet"))
        .collect();
    assert!(names[0].len() > 400);
    futures::stream::iter(names.iter().cloned())
        .map(|n| {
            let s3 = s3.clone();
            async move { s3.put(&Path::from(n), PutPayload::from_static(b"x")).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    s3.put(
        &Path::from(format!("{dir}/_delta_log/00000000000000000000.json")),
        PutPayload::from_static(b"{}"),
    )
    .await
    .unwrap();

    // Every key once, across the 1,000-key pages, in order.
    let mut listed: Vec<Path> = s3
        .list(Some(&Path::from(dir.as_str())))
        .map_ok(|m| m.location)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), 2501);
    let sorted = {
        let mut v = listed.clone();
        v.sort();
        v
    };
    assert_eq!(listed, sorted);
    listed.dedup();
    assert_eq!(listed.len(), 2501);

    let by_dir = s3
        .list_with_delimiter(Some(&Path::from(dir.as_str())))
        .await
        .unwrap();
    let mut prefixes: Vec<String> = by_dir
        .common_prefixes
        .iter()
        .map(|p| p.to_string())
        .collect();
    prefixes.sort();
    assert_eq!(
        prefixes,
        [
            format!("{dir}/_delta_log"),
            format!("{dir}/ingest_date=2026-12-03")
        ]
    );
    assert!(by_dir.objects.is_empty());

    // Delete them all: nothing listed, no directory left on disk.
    let paths = futures::stream::iter(listed.into_iter().map(Ok)).boxed();
    s3.delete_stream(paths)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    assert_eq!(s3.list(None).count().await, 0);
    assert_eq!(
        std::fs::read_dir(server.root.join("lake")).unwrap().count(),
        0
    );
}

#[tokio::test]
async fn ranged_reads_and_multipart_uploads() {
    let (_server, s3) = server().await;
    let path = Path::from("t/part-00000.parquet");
    // Two full 5 MiB parts and a short last one, as a large Silver file is written.
    let data: Vec<u8> = (0..(11 << 20)).map(|i: u32| (i % 251) as u8).collect();
    let mut upload = s3.put_multipart(&path).await.unwrap();
    for chunk in data.chunks(5 << 20) {
        upload
            .put_part(PutPayload::from(Bytes::copy_from_slice(chunk)))
            .await
            .unwrap();
    }
    upload.complete().await.unwrap();
    let whole = s3.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(whole.len(), data.len());
    assert!(whole == data[..]);
    let footer = s3
        .get_range(&path, (data.len() as u64 - 8)..data.len() as u64)
        .await
        .unwrap();
    assert_eq!(footer, data[data.len() - 8..]);
    let meta = s3.head(&path).await.unwrap();
    assert_eq!(meta.size, data.len() as u64);
    // An aborted upload leaves no object.
    let other = Path::from("t/aborted.parquet");
    let mut upload = s3.put_multipart(&other).await.unwrap();
    upload
        .put_part(PutPayload::from_static(b"half"))
        .await
        .unwrap();
    upload.abort().await.unwrap();
    assert!(matches!(
        s3.head(&other).await,
        Err(object_store::Error::NotFound { .. })
    ));
}
