//! Your own scans: DICOM, NIfTI, 16-bit and multi-channel images, read in their own units.
//!
//! Each reader turns one file (or, for a DICOM series, one directory) into a [`Decoded`] array:
//! `f32` values channels-first in the modality's units (Hounsfield units after a CT's rescale,
//! the raw counts of a 16-bit TIFF), with the pixel spacing where the header gives one.
//! Intensity mapping to `[0, 1]`, resizing and caching come after, the same for every format:
//!
//! * [`scan`] finds a folder's or manifest's files, recognises them by content and groups them
//!   into samples with labels and splits ([`Collection`]), listing the files it refuses;
//! * [`load_scans`] decodes them through [`Intensity`] and [`fit_image`] / [`fit_volume`] into a
//!   cached 16-bit [`crate::Dataset`];
//! * [`inspect`] reads them all without training and reports what a run would see.

pub mod dicom;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod nifti;
pub mod raster;

/// One image or volume as read from its file, before any intensity mapping or resizing.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The values, channels-first: `[C, H, W]` for an image, `[C, D, H, W]` for a volume
    /// (`D` slices from the first to the last, rows top to bottom, columns left to right).
    pub values: Vec<f32>,
    /// `[C, H, W]` or `[C, D, H, W]`.
    pub shape: Vec<usize>,
    /// The spacing of the spatial axes in millimetres, in `shape`'s order after `C`
    /// (`[row, column]` or `[slice, row, column]`), where the header gives it.
    pub spacing: Option<Vec<f64>>,
    /// The full range of the stored integer type (`(0, 255)` for 8-bit, `(0, 65535)` for
    /// unsigned 16-bit) when the values are those integers unscaled; `None` for floats and for
    /// values rescaled into modality units.
    pub type_range: Option<(f64, f64)>,
    /// What was read, for `ssl data inspect`: e.g. `DICOM CT, JPEG Lossless, 12-bit`.
    pub format: String,
}

mod collection;
mod fit;
mod inspect;
mod intensity;
mod load;

pub use collection::{
    is_manifest, probe, scan, sniff, Collection, Entry, Kind, Probe, Refused, Source, Split,
};
pub use fit::{fit_image, fit_volume, resample_axis};
pub use inspect::{inspect, Report};
pub use intensity::Intensity;
pub use load::{load_scans, prepare, read_source, ScanOptions, ScanSet};
