//! `ssl_hub::hub` against a fake Hub: a small HTTP/1.1 server on 127.0.0.1, started by each test,
//! that implements the endpoints `huggingface_hub` calls to create a repository, commit files
//! (preupload, then the LFS batch API for the files its `.gitattributes` sends through LFS, then
//! one NDJSON commit with inline base64 and LFS pointer entries), read repository info and
//! download files (LFS files by a redirect to storage). A second server on another port plays the
//! LFS storage and CDN, as the Hub's pre-signed storage URLs live on another host. Both record
//! every request, and the Hub every commit, so the tests can check what reached them.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use ssl_hub::hub::{self, HubOptions};

/// A token the fake Hub accepts for reading and writing.
const WRITE_TOKEN: &str = "hf_write_token";
/// A token the fake Hub knows but refuses writes with (HTTP 403).
const READ_TOKEN: &str = "hf_read_token";
/// Set in the environment of the child processes the token tests start.
const CHILD_MARKER: &str = "SSL_HUB_TEST_CHILD";

// ---------------------------------------------------------------------------------------------
// The fake Hub
// ---------------------------------------------------------------------------------------------

/// A model repository: its commits, oldest first, each with the files it holds.
struct Repo {
    private: bool,
    commits: Vec<(String, BTreeMap<String, Vec<u8>>)>,
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
struct Seen {
    /// It reached the storage server, not the Hub.
    storage: bool,
    method: String,
    path: String,
    authorization: Option<String>,
}

/// One commit made through the commit endpoint.
#[derive(Clone, Debug)]
struct Commit {
    repo: String,
    oid: String,
    summary: String,
    /// Every file the commit adds, in the order of its entries.
    files: Vec<String>,
    /// The files added by an `lfsFile` entry, with the object id it names.
    lfs: Vec<(String, String)>,
}

#[derive(Clone, Copy)]
enum Fault {
    /// Close the connection without answering.
    Drop,
    /// Answer with this HTTP status.
    Status(u16),
}

#[derive(Default)]
struct State {
    repos: HashMap<String, Repo>,
    requests: Vec<Seen>,
    commits: Vec<Commit>,
    /// How every commit request fails, if it does.
    commit_fault: Option<Fault>,
    /// Commit requests failed so far.
    failed_commits: usize,
    oids: u64,
    /// What each preupload call was told, by repository and path: the size and the sample.
    preuploaded: HashMap<(String, String), (u64, Vec<u8>)>,
    /// The LFS objects in storage, by SHA-256 (hex).
    lfs_objects: HashMap<String, Vec<u8>>,
    /// The parts of multi-part uploads received so far, by object id and part number.
    parts: BTreeMap<(String, usize), Vec<u8>>,
    /// Objects that passed the verify call.
    verified: Vec<String>,
    /// When set, the batch endpoint asks for multi-part uploads in parts of this many bytes.
    chunk_size: Option<usize>,
    /// How every upload to storage (`PUT`) fails, if it does.
    storage_fault: Option<Fault>,
    /// Uploads to storage failed so far.
    failed_puts: usize,
    /// The CDN sends half of each file and closes the connection.
    cut_downloads: bool,
    /// With `cut_downloads`, the CDN keeps the connection open for a minute instead.
    stall_downloads: bool,
    /// Both servers wait this long before answering a `GET`.
    slow_gets: Option<std::time::Duration>,
}

impl State {
    fn new_oid(&mut self) -> String {
        self.oids += 1;
        format!("{:040x}", 0xc0ff_ee00_u64 + self.oids)
    }

    fn calls(&self) -> Vec<(String, String)> {
        let seen = self.requests.iter();
        seen.map(|r| (r.method.clone(), r.path.clone())).collect()
    }

