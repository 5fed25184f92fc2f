//! Small helpers shared by the custom CPU ops: contiguous slices of `CpuStorage` and the
//! float element trait the kernels are generic over.

use candle_core::{CpuStorage, Layout, Result, WithDType};

/// Float element types the custom ops support (f32 and f64).
pub(crate) trait Float: WithDType + Copy + Send + Sync + std::ops::AddAssign {
    /// `x ← exp(x)` for every value: f64 through libm, f32 through [`exp_f32`].
    fn exp_in_place(xs: &mut [Self]);
}

impl Float for f32 {
    fn exp_in_place(xs: &mut [f32]) {
        for x in xs {
            *x = exp_f32(*x);
        }
    }
}

impl Float for f64 {
    fn exp_in_place(xs: &mut [f64]) {
        for x in xs {
            *x = x.exp();
        }
    }
}

/// `exp(x)` in f32 within 2 ulp on [−87, 88] (clamped outside: `exp(−∞)` gives 2⁻¹²⁶, not
/// 0), branch-free so that a loop over a slice vectorises: `x = n ln 2 + r` with `n` rounded by
/// the 1.5·2²³ trick and `ln 2` split in two, Cephes' degree-6 polynomial for `eʳ` on
/// |r| ≤ ln 2 / 2, and `2ⁿ` built in the exponent bits. libm's `expf` is a call per value.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    let two_n = f32::from_bits(
        shifted
            .to_bits()
            .wrapping_sub(ROUND.to_bits())
            .wrapping_add(127)
            << 23,
    );
    e_r * two_n
}

/// The contiguous data of `s` under layout `l`; errors on strided layouts.
pub(crate) fn contiguous_slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let data = s.as_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("custom op expects a contiguous input"),
    }
}

/// A matrix in memory: pointer, row stride, column stride (in elements).
pub(crate) type Mat<T> = (*const T, usize, usize);

/// `dst (+)= a b` for `[m, k]` × `[k, n]`, single-threaded (`gemm` crate).
///
/// # Safety
/// Every matrix lies in memory valid for its strides, and nothing else writes `dst`.
pub(crate) unsafe fn gemm_into<T: Float>(
    (m, n, k): (usize, usize, usize),
    dst: (*mut T, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    accumulate: bool,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.0,
            dst.2 as isize,
            dst.1 as isize,
            accumulate,
            a.0,
            a.2 as isize,
            a.1 as isize,
            b.0,
            b.2 as isize,
            b.1 as isize,
            T::from_f64(1.0),
            T::from_f64(1.0),
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use candle_core::{DType, Device, Tensor};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A seeded Uniform(-1, 1) tensor.
    pub fn rand_tensor(seed: u64, shape: &[usize], dtype: DType) -> Tensor {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }

    pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// Central finite difference of `f` at flat index `i` of `x` (f64), step 1e-5.
    pub fn finite_diff(x: &Tensor, i: usize, f: &dyn Fn(&Tensor) -> f64) -> f64 {
        finite_diff_step(x, i, 1e-5, f)
    }

    /// Central finite difference with step `h`.
    pub fn finite_diff_step(x: &Tensor, i: usize, h: f64, f: &dyn Fn(&Tensor) -> f64) -> f64 {
        let mut v: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
        let orig = v[i];
        v[i] = orig + h;
        let xp = Tensor::from_vec(v.clone(), x.shape(), x.device()).unwrap();
        v[i] = orig - h;
        let xm = Tensor::from_vec(v, x.shape(), x.device()).unwrap();
        (f(&xp) - f(&xm)) / (2.0 * h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_within_two_ulp_and_propagates_nan() {
        let mut worst = 0.0f64;
        for i in 0..=174_000 {
            let x = -87.0 + i as f32 * 1e-3;
            let exact = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - exact) / exact).abs());
        }
        assert!(
            worst < 2.0 * f32::EPSILON as f64,
            "worst relative error {worst:e}"
        );
        let mut xs = [0.0f32, -1.0, 1.0, f32::NAN];
        f32::exp_in_place(&mut xs);
        assert_eq!(xs[0], 1.0);
        assert!((xs[1] - (-1.0f32).exp()).abs() < 1e-7 && (xs[2] - 1.0f32.exp()).abs() < 1e-6);
        assert!(xs[3].is_nan());
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
    }
}
