//! DICOM files and series as [`Decoded`] arrays, values in the modality's units.
//!
//! **What is read.** DICOM Part 10 files, recognised by `DICM` at byte 128 whatever their name
//! (PACS exports often have no ending). [`read_header`] parses the data set up to the pixel data
//! (cheap: grouping into series, listings); [`read_frames`] reads every frame of a file as a
//! `[C, H, W]` image; [`read_volume`] a multi-frame file as one `[C, F, H, W]` volume;
//! [`read_series`] the single-frame files of one series as one `[C, D, H, W]` volume. `C` is 1
//! for `MONOCHROME1`/`MONOCHROME2` and 3 for colour: `RGB` as stored, `YBR_FULL` and
//! `YBR_FULL_422` converted to RGB (full-range BT.601 as in PS3.3 C.7.6.3.1.2, rounded and
//! clamped to the stored range), `YBR_ICT`/`YBR_RCT` as the JPEG 2000 decoder gives them (RGB).
//! `PALETTE COLOR` and other photometric interpretations are refused. Pixel spacing comes from
//! Pixel Spacing, else Imager Pixel Spacing, else the functional groups of enhanced files.
//!
//! **Transfer syntaxes** (the pure-Rust codecs of dicom-rs). Decoded: Implicit VR Little
//! Endian, Explicit VR Little and Big Endian, Deflated Explicit VR Little Endian, Encapsulated
//! Uncompressed, Deflated Image Frame Compression, RLE Lossless, JPEG Baseline (Process 1),
//! JPEG Extended at 8 bits (the 12-bit Process 4 is refused by the decoder, jpeg-decoder, with
//! its message), JPEG Lossless (Process 14, any predictor, 2 to 16 bits), and JPEG 2000 (Part 1
//! and 2, lossless and lossy) and High-Throughput JPEG 2000 through openjp2. Not decoded, each
//! refused with its name, UID and a fix: JPEG-LS (its decoder, CharLS, is a C++ library not
//! built in), JPEG XL (no decoder built in), MPEG-2, MPEG-4, HEVC and SMPTE ST 2110 (video
//! streams), JPIP Referenced (the file holds only an address of its pixels), and any UID not
//! listed here (retired or private syntaxes). A decoder that panics on corrupt data is caught
//! and reported as an error.
//!
//! **Values.** Each stored sample is taken at High Bit, masked to Bits Stored and
//! sign-extended when Pixel Representation is 1. A grey image then goes through its Modality
//! LUT: the Modality LUT Sequence when present (the stored value clamped to the table's
//! domain), else Rescale Slope and Intercept (per frame in enhanced multi-frame files), giving
//! e.g. Hounsfield units. `MONOCHROME1` is then inverted so that higher is brighter:
//! `v' = lo + hi − v`, where `[lo, hi]` is the stored type's full range mapped through the
//! Modality LUT (`[−1024, 3071]` for 12-bit unsigned with intercept −1024), or the LUT's output
//! range `[0, 2^bits − 1]`; the values keep their range. Windows and VOI LUTs are ignored.
//! `type_range` is `(0, 2^BitsStored − 1)` when the values are unsigned stored integers without
//! a modality transform (grey, inverted `MONOCHROME1`, or colour), else `None`.
//!
//! **Series.** Slices are ordered by Image Position (Patient) projected on the slice normal
//! (row direction × column direction of Image Orientation (Patient)), ascending: for axial
//! slices in the usual orientation, feet to head. When a slice lacks its position (or no slice
//! has an orientation), they are ordered by Instance Number. A slice is missing when the gap
//! between neighbours exceeds 1.5× the median step, or when instance numbers skip one. The
//! spacing is `[median step, row, column]`; ordered by instance number, the step is Spacing
//! Between Slices, else Slice Thickness.

use std::error::Error as StdError;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Result};
use dicom_core::Tag;
use dicom_dictionary_std::tags;
use dicom_object::{DefaultDicomObject, FileMetaTable, InMemDicomObject, OpenFileOptions};
use dicom_pixeldata::{DecodedPixelData, PixelDecoder, PixelRepresentation};
use rayon::prelude::*;

use super::Decoded;

/// Where the `DICM` magic of a Part 10 file starts, after the 128-byte preamble.
const MAGIC_AT: usize = 128;
/// Slices closer than this along the normal (mm) are at the same position.
const SAME_POSITION_MM: f64 = 1e-3;
/// A gap between neighbouring slices wider than this many median steps means a missing slice.
const MAX_GAP_IN_STEPS: f64 = 1.5;
/// Files named in full in an error message before "and N more".
const NAMED_FILES: usize = 3;

/// Whether `head` (the first bytes of a file, at least 132) is a DICOM Part 10 file.
pub fn is_dicom(head: &[u8]) -> bool {
    head.get(MAGIC_AT..MAGIC_AT + 4) == Some(b"DICM".as_slice())
}

/// What [`read_header`] tells of a file without decoding its pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct DicomHeader {
    /// Modality (0008,0060), e.g. `CT`.
    pub modality: Option<String>,
    /// Series Instance UID (0020,000E).
    pub series_uid: Option<String>,
    /// The transfer syntax UID, e.g. `1.2.840.10008.1.2.4.70`.
    pub transfer_syntax: String,
    /// Its name, e.g. `JPEG Lossless, Non-Hierarchical, First-Order Prediction (Process 14
    /// [Selection Value 1])`; `unknown` for a UID not listed in the module docs.
    pub transfer_syntax_name: String,
    /// Number of Frames, 1 when absent.
    pub frames: usize,
    pub rows: usize,
    pub columns: usize,
    pub samples_per_pixel: usize,
    pub bits_stored: u16,
    /// Photometric Interpretation, e.g. `MONOCHROME2`.
    pub photometric: String,
    /// Image Position (Patient) of the first pixel, mm (first frame of an enhanced file).
    pub position: Option<[f64; 3]>,
    /// Image Orientation (Patient): the row then the column direction cosines.
    pub orientation: Option<[f64; 6]>,
    pub instance_number: Option<i64>,
    /// Pixel Spacing (else Imager Pixel Spacing) as `[row, column]`, mm.
    pub pixel_spacing: Option<[f64; 2]>,
    /// Spacing Between Slices, else Slice Thickness, mm.
    pub slice_spacing: Option<f64>,
}

/// The header of the DICOM file at `path`, read up to the pixel data.
///
/// # Errors
/// The file is truncated or not DICOM, its transfer syntax is unknown, or it holds no image
/// (no Rows/Columns: a structured report, a presentation state).
pub fn read_header(path: &Path) -> Result<DicomHeader> {
    let object = open(path, OpenFileOptions::new().read_until(tags::PIXEL_DATA))?;
    header_of(&object, path)
}

/// Every frame of the DICOM file at `path` as its own `[C, H, W]` image in modality units
/// (module docs), `spacing` `[row, column]` in mm where known, with the file's header.
///
/// # Errors
/// Besides those of [`read_header`]: a transfer syntax that is not decoded (module docs), no
/// pixel data, an unsupported photometric interpretation or sample layout, and pixel data that
/// fails to decode or is shorter than the header says.
pub fn read_frames(path: &Path) -> Result<(DicomHeader, Vec<Decoded>)> {
    let object = open(path, OpenFileOptions::new())?;
    let header = header_of(&object, path)?;
    let syntax = syntax(&header.transfer_syntax, path)?;
    let shown = path.display();
    if object.get(tags::PIXEL_DATA).is_none() {
        let float = [tags::FLOAT_PIXEL_DATA, tags::DOUBLE_FLOAT_PIXEL_DATA]
            .iter()
            .any(|&tag| object.get(tag).is_some());
        if float {
            bail!(
                "{shown} holds float pixel data (a parametric map), which is not read here; \
                 export the map as NIfTI or TIFF instead"
            );
        }
        bail!(
            "{shown} has no pixel data (7FE0,0010): the image was left out of the file; copy \
             or export it again with its pixels"
        );
    }
    let colour = Colour::of(&header, syntax.codec, path)?;
    let pixels = decode(&object, syntax, path)?;
    let plan = Plan::new(&object, &header, &pixels, syntax.codec, colour, path)?;

    let frames = pixels.number_of_frames() as usize;
    let frame_bytes = plan.samples_per_frame * plan.stored.bytes;
    let data = pixels.data();
    let needed = frames.saturating_mul(frame_bytes);
    ensure!(
        data.len() >= needed,
        "{shown}: the pixel data holds {} bytes, but {frames} frame(s) of {} × {} need \
         {needed}; the file is truncated or its header is wrong: copy or export it again",
        data.len(),
        header.rows,
        header.columns,
    );

    let channels = colour.channels();
    let mut format = format!(
        "DICOM{}, {}, {}-bit{}",
        header
            .modality
            .as_deref()
            .map(|m| format!(" {m}"))
            .unwrap_or_default(),
        syntax.short,
        header.bits_stored,
        if channels == 3 { " RGB" } else { "" },
    );
    if frames > 1 {
        format.push_str(&format!(", {frames} frames"));
    }
    let type_range = plan.type_range();
    let decoded = data[..needed]
        .par_chunks(frame_bytes)
        .enumerate()
        .map(|(frame, raw)| Decoded {
            values: plan.values(raw, frame),
            shape: vec![channels, header.rows, header.columns],
            spacing: header.pixel_spacing.map(|s| s.to_vec()),
            type_range,
            format: format.clone(),
        })
        .collect();
    Ok((header, decoded))
}

