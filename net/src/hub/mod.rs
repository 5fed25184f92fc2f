//! Publishing to and fetching from the Hugging Face Hub, over its HTTP API with reqwest's
//! blocking client.
//!
//! [`push_folder`] creates the model repository (or reuses one a failed push left without a
//! model) and uploads a folder in one commit, which the Hub applies atomically, so a failed push
//! is retried by running it again. [`pull`] fills the standard HF cache, pinned to one commit.
//! Tokens are checked before any request; errors name the repo and endpoint and the next step.
//!
//! The requests are those `huggingface_hub` makes (`hf_api.py`: `create_repo`, `repo_info`,
//! `create_commit`; `_commit_api.py`: `_fetch_upload_modes`, `_prepare_commit_payload`;
//! `lfs.py`: `post_lfs_batch_info`, `lfs_upload`; `file_download.py`: `hf_hub_download`), all but
//! the storage ones with `Authorization: Bearer <token>` when there is a token:
//!
//! - `POST /api/repos/create` with `{"type", "name", "organization", "private"}`; HTTP 409 means
//!   the repository exists.
//! - `GET /api/models/{repo}/revision/{revision}`: the commit id (`sha`) and files (`siblings`).
//! - `POST /api/models/{repo}/preupload/{revision}` with each file's path, size and first 512
//!   bytes (base64): the Hub answers, per file, whether it goes inline in the commit (`regular`)
//!   or through LFS (`lfs`, e.g. `*.safetensors` by the repository's `.gitattributes`).
//! - LFS files: `POST /{repo}.git/info/lfs/objects/batch` (git-lfs batch API, media type
//!   `application/vnd.git-lfs+json`) with their SHA-256 and size. An object the Hub already
//!   holds comes back without actions and is not sent again; otherwise the bytes are `PUT` to the
//!   storage URL it names (without the Hub token), in one piece, or, when its header carries
//!   `chunk_size`, in numbered parts whose ETags are then `POST`ed to it; then its `verify`
//!   action, if any, is `POST`ed `{"oid", "size"}`.
//! - `POST /api/models/{repo}/commit/{revision}`, NDJSON: a `header` line with the message, a
//!   `file` line (base64 content) per regular file and an `lfsFile` line (SHA-256, size) per LFS
//!   file; the answer holds `commitUrl` and `commitOid`.
//! - `HEAD /{repo}/resolve/{revision}/{file}`, not following redirects to other hosts: the
//!   commit (`X-Repo-Commit`) and blob id (`X-Linked-Etag`, else `ETag`); then `GET` of the same
//!   file at that commit, following redirects (to the Hub's CDN, where reqwest drops the
//!   `Authorization` header, as it does on any redirect to another host).
//!
//! Requests that fail transiently (connection error, timeout, HTTP 408, 429 or 5xx) are sent
//! again after a pause that doubles each time (or the server's `Retry-After`).
//!
//! `upload.rs` holds a push's steps (the repository, the preupload call, the LFS uploads, the
//! commit), `download.rs` a pull's requests, `cache.rs` the cache's layout and locks, and
//! `retry.rs` the failures of requests and the retries of transient ones.

mod cache;
mod download;
mod retry;
mod upload;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use reqwest::blocking::{Client, RequestBuilder};
use reqwest::redirect::Policy;
use reqwest::Url;

use cache::RepoCache;
use upload::Upload;

/// The Hub used when neither the options nor `HF_ENDPOINT` name one.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Time allowed for an API answer, and for each read of a download.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Where and as whom to talk to the Hub.
#[derive(Clone)]
pub struct HubOptions {
    /// Hub base URL; `None` means `HF_ENDPOINT`, else `https://huggingface.co`.
    pub endpoint: Option<String>,
    /// Access token; `None` means `HF_TOKEN`, else the file at `HF_TOKEN_PATH`, else
    /// `$HF_HOME/token` (where `hf auth login` writes it).
    pub token: Option<String>,
    /// Branch (or, for [`pull`], commit) to work on.
    pub revision: String,
    /// Create the repository as private (a repository that already exists keeps its visibility).
    pub private: bool,
    /// Allow adding a commit to a repository that already holds a model.
    pub update: bool,
    /// Download cache; `None` means `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`.
    pub cache_dir: Option<PathBuf>,
    /// Attempts per request before a transient failure (connection error, timeout, HTTP 429 or
    /// 5xx) is reported; 1 disables retrying.
    pub retries: usize,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            endpoint: None,
            token: None,
            revision: "main".to_string(),
            private: false,
            update: false,
            cache_dir: None,
            retries: 3,
        }
    }
}

impl fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubOptions")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("revision", &self.revision)
            .field("private", &self.private)
            .field("update", &self.update)
            .field("cache_dir", &self.cache_dir)
            .field("retries", &self.retries)
            .finish()
    }
}

