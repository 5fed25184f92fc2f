//! SGD with momentum (PyTorch's `torch.optim.SGD`) and LARS (You, Gitman & Ginsburg, "Large
//! Batch Training of Convolutional Networks", 2017) for one parameter `w` with gradient `g` and
//! momentum buffer `buf`, all of one shape:
//!
//! ```text
//! d   = g + λ·w                     (weight decay λ, before the trust ratio)
//! d  ← η·‖w‖/‖d‖ · d                (LARS, where the parameter adapts and both norms are > 0)
//! buf ← μ·buf + d                   (buf = d on the first step)
//! s   = d + μ·buf if Nesterov, else buf
//! w  ← w − lr·s
//! ```
//!
//! The buffer is off the autograd graph. For contiguous f32/f64 parameters on the CPU (on
//! Candle's workers), a step is one parallel pass for both norms (LARS only; summed in f64 into
//! a two-value tensor, allocating nothing of `w`'s size), then one in-place pass over the buffer
//! and one over the parameter, each deriving the trust ratio from those sums. On CUDA (feature
//! `cuda`, the kernels of [`sgd.cu`](sgd.cu)) every parameter of the optimiser steps at once
//! (`cuda.rs`, on CUDA builds): one launch sums the norms of every adapting parameter, one updates every
//! buffer and parameter in a single pass, taking its trust ratio on the device. Elsewhere it is
//! about ten tensor ops, each a pass and a fresh buffer, with the norms summed in the
//! parameter's dtype and read to the host. Public for the optimiser bench
//! (`benches/optimizer_step.rs`).

use candle_core::{bail, CpuStorage, DType, InplaceOp3, Layout, Result, Tensor, WithDType};
use ssl_linalg::{for_each_chunk_mut, vectorized};

use super::{part, part_mut};

/// Values per parallel task.
const CHUNK: usize = 1 << 16;

/// The hyperparameters of one SGD or LARS step of one parameter.
#[derive(Debug, Clone, Copy)]
pub struct SgdStep {
    pub lr: f64,
    /// λ.
    pub weight_decay: f64,
    /// μ.
    pub momentum: f64,
    pub nesterov: bool,
    /// LARS's η where the step adapts this parameter (LARS, and its group's `lars` on); `None`
    /// for plain SGD.
    pub lars_eta: Option<f64>,
}

impl SgdStep {
    /// Whether the step of `w` runs [`Self::in_place`]: a contiguous f32 or f64 parameter on
    /// the CPU or on CUDA (where our kernels run, `ssl_models::dispatch::cuda_ops`), whose
    /// gradient and momentum buffer (where it has one yet) share its device, dtype and shape,
    /// the buffer contiguous.
    pub fn fuses(w: &Tensor, g: &Tensor, buf: Option<&Tensor>) -> bool {
        let like_w = |t: &Tensor| {
            t.dtype() == w.dtype() && t.dims() == w.dims() && t.device().same_device(w.device())
        };
        (w.device().is_cpu() || ssl_models::dispatch::cuda_ops(w.device()))
            && w.is_contiguous()
            && matches!(w.dtype(), DType::F32 | DType::F64)
            && like_w(g)
            && buf.is_none_or(|b| like_w(b) && b.is_contiguous())
    }

    /// Updates the parameter `w` and its momentum buffer `buf` (zeros before the first step,
    /// which makes `buf = d` then) from the gradient `g`, all in place; an error where
    /// [`Self::fuses`] does not hold. On CUDA, launches of its own (`launch` (CUDA builds) steps
    /// many parameters in them).
    pub fn in_place(&self, w: &Tensor, g: &Tensor, buf: &Tensor) -> Result<()> {
        if !Self::fuses(w, g, Some(buf)) {
            bail!(
                "the in-place SGD step takes contiguous f32/f64 CPU or CUDA tensors of one dtype \
                 and shape"
            );
        }
        #[cfg(feature = "cuda")]
        if w.device().is_cuda() {
            return Self::launch(&[self.entry(w, g, buf, None)?]);
        }
        let g = g.contiguous()?;
        let squares = match self.lars_eta {
            Some(_) => {
                let sums = Tensor::zeros(2, DType::F64, w.device())?;
                sums.inplace_op3(w, &g, &Squares(self.weight_decay))?;
                Some(sums)
            }
            None => None,
        };
        let pass = |target| Pass {
            step: *self,
            squares: squares.clone(),
            target,
        };
        buf.inplace_op3(w, &g, &pass(Target::Buffer))?;
        w.inplace_op3(buf, &g, &pass(Target::Weight))
    }

