//! The CPU forward of the convolution op: a skinny convolution's products, Winograd's algorithm
//! where it applies, else im2col and one GEMM chunk by chunk of images.

use ssl_linalg::bf16_gemm::gemm_in;
use ssl_linalg::for_each_index;

use super::geom::Geom;
use super::im2col::{chunk_columns, PhaseRows};
use super::skinny::skinny_forward_into;
use super::winograd::Winograd;
use super::Shared;
use crate::util::{written_whole, Float, Scratch};

/// `y = W · im2col(x)`: `[O, N·S_out]`, chunk by chunk of images on Candle's workers.
pub(super) fn conv_forward<T: Float>(g: Geom, x: &[T], w: &[T], o: usize) -> Vec<T> {
    // SAFETY: conv_forward_into writes every value of `y` and reads none.
    unsafe { written_whole(o * g.col_shape().1, |y| conv_forward_into(g, x, w, y)) }
}

/// [`conv_forward`] into `y`: `[O, N·S_out]`, every value of which it writes without reading it
/// first: a skinny convolution's as [`skinny_forward_into`], else by Winograd's algorithm where
/// one applies, else by im2col.
pub(super) fn conv_forward_into<T: Float>(g: Geom, x: &[T], w: &[T], y: &mut [T]) {
    if g.skinny() {
        return skinny_forward_into(g, x, w, y);
    }
    let o = y.len() / g.col_shape().1;
    match Winograd::new(g, o) {
        Some(winograd) => winograd.forward(x, w, y),
        None => im2col_forward_into(g, x, w, y),
    }
}

/// [`conv_forward_into`] as im2col and GEMM, chunk by chunk of images on Candle's workers.
pub(super) fn im2col_forward_into<T: Float>(g: Geom, x: &[T], w: &[T], y: &mut [T]) {
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
            gemm_in(
                g.products,
                (o, width, rows),
                (out.0.add(n0 * per_image), cols, 1),
                (w.as_ptr(), rows, 1),
                (col.as_ptr(), width, 1),
                false,
            )
        };
    });
}
