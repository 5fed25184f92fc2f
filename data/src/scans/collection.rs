//! What a scan collection holds: its files found, recognised by content, grouped into samples,
//! with their labels and splits, and the files it refuses with the reason.
//!
//! * **A folder** (`root/<class>/…`, walked recursively in sorted order; or `root/train/<class>`
//!   and `root/val/<class>`, `val` held out as the test split): a sample's label is its class
//!   directory. Files directly in the root (or in `train/` or `val/`) have no label and join
//!   the pretraining only. Names starting with `.` are passed over (`.DS_Store`).
//! * **A manifest**, a `.csv` or `.tsv` file of rows `path,label[,split]` (an optional header row
//!   starting with `path`): paths relative to the manifest; labels any text, numbered in sorted
//!   order; an empty label joins the pretraining only; `split` is `train`, `test` or empty (then
//!   drawn, stratified, by `data.test_fraction`). Either every labelled row names its split or
//!   none does.
//! * **Formats**, by content, never by ending: DICOM (the `DICM` preamble), NIfTI-1/2 (plain or
//!   gzipped), and the images the `image` crate recognises (PNG, TIFF, JPEG, BMP, PNM, WebP).
//!   Anything else is refused.
//! * **Samples**: for 2D, each image file, and each frame of a DICOM file; for volumes, each NIfTI
//!   file, each multi-frame DICOM file, and each DICOM series (the single-frame files of one
//!   directory that share a Series Instance UID).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use super::{dicom, nifti};

/// Where one unit of samples is read from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A PNG, TIFF, JPEG, … file: one `[C, H, W]` image.
    Raster(PathBuf),
    /// A DICOM file read as 2D: one image per frame.
    DicomFrames { path: PathBuf, frames: usize },
    /// A multi-frame DICOM file read as one volume.
    DicomVolume(PathBuf),
    /// The single-frame files of one DICOM series, read as one volume.
    Series { dir: PathBuf, files: Vec<PathBuf> },
    /// A NIfTI volume.
    Nifti(PathBuf),
}

impl Source {
    /// How many samples it gives.
    pub fn samples(&self) -> usize {
        match self {
            Source::DicomFrames { frames, .. } => *frames,
            _ => 1,
        }
    }

    /// The files it reads.
    pub fn files(&self) -> Vec<&Path> {
        match self {
            Source::Raster(p) | Source::DicomVolume(p) | Source::Nifti(p) => vec![p],
            Source::DicomFrames { path, .. } => vec![path],
            Source::Series { files, .. } => files.iter().map(PathBuf::as_path).collect(),
        }
    }

    /// The file or directory it names, for messages.
    pub fn name(&self) -> String {
        match self {
            Source::Series { dir, files } => {
                format!("DICOM series {} ({} files)", dir.display(), files.len())
            }
            Source::Raster(p) | Source::DicomVolume(p) | Source::Nifti(p) => {
                p.display().to_string()
            }
            Source::DicomFrames { path, .. } => path.display().to_string(),
        }
    }
}

/// The split a manifest row or a `train/` / `val/` directory assigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Test,
}

/// One unit of samples with its label (an index into [`Collection::classes`]) and split.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub source: Source,
    pub label: Option<u32>,
    pub split: Option<Split>,
}

/// A file that will not be read, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub path: PathBuf,
    pub reason: String,
}

/// The file then the reason, or the reason alone when it names the file.
impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.path.display().to_string();
        match self.reason.contains(&path) {
            true => f.write_str(&self.reason),
            false => write!(f, "{path} {}", self.reason),
        }
    }
}

/// The samples of a folder or manifest, before decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Collection {
    /// Class names in label order (sorted).
    pub classes: Vec<String>,
    pub entries: Vec<Entry>,
    /// Files found that will not be read.
    pub refused: Vec<Refused>,
    /// Whether the samples are volumes (`[C, D, H, W]`) rather than images.
    pub volumes: bool,
}

/// What a file holds, by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dicom,
    Nifti,
    Raster,
}

/// Bytes read to recognise a file: past DICOM's 132-byte preamble and NIfTI-1's 348-byte header.
const HEAD: usize = 352;

