//! `ssl_net::hub` against a fake Hub ([`fake`]): pushes ([`push`]), pulls ([`pull`]), and what
//! is refused or retried ([`checks`]: tokens, arguments, server errors, an unreachable Hub).

mod checks;
mod fake;
mod pull;
mod push;

use std::path::{Path, PathBuf};

/// Set in the environment of the child processes that tests start.
const CHILD_MARKER: &str = "SSL_HUB_TEST_CHILD";

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
