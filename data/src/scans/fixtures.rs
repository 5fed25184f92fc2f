//! Small synthetic scans written through the formats' own crates (dicom-rs, nifti, image,
//! tiff), for the tests of this crate and the end-to-end tests of `ssl` (feature `fixtures`).
//! Where dicom-rs writes only the data set, the frames are encoded here: RLE Lossless
//! (PackBits per byte plane) and JPEG Lossless (Process 14); JPEG Baseline comes from the
//! `image` crate's encoder.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use dicom_core::value::PixelFragmentSequence;
use dicom_core::{DataElement, DicomValue, PrimitiveValue, Tag, VR};
use dicom_dictionary_std::{tags, uids};
use dicom_object::meta::FileMetaTableBuilder;
use dicom_object::InMemDicomObject;
use flate2::write::DeflateEncoder;
use flate2::Compression;
use image::{ImageBuffer, Luma};
use ndarray::Array3;
use nifti::writer::WriterOptions;
use nifti::NiftiHeader;
use tiff::encoder::colortype::ColorType;
use tiff::encoder::TiffEncoder;
use tiff::tags::{PhotometricInterpretation, SampleFormat};

/// Explicit VR Big Endian (retired, so not among dicom-rs's named UIDs).
pub const EXPLICIT_BIG_ENDIAN: &str = "1.2.840.10008.1.2.2";

/// The transfer syntaxes [`ct_slice`] encodes, one of each family the readers decode.
pub const CT_SYNTAXES: [&str; 8] = [
    uids::EXPLICIT_VR_LITTLE_ENDIAN,
    uids::IMPLICIT_VR_LITTLE_ENDIAN,
    EXPLICIT_BIG_ENDIAN,
    uids::DEFLATED_EXPLICIT_VR_LITTLE_ENDIAN,
    uids::RLE_LOSSLESS,
    uids::JPEG_LOSSLESS_SV1,
    uids::JPEG_BASELINE8_BIT,
    uids::DEFLATED_IMAGE_FRAME_COMPRESSION,
];

/// A CT slice of 12-bit `stored` values (row-major `rows × columns`, each < 4096; Rescale
/// Intercept −1024, so `stored − 1024` HU), its pixel data encoded for `syntax` (one of
/// [`CT_SYNTAXES`]). JPEG Baseline holds 8 bits: it stores `stored / 16` with slope 16.
pub fn ct_slice(stored: &[u16], rows: u16, columns: u16, syntax: &str) -> InMemDicomObject {
    assert_eq!(stored.len(), usize::from(rows) * usize::from(columns));
    assert!(stored.iter().all(|&v| v < 4096), "12-bit values");
    let baseline = syntax == uids::JPEG_BASELINE8_BIT;
    let bits = if baseline { (8, 8) } else { (16, 12) };
    let mut object = image(rows, columns, 1, "MONOCHROME2", bits, false);
    put(&mut object, tags::RESCALE_INTERCEPT, VR::DS, "-1024");
    put(
        &mut object,
        tags::RESCALE_SLOPE,
        VR::DS,
        if baseline { "16" } else { "1" },
    );
    put(&mut object, tags::PIXEL_SPACING, VR::DS, "0.7\\0.7");
    let little_endian: Vec<u8> = stored.iter().flat_map(|v| v.to_le_bytes()).collect();
    let encapsulated = match syntax {
        uids::RLE_LOSSLESS => {
            let msb = stored.iter().map(|v| (v >> 8) as u8).collect();
            let lsb = stored.iter().map(|&v| v as u8).collect();
            rle_frame(&[msb, lsb])
        }
        uids::JPEG_LOSSLESS_SV1 => jpeg_lossless(stored, rows, columns, 12),
        uids::JPEG_BASELINE8_BIT => {
            let grey: Vec<u8> = stored.iter().map(|v| (v / 16) as u8).collect();
            let mut jpeg = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
                .encode(&grey, columns.into(), rows.into(), image::ColorType::L8)
                .expect("an in-memory JPEG");
            jpeg
        }
        uids::DEFLATED_IMAGE_FRAME_COMPRESSION => {
            let mut encoder = DeflateEncoder::new(Vec::new(), Compression::default());
            encoder.write_all(&little_endian).expect("in memory");
            encoder.finish().expect("in memory")
        }
        _ => {
            put(
                &mut object,
                tags::PIXEL_DATA,
                VR::OW,
                unsigned_words(stored),
            );
            return object;
        }
    };
    object.put(element(
        tags::PIXEL_DATA,
        VR::OB,
        fragments(vec![encapsulated]),
    ));
    object
}