/// The frames of the DICOM file at `path` as one volume `[C, F, H, W]` in stored frame order,
/// `spacing` `[slice, row, column]` in mm when both slice and pixel spacing are known.
///
/// # Errors
/// Those of [`read_frames`].
pub fn read_volume(path: &Path) -> Result<Decoded> {
    let (header, frames) = read_frames(path)?;
    let spacing = match (header.slice_spacing, header.pixel_spacing) {
        (Some(slice), Some([row, column])) => Some(vec![slice, row, column]),
        _ => None,
    };
    let format = frames.first().map(|f| f.format.clone()).unwrap_or_default();
    Ok(stack(&frames, spacing, format))
}

/// The single-frame DICOM files of one series (the caller groups them, usually one directory)
/// as one volume `[C, D, H, W]`, slices ordered as the module docs say, `spacing`
/// `[median slice step, row, column]` in mm where known.
///
/// # Errors
/// Each names the directory and the files concerned: fewer than 2 slices, a multi-frame file,
/// files of different series, slices of different sizes, two slices at one position (or with
/// one instance number), a missing slice, slices that can be ordered neither by position nor
/// by instance number; and those of [`read_frames`].
pub fn read_series(files: &[PathBuf]) -> Result<Decoded> {
    let dir = files
        .first()
        .and_then(|f| f.parent())
        .unwrap_or(Path::new("."));
    let shown = format!("DICOM series in {}", dir.display());
    ensure!(
        files.len() >= 2,
        "{shown}: a series needs at least 2 slices, found {} ({}); read a single slice as a \
         2D image instead",
        files.len(),
        some_names(&files.iter().map(|f| file_name(f)).collect::<Vec<_>>()),
    );
    let slices: Vec<(DicomHeader, Decoded)> = files
        .par_iter()
        .map(|path| {
            let (header, frames) = read_frames(path)?;
            match <[Decoded; 1]>::try_from(frames) {
                Ok([frame]) => Ok((header, frame)),
                Err(frames) => bail!(
                    "{shown}: {} has {} frames, a volume of its own rather than a slice of the \
                     series; move it to a directory of its own",
                    file_name(path),
                    frames.len(),
                ),
            }
        })
        .collect::<Result<_>>()?;
    let names: Vec<String> = files.iter().map(|f| file_name(f)).collect();

    let by_series = group_by(&names, slices.iter().map(|(h, _)| h.series_uid.clone()));
    if by_series.len() > 1 {
        let listed: Vec<String> = by_series
            .iter()
            .map(|(uid, names)| {
                let uid = uid.as_deref().unwrap_or("(none)");
                format!("Series Instance UID {uid}: {}", some_names(names))
            })
            .collect();
        bail!(
            "{shown}: the files belong to {} different series ({}); put each series in a \
             directory of its own",
            by_series.len(),
            listed.join("; "),
        );
    }
    let by_size = group_by(&names, slices.iter().map(|(_, d)| d.shape.clone()));
    if by_size.len() > 1 {
        let listed: Vec<String> = by_size
            .iter()
            .map(|(shape, names)| {
                let colour = if shape[0] == 3 { " RGB" } else { "" };
                format!("{} × {}{colour}: {}", shape[1], shape[2], some_names(names))
            })
            .collect();
        bail!(
            "{shown}: the slices differ in size ({}); remove the odd ones (often a localizer \
             or a reformatted image) or move them to a directory of their own",
            listed.join("; "),
        );
    }

    let (order, step) = slice_order(&slices, &names, &shown)?;
    let first = &slices[order[0]];
    let spacing = match (step, first.0.pixel_spacing) {
        (Some(step), Some([row, column])) => Some(vec![step, row, column]),
        _ => None,
    };
    let format = format!("{}, {} slices", first.1.format, slices.len());
    let ordered: Vec<Decoded> = order.iter().map(|&i| slices[i].1.clone()).collect();
    Ok(stack(&ordered, spacing, format))
}

/// The order of `slices` (indices) and the slice step in mm where known.
fn slice_order(
    slices: &[(DicomHeader, Decoded)],
    names: &[String],
    shown: &str,
) -> Result<(Vec<usize>, Option<f64>)> {
    let normal = slices
        .iter()
        .find_map(|(h, _)| h.orientation)
        .and_then(slice_normal);
    let along_normal: Option<Vec<f64>> = normal.and_then(|n| {
        slices
            .iter()
            .map(|(h, _)| {
                h.position
                    .map(|p| p.iter().zip(n).map(|(a, b)| a * b).sum())
            })
            .collect()
    });
    let mut order: Vec<usize> = (0..slices.len()).collect();

    if let Some(at) = along_normal {
        order.sort_by(|&a, &b| at[a].total_cmp(&at[b]));
        let steps: Vec<f64> = order.windows(2).map(|w| at[w[1]] - at[w[0]]).collect();
        for (w, step) in order.windows(2).zip(&steps) {
            ensure!(
                *step >= SAME_POSITION_MM,
                "{shown}: {} and {} are at the same position ({:.3} mm along the slice normal): \
                 a slice is there twice, or two series share one Series Instance UID; remove \
                 the duplicate",
                names[w[0]],
                names[w[1]],
                at[w[0]],
            );
        }
        let median = median(&steps);
        for (w, step) in order.windows(2).zip(&steps) {
            ensure!(
                *step <= MAX_GAP_IN_STEPS * median,
                "{shown}: a slice is missing between {} ({:.2} mm) and {} ({:.2} mm): the gap \
                 of {step:.2} mm is {:.1}× the usual step of {median:.2} mm; copy the series \
                 again with all its files",
                names[w[0]],
                at[w[0]],
                names[w[1]],
                at[w[1]],
                step / median,
            );
        }
        return Ok((order, Some(median)));
    }

    let numbers: Vec<Option<i64>> = slices.iter().map(|(h, _)| h.instance_number).collect();
    let unordered: Vec<String> = numbers
        .iter()
        .zip(names)
        .filter(|(n, _)| n.is_none())
        .map(|(_, name)| name.clone())
        .collect();
    ensure!(
        unordered.is_empty(),
        "{shown}: the slices cannot be ordered: {} lack both Image Position (Patient) (with \
         Image Orientation (Patient)) and Instance Number; export the series again with its \
         geometry",
        some_names(&unordered),
    );
    let number = |i: usize| numbers[i].unwrap_or_default();
    order.sort_by_key(|&i| number(i));
    for w in order.windows(2) {
        let (a, b) = (number(w[0]), number(w[1]));
        ensure!(
            a != b,
            "{shown}: {} and {} have the same Instance Number {a} (and no usable Image Position \
             (Patient)): a slice is there twice; remove the duplicate",
            names[w[0]],
            names[w[1]],
        );
        ensure!(
            b - a == 1,
            "{shown}: a slice is missing: Instance Numbers jump from {a} ({}) to {b} ({}); \
             copy the series again with all its files",
            names[w[0]],
            names[w[1]],
        );
    }
    let step = slices[order[0]].0.slice_spacing;
    Ok((order, step))
}

/// The unit normal of the slice plane, row direction × column direction, if not degenerate.
fn slice_normal(orientation: [f64; 6]) -> Option<[f64; 3]> {
    let [rx, ry, rz, cx, cy, cz] = orientation;
    let normal = [ry * cz - rz * cy, rz * cx - rx * cz, rx * cy - ry * cx];
    let length = normal.iter().map(|v| v * v).sum::<f64>().sqrt();
    (length > 1e-6).then(|| normal.map(|v| v / length))
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    match sorted.len() % 2 {
        0 => (sorted[mid - 1] + sorted[mid]) / 2.0,
        _ => sorted[mid],
    }
}

/// `names` grouped by `keys` (one per name), groups in order of first appearance.
fn group_by<K: PartialEq>(
    names: &[String],
    keys: impl Iterator<Item = K>,
) -> Vec<(K, Vec<String>)> {
    let mut groups: Vec<(K, Vec<String>)> = Vec::new();
    for (key, name) in keys.zip(names) {
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => group.push(name.clone()),
            None => groups.push((key, vec![name.clone()])),
        }
    }
    groups
}

