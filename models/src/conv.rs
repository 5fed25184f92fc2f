//! 2D and 3D convolution as im2col (vol2col) + one GEMM on channel-major activations.
//!
//! Candle's own CPU conv2d is slow (especially its backward) and Candle has no 3D convolution,
//! so [`Conv::forward_channel_major`] computes a convolution of spatial rank 2 or 3 as im2col
//! and one GEMM, `W[O, C·kᴿ] × col[C·kᴿ, N·S_out]`, which yields the output directly in
//! `[O, N, *S_out]`. One custom op does it chunk by chunk of images (about 4 MiB of columns
//! each, on Candle's CPU workers), and its backward recomputes each chunk's columns for
//! `dW += dy·colᵀ`: the column matrix of the batch, 9–27× the input, is never stored, neither
//! for the GEMM nor for the backward. The input gradient of a stride-1 convolution is the
//! forward convolution of `dy` with the flipped kernel (one GEMM of depth `O·kᴿ`); with a
//! stride it is `dx = col2im(Wᵀ·dy)`. A stride-1 3×3 (3×3×3) convolution of at least 16
//! channels in and out, over at least 64 tiles, takes Winograd's minimal filtering instead
//! (`winograd`): F(4×4, 3×3) on images, 4× fewer multiply-adds in its GEMMs (F(2×2, 3×3),
//! 2.25×, on the smallest images), and F(2×2×2, 3×3×3) on volumes, 3.4×; for the forward, the
//! dual convolution of the input gradient and the weight gradient alike. A 2D convolution is
//! the 3D one with depth 1 and kernel depth 1, so one set of kernels serves both; a 1×1 stride-1
//! convolution needs no im2col (its input is the column matrix). A stride along the width reads
//! the input rows phase by phase (`PhaseRows`), so im2col copies and col2im adds runs. A
//! *skinny* convolution, few output positions against a large weight (the 3D ResNet's 2³
//! layers), computes its three products with `W` read in place, once (`SKINNY_COLUMNS`).
//! Chunks are fixed by the shapes alone and the weight gradient's partial sums are added in a
//! fixed order, so results do not depend on the thread count. On CUDA (feature `cuda`) cuDNN
//! computes the convolution and its two gradients (module `cudnn`). On other devices the columns
//! are gathered with Candle ops (zero padding and `index_select` per kernel offset), whose
//! autograd gives the same gradients.

use std::borrow::Cow;
use std::ops::Range;

use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::{for_each_chunk_mut, for_each_index};

use crate::autocast::matrix_product;
use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{contiguous_slice, gemm_into, row_stride, written_whole, Float, Scratch};
use winograd::Winograd;

#[cfg(feature = "cuda")]
pub mod cudnn;
mod winograd;

/// Geometry of a convolution on a `[C, N, D, H, W]` input (`D = 1`, kernel depth 1 in 2D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Geom {
    pub c: usize,
    pub n: usize,
    /// Input extent per axis (D, H, W).
    pub size: [usize; 3],
    /// Kernel extent, stride and padding per axis.
    pub k: [usize; 3],
    pub stride: [usize; 3],
    pub pad: [usize; 3],
}

/// Workers whose counts [`balanced_chunks`] shares chunks evenly among: 1, 2, 4 or 8.
const WORKER_MULTIPLE: usize = 8;

/// How many chunks `n` images make at `per_chunk` images a chunk, rounded up to a multiple of
/// [`WORKER_MULTIPLE`] where every chunk keeps at least `min_images`: Candle's workers take
/// contiguous ranges of chunks, and 19 chunks of 7 images (the last of 2) gave one of two
/// workers 70 images and the other 58. Fixed by the shapes; [`chunk_images`] sizes them.
fn balanced_chunks(n: usize, per_chunk: usize, min_images: usize) -> usize {
    let count = n.div_ceil(per_chunk.max(1));
    let balanced = count.next_multiple_of(WORKER_MULTIPLE).max(1);
    if n / balanced >= min_images.max(1) {
        balanced
    } else {
        count
    }
}

/// The images of chunk `chunk` of `chunks` over `n` images: sizes within one of each other.
fn chunk_images(n: usize, chunks: usize, chunk: usize) -> Range<usize> {
    chunk * n / chunks..(chunk + 1) * n / chunks
}

impl Geom {
    /// The geometry of a cubic window `kernel` on a channel-major `[C, N, *S]` input of spatial
    /// rank 2 or 3 (`what` names the operation in errors).
    pub fn new(
        what: &str,
        dims: &[usize],
        kernel: usize,
        stride: usize,
        pad: usize,
    ) -> Result<Self> {
        if !(4..=5).contains(&dims.len()) {
            candle_core::bail!(
                "{what} takes channel-major [C, N, H, W] or [C, N, D, H, W] input, got {dims:?}"
            );
        }
        let spatial = &dims[2..];
        if spatial.iter().any(|&s| s + 2 * pad < kernel) {
            candle_core::bail!(
                "{what}: input {spatial:?} (padding {pad}) is smaller than the window {kernel}"
            );
        }
        let lead = 5 - dims.len();
        let per_axis = |v: usize, flat: usize| -> [usize; 3] {
            std::array::from_fn(|a| if a < lead { flat } else { v })
        };
        Ok(Self {
            c: dims[0],
            n: dims[1],
            size: std::array::from_fn(|a| if a < lead { 1 } else { spatial[a - lead] }),
            k: per_axis(kernel, 1),
            stride: per_axis(stride, 1),
            pad: per_axis(pad, 0),
        })
    }

    /// `[C, N, *S_out]` for an input of spatial rank `rank` with `channels` output channels.
    pub fn out_dims(&self, channels: usize, rank: usize) -> Vec<usize> {
        let mut dims = vec![channels, self.n];
        dims.extend(&self.out()[3 - rank..]);
        dims
    }

    pub fn out(&self) -> [usize; 3] {
        std::array::from_fn(|a| (self.size[a] + 2 * self.pad[a] - self.k[a]) / self.stride[a] + 1)
    }

    /// The input as `[C, N, D, H, W]`.
    pub fn size_5d(&self) -> (usize, usize, usize, usize, usize) {
        let [d, h, w] = self.size;
        (self.c, self.n, d, h, w)
    }

    pub fn kernel_volume(&self) -> usize {
        self.k.iter().product()
    }

    fn col_shape(&self) -> (usize, usize) {
        let o = self.out();
        (self.c * self.kernel_volume(), self.n * o[0] * o[1] * o[2])
    }

