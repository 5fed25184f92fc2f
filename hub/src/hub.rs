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

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use reqwest::blocking::{Body, Client, RequestBuilder, Response};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, ETAG, RETRY_AFTER};
use reqwest::redirect::Policy;
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use ssl_train::atomic;

/// The file whose presence marks a repository as already holding a model.
const MODEL_FILE: &str = "model.safetensors";
/// The Hub used when neither the options nor `HF_ENDPOINT` name one.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The media type of git-lfs batch requests and answers.
const LFS_MEDIA_TYPE: &str = "application/vnd.git-lfs+json";
/// How many leading bytes of each file the preupload call sees.
const SAMPLE_BYTES: usize = 512;
/// Time allowed for an API answer, and for each read of a download.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Time allowed for the commit, which the Hub may take a while to apply.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(300);
/// The pause before the first retry; it doubles with each further one, up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(500);
/// The longest pause between two attempts, also for a server's `Retry-After`.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

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

/// A file to commit: its name in the repository, where it is, and what the Hub is told of it.
struct Upload {
    name: String,
    path: PathBuf,
    size: u64,
    /// The first [`SAMPLE_BYTES`] bytes, from which the Hub tells text from binary files.
    sample: Vec<u8>,
    /// SHA-256 of the content, in lowercase hex: the file's LFS object id.
    sha256: String,
    /// Set by [`Hub::preupload`].
    mode: UploadMode,
}

/// How a file reaches the commit, as the preupload call decides.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UploadMode {
    /// Inline, base64, in the commit itself.
    Regular,
    /// As an LFS object, uploaded before the commit that names it.
    Lfs,
    /// Not at all: the repository's `.gitignore` excludes it.
    Ignored,
}

/// What `HEAD /{repo}/resolve/{revision}/{file}` tells of a file.
struct FileMetadata {
    /// The commit the revision resolved to.
    commit: String,
    /// The blob id, the file's name under `blobs/` in the cache.
    etag: String,
}

/// Why a request failed (after any retries).
#[derive(Debug)]
enum Failure {
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

    fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The Hub's `X-Error-Code`, e.g. `RepoNotFound`.
    fn code(&self) -> Option<&str> {
        match self {
            Self::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// Whether trying again later may succeed.
    fn is_transient(&self) -> bool {
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

/// The preupload call's answer: how each file is to be uploaded.
#[derive(Deserialize)]
struct PreuploadAnswer {
    files: Vec<PreuploadFile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PreuploadFile {
    path: String,
    upload_mode: String,
    #[serde(default)]
    should_ignore: bool,
}

/// The LFS batch call's answer.
#[derive(Deserialize)]
struct LfsBatch {
    objects: Vec<LfsObject>,
}

#[derive(Deserialize)]
struct LfsObject {
    oid: String,
    /// Absent when the Hub already holds the object.
    actions: Option<LfsActions>,
    error: Option<LfsError>,
}

#[derive(Deserialize)]
struct LfsActions {
    upload: Option<LfsAction>,
    verify: Option<LfsAction>,
}

#[derive(Deserialize)]
struct LfsAction {
    href: String,
    /// For a multi-part upload, `chunk_size` and the part URLs keyed by their number
    /// (`"00001"`, …). Like `huggingface_hub`, nothing else of it is used: storage URLs are
    /// pre-signed.
    #[serde(default)]
    header: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
struct LfsError {
    message: String,
}

/// The commit call's answer.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CommitAnswer {
    commit_url: Option<String>,
    commit_oid: Option<String>,
}

/// The repository's information at a revision.
#[derive(Deserialize)]
struct RepoInfo {
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
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
        let builder = crate::download::http_client;
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

    /// Sends the request `build` makes, again after a pause while it fails transiently and
    /// attempts remain. A success or redirection status is returned as is.
    fn send(&self, build: impl Fn() -> RequestBuilder) -> Result<Response, Failure> {
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

    /// [`Self::send`]s a JSON `body` to the Hub's API and reads the JSON answer.
    fn post_json<T: for<'de> Deserialize<'de>>(
        &self,
        url: &str,
        content_type: &str,
        body: &Value,
    ) -> Result<T, Failure> {
        let body = body.to_string();
        let response = self.send(|| {
            let request = self.api.post(url).header(CONTENT_TYPE, content_type);
            self.authorized(request.header(ACCEPT, content_type).body(body.clone()))
        })?;
        read_json(response, url)
    }

    /// Creates the repository, or checks that the existing one may take this push.
    fn create_repo(&self, private: bool, update: bool) -> Result<()> {
        let (owner, name) = self.repo_id.split_once('/').expect("a validated repo id");
        let body =
            json!({ "type": "model", "name": name, "organization": owner, "private": private });
        let url = format!("{}/api/repos/create", self.endpoint);
        match self.post_json::<Value>(&url, "application/json", &body) {
            Ok(_) => Ok(()),
            Err(failure) if failure.status() == Some(StatusCode::CONFLICT) && update => Ok(()),
            Err(failure) if failure.status() == Some(StatusCode::CONFLICT) => {
                let url = self.api_url("revision", &self.revision);
                let has_model = match self.send(|| self.authorized(self.api.get(&url))) {
                    Ok(response) => {
                        let info: RepoInfo =
                            read_json(response, &url).map_err(|e| self.push_error(e))?;
                        info.siblings.iter().any(|f| f.rfilename == MODEL_FILE)
                    }
                    // The branch does not exist yet, so it holds no model; the commit reports it.
                    Err(failure) if failure.code() == Some("RevisionNotFound") => false,
                    Err(failure) => return Err(self.push_error(failure)),
                };
                ensure!(
                    !has_model,
                    "repository {} already exists on {} and holds a model; pass --update to add \
                     a new commit to it",
                    self.repo_id,
                    self.endpoint
                );
                Ok(())
            }
            Err(failure) => Err(self.push_error(failure)),
        }
    }

    /// Asks the Hub how to upload each file, setting their [`Upload::mode`].
    fn preupload(&self, uploads: &mut [Upload]) -> Result<()> {
        let files: Vec<Value> = uploads
            .iter()
            .map(|u| json!({ "path": u.name, "size": u.size, "sample": BASE64.encode(&u.sample) }))
            .collect();
        let url = self.api_url("preupload", &self.revision);
        let answer: PreuploadAnswer = self
            .post_json(&url, "application/json", &json!({ "files": files }))
            .map_err(|e| self.push_error(e))?;
        for upload in uploads {
            let Some(file) = answer.files.iter().find(|f| f.path == upload.name) else {
                return Err(self.push_error(Failure::Malformed(format!(
                    "the preupload answer does not mention {}",
                    upload.name
                ))));
            };
            upload.mode = match file.upload_mode.as_str() {
                _ if file.should_ignore => UploadMode::Ignored,
                // Storage cannot take empty objects, so the Hub commits empty files inline.
                "lfs" if upload.size > 0 => UploadMode::Lfs,
                "lfs" | "regular" => UploadMode::Regular,
                other => {
                    return Err(self.push_error(Failure::Malformed(format!(
                        "unknown upload mode `{other}` for {}",
                        upload.name
                    ))));
                }
            };
        }
        Ok(())
    }

    /// Uploads the LFS objects of `uploads` the Hub does not hold yet.
    fn upload_lfs_objects(&self, uploads: &[Upload]) -> Result<()> {
        let mut lfs: Vec<&Upload> = uploads
            .iter()
            .filter(|u| u.mode == UploadMode::Lfs)
            .collect();
        // Files with the same content are one object.
        lfs.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        lfs.dedup_by(|a, b| a.sha256 == b.sha256);
        if lfs.is_empty() {
            return Ok(());
        }
        let objects: Vec<Value> = lfs
            .iter()
            .map(|u| json!({ "oid": u.sha256, "size": u.size }))
            .collect();
        let body = json!({
            "operation": "upload",
            "transfers": ["basic", "multipart"],
            "objects": objects,
            "hash_algo": "sha256",
            "ref": { "name": self.revision },
        });
        let url = format!(
            "{}/{}.git/info/lfs/objects/batch",
            self.endpoint, self.repo_id
        );
        let batch: LfsBatch = self
            .post_json(&url, LFS_MEDIA_TYPE, &body)
            .map_err(|e| self.push_error(e))?;
        for upload in lfs {
            let Some(object) = batch.objects.iter().find(|o| o.oid == upload.sha256) else {
                return Err(self.push_error(Failure::Malformed(format!(
                    "the LFS batch answer does not mention {} ({})",
                    upload.name, upload.sha256
                ))));
            };
            if let Some(error) = &object.error {
                bail!(
                    "the Hub at {} refused to store {} for {}: {}",
                    self.endpoint,
                    upload.name,
                    self.repo_id,
                    error.message
                );
            }
            let Some(actions) = &object.actions else {
                continue;
            };
            if let Some(action) = &actions.upload {
                self.put_object(upload, action)
                    .map_err(|e| self.storage_error(upload, e))?;
            }
            if let Some(verify) = &actions.verify {
                let body = json!({ "oid": upload.sha256, "size": upload.size });
                self.send(|| {
                    let request = self.api.post(&verify.href);
                    let request = request.header(CONTENT_TYPE, "application/json");
                    self.authorized(request.body(body.to_string()))
                })
                .map_err(|e| self.push_error(e))?;
            }
        }
        Ok(())
    }

    /// Sends `upload`'s bytes where its LFS `action` says: in one `PUT`, or, when the action's
    /// header has a `chunk_size`, a `PUT` per part and then the parts' ETags to `action.href`
    /// (`lfs.py`'s `_upload_single_part` and `_upload_multi_part`).
    fn put_object(&self, upload: &Upload, action: &LfsAction) -> Result<(), Failure> {
        let Some(chunk_size) = action.header.get("chunk_size") else {
            self.send(|| {
                let request = self.transfer.put(&action.href);
                request.body(file_slice(&upload.path, 0, upload.size))
            })?;
            return Ok(());
        };
        let chunk_size = chunk_size
            .as_str()
            .and_then(|s| s.parse::<u64>().ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| Failure::Malformed(format!("invalid chunk_size {chunk_size}")))?;
        let mut parts: Vec<(u64, &str)> = action
            .header
            .iter()
            .filter(|(key, _)| !key.is_empty() && key.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|(key, url)| Some((key.parse().ok()?, url.as_str()?)))
            .collect();
        parts.sort();
        if parts.len() as u64 != upload.size.div_ceil(chunk_size) {
            return Err(Failure::Malformed(format!(
                "{} part URLs for {} bytes in parts of {chunk_size}",
                parts.len(),
                upload.size
            )));
        }
        let mut etags = Vec::with_capacity(parts.len());
        for (index, (_, url)) in (0u64..).zip(parts) {
            let offset = index * chunk_size;
            let length = chunk_size.min(upload.size - offset);
            let response = self.send(|| {
                self.transfer
                    .put(url)
                    .body(file_slice(&upload.path, offset, length))
            })?;
            let etag = response.headers().get(ETAG).and_then(|v| v.to_str().ok());
            let etag = etag.filter(|e| !e.is_empty()).ok_or_else(|| {
                Failure::Malformed(format!("no ETag for part {} of {}", index + 1, upload.name))
            })?;
            etags.push(json!({ "partNumber": index + 1, "etag": etag }));
        }
        let body = json!({ "oid": upload.sha256, "parts": etags }).to_string();
        self.send(|| {
            let request = self.transfer.post(&action.href);
            let request = request.header(CONTENT_TYPE, LFS_MEDIA_TYPE);
            request.header(ACCEPT, LFS_MEDIA_TYPE).body(body.clone())
        })?;
        Ok(())
    }

    /// Commits `uploads` with `message`; returns the commit URL, else its id, else the repo URL.
    fn commit(&self, uploads: &[Upload], message: &str) -> Result<String> {
        let header = json!({ "key": "header", "value": { "summary": message, "description": "" } });
        let mut lines = vec![header.to_string()];
        for upload in uploads {
            let line = match upload.mode {
                UploadMode::Ignored => continue,
                UploadMode::Lfs => json!({ "key": "lfsFile", "value": {
                    "path": upload.name, "algo": "sha256", "oid": upload.sha256, "size": upload.size,
                } }),
                UploadMode::Regular => {
                    let content = std::fs::read(&upload.path)
                        .with_context(|| format!("cannot read {}", upload.path.display()))?;
                    json!({ "key": "file", "value": {
                        "content": BASE64.encode(content), "path": upload.name, "encoding": "base64",
                    } })
                }
            };
            lines.push(line.to_string());
        }
        let body = lines.join("\n") + "\n";
        let url = self.api_url("commit", &self.revision);
        let response = self
            .send(|| {
                let request = self.api.post(&url).timeout(COMMIT_TIMEOUT);
                let request = request.header(CONTENT_TYPE, "application/x-ndjson");
                self.authorized(request.body(body.clone()))
            })
            .map_err(|e| self.push_error(e))?;
        let answer: CommitAnswer = read_json(response, &url).map_err(|e| self.push_error(e))?;
        Ok(answer
            .commit_url
            .or(answer.commit_oid)
            .unwrap_or_else(|| format!("{}/{}", self.endpoint, self.repo_id)))
    }

    /// The commit and blob id of `file` at `revision`, from a `HEAD` of its resolve URL.
    fn file_metadata(&self, file: &str, revision: &str) -> Result<FileMetadata, Failure> {
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
    fn download(&self, file: &str, commit: &str, blob: &Path) -> Result<()> {
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

    /// Explains a failed push step.
    fn push_error(&self, failure: Failure) -> anyhow::Error {
        let (repo, endpoint) = (&self.repo_id, &self.endpoint);
        let message = match failure.status() {
            Some(StatusCode::UNAUTHORIZED) => format!(
                "the Hub at {endpoint} refused the token (HTTP 401): check that HF_TOKEN holds a \
                 valid, unexpired token with write access to {repo}"
            ),
            Some(StatusCode::FORBIDDEN) => format!(
                "the Hub at {endpoint} refused the token (HTTP 403): it is valid but may not \
                 write there; check that HF_TOKEN holds a token with write access to {repo}"
            ),
            _ if failure.is_transient() => {
                return anyhow!(
                    "upload of {repo} to {endpoint} failed ({failure}); nothing was committed \
                     (Hub commits are atomic), so run the same command again to retry"
                );
            }
            _ if failure.code() == Some("RepoNotFound") => {
                return anyhow!("repository {repo} not found on {endpoint} while pushing to it");
            }
            _ => format!("push to {repo} on {endpoint} failed"),
        };
        anyhow::Error::new(failure).context(message)
    }

    /// Explains a failed upload of an LFS object to the Hub's storage.
    fn storage_error(&self, upload: &Upload, failure: Failure) -> anyhow::Error {
        anyhow!(
            "upload of {} ({} bytes) for {} to the Hub's storage failed ({failure}); nothing was \
             committed (Hub commits are atomic), so run the same command again to retry",
            upload.name,
            upload.size,
            self.repo_id
        )
    }

    /// Explains a failed download, telling a missing repository, revision and file apart by
    /// the Hub's `X-Error-Code`.
    fn pull_error(&self, failure: Failure, file: &str) -> anyhow::Error {
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

impl Upload {
    /// Reads `path`'s size, first bytes and SHA-256.
    fn read(name: String, path: PathBuf) -> Result<Self> {
        let cannot_read = || format!("cannot read {}", path.display());
        let mut file = File::open(&path).with_context(cannot_read)?;
        let (mut hasher, mut sample, mut size) = (Sha256::new(), Vec::new(), 0u64);
        let mut buffer = vec![0; 1 << 16];
        loop {
            let n = match file.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).with_context(cannot_read),
            };
            let take = n.min(SAMPLE_BYTES - sample.len());
            sample.extend_from_slice(&buffer[..take]);
            hasher.update(&buffer[..n]);
            size += n as u64;
        }
        Ok(Self {
            name,
            path,
            size,
            sample,
            sha256: hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            mode: UploadMode::Regular,
        })
    }
}

/// A request body of `length` bytes of the file at `path` from `offset`, with its
/// `Content-Length`.
fn file_slice(path: &Path, offset: u64, length: u64) -> Body {
    let slice = FileSlice {
        path: path.to_path_buf(),
        offset,
        length,
        reader: None,
    };
    Body::sized(slice, length)
}

/// Part of a file, opened when first read, so that each attempt at a request reads it afresh
/// and a file that cannot be read fails the request that was to send it.
struct FileSlice {
    path: PathBuf,
    offset: u64,
    length: u64,
    reader: Option<io::Take<File>>,
}

impl Read for FileSlice {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let reader = match &mut self.reader {
            Some(reader) => reader,
            None => {
                let mut file = File::open(&self.path)?;
                file.seek(SeekFrom::Start(self.offset))?;
                self.reader.insert(file.take(self.length))
            }
        };
        reader.read(buf)
    }
}

/// The JSON body of a successful `response` to `url`.
fn read_json<T: for<'de> Deserialize<'de>>(response: Response, url: &str) -> Result<T, Failure> {
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

/// Whether a server-sent id can name a cache entry: letters, digits, `-`, `_` and `.`, not
/// starting with `.`.
fn is_safe_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// One repository's part of the Hugging Face cache: `models--{owner}--{name}/`.
struct RepoCache {
    root: PathBuf,
}

impl RepoCache {
    fn new(cache_dir: &Path, repo: &str) -> Self {
        let root = cache_dir.join(format!("models--{}", repo.replace('/', "--")));
        Self { root }
    }

    /// `snapshots/{commit}`: the repository's files at `commit`, as links to their blobs.
    fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    /// `blobs/{etag}`: the content of every version of a file with that id.
    fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    /// Holds the lock of `blobs/{etag}` until dropped, waiting while another process (or
    /// thread) holds it: `.locks/models--{owner}--{name}/{etag}.lock` beside the repository's
    /// folder, the file `huggingface_hub` locks around the same download (an advisory `flock`
    /// on Unix, which its `filelock` takes too), so the two tools sharing one cache also wait
    /// for each other.
    fn lock_blob(&self, etag: &str, file: &str) -> Result<std::fs::File> {
        let (cache, folder) = (
            self.root.parent().expect("a repository folder in a cache"),
            self.root.file_name().expect("a repository folder"),
        );
        let path = cache
            .join(".locks")
            .join(folder)
            .join(format!("{etag}.lock"));
        let parent = path.parent().expect("a lock file in a folder");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the lock file {}", path.display()))?;
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(std::fs::TryLockError::WouldBlock) => eprintln!(
                "waiting for another download of {file} into {} to finish",
                cache.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
        lock.lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
        Ok(lock)
    }

    /// Points `snapshots/{commit}/{file}` at `blobs/{etag}` (a relative symbolic link, as
    /// `huggingface_hub` makes; a copy where there are none), replacing it in one rename.
    fn link(&self, commit: &str, file: &str, etag: &str) -> Result<()> {
        let pointer = self.snapshot(commit).join(file);
        let temp = atomic::temp_path(&pointer);
        let parent = pointer.parent().expect("a file in a snapshot");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let _ = std::fs::remove_file(&temp);
        #[cfg(unix)]
        let made = {
            let depth = Path::new(file).components().count();
            let target = "../".repeat(depth + 1) + "blobs/" + etag;
            std::os::unix::fs::symlink(target, &temp)
        };
        #[cfg(not(unix))]
        let made = std::fs::copy(self.blob(etag), &temp).map(drop);
        made.with_context(|| format!("cannot create {}", temp.display()))?;
        std::fs::rename(&temp, &pointer)
            .with_context(|| format!("cannot create {}", pointer.display()))
    }

    /// Records in `refs/{revision}` that `revision` named `commit`.
    fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        write_atomically(&self.root.join("refs").join(revision), |out| {
            Ok(out.write_all(commit.as_bytes())?)
        })
    }
}

/// Creates `path`, and its directory, through [`atomic::write_with`].
fn write_atomically(path: &Path, write: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let parent = path.parent().expect("a path in the cache");
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    atomic::write_with(path, write)
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

    #[test]
    fn upload_reads_size_sample_and_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abc");
        std::fs::write(&path, b"abc").unwrap();
        let upload = Upload::read("abc".into(), path.clone()).unwrap();
        assert_eq!(upload.size, 3);
        assert_eq!(upload.sample, b"abc");
        assert_eq!(
            upload.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long: Vec<u8> = (0..2000u32).map(|i| i as u8).collect();
        std::fs::write(&path, &long).unwrap();
        let upload = Upload::read("abc".into(), path).unwrap();
        assert_eq!(upload.size, 2000);
        assert_eq!(upload.sample, long[..SAMPLE_BYTES]);
    }
}
