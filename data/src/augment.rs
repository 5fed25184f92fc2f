//! Per-view stochastic transforms.
//!
//! A [`ViewTransform`] maps one flat sample (laid out per its `shape`) to one augmented view,
//! drawing all randomness from the RNG it is handed, so the loader can make every view
//! reproducible regardless of scheduling.
//!
//! * [`DigitsAugment`]: random affine (rotation about the image centre, isotropic scale,
//!   translation) with bilinear sampling and zero padding, then additive Gaussian noise.
//! * [`GaussianJitter`]: additive Gaussian noise, for vector data such as the 2D mixture.
//! * [`Identity`]: copies the input.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// A stochastic map from one sample to one view of the same shape.
pub trait ViewTransform: Send + Sync {
    /// Writes a view of `input` (shape `shape`) into `out` (same length), using only `rng`.
    fn apply(&self, input: &[f32], shape: &[usize], out: &mut [f32], rng: &mut ChaCha8Rng);
}

/// Copies the input unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct Identity;

impl ViewTransform for Identity {
    fn apply(&self, input: &[f32], _shape: &[usize], out: &mut [f32], _rng: &mut ChaCha8Rng) {
        out.copy_from_slice(input);
    }
}

/// Adds i.i.d. `N(0, std²)` noise to every value (IConE Appendix E uses `std = 0.15`).
#[derive(Debug, Clone, Copy)]
pub struct GaussianJitter {
    /// Standard deviation of the additive noise.
    pub std: f32,
}

impl Default for GaussianJitter {
    fn default() -> Self {
        Self { std: 0.15 }
    }
}

impl ViewTransform for GaussianJitter {
    fn apply(&self, input: &[f32], _shape: &[usize], out: &mut [f32], rng: &mut ChaCha8Rng) {
        add_noise(input, out, self.std, rng);
    }
}

fn add_noise(input: &[f32], out: &mut [f32], std: f32, rng: &mut ChaCha8Rng) {
    if std > 0.0 {
        let normal = Normal::new(0.0f32, std).expect("finite, positive std");
        for (o, &x) in out.iter_mut().zip(input) {
            *o = x + normal.sample(rng);
        }
    } else {
        out.copy_from_slice(input);
    }
}

/// Fixed parameters of one affine warp (see [`apply_affine`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffineParams {
    /// Rotation angle in degrees. Positive angles rotate from +x (right) towards +y (down),
    /// i.e. clockwise as displayed with row 0 at the top.
    pub angle_deg: f64,
    /// Isotropic scale factor (> 1 enlarges the content).
    pub scale: f64,
    /// Translation in pixels along the columns (+ moves content right).
    pub shift_x: f64,
    /// Translation in pixels along the rows (+ moves content down).
    pub shift_y: f64,
}

impl AffineParams {
    /// The identity warp.
    pub const IDENTITY: AffineParams = AffineParams {
        angle_deg: 0.0,
        scale: 1.0,
        shift_x: 0.0,
        shift_y: 0.0,
    };
}

