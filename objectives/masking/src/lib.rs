//! Token masks for masked-image objectives: which patches of each image a ViT encoder sees
//! (`ssl_models::VisionTransformer::forward_tokens` takes them as `[N, K]` u32 indices) and
//! which ones a predictor must reconstruct. Spec: `docs/spec/objectives.md` §3.1.
//!
//! * [`random_masking`] (MAE; He et al., "Masked Autoencoders Are Scalable Vision Learners",
//!   CVPR 2022): per image, the `⌊L(1 − r)⌋` patches of lowest uniform noise are kept, in
//!   ascending order of noise; the binary mask and the restoring permutation come with them.
//! * [`MultiBlockConfig`] (I-JEPA; Assran et al., "Self-Supervised Learning from Images with a
//!   Joint-Embedding Predictive Architecture", CVPR 2023): per batch, 4 target blocks of 15–20 %
//!   of the patches and aspect ratio 0.75–1.5, and one context block of 85–100 % with the
//!   targets taken out, every image's masks truncated to the batch's shortest.
//!
//! Both masks follow the official code draw for draw: given the same random numbers they give the
//! same masks (the golden tests replay numbers recorded from it). In training the numbers come
//! from [`ssl_core::Progress::rng`], so the masks depend only on the run's seed and step: the
//! same on every worker and after `--resume` ([`random_masking_for_step`],
//! [`MultiBlockConfig::sample_for_step`]).
//!
//! ```
//! use ssl_masking::{random_masking, MultiBlockConfig};
//! use rand::SeedableRng;
//!
//! # fn main() -> anyhow::Result<()> {
//! // MAE: two images of 4 patches, noise given; ratio 0.5 keeps the 2 lowest-noise patches.
//! let mask = random_masking(&[0.9, 0.1, 0.5, 0.3, 0.2, 0.8, 0.4, 0.6], 4, 0.5)?;
//! assert_eq!(mask.keep.row(0), &[1, 3]);
//! assert_eq!(mask.keep.row(1), &[0, 2]);
//! assert_eq!(mask.mask(), &[1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0]); // 1 = removed
//!
//! // I-JEPA on a 14 × 14 grid (224 px, patch 16), the official defaults.
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
//! let masks = MultiBlockConfig::default().sample(8, (14, 14), &mut rng)?;
//! assert_eq!((masks.context.len(), masks.targets.len()), (1, 4));
//! let (context, target) = (masks.context[0].row(0), masks.targets[0].row(0));
//! assert!(context.len() > 10 && target.iter().all(|t| !context.contains(t)));
//! let keep = masks.context[0].to_tensor(&candle_core::Device::Cpu)?; // [8, K] u32
//! assert_eq!(keep.dims(), &[8, context.len()]);
//! # Ok(())
//! # }
//! ```

pub mod multiblock;
pub mod random;

pub use multiblock::{BlockSize, MultiBlockConfig, MultiBlockMasks, MULTIBLOCK_STREAM};
pub use random::{
    draw_random_masking, kept_patches, random_masking, random_masking_for_step, RandomMask,
    RANDOM_MASKING_STREAM,
};

use candle_core::{Device, Tensor};

/// Patch indices per image: `images` rows of `per_image` indices into the row-major patch grid,
/// stored row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchIndices {
    images: usize,
    per_image: usize,
    values: Vec<u32>,
}

impl PatchIndices {
    fn new(images: usize, per_image: usize, values: Vec<u32>) -> Self {
        debug_assert_eq!(values.len(), images * per_image);
        Self {
            images,
            per_image,
            values,
        }
    }

    /// Rows `N`.
    pub fn images(&self) -> usize {
        self.images
    }

    /// Indices per row `K`.
    pub fn per_image(&self) -> usize {
        self.per_image
    }

    /// Images `first..first + count`, as indices of their own.
    ///
    /// Panics if there are fewer than `first + count` images.
    pub fn rows(&self, first: usize, count: usize) -> PatchIndices {
        let k = self.per_image;
        PatchIndices::new(
            count,
            k,
            self.values[first * k..(first + count) * k].to_vec(),
        )
    }

    /// The indices of image `n`.
    pub fn row(&self, n: usize) -> &[u32] {
        &self.values[n * self.per_image..(n + 1) * self.per_image]
    }

    /// Every index, `[N·K]` row-major.
    pub fn as_slice(&self) -> &[u32] {
        &self.values
    }

    /// `[N, K]` u32 on `device`.
    pub fn to_tensor(&self, device: &Device) -> candle_core::Result<Tensor> {
        Tensor::from_slice(&self.values, (self.images, self.per_image), device)
    }
}

/// The two kinds of random numbers the masks consume, in the official code's order. Every
/// [`rand::Rng`] provides them; a recorded sequence can too (the golden tests replay the
/// official collator's draws).
pub trait MaskRandomness {
    /// A uniform number in `[0, 1)`.
    fn unit(&mut self) -> f64;
    /// A uniform integer in `0..bound` (`bound ≥ 1`).
    fn below(&mut self, bound: usize) -> usize;
}

impl<R: rand::Rng + ?Sized> MaskRandomness for R {
    fn unit(&mut self) -> f64 {
        self.random()
    }
    fn below(&mut self, bound: usize) -> usize {
        self.random_range(0..bound)
    }
}

#[cfg(test)]
mod tests;
