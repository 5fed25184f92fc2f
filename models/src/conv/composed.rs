//! im2col composed of Candle ops (padding, slices and copies), for devices without the CPU op:
//! its autograd gives the convolution's gradients.

use candle_core::{Result, Tensor};

use super::geom::Geom;

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
pub(super) fn im2col_composed(x: &Tensor, g: Geom) -> Result<Tensor> {
    let (rows, cols) = g.col_shape();
    gather_windows(x, g, 0.0)?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((rows, cols))
}