/// Warps an image with `params` into `out`.
///
/// `shape` is `[H, W]` or `[C, ..., H, W]`; the last two dims are spatial and every leading
/// channel is warped identically. The forward map sends input pixel `p` to
/// `R(angle) · scale · (p − c) + c + shift`, with `c = ((W−1)/2, (H−1)/2)` the image centre;
/// each output pixel is inverse-mapped and bilinearly sampled, values outside the input read 0.
pub fn apply_affine(input: &[f32], shape: &[usize], params: &AffineParams, out: &mut [f32]) {
    assert!(
        shape.len() >= 2,
        "apply_affine: shape {shape:?} has no spatial dims"
    );
    assert_eq!(input.len(), out.len(), "apply_affine: length mismatch");
    let h = shape[shape.len() - 2];
    let w = shape[shape.len() - 1];
    let plane = h * w;
    assert_eq!(
        input.len() % plane.max(1),
        0,
        "apply_affine: shape/length mismatch"
    );
    if plane == 0 {
        return;
    }
    let (cx, cy) = ((w as f64 - 1.0) / 2.0, (h as f64 - 1.0) / 2.0);
    let (sin, cos) = params.angle_deg.to_radians().sin_cos();
    let inv_s = 1.0 / params.scale;
    for (src, dst) in input.chunks_exact(plane).zip(out.chunks_exact_mut(plane)) {
        for y in 0..h {
            for x in 0..w {
                // Inverse map: p = R^T (q − c − t) / s + c.
                let dx = x as f64 - cx - params.shift_x;
                let dy = y as f64 - cy - params.shift_y;
                let sx = (cos * dx + sin * dy) * inv_s + cx;
                let sy = (-sin * dx + cos * dy) * inv_s + cy;
                dst[y * w + x] = sample_zero_pad(src, h, w, sy, sx);
            }
        }
    }
}

/// Bilinear sample of a `h x w` plane at fractional `(y, x)`; neighbours outside read 0.
fn sample_zero_pad(img: &[f32], h: usize, w: usize, y: f64, x: f64) -> f32 {
    // Snap values within rounding error of an integer so exact warps stay exact.
    let snap = |v: f64| {
        let r = v.round();
        if (v - r).abs() < 1e-9 {
            r
        } else {
            v
        }
    };
    let (y, x) = (snap(y), snap(x));
    let (y0, x0) = (y.floor(), x.floor());
    let (fy, fx) = ((y - y0) as f32, (x - x0) as f32);
    let (y0, x0) = (y0 as i64, x0 as i64);
    let at = |yy: i64, xx: i64| -> f32 {
        if yy >= 0 && xx >= 0 && (yy as usize) < h && (xx as usize) < w {
            img[yy as usize * w + xx as usize]
        } else {
            0.0
        }
    };
    let top = (1.0 - fx) * at(y0, x0) + fx * at(y0, x0 + 1);
    let bottom = (1.0 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1);
    (1.0 - fy) * top + fy * bottom
}

/// Random affine warp (rotation, scale, shift) followed by additive Gaussian noise.
///
/// Angle ~ U(−rotation_deg, rotation_deg), scale ~ U(scale.0, scale.1), each shift ~
/// U(−shift_px, shift_px), then noise `N(0, noise_std²)` per pixel. Samples whose shape has
/// fewer than two dims only receive the noise.
#[derive(Debug, Clone, Copy)]
pub struct DigitsAugment {
    /// Maximum absolute rotation in degrees.
    pub rotation_deg: f64,
    /// Range of the isotropic scale factor.
    pub scale: (f64, f64),
    /// Maximum absolute translation in pixels, per axis.
    pub shift_px: f64,
    /// Standard deviation of the additive pixel noise.
    pub noise_std: f32,
}

impl Default for DigitsAugment {
    fn default() -> Self {
        Self {
            rotation_deg: 15.0,
            scale: (0.9, 1.1),
            shift_px: 2.0,
            noise_std: 0.1,
        }
    }
}

impl DigitsAugment {
    /// Draws the affine parameters of one view.
    pub fn sample_params(&self, rng: &mut ChaCha8Rng) -> AffineParams {
        let uniform = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| {
            if hi > lo {
                rng.random_range(lo..hi)
            } else {
                lo
            }
        };
        AffineParams {
            angle_deg: uniform(rng, -self.rotation_deg, self.rotation_deg),
            scale: uniform(rng, self.scale.0, self.scale.1),
            shift_x: uniform(rng, -self.shift_px, self.shift_px),
            shift_y: uniform(rng, -self.shift_px, self.shift_px),
        }
    }
}