    /// The requests that reached the storage server.
    fn storage_requests(&self) -> Vec<Seen> {
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

struct FakeHub {
    endpoint: String,
    state: Arc<Mutex<State>>,
}

impl FakeHub {
    fn start() -> Self {
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

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Options that talk to this server with a write token, caching under `cache`.
    fn options(&self, cache: &Path) -> HubOptions {
        HubOptions {
            endpoint: Some(self.endpoint.clone()),
            token: Some(WRITE_TOKEN.to_string()),
            cache_dir: Some(cache.to_path_buf()),
            retries: 2,
            ..Default::default()
        }
    }

    /// The files at the head of `repo`.
    fn head_files(&self, repo: &str) -> BTreeMap<String, Vec<u8>> {
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

fn sha256_hex(bytes: &[u8]) -> String {
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

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A folder like the one `ssl push` uploads: ~200 KB of pseudo-random weights, a config and a
/// card, plus a subdirectory that is not uploaded.
fn model_folder(root: &Path) -> PathBuf {
    let dir = root.join("upload");
    std::fs::create_dir_all(dir.join("nested")).unwrap();
    let mut x = 0x9e3779b97f4a7c15_u64;
    let weights: Vec<u8> = (0..200 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(dir.join("model.safetensors"), weights).unwrap();
    std::fs::write(dir.join("config.yaml"), "objective:\n  name: vicreg\n").unwrap();
    std::fs::write(
        dir.join("README.md"),
        "---\nlibrary_name: candle-ssl\n---\n# VICReg\n",
    )
    .unwrap();
    std::fs::write(dir.join("nested").join("skipped.txt"), "not uploaded").unwrap();
    dir
}

const FILES: [&str; 3] = ["README.md", "config.yaml", "model.safetensors"];

fn error_text(result: anyhow::Result<impl std::fmt::Debug>) -> String {
    format!("{:#}", result.expect_err("expected an error"))
}

fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "`{part}` missing from: {text}");
    }
}

/// Every file and link under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        match path.symlink_metadata().unwrap().is_dir() {
            true => found.extend(files_under(&path)),
            false => found.push(path),
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[test]
fn push_then_pull_round_trips_the_bytes() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = HubOptions {
        private: true,
        ..hub.options(&tmp.path().join("cache"))
    };

    let url = hub::push_folder("alice/vicreg-digits", &folder, "Upload VICReg", &opts).unwrap();

    let (commit, requests) = {
        let state = hub.state();
        assert_eq!(state.commits.len(), 1, "exactly one commit");
        assert!(state.repos["alice/vicreg-digits"].private);
        // The Hub sees the token on every request; storage, on none.
        let bearer = format!("Bearer {WRITE_TOKEN}");
        let authorised = |r: &Seen| match r.storage {
            false => r.authorization.as_deref() == Some(&bearer as &str),
            true => r.authorization.is_none(),
        };
        assert!(
            state.requests.iter().all(authorised),
            "{:?}",
            state.requests
        );
        (state.commits[0].clone(), state.calls())
    };
    assert_eq!(commit.repo, "alice/vicreg-digits");
    assert_eq!(commit.summary, "Upload VICReg");
    assert_eq!(commit.files, FILES);
    assert_eq!(
        url,
        format!("{}/alice/vicreg-digits/commit/{}", hub.endpoint, commit.oid)
    );
    let post = |path: &str| ("POST".to_string(), path.to_string());
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    assert_eq!(
        requests,
        [
            post("/api/repos/create"),
            post("/api/models/alice/vicreg-digits/preupload/main"),
            post("/alice/vicreg-digits.git/info/lfs/objects/batch"),
            ("PUT".to_string(), format!("/storage/{oid}")),
            post("/alice/vicreg-digits.git/info/lfs/objects/verify"),
            post("/api/models/alice/vicreg-digits/commit/main"),
        ]
    );

    let cache = tmp.path().join("fresh-cache");
    let snapshot = hub::pull("alice/vicreg-digits", &FILES, &hub.options(&cache)).unwrap();
    let repo_cache = cache.join("models--alice--vicreg-digits");
    assert_eq!(snapshot, repo_cache.join("snapshots").join(&commit.oid));
    let main_ref = std::fs::read_to_string(repo_cache.join("refs").join("main")).unwrap();
    assert_eq!(main_ref, commit.oid);
    for file in FILES {
        let pulled = std::fs::read(snapshot.join(file)).unwrap();
        assert_eq!(
            pulled,
            std::fs::read(folder.join(file)).unwrap(),
            "{file} differs"
        );
    }
    assert!(!snapshot.join("nested").exists());
}

#[test]
fn weights_travel_by_lfs_and_come_back_through_the_cache() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    hub::push_folder("alice/m", &folder, "v1", &hub.options(tmp.path())).unwrap();
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    {
        let state = hub.state();
        let commit = &state.commits[0];
        assert_eq!(commit.lfs, [("model.safetensors".to_string(), oid.clone())]);
        assert_eq!(commit.files, FILES, "README.md and config.yaml inline");
        assert_eq!(state.lfs_objects[&oid], weights);
        assert_eq!(state.verified, std::slice::from_ref(&oid));
        let puts: Vec<&Seen> = state
            .requests
            .iter()
            .filter(|r| r.method == "PUT")
            .collect();
        assert_eq!(puts.len(), 1, "{:?}", state.requests);
        assert!(puts[0].storage, "{:?}", puts[0]);
        assert!(puts[0].authorization.is_none(), "no Hub token to storage");
    }

    hub.state().requests.clear();
    let cache = tmp.path().join("fresh-cache");
    let snapshot = hub::pull("alice/m", &FILES, &hub.options(&cache)).unwrap();
    for file in FILES {
        let pulled = std::fs::read(snapshot.join(file)).unwrap();
        assert_eq!(pulled, std::fs::read(folder.join(file)).unwrap(), "{file}");
    }
    // huggingface_hub's layout: the snapshot entry links to the blob named by the object id.
    let blob = cache.join("models--alice--m").join("blobs").join(&oid);
    assert_eq!(std::fs::read(&blob).unwrap(), weights);
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(snapshot.join("model.safetensors")).unwrap(),
        Path::new("../../blobs").join(&oid)
    );
    let leftovers: Vec<PathBuf> = files_under(&cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // The metadata comes from the Hub, with the token; the bytes from the CDN, without it.
    let state = hub.state();
    let cdn = state.storage_requests();
    assert_eq!(cdn.len(), 1, "{:?}", state.requests);
    assert_eq!(
        (cdn[0].method.as_str(), cdn[0].path.clone()),
        ("GET", format!("/cdn/{oid}"))
    );
    assert!(cdn[0].authorization.is_none(), "{:?}", cdn[0]);
    let bearer = format!("Bearer {WRITE_TOKEN}");
    let hub_requests = state.requests.iter().filter(|r| !r.storage);
    assert!(hub_requests
        .clone()
        .all(|r| r.authorization.as_deref() == Some(&bearer as &str)));
    let heads = hub_requests.filter(|r| r.method == "HEAD").count();
    assert_eq!(heads, FILES.len(), "{:?}", state.requests);
}

#[test]
fn an_lfs_object_the_hub_holds_is_not_uploaded_again() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = HubOptions {
        update: true,
        ..hub.options(tmp.path())
    };
    hub::push_folder("alice/m", &folder, "v1", &opts).unwrap();
    hub.state().requests.clear();

    // Same weights, new config.
    std::fs::write(folder.join("config.yaml"), "objective:\n  name: barlow\n").unwrap();
    hub::push_folder("alice/m", &folder, "v2", &opts).unwrap();
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let state = hub.state();
    let calls = state.calls();
    assert!(
        calls.contains(&("POST".into(), "/alice/m.git/info/lfs/objects/batch".into())),
        "{calls:?}"
    );
    assert!(state.storage_requests().is_empty(), "{calls:?}");
    assert!(
        !calls.iter().any(|(_, path)| path.ends_with("/verify")),
        "{calls:?}"
    );
    assert_eq!(state.verified.len(), 1, "verified once, by the first push");
    let oid = sha256_hex(&weights);
    assert_eq!(
        state.commits[1].lfs,
        [("model.safetensors".to_string(), oid)]
    );
    drop(state);
    let files = hub.head_files("alice/m");
    assert_eq!(files["model.safetensors"], weights);
    assert_eq!(files["config.yaml"], b"objective:\n  name: barlow\n");
}

#[test]
fn failed_upload_to_storage_commits_nothing() {
    for fault in [Fault::Status(500), Fault::Drop] {
        let hub = FakeHub::start();
        let tmp = tempfile::tempdir().unwrap();
        let folder = model_folder(tmp.path());
        let opts = hub.options(tmp.path());
        hub.state().storage_fault = Some(fault);

        let err = error_text(hub::push_folder("alice/m", &folder, "m", &opts));
        assert_mentions(
            &err,
            &[
                "upload of model.safetensors (204800 bytes) for alice/m to the Hub's storage \
                 failed (",
                "nothing was committed",
                "run the same command again to retry",
            ],
        );
        if let Fault::Status(_) = fault {
            assert_mentions(
                &err,
                &["HTTP 500 Internal Server Error: storage unavailable"],
            );
        }
        {
            let state = hub.state();
            assert_eq!(state.failed_puts, opts.retries, "the upload is retried");
            assert!(state.commits.is_empty());
            assert!(state.lfs_objects.is_empty());
            let calls = state.calls();
            assert!(
                !calls.iter().any(|(_, p)| p.contains("/commit/")),
                "{calls:?}"
            );
        }

        // Storage is back: the same command uploads the weights and commits.
        hub.state().storage_fault = None;
        hub::push_folder("alice/m", &folder, "m", &opts).unwrap();
        let state = hub.state();
        assert_eq!(state.commits.len(), 1);
        let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
        assert_eq!(state.lfs_objects[&sha256_hex(&weights)], weights);
    }
}

#[test]
fn large_weights_go_up_in_parts() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(&tmp.path().join("cache"));
    hub.state().chunk_size = Some(64 * 1024);
    hub::push_folder("alice/m", &folder, "m", &opts).unwrap();

    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    {
        let state = hub.state();
        let storage: Vec<(String, String)> = state
            .storage_requests()
            .into_iter()
            .map(|r| (r.method, r.path))
            .collect();
        // 200 KiB in parts of 64 KiB: four parts, then their ETags.
        let part = |n: usize| ("PUT".to_string(), format!("/storage/{oid}/part/{n}"));
        let complete = ("POST".to_string(), format!("/storage/{oid}/complete"));
        assert_eq!(storage, [part(1), part(2), part(3), part(4), complete]);
        assert_eq!(
            state.parts[&(oid.clone(), 4)].len(),
            200 * 1024 - 3 * 64 * 1024
        );
        assert_eq!(state.lfs_objects[&oid], weights);
        assert_eq!(state.verified, std::slice::from_ref(&oid));
        assert_eq!(
            state.commits[0].lfs,
            [("model.safetensors".to_string(), oid)]
        );
    }
    let snapshot = hub::pull("alice/m", &FILES, &opts).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        weights
    );
}

