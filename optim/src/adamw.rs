//! AdamW's update of one parameter (Loshchilov & Hutter, "Decoupled Weight Decay
//! Regularization", ICLR 2019, Algorithm 2, with the moments and bias correction of PyTorch's
//! `AdamW`). On the CPU it runs as three in-place passes over the buffers (the first moment, the
//! second moment, the parameter) on Candle's workers, each loop compiled for the CPU's widest
//! vectors ([`vectorized`]), on CUDA (feature `cuda`) as one pass of
//! [`adamw.cu`](adamw.cu) in a launch that steps every parameter of the optimiser at once
//! (`cuda.rs`, on CUDA builds); elsewhere as sixteen tensor ops, each a pass and a fresh buffer.

use candle_core::{CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Result, Tensor, WithDType};
use ssl_linalg::{for_each_chunk_mut, vectorized};

use super::{part, part_mut};

/// Values per parallel task.
const CHUNK: usize = 1 << 16;

/// The kernel of the CUDA update.
#[cfg(feature = "cuda")]
const KERNELS: super::cuda::Kernels = super::cuda::Kernels {
    module: "ssl_adamw",
    source: concat!(include_str!("multi_tensor.cuh"), include_str!("adamw.cu")),
};

/// ε of the update's denominator (PyTorch's default).
const EPS: f64 = 1e-8;

/// AdamW's hyperparameters for one step of one parameter.
#[derive(Debug, Clone, Copy)]
pub(super) struct AdamwStep {
    pub lr: f64,
    pub weight_decay: f64,
    pub betas: (f64, f64),
    /// Updates this parameter has received, this one included (the bias correction's `t`).
    pub t: i32,
}

impl AdamwStep {
    /// Whether the step of `w` runs [`Self::in_place`]: a contiguous f32 or f64 parameter on
    /// the CPU or on CUDA (where our kernels run, `ssl_models::dispatch::cuda_ops`), whose
    /// gradient and moments (where it has them yet) share its device, dtype and shape, the
    /// moments contiguous.
    pub fn fuses(w: &Tensor, g: &Tensor, moments: [&Option<Tensor>; 2]) -> bool {
        let like_w = |t: &Tensor| {
            t.dtype() == w.dtype() && t.dims() == w.dims() && t.device().same_device(w.device())
        };
        (w.device().is_cpu() || ssl_models::dispatch::cuda_ops(w.device()))
            && w.is_contiguous()
            && matches!(w.dtype(), DType::F32 | DType::F64)
            && like_w(g)
            && moments
                .into_iter()
                .flatten()
                .all(|m| like_w(m) && m.is_contiguous())
    }

    /// Updates the parameter `w` from its gradient `g` and the moments `m` and `v`, all in
    /// place, where [`Self::fuses`] holds (the moments start as zeros). On CUDA, a launch of
    /// its own (`launch` (CUDA builds) steps many parameters in one).
    pub fn in_place(&self, w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> Result<()> {
        #[cfg(feature = "cuda")]
        if w.device().is_cuda() {
            return Self::launch(&[self.entry(w, g, m, v, None)?]);
        }
        let g = g.contiguous()?;
        let (b1, b2) = self.betas;
        m.inplace_op2(
            &g,
            &Moment {
                beta: b1,
                squared: false,
            },
        )?;
        v.inplace_op2(
            &g,
            &Moment {
                beta: b2,
                squared: true,
            },
        )?;
        w.inplace_op3(m, v, self)
    }

    /// The new parameter and moments `(w, m, v)` from tensor ops, on any device (`m` and `v`
    /// absent before the first update).
    pub fn composed(
        &self,
        w: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (b1, b2) = self.betas;
        let m = match m {
            Some(m) => ((m * b1)? + (g * (1.0 - b1))?)?,
            None => (g * (1.0 - b1))?,
        };
        let v = match v {
            Some(v) => ((v * b2)? + (g.sqr()? * (1.0 - b2))?)?,
            None => (g.sqr()? * (1.0 - b2))?,
        };
        let m_hat = (&m / (1.0 - b1.powi(self.t)))?;
        let v_hat = (&v / (1.0 - b2.powi(self.t)))?;
        let update = (m_hat / (v_hat.sqrt()? + EPS)?)?;
        let w = ((w * (1.0 - self.lr * self.weight_decay))? - (update * self.lr)?)?;
        Ok((w, m, v))
    }
}

/// `m ← β·m + (1 − β)·g`, or `β·m + (1 − β)·g²` where `squared`.
struct Moment {
    beta: f64,
    squared: bool,
}

impl Moment {
    fn kernel<T: WithDType>(&self, m: &mut [T], g: &[T]) {
        let (beta, squared) = (self.beta, self.squared);
        for_each_chunk_mut(
            m,
            CHUNK,
            || (),
            |_, i, m| {
                vectorized(
                    #[inline(always)]
                    || {
                        for (m, &g) in m.iter_mut().zip(&g[i * CHUNK..]) {
                            let g = g.to_f64();
                            let g = if squared { g * g } else { g };
                            *m = T::from_f64(beta * m.to_f64() + (1.0 - beta) * g);
                        }
                    },
                )
            },
        );
    }
}

impl InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "ssl-adamw-moment"
    }

    fn cpu_fwd(&self, m: &mut CpuStorage, lm: &Layout, g: &CpuStorage, lg: &Layout) -> Result<()> {
        match (m, g) {
            (CpuStorage::F32(m), CpuStorage::F32(g)) => self.kernel(part_mut(m, lm)?, part(g, lg)?),
            (CpuStorage::F64(m), CpuStorage::F64(g)) => self.kernel(part_mut(m, lm)?, part(g, lg)?),
            _ => candle_core::bail!("AdamW's CPU update takes f32 or f64 tensors of one dtype"),
        }
        Ok(())
    }
}