/// Places `object` as slice `instance` of series `series` at `z` mm along an axial normal.
pub fn place_in_series(object: &mut InMemDicomObject, series: &str, instance: i64, z: f64) {
    put(object, tags::SERIES_INSTANCE_UID, VR::UI, series);
    put(object, tags::INSTANCE_NUMBER, VR::IS, instance.to_string());
    put(
        object,
        tags::IMAGE_POSITION_PATIENT,
        VR::DS,
        format!("0\\0\\{z}"),
    );
    put(
        object,
        tags::IMAGE_ORIENTATION_PATIENT,
        VR::DS,
        "1\\0\\0\\0\\1\\0",
    );
}

/// A data element of an in-memory data set.
pub type Element = DataElement<InMemDicomObject>;

/// The element `tag` of representation `vr` holding `value`.
pub fn element(tag: Tag, vr: VR, value: impl Into<DicomValue<InMemDicomObject>>) -> Element {
    DataElement::new(tag, vr, value)
}

/// A CT image data set without pixel data: `rows × columns`, `samples` per pixel, `bits`
/// (allocated, stored), signed or not, in series `2.25.7`.
pub fn image(
    rows: u16,
    columns: u16,
    samples: u16,
    photometric: &str,
    bits: (u16, u16),
    signed: bool,
) -> InMemDicomObject {
    let (allocated, stored) = bits;
    InMemDicomObject::from_element_iter([
        element(tags::SOP_CLASS_UID, VR::UI, uids::CT_IMAGE_STORAGE),
        element(tags::SOP_INSTANCE_UID, VR::UI, "2.25.1"),
        element(tags::MODALITY, VR::CS, "CT"),
        element(tags::SERIES_INSTANCE_UID, VR::UI, "2.25.7"),
        element(
            tags::SAMPLES_PER_PIXEL,
            VR::US,
            PrimitiveValue::from(samples),
        ),
        element(tags::PHOTOMETRIC_INTERPRETATION, VR::CS, photometric),
        element(tags::ROWS, VR::US, PrimitiveValue::from(rows)),
        element(tags::COLUMNS, VR::US, PrimitiveValue::from(columns)),
        element(
            tags::BITS_ALLOCATED,
            VR::US,
            PrimitiveValue::from(allocated),
        ),
        element(tags::BITS_STORED, VR::US, PrimitiveValue::from(stored)),
        element(tags::HIGH_BIT, VR::US, PrimitiveValue::from(stored - 1)),
        element(
            tags::PIXEL_REPRESENTATION,
            VR::US,
            PrimitiveValue::from(u16::from(signed)),
        ),
    ])
}

/// Sets the element `tag` of `object`.
pub fn put(
    object: &mut InMemDicomObject,
    tag: Tag,
    vr: VR,
    value: impl Into<DicomValue<InMemDicomObject>>,
) {
    object.put(element(tag, vr, value));
}

/// Signed 16-bit pixel data (OW).
pub fn words(values: &[i16]) -> PrimitiveValue {
    PrimitiveValue::I16(values.iter().copied().collect())
}

/// Unsigned 16-bit pixel data (OW).
pub fn unsigned_words(values: &[u16]) -> PrimitiveValue {
    PrimitiveValue::U16(values.iter().copied().collect())
}

/// Encapsulated pixel data: one fragment per frame, padded to an even length.
pub fn fragments(frames: Vec<Vec<u8>>) -> DicomValue<InMemDicomObject> {
    let padded: Vec<Vec<u8>> = frames
        .into_iter()
        .map(|mut f| {
            if f.len() % 2 == 1 {
                f.push(0);
            }
            f
        })
        .collect();
    PixelFragmentSequence::new(Vec::new(), padded).into()
}