    /// The new parameter and momentum buffer `(w, buf)` from tensor ops, on any device (`buf`
    /// absent before the first step).
    pub fn composed(
        &self,
        w: &Tensor,
        g: &Tensor,
        buf: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        // Off the autograd graph: a buffer built from the tracked weight would chain every
        // step's graph onto the last (a copy of the weights per step kept alive).
        let w = &w.detach();
        let mut d = if self.weight_decay > 0.0 {
            (g + (w * self.weight_decay)?)?
        } else {
            g.clone()
        };
        if let Some(eta) = self.lars_eta {
            let norm = |t: &Tensor| {
                t.sqr()?
                    .sum_all()?
                    .sqrt()?
                    .to_dtype(DType::F64)?
                    .to_scalar::<f64>()
            };
            if let Some(ratio) = trust_ratio(eta, norm(w)?, norm(&d)?) {
                d = (d * ratio)?;
            }
        }
        let buf = match buf {
            Some(b) => ((b * self.momentum)? + &d)?,
            None => d.clone(),
        };
        let step = if self.nesterov {
            (d + (&buf * self.momentum)?)?
        } else {
            buf.clone()
        };
        Ok(((w - (step * self.lr)?)?, buf.detach()))
    }
}

/// LARS's trust ratio `η·‖w‖/‖d‖` where both norms are positive; `None` (no adaptation) else.
fn trust_ratio(eta: f64, w_norm: f64, d_norm: f64) -> Option<f64> {
    (w_norm > 0.0 && d_norm > 0.0).then(|| eta * w_norm / d_norm)
}

/// `[‖w‖², ‖g + λ·w‖²]` (λ the weight decay) of contiguous tensors `w` and `g` of one shape,
/// summed in f64 into the `[2]` f64 tensor it updates (zeros before): on the CPU each chunk on
/// Candle's workers and the chunks' sums added in order; on CUDA a block at a time.
struct Squares(f64);

impl Squares {
    fn sum<T: WithDType>(w: &[T], g: &[T], weight_decay: f64) -> [f64; 2] {
        let mut sums = vec![[0.0; 2]; w.len().div_ceil(CHUNK)];
        for_each_chunk_mut(
            &mut sums,
            1,
            || (),
            |_, i, sum| {
                let range = i * CHUNK..w.len().min((i + 1) * CHUNK);
                sum[0] = w[range.clone()].iter().zip(&g[range]).fold(
                    [0.0, 0.0],
                    |[w_sq, d_sq], (&w, &g)| {
                        let (w, g) = (w.to_f64(), g.to_f64());
                        let d = g + weight_decay * w;
                        [w_sq + w * w, d_sq + d * d]
                    },
                );
            },
        );
        sums.iter()
            .fold([0.0, 0.0], |[a, b], [x, y]| [a + x, b + y])
    }
}

impl InplaceOp3 for Squares {
    fn name(&self) -> &'static str {
        "ssl-lars-norms"
    }

    fn cpu_fwd(
        &self,
        out: &mut CpuStorage,
        lo: &Layout,
        w: &CpuStorage,
        lw: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<()> {
        let sums = match (w, g) {
            (CpuStorage::F32(w), CpuStorage::F32(g)) => {
                Self::sum(part(w, lw)?, part(g, lg)?, self.0)
            }
            (CpuStorage::F64(w), CpuStorage::F64(g)) => {
                Self::sum(part(w, lw)?, part(g, lg)?, self.0)
            }
            _ => bail!("LARS's norms take f32 or f64 tensors of one dtype"),
        };
        match out {
            CpuStorage::F64(out) => part_mut(out, lo)?.copy_from_slice(&sums),
            _ => bail!("LARS's norms are summed into an f64 tensor"),
        }
        Ok(())
    }
}

/// The kernels of the CUDA step.
#[cfg(feature = "cuda")]
const KERNELS: super::cuda::Kernels = super::cuda::Kernels {
    module: "ssl_sgd",
    source: concat!(include_str!("multi_tensor.cuh"), include_str!("sgd.cu")),
};

