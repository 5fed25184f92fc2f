//! Files written whole or not at all, and the decoded-image caches of MedMNIST and image folders
//! built on them.
//!
//! * **Partial files.** A [`Partial`] is written under a visible temporary name beside its final
//!   path, `{name}.ssl-partial-{pid}-{n}`, and renamed into place once complete, so the final
//!   name never holds a partial file. Its writer holds an exclusive lock on it until then; the
//!   lock dies with the process, so a partial file nobody holds is left over from a killed or
//!   crashed writer, and every [`cached`] call removes those in its directory. It is created like
//!   any file (not by `tempfile`, which makes `0600` files): its mode is `0o666 & !umask`.
//! * **Caches.** A cache file holds the data bytes, then a [`TRAILER_LEN`]-byte trailer: the
//!   marker [`MAGIC`] and the MD5 of a *key* that names the content the bytes were made from (the
//!   caller's choice: sizes and checksums, not modification times). A cache is used only when its
//!   length and trailer match; otherwise it is built again. It is memory-mapped, so the images
//!   live in the page cache and nowhere else. A cache whose length is known only once written
//!   ([`cached_unsized`]: images of their own sizes) is used when its trailer matches and the
//!   caller's check accepts its bytes.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{anyhow, ensure, Context, Result};
use md5::{Digest, Md5};
use memmap2::Mmap;

use crate::npy::Counted;

/// What a temporary file's name carries after its final name, before `{pid}-{n}`.
const PARTIAL_INFIX: &str = ".ssl-partial-";

/// The first half of a cache file's trailer.
const MAGIC: &[u8; 16] = b"candle-ssl cache";

/// Bytes after a cache file's data: [`MAGIC`] and the MD5 of its key.
pub(crate) const TRAILER_LEN: usize = 32;

/// A file being written under a temporary name beside `path`: renamed to `path` by
/// [`Partial::persist`], removed when dropped before that.
pub(crate) struct Partial {
    file: File,
    temp: PathBuf,
    path: PathBuf,
    persisted: bool,
}

