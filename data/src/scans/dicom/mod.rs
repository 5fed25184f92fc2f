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

mod pixels;
#[cfg(test)]
mod tests;

use pixels::*;
