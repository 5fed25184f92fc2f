//! A linear layer `y = x Wᵀ + b` over the last axis, keyed `weight` `[D_out, D_in]` and `bias`
//! `[D_out]` as `torch.nn.Linear`.
//!
//! Inputs of any rank are multiplied as one `[rows, D_in] × [D_in, D_out]` product on the CPU
//! workers (Candle's `Linear` broadcasts the weight to `[N, D_out, D_in]` for a `[N, T, D_in]`
//! input, so its weight gradient is N products summed over a temporary of that size), under the
//! thread's [`autocast`](crate::autocast) precision.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::autocast::matrix_product;

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
        let y = matrix_product(
            &x.reshape((rows, in_dim))?,
            &self.weight.t()?,
            ssl_linalg::matmul,
        )?;
        match &self.bias {
            Some(b) => y.broadcast_add(b)?.reshape(shape),
            None => y.reshape(shape),
        }
    }
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
}
