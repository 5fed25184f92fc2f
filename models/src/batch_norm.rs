//! Batch normalisation as a fused CPU custom op on channel-major activations.
//!
//! In train mode, [`BatchNorm`] normalises each row of a `[C, M]` tensor (M = N·H·W) with the
//! batch mean and population variance, applies the affine transform and optionally a ReLU, all in
//! one pass; the backward is the closed-form BN (+ReLU) gradient, also one fused op. Running
//! statistics follow PyTorch: unbiased batch variance, `momentum` 0.1 by default, or a cumulative
//! average when `momentum` is `None`. Eval mode uses the running statistics. Under
//! [`crate::sync_bn`] the train-mode statistics are those of the global batch. On CUDA (feature
//! `cuda`) the same two ops run our kernels (`cuda.rs`), and the statistics stay on the device;
//! eval mode is one op there too (`BnEval`).

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, Var};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::extend_by_chunks;

use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{
    batch_major_in_memory, contiguous_slice, lane_sum, owned_part, vectorized, Float,
};

/// Per-channel batch statistics saved by the forward for the backward and running stats.
#[derive(Debug, Default)]
enum Saved {
    /// The forward has not run.
    #[default]
    Pending,
    /// The batch mean and population variance, from the CPU op.
    Host { mean: Vec<f64>, var: Vec<f64> },
    /// On the CUDA device, from our kernels.
    #[cfg(feature = "cuda")]
    Device(Arc<crate::cuda::BnSaved>),
}

const PENDING: &str = "batch norm: the backward or statistics were asked for before the forward";

fn row_len(l: &Layout, c: usize) -> usize {
    l.shape().elem_count() / c.max(1)
}

/// Train-mode batch norm of a contiguous operand whose channel `c` holds the values at flat
/// indices `i` with `(i / inner) % C = c`: `[C, M]` rows (`inner = M`, the CPU's and the
/// composed path's only form) or, on CUDA, activations that lie batch-major (`[N, C, *S]`,
/// `inner` the positions per sample; `[N, C]` with `inner = 1`).
struct BnFwd {
    eps: f64,
    relu: bool,
    inner: usize,
    saved: Arc<Mutex<Saved>>,
}

/// The CPU kernels take `[C, M]` rows only.
fn check_channel_rows(inner: usize, m: usize) -> Result<()> {
    if inner != m {
        candle_core::bail!(
            "the CPU batch norm takes channel-major rows [C, M]; this operand's channels change \
             every {inner} values, not every {m}"
        );
    }
    Ok(())
}

fn bn_fwd_kernel<T: Float>(
    x: &[T],
    gamma: &[T],
    beta: &[T],
    m: usize,
    eps: f64,
    relu: bool,
) -> (Vec<T>, Vec<f64>, Vec<f64>) {
    let c = gamma.len();
    let mut out = Vec::new();
    // SAFETY: each channel's loop writes all of its chunk (`src` has its length).
    let stats: Vec<(f64, f64)> = unsafe {
        extend_by_chunks(&mut out, c * m, m.max(1), |ci, dst| {
            let src = &x[ci * m..][..m];
            vectorized(
                #[inline(always)]
                || {
                    let mean = lane_sum(src, src, src, |v, _, _| v.to_f64()) / m as f64;
                    let var =
                        lane_sum(src, src, src, |v, _, _| (v.to_f64() - mean).powi(2)) / m as f64;
                    let inv = 1.0 / (var + eps).sqrt();
                    let scale = gamma[ci].to_f64() * inv;
                    let shift = beta[ci].to_f64() - mean * scale;
                    let (scale, shift) = (T::from_f64(scale), T::from_f64(shift));
                    let zero = T::from_f64(0.0);
                    for (d, &s) in dst.iter_mut().zip(src) {
                        let y = s * scale + shift;
                        d.write(if relu && y <= zero { zero } else { y });
                    }
                    (mean, var)
                },
            )
        })
    };
    let (mean, var) = stats.into_iter().unzip();
    (out, mean, var)
}