impl AdamwStep {
    /// `w ← w·(1 − lr·λ) − lr·m̂/(√v̂ + ε)` with `m̂ = m/(1 − β₁ᵗ)`, `v̂ = v/(1 − β₂ᵗ)`.
    fn kernel<T: WithDType>(&self, w: &mut [T], m: &[T], v: &[T]) {
        let decay = 1.0 - self.lr * self.weight_decay;
        let m_scale = 1.0 / (1.0 - self.betas.0.powi(self.t));
        let v_scale = 1.0 / (1.0 - self.betas.1.powi(self.t));
        let lr = self.lr;
        for_each_chunk_mut(
            w,
            CHUNK,
            || (),
            |_, i, w| {
                let (m, v) = (&m[i * CHUNK..], &v[i * CHUNK..]);
                vectorized(
                    #[inline(always)]
                    || {
                        for ((w, &m), &v) in w.iter_mut().zip(m).zip(v) {
                            let update =
                                m.to_f64() * m_scale / ((v.to_f64() * v_scale).sqrt() + EPS);
                            *w = T::from_f64(w.to_f64() * decay - lr * update);
                        }
                    },
                )
            },
        );
    }
}

impl InplaceOp3 for AdamwStep {
    fn name(&self) -> &'static str {
        "ssl-adamw-update"
    }

    fn cpu_fwd(
        &self,
        w: &mut CpuStorage,
        lw: &Layout,
        m: &CpuStorage,
        lm: &Layout,
        v: &CpuStorage,
        lv: &Layout,
    ) -> Result<()> {
        match (w, m, v) {
            (CpuStorage::F32(w), CpuStorage::F32(m), CpuStorage::F32(v)) => {
                self.kernel(part_mut(w, lw)?, part(m, lm)?, part(v, lv)?)
            }
            (CpuStorage::F64(w), CpuStorage::F64(m), CpuStorage::F64(v)) => {
                self.kernel(part_mut(w, lw)?, part(m, lm)?, part(v, lv)?)
            }
            _ => candle_core::bail!("AdamW's CPU update takes f32 or f64 tensors of one dtype"),
        }
        Ok(())
    }
}

#[cfg(feature = "cuda")]
impl AdamwStep {
    /// This update of the parameter `w` (gradient `g`, moments `m` and `v`, where
    /// [`Self::fuses`] holds), its gradient multiplied by `grad_factor` first, as one parameter
    /// of `launch` (CUDA builds).
    pub(super) fn entry(
        &self,
        w: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        grad_factor: Option<Tensor>,
    ) -> Result<super::cuda::Entry> {
        let (b1, b2) = self.betas;
        Ok(super::cuda::Entry {
            buffers: vec![w.clone(), g.contiguous()?, m.clone(), v.clone()],
            grad_factor,
            // `s` of adamw.cu.
            scalars: vec![
                b1,
                b2,
                1.0 - self.lr * self.weight_decay,
                self.lr,
                1.0 / (1.0 - b1.powi(self.t)),
                1.0 / (1.0 - b2.powi(self.t)),
                EPS,
            ],
        })
    }

