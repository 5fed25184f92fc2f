//! Winograd's minimal filtering F(2×2, 3×3) for a stride-1 3×3 convolution (Lavin & Gray,
//! "Fast Algorithms for Convolutional Neural Networks", CVPR 2016, eq. 7–8).
//!
//! Each 2×2 output tile `Y` is `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A` of its 4×4 input tile `d` (which
//! overlaps its neighbours by 2) and the kernel `g`. Summed over input channels, the
//! element-wise products become one GEMM per transform point `ξ` (16 of them):
//! `M[ξ] (O × T) = U[ξ] (O × C) · V[ξ] (C × T)` over the `T` tiles, with `U = G g Gᵀ` and
//! `V = Bᵀ d B`: 16 multiply-adds per output channel, input channel and tile where im2col
//! spends 36, and a tile's padding is never multiplied by the taps that miss the image.
//!
//! The backward is the same algorithm transposed: the weight gradient is
//! `dU[ξ] = Σ_t (A dY Aᵀ)[ξ, t] · V[ξ, t]` and `dW = Gᵀ dU G`, and the input gradient of a
//! stride-1 convolution is the forward of its dual convolution (`dy` with the flipped kernel,
//! see `conv.rs`), which takes this path as well. F(2, 3)'s transforms have coefficients 0, ±½
//! and ±1, so its rounding error is that of im2col (tested against it).
//!
//! Every transform is a small matrix applied to rows of lanes. A chunk's tiles are ordered
//! `[t_h, image, t_w]`, so one row holds a transform point of every tile of the chunk: the
//! height transforms read the rows of even and odd input rows shifted by one tile row, the
//! width transforms even and odd positions, and all of them run over whole rows.
//!
//! Only 2D: 3×3×3 tiles (64 points) were exact but, with their transforms on the few lanes of
//! a 64³ volume's chunk, made the 3D ResNet's step 3.3× slower, so volumes keep im2col.

use std::ops::Range;

use ssl_linalg::for_each_index;

use super::{Geom, Shared, CHUNK_VALUES, WEIGHT_GRAD_GROUPS};
use crate::util::{gemm_into, vectorized, Float};

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

/// Output positions of a tile per axis, input positions of a tile per axis, transform points.
const TILE: usize = 2;
const ALPHA: usize = 4;
const POINTS: usize = ALPHA * ALPHA;

/// The tiling of one 2D convolution geometry.
#[derive(Debug, Clone, Copy)]
pub(super) struct Winograd {
    g: Geom,
    /// Tiles along the height and the width.
    tiles: [usize; 2],
}

impl Winograd {
    /// The tiling of `g` with `o` output channels, where F(2×2, 3×3) applies: a 2D 3×3 kernel
    /// at stride 1 with padding ≤ 2, at least [`MIN_CHANNELS`] channels in and out.
    pub fn new(g: Geom, o: usize) -> Option<Self> {
        let fits = g.k == [1, 3, 3]
            && g.stride == [1, 1, 1]
            && g.pad[0] == 0
            && g.pad[1..].iter().all(|&p| p <= 2)
            && g.c.min(o) >= MIN_CHANNELS;
        let out = g.out();
        fits.then(|| Self {
            g,
            tiles: [out[1].div_ceil(TILE), out[2].div_ceil(TILE)],
        })
    }

    fn tiles_per_image(&self) -> usize {
        self.tiles[0] * self.tiles[1]
    }

    /// Images per chunk: the larger of a chunk's transformed input and output about
    /// [`CHUNK_VALUES`], and at least 8 chunks when the batch allows; fixed by the shapes.
    fn images_per_chunk(&self, o: usize) -> usize {
        let per_image = POINTS * self.g.c.max(o) * self.tiles_per_image();
        (CHUNK_VALUES / per_image.max(1)).clamp(1, self.g.n.div_ceil(8).max(1))
    }

    /// `U = G g Gᵀ`: `[16, O·C]` from the kernel `w`: `[O, C·9]`.
    fn kernel_transform<T: Float>(&self, w: &[T]) -> Vec<T> {
        let oc = w.len() / 9;
        let mut buf = vec![T::from_f64(0.0); w.len()];
        for (pair, taps) in w.chunks(9).enumerate() {
            for (tap, &v) in taps.iter().enumerate() {
                buf[tap * oc + pair] = v;
            }
        }
        let mut tmp = Vec::new();
        vectorized(
            #[inline(always)]
            || transform_axes(&G, &mut buf, &mut tmp, [3, 3, oc]),
        );
        buf
    }

