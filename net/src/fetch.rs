//! Resumable, verified downloads: a file fetched to `FILE.part` and renamed to `FILE` only once
//! its MD5 matches the published one, so the final name never holds a partial or corrupt file,
//! and a file already there is replaced by that rename alone: a download that fails leaves it
//! byte for byte as it was. A transfer that breaks (network failure, server closing early) keeps
//! the `.part`, and the next attempt asks only for the rest with `Range: bytes=N-`; a server that
//! ignores the range answers with the whole file, which then replaces the part. Files are created
//! with the mode `0o666 & !umask`, as any file the user creates.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use md5::{Digest, Md5};
use reqwest::blocking::Response;
use reqwest::header::{CONTENT_RANGE, RANGE};
use reqwest::StatusCode;

/// What [`fetch_verified`] (or a data set download built on it, such as Caltech-256's, which
/// extracts the file) left in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// The file, its MD5 verified (Caltech-256: the directory extracted from it).
    pub path: PathBuf,
    /// The file was already there with the right MD5 (Caltech-256: the directory was there), so
    /// nothing was requested.
    pub already_present: bool,
    /// This call checked the MD5 (of the file; for Caltech-256, of the archive it extracted).
    /// False only for a Caltech-256 directory that was already there, taken as it is.
    pub verified: bool,
}

impl Downloaded {
    /// What `ssl data download` reports: where the data is and whether its MD5 was checked.
    pub fn summary(&self) -> String {
        let path = self.path.display();
        match (self.already_present, self.verified) {
            (false, _) => format!("downloaded: {path} (MD5 verified)"),
            (true, true) => format!("already downloaded: {path} (MD5 verified)"),
            (true, false) => format!(
                "already there: {path} (a directory found in place, not verified; remove it to \
                 download the archive and verify it again)"
            ),
        }
    }
}

/// Downloads `url` to `path` unless `path` already holds a file whose MD5 is `md5` (hex).
///
/// Bytes go to `path` + `.part`, resumed with a `Range` request when that file exists (or
/// renamed without any request when it is already whole), and the part is renamed to `path`
/// only when the MD5 of the whole file matches; an existing `path` with another MD5 stays as it
/// is until then. On a wrong MD5 the part is deleted (the next attempt starts afresh); on a
/// network failure or truncated transfer it is kept (the next attempt resumes). Every error
/// names the problem and what to do about it.
pub fn fetch_verified(url: &str, path: &Path, md5: &str, progress: bool) -> Result<Downloaded> {
    let md5 = md5.to_ascii_lowercase();
    let done = |already_present| Downloaded {
        path: path.to_path_buf(),
        already_present,
        verified: true,
    };
    if path.is_file() {
        let actual = md5_file(path)?;
        if actual == md5 {
            return Ok(done(true));
        }
        note(
            progress,
            format!(
                "{}: its MD5 {actual} is not the published {md5}; downloading it again (the \
                 file stays as it is until the new one has arrived and matched)",
                path.display()
            ),
        );
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir).map_err(|e| not_writable(dir, e))?;
    let part = part_path(path);
    let client = crate::client::http_client()
        // Per read, not for the whole transfer (blocking client).
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot start the HTTP client")?;

    let mut restarted = false;
    loop {
        let (offset, so_far) = hash_part(&part)?;
        // A whole part whose rename did not happen.
        if offset > 0 && hex(&so_far.clone().finalize()) == md5 {
            return finish(&part, path).map(|()| done(false));
        }
        let mut request = client.get(url);
        if offset > 0 {
            note(
                progress,
                format!("resuming {} at byte {offset}", part.display()),
            );
            request = request.header(RANGE, format!("bytes={offset}-"));
        }
        let response = request
            .send()
            .map_err(|e| broken(url, &part, offset, None, &anyhow!(e.without_url())))?;
        let status = response.status();
        let (start, so_far) = match status {
            StatusCode::OK => (0, Md5::new()),
            StatusCode::PARTIAL_CONTENT if range_start(&response) == Some(offset) => {
                (offset, so_far)
            }
            // The part is not a beginning of this file (it is longer, or belongs to another
            // one): start over, once.
            StatusCode::PARTIAL_CONTENT | StatusCode::RANGE_NOT_SATISFIABLE
                if offset > 0 && !restarted =>
            {
                fs::remove_file(&part)
                    .with_context(|| format!("cannot remove {}", part.display()))?;
                restarted = true;
                continue;
            }
            _ => {
                let hint = match status.is_server_error() {
                    true => "try again later",
                    false => "check the address (--url), the flag and the size",
                };
                bail!("{url} answered HTTP {status}; {hint}");
            }
        };
        let actual = transfer(response, url, &part, start, so_far, progress)?;
        if actual != md5 {
            // Removed so that the next attempt does not resume from bad bytes.
            let _ = fs::remove_file(&part);
            let kept = match path.is_file() {
                true => format!(" ({} is left as it was)", path.display()),
                false => String::new(),
            };
            bail!(
                "{url} sent a file whose MD5 is {actual}, not the published {md5}; the download \
                 was deleted{kept}, so running the command again starts afresh (if this repeats, \
                 the file at that address is not the published one: check --url)"
            );
        }
        return finish(&part, path).map(|()| done(false));
    }
}

