//! L2 normalisation along an axis (spec §0: `normalize(x) = x / max(‖x‖₂, 1e-12)`, as
//! `torch.nn.functional.normalize`), the one definition every objective uses; and the stable
//! row-wise log-sum-exp of the contrastive objectives.

use candle_core::{Result, Tensor, D};

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

/// Rows (the last axis) of `x`: `[…, N, d]` scaled to unit L2 norm.
pub fn normalize_rows(x: &Tensor) -> Result<Tensor> {
    l2_normalize(x, D::Minus1)
}

/// Columns (the second-to-last axis, i.e. each dimension over the batch) of `x`: `[…, N, d]`
/// scaled to unit L2 norm, no centring.
pub fn normalize_columns(x: &Tensor) -> Result<Tensor> {
    l2_normalize(x, D::Minus2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

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
}
