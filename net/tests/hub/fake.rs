//! The fake Hub: a small HTTP/1.1 server on 127.0.0.1, started by each test, that implements
//! the endpoints `huggingface_hub` calls to create a repository, commit files (preupload, then the
//! LFS batch API for the files its `.gitattributes` sends through LFS, then one NDJSON commit with
//! inline base64 and LFS pointer entries), read repository info and download files (LFS files by a
//! redirect to storage). A second server on another port plays the LFS storage and CDN, as the
//! Hub's pre-signed storage URLs live on another host. Both record every request, and the Hub
//! every commit, so the tests can check what reached them. Also the checks of the error messages
//! the tests read.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use ssl_net::hub::HubOptions;

/// A token the fake Hub accepts for reading and writing.
pub const WRITE_TOKEN: &str = "hf_write_token";
/// A token the fake Hub knows but refuses writes with (HTTP 403).
pub const READ_TOKEN: &str = "hf_read_token";
/// A model repository: its commits, oldest first, each with the files it holds.
pub struct Repo {
    pub private: bool,
    pub commits: Vec<(String, BTreeMap<String, Vec<u8>>)>,
}

impl Repo {
    /// The commit `revision` names: `main` (the head) or a commit id.
    fn commit(&self, revision: &str) -> Option<&(String, BTreeMap<String, Vec<u8>>)> {
        match revision {
            "main" => self.commits.last(),
            oid => self.commits.iter().find(|(id, _)| id == oid),
        }
    }
}

/// One request as it reached a server.
#[derive(Clone, Debug)]
pub struct Seen {
    /// It reached the storage server, not the Hub.
    pub storage: bool,
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
}

/// One commit made through the commit endpoint.
#[derive(Clone, Debug)]
pub struct Commit {
    pub repo: String,
    pub oid: String,
    pub summary: String,
    /// Every file the commit adds, in the order of its entries.
    pub files: Vec<String>,
    /// The files added by an `lfsFile` entry, with the object id it names.
    pub lfs: Vec<(String, String)>,
}

#[derive(Clone, Copy)]
pub enum Fault {
    /// Close the connection without answering.
    Drop,
    /// Answer with this HTTP status.
    Status(u16),
}

#[derive(Default)]
pub struct State {
    pub repos: HashMap<String, Repo>,
    pub requests: Vec<Seen>,
    pub commits: Vec<Commit>,
    /// How every commit request fails, if it does.
    pub commit_fault: Option<Fault>,
    /// Commit requests failed so far.
    pub failed_commits: usize,
    pub oids: u64,
    /// What each preupload call was told, by repository and path: the size and the sample.
    pub preuploaded: HashMap<(String, String), (u64, Vec<u8>)>,
    /// The LFS objects in storage, by SHA-256 (hex).
    pub lfs_objects: HashMap<String, Vec<u8>>,
    /// The parts of multi-part uploads received so far, by object id and part number.
    pub parts: BTreeMap<(String, usize), Vec<u8>>,
    /// Objects that passed the verify call.
    pub verified: Vec<String>,
    /// When set, the batch endpoint asks for multi-part uploads in parts of this many bytes.
    pub chunk_size: Option<usize>,
    /// How every upload to storage (`PUT`) fails, if it does.
    pub storage_fault: Option<Fault>,
    /// Uploads to storage failed so far.
    pub failed_puts: usize,
    /// The CDN sends half of each file and closes the connection.
    pub cut_downloads: bool,
    /// With `cut_downloads`, the CDN keeps the connection open for a minute instead.
    pub stall_downloads: bool,
    /// Both servers wait this long before answering a `GET`.
    pub slow_gets: Option<std::time::Duration>,
}

impl State {
    fn new_oid(&mut self) -> String {
        self.oids += 1;
        format!("{:040x}", 0xc0ff_ee00_u64 + self.oids)
    }

    pub fn calls(&self) -> Vec<(String, String)> {
        let seen = self.requests.iter();
        seen.map(|r| (r.method.clone(), r.path.clone())).collect()
    }

    /// The requests that reached the storage server.
    pub fn storage_requests(&self) -> Vec<Seen> {
        let seen = self.requests.iter().filter(|r| r.storage);
        seen.cloned().collect()
    }
}

