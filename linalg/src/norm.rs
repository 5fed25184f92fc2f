//! L2 normalisation along an axis (spec `docs/spec/objectives.md` §0:
//! `normalize(x) = x / max(‖x‖₂, 1e-12)`, as `torch.nn.functional.normalize`), the one definition
//! every objective uses; and the stable row-wise log-sum-exp of the contrastive objectives.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType, D};
use rayon::prelude::*;

/// `max(‖x‖₂, 1e-12)` along `axis`, kept for broadcasting; computed as `sqrt(max(Σx², 1e-24))`
/// so a zero vector has a zero gradient, not `0·∞`.
pub fn l2_norm_keepdim<A: candle_core::shape::Dim>(x: &Tensor, axis: A) -> Result<Tensor> {
    x.sqr()?
        .sum_keepdim(axis)?
        .clamp(1e-24, f64::INFINITY)?
        .sqrt()
}

/// `x / max(‖x‖₂, 1e-12)` with the norm taken along `axis`.
pub fn l2_normalize<A: candle_core::shape::Dim>(x: &Tensor, axis: A) -> Result<Tensor> {
    x.broadcast_div(&l2_norm_keepdim(x, axis)?)
}

/// Row-wise `log Σ exp(x)` with the (detached) row maximum subtracted, so large logits do not
/// overflow. `x`: `[R, C]` → `[R]`.
pub fn logsumexp_rows(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    x.broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        .add(&max)?
        .squeeze(D::Minus1)
}

/// Rows (the last axis) of `x`: `[…, N, d]` scaled to unit L2 norm. On the CPU one fused pass
/// each way, with the backward `(g − y⟨g, y⟩)/max(‖x‖, 1e-12)` (`g/1e-12` for a row under the
/// floor); the composed [`l2_normalize`] elsewhere.
pub fn normalize_rows(x: &Tensor) -> Result<Tensor> {
    match x.device().is_cpu() && x.rank() >= 1 {
        true => x.contiguous()?.apply_op1(NormalizeRows),
        false => l2_normalize(x, D::Minus1),
    }
}

/// The smallest norm a row is divided by (spec §0).
const NORM_FLOOR: f64 = 1e-12;

/// `max(‖row‖, 1e-12)` and whether the floor was hit.
fn clamped_norm<T: WithDType>(row: &[T]) -> (f64, bool) {
    let norm = row
        .iter()
        .map(|v| v.to_f64() * v.to_f64())
        .sum::<f64>()
        .sqrt();
    match norm < NORM_FLOOR {
        true => (NORM_FLOOR, true),
        false => (norm, false),
    }
}

fn normalize_rows_forward<T: WithDType>(x: &[T], d: usize) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .with_min_len(64)
        .for_each(|(out, x)| {
            let (norm, _) = clamped_norm(x);
            for (o, v) in out.iter_mut().zip(x) {
                *o = T::from_f64(v.to_f64() / norm);
            }
        });
    out
}

fn normalize_rows_backward<T: WithDType>(x: &[T], g: &[T], d: usize) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d).zip(g.par_chunks(d)))
        .with_min_len(64)
        .for_each(|(out, (x, g))| {
            let (norm, floored) = clamped_norm(x);
            let g_dot_y = match floored {
                true => 0.0,
                false => {
                    x.iter()
                        .zip(g)
                        .map(|(x, g)| x.to_f64() * g.to_f64())
                        .sum::<f64>()
                        / norm
                }
            };
            for ((o, x), g) in out.iter_mut().zip(x).zip(g) {
                *o = T::from_f64((g.to_f64() - x.to_f64() / norm * g_dot_y) / norm);
            }
        });
    out
}

/// The last dimension and slice bounds of a contiguous layout.
fn rows_of(layout: &Layout, op: &str) -> Result<(usize, usize, usize)> {
    let d = layout.dims().last().copied().unwrap_or(1);
    match layout.contiguous_offsets() {
        Some((start, end)) if d > 0 => Ok((d, start, end)),
        Some(_) => candle_core::bail!("{op}: rows of length 0"),
        None => candle_core::bail!("{op} expects a contiguous input"),
    }
}

struct NormalizeRows;