impl candle_core::CustomOp3 for BnFwd {
    fn name(&self) -> &'static str {
        "ssl-batch-norm"
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
        let c = l2.shape().elem_count();
        let m = row_len(l1, c);
        check_channel_rows(self.inner, m)?;
        let (out, mean, var) = match s1 {
            CpuStorage::F32(_) => {
                let (o, a, b) = bn_fwd_kernel::<f32>(
                    contiguous_slice(s1, l1)?,
                    contiguous_slice(s2, l2)?,
                    contiguous_slice(s3, l3)?,
                    m,
                    self.eps,
                    self.relu,
                );
                (CpuStorage::F32(o), a, b)
            }
            CpuStorage::F64(_) => {
                let (o, a, b) = bn_fwd_kernel::<f64>(
                    contiguous_slice(s1, l1)?,
                    contiguous_slice(s2, l2)?,
                    contiguous_slice(s3, l3)?,
                    m,
                    self.eps,
                    self.relu,
                );
                (CpuStorage::F64(o), a, b)
            }
            _ => candle_core::bail!("batch norm supports f32 and f64 only"),
        };
        *self.saved.lock().expect("bn stats lock") = Saved::Host { mean, var };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{batch_norm, float_dtype, view};
        use candle_core::backend::BackendStorage;
        let c = l2.shape().elem_count();
        let rows = (c, row_len(l1, c), self.inner);
        let (y, saved) = float_dtype!(s1.dtype(), T => {
            let operands = (view::<T>(s1, l1)?, view::<T>(s2, l2)?, view::<T>(s3, l3)?);
            batch_norm(&s1.device, operands, rows, self.eps, self.relu)?
        });
        *self.saved.lock().expect("bn stats lock") = Saved::Device(Arc::new(saved));
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let c = gamma.elem_count();
        let m = x.elem_count() / c.max(1);
        let op = BnBwd {
            stats: self.backward_stats(gamma)?,
            relu: self.relu,
            inner: self.inner,
        };
        let all = x.apply_op3_no_bwd(res, &grad.contiguous()?, &op)?;
        let dx = all.narrow(0, 0, c * m)?.reshape(x.shape())?;
        let dgamma = owned_part(&all, c * m, c)?.reshape(gamma.shape())?;
        let dbeta = owned_part(&all, c * m + c, c)?.reshape(gamma.shape())?;
        Ok((Some(dx), Some(dgamma), Some(dbeta)))
    }
}

impl BnFwd {
    /// What the backward needs from the forward: on the host, or on the CUDA device.
    fn backward_stats(&self, gamma: &Tensor) -> Result<BackwardStats> {
        match &*self.saved.lock().expect("bn stats lock") {
            Saved::Pending => candle_core::bail!("{PENDING}"),
            Saved::Host { mean, var } => Ok(BackwardStats::Host {
                gamma: gamma.to_dtype(DType::F64)?.to_vec1()?,
                mean: mean.clone(),
                inv_std: var.iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect(),
            }),
            #[cfg(feature = "cuda")]
            Saved::Device(device) => Ok(BackwardStats::Device(device.clone())),
        }
    }
}

/// `running ← (1 − factor)·running + factor·statistic` in place on CUDA, from the batch
/// statistics a forward of our kernels saved.
#[cfg(feature = "cuda")]
struct RunningUpdate {
    saved: Arc<crate::cuda::BnSaved>,
    which: crate::cuda::Running,
    factor: f64,
}

#[cfg(feature = "cuda")]
impl candle_core::InplaceOp1 for RunningUpdate {
    fn name(&self) -> &'static str {
        "ssl-batch-norm-running"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> Result<()> {
        candle_core::bail!("the saved statistics of a CUDA batch norm live on the GPU")
    }

    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        use crate::cuda::{batch_norm_running, float_dtype};
        use candle_core::backend::BackendStorage;
        float_dtype!(s.dtype(), T => {
            batch_norm_running::<T>(s, l, &self.saved, self.which, self.factor)
        })
    }
}

/// A train-mode pass's batch statistics, for the running statistics.
enum BatchStats {
    /// Batch mean and unbiased variance `[C]`.
    Tensors { mean: Tensor, unbiased_var: Tensor },
    /// On the CUDA device, where our kernels left them (mean and population variance of `m`
    /// values a channel).
    #[cfg(feature = "cuda")]
    Device {
        saved: Arc<crate::cuda::BnSaved>,
        m: usize,
    },
}

