//! The transforms of F(2, 3) and F(4, 3) and their application along every axis of a tile: the
//! kernel's `U = G g Gᵀ`, the input's `V = Bᵀ d B`, the output's `Aᵀ M A` and the output
//! gradient's `A dY Aᵀ`, each a small matrix applied to rows of lanes.

use std::ops::Range;

use ssl_linalg::for_each_index;

use super::super::Shared;
use super::Minimal;
use crate::util::{vectorized, written_whole, Float, Scratch};

/// The transforms of F(m, 3), `n = m + 2`: `Bᵀ` (input), `G` (kernel) and `Aᵀ` (output), and
/// the transposes the backward applies.
pub(in crate::conv) trait Transforms<const M: usize, const N: usize> {
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

/// Channel pairs per block of the kernel transform: its rows of taps stay in L2.
const KERNEL_LANES: usize = 1024;

impl<const M: usize, const N: usize> Minimal<M, N>
where
    Self: Transforms<M, N>,
{
    /// `U = G g Gᵀ`: `[points, O·C]` from the kernel `w`: `[O, C·k_vol]`, a block of
    /// [`KERNEL_LANES`] (output, input) channel pairs at a time on Candle's workers.
    pub(super) fn kernel_transform<T: Float>(&self, w: &[T]) -> Vec<T> {
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
    ///
    /// [`row_stride`]: crate::util::row_stride
    #[inline(always)]
    pub(super) unsafe fn input_transform<T: Float>(
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
    pub(super) unsafe fn output_transform<T: Float>(
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
    pub(super) unsafe fn output_grad_transform<T: Float>(
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
}

/// `coef` (`[I, J]`) along axes `first..3` of `buf`, a row-major block of shape `dims` whose
/// last axis is a lane of independent values; `tmp` is scratch. On return `buf` holds the
/// result, of extent `I` on those axes.
#[inline(always)]
pub(super) fn transform_axes<T: Float, const I: usize, const J: usize>(
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
