//! The benchmark sets read whole: [`load_benchmark`] finds a set's official archive, decodes it
//! once with its format's reader ([`crate::cifar`], [`crate::stl10`], [`crate::tiny_imagenet`])
//! into the 8-bit cache of [`crate::archive`], and maps the cache on every later use;
//! [`write_synthetic_archive`] writes a small archive in the same official layout for tests.

use std::path::Path;

use anyhow::{anyhow, bail, ensure, Result};

use crate::archive::*;
use crate::cache;

/// Reads benchmark set `name` from `root` (a directory holding its official archive, or the
/// archive itself), decoding it into its cache on first use (see the module docs).
pub fn load_benchmark(name: &str, root: &Path) -> Result<Benchmark> {
    let Some(info) = archive_info(name) else {
        bail!(
            "unknown benchmark set `{name}`; known: {}",
            ARCHIVES
                .iter()
                .map(|a| a.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let path = archive_path(root, info);
    let dir = path.parent().unwrap_or(Path::new("."));
    let fix = format!(
        "download it again with `ssl data download {} --dir {}`",
        info.name,
        dir.display()
    );
    ensure!(
        path.is_file(),
        "{} not found; fetch it with `ssl data download {} --dir {}` or from {} (MD5 {}), or \
         point data.root (--root) at the directory or the file",
        path.display(),
        info.name,
        root.display(),
        info.url,
        info.md5
    );
    let key = archive_key(&path, info)?;
    let cache_path = archive_cache_path(&path);
    let found = Layout::read(&cache_path)
        .and_then(|layout| Some((cache::open_cached(&cache_path, layout.len(), &key)?, layout)));
    let (bytes, layout) = match found {
        Some(found) => found,
        None => {
            let decoded = match info.file {
                "cifar-10-python.tar.gz" | "cifar-100-python.tar.gz" => {
                    crate::cifar::decode(&path, info)
                }
                "stl10_binary.tar.gz" => crate::stl10::decode(&path, info),
                _ => crate::tiny_imagenet::decode(&path, info),
            };
            let refused = |e: anyhow::Error| match e.downcast_ref::<Corrupt>() {
                Some(corrupt) => anyhow!(
                    "{} is corrupt ({corrupt}); delete it and download it again: `ssl data \
                     download {} --dir {}`",
                    path.display(),
                    info.name,
                    dir.display()
                ),
                None => anyhow!("{}: {e:#}; {fix}", path.display()),
            };
            let (layout, fill) = decoded.map_err(refused)?;
            let unwritable = format!(
                "make {} writable, or copy the archive into a writable directory and point \
                 --root there",
                dir.display()
            );
            let bytes =
                cache::cached_placed(&cache_path, layout.len(), &key, &unwritable, |out| {
                    out.write_at(0, &layout.header())?;
                    fill(&layout, out).map_err(refused)
                })?;
            (bytes, layout)
        }
    };
    layout.benchmark(info, bytes, &cache_path)
}

/// Writes an archive in the exact official layout of benchmark set `name` (member names, file
/// formats, pixel order) holding `counts` train, test and unlabeled images of
/// [`synthetic_pixel`]s, labelled `i mod classes` (CIFAR-100's coarse label: fine mod 20): the
/// official files' code path without them, for tests and smoke runs. The archive also holds
/// `<top directory>/SYNTHETIC.txt`, declaring `counts`, which the reader checks its members
/// against in place of the published table (see the module docs).
pub fn write_synthetic_archive(name: &str, path: &Path, counts: [usize; 3]) -> Result<()> {
    let Some(info) = archive_info(name) else {
        bail!("unknown benchmark set `{name}`");
    };
    match info.file {
        "cifar-10-python.tar.gz" | "cifar-100-python.tar.gz" => {
            crate::cifar::write_synthetic(path, info, counts)
        }
        "stl10_binary.tar.gz" => crate::stl10::write_synthetic(path, counts),
        _ => crate::tiny_imagenet::write_synthetic(path, counts),
    }
}
