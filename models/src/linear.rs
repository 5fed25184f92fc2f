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
//! to `[N, D_out, D_in]` for a `[N, T, D_in]` input and sum that gradient back); on CUDA a
//! layer with a bias keeps for its backward only what the CPU op keeps
//! (`Linear::product_then_bias`).

use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::{extend_by_chunks, for_each_chunk_mut, matmul_strided, matmul_strided_uninit};

use crate::autocast::{matmul, matrix_product, precision, Precision};
use crate::dispatch::{cuda_ops, fused_kernels};
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
        let y = matmul(x, &self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// `x Wᵀ + b` for devices where [`LinearOp`] does not run (CUDA), keeping for the backward
    /// what the CPU op keeps, `x` and `W`. Composed, the bias add holds the product
    /// `[rows, D_out]` until the backward (ViT-S/16 at 32 images: 87 MB a block over its four
    /// layers, 1 GB over the 12), and `dW` arrives transposed and is copied. Here the product
    /// runs detached and one op node adds the bias ([`BiasAdded`]); its backward gives `dx = G
    /// W`, `dW = Gᵀ x` (in `W`'s layout) and `db = Σ_rows G`, the products as
    /// [`matrix_product`] makes them.
    fn product_then_bias(&self, x: &Tensor, b: &Tensor) -> Result<Tensor> {
        let product = matrix_product(&x.detach(), &self.weight.detach().t()?, ssl_linalg::matmul)?;
        x.apply_op3(
            &self.weight,
            b,
            BiasAdded {
                product: std::sync::Mutex::new(Some(product.contiguous()?)),
            },
        )
    }
}

/// Whether `x` and `b` are both f32 or both f64 (the dtypes of our kernels).
fn same_float(x: &Tensor, b: &Tensor) -> bool {
    matches!(x.dtype(), DType::F32 | DType::F64) && b.dtype() == x.dtype()
}

/// The op node of [`Linear::product_then_bias`] on `(x, W, b)`: its forward adds `b` to every
/// row of the product computed detached, its backward is the linear layer's.
struct BiasAdded {
    /// `x Wᵀ`: `[rows, D_out]`, until the forward takes it.
    product: std::sync::Mutex<Option<Tensor>>,
}

impl BiasAdded {
    fn product(&self) -> Result<Tensor> {
        let product = self
            .product
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        product.ok_or_else(|| candle_core::Error::Msg("ssl-linear-bias ran twice".into()))
    }
}

