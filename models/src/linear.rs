//! A linear layer `y = x Wᵀ + b` over the last axis, keyed `weight` `[D_out, D_in]` and `bias`
//! `[D_out]` as `torch.nn.Linear`.
//!
//! Inputs of any rank are multiplied as one `[rows, D_in] × [D_in, D_out]` product. On the CPU
//! in f32 or f64 the layer is one op, as PyTorch's `addmm`: the bias fills the output before
//! the GEMM adds `x Wᵀ` into it, and the backward gives `dx = G W`, `dW = Gᵀ x` (read through
//! strides, in `W`'s own `[D_out, D_in]` layout) and `db = Σ_rows G` in one buffer. Composed
//! of Candle ops instead, the bias add is a broadcast op whose gradient is a reduction over
//! rows, `x` is copied transposed for `dW`, and `dW` arrives transposed. Other devices and bf16
//! autocast multiply as [`matrix_product`] does (Candle's `Linear` would broadcast the weight
//! to `[N, D_out, D_in]` for a `[N, T, D_in]` input and sum that gradient back).

use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::{extend_by_chunks, for_each_chunk_mut, matmul_strided, matmul_strided_uninit};

use crate::autocast::{matrix_product, precision, Precision};
use crate::dispatch::fused_kernels;
use crate::util::{contiguous_slice, owned_part, Float};

#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// From a weight `[D_out, D_in]` and an optional bias `[D_out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `x Wᵀ + b` of Candle ops for `x`: `[rows, D_in]`, the operands under the thread's
    /// autocast precision.
    fn composed(&self, x: &Tensor) -> Result<Tensor> {
        let y = matrix_product(x, &self.weight.t()?, ssl_linalg::matmul)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

impl Module for Linear {
    /// `x`: `[…, D_in]` → `[…, D_out]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (out_dim, in_dim) = self.weight.dims2()?;
        if x.dims().last() != Some(&in_dim) {
            candle_core::bail!(
                "a linear layer of input width {in_dim} got input {:?}",
                x.dims()
            );
        }
        let mut shape = x.dims().to_vec();
        let rows = x.elem_count() / in_dim.max(1);
        *shape.last_mut().expect("checked above") = out_dim;
        let x = x.reshape((rows, in_dim))?;
        let fused = fused_kernels(x.device())
            && matches!(x.dtype(), DType::F32 | DType::F64)
            && self.weight.dtype() == x.dtype()
            && precision() == Precision::F32;
        let y = match (&self.bias, fused) {
            (Some(b), true) => {
                x.contiguous()?
                    .apply_op3(&self.weight.contiguous()?, &b.contiguous()?, LinearOp)?
            }
            (None, true) => x
                .contiguous()?
                .apply_op2(&self.weight.contiguous()?, LinearOp)?,
            (_, false) => self.composed(&x)?,
        };
        y.reshape(shape)
    }
}

/// Output rows per task of the bias fill and of the bias gradient's column blocks.
const BLOCK: usize = 64;

/// `y = x Wᵀ (+ b)`: `[rows, D_out]` for `x`: `[rows, D_in]`, `W`: `[D_out, D_in]`.
fn linear_forward<T: Float>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    (rows, in_dim, out_dim): (usize, usize, usize),
) -> Result<Vec<T>> {
    let mut y = match bias {
        Some(b) => {
            let mut y = Vec::new();
            // SAFETY: a block's rows are `D_out` long, as `b`, and together cover the block.
            unsafe {
                extend_by_chunks(&mut y, rows * out_dim, BLOCK * out_dim, |_, block| {
                    for row in block.chunks_mut(out_dim) {
                        row.write_copy_of_slice(b);
                    }
                })
            };
            y
        }
        None => vec![T::zero(); rows * out_dim],
    };
    matmul_strided(
        (x, (in_dim, 1)),
        (w, (1, in_dim)),
        (rows, out_dim, in_dim),
        &mut y,
        bias.is_some(),
    )?;
    Ok(y)
}

/// Which gradients [`LinearBwd`] computes.
#[derive(Clone, Copy)]
struct Wanted {
    input: bool,
    bias: bool,
}