#[test]
fn pull_at_a_cached_commit_sends_no_request() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let cache = tmp.path().join("cache");
    let opts = hub.options(&cache);
    hub::push_folder("alice/m", &folder, "m", &opts).unwrap();
    let snapshot = hub::pull("alice/m", &FILES, &opts).unwrap();
    let commit = hub.state().commits[0].oid.clone();

    let pinned = HubOptions {
        revision: commit.clone(),
        ..opts.clone()
    };
    hub.state().requests.clear();
    assert_eq!(hub::pull("alice/m", &FILES, &pinned).unwrap(), snapshot);
    assert!(hub.state().requests.is_empty(), "{:?}", hub.state().calls());

    // A file missing from the snapshot is asked for alone, at the commit; its blob is still
    // cached, so it is linked again without a download.
    std::fs::remove_file(snapshot.join("config.yaml")).unwrap();
    assert_eq!(hub::pull("alice/m", &FILES, &pinned).unwrap(), snapshot);
    let at_commit = format!("/alice/m/resolve/{commit}/config.yaml");
    assert_eq!(hub.state().calls(), [("HEAD".into(), at_commit.clone())]);
    assert_eq!(
        std::fs::read(snapshot.join("config.yaml")).unwrap(),
        std::fs::read(folder.join("config.yaml")).unwrap()
    );
    // Without the blob, it is downloaded again.
    std::fs::remove_file(snapshot.join("config.yaml")).unwrap();
    let blobs = snapshot.join("../../blobs");
    for blob in std::fs::read_dir(&blobs).unwrap() {
        let blob = blob.unwrap().path();
        if std::fs::read(&blob).unwrap() == std::fs::read(folder.join("config.yaml")).unwrap() {
            std::fs::remove_file(blob).unwrap();
        }
    }
    hub.state().requests.clear();
    assert_eq!(hub::pull("alice/m", &FILES, &pinned).unwrap(), snapshot);
    assert_eq!(
        hub.state().calls(),
        [
            ("HEAD".into(), at_commit.clone()),
            ("GET".into(), at_commit)
        ]
    );
    assert_eq!(
        std::fs::read(snapshot.join("config.yaml")).unwrap(),
        std::fs::read(folder.join("config.yaml")).unwrap()
    );

    // In a fresh cache, a commit id is fetched as such and recorded in no ref.
    let fresh = tmp.path().join("fresh-cache");
    let pinned_fresh = HubOptions {
        cache_dir: Some(fresh.clone()),
        ..pinned
    };
    hub.state().requests.clear();
    let snapshot = hub::pull("alice/m", &FILES, &pinned_fresh).unwrap();
    assert_eq!(
        snapshot,
        fresh
            .join("models--alice--m")
            .join("snapshots")
            .join(&commit)
    );
    assert!(!fresh.join("models--alice--m").join("refs").exists());
    let calls = hub.state().calls();
    let heads: Vec<&String> = calls
        .iter()
        .filter(|(m, _)| m == "HEAD")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(heads.len(), FILES.len(), "{calls:?}");
    assert!(heads.iter().all(|p| p.contains(&commit)), "{calls:?}");
}

#[test]
fn concurrent_pulls_into_one_cache_download_each_file_once() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(&tmp.path().join("cache"));
    hub::push_folder("alice/m", &folder, "m", &opts).unwrap();
    // Slow downloads, so that the pulls (as the ranks of one job start them) overlap.
    hub.state().slow_gets = Some(std::time::Duration::from_millis(300));
    hub.state().requests.clear();
    let snapshots: Vec<PathBuf> = std::thread::scope(|scope| {
        let pulls: Vec<_> = (0..3)
            .map(|_| scope.spawn(|| hub::pull("alice/m", &FILES, &opts).unwrap()))
            .collect();
        pulls.into_iter().map(|p| p.join().unwrap()).collect()
    });
    assert!(snapshots.iter().all(|s| *s == snapshots[0]));
    for file in FILES {
        assert_eq!(
            std::fs::read(snapshots[0].join(file)).unwrap(),
            std::fs::read(folder.join(file)).unwrap()
        );
    }
    let calls = hub.state().calls();
    let gets: Vec<&String> = calls
        .iter()
        .filter(|(m, _)| m == "GET")
        .map(|(_, p)| p)
        .collect();
    assert!(!gets.is_empty(), "{calls:?}");
    for path in &gets {
        assert_eq!(gets.iter().filter(|p| p == &path).count(), 1, "{calls:?}");
    }
}

