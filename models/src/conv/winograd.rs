//! Winograd's minimal filtering F(m, 3) on every axis of a stride-1 3×3 or 3×3×3 convolution
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016, eq. 7–8 and
//! §4.2, nested per axis): F(4×4, 3×3) on images with enough tiles of 4×4 outputs, else
//! F(2×2, 3×3), and F(2×2×2, 3×3×3) on volumes ([`Winograd`] says why). This file holds the
//! choice of algorithm and the tiling; `transforms` the transform matrices and their
//! application, `chunks` the work layout, `forward` and `backward` the two passes.
//!
//! Each m×m (m×m×m) output tile `Y` is `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A` of its n×n (n×n×n) input
//! tile `d`, `n = m + 2`, which overlaps its neighbours by 2, and the kernel `g`, the
//! transforms applied along every axis. Summed over input channels, the element-wise products
//! become one GEMM per transform point `ξ` (n² or n³ of them):
//! `M[ξ] (O × T) = U[ξ] (O × C) · V[ξ] (C × T)` over the `T` tiles, with `U = G g Gᵀ` and
//! `V = Bᵀ d B`. Per output channel, input channel and output, im2col spends 9 (27)
//! multiply-adds, F(2, 3) 4 (8) and F(4, 3) 2.25 (3.4); a tile's padding is never multiplied
//! by the taps that miss the image.
//!
//! The backward is the same algorithm transposed: the weight gradient is
//! `dU[ξ] = Σ_t (A dY Aᵀ)[ξ, t] · V[ξ, t]` and `dW = Gᵀ dU G`, and the input gradient of a
//! stride-1 convolution is the forward of its dual convolution (`dy` with the flipped kernel,
//! see `conv/backward.rs`), which takes this path as well. F(2, 3)'s transforms have
//! coefficients 0, ±½ and ±1, so its rounding error is that of im2col; F(4, 3)'s interpolate at
//! 0, ±1, ±2 and ∞, with coefficients up to 8 and down to 1/24, and its f32 error on images is
//! about 11× im2col's, 5·10⁻⁶ of the outputs' scale (both tested against it).
//!
//! Every transform is a small matrix applied to rows of lanes. A chunk's tiles are ordered
//! `[t_d, t_h, image, t_w]`, so one row holds a transform point of every tile of the chunk: the
//! width transforms read each input row split by the residue of its positions mod m, the
//! height and depth transforms read rows kept split by the residue of their position, shifted
//! by one tile, and all of them run over whole rows.

use super::geom::{balanced_chunks, Geom, CHUNK_VALUES};
use crate::util::Float;
use transforms::Transforms;

mod backward;
mod chunks;
mod forward;
mod transforms;

/// Fewest input and output channels for which the transforms pay: below it (the stem's 1–3
/// image channels) the GEMMs are too shallow and im2col's single deep GEMM is faster.
const MIN_CHANNELS: usize = 16;

/// Fewest tiles in the batch for Winograd's algorithm: each `U[ξ]` (`O × C`, n² or n³ of them)
/// is streamed once per chunk, so with fewer tiles the GEMMs wait on memory (the 3D ResNet's
/// 2³ and 4³ layers, 1 and 8 tiles of F(2, 3) a volume at 4 volumes a view, were 3× slower
/// than im2col).
const MIN_TILES: usize = 64;

/// Fewest tiles in a chunk, where the batch has them: besides `U` streamed once per chunk,
/// each chunk group of the weight gradient sums a whole `dU` (16 MB for 512 channels in and
/// out). 128 rather than 64 took row 1's 512-channel 4² layer from 4 chunks to 2 and its
/// weight gradient from 36 to 27 ms a call (256 channels at 8²: 22 to 17 ms); row 4 was
/// unchanged.
const MIN_CHUNK_TILES: usize = 128;

/// Fewest chunks for [`Minimal::forward`] and [`Minimal::weight_grad`] to give each worker
/// whole chunks. With fewer (row 1's 256- and 512-channel layers are 2 chunks of 32 images, one
/// a thread), nothing evens out a worker slower than the other, and each step of the chunks is
/// shared out instead ([`Minimal::forward_stepwise`], [`Minimal::weight_grad_stepwise`]): those
/// layers' forward + backward 0.84 and 0.89 of chunk by chunk (in-process A/B, 20 alternating
/// repetitions), row 1's step 0.94 (16 alternating pairs).
const STEPWISE_BELOW_CHUNKS: usize = 4;

/// Fewest F(4, 3) tiles per image for it to take an image convolution. With one tile an image
/// (ResNet-18's last stage on 32² inputs), a chunk's GEMMs pack each of the 36 `U[ξ]` for a
/// quarter of the tiles F(2, 3) gives them, and that costs more than the multiply-adds saved
/// (row 1 of the step bench, medians of 4 alternating runs: 2,121 ms with F(2, 3) there,
/// 2,257 ms with F(4, 3)).
const F43_MIN_TILES_PER_IMAGE: usize = 4;

