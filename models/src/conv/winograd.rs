//! Winograd's minimal filtering F(2, 3) on every axis of a stride-1 3×3 or 3×3×3 convolution:
//! F(2×2, 3×3) and F(2×2×2, 3×3×3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural
//! Networks", CVPR 2016, eq. 7–8, nested per axis).
//!
//! Each 2×2 (2×2×2) output tile `Y` is `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A` of its 4×4 (4×4×4) input
//! tile `d`, which overlaps its neighbours by 2, and the kernel `g`, the transforms applied
//! along every axis. Summed over input channels, the element-wise products become one GEMM per
//! transform point `ξ` (16, or 64): `M[ξ] (O × T) = U[ξ] (O × C) · V[ξ] (C × T)` over the `T`
//! tiles, with `U = G g Gᵀ` and `V = Bᵀ d B`: 16 multiply-adds per output channel, input
//! channel and tile where im2col spends 36 (64 where it spends 216), and a tile's padding is
//! never multiplied by the taps that miss the image.
//!
//! The backward is the same algorithm transposed: the weight gradient is
//! `dU[ξ] = Σ_t (A dY Aᵀ)[ξ, t] · V[ξ, t]` and `dW = Gᵀ dU G`, and the input gradient of a
//! stride-1 convolution is the forward of its dual convolution (`dy` with the flipped kernel,
//! see `conv.rs`), which takes this path as well. F(2, 3)'s transforms have coefficients 0, ±½
//! and ±1, so its rounding error is that of im2col (tested against it).
//!
//! Every transform is a small matrix applied to rows of lanes. A chunk's tiles are ordered
//! `[t_d, t_h, image, t_w]`, so one row holds a transform point of every tile of the chunk: the
//! width transforms read the even and odd positions of each input row, the height and depth
//! transforms read rows kept split by the parity of their position, shifted by one tile, and
//! all of them run over whole rows.

use std::ops::Range;

use ssl_linalg::for_each_index;

use super::{group_partial_sums, Geom, Shared, CHUNK_VALUES};
use crate::util::{gemm_into, row_stride, vectorized, Float, Scratch};

/// Input transform `Bᵀ` of F(2, 3).
const BT: [[f64; 4]; 4] = [
    [1.0, 0.0, -1.0, 0.0],
    [0.0, 1.0, 1.0, 0.0],
    [0.0, -1.0, 1.0, 0.0],
    [0.0, 1.0, 0.0, -1.0],
];
/// Kernel transform `G` of F(2, 3).
const G: [[f64; 3]; 4] = [
    [1.0, 0.0, 0.0],
    [0.5, 0.5, 0.5],
    [0.5, -0.5, 0.5],
    [0.0, 0.0, 1.0],
];
/// Output transform `Aᵀ` of F(2, 3).
const AT: [[f64; 4]; 2] = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];
/// `A`, which carries an output tile's gradient back to the transform points.
const A: [[f64; 2]; 4] = [[1.0, 0.0], [1.0, 1.0], [1.0, -1.0], [0.0, -1.0]];
/// `Gᵀ`, which carries the transformed kernel's gradient back to the taps.
const GT: [[f64; 4]; 3] = [
    [1.0, 0.5, 0.5, 0.0],
    [0.0, 0.5, -0.5, 0.0],
    [0.0, 0.5, 0.5, 1.0],
];

/// Fewest input and output channels for which the transforms pay: below it (the stem's 1–3
/// image channels) the GEMMs are too shallow and im2col's single deep GEMM is faster.
const MIN_CHANNELS: usize = 16;

/// Fewest tiles in a chunk's products: each `U[ξ]` (`O × C`, 16 or 64 of them) is streamed
/// once per chunk, so with fewer tiles the GEMMs wait on memory (the 3D ResNet's 2³ and 4³
/// layers, 1 and 8 tiles a volume at 4 volumes a view, were 3× slower than im2col).
const MIN_TILES: usize = 64;

/// Channel pairs per block of the kernel transform: its rows of taps stay in L2.
const KERNEL_LANES: usize = 1024;

