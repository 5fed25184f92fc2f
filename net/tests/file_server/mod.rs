//! A small HTTP/1.1 file server on 127.0.0.1 for the download tests of ssl-net, ssl-data and
//! `ssl`: each test starts one that serves a MedMNIST-format file made from the embedded digits (or
//! any body). It honours `Range: bytes=N-` (or ignores it), can close a transfer early or answer
//! with an error status, and records every request so the tests can check what reached it.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use md5::{Digest, Md5};

/// The official MD5 of `breastmnist.npz` (size 28), which the digits stand-in does not have.
pub const OFFICIAL_BREASTMNIST_MD5: &str = "750601b1f35ba3300ea97c75c52ff8f6";

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Mode {
    /// Serve the file, answering `Range: bytes=N-` with 206 (or 416 past the end).
    Serve,
    /// Serve the whole file with 200 whatever the request asks.
    IgnoreRange,
    /// Announce the whole file (200) but close the connection after this many bytes of it.
    CloseAfter(usize),
    /// Answer with this status and no body.
    Status(u16),
}

/// One request as it reached the server.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub path: String,
    pub range: Option<String>,
}

pub struct State {
    pub body: Vec<u8>,
    pub mode: Mode,
    pub requests: Vec<Seen>,
}

pub struct Server {
    pub base: String,
    state: Arc<Mutex<State>>,
}

impl Server {
    pub fn start(body: Vec<u8>, mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the test server");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            body,
            mode,
            requests: Vec::new(),
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Self { base, state }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub fn url(&self) -> String {
        format!("{}/breastmnist.npz", self.base)
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.state().requests.clone()
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() {
            return;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((key, value)) = header.split_once(':') {
            if key.trim().eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    let (mode, body) = {
        let mut state = state.lock().unwrap();
        let seen = Seen {
            path,
            range: range.clone(),
        };
        state.requests.push(seen);
        (state.mode, state.body.clone())
    };
    let len = body.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .map(|n| n.parse::<usize>().expect("a Range of the form bytes=N-"));
    let (status, headers, body): (u16, String, &[u8]) = match (mode, start) {
        (Mode::Status(status), _) => (status, String::new(), &[]),
        (Mode::Serve, Some(n)) if n >= len => {
            (416, format!("Content-Range: bytes */{len}\r\n"), &[])
        }
        (Mode::Serve, Some(n)) => (
            206,
            format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1),
            &body[n..],
        ),
        _ => (200, String::new(), &body[..]),
    };
    let head = format!(
        "HTTP/1.1 {status} Test\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
        body.len()
    );
    let sent = match mode {
        Mode::CloseAfter(n) => &body[..n],
        _ => body,
    };
    let _ = writer.write_all(head.as_bytes());
    let _ = writer.write_all(sent);
    let _ = writer.flush();
    let _ = writer.shutdown(Shutdown::Both);
}

/// The bytes of a MedMNIST-format `breastmnist.npz` made from the digits, and their MD5.
pub fn sample() -> &'static (Vec<u8>, String) {
    static SAMPLE: OnceLock<(Vec<u8>, String)> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("breastmnist.npz");
        ssl_data::write_digits_as_medmnist(&path, "breastmnist", 28).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let md5 = md5_hex(&bytes);
        (bytes, md5)
    })
}

pub fn md5_hex(bytes: &[u8]) -> String {
    Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The entries of `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
