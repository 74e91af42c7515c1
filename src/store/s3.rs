//! The S3 store: the only module that talks to aws-sdk-s3.
//!
//! Credentials and region come from the standard AWS chain (environment, profile,
//! instance role) and are never logged. An explicit endpoint (`--endpoint-url` or
//! `AWS_ENDPOINT_URL`) switches to path-style addressing, which MinIO, R2 and local
//! test servers expect. Request checksums are only sent when an operation requires
//! them, because several S3-compatible servers reject the newer trailing checksums.
//! Uploads carry an `x-amz-checksum-sha256` header instead, computed here from the
//! file being sent (of the whole object, or of each part), which the server checks
//! against the bytes it receives: a transfer damaged on the way is refused
//! (BadDigest) rather than stored. The user metadata of `put` is the object's S3 user
//! metadata (`x-amz-meta-*`), and `get` hands back what S3 returns.
//!
//! The trait is blocking; this store owns a small tokio runtime and blocks on it, so it
//! must not be called from inside another tokio runtime.
//!
//! Writes are conditional (`If-None-Match: *`): a concurrent writer of the same
//! checkpoint makes ours answer 412, which means the object is already there.
//! A multipart upload that fails for any reason is aborted before the error returns.
//!
//! Multipart uploads and the store's copies of parts are in `upload.rs`; the one
//! sentence a failure says to a user is made in `errors.rs`.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_config::environment::region::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_runtime::env_config::file::{
    EnvConfigFileKind as ProfileFileKind, EnvConfigFiles as ProfileFiles,
};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::ChecksumAlgorithm;
use bytes::{Buf, Bytes};
use tokio::runtime::Runtime;

use super::parts::{self};
use super::{
    ObjectInfo, ObjectMeta, ObjectReader, ObjectStore, ObjectVersion, Progress, PutMode,
    PutOutcome, Reuse, StoreError, Stored,
};

pub use super::parts::MIN_PART_SIZE;

mod errors;
mod upload;

use errors::{is_not_found, is_precondition_failed, remote_error};
use upload::{copy_source, digests_of_range};
pub struct S3Store {
    runtime: Runtime,
    client: Client,
    bucket: String,
    /// Empty, or ends with `/`.
    prefix: String,
    part_size: u64,
    /// A download that receives nothing for this long fails.
    stall_timeout: Duration,
    /// Where requests go, for messages: the custom endpoint, or S3 in its region.
    endpoint: String,
}

impl S3Store {
    /// `GetObject` of the current version, or of `version_id`.
    fn get_object(&self, name: &str, version_id: Option<&str>) -> Result<ObjectReader, StoreError> {
        let response = self.runtime.block_on(
            self.client
                .get_object()
                .bucket(&self.bucket)
                .key(self.key(name))
                .set_version_id(version_id.map(str::to_owned))
                .send(),
        );
        let response = match response {
            Ok(r) => r,
            Err(e) if is_not_found(&e) => {
                return Err(StoreError::NotFound { name: name.into() });
            }
            Err(e) => return Err(self.remote_error("GetObject", name, &e)),
        };
        let meta = object_meta(response.content_length(), response.metadata());
        Ok(ObjectReader {
            meta,
            body: Box::new(BodyReader {
                runtime: self.runtime.handle().clone(),
                body: response.body,
                chunk: Bytes::new(),
                stall_timeout: self.stall_timeout,
            }),
        })
    }