/// Which tensor a [`Pass`] updates.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// `buf ← μ·buf + d`, reading `w` and `g`.
    Buffer,
    /// `w ← w − lr·(d + μ·buf)` (Nesterov) or `w ← w − lr·buf`, reading `buf` and `g`.
    Weight,
}

/// One in-place pass of a step: `d = ratio·(g + λ·w)`, each value computed in f64, `ratio`
/// LARS's trust ratio from the [`Squares`] of the step where it adapts (else 1).
struct Pass {
    step: SgdStep,
    /// `[‖w‖², ‖g + λ·w‖²]` where LARS adapts this parameter.
    squares: Option<Tensor>,
    target: Target,
}

impl Pass {
    /// Updates `out` (the buffer or the parameter, after [`Target`]) from `other` (the
    /// parameter or the buffer) and the gradient `g`.
    fn kernel<T: WithDType>(&self, out: &mut [T], other: &[T], g: &[T]) -> Result<()> {
        let SgdStep {
            lr,
            weight_decay,
            momentum,
            nesterov,
            lars_eta,
        } = self.step;
        let ratio = match (&self.squares, lars_eta) {
            (Some(squares), Some(eta)) => match squares.to_vec1::<f64>()?.as_slice() {
                &[w_sq, d_sq] => trust_ratio(eta, w_sq.sqrt(), d_sq.sqrt()).unwrap_or(1.0),
                other => bail!("LARS's norms are two values, got {}", other.len()),
            },
            _ => 1.0,
        };
        let d = |w: f64, g: f64| ratio * (g + weight_decay * w);
        match (self.target, nesterov) {
            (Target::Buffer, _) => each(out, other, g, |buf, w, g| momentum * buf + d(w, g)),
            (Target::Weight, true) => each(out, other, g, |w, buf, g| {
                w - lr * (d(w, g) + momentum * buf)
            }),
            (Target::Weight, false) => each(out, other, g, |w, buf, _| w - lr * buf),
        }
        Ok(())
    }
}

/// `out[i] ← f(out[i], a[i], b[i])` in f64, in chunks on Candle's workers.
fn each<T: WithDType>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(f64, f64, f64) -> f64 + Sync) {
    for_each_chunk_mut(
        out,
        CHUNK,
        || (),
        |_, i, out| {
            let (a, b) = (&a[i * CHUNK..], &b[i * CHUNK..]);
            vectorized(
                #[inline(always)]
                || {
                    for ((x, &a), &b) in out.iter_mut().zip(a).zip(b) {
                        *x = T::from_f64(f(x.to_f64(), a.to_f64(), b.to_f64()));
                    }
                },
            )
        },
    );
}

impl InplaceOp3 for Pass {
    fn name(&self) -> &'static str {
        match self.target {
            Target::Buffer => "ssl-sgd-buffer",
            Target::Weight => "ssl-sgd-weight",
        }
    }

    fn cpu_fwd(
        &self,
        out: &mut CpuStorage,
        lo: &Layout,
        other: &CpuStorage,
        la: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<()> {
        match (out, other, g) {
            (CpuStorage::F32(out), CpuStorage::F32(a), CpuStorage::F32(g)) => {
                self.kernel(part_mut(out, lo)?, part(a, la)?, part(g, lg)?)
            }
            (CpuStorage::F64(out), CpuStorage::F64(a), CpuStorage::F64(g)) => {
                self.kernel(part_mut(out, lo)?, part(a, la)?, part(g, lg)?)
            }
            _ => bail!("the in-place SGD step takes f32 or f64 tensors of one dtype"),
        }
    }
}

/// Where [`SgdStep::entry`] puts whether LARS adapts the parameter (`s` of sgd.cu).
#[cfg(feature = "cuda")]
const ADAPTS: usize = 5;

#[cfg(feature = "cuda")]
impl SgdStep {
    /// This step of the parameter `w` (gradient `g`, momentum buffer `buf`, where
    /// [`Self::fuses`] holds), its gradient multiplied by `grad_factor` first, as one parameter
    /// of `launch` (CUDA builds).
    pub(super) fn entry(
        &self,
        w: &Tensor,
        g: &Tensor,
        buf: &Tensor,
        grad_factor: Option<Tensor>,
    ) -> Result<super::cuda::Entry> {
        Ok(super::cuda::Entry {
            buffers: vec![w.clone(), g.contiguous()?, buf.clone()],
            grad_factor,
            // `s` of sgd.cu: λ, μ, lr, Nesterov, η, and at ADAPTS whether LARS adapts.
            scalars: vec![
                self.weight_decay,
                self.momentum,
                self.lr,
                f64::from(u8::from(self.nesterov)),
                self.lars_eta.unwrap_or(0.0),
                f64::from(u8::from(self.lars_eta.is_some())),
            ],
        })
    }