/// The first few of `names`, and how many more.
fn some_names(names: &[String]) -> String {
    let shown = names[..names.len().min(NAMED_FILES)].join(", ");
    match names.len().saturating_sub(NAMED_FILES) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `[C, H, W]` images of one shape as a volume `[C, D, H, W]`.
fn stack(slices: &[Decoded], spacing: Option<Vec<f64>>, format: String) -> Decoded {
    let shape = slices.first().map(|s| s.shape.clone()).unwrap_or_default();
    let (channels, plane) = match shape.as_slice() {
        [c, h, w] => (*c, h * w),
        _ => (0, 0),
    };
    let mut values = Vec::with_capacity(channels * plane * slices.len());
    for c in 0..channels {
        for slice in slices {
            values.extend_from_slice(&slice.values[c * plane..(c + 1) * plane]);
        }
    }
    let type_range = slices.first().and_then(|s| s.type_range);
    let same_range = slices.iter().all(|s| s.type_range == type_range);
    Decoded {
        values,
        shape: [channels, slices.len()]
            .into_iter()
            .chain(shape.into_iter().skip(1))
            .collect(),
        spacing,
        type_range: type_range.filter(|_| same_range),
        format,
    }
}

/// How a transfer syntax's pixel data comes out of dicom-pixeldata.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Codec {
    /// Samples as stored: Planar Configuration honoured, `YBR_FULL_422` in pairs of pixels.
    Native,
    /// RLE Lossless: samples interleaved, in the stored colour space.
    Rle,
    /// JPEG: samples interleaved, colour converted to RGB by the decoder.
    Jpeg,
    /// JPEG 2000: samples interleaved; the decoder undoes `YBR_ICT`/`YBR_RCT`, not `YBR_FULL`.
    Jpeg2000,
    /// Not decoded: why, and what to do.
    Refused(&'static str),
}

/// A transfer syntax this module knows.
struct Syntax {
    uid: &'static str,
    name: &'static str,
    /// For [`Decoded::format`].
    short: &'static str,
    codec: Codec,
}

const JPEG_LS: Codec = Codec::Refused(
    "JPEG-LS needs CharLS, a C++ library this build does not include; convert the file to an \
     uncompressed transfer syntax: `gdcmconv --raw IN OUT` (GDCM) or `dcmdjpls IN OUT` (DCMTK)",
);
const JPEG_XL: Codec = Codec::Refused(
    "no JPEG XL decoder is built in; convert the file to an uncompressed transfer syntax with a \
     tool that reads JPEG XL, or export it uncompressed from the PACS",
);
const VIDEO: Codec = Codec::Refused(
    "it is a video stream; extract the stream (`gdcmraw -i IN -o video -t 7fe0,0010`), turn it \
     into images (`ffmpeg -i video frame%04d.png`) and use those",
);
const JPIP: Codec = Codec::Refused(
    "the file holds only a JPIP address of its pixels, not the pixels; retrieve the full image \
     from the PACS instead",
);

#[rustfmt::skip]
const SYNTAXES: &[Syntax] = &[
    Syntax { uid: "1.2.840.10008.1.2", name: "Implicit VR Little Endian", short: "Implicit VR Little Endian", codec: Codec::Native },
    Syntax { uid: "1.2.840.10008.1.2.1", name: "Explicit VR Little Endian", short: "Explicit VR Little Endian", codec: Codec::Native },
    Syntax { uid: "1.2.840.10008.1.2.2", name: "Explicit VR Big Endian", short: "Explicit VR Big Endian", codec: Codec::Native },
    Syntax { uid: "1.2.840.10008.1.2.1.99", name: "Deflated Explicit VR Little Endian", short: "Deflated Explicit VR Little Endian", codec: Codec::Native },
    Syntax { uid: "1.2.840.10008.1.2.1.98", name: "Encapsulated Uncompressed Explicit VR Little Endian", short: "Encapsulated Uncompressed", codec: Codec::Native },
    Syntax { uid: "1.2.840.10008.1.2.8.1", name: "Deflated Image Frame Compression", short: "Deflated Image Frame", codec: Codec::Native },
    Syntax { uid: "1.2.840.10008.1.2.5", name: "RLE Lossless", short: "RLE Lossless", codec: Codec::Rle },
    Syntax { uid: "1.2.840.10008.1.2.4.50", name: "JPEG Baseline (Process 1)", short: "JPEG Baseline", codec: Codec::Jpeg },
    Syntax { uid: "1.2.840.10008.1.2.4.51", name: "JPEG Extended (Process 2 & 4)", short: "JPEG Extended", codec: Codec::Jpeg },
    Syntax { uid: "1.2.840.10008.1.2.4.57", name: "JPEG Lossless, Non-Hierarchical (Process 14)", short: "JPEG Lossless", codec: Codec::Jpeg },
    Syntax { uid: "1.2.840.10008.1.2.4.70", name: "JPEG Lossless, Non-Hierarchical, First-Order Prediction (Process 14 [Selection Value 1])", short: "JPEG Lossless", codec: Codec::Jpeg },
    Syntax { uid: "1.2.840.10008.1.2.4.90", name: "JPEG 2000 Image Compression (Lossless Only)", short: "JPEG 2000 Lossless", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.91", name: "JPEG 2000 Image Compression", short: "JPEG 2000", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.92", name: "JPEG 2000 Part 2 Multi-component Image Compression (Lossless Only)", short: "JPEG 2000 Part 2 Lossless", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.93", name: "JPEG 2000 Part 2 Multi-component Image Compression", short: "JPEG 2000 Part 2", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.201", name: "High-Throughput JPEG 2000 Image Compression (Lossless Only)", short: "HTJ2K Lossless", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.202", name: "High-Throughput JPEG 2000 with RPCL Options Image Compression (Lossless Only)", short: "HTJ2K Lossless RPCL", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.203", name: "High-Throughput JPEG 2000 Image Compression", short: "HTJ2K", codec: Codec::Jpeg2000 },
    Syntax { uid: "1.2.840.10008.1.2.4.80", name: "JPEG-LS Lossless Image Compression", short: "JPEG-LS Lossless", codec: JPEG_LS },
    Syntax { uid: "1.2.840.10008.1.2.4.81", name: "JPEG-LS Lossy (Near-Lossless) Image Compression", short: "JPEG-LS Near-Lossless", codec: JPEG_LS },
    Syntax { uid: "1.2.840.10008.1.2.4.110", name: "JPEG XL Lossless", short: "JPEG XL Lossless", codec: JPEG_XL },
    Syntax { uid: "1.2.840.10008.1.2.4.111", name: "JPEG XL JPEG Recompression", short: "JPEG XL Recompression", codec: JPEG_XL },
    Syntax { uid: "1.2.840.10008.1.2.4.112", name: "JPEG XL", short: "JPEG XL", codec: JPEG_XL },
    Syntax { uid: "1.2.840.10008.1.2.4.100", name: "MPEG2 Main Profile / Main Level", short: "MPEG2", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.100.1", name: "Fragmentable MPEG2 Main Profile / Main Level", short: "MPEG2", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.101", name: "MPEG2 Main Profile / High Level", short: "MPEG2", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.101.1", name: "Fragmentable MPEG2 Main Profile / High Level", short: "MPEG2", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.102", name: "MPEG-4 AVC/H.264 High Profile / Level 4.1", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.102.1", name: "Fragmentable MPEG-4 AVC/H.264 High Profile / Level 4.1", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.103", name: "MPEG-4 AVC/H.264 BD-Compatible High Profile / Level 4.1", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.103.1", name: "Fragmentable MPEG-4 AVC/H.264 BD-Compatible High Profile / Level 4.1", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.104", name: "MPEG-4 AVC/H.264 High Profile / Level 4.2 For 2D Video", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.104.1", name: "Fragmentable MPEG-4 AVC/H.264 High Profile / Level 4.2 For 2D Video", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.105", name: "MPEG-4 AVC/H.264 High Profile / Level 4.2 For 3D Video", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.105.1", name: "Fragmentable MPEG-4 AVC/H.264 High Profile / Level 4.2 For 3D Video", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.106", name: "MPEG-4 AVC/H.264 Stereo High Profile / Level 4.2", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.106.1", name: "Fragmentable MPEG-4 AVC/H.264 Stereo High Profile / Level 4.2", short: "H.264", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.107", name: "HEVC/H.265 Main Profile / Level 5.1", short: "HEVC", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.108", name: "HEVC/H.265 Main 10 Profile / Level 5.1", short: "HEVC", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.7.1", name: "SMPTE ST 2110-20 Uncompressed Progressive Active Video", short: "SMPTE ST 2110-20", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.7.2", name: "SMPTE ST 2110-20 Uncompressed Interlaced Active Video", short: "SMPTE ST 2110-20", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.7.3", name: "SMPTE ST 2110-30 PCM Digital Audio", short: "SMPTE ST 2110-30", codec: VIDEO },
    Syntax { uid: "1.2.840.10008.1.2.4.94", name: "JPIP Referenced", short: "JPIP Referenced", codec: JPIP },
    Syntax { uid: "1.2.840.10008.1.2.4.95", name: "JPIP Referenced Deflate", short: "JPIP Referenced", codec: JPIP },
    Syntax { uid: "1.2.840.10008.1.2.4.204", name: "JPIP HTJ2K Referenced", short: "JPIP Referenced", codec: JPIP },
    Syntax { uid: "1.2.840.10008.1.2.4.205", name: "JPIP HTJ2K Referenced Deflate", short: "JPIP Referenced", codec: JPIP },
];

/// The decodable transfer syntax `uid` of the file at `path`.
fn syntax(uid: &str, path: &Path) -> Result<&'static Syntax> {
    let shown = path.display();
    match SYNTAXES.iter().find(|s| s.uid == uid) {
        Some(Syntax {
            name,
            codec: Codec::Refused(why),
            ..
        }) => bail!("{shown}: its transfer syntax {name} ({uid}) is not decoded here: {why}"),
        Some(known) => Ok(known),
        None => bail!(
            "{shown}: its transfer syntax {uid} is unknown here (a retired or private one); \
             convert the file to an uncompressed transfer syntax (`gdcmconv --raw IN OUT` with \
             GDCM) or export it uncompressed from the PACS"
        ),
    }
}

fn open(path: &Path, options: OpenFileOptions) -> Result<DefaultDicomObject> {
    options
        .open_file(path)
        .map_err(|error| open_error(path, &error))
}