/// What `path` holds, or why it is not read.
pub fn sniff(path: &Path) -> Result<Kind, String> {
    let mut head = Vec::with_capacity(HEAD);
    std::fs::File::open(path)
        .and_then(|f| f.take(HEAD as u64).read_to_end(&mut head))
        .map_err(|e| format!("cannot be read ({e})"))?;
    if dicom::is_dicom(&head) {
        Ok(Kind::Dicom)
    } else if nifti::is_nifti(path) {
        Ok(Kind::Nifti)
    } else if image::guess_format(&head).is_ok() {
        Ok(Kind::Raster)
    } else if head.is_empty() {
        Err("is empty".into())
    } else {
        Err("is not a DICOM, NIfTI or image file (PNG, TIFF, JPEG, BMP, PNM, WebP)".into())
    }
}

/// Whether `root` names a manifest rather than a folder: a `.csv` or `.tsv` file.
pub fn is_manifest(root: &Path) -> bool {
    root.is_file()
        && root
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("csv") || e.eq_ignore_ascii_case("tsv"))
}

/// What the first sample of a folder or manifest says about the rest, before anything is
/// decoded: whether it is read as scans (at full precision, through an [`super::Intensity`])
/// rather than as 8-bit photos, and whether as volumes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// `None`: 8-bit photos (JPEG, 8-bit PNG or TIFF of 1, 3 or 4 channels), read as RGB as
    /// ImageNet-style folders always were. Else the default mapping for the format found:
    /// [`super::Intensity::Range`] for integer PNG and TIFF, [`super::Intensity::PERCENTILE`]
    /// for DICOM, NIfTI and float TIFF.
    pub intensity: Option<super::Intensity>,
    pub volumes: bool,
}

/// Looks at the first sample of the folder or manifest at `root` (module docs); `None` when
/// there is none to look at (loading then says why).
pub fn probe(root: &Path) -> Option<Probe> {
    let first = match is_manifest(root) {
        true => read_manifest(root).ok()?.into_iter().next()?.path,
        false => {
            let mut files = Vec::new();
            files_under(root, &mut files).ok()?;
            files.into_iter().next()?
        }
    };
    let scans = |volumes| Probe {
        intensity: Some(super::Intensity::PERCENTILE),
        volumes,
    };
    if first.is_dir() {
        return Some(scans(true));
    }
    Some(match sniff(&first).ok()? {
        Kind::Nifti => scans(true),
        Kind::Dicom => {
            let header = dicom::read_header(&first).ok()?;
            let siblings = first.parent().map(visible_entries)?.ok()?;
            let in_series = header.position.is_some()
                && siblings.iter().filter(|p| **p != first).any(|p| {
                    sniff(p) == Ok(Kind::Dicom)
                        && dicom::read_header(p).is_ok_and(|h| {
                            h.series_uid.is_some() && h.series_uid == header.series_uid
                        })
                });
            scans(header.frames > 1 || in_series)
        }
        Kind::Raster => {
            let header = super::raster::read_raster_header(&first).ok()?;
            let photo = header.bits == 8 && !header.float && [1, 3, 4].contains(&header.channels);
            Probe {
                intensity: match (photo, header.float) {
                    (true, _) => None,
                    (false, true) => Some(super::Intensity::PERCENTILE),
                    (false, false) => Some(super::Intensity::Range),
                },
                volumes: false,
            }
        }
    })
}

/// A file found with its label and split, before grouping into samples.
struct Found {
    path: PathBuf,
    label: Option<String>,
    split: Option<Split>,
}