/// `path` with `.part` appended to its name.
pub fn part_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    path.with_file_name(name)
}

/// The length of `part` and the MD5 state of its bytes (0 and a fresh state when there is none).
fn hash_part(part: &Path) -> Result<(u64, Md5)> {
    let mut hasher = Md5::new();
    let mut file = match File::open(part) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, hasher)),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", part.display())),
    };
    let length = hash_into(&mut file, &mut hasher)
        .with_context(|| format!("cannot read {}", part.display()))?;
    Ok((length, hasher))
}

/// Writes the body of `response` into `part` from byte `start` (its length; 0 writes it afresh),
/// `hasher` holding the MD5 state of the bytes before; returns the MD5 of the whole file.
fn transfer(
    mut response: Response,
    url: &str,
    part: &Path,
    start: u64,
    mut hasher: Md5,
    progress: bool,
) -> Result<String> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(part)
        .map_err(|e| not_writable(part.parent().unwrap_or(Path::new(".")), e))?;
    file.set_len(start)
        .and_then(|()| file.seek(SeekFrom::Start(start)))
        .with_context(|| format!("cannot write {}", part.display()))?;
    let length = response.content_length();
    let total = length.map(|n| start + n);
    let bar = progress.then(|| {
        let bar = ssl_core::progress::bar(
            total.unwrap_or(0),
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        );
        bar.set_message(
            part.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
        bar.set_position(start);
        bar
    });
    let mut received = 0u64;
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = match response.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(broken(url, part, start + received, total, &e.into())),
        };
        file.write_all(&buffer[..n]).with_context(|| {
            format!(
                "cannot write {} (disk full?); the bytes so far are kept, so running the command \
                 again resumes once there is room (or choose another --dir)",
                part.display()
            )
        })?;
        hasher.update(&buffer[..n]);
        received += n as u64;
        if let Some(bar) = &bar {
            bar.inc(n as u64);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // hyper reports an early end itself; checked again so that none passes as a whole file.
    if length.is_some_and(|n| received < n) {
        let cause = anyhow!("the server closed the connection early");
        return Err(broken(url, part, start + received, total, &cause));
    }
    file.sync_all()
        .with_context(|| format!("cannot write {}", part.display()))?;
    Ok(hex(&hasher.finalize()))
}

/// Renames the verified `part` to `path`.
fn finish(part: &Path, path: &Path) -> Result<()> {
    fs::rename(part, path)
        .with_context(|| format!("cannot rename {} to {}", part.display(), path.display()))
}

/// The first byte of a `206` answer's `Content-Range: bytes FIRST-LAST/TOTAL`.
fn range_start(response: &Response) -> Option<u64> {
    let value = response.headers().get(CONTENT_RANGE)?.to_str().ok()?;
    let range = value.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

/// The error for a transfer that stopped: what broke, and that a retry resumes from `part`.
fn broken(
    url: &str,
    part: &Path,
    have: u64,
    total: Option<u64>,
    cause: &anyhow::Error,
) -> anyhow::Error {
    let of = total.map_or(String::new(), |t| format!(" of {t}"));
    let next = match have {
        0 => "check the network (or --url) and run the command again".to_string(),
        _ => format!(
            "{have}{of} bytes are kept in {}: check the network (or --url) and run the command \
             again, which resumes from there",
            part.display()
        ),
    };
    anyhow!("the download of {url} failed ({cause:#}); {next}")
}

fn not_writable(dir: &Path, e: io::Error) -> anyhow::Error {
    anyhow!(
        "cannot write to {} ({e}); choose a writable directory with --dir",
        dir.display()
    )
}

fn md5_file(path: &Path) -> Result<String> {
    let mut hasher = Md5::new();
    File::open(path)
        .and_then(|mut file| hash_into(&mut file, &mut hasher))
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(hex(&hasher.finalize()))
}

/// Feeds what is left of `reader` to `hasher`; returns how many bytes that was.
fn hash_into(reader: &mut impl Read, hasher: &mut Md5) -> io::Result<u64> {
    let mut buffer = vec![0u8; 1 << 16];
    let mut total = 0;
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return Ok(total),
            Ok(n) => {
                hasher.update(&buffer[..n]);
                total += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn note(progress: bool, line: String) {
    if progress {
        ssl_core::progress::println(line);
    }
}
