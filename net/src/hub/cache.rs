//! One repository's part of the Hugging Face cache, in `huggingface_hub`'s layout: blobs named by
//! their id, snapshots of links to them per commit, refs naming commits, and the lock files that
//! let processes sharing the cache download each blob once.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ssl_core::atomic;

/// One repository's part of the Hugging Face cache: `models--{owner}--{name}/`.
pub(super) struct RepoCache {
    root: PathBuf,
}

impl RepoCache {
    pub(super) fn new(cache_dir: &Path, repo: &str) -> Self {
        let root = cache_dir.join(format!("models--{}", repo.replace('/', "--")));
        Self { root }
    }

    /// `snapshots/{commit}`: the repository's files at `commit`, as links to their blobs.
    pub(super) fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    /// `blobs/{etag}`: the content of every version of a file with that id.
    pub(super) fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    /// Holds the lock of `blobs/{etag}` until dropped, waiting while another process (or
    /// thread) holds it: `.locks/models--{owner}--{name}/{etag}.lock` beside the repository's
    /// folder, the file `huggingface_hub` locks around the same download (an advisory `flock`
    /// on Unix, which its `filelock` takes too), so the two tools sharing one cache also wait
    /// for each other.
    pub(super) fn lock_blob(&self, etag: &str, file: &str) -> Result<std::fs::File> {
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
    pub(super) fn link(&self, commit: &str, file: &str, etag: &str) -> Result<()> {
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
    pub(super) fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        write_atomically(&self.root.join("refs").join(revision), |out| {
            Ok(out.write_all(commit.as_bytes())?)
        })
    }
}

/// Creates `path`, and its directory, through [`atomic::write_with`].
pub(super) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<()>,
) -> Result<()> {
    let parent = path.parent().expect("a path in the cache");
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    atomic::write_with(path, write)
}