/// Why the file at `path` failed to open with `error`: its transfer syntax, or a broken file.
fn open_error(path: &Path, error: &dyn StdError) -> anyhow::Error {
    let shown = path.display();
    let mut head = Vec::new();
    if let Err(e) =
        File::open(path).and_then(|f| f.take(MAGIC_AT as u64 + 4).read_to_end(&mut head))
    {
        return anyhow!("cannot read DICOM file {shown}: {e}");
    }
    if !is_dicom(&head) {
        return anyhow!(
            "{shown} is truncated or not a valid DICOM file: there is no `DICM` marker at byte \
             128 ({}); copy or export it again",
            causes(error),
        );
    }
    let meta = File::open(path).and_then(|f| {
        let mut reader = BufReader::new(f);
        reader.seek(SeekFrom::Start(MAGIC_AT as u64))?;
        FileMetaTable::from_reader(reader).map_err(std::io::Error::other)
    });
    if let Ok(meta) = meta {
        if let Err(refused) = syntax(meta.transfer_syntax(), path) {
            return refused;
        }
    }
    anyhow!(
        "{shown} is truncated or not a valid DICOM file ({}); copy or export it again",
        causes(error),
    )
}

/// `error` and its sources, `: `-separated, without repeats.
fn causes(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

/// The header fields of an opened file.
fn header_of(object: &DefaultDicomObject, path: &Path) -> Result<DicomHeader> {
    let shown = path.display();
    let transfer_syntax = object.meta().transfer_syntax().to_string();
    let transfer_syntax_name = SYNTAXES
        .iter()
        .find(|s| s.uid == transfer_syntax)
        .map_or("unknown", |s| s.name)
        .to_string();
    let (Some(rows), Some(columns)) = (
        count(object, tags::ROWS).filter(|&n| n > 0),
        count(object, tags::COLUMNS).filter(|&n| n > 0),
    ) else {
        bail!(
            "{shown} holds no image (no Rows and Columns; SOP Class {}): it is a report, a \
             presentation state or another non-image object; leave it out of the image data",
            object.meta().media_storage_sop_class_uid(),
        );
    };
    let frames = match integer(object, tags::NUMBER_OF_FRAMES) {
        None => 1,
        Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
        Some(n) => {
            bail!("{shown}: Number of Frames is {n}; the header is corrupt, export the file again")
        }
    };
    let samples_per_pixel = count(object, tags::SAMPLES_PER_PIXEL).unwrap_or(1);
    let bits_stored = integer(object, tags::BITS_STORED)
        .or_else(|| integer(object, tags::BITS_ALLOCATED))
        .and_then(|b| u16::try_from(b).ok())
        .filter(|&b| b > 0)
        .ok_or_else(|| {
            anyhow!("{shown}: Bits Stored is missing or invalid; the header is corrupt, export the file again")
        })?;
    let photometric = text(object, tags::PHOTOMETRIC_INTERPRETATION).unwrap_or_else(|| {
        match samples_per_pixel {
            3 => "RGB",
            _ => "MONOCHROME2",
        }
        .into()
    });
    let position = in_groups(object, tags::PLANE_POSITION_SEQUENCE, |o| {
        numbers(o, tags::IMAGE_POSITION_PATIENT)?.try_into().ok()
    });
    let orientation = in_groups(object, tags::PLANE_ORIENTATION_SEQUENCE, |o| {
        numbers(o, tags::IMAGE_ORIENTATION_PATIENT)?.try_into().ok()
    });
    let positive = |values: Vec<f64>| values.iter().all(|&v| v > 0.0).then_some(values);
    let pixel_spacing = in_groups(object, tags::PIXEL_MEASURES_SEQUENCE, |o| {
        [tags::PIXEL_SPACING, tags::IMAGER_PIXEL_SPACING]
            .iter()
            .find_map(|&tag| positive(numbers(o, tag)?)?.try_into().ok())
    });
    let slice_spacing = in_groups(object, tags::PIXEL_MEASURES_SEQUENCE, |o| {
        [tags::SPACING_BETWEEN_SLICES, tags::SLICE_THICKNESS]
            .iter()
            .find_map(|&tag| positive(numbers(o, tag)?)?.first().copied())
    });
    Ok(DicomHeader {
        modality: text(object, tags::MODALITY),
        series_uid: text(object, tags::SERIES_INSTANCE_UID),
        transfer_syntax,
        transfer_syntax_name,
        frames,
        rows,
        columns,
        samples_per_pixel,
        bits_stored,
        photometric,
        position,
        orientation,
        instance_number: integer(object, tags::INSTANCE_NUMBER),
        pixel_spacing,
        slice_spacing,
    })
}

/// `read` of the data set, else of the item of the functional group `group` (shared, then
/// the first frame's) in an enhanced multi-frame file.
fn in_groups<T>(
    object: &InMemDicomObject,
    group: Tag,
    read: impl Fn(&InMemDicomObject) -> Option<T>,
) -> Option<T> {
    read(object).or_else(|| {
        [
            tags::SHARED_FUNCTIONAL_GROUPS_SEQUENCE,
            tags::PER_FRAME_FUNCTIONAL_GROUPS_SEQUENCE,
        ]
        .iter()
        .find_map(|&groups| {
            let frame = object.get(groups)?.items()?.first()?;
            read(frame.get(group)?.items()?.first()?)
        })
    })
}

fn text(object: &InMemDicomObject, tag: Tag) -> Option<String> {
    let value = object.get(tag)?.to_str().ok()?;
    let trimmed = value.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

fn integer(object: &InMemDicomObject, tag: Tag) -> Option<i64> {
    object.get(tag)?.to_int::<i64>().ok()
}

fn count(object: &InMemDicomObject, tag: Tag) -> Option<usize> {
    usize::try_from(integer(object, tag)?).ok()
}

/// The finite numbers of a multi-valued attribute.
fn numbers(object: &InMemDicomObject, tag: Tag) -> Option<Vec<f64>> {
    let values = object.get(tag)?.to_multi_float64().ok()?;
    values.iter().all(|v| v.is_finite()).then_some(values)
}

/// The decoded pixel data of `object`, a decoder's panic turned into an error.
fn decode<'a>(
    object: &'a DefaultDicomObject,
    syntax: &Syntax,
    path: &Path,
) -> Result<DecodedPixelData<'a>> {
    let failed = |cause: String| {
        anyhow!(
            "{}: its {} pixel data cannot be decoded ({cause}); the file may be corrupt: copy \
             or export it again, or convert it (`gdcmconv --raw IN OUT`) to see whether another \
             decoder reads it",
            path.display(),
            syntax.name,
        )
    };
    match catch_unwind(AssertUnwindSafe(|| object.decode_pixel_data())) {
        Ok(Ok(pixels)) => Ok(pixels),
        Ok(Err(e)) => Err(failed(causes(&e))),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(failed(format!("the decoder failed: {message}")))
        }
    }
}

/// What the decoded samples are and what becomes of them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Colour {
    /// `MONOCHROME2`.
    Grey,
    /// `MONOCHROME1`: inverted after the Modality LUT.
    InvertedGrey,
    /// RGB as decoded.
    Rgb,
    /// `YBR_FULL`/`YBR_FULL_422` samples, converted to RGB here.
    Ybr,
}

impl Colour {
    fn of(header: &DicomHeader, codec: Codec, path: &Path) -> Result<Self> {
        Ok(
            match (header.photometric.as_str(), header.samples_per_pixel) {
                ("MONOCHROME2", 1) => Colour::Grey,
                ("MONOCHROME1", 1) => Colour::InvertedGrey,
                ("YBR_FULL" | "YBR_FULL_422", 3) if codec != Codec::Jpeg => Colour::Ybr,
                ("RGB" | "YBR_FULL" | "YBR_FULL_422" | "YBR_ICT" | "YBR_RCT", 3) => Colour::Rgb,
                (photometric, samples) => bail!(
                    "{}: Photometric Interpretation {photometric} with {samples} sample(s) per \
                 pixel is not read here (only MONOCHROME1, MONOCHROME2, RGB and YBR_* are); \
                 convert it to RGB or greyscale first (for PALETTE COLOR, e.g. with pydicom's \
                 `apply_color_lut`)",
                    path.display(),
                ),
            },
        )
    }

    fn channels(self) -> usize {
        match self {
            Colour::Grey | Colour::InvertedGrey => 1,
            Colour::Rgb | Colour::Ybr => 3,
        }
    }
}

/// How stored samples are read from the decoded bytes (native byte order).
#[derive(Debug, Clone, Copy)]
struct Stored {
    /// Bytes per sample: 1, 2 or 4.
    bytes: usize,
    /// Bits Stored.
    bits: u32,
    /// How far the stored bits sit above bit 0: High Bit + 1 − Bits Stored.
    shift: u32,
    signed: bool,
}

impl Stored {
    /// Sample `index` of `raw`, which must hold it.
    fn get(&self, raw: &[u8], index: usize) -> i64 {
        let at = index * self.bytes;
        let word = match self.bytes {
            1 => u32::from(raw[at]),
            2 => u32::from(u16::from_ne_bytes([raw[at], raw[at + 1]])),
            _ => u32::from_ne_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]),
        };
        let value = (word >> self.shift) & (u32::MAX >> (32 - self.bits));
        match self.signed && value >> (self.bits - 1) == 1 {
            true => i64::from(value) - (1i64 << self.bits),
            false => i64::from(value),
        }
    }

    /// The smallest and largest stored values.
    fn range(&self) -> (i64, i64) {
        match self.signed {
            true => (-(1i64 << (self.bits - 1)), (1i64 << (self.bits - 1)) - 1),
            false => (0, (1i64 << self.bits) - 1),
        }
    }
}

