//! `ssl data download`: MedMNIST `.npz` files fetched from the official Zenodo record, and the
//! benchmark sets' official archives (CIFAR-10/100, STL-10, Tiny ImageNet, Caltech-256) from their
//! official addresses (or a mirror), into the directory `ssl run --data NAME` reads them from;
//! Caltech-256's tar is then extracted there ([`fetch_and_extract_caltech256`]). Each file is
//! fetched by [`ssl_net::fetch::fetch_verified`]: resumable, and renamed into place only once its
//! MD5 matches the published one.

use std::path::Path;

use anyhow::{bail, ensure, Result};
use ssl_net::fetch::{fetch_verified, Downloaded};

use crate::{caltech256, DataSource};

/// Fetches MedMNIST `flag` at image size `size` into `dir` as `{flag}.npz` (28) or
/// `{flag}_{size}.npz`, checked against the official MD5 (see [`fetch_verified`]).
///
/// The file comes from the official Zenodo record, or from `base_url/{file}` when a base is given
/// (a mirror, or a test server). An unknown flag or unpublished size fails before any request.
/// `progress` draws a byte progress bar and notes (resuming, replacing a corrupt file) on stderr.
pub fn download_medmnist(
    flag: &str,
    size: usize,
    dir: &Path,
    base_url: Option<&str>,
    progress: bool,
) -> Result<Downloaded> {
    let info = crate::medmnist_info(flag)?;
    let md5 = info.md5_at(size)?;
    let file = info.file_name(size);
    let url = match base_url {
        Some(base) => format!("{}/{file}", base.trim_end_matches('/')),
        None => info.url(size),
    };
    fetch_verified(&url, &dir.join(file), md5, progress)
}

/// Fetches data set `name`: a MedMNIST flag at image size `size` (default 28) into `dir`
/// (default `~/.medmnist`), or a benchmark set's official archive (`cifar10`, `cifar100`,
/// `cifar100-coarse`, `stl10`, `tiny-imagenet`; `size` may only be its image side) into `dir`
/// (default `~/.cache/candle-ssl/data`), checked against the published MD5 (see
/// [`fetch_verified`]); `caltech256` (no `size`) is also extracted there, and its `path` is the
/// extracted directory (see [`fetch_and_extract_caltech256`]). With `base_url`, the file is
/// fetched from `base_url/{file}`.
pub fn download_data_set(
    name: &str,
    size: Option<usize>,
    dir: Option<&Path>,
    base_url: Option<&str>,
    progress: bool,
) -> Result<Downloaded> {
    let archive = |dir: Option<&Path>, file: &str, official: &str| {
        let dir = dir.map_or_else(crate::default_benchmark_root, Path::to_path_buf);
        let url = match base_url {
            Some(base) => format!("{}/{file}", base.trim_end_matches('/')),
            None => official.to_string(),
        };
        (dir, url)
    };
    match DataSource::parse(name)? {
        DataSource::Caltech256 => {
            ensure!(
                size.is_none(),
                "Caltech-256's images come in many sizes, so there is no --size to download; \
                 drop it (`ssl run --size S` sets the side they are resized to)"
            );
            let (dir, url) = archive(dir, caltech256::ARCHIVE, caltech256::URL);
            fetch_and_extract_caltech256(&url, &dir, caltech256::MD5, progress)
        }
        DataSource::Archive(info) => {
            if let Some(size) = size.filter(|&s| s != info.side) {
                bail!(
                    "{} is published at {side}×{side} only, not {size}; drop --size",
                    info.name,
                    side = info.side
                );
            }
            let (dir, url) = archive(dir, info.file, info.url);
            fetch_verified(&url, &dir.join(info.file), info.md5, progress)
        }
        DataSource::MedMnist(info) => {
            let dir = dir.map_or_else(crate::default_medmnist_root, Path::to_path_buf);
            download_medmnist(info.flag, size.unwrap_or(28), &dir, base_url, progress)
        }
        other @ (DataSource::Digits | DataSource::GaussianMixture) => bail!(
            "`{other}` is built in: there is nothing to download; `ssl run --data {other}` \
             reads it"
        ),
        other @ (DataSource::Folder | DataSource::Npz) => {
            bail!("`{other}` is data of your own at --root: there is nothing to download")
        }
    }
}

/// Caltech-256 in `dir`: `dir/256_ObjectCategories` as it is when it is there (nothing is
/// requested), else `dir/256_ObjectCategories.tar` fetched from `url` and checked against `md5`
/// by [`fetch_verified`] (resumable, renamed into place only when verified), then extracted by
/// [`caltech256::extract`] into a temporary directory beside it that is renamed to
/// `256_ObjectCategories` only once every member is out and the 256 categories are there. The
/// archive is kept (delete it to save its 1.2 GB: only the directory is read), so a failed
/// extraction is retried without a download.
pub fn fetch_and_extract_caltech256(
    url: &str,
    dir: &Path,
    md5: &str,
    progress: bool,
) -> Result<Downloaded> {
    let target = dir.join(caltech256::DIR);
    if target.is_dir() {
        return Ok(Downloaded {
            path: target,
            already_present: true,
            verified: false,
        });
    }
    let archive = fetch_verified(url, &dir.join(caltech256::ARCHIVE), md5, progress)?;
    let _extracting = progress.then(|| {
        ssl_core::progress::spinner(format!(
            "extracting {} into {}",
            archive.path.display(),
            dir.display()
        ))
    });
    let path = caltech256::extract(&archive.path, dir)?;
    Ok(Downloaded {
        path,
        already_present: false,
        verified: true,
    })
}
