//! Autocast-style bf16 training (`train.precision: bf16`), the policy of PyTorch's
//! `torch.autocast(device_type, dtype=torch.bfloat16)` for what the encoders and heads compute:
//! the two operands of every matrix product — convolutions, linear layers, attention — are
//! rounded to bf16 and the product is accumulated in f32; normalisations, softmax, activations,
//! losses, the optimiser and the master weights stay f32, and gradients reach the f32 weights
//! through the casts.
//!
//! On CUDA and Metal the products run in bf16 (Candle's bf16 GEMMs accumulate in f32) and give
//! bf16 results, widened back to f32. On the CPU our own ops — linear layers, convolutions by
//! im2col, [`matmul`] — round their operands as their GEMMs pack them
//! ([`ssl_linalg::bf16_gemm`]), on AMX tiles where the core has AMX, with `vdpbf16ps` where it
//! has AVX512-BF16 (twice the multiply-adds of f32 per instruction) and f32 products of the
//! rounded values elsewhere; their
//! backward products round the output gradient too, as autocast's bf16 backward GEMMs do. Two
//! departures: convolutions taken by Winograd's algorithm (stride-1 3×3 layers of 16 channels
//! or more) multiply in f32 — the products are of transformed operands, which bf16 rounds
//! with up to 35× im2col's error, and F(4×4, 3×3) in f32 (2.25 multiply-adds an output) is
//! faster than im2col in bf16 (9, at 1.5–1.9× the rate) — and what runs composed of Candle
//! ops multiplies bf16-rounded copies in f32 (`matrix_product`).
//!
//! The precision is a per-thread setting that the trainer holds around a step, as
//! `torch.autocast` is a context: `let _bf16 = autocast(Precision::Bf16);`. Models need no
//! precision argument; objective-specific heads built from `candle_nn` layers stay f32.

use std::cell::Cell;

use candle_core::{DType, Result, Tensor};
pub use ssl_linalg::Precision;

thread_local! {
    static PRECISION: Cell<Precision> = const { Cell::new(Precision::F32) };
}

/// Restores the previous precision of this thread when dropped.
#[must_use = "the precision holds only while the guard lives"]
pub struct AutocastGuard(Precision);

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        PRECISION.with(|p| p.set(self.0));
    }
}

/// Sets this thread's precision until the returned guard is dropped.
pub fn autocast(precision: Precision) -> AutocastGuard {
    AutocastGuard(PRECISION.with(|p| p.replace(precision)))
}

/// This thread's precision.
pub fn precision() -> Precision {
    PRECISION.with(Cell::get)
}

/// `product(a, b)` under this thread's precision: f32 operands rounded to bf16 under
/// [`Precision::Bf16`], the result back in f32. Other dtypes (f64 in tests) are left alone.
pub fn matrix_product(
    a: &Tensor,
    b: &Tensor,
    product: impl FnOnce(&Tensor, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if precision() == Precision::F32 || a.dtype() != DType::F32 || b.dtype() != DType::F32 {
        return product(a, b);
    }
    product(&operand(a)?, &operand(b)?)?.to_dtype(DType::F32)
}

/// `a · b` with autograd under this thread's precision: on the CPU [`ssl_linalg::matmul_in`],
/// whose three products round their operands as they pack them; elsewhere as
/// [`matrix_product`] makes [`ssl_linalg::matmul`]'s.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    match a.device().is_cpu() {
        true => ssl_linalg::matmul_in(precision(), a, b),
        false => matrix_product(a, b, ssl_linalg::matmul),
    }
}

/// `t` rounded to bf16: kept in bf16 on a GPU, widened back to f32 on the CPU.
fn operand(t: &Tensor) -> Result<Tensor> {
    let rounded = t.to_dtype(DType::BF16)?;
    if t.device().is_cpu() {
        rounded.to_dtype(DType::F32)
    } else {
        Ok(rounded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::rand_tensor;
    use candle_core::Var;

    #[test]
    fn products_take_bf16_operands_and_gradients_reach_f32_weights() {
        let a = Var::from_tensor(&rand_tensor(1, &[5, 64], DType::F32)).unwrap();
        let b = Var::from_tensor(&rand_tensor(2, &[64, 3], DType::F32)).unwrap();
        let f32_product = matrix_product(&a, &b, |x, y| x.matmul(y)).unwrap();
        let bf16_product = {
            let _bf16 = autocast(Precision::Bf16);
            matrix_product(&a, &b, |x, y| x.matmul(y)).unwrap()
        };
        assert_eq!(precision(), Precision::F32, "the guard restores f32");
        let round = |t: &Tensor| {
            t.to_dtype(DType::BF16)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
        };
        let expected = round(&a).matmul(&round(&b)).unwrap();
        let diff = |x: &Tensor, y: &Tensor| -> f32 {
            (x - y)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        assert_eq!(diff(&bf16_product, &expected), 0.0);
        // bf16 keeps 8 significant bits: the products differ, by about 2⁻⁹ relative per operand.
        let error = diff(&bf16_product, &f32_product);
        assert!(error > 0.0 && error < 0.05, "bf16 vs f32: {error}");
        assert_eq!(bf16_product.dtype(), DType::F32);
        let grads = bf16_product.sum_all().unwrap().backward().unwrap();
        let grad_a = grads.get(&a).unwrap();
        assert_eq!(grad_a.dtype(), DType::F32);
        // d(sum(A B))/dA = 1 Bᵀ with the rounded B, itself rounded to bf16 on its way back
        // through the cast (as the bf16 gradient of a GPU's bf16 product).
        let want = round(
            &Tensor::ones((5, 3), DType::F32, &candle_core::Device::Cpu)
                .unwrap()
                .matmul(&round(&b).t().unwrap())
                .unwrap(),
        );
        assert_eq!(diff(grad_a, &want), 0.0);
    }

    #[test]
    fn f64_and_f32_mode_are_untouched() {
        let a = rand_tensor(3, &[4, 4], DType::F64);
        let _bf16 = autocast(Precision::Bf16);
        let p = matrix_product(&a, &a, |x, y| x.matmul(y)).unwrap();
        assert_eq!(p.dtype(), DType::F64);
        let exact = a.matmul(&a).unwrap();
        let d: f64 = (p - exact)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(d, 0.0);
    }
}