    /// Output positions along axis `a` whose input index `o·stride + k − pad` at kernel
    /// offset `k` lies inside the input.
    pub fn valid_outputs(&self, a: usize, k: usize) -> std::ops::Range<usize> {
        let (s, p) = (self.stride[a], self.pad[a]);
        let first = p.saturating_sub(k).div_ceil(s);
        let end = match (self.size[a] + p).checked_sub(k + 1) {
            Some(v) => (v / s + 1).min(self.out()[a]),
            None => 0,
        };
        first..end.max(first)
    }

    /// Kernel offsets `[kd, kh, kw]` of column-matrix row `row`.
    pub fn offsets(&self, row: usize) -> [usize; 3] {
        let r = row % self.kernel_volume();
        [
            r / (self.k[1] * self.k[2]),
            (r / self.k[2]) % self.k[1],
            r % self.k[2],
        ]
    }
}

/// For every output row `(od, oh)` readable at kernel offsets `(kd, kh)`, `f(output row start,
/// input row start)` in units of elements of one `[D, H, W]` volume.
fn for_each_row(g: &Geom, [kd, kh, _]: [usize; 3], mut f: impl FnMut(usize, usize)) {
    let [_, h, w] = g.size;
    let [_, h_out, w_out] = g.out();
    for od in g.valid_outputs(0, kd) {
        let id = od * g.stride[0] + kd - g.pad[0];
        for oh in g.valid_outputs(1, kh) {
            let ih = oh * g.stride[1] + kh - g.pad[1];
            f((od * h_out + oh) * w_out, (id * h + ih) * w);
        }
    }
}

/// The layout im2col reads its input in and col2im adds its gradient in: every row of `W`
/// values stored phase by phase modulo the width stride `s`, `x[w]` at `w / s` after the
/// values of the phases below `w mod s`. The values one kernel column reads along a row
/// (`w0 + j·s`, `j = 0, 1, …`) then lie next to each other, so im2col copies runs and col2im
/// adds runs instead of gathering and scattering single values (the 3D stem's forward, 7³ at
/// stride 2 on 4 volumes of 64³, went from 65–80 to 50–56 ms). At stride 1 it is the input's
/// own layout, and a 1-wide kernel keeps it too: it reads one value in `s`, and rearranging
/// the whole input for that cost more than it saved (a ResNet's 1×1 stride-2 projections).
#[derive(Debug, Clone, Copy)]
struct PhaseRows {
    width: usize,
    /// The phases a row is stored in.
    stride: usize,
    /// How far apart the values one kernel column reads along a row lie in this layout.
    step: usize,
}

/// Rows per task when [`PhaseRows`] converts a whole input on Candle's workers.
const PHASE_ROWS_PER_TASK: usize = 1024;

impl PhaseRows {
    fn of(g: &Geom) -> Self {
        let (width, stride) = (g.size[2], g.stride[2]);
        match g.k[2] {
            1 => Self {
                width,
                stride: 1,
                step: stride,
            },
            _ => Self {
                width,
                stride,
                step: 1,
            },
        }
    }

    /// Where `x[w]` of a row lies in this layout.
    fn offset(&self, w: usize) -> usize {
        let phase = w % self.stride;
        let before: usize = (0..phase)
            .map(|q| self.width.saturating_sub(q).div_ceil(self.stride))
            .sum();
        before + w / self.stride
    }

    /// `x` (rows of `W` values) in this layout: `x` itself at stride 1.
    fn arrange<'a, T: Float>(&self, x: &'a [T]) -> Cow<'a, [T]> {
        if self.stride == 1 {
            return Cow::Borrowed(x);
        }
        let mut out = vec![T::from_f64(0.0); x.len()];
        let w = self.width;
        for_each_chunk_mut(
            &mut out,
            w * PHASE_ROWS_PER_TASK,
            || (),
            |_, i, rows| {
                let first = i * w * PHASE_ROWS_PER_TASK;
                for (dst, src) in rows.chunks_mut(w).zip(x[first..].chunks(w)) {
                    let mut at = 0;
                    for phase in 0..self.stride.min(w) {
                        for &v in src[phase..].iter().step_by(self.stride) {
                            dst[at] = v;
                            at += 1;
                        }
                    }
                }
            },
        );
        Cow::Owned(out)
    }

    /// `x[i] += rows[i']` for every value, `rows` in this layout and `x` in the input's.
    fn add_into<T: Float>(&self, rows: &[T], x: &mut [T]) {
        let w = self.width;
        for (dst, src) in x.chunks_mut(w).zip(rows.chunks(w)) {
            let mut values = src.iter();
            for phase in 0..self.stride.min(w) {
                for (d, v) in dst[phase..]
                    .iter_mut()
                    .step_by(self.stride)
                    .zip(&mut values)
                {
                    *d += *v;
                }
            }
        }
    }
}

/// Column-matrix values per chunk of images (4 MiB of f32): the chunk's columns stay in the
/// cache between im2col and the GEMM, and no column matrix of the whole batch is ever made.
const CHUNK_VALUES: usize = 1 << 20;
/// Weight-gradient partial sums of the backward: a fixed count, so the result does not depend
/// on the number of threads.
const WEIGHT_GRAD_GROUPS: usize = 4;
/// Blocks of column-matrix rows the im2col weight gradient is shared out in (a fixed count,
/// each block summed over the batch in one order, so the result does not depend on the number
/// of threads).
const WEIGHT_GRAD_BLOCKS: usize = 8;
/// Largest `dW` (in values) that [`patch_weight_grad`] takes, as partial sums over groups of
/// chunks: a stem's (the 3D ResNet's 7³ one is 64 × 343).
const PATCH_WEIGHT_GRAD_MAX: usize = 1 << 16;

/// [`WEIGHT_GRAD_GROUPS`] partial sums of `len` values over `chunks` chunks, on Candle's
/// workers: group `i` starts from zeros and `add(scratch, chunk, sum)` adds its chunks
/// `i·chunks/groups..` in turn. The grouping is fixed by the shapes, so the partials added in
/// order give a sum that does not depend on the number of threads.
fn group_partial_sums<T: Float, S>(
    chunks: usize,
    len: usize,
    init: impl Fn() -> S + Sync,
    add: impl Fn(&mut S, usize, &mut [T]) + Sync,
) -> Vec<Vec<T>> {
    let groups = WEIGHT_GRAD_GROUPS.min(chunks);
    let mut partials: Vec<Vec<T>> = vec![Vec::new(); groups];
    let partial_ptr = Shared(partials.as_mut_ptr());
    for_each_index(groups, init, |scratch, group| {
        let partial_ptr = &partial_ptr;
        let mut sum = vec![T::from_f64(0.0); len];
        for chunk in (group * chunks / groups)..((group + 1) * chunks / groups) {
            add(scratch, chunk, &mut sum);
        }
        // SAFETY: one slot per group, each written by its own task.
        unsafe { *partial_ptr.0.add(group) = sum };
    });
    partials
}