/// Output positions of a tile per axis, input positions of a tile per axis.
const TILE: usize = 2;
const ALPHA: usize = 4;

/// The tiling of one convolution geometry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Winograd {
    g: Geom,
    /// A 3×3×3 kernel on volumes; else a 3×3 kernel on images (depth 1, one tile deep).
    volumetric: bool,
    /// Tiles along the depth, the height and the width.
    tiles: [usize; 3],
}

impl Winograd {
    /// The tiling of `g` with `o` output channels, where F(2, 3) applies: a 3×3 or 3×3×3
    /// kernel at stride 1 with padding ≤ 2, at least [`MIN_CHANNELS`] channels in and out.
    pub fn new(g: Geom, o: usize) -> Option<Self> {
        let volumetric = g.k == [3, 3, 3];
        let fits = (volumetric || g.k == [1, 3, 3] && g.pad[0] == 0)
            && g.stride == [1, 1, 1]
            && g.pad.iter().all(|&p| p <= 2)
            && g.c.min(o) >= MIN_CHANNELS;
        let out = g.out();
        let tiles = [
            if volumetric {
                out[0].div_ceil(TILE)
            } else {
                out[0]
            },
            out[1].div_ceil(TILE),
            out[2].div_ceil(TILE),
        ];
        let many_tiles = g.n * tiles.iter().product::<usize>() >= MIN_TILES;
        (fits && many_tiles).then_some(Self {
            g,
            volumetric,
            tiles,
        })
    }

    /// Output positions of a tile along the depth: 2 on volumes, 1 on images.
    fn depth_tile(&self) -> usize {
        if self.volumetric {
            TILE
        } else {
            1
        }
    }

