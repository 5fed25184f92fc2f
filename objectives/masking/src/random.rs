//! MAE's per-sample random masking (He et al., CVPR 2022, §3 "Masking"; the official
//! `MaskedAutoencoderViT.random_masking`): each image draws uniform noise for its `L` patches,
//! sorts it ascending, keeps the first `K = ⌊L(1 − r)⌋` patches of that order and removes the
//! rest. The inverse of the sorting permutation restores the patch order after a decoder has
//! appended its mask tokens.

use anyhow::{bail, ensure, Result};
use candle_core::{Device, Tensor};
use rand::Rng;
use ssl_core::Progress;

use crate::PatchIndices;

/// The [`Progress::rng`] stream MAE's noise is drawn from.
pub const RANDOM_MASKING_STREAM: u64 = 0x6d61_655f_6e6f_6973;

/// A batch's random masks: `N` images of `L` patches, `K` kept each.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomMask {
    /// `[N, K]`: the kept patches, lowest noise first (MAE's `ids_shuffle[:, :K]`).
    pub keep: PatchIndices,
    /// `[N·L]`, 1 where the patch is removed, 0 where it is kept.
    mask: Vec<f32>,
    /// `[N·L]`: the position of each patch in its image's ascending order of noise (MAE's
    /// `ids_restore`, the inverse permutation of the sort).
    restore: Vec<u32>,
    len: usize,
}

impl RandomMask {
    /// `[N·L]` row-major, 1 = removed, 0 = kept.
    pub fn mask(&self) -> &[f32] {
        &self.mask
    }

    /// `[N·L]` row-major: patch `l` of image `n` is at position `restore[n·L + l]` of that
    /// image's noise order, so the `K` kept tokens followed by `L − K` mask tokens, gathered
    /// at `restore`, are back in patch order.
    pub fn restore(&self) -> &[u32] {
        &self.restore
    }

    /// Patches per image `L`.
    pub fn patches(&self) -> usize {
        self.len
    }

    /// Images `first..first + count` of the batch, as a batch of their own.
    ///
    /// Panics if the batch has fewer than `first + count` images.
    pub fn rows(&self, first: usize, count: usize) -> RandomMask {
        let l = self.len;
        let range = |per: usize| first * per..(first + count) * per;
        RandomMask {
            keep: self.keep.rows(first, count),
            mask: self.mask[range(l)].to_vec(),
            restore: self.restore[range(l)].to_vec(),
            len: l,
        }
    }

    /// The mask as `[N, L]` f32 (1 = removed) on `device`.
    pub fn mask_tensor(&self, device: &Device) -> candle_core::Result<Tensor> {
        Tensor::from_slice(&self.mask, (self.keep.images(), self.len), device)
    }

    /// The restoring indices as `[N, L]` u32 on `device`.
    pub fn restore_tensor(&self, device: &Device) -> candle_core::Result<Tensor> {
        Tensor::from_slice(&self.restore, (self.keep.images(), self.len), device)
    }
}

/// MAE's count of kept patches, `int(L·(1 − ratio))` in double precision as the official code
/// computes it (so `L = 20`, ratio 0.9 keeps 1: `20·(1 − 0.9)` is 1.9999999999999996).
pub fn kept_patches(len: usize, ratio: f64) -> usize {
    (len as f64 * (1.0 - ratio)) as usize
}

/// MAE's masks from given noise `[N·L]` (row-major, `L = len` per image): per image the patches
/// sorted by ascending noise (ties by patch index), the first `⌊L(1 − ratio)⌋` kept.
pub fn random_masking(noise: &[f32], len: usize, ratio: f64) -> Result<RandomMask> {
    ensure!(
        len > 0 && !noise.is_empty() && noise.len().is_multiple_of(len),
        "random masking: {} noise values do not form rows of {len} patches; pass N·L values, \
         L per image",
        noise.len()
    );
    ensure!(
        (0.0..1.0).contains(&ratio),
        "random masking: the mask ratio must be in [0, 1), got {ratio}; MAE's default is 0.75"
    );
    let kept = kept_patches(len, ratio);
    ensure!(
        kept > 0,
        "random masking: ratio {ratio} of {len} patches keeps none (⌊{len}·(1 − {ratio})⌋ = 0); \
         lower the ratio"
    );
    if let Some(bad) = noise.iter().find(|v| !v.is_finite()) {
        bail!("random masking: the noise holds {bad}; it must be finite to be sorted");
    }
    let images = noise.len() / len;
    let mut keep = Vec::with_capacity(images * kept);
    let mut mask = vec![1.0; images * len];
    let mut restore = vec![0; images * len];
    for n in 0..images {
        let row = &noise[n * len..(n + 1) * len];
        let mut order: Vec<u32> = (0..len as u32).collect();
        order.sort_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]));
        for (position, &patch) in order.iter().enumerate() {
            restore[n * len + patch as usize] = position as u32;
            if position < kept {
                mask[n * len + patch as usize] = 0.0;
            }
        }
        keep.extend_from_slice(&order[..kept]);
    }
    Ok(RandomMask {
        keep: PatchIndices::new(images, kept, keep),
        mask,
        restore,
        len,
    })
}

/// [`random_masking`] with noise drawn uniformly in `[0, 1)` (f32, as `torch.rand`) from `rng`,
/// `images × len` values, image by image.
pub fn draw_random_masking(
    images: usize,
    len: usize,
    ratio: f64,
    rng: &mut (impl Rng + ?Sized),
) -> Result<RandomMask> {
    let noise: Vec<f32> = (0..images * len).map(|_| rng.random()).collect();
    random_masking(&noise, len, ratio)
}

/// [`draw_random_masking`] from the run's seed and step ([`RANDOM_MASKING_STREAM`]): the same
/// masks on every worker and after `--resume`.
pub fn random_masking_for_step(
    images: usize,
    len: usize,
    ratio: f64,
    progress: &Progress,
) -> Result<RandomMask> {
    draw_random_masking(images, len, ratio, &mut progress.rng(RANDOM_MASKING_STREAM))
}
