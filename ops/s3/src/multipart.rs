//! Multipart uploads: each upload is a directory `<root>/.uploads/<id>/` holding the file
//! `target` (bucket and key, one per line) and one file per part (`part-<n>`). Completing
//! concatenates the listed parts into a temporary file and commits it like a single PUT,
//! with the same atomic preconditions.

use std::path::PathBuf;

use s3s::dto::{CompletedPart, StreamingBlob};
use s3s::{s3_error, S3Result};

use crate::store::{DirStore, Meta, Precondition};

/// S3's part numbers.
const PARTS: std::ops::RangeInclusive<i32> = 1..=10_000;

impl DirStore {
    /// Starts an upload to `bucket`/`key`; its id.
    pub async fn create_upload(&self, bucket: &str, key: &str) -> S3Result<String> {
        self.object_path(bucket, key)?;
        let id = format!("{:032x}", rand::random::<u128>());
        let dir = self.uploads().join(&id);
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        tokio::fs::write(dir.join("target"), format!("{bucket}\n{key}"))
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        Ok(id)
    }

    /// The directory of an upload to `bucket`/`key`, or `NoSuchUpload`.
    async fn upload_dir(&self, id: &str, bucket: &str, key: &str) -> S3Result<PathBuf> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(s3_error!(NoSuchUpload));
        }
        let dir = self.uploads().join(id);
        let target = tokio::fs::read_to_string(dir.join("target"))
            .await
            .map_err(|_| s3_error!(NoSuchUpload))?;
        if target != format!("{bucket}\n{key}") {
            return Err(s3_error!(NoSuchUpload));
        }
        Ok(dir)
    }

    /// Stores one part (a part sent again replaces the earlier one).
    pub async fn upload_part(
        &self,
        id: &str,
        bucket: &str,
        key: &str,
        number: i32,
        body: Option<StreamingBlob>,
    ) -> S3Result<Meta> {
        if !PARTS.contains(&number) {
            return Err(s3_error!(InvalidArgument, "part number must be 1 to 10000"));
        }
        let dir = self.upload_dir(id, bucket, key).await?;
        let tmp = self.receive(body).await?;
        let part = dir.join(format!("part-{number:05}"));
        tokio::fs::rename(tmp.path(), &part)
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        tmp.forget();
        self.meta(&part)
            .await?
            .ok_or_else(|| s3_error!(InternalError, "part vanished after its write"))
    }

    /// Joins the listed parts (ascending, each as uploaded: its ETag must match) into the
    /// object, if `cond` holds; the upload is gone afterwards.
    pub async fn complete_upload(
        &self,
        id: &str,
        bucket: &str,
        key: &str,
        parts: &[CompletedPart],
        cond: Precondition,
    ) -> S3Result<Meta> {
        let dir = self.upload_dir(id, bucket, key).await?;
        let dest = self.object_path(bucket, key)?;
        if parts.is_empty() {
            return Err(s3_error!(MalformedXML, "no parts listed"));
        }
        let joined = self.temp_file();
        tokio::fs::File::create(joined.path())
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        let mut previous = 0;
        for part in parts {
            let number = part.part_number.unwrap_or(0);
            if number <= previous {
                return Err(s3_error!(InvalidPartOrder));
            }
            previous = number;
            let path = dir.join(format!("part-{number:05}"));
            let meta = self
                .meta(&path)
                .await?
                .ok_or_else(|| s3_error!(InvalidPart))?;
            if part.e_tag.as_ref().is_some_and(|e| e.value() != meta.etag) {
                return Err(s3_error!(
                    InvalidPart,
                    "part {number} was uploaded again since"
                ));
            }
            self.append(&joined, &path).await?;
        }
        let meta = self.commit(joined, &dest, cond).await?;
        let _ = tokio::fs::remove_dir_all(&dir).await;
        Ok(meta)
    }

    /// Drops an upload and its parts.
    pub async fn abort_upload(&self, id: &str, bucket: &str, key: &str) -> S3Result<()> {
        let dir = self.upload_dir(id, bucket, key).await?;
        tokio::fs::remove_dir_all(&dir)
            .await
            .map_err(|e| s3_error!(e, InternalError))
    }
}
