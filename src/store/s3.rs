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

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, SystemTime};

use aws_config::environment::region::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::profile::ProfileFileRegionProvider;
use aws_credential_types::provider::error::CredentialsError;
use aws_runtime::env_config::file::{
    EnvConfigFileKind as ProfileFileKind, EnvConfigFiles as ProfileFiles,
};
use aws_sdk_s3::Client;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};
use bytes::{Buf, Bytes};
use tokio::runtime::Runtime;

use super::parts::{self, Part};
use super::{
    ObjectInfo, ObjectMeta, ObjectReader, ObjectStore, ObjectVersion, Progress, PutMode,
    PutOutcome, Reuse, StoreError, Stored,
};

pub use super::parts::MIN_PART_SIZE;
/// Parts uploaded at the same time by one multipart upload.
const PARTS_IN_FLIGHT: usize = 4;

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

    async fn put_multipart(
        &self,
        name: &str,
        path: &Path,
        plan: &[Part],
        metadata: &BTreeMap<String, String>,
        mode: PutMode,
        progress: Progress<'_>,
    ) -> Result<(PutOutcome, u64), StoreError> {
        let key = self.key(name);
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .set_metadata(Some(metadata.clone().into_iter().collect()))
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .send()
            .await
            .map_err(|e| self.remote_error("CreateMultipartUpload", name, &e))?;
        let upload_id = created.upload_id().unwrap_or_default().to_owned();
        let (parts, md5_only) = match self
            .upload_parts(name, path, plan, &upload_id, progress)
            .await
        {
            Ok(done) => done,
            Err(e) => {
                self.abort_upload(&key, &upload_id).await;
                return Err(e);
            }
        };
        let completed = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&key)
            .upload_id(&upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .set_if_none_match(if_absent(mode))
            .send()
            .await;
        let result = match completed {
            Ok(_) => return Ok((PutOutcome::Stored, md5_only)),
            Err(e) if is_precondition_failed(&e) => Ok((PutOutcome::AlreadyPresent, 0)),
            // Some servers answer 200 with a body the SDK cannot parse (moto names the
            // XML root differently). The object is content-addressed, so if it exists
            // now it is the right one, whoever completed it.
            Err(e) if e.raw_response().is_some_and(|r| r.status().is_success()) => {
                match self.exists_async(name).await {
                    Ok(true) => return Ok((PutOutcome::Stored, md5_only)),
                    _ => Err(self.remote_error("CompleteMultipartUpload", name, &e)),
                }
            }
            Err(e) => Err(self.remote_error("CompleteMultipartUpload", name, &e)),
        };
        // The upload was not completed: it must not be left behind, holding storage.
        self.abort_upload(&key, &upload_id).await;
        result
    }

    async fn abort_upload(&self, key: &str, upload_id: &str) {
        let aborted = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await;
        if let Err(e) = aborted {
            tracing::warn!(key, upload_id, error = %DisplayErrorContext(&e), "could not abort the multipart upload");
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

    async fn upload_parts(
        &self,
        name: &str,
        path: &Path,
        plan: &[Part],
        upload_id: &str,
        progress: Progress<'_>,
    ) -> Result<(Vec<CompletedPart>, u64), StoreError> {
        let size: u64 = plan.iter().map(|p| p.length).sum();
        let mut md5_only = 0;
        let mut parts = Vec::with_capacity(plan.len());
        let mut in_flight = tokio::task::JoinSet::new();
        let mut done = 0u64;
        let mut next = 0;
        while next < plan.len() || !in_flight.is_empty() {
            while next < plan.len() && in_flight.len() < PARTS_IN_FLIGHT {
                let part = plan[next].clone();
                let number = (next + 1) as i32;
                let shown = format!("s3://{}/{}", self.bucket, self.key(name));
                let endpoint = self.endpoint.clone();
                let (path, client, bucket, key, upload_id) = (
                    path.to_owned(),
                    self.client.clone(),
                    self.bucket.clone(),
                    self.key(name),
                    upload_id.to_owned(),
                );
                let source = part.copy.as_ref().map(|(object, offset)| {
                    (copy_source(&self.bucket, &self.key(object)), *offset)
                });
                in_flight.spawn(async move {
                    let read_error = |e: io::Error| StoreError::io("read", &path, e);
                    // Hashed in the part's own task, so that hashing overlaps with the
                    // other parts' transfers.
                    let (sha256, md5) = {
                        let path = path.clone();
                        let copying = part.copy.is_some();
                        tokio::task::spawn_blocking(move || {
                            digests_of_range(&path, part.offset, part.length, copying)
                        })
                        .await
                        .map_err(io::Error::other)
                        .and_then(|r| r)
                        .map_err(read_error)?
                    };
                    // Bytes copied that only an MD5 vouches for.
                    let mut md5_only = 0;
                    let e_tag = match source {
                        None => {
                            // The part carries the SHA-256 of its bytes, for the server
                            // to check.
                            let body = ByteStream::read_from()
                                .path(&path)
                                .offset(part.offset)
                                .length(Length::Exact(part.length))
                                .build()
                                .await
                                .map_err(|e| read_error(io::Error::other(e)))?;
                            let uploaded = client
                                .upload_part()
                                .bucket(bucket)
                                .key(key)
                                .upload_id(upload_id)
                                .part_number(number)
                                .checksum_algorithm(ChecksumAlgorithm::Sha256)
                                .checksum_sha256(&sha256)
                                .body(body)
                                .send()
                                .await
                                .map_err(|e| remote_error("UploadPart", shown, &endpoint, &e))?;
                            uploaded.e_tag().map(str::to_owned)
                        }
                        Some((source, source_offset)) => {
                            let range = format!(
                                "bytes={source_offset}-{}",
                                source_offset + part.length - 1
                            );
                            let copied = client
                                .upload_part_copy()
                                .bucket(bucket)
                                .key(key)
                                .upload_id(upload_id)
                                .part_number(number)
                                .copy_source(&source)
                                .copy_source_range(&range)
                                .send()
                                .await
                                .map_err(|e| remote_error("UploadPartCopy", shown.clone(), &endpoint, &e))?;
                            let result = copied.copy_part_result();
                            let e_tag = result.and_then(|r| r.e_tag()).map(str::to_owned);
                            let server_sha256 = result.and_then(|r| r.checksum_sha256());
                            // The source may have changed since it was recorded, or the
                            // hint be wrong: the copy must be exactly the file's bytes.
                            let md5 = md5.unwrap_or_default();
                            if e_tag.as_deref().map(|t| t.trim_matches('"')) != Some(md5.as_str())
                                || server_sha256.is_some_and(|c| c != sha256)
                            {
                                return Err(StoreError::Remote {
                                    operation: "UploadPartCopy",
                                    name: shown,
                                    message: format!(
                                        "the copy of {source} {range} is not the bytes expected (ETag {}, MD5 {md5})",
                                        e_tag.as_deref().unwrap_or("none")
                                    ),
                                });
                            }
                            if server_sha256.is_none() {
                                md5_only = part.length;
                            }
                            e_tag
                        }
                    };
                    let completed = CompletedPart::builder()
                        .part_number(number)
                        .set_e_tag(e_tag)
                        .checksum_sha256(sha256)
                        .build();
                    Ok::<_, StoreError>((completed, part.length, md5_only))
                });
                next += 1;
            }
            let Some(joined) = in_flight.join_next().await else {
                break;
            };
            let (part, length, part_md5_only) = joined.map_err(|e| StoreError::Remote {
                operation: "UploadPart",
                name: name.to_owned(),
                message: e.to_string(),
            })??;
            md5_only += part_md5_only;
            parts.push(part);
            done += length;
            progress(done, size);
        }
        parts.sort_by_key(|p| p.part_number());
        Ok((parts, md5_only))
    }
}

/// The `x-amz-copy-source` of an object: bucket and key, URL-encoded.
fn copy_source(bucket: &str, key: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    format!("{bucket}/{}", utf8_percent_encode(key, KEEP))
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

fn remote_error<E>(
    operation: &'static str,
    name: String,
    endpoint: &str,
    err: &SdkError<E>,
) -> StoreError
where
    E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
{
    // The SDK's own text is a page of nested Debug output; users get one sentence
    // that says what to do, and `-v` shows the whole chain of causes.
    tracing::debug!(operation, %name, error = %DisplayErrorContext(err), "S3 request failed");
    StoreError::Remote {
        operation,
        name,
        message: explain(endpoint, err),
    }
}

const NO_CREDENTIALS: &str = "no AWS credentials found: set AWS_ACCESS_KEY_ID and \
    AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a profile in ~/.aws/config or \
    ~/.aws/credentials, or run with an instance or container role";

/// One sentence for an S3 failure, naming its cause and, where there is one, the fix.
fn explain<E>(endpoint: &str, err: &SdkError<E>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
{
    if let Some(credentials) = cause::<CredentialsError>(err) {
        return match credentials {
            CredentialsError::CredentialsNotLoaded(_) if let Some(profile) = aws_profile() => {
                format!(
                    "no AWS credentials found for profile {profile:?} (AWS_PROFILE): is it in \
                     ~/.aws/config or ~/.aws/credentials, with credentials or a way to get them?"
                )
            }
            CredentialsError::CredentialsNotLoaded(_) => NO_CREDENTIALS.to_owned(),
            // The instance metadata service is the chain's last place to look: when it
            // refuses (as it does on many hosts and CI machines that are not EC2
            // instances), nothing before it had credentials either.
            other if cause::<aws_config::imds::client::error::ImdsError>(other).is_some() => {
                format!(
                    "{NO_CREDENTIALS} (the instance metadata service, looked at last, \
                     answered: {})",
                    innermost(other)
                )
            }
            other => format!("cannot load AWS credentials: {}", innermost(other)),
        };
    }
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or("");
            let text = service.err().message().unwrap_or("");
            match code {
                "NoSuchBucket" => "no such bucket (NoSuchBucket)".to_owned(),
                "InvalidAccessKeyId" | "NotSignedUp" => "the server does not know this access key \
                    (InvalidAccessKeyId): check AWS_ACCESS_KEY_ID or the profile"
                    .to_owned(),
                "SignatureDoesNotMatch" => "the secret key does not match the access key \
                    (SignatureDoesNotMatch): check AWS_SECRET_ACCESS_KEY or the profile"
                    .to_owned(),
                "AccessDenied" | "AllAccessDisabled" => format!(
                    "access denied ({code}): the credentials in use are not allowed this \
                     request{}",
                    if text.is_empty() {
                        String::new()
                    } else {
                        format!("; the server says: {text}")
                    }
                ),
                "" if status == 403 => format!(
                    "access denied (HTTP 403 from {endpoint}, no reason given): check \
                     AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the profile, and what \
                     the credentials are allowed"
                ),
                "" => format!("HTTP {status} from {endpoint}"),
                _ if text.is_empty() => format!("{code} (HTTP {status})"),
                _ => format!("{code}: {text} (HTTP {status})"),
            }
        }
        SdkError::DispatchFailure(failure) if failure.is_timeout() => {
            format!("cannot connect to {endpoint}: timed out")
        }
        SdkError::DispatchFailure(failure) if failure.is_io() => {
            format!("cannot connect to {endpoint}: {}", innermost(err))
        }
        SdkError::TimeoutError(_) => format!("no answer from {endpoint} in time"),
        SdkError::ResponseError(_) => {
            format!("unreadable answer from {endpoint}: {}", innermost(err))
        }
        _ => innermost(err),
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

fn aws_profile() -> Option<String> {
    std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty())
}

/// The first error of type `T` in `err`'s chain of causes.
fn cause<'a, T: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// The message of the last error in the chain: the root cause, such as "Connection
/// refused (os error 111)".
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(source) = last.source() {
        last = source;
    }
    last.to_string()
}

/// The `x-amz-checksum-sha256` value (base64) of `path`'s bytes from `offset`,
/// `length` of them, and with `with_md5` their MD5 (hex: what S3 answers as the ETag
/// of a copied part).
fn digests_of_range(
    path: &Path,
    offset: u64,
    length: u64,
    with_md5: bool,
) -> io::Result<(String, Option<String>)> {
    use sha2::{Digest, Sha256};
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut part = file.take(length);
    let mut sha256 = Sha256::new();
    let mut md5 = with_md5.then(<md5::Md5 as md5::Digest>::new);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = part.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha256.update(&buf[..n]);
        if let Some(md5) = &mut md5 {
            md5::Digest::update(md5, &buf[..n]);
        }
    }
    Ok((
        aws_smithy_types::base64::encode(sha256.finalize()),
        md5.map(|md5| hex::encode(md5::Digest::finalize(md5))),
    ))
}

