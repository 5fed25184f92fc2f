//! Where candle-ssl's files are kept by default: its user cache, and the directories the data
//! sets `ssl data download` fetches are read from when `data.root` is not set.

use std::path::PathBuf;

/// `~/.cache/candle-ssl`.
pub fn user_cache() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/candle-ssl")
}

/// `~/.cache/candle-ssl/data`: the benchmark sets' archives (CIFAR, STL-10, Tiny ImageNet) and
/// the extracted Caltech-256.
pub fn default_benchmark_root() -> PathBuf {
    user_cache().join("data")
}

/// `~/.medmnist`, the official MedMNIST package's directory.
pub fn default_medmnist_root() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".medmnist")
}
