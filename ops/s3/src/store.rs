//! Objects as files: object `key` of `bucket` is the file `<root>/<bucket>/<key>`, a `/` in
//! the key a directory. Nothing else is stored per object: no side file of metadata whose
//! name grows with the key (s3s-fs, which this server used before, keeps one in the root
//! named after the base64 of bucket and key, so any key longer than about 160 bytes failed
//! with a 500: a Bronze file of a table with a long or non-ASCII name did).
//!
//! **ETags** are `<inode>-<mtime ns>-<size>` of the file. Every write lands by renaming a
//! new file into place, so every write gives a new inode and a new ETag: what `If-Match`
//! and readers that pin a version need. They are not MD5 sums; no client here needs one.
//!
//! **Conditional writes** are atomic: the body is received into a temporary file first
//! (concurrently), then the precondition check and the rename run under one lock
//! ([`DirStore::commit`]). The Delta commit protocol on S3 rests on this: of two writers
//! racing with `PUT _delta_log/<version>.json` and `If-None-Match: *` exactly one may
//! succeed, the other must get 412 and retry on the next version.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use futures::StreamExt;
use s3s::dto::{ETag, ETagCondition, StreamingBlob};
use s3s::{s3_error, S3Result};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

/// The longest key S3 accepts, in bytes.
const MAX_KEY_BYTES: usize = 1024;
/// The longest file name the filesystem takes: one segment of a key between `/`s.
const MAX_SEGMENT_BYTES: usize = 255;

/// The directory holding the buckets.
pub struct DirStore {
    root: PathBuf,
    tmp: PathBuf,
    uploads: PathBuf,
    commits: Mutex<()>,
    ignore_preconditions: bool,
}

/// What a reader learns of one object.
#[derive(Debug, Clone)]
pub struct Meta {
    pub size: u64,
    pub modified: SystemTime,
    pub etag: String,
}

impl Meta {
    pub fn of(md: &std::fs::Metadata) -> Meta {
        let ns = md
            .mtime()
            .wrapping_mul(1_000_000_000)
            .wrapping_add(md.mtime_nsec());
        Meta {
            size: md.len(),
            modified: md.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            etag: format!("{:x}-{:x}-{:x}", md.ino(), ns, md.len()),
        }
    }

    pub fn e_tag(&self) -> ETag {
        ETag::Strong(self.etag.clone())
    }
}

/// A received body not yet in place; removed when dropped uncommitted.
pub struct TempFile {
    path: PathBuf,
    committed: bool,
}