#[test]
fn interrupted_download_leaves_nothing_half_written() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let cache = tmp.path().join("cache");
    let opts = hub.options(&cache);
    hub::push_folder("alice/m", &folder, "m", &opts).unwrap();
    hub.state().cut_downloads = true;

    let err = error_text(hub::pull("alice/m", &FILES, &opts));
    assert_mentions(
        &err,
        &[
            &format!(
                "download of model.safetensors from alice/m on {} failed",
                hub.endpoint
            ),
            "run the same command again to retry",
        ],
    );
    let repo = cache.join("models--alice--m");
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let oid = sha256_hex(&weights);
    assert!(!repo.join("blobs").join(&oid).exists());
    let files = files_under(&repo);
    assert!(
        files.iter().all(|p| !p.ends_with("model.safetensors")),
        "{files:?}"
    );
    assert!(
        files
            .iter()
            .all(|p| !p.to_string_lossy().contains(".incomplete")),
        "{files:?}"
    );

    hub.state().cut_downloads = false;
    let snapshot = hub::pull("alice/m", &FILES, &opts).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        weights
    );
}

#[test]
fn a_pull_killed_mid_download_leaves_only_a_temporary_file() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    hub::push_folder("alice/m", &folder, "m", &hub.options(tmp.path())).unwrap();
    let weights = std::fs::read(folder.join("model.safetensors")).unwrap();
    let mut state = hub.state();
    (state.cut_downloads, state.stall_downloads) = (true, true);
    drop(state);

    // A child process pulls; the CDN sends half of the weights and stalls.
    let cache = tmp.path().join("cache");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_pull_stalls",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env(CHILD_MARKER, "1")
        .env("SSL_HUB_TEST_ENDPOINT", &hub.endpoint)
        .env("SSL_HUB_TEST_CACHE", &cache)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let blobs = cache.join("models--alice--m").join("blobs");
    let half = (weights.len() / 2) as u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let partial = loop {
        let found = std::fs::read_dir(&blobs).into_iter().flatten().flatten();
        let partial = found
            .map(|e| e.path())
            .find(|p| p.metadata().unwrap().len() == half);
        if let Some(partial) = partial {
            break partial;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the child wrote no half download"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();

    // The half is under a temporary name: neither the blob nor the snapshot entry exists.
    let name = partial.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with(".incomplete"), "{name}");
    let oid = sha256_hex(&weights);
    assert!(!blobs.join(&oid).exists());
    let snapshots = cache.join("models--alice--m").join("snapshots");
    let entries = files_under(&snapshots);
    assert!(
        entries.iter().all(|p| !p.ends_with("model.safetensors")),
        "{entries:?}"
    );

    // The next pull downloads the weights whole.
    hub.state().cut_downloads = false;
    let snapshot = hub::pull("alice/m", &FILES, &hub.options(&cache)).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        weights
    );
}

#[test]
#[ignore = "run by a_pull_killed_mid_download_leaves_only_a_temporary_file in a child process"]
fn child_pull_stalls() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let opts = HubOptions {
        endpoint: std::env::var("SSL_HUB_TEST_ENDPOINT").ok(),
        token: Some(WRITE_TOKEN.to_string()),
        cache_dir: std::env::var_os("SSL_HUB_TEST_CACHE").map(PathBuf::from),
        retries: 1,
        ..Default::default()
    };
    // Killed by the parent while the weights' download stalls.
    let _ = hub::pull("alice/m", &FILES, &opts);
}

#[test]
fn push_with_rejected_token_reports_http_401() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: Some("hf_expired".to_string()),
        ..hub.options(tmp.path())
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    let expected = format!("the Hub at {} refused the token (HTTP 401)", hub.endpoint);
    assert_mentions(&err, &[&expected, "HF_TOKEN", "write access to alice/m"]);
    assert!(hub.state().repos.is_empty());
}

#[test]
fn push_with_read_only_token_reports_http_403() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: Some(READ_TOKEN.to_string()),
        ..hub.options(tmp.path())
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    let expected = format!("the Hub at {} refused the token (HTTP 403)", hub.endpoint);
    assert_mentions(&err, &[&expected, "HF_TOKEN", "write access to alice/m"]);
    assert!(!err.contains("HTTP 401"), "{err}");
    assert!(hub.state().repos.is_empty());
}

#[test]
fn dropped_commit_fails_cleanly_and_the_same_push_then_succeeds() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(tmp.path());
    hub.state().commit_fault = Some(Fault::Drop);

    let err = error_text(hub::push_folder("alice/m", &folder, "first try", &opts));
    assert_mentions(
        &err,
        &[
            &format!("upload of alice/m to {} failed", hub.endpoint),
            "nothing was committed",
            "run the same command again to retry",
        ],
    );
    {
        let state = hub.state();
        let attempts = state.failed_commits;
        assert_eq!(attempts, opts.retries, "a dropped commit is retried");
        assert!(state.commits.is_empty());
        assert!(
            state.repos.contains_key("alice/m"),
            "the repository was created"
        );
    }

    // The network is back: the same command reuses the model-less repository.
    let mut state = hub.state();
    state.commit_fault = None;
    state.requests.clear();
    drop(state);
    hub::push_folder("alice/m", &folder, "first try", &opts).unwrap();
    let state = hub.state();
    assert_eq!(state.commits.len(), 1);
    assert_eq!(state.commits[0].files, FILES);
    // Create (409), look for a model at the branch (none), then upload: the weights reached
    // storage on the first try, so the batch call asks for nothing and nothing is sent again.
    let post = |path: &str| ("POST".to_string(), path.to_string());
    assert_eq!(
        state.calls(),
        [
            post("/api/repos/create"),
            ("GET".into(), "/api/models/alice/m/revision/main".into()),
            post("/api/models/alice/m/preupload/main"),
            post("/alice/m.git/info/lfs/objects/batch"),
            post("/api/models/alice/m/commit/main"),
        ]
    );
    drop(state);
    let files = hub.head_files("alice/m");
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            ".gitattributes",
            "README.md",
            "config.yaml",
            "model.safetensors"
        ]
    );
    assert_eq!(
        files["model.safetensors"],
        std::fs::read(folder.join("model.safetensors")).unwrap()
    );
}