/// Where sample `c` of pixel `p` lies in a frame's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// `p × C + c`.
    Interleaved,
    /// Planar Configuration 1: `c × pixels + p`.
    Planar,
    /// Native `YBR_FULL_422`: `Y₀ Y₁ Cb Cr` for each horizontal pair of pixels.
    PairedYbr,
}

/// The Modality LUT of a grey image.
#[derive(Debug, Clone)]
enum Modality {
    /// Rescale `(slope, intercept)`, one for all frames or one per frame.
    Rescale(Vec<(f64, f64)>),
    /// Modality LUT Sequence: the stored value mapped to table entry `value − first`.
    Table {
        first: i64,
        entries: Vec<f64>,
        bits: u32,
    },
}

impl Modality {
    fn map(&self, frame: usize, value: i64) -> f64 {
        match self {
            Modality::Rescale(rescale) => {
                let (slope, intercept) = rescale
                    .get(frame)
                    .or(rescale.first())
                    .copied()
                    .unwrap_or((1.0, 0.0));
                slope * value as f64 + intercept
            }
            Modality::Table { first, entries, .. } => {
                let last = entries.len() as i64 - 1;
                entries[(value - first).clamp(0, last) as usize]
            }
        }
    }

    /// The range of mapped values for `stored` samples, the one `MONOCHROME1` is mirrored in.
    fn range(&self, frame: usize, stored: &Stored) -> (f64, f64) {
        match self {
            Modality::Rescale(_) => {
                let (lo, hi) = stored.range();
                let (a, b) = (self.map(frame, lo), self.map(frame, hi));
                (a.min(b), a.max(b))
            }
            Modality::Table { bits, .. } => (0.0, ((1u64 << bits) - 1) as f64),
        }
    }

    fn is_identity(&self) -> bool {
        match self {
            Modality::Rescale(rescale) => rescale.iter().all(|&r| r == (1.0, 0.0)),
            Modality::Table { .. } => false,
        }
    }
}

/// The Modality LUT Sequence of `object`, if any.
fn modality_table(
    object: &InMemDicomObject,
    signed: bool,
    path: &Path,
) -> Result<Option<Modality>> {
    let Some(item) = object
        .get(tags::MODALITY_LUT_SEQUENCE)
        .and_then(|e| e.items())
        .and_then(|items| items.first())
    else {
        return Ok(None);
    };
    let invalid = |what: &str| {
        anyhow!(
            "{}: the Modality LUT Sequence is invalid ({what}); remove it or export the file \
             again",
            path.display()
        )
    };
    let descriptor: [i64; 3] = item
        .get(tags::LUT_DESCRIPTOR)
        .and_then(|e| e.to_multi_int::<i64>().ok())
        .and_then(|d| d.try_into().ok())
        .ok_or_else(|| invalid("LUT Descriptor is not 3 numbers"))?;
    let length = match descriptor[0].rem_euclid(1 << 16) {
        0 => 1 << 16,
        n => n as usize,
    };
    let first = match signed {
        true => i64::from(descriptor[1] as i16),
        false => i64::from(descriptor[1] as u16),
    };
    let bits = u32::try_from(descriptor[2])
        .ok()
        .filter(|b| (1..=16).contains(b))
        .ok_or_else(|| invalid("bits per entry are not 1 to 16"))?;
    let data = item
        .get(tags::LUT_DATA)
        .and_then(|e| e.to_multi_int::<i64>().ok())
        .ok_or_else(|| invalid("LUT Data is missing"))?;
    if data.len() < length {
        let found = data.len();
        return Err(invalid(&format!(
            "{found} entries in LUT Data, {length} described"
        )));
    }
    let mask = (1i64 << bits) - 1;
    Ok(Some(Modality::Table {
        first,
        entries: data[..length].iter().map(|&v| (v & mask) as f64).collect(),
        bits,
    }))
}

/// How one file's decoded frames become values.
struct Plan {
    colour: Colour,
    layout: Layout,
    stored: Stored,
    modality: Modality,
    pixels: usize,
    samples_per_frame: usize,
}

impl Plan {
    fn new(
        object: &DefaultDicomObject,
        header: &DicomHeader,
        decoded: &DecodedPixelData,
        codec: Codec,
        colour: Colour,
        path: &Path,
    ) -> Result<Self> {
        let shown = path.display();
        let bytes = match decoded.bits_allocated() {
            1 | 8 => 1,
            16 => 2,
            32 => 4,
            other => bail!(
                "{shown}: Bits Allocated {other} is not read here (only 1, 8, 16 and 32); \
                 convert the file with `gdcmconv --raw IN OUT`"
            ),
        };
        let bits = u32::from(decoded.bits_stored());
        let high_bit = u32::from(decoded.high_bit());
        let bits_allocated = (8 * bytes) as u32;
        ensure!(
            (1..=bits_allocated).contains(&bits) && (bits - 1..bits_allocated).contains(&high_bit),
            "{shown}: Bits Stored {bits} and High Bit {high_bit} do not fit in {bits_allocated} \
             allocated bits; the header is corrupt, export the file again"
        );
        let shift = match codec {
            Codec::Native => high_bit + 1 - bits,
            _ => 0,
        };
        let signed = decoded.pixel_representation() == PixelRepresentation::Signed;
        let stored = Stored {
            bytes,
            bits,
            shift,
            signed,
        };
        let planar = integer(object, tags::PLANAR_CONFIGURATION) == Some(1);
        let layout = match (codec, colour, header.photometric.as_str()) {
            (Codec::Native, Colour::Ybr, "YBR_FULL_422") => Layout::PairedYbr,
            (Codec::Native, Colour::Rgb | Colour::Ybr, _) if planar => Layout::Planar,
            _ => Layout::Interleaved,
        };
        let pixels = header.rows * header.columns;
        ensure!(
            layout != Layout::PairedYbr || header.columns.is_multiple_of(2),
            "{shown}: YBR_FULL_422 pixel data with an odd number of columns ({}) is invalid; \
             export the file again",
            header.columns
        );
        let samples_per_frame = match layout {
            Layout::PairedYbr => 2 * pixels,
            _ => colour.channels() * pixels,
        };
        let rescale = decoded
            .rescale()
            .map_err(|e| {
                anyhow!(
                    "{shown}: {}; fix the Rescale Slope and Intercept",
                    causes(&e)
                )
            })?
            .iter()
            .map(|r| (r.slope, r.intercept))
            .collect();
        let modality = modality_table(object, signed, path)?.unwrap_or(Modality::Rescale(rescale));
        Ok(Plan {
            colour,
            layout,
            stored,
            modality,
            pixels,
            samples_per_frame,
        })
    }

    /// The values `[C, H·W]` of frame `frame`, whose samples are `raw`.
    fn values(&self, raw: &[u8], frame: usize) -> Vec<f32> {
        let stored = &self.stored;
        match self.colour {
            Colour::Grey => (0..self.pixels)
                .map(|p| self.modality.map(frame, stored.get(raw, p)) as f32)
                .collect(),
            Colour::InvertedGrey => {
                let (lo, hi) = self.modality.range(frame, stored);
                (0..self.pixels)
                    .map(|p| (lo + hi - self.modality.map(frame, stored.get(raw, p))) as f32)
                    .collect()
            }
            Colour::Rgb => (0..3)
                .flat_map(|c| {
                    (0..self.pixels).map(move |p| stored.get(raw, self.index(p, c)) as f32)
                })
                .collect(),
            Colour::Ybr => {
                let mut values = vec![0.0; 3 * self.pixels];
                let max = stored.range().1 as f64;
                let half = (1i64 << (stored.bits - 1)) as f64;
                for p in 0..self.pixels {
                    let [y, cb, cr] = [0, 1, 2].map(|c| stored.get(raw, self.index(p, c)) as f64);
                    let rgb = [
                        y + 1.402 * (cr - half),
                        y - 0.344136 * (cb - half) - 0.714136 * (cr - half),
                        y + 1.772 * (cb - half),
                    ];
                    for (c, v) in rgb.into_iter().enumerate() {
                        values[c * self.pixels + p] = v.round().clamp(0.0, max) as f32;
                    }
                }
                values
            }
        }
    }

    /// The index of sample `c` of pixel `p` in a frame's samples.
    fn index(&self, p: usize, c: usize) -> usize {
        match self.layout {
            Layout::Interleaved => p * 3 + c,
            Layout::Planar => c * self.pixels + p,
            Layout::PairedYbr => match c {
                0 => (p / 2) * 4 + p % 2,
                _ => (p / 2) * 4 + 1 + c,
            },
        }
    }

