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
//! stride it is `dyᵀ·W` patch by patch, added back into a channels-last `dx` as runs across the
//! channels. Where the weight gradient's sums are small it is taken over such patches too
//! (`dW = dyᵀᵀ·patches`), else as `dW = dy·colᵀ` block by block of rows. A stride-1 3×3
//! (3×3×3) convolution of at least 16 channels in and out, over at least 64 tiles, takes
//! Winograd's minimal filtering instead
//! (`winograd`): F(4×4, 3×3) on images, 4× fewer multiply-adds in its GEMMs (F(2×2, 3×3),
//! 2.25×, on the smallest images), and F(2×2×2, 3×3×3) on volumes, 3.4×; for the forward, the
//! dual convolution of the input gradient and the weight gradient alike. A 2D convolution is
//! the 3D one with depth 1 and kernel depth 1, so one set of kernels serves both; a 1×1 stride-1
//! convolution needs no im2col (its input is the column matrix). A stride along the width reads
//! the input rows phase by phase (`PhaseRows`), so im2col copies and col2im adds runs; output
//! rows of at most 8 values are instead gathered (and added back) value by value through a
//! table of where each output reads, from the input's own layout (`Copying`). A
//! *skinny* convolution, few output positions against a large weight (the 3D ResNet's 2³
//! layers), computes its three products with `W` read in place, once (`SKINNY_COLUMNS`).
//! Chunks are fixed by the shapes alone and the weight gradient's partial sums are added in a
//! fixed order, so results do not depend on the thread count. On CUDA (feature `cuda`) cuDNN
//! computes the convolution and its two gradients (module `cudnn`). On other devices the columns
//! are gathered with Candle ops (zero padding and `index_select` per kernel offset), whose
//! autograd gives the same gradients.
//!
//! This file holds [`Conv`]; the CPU op lives in `geom` (shapes and chunks), `im2col`,
//! `forward`, `backward`, `skinny`, `winograd` and `op` (the custom op itself), and the Candle-op
//! fallback in `composed`.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::autocast::{matrix_product, precision, Precision};
use crate::dispatch::{cuda_ops, fused_kernels};
use composed::im2col_composed;
use op::ConvOp;

mod backward;
mod composed;
#[cfg(feature = "cuda")]
pub mod cudnn;
mod forward;
mod geom;
mod im2col;
mod op;
mod skinny;
mod winograd;

pub(crate) use composed::gather_windows;
pub(crate) use geom::Geom;

/// A pointer handed to the tasks of one op, each writing a disjoint part.
struct Shared<T>(*mut T);
unsafe impl<T: Send> Sync for Shared<T> {}

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
            let pointwise = self.kernel == 1 && self.stride == 1 && self.padding == 0;
            let fused = fused_kernels(x.device());
            let convolve = |x: &Tensor, wm: &Tensor, products| {
                if pointwise {
                    // The input already is the column matrix.
                    ssl_linalg::matmul_in(products, wm, &x.reshape((rows, cols))?)
                } else if fused {
                    let g = Geom { products, ..g };
                    x.reshape(g.size_5d())?
                        .apply_op2(&wm.contiguous()?, ConvOp(g))
                } else {
                    wm.matmul(&im2col_composed(&x.reshape(g.size_5d())?, g)?)
                }
            };
            // Our ops round bf16 operands as their GEMMs pack them (Winograd's multiply in f32:
            // `Geom::products`); Candle's matmul gets them rounded beforehand.
            let packs_bf16 = x.device().is_cpu() && (pointwise || fused);
            match precision() {
                Precision::Bf16 if packs_bf16 => convolve(&x, &wm, Precision::Bf16)?,
                _ => matrix_product(&x, &wm, |x, wm| convolve(x, wm, Precision::F32))?,
            }
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