/// The unbiased variance `var · m/(m − 1)` of a population variance over `m` values.
fn unbiased(var: &Tensor, m: usize) -> Result<Tensor> {
    var * (m as f64 / (m as f64 - 1.0))
}

/// The forward's statistics as the backward reads them.
enum BackwardStats {
    Host {
        gamma: Vec<f64>,
        mean: Vec<f64>,
        inv_std: Vec<f64>,
    },
    #[cfg(feature = "cuda")]
    Device(Arc<crate::cuda::BnSaved>),
}

/// Eval-mode batch norm of a contiguous operand laid out as [`BnFwd`]'s, with `γ`, `β` its
/// inputs and the running statistics (`[C]`, the operand's dtype): `y = x·s + t` (then ReLU),
/// `s = γ / √(var + eps)`, `t = β − mean·s`, `s` and `t` in double, one pass (on CUDA one
/// launch, where the composed ops copied an operand that lies batch-major and ran four
/// broadcast passes). The backward (rare: eval mode inside autograd, frozen statistics) is
/// composed: `dx = g·s` (masked by the ReLU), `dγ = Σ g·(x − mean)/√(var + eps)`, `dβ = Σ g`.
struct BnEval {
    eps: f64,
    relu: bool,
    inner: usize,
    mean: Tensor,
    var: Tensor,
}

impl BnEval {
    /// `(s, t)` per channel, in double, from `γ` and `β`.
    fn scale_shift(&self, gamma: &[f64], beta: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
        let as_f64 = |t: &Tensor| t.to_dtype(DType::F64)?.to_vec1::<f64>();
        let (mean, var) = (as_f64(&self.mean)?, as_f64(&self.var)?);
        let scale: Vec<f64> = (0..gamma.len())
            .map(|c| gamma[c] / (var[c] + self.eps).sqrt())
            .collect();
        let shift = (0..gamma.len())
            .map(|c| beta[c] - mean[c] * scale[c])
            .collect();
        Ok((scale, shift))
    }
}

impl candle_core::CustomOp3 for BnEval {
    fn name(&self) -> &'static str {
        "ssl-batch-norm-eval"
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
        fn run<T: Float>(op: &BnEval, x: &[T], gamma: &[T], beta: &[T]) -> Result<Vec<T>> {
            let wide = |v: &[T]| v.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
            let (scale, shift) = op.scale_shift(&wide(gamma), &wide(beta))?;
            let zero = T::from_f64(0.0);
            let normalised = x.iter().enumerate().map(|(i, &v)| {
                let c = (i / op.inner.max(1)) % scale.len();
                let y = v * T::from_f64(scale[c]) + T::from_f64(shift[c]);
                if op.relu && y <= zero {
                    zero
                } else {
                    y
                }
            });
            Ok(normalised.collect())
        }
        let [x, gamma, beta] = [(s1, l1), (s2, l2), (s3, l3)];
        let y = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(run::<f32>(
                self,
                contiguous_slice(x.0, x.1)?,
                contiguous_slice(gamma.0, gamma.1)?,
                contiguous_slice(beta.0, beta.1)?,
            )?),
            CpuStorage::F64(_) => CpuStorage::F64(run::<f64>(
                self,
                contiguous_slice(x.0, x.1)?,
                contiguous_slice(gamma.0, gamma.1)?,
                contiguous_slice(beta.0, beta.1)?,
            )?),
            _ => candle_core::bail!("batch norm supports f32 and f64 only"),
        };
        Ok((y, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{batch_norm_eval, float_dtype, view};
        use candle_core::backend::BackendStorage;
        use candle_core::Storage;
        let c = l2.shape().elem_count();
        let (mean, mean_layout) = self.mean.storage_and_layout();
        let (var, var_layout) = self.var.storage_and_layout();
        let (Storage::Cuda(mean), Storage::Cuda(var)) = (&*mean, &*var) else {
            candle_core::bail!("batch norm: the running statistics are not on the CUDA device");
        };
        let y = float_dtype!(s1.dtype(), T => {
            let operands = [
                view::<T>(s1, l1)?,
                view::<T>(mean, mean_layout)?,
                view::<T>(var, var_layout)?,
                view::<T>(s2, l2)?,
                view::<T>(s3, l3)?,
            ];
            let n = l1.shape().elem_count();
            batch_norm_eval(&s1.device, operands, (n, c, self.inner), self.eps, self.relu)?
        });
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        // `[outer, C, inner]`, channels along the middle axis.
        let c = gamma.elem_count();
        let dims = (x.elem_count() / (c * self.inner).max(1), c, self.inner);
        let per_channel = |t: &Tensor| t.detach().reshape((1, c, 1));
        let inv = per_channel(&(&self.var + self.eps)?.sqrt()?.recip()?)?;
        let mut g = grad.detach().reshape(dims)?;
        if self.relu {
            g = (g * y.detach().reshape(dims)?.gt(0.0)?.to_dtype(x.dtype())?)?;
        }
        let dx = g.broadcast_mul(&per_channel(gamma)?.broadcast_mul(&inv)?)?;
        let centred = x
            .detach()
            .reshape(dims)?
            .broadcast_sub(&per_channel(&self.mean)?)?;
        let dgamma = (&g * centred.broadcast_mul(&inv)?)?.sum((0, 2))?;
        let dbeta = g.sum((0, 2))?;
        Ok((Some(dx.reshape(x.shape())?), Some(dgamma), Some(dbeta)))
    }
}