impl Geom {
    /// Chunks of images: about [`CHUNK_VALUES`] column values each, and at least 8 chunks
    /// when the batch allows (work for every thread), shared evenly among workers
    /// ([`balanced_chunks`]); independent of the thread count.
    fn chunks(&self) -> usize {
        let (rows, _) = self.col_shape();
        let per_image = rows * self.out().iter().product::<usize>();
        let nb = (CHUNK_VALUES / per_image.max(1)).clamp(1, self.n.div_ceil(8).max(1));
        balanced_chunks(self.n, nb, 1)
    }
}

/// Rows `first_row..` of the columns `[C·k_vol, nb·S_out]` of images `n0..n0 + nb` of `x`:
/// `[C, N, D, H, W]` in its [`PhaseRows`] layout, as many as `col` holds, each `ld` ≥
/// `nb·S_out` values after the one before. Every value is written once: a copy where the
/// window lies inside the input, a zero in the padding.
fn im2col_chunk<T: Float>(
    g: &Geom,
    x: &[T],
    (n0, nb): (usize, usize),
    first_row: usize,
    (col, ld): (&mut [T], usize),
) {
    let zero = T::from_f64(0.0);
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let w_out = g.out()[2];
    let phases = PhaseRows::of(g);
    for (i, dst_row) in col.chunks_mut(ld).enumerate() {
        let dst_row = &mut dst_row[..nb * per_image];
        let row = first_row + i;
        let c = row / g.kernel_volume();
        let offsets = g.offsets(row);
        let kw = offsets[2];
        let ows = g.valid_outputs(2, kw);
        let iw0 = (ows.start * g.stride[2] + kw).checked_sub(g.pad[2]);
        let Some(iw0) = iw0.filter(|_| !ows.is_empty()) else {
            dst_row.fill(zero);
            continue;
        };
        let run = phases.offset(iw0);
        for (j, dst) in dst_row.chunks_mut(per_image).enumerate() {
            let src = &x[(c * g.n + n0 + j) * volume..][..volume];
            // Output rows before `next` are written; rows the window misses are zero.
            let mut next = 0;
            for_each_row(g, offsets, |o, i| {
                dst[next..o + ows.start].fill(zero);
                let drow = &mut dst[o..o + w_out];
                let values = &src[i + run..];
                match phases.step {
                    1 => drow[ows.clone()].copy_from_slice(&values[..ows.len()]),
                    step => {
                        for (d, &v) in drow[ows.clone()]
                            .iter_mut()
                            .zip(values.iter().step_by(step))
                        {
                            *d = v;
                        }
                    }
                }
                drow[ows.end..].fill(zero);
                next = o + w_out;
            });
            dst[next..].fill(zero);
        }
    }
}

/// Adds the column gradient `dcol`: `[C·k_vol, nb·S_out]` of images `n0..n0 + nb` into their
/// volumes of `dx`: `[C, N, D, H, W]`, summing them first in `acc` in the [`PhaseRows`]
/// layout.
///
/// # Safety
/// `dx` points to `C·N·D·H·W` values, and no other thread touches images `n0..n0 + nb`.
unsafe fn col2im_chunk<T: Float>(
    g: &Geom,
    dcol: &[T],
    (n0, nb): (usize, usize),
    acc: &mut Scratch<T>,
    dx: *mut T,
) {
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let phases = PhaseRows::of(g);
    acc.resize(g.c * nb * volume);
    acc.fill(T::from_f64(0.0));
    for (row, src_row) in dcol.chunks(nb * per_image).enumerate() {
        let c = row / g.kernel_volume();
        let offsets = g.offsets(row);
        let kw = offsets[2];
        let ows = g.valid_outputs(2, kw);
        let Some(iw0) = (ows.start * g.stride[2] + kw).checked_sub(g.pad[2]) else {
            continue;
        };
        let run = phases.offset(iw0);
        for (j, src) in src_row.chunks(per_image).enumerate() {
            let dst = &mut acc[(c * nb + j) * volume..][..volume];
            for_each_row(g, offsets, |o, i| {
                let values = &src[o + ows.start..o + ows.end];
                match phases.step {
                    1 => {
                        for (d, &v) in dst[i + run..][..ows.len()].iter_mut().zip(values) {
                            *d += v;
                        }
                    }
                    step => {
                        for (d, &v) in dst[i + run..].iter_mut().step_by(step).zip(values) {
                            *d += v;
                        }
                    }
                }
            });
        }
    }
    for c in 0..g.c {
        // SAFETY: these volumes lie inside `dx` and belong to this chunk alone.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(dx.add((c * g.n + n0) * volume), nb * volume) };
        phases.add_into(&acc[c * nb * volume..][..nb * volume], dst);
    }
}

/// A pointer handed to the tasks of one op, each writing a disjoint part.
struct Shared<T>(*mut T);
unsafe impl<T: Send> Sync for Shared<T> {}

/// `y = W · im2col(x)`: `[O, N·S_out]`, chunk by chunk of images on Candle's workers.
fn conv_forward<T: Float>(g: Geom, x: &[T], w: &[T], o: usize) -> Vec<T> {
    // SAFETY: conv_forward_into writes every value of `y` and reads none.
    unsafe { written_whole(o * g.col_shape().1, |y| conv_forward_into(g, x, w, y)) }
}

/// [`conv_forward`] into `y`: `[O, N·S_out]`, every value of which it writes without reading it
/// first: a skinny convolution's as [`skinny_forward_into`], else by Winograd's algorithm where
/// one applies, else by im2col.
fn conv_forward_into<T: Float>(g: Geom, x: &[T], w: &[T], y: &mut [T]) {
    if g.skinny() {
        return skinny_forward_into(g, x, w, y);
    }
    let o = y.len() / g.col_shape().1;
    match Winograd::new(g, o) {
        Some(winograd) => winograd.forward(x, w, y),
        None => im2col_forward_into(g, x, w, y),
    }
}

/// The columns `[C·k_vol, width]` of chunk `chunk` of `chunks` of `x` (in its [`PhaseRows`]
/// layout) into `col`, `width` the chunk's images times `S_out`; returns its first image and
/// `width`.
fn chunk_columns<T: Float>(
    g: &Geom,
    x: &[T],
    (chunk, chunks): (usize, usize),
    col: &mut Scratch<T>,
) -> (usize, usize) {
    let images = chunk_images(g.n, chunks, chunk);
    let width = images.len() * g.out().iter().product::<usize>();
    col.resize(g.col_shape().0 * width);
    im2col_chunk(g, x, (images.start, images.len()), 0, (col, width));
    (images.start, width)
}

