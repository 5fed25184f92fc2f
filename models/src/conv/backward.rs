//! The CPU gradients of the convolution op: the input gradient (the dual convolution's forward
//! at stride 1, else `dyᵀ·W` added back patch by patch) and the weight gradient (Winograd's, or
//! one of three im2col sums), each summed in an order fixed by the shapes.

use ssl_linalg::bf16_gemm::gemm_in;
use ssl_linalg::{for_each_chunk_mut, for_each_index, transpose};

use super::forward::conv_forward_into;
use super::geom::{chunk_images, Geom, CHUNK_VALUES};
use super::im2col::{
    channels_first, channels_last, chunk_columns, im2col_chunk, im2row, row2im, PhaseRows,
};
use super::skinny::{skinny_input_grad, skinny_weight_grad};
use super::winograd::Winograd;
use super::Shared;
use crate::util::{row_stride, written_whole, Float, Scratch};

/// Weight-gradient partial sums of the backward: a fixed count, so the result does not depend
/// on the number of threads.
pub(super) const WEIGHT_GRAD_GROUPS: usize = 4;

/// Blocks of column-matrix rows the im2col weight gradient is shared out in (a fixed count,
/// each block summed over the batch in one order, so the result does not depend on the number
/// of threads).
pub(super) const WEIGHT_GRAD_BLOCKS: usize = 8;

/// Largest `dW` (in values) that [`patch_weight_grad`] takes, as [`WEIGHT_GRAD_GROUPS`] partial
/// sums of the whole `dW` (32 MiB of f32 at this size). Every im2col layer up to it was as fast
/// or faster this way than by [`row_block_weight_grad`], whose left operand the `gemm` crate
/// packs a value at a time (forward and backward of one view, one thread, 2-core Zen 4): the
/// digits CNN's 64→128 at 8², 20.5 → 14.2 ms; row 1's 3×3 stride-2 layers 144 → 103 (64→128),
/// 107 → 88 (128→256) and 90 → 87 ms (256→512); row 4's 3D layers within 5 %. Above it (row
/// 4's 256→512 3×3×3 layer, 3.5 M values) the partial sums cost more than they save.
const PATCH_WEIGHT_GRAD_MAX: usize = 1 << 21;