/// `If-None-Match: *` for a put that must not replace an existing object.
fn if_absent(mode: PutMode) -> Option<String> {
    (mode == PutMode::IfAbsent).then(|| "*".to_owned())
}

fn is_precondition_failed<E>(err: &SdkError<E>) -> bool {
    err.raw_response()
        .is_some_and(|r| r.status().as_u16() == 412)
}

fn is_not_found<E: ProvideErrorMetadata>(err: &SdkError<E>) -> bool {
    err.raw_response()
        .is_some_and(|r| r.status().as_u16() == 404)
        || err
            .as_service_error()
            .and_then(|e| e.code())
            .is_some_and(|c| c == "NoSuchKey" || c == "NotFound")
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
mod tests {
    use super::without_userinfo;

    #[test]
    fn without_home_the_aws_files_are_in_the_users_home() {
        use super::profile_files_without_home;
        assert!(
            profile_files_without_home(Some("/home/me".into()), Some("/root".into())).is_none()
        );
        assert!(profile_files_without_home(None, None).is_none());
        let home = tempfile::tempdir().unwrap();
        assert!(profile_files_without_home(None, Some(home.path().into())).is_none());
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(home.path().join(".aws/credentials"), "[default]\n").unwrap();
        let files = format!(
            "{:?}",
            profile_files_without_home(None, Some(home.path().into())).unwrap()
        );
        assert!(files.contains(".aws/credentials"), "{files}");
        assert!(!files.contains(".aws/config"), "{files}");
    }

    #[test]
    fn endpoint_userinfo_is_dropped() {
        assert_eq!(
            without_userinfo("http://127.0.0.1:9000"),
            "http://127.0.0.1:9000"
        );
        assert_eq!(
            without_userinfo("https://key:s3cr3t@minio.local:9000/base"),
            "https://minio.local:9000/base"
        );
        assert_eq!(without_userinfo("http://a@b@host/p@q"), "http://host/p@q");
        // A password holding `/`, and no scheme at all (attacker review).
        assert_eq!(
            without_userinfo("http://user:SEC/RETPW@127.0.0.1:9/"),
            "http://127.0.0.1:9/"
        );
        assert_eq!(without_userinfo("user:SECRETPW@host:9000"), "host:9000");
        assert_eq!(
            without_userinfo("http://host:9000/p@q"),
            "http://host:9000/p@q"
        );
    }
}