/// [`conv_forward_into`] as im2col and GEMM, chunk by chunk of images on Candle's workers.
fn im2col_forward_into<T: Float>(g: Geom, x: &[T], w: &[T], y: &mut [T]) {
    let x = &*PhaseRows::of(&g).arrange(x);
    let (rows, cols) = g.col_shape();
    let o = y.len() / cols;
    let per_image = g.out().iter().product::<usize>();
    let chunks = g.chunks();
    let out = Shared(y.as_mut_ptr());
    for_each_index(chunks, Scratch::default, |col: &mut Scratch<T>, chunk| {
        let out = &out;
        let (n0, width) = chunk_columns(&g, x, (chunk, chunks), col);
        // SAFETY: `y` is [O, N·S_out]; this chunk writes its own columns of every row.
        unsafe {
            gemm_into(
                (o, width, rows),
                (out.0.add(n0 * per_image), cols, 1),
                (w.as_ptr(), rows, 1),
                (col.as_ptr(), width, 1),
                false,
            )
        };
    });
}

/// `dx`: `[C, N, D, H, W]` of [`conv_forward`] from `dy`: the dual convolution's forward where
/// there is one (writing every value), else zeros and the skinny or scattered gradient added in.
fn input_grad<T: Float>(g: Geom, x_len: usize, w: &[T], dy: &[T], o: usize) -> Vec<T> {
    match g.input_grad_geometry(o).filter(|_| !g.skinny()) {
        // SAFETY: conv_forward_into writes every value of `dx` and reads none.
        Some(dual) => unsafe {
            written_whole(x_len, |dx| {
                conv_forward_into(dual, dy, &flipped_transpose(w, o, g), dx)
            })
        },
        None => {
            let mut dx = vec![T::from_f64(0.0); x_len];
            match g.skinny() {
                true => skinny_input_grad(g, w, dy, &mut dx),
                false => input_grad_scattered(g, w, dy, o, &mut dx),
            }
            dx
        }
    }
}

impl Geom {
    /// For a stride-1 convolution with padding `p ≤ k − 1` on every axis, the input gradient is
    /// itself a stride-1 convolution of `dy`: `[O, N, *S_out]` with the kernel flipped on every
    /// axis and its channels swapped, at padding `k − 1 − p`; this is its geometry. (With a
    /// stride, the gradient is a transposed convolution, which [`input_grad_scattered`] computes.)
    fn input_grad_geometry(&self, o: usize) -> Option<Geom> {
        let fits = (0..3).all(|a| self.stride[a] == 1 && self.pad[a] < self.k[a]);
        fits.then(|| Geom {
            c: o,
            n: self.n,
            size: self.out(),
            k: self.k,
            stride: [1; 3],
            pad: std::array::from_fn(|a| self.k[a] - 1 - self.pad[a]),
        })
    }
}

/// Input channels per task of [`flipped_transpose`].
const FLIP_CHANNEL_BLOCK: usize = 16;

/// `W̃[c, o, r] = W[o, c, k_vol − 1 − r]`: `[C, O·k_vol]` from `W`: `[O, C·k_vol]`, the kernel
/// of [`Geom::input_grad_geometry`] (reversing the flat offset flips every axis).
fn flipped_transpose<T: Float>(w: &[T], o: usize, g: Geom) -> Vec<T> {
    let kv = g.kernel_volume();
    let write = |flipped: &mut [T]| {
        // `FLIP_CHANNEL_BLOCK` input channels' `[O, k_vol]` blocks a task, reading a run of
        // their taps from each row of `W` (a 512-channel kernel is 2.4 M values).
        for_each_chunk_mut(
            flipped,
            FLIP_CHANNEL_BLOCK * o * kv,
            || (),
            |_, block, dst| {
                let c0 = block * FLIP_CHANNEL_BLOCK;
                let channels = dst.len() / (o * kv);
                for oi in 0..o {
                    let src = &w[(oi * g.c + c0) * kv..][..channels * kv];
                    for (ci, taps) in src.chunks(kv).enumerate() {
                        let dst = &mut dst[(ci * o + oi) * kv..][..kv];
                        for (d, &t) in dst.iter_mut().zip(taps.iter().rev()) {
                            *d = t;
                        }
                    }
                }
            },
        );
    };
    // SAFETY: the blocks cover `flipped`, and each writes all of its own.
    unsafe { written_whole(w.len(), write) }
}

/// `dx += col2im(Wᵀ·dy)`, chunk by chunk of images on Candle's workers: the input gradient of
/// any stride and padding, added into `dx`: `[C, N, D, H, W]`.
fn input_grad_scattered<T: Float>(g: Geom, w: &[T], dy: &[T], o: usize, dx: &mut [T]) {
    let (rows, cols) = g.col_shape();
    let per_image = g.out().iter().product::<usize>();
    let chunks = g.chunks();
    let dx_ptr = Shared(dx.as_mut_ptr());
    for_each_index(chunks, <[Scratch<T>; 2]>::default, |[dcol, acc], chunk| {
        let dx_ptr = &dx_ptr;
        let images = chunk_images(g.n, chunks, chunk);
        let (n0, count) = (images.start, images.len());
        let width = count * per_image;
        dcol.resize(rows * width);
        // SAFETY: dcol is this task's own; dy and W are read in bounds; the chunk's images of
        // dx are written by this task alone.
        unsafe {
            gemm_into(
                (rows, width, o),
                (dcol.as_mut_ptr(), width, 1),
                (w.as_ptr(), 1, rows),
                (dy[n0 * per_image..].as_ptr(), cols, 1),
                false,
            );
            col2im_chunk(&g, dcol, (n0, count), acc, dx_ptr.0);
        }
    });
}

/// `dW`: `[O, C·k_vol]` of [`conv_forward`], every value written without reading it first: a
/// skinny convolution's as [`skinny_weight_grad`], else by Winograd's algorithm where one
/// applies, else [`im2col_weight_grad`].
fn weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw: &mut [T]) {
    if g.skinny() {
        return skinny_weight_grad(g, x, dy, dw);
    }
    match Winograd::new(g, dw.len() / g.col_shape().0) {
        Some(winograd) => winograd.weight_grad(x, dy, dw),
        None => im2col_weight_grad(g, x, dy, dw),
    }
}

