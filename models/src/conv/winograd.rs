//! Winograd's minimal filtering F(m, 3) on every axis of a stride-1 3×3 or 3×3×3 convolution
//! (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR 2016, eq. 7–8 and
//! §4.2, nested per axis): F(4×4, 3×3) on images with enough tiles of 4×4 outputs, else
//! F(2×2, 3×3), and F(2×2×2, 3×3×3) on volumes ([`Winograd`] says why).
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
//! see `conv.rs`), which takes this path as well. F(2, 3)'s transforms have coefficients 0, ±½
//! and ±1, so its rounding error is that of im2col; F(4, 3)'s interpolate at 0, ±1, ±2 and ∞,
//! with coefficients up to 8 and down to 1/24, and its f32 error on images is about 11× im2col's,
//! 5·10⁻⁶ of the outputs' scale (both tested against it).
//!
//! Every transform is a small matrix applied to rows of lanes. A chunk's tiles are ordered
//! `[t_d, t_h, image, t_w]`, so one row holds a transform point of every tile of the chunk: the
//! width transforms read each input row split by the residue of its positions mod m, the
//! height and depth transforms read rows kept split by the residue of their position, shifted
//! by one tile, and all of them run over whole rows.

use std::ops::Range;

use ssl_linalg::for_each_index;

use super::{balanced_chunks, chunk_images, group_partial_sums, Geom, Shared, CHUNK_VALUES};
use crate::util::{gemm_into, row_stride, vectorized, written_whole, Float, Scratch};

/// The transforms of F(m, 3), `n = m + 2`: `Bᵀ` (input), `G` (kernel) and `Aᵀ` (output), and
/// the transposes the backward applies.
pub(super) trait Transforms<const M: usize, const N: usize> {
    const BT: [[f64; N]; N];
    const G: [[f64; 3]; N];
    const AT: [[f64; N]; M];
    /// `A`, which carries an output tile's gradient back to the transform points.
    const A: [[f64; M]; N] = transpose(Self::AT);
    /// `Gᵀ`, which carries the transformed kernel's gradient back to the taps.
    const GT: [[f64; N]; 3] = transpose(Self::G);
}

/// F(2, 3): interpolation at 0, ±1 and ∞ (Lavin & Gray, eq. 7).
impl Transforms<2, 4> for Minimal<2, 4> {
    const BT: [[f64; 4]; 4] = [
        [1.0, 0.0, -1.0, 0.0],
        [0.0, 1.0, 1.0, 0.0],
        [0.0, -1.0, 1.0, 0.0],
        [0.0, 1.0, 0.0, -1.0],
    ];
    const G: [[f64; 3]; 4] = [
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.5, -0.5, 0.5],
        [0.0, 0.0, 1.0],
    ];
    const AT: [[f64; 4]; 2] = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];
}