    fn type_range(&self) -> Option<(f64, f64)> {
        let unscaled = match self.colour {
            Colour::Grey | Colour::InvertedGrey => self.modality.is_identity(),
            Colour::Rgb | Colour::Ybr => true,
        };
        (unscaled && !self.stored.signed).then(|| (0.0, self.stored.range().1 as f64))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use dicom_core::value::DataSetSequence;
    use dicom_core::{Length, PrimitiveValue, VR};
    use dicom_dictionary_std::uids;
    use flate2::write::DeflateEncoder;
    use flate2::Compression;
    use image::ImageEncoder;
    use tempfile::TempDir;

    use super::super::fixtures::*;
    use super::*;

    const JPEG_LS_LOSSLESS: &str = "1.2.840.10008.1.2.4.80";
    /// Stored values of the CT fixture (2 × 3, signed 16-bit, slope 2, intercept −1024).
    const CT_STORED: [i16; 6] = [-5, 0, 1, 100, 512, 2047];

    fn ct(stored: &[i16]) -> InMemDicomObject {
        let mut object = image(2, 3, 1, "MONOCHROME2", (16, 16), true);
        put(&mut object, tags::RESCALE_SLOPE, VR::DS, "2");
        put(&mut object, tags::RESCALE_INTERCEPT, VR::DS, "-1024");
        put(&mut object, tags::PIXEL_SPACING, VR::DS, "0.5\\0.75");
        put(&mut object, tags::PIXEL_DATA, VR::OW, words(stored));
        object
    }

    fn error_of<T: std::fmt::Debug>(result: Result<T>) -> String {
        format!("{:#}", result.expect_err("an error"))
    }

    fn assert_close(found: &[f32], expected: &[f32], tolerance: f32) {
        assert_eq!(found.len(), expected.len());
        for (i, (f, e)) in found.iter().zip(expected).enumerate() {
            assert!((f - e).abs() <= tolerance, "value {i}: {f} vs {e}");
        }
    }

    #[test]
    fn uncompressed_and_deflated_syntaxes_give_hounsfield_units() {
        let dir = TempDir::new().unwrap();
        let expected: Vec<f32> = CT_STORED.iter().map(|&v| 2.0 * v as f32 - 1024.0).collect();
        for (i, syntax) in [
            uids::EXPLICIT_VR_LITTLE_ENDIAN,
            uids::IMPLICIT_VR_LITTLE_ENDIAN,
            EXPLICIT_BIG_ENDIAN,
            uids::DEFLATED_EXPLICIT_VR_LITTLE_ENDIAN,
        ]
        .into_iter()
        .enumerate()
        {
            let path = write_dicom(dir.path(), &format!("IM{i:04}"), ct(&CT_STORED), syntax);
            let bytes = std::fs::read(&path).unwrap();
            assert!(is_dicom(&bytes[..132]), "{syntax}");
            let (header, frames) = read_frames(&path).unwrap();
            assert_eq!(header.transfer_syntax, syntax);
            let [frame] = frames.as_slice() else {
                panic!("one frame expected")
            };
            assert_eq!(frame.values, expected, "{syntax}");
            assert_eq!(frame.shape, [1, 2, 3]);
            assert_eq!(frame.spacing, Some(vec![0.5, 0.75]));
            assert_eq!(frame.type_range, None);
            assert_eq!(
                frame.format,
                format!("DICOM CT, {}, 16-bit", header.transfer_syntax_name)
            );
        }
    }

    #[test]
    fn only_dicom_bytes_are_dicom() {
        let mut png = Vec::new();
        image::codecs::png::PngEncoder::new(&mut png)
            .write_image(&[0; 256], 16, 16, image::ColorType::L8)
            .unwrap();
        png.resize(200, 0);
        assert!(!is_dicom(&png));
        assert!(!is_dicom(b"DICM"));
    }

    #[test]
    fn header_reads_geometry_without_pixels() {
        let dir = TempDir::new().unwrap();
        let mut object = ct(&CT_STORED);
        put(
            &mut object,
            tags::IMAGE_POSITION_PATIENT,
            VR::DS,
            "-10\\20.5\\-3",
        );
        put(
            &mut object,
            tags::IMAGE_ORIENTATION_PATIENT,
            VR::DS,
            "1\\0\\0\\0\\1\\0",
        );
        put(&mut object, tags::INSTANCE_NUMBER, VR::IS, "7");
        put(&mut object, tags::SLICE_THICKNESS, VR::DS, "1.25");
        let path = write_dicom(dir.path(), "slice", object, uids::EXPLICIT_VR_LITTLE_ENDIAN);
        let header = read_header(&path).unwrap();
        assert_eq!(
            header,
            DicomHeader {
                modality: Some("CT".into()),
                series_uid: Some("2.25.7".into()),
                transfer_syntax: uids::EXPLICIT_VR_LITTLE_ENDIAN.into(),
                transfer_syntax_name: "Explicit VR Little Endian".into(),
                frames: 1,
                rows: 2,
                columns: 3,
                samples_per_pixel: 1,
                bits_stored: 16,
                photometric: "MONOCHROME2".into(),
                position: Some([-10.0, 20.5, -3.0]),
                orientation: Some([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
                instance_number: Some(7),
                pixel_spacing: Some([0.5, 0.75]),
                slice_spacing: Some(1.25),
            }
        );
    }

    #[test]
    fn rle_lossless_grey_frames_are_exact() {
        let dir = TempDir::new().unwrap();
        let frames: [[u16; 6]; 2] = [[0, 0, 0, 1, 256, 65535], [4095, 4095, 7, 300, 300, 2]];
        let mut object = image(2, 3, 1, "MONOCHROME2", (16, 16), false);
        put(&mut object, tags::NUMBER_OF_FRAMES, VR::IS, "2");
        let encoded = frames
            .iter()
            .map(|f| {
                let msb = f.iter().map(|v| (v >> 8) as u8).collect();
                let lsb = f.iter().map(|v| *v as u8).collect();
                rle_frame(&[msb, lsb])
            })
            .collect();
        object.put(element(tags::PIXEL_DATA, VR::OB, fragments(encoded)));
        let path = write_dicom(dir.path(), "rle", object, uids::RLE_LOSSLESS);
        let (_, decoded) = read_frames(&path).unwrap();
        assert_eq!(decoded.len(), 2);
        for (frame, stored) in decoded.iter().zip(frames) {
            assert_eq!(frame.values, stored.map(f32::from));
            assert_eq!(frame.type_range, Some((0.0, 65535.0)));
            assert_eq!(frame.format, "DICOM CT, RLE Lossless, 16-bit, 2 frames");
        }
    }

    #[test]
    fn ybr_full_becomes_rgb() {
        let dir = TempDir::new().unwrap();
        // (Y, Cb, Cr) = (100, 128, 128) is grey 100; (76, 85, 255) is red.
        let mut rle = image(1, 2, 3, "YBR_FULL", (8, 8), false);
        let planes = [vec![100, 76], vec![128, 85], vec![128, 255]];
        rle.put(element(
            tags::PIXEL_DATA,
            VR::OB,
            fragments(vec![rle_frame(&planes)]),
        ));
        let path = write_dicom(dir.path(), "rle", rle, uids::RLE_LOSSLESS);
        let (_, frames) = read_frames(&path).unwrap();
        assert_eq!(frames[0].values, [100.0, 254.0, 100.0, 0.0, 100.0, 0.0]);
        assert_eq!(frames[0].shape, [3, 1, 2]);
        assert_eq!(frames[0].type_range, Some((0.0, 255.0)));

        // Native YBR_FULL_422: Y₀ Y₁ Cb Cr for the pair; (100, 85, 255) clamps red at 255.
        let mut native = image(1, 2, 3, "YBR_FULL_422", (8, 8), false);
        put(
            &mut native,
            tags::PIXEL_DATA,
            VR::OB,
            PrimitiveValue::from(vec![100u8, 76, 85, 255]),
        );
        let path = write_dicom(dir.path(), "422", native, uids::EXPLICIT_VR_LITTLE_ENDIAN);
        let (_, frames) = read_frames(&path).unwrap();
        assert_eq!(frames[0].values, [255.0, 254.0, 24.0, 0.0, 24.0, 0.0]);
    }

    #[test]
    fn rgb_is_three_channels_in_either_planar_configuration() {
        let dir = TempDir::new().unwrap();
        let stored = [
            (0u16, vec![10u8, 20, 30, 40, 50, 60]),
            (1, vec![10, 40, 20, 50, 30, 60]),
        ];
        for (planar, bytes) in stored {
            let mut object = image(1, 2, 3, "RGB", (8, 8), false);
            put(
                &mut object,
                tags::PLANAR_CONFIGURATION,
                VR::US,
                PrimitiveValue::from(planar),
            );
            put(
                &mut object,
                tags::PIXEL_DATA,
                VR::OB,
                PrimitiveValue::from(bytes),
            );
            let path = write_dicom(
                dir.path(),
                &format!("rgb{planar}"),
                object,
                uids::EXPLICIT_VR_LITTLE_ENDIAN,
            );
            let (_, frames) = read_frames(&path).unwrap();
            assert_eq!(frames[0].values, [10.0, 40.0, 20.0, 50.0, 30.0, 60.0]);
            assert_eq!(frames[0].shape, [3, 1, 2]);
            assert_eq!(
                frames[0].format,
                "DICOM CT, Explicit VR Little Endian, 8-bit RGB"
            );
        }
    }

    #[test]
    fn jpeg_baseline_decodes_within_lossy_tolerance() {
        let dir = TempDir::new().unwrap();
        let grey: Vec<u8> = (0..256u32)
            .map(|i| (8 * (i / 16) + 4 * (i % 16)) as u8)
            .collect();
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 100)
            .encode(&grey, 16, 16, image::ColorType::L8)
            .unwrap();
        let mut object = image(16, 16, 1, "MONOCHROME2", (8, 8), false);
        object.put(element(tags::PIXEL_DATA, VR::OB, fragments(vec![jpeg])));
        let path = write_dicom(dir.path(), "grey", object, uids::JPEG_BASELINE8_BIT);
        let (_, frames) = read_frames(&path).unwrap();
        let expected: Vec<f32> = grey.iter().map(|&v| f32::from(v)).collect();
        assert_close(&frames[0].values, &expected, 4.0);
        assert_eq!(frames[0].format, "DICOM CT, JPEG Baseline, 8-bit");

        let colour = [200u8, 60, 30].repeat(256);
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 100)
            .encode(&colour, 16, 16, image::ColorType::Rgb8)
            .unwrap();
        let mut object = image(16, 16, 3, "YBR_FULL_422", (8, 8), false);
        object.put(element(tags::PIXEL_DATA, VR::OB, fragments(vec![jpeg])));
        let path = write_dicom(dir.path(), "colour", object, uids::JPEG_BASELINE8_BIT);
        let (_, frames) = read_frames(&path).unwrap();
        let expected: Vec<f32> = [200.0, 60.0, 30.0].iter().flat_map(|&v| [v; 256]).collect();
        assert_eq!(frames[0].shape, [3, 16, 16]);
        assert_close(&frames[0].values, &expected, 5.0);
    }

    #[test]
    fn jpeg_lossless_is_exact() {
        let dir = TempDir::new().unwrap();
        let stored: Vec<u16> = vec![
            0, 4095, 1024, 1023, 17, 2000, 2001, 2003, 1999, 0, 4095, 4095, 12, 3000, 1, 2, 1024,
            1024, 1100, 900,
        ];
        let jpeg = jpeg_lossless(&stored, 4, 5, 12);
        for syntax in [uids::JPEG_LOSSLESS_SV1, uids::JPEG_LOSSLESS] {
            let mut object = image(4, 5, 1, "MONOCHROME2", (16, 12), false);
            put(&mut object, tags::RESCALE_INTERCEPT, VR::DS, "-1024");
            put(&mut object, tags::RESCALE_SLOPE, VR::DS, "1");
            object.put(element(
                tags::PIXEL_DATA,
                VR::OB,
                fragments(vec![jpeg.clone()]),
            ));
            let path = write_dicom(dir.path(), syntax, object, syntax);
            let (_, frames) = read_frames(&path).unwrap();
            let expected: Vec<f32> = stored.iter().map(|&v| f32::from(v) - 1024.0).collect();
            assert_eq!(frames[0].values, expected, "{syntax}");
            assert_eq!(frames[0].type_range, None);
            assert_eq!(frames[0].format, "DICOM CT, JPEG Lossless, 12-bit");
        }
    }

    #[test]
    fn deflated_frames_and_encapsulated_uncompressed_are_exact() {
        let dir = TempDir::new().unwrap();
        let frames = vec![vec![0u8, 1, 2, 255], vec![9, 8, 7, 6]];
        let deflate = |frame: &Vec<u8>| {
            let mut encoder = DeflateEncoder::new(Vec::new(), Compression::default());
            encoder.write_all(frame).unwrap();
            encoder.finish().unwrap()
        };
        let encodings = [
            (
                uids::DEFLATED_IMAGE_FRAME_COMPRESSION,
                frames.iter().map(deflate).collect(),
            ),
            (
                uids::ENCAPSULATED_UNCOMPRESSED_EXPLICIT_VR_LITTLE_ENDIAN,
                frames.clone(),
            ),
        ];
        for (syntax, encoded) in encodings {
            let mut object = image(2, 2, 1, "MONOCHROME2", (8, 8), false);
            put(&mut object, tags::NUMBER_OF_FRAMES, VR::IS, "2");
            object.put(element(tags::PIXEL_DATA, VR::OB, fragments(encoded)));
            let path = write_dicom(dir.path(), syntax, object, syntax);
            let (_, decoded) = read_frames(&path).unwrap();
            let values: Vec<Vec<f32>> = decoded.into_iter().map(|d| d.values).collect();
            let expected: Vec<Vec<f32>> = frames
                .iter()
                .map(|f| f.iter().map(|&v| f32::from(v)).collect())
                .collect();
            assert_eq!(values, expected, "{syntax}");
        }
    }

    #[test]
    fn monochrome1_is_mirrored_in_its_modality_range() {
        let dir = TempDir::new().unwrap();
        let mut plain = image(1, 3, 1, "MONOCHROME1", (8, 8), false);
        put(
            &mut plain,
            tags::PIXEL_DATA,
            VR::OB,
            PrimitiveValue::from(vec![0u8, 10, 255]),
        );
        let path = write_dicom(dir.path(), "plain", plain, uids::EXPLICIT_VR_LITTLE_ENDIAN);
        let (_, frames) = read_frames(&path).unwrap();
        assert_eq!(frames[0].values, [255.0, 245.0, 0.0]);
        assert_eq!(frames[0].type_range, Some((0.0, 255.0)));

        // 12-bit stored 0..4095 with intercept −1024 spans [−1024, 3071]: v' = 2047 − v.
        let mut rescaled = image(1, 3, 1, "MONOCHROME1", (16, 12), false);
        put(&mut rescaled, tags::RESCALE_INTERCEPT, VR::DS, "-1024");
        put(&mut rescaled, tags::RESCALE_SLOPE, VR::DS, "1");
        put(
            &mut rescaled,
            tags::PIXEL_DATA,
            VR::OW,
            unsigned_words(&[0, 1024, 4095]),
        );
        let path = write_dicom(
            dir.path(),
            "rescaled",
            rescaled,
            uids::EXPLICIT_VR_LITTLE_ENDIAN,
        );
        let (_, frames) = read_frames(&path).unwrap();
        assert_eq!(frames[0].values, [3071.0, 2047.0, -1024.0]);
        assert_eq!(frames[0].type_range, None);
    }

    #[test]
    fn modality_lut_sequence_maps_stored_values() {
        let dir = TempDir::new().unwrap();
        let mut object = image(1, 5, 1, "MONOCHROME2", (8, 8), false);
        let lut = InMemDicomObject::from_element_iter([
            element(
                tags::LUT_DESCRIPTOR,
                VR::US,
                PrimitiveValue::from([4u16, 2, 16]),
            ),
            element(
                tags::LUT_DATA,
                VR::US,
                PrimitiveValue::from([100u16, 200, 300, 400]),
            ),
        ]);
        put(
            &mut object,
            tags::MODALITY_LUT_SEQUENCE,
            VR::SQ,
            DataSetSequence::new(vec![lut], Length::UNDEFINED),
        );
        put(
            &mut object,
            tags::PIXEL_DATA,
            VR::OB,
            PrimitiveValue::from(vec![0u8, 2, 3, 5, 9, 0]),
        );
        let path = write_dicom(dir.path(), "lut", object, uids::EXPLICIT_VR_LITTLE_ENDIAN);
        let (_, frames) = read_frames(&path).unwrap();
        assert_eq!(frames[0].values, [100.0, 100.0, 200.0, 400.0, 400.0]);
        assert_eq!(frames[0].type_range, None);
    }

    #[test]
    fn multi_frame_file_reads_as_frames_and_as_volume() {
        let dir = TempDir::new().unwrap();
        let stored: Vec<i16> = (0..12).map(|v| v * 10 - 50).collect();
        let mut object = image(2, 2, 1, "MONOCHROME2", (16, 16), true);
        put(&mut object, tags::NUMBER_OF_FRAMES, VR::IS, "3");
        put(&mut object, tags::SPACING_BETWEEN_SLICES, VR::DS, "2.5");
        put(&mut object, tags::PIXEL_SPACING, VR::DS, "0.5\\0.25");
        put(&mut object, tags::PIXEL_DATA, VR::OW, words(&stored));
        let path = write_dicom(dir.path(), "cine", object, uids::EXPLICIT_VR_LITTLE_ENDIAN);
        let expected: Vec<f32> = stored.iter().map(|&v| f32::from(v)).collect();

        let (header, frames) = read_frames(&path).unwrap();
        assert_eq!(header.frames, 3);
        assert_eq!(frames.len(), 3);
        for (k, frame) in frames.iter().enumerate() {
            assert_eq!(frame.shape, [1, 2, 2]);
            assert_eq!(frame.values, expected[4 * k..4 * k + 4]);
        }
        let volume = read_volume(&path).unwrap();
        assert_eq!(volume.shape, [1, 3, 2, 2]);
        assert_eq!(volume.values, expected);
        assert_eq!(volume.spacing, Some(vec![2.5, 0.5, 0.25]));
        assert_eq!(
            volume.format,
            "DICOM CT, Explicit VR Little Endian, 16-bit, 3 frames"
        );
    }

    /// A 2 × 2 slice of constant `value`, at `z` when given, in series `series`.
    fn slice(z: Option<f64>, instance: i64, value: i16, series: &str) -> InMemDicomObject {
        let mut object = image(2, 2, 1, "MONOCHROME2", (16, 16), true);
        put(&mut object, tags::SERIES_INSTANCE_UID, VR::UI, series);
        put(
            &mut object,
            tags::INSTANCE_NUMBER,
            VR::IS,
            instance.to_string(),
        );
        put(&mut object, tags::PIXEL_SPACING, VR::DS, "0.7\\0.7");
        put(&mut object, tags::SLICE_THICKNESS, VR::DS, "1.25");
        if let Some(z) = z {
            put(
                &mut object,
                tags::IMAGE_POSITION_PATIENT,
                VR::DS,
                format!("0\\0\\{z}"),
            );
            put(
                &mut object,
                tags::IMAGE_ORIENTATION_PATIENT,
                VR::DS,
                "1\\0\\0\\0\\1\\0",
            );
        }
        put(&mut object, tags::PIXEL_DATA, VR::OW, words(&[value; 4]));
        object
    }

    /// A slice of [`series`]: position `z`, Instance Number, value, Series Instance UID.
    type SliceAt<'a> = (Option<f64>, i64, i16, &'a str);