/// `dW = Σ_chunks dy_chunk · col_chunkᵀ`, recomputing each chunk's columns, by one of three
/// sums, each in an order fixed by the shapes (not by the thread count):
/// - a stem (`C·k_vol < O`) has too few rows to share out: [`stem_weight_grad`];
/// - a small `dW` over many positions (the 3D stem's): [`patch_weight_grad`];
/// - every other layer: [`row_block_weight_grad`].
fn im2col_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
    let rows = g.col_shape().0;
    let o = dw_out.len() / rows;
    if rows < o {
        stem_weight_grad(g, x, dy, dw_out)
    } else if o * rows <= PATCH_WEIGHT_GRAD_MAX {
        patch_weight_grad(g, x, dy, dw_out)
    } else {
        row_block_weight_grad(g, x, dy, dw_out)
    }
}

/// [`im2col_weight_grad`] as `dWᵀ = col · dyᵀ`, `[C·k_vol, O]`, by [`WEIGHT_GRAD_BLOCKS`] tasks,
/// each a block of `col`'s rows over the whole batch in a fixed order of chunks, writing its
/// columns of `dW`: no partial sums of the whole `dW` (for the deep 3D layers 28 MB each,
/// zeroed, summed and transposed), and a chunk as wide as the block's columns allow (a 2³
/// layer's 4 volumes in one product instead of 4 of depth 8). The `gemm` crate packs its right
/// operand only when the product has many rows, and this form's right operand `dyᵀ` is read in
/// place; `dW = dy · colᵀ` read the unpacked `colᵀ` 1.5–3× slower (64 to 256 channels at 32² to
/// 8², 128 images: 33–69 GFLOP/s against 91–100 on one core).
fn row_block_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
    let x = &*PhaseRows::of(&g).arrange(x);
    let (rows, cols) = g.col_shape();
    let o = dw_out.len() / rows;
    let per_image = g.out().iter().product::<usize>();
    let blocks = WEIGHT_GRAD_BLOCKS.min(rows);
    let out = Shared(dw_out.as_mut_ptr());
    for_each_index(
        blocks,
        <[Scratch<T>; 2]>::default,
        |[col, dwt]: &mut [Scratch<T>; 2], block| {
            let out = &out;
            let first_row = block * rows / blocks;
            let block_rows = (block + 1) * rows / blocks - first_row;
            let nb = (CHUNK_VALUES / (block_rows * per_image).max(1)).clamp(1, g.n.max(1));
            dwt.resize(block_rows * o);
            dwt.fill(T::from_f64(0.0));
            for n0 in (0..g.n).step_by(nb) {
                let count = nb.min(g.n - n0);
                let width = count * per_image;
                let ld = row_stride::<T>(width);
                col.resize(block_rows * ld);
                im2col_chunk(&g, x, (n0, count), first_row, (col, ld));
                // SAFETY: dwt is this task's own; dy and col are read in bounds.
                unsafe {
                    gemm_into(
                        (block_rows, o, width),
                        (dwt.as_mut_ptr(), o, 1),
                        (col.as_ptr(), ld, 1),
                        (dy[n0 * per_image..].as_ptr(), 1, cols),
                        true,
                    );
                }
            }
            // dW's rows in turn, each taking a run of this block's columns.
            for oi in 0..o {
                // SAFETY: columns `first_row..first_row + block_rows` of dW belong to this
                // block alone.
                let run = unsafe {
                    std::slice::from_raw_parts_mut(out.0.add(oi * rows + first_row), block_rows)
                };
                for (r, value) in run.iter_mut().enumerate() {
                    *value = dwt[r * o + oi];
                }
            }
        },
    );
}

/// [`im2col_weight_grad`] of a stem (`C·k_vol < O`): `dW = Σ_chunks dy_chunk · col_chunkᵀ` as
/// [`WEIGHT_GRAD_GROUPS`] partial sums added in a fixed order.
fn stem_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
    let x = &*PhaseRows::of(&g).arrange(x);
    let (rows, cols) = g.col_shape();
    let o = dw_out.len() / rows;
    let per_image = g.out().iter().product::<usize>();
    let chunks = g.chunks();
    let partials = group_partial_sums(chunks, o * rows, Scratch::default, |col, chunk, dw| {
        let (n0, width) = chunk_columns(&g, x, (chunk, chunks), col);
        // SAFETY: dW is this task's own; dy and col are read in bounds.
        unsafe {
            gemm_into(
                (o, rows, width),
                (dw.as_mut_ptr(), rows, 1),
                (dy[n0 * per_image..].as_ptr(), cols, 1),
                (col.as_ptr(), 1, width),
                true,
            );
        }
    });
    dw_out.fill(T::from_f64(0.0));
    for partial in &partials {
        for (d, p) in dw_out.iter_mut().zip(partial) {
            *d += *p;
        }
    }
}

/// The patches of output positions `positions` (flat in one image's `S_out`) of image `n` of
/// `x`: `[C, N, D, H, W]`, one row of `C·k_vol` values per position, `ld` values apart: the
/// transposed columns of im2col. Every value is written once: a copy, or a zero in the padding.
fn im2row<T: Float>(
    g: &Geom,
    x: &[T],
    n: usize,
    positions: std::ops::Range<usize>,
    (patches, ld): (&mut [T], usize),
) {
    let zero = T::from_f64(0.0);
    let volume = g.size.iter().product::<usize>();
    let [depth, height, width] = g.size;
    let [_, h_out, w_out] = g.out();
    let [kd, kh, kw] = g.k;
    // The input index of kernel offset 0 along axis `a` for output `o` (below 0 in the padding).
    let start = |a: usize, o: usize| (o * g.stride[a]) as isize - g.pad[a] as isize;
    let inside = |i: isize, n: usize| usize::try_from(i).ok().filter(|&i| i < n);
    for (p, patch) in positions.zip(patches.chunks_mut(ld)) {
        let at = [p / (h_out * w_out), (p / w_out) % h_out, p % w_out];
        let [d0, h0, w0]: [isize; 3] = std::array::from_fn(|a| start(a, at[a]));
        // The kernel columns `k` whose input column `w0 + k` lies inside the row.
        let first = usize::try_from(-w0).unwrap_or(0).min(kw);
        let end = (width as isize - w0).clamp(first as isize, kw as isize) as usize;
        let iw = (w0 + first as isize) as usize;
        for (r, run) in patch[..g.c * kd * kh * kw].chunks_mut(kw).enumerate() {
            let (c, kdh) = (r / (kd * kh), r % (kd * kh));
            let id = inside(d0 + (kdh / kh) as isize, depth);
            let ih = inside(h0 + (kdh % kh) as isize, height);
            let (Some(id), Some(ih)) = (id, ih) else {
                run.fill(zero);
                continue;
            };
            let row = &x[(c * g.n + n) * volume + (id * height + ih) * width..][..width];
            run[..first].fill(zero);
            run[first..end].copy_from_slice(&row[iw..iw + end - first]);
            run[end..].fill(zero);
        }
    }
}