/// Backward of [`BnFwd`]: inputs (x, res, grad), output flat `[dx (C·M), dgamma (C), dbeta (C)]`,
/// `dx` laid out as `x` (channels every `inner` values, as in [`BnFwd`]).
struct BnBwd {
    stats: BackwardStats,
    relu: bool,
    inner: usize,
}

impl BnBwd {
    fn kernel<T: Float>(
        &self,
        (gamma, mean, inv_std): (&[f64], &[f64], &[f64]),
        x: &[T],
        res: &[T],
        g: &[T],
    ) -> Vec<T> {
        let c = gamma.len();
        let m = x.len() / c.max(1);
        let zero = T::from_f64(0.0);
        let mut out = Vec::with_capacity(c * m + 2 * c);
        let relu = self.relu;
        // The gradient reaching the BN output: none where the ReLU was off.
        let passed = move |g: T, r: T| if relu && r <= zero { zero } else { g };
        // SAFETY: each channel's loop writes all of its chunk (`gs`, `rs`, `xs` have its length).
        let mut sums: Vec<(f64, f64)> = unsafe {
            extend_by_chunks(&mut out, c * m, m.max(1), |ci, dst| {
                let xs = &x[ci * m..][..m];
                let rs = &res[ci * m..][..m];
                let gs = &g[ci * m..][..m];
                let (mean, inv) = (mean[ci], inv_std[ci]);
                vectorized(
                    #[inline(always)]
                    || {
                        let dbeta = lane_sum(gs, rs, xs, |g, r, _| passed(g, r).to_f64());
                        let dgamma = inv
                            * lane_sum(gs, rs, xs, |g, r, x| {
                                passed(g, r).to_f64() * (x.to_f64() - mean)
                            });
                        // dx = γ·inv·(g − dβ/M − x̂·dγ/M) = k·g + slope·(x − mean) + offset
                        let k = gamma[ci] * inv;
                        let slope = -k * inv * dgamma / m as f64;
                        let offset = -k * dbeta / m as f64;
                        let [k, slope, offset, mean] = [k, slope, offset, mean].map(T::from_f64);
                        for (((d, &gv), &r), &xv) in dst.iter_mut().zip(gs).zip(rs).zip(xs) {
                            d.write(k * passed(gv, r) + slope * (xv - mean) + offset);
                        }
                        (dgamma, dbeta)
                    },
                )
            })
        };
        // An empty batch (M = 0) has no chunks, and its sums are zero.
        sums.resize(c, (0.0, 0.0));
        out.extend(sums.iter().map(|&(dgamma, _)| T::from_f64(dgamma)));
        out.extend(sums.iter().map(|&(_, dbeta)| T::from_f64(dbeta)));
        out
    }
}

