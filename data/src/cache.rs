//! Decoded-image cache files, shared by MedMNIST and image folders: written once as a stream
//! through a temporary file renamed into place (an interrupted decode leaves no partial cache),
//! then memory-mapped, so the images live in the page cache and nowhere else.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{ensure, Context, Result};
use memmap2::Mmap;

/// Writes `path` from what `fill` streams into it; `fix` says what to do when its directory is
/// not writable.
pub(crate) fn write_cache(
    path: &Path,
    fix: &str,
    fill: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .and_then(|()| tempfile::NamedTempFile::new_in(dir))
        .with_context(|| {
            format!(
                "cannot write a decoded-image cache into {}; {fix}",
                dir.display()
            )
        })
        .and_then(|tmp| {
            let mut out = BufWriter::with_capacity(1 << 20, tmp.as_file());
            fill(&mut out)?;
            out.flush()
                .with_context(|| format!("writing {}", path.display()))?;
            drop(out);
            tmp.persist(path)
                .with_context(|| format!("cannot rename into {}", path.display()))?;
            Ok(())
        })
}

/// `path` memory-mapped, which must hold exactly `len` bytes.
pub(crate) fn map_cache(path: &Path, len: usize) -> Result<Mmap> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the cache is ours, complete (renamed into place whole) and only read; a file
    // truncated under the map by another process would fault, as with any mapped file.
    let map = unsafe { Mmap::map(&file) }
        .with_context(|| format!("cannot memory-map {}", path.display()))?;
    ensure!(
        map.len() == len,
        "{} holds {} bytes, expected {len}; delete it to decode again",
        path.display(),
        map.len()
    );
    Ok(map)
}