/// F(4, 3): interpolation at 0, ±1, ±2 and ∞ (Lavin & Gray, §4.2).
impl Transforms<4, 6> for Minimal<4, 6> {
    const BT: [[f64; 6]; 6] = [
        [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
        [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
        [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
        [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
        [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
        [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
    ];
    const G: [[f64; 3]; 6] = [
        [1.0 / 4.0, 0.0, 0.0],
        [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
        [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
        [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
        [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
        [0.0, 0.0, 1.0],
    ];
    const AT: [[f64; 6]; 4] = [
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
        [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
        [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
        [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
    ];
}

const fn transpose<const I: usize, const J: usize>(m: [[f64; J]; I]) -> [[f64; I]; J] {
    let mut t = [[0.0; I]; J];
    let mut i = 0;
    while i < I {
        let mut j = 0;
        while j < J {
            t[j][i] = m[i][j];
            j += 1;
        }
        i += 1;
    }
    t
}

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

/// Input channels per task of the weight gradient's last step: each task writes a run of
/// `16 · k_vol` values in every row of `dW` (`[O, C·k_vol]`) instead of `k_vol`, a row apart,
/// per channel.
const GRAD_CHANNEL_BLOCK: usize = 16;

/// Fewest chunks for [`Minimal::forward`] and [`Minimal::weight_grad`] to give each worker
/// whole chunks. With fewer (row 1's 256- and 512-channel layers are 2 chunks of 32 images, one
/// a thread), nothing evens out a worker slower than the other, and each step of the chunks is
/// shared out instead ([`Minimal::forward_stepwise`], [`Minimal::weight_grad_stepwise`]): those
/// layers' forward + backward 0.84 and 0.89 of chunk by chunk (in-process A/B, 20 alternating
/// repetitions), row 1's step 0.94 (16 alternating pairs).
const STEPWISE_BELOW_CHUNKS: usize = 4;

/// Input or output channels per task of the transforms shared out step by step.
const STEP_CHANNELS: usize = 16;

/// Channel pairs per block of the kernel transform: its rows of taps stay in L2.
const KERNEL_LANES: usize = 1024;

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

    /// `U = G g Gᵀ`: `[points, O·C]` from the kernel `w`: `[O, C·k_vol]`, a block of
    /// [`KERNEL_LANES`] (output, input) channel pairs at a time on Candle's workers.
    fn kernel_transform<T: Float>(&self, w: &[T]) -> Vec<T> {
        let kv = self.g.kernel_volume();
        let oc = w.len() / kv;
        let write = |u: &mut [T]| {
            let out = Shared(u.as_mut_ptr());
            for_each_index(
                oc.div_ceil(KERNEL_LANES),
                || [(); 2].map(|_| Vec::new()),
                |[buf, tmp]: &mut [Vec<T>; 2], block| {
                    let out = &out;
                    let pairs = block * KERNEL_LANES..oc.min((block + 1) * KERNEL_LANES);
                    let lanes = pairs.len();
                    buf.resize(kv * lanes, T::from_f64(0.0));
                    for (lane, taps) in w[pairs.start * kv..pairs.end * kv].chunks(kv).enumerate() {
                        for (tap, &v) in taps.iter().enumerate() {
                            buf[tap * lanes + lane] = v;
                        }
                    }
                    let dims = [self.g.k[0], 3, 3, lanes];
                    vectorized(
                        #[inline(always)]
                        || transform_axes(&Self::G, buf, tmp, dims, self.first_axis()),
                    );
                    for (point, row) in buf.chunks(lanes).enumerate() {
                        // SAFETY: U has `points` rows of `oc` values; this block alone writes
                        // columns `pairs` of each.
                        unsafe {
                            let dst = out.0.add(point * oc + pairs.start);
                            std::ptr::copy_nonoverlapping(row.as_ptr(), dst, lanes);
                        }
                    }
                },
            );
        };
        // SAFETY: the blocks write every column of every point's row of U.
        unsafe { written_whole(self.points() * oc, write) }
    }

    /// `V = Bᵀ d B` of channel `c` of `images` of `x`: `[C, N, D, H, W]`, written at
    /// `v[(ξ·C + c)·ld + t]` for the `T` tiles `t` (`ld` ≥ `T`, a [`row_stride`]: the weight
    /// gradient's GEMM packs `V` down its columns); `rows` and `stage` are scratch.
    ///
    /// First along the width, as each zero-padded input row is read: split into the residues
    /// `s_r` of its positions mod m, tile `t`'s inputs are `s_{i mod m}[t + ⌊i/m⌋]`, `i < n`,
    /// and `Bᵀ` of them gives its n rows over the tiles. These are kept as
    /// `rows[ξ_w, padded d, padded h mod m, ⌊padded h / m⌋, image, t_w]`, so that input row
    /// `m·t_h + i` of every tile row `t_h` is one run of lanes, shifted by `⌊i/m⌋` rows; the
    /// height transform reads them so, and on volumes writes
    /// `stage[ξ_h, ξ_w, padded d mod m, ⌊padded d / m⌋, t_h, image, t_w]` for the depth
    /// transform to read the same way.
    ///
    /// # Safety
    /// `v` points to `points·C·ld` values, and no other thread reads or writes channel `c`'s
    /// rows of them meanwhile.
    #[inline(always)]
    unsafe fn input_transform<T: Float>(
        &self,
        x: &[T],
        c: usize,
        images: Range<usize>,
        (v, ld): (*mut T, usize),
        [rows, stage]: [&mut Scratch<T>; 2],
    ) {
        let (n0, nb) = (images.start, images.len());
        let g = &self.g;
        let zero = T::from_f64(0.0);
        let [depth, height, width] = g.size;
        let volume = depth * height * width;
        let [tiles_d, tiles_h, tiles_w] = self.tiles;
        let lanes = nb * tiles_w;
        let plane = tiles_h * lanes;
        let total = tiles_d * plane;
        // Padded depths read (one on images), and a residue's rows of padded heights.
        let pd = if self.volumetric { M * tiles_d + 2 } else { 1 };
        let part_h = (tiles_h + 1) * lanes;
        rows.resize(N * pd * M * part_h);
        // One input row, zero-padded to whole tiles, and its residues `[r, t]` mod m.
        let run = tiles_w + 1;
        let mut padded = vec![zero; M * run];
        let mut residues = vec![zero; M * run];
        let inside = width.min(padded.len() - g.pad[2]);
        let src = &x[(c * g.n + n0) * volume..][..nb * volume];
        for d in 0..pd {
            let d_in = d.checked_sub(g.pad[0]).filter(|&d| d < depth);
            for p in 0..M * tiles_h + 2 {
                let at = (d * M + p % M) * part_h + (p / M) * lanes;
                let h_in = p.checked_sub(g.pad[1]).filter(|&h| h < height);
                for image in 0..nb {
                    let lane = at + image * tiles_w;
                    let dst: [_; N] = split_strided(rows, lane, pd * M * part_h, tiles_w);
                    let (Some(d_in), Some(h_in)) = (d_in, h_in) else {
                        for row in dst {
                            row.fill(zero);
                        }
                        continue;
                    };
                    let input = &src[image * volume + (d_in * height + h_in) * width..][..inside];
                    padded[g.pad[2]..][..inside].copy_from_slice(input);
                    for (t, tile) in padded.chunks_exact(M).enumerate() {
                        for (r, &value) in tile.iter().enumerate() {
                            residues[r * run + t] = value;
                        }
                    }
                    let src = std::array::from_fn(|i| &residues[(i % M) * run + i / M..]);
                    mix_rows(&Self::BT, src, dst);
                }
            }
        }
        let per_point = g.c * ld;
        if !self.volumetric {
            // Along the height, into V's rows of the points (ξ_h, ξ_w).
            for xi_w in 0..N {
                let src = residue_rows::<T, M, N>(&rows[xi_w * M * part_h..], part_h, lanes);
                let first = xi_w * per_point + c * ld;
                // SAFETY: channel c's rows of V, which the caller lends this call alone.
                let dst = unsafe { strided_rows(v, first, N * per_point, total) };
                mix_rows(&Self::BT, src, dst);
            }
            return;
        }
        // Along the height, into `stage`; then along the depth into V's rows of (ξ_d, ξ_h, ξ_w).
        let part_d = (tiles_d + 1) * plane;
        stage.resize(N * N * M * part_d);
        for xi_w in 0..N {
            for d in 0..pd {
                let rows = &rows[(xi_w * pd + d) * M * part_h..];
                let first = (xi_w * M + d % M) * part_d + (d / M) * plane;
                mix_rows(
                    &Self::BT,
                    residue_rows::<T, M, N>(rows, part_h, lanes),
                    split_strided(stage, first, N * M * part_d, plane),
                );
            }
        }
        for xi_hw in 0..N * N {
            let src = residue_rows::<T, M, N>(&stage[xi_hw * M * part_d..], part_d, plane);
            let first = xi_hw * per_point + c * ld;
            let stride = N * N * per_point;
            // SAFETY: channel c's rows of V, which the caller lends this call alone.
            let dst = unsafe { strided_rows(v, first, stride, total) };
            mix_rows(&Self::BT, src, dst);
        }
    }

    /// `y = Aᵀ M A` for output channel `oi` of the chunk's products `m`: `[points, O, T]` into
    /// `images` of `y`: `[O, N·S_out]`, dropping a tile's positions past the edge; `tmp` is
    /// scratch.
    ///
    /// # Safety
    /// `y` points to `O·N·S_out` values, and no other thread writes `images`.
    #[inline(always)]
    unsafe fn output_transform<T: Float>(
        &self,
        m: &[T],
        o: usize,
        oi: usize,
        images: Range<usize>,
        y: *mut T,
        tmp: &mut Scratch<T>,
    ) {
        let (n0, nb) = (images.start, images.len());
        let [tiles_d, tiles_h, tiles_w] = self.tiles;
        let lanes = nb * tiles_w;
        let total = tiles_d * tiles_h * lanes;
        let [d_out, h_out, w_out] = self.g.out();
        let jd = self.depth_tile();
        let m_row = |point: usize| &m[(point * o + oi) * total..][..total];
        // tmp: [j_d, ξ_h, ξ_w, T] after the depth (volumes only), [j_d, j_h, ξ_w, T] after the
        // height, [j_d, j_h, j_w, T] after the width.
        let by_depth_len = if self.volumetric {
            M * N * N * total
        } else {
            0
        };
        let by_height_len = jd * M * N * total;
        tmp.resize(by_depth_len + by_height_len + jd * M * M * total);
        let (by_depth, rest) = tmp.split_at_mut(by_depth_len);
        let (by_height, by_all) = rest.split_at_mut(by_height_len);
        if self.volumetric {
            for xi_hw in 0..N * N {
                let src = std::array::from_fn(|xi_d| m_row(xi_d * N * N + xi_hw));
                let dst = split_strided(by_depth, xi_hw * total, N * N * total, total);
                mix_rows(&Self::AT, src, dst);
            }
        }
        let by_depth = &*by_depth;
        let depth_row = |j_d: usize, xi_hw: usize| match self.volumetric {
            true => &by_depth[(j_d * N * N + xi_hw) * total..][..total],
            false => m_row(xi_hw),
        };
        for j_d in 0..jd {
            for xi_w in 0..N {
                let src = std::array::from_fn(|xi_h| depth_row(j_d, xi_h * N + xi_w));
                let first = (j_d * M * N + xi_w) * total;
                mix_rows(
                    &Self::AT,
                    src,
                    split_strided(by_height, first, N * total, total),
                );
            }
        }
        for j_dh in 0..jd * M {
            let src = std::array::from_fn(|xi_w| &by_height[(j_dh * N + xi_w) * total..][..total]);
            mix_rows(
                &Self::AT,
                src,
                split_strided(by_all, j_dh * M * total, total, total),
            );
        }
        // Each output row of each image at once, from the m rows `j_w` of its (j_d, j_h).
        let per_image = d_out * h_out * w_out;
        for (j_dh, by_w) in by_all.chunks(M * total).enumerate() {
            let (j_d, j_h) = (j_dh / M, j_dh % M);
            let by_w: [_; M] = std::array::from_fn(|j_w| &by_w[j_w * total..][..total]);
            for slice in 0..tiles_d * tiles_h {
                let (d, h) = (jd * (slice / tiles_h) + j_d, M * (slice % tiles_h) + j_h);
                if d >= d_out || h >= h_out {
                    continue;
                }
                for image in 0..nb {
                    let first = (oi * self.g.n + n0 + image) * per_image + (d * h_out + h) * w_out;
                    // SAFETY: row (image, d, h) lies inside the chunk's images of output
                    // channel `oi`, which no other thread writes.
                    let row = unsafe { std::slice::from_raw_parts_mut(y.add(first), w_out) };
                    let lane = slice * lanes + image * tiles_w;
                    for (t_w, outputs) in row.chunks_mut(M).enumerate() {
                        for (j_w, value) in outputs.iter_mut().enumerate() {
                            *value = by_w[j_w][lane + t_w];
                        }
                    }
                }
            }
        }
    }

    /// `A dY Aᵀ` of output channel `oi` of `images` of `dy`: `[O, N·S_out]`, its point `ξ`
    /// written as the `T` values at `out[ξ·point_stride..]` (positions past the edge have no
    /// gradient); `rows` and `stage` are scratch.
    ///
    /// # Safety
    /// `out` points to `points · point_stride` values, and no other thread reads or writes
    /// those written here meanwhile.
    #[inline(always)]
    unsafe fn output_grad_transform<T: Float>(
        &self,
        dy: &[T],
        oi: usize,
        images: Range<usize>,
        (out, point_stride): (*mut T, usize),
        [rows, stage]: [&mut Scratch<T>; 2],
    ) {
        let (n0, nb) = (images.start, images.len());
        let zero = T::from_f64(0.0);
        let [tiles_d, tiles_h, tiles_w] = self.tiles;
        let lanes = nb * tiles_w;
        let total = tiles_d * tiles_h * lanes;
        let [d_out, h_out, w_out] = self.g.out();
        let jd = self.depth_tile();
        let per_image = d_out * h_out * w_out;
        // rows[j_d, j_h, ξ_w, T]: along the width, A of each output row split by the residue
        // of its positions mod m (`[j, t]`, zero past the edge).
        rows.resize(jd * M * N * total);
        let mut residues = vec![zero; M * tiles_w];
        let src = &dy[(oi * self.g.n + n0) * per_image..][..nb * per_image];
        for d in 0..jd * tiles_d {
            let (j_d, t_d) = (d % jd, d / jd);
            for h in 0..M * tiles_h {
                let at = (j_d * M + h % M) * N * total + (t_d * tiles_h + h / M) * lanes;
                for image in 0..nb {
                    let lane = at + image * tiles_w;
                    let dst: [_; N] = split_strided(rows, lane, total, tiles_w);
                    if d >= d_out || h >= h_out {
                        for row in dst {
                            row.fill(zero);
                        }
                        continue;
                    }
                    let row = &src[image * per_image + (d * h_out + h) * w_out..][..w_out];
                    for (w, &value) in row.iter().enumerate() {
                        residues[(w % M) * tiles_w + w / M] = value;
                    }
                    let src = std::array::from_fn(|j| &residues[j * tiles_w..]);
                    mix_rows(&Self::A, src, dst);
                }
            }
        }
        let row = |j: usize, xi_w: usize| &rows[(j * N + xi_w) * total..][..total];
        if !self.volumetric {
            // Along the height, into the rows of the points (ξ_h, ξ_w).
            for xi_w in 0..N {
                let src = std::array::from_fn(|j_h| row(j_h, xi_w));
                // SAFETY: rows of this call's values, which the caller lends it alone.
                let dst =
                    unsafe { strided_rows(out, xi_w * point_stride, N * point_stride, total) };
                mix_rows(&Self::A, src, dst);
            }
            return;
        }
        // Along the height into stage[j_d, ξ_h, ξ_w, T], then along the depth.
        stage.resize(M * N * N * total);
        for j_d in 0..M {
            for xi_w in 0..N {
                let src = std::array::from_fn(|j_h| row(j_d * M + j_h, xi_w));
                let first = (j_d * N * N + xi_w) * total;
                mix_rows(&Self::A, src, split_strided(stage, first, N * total, total));
            }
        }
        for xi_hw in 0..N * N {
            let src = std::array::from_fn(|j_d| &stage[(j_d * N * N + xi_hw) * total..][..total]);
            let stride = N * N * point_stride;
            // SAFETY: rows of this call's values, which the caller lends it alone.
            let dst = unsafe { strided_rows(out, xi_hw * point_stride, stride, total) };
            mix_rows(&Self::A, src, dst);
        }
    }

    /// `V` of every input channel of chunk `chunk` of `chunks` of `x` into `v`, as
    /// [`Self::input_transform`] lays it out; returns the chunk's images, its tiles `T` and
    /// `V`'s row stride `ld`.
    fn chunk_input_transform<T: Float>(
        &self,
        x: &[T],
        (chunk, chunks): (usize, usize),
        v: &mut Scratch<T>,
        [rows, stage]: [&mut Scratch<T>; 2],
    ) -> (Range<usize>, usize, usize) {
        let images = chunk_images(self.g.n, chunks, chunk);
        let lane = images.len() * self.tiles_per_image();
        let ld = row_stride::<T>(lane);
        v.resize(self.points() * self.g.c * ld);
        vectorized(
            #[inline(always)]
            || {
                for c in 0..self.g.c {
                    // SAFETY: v holds `points·C·ld` values, and this task alone writes them.
                    unsafe {
                        self.input_transform(
                            x,
                            c,
                            images.clone(),
                            (v.as_mut_ptr(), ld),
                            [rows, stage],
                        )
                    };
                }
            },
        );
        (images, lane, ld)
    }

    /// Whether [`Self::forward`] and [`Self::weight_grad`] share out the steps of their
    /// `chunks` chunks rather than whole chunks: where there are fewer than
    /// [`STEPWISE_BELOW_CHUNKS`].
    fn stepwise(chunks: usize) -> bool {
        chunks < STEPWISE_BELOW_CHUNKS
    }

    /// The convolution of `x`: `[C, N, D, H, W]` with `w`: `[O, C·k_vol]` into `y`:
    /// `[O, N·S_out]`, every value written, on Candle's workers: chunk by chunk of images, or
    /// step by step of few chunks ([`Self::stepwise`]).
    pub fn forward<T: Float>(&self, x: &[T], w: &[T], y: &mut [T]) {
        let o = w.len() / (self.g.c * self.g.kernel_volume());
        self.forward_by(x, w, y, Self::stepwise(self.chunks(o)));
    }

    /// [`Self::forward`] step by step ([`Self::forward_stepwise`]) or chunk by chunk.
    pub(super) fn forward_by<T: Float>(&self, x: &[T], w: &[T], y: &mut [T], stepwise: bool) {
        let g = self.g;
        let o = w.len() / (g.c * g.kernel_volume());
        let points = self.points();
        let u = self.kernel_transform(w);
        let chunks = self.chunks(o);
        if stepwise {
            return self.forward_stepwise(x, &u, o, chunks, y);
        }
        let out = Shared(y.as_mut_ptr());
        for_each_index(
            chunks,
            <[Scratch<T>; 4]>::default,
            |[v, m, rows, stage]: &mut [Scratch<T>; 4], chunk| {
                let chunk = (chunk, chunks);
                let (images, lane, ld) = self.chunk_input_transform(x, chunk, v, [rows, stage]);
                m.resize(points * o * lane);
                for xi in 0..points {
                    // SAFETY: m, u and v hold `points` blocks of the sizes read and written.
                    unsafe {
                        gemm_into(
                            (o, lane, g.c),
                            (m[xi * o * lane..].as_mut_ptr(), lane, 1),
                            (u[xi * o * g.c..].as_ptr(), g.c, 1),
                            (v[xi * g.c * ld..].as_ptr(), ld, 1),
                            false,
                        );
                    }
                }
                let out = &out;
                vectorized(
                    #[inline(always)]
                    || {
                        for oi in 0..o {
                            // SAFETY: `y` is [O, N·S_out]; this chunk writes its own images.
                            let images = images.clone();
                            unsafe { self.output_transform(m, o, oi, images, out.0, stage) };
                        }
                    },
                );
            },
        );
    }

    /// The first step of [`Self::forward_stepwise`] and [`Self::weight_grad_stepwise`]: their
    /// chunks laid out one after another, every chunk's `V` of `x` in one buffer (a block of
    /// [`STEP_CHANNELS`] input channels of a chunk a task), and room for every chunk's
    /// `out_values(T, ld)` products or transformed gradients in another.
    fn stepwise_inputs<T: Float>(
        &self,
        x: &[T],
        chunks: usize,
        out_values: impl Fn(usize, usize) -> usize,
    ) -> (Vec<StepChunk>, Scratch<T>, Scratch<T>) {
        let (mut v_len, mut out_len) = (0, 0);
        let layout: Vec<_> = (0..chunks)
            .map(|chunk| {
                let images = chunk_images(self.g.n, chunks, chunk);
                let lane = images.len() * self.tiles_per_image();
                let ld = row_stride::<T>(lane);
                let step = StepChunk {
                    images,
                    lane,
                    ld,
                    v_at: v_len,
                    out_at: out_len,
                };
                v_len += self.points() * self.g.c * ld;
                out_len += out_values(lane, ld);
                step
            })
            .collect();
        let (mut v, mut out) = (Scratch::<T>::default(), Scratch::<T>::default());
        v.resize(v_len);
        out.resize(out_len);
        let v_ptr = Shared(v.as_mut_ptr());
        for_each_step_channel(
            &layout,
            self.g.c,
            <[Scratch<T>; 2]>::default,
            #[inline(always)]
            |[rows, stage]: &mut [Scratch<T>; 2], step, ci| {
                let v_ptr = &v_ptr;
                // SAFETY: the chunk's V, `points·C·ld` values from `v_at`, lies in `v`; this task
                // alone writes channel ci's rows of it.
                unsafe {
                    let v = (v_ptr.0.add(step.v_at), step.ld);
                    self.input_transform(x, ci, step.images.clone(), v, [rows, stage]);
                }
            },
        );
        (layout, v, out)
    }

    /// [`Self::forward`] of few chunks, each step shared among the workers: the input transform
    /// a block of [`STEP_CHANNELS`] input channels of a chunk a task, then the products a point
    /// of a chunk a task, then the output transform a block of output channels of a chunk a
    /// task. The same values as chunk by chunk.
    fn forward_stepwise<T: Float>(&self, x: &[T], u: &[T], o: usize, chunks: usize, y: &mut [T]) {
        let (c, points) = (self.g.c, self.points());
        let (layout, v, mut m) = self.stepwise_inputs(x, chunks, |lane, _| points * o * lane);
        let m_ptr = Shared(m.as_mut_ptr());
        for_each_index(
            chunks * points,
            || (),
            |_, task| {
                let m_ptr = &m_ptr;
                let (step, xi) = (&layout[task / points], task % points);
                // SAFETY: the chunk's M and V, from `out_at` and `v_at`, hold `points` blocks of
                // the sizes written and read; this task alone writes block ξ of its M.
                unsafe {
                    gemm_into(
                        (o, step.lane, c),
                        (m_ptr.0.add(step.out_at + xi * o * step.lane), step.lane, 1),
                        (u[xi * o * c..].as_ptr(), c, 1),
                        (v[step.v_at + xi * c * step.ld..].as_ptr(), step.ld, 1),
                        false,
                    );
                }
            },
        );
        let out = Shared(y.as_mut_ptr());
        for_each_step_channel(
            &layout,
            o,
            Scratch::default,
            #[inline(always)]
            |tmp, step, oi| {
                let out = &out;
                let m = &m[step.out_at..];
                // SAFETY: `y` is [O, N·S_out]; this task alone writes channel oi of the chunk's
                // images.
                unsafe { self.output_transform(m, o, oi, step.images.clone(), out.0, tmp) };
            },
        );
    }

    /// `dU`: `[points, C, O]` of [`Self::weight_grad`] for few chunks, each step shared among
    /// the workers: `V` and `Ŷ` of every chunk a block of channels of a chunk a task, then the
    /// products a point a task, summed over the chunks in order. Every value written.
    fn weight_grad_stepwise<T: Float>(&self, x: &[T], dy: &[T], o: usize, chunks: usize) -> Vec<T> {
        let (c, points) = (self.g.c, self.points());
        let (layout, v, mut dyt) = self.stepwise_inputs(x, chunks, |_, ld| points * o * ld);
        let dyt_ptr = Shared(dyt.as_mut_ptr());
        for_each_step_channel(
            &layout,
            o,
            <[Scratch<T>; 2]>::default,
            #[inline(always)]
            |[rows, stage]: &mut [Scratch<T>; 2], step, oi| {
                let dyt_ptr = &dyt_ptr;
                // SAFETY: the chunk's Ŷ, `points·O·ld` values from `out_at`, lies in `dyt`; this
                // task alone writes channel oi's rows of it.
                unsafe {
                    let out = (dyt_ptr.0.add(step.out_at + oi * step.ld), o * step.ld);
                    self.output_grad_transform(dy, oi, step.images.clone(), out, [rows, stage]);
                }
            },
        );
        let write = |du: &mut [T]| {
            let du_ptr = Shared(du.as_mut_ptr());
            for_each_index(
                points,
                || (),
                |_, xi| {
                    let du_ptr = &du_ptr;
                    for (i, step) in layout.iter().enumerate() {
                        // SAFETY: dU holds `points` blocks of `C·O` values, this task's block
                        // ξ alone; the chunk's V and Ŷ hold the blocks read.
                        unsafe {
                            gemm_into(
                                (c, o, step.lane),
                                (du_ptr.0.add(xi * c * o), o, 1),
                                (v[step.v_at + xi * c * step.ld..].as_ptr(), step.ld, 1),
                                (dyt[step.out_at + xi * o * step.ld..].as_ptr(), 1, step.ld),
                                i > 0,
                            );
                        }
                    }
                },
            );
        };
        // SAFETY: chunk 0's product writes every value of each block ξ, the others add to it.
        unsafe { written_whole(points * c * o, write) }
    }

    /// The weight gradient `dW`: `[O, C·k_vol]` of [`Self::forward`] from `dy`:
    /// `[O, N·S_out]`, as partial sums over groups of chunks ([`group_partial_sums`]) of
    /// `dUᵀ[ξ] (C × O) = V[ξ] · Ŷ[ξ]ᵀ` with `Ŷ = A dY Aᵀ`, added in a fixed order, then `Gᵀ dU G`.
    ///
    /// `Ŷ` is kept as `[points, O, T]` and read transposed by the GEMM: on row 1 of the step bench
    /// that costs the GEMMs 60 ms more a step than a `[16, T, O]` copy would, and saves the
    /// copy's 90 ms.
    ///
    /// Of few chunks ([`Self::stepwise`]), `dU` is one sum over the chunks in order, its
    /// steps shared out as in the forward ([`Self::weight_grad_stepwise`]).
    pub fn weight_grad<T: Float>(&self, x: &[T], dy: &[T], dw: &mut [T]) {
        let o = dw.len() / (self.g.c * self.g.kernel_volume());
        self.weight_grad_by(x, dy, dw, Self::stepwise(self.chunks(o)));
    }

    /// [`Self::weight_grad`] step by step or chunk by chunk.
    pub(super) fn weight_grad_by<T: Float>(&self, x: &[T], dy: &[T], dw: &mut [T], stepwise: bool) {
        let g = self.g;
        let kv = g.kernel_volume();
        let o = dw.len() / (g.c * kv);
        let points = self.points();
        let chunks = self.chunks(o);
        let partials = if stepwise {
            vec![self.weight_grad_stepwise(x, dy, o, chunks)]
        } else {
            group_partial_sums(
                chunks,
                points * g.c * o,
                <[Scratch<T>; 4]>::default,
                |[v, dyt, rows, stage]: &mut [Scratch<T>; 4], chunk, du| {
                    let chunk = (chunk, chunks);
                    let (images, lane, ld) = self.chunk_input_transform(x, chunk, v, [rows, stage]);
                    dyt.resize(points * o * ld);
                    vectorized(
                        #[inline(always)]
                        || {
                            for oi in 0..o {
                                let out = (dyt[oi * ld..].as_mut_ptr(), o * ld);
                                let images = images.clone();
                                // SAFETY: dyt holds `points · O · ld` values, this task's own.
                                unsafe {
                                    self.output_grad_transform(dy, oi, images, out, [rows, stage])
                                };
                            }
                        },
                    );
                    for xi in 0..points {
                        // SAFETY: du, v and dyt hold `points` blocks of the sizes used.
                        unsafe {
                            gemm_into(
                                (g.c, o, lane),
                                (du[xi * g.c * o..].as_mut_ptr(), o, 1),
                                (v[xi * g.c * ld..].as_ptr(), ld, 1),
                                (dyt[xi * o * ld..].as_ptr(), 1, ld),
                                true,
                            );
                        }
                    }
                },
            )
        };
        // Per block of input channels on the workers: for each channel, the partial sums in
        // group order and `Gᵀ dU G` from the [(n,) n, n, O] points to the [(3,) 3, 3, O] taps;
        // then the block's taps into dW's layout, a run of them per output channel.
        let dw_ptr = Shared(dw.as_mut_ptr());
        let first = self.first_axis();
        for_each_index(
            g.c.div_ceil(GRAD_CHANNEL_BLOCK),
            || [(); 3].map(|_| Vec::new()),
            |[sum, tmp, taps]: &mut [Vec<T>; 3], block| {
                let dw_ptr = &dw_ptr;
                let channels =
                    block * GRAD_CHANNEL_BLOCK..g.c.min((block + 1) * GRAD_CHANNEL_BLOCK);
                taps.clear();
                for c in channels.clone() {
                    sum.clear();
                    for xi in 0..points {
                        let row = (xi * g.c + c) * o;
                        let start = sum.len();
                        sum.extend_from_slice(&partials[0][row..][..o]);
                        for partial in &partials[1..] {
                            for (s, &p) in sum[start..].iter_mut().zip(&partial[row..][..o]) {
                                *s += p;
                            }
                        }
                    }
                    vectorized(
                        #[inline(always)]
                        || transform_axes(&Self::GT, sum, tmp, [points / (N * N), N, N, o], first),
                    );
                    taps.extend_from_slice(sum);
                }
                // taps: [channel, tap, O].
                let run = channels.len() * kv;
                for oi in 0..o {
                    // SAFETY: dW is [O, C, k_vol]; this task alone writes input channels
                    // `channels`, a run of `run` values in each output channel's row.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            dw_ptr.0.add((oi * g.c + channels.start) * kv),
                            run,
                        )
                    };
                    for (i, value) in dst.iter_mut().enumerate() {
                        *value = taps[i * o + oi];
                    }
                }
            },
        );
    }
}

/// `coef` (`[I, J]`) along axes `first..3` of `buf`, a row-major block of shape `dims` whose
/// last axis is a lane of independent values; `tmp` is scratch. On return `buf` holds the
/// result, of extent `I` on those axes.
#[inline(always)]
fn transform_axes<T: Float, const I: usize, const J: usize>(
    coef: &[[f64; J]; I],
    buf: &mut Vec<T>,
    tmp: &mut Vec<T>,
    mut dims: [usize; 4],
    first: usize,
) {
    for axis in first..3 {
        debug_assert_eq!(dims[axis], J);
        let inner: usize = dims[axis + 1..].iter().product();
        tmp.resize(buf.len() / J * I, T::from_f64(0.0));
        for (src, dst) in buf.chunks(J * inner).zip(tmp.chunks_mut(I * inner)) {
            let src = std::array::from_fn(|j| &src[j * inner..][..inner]);
            mix_rows(coef, src, split_strided(dst, 0, inner, inner));
        }
        dims[axis] = I;
        std::mem::swap(buf, tmp);
    }
}

/// `dst[i] = Σ_j coef[i][j] · src[j]` lane by lane, for the `dst` rows' lanes: a transform
/// along one axis, on rows of independent lanes. Inlined with a constant `coef`, its loops
/// unroll, and its products by ±1 and zeros fold away.
#[inline(always)]
fn mix_rows<T: Float, const I: usize, const J: usize>(
    coef: &[[f64; J]; I],
    src: [&[T]; J],
    dst: [&mut [T]; I],
) {
    let n = dst[0].len();
    let src = src.map(|row| &row[..n]);
    let dst = dst.map(|row| &mut row[..n]);
    for lane in 0..n {
        let mut values = [T::from_f64(0.0); J];
        for j in 0..J {
            values[j] = src[j][lane];
        }
        for i in 0..I {
            let mut sum = None;
            for j in 0..J {
                if coef[i][j] != 0.0 {
                    let term = T::from_f64(coef[i][j]) * values[j];
                    sum = Some(match sum {
                        Some(sum) => sum + term,
                        None => term,
                    });
                }
            }
            dst[i][lane] = sum.unwrap_or(T::from_f64(0.0));
        }
    }
}

/// The rows `i` of `base` at `(i mod m)·part + ⌊i/m⌋·step`, each to its end: where rows are
/// kept split by the residue of their position mod m (each residue's rows `step` apart, one
/// residue `part` after the other), row `m·t + i` of every `t` at once.
fn residue_rows<T, const M: usize, const R: usize>(
    base: &[T],
    part: usize,
    step: usize,
) -> [&[T]; R] {
    std::array::from_fn(|i| &base[(i % M) * part + (i / M) * step..])
}

/// `N` disjoint rows of `len` values of `buf`, the first at `first` and each `stride` after the
/// one before.
fn split_strided<T, const N: usize>(
    buf: &mut [T],
    first: usize,
    stride: usize,
    len: usize,
) -> [&mut [T]; N] {
    assert!(stride >= len && first + (N - 1) * stride + len <= buf.len());
    // SAFETY: the rows lie inside `buf` (checked), which is borrowed mutably while they live.
    unsafe { strided_rows(buf.as_mut_ptr(), first, stride, len) }
}

/// [`split_strided`] of the buffer at `ptr`.
///
/// # Safety
/// The rows lie inside one allocation, `stride ≥ len`, and nothing else reads or writes them
/// while they live.
unsafe fn strided_rows<'a, T, const N: usize>(
    ptr: *mut T,
    first: usize,
    stride: usize,
    len: usize,
) -> [&'a mut [T]; N] {
    debug_assert!(stride >= len);
    // SAFETY: as the caller promises.
    std::array::from_fn(|i| unsafe {
        std::slice::from_raw_parts_mut(ptr.add(first + i * stride), len)
    })
}

/// `f(scratch, chunk, channel)` for every chunk of `layout` and each of `channels` channels, a
/// block of [`STEP_CHANNELS`] channels of a chunk a task on Candle's workers, vectorised: the
/// transforms of [`Minimal::forward_stepwise`] and [`Minimal::weight_grad_stepwise`].
#[inline(always)]
fn for_each_step_channel<S>(
    layout: &[StepChunk],
    channels: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &StepChunk, usize) + Sync,
) {
    let blocks = channels.div_ceil(STEP_CHANNELS);
    for_each_index(layout.len() * blocks, init, |scratch, task| {
        let (step, block) = (&layout[task / blocks], task % blocks);
        vectorized(
            #[inline(always)]
            || {
                for channel in block * STEP_CHANNELS..channels.min((block + 1) * STEP_CHANNELS) {
                    f(scratch, step, channel);
                }
            },
        );
    });
}

/// A chunk of images of [`Minimal::forward_stepwise`] or [`Minimal::weight_grad_stepwise`]:
/// its tiles `T` (`lane`), its `V`'s row stride, and where its `V` and its products (or
/// transformed gradients) begin in the buffers of every chunk.
struct StepChunk {
    images: Range<usize>,
    lane: usize,
    ld: usize,
    v_at: usize,
    out_at: usize,
}
