//! Files replaced whole or not at all: written to a temporary file beside the target, synced to
//! the disk and renamed over it, the rename synced too; what killed writers leave goes with the
//! next write. Checkpoints, exports, reports and the Hub cache all write through [`write_with`].

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Writes `path` with what `write` writes to it, so that `path` holds either its old content
/// or all of the new, whatever stops the process or the machine: the bytes go to a temporary
/// file beside it ([`temp_path`], removed if writing fails), which reaches the disk
/// before it is renamed over `path`; the rename reaches the disk before this returns. The
/// directory must exist.
pub fn write_with(path: &Path, write: impl FnOnce(&mut File) -> Result<()>) -> Result<()> {
    let temp = temp_path(path);
    let written = File::create(&temp)
        .with_context(|| format!("cannot create {}", temp.display()))
        .and_then(|mut file| {
            write(&mut file)?;
            file.sync_all()
                .with_context(|| format!("cannot write {}", temp.display()))
        })
        .and_then(|()| {
            std::fs::rename(&temp, path)
                .with_context(|| format!("cannot move {} into place", path.display()))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    remove_abandoned_temps(path);
    // The rename is the directory's change: durable once the directory is synced.
    #[cfg(unix)]
    {
        let dir = directory(path);
        File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync the directory {}", dir.display()))?;
    }
    Ok(())
}

/// The directory `path` is in (`.` for a bare file name).
fn directory(path: &Path) -> &Path {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    dir.unwrap_or(Path::new("."))
}

/// How long a temporary file of a writer that no longer runs stays untouched before
/// [`write_with`] removes it (a writer in another PID namespace may still be writing it).
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the temporary files that writers of `path` killed mid-write left beside it:
/// `NAME.PID.N.incomplete` (or, as earlier versions named them, `NAME.PID.incomplete`) of a
/// process that no longer runs, unwritten for [`ABANDONED_AFTER`].
/// Best effort: whatever cannot be read or removed stays.
fn remove_abandoned_temps(path: &Path) {
    let Some(name) = path.file_name() else {
        return;
    };
    let dir = directory(path);
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let pid = file
            .to_string_lossy()
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".incomplete"))
            .and_then(|rest| rest.split('.').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let idle = || {
            let modified = entry.metadata().and_then(|m| m.modified()).ok();
            modified.and_then(|m| m.elapsed().ok()) >= Some(ABANDONED_AFTER)
        };
        if pid.is_some_and(|pid| !running(pid)) && idle() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Whether process `pid` runs, as far as this process can tell (elsewhere than on Unix: yes).
fn running(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: signal 0 only checks that the process exists and may be signalled.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        alive || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    true
}

/// [`write_with`] of `bytes`.
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |file| {
        file.write_all(bytes)
            .with_context(|| format!("cannot write {}", path.display()))
    })
}

/// Where [`write_with`] writes `path` first: beside it, named after it, this process and a
/// count of this process's calls (`NAME.PID.N.incomplete`), so that threads writing one file
/// at once do not share a temporary file either.
pub fn temp_path(path: &Path) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{call}.incomplete", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = "model.safetensors";
    const STATE: &str = "trainer_state.json";

    /// The next write of a file removes the temporary files of its writers that were killed
    /// (their process gone, the file untouched for a minute); a running writer's, one written
    /// a moment ago and another file's stay.
    #[cfg(unix)]
    #[test]
    fn the_next_write_removes_what_killed_writers_left() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let minutes_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
        let temp = |file: &str, pid: &str, modified| -> Result<PathBuf> {
            let path = dir.path().join(format!("{file}.{pid}.incomplete"));
            File::create(&path)?.set_modified(modified)?;
            Ok(path)
        };
        // No process has a PID above Linux's limit of 2²²; process 1 always runs.
        let killed = temp(MODEL, "999999999.4", minutes_ago)?;
        let killed_by_an_earlier_version = temp(MODEL, "999999997", minutes_ago)?;
        let just_written = temp(MODEL, "999999998.0", std::time::SystemTime::now())?;
        let running = temp(MODEL, "1.2", minutes_ago)?;
        let other_file = temp(STATE, "999999999", minutes_ago)?;
        write(&dir.path().join(MODEL), b"new")?;
        assert_eq!(std::fs::read(dir.path().join(MODEL))?, b"new");
        assert!(!killed.exists() && !killed_by_an_earlier_version.exists());
        for kept in [just_written, running, other_file] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        Ok(())
    }
}
