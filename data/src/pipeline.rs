//! torchvision-style 2D augmentation pipelines (docs/spec/data.md §3) and the seeds' named recipes
//! (§3.10).
//!
//! An [`ImageAugment`] is one view type: random resized crop → horizontal flip → colour jitter
//! (the four ops in a random order) → grayscale → Gaussian blur → solarisation → normalisation,
//! each applied with its own probability. [`ImageAugment::sample`] draws a view's parameters
//! ([`ImageViewParams`]: crop box, flip, jitter order and factors, blur σ, …) and
//! [`ImageAugment::apply_params`] applies them deterministically, so the parameters can be fixed
//! to compare against torchvision (`data/tests/torchvision.rs`). The flip commutes with every
//! other op, so its place in the order does not change the distribution (§3.9).
//!
//! A [`Recipe`] names every augmentation a run can select (`data.augment`): the seeds' 2D
//! recipes as a [`Pipeline`] of view types — view `v` of an instance uses view type `v mod n`
//! (BYOL's asymmetric pair gives V/2 views of each type, as FroSSL does for V > 2), and
//! multi-crop recipes add the local views' type — IConE's 3D pipeline, and the simple
//! transforms of the digits and the Gaussian mixture.
//!
//! On a folder kept at full resolution ([`crate::Samples::Images`]) a view type's random
//! resized crop is drawn on the stored image's own `H × W` (torchvision's algorithm, §3.2) and
//! resized to `S × S`; flip, jitter, grayscale, blur, solarisation and normalisation then follow
//! unchanged ([`Pipeline::view_types`]'s [`ViewType::from_image`]).

use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::augment::{DigitsAugment, GaussianJitter, Identity, ViewTransform};
use crate::blur::{blur_kernel_size, gaussian_blur};
use crate::color::{
    adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation, grayscale, solarize,
    Normalization,
};
use crate::crop::{random_resized_crop_box, LocalCrop};
use crate::loader::ViewType;
use crate::resample::{resized_crop, Interpolation};
use crate::stored::CropBox;
use crate::volume::VolumeAugment;

/// One view type of a 2D pipeline; defaults are torchvision's (`RandomResizedCrop` scale
/// `(0.08, 1)`, ratio `(3/4, 4/3)`, bilinear; flip 0.5) with every colour op off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageAugment {
    /// Area fraction range of the random resized crop; `None` keeps the whole image (the
    /// local views of multi-crop, which are cropped before).
    pub crop_scale: Option<(f64, f64)>,
    /// Aspect-ratio range (width / height) of the crop.
    pub crop_ratio: (f64, f64),
    /// Resampling filter of the crop's resize.
    pub interpolation: Interpolation,
    /// Horizontal flip probability.
    pub flip: f64,
    /// ColorJitter strengths (brightness, contrast, saturation, hue); 0 disables an op.
    pub jitter: [f32; 4],
    /// Probability of applying the colour jitter.
    pub jitter_p: f64,
    /// RandomGrayscale probability.
    pub grayscale: f64,
    /// Gaussian blur probability.
    pub blur: f64,
    /// Range of the blur's σ (drawn uniformly per view).
    pub blur_sigma: (f32, f32),
    /// Blur kernel taps; 0: `2⌊S/20⌋ + 1` of the image side `S` (23 at 224).
    pub blur_kernel: usize,
    /// Solarisation probability (threshold 0.5).
    pub solarize: f64,
    /// Normalisation applied last.
    pub normalize: Normalization,
}

impl Default for ImageAugment {
    fn default() -> Self {
        Self {
            crop_scale: Some((0.08, 1.0)),
            crop_ratio: (3.0 / 4.0, 4.0 / 3.0),
            interpolation: Interpolation::Bilinear,
            flip: 0.5,
            jitter: [0.0; 4],
            jitter_p: 0.0,
            grayscale: 0.0,
            blur: 0.0,
            blur_sigma: (0.1, 2.0),
            blur_kernel: 0,
            solarize: 0.0,
            normalize: Normalization::None,
        }
    }
}