impl candle_core::CustomOp3 for BnBwd {
    fn name(&self) -> &'static str {
        "ssl-batch-norm-bwd"
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
        let (gamma, mean, inv_std) = match &self.stats {
            BackwardStats::Host {
                gamma,
                mean,
                inv_std,
            } => (gamma, mean, inv_std),
            #[cfg(feature = "cuda")]
            BackwardStats::Device(_) => {
                candle_core::bail!("a CUDA batch norm's backward got CPU tensors")
            }
        };
        check_channel_rows(self.inner, row_len(l1, gamma.len()))?;
        let stats = (&gamma[..], &mean[..], &inv_std[..]);
        let n = l1.shape().elem_count() + 2 * gamma.len();
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(self.kernel::<f32>(
                stats,
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                contiguous_slice(s3, l3)?,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(self.kernel::<f64>(
                stats,
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                contiguous_slice(s3, l3)?,
            )),
            _ => candle_core::bail!("batch norm supports f32 and f64 only"),
        };
        Ok((out, Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{batch_norm_backward, float_dtype, view};
        use candle_core::backend::BackendStorage;
        let BackwardStats::Device(saved) = &self.stats else {
            candle_core::bail!("a CPU batch norm's backward got CUDA tensors");
        };
        let c = saved.channels();
        let m = row_len(l1, c);
        let out = float_dtype!(s1.dtype(), T => {
            let operands = (view::<T>(s1, l1)?, view::<T>(s2, l2)?, view::<T>(s3, l3)?);
            batch_norm_backward(&s1.device, operands, saved, (c, m, self.inner), self.relu)?
        });
        Ok((out, Shape::from(c * m + 2 * c)))
    }
}

/// Batch normalisation over the channel dimension with PyTorch's parameters and buffers
/// (`weight`, `bias`, `running_mean`, `running_var`).
#[derive(Debug, Clone)]
pub struct BatchNorm {
    weight: Tensor,
    bias: Tensor,
    running_mean: Var,
    running_var: Var,
    eps: f64,
    momentum: Option<f64>,
    /// Batches seen in train mode (for the cumulative average when `momentum` is `None`).
    count: Arc<Mutex<u64>>,
}

/// A [`BatchNorm`] of `num_features` channels, eps 1e-5, momentum 0.1.
pub fn batch_norm(num_features: usize, vb: VarBuilder) -> Result<BatchNorm> {
    BatchNorm::new(num_features, 1e-5, Some(0.1), vb)
}

impl BatchNorm {
    /// Creates the parameters (`weight` = 1, `bias` = 0) and buffers (`running_mean` = 0,
    /// `running_var` = 1). `momentum: None` means a cumulative moving average.
    pub fn new(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        vb: VarBuilder,
    ) -> Result<Self> {
        Self::with_weight(num_features, eps, momentum, 1.0, vb)
    }

    /// As [`BatchNorm::new`] with `weight` initialised to `weight_init` (0 for the last BN of a
    /// residual block under zero-init-residual).
    pub fn with_weight(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        weight_init: f64,
        vb: VarBuilder,
    ) -> Result<Self> {
        let weight = vb.get_with_hints(num_features, "weight", Init::Const(weight_init))?;
        let bias = vb.get_with_hints(num_features, "bias", Init::Const(0.0))?;
        let rm = vb.get_with_hints(num_features, "running_mean", Init::Const(0.0))?;
        let rv = vb.get_with_hints(num_features, "running_var", Init::Const(1.0))?;
        Ok(Self {
            weight,
            bias,
            running_mean: Var::from_tensor(&rm)?,
            running_var: Var::from_tensor(&rv)?,
            eps,
            momentum,
            count: Arc::new(Mutex::new(0)),
        })
    }

    /// The running mean buffer.
    pub fn running_mean(&self) -> &Tensor {
        self.running_mean.as_tensor()
    }

    /// The running variance buffer.
    pub fn running_var(&self) -> &Tensor {
        self.running_var.as_tensor()
    }

    /// Batch norm of a channel-major input `[C, ...]` (statistics over all but the first dim),
    /// optionally followed by ReLU. Train mode uses batch statistics and updates running stats.
    pub fn forward_channel_major(&self, x: &Tensor, relu: bool, train: bool) -> Result<Tensor> {
        let c = self.weight.elem_count();
        if x.rank() < 2 || x.dim(0)? != c {
            candle_core::bail!("batch norm expects [{c}, ...], got {:?}", x.dims());
        }
        let shape = x.shape().clone();
        let m = x.elem_count() / c;
        if train && m < 2 && !crate::sync_bn::synchronised() {
            candle_core::bail!(
                "batch norm in train mode needs more than one value per channel, got an input of \
                 shape {:?} (channels, then batch × positions: {m} value a channel); train with a \
                 batch size of 2 or more, or with inputs large enough that this layer keeps more \
                 than one position per sample (e.g. --size 64 for a 3D ResNet)",
                x.dims()
            );
        }
        if train && cuda_ops(x.device()) && crate::sync_bn::current().is_none() {
            if let Some(batch_major) = batch_major_in_memory(x)? {
                // Normalised where it lies: channel `c` every `inner` values of `[N, C, *S]`.
                let inner = batch_major.dims()[2..].iter().product();
                let (y, stats) = self.train_fused(&batch_major, inner, relu)?;
                self.record(stats, c)?;
                return y.transpose(0, 1);
            }
        }
        if !train && cuda_ops(x.device()) && matches!(x.dtype(), DType::F32 | DType::F64) {
            return self.eval_fused(x, relu);
        }
        let x2 = x.reshape((c, m))?;
        let y = if train {
            self.forward_train_rows(&x2, relu)?
        } else {
            let dt = x.dtype();
            // The buffers get no gradient: detached, a network of detached weights records no
            // graph in evaluation.
            let inv = (self.running_var.as_tensor().detach().to_dtype(dt)? + self.eps)?
                .sqrt()?
                .recip()?;
            let scale = (self.weight.to_dtype(dt)? * &inv)?;
            let shift = (self.bias.to_dtype(dt)?
                - (self.running_mean.as_tensor().detach().to_dtype(dt)? * &scale)?)?;
            let y = x2
                .broadcast_mul(&scale.reshape((c, 1))?)?
                .broadcast_add(&shift.reshape((c, 1))?)?;
            if relu {
                y.relu()?
            } else {
                y
            }
        };
        y.reshape(shape)
    }

    /// Batch norm of a batch-major input `[N, C]` (BatchNorm1d), optionally followed by ReLU.
    pub fn forward_rows(&self, x: &Tensor, relu: bool, train: bool) -> Result<Tensor> {
        self.forward_channel_major(&x.t()?, relu, train)?.t()
    }

    /// Train mode: the batch statistics of `x`'s rows, or of every rank's rows under
    /// [`crate::sync_bn::with_global_statistics`]; the running statistics follow those statistics.
    fn forward_train_rows(&self, x: &Tensor, relu: bool) -> Result<Tensor> {
        let (c, m) = x.dims2()?;
        let (y, stats) = match crate::sync_bn::current() {
            Some(collective) => {
                let (y, mean, unbiased_var) = crate::sync_bn::synced_train_rows(
                    x,
                    &self.weight,
                    &self.bias,
                    self.eps,
                    relu,
                    collective.as_ref(),
                )?;
                (y, BatchStats::Tensors { mean, unbiased_var })
            }
            None => {
                let dev = x.device();
                match fused_kernels(dev) || cuda_ops(dev) {
                    true => self.train_fused(x, m, relu)?,
                    false => {
                        let (y, mean, var) = self.train_composed(x, relu)?;
                        let unbiased_var = unbiased(&var, m)?;
                        (y, BatchStats::Tensors { mean, unbiased_var })
                    }
                }
            }
        };
        self.record(stats, c)?;
        Ok(y)
    }

    /// Counts a train-mode batch and moves the running statistics towards its `stats`.
    fn record(&self, stats: BatchStats, c: usize) -> Result<()> {
        let factor = {
            let mut count = self.count.lock().expect("bn count lock");
            *count += 1;
            self.momentum.unwrap_or(1.0 / *count as f64)
        };
        self.update_running(stats, c, factor)
    }

    /// Running statistics (no gradient) moved by `factor` towards the batch's mean and unbiased
    /// variance, as PyTorch.
    fn update_running(&self, stats: BatchStats, c: usize, factor: f64) -> Result<()> {
        match stats {
            BatchStats::Tensors { mean, unbiased_var } => {
                let rdt = self.running_mean.dtype();
                let var = unbiased_var.to_dtype(rdt)?;
                let mean = mean.to_dtype(rdt)?.reshape(c)?;
                let rm = ((self.running_mean.as_tensor() * (1.0 - factor))? + (mean * factor)?)?;
                let rv = ((self.running_var.as_tensor() * (1.0 - factor))?
                    + (var.reshape(c)? * factor)?)?;
                self.running_mean.set(&rm.detach())?;
                self.running_var.set(&rv.detach())
            }
            #[cfg(feature = "cuda")]
            BatchStats::Device { saved, m } => {
                use crate::cuda::Running;
                for (running, which) in [
                    (&self.running_mean, Running::Mean),
                    (&self.running_var, Running::Var { m }),
                ] {
                    let update = RunningUpdate {
                        saved: saved.clone(),
                        which,
                        factor,
                    };
                    running.as_tensor().inplace_op1(&update)?;
                }
                Ok(())
            }
        }
    }

    /// Train-mode output of the fused op (CPU or CUDA) on `x`, `[C, M]` rows or (CUDA) any
    /// operand whose channels repeat every `inner` values (see [`BnFwd`]), in `x`'s shape, and
    /// the batch statistics (mean and unbiased variance as f64 tensors from the CPU; left on the
    /// device by CUDA).
    fn train_fused(&self, x: &Tensor, inner: usize, relu: bool) -> Result<(Tensor, BatchStats)> {
        let c = self.weight.elem_count();
        let m = x.elem_count() / c.max(1);
        let dt = match x.dtype() {
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let saved = Arc::new(Mutex::new(Saved::default()));
        let op = BnFwd {
            eps: self.eps,
            relu,
            inner,
            saved: saved.clone(),
        };
        let y = x.to_dtype(dt)?.contiguous()?.apply_op3(
            &self.weight.to_dtype(dt)?.contiguous()?,
            &self.bias.to_dtype(dt)?.contiguous()?,
            op,
        )?;
        let stats = match &*saved.lock().expect("bn stats lock") {
            Saved::Pending => candle_core::bail!("{PENDING}"),
            Saved::Host { mean, var } => BatchStats::Tensors {
                mean: Tensor::from_vec(mean.clone(), c, x.device())?,
                unbiased_var: unbiased(&Tensor::from_vec(var.clone(), c, x.device())?, m)?,
            },
            #[cfg(feature = "cuda")]
            Saved::Device(device) => BatchStats::Device {
                saved: device.clone(),
                m,
            },
        };
        Ok((y, stats))
    }

    /// Eval mode as one op ([`BnEval`]) on `x` where it lies: a channel-major `[C, …]` that lies
    /// batch-major in memory (as on CUDA) normalised on its batch-major view, any other made
    /// contiguous; the result lies as the operand does.
    pub(crate) fn eval_fused(&self, x: &Tensor, relu: bool) -> Result<Tensor> {
        let c = self.weight.elem_count();
        let dt = x.dtype();
        let (operand, inner, batch_major) = match batch_major_in_memory(x)? {
            Some(view) => {
                let inner = view.dims()[2..].iter().product();
                (view, inner, true)
            }
            None => (x.contiguous()?, x.elem_count() / c.max(1), false),
        };
        let stats = |t: &Var| t.as_tensor().detach().to_dtype(dt)?.contiguous();
        let op = BnEval {
            eps: self.eps,
            relu,
            inner,
            mean: stats(&self.running_mean)?,
            var: stats(&self.running_var)?,
        };
        let y = operand.apply_op3(
            &self.weight.to_dtype(dt)?.contiguous()?,
            &self.bias.to_dtype(dt)?.contiguous()?,
            op,
        )?;
        match batch_major {
            true => y.transpose(0, 1),
            false => Ok(y),
        }
    }

    /// [`BatchNorm::train_fused`] composed of Candle ops, for devices other than the CPU.
    fn train_composed(&self, x: &Tensor, relu: bool) -> Result<(Tensor, Tensor, Tensor)> {
        let c = x.dim(0)?;
        let dt = x.dtype();
        let mean = x.mean_keepdim(1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(1)?;
        let y = centred
            .broadcast_div(&(&var + self.eps)?.sqrt()?)?
            .broadcast_mul(&self.weight.to_dtype(dt)?.reshape((c, 1))?)?
            .broadcast_add(&self.bias.to_dtype(dt)?.reshape((c, 1))?)?;
        let y = if relu { y.relu()? } else { y };
        Ok((y, mean.detach().reshape(c)?, var.detach().reshape(c)?))
    }
}

#[cfg(test)]
mod tests;
