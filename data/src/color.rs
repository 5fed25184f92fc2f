//! torchvision's colour operations on float images (`docs/spec/data.md` §3.4, §3.5, §3.7, §3.8).
//!
//! Every function works in place on a channel-planar image `[C, H·W]` (`C = 3` for RGB; the
//! brightness, contrast and solarisation also take `C = 1`) with values in `[0, 1]`, and follows
//! `torchvision.transforms.functional` on `float32` tensors: each colour-jitter op blends with
//! a reference image and clamps to `[0, 1]`; grey is ITU-R 601-2 luma
//! `0.2989·R + 0.587·G + 0.114·B`.

use serde::{Deserialize, Serialize};

/// ITU-R 601-2 luma weights, as torchvision's `rgb_to_grayscale`.
const LUMA: [f32; 3] = [0.2989, 0.587, 0.114];

fn planes(image: &mut [f32], channels: usize) -> (usize, &mut [f32]) {
    assert!(
        channels > 0 && image.len().is_multiple_of(channels),
        "an image of {} values has no {channels} equal planes",
        image.len()
    );
    (image.len() / channels, image)
}

fn luma_at(image: &[f32], plane: usize, i: usize) -> f32 {
    LUMA[0] * image[i] + LUMA[1] * image[plane + i] + LUMA[2] * image[2 * plane + i]
}

/// `x ← clamp(β·x)` (`adjust_brightness`).
pub fn adjust_brightness(image: &mut [f32], factor: f32) {
    for x in image {
        *x = (factor * *x).clamp(0.0, 1.0);
    }
}

/// `x ← clamp(γ·x + (1 − γ)·m)` with `m` the mean grey level of the whole image
/// (`adjust_contrast`; the mean of the single plane for `C = 1`).
pub fn adjust_contrast(image: &mut [f32], channels: usize, factor: f32) {
    let (plane, image) = planes(image, channels);
    let mean = match channels {
        3 => {
            let sum: f64 = (0..plane).map(|i| luma_at(image, plane, i) as f64).sum();
            (sum / plane as f64) as f32
        }
        _ => (image.iter().map(|&x| x as f64).sum::<f64>() / image.len() as f64) as f32,
    };
    let offset = (1.0 - factor) * mean;
    for x in image {
        *x = (factor * *x + offset).clamp(0.0, 1.0);
    }
}

/// `x ← clamp(σ·x + (1 − σ)·gray(x))`, grey per pixel (`adjust_saturation`; a no-op unless RGB).
pub fn adjust_saturation(image: &mut [f32], channels: usize, factor: f32) {
    if channels != 3 {
        return;
    }
    let (plane, image) = planes(image, channels);
    for i in 0..plane {
        let grey = (1.0 - factor) * luma_at(image, plane, i);
        for c in 0..3 {
            let x = &mut image[c * plane + i];
            *x = (factor * *x + grey).clamp(0.0, 1.0);
        }
    }
}

/// Rotates the hue by `shift` turns (`adjust_hue`, `shift ∈ [−0.5, 0.5]`): RGB → HSV,
/// `H ← (H + shift) mod 1`, HSV → RGB, with torchvision's float formulas (a no-op unless RGB).
/// Each channel is first clamped to `[0, 1]`, the domain of those formulas: a pixel whose
/// largest channel is 0 while another is negative would otherwise divide by zero in RGB → HSV.
pub fn adjust_hue(image: &mut [f32], channels: usize, shift: f32) {
    if channels != 3 {
        return;
    }
    let (plane, image) = planes(image, channels);
    let unit = |x: f32| x.clamp(0.0, 1.0);
    for i in 0..plane {
        let (r, g, b) = (
            unit(image[i]),
            unit(image[plane + i]),
            unit(image[2 * plane + i]),
        );
        let (h, s, v) = rgb_to_hsv(r, g, b);
        let h = (h + shift).rem_euclid(1.0);
        let (r, g, b) = hsv_to_rgb(h, s, v);
        image[i] = r;
        image[plane + i] = g;
        image[2 * plane + i] = b;
    }
}

/// torchvision's `_rgb2hsv` for one pixel of `[0, 1]³`: `(H, S, V)` with `H ∈ [0, 1)`. Its
/// guard (`S = 0`, `H = 0` for a grey pixel) also covers black, the only pixel with `maxc = 0`.
fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    if maxc <= minc {
        return (0.0, 0.0, maxc);
    }
    let cr = maxc - minc;
    let s = cr / maxc;
    let (rc, gc, bc) = ((maxc - r) / cr, (maxc - g) / cr, (maxc - b) / cr);
    let h = if maxc == r {
        bc - gc
    } else if maxc == g {
        2.0 + rc - bc
    } else {
        4.0 + gc - rc
    };
    ((h / 6.0 + 1.0) % 1.0, s, maxc)
}

/// torchvision's `_hsv2rgb` for one pixel.
fn hsv_to_rgb(h: f32, s: f32, v: f32) -> (f32, f32, f32) {
    let i = (h * 6.0).floor();
    let f = h * 6.0 - i;
    let p = (v * (1.0 - s)).clamp(0.0, 1.0);
    let q = (v * (1.0 - s * f)).clamp(0.0, 1.0);
    let t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0);
    match (i as i32).rem_euclid(6) {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    }
}

