//! Publishing to and fetching from the Hugging Face Hub, over hf-hub's blocking client.
//!
//! [`push_folder`] creates the model repository (or reuses one a failed push left without a
//! model) and uploads a folder in one commit, which the Hub applies atomically, so a failed push
//! is retried by running it again. [`pull`] fills the standard HF cache, pinned to one commit.
//! Tokens are checked before any request; errors name the repo and endpoint and the next step.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use hf_hub::repository::CommitOperation;
use hf_hub::{HFClient, HFClientSync, HFError, HFRepositorySync, RepoTypeModel};

/// The file whose presence marks a repository as already holding a model.
const MODEL_FILE: &str = "model.safetensors";

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

    let created = hub
        .client
        .create_repository()
        .repo_id(repo)
        .repo_type(RepoTypeModel)
        .private(opts.private)
        .send();
    match created {
        Ok(_) => {}
        Err(HFError::Conflict { .. }) if opts.update => {}
        Err(HFError::Conflict { .. }) => {
            let has_model = match hub
                .repo
                .file_exists()
                .filename(MODEL_FILE)
                .revision(&opts.revision)
                .send()
            {
                Ok(exists) => exists,
                // The branch does not exist yet, so it holds no model; the commit reports it.
                Err(HFError::RevisionNotFound { .. }) => false,
                Err(e) => return Err(hub.push_error(e)),
            };
            if has_model {
                bail!(
                    "repository {repo} already exists on {} and holds a model; pass --update to \
                     add a new commit to it",
                    hub.endpoint
                );
            }
        }
        Err(e) => return Err(hub.push_error(e)),
    }

    let operations = files
        .into_iter()
        .map(|(name, path)| CommitOperation::add_file(name, path))
        .collect();
    let commit = hub
        .repo
        .create_commit()
        .operations(operations)
        .commit_message(message)
        .revision(opts.revision.as_str())
        .send()
        .map_err(|e| hub.push_error(e))?;
    Ok(commit
        .commit_url
        .or(commit.commit_oid)
        .unwrap_or_else(|| format!("{}/{repo}", hub.endpoint)))
}

/// Downloads `files` of model repository `repo` at `opts.revision` into the Hugging Face cache
/// (hf-hub's own, in the standard layout) and returns the snapshot directory holding them. All
/// files come from the commit the revision names when the first one is fetched.
pub fn pull(repo: &str, files: &[&str], opts: &HubOptions) -> Result<PathBuf> {
    validate_repo_id(repo)?;
    ensure!(
        !opts.revision.is_empty(),
        "the revision to pull must not be empty"
    );
    let Some((first, rest)) = files.split_first() else {
        bail!("no files to pull from {repo}");
    };
    let hub = Hub::connect(repo, opts)?;
    let first_path = hub.download(first, &opts.revision)?;
    let snapshot = snapshot_dir(&first_path, first)
        .with_context(|| format!("unexpected cache path {}", first_path.display()))?;
    // Pin the other files to the commit the first one came from (its snapshot directory's name).
    let commit = snapshot
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(&opts.revision);
    for file in rest {
        hub.download(file, commit)?;
    }
    Ok(snapshot)
}

/// A client bound to one model repository, with what error messages need to name.
struct Hub {
    client: HFClientSync,
    repo: HFRepositorySync<RepoTypeModel>,
    repo_id: String,
    /// The revision asked for, as error messages name it.
    revision: String,
    endpoint: String,
    token: Option<String>,
}

impl Hub {
    fn connect(repo: &str, opts: &HubOptions) -> Result<Self> {
        let token = resolve_token(opts.token.as_deref());
        let mut builder = HFClient::builder().retry_max_attempts(opts.retries.max(1) - 1);
        if let Some(endpoint) = &opts.endpoint {
            builder = builder.endpoint(endpoint.as_str());
        }
        if let Some(token) = &token {
            builder = builder.token(token.as_str());
        }
        if let Some(dir) = &opts.cache_dir {
            builder = builder.cache_dir(dir);
        }
        let client = builder
            .build()
            .context("cannot set up the Hub client (check --endpoint or HF_ENDPOINT)")?;
        let endpoint = client.endpoint().to_string();
        let client = HFClientSync::from_inner(client).context("cannot set up the Hub client")?;
        let (owner, name) = hf_hub::split_id(repo);
        Ok(Self {
            repo: client.model(owner, name),
            client,
            repo_id: repo.to_string(),
            revision: opts.revision.clone(),
            endpoint,
            token,
        })
    }

    /// Explains a failed push step.
    fn push_error(&self, err: HFError) -> anyhow::Error {
        let (repo, endpoint) = (&self.repo_id, &self.endpoint);
        let message = match &err {
            HFError::AuthRequired { .. } => format!(
                "the Hub at {endpoint} refused the token (HTTP 401): check that HF_TOKEN holds a \
                 valid, unexpired token with write access to {repo}"
            ),
            HFError::Forbidden { .. } => format!(
                "the Hub at {endpoint} refused the token (HTTP 403): it is valid but may not \
                 write there; check that HF_TOKEN holds a token with write access to {repo}"
            ),
            e if is_transient(e) => {
                return anyhow!(
                    "upload of {repo} to {endpoint} failed ({}); nothing was committed (Hub \
                     commits are atomic), so run the same command again to retry",
                    root_cause(e)
                );
            }
            HFError::RepoNotFound { .. } => {
                return anyhow!("repository {repo} not found on {endpoint} while pushing to it");
            }
            _ => format!("push to {repo} on {endpoint} failed"),
        };
        anyhow::Error::new(err).context(message)
    }