/// The two servers' base URLs.
#[derive(Clone)]
struct Bases {
    hub: String,
    storage: String,
}

pub struct FakeHub {
    pub endpoint: String,
    pub state: Arc<Mutex<State>>,
}

impl FakeHub {
    pub fn start() -> Self {
        let bind = || {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind a fake server");
            let base = format!("http://{}", listener.local_addr().unwrap());
            (listener, base)
        };
        let ((hub, hub_base), (storage, storage_base)) = (bind(), bind());
        let bases = Bases {
            hub: hub_base,
            storage: storage_base,
        };
        let state = Arc::new(Mutex::new(State::default()));
        for (listener, on_storage) in [(hub, false), (storage, true)] {
            let (shared, bases) = (state.clone(), bases.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let (state, bases) = (shared.clone(), bases.clone());
                    std::thread::spawn(move || serve(stream, &state, &bases, on_storage));
                }
            });
        }
        Self {
            endpoint: bases.hub,
            state,
        }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Options that talk to this server with a write token, caching under `cache`.
    pub fn options(&self, cache: &Path) -> HubOptions {
        HubOptions {
            endpoint: Some(self.endpoint.clone()),
            token: Some(WRITE_TOKEN.to_string()),
            cache_dir: Some(cache.to_path_buf()),
            retries: 2,
            ..Default::default()
        }
    }

    /// The files at the head of `repo`.
    pub fn head_files(&self, repo: &str) -> BTreeMap<String, Vec<u8>> {
        let state = self.state();
        state.repos[repo].commits.last().unwrap().1.clone()
    }
}