/// The collection at `root` (a folder or a manifest; module docs), its samples volumes or
/// images as `volumes` says ([`probe`] tells from the first).
pub fn scan(root: &Path, volumes: bool) -> Result<Collection> {
    let found = match is_manifest(root) {
        true => read_manifest(root)?,
        false => walk_folder(root)?,
    };
    let mut refused = Vec::new();
    let mut kinds = Vec::with_capacity(found.len());
    for file in &found {
        match std::fs::metadata(&file.path) {
            Ok(m) if m.is_dir() => kinds.push(Ok(None)),
            _ => kinds.push(sniff(&file.path).map(Some)),
        }
    }
    let headers: Vec<Option<dicom::DicomHeader>> = found
        .iter()
        .zip(&kinds)
        .map(|(file, kind)| match kind {
            Ok(Some(Kind::Dicom)) => dicom::read_header(&file.path).ok(),
            _ => None,
        })
        .collect();
    let mut classes: Vec<String> = found.iter().filter_map(|f| f.label.clone()).collect();
    classes.sort();
    classes.dedup();
    let label_of = |f: &Found| {
        f.label
            .as_ref()
            .map(|l| classes.binary_search(l).expect("collected above") as u32)
    };
    let mut entries = Vec::new();
    // Single-frame DICOM files of one directory and series, for volumes.
    let mut series: BTreeMap<(PathBuf, String), SeriesFiles> = BTreeMap::new();
    for ((file, kind), header) in found.iter().zip(kinds).zip(headers) {
        let refuse = |reason: String| Refused {
            path: file.path.clone(),
            reason,
        };
        let (label, split) = (label_of(file), file.split);
        let source = match kind {
            Err(reason) => {
                refused.push(refuse(reason));
                continue;
            }
            Ok(None) => match dicom_files(&file.path) {
                Ok(files) if volumes => Source::Series {
                    dir: file.path.clone(),
                    files,
                },
                Ok(_) => {
                    refused.push(refuse(
                        "is a directory (a DICOM series), but the samples are 2D; set \
                         data.volumes: true"
                            .into(),
                    ));
                    continue;
                }
                Err(e) => {
                    refused.push(refuse(format!("{e:#}")));
                    continue;
                }
            },
            Ok(Some(Kind::Raster)) if volumes => {
                refused.push(refuse(
                    "is a 2D image among volumes; a collection is all images or all volumes".into(),
                ));
                continue;
            }
            Ok(Some(Kind::Raster)) => Source::Raster(file.path.clone()),
            Ok(Some(Kind::Nifti)) if !volumes => {
                refused.push(refuse(
                    "is a NIfTI volume, but the samples are 2D; set data.volumes: true".into(),
                ));
                continue;
            }
            Ok(Some(Kind::Nifti)) => Source::Nifti(file.path.clone()),
            Ok(Some(Kind::Dicom)) => {
                let Some(header) = header else {
                    let reason = match dicom::read_header(&file.path) {
                        Err(e) => format!("{e:#}"),
                        Ok(_) => "could not be read".into(),
                    };
                    refused.push(refuse(reason));
                    continue;
                };
                match (volumes, header.frames) {
                    (false, frames) => Source::DicomFrames {
                        path: file.path.clone(),
                        frames,
                    },
                    (true, frames) if frames > 1 => Source::DicomVolume(file.path.clone()),
                    (true, _) => {
                        let dir = file.path.parent().unwrap_or(Path::new(".")).to_path_buf();
                        let uid = header.series_uid.clone().unwrap_or_default();
                        let group = series
                            .entry((dir, uid))
                            .or_insert_with(|| (Vec::new(), label, split));
                        group.0.push(file.path.clone());
                        continue;
                    }
                }
            }
        };
        entries.push(Entry {
            source,
            label,
            split,
        });
    }
    for ((dir, _), (files, label, split)) in series {
        entries.push(Entry {
            source: Source::Series { dir, files },
            label,
            split,
        });
    }
    check_splits(&entries, &classes)?;
    Ok(Collection {
        classes,
        entries,
        refused,
        volumes,
    })
}

/// The files of one DICOM series found so far, with the label and split of its first.
type SeriesFiles = (Vec<PathBuf>, Option<u32>, Option<Split>);

/// The DICOM files of the directory `dir`, sorted (a manifest row naming a series).
fn dicom_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let files: Vec<PathBuf> = visible_entries(dir)?
        .into_iter()
        .filter(|p| p.is_file() && sniff(p) == Ok(Kind::Dicom))
        .collect();
    ensure!(
        !files.is_empty(),
        "is a directory without DICOM files; a directory row names one DICOM series"
    );
    Ok(files)
}

/// The entries of `dir` whose names do not start with `.`, sorted by name.
fn visible_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if !entry.file_name().to_string_lossy().starts_with('.') {
            paths.push(entry.path());
        }
    }
    paths.sort();
    Ok(paths)
}

/// Every file under `dir`, recursively, directories and files in sorted order.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for path in visible_entries(dir)? {
        match path.is_dir() {
            true => files_under(&path, out)?,
            false => out.push(path),
        }
    }
    Ok(())
}

/// The files of a folder (module docs) with their class names and splits.
fn walk_folder(root: &Path) -> Result<Vec<Found>> {
    ensure!(
        root.is_dir(),
        "{} does not exist or is not a directory; point data.root at a folder of class \
         directories (root/<class>/<file>) or at a manifest (.csv or .tsv)",
        root.display()
    );
    let (train, val) = (root.join("train"), root.join("val"));
    let splits: Vec<(PathBuf, Option<Split>)> = match train.is_dir() && val.is_dir() {
        true => vec![(train, Some(Split::Train)), (val, Some(Split::Test))],
        false => vec![(root.to_path_buf(), None)],
    };
    let mut found = Vec::new();
    for (dir, split) in splits {
        for path in visible_entries(&dir)? {
            if path.is_dir() {
                let class = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let mut files = Vec::new();
                files_under(&path, &mut files)?;
                ensure!(
                    !files.is_empty(),
                    "class `{class}` ({}) holds no files: an empty class cannot be trained or \
                     evaluated; remove the directory or add its scans",
                    path.display()
                );
                found.extend(files.into_iter().map(|path| Found {
                    path,
                    label: Some(class.clone()),
                    split,
                }));
            } else {
                found.push(Found {
                    path,
                    label: None,
                    split: None,
                });
            }
        }
    }
    ensure!(
        !found.is_empty(),
        "{} holds no files; put scans in root/<class>/ (or unlabelled ones in root/)",
        root.display()
    );
    Ok(found)
}