impl Partial {
    /// A new, empty, locked temporary file for `path`, its directory created first; `fix` says
    /// what to do when that directory is not writable.
    pub(crate) fn create(path: &Path, fix: &str) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = parent(path);
        let unwritable =
            |e: std::io::Error| anyhow!("cannot write {} ({e}); {fix}", path.display());
        std::fs::create_dir_all(dir).map_err(unwritable)?;
        let name = path
            .file_name()
            .unwrap_or(OsStr::new("file"))
            .to_string_lossy();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let temp = dir.join(format!("{name}{PARTIAL_INFIX}{}-{n}", std::process::id()));
            let file = match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(unwritable(e)),
            };
            // Where locks are unsupported, cleaners cannot lock the file either, so they leave it.
            let _ = file.lock();
            // A cleaner that opened the file before the lock may have removed it: try another
            // name (one that is there now is ours, as no one else makes names with our pid).
            if temp.exists() {
                return Ok(Self {
                    file,
                    temp,
                    path: path.to_path_buf(),
                    persisted: false,
                });
            }
        }
    }

    /// The temporary file, to write into.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// Renames the temporary file to the final path, replacing what was there.
    pub(crate) fn persist(mut self) -> Result<()> {
        std::fs::rename(&self.temp, &self.path).with_context(|| {
            format!(
                "cannot rename {} into {}",
                self.temp.display(),
                self.path.display()
            )
        })?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// The directory `path` is in (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Whether `name` is a [`Partial`]'s temporary name: `{name}.ssl-partial-{pid}-{n}`.
fn is_partial_name(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.rsplit_once(PARTIAL_INFIX)
        .and_then(|(_, tail)| tail.split_once('-'))
        .is_some_and(|(pid, n)| {
            [pid, n]
                .iter()
                .all(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Removes the partial files in `dir` that no writer holds (left by a run that was killed);
/// best effort, as a file that cannot be removed now can be on a later run.
fn remove_stale_partials(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !is_partial_name(&entry.file_name()) {
            continue;
        }
        // The lock is held while removing, so a writer locking it meanwhile sees it gone.
        if let Ok(file) = File::open(entry.path()) {
            if file.try_lock().is_ok() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The data bytes of a memory-mapped cache file (its trailer left out).
pub(crate) struct CacheBytes {
    map: Mmap,
    len: usize,
}

impl AsRef<[u8]> for CacheBytes {
    fn as_ref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

/// The `len` data bytes of the cache file `path` for the content named by `key`, memory-mapped:
/// the file as it is when its length and trailer say it holds them, else first written afresh
/// from what `fill` streams into it (`len` bytes; see the module docs). Stale partial files in
/// its directory are removed first. `fix` says what to do when the directory is not writable.
pub(crate) fn cached(
    path: &Path,
    len: usize,
    key: &[u8],
    fix: &str,
    fill: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<CacheBytes> {
    build(path, len, key, fix, |file| streamed(file, path, fill))
}

/// [`cached`] for data whose length `fill` decides: the file as it is when its trailer names
/// `key` and `valid` accepts its data bytes (whatever their length), else written afresh.
pub(crate) fn cached_unsized(
    path: &Path,
    key: &[u8],
    fix: &str,
    valid: impl Fn(&[u8]) -> bool,
    fill: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<CacheBytes> {
    build_checked(path, None, key, fix, valid, |file| {
        streamed(file, path, fill)
    })
}

/// What `fill` writes into `file` (the cache `path` being built), through a buffer; the bytes
/// written.
fn streamed(
    file: &File,
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<usize> {
    let mut out = Counted {
        inner: BufWriter::with_capacity(1 << 20, file),
        bytes: 0,
    };
    fill(&mut out)?;
    out.flush()
        .with_context(|| format!("writing {} (disk full?)", path.display()))?;
    Ok(out.bytes)
}

/// [`cached`] for data whose parts arrive out of order (the members of a tar archive): `fill`
/// writes each part where it belongs with [`Placed::write_at`], and must cover all `len` bytes
/// exactly once.
pub(crate) fn cached_placed(
    path: &Path,
    len: usize,
    key: &[u8],
    fix: &str,
    fill: impl FnOnce(&mut Placed) -> Result<()>,
) -> Result<CacheBytes> {
    build(path, len, key, fix, |file| {
        let mut out = Placed {
            inner: BufWriter::with_capacity(1 << 20, file),
            at: 0,
            len,
            bytes: 0,
            path,
        };
        fill(&mut out)?;
        out.inner
            .flush()
            .with_context(|| format!("writing {} (disk full?)", path.display()))?;
        Ok(out.bytes)
    })
}

/// A cache being built from parts written at their offsets (see [`cached_placed`]).
pub(crate) struct Placed<'a> {
    inner: BufWriter<&'a File>,
    /// Where the next byte written goes.
    at: usize,
    len: usize,
    /// Bytes written so far.
    bytes: usize,
    path: &'a Path,
}

impl Placed<'_> {
    /// Writes `bytes` at byte `offset` of the cache's data.
    pub(crate) fn write_at(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        ensure!(
            offset + bytes.len() <= self.len,
            "{}: bytes {offset}..{} are outside the {} the cache holds",
            self.path.display(),
            offset + bytes.len(),
            self.len
        );
        let written = (|| {
            if offset != self.at {
                self.inner.seek(SeekFrom::Start(offset as u64))?;
            }
            self.inner.write_all(bytes)
        })();
        written.with_context(|| format!("writing {} (disk full?)", self.path.display()))?;
        self.at = offset + bytes.len();
        self.bytes += bytes.len();
        Ok(())
    }
}

/// The cache file `path`, mapped as it is when it holds `len` bytes for `key`, else built by
/// `fill` (which returns how many bytes it wrote) in a [`Partial`] renamed into place.
fn build(
    path: &Path,
    len: usize,
    key: &[u8],
    fix: &str,
    fill: impl FnOnce(&File) -> Result<usize>,
) -> Result<CacheBytes> {
    build_checked(path, Some(len), key, fix, |_| true, fill)
}

/// [`build`] for `len` bytes, or any number when `None`, that `valid` accepts (the file is
/// built again when it does not).
fn build_checked(
    path: &Path,
    len: Option<usize>,
    key: &[u8],
    fix: &str,
    valid: impl Fn(&[u8]) -> bool,
    fill: impl FnOnce(&File) -> Result<usize>,
) -> Result<CacheBytes> {
    remove_stale_partials(parent(path));
    let trailer = trailer(key);
    if let Some(bytes) = map_if_holds(path, len, &trailer).filter(|b| valid(b.as_ref())) {
        return Ok(bytes);
    }
    let partial = Partial::create(path, fix)?;
    let bytes = fill(partial.file())?;
    if let Some(len) = len {
        ensure!(
            bytes == len,
            "{}: {bytes} bytes were decoded, {len} expected",
            path.display(),
        );
    }
    let mut file = partial.file();
    file.seek(SeekFrom::Start(bytes as u64))
        .and_then(|_| file.write_all(&trailer))
        .with_context(|| format!("writing {} (disk full?)", path.display()))?;
    partial.persist()?;
    let mapped = map_if_holds(path, Some(bytes), &trailer).with_context(|| {
        format!(
            "{} changed while it was being opened; run again",
            path.display()
        )
    })?;
    ensure!(
        valid(mapped.as_ref()),
        "{} was written but does not read back whole; remove it and run again",
        path.display()
    );
    Ok(mapped)
}

/// The cache file `path` memory-mapped when it holds `len` bytes for `key`, else `None`.
pub(crate) fn open_cached(path: &Path, len: usize, key: &[u8]) -> Option<CacheBytes> {
    map_if_holds(path, Some(len), &trailer(key))
}

/// A cache's trailer for `key`: [`MAGIC`] and the key's MD5.
fn trailer(key: &[u8]) -> [u8; TRAILER_LEN] {
    let mut trailer = [0u8; TRAILER_LEN];
    trailer[..MAGIC.len()].copy_from_slice(MAGIC);
    trailer[MAGIC.len()..].copy_from_slice(&Md5::digest(key));
    trailer
}

/// `path` memory-mapped when it is `wanted` bytes (any number when `None`) followed by
/// `trailer`.
fn map_if_holds(
    path: &Path,
    wanted: Option<usize>,
    trailer: &[u8; TRAILER_LEN],
) -> Option<CacheBytes> {
    let file = File::open(path).ok()?;
    let len = usize::try_from(file.metadata().ok()?.len())
        .ok()?
        .checked_sub(TRAILER_LEN)?;
    if wanted.is_some_and(|wanted| wanted != len) {
        return None;
    }
    // SAFETY: the cache is ours, complete (renamed into place whole) and only read; a file
    // truncated under the map by another process would fault, as with any mapped file.
    let map = unsafe { Mmap::map(&file) }.ok()?;
    (map.get(len..) == Some(&trailer[..])).then_some(CacheBytes { map, len })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The names in `dir`, sorted (shared with the other cache tests of the crate).
    pub(crate) fn names(dir: &Path) -> Result<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        Ok(names)
    }

    #[test]
    fn a_cache_is_built_once_per_key_and_its_trailer_is_hidden() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.u8");
        let build = |key: &[u8], value: u8| {
            cached(&path, 3, key, "fix", |out| Ok(out.write_all(&[value; 3])?))
        };
        assert_eq!(build(b"one", 1)?.as_ref(), [1, 1, 1]);
        assert_eq!(std::fs::metadata(&path)?.len(), (3 + TRAILER_LEN) as u64);
        // The same key: the file as it is (the fill is not run).
        assert_eq!(build(b"one", 2)?.as_ref(), [1, 1, 1]);
        // Another key, or a damaged trailer: built again.
        assert_eq!(build(b"two", 2)?.as_ref(), [2, 2, 2]);
        let mut bytes = std::fs::read(&path)?;
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &bytes)?;
        assert_eq!(build(b"two", 3)?.as_ref(), [3, 3, 3]);
        assert_eq!(names(dir.path())?, ["c.u8"]);
        Ok(())
    }

    #[test]
    fn an_unsized_cache_is_used_while_its_check_accepts_it() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.u8");
        let even = |bytes: &[u8]| bytes.len().is_multiple_of(2);
        let build = |value: u8, n: usize| {
            cached_unsized(&path, b"k", "fix", even, |out| {
                Ok(out.write_all(&vec![value; n])?)
            })
        };
        assert_eq!(build(1, 4)?.as_ref(), [1; 4]);
        // Any length the check accepts: the file as it is (the fill is not run).
        assert_eq!(build(2, 6)?.as_ref(), [1; 4]);
        // A file the check refuses under an intact trailer is built again.
        std::fs::write(&path, [&[7u8; 3][..], &trailer(b"k")].concat())?;
        assert_eq!(build(3, 2)?.as_ref(), [3; 2]);
        // A build the check refuses is an error, not a mapped file.
        std::fs::remove_file(&path)?;
        let e = format!("{:#}", build(4, 3).err().expect("an error"));
        assert!(e.contains("does not read back whole"), "{e}");
        Ok(())
    }

    #[test]
    fn a_failed_or_short_build_leaves_neither_cache_nor_partial() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.u8");
        let e = cached(&path, 3, b"k", "fix", |_| anyhow::bail!("decoding failed"));
        assert!(format!("{:#}", e.err().unwrap()).contains("decoding failed"));
        let short = cached(&path, 3, b"k", "fix", |out| Ok(out.write_all(&[1])?));
        let e = format!("{:#}", short.err().unwrap());
        assert!(e.contains("1 bytes were decoded, 3 expected"), "{e}");
        assert!(names(dir.path())?.is_empty());
        Ok(())
    }

    #[test]
    fn stale_partials_are_removed_and_held_ones_kept() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let stale = dir.path().join("x.u8.ssl-partial-4194304-7");
        let held = dir.path().join("y.u8.ssl-partial-4194305-0");
        // Not ours: a name that only looks alike, and a download's part.
        let others = ["z.ssl-partial-notes.txt", "x.npz.part"];
        for path in [&stale, &held] {
            std::fs::write(path, b"partial")?;
        }
        for name in others {
            std::fs::write(dir.path().join(name), b"keep")?;
        }
        let writer = File::open(&held)?;
        writer.lock()?;
        cached(&dir.path().join("c.u8"), 1, b"k", "fix", |out| {
            Ok(out.write_all(&[0])?)
        })?;
        let mut expected = vec!["c.u8", "x.npz.part", "y.u8.ssl-partial-4194305-0"];
        expected.push("z.ssl-partial-notes.txt");
        assert_eq!(names(dir.path())?, expected);
        Ok(())
    }

    #[test]
    fn an_unwritable_directory_names_the_fix() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, b"")?;
        let e = cached(&blocked.join("sub/c.u8"), 1, b"k", "set SSL_CACHE", |_| {
            Ok(())
        });
        let e = format!("{:#}", e.err().unwrap());
        assert!(
            e.contains("cannot write") && e.contains("sub/c.u8") && e.contains("set SSL_CACHE"),
            "{e}"
        );
        Ok(())
    }
}