    /// Files `s0`, `s1`, … in `dir`, one per [`SliceAt`].
    fn series(dir: &Path, slices: &[SliceAt]) -> Vec<PathBuf> {
        slices
            .iter()
            .enumerate()
            .map(|(i, &(z, instance, value, uid))| {
                let object = slice(z, instance, value, uid);
                write_dicom(
                    dir,
                    &format!("s{i}"),
                    object,
                    uids::EXPLICIT_VR_LITTLE_ENDIAN,
                )
            })
            .collect()
    }

    fn slice_values(volume: &Decoded) -> Vec<f32> {
        volume.values.chunks(4).map(|plane| plane[0]).collect()
    }

    #[test]
    fn series_is_ordered_by_position_before_instance_number() {
        let dir = TempDir::new().unwrap();
        let files = series(
            dir.path(),
            &[
                (Some(4.0), 1, 4, "2.25.7"),
                (Some(0.0), 2, 0, "2.25.7"),
                (Some(6.0), 4, 6, "2.25.7"),
                (Some(2.0), 3, 2, "2.25.7"),
            ],
        );
        let volume = read_series(&files).unwrap();
        assert_eq!(volume.shape, [1, 4, 2, 2]);
        assert_eq!(slice_values(&volume), [0.0, 2.0, 4.0, 6.0]);
        assert_eq!(volume.spacing, Some(vec![2.0, 0.7, 0.7]));
        assert_eq!(
            volume.format,
            "DICOM CT, Explicit VR Little Endian, 16-bit, 4 slices"
        );
    }

