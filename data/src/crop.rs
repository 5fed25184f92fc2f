//! Multi-crop local views (Caron et al., "Unsupervised Learning of Visual Features by Contrasting
//! Cluster Assignments", NeurIPS 2020, §3.2; DINO's local crops): a random resized crop of a
//! small area of the image, resized to a smaller side, then the run's per-view transform.
//!
//! The crop box follows torchvision's `RandomResizedCrop.get_params` (`docs/spec/data.md` §3):
//! up to ten draws of area fraction `U(scale)` and log-uniform aspect ratio, sides rounded half
//! to even as Python's `round`, and the centre-crop fallback.
//! The crop is resampled as torchvision's `resized_crop` does ([`crate::resample`]: antialiased
//! bilinear by default, bicubic for DINO).
//!
//! Crops of a stored 8-bit image of its own size (a folder kept at full resolution,
//! [`crate::Samples::Images`]) read only the box's pixels: [`resized_image_crop`], and
//! [`resize_center_crop`] for the evaluation view.

use std::sync::Arc;

use anyhow::{bail, Result};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::augment::ViewTransform;
use crate::resample::{resized_crop, Interpolation};
use crate::stored::{CropBox, StoredImage};

/// torchvision's `RandomResizedCrop.get_params` for an `h × w` image.
pub fn random_resized_crop_box(
    h: usize,
    w: usize,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut ChaCha8Rng,
) -> CropBox {
    let area = (h * w) as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.random_range(scale.0..=scale.1);
        let aspect = rng.random_range(log_lo..=log_hi).exp();
        let cw = (target_area * aspect).sqrt().round_ties_even() as usize;
        let ch = (target_area / aspect).sqrt().round_ties_even() as usize;
        if 0 < cw && cw <= w && 0 < ch && ch <= h {
            return CropBox {
                top: rng.random_range(0..=h - ch),
                left: rng.random_range(0..=w - cw),
                height: ch,
                width: cw,
            };
        }
    }
    let in_ratio = w as f64 / h as f64;
    let (ch, cw) = if in_ratio < ratio.0.min(ratio.1) {
        (
            (w as f64 / ratio.0.min(ratio.1)).round_ties_even() as usize,
            w,
        )
    } else if in_ratio > ratio.0.max(ratio.1) {
        (
            h,
            (h as f64 * ratio.0.max(ratio.1)).round_ties_even() as usize,
        )
    } else {
        (h, w)
    };
    CropBox {
        top: (h - ch) / 2,
        left: (w - cw) / 2,
        height: ch,
        width: cw,
    }
}

/// Round half to even of `x / 2` (torchvision's centre-crop offset `round((H − S)/2)`, spec
/// data §2.2).
pub(crate) fn half_rounded_even(x: usize) -> usize {
    let (half, odd) = (x / 2, x % 2 == 1);
    if odd && half % 2 == 1 {
        half + 1
    } else {
        half
    }
}

/// The `(height, width)` of torchvision's `Resize(size)` of a `height × width` image: the shorter
/// side becomes `size`, the longer `int(size · long / short)` (truncated).
pub(crate) fn shorter_side_to(height: usize, width: usize, size: usize) -> (usize, usize) {
    if width <= height {
        (size * height / width, size)
    } else {
        (size, size * width / height)
    }
}

/// The `crop` of `image` as `[C, crop.height, crop.width]` values `v / 255`.
fn crop_planes(image: StoredImage, crop: CropBox) -> Vec<f32> {
    let c = image.channels;
    let plane = crop.height * crop.width;
    let mut planes = vec![0f32; c * plane];
    for y in 0..crop.height {
        let start = ((crop.top + y) * image.width + crop.left) * c;
        let row = &image.pixels[start..start + crop.width * c];
        for (x, pixel) in row.chunks_exact(c).enumerate() {
            for (ch, &v) in pixel.iter().enumerate() {
                planes[ch * plane + y * crop.width + x] = f32::from(v) / 255.0;
            }
        }
    }
    planes
}

/// The `crop` of a stored image resampled to `[C, size, size]` in `out`, as
/// [`resized_crop`] does it on the image read as `[C, H, W]` values `v / 255`.
pub fn resized_image_crop(
    image: StoredImage,
    crop: CropBox,
    size: usize,
    interpolation: Interpolation,
    out: &mut [f32],
) {
    let planes = crop_planes(image, crop);
    let whole = CropBox {
        top: 0,
        left: 0,
        ..crop
    };
    resized_crop(
        &planes,
        crop.height,
        crop.width,
        whole,
        size,
        size,
        interpolation,
        out,
    );
}