/// `[dx (rows·D_in, where wanted) | dW (D_out·D_in) | db (D_out, where wanted)]` from the
/// output gradient `g`: `[rows, D_out]`.
fn linear_backward<T: Float>(
    x: &[T],
    w: &[T],
    g: &[T],
    (rows, in_dim, out_dim): (usize, usize, usize),
    wanted: Wanted,
) -> Result<Vec<T>> {
    let dx_len = if wanted.input { x.len() } else { 0 };
    let db_len = if wanted.bias { out_dim } else { 0 };
    let len = dx_len + w.len() + db_len;
    let mut grads = Vec::with_capacity(len);
    let (dx, rest) = grads.spare_capacity_mut()[..len].split_at_mut(dx_len);
    let (dw, db) = rest.split_at_mut(w.len());
    if wanted.input {
        matmul_strided_uninit(
            (g, (out_dim, 1)),
            (w, (in_dim, 1)),
            (rows, in_dim, out_dim),
            dx,
        )?;
    }
    matmul_strided_uninit(
        (g, (1, out_dim)),
        (x, (in_dim, 1)),
        (out_dim, in_dim, rows),
        dw,
    )?;
    for_each_chunk_mut(
        db,
        BLOCK,
        || (),
        |_, block, db| {
            let first = block * BLOCK;
            let mut sums = [T::zero(); BLOCK];
            for row in g.chunks(out_dim) {
                for (s, &v) in sums.iter_mut().zip(&row[first..]) {
                    *s += v;
                }
            }
            for (d, &s) in db.iter_mut().zip(&sums) {
                d.write(s);
            }
        },
    );
    // SAFETY: the two products wrote `dx` and `dW`, and the loop above every value of `db`.
    unsafe { grads.set_len(len) };
    Ok(grads)
}

/// [`Linear`] on the CPU: `(x, W)` or `(x, W, b)` → `x Wᵀ (+ b)`.
struct LinearOp;

/// The dimensions `(rows, D_in, D_out)` of a product of `x` and `W`.
fn dims(x: &Layout, w: &Layout) -> Result<(usize, usize, usize)> {
    let (rows, in_dim) = x.shape().dims2()?;
    let (out_dim, _) = w.shape().dims2()?;
    Ok((rows, in_dim, out_dim))
}

impl LinearOp {
    fn forward(
        (x, lx): (&CpuStorage, &Layout),
        (w, lw): (&CpuStorage, &Layout),
        bias: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let d = dims(lx, lw)?;
        fn run<T: Float>(
            (x, lx): (&CpuStorage, &Layout),
            (w, lw): (&CpuStorage, &Layout),
            bias: Option<(&CpuStorage, &Layout)>,
            d: (usize, usize, usize),
        ) -> Result<Vec<T>> {
            let bias = bias.map(|(b, lb)| contiguous_slice(b, lb)).transpose()?;
            linear_forward(contiguous_slice(x, lx)?, contiguous_slice(w, lw)?, bias, d)
        }
        let y = match x {
            CpuStorage::F32(_) => CpuStorage::F32(run((x, lx), (w, lw), bias, d)?),
            CpuStorage::F64(_) => CpuStorage::F64(run((x, lx), (w, lw), bias, d)?),
            _ => candle_core::bail!("ssl-linear supports f32 and f64 only"),
        };
        Ok((y, Shape::from((d.0, d.2))))
    }

    /// The gradients of `x`, `W` and (where `b` is given) `b`.
    fn backward(
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Tensor, Option<Tensor>)> {
        let wanted = Wanted {
            input: x.track_op(),
            bias: b.is_some(),
        };
        let all = x.apply_op3_no_bwd(w, &grad.contiguous()?, &LinearBwd(wanted))?;
        let dx_len = if wanted.input { x.elem_count() } else { 0 };
        let dx = match wanted.input {
            true => Some(all.narrow(0, 0, dx_len)?.reshape(x.shape())?),
            false => None,
        };
        let dw = owned_part(&all, dx_len, w.elem_count())?.reshape(w.shape())?;
        let db = match b {
            Some(b) => Some(owned_part(&all, dx_len + w.elem_count(), b.elem_count())?),
            None => None,
        };
        Ok((dx, dw, db))
    }
}

impl candle_core::CustomOp2 for LinearOp {
    fn name(&self) -> &'static str {
        "ssl-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        w: &CpuStorage,
        lw: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Self::forward((x, lx), (w, lw), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = Self::backward(x, w, None, grad)?;
        Ok((dx, Some(dw)))
    }
}

impl candle_core::CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        "ssl-linear"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        w: &CpuStorage,
        lw: &Layout,
        b: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Self::forward((x, lx), (w, lw), Some((b, lb)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = Self::backward(x, w, Some(b), grad)?;
        Ok((dx, Some(dw), db))
    }
}