/// [`im2col_weight_grad`] of a small `dW` (at most [`PATCH_WEIGHT_GRAD_MAX`] values) over many
/// positions, a stem's: `dW = Σ_chunks dy_chunk · patches` as [`WEIGHT_GRAD_GROUPS`] partial
/// sums added in a fixed order. Both operands run along the positions, so one is transposed
/// for the `gemm` crate, which packs its left operand a vector at a time only from the
/// column-major layout: `dy`'s chunk (`O` values a position, against the patches' `C·k_vol`),
/// into `[P, O]`. The patches (`[P, C·k_vol]`, [`im2row`]) are the right operand, read in
/// place. As the left operand the patches were packed, a copy of the chunk's largest matrix,
/// and the row blocks' column rows (the 3D stem's 343 rows over 32,768 positions a volume)
/// a value at a time.
fn patch_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
    let (rows, cols) = g.col_shape();
    let o = dw_out.len() / rows;
    let per_image = g.out().iter().product::<usize>();
    let span = (CHUNK_VALUES / rows.max(1)).clamp(1, per_image.max(1));
    let per_image_chunks = per_image.div_ceil(span);
    let chunks = g.n * per_image_chunks;
    let init = <[Scratch<T>; 2]>::default;
    let partials = group_partial_sums(chunks, o * rows, init, |[patches, dyt], chunk, dw| {
        let (n, first) = (chunk / per_image_chunks, (chunk % per_image_chunks) * span);
        let positions = first..(first + span).min(per_image);
        let count = positions.len();
        patches.resize(count * rows);
        im2row(&g, x, n, positions, (patches, rows));
        dyt.resize(count * o);
        for (oi, line) in dy.chunks(cols).enumerate() {
            let line = &line[n * per_image + first..][..count];
            for (p, &value) in line.iter().enumerate() {
                dyt[p * o + oi] = value;
            }
        }
        // SAFETY: dW is this task's own; dyᵀ and the patches are read in bounds.
        unsafe {
            gemm_into(
                (o, rows, count),
                (dw.as_mut_ptr(), rows, 1),
                (dyt.as_ptr(), 1, o),
                (patches.as_ptr(), rows, 1),
                true,
            );
        }
    });
    dw_out.fill(T::from_f64(0.0));
    for partial in &partials {
        for (d, p) in dw_out.iter_mut().zip(partial) {
            *d += *p;
        }
    }
}

/// Most columns (`N·S_out`, output positions of the batch) of a *skinny* convolution: one whose
/// weight matrix dwarfs its columns (the 3D ResNet's 2³ layers: `W` 512 × 13,824, 32 columns).
/// The chunked products pack `W` (a copy of it), build `W̃` for the input gradient (another)
/// and sum `dW` in partial sums (two more passes), each for a few multiply-adds per value;
/// [`skinny_forward_into`], [`skinny_input_grad`] and [`skinny_weight_grad`] read and write `W`
/// and `dW` once each, in place, and make the small matrices the `gemm` crate packs. On that
/// layer the three took 10, 32 and 22 ms against 2–3 ms each this way.
const SKINNY_COLUMNS: usize = 64;

/// Blocks a skinny product is shared out in on Candle's workers (fixed, so results do not
/// depend on the thread count).
const SKINNY_BLOCKS: usize = 8;

impl Geom {
    fn skinny(&self) -> bool {
        self.col_shape().1 <= SKINNY_COLUMNS
    }
}

/// The column matrix `[C·k_vol, N·S_out]` of the whole batch, in blocks of rows on Candle's
/// workers.
fn batch_columns<T: Float>(g: &Geom, x: &[T]) -> Vec<T> {
    let (rows, cols) = g.col_shape();
    let x = PhaseRows::of(g).arrange(x);
    let mut col = vec![T::from_f64(0.0); rows * cols];
    let block_rows = rows.div_ceil(SKINNY_BLOCKS).max(1);
    for_each_chunk_mut(
        &mut col,
        block_rows * cols,
        || (),
        |_, block, part| {
            im2col_chunk(g, &x, (0, g.n), block * block_rows, (part, cols));
        },
    );
    col
}

/// `y = W · col` of a skinny convolution as `yᵀ = colᵀ · Wᵀ`, in blocks of output channels:
/// `W` is read in place, once, and only the columns are packed.
fn skinny_forward_into<T: Float>(g: Geom, x: &[T], w: &[T], y: &mut [T]) {
    let (rows, cols) = g.col_shape();
    let o = y.len() / cols.max(1);
    let col = batch_columns(&g, x);
    let block_channels = o.div_ceil(SKINNY_BLOCKS).max(1);
    for_each_chunk_mut(
        y,
        block_channels * cols,
        || (),
        |_, block, part| {
            let first = block * block_channels;
            // SAFETY: `part` holds this block's rows of y; the columns and W are read in bounds.
            unsafe {
                gemm_into(
                    (cols, part.len() / cols, rows),
                    (part.as_mut_ptr(), 1, cols),
                    (col.as_ptr(), 1, cols),
                    (w[first * rows..].as_ptr(), 1, rows),
                    false,
                )
            };
        },
    );
}

/// `dx += col2im(Wᵀ·dy)` of a skinny convolution, `dcolᵀ = dyᵀ · W` in blocks of column rows:
/// `W` is read in place, once, and only `dy` is packed.
fn skinny_input_grad<T: Float>(g: Geom, w: &[T], dy: &[T], dx: &mut [T]) {
    let (rows, cols) = g.col_shape();
    let o = dy.len() / cols.max(1);
    let mut dcol = vec![T::from_f64(0.0); rows * cols];
    let block_rows = rows.div_ceil(SKINNY_BLOCKS).max(1);
    for_each_chunk_mut(
        &mut dcol,
        block_rows * cols,
        || (),
        |_, block, part| {
            let first = block * block_rows;
            // SAFETY: `part` holds this block's rows of dcol; dy and W are read in bounds.
            unsafe {
                gemm_into(
                    (cols, part.len() / cols, o),
                    (part.as_mut_ptr(), 1, cols),
                    (dy.as_ptr(), 1, cols),
                    (w[first..].as_ptr(), rows, 1),
                    false,
                )
            };
        },
    );
    // SAFETY: dx is [C, N, D, H, W], and this thread is its only writer.
    unsafe {
        col2im_chunk(
            &g,
            &dcol,
            (0, g.n),
            &mut Scratch::default(),
            dx.as_mut_ptr(),
        )
    };
}

