//! Property test: every view of every `data.augment` recipe is finite, and a photo recipe's view
//! is in `[0, 1]` before normalisation, on images that real collections contain and that ring
//! under resampling: flat, black, white, a few saturated primaries on black (fluorescence
//! microscopy, photos with a black background), a one-pixel checkerboard, random.
//!
//! Two sweeps: each recipe's own draws (many seeds, global and multi-crop local views, both
//! from samples and from stored images), and every order of the four colour-jitter ops at
//! extreme factors after a bicubic upsampling crop, the case that used to divide by zero in
//! RGB → HSV. The recipes that add Gaussian noise by design (`digits`, `noise`, and IConE's
//! unclipped 3D intensity ops) are held to finiteness and to their analytic range without the
//! noise.

use std::sync::Arc;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssl_data::{
    CropBox, DigitsAugment, ImageAugment, ImageViewParams, Interpolation, JitterOp, LocalCrop,
    Normalization, Recipe, StoredImage, ViewTransform, VolumeAugment,
};

/// The adversarial images of `channels × side × side`, named, values in `[0, 1]`.
fn adversarial_images(channels: usize, side: usize) -> Vec<(&'static str, Vec<f32>)> {
    let plane = side * side;
    let n = channels * plane;
    let mut primaries = vec![0f32; n];
    // Isolated saturated pixels of each primary, and a white one, on black.
    for (k, (y, x)) in [(3, 4), (10, 20), (17, 9), (25, 25), (side / 2, side / 2)]
        .into_iter()
        .enumerate()
    {
        let (y, x) = (y % side, x % side);
        for c in 0..channels {
            let on = k % 4 == 3 || c == k % channels;
            primaries[c * plane + y * side + x] = if on { 1.0 } else { 0.0 };
        }
    }
    let checkerboard = (0..n)
        .map(|i| {
            let (c, p) = (i / plane, i % plane);
            ((p / side + p % side + c) % 2) as f32
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let random = (0..n).map(|_| rng.random::<f32>()).collect();
    vec![
        ("constant", vec![0.37; n]),
        ("black", vec![0.0; n]),
        ("white", vec![1.0; n]),
        ("saturated primaries on black", primaries),
        ("one-pixel checkerboard", checkerboard),
        ("random", random),
    ]
}

fn check_view(view: &[f32], range: (f32, f32), what: &str) {
    let (lo, hi) = range;
    if let Some((i, v)) = view
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && lo <= **v && **v <= hi))
    {
        panic!("{what}: value {v} at {i} is not finite in [{lo}, {hi}]");
    }
}

const UNIT: (f32, f32) = (0.0, 1.0);

#[test]
fn every_photo_recipe_gives_finite_views_in_the_unit_range() {
    for (channels, side) in [(3, 32), (1, 28)] {
        let shape = [channels, side, side];
        for image in adversarial_images(channels, side) {
            for name in Recipe::NAMES {
                let recipe: Recipe = serde_yaml::from_str(name).unwrap();
                if recipe.pipeline(Normalization::None).is_none() {
                    continue;
                }
                let types = recipe.view_types(Normalization::None, &shape).unwrap();
                let local = LocalCrop {
                    interpolation: types.local.1,
                    ..LocalCrop::new(12, recipe.local_crop_scale(), types.local.0.clone())
                };
                // Stored images lie `[H, W, C]` in 8 bits.
                let hwc: Vec<u8> = (0..image.1.len())
                    .map(|i| {
                        let (p, c) = (i / channels, i % channels);
                        (image.1[c * side * side + p] * 255.0).round() as u8
                    })
                    .collect();
                let stored = StoredImage {
                    channels,
                    height: side,
                    width: side,
                    pixels: &hwc,
                };
                for seed in 0..40 {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed);
                    let what = format!("{name} on {} ({channels}×{side}²)", image.0);
                    let mut out = vec![0f32; image.1.len()];
                    for view in &types.views {
                        view.transform.apply(&image.1, &shape, &mut out, &mut rng);
                        check_view(&out, UNIT, &format!("{what}, global view"));
                        if let Some(from_image) = &view.from_image {
                            from_image.apply_to_image(stored, &mut out, &mut rng);
                            check_view(&out, UNIT, &format!("{what}, stored-image view"));
                        }
                    }
                    let mut small = vec![0f32; channels * 12 * 12];
                    local.apply(&image.1, &shape, &mut small, &mut rng);
                    check_view(&small, UNIT, &format!("{what}, local view"));
                }
            }
        }
    }
}