/// One colour-jitter op with its drawn factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JitterOp {
    Brightness(f32),
    Contrast(f32),
    Saturation(f32),
    Hue(f32),
}

/// Everything random about one view.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageViewParams {
    /// Crop box; `None`: the whole image, unresized.
    pub crop: Option<CropBox>,
    pub flip: bool,
    /// Jitter ops in the order they are applied (empty: no jitter).
    pub jitter: Vec<JitterOp>,
    pub grayscale: bool,
    /// Blur σ when blurred.
    pub blur_sigma: Option<f32>,
    pub solarize: bool,
}

impl ImageAugment {
    /// Draws one view's parameters for an image of `height × width`, in a fixed order: crop
    /// box, flip, jitter (apply?, order, factors b, c, s, h), grayscale, blur (apply?, σ),
    /// solarise.
    pub fn sample(&self, height: usize, width: usize, rng: &mut ChaCha8Rng) -> ImageViewParams {
        let crop = self
            .crop_scale
            .map(|scale| random_resized_crop_box(height, width, scale, self.crop_ratio, rng));
        let flip = rng.random::<f64>() < self.flip;
        let mut jitter = Vec::new();
        if rng.random::<f64>() < self.jitter_p {
            let mut order = [0usize, 1, 2, 3];
            order.shuffle(rng);
            let [b, c, s, h] = self.jitter;
            let factor =
                |v: f32, rng: &mut ChaCha8Rng| rng.random_range((1.0 - v).max(0.0)..=1.0 + v);
            let ops = [
                (b > 0.0).then(|| JitterOp::Brightness(factor(b, rng))),
                (c > 0.0).then(|| JitterOp::Contrast(factor(c, rng))),
                (s > 0.0).then(|| JitterOp::Saturation(factor(s, rng))),
                (h > 0.0).then(|| JitterOp::Hue(rng.random_range(-h..=h))),
            ];
            jitter = order.iter().filter_map(|&i| ops[i]).collect();
        }
        let grayscale = rng.random::<f64>() < self.grayscale;
        let blur_sigma = (rng.random::<f64>() < self.blur).then(|| {
            let (lo, hi) = self.blur_sigma;
            rng.random_range(lo..=hi)
        });
        let solarize = rng.random::<f64>() < self.solarize;
        ImageViewParams {
            crop,
            flip,
            jitter,
            grayscale,
            blur_sigma,
            solarize,
        }
    }

    /// Applies `params` to `input` (`[C, H, W]`, values in `[0, 1]`), writing a view of the
    /// same shape into `out`.
    pub fn apply_params(
        &self,
        input: &[f32],
        shape: &[usize],
        params: &ImageViewParams,
        out: &mut [f32],
    ) {
        let (channels, height, width) = image_dims(shape);
        match params.crop {
            Some(crop) => resized_crop(
                input,
                height,
                width,
                crop,
                height,
                width,
                self.interpolation,
                out,
            ),
            None => out.copy_from_slice(input),
        }
        if params.flip {
            for row in out.chunks_mut(width) {
                row.reverse();
            }
        }
        for op in &params.jitter {
            match *op {
                JitterOp::Brightness(f) => adjust_brightness(out, f),
                JitterOp::Contrast(f) => adjust_contrast(out, channels, f),
                JitterOp::Saturation(f) => adjust_saturation(out, channels, f),
                JitterOp::Hue(f) => adjust_hue(out, channels, f),
            }
        }
        if params.grayscale {
            grayscale(out, channels);
        }
        if let Some(sigma) = params.blur_sigma {
            let taps = match self.blur_kernel {
                0 => blur_kernel_size(height.min(width)),
                k => k,
            };
            if taps > 1 {
                gaussian_blur(out, height, width, taps, sigma);
            }
        }
        if params.solarize {
            solarize(out, 0.5);
        }
        self.normalize.apply(out, channels);
    }