impl TempFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file was moved into place by the caller: do not remove it.
    pub fn forget(mut self) {
        self.committed = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The conditions of a write (`If-None-Match`, `If-Match`).
#[derive(Debug, Default)]
pub struct Precondition {
    pub if_none_match: Option<ETagCondition>,
    pub if_match: Option<ETagCondition>,
}

impl DirStore {
    /// Opens (creating) the root. `ignore_preconditions` drops `If-None-Match` and
    /// `If-Match` from writes, as old S3-compatible servers do: what the tests use to check
    /// that wal2delta refuses such a store.
    pub fn open(root: &Path, ignore_preconditions: bool) -> io::Result<DirStore> {
        let tmp = root.join(".tmp");
        let uploads = root.join(".uploads");
        // Bodies half-received when the server last stopped.
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        std::fs::create_dir_all(&uploads)?;
        Ok(DirStore {
            root: root.to_path_buf(),
            tmp,
            uploads,
            commits: Mutex::new(()),
            ignore_preconditions,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn uploads(&self) -> &Path {
        &self.uploads
    }

    /// The directory of a bucket (which may not exist). Names follow S3's rules, so none
    /// can reach outside the root or into the server's own `.tmp` and `.uploads`.
    pub fn bucket_dir(&self, bucket: &str) -> S3Result<PathBuf> {
        let ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && !bucket.starts_with(['.', '-'])
            && !bucket.contains("..");
        if !ok {
            return Err(s3_error!(InvalidBucketName, "invalid bucket name"));
        }
        Ok(self.root.join(bucket))
    }

    /// The bucket's directory, or `NoSuchBucket`.
    pub fn existing_bucket(&self, bucket: &str) -> S3Result<PathBuf> {
        let dir = self.bucket_dir(bucket)?;
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(s3_error!(NoSuchBucket))
        }
    }

    /// The file of an object. Keys this store cannot hold as a path are refused by name
    /// rather than stored somewhere else: empty segments (`a//b`, a trailing `/`), `.` and
    /// `..`, NUL, a segment over 255 bytes.
    pub fn object_path(&self, bucket: &str, key: &str) -> S3Result<PathBuf> {
        let dir = self.existing_bucket(bucket)?;
        if key.len() > MAX_KEY_BYTES {
            return Err(s3_error!(KeyTooLongError));
        }
        for segment in key.split('/') {
            if segment.is_empty() || segment == "." || segment == ".." || segment.contains('\0') {
                return Err(s3_error!(
                    InvalidArgument,
                    "this development server stores keys as paths: no empty, `.` or `..` segment"
                ));
            }
            if segment.len() > MAX_SEGMENT_BYTES {
                return Err(s3_error!(
                    KeyTooLongError,
                    "a key segment between `/`s is longer than 255 bytes"
                ));
            }
        }
        Ok(dir.join(key))
    }

    /// The object's metadata, `None` when it does not exist.
    pub async fn meta(&self, path: &Path) -> S3Result<Option<Meta>> {
        match tokio::fs::metadata(path).await {
            Ok(md) if md.is_file() => Ok(Some(Meta::of(&md))),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => Ok(None),
            Err(e) => Err(s3_error!(e, InternalError)),
        }
    }

    /// Receives a request body into a temporary file.
    pub async fn receive(&self, body: Option<StreamingBlob>) -> S3Result<TempFile> {
        let tmp = self.temp_file();
        let mut file = tokio::fs::File::create(&tmp.path)
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        if let Some(mut body) = body {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "body: {e}"))?;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| s3_error!(e, InternalError))?;
            }
        }
        file.flush()
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        Ok(tmp)
    }

    /// A fresh temporary file name (not created).
    pub fn temp_file(&self) -> TempFile {
        TempFile {
            path: self.tmp.join(format!("{:032x}", rand::random::<u128>())),
            committed: false,
        }
    }

    /// Appends the file `src` to the temporary file (a multipart upload's parts are
    /// concatenated this way).
    pub async fn append(&self, tmp: &TempFile, src: &Path) -> S3Result<()> {
        let mut from = tokio::fs::File::open(src)
            .await
            .map_err(|e| s3_error!(e, InvalidPart))?;
        let mut to = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&tmp.path)
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        tokio::io::copy(&mut from, &mut to)
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        Ok(())
    }

    /// Puts a received body in place at `dest` if `cond` holds: the check and the rename
    /// run under the one lock every change takes, so no other change can come between.
    pub async fn commit(
        &self,
        mut tmp: TempFile,
        dest: &Path,
        cond: Precondition,
    ) -> S3Result<Meta> {
        let _one = self.commits.lock().await;
        if !self.ignore_preconditions {
            let current = self.meta(dest).await?;
            check_write(current.as_ref(), &cond)?;
        }
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| path_conflict(e, "a parent of the key is an object"))?;
        }
        tokio::fs::rename(&tmp.path, dest)
            .await
            .map_err(|e| path_conflict(e, "the key is a prefix of other objects"))?;
        tmp.committed = true;
        self.meta(dest)
            .await?
            .ok_or_else(|| s3_error!(InternalError, "object vanished after its write"))
    }

    /// Removes an object (absent is fine, as on S3) and the directories it leaves empty.
    pub async fn remove(&self, bucket_dir: &Path, path: &Path) -> S3Result<()> {
        let _one = self.commits.lock().await;
        match tokio::fs::remove_file(path).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::IsADirectory => return Ok(()),
            Err(e) => return Err(s3_error!(e, InternalError)),
        }
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == bucket_dir || !d.starts_with(bucket_dir) {
                break;
            }
            // Fails (and stops) at the first directory that still holds something.
            if tokio::fs::remove_dir(d).await.is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    /// Creates a bucket's directory.
    pub async fn create_bucket(&self, dir: &Path) -> S3Result<()> {
        let _one = self.commits.lock().await;
        if dir.is_dir() {
            return Err(s3_error!(BucketAlreadyOwnedByYou));
        }
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| s3_error!(e, InternalError))
    }

    /// Removes an empty bucket.
    pub async fn delete_bucket(&self, dir: &Path) -> S3Result<()> {
        let _one = self.commits.lock().await;
        tokio::fs::remove_dir(dir)
            .await
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => s3_error!(NoSuchBucket),
                _ => s3_error!(BucketNotEmpty),
            })
    }
}