    /// Updates every parameter of `entries` ([`Self::entry`]) in one launch.
    pub(super) fn launch(entries: &[super::cuda::Entry]) -> Result<()> {
        super::cuda::launch(KERNELS, "adamw", entries, None)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::AdamwStep;
    use ssl_core::testing::randn;

    /// Over a few steps with weight decay, the in-place CPU update keeps the parameter and both
    /// moments equal to the composed one's (to f32 rounding; exactly enough in f64), on more
    /// values than one parallel task takes.
    #[test]
    fn the_in_place_update_equals_the_composed_one() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        for (dtype, tol) in [(DType::F32, 1e-6), (DType::F64, 1e-13)] {
            let n = 3 * super::CHUNK + 17;
            let w0 = randn(0f64, 1.0, n, &dev)?.to_dtype(dtype)?;
            let (w, m, v) = (w0.copy()?, w0.zeros_like()?, w0.zeros_like()?);
            let mut composed: (Tensor, Option<Tensor>, Option<Tensor>) = (w0, None, None);
            for t in 1..=4 {
                let g = randn(0f64, 1.0, n, &dev)?.to_dtype(dtype)?;
                let step = AdamwStep {
                    lr: 0.01,
                    weight_decay: 0.05,
                    betas: (0.9, 0.999),
                    t,
                };
                assert!(AdamwStep::fuses(
                    &w,
                    &g,
                    [&Some(m.clone()), &Some(v.clone())]
                ));
                step.in_place(&w, &g, &m, &v)?;
                let (cw, cm, cv) =
                    step.composed(&composed.0, &g, composed.1.as_ref(), composed.2.as_ref())?;
                composed = (cw, Some(cm), Some(cv));
            }
            let pairs = [
                (&w, &composed.0),
                (&m, composed.1.as_ref().unwrap()),
                (&v, composed.2.as_ref().unwrap()),
            ];
            for (name, (fused, plain)) in ["w", "m", "v"].into_iter().zip(pairs) {
                let diff = (fused - plain)?.abs()?.max(0)?.to_dtype(DType::F64)?;
                let scale = plain.abs()?.max(0)?.to_dtype(DType::F64)?;
                let rel = diff.to_scalar::<f64>()? / scale.to_scalar::<f64>()?;
                assert!(rel < tol, "{dtype:?} {name}: relative difference {rel}");
            }
        }
        Ok(())
    }

    /// Only a contiguous f32/f64 CPU parameter with a gradient of its own dtype and shape fuses;
    /// the in-place update refuses the others with an error.
    #[test]
    fn other_parameters_take_the_composed_update() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let step = AdamwStep {
            lr: 0.1,
            weight_decay: 0.0,
            betas: (0.9, 0.999),
            t: 1,
        };
        let w = Tensor::zeros((4, 3), DType::F32, &dev)?;
        let g = Tensor::ones((4, 3), DType::F32, &dev)?;
        assert!(AdamwStep::fuses(&w, &g, [&None, &None]));
        assert!(
            !AdamwStep::fuses(&w.t()?, &g.t()?, [&None, &None]),
            "transposed"
        );
        let half = w.to_dtype(DType::BF16)?;
        assert!(
            !AdamwStep::fuses(&half, &g.to_dtype(DType::BF16)?, [&None, &None]),
            "bf16"
        );
        assert!(
            !AdamwStep::fuses(&w, &g.to_dtype(DType::F64)?, [&None, &None]),
            "f64 gradient"
        );
        assert!(
            !AdamwStep::fuses(&w, &g, [&Some(g.narrow(0, 0, 2)?), &None]),
            "shape"
        );
        // Called where it does not fuse, the in-place update refuses, naming why.
        let (m, v) = (w.zeros_like()?, w.zeros_like()?);
        let mixed = step.in_place(&w, &g.to_dtype(DType::F64)?, &m, &v);
        let err = mixed.expect_err("an f64 gradient of an f32 parameter");
        assert!(err.to_string().contains("of one dtype"), "{err}");
        let strided = step.in_place(&w.t()?, &g.t()?, &m.t()?, &v.t()?);
        let err = strided.expect_err("transposed moments");
        assert!(err.to_string().contains("contiguous"), "{err}");
        Ok(())
    }
}