/// [`WEIGHT_GRAD_GROUPS`] partial sums of `len` values over `chunks` chunks, on Candle's
/// workers: group `i` starts from zeros and `add(scratch, chunk, sum)` adds its chunks
/// `i·chunks/groups..` in turn. The grouping is fixed by the shapes, so the partials added in
/// order give a sum that does not depend on the number of threads.
pub(super) fn group_partial_sums<T: Float, S>(
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

/// `dx`: `[C, N, D, H, W]` of [`conv_forward`] from `dy`: the dual convolution's forward where
/// there is one (writing every value), else zeros and the skinny or scattered gradient added in.
///
/// [`conv_forward`]: super::forward::conv_forward
pub(super) fn input_grad<T: Float>(g: Geom, x_len: usize, w: &[T], dy: &[T], o: usize) -> Vec<T> {
    match g.input_grad_geometry(o).filter(|_| !g.skinny()) {
        // SAFETY: conv_forward_into writes every value of `dx` and reads none.
        Some(dual) => unsafe {
            written_whole(x_len, |dx| {
                conv_forward_into(dual, dy, &flipped_transpose(w, o, g), dx)
            })
        },
        None if g.skinny() => {
            let mut dx = vec![T::from_f64(0.0); x_len];
            skinny_input_grad(g, w, dy, &mut dx);
            dx
        }
        None => input_grad_patches(g, x_len, w, dy, o),
    }
}

impl Geom {
    /// For a stride-1 convolution with padding `p ≤ k − 1` on every axis, the input gradient is
    /// itself a stride-1 convolution of `dy`: `[O, N, *S_out]` with the kernel flipped on every
    /// axis and its channels swapped, at padding `k − 1 − p`; this is its geometry. (With a
    /// stride, the gradient is a transposed convolution, which [`input_grad_patches`] computes.)
    pub(super) fn input_grad_geometry(&self, o: usize) -> Option<Geom> {
        let fits = (0..3).all(|a| self.stride[a] == 1 && self.pad[a] < self.k[a]);
        fits.then(|| Geom {
            c: o,
            n: self.n,
            size: self.out(),
            k: self.k,
            stride: [1; 3],
            pad: std::array::from_fn(|a| self.k[a] - 1 - self.pad[a]),
            products: self.products,
        })
    }
}

/// Input channels per task of [`flipped_transpose`].
const FLIP_CHANNEL_BLOCK: usize = 16;

/// `W̃[c, o, r] = W[o, c, k_vol − 1 − r]`: `[C, O·k_vol]` from `W`: `[O, C·k_vol]`, the kernel
/// of [`Geom::input_grad_geometry`] (reversing the flat offset flips every axis).
pub(super) fn flipped_transpose<T: Float>(w: &[T], o: usize, g: Geom) -> Vec<T> {
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

/// `dx`: `[C, N, D, H, W]` of any stride and padding through patches: chunk by chunk of whole
/// images on Candle's workers, `dpatches = dy_chunkᵀ · W̃` (`[P, k_vol·C]`, `W̃` the kernel with
/// its columns kernel offset by kernel offset, both operands in the `gemm` crate's packed
/// order), each patch row added back into the chunk's images of a channels-last `dx` as runs
/// of `k_w·C` values ([`row2im`]), and `dx` made channel-major once.
pub(super) fn input_grad_patches<T: Float>(
    g: Geom,
    x_len: usize,
    w: &[T],
    dy: &[T],
    o: usize,
) -> Vec<T> {
    let (rows, cols) = g.col_shape();
    let kv = g.kernel_volume();
    let per_image = g.out().iter().product::<usize>();
    let volume = x_len / g.n.max(1);
    let mut by_offset = vec![T::from_f64(0.0); w.len()];
    transpose_blocks(w, (g.c, kv), &mut by_offset);
    let mut dx = vec![T::from_f64(0.0); x_len];
    let chunks = g.chunks();
    let dx_ptr = Shared(dx.as_mut_ptr());
    for_each_index(
        chunks,
        Scratch::default,
        |dpatches: &mut Scratch<T>, chunk| {
            let dx_ptr = &dx_ptr;
            let images = chunk_images(g.n, chunks, chunk);
            let positions = images.start * per_image..images.end * per_image;
            dpatches.resize(positions.len() * rows);
            // SAFETY: dpatches is this task's own; dy and W̃ are read in bounds; the chunk's images
            // of dx are written by this task alone.
            unsafe {
                gemm_in(
                    g.products,
                    (positions.len(), rows, o),
                    (dpatches.as_mut_ptr(), rows, 1),
                    (dy[positions.start..].as_ptr(), 1, cols),
                    (by_offset.as_ptr(), rows, 1),
                    false,
                );
                let dx = std::slice::from_raw_parts_mut(
                    dx_ptr.0.add(images.start * volume),
                    images.len() * volume,
                );
                row2im(&g, (dpatches, rows), positions, dx);
            }
        },
    );
    // SAFETY: channels_first writes every value of the output.
    unsafe { written_whole(x_len, |out| channels_first(&g, &dx, out)) }
}

/// `dW`: `[O, C·k_vol]` of [`conv_forward`], every value written without reading it first: a
/// skinny convolution's as [`skinny_weight_grad`], else by Winograd's algorithm where one
/// applies, else [`im2col_weight_grad`].
///
/// [`conv_forward`]: super::forward::conv_forward
pub(super) fn weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw: &mut [T]) {
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
/// - a `dW` of at most [`PATCH_WEIGHT_GRAD_MAX`] values: [`patch_weight_grad`];
/// - a larger one: [`row_block_weight_grad`].
pub(super) fn im2col_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
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
pub(super) fn row_block_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
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
                    gemm_in(
                        g.products,
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
pub(super) fn stem_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
    let x = &*PhaseRows::of(&g).arrange(x);
    let (rows, cols) = g.col_shape();
    let o = dw_out.len() / rows;
    let per_image = g.out().iter().product::<usize>();
    let chunks = g.chunks();
    let partials = group_partial_sums(chunks, o * rows, Scratch::default, |col, chunk, dw| {
        let (n0, width) = chunk_columns(&g, x, (chunk, chunks), col);
        // SAFETY: dW is this task's own; dy and col are read in bounds.
        unsafe {
            gemm_in(
                g.products,
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

/// [`im2col_weight_grad`] of a `dW` of at most [`PATCH_WEIGHT_GRAD_MAX`] values:
/// `dW = Σ_chunks dy_chunk · patches` as [`WEIGHT_GRAD_GROUPS`] partial sums added in a fixed
/// order. Both operands run along the positions, so one is transposed for the `gemm` crate,
/// which packs its left operand a vector at a time only from the column-major layout: `dy`'s
/// chunk (`O` values a position, against the patches' `C·k_vol`), into `[P, O]`. The patches
/// (`[P, k_vol·C]`, [`im2row`] of the input made channels-last) are the right operand, read in
/// place; their rows come kernel offset by kernel offset, so the sums are `dW` with its
/// columns in that order, put back in `W`'s `[O, C·k_vol]` as they are added. As the left
/// operand the patches were packed, a copy of the chunk's largest matrix, and the row blocks'
/// column rows (the 3D stem's 343 rows over 32,768 positions a volume) a value at a time.
pub(super) fn patch_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw_out: &mut [T]) {
    let (rows, cols) = g.col_shape();
    let o = dw_out.len() / rows;
    let x = &*channels_last(&g, x);
    let spans = g.patch_spans();
    let init = <[Scratch<T>; 2]>::default;
    let partials = group_partial_sums(spans.len(), o * rows, init, |[patches, dyt], chunk, dw| {
        let positions = spans[chunk].clone();
        let count = positions.len();
        patches.resize(count * rows);
        im2row(&g, x, positions.clone(), (patches, rows));
        dyt.resize(count * o);
        transpose(&dy[positions.start..], cols, (o, count), dyt, o);
        // SAFETY: dW is this task's own; dyᵀ and the patches are read in bounds.
        unsafe {
            gemm_in(
                g.products,
                (o, rows, count),
                (dw.as_mut_ptr(), rows, 1),
                (dyt.as_ptr(), 1, o),
                (patches.as_ptr(), rows, 1),
                true,
            );
        }
    });
    let mut partials = partials.into_iter();
    let Some(mut sum) = partials.next() else {
        return dw_out.fill(T::from_f64(0.0));
    };
    for partial in partials {
        for (s, p) in sum.iter_mut().zip(&partial) {
            *s += *p;
        }
    }
    transpose_blocks(&sum, (g.kernel_volume(), g.c), dw_out);
}

/// Every `[a, b]` block of `src` (one kernel's columns: channel by channel, or kernel offset by
/// kernel offset) written transposed, `[b, a]`, into the same place of `dst`.
fn transpose_blocks<T: Float>(src: &[T], (a, b): (usize, usize), dst: &mut [T]) {
    for (dst, src) in dst.chunks_mut(a * b).zip(src.chunks(a * b)) {
        transpose(src, b, (a, b), dst, a);
    }
}

impl Geom {
    /// The chunks of [`patch_weight_grad`], ranges of positions flat over the batch's
    /// `N·S_out`: about [`CHUNK_VALUES`] patch values each, whole images where one fits (at
    /// least 8 chunks when the batch allows, as [`Geom::chunks`]), else parts of one image.
    pub(super) fn patch_spans(&self) -> Vec<std::ops::Range<usize>> {
        let rows = self.col_shape().0;
        let per_image = self.out().iter().product::<usize>();
        let span = (CHUNK_VALUES / rows.max(1)).max(1);
        if per_image <= span {
            let chunks = self.chunks();
            return (0..chunks)
                .map(|chunk| {
                    let images = chunk_images(self.n, chunks, chunk);
                    images.start * per_image..images.end * per_image
                })
                .collect();
        }
        let per_image_chunks = per_image.div_ceil(span);
        (0..self.n * per_image_chunks)
            .map(|chunk| {
                let (n, first) = (chunk / per_image_chunks, (chunk % per_image_chunks) * span);
                n * per_image + first..n * per_image + (first + span).min(per_image)
            })
            .collect()
    }
}