    /// `V = Bᵀ d B` of channel `c` of `images` of `x`: `[C, N, H, W]`, written at
    /// `v[ξ·C·T + c·T + t]`; `rows` is scratch.
    ///
    /// First along the width, as each zero-padded input row is read: split into its even and
    /// odd positions `e` and `o`, it gives the rows `e[t] − e[t+1]`, `o[t] + e[t+1]`,
    /// `e[t+1] − o[t]` and `o[t] − o[t+1]` over its tiles `t`. These are kept as
    /// `rows[ξ_w, parity of the padded row, padded row / 2, image, t_w]`, so that input row
    /// `2·t_h + i` of every tile row `t_h` is one run of `T` lanes, shifted by `i / 2` rows.
    #[inline(always)]
    fn input_transform<T: Float>(
        &self,
        x: &[T],
        c: usize,
        images: Range<usize>,
        v: &mut [T],
        rows: &mut Vec<T>,
    ) {
        let (n0, nb) = (images.start, images.len());
        let g = &self.g;
        let zero = T::from_f64(0.0);
        let [_, height, width] = g.size;
        let area = height * width;
        let [tiles_h, tiles_w] = self.tiles;
        let lanes = nb * tiles_w;
        let total = lanes * tiles_h;
        // Rows per parity: tiles_h + 1 pairs of padded rows.
        let half = (tiles_h + 1) * lanes;
        rows.resize(ALPHA * 2 * half, zero);
        let mut padded = vec![zero; TILE * tiles_w + 2];
        let (mut even, mut odd) = (vec![zero; tiles_w + 1], vec![zero; tiles_w + 1]);
        let inside = width.min(padded.len() - g.pad[2]);
        let src = &x[(c * g.n + n0) * area..][..nb * area];
        for p in 0..TILE * tiles_h + 2 {
            let at = (p % 2) * half + (p / 2) * lanes;
            let h = p.checked_sub(g.pad[1]).filter(|&h| h < height);
            for image in 0..nb {
                let lane = at + image * tiles_w;
                let [r0, r1, r2, r3] = split_strided(rows, lane, 2 * half, tiles_w);
                let Some(h) = h else {
                    for row in [r0, r1, r2, r3] {
                        row.fill(zero);
                    }
                    continue;
                };
                let input = &src[image * area + h * width..][..inside];
                padded[g.pad[2]..][..inside].copy_from_slice(input);
                for ((e, o), pair) in even.iter_mut().zip(&mut odd).zip(padded.chunks_exact(2)) {
                    (*e, *o) = (pair[0], pair[1]);
                }
                let (e0, e1, o0, o1) = (&even[..tiles_w], &even[1..], &odd[..tiles_w], &odd[1..]);
                for t in 0..tiles_w {
                    r0[t] = e0[t] - e1[t];
                    r1[t] = o0[t] + e1[t];
                    r2[t] = e1[t] - o0[t];
                    r3[t] = o0[t] - o1[t];
                }
            }
        }
        // Along the height, into V's rows of the points (ξ_h, ξ_w).
        let per_point = g.c * total;
        for xi_w in 0..ALPHA {
            let plane = &rows[xi_w * 2 * half..][..2 * half];
            let src = std::array::from_fn(|i| &plane[(i % 2) * half + (i / 2) * lanes..][..total]);
            let first = xi_w * per_point + c * total;
            mix_rows(&BT, src, split_strided(v, first, ALPHA * per_point, total));
        }
    }

    /// `y = Aᵀ M A` for output channel `oi` of the chunk's products `m`: `[16, O, T]` into
    /// `images` of `y`: `[O, N·H_out·W_out]`, dropping a tile's positions past the
    /// edge; `tmp` is scratch.
    ///
    /// # Safety
    /// `y` points to `O·N·H_out·W_out` values, and no other thread writes `images`.
    #[inline(always)]
    unsafe fn output_transform<T: Float>(
        &self,
        m: &[T],
        o: usize,
        oi: usize,
        images: Range<usize>,
        y: *mut T,
        tmp: &mut Vec<T>,
    ) {
        let (n0, nb) = (images.start, images.len());
        let [tiles_h, tiles_w] = self.tiles;
        let total = nb * tiles_h * tiles_w;
        let [_, h_out, w_out] = self.g.out();
        let m_row = |point: usize| &m[(point * o + oi) * total..][..total];
        // tmp: [j_h, ξ_w, T] after the height, then [j_h, j_w, T] after the width.
        tmp.resize((TILE * ALPHA + TILE * TILE) * total, T::from_f64(0.0));
        let (by_height, by_both) = tmp.split_at_mut(TILE * ALPHA * total);
        for xi_w in 0..ALPHA {
            let src = std::array::from_fn(|xi_h| m_row(xi_h * ALPHA + xi_w));
            mix_rows(
                &AT,
                src,
                split_strided(by_height, xi_w * total, ALPHA * total, total),
            );
        }
        for j_h in 0..TILE {
            let src =
                std::array::from_fn(|xi_w| &by_height[(j_h * ALPHA + xi_w) * total..][..total]);
            mix_rows(
                &AT,
                src,
                split_strided(by_both, j_h * TILE * total, total, total),
            );
        }
        let per_image = h_out * w_out;
        for (row, values) in by_both.chunks(total).enumerate() {
            let (j_h, j_w) = (row / TILE, row % TILE);
            for (t_h, values) in values.chunks(nb * tiles_w).enumerate() {
                let h = TILE * t_h + j_h;
                if h >= h_out {
                    continue;
                }
                for (image, values) in values.chunks(tiles_w).enumerate() {
                    let first = (oi * self.g.n + n0 + image) * per_image + h * w_out + j_w;
                    let count = (w_out - j_w).div_ceil(TILE);
                    for (t_w, &value) in values[..count].iter().enumerate() {
                        // SAFETY: (image, h, 2·t_w + j_w) lies inside the chunk's images of
                        // output channel `oi`.
                        unsafe { *y.add(first + TILE * t_w) = value };
                    }
                }
            }
        }
    }