    /// Steps every parameter of `entries` ([`Self::entry`]): where LARS adapts any, one launch
    /// sums their norms (two f64 values a parameter, on the device), then one updates them all.
    pub(super) fn launch(entries: &[super::cuda::Entry]) -> Result<()> {
        use super::cuda::launch;
        let Some(first) = entries.first() else {
            return Ok(());
        };
        if !entries.iter().any(|e| e.scalars[ADAPTS] != 0.0) {
            return launch(KERNELS, "sgd", entries, None);
        }
        let device = first.buffers[0].device();
        let sums = Tensor::zeros(2 * entries.len(), DType::F64, device)?;
        launch(KERNELS, "sgd_squares", entries, Some(&sums))?;
        launch(KERNELS, "sgd", entries, Some(&sums))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Result, Tensor, Var};
    use ssl_core::testing::randn;

    use super::{SgdStep, CHUNK};

    fn sgd(momentum: f64, nesterov: bool, weight_decay: f64, lars_eta: Option<f64>) -> SgdStep {
        SgdStep {
            lr: 0.1,
            weight_decay,
            momentum,
            nesterov,
            lars_eta,
        }
    }

    /// `max |a − b| / max |b|`.
    fn relative_difference(a: &Tensor, b: &Tensor) -> Result<f64> {
        let max = |t: Tensor| {
            t.abs()?
                .flatten_all()?
                .max(0)?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()
        };
        Ok(max((a - b)?)? / max(b.clone())?)
    }

