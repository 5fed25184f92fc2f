//! I-JEPA's multi-block masks (Assran et al., CVPR 2023, §3 and Appendix C; the official
//! `src/masks/multiblock.py` `MaskCollator`), step by step as the official collator takes them:
//!
//! 1. Once per batch, two block sizes from one uniform number `u` each, the target size first:
//!    scale `s = s₀ + u(s₁ − s₀)` and aspect ratio `a = a₀ + u(a₁ − a₀)` (the same `u`, so
//!    larger targets are also taller), an area of `m = ⌊H·W·s⌋` patches, height
//!    `h = round(√(m·a))` and width `w = round(√(m/a))` (halves to even, as Python rounds),
//!    each lowered until it is below the grid's side. The context block uses aspect ratio 1.
//! 2. Per image, each target block at a uniform corner `top ∈ 0..H−h`, `left ∈ 0..W−w` (upper
//!    bounds excluded, so no block reaches the grid's last row or column: the official code's
//!    bounds, kept for exactness). A block must hold more than `min_keep` patches, else it is
//!    drawn again.
//! 3. Per image, each context block likewise, with every target block of that image taken out
//!    (unless `allow_overlap`). After 20 failed draws in a row, the last target still excluded
//!    is let back in (the official "decreasing acceptable-regions" warning), and so on.
//! 4. The indices are listed row-major ascending, and every image's target masks are cut to
//!    the shortest target mask of the batch, its context masks to the shortest context mask,
//!    so that each mask is one `[N, K]` tensor.

use anyhow::{bail, ensure, Result};
use serde::{Deserialize, Serialize};
use ssl_core::Progress;

use crate::{MaskRandomness, PatchIndices};

/// The [`Progress::rng`] stream the multi-block masks are drawn from.
pub const MULTIBLOCK_STREAM: u64 = 0x696a_6570_615f_6d6b;

/// Consecutive failed draws before one excluded target is let back into the context.
const DRAWS_BEFORE_RELAXING: usize = 20;

/// I-JEPA's mask parameters; the defaults are the official configurations' (`mask:` in
/// `configs/in1k_vith14_ep300.yaml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultiBlockConfig {
    /// Context block area as a fraction of the patches, `(min, max)` ((0.85, 1.0)).
    pub context_scale: (f64, f64),
    /// Target block area as a fraction of the patches, `(min, max)` ((0.15, 0.2)).
    pub target_scale: (f64, f64),
    /// Target block height / width, `(min, max)` ((0.75, 1.5)).
    pub aspect_ratio: (f64, f64),
    /// Context blocks per image (1).
    pub context_blocks: usize,
    /// Target blocks per image (4).
    pub target_blocks: usize,
    /// Every block keeps more than this many patches (10).
    pub min_keep: usize,
    /// Leave the targets in the context (false).
    pub allow_overlap: bool,
}

impl Default for MultiBlockConfig {
    fn default() -> Self {
        Self {
            context_scale: (0.85, 1.0),
            target_scale: (0.15, 0.2),
            aspect_ratio: (0.75, 1.5),
            context_blocks: 1,
            target_blocks: 4,
            min_keep: 10,
            allow_overlap: false,
        }
    }
}

/// A block's size in patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockSize {
    pub height: usize,
    pub width: usize,
}

/// A batch's multi-block masks: patch indices, row-major ascending per image before the cut to
/// the batch's shortest.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiBlockMasks {
    /// `context_blocks` masks of `[N, K_context]`: the patches the context encoder sees.
    pub context: Vec<PatchIndices>,
    /// `target_blocks` masks of `[N, K_target]`: the patches to predict.
    pub targets: Vec<PatchIndices>,
    /// The batch's context block size.
    pub context_block: BlockSize,
    /// The batch's target block size.
    pub target_block: BlockSize,
    /// Times a context block was drawn with one excluded target fewer, after 20 failed draws
    /// (the official collator logs a warning for each).
    pub relaxations: usize,
}

impl MultiBlockConfig {
    /// Checks the parameters, naming the one to fix.
    pub fn validate(&self) -> Result<()> {
        for (name, (low, high)) in [
            ("context_scale", self.context_scale),
            ("target_scale", self.target_scale),
        ] {
            ensure!(
                0.0 < low && low <= high && high <= 1.0,
                "multi-block masks: {name} must be (min, max) with 0 < min ≤ max ≤ 1, got \
                 ({low}, {high})"
            );
        }
        let (low, high) = self.aspect_ratio;
        ensure!(
            0.0 < low && low <= high && high.is_finite(),
            "multi-block masks: aspect_ratio must be (min, max) with 0 < min ≤ max, got ({low}, \
             {high}); I-JEPA's is (0.75, 1.5)"
        );
        ensure!(
            self.context_blocks > 0 && self.target_blocks > 0,
            "multi-block masks: context_blocks ({}) and target_blocks ({}) must be at least 1",
            self.context_blocks,
            self.target_blocks
        );
        Ok(())
    }

    /// The block size for the uniform draw `u` on an `H × W` grid (step 1 of the module docs).
    pub fn block_size(
        u: f64,
        scale: (f64, f64),
        aspect_ratio: (f64, f64),
        (height, width): (usize, usize),
    ) -> BlockSize {
        let area = ((height * width) as f64 * (scale.0 + u * (scale.1 - scale.0))) as usize;
        let ratio = aspect_ratio.0 + u * (aspect_ratio.1 - aspect_ratio.0);
        let side = |x: f64, limit: usize| (x.sqrt().round_ties_even() as usize).min(limit - 1);
        BlockSize {
            height: side(area as f64 * ratio, height),
            width: side(area as f64 / ratio, width),
        }
    }

