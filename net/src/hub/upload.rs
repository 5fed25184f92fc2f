//! A push's steps once its arguments and token are checked: creating the repository (or checking
//! the one there may take the push), the preupload call that sorts the files into inline and LFS
//! ones, the LFS objects' uploads to the Hub's storage (in one piece or in parts), and the commit.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context, Result};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use reqwest::blocking::Body;
use reqwest::header::{ACCEPT, CONTENT_TYPE, ETAG};
use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::retry::{read_json, Failure};
use super::Hub;

/// The file whose presence marks a repository as already holding a model.
const MODEL_FILE: &str = "model.safetensors";
/// The media type of git-lfs batch requests and answers.
const LFS_MEDIA_TYPE: &str = "application/vnd.git-lfs+json";
/// How many leading bytes of each file the preupload call sees.
const SAMPLE_BYTES: usize = 512;
/// Time allowed for the commit, which the Hub may take a while to apply.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(300);

/// A file to commit: its name in the repository, where it is, and what the Hub is told of it.
pub(super) struct Upload {
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
    pub(super) fn create_repo(&self, private: bool, update: bool) -> Result<()> {
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
    pub(super) fn preupload(&self, uploads: &mut [Upload]) -> Result<()> {
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
    pub(super) fn upload_lfs_objects(&self, uploads: &[Upload]) -> Result<()> {
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
    pub(super) fn commit(&self, uploads: &[Upload], message: &str) -> Result<String> {
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
}

impl Upload {
    /// Reads `path`'s size, first bytes and SHA-256.
    pub(super) fn read(name: String, path: PathBuf) -> Result<Self> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