/// The rows of the manifest at `path` (module docs).
fn read_manifest(path: &Path) -> Result<Vec<Found>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the manifest {}", path.display()))?;
    let tab = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("tsv"));
    let base = path.parent().unwrap_or(Path::new("."));
    let mut found = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let row = index + 1;
        let cells = split_row(line, if tab { '\t' } else { ',' });
        if cells.iter().all(|c| c.is_empty()) {
            continue;
        }
        if index == 0 && cells[0].eq_ignore_ascii_case("path") {
            continue;
        }
        let at = || format!("{} row {row}", path.display());
        ensure!(
            (2..=3).contains(&cells.len()),
            "{}: {} columns; a row is path,label[,split]",
            at(),
            cells.len()
        );
        ensure!(!cells[0].is_empty(), "{}: the path is empty", at());
        let file = base.join(&cells[0]);
        ensure!(
            file.exists(),
            "{}: {} does not exist (paths are relative to the manifest's directory); fix the \
             path or remove the row",
            at(),
            file.display()
        );
        let label = Some(cells[1].clone()).filter(|l| !l.is_empty());
        let split = match cells.get(2).map(|s| s.to_ascii_lowercase()).as_deref() {
            None | Some("") => None,
            Some("train") => Some(Split::Train),
            Some("test") => Some(Split::Test),
            Some(other) => bail!(
                "{}: split `{other}`; use train, test or leave it empty",
                at()
            ),
        };
        ensure!(
            !(label.is_none() && split == Some(Split::Test)),
            "{}: a test row needs a label (unlabelled images only pretrain)",
            at()
        );
        found.push(Found {
            path: file,
            label,
            split,
        });
    }
    ensure!(
        !found.is_empty(),
        "the manifest {} has no rows",
        path.display()
    );
    Ok(found)
}

/// The cells of one CSV/TSV line: separated by `separator`, a cell in double quotes may hold
/// it (and `""` for a quote), surrounding spaces trimmed.
fn split_row(line: &str, separator: char) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                cells.last_mut().expect("one cell").push('"');
            }
            '"' => quoted = !quoted,
            c if c == separator && !quoted => cells.push(String::new()),
            c => cells.last_mut().expect("one cell").push(c),
        }
    }
    cells.iter().map(|c| c.trim().to_string()).collect()
}

/// Either every labelled entry has a split or none does; there are labels to evaluate on.
fn check_splits(entries: &[Entry], classes: &[String]) -> Result<()> {
    let labelled: Vec<&Entry> = entries.iter().filter(|e| e.label.is_some()).collect();
    ensure!(
        !labelled.is_empty() || entries.is_empty(),
        "no file has a label; the run's evaluation needs labelled scans (class directories, or a \
         manifest's label column)"
    );
    let with = labelled.iter().filter(|e| e.split.is_some()).count();
    if with > 0 && with < labelled.len() {
        let without = labelled
            .iter()
            .find(|e| e.split.is_none())
            .expect("some have none");
        bail!(
            "{} labelled samples name their split but {} does not; give every labelled row a \
             split (train or test) or none",
            with,
            without.source.name()
        );
    }
    if with > 0 {
        for (class, name) in classes.iter().enumerate() {
            let has = |split| {
                labelled
                    .iter()
                    .any(|e| e.label == Some(class as u32) && e.split == Some(split))
            };
            ensure!(
                has(Split::Train),
                "class `{name}` has no training sample; every class needs one in the train split"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_with_quotes() {
        assert_eq!(split_row("a,b", ','), ["a", "b"]);
        assert_eq!(
            split_row("\"x, y.png\",\"say \"\"hi\"\"\",test\r", ','),
            ["x, y.png", "say \"hi\"", "test"]
        );
        assert_eq!(split_row("a\t b \t", '\t'), ["a", "b", ""]);
    }
}
