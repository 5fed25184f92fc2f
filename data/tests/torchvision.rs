//! The augmentation ops against torchvision and PIL on a real photo (`docs/spec/data.md` §3, §4).
//!
//! `golden/make_golden.py` computed every reference array with torchvision 0.29 / Pillow from
//! `golden/photo.png` (a 48 × 64 crop of scikit-learn's `china.jpg`) for fixed parameters; the
//! float path must agree to 1e-5 (rounding of a different summation order), the PIL path
//! (which quantises to `u8` after each op) within 1/255 plus its own rounding.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use ssl_data::npy::{read_header, Dtype};
use ssl_data::{
    blur, color, resample, CropBox, ImageAugment, ImageViewParams, Interpolation, JitterOp,
    Normalization, VolumeAugment, VolumeViewParams,
};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// A golden array as `f32` (u8 arrays scaled by 1/255), with its shape.
fn golden(name: &str) -> (Vec<f32>, Vec<usize>) {
    let path = golden_dir().join(format!("{name}.npy"));
    let mut r = BufReader::new(File::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")));
    let header = read_header(&mut r).unwrap();
    let mut bytes = vec![0u8; header.data_bytes()];
    r.read_exact(&mut bytes).unwrap();
    let values = match header.dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect(),
        Dtype::U8 => bytes.iter().map(|&v| v as f32 / 255.0).collect(),
        other => panic!("{name}: unexpected dtype {other:?}"),
    };
    (values, header.shape)
}

/// The PIL path's HWC bytes as CHW.
fn golden_pil(name: &str) -> Vec<f32> {
    let (hwc, shape) = golden(name);
    let (h, w, c) = (shape[0], shape[1], shape[2]);
    let mut chw = vec![0f32; hwc.len()];
    for y in 0..h {
        for x in 0..w {
            for k in 0..c {
                chw[k * h * w + y * w + x] = hwc[(y * w + x) * c + k];
            }
        }
    }
    chw
}

/// The photo as `[3, 48, 64]` in `[0, 1]`, decoded by the `image` crate.
fn photo() -> Vec<f32> {
    let img = image::open(golden_dir().join("photo.png"))
        .unwrap()
        .to_rgb8();
    let (w, h) = img.dimensions();
    let (w, h) = (w as usize, h as usize);
    assert_eq!((h, w), (48, 64));
    let mut chw = vec![0f32; 3 * h * w];
    for (x, y, p) in img.enumerate_pixels() {
        for c in 0..3 {
            chw[c * h * w + y as usize * w + x as usize] = p[c] as f32 / 255.0;
        }
    }
    chw
}

fn assert_close(ours: &[f32], theirs: &[f32], tol: f32, what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    let (i, worst) = ours
        .iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
    assert!(
        worst <= tol,
        "{what}: largest difference {worst} at {i} (ours {}, reference {}) exceeds {tol}",
        ours[i],
        theirs[i]
    );
}

const FLOAT_TOL: f32 = 1e-5;
/// The PIL path rounds to u8 once per pass or op: half a level each, plus the 1/255 budget.
const PIL_TOL: f32 = 1.0 / 255.0 + 1e-6;

#[test]
fn antialiased_resized_crops_match_torchvision_and_pil() {
    let x = photo();
    for (name, interpolation) in [
        ("bilinear", Interpolation::Bilinear),
        ("bicubic", Interpolation::Bicubic),
    ] {
        // Downsampling (antialiased), then upsampling, each against torchvision's float path.
        let down = CropBox {
            top: 5,
            left: 8,
            height: 36,
            width: 48,
        };
        let up = CropBox {
            top: 15,
            left: 20,
            height: 10,
            width: 12,
        };
        for (direction, crop, (h, w)) in [("down", down, (20, 24)), ("up", up, (24, 28))] {
            let mut out = vec![0f32; 3 * h * w];
            resample::resized_crop(&x, 48, 64, crop, h, w, interpolation, &mut out);
            let case = format!("resize_{direction}_{name}");
            // Ours clamps to [0, 1] as PIL's 8-bit output does; torchvision's float path
            // leaves bicubic's overshoot, so its values are compared clamped.
            let reference: Vec<f32> = golden(&case).0.iter().map(|v| v.clamp(0.0, 1.0)).collect();
            assert_close(&out, &reference, FLOAT_TOL, &case);
            if direction == "down" {
                // PIL rounds each pass to u8.
                let pil = golden_pil(&format!("{case}_pil"));
                assert_close(&out, &pil, PIL_TOL, &format!("{name} vs PIL"));
            }
        }
    }
}

#[test]
fn colour_ops_match_torchvision_float_path() {
    let x = photo();
    type Op = dyn Fn(&mut [f32]);
    let cases: [(&str, &Op); 8] = [
        ("brightness_1.3", &|v| color::adjust_brightness(v, 1.3)),
        ("contrast_0.6", &|v| color::adjust_contrast(v, 3, 0.6)),
        ("saturation_1.5", &|v| color::adjust_saturation(v, 3, 1.5)),
        ("saturation_0.3", &|v| color::adjust_saturation(v, 3, 0.3)),
        ("hue_0.08", &|v| color::adjust_hue(v, 3, 0.08)),
        ("hue_-0.17", &|v| color::adjust_hue(v, 3, -0.17)),
        ("grayscale", &|v| color::grayscale(v, 3)),
        ("solarize", &|v| color::solarize(v, 0.5)),
    ];
    for (name, op) in cases {
        let mut v = x.clone();
        op(&mut v);
        assert_close(&v, &golden(name).0, FLOAT_TOL, name);
    }
}