    /// Over four steps, the in-place update keeps the parameter and its buffer equal to the
    /// composed one's for SGD (plain, Nesterov, with weight decay) and LARS (with weight decay,
    /// with Nesterov, with neither; a LARS parameter whose group turns `lars` off steps as SGD
    /// with decay): to 10⁻⁶ of their scale in f32 (the composed path rounds every op and sums
    /// the norms in f32; 2·10⁻⁷ seen) and 10⁻¹³ in f64, on more values than one parallel task
    /// takes and on fewer, neither a multiple of it.
    #[test]
    fn the_in_place_step_equals_the_composed_one() -> Result<()> {
        let dev = Device::Cpu;
        let cases = [
            ("sgd", sgd(0.9, false, 0.0, None)),
            ("sgd nesterov", sgd(0.9, true, 0.0, None)),
            ("sgd decay", sgd(0.9, false, 0.05, None)),
            ("lars", sgd(0.9, false, 0.05, Some(0.02))),
            ("lars nesterov", sgd(0.9, true, 0.05, Some(0.02))),
            ("lars plain", sgd(0.0, false, 0.0, Some(0.02))),
        ];
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-13)] {
            for dims in [vec![3, CHUNK + 7], vec![37, 53]] {
                for (name, step) in cases {
                    let w0 = randn(0f64, 1.0, dims.as_slice(), &dev)?.to_dtype(dtype)?;
                    let (w, buf) = (w0.copy()?, w0.zeros_like()?);
                    let (mut cw, mut cbuf) = (w0, None);
                    for _ in 0..4 {
                        let g = randn(0f64, 1.0, dims.as_slice(), &dev)?.to_dtype(dtype)?;
                        assert!(SgdStep::fuses(&w, &g, Some(&buf)));
                        step.in_place(&w, &g, &buf)?;
                        let (next, b) = step.composed(&cw, &g, cbuf.as_ref())?;
                        (cw, cbuf) = (next, Some(b));
                    }
                    for (what, fused, plain) in [("w", &w, &cw), ("buf", &buf, &cbuf.unwrap())] {
                        let rel = relative_difference(fused, plain)?;
                        assert!(rel < tol, "{dtype:?} {dims:?} {name}, {what}: {rel}");
                    }
                }
            }
        }
        Ok(())
    }

    /// LARS leaves a step unadapted where a norm is 0: a zero parameter takes the plain step
    /// `−lr·g` (a ratio of η·0/‖g‖ would not move it), and a zero gradient without weight decay
    /// leaves the parameter as it is (η·‖w‖/0 would make it NaN).
    #[test]
    fn lars_skips_the_trust_ratio_where_a_norm_is_zero() -> Result<()> {
        let dev = Device::Cpu;
        let step = sgd(0.9, false, 0.0, Some(0.02));
        for dtype in [DType::F32, DType::F64] {
            let g = randn(0f64, 1.0, 1001, &dev)?.to_dtype(dtype)?;
            let w = g.zeros_like()?;
            step.in_place(&w, &g, &w.zeros_like()?)?;
            let (composed, _) = step.composed(&g.zeros_like()?, &g, None)?;
            let want = (&g * -step.lr)?;
            for (what, got) in [("in place", &w), ("composed", &composed)] {
                let rel = relative_difference(got, &want)?;
                assert!(rel < 1e-7, "{dtype:?} zero parameter, {what}: {rel}");
            }

            let w0 = randn(0f64, 1.0, 1001, &dev)?.to_dtype(dtype)?;
            let w = w0.copy()?;
            step.in_place(&w, &g.zeros_like()?, &w.zeros_like()?)?;
            let (composed, _) = step.composed(&w0, &g.zeros_like()?, None)?;
            for (what, got) in [("in place", &w), ("composed", &composed)] {
                let rel = relative_difference(got, &w0)?;
                assert!(rel == 0.0, "{dtype:?} zero gradient, {what}: {rel}");
            }
        }
        Ok(())
    }

    /// The composed step of a tracked parameter, with weight decay, returns a buffer and a
    /// parameter that track no ops.
    #[test]
    fn the_composed_step_is_off_the_graph() -> Result<()> {
        let w = Var::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu)?;
        let g = Tensor::ones((2, 2), DType::F32, &Device::Cpu)?;
        let step = sgd(0.9, true, 0.1, Some(0.02));
        let (_, buf) = step.composed(w.as_tensor(), &g, None)?;
        let (new, buf) = step.composed(w.as_tensor(), &g, Some(&buf))?;
        assert!(!buf.track_op(), "the buffer tracks its ops");
        assert!(!new.track_op(), "the new parameter tracks its ops");
        Ok(())
    }

    /// Only a contiguous f32/f64 CPU parameter with a gradient and buffer of its own dtype and
    /// shape fuses, and the in-place step refuses the others; the composed step takes them
    /// (LARS on bf16 here, its norms summed in bf16: within 1 % of the f32 step).
    #[test]
    fn other_parameters_take_the_composed_step() -> Result<()> {
        let dev = Device::Cpu;
        let w = randn(0f32, 1.0, (40, 30), &dev)?;
        let g = randn(0f32, 1.0, (40, 30), &dev)?;
        let strided = g.t()?.contiguous()?.t()?;
        assert!(SgdStep::fuses(&w, &g, None));
        assert!(SgdStep::fuses(&w, &strided, None), "strided gradient");
        assert!(!SgdStep::fuses(&w.t()?, &g.t()?, None), "transposed");
        let half = |t: &Tensor| t.to_dtype(DType::BF16);
        assert!(!SgdStep::fuses(&half(&w)?, &half(&g)?, None), "bf16");
        assert!(
            !SgdStep::fuses(&w, &g.to_dtype(DType::F64)?, None),
            "f64 gradient"
        );
        assert!(
            !SgdStep::fuses(&w, &g, Some(&g.narrow(0, 0, 2)?)),
            "buffer shape"
        );
        assert!(!SgdStep::fuses(&w, &g, Some(&strided)), "strided buffer");

        let step = sgd(0.9, false, 0.05, Some(0.02));
        let err = step
            .in_place(&w, &g.to_dtype(DType::F64)?, &w.zeros_like()?)
            .expect_err("an f64 gradient of an f32 parameter");
        assert!(err.to_string().contains("of one dtype and shape"), "{err}");

        let (composed, _) = step.composed(&half(&w)?, &half(&g)?, None)?;
        let fused = w.copy()?;
        step.in_place(&fused, &g, &w.zeros_like()?)?;
        let rel = relative_difference(&composed.to_dtype(DType::F32)?, &fused)?;
        assert!(rel < 1e-2, "bf16 against f32: {rel}");
        Ok(())
    }
}
