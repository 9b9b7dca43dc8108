//! The S3 operations the Delta protocol, object_store, DuckDB's httpfs and the deltalake
//! package use, over [`DirStore`]. Anything else is answered `NotImplemented` by s3s, so a
//! client never gets a silent half-answer.

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result, S3};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::listing;
use crate::store::{check_read, DirStore, Precondition};

/// Keys per listing page when the client does not say.
const DEFAULT_MAX_KEYS: i32 = 1000;

#[async_trait::async_trait]
impl S3 for DirStore {
    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let dest = self.object_path(&input.bucket, &input.key)?;
        let body = self.receive(input.body).await?;
        let cond = Precondition {
            if_none_match: input.if_none_match,
            if_match: input.if_match,
        };
        let meta = self.commit(body, &dest, cond).await?;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(meta.e_tag()),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        if input.if_modified_since.is_some() || input.if_unmodified_since.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "If-(Un)Modified-Since is not supported"
            ));
        }
        let path = self.object_path(&input.bucket, &input.key)?;
        // Open first: the file read is the one the metadata describes, even if a write
        // renames a new one into place meanwhile.
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(s3_error!(NoSuchKey)),
            Err(e) => return Err(s3_error!(e, InternalError)),
        };
        let md = file
            .metadata()
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        if !md.is_file() {
            return Err(s3_error!(NoSuchKey));
        }
        let meta = crate::store::Meta::of(&md);
        check_read(&meta, input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let (range, content_range) = match input.range {
            None => (0..meta.size, None),
            Some(r) => {
                let r = r.check(meta.size).map_err(|_| s3_error!(InvalidRange))?;
                let cr = format!("bytes {}-{}/{}", r.start, r.end - 1, meta.size);
                (r, Some(cr))
            }
        };
        let len = usize::try_from(range.end - range.start).map_err(|_| s3_error!(InvalidRange))?;
        file.seek(std::io::SeekFrom::Start(range.start))
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        let mut bytes = vec![0u8; len];
        file.read_exact(&mut bytes)
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        Ok(S3Response::new(GetObjectOutput {
            body: Some(StreamingBlob::from(s3s::Body::from(bytes))),
            content_length: Some(len as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            last_modified: Some(meta.modified.into()),
            e_tag: Some(meta.e_tag()),
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        if input.if_modified_since.is_some() || input.if_unmodified_since.is_some() {
            return Err(s3_error!(
                NotImplemented,
                "If-(Un)Modified-Since is not supported"
            ));
        }
        let path = self.object_path(&input.bucket, &input.key)?;
        let meta = self
            .meta(&path)
            .await?
            .ok_or_else(|| s3_error!(NoSuchKey))?;
        check_read(&meta, input.if_match.as_ref(), input.if_none_match.as_ref())?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(meta.size as i64),
            accept_ranges: Some("bytes".into()),
            last_modified: Some(meta.modified.into()),
            e_tag: Some(meta.e_tag()),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let input = req.input;
        let bucket_dir = self.existing_bucket(&input.bucket)?;
        let path = self.object_path(&input.bucket, &input.key)?;
        self.remove(&bucket_dir, &path).await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        let bucket_dir = self.existing_bucket(&input.bucket)?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for object in input.delete.objects {
            let removed = match self.object_path(&input.bucket, &object.key) {
                Ok(path) => self.remove(&bucket_dir, &path).await,
                Err(e) => Err(e),
            };
            match removed {
                Ok(()) if quiet => {}
                Ok(()) => deleted.push(DeletedObject {
                    key: Some(object.key),
                    ..Default::default()
                }),
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(object.key),
                    message: e.message().map(str::to_string),
                    version_id: None,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        let CopySource::Bucket { bucket, key, .. } = &input.copy_source else {
            return Err(s3_error!(NotImplemented, "copy from an access point"));
        };
        let src = self.object_path(bucket, key)?;
        let dest = self.object_path(&input.bucket, &input.key)?;
        let copy = self.temp_file();
        tokio::fs::copy(&src, copy.path())
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => s3_error!(NoSuchKey),
                _ => s3_error!(e, InternalError),
            })?;
        let meta = self.commit(copy, &dest, Precondition::default()).await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(meta.e_tag()),
                last_modified: Some(meta.modified.into()),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let bucket_dir = self.existing_bucket(&input.bucket)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input
            .max_keys
            .unwrap_or(DEFAULT_MAX_KEYS)
            .clamp(0, DEFAULT_MAX_KEYS);
        let walk_prefix = prefix.clone();
        let all =
            tokio::task::spawn_blocking(move || listing::objects_under(&bucket_dir, &walk_prefix))
                .await
                .map_err(|e| s3_error!(InternalError, "listing task: {e}"))?
                .map_err(|e| s3_error!(e, InternalError))?;
        // Resume after the token, else after start-after.
        let after = input
            .continuation_token
            .as_deref()
            .or(input.start_after.as_deref());
        let page = listing::page(
            all,
            &prefix,
            input.delimiter.as_deref(),
            after,
            max as usize,
        );
        let key_count = (page.objects.len() + page.prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: Some(max),
            key_count: Some(key_count),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            is_truncated: Some(page.next.is_some()),
            next_continuation_token: page.next,
            contents: Some(
                page.objects
                    .into_iter()
                    .map(|(key, meta)| Object {
                        key: Some(key),
                        size: Some(meta.size as i64),
                        last_modified: Some(meta.modified.into()),
                        e_tag: Some(meta.e_tag()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            common_prefixes: Some(
                page.prefixes
                    .into_iter()
                    .map(|p| CommonPrefix { prefix: Some(p) })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let mut buckets = Vec::new();
        let mut dir = tokio::fs::read_dir(self.root())
            .await
            .map_err(|e| s3_error!(e, InternalError))?;
        while let Some(entry) = dir
            .next_entry()
            .await
            .map_err(|e| s3_error!(e, InternalError))?
        {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if self.bucket_dir(&name).is_err() || !entry.path().is_dir() {
                continue;
            }
            let created = entry.metadata().await.ok().and_then(|m| m.created().ok());
            buckets.push(Bucket {
                name: Some(name),
                creation_date: created.map(Into::into),
                ..Default::default()
            });
        }
        buckets.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.existing_bucket(&req.input.bucket)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.existing_bucket(&req.input.bucket)?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let dir = self.bucket_dir(&req.input.bucket)?;
        DirStore::create_bucket(self, &dir).await?;
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let dir = self.existing_bucket(&req.input.bucket)?;
        DirStore::delete_bucket(self, &dir).await?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let id = self.create_upload(&input.bucket, &input.key).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        let meta = DirStore::upload_part(
            self,
            &input.upload_id,
            &input.bucket,
            &input.key,
            input.part_number,
            input.body,
        )
        .await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(meta.e_tag()),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let parts = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        let cond = Precondition {
            if_none_match: input.if_none_match,
            if_match: input.if_match,
        };
        let meta = self
            .complete_upload(&input.upload_id, &input.bucket, &input.key, &parts, cond)
            .await?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(meta.e_tag()),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        self.abort_upload(&input.upload_id, &input.bucket, &input.key)
            .await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}