    /// Checks the ranges and that the blur fits images of `shape`.
    pub fn validate(&self, shape: &[usize]) -> anyhow::Result<()> {
        use anyhow::bail;
        if shape.len() != 3 {
            bail!("image augmentations need [C, H, W] samples, got shape {shape:?}");
        }
        let (_, h, w) = image_dims(shape);
        if let Some((lo, hi)) = self.crop_scale {
            if !(0.0 < lo && lo <= hi && hi <= 1.0) {
                bail!("crop_scale must satisfy 0 < min ≤ max ≤ 1, got ({lo}, {hi})");
            }
        }
        let (r0, r1) = self.crop_ratio;
        if !(0.0 < r0 && r0 <= r1) {
            bail!("crop_ratio must satisfy 0 < min ≤ max, got ({r0}, {r1})");
        }
        for (name, p) in [
            ("flip", self.flip),
            ("jitter_p", self.jitter_p),
            ("grayscale", self.grayscale),
            ("blur", self.blur),
            ("solarize", self.solarize),
        ] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{name} is a probability in [0, 1], got {p}");
            }
        }
        if self.jitter.iter().any(|v| v.is_nan() || *v < 0.0) || self.jitter[3] > 0.5 {
            bail!(
                "jitter strengths must be ≥ 0 and the hue's ≤ 0.5, got {:?}",
                self.jitter
            );
        }
        let (s0, s1) = self.blur_sigma;
        if !(0.0 < s0 && s0 <= s1) {
            bail!("blur_sigma must satisfy 0 < min ≤ max, got ({s0}, {s1})");
        }
        if self.blur_kernel != 0
            && (self.blur_kernel.is_multiple_of(2) || self.blur_kernel / 2 >= h.min(w))
        {
            bail!(
                "blur_kernel must be odd and below twice the image side ({h}×{w}), got {}; \
                 0 picks 2⌊S/20⌋ + 1",
                self.blur_kernel
            );
        }
        Ok(())
    }
}

fn image_dims(shape: &[usize]) -> (usize, usize, usize) {
    match *shape {
        [c, h, w] => (c, h, w),
        _ => panic!("image augmentations need [C, H, W] samples, got shape {shape:?}"),
    }
}

impl ViewTransform for ImageAugment {
    fn apply(&self, input: &[f32], shape: &[usize], out: &mut [f32], rng: &mut ChaCha8Rng) {
        let (_, h, w) = image_dims(shape);
        let params = self.sample(h, w, rng);
        self.apply_params(input, shape, &params, out);
    }
}

/// The view types of a 2D recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// View `v` uses `views[v % views.len()]`.
    pub views: Vec<ImageAugment>,
    /// Multi-crop local views' type, applied after the local crop (whose scale is the run's
    /// `train.local_scale`, by default [`Recipe::local_crop_scale`]).
    pub local: Option<ImageAugment>,
}

/// The transforms of a run: one per view type, and the local views' (if any).
#[derive(Clone)]
pub struct ViewTypes {
    /// View `v` uses `views[v % views.len()]`.
    pub views: Vec<ViewType>,
    /// Applied to multi-crop local views after their crop, with the crop's filter.
    pub local: (Arc<dyn ViewTransform>, Interpolation),
}

impl ViewTypes {
    /// Every view, local ones included, from the one transform `t`.
    pub fn single(t: Arc<dyn ViewTransform>) -> Self {
        Self {
            views: vec![ViewType::from(t.clone())],
            local: (t, Interpolation::Bilinear),
        }
    }
}

