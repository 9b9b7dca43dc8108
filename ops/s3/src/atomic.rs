//! The one thing this server adds to s3s-fs: conditional writes that hold under
//! concurrent requests.
//!
//! The Delta commit protocol on S3 rests on `PUT _delta_log/<version>.json` with
//! `If-None-Match: *`: of two writers racing for the same version exactly one may succeed,
//! the other must get `412 Precondition Failed` and retry on the next version. s3s-fs checks
//! the precondition when the request arrives and renames the uploaded file into place when
//! the body has been read, so two racing requests can both pass the check and the second
//! rename silently replaces the first commit. Every request that changes objects therefore
//! runs under one lock here: the check and the rename of one request can no longer
//! interleave with another's. Reads stay concurrent (a rename is atomic for readers).
//! Serialising writes costs throughput, which a development server can spare.

use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, S3};
use s3s_fs::FileSystem;
use tokio::sync::Mutex;

/// s3s-fs with its object-changing requests serialised.
pub struct AtomicFs {
    fs: FileSystem,
    writes: Mutex<()>,
    ignore_preconditions: bool,
}

impl AtomicFs {
    /// `ignore_preconditions` drops `If-None-Match` and `If-Match` from uploads, as old
    /// S3-compatible servers do: what the tests use to check that wal2delta refuses such
    /// a store.
    pub fn new(fs: FileSystem, ignore_preconditions: bool) -> Self {
        AtomicFs {
            fs,
            writes: Mutex::new(()),
            ignore_preconditions,
        }
    }
}

#[async_trait::async_trait]
impl S3 for AtomicFs {
    // --- requests that change objects: one at a time -------------------------------------

    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        if self.ignore_preconditions {
            req.input.if_none_match = None;
            req.input.if_match = None;
        }
        let _one = self.writes.lock().await;
        self.fs.put_object(req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let _one = self.writes.lock().await;
        self.fs.complete_multipart_upload(req).await
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let _one = self.writes.lock().await;
        self.fs.copy_object(req).await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let _one = self.writes.lock().await;
        self.fs.delete_object(req).await
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let _one = self.writes.lock().await;
        self.fs.delete_objects(req).await
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let _one = self.writes.lock().await;
        self.fs.create_bucket(req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let _one = self.writes.lock().await;
        self.fs.delete_bucket(req).await
    }

    // --- everything else: straight to s3s-fs ---------------------------------------------

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.fs.get_object(req).await
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        self.fs.head_object(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.fs.head_bucket(req).await
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.fs.get_bucket_location(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.fs.list_buckets(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.fs.list_objects(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.fs.list_objects_v2(req).await
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.fs.create_multipart_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        self.fs.upload_part(req).await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        self.fs.upload_part_copy(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.fs.list_parts(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.fs.abort_multipart_upload(req).await
    }
}
