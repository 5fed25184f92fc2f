//! Why a request to the Hub failed, and the retries of those that may succeed later: a connection
//! error, a timeout, HTTP 408, 429 or 5xx is sent again after a pause that doubles each time (or
//! the server's `Retry-After`).

use std::fmt;
use std::time::Duration;

use reqwest::blocking::{RequestBuilder, Response};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::Value;

use super::Hub;

/// The pause before the first retry; it doubles with each further one, up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause between two attempts, also for a server's `Retry-After`.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Why a request failed (after any retries).
#[derive(Debug)]
pub(super) enum Failure {
    /// No answer: the connection failed or broke, or timed out.
    Network(reqwest::Error),
    /// An error status, with the Hub's `X-Error-Code` and message when it sent them.
    Status {
        status: StatusCode,
        code: Option<String>,
        message: String,
    },
    /// An answer that does not follow the protocol.
    Malformed(String),
}

impl Failure {
    /// The failure an error status `response` describes.
    fn from_response(response: Response) -> Self {
        let status = response.status();
        let header = |name: &str| {
            let value = response.headers().get(name)?.to_str().ok()?;
            Some(value.to_string())
        };
        let code = header("x-error-code");
        let mut message = header("x-error-message").unwrap_or_default();
        if message.is_empty() {
            let body = response.text().unwrap_or_default();
            message = match serde_json::from_str::<Value>(&body) {
                Ok(Value::Object(map)) => map
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                _ => body.trim().chars().take(200).collect(),
            };
        }
        Self::Status {
            status,
            code,
            message,
        }
    }

    pub(super) fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The Hub's `X-Error-Code`, e.g. `RepoNotFound`.
    pub(super) fn code(&self) -> Option<&str> {
        match self {
            Self::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// Whether trying again later may succeed.
    pub(super) fn is_transient(&self) -> bool {
        match self {
            Self::Network(_) => true,
            Self::Status { status, .. } => is_transient_status(*status),
            Self::Malformed(_) => false,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The innermost error, e.g. "connection closed before message completed" rather
            // than reqwest's layers, each repeating the URL.
            Self::Network(err) => {
                let mut cause: &dyn std::error::Error = err;
                while let Some(source) = cause.source() {
                    cause = source;
                }
                write!(f, "{cause}")
            }
            Self::Status {
                status, message, ..
            } if message.is_empty() => write!(f, "HTTP {status}"),
            Self::Status {
                status, message, ..
            } => write!(f, "HTTP {status}: {message}"),
            Self::Malformed(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Failure {}

/// HTTP 408, 429 and 5xx: the server may answer otherwise later.
fn is_transient_status(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

impl Hub {
    /// Sends the request `build` makes, again after a pause while it fails transiently and
    /// attempts remain. A success or redirection status is returned as is.
    pub(super) fn send(&self, build: impl Fn() -> RequestBuilder) -> Result<Response, Failure> {
        let mut attempt = 1;
        loop {
            let pause = match build().send() {
                Ok(response)
                    if response.status().is_success() || response.status().is_redirection() =>
                {
                    return Ok(response);
                }
                Ok(response)
                    if attempt < self.retries && is_transient_status(response.status()) =>
                {
                    retry_after(response.headers()).unwrap_or_else(|| backoff(attempt))
                }
                Ok(response) => return Err(Failure::from_response(response)),
                Err(err) if attempt < self.retries && !(err.is_builder() || err.is_redirect()) => {
                    backoff(attempt)
                }
                Err(err) => return Err(Failure::Network(err)),
            };
            std::thread::sleep(pause);
            attempt += 1;
        }
    }
}

/// The JSON body of a successful `response` to `url`.
pub(super) fn read_json<T: for<'de> Deserialize<'de>>(
    response: Response,
    url: &str,
) -> Result<T, Failure> {
    let body = response.bytes().map_err(Failure::Network)?;
    serde_json::from_slice(&body)
        .map_err(|e| Failure::Malformed(format!("unexpected answer from {url}: {e}")))
}

/// The pause before attempt `attempt + 1`: [`BASE_BACKOFF`] doubled `attempt - 1` times.
fn backoff(attempt: usize) -> Duration {
    let doublings = u32::try_from(attempt - 1).unwrap_or(u32::MAX).min(16);
    (BASE_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

/// A `Retry-After` header in seconds, at most [`MAX_BACKOFF`].
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_BACKOFF))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(1), BASE_BACKOFF);
        assert_eq!(backoff(2), BASE_BACKOFF * 2);
        assert_eq!(backoff(3), BASE_BACKOFF * 4);
        assert_eq!(backoff(40), MAX_BACKOFF);
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(RETRY_AFTER, "3600".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(MAX_BACKOFF));
    }
}