/// `dW = dy · colᵀ` of a skinny convolution, in blocks of column rows (columns of `dW`), each
/// written once: no partial sums.
fn skinny_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw: &mut [T]) {
    let (rows, cols) = g.col_shape();
    let o = dw.len() / rows.max(1);
    if cols == 0 {
        return dw.fill(T::from_f64(0.0));
    }
    let col = batch_columns(&g, x);
    let out = Shared(dw.as_mut_ptr());
    for_each_index(
        SKINNY_BLOCKS,
        || (),
        |_, block| {
            let out = &out;
            let taps = block * rows / SKINNY_BLOCKS..(block + 1) * rows / SKINNY_BLOCKS;
            // SAFETY: dW is [O, C·k_vol]; this block writes its own columns `taps`.
            unsafe {
                gemm_into(
                    (o, taps.len(), cols),
                    (out.0.add(taps.start), rows, 1),
                    (dy.as_ptr(), cols, 1),
                    (col[taps.start * cols..].as_ptr(), 1, cols),
                    false,
                )
            };
        },
    );
}

/// The convolution `x`: `[C, N, D, H, W]`, `W`: `[O, C·k_vol]` → `[O, N·S_out]` as one op,
/// whose backward ([`ConvBwd`]) recomputes the columns instead of keeping them.
struct ConvOp(Geom);

/// One gradient of [`ConvOp`] from inputs (x, W, dy): `dx` or `dW`, each an op of its own so
/// that each is a buffer of its own (a parameter's gradient lives until the optimiser step).
/// An input that tracks no gradient (the images entering the stem) gets no `dx`: it costs as
/// much as the forward.
struct ConvBwd {
    geom: Geom,
    of: Operand,
}

/// Which gradient a [`ConvBwd`] computes.
#[derive(Clone, Copy)]
enum Operand {
    Input,
    Weight,
}

impl candle_core::CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "ssl-conv"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, o) = (self.0, l2.dims()[0]);
        let y = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(conv_forward(
                g,
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                o,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(conv_forward(
                g,
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                o,
            )),
            _ => {
                candle_core::bail!("the convolution takes f32 or f64 input and weight of one dtype")
            }
        };
        Ok((y, Shape::from((o, g.col_shape().1))))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let of = |of| ConvBwd { geom: self.0, of };
        let dx = match x.track_op() {
            true => Some(x.apply_op3_no_bwd(w, &grad, &of(Operand::Input))?),
            false => None,
        };
        let dw = x.apply_op3_no_bwd(w, &grad, &of(Operand::Weight))?;
        Ok((dx, Some(dw)))
    }
}

impl candle_core::CustomOp3 for ConvBwd {
    fn name(&self) -> &'static str {
        "ssl-conv-bwd"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        type Arg<'a> = (&'a CpuStorage, &'a Layout);
        fn grad<T: Float>(op: &ConvBwd, [x, w, dy]: [Arg; 3]) -> Result<Vec<T>> {
            let (g, o) = (op.geom, w.1.dims()[0]);
            let (w, dy) = (contiguous_slice(w.0, w.1)?, contiguous_slice(dy.0, dy.1)?);
            Ok(match op.of {
                Operand::Input => input_grad(g, x.1.shape().elem_count(), w, dy, o),
                // SAFETY: weight_grad writes every value of `dW` and reads none.
                Operand::Weight => unsafe {
                    let x = contiguous_slice(x.0, x.1)?;
                    written_whole(w.len(), |dw| weight_grad(g, x, dy, dw))
                },
            })
        }
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(grad(self, args)?),
            CpuStorage::F64(_) => CpuStorage::F64(grad(self, args)?),
            _ => candle_core::bail!("the convolution supports f32 and f64 only"),
        };
        let shape = match self.of {
            Operand::Input => l1.shape(),
            Operand::Weight => l2.shape(),
        };
        Ok((out, shape.clone()))
    }
}

/// `x` with `before` and `after` values `fill` on either side of axis `axis`.
fn pad_axis(x: &Tensor, axis: usize, before: usize, after: usize, fill: f64) -> Result<Tensor> {
    let border = |p: usize| -> Result<Tensor> {
        let mut dims = x.dims().to_vec();
        dims[axis] = p;
        Tensor::full(fill, dims, x.device())?.to_dtype(x.dtype())
    };
    match (before, after) {
        (0, 0) => Ok(x.clone()),
        (0, _) => Tensor::cat(&[x, &border(after)?], axis),
        (_, 0) => Tensor::cat(&[&border(before)?, x], axis),
        _ => Tensor::cat(&[&border(before)?, x, &border(after)?], axis),
    }
}

/// Every window of `x`: `[C, N, D, H, W]` as `[k_vol, C, N, D_out, H_out, W_out]` (row `r` =
/// kernel offset [`Geom::offsets`]`(r)`), outside values `fill`, composed of Candle ops: the
/// im2col of devices without our op. After padding, the windows at offset `k` along an axis of
/// stride `s` are the `out·s` values from `k`, of which every `s`-th is kept ([`strided_from`]):
/// slices and copies, whose backward is zeros and copies again. Windows that share their
/// leading offsets share those slices (a tree: `k_d`, then `k_d·k_h`, then `k_vol` tensors).
pub(crate) fn gather_windows(x: &Tensor, g: Geom, fill: f64) -> Result<Tensor> {
    let out = g.out();
    let mut padded = x.clone();
    for a in 0..3 {
        // A strided axis also needs room for the `s − 1` values after its last window.
        let tail = g.stride[a] - 1;
        padded = pad_axis(&padded, 2 + a, g.pad[a], g.pad[a] + tail, fill)?;
    }
    let mut windows = vec![padded];
    for (a, &count) in out.iter().enumerate() {
        let (axis, stride) = (2 + a, g.stride[a]);
        windows = windows
            .iter()
            .flat_map(|t| (0..g.k[a]).map(move |k| strided_from(t, axis, k, count, stride)))
            .collect::<Result<Vec<_>>>()?;
    }
    Tensor::stack(&windows, 0)
}

