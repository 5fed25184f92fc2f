//! The three products of a *skinny* convolution (few output positions against a large weight),
//! each reading or writing `W` once, in place, on the column matrix of the whole batch.

use ssl_linalg::bf16_gemm::gemm_in;
use ssl_linalg::{for_each_chunk_mut, for_each_index};

use super::geom::Geom;
use super::im2col::{col2im_chunk, im2col_chunk, PhaseRows};
use super::Shared;
use crate::util::{Float, Scratch};

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
    pub(super) fn skinny(&self) -> bool {
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
pub(super) fn skinny_forward_into<T: Float>(g: Geom, x: &[T], w: &[T], y: &mut [T]) {
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
                gemm_in(
                    g.products,
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
pub(super) fn skinny_input_grad<T: Float>(g: Geom, w: &[T], dy: &[T], dx: &mut [T]) {
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
                gemm_in(
                    g.products,
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
pub(super) fn skinny_weight_grad<T: Float>(g: Geom, x: &[T], dy: &[T], dw: &mut [T]) {
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
                gemm_in(
                    g.products,
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