    /// The masks of a batch of `images` on a `grid = (H, W)` patch grid (224 px with patch 16:
    /// 14 × 14), drawing from `random` in the official collator's order: the target size, the
    /// context size, then per image the target corners and the context corners.
    pub fn sample(
        &self,
        images: usize,
        grid: (usize, usize),
        random: &mut (impl MaskRandomness + ?Sized),
    ) -> Result<MultiBlockMasks> {
        self.validate()?;
        ensure!(images > 0, "multi-block masks: the batch has no images");
        let (height, width) = grid;
        ensure!(
            height >= 2 && width >= 2,
            "multi-block masks: the patch grid is {height}×{width}; blocks need at least 2×2 \
             patches (a larger image or a smaller patch)"
        );
        let target_block =
            Self::block_size(random.unit(), self.target_scale, self.aspect_ratio, grid);
        let context_block = Self::block_size(random.unit(), self.context_scale, (1.0, 1.0), grid);
        let mut sampler = BlockSampler {
            grid,
            min_keep: self.min_keep,
            relaxations: 0,
        };
        let mut targets = vec![Vec::with_capacity(images); self.target_blocks];
        let mut context = vec![Vec::with_capacity(images); self.context_blocks];
        for _ in 0..images {
            let mut outside_targets = Vec::with_capacity(self.target_blocks);
            for mask in &mut targets {
                let (indices, outside) = sampler.place(target_block, &[], random)?;
                mask.push(indices);
                outside_targets.push(outside);
            }
            let allowed: &[Vec<bool>] = match self.allow_overlap {
                true => &[],
                false => &outside_targets,
            };
            for mask in &mut context {
                mask.push(sampler.place(context_block, allowed, random)?.0);
            }
        }
        Ok(MultiBlockMasks {
            context: cut_to_shortest(context),
            targets: cut_to_shortest(targets),
            context_block,
            target_block,
            relaxations: sampler.relaxations,
        })
    }

    /// [`MultiBlockConfig::sample`] from the run's seed and step ([`MULTIBLOCK_STREAM`]): the
    /// same masks on every worker and after `--resume`.
    pub fn sample_for_step(
        &self,
        images: usize,
        grid: (usize, usize),
        progress: &Progress,
    ) -> Result<MultiBlockMasks> {
        self.sample(images, grid, &mut progress.rng(MULTIBLOCK_STREAM))
    }
}

/// Places blocks on the grid, counting relaxed exclusions.
struct BlockSampler {
    grid: (usize, usize),
    min_keep: usize,
    relaxations: usize,
}

impl BlockSampler {
    /// A block of `size` at a uniform corner, restricted to the cells every one of `allowed`
    /// admits (each `H·W`, true = allowed), drawn again until more than `min_keep` cells
    /// remain; after every 20 failures in a row the last restriction still in force is
    /// dropped. Returns the block's cells (row-major ascending) and the cells outside it.
    fn place(
        &mut self,
        size: BlockSize,
        allowed: &[Vec<bool>],
        random: &mut (impl MaskRandomness + ?Sized),
    ) -> Result<(Vec<u32>, Vec<bool>)> {
        let (height, width) = self.grid;
        let BlockSize {
            height: h,
            width: w,
        } = size;
        // Unrestricted, a block keeps all its h·w cells; no smaller block can ever be accepted
        // (the official loop would never end).
        if h * w <= self.min_keep {
            bail!(
                "multi-block masks: a {h}×{w} block on a {height}×{width} patch grid has {} \
                 patches, and blocks must keep more than min_keep = {}; lower min_keep, raise \
                 the block scale or use a finer patch grid",
                h * w,
                self.min_keep
            );
        }
        let (mut failures, mut dropped) = (0, 0);
        loop {
            let top = random.below(height - h);
            let left = random.below(width - w);
            let in_force = &allowed[..allowed.len().saturating_sub(dropped)];
            let cells: Vec<u32> = (top..top + h)
                .flat_map(|row| (left..left + w).map(move |col| row * width + col))
                .filter(|&cell| in_force.iter().all(|region| region[cell]))
                .map(|cell| cell as u32)
                .collect();
            if cells.len() > self.min_keep {
                let mut outside = vec![true; height * width];
                for row in top..top + h {
                    outside[row * width + left..row * width + left + w].fill(false);
                }
                return Ok((cells, outside));
            }
            failures += 1;
            if failures == DRAWS_BEFORE_RELAXING {
                failures = 0;
                dropped += 1;
                self.relaxations += 1;
            }
        }
    }
}

/// `masks[i][n]`, mask `i` of image `n`, as one `[N, K]` per mask, every row cut to the
/// shortest mask of this kind (target or context) in the batch, as the official collator does.
fn cut_to_shortest(masks: Vec<Vec<Vec<u32>>>) -> Vec<PatchIndices> {
    let shortest = masks.iter().flatten().map(Vec::len).min().unwrap_or(0);
    masks
        .into_iter()
        .map(|per_image| {
            let images = per_image.len();
            let values = per_image
                .into_iter()
                .flat_map(|cells| cells.into_iter().take(shortest))
                .collect();
            PatchIndices::new(images, shortest, values)
        })
        .collect()
}
