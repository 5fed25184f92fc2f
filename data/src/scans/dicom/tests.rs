//! The DICOM reader's tests: every transfer syntax, photometric interpretation, series order
//! and refusal, on files written by `super::super::fixtures`.

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
        0, 4095, 1024, 1023, 17, 2000, 2001, 2003, 1999, 0, 4095, 4095, 12, 3000, 1, 2, 1024, 1024,
        1100, 900,
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