/// `object` written as the Part 10 file `dir/name` in the transfer syntax `syntax`.
pub fn write_dicom(dir: &Path, name: &str, object: InMemDicomObject, syntax: &str) -> PathBuf {
    let path = dir.join(name);
    object
        .with_meta(FileMetaTableBuilder::new().transfer_syntax(syntax))
        .expect("a complete meta group")
        .write_to_file(&path)
        .expect("a writable file");
    path
}

/// PackBits, as RLE Lossless codes each byte plane (PS3.5 G.3.1).
pub fn packbits(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let run = bytes[i..]
            .iter()
            .take(128)
            .take_while(|&&b| b == bytes[i])
            .count();
        if run >= 2 {
            out.push((1 - run as i16) as u8);
            out.push(bytes[i]);
            i += run;
            continue;
        }
        let start = i;
        while i < bytes.len() && i - start < 128 && bytes.get(i + 1) != Some(&bytes[i]) {
            i += 1;
        }
        out.push((i - start - 1) as u8);
        out.extend_from_slice(&bytes[start..i]);
    }
    out
}

/// One RLE Lossless frame of the given byte planes (most significant byte first).
pub fn rle_frame(planes: &[Vec<u8>]) -> Vec<u8> {
    let mut header = vec![0u8; 64];
    header[..4].copy_from_slice(&(planes.len() as u32).to_le_bytes());
    let mut body = Vec::new();
    for (k, plane) in planes.iter().enumerate() {
        let offset = (64 + body.len()) as u32;
        header[4 + 4 * k..8 + 4 * k].copy_from_slice(&offset.to_le_bytes());
        body.extend(packbits(plane));
        if body.len() % 2 == 1 {
            body.push(0);
        }
    }
    header.extend(body);
    header
}

/// Packs bits most significant first, stuffing a zero after each `0xFF` (JPEG F.1.2.3).
#[derive(Default)]
struct BitWriter {
    bytes: Vec<u8>,
    pending: u32,
    count: u32,
}

impl BitWriter {
    fn put(&mut self, value: u32, bits: u32) {
        for k in (0..bits).rev() {
            self.pending = (self.pending << 1) | ((value >> k) & 1);
            self.count += 1;
            if self.count == 8 {
                let byte = self.pending as u8;
                self.bytes.push(byte);
                if byte == 0xFF {
                    self.bytes.push(0);
                }
                (self.pending, self.count) = (0, 0);
            }
        }
    }

    fn finish(mut self) -> Vec<u8> {
        while self.count != 0 {
            self.put(1, 1);
        }
        self.bytes
    }
}

/// A lossless JPEG (Process 14, predictor 1) of one grey component at `precision` < 16
/// bits, its Huffman table giving every difference category a 5-bit code.
pub fn jpeg_lossless(samples: &[u16], rows: u16, columns: u16, precision: u8) -> Vec<u8> {
    let ([rh, rl], [ch, cl]) = (rows.to_be_bytes(), columns.to_be_bytes());
    let mut out = vec![0xFF, 0xD8];
    out.extend([0xFF, 0xC3, 0, 11, precision, rh, rl, ch, cl, 1, 1, 0x11, 0]);
    out.extend([0xFF, 0xC4, 0, 36, 0x00]);
    let mut lengths = [0u8; 16];
    lengths[4] = 17;
    out.extend(lengths);
    out.extend(0..=16u8);
    out.extend([0xFF, 0xDA, 0, 8, 1, 1, 0x00, 1, 0, 0]);
    let width = usize::from(columns);
    let mut bits = BitWriter::default();
    for (i, &sample) in samples.iter().enumerate() {
        let predicted = match (i / width, i % width) {
            (0, 0) => 1 << (precision - 1),
            (0, _) | (_, 1..) => samples[i - 1],
            (_, 0) => samples[i - width],
        };
        let difference = i32::from(sample) - i32::from(predicted);
        let category = 32 - difference.unsigned_abs().leading_zeros();
        bits.put(category, 5);
        let extra = if difference > 0 {
            difference
        } else {
            difference - 1
        };
        bits.put(extra as u32 & ((1 << category) - 1), category);
    }
    out.extend(bits.finish());
    out.extend([0xFF, 0xD9]);
    out
}