    /// Downloads one file at `revision` (the one asked for, or the commit it resolved to) into
    /// the cache, returning its snapshot path.
    fn download(&self, file: &str, revision: &str) -> Result<PathBuf> {
        self.repo
            .download_file()
            .filename(file)
            .revision(revision)
            .send()
            .map_err(|e| self.pull_error(e, file))
    }

    /// Explains a failed download, telling a missing repository, revision and file apart.
    fn pull_error(&self, err: HFError, file: &str) -> anyhow::Error {
        let (repo, revision, endpoint) = (&self.repo_id, &self.revision, &self.endpoint);
        let token_hint = match self.token {
            Some(_) => "check that HF_TOKEN holds a valid token with read access to it",
            None => "set HF_TOKEN to a token with read access to it",
        };
        let message = match &err {
            HFError::EntryNotFound { .. } | HFError::RepoNotFound { .. } => {
                return if matches!(self.repo.exists().send(), Ok(false)) {
                    anyhow!("repository {repo} not found on {endpoint}")
                } else if matches!(
                    self.repo.revision_exists().revision(revision).send(),
                    Ok(false)
                ) {
                    anyhow!("revision {revision} of {repo} not found on {endpoint}")
                } else {
                    anyhow!("file {file} of {repo} at revision {revision} not found on {endpoint}")
                };
            }
            HFError::RevisionNotFound { .. } => {
                return anyhow!("revision {revision} of {repo} not found on {endpoint}");
            }
            // The Hub answers 401 for a repository that is missing or hidden from this caller.
            HFError::AuthRequired { context }
                if context.error_code.as_deref() == Some("RepoNotFound") =>
            {
                format!(
                    "repository {repo} not found on {endpoint} (HTTP 401): it does not exist, or \
                     it is private and you need to {token_hint}"
                )
            }
            HFError::AuthRequired { .. } => {
                format!("the Hub at {endpoint} refused access to {repo} (HTTP 401): {token_hint}")
            }
            HFError::Forbidden { .. } => format!(
                "the Hub at {endpoint} refused access to {repo} (HTTP 403): {token_hint} (gated \
                 models also need their terms accepted on the model page)"
            ),
            e if is_transient(e) => {
                return anyhow!(
                    "download of {file} from {repo} on {endpoint} failed ({}); run the same \
                     command again to retry",
                    root_cause(e)
                );
            }
            _ => format!("download of {file} from {repo} on {endpoint} failed"),
        };
        anyhow::Error::new(err).context(message)
    }
}

/// Whether `err` is a network or server failure that trying again may cure (hf-hub has already
/// retried it).
fn is_transient(err: &HFError) -> bool {
    match err {
        HFError::Request { .. } | HFError::RateLimited { .. } | HFError::Xet { .. } => true,
        HFError::Http { context } => context.status.is_server_error() || context.status == 408,
        _ => false,
    }
}

/// The innermost error under `err`, e.g. "connection closed before message completed" rather
/// than reqwest's layers, each repeating the URL.
fn root_cause(err: &HFError) -> String {
    let mut cause: &dyn std::error::Error = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
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

/// The snapshot directory a cached `file` lives in: its path less the file's own components.
fn snapshot_dir(cached: &Path, file: &str) -> Option<PathBuf> {
    let depth = Path::new(file).components().count();
    cached.ancestors().nth(depth).map(Path::to_path_buf)
}

/// The token to use, in hf-hub's order: `explicit`, unless empty; then, unless
/// `HF_HUB_DISABLE_IMPLICIT_TOKEN` is set, `HF_TOKEN`, the file at `HF_TOKEN_PATH`, and
/// `$HF_HOME/token`.
fn resolve_token(explicit: Option<&str>) -> Option<String> {
    if let Some(token) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return Some(token.to_string());
    }
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    if env("HF_HUB_DISABLE_IMPLICIT_TOKEN").is_some() {
        return None;
    }
    let read = |path: PathBuf| {
        let token = std::fs::read_to_string(path).ok()?.trim().to_string();
        (!token.is_empty()).then_some(token)
    };
    env("HF_TOKEN")
        .or_else(|| env("HF_TOKEN_PATH").and_then(|path| read(PathBuf::from(path))))
        .or_else(|| read(hf_hub::hf_home().join("token")))
}

/// Where a stored token is looked for: `HF_TOKEN_PATH`, else `$HF_HOME/token`.
fn token_file() -> PathBuf {
    std::env::var_os("HF_TOKEN_PATH")
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| hf_hub::hf_home().join("token"))
}