#[test]
fn server_errors_after_retries_say_to_retry() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        retries: 3,
        ..hub.options(tmp.path())
    };
    hub.state().commit_fault = Some(Fault::Status(503));
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    assert_mentions(
        &err,
        &[
            &format!("upload of alice/m to {} failed", hub.endpoint),
            "503 Service Unavailable",
            "nothing was committed",
            "run the same command again to retry",
        ],
    );
    assert_eq!(hub.state().failed_commits, 3);
    assert!(hub.state().commits.is_empty());
}

#[test]
fn unreachable_hub_says_to_retry() {
    let tmp = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let opts = HubOptions {
        endpoint: Some(endpoint.clone()),
        token: Some(WRITE_TOKEN.to_string()),
        cache_dir: Some(tmp.path().join("cache")),
        retries: 1,
        ..Default::default()
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    assert_mentions(
        &err,
        &[
            &format!("upload of alice/m to {endpoint} failed"),
            "nothing was committed",
            "run the same command again to retry",
        ],
    );
    let err = error_text(hub::pull("alice/m", &FILES, &opts));
    assert_mentions(
        &err,
        &[
            &format!("download of README.md from alice/m on {endpoint} failed"),
            "run the same command again to retry",
        ],
    );
}

#[test]
fn existing_model_needs_update() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let folder = model_folder(tmp.path());
    let opts = hub.options(tmp.path());
    hub::push_folder("alice/m", &folder, "v1", &opts).unwrap();

    let err = error_text(hub::push_folder("alice/m", &folder, "v2", &opts));
    let expected = format!(
        "repository alice/m already exists on {} and holds a model",
        hub.endpoint
    );
    assert_mentions(&err, &[&expected, "pass --update to add a new commit"]);
    assert_eq!(hub.state().commits.len(), 1);

    std::fs::write(folder.join("config.yaml"), "objective:\n  name: barlow\n").unwrap();
    let update = HubOptions {
        update: true,
        ..opts
    };
    let url = hub::push_folder("alice/m", &folder, "v2", &update).unwrap();
    let state = hub.state();
    assert_eq!(state.commits.len(), 2);
    assert_eq!(state.commits[1].summary, "v2");
    assert!(url.ends_with(&state.commits[1].oid), "{url}");
    drop(state);
    assert_eq!(
        hub.head_files("alice/m")["config.yaml"],
        b"objective:\n  name: barlow\n"
    );
}

#[test]
fn pull_reports_what_is_missing() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = hub.options(&tmp.path().join("cache"));
    hub::push_folder("alice/m", &model_folder(tmp.path()), "v1", &opts).unwrap();
    let ep = &hub.endpoint;

    let err = error_text(hub::pull("alice/m", &["config.yaml", "missing.bin"], &opts));
    assert_mentions(
        &err,
        &[&format!(
            "file missing.bin of alice/m at revision main not found on {ep}"
        )],
    );

    let err = error_text(hub::pull("alice/nothing", &FILES, &opts));
    assert_mentions(
        &err,
        &[&format!("repository alice/nothing not found on {ep}")],
    );

    let v9 = HubOptions {
        revision: "v9".to_string(),
        ..opts.clone()
    };
    let err = error_text(hub::pull("alice/m", &FILES, &v9));
    assert_mentions(
        &err,
        &[&format!("revision v9 of alice/m not found on {ep}")],
    );

    // A repository private to someone else: the Hub refuses a token it does not accept.
    hub.state().repos.get_mut("alice/m").unwrap().private = true;
    let stranger = HubOptions {
        token: Some("hf_someone_else".to_string()),
        cache_dir: Some(tmp.path().join("other-cache")),
        ..opts.clone()
    };
    let err = error_text(hub::pull("alice/m", &FILES, &stranger));
    assert_mentions(
        &err,
        &[
            &format!("repository alice/m not found on {ep} (HTTP 401)"),
            "it is private",
            "HF_TOKEN",
        ],
    );

    let err = error_text(hub::pull("alice/m", &[], &opts));
    assert_mentions(&err, &["no files to pull from alice/m"]);
}

#[test]
fn bad_arguments_fail_before_any_request() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = hub.options(tmp.path());
    let folder = model_folder(tmp.path());

    for repo in [
        "noslash",
        "a/b/c",
        "alice/",
        "/m",
        "alice/has space",
        "alice/-m",
        "alice/m..x",
    ] {
        let err = error_text(hub::push_folder(repo, &folder, "m", &opts));
        assert_mentions(&err, &[&format!("invalid repository id `{repo}`")]);
        let err = error_text(hub::pull(repo, &FILES, &opts));
        assert_mentions(&err, &["invalid repository id"]);
    }
    let missing = tmp.path().join("no-such-run");
    let err = error_text(hub::push_folder("alice/m", &missing, "m", &opts));
    assert_mentions(&err, &["cannot read the folder to push", "no-such-run"]);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = error_text(hub::push_folder("alice/m", &empty, "m", &opts));
    assert_mentions(&err, &["holds no files to push"]);
    let err = error_text(hub::push_folder("alice/m", &folder, "  ", &opts));
    assert_mentions(&err, &["commit message must not be empty"]);

    assert!(hub.state().requests.is_empty());
}