/// `count` values of `t` along `axis`, `stride` apart from `start`: a slice (stride 1), or a
/// slice of `count·stride` values split into `[count, stride]` of which the first column is kept.
fn strided_from(
    t: &Tensor,
    axis: usize,
    start: usize,
    count: usize,
    stride: usize,
) -> Result<Tensor> {
    if stride == 1 {
        return t.narrow(axis, start, count);
    }
    let mut dims = t.dims().to_vec();
    dims[axis] = count;
    dims.insert(axis + 1, stride);
    t.narrow(axis, start, count * stride)?
        .reshape(dims)?
        .narrow(axis + 1, 0, 1)?
        .squeeze(axis + 1)
}

/// The column matrix `[C·k_vol, N·S_out]` of [`gather_windows`] with zero padding.
fn im2col_composed(x: &Tensor, g: Geom) -> Result<Tensor> {
    let (rows, cols) = g.col_shape();
    gather_windows(x, g, 0.0)?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((rows, cols))
}

/// A convolution with a square (2D) or cubic (3D) kernel: weight `[O, C, k, k]` or
/// `[O, C, k, k, k]` (key `weight`), optional `bias` `[O]`, as PyTorch's `Conv2d` / `Conv3d`.
#[derive(Debug, Clone)]
pub struct Conv {
    weight: Tensor,
    bias: Option<Tensor>,
    kernel: usize,
    stride: usize,
    padding: usize,
}

/// Builds a [`Conv`] of spatial rank 2 or 3 with PyTorch's default initialisation (Uniform
/// ±1/√fan_in for weight and bias).
#[allow(clippy::too_many_arguments)]
pub fn conv(
    c_in: usize,
    c_out: usize,
    spatial_rank: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    bias: bool,
    vb: VarBuilder,
) -> Result<Conv> {
    let fan_in = c_in * kernel.pow(spatial_rank as u32);
    let bound = 1.0 / (fan_in as f64).sqrt();
    let init = Init::Uniform {
        lo: -bound,
        up: bound,
    };
    let mut shape = vec![c_out, c_in];
    shape.extend(std::iter::repeat_n(kernel, spatial_rank));
    let weight = vb.get_with_hints(shape, "weight", init)?;
    let bias = match bias {
        true => Some(vb.get_with_hints(c_out, "bias", init)?),
        false => None,
    };
    Conv::new(weight, bias, stride, padding)
}

impl Conv {
    /// Wraps existing tensors; `weight` is `[O, C, k, k]` (2D) or `[O, C, k, k, k]` (3D).
    pub fn new(
        weight: Tensor,
        bias: Option<Tensor>,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        let dims = weight.dims();
        if !(4..=5).contains(&dims.len()) {
            candle_core::bail!(
                "Conv weight must be [O, C, k, k] or [O, C, k, k, k], got {:?}",
                dims
            );
        }
        let kernel = dims[2];
        if dims[2..].iter().any(|&k| k != kernel) {
            candle_core::bail!(
                "Conv supports square/cubic kernels only, got {:?}",
                &dims[2..]
            );
        }
        if stride == 0 {
            candle_core::bail!("Conv stride must be positive");
        }
        Ok(Self {
            weight,
            bias,
            kernel,
            stride,
            padding,
        })
    }

    /// The weight `[O, C, k, …]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias `[O]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// 2 (images) or 3 (volumes).
    pub fn spatial_rank(&self) -> usize {
        self.weight.rank() - 2
    }

    /// Convolution of a channel-major input `[C, N, *S]`, giving `[O, N, *S_out]`.
    pub fn forward_channel_major(&self, x: &Tensor) -> Result<Tensor> {
        let rank = self.spatial_rank();
        let (o, wc) = (self.weight.dim(0)?, self.weight.dim(1)?);
        if x.rank() != rank + 2 {
            candle_core::bail!(
                "a {rank}D convolution takes [C, N, {}] channel-major input, got {:?}",
                if rank == 2 { "H, W" } else { "D, H, W" },
                x.dims()
            );
        }
        let g = Geom::new("Conv", x.dims(), self.kernel, self.stride, self.padding)?;
        if wc != g.c {
            candle_core::bail!("Conv expects {wc} input channels, got {}", g.c);
        }
        let x = match x.dtype() {
            DType::F32 | DType::F64 => x.clone(),
            _ => x.to_dtype(DType::F32)?,
        };
        let (rows, cols) = g.col_shape();
        let wm = self.weight.reshape((o, rows))?.to_dtype(x.dtype())?;
        let y = if cuda_ops(x.device()) {
            // cuDNN convolves activations that lie batch-major in memory, and so do bf16's
            // roundings of them here: every shape, 1×1 included, without a copy.
            matrix_product(&x.transpose(0, 1)?, &wm, |x, wm| self.cudnn(x, wm, g))?
                .transpose(0, 1)?
        } else {
            let x = x.contiguous()?;
            matrix_product(&x, &wm, |x, wm| {
                let volumes = x.reshape(g.size_5d())?;
                if self.kernel == 1 && self.stride == 1 && self.padding == 0 {
                    // The input already is the column matrix.
                    ssl_linalg::matmul(wm, &x.reshape((rows, cols))?)
                } else if fused_kernels(x.device()) {
                    volumes.apply_op2(&wm.contiguous()?, ConvOp(g))
                } else {
                    wm.matmul(&im2col_composed(&volumes, g)?)
                }
            })?
            .reshape(g.out_dims(o, rank))?
        };
        match &self.bias {
            Some(b) => {
                let mut bshape = vec![o];
                bshape.extend(std::iter::repeat_n(1, rank + 1));
                y.broadcast_add(&b.reshape(bshape)?)
            }
            None => Ok(y),
        }
    }
}

impl Conv {
    /// `[N, O, *S_out]` from cuDNN for the batch-major `x` (`[N, C, *S]`) and the weight matrix
    /// `wm`.
    #[cfg(feature = "cuda")]
    fn cudnn(&self, x: &Tensor, wm: &Tensor, g: Geom) -> Result<Tensor> {
        let rank = self.spatial_rank();
        let o = self.weight.dim(0)?;
        let w = wm.reshape(self.weight.dims())?;
        cudnn::conv(x, &w, g, o, rank)
    }

    #[cfg(not(feature = "cuda"))]
    fn cudnn(&self, _: &Tensor, _: &Tensor, _: Geom) -> Result<Tensor> {
        unreachable!("dispatch::cuda_ops is false without the cuda feature")
    }
}

impl Module for Conv {
    /// Convolution of a batch-major input `[N, C, *S]`, giving `[N, O, *S_out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_channel_major(&x.transpose(0, 1)?)?
            .transpose(0, 1)?
            .contiguous()
    }
}

#[cfg(test)]
mod tests;
