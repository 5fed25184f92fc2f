//! Every column of a batch centred over the batch axis and scaled: Barlow Twins' batch norm
//! without affine (spec `docs/spec/objectives.md` §2.9), the duality paper's unit-norm dimensions
//! (§2.2) and SimCLR's dimension standardisation (§2.6, eq. 14).
//!
//! Composed from Candle ops these are a chain of reductions over the middle axis (which Candle
//! walks strided, on one thread) and broadcasts, each with its own backward: 10–11 ms of the
//! digits CNN's 190 ms step. Here the forward is two passes over the rows and the backward one,
//! with the closed form `∂L/∂z = (h − mean(h) − u·⟨h, u⟩) / r`, `h = α·∂L/∂y`, `u = c/r`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor, WithDType};
use rayon::prelude::*;

/// How each centred column `c = z − z̄` is scaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ColumnScale {
    /// Not at all: the columns are only centred.
    None,
    /// Batch norm without affine: `c / sqrt(var_p + eps)`, the variance over the batch with 1/N.
    BatchNorm { eps: f64 },
    /// `norm · c / max(‖c‖₂, 1e-12)`: columns of L2 norm `norm` (spec §0's normalisation).
    Norm { norm: f64 },
}

impl ColumnScale {
    /// `(α, β, floor)` of `y = α·c / max(sqrt(‖c‖² + β), floor)` for a batch of `n` rows;
    /// centring alone is `y = c`, a radius fixed at 1.
    fn coefficients(self, n: usize) -> (f64, f64, f64) {
        match self {
            ColumnScale::None => (1.0, 0.0, f64::INFINITY),
            ColumnScale::BatchNorm { eps } => ((n as f64).sqrt(), n as f64 * eps, 0.0),
            ColumnScale::Norm { norm } => (norm, 0.0, 1e-12),
        }
    }
}

/// `z`: `[…, N, d]` with every column (over the `N` axis, per leading index) centred and scaled
/// by `scale`; same shape. One fused pass each way on the CPU, the composed form elsewhere.
pub fn centre_and_scale_columns(z: &Tensor, scale: ColumnScale) -> Result<Tensor> {
    if z.rank() < 2 {
        candle_core::bail!(
            "column statistics need a matrix or a batch of them, got {:?}",
            z.dims()
        );
    }
    match z.device().is_cpu() {
        true => z.contiguous()?.apply_op1(ScaleColumns(scale)),
        false => centre_and_scale_columns_composed(z, scale),
    }
}

/// [`centre_and_scale_columns`] from Candle's ops (any device; the reference of the tests).
pub fn centre_and_scale_columns_composed(z: &Tensor, scale: ColumnScale) -> Result<Tensor> {
    let axis = z.rank() - 2;
    let (alpha, beta, floor) = scale.coefficients(z.dim(axis)?);
    let centred = z.broadcast_sub(&z.mean_keepdim(axis)?)?;
    if scale == ColumnScale::None {
        return Ok(centred);
    }
    let radius = (centred.sqr()?.sum_keepdim(axis)? + beta)?
        .clamp(floor * floor, f64::INFINITY)?
        .sqrt()?;
    centred.broadcast_div(&radius)? * alpha
}

/// Per column of one `[N, d]` matrix: the mean, and `1/r` with `r = max(sqrt(‖c‖² + β), floor)`,
/// and whether the floor was hit (then `r` does not depend on `c`). An infinite floor stands for
/// a radius fixed at 1 (centring alone).
struct ColumnStats {
    mean: Vec<f64>,
    inv_radius: Vec<f64>,
    floored: Vec<bool>,
}

fn column_stats<T: WithDType>(x: &[T], d: usize, beta: f64, floor: f64) -> ColumnStats {
    let n = x.len() / d;
    let mut mean = vec![0f64; d];
    for row in x.chunks_exact(d) {
        for (m, v) in mean.iter_mut().zip(row) {
            *m += v.to_f64();
        }
    }
    mean.iter_mut().for_each(|m| *m /= n as f64);
    let mut squares = vec![0f64; d];
    for row in x.chunks_exact(d) {
        for ((s, v), m) in squares.iter_mut().zip(row).zip(&mean) {
            let c = v.to_f64() - m;
            *s += c * c;
        }
    }
    let (inv_radius, floored) = squares
        .iter()
        .map(|s| {
            let r = (s + beta).sqrt();
            match (floor.is_infinite(), r < floor) {
                (true, _) => (1.0, true),
                (false, true) => (1.0 / floor, true),
                (false, false) => (1.0 / r, false),
            }
        })
        .unzip();
    ColumnStats {
        mean,
        inv_radius,
        floored,
    }
}