/// Every augmentation a run can select by name (`data.augment`); the 2D recipes follow spec
/// data §3.10.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recipe {
    /// The digits' random affine (rotation, scale, translation) and pixel noise.
    Digits,
    /// Additive Gaussian noise, σ = 0.15 (IConE's 2-D mixture, App. E).
    Noise,
    /// No augmentation: every view is the input.
    None,
    /// IConE App. A.2: crop scale (0.2, 1), flip, jitter (0.4, 0.4, 0.4, 0.1) p 0.8,
    /// grayscale 0.2, blur p 0.5 (k 23 at 224), bilinear.
    Icone,
    /// solo-learn's `symmetric` (SimCLR, SwAV): scale (0.08, 1), jitter (0.8, 0.8, 0.8, 0.2)
    /// p 0.8, grayscale 0.2, blur 0.5, bicubic.
    Simclr,
    /// FroSSL's default on CIFAR, STL-10 and ImageNet-100: solo-learn's `symmetric`.
    Frossl,
    /// solo-learn's `symmetric_weak` (MoCo v2+, SimSiam): jitter (0.4, 0.4, 0.4, 0.1).
    MocoV2,
    /// BYOL's asymmetric pair: jitter (0.4, 0.4, 0.2, 0.1) p 0.8, grayscale 0.2; blur 1.0 /
    /// 0.1, solarise 0 / 0.2; bicubic.
    Byol,
    /// solo-learn's `vicreg`: scale (0.2, 1), jitter (0.4, 0.4, 0.2, 0.1) p 0.8, grayscale
    /// 0.2, blur 0.5, solarise 0.1.
    Vicreg,
    /// DINO's multi-crop: globals scale (0.4, 1) with blur 1.0 / 0.1 + solarise 0 / 0.2,
    /// locals scale (0.05, 0.4) with blur 0.5; jitter (0.4, 0.4, 0.2, 0.1) p 0.8; bicubic.
    Dino,
    /// SwAV's multi-crop: globals scale (0.14, 1), locals (0.05, 0.14); jitter
    /// (0.8, 0.8, 0.8, 0.2) p 0.8, grayscale 0.2, blur 0.5; bilinear.
    Swav,
    /// IConE's 3D pipeline (App. A.2, [`VolumeAugment`]'s defaults) for `[C, D, H, W]` volumes.
    Icone3d,
}

impl Recipe {
    /// Every name, as configs spell them.
    pub const NAMES: [&'static str; 12] = [
        "digits", "noise", "none", "icone", "simclr", "frossl", "moco-v2", "byol", "vicreg",
        "dino", "swav", "icone3d",
    ];

    /// The normalisation the recipe's papers use: ImageNet's for the photo recipes, none for
    /// the digits, the mixture and volumes.
    pub fn default_normalization(self) -> Normalization {
        match self.pipeline(Normalization::None) {
            Some(_) => Normalization::Imagenet,
            None => Normalization::None,
        }
    }

    /// The recipe's transforms for samples of `shape`, or an error naming why they do not fit
    /// (a 2D recipe on volumes, a blur larger than the image, …).
    pub fn view_types(
        self,
        normalize: Normalization,
        shape: &[usize],
    ) -> anyhow::Result<ViewTypes> {
        if let Some(pipeline) = self.pipeline(normalize) {
            return pipeline.view_types(shape);
        }
        let one = ViewTypes::single;
        Ok(match self {
            Self::Digits => one(Arc::new(DigitsAugment::default())),
            Self::Noise => one(Arc::new(GaussianJitter::default())),
            Self::Icone3d => VolumeAugment::default().view_types(shape)?,
            _ => one(Arc::new(Identity)),
        })
    }

    /// Area range of multi-crop local crops under this recipe (the run's `train.local_scale`
    /// unless set): SwAV's `[0.05, 0.14]`, else DINO's `[0.05, 0.4]`.
    pub fn local_crop_scale(self) -> (f64, f64) {
        match self {
            Self::Swav => (0.05, 0.14),
            _ => (0.05, 0.4),
        }
    }