#[test]
fn parse_hf_path_cases() {
    let some = |repo: &str, rev: Option<&str>| Some((repo.to_string(), rev.map(str::to_string)));
    assert_eq!(
        hub::parse_hf_path("hf://alice/vicreg"),
        some("alice/vicreg", None)
    );
    assert_eq!(
        hub::parse_hf_path("hf://alice/vicreg@v2"),
        some("alice/vicreg", Some("v2"))
    );
    assert_eq!(
        hub::parse_hf_path("hf://alice/vicreg@refs/pr/1"),
        some("alice/vicreg", Some("refs/pr/1"))
    );
    assert_eq!(
        hub::parse_hf_path("hf://org-1/model_v1.5@0123abc"),
        some("org-1/model_v1.5", Some("0123abc"))
    );
    for bad in [
        "alice/vicreg",
        "hf://",
        "hf://alice",
        "hf://alice/",
        "hf:///vicreg",
        "hf://alice/vicreg@",
        "hf://a/b/c",
        "hf://alice/vic reg",
        "https://huggingface.co/alice/vicreg",
        "HF://alice/vicreg",
    ] {
        assert_eq!(hub::parse_hf_path(bad), None, "{bad}");
    }
}

// ---------------------------------------------------------------------------------------------
// Token lookup from the environment, in child processes so no test mutates this one's environment
// ---------------------------------------------------------------------------------------------

/// Runs the ignored test `name` of this binary in a child process whose Hugging Face environment
/// is `HF_HOME=home` plus `env`, with no `HF_TOKEN`.
fn run_child(name: &str, home: &Path, env: &[(&str, &Path)]) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([
        name,
        "--exact",
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ]);
    for key in [
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN",
        "HF_ENDPOINT",
        "HF_HUB_CACHE",
        "XDG_CACHE_HOME",
    ] {
        command.env_remove(key);
    }
    command.env("HF_HOME", home).env(CHILD_MARKER, "1");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child test {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn push_without_token_names_hf_token() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-token-here");
    run_child(
        "child_push_without_token",
        tmp.path(),
        &[("HF_TOKEN_PATH", &missing)],
    );
}

#[test]
fn push_reads_the_token_file() {
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token-file");
    std::fs::write(&token, format!("{WRITE_TOKEN}\n")).unwrap();
    run_child(
        "child_push_with_token_file",
        tmp.path(),
        &[("HF_TOKEN_PATH", &token)],
    );
}

#[test]
#[ignore = "run by push_without_token_names_hf_token in a child process"]
fn child_push_without_token() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: None,
        ..hub.options(tmp.path())
    };
    let err = error_text(hub::push_folder(
        "alice/m",
        &model_folder(tmp.path()),
        "m",
        &opts,
    ));
    let token_path = std::env::var("HF_TOKEN_PATH").unwrap();
    assert_mentions(
        &err,
        &[
            "HF_TOKEN",
            "hf auth login",
            &token_path,
            &hub.endpoint,
            "alice/m",
        ],
    );
    assert!(
        hub.state().requests.is_empty(),
        "nothing may be sent without a token"
    );

    // Pulling a public repository needs no token.
    let owner = hub.options(tmp.path());
    hub::push_folder("alice/m", &model_folder(tmp.path()), "m", &owner).unwrap();
    let anonymous = HubOptions {
        cache_dir: Some(tmp.path().join("anonymous-cache")),
        ..opts
    };
    let snapshot = hub::pull("alice/m", &FILES, &anonymous).unwrap();
    assert!(snapshot.join("model.safetensors").is_file());
    let state = hub.state();
    let downloads = state
        .requests
        .iter()
        .filter(|r| r.path.contains("/resolve/"));
    assert!(downloads.clone().count() > 0);
    assert!(
        downloads.clone().all(|r| r.authorization.is_none()),
        "{:?}",
        state.requests
    );
}

#[test]
#[ignore = "run by push_reads_the_token_file in a child process"]
fn child_push_with_token_file() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let opts = HubOptions {
        token: None,
        ..hub.options(tmp.path())
    };
    hub::push_folder("alice/m", &model_folder(tmp.path()), "m", &opts).unwrap();
    let state = hub.state();
    assert_eq!(state.commits.len(), 1);
    let bearer = format!("Bearer {WRITE_TOKEN}");
    let (hub_requests, storage): (Vec<&Seen>, Vec<&Seen>) =
        state.requests.iter().partition(|r| !r.storage);
    let all_authorised = hub_requests
        .iter()
        .all(|r| r.authorization.as_deref() == Some(&bearer as &str));
    assert!(all_authorised, "{:?}", state.requests);
    assert_eq!(
        storage.len(),
        1,
        "the weights' upload: {:?}",
        state.requests
    );
    assert!(storage[0].authorization.is_none(), "{:?}", storage[0]);
}

// ---------------------------------------------------------------------------------------------
// The staged repository of `ssl push`: recipe, licence, card, evaluation file, snippets
// ---------------------------------------------------------------------------------------------

/// A finished run in `dir` without training: the config resolved from `sets` (plus `out`), an
/// encoder for samples of `shape` with perturbed weights and batch-norm statistics saved as its
/// checkpoint, `split.json` (the digits' real split for digits, else a shape-only one),
/// `results.json` and a training log. Returns the config and the encoder.
fn fixture_run(
    dir: &Path,
    sets: &[&str],
    shape: &[usize],
) -> (ssl_train::config::RunConfig, Box<dyn ssl_models::Encoder>) {
    use candle_core::{Device, Tensor};
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for set in sets {
        ssl_train::config::apply_set(&mut root, set).unwrap();
    }
    ssl_train::config::apply_set(&mut root, &format!("out='{}'", dir.display())).unwrap();
    let cfg = ssl_train::config::RunConfig::from_yaml_value(root).unwrap();
    let data = match cfg.data.name.as_str() {
        "digits" => ssl_train::setup::data(&cfg).unwrap(),
        _ => ssl_train::setup::DataSplit::shape_only(shape, 40),
    };
    let store = ssl_core::ParamStore::new(cfg.train.seed);
    let encoder = ssl_train::setup::encoder(
        &cfg,
        &data.dataset,
        store.var_builder(&Device::Cpu).pp("encoder"),
    )
    .unwrap();
    for (name, var) in store.vars() {
        // Scaled weights (the activations keep their size) and shifted biases and statistics.
        let noise = || Tensor::rand(-0.5f32, 0.5, var.shape(), &Device::Cpu).unwrap();
        let value = match name.ends_with("running_var") {
            true => (noise() + 1.0).unwrap(),
            false => {
                let factor = ((noise() * 0.2).unwrap() + 1.0).unwrap();
                let scaled = (var.as_tensor() * factor).unwrap();
                (scaled + (noise() * 0.1).unwrap()).unwrap()
            }
        };
        var.set(&value).unwrap();
    }
    std::fs::create_dir_all(dir).unwrap();
    ssl_train::checkpoint::save(
        &dir.join("checkpoint"),
        &store.tensors(),
        &Default::default(),
        &ssl_train::checkpoint::TrainerState {
            epochs_done: 1,
            step: 3,
        },
    )
    .unwrap();
    std::fs::write(
        dir.join("config.yaml"),
        serde_yaml::to_string(&cfg).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("split.json"),
        serde_json::to_string(&data).unwrap(),
    )
    .unwrap();
    let row = |name: &str, acc: f64| {
        json!({"encoder": name, "metrics": {"probe_balanced_accuracy": acc, "knn_accuracy": acc,
               "rankme": 9.5, "effective_rank": 7.25}})
    };
    let results = json!({"seconds": 1.0, "rows": [row("raw inputs", 0.9), row("random init", 0.5),
                         row("vicreg", 0.95)]});
    std::fs::write(dir.join("results.json"), results.to_string()).unwrap();
    std::fs::write(
        dir.join("metrics.jsonl"),
        "{\"epoch\": 1, \"online_probe_accuracy\": 0.8}\n",
    )
    .unwrap();
    (cfg, encoder)
}

