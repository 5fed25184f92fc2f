//! 2D and 3D convolution as im2col (vol2col) + one GEMM on channel-major activations.
//!
//! Candle's own CPU conv2d is slow (especially its backward) and Candle has no 3D convolution,
//! so [`Conv::forward_channel_major`] lowers a convolution of spatial rank 2 or 3 to a custom
//! im2col op (whose backward is a col2im op) followed by a single matmul
//! `W[O, C·kᴿ] × col[C·kᴿ, N·S_out]`, which yields the output directly in `[O, N, *S_out]`.
//! A 2D convolution is the 3D one with depth 1 and kernel depth 1, so one pair of kernels
//! serves both; a 1×1 stride-1 convolution needs no im2col (its input is the column matrix).
//! Both ops are parallel over disjoint output chunks on Candle's CPU workers, so they are
//! deterministic. On other devices the columns are gathered with Candle ops (zero padding and
//! `index_select` per kernel offset), whose autograd gives the same gradients.

use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::for_each_chunk_mut;

use crate::util::{contiguous_slice, Float};

/// Geometry of a convolution on a `[C, N, D, H, W]` input (`D = 1`, kernel depth 1 in 2D).
#[derive(Debug, Clone, Copy, PartialEq)]
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

fn im2col_kernel<T: Float>(g: Geom, x: &[T]) -> Vec<T> {
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let (rows, cols) = g.col_shape();
    let mut out = vec![T::from_f64(0.0); rows * cols];
    let sw = g.stride[2];
    // One chunk = one (row, image) pair: D_out·H_out·W_out contiguous outputs.
    for_each_chunk_mut(
        &mut out,
        per_image.max(1),
        || (),
        |_, idx, dst| {
            let (row, n) = (idx / g.n, idx % g.n);
            let c = row / g.kernel_volume();
            let offsets = g.offsets(row);
            let kw = offsets[2];
            let src = &x[(c * g.n + n) * volume..][..volume];
            let ows = g.valid_outputs(2, kw);
            let Some(iw0) = (ows.start * sw + kw).checked_sub(g.pad[2]) else {
                return;
            };
            for_each_row(&g, offsets, |o, i| {
                let (drow, srow) = (&mut dst[o..], &src[i + iw0..]);
                if sw == 1 {
                    drow[ows.clone()].copy_from_slice(&srow[..ows.len()]);
                } else {
                    for (j, ow) in ows.clone().enumerate() {
                        drow[ow] = srow[j * sw];
                    }
                }
            });
        },
    );
    out
}

fn col2im_kernel<T: Float>(g: Geom, col: &[T]) -> Vec<T> {
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let (_, cols) = g.col_shape();
    let mut out = vec![T::from_f64(0.0); g.c * g.n * volume];
    let sw = g.stride[2];
    // One chunk = one (channel, image) volume of the input gradient.
    for_each_chunk_mut(
        &mut out,
        volume.max(1),
        || (),
        |_, idx, dst| {
            let (c, n) = (idx / g.n, idx % g.n);
            for r in 0..g.kernel_volume() {
                let row = c * g.kernel_volume() + r;
                let offsets = g.offsets(row);
                let kw = offsets[2];
                let src = &col[row * cols + n * per_image..][..per_image];
                let ows = g.valid_outputs(2, kw);
                let Some(iw0) = (ows.start * sw + kw).checked_sub(g.pad[2]) else {
                    continue;
                };
                for_each_row(&g, offsets, |o, i| {
                    let (srow, drow) = (&src[o..], &mut dst[i + iw0..]);
                    for (j, ow) in ows.clone().enumerate() {
                        drow[j * sw] += srow[ow];
                    }
                });
            }
        },
    );
    out
}

/// im2col: `[C, N, D, H, W]` → `[C·kd·kh·kw, N·D_out·H_out·W_out]`.
struct Im2Col(Geom);
/// col2im (adjoint of im2col): `[C·kd·kh·kw, N·D_out·H_out·W_out]` → `[C, N, D, H, W]`.
struct Col2Im(Geom);

impl candle_core::CustomOp1 for Im2Col {
    fn name(&self) -> &'static str {
        "ssl-im2col"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = self.0;
        let shape = Shape::from(g.col_shape());
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(im2col_kernel(g, contiguous_slice(s, l)?)),
            CpuStorage::F64(_) => CpuStorage::F64(im2col_kernel(g, contiguous_slice(s, l)?)),
            _ => candle_core::bail!("im2col supports f32 and f64 only"),
        };
        Ok((out, shape))
    }
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(Col2Im(self.0))?))
    }
}

impl candle_core::CustomOp1 for Col2Im {
    fn name(&self) -> &'static str {
        "ssl-col2im"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = self.0;
        let mut dims = vec![g.c, g.n];
        dims.extend(g.size);
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(col2im_kernel(g, contiguous_slice(s, l)?)),
            CpuStorage::F64(_) => CpuStorage::F64(col2im_kernel(g, contiguous_slice(s, l)?)),
            _ => candle_core::bail!("col2im supports f32 and f64 only"),
        };
        Ok((out, Shape::from(dims)))
    }
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(Im2Col(self.0))?))
    }
}

/// `x` padded by `p` values `fill` on both sides of axis `axis`.
fn pad_axis(x: &Tensor, axis: usize, p: usize, fill: f64) -> Result<Tensor> {
    if p == 0 {
        return Ok(x.clone());
    }
    let mut dims = x.dims().to_vec();
    dims[axis] = p;
    let border = Tensor::full(fill, dims, x.device())?.to_dtype(x.dtype())?;
    Tensor::cat(&[&border, x, &border], axis)
}

/// Every window of `x`: `[C, N, D, H, W]` as `[k_vol, C, N, D_out, H_out, W_out]` (row `r` =
/// kernel offset [`Geom::offsets`]`(r)`), outside values `fill`, composed of Candle ops (padding,
/// then one strided `index_select` per axis and offset): the im2col of devices without our op.
pub(crate) fn gather_windows(x: &Tensor, g: Geom, fill: f64) -> Result<Tensor> {
    let out = g.out();
    let mut padded = x.clone();
    for a in 0..3 {
        padded = pad_axis(&padded, 2 + a, g.pad[a], fill)?;
    }
    let index = |a: usize, k: usize| -> Result<Tensor> {
        let idx: Vec<u32> = (0..out[a]).map(|o| (o * g.stride[a] + k) as u32).collect();
        Tensor::new(idx, x.device())
    };
    let windows = (0..g.kernel_volume())
        .map(|r| {
            let mut t = padded.clone();
            for (a, &k) in g.offsets(r).iter().enumerate() {
                t = t.index_select(&index(a, k)?, 2 + a)?;
            }
            Ok(t)
        })
        .collect::<Result<Vec<_>>>()?;
    Tensor::stack(&windows, 0)
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
            DType::F32 | DType::F64 => x.contiguous()?,
            _ => x.to_dtype(DType::F32)?.contiguous()?,
        };
        let (rows, cols) = g.col_shape();
        let volumes = x.reshape((g.c, g.n, g.size[0], g.size[1], g.size[2]))?;
        let col = if self.kernel == 1 && self.stride == 1 && self.padding == 0 {
            x.reshape((rows, cols))?
        } else if x.device().is_cpu() {
            volumes.apply_op1(Im2Col(g))?
        } else {
            im2col_composed(&volumes, g)?
        };
        let wm = self.weight.reshape((o, rows))?;
        let y = ssl_linalg::matmul(&wm, &col)?.reshape(g.out_dims(o, rank))?;
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