/// Backward of [`LinearOp`]: `(x, W, G)` → the gradients [`linear_backward`] lays out.
struct LinearBwd(Wanted);

impl candle_core::CustomOp3 for LinearBwd {
    fn name(&self) -> &'static str {
        "ssl-linear-bwd"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        w: &CpuStorage,
        lw: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = dims(lx, lw)?;
        let grads = match x {
            CpuStorage::F32(_) => CpuStorage::F32(linear_backward(
                contiguous_slice(x, lx)?,
                contiguous_slice(w, lw)?,
                contiguous_slice(g, lg)?,
                d,
                self.0,
            )?),
            CpuStorage::F64(_) => CpuStorage::F64(linear_backward(
                contiguous_slice(x, lx)?,
                contiguous_slice(w, lw)?,
                contiguous_slice(g, lg)?,
                d,
                self.0,
            )?),
            _ => candle_core::bail!("ssl-linear supports f32 and f64 only"),
        };
        let len = grads_len(d, self.0);
        Ok((grads, Shape::from(len)))
    }
}

/// The length of [`linear_backward`]'s buffer.
fn grads_len((rows, in_dim, out_dim): (usize, usize, usize), wanted: Wanted) -> usize {
    let dx = if wanted.input { rows * in_dim } else { 0 };
    let db = if wanted.bias { out_dim } else { 0 };
    dx + out_dim * in_dim + db
}

/// A linear layer with PyTorch's default initialisation: weight and bias Uniform ±1/√in_dim.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let bound = 1.0 / (in_dim as f64).sqrt();
    let init = Init::Uniform {
        lo: -bound,
        up: bound,
    };
    let w = vb.get_with_hints((out_dim, in_dim), "weight", init)?;
    let b = vb.get_with_hints(out_dim, "bias", init)?;
    Ok(Linear::new(w, Some(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{max_abs_diff, rand_tensor};
    use candle_core::DType;

    #[test]
    fn any_rank_equals_candles_linear_and_widths_are_checked() {
        let w = rand_tensor(1, &[5, 7], DType::F64);
        let b = rand_tensor(2, &[5], DType::F64);
        let ours = Linear::new(w.clone(), Some(b.clone()));
        let candle = candle_nn::Linear::new(w, Some(b));
        for shape in [vec![3, 7], vec![2, 3, 7]] {
            let x = rand_tensor(3, &shape, DType::F64);
            let d = max_abs_diff(&ours.forward(&x).unwrap(), &candle.forward(&x).unwrap());
            assert!(d < 1e-12, "{shape:?}: {d}");
        }
        let err = ours
            .forward(&rand_tensor(3, &[3, 6], DType::F64))
            .unwrap_err();
        assert!(err.to_string().contains("input width 7"), "{err}");
    }

    #[test]
    fn fused_gradients_equal_the_composed_ones_with_and_without_bias_or_input_gradient() {
        use candle_core::Var;
        // 70 outputs: two bias-gradient blocks, the second partial; 130 rows.
        let w = Var::from_tensor(&rand_tensor(4, &[70, 9], DType::F64)).unwrap();
        let b = Var::from_tensor(&rand_tensor(5, &[70], DType::F64)).unwrap();
        let r = rand_tensor(6, &[2, 65, 70], DType::F64);
        let x_var = Var::from_tensor(&rand_tensor(7, &[2, 65, 9], DType::F64)).unwrap();
        let x_plain = x_var.as_tensor().detach();
        for bias in [Some(b.as_tensor().clone()), None] {
            let layer = Linear::new(w.as_tensor().clone(), bias.clone());
            for x in [x_var.as_tensor(), &x_plain] {
                let grads = |y: Tensor| (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
                let fused = layer.forward(x).unwrap();
                let composed = layer
                    .composed(&x.reshape((130, 9)).unwrap())
                    .unwrap()
                    .reshape((2, 65, 70))
                    .unwrap();
                assert!(max_abs_diff(&fused, &composed) < 1e-13);
                let (gf, gc) = (grads(fused), grads(composed));
                let mut tensors = vec![w.as_tensor()];
                tensors.extend(bias.as_ref());
                if x.track_op() {
                    tensors.push(x);
                } else {
                    assert!(gf.get(x).is_none(), "an untracked input gets no gradient");
                }
                for t in tensors {
                    let d = max_abs_diff(gf.get(t).unwrap(), gc.get(t).unwrap());
                    assert!(d < 1e-12, "{:?}: {d}", t.dims());
                }
            }
        }
    }
}