/// A write's precondition against the object as it is (`None`: absent).
fn check_write(current: Option<&Meta>, cond: &Precondition) -> S3Result<()> {
    match (&cond.if_none_match, current) {
        (Some(ETagCondition::Any), Some(_)) => {
            return Err(s3_error!(PreconditionFailed, "Object already exists"))
        }
        (Some(ETagCondition::ETag(e)), Some(m)) if e.value() == m.etag => {
            return Err(s3_error!(PreconditionFailed, "ETag matches"))
        }
        _ => {}
    }
    match (&cond.if_match, current) {
        (Some(_), None) => Err(s3_error!(NoSuchKey)),
        (Some(ETagCondition::ETag(e)), Some(m)) if e.value() != m.etag => {
            Err(s3_error!(PreconditionFailed, "ETag does not match"))
        }
        _ => Ok(()),
    }
}

/// A read's preconditions: `If-Match` failing is 412, `If-None-Match` matching is 304.
pub fn check_read(
    meta: &Meta,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    if let Some(ETagCondition::ETag(e)) = if_match {
        if e.value() != meta.etag {
            return Err(s3_error!(PreconditionFailed));
        }
    }
    match if_none_match {
        Some(ETagCondition::Any) => Err(s3_error!(NotModified)),
        Some(ETagCondition::ETag(e)) if e.value() == meta.etag => Err(s3_error!(NotModified)),
        _ => Ok(()),
    }
}

/// A path that is a file where a directory is needed, or the reverse: S3 allows keys
/// `a` and `a/b` side by side, a filesystem does not.
fn path_conflict(e: io::Error, what: &str) -> s3s::S3Error {
    match e.kind() {
        io::ErrorKind::NotADirectory
        | io::ErrorKind::IsADirectory
        | io::ErrorKind::AlreadyExists => {
            s3_error!(
                InvalidRequest,
                "this development server stores keys as paths and {what}"
            )
        }
        _ => s3_error!(e, InternalError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(etag: &str) -> Meta {
        Meta {
            size: 1,
            modified: SystemTime::UNIX_EPOCH,
            etag: etag.into(),
        }
    }

    fn tag(v: &str) -> ETagCondition {
        ETagCondition::ETag(ETag::Strong(v.into()))
    }

    #[test]
    fn create_only_refuses_an_existing_object() {
        let create = Precondition {
            if_none_match: Some(ETagCondition::Any),
            if_match: None,
        };
        assert!(check_write(None, &create).is_ok());
        assert!(check_write(Some(&meta("a")), &create).is_err());
    }

    #[test]
    fn update_needs_the_current_etag() {
        let update = Precondition {
            if_none_match: None,
            if_match: Some(tag("a")),
        };
        assert!(check_write(Some(&meta("a")), &update).is_ok());
        assert!(check_write(Some(&meta("b")), &update).is_err());
        assert!(check_write(None, &update).is_err());
        assert!(check_write(Some(&meta("b")), &Precondition::default()).is_ok());
    }

    #[test]
    fn reads_check_if_match_and_if_none_match() {
        let m = meta("a");
        assert!(check_read(&m, Some(&tag("a")), None).is_ok());
        assert!(check_read(&m, Some(&tag("b")), None).is_err());
        assert!(check_read(&m, None, Some(&tag("a"))).is_err());
        assert!(check_read(&m, None, Some(&tag("b"))).is_ok());
    }

    #[test]
    fn keys_that_cannot_be_paths_are_refused() {
        let root = std::env::temp_dir().join(format!("dev-s3-{:x}", rand::random::<u64>()));
        let store = DirStore::open(&root, false).unwrap();
        std::fs::create_dir_all(root.join("lake")).unwrap();
        let long_ok = format!("{}/{}", "x".repeat(255), "y".repeat(255));
        assert!(store.object_path("lake", &long_ok).is_ok());
        for bad in [
            "a//b",
            "a/",
            "../x",
            "a/./b",
            &"z".repeat(256),
            &"q/".repeat(600),
        ] {
            assert!(store.object_path("lake", bad).is_err(), "{bad:?}");
        }
        assert!(store.object_path("nope", "a").is_err());
        assert!(store.bucket_dir(".tmp").is_err());
        assert!(store.bucket_dir("../x").is_err());
        let _ = std::fs::remove_dir_all(root);
    }
}