/// `values` (`[D, H, W]` order, `shape` `[D, H, W]`) written as the NIfTI-1 file `path`
/// (gzipped when it ends in `.gz`), `f32` voxels of `spacing` `[slice, row, column]` mm.
pub fn write_nifti(path: &Path, values: &[f32], shape: [usize; 3], spacing: [f32; 3]) {
    let [d, h, w] = shape;
    assert_eq!(values.len(), d * h * w);
    let volume = Array3::from_shape_fn((w, h, d), |(x, y, z)| values[(z * h + y) * w + x]);
    let header = NiftiHeader {
        pixdim: [1.0, spacing[2], spacing[1], spacing[0], 1.0, 1.0, 1.0, 1.0],
        // Millimetres (NIFTI_UNITS_MM).
        xyzt_units: 2,
        ..NiftiHeader::default()
    };
    WriterOptions::new(path)
        .reference_header(&header)
        .write_nifti(&volume)
        .expect("a writable NIfTI file");
}

/// `values` (row-major `height × width`) written as the 16-bit grey PNG `path`.
pub fn write_png16(path: &Path, values: &[u16], width: u32, height: u32) {
    ImageBuffer::<Luma<u16>, _>::from_raw(width, height, values.to_vec())
        .expect("width × height values")
        .save_with_format(path, image::ImageFormat::Png)
        .expect("a writable PNG");
}

/// `C` unsigned 16-bit samples per pixel, as a fluorescence microscope writes them.
pub struct Channels16<const C: usize>;

impl<const C: usize> ColorType for Channels16<C> {
    type Inner = u16;
    const TIFF_VALUE: PhotometricInterpretation = PhotometricInterpretation::BlackIsZero;
    const BITS_PER_SAMPLE: &'static [u16] = &[16; C];
    const SAMPLE_FORMAT: &'static [SampleFormat] = &[SampleFormat::Uint; C];

    fn horizontal_predict(row: &[u16], result: &mut Vec<u16>) {
        let predicted = row
            .iter()
            .enumerate()
            .map(|(i, &v)| match i.checked_sub(C) {
                Some(left) => v.wrapping_sub(row[left]),
                None => v,
            });
        result.extend(predicted);
    }
}

/// `values` (pixels row-major, their `C` samples interleaved) written as the `C`-channel
/// 16-bit TIFF `path`.
pub fn write_tiff16<const C: usize>(path: &Path, values: &[u16], width: u32, height: u32) {
    let file = File::create(path).expect("a writable TIFF");
    TiffEncoder::new(file)
        .expect("a TIFF encoder")
        .write_image::<Channels16<C>>(width, height, values)
        .expect("width × height × C values");
}

#[cfg(test)]
mod tests {
    use super::super::dicom::read_frames;
    use super::*;

    #[test]
    fn every_ct_syntax_reads_back_in_hounsfield_units() {
        let dir = tempfile::TempDir::new().unwrap();
        let stored: Vec<u16> = (0..64).map(|i| i * 61).collect();
        for syntax in CT_SYNTAXES {
            let path = write_dicom(dir.path(), syntax, ct_slice(&stored, 8, 8, syntax), syntax);
            let (header, frames) = read_frames(&path).unwrap();
            assert_eq!(header.transfer_syntax, syntax);
            // JPEG Baseline keeps 8 of the 12 bits and loses a little more to its DCT.
            let tolerance = if syntax == uids::JPEG_BASELINE8_BIT {
                40.0
            } else {
                0.0
            };
            for (&v, &s) in frames[0].values.iter().zip(&stored) {
                let hu = f32::from(s) - 1024.0;
                assert!((v - hu).abs() <= tolerance, "{syntax}: {v} vs {hu}");
            }
        }
    }
}