    /// `A dY Aᵀ` of output channel `oi` of `images` of `dy`: `[O, N·H_out·W_out]`,
    /// its point `ξ` written as the `T` values at `out[ξ·point_stride..]` (positions past the
    /// edge have no gradient); `rows` is scratch.
    #[inline(always)]
    fn output_grad_transform<T: Float>(
        &self,
        dy: &[T],
        oi: usize,
        images: Range<usize>,
        out: &mut [T],
        point_stride: usize,
        rows: &mut Vec<T>,
    ) {
        let (n0, nb) = (images.start, images.len());
        let zero = T::from_f64(0.0);
        let [tiles_h, tiles_w] = self.tiles;
        let lanes = nb * tiles_w;
        let total = lanes * tiles_h;
        let [_, h_out, w_out] = self.g.out();
        let per_image = h_out * w_out;
        // rows[ξ_w, h parity, t_h, image, t_w]: along the width, A of each output row's pairs.
        rows.resize(ALPHA * TILE * total, zero);
        let src = &dy[(oi * self.g.n + n0) * per_image..][..nb * per_image];
        for h in 0..TILE * tiles_h {
            let at = (h % 2) * total + (h / 2) * lanes;
            for image in 0..nb {
                let lane = at + image * tiles_w;
                let [r0, r1, r2, r3] = split_strided(rows, lane, TILE * total, tiles_w);
                if h >= h_out {
                    for row in [r0, r1, r2, r3] {
                        row.fill(zero);
                    }
                    continue;
                }
                let row = &src[image * per_image + h * w_out..][..w_out];
                for t in 0..tiles_w {
                    let e = row[TILE * t];
                    let o = row.get(TILE * t + 1).copied().unwrap_or(zero);
                    (r0[t], r1[t], r2[t], r3[t]) = (e, e + o, e - o, zero - o);
                }
            }
        }
        // Along the height, into the block's rows of the points (ξ_h, ξ_w).
        for xi_w in 0..ALPHA {
            let plane = &rows[xi_w * TILE * total..][..TILE * total];
            let src = std::array::from_fn(|j| &plane[j * total..][..total]);
            mix_rows(
                &A,
                src,
                split_strided(out, xi_w * point_stride, ALPHA * point_stride, total),
            );
        }
    }

    /// The convolution of `x`: `[C, N, H, W]` with `w`: `[O, C·9]` into `y`:
    /// `[O, N·H_out·W_out]`, chunk by chunk of images on Candle's workers.
    pub fn forward<T: Float>(&self, x: &[T], w: &[T], y: &mut [T]) {
        let g = self.g;
        let o = w.len() / (g.c * 9);
        let u = self.kernel_transform(w);
        let nb = self.images_per_chunk(o);
        let out = Shared(y.as_mut_ptr());
        for_each_index(
            g.n.div_ceil(nb),
            || [(); 4].map(|_| Vec::new()),
            |[v, m, rows, tmp]: &mut [Vec<T>; 4], chunk| {
                let n0 = chunk * nb;
                let count = nb.min(g.n - n0);
                let lane = count * self.tiles_per_image();
                v.resize(POINTS * g.c * lane, T::from_f64(0.0));
                m.resize(POINTS * o * lane, T::from_f64(0.0));
                vectorized(
                    #[inline(always)]
                    || {
                        for c in 0..g.c {
                            self.input_transform(x, c, n0..n0 + count, v, rows);
                        }
                    },
                );
                for xi in 0..POINTS {
                    // SAFETY: m, u and v hold 16 blocks of the sizes read and written.
                    unsafe {
                        gemm_into(
                            (o, lane, g.c),
                            (m[xi * o * lane..].as_mut_ptr(), lane, 1),
                            (u[xi * o * g.c..].as_ptr(), g.c, 1),
                            (v[xi * g.c * lane..].as_ptr(), lane, 1),
                            false,
                        );
                    }
                }
                let out = &out;
                vectorized(
                    #[inline(always)]
                    || {
                        for oi in 0..o {
                            // SAFETY: `y` is [O, N·H_out·W_out]; this chunk writes its own
                            // images.
                            unsafe { self.output_transform(m, o, oi, n0..n0 + count, out.0, tmp) };
                        }
                    },
                );
            },
        );
    }

