//! `ssl data inspect`: every file of a collection read once, before any training, and a report
//! of what a run would see and what it would refuse.

use std::collections::BTreeMap;
use std::fmt;

use rayon::prelude::*;

use anyhow::Result;

use super::collection::{Collection, Entry, Refused, Split};
use super::load::CHUNK;
use super::{read_source, Decoded, ScanOptions};

/// What a run on a collection would read.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// `2D images` or `3D volumes`.
    pub dims: &'static str,
    /// The mapping and size the samples would be made with.
    pub options: ScanOptions,
    /// Samples per format, e.g. `DICOM CT, JPEG Lossless, 12-bit` → 40.
    pub formats: BTreeMap<String, usize>,
    /// Per class (and `(unlabelled)`): samples in the train split, the test split, and those
    /// whose split is drawn by `data.test_fraction`.
    pub classes: Vec<(String, [usize; 3])>,
    /// Native shapes (`[C, H, W]` or `[C, D, H, W]`) and how many samples have each.
    pub shapes: BTreeMap<Vec<usize>, usize>,
    /// Smallest and largest spacing per spatial axis (mm), over the samples that give one, and
    /// how many do not.
    pub spacing: Option<(Vec<f64>, Vec<f64>)>,
    pub without_spacing: usize,
    /// Smallest and largest value in the files' own units.
    pub range: Option<(f32, f32)>,
    /// Files that would be refused or fail to decode, with the reason.
    pub refused: Vec<Refused>,
}

/// Reads every unit of `collection` in its own units (in parallel, [`CHUNK`] units at a time so
/// that memory holds a few decoded volumes, not the collection; nothing is cached) and reports
/// what a run with `options` would see.
pub fn inspect(collection: &Collection, options: &ScanOptions) -> Report {
    let mut report = Report {
        dims: if collection.volumes {
            "3D volumes"
        } else {
            "2D images"
        },
        options: options.clone(),
        formats: BTreeMap::new(),
        classes: collection
            .classes
            .iter()
            .cloned()
            .chain(["(unlabelled)".to_string()])
            .map(|c| (c, [0; 3]))
            .collect(),
        shapes: BTreeMap::new(),
        spacing: None,
        without_spacing: 0,
        range: None,
        refused: collection.refused.clone(),
    };
    let unlabelled = collection.classes.len();
    for chunk in collection.entries.chunks(CHUNK) {
        let read: Vec<_> = chunk.par_iter().map(|e| read_source(&e.source)).collect();
        for (entry, read) in chunk.iter().zip(read) {
            report.add(entry, read, unlabelled);
        }
    }
    if report.classes[unlabelled].1 == [0; 3] {
        report.classes.pop();
    }
    report
}

impl Report {
    /// Counts `entry`'s samples as read (or refuses it), `unlabelled` its row without a label.
    fn add(&mut self, entry: &Entry, read: Result<Vec<Decoded>>, unlabelled: usize) {
        let scans = match read {
            Ok(scans) => scans,
            Err(e) => {
                self.refused.push(Refused {
                    path: entry.source.files()[0].to_path_buf(),
                    reason: format!("{e:#}"),
                });
                return;
            }
        };
        let class = entry.label.map_or(unlabelled, |l| l as usize);
        let column = match entry.split {
            Some(Split::Train) => 0,
            Some(Split::Test) => 1,
            None => 2,
        };
        self.classes[class].1[column] += scans.len();
        for scan in scans {
            *self.formats.entry(scan.format.clone()).or_default() += 1;
            *self.shapes.entry(scan.shape.clone()).or_default() += 1;
            match &scan.spacing {
                Some(s) => {
                    let (lo, hi) = self.spacing.get_or_insert_with(|| (s.clone(), s.clone()));
                    if lo.len() == s.len() {
                        for ((lo, hi), &v) in lo.iter_mut().zip(hi.iter_mut()).zip(s) {
                            *lo = lo.min(v);
                            *hi = hi.max(v);
                        }
                    }
                }
                None => self.without_spacing += 1,
            }
            let (lo, hi) = scan
                .values
                .iter()
                .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                    (lo.min(v), hi.max(v))
                });
            let range = self.range.get_or_insert((lo, hi));
            *range = (range.0.min(lo), range.1.max(hi));
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: usize = self.shapes.values().sum();
        let o = &self.options;
        let side = if self.dims == "3D volumes" {
            format!("{0} × {0} × {0}", o.size)
        } else {
            format!("{0} × {0}", o.size)
        };
        writeln!(f, "{total} {} readable, made {side}", self.dims)?;
        writeln!(f, "intensity: {} → [0, 1]", o.intensity.describe())?;
        if let Some(s) = o.spacing {
            writeln!(f, "resampled to spacing {s:?} mm, then cropped or padded")?;
        }
        writeln!(f, "\nformats:")?;
        for (format, n) in &self.formats {
            writeln!(f, "  {n:>6}  {format}")?;
        }
        writeln!(f, "\nclass                     train    test   drawn")?;
        for (class, [train, test, drawn]) in &self.classes {
            writeln!(f, "  {class:<22} {train:>6}  {test:>6}  {drawn:>6}")?;
        }
        writeln!(f, "\nshapes in the files:")?;
        for (shape, n) in self.shapes.iter().take(8) {
            writeln!(f, "  {n:>6}  {shape:?}")?;
        }
        if self.shapes.len() > 8 {
            writeln!(f, "  … and {} more shapes", self.shapes.len() - 8)?;
        }
        match &self.spacing {
            Some((lo, hi)) => writeln!(
                f,
                "spacing (mm): {lo:?} to {hi:?}{}",
                match self.without_spacing {
                    0 => String::new(),
                    n => format!(" ({n} without)"),
                }
            )?,
            None => writeln!(f, "spacing: none in the headers")?,
        }
        if let Some((lo, hi)) = self.range {
            writeln!(f, "values in the files' units: {lo} to {hi}")?;
        }
        match self.refused.len() {
            0 => writeln!(f, "\nno file refused"),
            n => {
                writeln!(f, "\n{n} files refused:")?;
                for r in &self.refused {
                    writeln!(f, "  {r}")?;
                }
                Ok(())
            }
        }
    }
}