/// torchvision's evaluation view of a stored image (spec data §2.2): `Resize(size)` (shorter side
/// to `size`, antialiased bilinear; none when it is `size` already), then `CenterCrop(size)` with
/// offsets rounded half to even, written to `out` as `[C, size, size]`.
pub fn resize_center_crop(image: StoredImage, size: usize, out: &mut [f32]) {
    let (h, w) = (image.height, image.width);
    let (nh, nw) = shorter_side_to(h, w, size);
    let (top, left) = (half_rounded_even(nh - size), half_rounded_even(nw - size));
    let centre = CropBox {
        top,
        left,
        height: size,
        width: size,
    };
    if (nh, nw) == (h, w) {
        out.copy_from_slice(&crop_planes(image, centre));
        return;
    }
    let whole = CropBox {
        top: 0,
        left: 0,
        height: h,
        width: w,
    };
    let mut resized = vec![0f32; image.channels * nh * nw];
    resized_crop(
        &crop_planes(image, whole),
        h,
        w,
        whole,
        nh,
        nw,
        Interpolation::Bilinear,
        &mut resized,
    );
    for (resized, out) in resized
        .chunks_exact(nh * nw)
        .zip(out.chunks_exact_mut(size * size))
    {
        for (y, row) in out.chunks_exact_mut(size).enumerate() {
            let start = (top + y) * nw + left;
            row.copy_from_slice(&resized[start..start + size]);
        }
    }
}

/// A random resized crop at `size × size`, then `then` (a per-view transform) at that size:
/// multi-crop's local views, and the global views of a data set of stored images (a 2D
/// pipeline's own crop drawn on the stored image, [`crate::ViewType::from_image`]).
#[derive(Clone)]
pub struct LocalCrop {
    /// Side of the local view in pixels.
    pub size: usize,
    /// Range of the crop's area as a fraction of the image (DINO: `(0.05, 0.4)`).
    pub scale: (f64, f64),
    /// Range of the crop's aspect ratio (torchvision: `(3/4, 4/3)`).
    pub ratio: (f64, f64),
    /// Resampling filter of the crop's resize.
    pub interpolation: Interpolation,
    /// Applied to the resized crop.
    pub then: Arc<dyn ViewTransform>,
}

impl LocalCrop {
    /// DINO's local crops (`scale (0.05, 0.4)`, ratio `(3/4, 4/3)`) of side `size`.
    pub fn new(size: usize, scale: (f64, f64), then: Arc<dyn ViewTransform>) -> Self {
        Self {
            size,
            scale,
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            interpolation: Interpolation::Bilinear,
            then,
        }
    }

    /// The shape of a local view of a sample of shape `shape`, or an error naming why this data
    /// has no local crops.
    pub fn output_shape(&self, shape: &[usize]) -> Result<Vec<usize>> {
        if !(shape.len() == 2 || shape.len() == 3) {
            bail!(
                "local crops need 2D images ([C, H, W]), but samples have shape {shape:?}; \
                 train without --local-views on this data"
            );
        }
        if self.size == 0 {
            bail!("the local crop size must be at least 1 pixel");
        }
        if !(0.0 < self.scale.0 && self.scale.0 <= self.scale.1 && self.scale.1 <= 1.0) {
            bail!(
                "the local crop scale must satisfy 0 < min ≤ max ≤ 1, got {:?}",
                self.scale
            );
        }
        let mut out = shape.to_vec();
        let n = out.len();
        out[n - 2] = self.size;
        out[n - 1] = self.size;
        Ok(out)
    }

    /// Writes one local view of `input` (shape `shape`) into `out` (the length of
    /// [`Self::output_shape`]), drawing from `rng` only.
    pub fn apply(&self, input: &[f32], shape: &[usize], out: &mut [f32], rng: &mut ChaCha8Rng) {
        let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        let crop = random_resized_crop_box(h, w, self.scale, self.ratio, rng);
        let mut resized = vec![0f32; input.len() / (h * w) * self.size * self.size];
        resized_crop(
            input,
            h,
            w,
            crop,
            self.size,
            self.size,
            self.interpolation,
            &mut resized,
        );
        let mut local_shape = shape.to_vec();
        let n = local_shape.len();
        local_shape[n - 2] = self.size;
        local_shape[n - 1] = self.size;
        self.then.apply(&resized, &local_shape, out, rng);
    }