impl ViewTransform for DigitsAugment {
    fn apply(&self, input: &[f32], shape: &[usize], out: &mut [f32], rng: &mut ChaCha8Rng) {
        if shape.len() >= 2 {
            let params = self.sample_params(rng);
            let mut warped = vec![0f32; input.len()];
            apply_affine(input, shape, &params, &mut warped);
            add_noise(&warped, out, self.noise_std, rng);
        } else {
            add_noise(input, out, self.noise_std, rng);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|v| v as f32 + 1.0).collect()
    }

    #[test]
    fn identity_params_are_identity() {
        let img = ramp(2 * 5 * 4);
        let mut out = vec![0.0; img.len()];
        apply_affine(&img, &[2, 5, 4], &AffineParams::IDENTITY, &mut out);
        assert_eq!(out, img);

        let aug = DigitsAugment {
            rotation_deg: 0.0,
            scale: (1.0, 1.0),
            shift_px: 0.0,
            noise_std: 0.0,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut out = vec![0.0; img.len()];
        aug.apply(&img, &[2, 5, 4], &mut out, &mut rng);
        assert_eq!(out, img);
    }

    #[test]
    fn rotation_by_90_degrees() {
        // 3x3 image with a single bright pixel at the top-middle (row 0, col 1).
        let mut img = vec![0.0f32; 9];
        img[1] = 1.0;
        let mut out = vec![0.0; 9];
        let p = AffineParams {
            angle_deg: 90.0,
            ..AffineParams::IDENTITY
        };
        apply_affine(&img, &[1, 3, 3], &p, &mut out);
        // +90° turns +x (right) into +y (down): top-middle goes to middle-right (row 1, col 2).
        let mut expected = vec![0.0f32; 9];
        expected[5] = 1.0;
        assert_eq!(out, expected);

        // Full 4x4 check: out[y][x] = in[W-1-x][y] for a clockwise quarter turn on screen.
        let img = ramp(16);
        let mut out = vec![0.0; 16];
        apply_affine(&img, &[4, 4], &p, &mut out);
        for y in 0..4 {
            for x in 0..4 {
                assert_eq!(out[y * 4 + x], img[(3 - x) * 4 + y], "({y}, {x})");
            }
        }
    }

    #[test]
    fn shift_pads_with_zero_and_scale_about_centre() {
        let img = ramp(9);
        let mut out = vec![0.0; 9];
        let p = AffineParams {
            shift_x: 1.0,
            ..AffineParams::IDENTITY
        };
        apply_affine(&img, &[3, 3], &p, &mut out);
        assert_eq!(out, vec![0.0, 1.0, 2.0, 0.0, 4.0, 5.0, 0.0, 7.0, 8.0]);

        // Scaling keeps the centre pixel fixed.
        let p = AffineParams {
            scale: 1.7,
            ..AffineParams::IDENTITY
        };
        apply_affine(&img, &[3, 3], &p, &mut out);
        assert_eq!(out[4], img[4]);
    }

    #[test]
    fn digits_augment_is_seeded_and_perturbs() {
        let aug = DigitsAugment::default();
        let img = ramp(64);
        let run = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut out = vec![0.0; 64];
            aug.apply(&img, &[1, 8, 8], &mut out, &mut rng);
            out
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        assert_ne!(run(1), img);
    }

    #[test]
    fn jitter_and_identity() {
        let x = [1.0f32, -2.0];
        let mut out = [0.0; 2];
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        Identity.apply(&x, &[2], &mut out, &mut rng);
        assert_eq!(out, x);
        let mut sum = 0.0f64;
        let mut sq = 0.0f64;
        let n = 20_000;
        for _ in 0..n {
            GaussianJitter::default().apply(&x, &[2], &mut out, &mut rng);
            let d = (out[0] - x[0]) as f64;
            sum += d;
            sq += d * d;
        }
        let mean = sum / n as f64;
        let std = (sq / n as f64 - mean * mean).sqrt();
        assert!(
            mean.abs() < 0.01 && (std - 0.15).abs() < 0.01,
            "{mean} {std}"
        );
    }
}
