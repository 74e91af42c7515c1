//! Multipart uploads: each part sent with the SHA-256 of its bytes for the server to
//! check, or copied in the store from an object that holds the same bytes (and then
//! checked against their MD5, or SHA-256 where the server gives it), a few parts at a
//! time; an upload that fails for any reason is aborted before the error returns.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::Path;

use aws_sdk_s3::Client;
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{ChecksumAlgorithm, CompletedMultipartUpload, CompletedPart};

use super::errors::{is_precondition_failed, remote_error};
use super::{S3Store, if_absent};
use crate::store::parts::Part;
use crate::store::{Progress, PutMode, PutOutcome, StoreError};

/// Parts uploaded at the same time by one multipart upload.
const PARTS_IN_FLIGHT: usize = 4;

impl S3Store {
    pub(super) async fn put_multipart(
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

    pub(super) async fn abort_upload(&self, key: &str, upload_id: &str) {
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

    /// Sends or copies the parts of `plan`, [`PARTS_IN_FLIGHT`] at a time; returns
    /// them completed, in order, and how many bytes were copied that only an MD5
    /// vouches for.
    async fn upload_parts(
        &self,
        name: &str,
        path: &Path,
        plan: &[Part],
        upload_id: &str,
        progress: Progress<'_>,
    ) -> Result<(Vec<CompletedPart>, u64), StoreError> {
        let size: u64 = plan.iter().map(|p| p.length).sum();
        let upload = Upload {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: self.key(name),
            upload_id: upload_id.to_owned(),
            shown: format!("s3://{}/{}", self.bucket, self.key(name)),
            endpoint: self.endpoint.clone(),
        };
        let (mut parts, mut md5_only, mut done) = (Vec::with_capacity(plan.len()), 0, 0u64);
        let mut in_flight = tokio::task::JoinSet::new();
        let mut next = 0;
        while next < plan.len() || !in_flight.is_empty() {
            while next < plan.len() && in_flight.len() < PARTS_IN_FLIGHT {
                let part = plan[next].clone();
                let source = part.copy.as_ref().map(|(object, offset)| {
                    (copy_source(&self.bucket, &self.key(object)), *offset)
                });
                let (upload, path) = (upload.clone(), path.to_owned());
                let number = (next + 1) as i32;
                in_flight.spawn(async move { upload.part(number, &path, part, source).await });
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

/// One multipart upload in progress, as each part's task needs it.
#[derive(Clone)]
struct Upload {
    client: Client,
    bucket: String,
    key: String,
    upload_id: String,
    /// The object's name in messages.
    shown: String,
    endpoint: String,
}

impl Upload {
    /// Part `number`: `part` of the file at `path`, copied from `source` (an object
    /// and the offset of the same bytes in it) when given. Returns it completed, its
    /// length, and its length again if only an MD5 vouches for the copy.
    async fn part(
        &self,
        number: i32,
        path: &Path,
        part: Part,
        source: Option<(String, u64)>,
    ) -> Result<(CompletedPart, u64, u64), StoreError> {
        // Hashed in the part's own task, so that hashing overlaps with the other
        // parts' transfers.
        let (sha256, md5) = {
            let (owned, copying) = (path.to_owned(), part.copy.is_some());
            tokio::task::spawn_blocking(move || {
                digests_of_range(&owned, part.offset, part.length, copying)
            })
            .await
            .map_err(io::Error::other)
            .and_then(|r| r)
            .map_err(|e| StoreError::io("read", path, e))?
        };
        let (e_tag, md5_only) = match source {
            None => (self.send(number, path, &part, &sha256).await?, 0),
            Some((source, offset)) => {
                let md5 = md5.unwrap_or_default();
                self.copy(number, &part, (&source, offset), &sha256, &md5)
                    .await?
            }
        };
        let completed = CompletedPart::builder()
            .part_number(number)
            .set_e_tag(e_tag)
            .checksum_sha256(sha256)
            .build();
        Ok((completed, part.length, md5_only))
    }

    /// Sends the part's bytes with their SHA-256, for the server to check; its ETag.
    async fn send(
        &self,
        number: i32,
        path: &Path,
        part: &Part,
        sha256: &str,
    ) -> Result<Option<String>, StoreError> {
        let body = ByteStream::read_from()
            .path(path)
            .offset(part.offset)
            .length(Length::Exact(part.length))
            .build()
            .await
            .map_err(|e| StoreError::io("read", path, io::Error::other(e)))?;
        let uploaded = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(number)
            .checksum_algorithm(ChecksumAlgorithm::Sha256)
            .checksum_sha256(sha256)
            .body(body)
            .send()
            .await
            .map_err(|e| remote_error("UploadPart", self.shown.clone(), &self.endpoint, &e))?;
        Ok(uploaded.e_tag().map(str::to_owned))
    }

    /// Copies the part from `source` at `offset`, and checks that the copy is exactly
    /// the file's bytes (the source may have changed since it was recorded, or the
    /// hint be wrong); its ETag, and its length if only the MD5 vouches for it.
    async fn copy(
        &self,
        number: i32,
        part: &Part,
        (source, offset): (&str, u64),
        sha256: &str,
        md5: &str,
    ) -> Result<(Option<String>, u64), StoreError> {
        let range = format!("bytes={offset}-{}", offset + part.length - 1);
        let copied = self
            .client
            .upload_part_copy()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&self.upload_id)
            .part_number(number)
            .copy_source(source)
            .copy_source_range(&range)
            .send()
            .await
            .map_err(|e| remote_error("UploadPartCopy", self.shown.clone(), &self.endpoint, &e))?;
        let result = copied.copy_part_result();
        let e_tag = result.and_then(|r| r.e_tag()).map(str::to_owned);
        let server_sha256 = result.and_then(|r| r.checksum_sha256());
        if e_tag.as_deref().map(|t| t.trim_matches('"')) != Some(md5)
            || server_sha256.is_some_and(|c| c != sha256)
        {
            return Err(StoreError::Remote {
                operation: "UploadPartCopy",
                name: self.shown.clone(),
                message: format!(
                    "the copy of {source} {range} is not the bytes expected (ETag {}, MD5 {md5})",
                    e_tag.as_deref().unwrap_or("none")
                ),
            });
        }
        let md5_only = if server_sha256.is_none() {
            part.length
        } else {
            0
        };
        Ok((e_tag, md5_only))
    }
}

/// The `x-amz-copy-source` of an object: bucket and key, URL-encoded.
pub(super) fn copy_source(bucket: &str, key: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const KEEP: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'/')
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    format!("{bucket}/{}", utf8_percent_encode(key, KEEP))
}

/// The `x-amz-checksum-sha256` value (base64) of `path`'s bytes from `offset`,
/// `length` of them, and with `with_md5` their MD5 (hex: what S3 answers as the ETag
/// of a copied part).
pub(super) fn digests_of_range(
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