impl CustomOp1 for NormalizeRows {
    fn name(&self) -> &'static str {
        "ssl-normalize-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (d, start, end) = rows_of(layout, self.name())?;
        let out = match storage {
            CpuStorage::F32(x) => CpuStorage::F32(normalize_rows_forward(&x[start..end], d)),
            CpuStorage::F64(x) => CpuStorage::F64(normalize_rows_forward(&x[start..end], d)),
            _ => candle_core::bail!("row normalisation supports f32 and f64"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(
            &grad.contiguous()?,
            &NormalizeRowsBackward,
        )?))
    }
}

struct NormalizeRowsBackward;

impl CustomOp2 for NormalizeRowsBackward {
    fn name(&self) -> &'static str {
        "ssl-normalize-rows-backward"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        g: &CpuStorage,
        g_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (d, xs, xe) = rows_of(x_layout, self.name())?;
        let (_, gs, ge) = rows_of(g_layout, self.name())?;
        let out = match (x, g) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(normalize_rows_backward(&x[xs..xe], &g[gs..ge], d))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(normalize_rows_backward(&x[xs..xe], &g[gs..ge], d))
            }
            _ => candle_core::bail!(
                "row normalisation's backward needs matching f32 or f64 inputs, got {:?} and {:?}",
                x.dtype(),
                g.dtype()
            ),
        };
        Ok((out, x_layout.shape().clone()))
    }
}

/// Columns (the second-to-last axis, i.e. each dimension over the batch) of `x`: `[…, N, d]`
/// scaled to unit L2 norm, no centring.
pub fn normalize_columns(x: &Tensor) -> Result<Tensor> {
    l2_normalize(x, D::Minus2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::randn;

    #[test]
    fn unit_norms_and_zero_vectors_stay_finite() -> Result<()> {
        let x = Tensor::new(&[[3f64, 4.0], [0.0, 0.0]], &Device::Cpu)?;
        assert_eq!(
            normalize_rows(&x)?.to_vec2::<f64>()?,
            [[0.6, 0.8], [0.0, 0.0]]
        );
        assert_eq!(
            normalize_columns(&x)?.to_vec2::<f64>()?,
            [[1.0, 1.0], [0.0, 0.0]]
        );
        let v = candle_core::Var::from_tensor(&x)?;
        let grads = normalize_rows(v.as_tensor())?.sum_all()?.backward()?;
        let g = grads.get(&v).expect("gradient").to_vec2::<f64>()?;
        assert!(g.iter().flatten().all(|g| g.is_finite()), "{g:?}");
        Ok(())
    }

    /// The fused rows equal the composed [`l2_normalize`] in value and gradient (against a random
    /// weight), batched, strided, in f32 and f64, with a zero row.
    #[test]
    fn fused_rows_equal_the_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        let with_zero_row = Tensor::cat(
            &[
                &randn(0f64, 1.0, (3, 4), &dev)?,
                &Tensor::zeros((1, 4), DType::F64, &dev)?,
            ],
            0,
        )?;
        let cases = [
            (with_zero_row, 1e-12),
            (randn(0f64, 1.0, (2, 5, 7), &dev)?.transpose(1, 2)?, 1e-12),
            (randn(0f32, 1.0, (2, 128, 512), &dev)?, 1e-5),
        ];
        for (x, tolerance) in cases {
            let v = candle_core::Var::from_tensor(&x)?;
            let weight = randn(0f64, 1.0, x.dims(), &dev)?.to_dtype(x.dtype())?;
            let fused = normalize_rows(v.as_tensor())?;
            let composed = l2_normalize(v.as_tensor(), D::Minus1)?;
            let gradient = |y: &Tensor| -> Result<Tensor> {
                let grads = (y * &weight)?.sum_all()?.backward()?;
                Ok(grads.get(&v).expect("gradient").clone())
            };
            let difference = |a: &Tensor, b: &Tensor| -> Result<f64> {
                (a - b)?
                    .abs()?
                    .max_all()?
                    .to_dtype(DType::F64)?
                    .to_scalar::<f64>()
            };
            assert!(difference(&fused, &composed)? < tolerance);
            assert!(difference(&gradient(&fused)?, &gradient(&composed)?)? < tolerance);
        }
        Ok(())
    }
}