/// `hf://user/name` or `hf://user/name@revision` → (repo, revision); `None` for anything else.
pub fn parse_hf_path(s: &str) -> Option<(String, Option<String>)> {
    let rest = s.strip_prefix("hf://")?;
    let (repo, revision) = match rest.split_once('@') {
        Some((repo, revision)) if !revision.is_empty() => (repo, Some(revision.to_string())),
        Some(_) => return None,
        None => (rest, None),
    };
    validate_repo_id(repo).ok()?;
    Some((repo.to_string(), revision))
}

/// Uploads every regular file directly in `folder` (subdirectories are skipped) to model
/// repository `repo` (`user/name`) in one commit on `opts.revision`; returns the commit URL (or,
/// if the Hub sends none, the commit id).
///
/// The repository is created if needed. One that already exists is refused when it holds a
/// `model.safetensors`, unless `opts.update` is set; one that exists without a model (left by a
/// push that failed after creating it) is reused, which is how a failed push is retried.
pub fn push_folder(repo: &str, folder: &Path, message: &str, opts: &HubOptions) -> Result<String> {
    validate_repo_id(repo)?;
    ensure!(
        !opts.revision.is_empty(),
        "the revision to push to must not be empty"
    );
    ensure!(
        !message.trim().is_empty(),
        "the commit message must not be empty"
    );
    let files = folder_files(folder)?;
    let hub = Hub::connect(repo, opts)?;
    if hub.token.is_none() {
        bail!(
            "no Hugging Face token found to push {repo} to {}: set HF_TOKEN to a token with write \
             access (https://huggingface.co/settings/tokens), or store one in {} with \
             `hf auth login`",
            hub.endpoint,
            token_file().display()
        );
    }
    hub.create_repo(opts.private, opts.update)?;
    let mut uploads = files
        .into_iter()
        .map(|(name, path)| Upload::read(name, path))
        .collect::<Result<Vec<_>>>()?;
    hub.preupload(&mut uploads)?;
    hub.upload_lfs_objects(&uploads)?;
    hub.commit(&uploads, message)
}

/// Downloads `files` of model repository `repo` at `opts.revision` into the Hugging Face cache
/// (the standard layout: `models--{owner}--{name}/` with `blobs/`, `snapshots/{commit}/` and
/// `refs/{revision}`) and returns the snapshot directory holding them. All files come from the
/// commit the revision names when the first one is fetched; when `opts.revision` is a commit id,
/// files already in its snapshot are used without a request.
pub fn pull(repo: &str, files: &[&str], opts: &HubOptions) -> Result<PathBuf> {
    validate_repo_id(repo)?;
    ensure!(
        !opts.revision.is_empty(),
        "the revision to pull must not be empty"
    );
    ensure!(!files.is_empty(), "no files to pull from {repo}");
    let hub = Hub::connect(repo, opts)?;
    let cache = RepoCache::new(
        &opts.cache_dir.clone().unwrap_or_else(default_cache_dir),
        repo,
    );
    let mut commit = is_commit_id(&opts.revision).then(|| opts.revision.clone());
    for file in files {
        if let Some(commit) = &commit {
            if cache.snapshot(commit).join(file).is_file() {
                continue;
            }
        }
        let meta = hub
            .file_metadata(file, commit.as_deref().unwrap_or(&opts.revision))
            .map_err(|e| hub.pull_error(e, file))?;
        let commit = commit.get_or_insert_with(|| meta.commit.clone());
        let blob = cache.blob(&meta.etag);
        if !blob.is_file() {
            // Ranks of one job pulling the same weights into a shared cache download them once:
            // the others wait on the blob's lock and find it there.
            let _lock = cache.lock_blob(&meta.etag, file)?;
            if !blob.is_file() {
                hub.download(file, commit, &blob)?;
            }
        }
        cache.link(commit, file, &meta.etag)?;
    }
    let commit = commit.expect("at least one file was pulled");
    if commit != opts.revision {
        cache.write_ref(&opts.revision, &commit)?;
    }
    Ok(cache.snapshot(&commit))
}

/// A client bound to one model repository, with what error messages need to name.
struct Hub {
    /// For the Hub's API and `HEAD`s: follows redirects only within the endpoint's origin.
    api: Client,
    /// For uploads and downloads: follows redirects anywhere, with no overall time limit.
    transfer: Client,
    repo_id: String,
    /// The revision asked for, as error messages name it.
    revision: String,
    /// The base URL, without a trailing `/`.
    endpoint: String,
    token: Option<String>,
    /// Attempts per request, at least 1.
    retries: usize,
}

