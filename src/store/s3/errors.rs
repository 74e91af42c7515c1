//! What an S3 failure says to a user: one sentence naming the cause and, where there
//! is one, the fix (credentials, bucket, endpoint), never the SDK's nested Debug
//! output, which `-v` logs instead.

use aws_credential_types::provider::error::CredentialsError;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::store::StoreError;

pub(super) fn remote_error<E>(
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
pub(super) fn explain<E>(endpoint: &str, err: &SdkError<E>) -> String
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

pub(super) fn is_precondition_failed<E>(err: &SdkError<E>) -> bool {
    err.raw_response()
        .is_some_and(|r| r.status().as_u16() == 412)
}

pub(super) fn is_not_found<E: ProvideErrorMetadata>(err: &SdkError<E>) -> bool {
    err.raw_response()
        .is_some_and(|r| r.status().as_u16() == 404)
        || err
            .as_service_error()
            .and_then(|e| e.code())
            .is_some_and(|c| c == "NoSuchKey" || c == "NotFound")
}
