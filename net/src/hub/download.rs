//! A pull's requests: a file's commit and blob id from a `HEAD` of its resolve URL, its download
//! into the cache, and the errors that tell a missing repository, revision and file apart.

use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use reqwest::StatusCode;

use super::cache::write_atomically;
use super::retry::Failure;
use super::{Hub, READ_TIMEOUT};

/// What `HEAD /{repo}/resolve/{revision}/{file}` tells of a file.
pub(super) struct FileMetadata {
    /// The commit the revision resolved to.
    pub(super) commit: String,
    /// The blob id, the file's name under `blobs/` in the cache.
    pub(super) etag: String,
}

impl Hub {
    /// The commit and blob id of `file` at `revision`, from a `HEAD` of its resolve URL.
    pub(super) fn file_metadata(
        &self,
        file: &str,
        revision: &str,
    ) -> Result<FileMetadata, Failure> {
        let url = self.resolve_url(revision, file);
        let response = self.send(|| self.authorized(self.api.head(&url)))?;
        let headers = response.headers();
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let commit = header("x-repo-commit").filter(|c| is_safe_name(c));
        let etag = header("x-linked-etag").or_else(|| header("etag"));
        let etag = etag.map(|e| e.strip_prefix("W/").unwrap_or(e).trim_matches('"'));
        match (commit, etag.filter(|e| is_safe_name(e))) {
            (Some(commit), Some(etag)) => Ok(FileMetadata {
                commit: commit.to_string(),
                etag: etag.to_string(),
            }),
            _ => Err(Failure::Malformed(format!(
                "{url} answered without a valid X-Repo-Commit and ETag"
            ))),
        }
    }

    /// Downloads `file` at `commit` into `blob`, through a temporary file beside it.
    pub(super) fn download(&self, file: &str, commit: &str, blob: &Path) -> Result<()> {
        let url = self.resolve_url(commit, file);
        let request = || self.authorized(self.transfer.get(&url).timeout(READ_TIMEOUT));
        let mut response = self.send(request).map_err(|e| self.pull_error(e, file))?;
        if !response.status().is_success() {
            let failure = Failure::Malformed(format!("{url} answered {}", response.status()));
            return Err(self.pull_error(failure, file));
        }
        write_atomically(blob, |out| {
            let mut buffer = vec![0; 1 << 16];
            loop {
                let n = match response.read(&mut buffer) {
                    Ok(0) => return Ok(()),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        bail!(
                            "download of {file} from {} on {} failed ({e}); run the same command \
                             again to retry",
                            self.repo_id,
                            self.endpoint
                        )
                    }
                };
                out.write_all(&buffer[..n])?;
            }
        })
    }

    /// Explains a failed download, telling a missing repository, revision and file apart by
    /// the Hub's `X-Error-Code`.
    pub(super) fn pull_error(&self, failure: Failure, file: &str) -> anyhow::Error {
        let (repo, revision, endpoint) = (&self.repo_id, &self.revision, &self.endpoint);
        let token_hint = match self.token {
            Some(_) => "check that HF_TOKEN holds a valid token with read access to it",
            None => "set HF_TOKEN to a token with read access to it",
        };
        let message = match (failure.status(), failure.code()) {
            (Some(StatusCode::UNAUTHORIZED), Some("RepoNotFound")) => format!(
                "repository {repo} not found on {endpoint} (HTTP 401): it does not exist, or it \
                 is private and you need to {token_hint}"
            ),
            (_, Some("RepoNotFound")) => {
                return anyhow!("repository {repo} not found on {endpoint}");
            }
            (_, Some("RevisionNotFound")) => {
                return anyhow!("revision {revision} of {repo} not found on {endpoint}");
            }
            (_, Some("EntryNotFound")) => {
                return anyhow!(
                    "file {file} of {repo} at revision {revision} not found on {endpoint}"
                );
            }
            (Some(StatusCode::UNAUTHORIZED), _) => {
                format!("the Hub at {endpoint} refused access to {repo} (HTTP 401): {token_hint}")
            }
            (Some(StatusCode::FORBIDDEN), _) => format!(
                "the Hub at {endpoint} refused access to {repo} (HTTP 403): {token_hint} (gated \
                 models also need their terms accepted on the model page)"
            ),
            _ if failure.is_transient() => {
                return anyhow!(
                    "download of {file} from {repo} on {endpoint} failed ({failure}); run the \
                     same command again to retry"
                );
            }
            _ => format!("download of {file} from {repo} on {endpoint} failed"),
        };
        anyhow::Error::new(failure).context(message)
    }
}

/// Whether a server-sent id can name a cache entry: letters, digits, `-`, `_` and `.`, not
/// starting with `.`.
fn is_safe_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::super::is_commit_id;
    use super::*;

    #[test]
    fn server_ids_that_could_leave_the_cache_are_refused() {
        assert!(is_safe_name("0123abcd"));
        assert!(is_safe_name("f00d.e7a9"));
        for bad in ["", "..", "../../etc/passwd", "a/b", ".hidden", "a b"] {
            assert!(!is_safe_name(bad), "{bad}");
        }
        assert!(is_commit_id(&"a".repeat(40)));
        assert!(!is_commit_id(&"a".repeat(39)));
        assert!(!is_commit_id(&"g".repeat(40)));
    }
}