/// A quick offline suite (the metrics `ssl eval` computes, LiDAR on fewer views).
fn quick_suite() -> ssl_experiments::offline::SuiteConfig {
    ssl_experiments::offline::SuiteConfig {
        lidar_samples: 64,
        lidar_views: 4,
        ..ssl_hub::publish::default_suite("digits")
    }
}

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<String> {
    let map = value.as_object().expect("a JSON object");
    let mut keys: Vec<String> = map.keys().cloned().collect();
    keys.sort();
    keys
}

/// Every string in a JSON document.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            out.push(k.clone());
            strings(v, out);
        }),
        _ => {}
    }
}

#[test]
fn staged_repository_has_no_local_paths_and_the_eval_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let init = tmp.path().join("weights").join("start.safetensors");
    fixture_run(
        &run,
        &[
            "train.epochs=1",
            "train.seed=7",
            "data.split_seed=3",
            &format!("data.root='{}'", tmp.path().join("data").display()),
            &format!("model.init='{}'", init.display()),
        ],
        &[],
    );
    let opts = ssl_hub::publish::StageOptions {
        license: None,
        suite: Some(quick_suite()),
    };
    let dir = ssl_hub::publish::stage(&run, "user/digits-vicreg", &opts).unwrap();
    let local = tmp.path().display().to_string();
    for file in ["config.yaml", "README.md", "eval.json"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(
            !text.contains(&local),
            "{file} holds the local path {local}"
        );
    }
    // The recipe: neutral `out`, no `data.root`, the init file by name; it still loads.
    let recipe: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("config.yaml")).unwrap()).unwrap();
    assert_eq!(recipe["out"], json!(""));
    assert!(recipe["data"].get("root").is_none(), "{recipe}");
    assert_eq!(recipe["model"]["init"], json!("start.safetensors"));
    ssl_train::config::RunConfig::load_run(&dir).unwrap();
    let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert_mentions(
        &card,
        &[
            "license: cc-by-4.0",
            "`data.root` (a local directory) is removed",
            "`model.init` (a local file) is reduced to its name",
            "| encoder | model seed | split seed | test images |",
            // Digits: 1797 images, a stratified 20 % held out.
            "| random init | 7 | 3 | 360 |",
            "| raw inputs | – | 3 | 360 |",
            "Optical Recognition of Handwritten Digits",
        ],
    );
    assert!(!card.contains("datasets:"), "no Hub data set for digits");
    // eval.json: `ssl eval`'s report, field for field, with the repository's weights file.
    let eval: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("eval.json")).unwrap()).unwrap();
    let report = ssl_experiments::offline::Report {
        columns: vec![ssl_experiments::offline::Column {
            label: "a".into(),
            weights: "w".into(),
            metrics: Default::default(),
            knn_sweep: vec![(20, 0.07, 0.5)],
        }],
        cka: vec![("a".into(), "b".into(), 0.5)],
        trees: Vec::new(),
    };
    let written = serde_json::to_value(&report).unwrap();
    assert_eq!(keys(&eval), keys(&written));
    let column = &eval["columns"][0];
    assert_eq!(keys(column), keys(&written["columns"][0]));
    assert_eq!(eval["columns"].as_array().unwrap().len(), 1);
    assert_eq!(column["weights"], json!("model.safetensors"));
    assert_eq!(column["label"], json!("vicreg (hf://user/digits-vicreg)"));
    for metric in [
        "probe balanced accuracy",
        "k-NN best accuracy",
        "LiDAR",
        "online probe accuracy (training log)",
    ] {
        assert!(column["metrics"][metric].is_number(), "{metric}: {column}");
    }
    let cell = &column["knn_sweep"][0];
    assert!(
        cell[0].is_u64() && cell[1].is_f64() && cell[2].is_f64(),
        "{cell}"
    );
    let mut texts = Vec::new();
    strings(&eval, &mut texts);
    assert!(texts.iter().all(|s| !s.starts_with('/')), "{texts:?}");
    // `ssl eval`'s other outputs come along; the export is the checkpoint's encoder.
    for file in ["knn.csv", "pca.png", "model.safetensors"] {
        assert!(dir.join(file).is_file(), "{file} not staged");
    }
}

#[test]
fn push_flags_check_the_licence_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    fixture_run(&run, &["train.epochs=1"], &[]);
    let push = |extra: &[&str]| {
        let mut args = vec!["ssl", "push", run.to_str().unwrap(), "--repo", "user/name"];
        args.extend(extra);
        args.push("--dry-run");
        let cli = <ssl::cli::Cli as clap::Parser>::try_parse_from(args).unwrap();
        ssl::cli::execute(cli)
    };
    let err = error_text(push(&["--license", "cc-by-4"]));
    assert_mentions(
        &err,
        &["--license `cc-by-4`", "cc-by-4.0", "not a licence id"],
    );
    let err = error_text(push(&["--license", ""]));
    assert_mentions(&err, &["not a licence id"]);
    assert!(!run.join("hub").exists(), "nothing staged on a bad licence");
    // An image folder's terms are unknown to the run: --license is required.
    let folder = tmp.path().join("folder-run");
    fixture_run(
        &folder,
        &["data.name=folder", "data.size=16", "data.root=/images"],
        &[3, 16, 16],
    );
    let cli = <ssl::cli::Cli as clap::Parser>::try_parse_from([
        "ssl",
        "push",
        folder.to_str().unwrap(),
        "--repo",
        "user/name",
        "--dry-run",
    ])
    .unwrap();
    let err = error_text(ssl::cli::execute(cli));
    assert_mentions(&err, &["`folder` data", "pass --license"]);
    assert!(!folder.join("hub").exists());
}