    #[test]
    fn series_without_positions_is_ordered_by_instance_number() {
        let dir = TempDir::new().unwrap();
        let files = series(
            dir.path(),
            &[
                (None, 3, 30, "2.25.7"),
                (None, 1, 10, "2.25.7"),
                (None, 2, 20, "2.25.7"),
            ],
        );
        let volume = read_series(&files).unwrap();
        assert_eq!(slice_values(&volume), [10.0, 20.0, 30.0]);
        assert_eq!(volume.spacing, Some(vec![1.25, 0.7, 0.7]));
    }

    #[test]
    fn series_errors_name_the_directory_and_the_files() {
        let cases: [(&[SliceAt], &[&str]); 6] = [
            (
                &[
                    (Some(0.0), 1, 0, "2.25.7"),
                    (Some(2.0), 2, 0, "2.25.7"),
                    (Some(2.0), 3, 0, "2.25.7"),
                ],
                &["s1 and s2 are at the same position"],
            ),
            (
                &[
                    (Some(0.0), 1, 0, "2.25.7"),
                    (Some(2.0), 2, 0, "2.25.7"),
                    (Some(4.0), 3, 0, "2.25.7"),
                    (Some(8.0), 4, 0, "2.25.7"),
                ],
                &["a slice is missing between s2 (4.00 mm) and s3 (8.00 mm)"],
            ),
            (
                &[(Some(0.0), 1, 0, "2.25.7"), (Some(2.0), 2, 0, "2.25.8")],
                &["belong to 2 different series", "2.25.7: s0", "2.25.8: s1"],
            ),
            (
                &[
                    (None, 1, 0, "2.25.7"),
                    (None, 2, 0, "2.25.7"),
                    (None, 2, 0, "2.25.7"),
                ],
                &["s1 and s2 have the same Instance Number 2"],
            ),
            (
                &[
                    (None, 1, 0, "2.25.7"),
                    (None, 2, 0, "2.25.7"),
                    (None, 4, 0, "2.25.7"),
                ],
                &["Instance Numbers jump from 2 (s1) to 4 (s2)"],
            ),
            (
                &[(Some(0.0), 1, 0, "2.25.7")],
                &["at least 2 slices, found 1 (s0)"],
            ),
        ];
        for (slices, expected) in cases {
            let dir = TempDir::new().unwrap();
            let files = series(dir.path(), slices);
            let message = error_of(read_series(&files));
            assert!(
                message.contains(&dir.path().display().to_string()),
                "{message}"
            );
            for part in expected {
                assert!(message.contains(part), "{message}");
            }
        }

        let dir = TempDir::new().unwrap();
        let mut files = series(
            dir.path(),
            &[(Some(0.0), 1, 0, "2.25.7"), (Some(2.0), 2, 0, "2.25.7")],
        );
        let mut scout = image(3, 3, 1, "MONOCHROME2", (16, 16), true);
        put(&mut scout, tags::SERIES_INSTANCE_UID, VR::UI, "2.25.7");
        put(&mut scout, tags::PIXEL_DATA, VR::OW, words(&[0; 9]));
        files.push(write_dicom(
            dir.path(),
            "scout",
            scout,
            uids::EXPLICIT_VR_LITTLE_ENDIAN,
        ));
        let message = error_of(read_series(&files));
        assert!(
            message.contains("differ in size (2 × 2: s0, s1; 3 × 3: scout)"),
            "{message}"
        );
    }

    #[test]
    fn truncated_file_is_named_as_such() {
        let dir = TempDir::new().unwrap();
        let mut object = image(64, 64, 1, "MONOCHROME2", (16, 16), true);
        put(&mut object, tags::PIXEL_DATA, VR::OW, words(&[7; 64 * 64]));
        let whole = write_dicom(dir.path(), "whole", object, uids::EXPLICIT_VR_LITTLE_ENDIAN);
        let bytes = std::fs::read(&whole).unwrap();
        for (name, length) in [("half", bytes.len() / 2), ("meta", 200)] {
            let cut = dir.path().join(name);
            std::fs::write(&cut, &bytes[..length]).unwrap();
            let message = error_of(read_frames(&cut));
            assert!(message.contains(&cut.display().to_string()), "{message}");
            assert!(
                message.contains("is truncated or not a valid DICOM file"),
                "{message}"
            );
        }
        let message = error_of(read_header(&dir.path().join("meta")));
        assert!(
            message.contains("is truncated or not a valid DICOM file"),
            "{message}"
        );
    }

    #[test]
    fn jpeg_ls_and_unknown_syntaxes_are_refused_by_name() {
        let dir = TempDir::new().unwrap();
        let mut object = image(2, 2, 1, "MONOCHROME2", (8, 8), false);
        let bytes = vec![0xFF, 0xD8, 0xFF, 0xF7, 0, 11, 8, 0, 2, 0, 2, 1, 1, 0x11, 0];
        object.put(element(tags::PIXEL_DATA, VR::OB, fragments(vec![bytes])));
        let path = write_dicom(dir.path(), "jls", object, JPEG_LS_LOSSLESS);

        let header = read_header(&path).unwrap();
        assert_eq!(
            header.transfer_syntax_name,
            "JPEG-LS Lossless Image Compression"
        );
        let message = error_of(read_frames(&path));
        for part in [
            "jls",
            "JPEG-LS Lossless Image Compression (1.2.840.10008.1.2.4.80)",
            "CharLS",
            "gdcmconv --raw",
        ] {
            assert!(message.contains(part), "{message}");
        }

        let unknown = "1.2.840.99999.1.2.4.80";
        let bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(JPEG_LS_LOSSLESS.len())
            .position(|w| w == JPEG_LS_LOSSLESS.as_bytes())
            .unwrap();
        let mut patched = bytes.clone();
        patched[at..at + unknown.len()].copy_from_slice(unknown.as_bytes());
        let path = dir.path().join("private");
        std::fs::write(&path, patched).unwrap();
        let message = error_of(read_header(&path));
        for part in ["private", unknown, "unknown", "gdcmconv --raw"] {
            assert!(message.contains(part), "{message}");
        }
    }

    #[test]
    fn files_without_pixels_or_image_are_refused() {
        let dir = TempDir::new().unwrap();
        let header_only = image(2, 2, 1, "MONOCHROME2", (8, 8), false);
        let path = write_dicom(
            dir.path(),
            "nopixels",
            header_only,
            uids::EXPLICIT_VR_LITTLE_ENDIAN,
        );
        assert!(error_of(read_frames(&path)).contains("has no pixel data"));

        let report = InMemDicomObject::from_element_iter([
            element(tags::SOP_CLASS_UID, VR::UI, "1.2.840.10008.5.1.4.1.1.88.11"),
            element(tags::SOP_INSTANCE_UID, VR::UI, "2.25.2"),
            element(tags::MODALITY, VR::CS, "SR"),
        ]);
        let path = write_dicom(
            dir.path(),
            "report",
            report,
            uids::EXPLICIT_VR_LITTLE_ENDIAN,
        );
        let message = error_of(read_header(&path));
        assert!(message.contains("holds no image"), "{message}");
        assert!(
            message.contains("1.2.840.10008.5.1.4.1.1.88.11"),
            "{message}"
        );
    }

    #[test]
    fn corrupt_compressed_data_is_an_error_not_a_panic() {
        let dir = TempDir::new().unwrap();
        let mut object = image(2, 2, 1, "MONOCHROME2", (8, 8), false);
        object.put(element(
            tags::PIXEL_DATA,
            VR::OB,
            fragments(vec![vec![1, 0]]),
        ));
        let path = write_dicom(dir.path(), "broken", object, uids::RLE_LOSSLESS);
        let message = error_of(read_frames(&path));
        assert!(
            message.contains("RLE Lossless pixel data cannot be decoded"),
            "{message}"
        );
    }
}