    /// Transform points per tile: 16 on images, 64 on volumes.
    fn points(&self) -> usize {
        if self.volumetric {
            ALPHA * ALPHA * ALPHA
        } else {
            ALPHA * ALPHA
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

    /// Images per chunk: the larger of a chunk's transformed input and output about
    /// [`CHUNK_VALUES`], and at least 8 chunks when the batch allows, but at least
    /// [`MIN_TILES`] tiles; fixed by the shapes.
    fn images_per_chunk(&self, o: usize) -> usize {
        let tiles = self.tiles_per_image();
        let per_image = self.points() * self.g.c.max(o) * tiles;
        let by_size = (CHUNK_VALUES / per_image.max(1)).clamp(1, self.g.n.div_ceil(8).max(1));
        by_size.max(MIN_TILES.div_ceil(tiles)).min(self.g.n)
    }

    /// `U = G g Gᵀ`: `[points, O·C]` from the kernel `w`: `[O, C·k_vol]`, a block of
    /// [`KERNEL_LANES`] (output, input) channel pairs at a time on Candle's workers.
    fn kernel_transform<T: Float>(&self, w: &[T]) -> Vec<T> {
        let kv = self.g.kernel_volume();
        let oc = w.len() / kv;
        let mut u = vec![T::from_f64(0.0); self.points() * oc];
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
                    || transform_axes(&G, buf, tmp, dims, self.first_axis()),
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
        u
    }

    /// `V = Bᵀ d B` of channel `c` of `images` of `x`: `[C, N, D, H, W]`, written at
    /// `v[(ξ·C + c)·ld + t]` for the `T` tiles `t` (`ld` ≥ `T`, a [`row_stride`]: the weight
    /// gradient's GEMM packs `V` down its columns); `rows` and `stage` are scratch.
    ///
    /// First along the width, as each zero-padded input row is read: split into its even and
    /// odd positions `e` and `o`, it gives the rows `e[t] − e[t+1]`, `o[t] + e[t+1]`,
    /// `e[t+1] − o[t]` and `o[t] − o[t+1]` over its tiles `t`. These are kept as
    /// `rows[ξ_w, padded d, parity of the padded h, padded h / 2, image, t_w]`, so that input
    /// row `2·t_h + i` of every tile row `t_h` is one run of lanes, shifted by `i / 2` rows;
    /// the height transform reads them so, and on volumes writes
    /// `stage[ξ_h, ξ_w, parity of the padded d, padded d / 2, t_h, image, t_w]` for the depth
    /// transform to read the same way.
    #[inline(always)]
    fn input_transform<T: Float>(
        &self,
        x: &[T],
        c: usize,
        images: Range<usize>,
        (v, ld): (&mut [T], usize),
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
        // Padded depths read (one on images), and a parity's rows of padded heights.
        let pd = if self.volumetric {
            TILE * tiles_d + 2
        } else {
            1
        };
        let half_h = (tiles_h + 1) * lanes;
        rows.resize(ALPHA * pd * 2 * half_h);
        // One input row, zero-padded to the tiles' width, and its even and odd positions.
        let mut padded = vec![zero; TILE * tiles_w + 2];
        let (mut even, mut odd) = (vec![zero; tiles_w + 1], vec![zero; tiles_w + 1]);
        let inside = width.min(padded.len() - g.pad[2]);
        let src = &x[(c * g.n + n0) * volume..][..nb * volume];
        for d in 0..pd {
            let d_in = d.checked_sub(g.pad[0]).filter(|&d| d < depth);
            for p in 0..TILE * tiles_h + 2 {
                let at = (d * 2 + p % 2) * half_h + (p / 2) * lanes;
                let h_in = p.checked_sub(g.pad[1]).filter(|&h| h < height);
                for image in 0..nb {
                    let lane = at + image * tiles_w;
                    let [r0, r1, r2, r3] = split_strided(rows, lane, pd * 2 * half_h, tiles_w);
                    let (Some(d_in), Some(h_in)) = (d_in, h_in) else {
                        for row in [r0, r1, r2, r3] {
                            row.fill(zero);
                        }
                        continue;
                    };
                    let input = &src[image * volume + (d_in * height + h_in) * width..][..inside];
                    padded[g.pad[2]..][..inside].copy_from_slice(input);
                    for ((e, o), pair) in even.iter_mut().zip(&mut odd).zip(padded.chunks_exact(2))
                    {
                        (*e, *o) = (pair[0], pair[1]);
                    }
                    let (e0, e1) = (&even[..tiles_w], &even[1..]);
                    let (o0, o1) = (&odd[..tiles_w], &odd[1..]);
                    for t in 0..tiles_w {
                        r0[t] = e0[t] - e1[t];
                        r1[t] = o0[t] + e1[t];
                        r2[t] = e1[t] - o0[t];
                        r3[t] = o0[t] - o1[t];
                    }
                }
            }
        }
        let per_point = g.c * ld;
        if !self.volumetric {
            // Along the height, into V's rows of the points (ξ_h, ξ_w).
            for xi_w in 0..ALPHA {
                let src = parity_rows(&rows[xi_w * 2 * half_h..], half_h, lanes, plane);
                let first = xi_w * per_point + c * ld;
                mix_rows(&BT, src, split_strided(v, first, ALPHA * per_point, total));
            }
            return;
        }
        // Along the height, into `stage`; then along the depth into V's rows of (ξ_d, ξ_h, ξ_w).
        let half_d = (tiles_d + 1) * plane;
        stage.resize(ALPHA * ALPHA * 2 * half_d);
        for xi_w in 0..ALPHA {
            for d in 0..pd {
                let src = parity_rows(&rows[(xi_w * pd + d) * 2 * half_h..], half_h, lanes, plane);
                let first = (xi_w * 2 + d % 2) * half_d + (d / 2) * plane;
                mix_rows(
                    &BT,
                    src,
                    split_strided(stage, first, ALPHA * 2 * half_d, plane),
                );
            }
        }
        for xi_hw in 0..ALPHA * ALPHA {
            let src = parity_rows(&stage[xi_hw * 2 * half_d..], half_d, plane, total);
            let first = xi_hw * per_point + c * ld;
            let stride = ALPHA * ALPHA * per_point;
            mix_rows(&BT, src, split_strided(v, first, stride, total));
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
            TILE * ALPHA * ALPHA * total
        } else {
            0
        };
        let by_height_len = jd * TILE * ALPHA * total;
        tmp.resize(by_depth_len + by_height_len + jd * TILE * TILE * total);
        let (by_depth, rest) = tmp.split_at_mut(by_depth_len);
        let (by_height, by_all) = rest.split_at_mut(by_height_len);
        if self.volumetric {
            for xi_hw in 0..ALPHA * ALPHA {
                let src = std::array::from_fn(|xi_d| m_row(xi_d * ALPHA * ALPHA + xi_hw));
                let dst = split_strided(by_depth, xi_hw * total, ALPHA * ALPHA * total, total);
                mix_rows(&AT, src, dst);
            }
        }
        let by_depth = &*by_depth;
        let depth_row = |j_d: usize, xi_hw: usize| match self.volumetric {
            true => &by_depth[(j_d * ALPHA * ALPHA + xi_hw) * total..][..total],
            false => m_row(xi_hw),
        };
        for j_d in 0..jd {
            for xi_w in 0..ALPHA {
                let src = std::array::from_fn(|xi_h| depth_row(j_d, xi_h * ALPHA + xi_w));
                let first = (j_d * TILE * ALPHA + xi_w) * total;
                mix_rows(
                    &AT,
                    src,
                    split_strided(by_height, first, ALPHA * total, total),
                );
            }
        }
        for j_dh in 0..jd * TILE {
            let src =
                std::array::from_fn(|xi_w| &by_height[(j_dh * ALPHA + xi_w) * total..][..total]);
            mix_rows(
                &AT,
                src,
                split_strided(by_all, j_dh * TILE * total, total, total),
            );
        }
        let per_image = d_out * h_out * w_out;
        for (row, values) in by_all.chunks(total).enumerate() {
            let (j_d, j_h, j_w) = (row / (TILE * TILE), (row / TILE) % TILE, row % TILE);
            for (slice, values) in values.chunks(lanes).enumerate() {
                let (d, h) = (jd * (slice / tiles_h) + j_d, TILE * (slice % tiles_h) + j_h);
                if d >= d_out || h >= h_out {
                    continue;
                }
                let count = (w_out - j_w).div_ceil(TILE);
                for (image, values) in values.chunks(tiles_w).enumerate() {
                    let first =
                        (oi * self.g.n + n0 + image) * per_image + (d * h_out + h) * w_out + j_w;
                    for (t_w, &value) in values[..count].iter().enumerate() {
                        // SAFETY: (image, d, h, 2·t_w + j_w) lies inside the chunk's images
                        // of output channel `oi`.
                        unsafe { *y.add(first + TILE * t_w) = value };
                    }
                }
            }
        }
    }

    /// `A dY Aᵀ` of output channel `oi` of `images` of `dy`: `[O, N·S_out]`, its point `ξ`
    /// written as the `T` values at `out[ξ·point_stride..]` (positions past the edge have no
    /// gradient); `rows` and `stage` are scratch.
    #[inline(always)]
    fn output_grad_transform<T: Float>(
        &self,
        dy: &[T],
        oi: usize,
        images: Range<usize>,
        (out, point_stride): (&mut [T], usize),
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
        // rows[j_d, j_h, ξ_w, T]: along the width, A of each output row's pairs.
        rows.resize(jd * TILE * ALPHA * total);
        let src = &dy[(oi * self.g.n + n0) * per_image..][..nb * per_image];
        for d in 0..jd * tiles_d {
            let (j_d, t_d) = (d % jd, d / jd);
            for h in 0..TILE * tiles_h {
                let at = (j_d * TILE + h % 2) * ALPHA * total + (t_d * tiles_h + h / 2) * lanes;
                for image in 0..nb {
                    let lane = at + image * tiles_w;
                    let [r0, r1, r2, r3] = split_strided(rows, lane, total, tiles_w);
                    if d >= d_out || h >= h_out {
                        for row in [r0, r1, r2, r3] {
                            row.fill(zero);
                        }
                        continue;
                    }
                    let row = &src[image * per_image + (d * h_out + h) * w_out..][..w_out];
                    for t in 0..tiles_w {
                        let e = row[TILE * t];
                        let o = row.get(TILE * t + 1).copied().unwrap_or(zero);
                        (r0[t], r1[t], r2[t], r3[t]) = (e, e + o, e - o, zero - o);
                    }
                }
            }
        }
        if !self.volumetric {
            // Along the height, into the rows of the points (ξ_h, ξ_w).
            for xi_w in 0..ALPHA {
                let src = parity_rows(&rows[xi_w * total..], ALPHA * total, 0, total);
                let dst = split_strided(out, xi_w * point_stride, ALPHA * point_stride, total);
                mix_rows(&A, src, dst);
            }
            return;
        }
        // Along the height into stage[j_d, ξ_h, ξ_w, T], then along the depth.
        stage.resize(TILE * ALPHA * ALPHA * total);
        for j_d in 0..TILE {
            for xi_w in 0..ALPHA {
                let src = parity_rows(
                    &rows[(j_d * TILE * ALPHA + xi_w) * total..],
                    ALPHA * total,
                    0,
                    total,
                );
                let first = (j_d * ALPHA * ALPHA + xi_w) * total;
                mix_rows(&A, src, split_strided(stage, first, ALPHA * total, total));
            }
        }
        for xi_hw in 0..ALPHA * ALPHA {
            let src = parity_rows(&stage[xi_hw * total..], ALPHA * ALPHA * total, 0, total);
            let stride = ALPHA * ALPHA * point_stride;
            mix_rows(
                &A,
                src,
                split_strided(out, xi_hw * point_stride, stride, total),
            );
        }
    }

    /// `V` of every input channel of chunk `chunk` (of `nb` images) of `x` into `v`, as
    /// [`Self::input_transform`] lays it out; returns the chunk's images, its tiles `T` and
    /// `V`'s row stride `ld`.
    fn chunk_input_transform<T: Float>(
        &self,
        x: &[T],
        chunk: usize,
        nb: usize,
        v: &mut Scratch<T>,
        [rows, stage]: [&mut Scratch<T>; 2],
    ) -> (Range<usize>, usize, usize) {
        let n0 = chunk * nb;
        let images = n0..n0 + nb.min(self.g.n - n0);
        let lane = images.len() * self.tiles_per_image();
        let ld = row_stride::<T>(lane);
        v.resize(self.points() * self.g.c * ld);
        vectorized(
            #[inline(always)]
            || {
                for c in 0..self.g.c {
                    self.input_transform(x, c, images.clone(), (v, ld), [rows, stage]);
                }
            },
        );
        (images, lane, ld)
    }

    /// The convolution of `x`: `[C, N, D, H, W]` with `w`: `[O, C·k_vol]` into `y`:
    /// `[O, N·S_out]`, chunk by chunk of images on Candle's workers.
    pub fn forward<T: Float>(&self, x: &[T], w: &[T], y: &mut [T]) {
        let g = self.g;
        let o = w.len() / (g.c * g.kernel_volume());
        let points = self.points();
        let u = self.kernel_transform(w);
        let nb = self.images_per_chunk(o);
        let out = Shared(y.as_mut_ptr());
        for_each_index(
            g.n.div_ceil(nb),
            <[Scratch<T>; 4]>::default,
            |[v, m, rows, stage]: &mut [Scratch<T>; 4], chunk| {
                let (images, lane, ld) = self.chunk_input_transform(x, chunk, nb, v, [rows, stage]);
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

    /// The weight gradient `dW`: `[O, C·k_vol]` of [`Self::forward`] from `dy`:
    /// `[O, N·S_out]`, as partial sums over groups of chunks ([`group_partial_sums`]) of
    /// `dUᵀ[ξ] (C × O) = V[ξ] · Ŷ[ξ]ᵀ` with `Ŷ = A dY Aᵀ`, added in a fixed order, then `Gᵀ dU G`.
    ///
    /// `Ŷ` is kept as `[points, O, T]` and read transposed by the GEMM: on row 1 of the step bench
    /// that costs the GEMMs 60 ms more a step than a `[16, T, O]` copy would, and saves the
    /// copy's 90 ms.
    pub fn weight_grad<T: Float>(&self, x: &[T], dy: &[T], dw: &mut [T]) {
        let g = self.g;
        let kv = g.kernel_volume();
        let o = dw.len() / (g.c * kv);
        let points = self.points();
        let nb = self.images_per_chunk(o);
        let chunks = g.n.div_ceil(nb);
        let partials = group_partial_sums(
            chunks,
            points * g.c * o,
            <[Scratch<T>; 4]>::default,
            |[v, dyt, rows, stage]: &mut [Scratch<T>; 4], chunk, du| {
                let (images, lane, ld) = self.chunk_input_transform(x, chunk, nb, v, [rows, stage]);
                dyt.resize(points * o * ld);
                vectorized(
                    #[inline(always)]
                    || {
                        for oi in 0..o {
                            let out = (&mut dyt[oi * ld..], o * ld);
                            let images = images.clone();
                            self.output_grad_transform(dy, oi, images, out, [rows, stage]);
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
        );
        // Per input channel on the workers: the partial sums in group order, `Gᵀ dU G` from
        // the [(4,) 4, 4, O] points to the [(3,) 3, 3, O] taps, and those into dW's layout.
        let dw_ptr = Shared(dw.as_mut_ptr());
        let first = self.first_axis();
        for_each_index(
            g.c,
            || [(); 2].map(|_| Vec::new()),
            |[sum, tmp]: &mut [Vec<T>; 2], c| {
                let dw_ptr = &dw_ptr;
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
                    || transform_axes(&GT, sum, tmp, [points / 16, ALPHA, ALPHA, o], first),
                );
                for (tap, row) in sum.chunks(o).enumerate() {
                    for (oi, &value) in row.iter().enumerate() {
                        // SAFETY: dW is [O, C, k_vol]; this task alone writes input channel `c`.
                        unsafe { *dw_ptr.0.add((oi * g.c + c) * kv + tap) = value };
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

/// `dst[i] = Σ_j coef[i][j] · src[j]` lane by lane: a transform along one axis, on rows of
/// independent lanes. Inlined with a constant `coef`, its products by ±1 and zeros fold away.
#[inline(always)]
fn mix_rows<T: Float, const I: usize, const J: usize>(
    coef: &[[f64; J]; I],
    src: [&[T]; J],
    dst: [&mut [T]; I],
) {
    let n = dst[0].len();
    let src = src.map(|row| &row[..n]);
    let mut dst = dst.map(|row| &mut row[..n]);
    for lane in 0..n {
        let values = src.map(|row| row[lane]);
        for (i, row) in dst.iter_mut().enumerate() {
            let mut sum: Option<T> = None;
            for (&k, &value) in coef[i].iter().zip(&values) {
                if k != 0.0 {
                    let term = T::from_f64(k) * value;
                    sum = Some(sum.map_or(term, |s| s + term));
                }
            }
            row[lane] = sum.unwrap_or(T::from_f64(0.0));
        }
    }
}

/// The rows `i` of `len` values of `base` at `(i % 2)·half + (i / 2)·step`: where rows are
/// kept split by the parity of their position (each parity's rows `step` apart, the odd ones
/// `half` after the even ones), row `2t + i` of every `t` at once. (Two rows `half` apart
/// with `step` 0.)
fn parity_rows<T, const N: usize>(base: &[T], half: usize, step: usize, len: usize) -> [&[T]; N] {
    std::array::from_fn(|i| &base[(i % 2) * half + (i / 2) * step..][..len])
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
    let ptr = buf.as_mut_ptr();
    // SAFETY: the rows lie inside `buf` (checked) and do not overlap (`stride ≥ len`).
    std::array::from_fn(|i| unsafe {
        std::slice::from_raw_parts_mut(ptr.add(first + i * stride), len)
    })
}