#[test]
fn colour_ops_match_pil_within_its_quantisation() {
    let x = photo();
    let mut contrast = x.clone();
    color::adjust_contrast(&mut contrast, 3, 0.6);
    // PIL's contrast blends with the integer-rounded mean of its u8 grey image.
    assert_close(
        &contrast,
        &golden_pil("contrast_0.6_pil"),
        PIL_TOL + 0.5 * 0.4 / 255.0,
        "contrast vs PIL",
    );
    let mut saturation = x.clone();
    color::adjust_saturation(&mut saturation, 3, 1.5);
    assert_close(
        &saturation,
        &golden_pil("saturation_1.5_pil"),
        PIL_TOL,
        "saturation vs PIL",
    );
    // PIL shifts an 8-bit hue (1/255 of a turn per step) and converts back in u8: compare the
    // mean error, the per-pixel one reaches a few levels on saturated dark pixels.
    let mut hue = x.clone();
    color::adjust_hue(&mut hue, 3, 0.08);
    let pil = golden_pil("hue_0.08_pil");
    let mean: f32 = hue
        .iter()
        .zip(&pil)
        .map(|(a, b)| (a - b).abs())
        .sum::<f32>()
        / pil.len() as f32;
    assert!(mean < 1.0 / 255.0, "hue vs PIL: mean difference {mean}");
}

#[test]
fn gaussian_blur_matches_torchvision_with_reflect_padding() {
    let x = photo();
    for (name, taps, sigma) in [("blur_k23_s1.7", 23, 1.7), ("blur_k3_s0.6", 3, 0.6)] {
        let mut v = x.clone();
        blur::gaussian_blur(&mut v, 48, 64, taps, sigma);
        assert_close(&v, &golden(name).0, FLOAT_TOL, name);
    }
}

#[test]
fn a_whole_view_with_fixed_parameters_matches_torchvision() {
    let x = photo();
    let augment = ImageAugment {
        blur_kernel: 7,
        normalize: Normalization::Imagenet,
        ..ImageAugment::default()
    };
    let params = ImageViewParams {
        crop: Some(CropBox {
            top: 3,
            left: 6,
            height: 40,
            width: 50,
        }),
        flip: true,
        jitter: vec![
            JitterOp::Hue(-0.05),
            JitterOp::Contrast(1.25),
            JitterOp::Brightness(0.8),
            JitterOp::Saturation(1.1),
        ],
        grayscale: false,
        blur_sigma: Some(0.9),
        solarize: false,
    };
    let mut out = vec![0f32; x.len()];
    augment.apply_params(&x, &[3, 48, 64], &params, &mut out);
    // Normalisation divides by std ≈ 0.22, which scales the float tolerance.
    assert_close(&out, &golden("view_icone").0, 5.0 * FLOAT_TOL, "IConE view");
}

/// The seeded 12³ volume of the 3D goldens.
fn volume() -> Vec<f32> {
    let (v, shape) = golden("volume");
    assert_eq!(shape, [1, 12, 12, 12]);
    v
}

fn volume_view(params: VolumeViewParams) -> Vec<f32> {
    let x = volume();
    let mut out = vec![0f32; x.len()];
    VolumeAugment::default().apply_params(&x, &[1, 12, 12, 12], &params, &mut out);
    out
}

const IDENTITY_3D: VolumeViewParams = VolumeViewParams {
    crop_corner: [0, 0, 0],
    crop_size: [12, 12, 12],
    flips: [false; 3],
    rotation: None,
    shift: 0.0,
    contrast: 1.0,
    noise_seed: None,
    blur: false,
};

#[test]
fn volume_ops_match_pytorch() {
    assert_close(&volume_view(IDENTITY_3D), &volume(), 0.0, "identity view");
    let crop = volume_view(VolumeViewParams {
        crop_corner: [2, 1, 3],
        crop_size: [9, 9, 9],
        ..IDENTITY_3D
    });
    assert_close(
        &crop,
        &golden("volume_crop_trilinear").0,
        FLOAT_TOL,
        "trilinear crop",
    );
    for (name, plane, k) in [
        ("volume_rot90_k1_dims12", [0, 1], 1),
        ("volume_rot90_k3_dims13", [0, 2], 3),
    ] {
        let rotated = volume_view(VolumeViewParams {
            rotation: Some((plane, k)),
            ..IDENTITY_3D
        });
        assert_close(&rotated, &golden(name).0, 0.0, name);
    }
    let pooled = volume_view(VolumeViewParams {
        blur: true,
        ..IDENTITY_3D
    });
    assert_close(
        &pooled,
        &golden("volume_avgpool3").0,
        FLOAT_TOL,
        "average pool",
    );
    let affine = volume_view(VolumeViewParams {
        shift: 0.05,
        contrast: 1.1,
        ..IDENTITY_3D
    });
    let want: Vec<f32> = volume().iter().map(|v| 1.1 * (v + 0.05)).collect();
    assert_close(&affine, &want, 1e-6, "shift then contrast");
}