/// Winograd's algorithm for one convolution geometry: F(4×4, 3×3) on images of at least
/// [`F43_MIN_TILES_PER_IMAGE`] of its tiles, else F(2, 3) on every axis. Volumes keep F(2, 3):
/// there F(4, 3)'s f32 error is 28× im2col's (three axes of its larger coefficients), and row 4
/// of the step bench was no faster with it (1,471 against 1,434 ms, medians of 3).
#[derive(Debug, Clone, Copy)]
pub(super) enum Winograd {
    F43(Minimal<4, 6>),
    F23(Minimal<2, 4>),
}

impl Winograd {
    /// The algorithm for `g` with `o` output channels, where one applies: a 3×3 or 3×3×3
    /// kernel at stride 1 with padding ≤ 2, at least [`MIN_CHANNELS`] channels in and out.
    pub fn new(g: Geom, o: usize) -> Option<Self> {
        let f43 = Minimal::<4, 6>::new(g, o)
            .filter(|f| !f.volumetric && f.tiles_per_image() >= F43_MIN_TILES_PER_IMAGE);
        f43.map(Self::F43)
            .or_else(|| Minimal::new(g, o).map(Self::F23))
    }

    /// The convolution of `x`: `[C, N, D, H, W]` with `w`: `[O, C·k_vol]` into `y`:
    /// `[O, N·S_out]`, every value of which it writes.
    pub fn forward<T: Float>(&self, x: &[T], w: &[T], y: &mut [T]) {
        match self {
            Self::F43(f) => f.forward(x, w, y),
            Self::F23(f) => f.forward(x, w, y),
        }
    }

    /// The weight gradient `dW`: `[O, C·k_vol]` of [`Self::forward`] from `dy`: `[O, N·S_out]`.
    pub fn weight_grad<T: Float>(&self, x: &[T], dy: &[T], dw: &mut [T]) {
        match self {
            Self::F43(f) => f.weight_grad(x, dy, dw),
            Self::F23(f) => f.weight_grad(x, dy, dw),
        }
    }
}

/// F(m, 3) per axis (`n = m + 2` inputs per tile and axis) on one convolution geometry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Minimal<const M: usize, const N: usize> {
    g: Geom,
    /// A 3×3×3 kernel on volumes; else a 3×3 kernel on images (depth 1, one tile deep).
    volumetric: bool,
    /// Tiles along the depth, the height and the width.
    tiles: [usize; 3],
}

impl<const M: usize, const N: usize> Minimal<M, N>
where
    Self: Transforms<M, N>,
{
    /// The tiling of `g` with `o` output channels, where F(m, 3) applies: a 3×3 or 3×3×3 kernel
    /// at stride 1 with padding ≤ 2, at least [`MIN_CHANNELS`] channels in and out, and at
    /// least [`MIN_TILES`] tiles in the batch.
    pub fn new(g: Geom, o: usize) -> Option<Self> {
        let volumetric = g.k == [3, 3, 3];
        let fits = (volumetric || g.k == [1, 3, 3] && g.pad[0] == 0)
            && g.stride == [1, 1, 1]
            && g.pad.iter().all(|&p| p <= 2)
            && g.c.min(o) >= MIN_CHANNELS;
        let out = g.out();
        let tiles = [
            if volumetric {
                out[0].div_ceil(M)
            } else {
                out[0]
            },
            out[1].div_ceil(M),
            out[2].div_ceil(M),
        ];
        let many_tiles = g.n * tiles.iter().product::<usize>() >= MIN_TILES;
        (fits && many_tiles).then_some(Self {
            g,
            volumetric,
            tiles,
        })
    }

    /// Output positions of a tile along the depth: m on volumes, 1 on images.
    fn depth_tile(&self) -> usize {
        if self.volumetric {
            M
        } else {
            1
        }
    }

    /// Transform points per tile: n² on images, n³ on volumes.
    fn points(&self) -> usize {
        if self.volumetric {
            N * N * N
        } else {
            N * N
        }
    }

    /// The first transformed axis of a `[depth, height, width, lane]` block.
    fn first_axis(&self) -> usize {
        if self.volumetric {
            0
        } else {
            1
        }
    }

    fn tiles_per_image(&self) -> usize {
        self.tiles.iter().product()
    }

    /// Chunks of images: the larger of a chunk's transformed input and output about
    /// [`CHUNK_VALUES`], and at least 8 chunks when the batch allows, but at least
    /// [`MIN_CHUNK_TILES`] tiles a chunk; shared evenly among workers where that keeps
    /// [`MIN_CHUNK_TILES`] ([`balanced_chunks`]). Fixed by the shapes.
    pub(super) fn chunks(&self, o: usize) -> usize {
        let tiles = self.tiles_per_image();
        let per_image = self.points() * self.g.c.max(o) * tiles;
        let by_size = (CHUNK_VALUES / per_image.max(1)).clamp(1, self.g.n.div_ceil(8).max(1));
        let min_images = MIN_CHUNK_TILES.div_ceil(tiles);
        let nb = by_size.max(min_images).min(self.g.n);
        balanced_chunks(self.g.n, nb, min_images)
    }

    /// Whether [`Self::forward`] and [`Self::weight_grad`] share out the steps of their
    /// `chunks` chunks rather than whole chunks: where there are fewer than
    /// [`STEPWISE_BELOW_CHUNKS`].
    fn stepwise(chunks: usize) -> bool {
        chunks < STEPWISE_BELOW_CHUNKS
    }
}