/// Every order of the four jitter ops at the recipes' extreme factors, after a bicubic crop
/// that upsamples a 6 × 6 box (the strongest ringing), with and without grayscale, blur and
/// solarisation.
#[test]
fn every_jitter_order_after_a_bicubic_crop_stays_finite_and_in_range() {
    let (channels, side) = (3, 32);
    let shape = [channels, side, side];
    let augment = ImageAugment {
        interpolation: Interpolation::Bicubic,
        ..ImageAugment::default()
    };
    let factors = [
        [
            JitterOp::Brightness(1.8),
            JitterOp::Contrast(0.2),
            JitterOp::Saturation(1.8),
            JitterOp::Hue(0.2),
        ],
        [
            JitterOp::Brightness(0.2),
            JitterOp::Contrast(1.8),
            JitterOp::Saturation(0.0),
            JitterOp::Hue(-0.5),
        ],
    ];
    let mut orders = Vec::new();
    permutations(&mut [0, 1, 2, 3], 0, &mut orders);
    assert_eq!(orders.len(), 24);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for image in adversarial_images(channels, side) {
        for order in &orders {
            for ops in &factors {
                for extras in 0..8u8 {
                    let mut top_left = [0usize, 1, 2, 22, 26];
                    top_left.shuffle(&mut rng);
                    let params = ImageViewParams {
                        crop: Some(CropBox {
                            top: top_left[0],
                            left: top_left[1],
                            height: 6,
                            width: 6,
                        }),
                        flip: false,
                        jitter: order.iter().map(|&i| ops[i]).collect(),
                        grayscale: extras & 1 != 0,
                        blur_sigma: (extras & 2 != 0).then_some(1.5),
                        solarize: extras & 4 != 0,
                    };
                    let mut out = vec![0f32; image.1.len()];
                    augment.apply_params(&image.1, &shape, &params, &mut out);
                    check_view(&out, UNIT, &format!("{} with {params:?}", image.0));
                }
            }
        }
    }
}

fn permutations(items: &mut [usize; 4], k: usize, out: &mut Vec<[usize; 4]>) {
    if k == items.len() {
        out.push(*items);
        return;
    }
    for i in k..items.len() {
        items.swap(k, i);
        permutations(items, k + 1, out);
        items.swap(k, i);
    }
}

#[test]
fn noise_recipes_are_finite_and_in_range_without_their_noise() {
    let shape = [1, 16, 16];
    for image in adversarial_images(1, 16) {
        for (name, augment, range) in [
            (
                "digits",
                Arc::new(DigitsAugment::default()) as Arc<dyn ViewTransform>,
                (f32::MIN, f32::MAX),
            ),
            (
                "digits without noise",
                Arc::new(DigitsAugment {
                    noise_std: 0.0,
                    ..DigitsAugment::default()
                }),
                UNIT,
            ),
            (
                "noise",
                Recipe::Noise
                    .view_types(Normalization::None, &shape)
                    .unwrap()
                    .views[0]
                    .transform
                    .clone(),
                (f32::MIN, f32::MAX),
            ),
            (
                "none",
                Recipe::None
                    .view_types(Normalization::None, &shape)
                    .unwrap()
                    .views[0]
                    .transform
                    .clone(),
                UNIT,
            ),
        ] {
            for seed in 0..20 {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut out = vec![0f32; image.1.len()];
                augment.apply(&image.1, &shape, &mut out, &mut rng);
                check_view(&out, range, &format!("{name} on {}", image.0));
            }
        }
    }
}

/// IConE's 3D views: finite always; without the noise, within the analytic range of the shift
/// and contrast that follow the (convex) trilinear crop, `[c·(0 − δ), c·(1 + δ)]`.
#[test]
fn volume_views_are_finite_and_within_the_intensity_ops_range() {
    let side = 12;
    let shape = [1, side, side, side];
    let default = VolumeAugment::default();
    let quiet = VolumeAugment {
        noise: 0.0,
        ..default.clone()
    };
    let bound = quiet.contrast.1 * quiet.shift;
    let range = (-bound, quiet.contrast.1 + bound);
    let volumes = adversarial_images(side, side)
        .into_iter()
        .map(|(name, v)| (name, v.into_iter().map(|x| x.min(1.0)).collect::<Vec<_>>()));
    for (name, volume) in volumes {
        for seed in 0..30 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut out = vec![0f32; volume.len()];
            default.apply(&volume, &shape, &mut out, &mut rng);
            check_view(&out, (f32::MIN, f32::MAX), &format!("icone3d on {name}"));
            quiet.apply(&volume, &shape, &mut out, &mut rng);
            check_view(&out, range, &format!("icone3d without noise on {name}"));
        }
    }
}
