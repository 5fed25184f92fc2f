//! Small helpers shared by the custom CPU ops: contiguous slices of `CpuStorage` and the
//! float element trait the kernels are generic over.

use candle_core::{CpuStorage, Layout, Result, WithDType};

/// Float element types the custom ops support (f32 and f64).
pub(crate) trait Float: WithDType + Copy + Send + Sync + std::ops::AddAssign {}
impl Float for f32 {}
impl Float for f64 {}

/// The contiguous data of `s` under layout `l`; errors on strided layouts.
pub(crate) fn contiguous_slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let data = s.as_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("custom op expects a contiguous input"),
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