/// Replaces every channel by the grey level (`rgb_to_grayscale(img, 3)`; a no-op unless RGB).
pub fn grayscale(image: &mut [f32], channels: usize) {
    if channels != 3 {
        return;
    }
    let (plane, image) = planes(image, channels);
    for i in 0..plane {
        let grey = luma_at(image, plane, i);
        for c in 0..3 {
            image[c * plane + i] = grey;
        }
    }
}

/// `x ← 1 − x` where `x ≥ threshold` (`solarize`; the papers use 0.5, PIL's 128 on `u8`).
pub fn solarize(image: &mut [f32], threshold: f32) {
    for x in image {
        if *x >= threshold {
            *x = 1.0 - *x;
        }
    }
}

/// Per-channel standardisation `(x − mean_c) / std_c` (torchvision's `Normalize`), by name in
/// configs: the data sets' usual statistics (spec data §3.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Normalization {
    /// Leave the values in `[0, 1]`.
    #[default]
    None,
    /// ImageNet's mean and std: ImageNet(-100), Imagenette, and MedMNIST 2D in IConE.
    Imagenet,
    /// CIFAR-10's (solo-learn).
    Cifar10,
    /// CIFAR-100's (solo-learn).
    Cifar100,
    /// STL-10's (solo-learn).
    Stl10,
    /// 0.5 and 0.5 per channel, the MedMNIST baselines'.
    Medmnist,
}

impl Normalization {
    /// `(mean, std)` per RGB channel, `None` for [`Normalization::None`].
    pub fn statistics(self) -> Option<([f32; 3], [f32; 3])> {
        match self {
            Self::None => None,
            Self::Imagenet => Some(([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])),
            Self::Cifar10 => Some(([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])),
            Self::Cifar100 => Some(([0.5071, 0.4865, 0.4409], [0.2673, 0.2564, 0.2762])),
            Self::Stl10 => Some(([0.4914, 0.4823, 0.4466], [0.247, 0.243, 0.261])),
            Self::Medmnist => Some(([0.5; 3], [0.5; 3])),
        }
    }

    /// Standardises an image `[C, …]` in place. A single-channel image takes the first
    /// channel's statistics (MedMNIST's 0.5 for all; ImageNet's red for greyscale inputs is a
    /// convention, grey images are usually replicated to RGB first).
    pub fn apply(self, image: &mut [f32], channels: usize) {
        let Some((mean, std)) = self.statistics() else {
            return;
        };
        let (plane, image) = planes(image, channels);
        for (c, values) in image.chunks_mut(plane).enumerate() {
            let (m, s) = (mean[c.min(2)], std[c.min(2)]);
            for x in values {
                *x = (*x - m) / s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsv_round_trip_is_the_identity() {
        for &(r, g, b) in &[
            (0.2f32, 0.4f32, 0.9f32),
            (0.9, 0.1, 0.3),
            (0.5, 0.5, 0.5),
            (0.0, 0.0, 0.0),
            (1.0, 0.2, 1.0),
            (0.3, 0.8, 0.3),
        ] {
            let (h, s, v) = rgb_to_hsv(r, g, b);
            let (r2, g2, b2) = hsv_to_rgb(h, s, v);
            assert!((r - r2).abs() < 1e-6 && (g - g2).abs() < 1e-6 && (b - b2).abs() < 1e-6);
        }
    }

    #[test]
    fn hue_shift_is_finite_and_in_range_next_to_bicubic_undershoot() {
        // A black pixel beside saturated red, as bicubic leaves it: R = 0, G and B just below 0.
        let mut x = vec![0.0, 1.0, -0.03, 0.0, -0.01, 0.0];
        adjust_hue(&mut x, 3, 0.1);
        assert!(x.iter().all(|v| (0.0..=1.0).contains(v)), "{x:?}");
        assert_eq!([x[0], x[2], x[4]], [0.0; 3], "black stays black: {x:?}");
    }

    #[test]
    fn hue_shift_by_a_third_rotates_the_primaries() {
        let mut red = vec![1.0, 0.0, 0.0];
        adjust_hue(&mut red, 3, 1.0 / 3.0);
        assert!((red[0]).abs() < 1e-6 && (red[1] - 1.0).abs() < 1e-6 && red[2].abs() < 1e-6);
    }

    #[test]
    fn identity_factors_leave_the_image_unchanged() {
        let image: Vec<f32> = (0..12).map(|i| i as f32 / 12.0).collect();
        let mut x = image.clone();
        adjust_brightness(&mut x, 1.0);
        adjust_contrast(&mut x, 3, 1.0);
        adjust_saturation(&mut x, 3, 1.0);
        adjust_hue(&mut x, 3, 0.0);
        for (a, b) in x.iter().zip(&image) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn zero_contrast_gives_the_mean_grey_everywhere() {
        let mut x = vec![0.0, 1.0, 0.2, 0.6, 0.4, 0.4];
        adjust_contrast(&mut x, 3, 0.0);
        let mean = ((0.2989 * 0.0 + 0.587 * 0.2 + 0.114 * 0.4)
            + (0.2989 * 1.0 + 0.587 * 0.6 + 0.114 * 0.4))
            / 2.0;
        assert!(x.iter().all(|&v| (v - mean).abs() < 1e-6), "{x:?}");
    }

    #[test]
    fn normalisation_standardises_each_channel() {
        let mut x = vec![0.485, 0.485 + 0.229, 0.456, 0.456, 0.406 - 0.225, 0.406];
        Normalization::Imagenet.apply(&mut x, 3);
        let want = [0.0, 1.0, 0.0, 0.0, -1.0, 0.0];
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{x:?}");
        }
    }
}