    /// A store for `s3://bucket/prefix`. `endpoint_url` overrides the endpoint (else
    /// `AWS_ENDPOINT_URL`, else AWS); objects larger than `part_size` (at least
    /// [`MIN_PART_SIZE`]) go up as multipart uploads in parts of that size.
    pub fn new(
        bucket: &str,
        prefix: &str,
        endpoint_url: Option<&str>,
        stall_timeout: Duration,
        part_size: u64,
    ) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ckptfs-s3")
            .enable_all()
            .build()
            .map_err(|e| StoreError::io("start runtime for", Path::new("s3"), e))?;
        let endpoint = endpoint_url
            .map(str::to_owned)
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .filter(|e| !e.is_empty())
            .map(|e| without_userinfo(&e));
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        if let Some(files) = profile_files_without_home(home, std::env::home_dir()) {
            loader = loader.profile_files(files);
        }
        if let Some(endpoint) = &endpoint {
            // A custom endpoint is MinIO, R2 or a local server: asking the EC2 instance
            // metadata service for a region would only add delay and warnings.
            loader = loader.endpoint_url(endpoint).region(
                RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
                    .or_else(ProfileFileRegionProvider::new())
                    .or_else(Region::new("us-east-1")),
            );
        }
        let sdk_config = runtime.block_on(loader.load());
        // Local servers do not care about the region, but request signing needs one.
        let region = sdk_config
            .region()
            .cloned()
            .unwrap_or_else(|| Region::new("us-east-1"));
        let config = aws_sdk_s3::config::Builder::from(&sdk_config)
            .region(region.clone())
            .force_path_style(endpoint.is_some())
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .build();
        let prefix = prefix.trim_matches('/');
        Ok(S3Store {
            runtime,
            client: Client::from_conf(config),
            bucket: bucket.to_owned(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            part_size: part_size.max(MIN_PART_SIZE),
            stall_timeout,
            endpoint: endpoint.unwrap_or_else(|| format!("S3 in {region}")),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn remote_error<E>(&self, operation: &'static str, name: &str, err: &SdkError<E>) -> StoreError
    where
        E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    {
        remote_error(
            operation,
            format!("s3://{}/{}", self.bucket, self.key(name)),
            &self.endpoint,
            err,
        )
    }

    async fn put_single(
        &self,
        name: &str,
        path: &Path,
        size: u64,
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
    ) -> Result<PutOutcome, StoreError> {
        // Hashed here, from the bytes about to be sent (not from what a caller says).
        let checksum = {
            let owned = path.to_owned();
            tokio::task::spawn_blocking(move || digests_of_range(&owned, 0, size, false))
                .await
                .map_err(io::Error::other)
                .and_then(|r| r)
                .map_err(|e| StoreError::io("read", path, e))?
                .0
        };
        let body = ByteStream::from_path(path)
            .await
            .map_err(|e| StoreError::io("read", path, io::Error::other(e)))?;
        let result = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(self.key(name))
            .set_metadata(Some(metadata.clone().into_iter().collect()))
            .set_if_none_match(if_absent(mode))
            // The algorithm's header too: a bucket under Object Lock refuses an upload
            // without it (or a Content-MD5).
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .checksum_sha256(checksum)
            .body(body)
            .send()
            .await;
        match result {
            Ok(_) => Ok(PutOutcome::Stored),
            Err(e) if is_precondition_failed(&e) => Ok(PutOutcome::AlreadyPresent),
            Err(e) => Err(self.remote_error("PutObject", name, &e)),
        }
    }

    async fn exists_async(&self, name: &str) -> Result<bool, StoreError> {
        let response = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.key(name))
            .send()
            .await;
        match response {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(self.head_error(name, &e).await),
        }
    }

    /// The error of a failed `HeadObject`. An answer to HEAD has no body, so a 403
    /// cannot say whether the key is unknown, the secret wrong or the request not
    /// allowed; a one-byte `GetObject` of the same key asks the server again, with
    /// a body that says which.
    async fn head_error<E>(&self, name: &str, err: &SdkError<E>) -> StoreError
    where
        E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
    {
        let uncoded = err
            .as_service_error()
            .is_some_and(|e| e.code().is_none_or(str::is_empty));
        if uncoded {
            let again = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(self.key(name))
                .range("bytes=0-0")
                .send()
                .await;
            if let Err(e) = again
                && e.as_service_error().and_then(|e| e.code()).is_some()
            {
                return self.remote_error("HeadObject", name, &e);
            }
        }
        self.remote_error("HeadObject", name, err)
    }
}

/// The endpoint URL without a `user:password@` part. S3 requests are signed with the
/// credentials of the AWS chain; userinfo in the URL is never used, and dropping it
/// here means it can reach no log line, error message or `.status`.
fn without_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    // `user:pass@host`; or, when the password holds a `/` (which ends the authority,
    // so the URL is not valid) or the scheme is missing, everything up to the last `@`:
    // whatever the SDK makes of such a URL, its error would quote it whole.
    // A `:` not followed by a port is a password's, cut short by its `/`.
    let cut_password = || {
        rest[..authority_end]
            .rsplit_once(':')
            .is_some_and(|(_, port)| !port.chars().all(|c| c.is_ascii_digit()))
    };
    let at = rest[..authority_end].rfind('@').or_else(|| {
        rest.rfind('@')
            .filter(|_| scheme.is_none() || cut_password())
    });
    match at {
        Some(at) => {
            tracing::warn!(
                "ignoring the user name and password in the endpoint URL; credentials come from the AWS chain"
            );
            match scheme {
                Some(scheme) => format!("{scheme}://{}", &rest[at + 1..]),
                None => rest[at + 1..].to_owned(),
            }
        }
        None => url.to_owned(),
    }
}

/// The AWS config and credentials files when `HOME` is unset, as for a mount started
/// by systemd or mount(8) from fstab: the SDK finds `~/.aws` through `HOME` only, so
/// without this a root mount would not see `/root/.aws`. `passwd_home` is the user's
/// home from the password database; `AWS_CONFIG_FILE` and
/// `AWS_SHARED_CREDENTIALS_FILE` still win. Only files that exist are given: the SDK
/// takes a missing file given explicitly for an error.
fn profile_files_without_home(
    home: Option<std::ffi::OsString>,
    passwd_home: Option<std::path::PathBuf>,
) -> Option<ProfileFiles> {
    if home.is_some() {
        return None;
    }
    let aws = passwd_home?.join(".aws");
    let file = |variable: &str, default: &str| {
        std::env::var_os(variable)
            .filter(|v| !v.is_empty())
            .map_or_else(|| aws.join(default), std::path::PathBuf::from)
    };
    let config = file("AWS_CONFIG_FILE", "config");
    let credentials = file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
    let mut files = ProfileFiles::builder()
        .include_default_config_file(false)
        .include_default_credentials_file(false);
    let mut any = false;
    for (kind, path) in [
        (ProfileFileKind::Config, config),
        (ProfileFileKind::Credentials, credentials),
    ] {
        if path.is_file() {
            files = files.with_file(kind, path);
            any = true;
        }
    }
    any.then(|| files.build())
}

/// `If-None-Match: *` for a put that must not replace an existing object.
fn if_absent(mode: PutMode) -> Option<String> {
    (mode == PutMode::IfAbsent).then(|| "*".to_owned())
}

/// What a `GetObject` or `HeadObject` response says of its object.
fn object_meta(
    length: Option<i64>,
    metadata: Option<&std::collections::HashMap<String, String>>,
) -> ObjectMeta {
    ObjectMeta {
        length: length.unwrap_or(0).max(0) as u64,
        metadata: metadata
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default(),
    }
}

impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    fn list(&self) -> Result<Vec<ObjectInfo>, StoreError> {
        self.runtime.block_on(async {
            let mut pages = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&self.prefix)
                .delimiter("/")
                .into_paginator()
                .send();
            let mut objects = Vec::new();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| self.remote_error("ListObjectsV2", "", &e))?;
                for object in page.contents() {
                    let Some(name) = object.key().and_then(|k| k.strip_prefix(&self.prefix)) else {
                        continue;
                    };
                    objects.push(ObjectInfo {
                        name: name.to_owned(),
                        size: object.size().unwrap_or(0).max(0) as u64,
                        last_modified: object
                            .last_modified()
                            .and_then(|t| SystemTime::try_from(*t).ok())
                            .unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
            Ok(objects)
        })
    }

    fn get(&self, name: &str) -> Result<ObjectReader, StoreError> {
        self.get_object(name, None)
    }

    fn get_version(&self, name: &str, version_id: &str) -> Result<ObjectReader, StoreError> {
        self.get_object(name, Some(version_id))
    }

    fn versions(&self, only: Option<&str>) -> Result<Option<Vec<ObjectVersion>>, StoreError> {
        let prefix = only.map_or_else(|| self.prefix.clone(), |name| self.key(name));
        let time = |t: Option<&aws_sdk_s3::primitives::DateTime>| {
            t.and_then(|t| SystemTime::try_from(*t).ok())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        let mut versions = Vec::new();
        let (mut key_marker, mut version_marker) = (None::<String>, None::<String>);
        loop {
            let page = self
                .runtime
                .block_on(
                    self.client
                        .list_object_versions()
                        .bucket(&self.bucket)
                        .prefix(&prefix)
                        .delimiter("/")
                        .set_key_marker(key_marker.take())
                        .set_version_id_marker(version_marker.take())
                        .send(),
                )
                .map_err(|e| self.remote_error("ListObjectVersions", "", &e))?;
            let name = |key: Option<&str>| {
                key.and_then(|k| k.strip_prefix(&self.prefix))
                    .filter(|name| only.is_none_or(|only| only == *name))
                    .map(str::to_owned)
            };
            for v in page.versions() {
                let (Some(name), Some(id)) = (name(v.key()), v.version_id()) else {
                    continue;
                };
                versions.push(ObjectVersion {
                    name,
                    version_id: id.to_owned(),
                    size: v.size().unwrap_or(0).max(0) as u64,
                    last_modified: time(v.last_modified()),
                    delete_marker: false,
                    is_latest: v.is_latest() == Some(true),
                });
            }
            for m in page.delete_markers() {
                let (Some(name), Some(id)) = (name(m.key()), m.version_id()) else {
                    continue;
                };
                versions.push(ObjectVersion {
                    name,
                    version_id: id.to_owned(),
                    size: 0,
                    last_modified: time(m.last_modified()),
                    delete_marker: true,
                    is_latest: m.is_latest() == Some(true),
                });
            }
            if page.is_truncated() != Some(true) {
                break;
            }
            key_marker = page.next_key_marker().map(str::to_owned);
            version_marker = page.next_version_id_marker().map(str::to_owned);
            if key_marker.is_none() {
                break;
            }
        }
        // Without versioning every object has the one version "null", and no delete
        // leaves a marker. (GetBucketVersioning would say so directly, but some
        // servers answer it in a shape the SDK refuses.)
        let versioned = versions
            .iter()
            .any(|v| v.delete_marker || v.version_id != "null");
        Ok(versioned.then_some(versions))
    }

    fn exists(&self, name: &str) -> Result<bool, StoreError> {
        self.runtime.block_on(self.exists_async(name))
    }

    fn refresh(&self, name: &str, metadata: &BTreeMap<String, String>) -> Result<(), StoreError> {
        let result = self.runtime.block_on(
            self.client
                .copy_object()
                .bucket(&self.bucket)
                .key(self.key(name))
                .copy_source(copy_source(&self.bucket, &self.key(name)))
                .metadata_directive(aws_sdk_s3::types::MetadataDirective::Replace)
                .set_metadata(Some(metadata.clone().into_iter().collect()))
                .send(),
        );
        match result {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Err(StoreError::NotFound { name: name.into() }),
            Err(e) => Err(self.remote_error("CopyObject", name, &e)),
        }
    }

    fn delete(&self, name: &str) -> Result<(), StoreError> {
        self.runtime
            .block_on(
                self.client
                    .delete_object()
                    .bucket(&self.bucket)
                    .key(self.key(name))
                    .send(),
            )
            .map(drop)
            .map_err(|e| self.remote_error("DeleteObject", name, &e))
    }

    fn head(&self, name: &str) -> Result<ObjectMeta, StoreError> {
        self.runtime.block_on(async {
            let response = self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(self.key(name))
                .send()
                .await;
            match response {
                Ok(r) => Ok(object_meta(r.content_length(), r.metadata())),
                Err(e) if is_not_found(&e) => Err(StoreError::NotFound { name: name.into() }),
                Err(e) => Err(self.head_error(name, &e).await),
            }
        })
    }

    fn abort_uploads(&self, name: &str) -> Result<usize, StoreError> {
        let key = self.key(name);
        self.runtime.block_on(async {
            let listed = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(&key)
                .send()
                .await
                .map_err(|e| self.remote_error("ListMultipartUploads", name, &e))?;
            let mut aborted = 0;
            for upload in listed.uploads() {
                if let (Some(k), Some(id)) = (upload.key(), upload.upload_id())
                    && k == key
                {
                    self.abort_upload(k, id).await;
                    aborted += 1;
                }
            }
            Ok(aborted)
        })
    }

    fn put(
        &self,
        name: &str,
        path: &Path,
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
        progress: Progress<'_>,
    ) -> Result<PutOutcome, StoreError> {
        let size = std::fs::metadata(path)
            .map_err(|e| StoreError::io("stat", path, e))?
            .len();
        self.runtime.block_on(async {
            if size > self.part_size {
                let plan = parts::plan(size, self.part_size, &[]);
                self.put_multipart(name, path, &plan, metadata, mode, progress)
                    .await
                    .map(|(outcome, _)| outcome)
            } else {
                let outcome = self.put_single(name, path, size, metadata, mode).await?;
                progress(size, size);
                Ok(outcome)
            }
        })
    }

    fn put_reusing(
        &self,
        name: &str,
        path: &Path,
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
        reuse: &[Reuse],
        progress: Progress<'_>,
    ) -> Result<Stored, StoreError> {
        let size = std::fs::metadata(path)
            .map_err(|e| StoreError::io("stat", path, e))?
            .len();
        let plan = parts::plan(size, self.part_size, reuse);
        let copied: u64 = plan
            .iter()
            .filter(|p| p.copy.is_some())
            .map(|p| p.length)
            .sum();
        if copied > 0 {
            let result = self
                .runtime
                .block_on(self.put_multipart(name, path, &plan, metadata, mode, progress));
            match result {
                Ok((outcome, md5_only)) => {
                    return Ok(Stored {
                        outcome,
                        copied,
                        copied_unchecked: md5_only,
                    });
                }
                // A source that was deleted or changed, a server without copies: the
                // upload was aborted; everything is sent instead.
                Err(e) => tracing::warn!(
                    object = name,
                    error = %e,
                    "copying unchanged ranges in the store failed; uploading the whole object"
                ),
            }
        }
        let outcome = self.put(name, path, metadata, mode, progress)?;
        Ok(Stored {
            outcome,
            copied: 0,
            copied_unchecked: 0,
        })
    }
}

/// Adapts the SDK's async body stream to `std::io::Read` by blocking on the runtime.
struct BodyReader {
    runtime: tokio::runtime::Handle,
    body: ByteStream,
    chunk: Bytes,
    stall_timeout: Duration,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            let (body, stall) = (&mut self.body, self.stall_timeout);
            // The timer is made inside the runtime: it needs its clock.
            let next = self
                .runtime
                .block_on(async { tokio::time::timeout(stall, body.next()).await });
            match next {
                Ok(Some(Ok(chunk))) => self.chunk = chunk,
                Ok(Some(Err(e))) => {
                    return Err(io::Error::other(DisplayErrorContext(e).to_string()));
                }
                Ok(None) => return Ok(0),
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the download stalled: nothing received for {:?}",
                            self.stall_timeout
                        ),
                    ));
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