    /// Writes one view of a stored image into `out` (`[C, size, size]`): the crop box drawn on
    /// the image's own `height × width`, only its pixels read, then `then`; the same draws from
    /// `rng` as [`Self::apply`].
    pub fn apply_to_image(&self, image: StoredImage, out: &mut [f32], rng: &mut ChaCha8Rng) {
        let crop = random_resized_crop_box(image.height, image.width, self.scale, self.ratio, rng);
        let mut resized = vec![0f32; image.channels * self.size * self.size];
        resized_image_crop(image, crop, self.size, self.interpolation, &mut resized);
        let shape = [image.channels, self.size, self.size];
        self.then.apply(&resized, &shape, out, rng);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::augment::Identity;
    use rand::SeedableRng;

    #[test]
    fn crop_boxes_stay_inside_and_cover_the_scale_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let (h, w) = (64, 48);
        let mut fractions = Vec::new();
        for _ in 0..2000 {
            let b = random_resized_crop_box(h, w, (0.05, 0.4), (0.75, 4.0 / 3.0), &mut rng);
            assert!(b.height > 0 && b.width > 0);
            assert!(b.top + b.height <= h && b.left + b.width <= w, "{b:?}");
            let ratio = b.width as f64 / b.height as f64;
            // Rounding each side to whole pixels moves the ratio a little past the range.
            assert!((0.6..=1.6).contains(&ratio), "{b:?}");
            fractions.push((b.height * b.width) as f64 / (h * w) as f64);
        }
        let (lo, hi) = fractions
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &f| (a.min(f), b.max(f)));
        assert!((0.04..0.07).contains(&lo), "smallest area fraction {lo}");
        assert!((0.36..0.45).contains(&hi), "largest area fraction {hi}");
    }

    #[test]
    fn impossible_scales_fall_back_to_the_centre_crop() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        // Aspect ratios of at least 4 never fit a 10 × 10 image at 90 % of its area; the
        // fallback's height 10/4 = 2.5 rounds half to even, as Python's `round` does.
        let b = random_resized_crop_box(10, 10, (0.9, 0.9), (4.0, 5.0), &mut rng);
        assert_eq!(
            b,
            CropBox {
                top: 4,
                left: 0,
                height: 2,
                width: 10
            }
        );
    }

    #[test]
    fn full_box_at_the_same_size_is_the_identity() {
        // Values in [0, 1], exact in binary (resampling clamps to [0, 1]).
        let img: Vec<f32> = (0..2 * 5 * 5).map(|v| v as f32 / 64.0).collect();
        let full = CropBox {
            top: 0,
            left: 0,
            height: 5,
            width: 5,
        };
        let resize = |crop: CropBox, size: usize| {
            let mut out = vec![0f32; 2 * size * size];
            resized_crop(
                &img,
                5,
                5,
                crop,
                size,
                size,
                Interpolation::Bilinear,
                &mut out,
            );
            out
        };
        assert_eq!(resize(full, 5), img);
        let corner = CropBox {
            top: 1,
            left: 2,
            height: 2,
            width: 2,
        };
        assert_eq!(
            resize(corner, 2),
            [7.0, 8.0, 12.0, 13.0, 32.0, 33.0, 37.0, 38.0].map(|v: f32| v / 64.0)
        );
    }

    #[test]
    fn local_views_have_the_local_shape_and_refuse_non_images() {
        let crop = LocalCrop::new(6, (0.05, 0.4), Arc::new(Identity));
        assert_eq!(crop.output_shape(&[1, 16, 16]).unwrap(), vec![1, 6, 6]);
        let err = crop.output_shape(&[2]).unwrap_err().to_string();
        assert!(err.contains("--local-views"), "{err}");
        let bad = LocalCrop::new(6, (0.5, 0.2), Arc::new(Identity));
        assert!(bad.output_shape(&[1, 16, 16]).is_err());
        let img: Vec<f32> = (0..256).map(|v| v as f32).collect();
        let mut out = vec![0.0; 36];
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        crop.apply(&img, &[1, 16, 16], &mut out, &mut rng);
        assert!(out.iter().all(|v| (0.0..256.0).contains(v)));
    }
}
