//! The synthetic 2D Gaussian mixture of IConE Appendix E.
//!
//! 5 classes x 350 instances = 1750 points in R². Class `k` is centred at radius 3.0 and angle
//! `2πk/5`; each point is drawn from `N(centre_k, 0.8² I)`. Samples are ordered by class.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use crate::{Dataset, Samples};

/// Number of mixture components (classes).
pub const GMM_CLASSES: usize = 5;
/// Instances per class.
pub const GMM_PER_CLASS: usize = 350;
/// Radius of the circle carrying the class centres.
pub const GMM_RADIUS: f64 = 3.0;
/// Isotropic standard deviation of each component.
pub const GMM_SIGMA: f64 = 0.8;

/// Draws the Appendix E mixture deterministically from `seed`; shape `[2]`, name `"gmm"`.
pub fn gaussian_mixture(seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let noise = Normal::new(0.0, GMM_SIGMA).expect("valid sigma");
    let mut images = Vec::with_capacity(GMM_CLASSES * GMM_PER_CLASS * 2);
    let mut labels = Vec::with_capacity(GMM_CLASSES * GMM_PER_CLASS);
    for k in 0..GMM_CLASSES {
        let theta = 2.0 * std::f64::consts::PI * k as f64 / GMM_CLASSES as f64;
        let (cx, cy) = (GMM_RADIUS * theta.cos(), GMM_RADIUS * theta.sin());
        for _ in 0..GMM_PER_CLASS {
            images.push((cx + noise.sample(&mut rng)) as f32);
            images.push((cy + noise.sample(&mut rng)) as f32);
            labels.push(k as u32);
        }
    }
    Dataset {
        name: "gmm".into(),
        samples: Samples::F32(images),
        labels,
        shape: vec![2],
        num_classes: GMM_CLASSES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_counts_and_statistics() {
        let d = gaussian_mixture(7);
        assert_eq!(d.len(), 1750);
        assert_eq!(d.shape, vec![2]);
        assert_eq!(d.num_classes, 5);
        assert_eq!(d.class_counts(), vec![350; 5]);
        for k in 0..5 {
            let theta = 2.0 * std::f64::consts::PI * k as f64 / 5.0;
            let idx: Vec<usize> = (0..d.len()).filter(|&i| d.labels[i] == k as u32).collect();
            let n = idx.len() as f64;
            let mx = idx.iter().map(|&i| d.sample(i)[0] as f64).sum::<f64>() / n;
            let my = idx.iter().map(|&i| d.sample(i)[1] as f64).sum::<f64>() / n;
            assert!(
                (mx - 3.0 * theta.cos()).abs() < 0.2,
                "class {k} mean x {mx}"
            );
            assert!(
                (my - 3.0 * theta.sin()).abs() < 0.2,
                "class {k} mean y {my}"
            );
            let var = idx
                .iter()
                .map(|&i| (d.sample(i)[0] as f64 - mx).powi(2))
                .sum::<f64>()
                / n;
            assert!(
                (var.sqrt() - 0.8).abs() < 0.1,
                "class {k} std {}",
                var.sqrt()
            );
        }
    }

    #[test]
    fn deterministic_per_seed() {
        let (a, b) = (gaussian_mixture(1), gaussian_mixture(1));
        assert_eq!((a.sample(7), &a.labels), (b.sample(7), &b.labels));
        assert_ne!(gaussian_mixture(1).sample(0), gaussian_mixture(2).sample(0));
    }
}
