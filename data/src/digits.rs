//! The UCI "Optical Recognition of Handwritten Digits" test set (1797 8x8 images, 10 classes),
//! as shipped by scikit-learn, embedded from `assets/digits.csv.gz` (see `assets/README.md`).
//!
//! Pixels (integers 0..=16) are divided by 16 into `[0, 1]` and bilinearly resized from 8x8 to
//! `size x size` with PyTorch `F.interpolate(mode="bilinear", align_corners=False)` semantics.

use std::io::Read;

use anyhow::{bail, Context, Result};

use crate::{Dataset, Samples};

/// The gzip-compressed CSV: 65 integer columns per row (64 pixels row-major, then the label).
static DIGITS_GZ: &[u8] = include_bytes!("../assets/digits.csv.gz");

/// The default output side length for [`digits`].
pub const DEFAULT_DIGITS_SIZE: usize = 16;

const SIDE: usize = 8;
const NUM_SAMPLES: usize = 1797;

/// Loads the digits, scaled to `[0, 1]` and resized to `size x size`; shape `[1, size, size]`.
///
/// `size == 8` returns the original pixels (divided by 16) unchanged.
pub fn digits(size: usize) -> Result<Dataset> {
    if size == 0 {
        bail!(
            "digits: image size must be at least 1 (got 0); the default is {DEFAULT_DIGITS_SIZE}"
        );
    }
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_GZ)
        .read_to_string(&mut text)
        .context("digits: decompressing the embedded digits.csv.gz")?;

    let mut images = Vec::with_capacity(NUM_SAMPLES * size * size);
    let mut labels = Vec::with_capacity(NUM_SAMPLES);
    let mut pixels = [0f32; SIDE * SIDE];
    for (row, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut n = 0;
        for (col, field) in line.split(',').enumerate() {
            let v: f32 = field.trim().parse().with_context(|| {
                format!("digits: row {row}, column {col}: cannot parse {field:?}")
            })?;
            if col < SIDE * SIDE {
                pixels[col] = v / 16.0;
            } else if col == SIDE * SIDE {
                if !(0.0..10.0).contains(&v) || v.fract() != 0.0 {
                    bail!("digits: row {row}: label {v} is not in 0..=9");
                }
                labels.push(v as u32);
            } else {
                bail!("digits: row {row} has more than 65 columns");
            }
            n += 1;
        }
        if n != SIDE * SIDE + 1 {
            bail!("digits: row {row} has {n} columns, expected 65");
        }
        images.extend(bilinear_resize(&pixels, SIDE, SIDE, size, size));
    }
    if labels.len() != NUM_SAMPLES {
        bail!(
            "digits: expected {NUM_SAMPLES} rows, found {}",
            labels.len()
        );
    }
    Ok(Dataset {
        name: "digits".into(),
        samples: Samples::F32(images),
        labels,
        shape: vec![1, size, size],
        num_classes: 10,
    })
}

/// Source coordinate and interpolation weight along one axis, as PyTorch computes them for
/// `align_corners=False`: `src = (dst + 0.5) * in / out - 0.5`, clamped below at 0.
fn source_index(dst: usize, in_len: usize, out_len: usize) -> (usize, usize, f32) {
    let scale = in_len as f32 / out_len as f32;
    let src = ((dst as f32 + 0.5) * scale - 0.5).max(0.0);
    let i0 = (src as usize).min(in_len - 1);
    let i1 = if i0 < in_len - 1 { i0 + 1 } else { i0 };
    let lambda = src - i0 as f32;
    (i0, i1, lambda.clamp(0.0, 1.0))
}

/// Bilinear resize of one `in_h x in_w` channel (row-major) to `out_h x out_w`, matching
/// PyTorch `F.interpolate(mode="bilinear", align_corners=False)` (no antialiasing).
///
/// Panics if `img.len() != in_h * in_w` or any dimension is zero.
pub fn bilinear_resize(
    img: &[f32],
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
) -> Vec<f32> {
    assert!(
        in_h > 0 && in_w > 0 && out_h > 0 && out_w > 0,
        "bilinear_resize: zero dimension"
    );
    assert_eq!(
        img.len(),
        in_h * in_w,
        "bilinear_resize: input length mismatch"
    );
    let cols: Vec<_> = (0..out_w).map(|x| source_index(x, in_w, out_w)).collect();
    let mut out = Vec::with_capacity(out_h * out_w);
    for y in 0..out_h {
        let (y0, y1, ly) = source_index(y, in_h, out_h);
        for &(x0, x1, lx) in &cols {
            let top = (1.0 - lx) * img[y0 * in_w + x0] + lx * img[y0 * in_w + x1];
            let bottom = (1.0 - lx) * img[y1 * in_w + x0] + lx * img[y1 * in_w + x1];
            out.push((1.0 - ly) * top + ly * bottom);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_all_samples_with_readme_class_counts() {
        let d = digits(DEFAULT_DIGITS_SIZE).unwrap();
        assert_eq!(d.len(), 1797);
        assert_eq!(d.shape, vec![1, 16, 16]);
        let Samples::F32(values) = &d.samples else {
            panic!("the digits are decoded")
        };
        assert_eq!(values.len(), 1797 * 256);
        assert_eq!(
            d.class_counts(),
            vec![178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
        );
        assert!(values.iter().all(|&v| (0.0..=1.0).contains(&v)));
    }

    #[test]
    fn size_eight_is_identity() {
        let d = digits(8).unwrap();
        assert_eq!(d.shape, vec![1, 8, 8]);
        // First row of the CSV: 0,0,5,13,9,1,0,0,...
        let first = d.sample(0);
        assert_eq!(
            &first[..8],
            &[
                0.0,
                0.0,
                5.0 / 16.0,
                13.0 / 16.0,
                9.0 / 16.0,
                1.0 / 16.0,
                0.0,
                0.0
            ]
        );
        assert_eq!(d.labels[0], 0);
        let img: Vec<f32> = (0..64).map(|v| v as f32).collect();
        assert_eq!(bilinear_resize(&img, 8, 8, 8, 8), img);
    }

    #[test]
    fn size_zero_is_an_error() {
        let err = digits(0).unwrap_err().to_string();
        assert!(err.contains("size"), "{err}");
    }

    #[test]
    fn upsampling_a_constant_is_constant() {
        let img = vec![0.375f32; 64];
        for size in [1, 5, 16, 28] {
            let out = bilinear_resize(&img, 8, 8, size, size);
            assert_eq!(out.len(), size * size);
            assert!(out.iter().all(|&v| (v - 0.375).abs() < 1e-6));
        }
    }

    #[test]
    fn matches_pytorch_on_a_small_example() {
        // torch.nn.functional.interpolate(torch.tensor([[[[0., 1.], [2., 3.]]]]), size=(4, 4),
        //     mode="bilinear", align_corners=False)
        let out = bilinear_resize(&[0.0, 1.0, 2.0, 3.0], 2, 2, 4, 4);
        let expected = [
            0.0, 0.25, 0.75, 1.0, //
            0.5, 0.75, 1.25, 1.5, //
            1.5, 1.75, 2.25, 2.5, //
            2.0, 2.25, 2.75, 3.0,
        ];
        for (a, b) in out.iter().zip(expected) {
            assert!((a - b).abs() < 1e-6, "{out:?}");
        }
    }
}