    /// The weight gradient `dW`: `[O, C·9]` of [`Self::forward`] from `dy`:
    /// `[O, N·H_out·W_out]`, as [`WEIGHT_GRAD_GROUPS`] partial sums of
    /// `dUᵀ[ξ] (C × O) = V[ξ] · Ŷ[ξ]ᵀ` with `Ŷ = A dY Aᵀ`, added in a fixed order, then `Gᵀ dU G`.
    ///
    /// `Ŷ` is kept as `[16, O, T]` and read transposed by the GEMM: on row 1 of the step bench
    /// that costs the GEMMs 60 ms more a step than a `[16, T, O]` copy would, and saves the
    /// copy's 90 ms.
    pub fn weight_grad<T: Float>(&self, x: &[T], dy: &[T], dw: &mut [T]) {
        let g = self.g;
        let o = dw.len() / (g.c * 9);
        let nb = self.images_per_chunk(o);
        let chunks = g.n.div_ceil(nb);
        let groups = WEIGHT_GRAD_GROUPS.min(chunks);
        let zero = T::from_f64(0.0);
        let mut partials: Vec<Vec<T>> = vec![Vec::new(); groups];
        let partial_ptr = Shared(partials.as_mut_ptr());
        for_each_index(
            groups,
            || [(); 3].map(|_| Vec::new()),
            |[v, dyt, rows]: &mut [Vec<T>; 3], group| {
                let partial_ptr = &partial_ptr;
                let mut du = vec![zero; POINTS * g.c * o];
                for chunk in (group * chunks / groups)..((group + 1) * chunks / groups) {
                    let n0 = chunk * nb;
                    let count = nb.min(g.n - n0);
                    let lane = count * self.tiles_per_image();
                    v.resize(POINTS * g.c * lane, zero);
                    dyt.resize(POINTS * lane * o, zero);
                    vectorized(
                        #[inline(always)]
                        || {
                            for c in 0..g.c {
                                self.input_transform(x, c, n0..n0 + count, v, rows);
                            }
                            for oi in 0..o {
                                self.output_grad_transform(
                                    dy,
                                    oi,
                                    n0..n0 + count,
                                    &mut dyt[oi * lane..],
                                    o * lane,
                                    rows,
                                );
                            }
                        },
                    );
                    for xi in 0..POINTS {
                        // SAFETY: du, v and dyt hold 16 blocks of the sizes used.
                        unsafe {
                            gemm_into(
                                (g.c, o, lane),
                                (du[xi * g.c * o..].as_mut_ptr(), o, 1),
                                (v[xi * g.c * lane..].as_ptr(), lane, 1),
                                (dyt[xi * lane * o..].as_ptr(), 1, lane),
                                true,
                            );
                        }
                    }
                }
                // SAFETY: one slot per group, each written by its own task.
                unsafe { *partial_ptr.0.add(group) = du };
            },
        );
        // Per input channel on the workers: the partial sums in group order, `Gᵀ dU G` from
        // the [4, 4, O] points to the [3, 3, O] taps, and those into dW's layout.
        let dw_ptr = Shared(dw.as_mut_ptr());
        for_each_index(
            g.c,
            || [(); 2].map(|_| Vec::new()),
            |[sum, tmp]: &mut [Vec<T>; 2], c| {
                let dw_ptr = &dw_ptr;
                sum.clear();
                for xi in 0..POINTS {
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
                    || transform_axes(&GT, sum, tmp, [ALPHA, ALPHA, o]),
                );
                for (tap, row) in sum.chunks(o).enumerate() {
                    for (oi, &value) in row.iter().enumerate() {
                        // SAFETY: dW is [O, C, 9]; this task alone writes input channel `c`.
                        unsafe { *dw_ptr.0.add((oi * g.c + c) * 9 + tap) = value };
                    }
                }
            },
        );
    }
}

/// `coef` (`[I, J]`) along both leading axes of `buf`, a row-major block of shape `dims` whose
/// last axis is a lane of independent values; `tmp` is scratch. On return `buf` holds the
/// result, of extent `I` on both.
#[inline(always)]
fn transform_axes<T: Float, const I: usize, const J: usize>(
    coef: &[[f64; J]; I],
    buf: &mut Vec<T>,
    tmp: &mut Vec<T>,
    mut dims: [usize; 3],
) {
    for axis in 0..2 {
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
