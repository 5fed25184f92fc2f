//! The replacements for `L_div` of IConE Appendix C.1 (spec `docs/spec/objectives.md` §2.1), both
//! on the whole table.
//!
//! * IConE-VC (eq. 8): VICReg's variance hinge and covariance penalty on the row-normalised table
//!   `Ẽ: [N, d]`, as **sums** over dimensions (no `1/d`).
//! * IConE-SIG: the sliced Epps–Pulley test of LeJEPA's SIGReg on the per-dimension standardised
//!   raw table, `M` fresh unit directions per step. SIGReg comes from LeJEPA and lives in
//!   `ssl-lejepa` ([`ssl_lejepa::sigreg`](mod@ssl_lejepa::sigreg)), whose [`sliced_epps_pulley`]
//!   is IConE-SIG's form (standardised columns, `R = 3`, 17 knots); LeJEPA's own loss tests the
//!   raw embeddings.

use candle_core::{Result, Tensor};

pub use ssl_lejepa::{epps_pulley, random_directions, sliced_epps_pulley};

/// `Σ_j max(0, γ − sqrt(var_u(Ẽ_{:,j}) + ε))` of `e`: `[N, d]`.
pub fn variance_hinge(e: &Tensor, gamma: f64, eps: f64) -> Result<Tensor> {
    let n = e.dim(0)? as f64;
    let centred = e.broadcast_sub(&e.mean_keepdim(0)?)?;
    let var = (centred.sqr()?.sum(0)? / (n - 1.0))?;
    ((var + eps)?.sqrt()?.neg()? + gamma)?.relu()?.sum_all()
}

/// `Σ_{i≠j} Cov(Ẽ)_{ij}²` with `Cov = (Ẽ−mean)ᵀ(Ẽ−mean)/(N−1)` of `e`: `[N, d]`.
pub fn covariance_penalty(e: &Tensor) -> Result<Tensor> {
    let n = e.dim(0)? as f64;
    let centred = e.broadcast_sub(&e.mean_keepdim(0)?)?;
    let cov = (centred.t()?.matmul(&centred)? / (n - 1.0))?;
    let diagonal = (centred.sqr()?.sum(0)? / (n - 1.0))?;
    cov.sqr()?.sum_all()? - diagonal.sqr()?.sum_all()?
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use ssl_core::testing::{close, max_gradient_error, randn, scalar};

    fn spec_table() -> Result<Tensor> {
        let e = Tensor::new(&[[1f64, 0., 1.], [0., 1., 0.], [1., 1., 0.]], &Device::Cpu)?;
        ssl_linalg::normalize_rows(&e)
    }

    #[test]
    fn icone_vc_known_answers() -> Result<()> {
        // Spec §2.1: variance term 1.6690622995, covariance term 0.1412718455.
        let e = spec_table()?;
        close(scalar(&variance_hinge(&e, 1.0, 1e-4)?), 1.6690622995, 1e-9);
        close(scalar(&covariance_penalty(&e)?), 0.1412718455, 1e-9);
        Ok(())
    }

    #[test]
    fn icone_vc_gradient_matches_finite_differences() -> Result<()> {
        let e = randn(0f64, 1.0, (7, 3), &Device::Cpu)?;
        let vc = |x: &Tensor| {
            let x = ssl_linalg::normalize_rows(x)?;
            variance_hinge(&x, 1.0, 1e-4)? + covariance_penalty(&x)?
        };
        assert!(max_gradient_error(&e, vc)? < 1e-6);
        Ok(())
    }
}