fn forward<T: WithDType>(x: &[T], n: usize, d: usize, scale: ColumnScale) -> Vec<T> {
    let (alpha, beta, floor) = scale.coefficients(n);
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(n * d)
        .zip(x.par_chunks(n * d))
        .for_each(|(out, x)| {
            let stats = column_stats(x, d, beta, floor);
            let factor: Vec<f64> = stats.inv_radius.iter().map(|r| alpha * r).collect();
            for (out, x) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
                for j in 0..d {
                    out[j] = T::from_f64((x[j].to_f64() - stats.mean[j]) * factor[j]);
                }
            }
        });
    out
}

/// `∂L/∂z = (h − mean(h) − u·⟨h, u⟩_N) / r` per column, `h = α·g`, `u = c/r`; a floored column
/// drops the `u` term.
fn backward<T: WithDType>(x: &[T], g: &[T], n: usize, d: usize, scale: ColumnScale) -> Vec<T> {
    let (alpha, beta, floor) = scale.coefficients(n);
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(n * d)
        .zip(x.par_chunks(n * d).zip(g.par_chunks(n * d)))
        .for_each(|(out, (x, g))| {
            let stats = column_stats(x, d, beta, floor);
            let (mut h_mean, mut h_dot_u) = (vec![0f64; d], vec![0f64; d]);
            for (x, g) in x.chunks_exact(d).zip(g.chunks_exact(d)) {
                for j in 0..d {
                    let h = alpha * g[j].to_f64();
                    h_mean[j] += h;
                    h_dot_u[j] += h * (x[j].to_f64() - stats.mean[j]) * stats.inv_radius[j];
                }
            }
            for j in 0..d {
                h_mean[j] /= n as f64;
                if stats.floored[j] {
                    h_dot_u[j] = 0.0;
                }
            }
            for (out, (x, g)) in out
                .chunks_exact_mut(d)
                .zip(x.chunks_exact(d).zip(g.chunks_exact(d)))
            {
                for j in 0..d {
                    let u = (x[j].to_f64() - stats.mean[j]) * stats.inv_radius[j];
                    let h = alpha * g[j].to_f64();
                    out[j] = T::from_f64((h - h_mean[j] - u * h_dot_u[j]) * stats.inv_radius[j]);
                }
            }
        });
    out
}

/// `(N, d)` of a contiguous `[…, N, d]` layout and its slice bounds.
fn matrix_dims(layout: &Layout, op: &str) -> Result<(usize, usize, usize, usize)> {
    let dims = layout.dims();
    let (n, d) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok((n, d, start, end)),
        None => candle_core::bail!("{op} expects a contiguous input"),
    }
}

struct ScaleColumns(ColumnScale);

impl CustomOp1 for ScaleColumns {
    fn name(&self) -> &'static str {
        "ssl-scale-columns"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, d, start, end) = matrix_dims(layout, self.name())?;
        let out = match storage {
            CpuStorage::F32(x) => CpuStorage::F32(forward(&x[start..end], n, d, self.0)),
            CpuStorage::F64(x) => CpuStorage::F64(forward(&x[start..end], n, d, self.0)),
            _ => candle_core::bail!("column scaling supports f32 and f64"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(
            &grad.contiguous()?,
            &ScaleColumnsBackward(self.0),
        )?))
    }
}

struct ScaleColumnsBackward(ColumnScale);

impl CustomOp2 for ScaleColumnsBackward {
    fn name(&self) -> &'static str {
        "ssl-scale-columns-backward"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        g: &CpuStorage,
        g_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, d, xs, xe) = matrix_dims(x_layout, self.name())?;
        let (_, _, gs, ge) = matrix_dims(g_layout, self.name())?;
        let out = match (x, g) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(backward(&x[xs..xe], &g[gs..ge], n, d, self.0))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(backward(&x[xs..xe], &g[gs..ge], n, d, self.0))
            }
            _ => candle_core::bail!(
                "column scaling's backward needs matching f32 or f64 inputs, got {:?} and {:?}",
                x.dtype(),
                g.dtype()
            ),
        };
        Ok((out, x_layout.shape().clone()))
    }
}