impl candle_core::CustomOp3 for BiasAdded {
    fn name(&self) -> &'static str {
        "ssl-linear-bias"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        b: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let product = self.product()?;
        let (storage, layout) = product.storage_and_layout();
        let candle_core::Storage::Cpu(y) = &*storage else {
            candle_core::bail!("ssl-linear-bias: the product is not on the CPU");
        };
        fn run<T: Float>(y: &[T], b: &[T]) -> Vec<T> {
            y.chunks(b.len().max(1))
                .flat_map(|row| row.iter().zip(b).map(|(&y, &b)| y + b))
                .collect()
        }
        let out = match y {
            CpuStorage::F32(_) => {
                CpuStorage::F32(run(contiguous_slice(y, layout)?, contiguous_slice(b, lb)?))
            }
            CpuStorage::F64(_) => {
                CpuStorage::F64(run(contiguous_slice(y, layout)?, contiguous_slice(b, lb)?))
            }
            _ => candle_core::bail!("ssl-linear-bias supports f32 and f64 only"),
        };
        Ok((out, product.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        b: &candle_core::CudaStorage,
        lb: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{bias_add, float_dtype, view};
        use candle_core::backend::BackendStorage;
        let product = self.product()?;
        let (storage, layout) = product.storage_and_layout();
        let candle_core::Storage::Cuda(y) = &*storage else {
            candle_core::bail!("ssl-linear-bias: the product is not on CUDA");
        };
        let dims = product.dims2()?;
        let out = float_dtype!(y.dtype(), T => {
            bias_add::<T>(&y.device, (view(y, layout)?, view(b, lb)?), dims)?
        });
        Ok((out, product.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (x_tracked, x, w, g) = (x.track_op(), x.detach(), w.detach(), grad.detach());
        let product = |a: &Tensor, b: &Tensor| matrix_product(a, b, ssl_linalg::matmul);
        let dx = match x_tracked {
            true => Some(product(&g, &w)?),
            false => None,
        };
        let dw = product(&g.t()?, &x)?;
        Ok((dx, Some(dw), Some(g.sum(0)?)))
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
            && self.weight.dtype() == x.dtype();
        let tracked = x.track_op() || self.weight.track_op();
        let y = match (&self.bias, fused) {
            (Some(b), true) => x.contiguous()?.apply_op3(
                &self.weight.contiguous()?,
                &b.contiguous()?,
                LinearOp(precision()),
            )?,
            (None, true) => x
                .contiguous()?
                .apply_op2(&self.weight.contiguous()?, LinearOp(precision()))?,
            (Some(b), false) if cuda_ops(x.device()) && tracked && same_float(&x, b) => {
                self.product_then_bias(&x, b)?
            }
            (_, false) => self.composed(&x)?,
        };
        y.reshape(shape)
    }
}

/// Output rows per task of the bias fill and of the bias gradient's column blocks.
const BLOCK: usize = 64;

/// `y = x Wᵀ (+ b)`: `[rows, D_out]` for `x`: `[rows, D_in]`, `W`: `[D_out, D_in]`.
fn linear_forward<T: Float>(
    precision: Precision,
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
        precision,
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
    precision: Precision,
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
            precision,
            (g, (out_dim, 1)),
            (w, (in_dim, 1)),
            (rows, in_dim, out_dim),
            dx,
        )?;
    }
    matmul_strided_uninit(
        precision,
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

/// [`Linear`] on the CPU: `(x, W)` or `(x, W, b)` → `x Wᵀ (+ b)`, its products (the backward's
/// too) in the autocast precision it was made under.
struct LinearOp(Precision);

/// The dimensions `(rows, D_in, D_out)` of a product of `x` and `W`.
fn dims(x: &Layout, w: &Layout) -> Result<(usize, usize, usize)> {
    let (rows, in_dim) = x.shape().dims2()?;
    let (out_dim, _) = w.shape().dims2()?;
    Ok((rows, in_dim, out_dim))
}

impl LinearOp {
    fn forward(
        &self,
        (x, lx): (&CpuStorage, &Layout),
        (w, lw): (&CpuStorage, &Layout),
        bias: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let d = dims(lx, lw)?;
        fn run<T: Float>(
            precision: Precision,
            (x, lx): (&CpuStorage, &Layout),
            (w, lw): (&CpuStorage, &Layout),
            bias: Option<(&CpuStorage, &Layout)>,
            d: (usize, usize, usize),
        ) -> Result<Vec<T>> {
            let bias = bias.map(|(b, lb)| contiguous_slice(b, lb)).transpose()?;
            linear_forward(
                precision,
                contiguous_slice(x, lx)?,
                contiguous_slice(w, lw)?,
                bias,
                d,
            )
        }
        let y = match x {
            CpuStorage::F32(_) => CpuStorage::F32(run(self.0, (x, lx), (w, lw), bias, d)?),
            CpuStorage::F64(_) => CpuStorage::F64(run(self.0, (x, lx), (w, lw), bias, d)?),
            _ => candle_core::bail!("ssl-linear supports f32 and f64 only"),
        };
        Ok((y, Shape::from((d.0, d.2))))
    }

    /// The gradients of `x`, `W` and (where `b` is given) `b`.
    fn backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Tensor, Option<Tensor>)> {
        let wanted = Wanted {
            input: x.track_op(),
            bias: b.is_some(),
        };
        let all = x.apply_op3_no_bwd(w, &grad.contiguous()?, &LinearBwd(wanted, self.0))?;
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
        self.forward((x, lx), (w, lw), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.backward(x, w, None, grad)?;
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
        self.forward((x, lx), (w, lw), Some((b, lb)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, db) = self.backward(x, w, Some(b), grad)?;
        Ok((dx, Some(dw), db))
    }
}

/// Backward of [`LinearOp`]: `(x, W, G)` → the gradients [`linear_backward`] lays out.
struct LinearBwd(Wanted, Precision);

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
                self.1,
                contiguous_slice(x, lx)?,
                contiguous_slice(w, lw)?,
                contiguous_slice(g, lg)?,
                d,
                self.0,
            )?),
            CpuStorage::F64(_) => CpuStorage::F64(linear_backward(
                self.1,
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

    /// Under bf16 autocast the CPU layer and its gradients are the f64 ones of bf16-rounded
    /// operands — `x`, `W` and, in the backward, the output gradient — up to f32 sums; the bias
    /// and its gradient stay f32.
    #[test]
    fn bf16_autocast_multiplies_the_rounded_operands() {
        use crate::autocast::autocast;
        use candle_core::Var;
        let round = |t: &Tensor, dtype| t.to_dtype(DType::BF16).unwrap().to_dtype(dtype).unwrap();
        let var = |seed, shape: &[usize]| {
            Var::from_tensor(&rand_tensor(seed, shape, DType::F32)).unwrap()
        };
        let (x, w, b) = (var(1, &[37, 70]), var(2, &[50, 70]), var(3, &[50]));
        // An output gradient of bf16 values plus a part that the backward's rounding removes.
        let r = rand_tensor(4, &[37, 50], DType::F32);
        let r = (round(&r, DType::F32) + (r * 1e-4).unwrap()).unwrap();
        let (y, grads) = {
            let _bf16 = autocast(Precision::Bf16);
            let layer = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
            let y = layer.forward(&x).unwrap();
            let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            (y, grads)
        };
        let to64 = |v: &Var, rounded: bool| {
            let t = v.as_tensor();
            Var::from_tensor(&match rounded {
                true => round(t, DType::F64),
                false => t.to_dtype(DType::F64).unwrap(),
            })
            .unwrap()
        };
        let (x64, w64, b64) = (to64(&x, true), to64(&w, true), to64(&b, false));
        let want_y = Linear::new(w64.as_tensor().clone(), Some(b64.as_tensor().clone()))
            .forward(&x64)
            .unwrap();
        let want = (&want_y * round(&r, DType::F64))
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(max_abs_diff(&y, &want_y) < 1e-5);
        for (ours, reference) in [(&x, &x64), (&w, &w64)] {
            let (o, e) = (grads.get(ours).unwrap(), want.get(reference).unwrap());
            let d = max_abs_diff(o, e);
            assert!(d < 1e-4, "{:?}: {d}", ours.dims());
        }
        // The bias gradient sums the output gradient unrounded: it is no product.
        assert!(max_abs_diff(grads.get(&b).unwrap(), &r.sum(0).unwrap()) < 1e-5);
    }

    #[test]
    fn the_product_then_bias_node_has_the_composed_values_and_gradients() {
        use crate::autocast::autocast;
        use candle_core::Var;
        // The CUDA path, run on the CPU: 40 rows of 9 into 11, with and without dx.
        let w = Var::from_tensor(&rand_tensor(8, &[11, 9], DType::F64)).unwrap();
        let b = Var::from_tensor(&rand_tensor(9, &[11], DType::F64)).unwrap();
        let r = rand_tensor(10, &[40, 11], DType::F64);
        let x_var = Var::from_tensor(&rand_tensor(11, &[40, 9], DType::F64)).unwrap();
        let layer = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
        let grads = |y: &Tensor| (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
        for x in [x_var.as_tensor().clone(), x_var.as_tensor().detach()] {
            let ours = layer.product_then_bias(&x, b.as_tensor()).unwrap();
            let composed = layer.composed(&x).unwrap();
            assert!(max_abs_diff(&ours, &composed) < 1e-14);
            let (go, gc) = (grads(&ours), grads(&composed));
            for t in [w.as_tensor(), b.as_tensor()] {
                let d = max_abs_diff(go.get(t).unwrap(), gc.get(t).unwrap());
                assert!(d < 1e-13, "{:?}: {d}", t.dims());
            }
            match x.track_op() {
                true => assert!(max_abs_diff(go.get(&x).unwrap(), gc.get(&x).unwrap()) < 1e-13),
                false => assert!(go.get(&x).is_none(), "an untracked input gets no gradient"),
            }
            assert!(go.get(w.as_tensor()).unwrap().is_contiguous());
        }
        // Under bf16 autocast its products round as the composed ones do.
        let to32 = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F32).unwrap()).unwrap();
        let (w32, b32, x32) = (
            to32(w.as_tensor()),
            to32(b.as_tensor()),
            to32(x_var.as_tensor()),
        );
        let layer = Linear::new(w32.as_tensor().clone(), Some(b32.as_tensor().clone()));
        let r32 = r.to_dtype(DType::F32).unwrap();
        let _bf16 = autocast(Precision::Bf16);
        let ours = layer
            .product_then_bias(x32.as_tensor(), b32.as_tensor())
            .unwrap();
        // The CPU's composed product rounds as it packs, summing in another order.
        let composed = layer.composed(x32.as_tensor()).unwrap();
        assert!(max_abs_diff(&ours, &composed) < 1e-5);
        let grads = |y: &Tensor| (y * &r32).unwrap().sum_all().unwrap().backward().unwrap();
        let (go, gc) = (grads(&ours), grads(&composed));
        for t in [w32.as_tensor(), b32.as_tensor(), x32.as_tensor()] {
            let (o, c) = (go.get(t).unwrap(), gc.get(t).unwrap());
            let scale = max_abs_diff(c, &c.zeros_like().unwrap());
            let d = max_abs_diff(o, c);
            assert!(d < 1e-2 * scale, "{:?}: {d} of {scale}", t.dims());
        }
    }
}