    /// The 2D recipe's view types normalising with `normalize`; `None` for the others.
    pub fn pipeline(self, normalize: Normalization) -> Option<Pipeline> {
        let base = ImageAugment {
            normalize,
            ..ImageAugment::default()
        };
        let colour = |jitter: [f32; 4], interpolation| ImageAugment {
            jitter,
            jitter_p: 0.8,
            grayscale: 0.2,
            blur: 0.5,
            interpolation,
            ..base.clone()
        };
        let symmetric = colour([0.8, 0.8, 0.8, 0.2], Interpolation::Bicubic);
        let asymmetric = |scale| {
            let first = ImageAugment {
                crop_scale: Some(scale),
                blur: 1.0,
                ..colour([0.4, 0.4, 0.2, 0.1], Interpolation::Bicubic)
            };
            let second = ImageAugment {
                blur: 0.1,
                solarize: 0.2,
                ..first.clone()
            };
            vec![first, second]
        };
        Some(match self {
            Self::Digits | Self::Noise | Self::None | Self::Icone3d => return None,
            Self::Icone => Pipeline {
                views: vec![ImageAugment {
                    crop_scale: Some((0.2, 1.0)),
                    ..colour([0.4, 0.4, 0.4, 0.1], Interpolation::Bilinear)
                }],
                local: None,
            },
            Self::Simclr | Self::Frossl => Pipeline {
                views: vec![symmetric],
                local: None,
            },
            Self::MocoV2 => Pipeline {
                views: vec![colour([0.4, 0.4, 0.4, 0.1], Interpolation::Bicubic)],
                local: None,
            },
            Self::Byol => Pipeline {
                views: asymmetric((0.08, 1.0)),
                local: None,
            },
            Self::Vicreg => Pipeline {
                views: vec![ImageAugment {
                    crop_scale: Some((0.2, 1.0)),
                    solarize: 0.1,
                    ..colour([0.4, 0.4, 0.2, 0.1], Interpolation::Bicubic)
                }],
                local: None,
            },
            Self::Dino => Pipeline {
                views: asymmetric((0.4, 1.0)),
                local: Some(ImageAugment {
                    crop_scale: None,
                    ..colour([0.4, 0.4, 0.2, 0.1], Interpolation::Bicubic)
                }),
            },
            Self::Swav => {
                let view = ImageAugment {
                    crop_scale: Some((0.14, 1.0)),
                    ..colour([0.8, 0.8, 0.8, 0.2], Interpolation::Bilinear)
                };
                let local = ImageAugment {
                    crop_scale: None,
                    ..view.clone()
                };
                Pipeline {
                    views: vec![view],
                    local: Some(local),
                }
            }
        })
    }
}