/// The mean over the leading axis of `z`: `[V, …]` → `[…]` (the mean view), as a sum of the
/// contiguous `[…]` slices: Candle reduces a leading axis strided, on one thread, which cost
/// FroSSL's and MMCR's losses a fifth of their time.
pub fn mean_of_views(z: &Tensor) -> Result<Tensor> {
    let v = z.dim(0)?;
    let mut sum = z.get(0)?;
    for view in 1..v {
        sum = (sum + z.get(view)?)?;
    }
    sum / v as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};
    use ssl_core::testing::randn;

    const SCALES: [ColumnScale; 4] = [
        ColumnScale::None,
        ColumnScale::BatchNorm { eps: 1e-5 },
        ColumnScale::Norm { norm: 1.0 },
        ColumnScale::Norm { norm: 0.7 },
    ];

    fn max_difference(a: &Tensor, b: &Tensor) -> Result<f64> {
        (a - b)?
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()
    }

    /// Value and gradient of `Σ W ⊙ y` against the composed ops, for a random weight `W`.
    fn check(x: &Tensor, tolerance: f64) -> Result<()> {
        let x = Var::from_tensor(x)?;
        let weight = randn(0f64, 1.0, x.dims(), x.device())?.to_dtype(x.dtype())?;
        for scale in SCALES {
            let fused = centre_and_scale_columns(x.as_tensor(), scale)?;
            let composed = centre_and_scale_columns_composed(x.as_tensor(), scale)?;
            assert!(max_difference(&fused, &composed)? < tolerance, "{scale:?}");
            let gradient = |y: &Tensor| -> Result<Tensor> {
                let grads = (y * &weight)?.sum_all()?.backward()?;
                Ok(grads.get(&x).expect("gradient").clone())
            };
            let difference = max_difference(&gradient(&fused)?, &gradient(&composed)?)?;
            assert!(difference < tolerance, "{scale:?}: {difference}");
        }
        Ok(())
    }

    #[test]
    fn mean_of_views_matches_candle_mean() -> Result<()> {
        let z = randn(0f64, 1., (3, 4, 5), &Device::Cpu)?;
        let diff = (mean_of_views(&z)? - z.mean(0)?)?.abs()?.max_all()?;
        assert!(diff.to_scalar::<f64>()? < 1e-15);
        Ok(())
    }

    #[test]
    fn value_and_gradient_equal_the_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        check(&randn(0f64, 1.0, (7, 5), &dev)?, 1e-12)?;
        check(&randn(0f64, 1.0, (3, 6, 4), &dev)?, 1e-12)?;
        check(
            &randn(0f64, 1.0, (2, 128, 512), &dev)?.to_dtype(DType::F32)?,
            1e-4,
        )?;
        // A strided input.
        check(&randn(0f64, 1.0, (2, 5, 6), &dev)?.transpose(1, 2)?, 1e-12)
    }

    #[test]
    fn gradient_matches_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let x = randn(0f64, 1.0, (2, 5, 3), &dev)?;
        let weight = randn(0f64, 1.0, (2, 5, 3), &dev)?;
        for scale in SCALES {
            let loss = |x: &Tensor| -> Result<f64> {
                (centre_and_scale_columns(x, scale)? * &weight)?
                    .sqr()?
                    .sum_all()?
                    .to_scalar::<f64>()
            };
            let var = Var::from_tensor(&x)?;
            let y = centre_and_scale_columns(var.as_tensor(), scale)?;
            let grads = (y * &weight)?.sqr()?.sum_all()?.backward()?;
            let analytic = grads
                .get(&var)
                .expect("gradient")
                .flatten_all()?
                .to_vec1::<f64>()?;
            let flat = x.flatten_all()?.to_vec1::<f64>()?;
            let h = 1e-6;
            for (i, want) in analytic.iter().enumerate() {
                let shifted = |delta: f64| -> Result<f64> {
                    let mut v = flat.clone();
                    v[i] += delta;
                    loss(&Tensor::from_vec(v, x.dims(), &dev)?)
                };
                let numeric = (shifted(h)? - shifted(-h)?) / (2.0 * h);
                assert!(
                    (numeric - want).abs() < 1e-6,
                    "{scale:?} [{i}]: {numeric} vs {want}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn known_statistics_and_a_constant_column() -> Result<()> {
        let dev = Device::Cpu;
        // Column 0: mean 2, population variance 2/3; column 1 is constant.
        let x = Tensor::new(&[[1f64, 5.0], [2.0, 5.0], [3.0, 5.0]], &dev)?;
        let bn = centre_and_scale_columns(&x, ColumnScale::BatchNorm { eps: 0.0 })?;
        let want = 1.0 / (2f64 / 3.0).sqrt();
        let got = bn.to_vec2::<f64>()?;
        assert!((got[0][0] + want).abs() < 1e-12 && (got[2][0] - want).abs() < 1e-12);
        let unit = centre_and_scale_columns(&x, ColumnScale::Norm { norm: 1.0 })?;
        let got = unit.to_vec2::<f64>()?;
        assert!((got[0][0] + 0.5f64.sqrt()).abs() < 1e-12);
        // A constant column centres to zeros and stays finite, with a finite gradient.
        assert!(got.iter().all(|row| row[1] == 0.0));
        let var = Var::from_tensor(&x)?;
        let y = centre_and_scale_columns(var.as_tensor(), ColumnScale::Norm { norm: 1.0 })?;
        let grads = y.sum_all()?.backward()?;
        let g = grads.get(&var).expect("gradient").to_vec2::<f64>()?;
        assert!(g.iter().flatten().all(|v| v.is_finite()));
        assert!(centre_and_scale_columns(&Tensor::zeros(3, DType::F64, &dev)?, SCALES[0]).is_err());
        Ok(())
    }
}