struct Request {
    method: String,
    segments: Vec<String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        let found = self.headers.iter().find(|(key, _)| key == name);
        found.map(|(_, value)| value.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON request body")
    }
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn respond(status: u16, body: Value) -> Response {
    Response {
        status,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: body.to_string().into_bytes(),
    }
}

/// A Hub-style error: JSON `{"error": …}` plus the `X-Error-Code` header.
fn hub_error(status: u16, code: &str, message: &str) -> Response {
    let mut response = respond(status, json!({ "error": message }));
    response.headers.push(("X-Error-Code".into(), code.into()));
    response
}

fn serve(stream: TcpStream, state: &Mutex<State>, bases: &Bases, on_storage: bool) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let Some(request) = read_request(&mut reader) else {
        return;
    };
    let mut state = state.lock().unwrap();
    let cut = on_storage && request.method == "GET" && state.cut_downloads;
    let stall = cut && state.stall_downloads;
    let delay = state.slow_gets.filter(|_| request.method == "GET");
    state.requests.push(Seen {
        storage: on_storage,
        method: request.method.clone(),
        path: format!("/{}", request.segments.join("/")),
        authorization: request.header("authorization").map(str::to_string),
    });
    // `None`: drop the connection without answering.
    let response = match on_storage {
        false => route(&request, &mut state, bases),
        true => route_storage(&request, &mut state),
    };
    drop(state);
    if let Some(delay) = delay {
        std::thread::sleep(delay);
    }
    let Some(response) = response else {
        return;
    };
    let reason = match response.status {
        200 => "OK",
        302 => "Found",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Bad Request",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n",
        response.status,
        response.body.len()
    );
    for (key, value) in &response.headers {
        head.push_str(&format!("{key}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    let body = match cut {
        false => &response.body[..],
        true => &response.body[..response.body.len() / 2],
    };
    if request.method != "HEAD" {
        bytes.extend_from_slice(body);
    }
    let _ = writer.write_all(&bytes);
    let _ = writer.flush();
    if stall {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Request line, headers (names lower-cased) and a `Content-Length` body.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?;
    let path = target.split('?').next()?;
    let segments = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (key, value) = header.split_once(':')?;
        headers.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut request = Request {
        method,
        segments,
        headers,
        body: Vec::new(),
    };
    assert!(
        request.header("transfer-encoding").is_none(),
        "the fake Hub only reads bodies with a Content-Length"
    );
    let length = request
        .header("content-length")
        .map_or(0, |v| v.parse().unwrap());
    request.body = vec![0; length];
    reader.read_exact(&mut request.body).ok()?;
    Some(request)
}

fn route(request: &Request, state: &mut State, bases: &Bases) -> Option<Response> {
    let endpoint = bases.hub.as_str();
    let segments: Vec<&str> = request.segments.iter().map(String::as_str).collect();
    let response = match (request.method.as_str(), segments.as_slice()) {
        ("POST", ["api", "repos", "create"]) => create_repo(request, state, endpoint),
        ("GET", ["api", "models", owner, name]) => repo_info(request, state, owner, name, "main"),
        ("GET", ["api", "models", owner, name, "revision", revision]) => {
            repo_info(request, state, owner, name, revision)
        }
        ("POST", ["api", "models", owner, name, "preupload", _]) => {
            preupload(request, state, &format!("{owner}/{name}"))
        }
        ("POST", [owner, name, "info", "lfs", "objects", "batch"]) if name.ends_with(".git") => {
            let repo = format!("{owner}/{}", name.trim_end_matches(".git"));
            lfs_batch(request, state, bases, &repo)
        }
        ("POST", [_, name, "info", "lfs", "objects", "verify"]) if name.ends_with(".git") => {
            lfs_verify(request, state)
        }
        ("POST", ["api", "models", owner, name, "commit", revision]) => {
            let repo = format!("{owner}/{name}");
            return commit(request, state, endpoint, &repo, revision);
        }
        ("HEAD" | "GET", [owner, name, "resolve", revision, file @ ..]) => resolve(
            request,
            state,
            &bases.storage,
            &format!("{owner}/{name}"),
            revision,
            &file.join("/"),
        ),
        _ => hub_error(404, "NotFound", "no such endpoint on the fake Hub"),
    };
    Some(response)
}

/// `None` when the request carries the write token, else the Hub's 401 or 403.
fn refuse_write(request: &Request) -> Option<Response> {
    let token = request
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(WRITE_TOKEN) => None,
        Some(READ_TOKEN) => Some(hub_error(
            403,
            "Forbidden",
            "You don't have the rights to create a model under the namespace",
        )),
        _ => Some(hub_error(
            401,
            "Unauthorized",
            "Invalid username or password.",
        )),
    }
}

/// A private repository is visible only with a token the server knows.
fn hidden(request: &Request, repo: &Repo) -> bool {
    let token = request
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "));
    repo.private && !matches!(token, Some(WRITE_TOKEN | READ_TOKEN))
}

fn create_repo(request: &Request, state: &mut State, endpoint: &str) -> Response {
    if let Some(refused) = refuse_write(request) {
        return refused;
    }
    let body = request.json();
    assert_eq!(body["type"], "model");
    let id = format!(
        "{}/{}",
        body["organization"].as_str().unwrap(),
        body["name"].as_str().unwrap()
    );
    if state.repos.contains_key(&id) {
        return hub_error(409, "Conflict", "You already created this model repo");
    }
    // Like the Hub, a new repository starts with one commit holding `.gitattributes`.
    let oid = state.new_oid();
    let files = BTreeMap::from([(
        ".gitattributes".to_string(),
        b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n".to_vec(),
    )]);
    let repo = Repo {
        private: body["private"].as_bool().unwrap(),
        commits: vec![(oid, files)],
    };
    state.repos.insert(id.clone(), repo);
    respond(200, json!({ "url": format!("{endpoint}/{id}") }))
}

fn repo_info(request: &Request, state: &State, owner: &str, name: &str, rev: &str) -> Response {
    let id = format!("{owner}/{name}");
    let Some(repo) = state.repos.get(&id).filter(|repo| !hidden(request, repo)) else {
        return hub_error(404, "RepoNotFound", "Repository not found");
    };
    let Some((oid, files)) = repo.commit(rev) else {
        return hub_error(404, "RevisionNotFound", "Invalid rev id");
    };
    let siblings: Vec<Value> = files.keys().map(|f| json!({ "rfilename": f })).collect();
    let info = json!({ "id": id, "sha": oid, "private": repo.private, "siblings": siblings });
    respond(200, info)
}

/// Whether `path` goes through LFS by the `.gitattributes` in `files`: a line
/// `*.{ext} filter=lfs …` whose extension `path` ends with.
fn is_lfs(files: &BTreeMap<String, Vec<u8>>, path: &str) -> bool {
    let Some(attributes) = files.get(".gitattributes") else {
        return false;
    };
    String::from_utf8_lossy(attributes).lines().any(|line| {
        let mut fields = line.split_whitespace();
        let pattern = fields.next().unwrap_or_default();
        let suffix = pattern.strip_prefix('*').unwrap_or(pattern);
        fields.any(|f| f == "filter=lfs") && path.ends_with(suffix)
    })
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Says, like the Hub, `lfs` for files the `.gitattributes` sends through LFS and `regular`
/// otherwise, and records the size and sample it was told, for the commit to check.
fn preupload(request: &Request, state: &mut State, id: &str) -> Response {
    if let Some(refused) = refuse_write(request) {
        return refused;
    }
    let Some((_, head)) = state.repos.get(id).and_then(|repo| repo.commits.last()) else {
        return hub_error(404, "RepoNotFound", "Repository not found");
    };
    let files = request.json()["files"].as_array().unwrap().clone();
    let modes: Vec<Value> = files
        .iter()
        .map(|f| {
            let path = f["path"].as_str().unwrap();
            let mode = if is_lfs(head, path) { "lfs" } else { "regular" };
            json!({ "path": path, "uploadMode": mode, "shouldIgnore": false })
        })
        .collect();
    for file in &files {
        let sample = base64_decode(file["sample"].as_str().unwrap());
        let size = file["size"].as_u64().unwrap();
        assert_eq!(
            sample.len() as u64,
            size.min(512),
            "the sample is the first 512 bytes"
        );
        let key = (id.to_string(), file["path"].as_str().unwrap().to_string());
        state.preuploaded.insert(key, (size, sample));
    }
    respond(200, json!({ "files": modes }))
}

/// The git-lfs batch API: no actions for an object storage holds, else an upload to the storage
/// server (in parts when `chunk_size` is set) and a verify call to the Hub.
fn lfs_batch(request: &Request, state: &State, bases: &Bases, id: &str) -> Response {
    if let Some(refused) = refuse_write(request) {
        return refused;
    }
    const LFS: &str = "application/vnd.git-lfs+json";
    assert_eq!(request.header("accept"), Some(LFS));
    assert_eq!(request.header("content-type"), Some(LFS));
    if !state.repos.contains_key(id) {
        return hub_error(404, "RepoNotFound", "Repository not found");
    }
    let body = request.json();
    assert_eq!(body["operation"], "upload");
    assert_eq!(body["hash_algo"], "sha256");
    assert_eq!(body["ref"]["name"], "main");
    let transfers = body["transfers"].as_array().unwrap();
    assert!(transfers.contains(&json!("basic")), "{body}");
    let storage = &bases.storage;
    let verify = json!({ "href": format!("{}/{id}.git/info/lfs/objects/verify", bases.hub) });
    let objects: Vec<Value> = body["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|object| {
            let oid = object["oid"].as_str().unwrap();
            let size = object["size"].as_u64().unwrap() as usize;
            if state.lfs_objects.contains_key(oid) {
                return json!({ "oid": oid, "size": size });
            }
            let upload = match state.chunk_size {
                None => json!({ "href": format!("{storage}/storage/{oid}") }),
                Some(chunk) => {
                    assert!(transfers.contains(&json!("multipart")), "{body}");
                    let mut header = serde_json::Map::new();
                    header.insert("chunk_size".into(), json!(chunk.to_string()));
                    for part in 1..=size.div_ceil(chunk) {
                        let url = format!("{storage}/storage/{oid}/part/{part}");
                        header.insert(format!("{part:05}"), json!(url));
                    }
                    json!({ "href": format!("{storage}/storage/{oid}/complete"), "header": header })
                }
            };
            json!({ "oid": oid, "size": size, "actions": { "upload": upload, "verify": verify } })
        })
        .collect();
    let transfer = if state.chunk_size.is_some() {
        "multipart"
    } else {
        "basic"
    };
    respond(200, json!({ "transfer": transfer, "objects": objects }))
}

/// The verify action: the object must be in storage, with that size and SHA-256.
fn lfs_verify(request: &Request, state: &mut State) -> Response {
    if let Some(refused) = refuse_write(request) {
        return refused;
    }
    let body = request.json();
    let oid = body["oid"].as_str().unwrap();
    match state.lfs_objects.get(oid) {
        Some(bytes) if bytes.len() as u64 == body["size"].as_u64().unwrap() => {
            assert_eq!(
                sha256_hex(bytes),
                oid,
                "the object id is the SHA-256 of its bytes"
            );
            state.verified.push(oid.to_string());
            respond(200, json!({}))
        }
        _ => hub_error(404, "NotFound", "Object not found in storage"),
    }
}

/// The storage server: single-part uploads, parts and their completion, and the CDN that LFS
/// downloads are redirected to. It checks no token, as pre-signed URLs carry their own.
fn route_storage(request: &Request, state: &mut State) -> Option<Response> {
    let segments: Vec<&str> = request.segments.iter().map(String::as_str).collect();
    let stored = |status| Response {
        status,
        headers: vec![("ETag".into(), format!("\"{:016x}\"", fnv1a(&request.body)))],
        body: Vec::new(),
    };
    let response = match (request.method.as_str(), segments.as_slice()) {
        ("PUT", ["storage", ..]) if state.storage_fault.is_some() => {
            state.failed_puts += 1;
            match state.storage_fault.unwrap() {
                Fault::Drop => return None,
                Fault::Status(status) => hub_error(status, "Internal", "storage unavailable"),
            }
        }
        ("PUT", ["storage", oid]) => {
            state
                .lfs_objects
                .insert(oid.to_string(), request.body.clone());
            stored(200)
        }
        ("PUT", ["storage", oid, "part", part]) => {
            let key = (oid.to_string(), part.parse().unwrap());
            state.parts.insert(key, request.body.clone());
            stored(200)
        }
        ("POST", ["storage", oid, "complete"]) => {
            let body = request.json();
            assert_eq!(body["oid"], *oid);
            let mut object = Vec::new();
            for (index, part) in body["parts"].as_array().unwrap().iter().enumerate() {
                assert_eq!(part["partNumber"], index + 1, "{body}");
                let bytes = &state.parts[&(oid.to_string(), index + 1)];
                let etag = format!("\"{:016x}\"", fnv1a(bytes));
                assert_eq!(part["etag"], etag, "the part's ETag comes back");
                object.extend_from_slice(bytes);
            }
            state.lfs_objects.insert(oid.to_string(), object);
            respond(200, json!({}))
        }
        ("GET", ["cdn", oid]) => match state.lfs_objects.get(*oid) {
            Some(bytes) => Response {
                status: 200,
                headers: Vec::new(),
                body: bytes.clone(),
            },
            None => hub_error(404, "NotFound", "no such object"),
        },
        _ => hub_error(404, "NotFound", "no such endpoint on the fake storage"),
    };
    Some(response)
}

fn commit(
    request: &Request,
    state: &mut State,
    endpoint: &str,
    id: &str,
    revision: &str,
) -> Option<Response> {
    if let Some(refused) = refuse_write(request) {
        return Some(refused);
    }
    if let Some(fault) = state.commit_fault {
        state.failed_commits += 1;
        return match fault {
            Fault::Drop => None,
            Fault::Status(status) => Some(hub_error(status, "Internal", "try again later")),
        };
    }
    assert_eq!(request.header("content-type"), Some("application/x-ndjson"));
    let Some((_, head)) = state.repos.get(id).and_then(|repo| repo.commit(revision)) else {
        return Some(hub_error(404, "RepoNotFound", "Repository not found"));
    };
    let mut files = head.clone();
    let (mut summary, mut added, mut lfs) = (String::new(), Vec::new(), Vec::new());
    for line in request
        .body
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let line: Value = serde_json::from_slice(line).unwrap();
        let value = &line["value"];
        match line["key"].as_str().unwrap() {
            "header" => summary = value["summary"].as_str().unwrap().to_string(),
            "file" => {
                assert_eq!(value["encoding"], "base64");
                let path = value["path"].as_str().unwrap().to_string();
                if is_lfs(head, &path) {
                    return Some(hub_error(
                        422,
                        "BadRequest",
                        &format!("{path} must be uploaded through LFS (see .gitattributes)"),
                    ));
                }
                let content = base64_decode(value["content"].as_str().unwrap());
                check_preuploaded(state, id, &path, &content);
                files.insert(path.clone(), content);
                added.push(path);
            }
            "lfsFile" => {
                assert_eq!(value["algo"], "sha256");
                let path = value["path"].as_str().unwrap().to_string();
                let oid = value["oid"].as_str().unwrap().to_string();
                let Some(content) = state.lfs_objects.get(&oid).cloned() else {
                    return Some(hub_error(422, "BadRequest", "LFS object not found"));
                };
                assert_eq!(value["size"].as_u64().unwrap(), content.len() as u64);
                check_preuploaded(state, id, &path, &content);
                files.insert(path.clone(), content);
                lfs.push((path.clone(), oid));
                added.push(path);
            }
            other => panic!("the fake Hub did not expect a `{other}` commit entry"),
        }
    }
    let oid = state.new_oid();
    let repo = state.repos.get_mut(id).unwrap();
    repo.commits.push((oid.clone(), files));
    state.commits.push(Commit {
        repo: id.to_string(),
        oid: oid.clone(),
        summary,
        files: added,
        lfs,
    });
    let url = format!("{endpoint}/{id}/commit/{oid}");
    Some(respond(200, json!({ "commitUrl": url, "commitOid": oid })))
}

/// Checks that the preupload call was told the size and first bytes of the committed `content`.
fn check_preuploaded(state: &State, id: &str, path: &str, content: &[u8]) {
    let key = (id.to_string(), path.to_string());
    let (size, sample) = &state.preuploaded[&key];
    assert_eq!(*size, content.len() as u64, "{path}: preuploaded size");
    assert!(content.starts_with(sample), "{path}: preuploaded sample");
}

/// `HEAD`/`GET /{repo}/resolve/{revision}/{file}` with the headers the cache needs: `ETag`,
/// `X-Repo-Commit` and `Content-Length`; for an LFS file, like the Hub, a redirect to the CDN
/// (`storage`) with the object's id and size in `X-Linked-Etag` and `X-Linked-Size`.
fn resolve(
    request: &Request,
    state: &State,
    storage: &str,
    id: &str,
    revision: &str,
    file: &str,
) -> Response {
    let Some(repo) = state.repos.get(id) else {
        return hub_error(404, "RepoNotFound", "Repository not found");
    };
    if hidden(request, repo) {
        return hub_error(401, "RepoNotFound", "Invalid username or password.");
    }
    let Some((oid, files)) = repo.commit(revision) else {
        return hub_error(404, "RevisionNotFound", "Invalid rev id");
    };
    let Some(bytes) = files.get(file) else {
        let mut response = hub_error(404, "EntryNotFound", "Entry not found");
        response.headers.push(("X-Repo-Commit".into(), oid.clone()));
        return response;
    };
    let etag = format!("{:016x}{:08x}", fnv1a(bytes), bytes.len());
    if is_lfs(files, file) {
        let sha = sha256_hex(bytes);
        return Response {
            status: 302,
            headers: vec![
                ("Location".into(), format!("{storage}/cdn/{sha}")),
                ("ETag".into(), format!("\"{etag}\"")),
                ("X-Linked-Etag".into(), format!("\"{sha}\"")),
                ("X-Linked-Size".into(), bytes.len().to_string()),
                ("X-Repo-Commit".into(), oid.clone()),
            ],
            body: Vec::new(),
        };
    }
    Response {
        status: 200,
        headers: vec![
            ("ETag".into(), format!("\"{etag}\"")),
            ("X-Repo-Commit".into(), oid.clone()),
        ],
        body: bytes.clone(),
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let word = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | value(c) << (18 - 6 * i));
        out.extend_from_slice(&word.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// The message of the error `result` holds, with its causes.
pub fn error_text(result: anyhow::Result<impl std::fmt::Debug>) -> String {
    format!("{:#}", result.expect_err("expected an error"))
}

/// Checks that `text` contains each of `parts`.
pub fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
}
