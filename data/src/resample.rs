//! Antialiased resampling as PIL and torchvision (`antialias=True`) do it (docs/spec/data.md §3.3):
//! separable convolution per axis with the filter stretched by the scale factor when
//! downscaling, taps outside the image dropped and the rest renormalised. The convolution is
//! `fast_image_resize`'s port of Pillow's resampler, on `f32` planes, so both passes stay in
//! floating point and the result is rounded nowhere (torchvision's tensor behaviour).
//!
//! The result is clamped to `[0, 1]`, as PIL's 8-bit output is (and BYOL's clip): bicubic
//! rings past the input's range next to a sharp edge (a black pixel beside a saturated one comes
//! out slightly negative), and the colour ops after the crop assume intensities in `[0, 1]`
//! (RGB → HSV divides by the largest channel). torchvision's float-tensor path leaves the
//! overshoot; PIL-based pipelines (solo-learn, lightly) never see it.

use fast_image_resize::images::{TypedImage, TypedImageRef};
use fast_image_resize::pixels::F32;
use fast_image_resize::{FilterType, ResizeAlg, ResizeOptions, Resizer};
use serde::{Deserialize, Serialize};

use crate::stored::CropBox;

/// The resampling filter of a resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    /// Triangle filter, support 1 (torchvision's default; IConE, SwAV).
    #[default]
    Bilinear,
    /// Keys cubic with `a = −0.5`, support 2 (PIL's bicubic; solo-learn, DINO). Its overshoot
    /// past `[0, 1]` is clamped, as PIL's 8-bit output is.
    Bicubic,
}

impl Interpolation {
    fn filter(self) -> FilterType {
        match self {
            Self::Bilinear => FilterType::Bilinear,
            Self::Bicubic => FilterType::CatmullRom,
        }
    }
}

/// Resamples the `crop` of every `height × width` plane of `input` (`[C, H, W]`) to
/// `out_height × out_width`, writing `[C, out_height, out_width]` into `out`. As torchvision's
/// `resized_crop`, the crop is cut out first, so the filter's border taps stop at the crop's
/// edges (Pillow's `resize(box=…)` would reach past them). Every output value is clamped to
/// `[0, 1]`.
#[allow(clippy::too_many_arguments)]
pub fn resized_crop(
    input: &[f32],
    height: usize,
    width: usize,
    crop: CropBox,
    out_height: usize,
    out_width: usize,
    interpolation: Interpolation,
    out: &mut [f32],
) {
    assert!(
        crop.top + crop.height <= height && crop.left + crop.width <= width,
        "crop {crop:?} outside a {height}×{width} image"
    );
    let (plane, out_plane) = (height * width, out_height * out_width);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(interpolation.filter()));
    let mut resizer = Resizer::new();
    let mut pixels = Vec::with_capacity(crop.height * crop.width);
    let mut dst = TypedImage::<F32>::new(out_width as u32, out_height as u32);
    for (src, out) in input.chunks(plane).zip(out.chunks_mut(out_plane)) {
        pixels.clear();
        for row in src.chunks(width).skip(crop.top).take(crop.height) {
            pixels.extend(
                row[crop.left..crop.left + crop.width]
                    .iter()
                    .map(|&v| F32::new(v)),
            );
        }
        let src = TypedImageRef::new(crop.width as u32, crop.height as u32, &pixels)
            .expect("a crop of height × width pixels");
        resizer
            .resize_typed(&src, &mut dst, &options)
            .expect("source and destination of one pixel type");
        for (o, p) in out.iter_mut().zip(dst.pixels()) {
            *o = p.0.clamp(0.0, 1.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_with_the_triangle_filter_averages_pixel_pairs() {
        // Downscaling by 2: the filter stretches to support 2, taps at ±0.5 weigh 3/8 and the
        // outer ±1.5 taps 1/8 (renormalised at the borders).
        let input: Vec<f32> = (0..8).map(|i| i as f32 / 8.0).collect();
        let mut out = vec![0f32; 4];
        let crop = CropBox {
            top: 0,
            left: 0,
            height: 1,
            width: 8,
        };
        resized_crop(&input, 1, 8, crop, 1, 4, Interpolation::Bilinear, &mut out);
        let first = (0.0 * 3.0 + 1.0 * 3.0 + 2.0) / 7.0 / 8.0;
        assert!((out[0] - first).abs() < 1e-6, "{out:?}");
        assert!((out[1] - 2.5 / 8.0).abs() < 1e-6, "{out:?}");
        assert!((out[2] - 4.5 / 8.0).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn constant_planes_stay_constant_for_both_filters() {
        let input = [vec![0.3f32; 30], vec![0.7f32; 30]].concat();
        let crop = CropBox {
            top: 1,
            left: 2,
            height: 3,
            width: 4,
        };
        for interpolation in [Interpolation::Bilinear, Interpolation::Bicubic] {
            let mut out = vec![0f32; 2 * 7 * 9];
            resized_crop(&input, 5, 6, crop, 7, 9, interpolation, &mut out);
            assert!(out[..63].iter().all(|&v| (v - 0.3).abs() < 1e-6));
            assert!(out[63..].iter().all(|&v| (v - 0.7).abs() < 1e-6));
        }
    }
}