impl Hub {
    fn connect(repo: &str, opts: &HubOptions) -> Result<Self> {
        let endpoint = opts
            .endpoint
            .clone()
            .or_else(|| env("HF_ENDPOINT"))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let origin = Url::parse(&endpoint)
            .with_context(|| {
                format!("invalid Hub endpoint `{endpoint}` (check --endpoint or HF_ENDPOINT)")
            })?
            .origin();
        let same_origin = Policy::custom(move |attempt| {
            if attempt.previous().len() < 10 && attempt.url().origin() == origin {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let builder = crate::client::http_client;
        let api = builder()
            .timeout(READ_TIMEOUT)
            .redirect(same_origin)
            .build()
            .context("cannot set up the HTTP client")?;
        let transfer = builder()
            .timeout(None)
            .build()
            .context("cannot set up the HTTP client")?;
        Ok(Self {
            api,
            transfer,
            repo_id: repo.to_string(),
            revision: opts.revision.clone(),
            endpoint,
            token: resolve_token(opts.token.as_deref()),
            retries: opts.retries.max(1),
        })
    }

    /// `{endpoint}/api/models/{repo}/{action}/{revision}`, the revision percent-encoded whole
    /// (`refs/pr/1` → `refs%2Fpr%2F1`).
    fn api_url(&self, action: &str, revision: &str) -> String {
        let (endpoint, repo) = (&self.endpoint, &self.repo_id);
        let revision = percent_encode(revision, false);
        format!("{endpoint}/api/models/{repo}/{action}/{revision}")
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{file}`.
    fn resolve_url(&self, revision: &str, file: &str) -> String {
        let (endpoint, repo) = (&self.endpoint, &self.repo_id);
        let revision = percent_encode(revision, false);
        let file = percent_encode(file, true);
        format!("{endpoint}/{repo}/resolve/{revision}/{file}")
    }

    /// `request` with the token, if there is one.
    fn authorized(&self, request: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

/// `s` percent-encoded as `huggingface_hub` quotes URL parts: ASCII letters, digits and `-._~`
/// kept, `/` kept when `keep_slash`, every other byte of its UTF-8 as `%XX`.
fn percent_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(byte));
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// A full commit id: 40 hexadecimal digits.
fn is_commit_id(revision: &str) -> bool {
    revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `user/name` with the Hub's naming rules: letters, digits, `-`, `_` and `.`, at most 96
/// characters, not starting or ending with `-` or `.`, no `--` or `..`.
fn validate_repo_id(repo: &str) -> Result<()> {
    let valid = |part: &str| {
        !part.is_empty()
            && part.len() <= 96
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && !part.starts_with(['-', '.'])
            && !part.ends_with(['-', '.'])
            && !part.contains("--")
            && !part.contains("..")
    };
    match repo.split_once('/') {
        Some((owner, name)) if valid(owner) && valid(name) => Ok(()),
        _ => bail!(
            "invalid repository id `{repo}`: expected `user/name` (letters, digits, `-`, `_` and \
             `.`)"
        ),
    }
}

/// The regular files directly in `folder`, as (name in the repository, path), sorted by name.
fn folder_files(folder: &Path) -> Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(folder)
        .with_context(|| format!("cannot read the folder to push, {}", folder.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("cannot read the folder to push, {}", folder.display()))?
            .path();
        if !path.is_file() {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .with_context(|| format!("{} is not a valid UTF-8 file name", path.display()))?
            .to_string();
        files.push((name, path));
    }
    ensure!(
        !files.is_empty(),
        "{} holds no files to push",
        folder.display()
    );
    files.sort();
    Ok(files)
}

/// An environment variable's value, unless unset or empty.
fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    env("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let cache = env("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let home = std::env::home_dir().unwrap_or_else(|| PathBuf::from("/tmp"));
            home.join(".cache")
        });
        cache.join("huggingface")
    })
}

/// `HF_HUB_CACHE`, else `$HF_HOME/hub`.
fn default_cache_dir() -> PathBuf {
    env("HF_HUB_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("hub"))
}

/// The token to use, in `huggingface_hub`'s order: `explicit`, unless empty; then, unless
/// `HF_HUB_DISABLE_IMPLICIT_TOKEN` is set, `HF_TOKEN`, the file at `HF_TOKEN_PATH`, and
/// `$HF_HOME/token`.
fn resolve_token(explicit: Option<&str>) -> Option<String> {
    if let Some(token) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return Some(token.to_string());
    }
    if env("HF_HUB_DISABLE_IMPLICIT_TOKEN").is_some() {
        return None;
    }
    let read = |path: PathBuf| {
        let token = std::fs::read_to_string(path).ok()?.trim().to_string();
        (!token.is_empty()).then_some(token)
    };
    env("HF_TOKEN")
        .or_else(|| env("HF_TOKEN_PATH").and_then(|path| read(PathBuf::from(path))))
        .or_else(|| read(hf_home().join("token")))
}

/// Where a stored token is looked for: `HF_TOKEN_PATH`, else `$HF_HOME/token`.
fn token_file() -> PathBuf {
    env("HF_TOKEN_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_home().join("token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encode_quotes_like_huggingface_hub() {
        assert_eq!(percent_encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(percent_encode("a dir/é.bin", true), "a%20dir/%C3%A9.bin");
        assert_eq!(percent_encode("v1.0-rc_2~x", false), "v1.0-rc_2~x");
    }
}