impl Pipeline {
    /// The view types as transforms, checked against samples of `shape` (`[C, H, W]`). For
    /// square samples (`[C, S, S]`) a view type with a crop also crops stored images of their
    /// own size: the same crop at side `S`, then the view type without its crop.
    pub fn view_types(&self, shape: &[usize]) -> anyhow::Result<ViewTypes> {
        for view in self.views.iter().chain(&self.local) {
            view.validate(shape)?;
        }
        let local = self.local.as_ref().unwrap_or(&self.views[0]);
        let from_image = |v: &ImageAugment| match (v.crop_scale, shape) {
            (Some(scale), &[_, h, w]) if h == w => Some(LocalCrop {
                size: w,
                scale,
                ratio: v.crop_ratio,
                interpolation: v.interpolation,
                then: Arc::new(ImageAugment {
                    crop_scale: None,
                    ..v.clone()
                }),
            }),
            _ => None,
        };
        Ok(ViewTypes {
            views: self
                .views
                .iter()
                .map(|v| ViewType {
                    transform: Arc::new(v.clone()),
                    from_image: from_image(v),
                })
                .collect(),
            local: (
                Arc::new(ImageAugment {
                    crop_scale: None,
                    ..local.clone()
                }),
                local.interpolation,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn sampled_parameters_follow_the_probabilities_and_ranges() {
        let aug = Recipe::Icone.pipeline(Normalization::None).unwrap().views[0].clone();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let n = 4000;
        let (mut flips, mut jitters, mut greys, mut blurs) = (0, 0, 0, 0);
        for _ in 0..n {
            let p = aug.sample(64, 64, &mut rng);
            let crop = p.crop.unwrap();
            let area = (crop.height * crop.width) as f64 / 4096.0;
            assert!((0.17..=1.0).contains(&area), "{crop:?}");
            flips += p.flip as usize;
            greys += p.grayscale as usize;
            if let Some(s) = p.blur_sigma {
                assert!((0.1..=2.0).contains(&s));
                blurs += 1;
            }
            if !p.jitter.is_empty() {
                jitters += 1;
                assert_eq!(p.jitter.len(), 4);
                for op in &p.jitter {
                    match *op {
                        JitterOp::Hue(h) => assert!((-0.1..=0.1).contains(&h)),
                        JitterOp::Brightness(f)
                        | JitterOp::Contrast(f)
                        | JitterOp::Saturation(f) => assert!((0.6..=1.4).contains(&f)),
                    }
                }
            }
        }
        let rate = |k: usize| k as f64 / n as f64;
        assert!((rate(flips) - 0.5).abs() < 0.03);
        assert!((rate(jitters) - 0.8).abs() < 0.03);
        assert!((rate(greys) - 0.2).abs() < 0.03);
        assert!((rate(blurs) - 0.5).abs() < 0.03);
    }

    #[test]
    fn jitter_orders_are_uniform_over_the_permutations() {
        let aug = ImageAugment {
            jitter: [0.4, 0.4, 0.4, 0.1],
            jitter_p: 1.0,
            ..ImageAugment::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut first_is_hue = 0;
        for _ in 0..2400 {
            let p = aug.sample(8, 8, &mut rng);
            first_is_hue += matches!(p.jitter[0], JitterOp::Hue(_)) as usize;
        }
        assert!((first_is_hue as f64 / 2400.0 - 0.25).abs() < 0.03);
    }

    #[test]
    fn asymmetric_recipes_alternate_their_view_types() {
        let byol = Recipe::Byol.pipeline(Normalization::Imagenet).unwrap();
        assert_eq!(byol.views.len(), 2);
        assert_eq!((byol.views[0].blur, byol.views[1].blur), (1.0, 0.1));
        assert_eq!((byol.views[0].solarize, byol.views[1].solarize), (0.0, 0.2));
        assert!(byol
            .views
            .iter()
            .all(|v| v.validate(&[3, 224, 224]).is_ok()));
        let dino = Recipe::Dino
            .view_types(Normalization::Imagenet, &[3, 32, 32])
            .unwrap();
        assert_eq!(
            (dino.views.len(), dino.local.1),
            (2, Interpolation::Bicubic)
        );
        let err = Recipe::Dino
            .view_types(Normalization::Imagenet, &[1, 8, 8, 8])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("[C, H, W]"), "{err}");
        assert!(Recipe::Icone3d
            .view_types(Normalization::None, &[1, 8, 8, 8])
            .is_ok());
        for name in Recipe::NAMES {
            let recipe: Recipe = serde_yaml::from_str(name).unwrap();
            assert_eq!(serde_yaml::to_string(&recipe).unwrap().trim(), name);
        }
    }

    #[test]
    fn validation_names_the_bad_field() {
        let bad = ImageAugment {
            grayscale: 1.5,
            ..ImageAugment::default()
        };
        let err = bad.validate(&[3, 32, 32]).unwrap_err().to_string();
        assert!(err.contains("grayscale"), "{err}");
        let big_blur = ImageAugment {
            blur_kernel: 41,
            ..ImageAugment::default()
        };
        assert!(big_blur.validate(&[3, 16, 16]).is_err());
    }
}