#[test]
fn push_of_a_staged_run_uploads_the_card_eval_and_weights() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    fixture_run(&run, &["train.epochs=1"], &[]);
    let opts = ssl_hub::publish::StageOptions {
        license: Some("MIT".into()),
        suite: Some(quick_suite()),
    };
    let commit = ssl_hub::publish::push(
        &run,
        "user/digits",
        &opts,
        &hub.options(&tmp.path().join("c")),
    )
    .unwrap();
    assert!(!commit.is_empty());
    let files = hub.head_files("user/digits");
    // (The fake Hub, like the real one, starts a repository with a .gitattributes.)
    let names: Vec<&str> = files
        .keys()
        .map(String::as_str)
        .filter(|name| *name != ".gitattributes")
        .collect();
    assert_eq!(
        names,
        [
            "README.md",
            "config.yaml",
            "eval.json",
            "knn.csv",
            "model.safetensors",
            "pca.png"
        ]
    );
    let card = String::from_utf8(files["README.md"].clone()).unwrap();
    assert_mentions(&card, &["license: mit\n", "The weights: `mit`"]);
    let pulled =
        ssl_hub::publish::pull("user/digits", &hub.options(&tmp.path().join("c"))).unwrap();
    for file in ssl_hub::publish::FILES {
        assert_eq!(
            std::fs::read(pulled.join(file)).unwrap(),
            files[file],
            "{file}"
        );
    }
}

/// Per encoder: a fixture run, its export and card, and `reference.safetensors` (an input and
/// the Candle encoder's eval-mode features of it) in `SSL_CARD_SNIPPETS/<case>/` when that is set
/// (for `bin/benches/card_snippet.py`, which runs the card's Python code on them), else in a
/// temporary directory. Checks that the export, read the way the card's Rust code reads it
/// (`VarBuilder::from_mmaped_safetensors` into a fresh encoder), gives those features.
#[test]
fn card_snippet_fixtures_load_back_in_candle() {
    use candle_core::{DType, Device, Tensor};
    let tmp = tempfile::tempdir().unwrap();
    let out = std::env::var_os("SSL_CARD_SNIPPETS")
        .map_or_else(|| tmp.path().join("snippets"), PathBuf::from);
    let cases: [(&str, &[&str], &[usize]); 7] = [
        ("digits_cnn", &["data.size=16"], &[1, 16, 16]),
        ("mlp", &["data.name=gmm", "model.encoder=mlp"], &[2]),
        (
            "resnet18_cifar",
            &["model.encoder=resnet18", "model.stem=cifar"],
            &[1, 16, 16],
        ),
        (
            "resnet34_gray",
            &["model.encoder=resnet34", "data.size=32"],
            &[1, 32, 32],
        ),
        (
            "resnet50_rgb",
            &[
                "data.name=bloodmnist",
                "data.size=28",
                "model.encoder=resnet50",
            ],
            &[3, 28, 28],
        ),
        (
            "resnet18_3d",
            &["data.name=organmnist3d", "data.size=28"],
            &[1, 28, 28, 28],
        ),
        (
            "vit_t16",
            &[
                "data.name=bloodmnist",
                "data.size=32",
                "model.encoder=vit_t16",
            ],
            &[3, 32, 32],
        ),
    ];
    for (case, sets, shape) in cases {
        let run = tmp.path().join(case);
        let (cfg, encoder) = fixture_run(&run, sets, shape);
        let dir = out.join(case);
        std::fs::create_dir_all(&dir).unwrap();
        let exported =
            ssl_train::export::export_encoder(&run, &dir.join("model.safetensors")).unwrap();
        let weights = ssl_train::checkpoint::load_tensors(&exported.path).unwrap();
        let (recipe, notes) = ssl_hub::card::published_config(&cfg);
        let card = ssl_hub::card::model_card(&ssl_hub::card::Card {
            repo: &format!("user/{case}"),
            cfg: &recipe,
            recipe_notes: &notes,
            license: "mit",
            results: &ssl_train::results::Results {
                seconds: 1.0,
                phases: Default::default(),
                rows: Vec::new(),
            },
            split: &ssl_hub::card::Split {
                seed: 0,
                train: vec![0, 1],
                test: vec![2],
            },
            eval: &ssl_experiments::offline::Report {
                columns: Vec::new(),
                cka: Vec::new(),
                trees: Vec::new(),
            },
            weights: &weights,
        })
        .unwrap();
        std::fs::write(dir.join("README.md"), &card).unwrap();
        let mut input_shape = vec![2];
        input_shape.extend(shape);
        let x = Tensor::randn(0f32, 1.0, input_shape, &Device::Cpu).unwrap();
        let expected = encoder.forward_t(&x, false).unwrap();
        candle_core::safetensors::save(
            &HashMap::from([
                ("input".to_string(), x.clone()),
                ("output".to_string(), expected.clone()),
            ]),
            dir.join("reference.safetensors"),
        )
        .unwrap();
        // The export read back as the card's Rust code reads it.
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &Device::Cpu,
            )
            .unwrap()
        };
        let dataset = ssl_train::setup::DataSplit::shape_only(shape, 1).dataset;
        let loaded = ssl_train::setup::encoder(&cfg, &dataset, vb).unwrap();
        let got = loaded.forward_t(&x, false).unwrap();
        let diff = (got - &expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{case}: reloaded export differs by {diff}");
        let python = card
            .split("```python\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap_or_else(|| panic!("{case}: no Python block"));
        assert!(python.contains("strict=True"), "{case}");
        let dim = expected.dims()[1];
        assert!(
            python.contains(&format!("assert features.shape == (1, {dim})")),
            "{case}: {python}"
        );
    }
}
