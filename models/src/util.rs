//! Small helpers shared by the custom CPU ops: contiguous slices of `CpuStorage` and the
//! float element trait the kernels are generic over.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

use candle_core::{CpuStorage, Layout, Result, Tensor, WithDType};
use ssl_linalg::{exp_f32, extend_by_chunks};

/// Float element types the custom ops support (f32 and f64).
pub(crate) trait Float: WithDType + Copy + Send + Sync + std::ops::AddAssign {
    /// `f` on this thread's pool of [`Scratch`] buffers of this type.
    fn with_scratch_pool<R>(f: impl FnOnce(&mut Vec<Vec<Self>>) -> R) -> R;
    /// `x ← exp(x)` for every value: f64 through libm, f32 through [`exp_f32`].
    fn exp_in_place(xs: &mut [Self]);
    /// `Φ(x)`, the standard normal CDF: f64 through Candle's `erf`, f32 as [`normal_cdf_f32`].
    fn normal_cdf(self) -> Self;
    /// `φ(x) = exp(−x²/2)/√(2π)`, the standard normal density.
    fn normal_density(self) -> Self;
}

/// Most buffers a thread's [`Scratch`] pool keeps per element type: as many as one task uses
/// at once (a Winograd weight gradient's four).
const SCRATCH_POOL: usize = 4;

/// A task's scratch buffer, drawn from its thread's pool and given back when dropped, so that
/// an op's buffers keep their memory, already faulted in, from one call to the next: on row 1
/// of the step bench, allocating and zeroing them afresh in every call was 2 % of the step.
///
/// Its values are stale, left by whatever used the buffer before: a kernel writes every value
/// it reads. Values a buffer gains by [`Scratch::resize`] are NaN, so a kernel that reads one
/// it never wrote gives NaN in the tests, not a plausible number.
pub(crate) struct Scratch<T: Float> {
    /// Every value the buffer ever held, initialised: a shorter use keeps the rest.
    buffer: Vec<T>,
    len: usize,
}

/// An empty buffer; its first [`Scratch::resize`] draws one from the pool.
impl<T: Float> Default for Scratch<T> {
    fn default() -> Self {
        Self {
            buffer: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Float> Scratch<T> {
    /// `len` values: the first ones kept as they are, any new ones NaN. The first call draws
    /// the pool's smallest buffer that holds `len` values (else its largest), so that buffers
    /// keep their sizes from call to call.
    pub fn resize(&mut self, len: usize) {
        if self.buffer.is_empty() {
            self.buffer = T::with_scratch_pool(|pool| {
                let fits = (0..pool.len())
                    .filter(|&i| pool[i].len() >= len)
                    .min_by_key(|&i| pool[i].len());
                let pick = fits.or_else(|| (0..pool.len()).max_by_key(|&i| pool[i].len()));
                pick.map(|i| pool.swap_remove(i)).unwrap_or_default()
            });
        }
        if self.buffer.len() < len {
            self.buffer.resize(len, T::from_f64(f64::NAN));
        }
        self.len = len;
    }
}

impl<T: Float> Drop for Scratch<T> {
    fn drop(&mut self) {
        let buffer = std::mem::take(&mut self.buffer);
        if buffer.is_empty() {
            return;
        }
        T::with_scratch_pool(|pool| {
            pool.push(buffer);
            if pool.len() > SCRATCH_POOL {
                let smallest = (0..pool.len()).min_by_key(|&i| pool[i].len());
                smallest.map(|i| pool.swap_remove(i));
            }
        });
    }
}

impl<T: Float> Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buffer[..self.len]
    }
}

impl<T: Float> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buffer[..self.len]
    }
}

pub(crate) use ssl_linalg::vectorized;

/// A fresh `Vec` of `len` values, all written by `write` without a zero fill first: for an
/// output its kernel overwrites whole, the fill is a pass over memory on the calling thread
/// alone while the workers wait (`vec![0; n]` on reused heap memory is a `memset`).
///
/// # Safety
/// `write` writes every value of the slice it is given before reading it.
pub(crate) unsafe fn written_whole<T: Float>(len: usize, write: impl FnOnce(&mut [T])) -> Vec<T> {
    let mut out = Vec::with_capacity(len);
    // SAFETY: the capacity holds `len` values; the caller's `write` writes each before any read.
    unsafe {
        write(std::slice::from_raw_parts_mut(out.as_mut_ptr(), len));
        out.set_len(len);
    }
    out
}

/// Elements per parallel block of an elementwise kernel.
pub(crate) const ELEMENTWISE_BLOCK: usize = 1 << 14;

/// `f(a[i], b[i])` for every `i` of two slices of one length, a block of
/// [`ELEMENTWISE_BLOCK`] values at a time on Candle's workers, each block's loop compiled under
/// [`vectorized`] and written straight into the output's uninitialised capacity.
#[inline(always)]
pub(crate) fn zip_map<T: Float>(a: &[T], b: &[T], f: impl Fn(T, T) -> T + Sync) -> Vec<T> {
    let mut out = Vec::new();
    // SAFETY: each chunk's loop writes all of it (`a` and `b` have its length).
    unsafe {
        extend_by_chunks(&mut out, a.len(), ELEMENTWISE_BLOCK, |block, dst| {
            let start = block * ELEMENTWISE_BLOCK;
            let (a, b) = (&a[start..][..dst.len()], &b[start..][..dst.len()]);
            vectorized(
                #[inline(always)]
                || {
                    for ((o, &a), &b) in dst.iter_mut().zip(a).zip(b) {
                        o.write(f(a, b));
                    }
                },
            )
        })
    };
    out
}

/// Independent partial sums per reduction in [`lane_sum`]: this many lanes, summed in a fixed
/// order that does not depend on the thread count. Four AVX-512 registers of f64: with one, every
/// addition waits on the previous one's latency (4 cycles), and batch norm's statistics ran at a
/// quarter of the throughput the loads allow.
pub(crate) const LANES: usize = 32;

/// `Σᵢ term(a[i], b[i], c[i])` in f64 over [`LANES`] partial sums, which vectorise (a plain
/// sequential f64 sum does not: its additions may not be reordered).
#[inline(always)]
pub(crate) fn lane_sum<T: Float>(a: &[T], b: &[T], c: &[T], term: impl Fn(T, T, T) -> f64) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let chunks = a
        .chunks_exact(LANES)
        .zip(b.chunks_exact(LANES))
        .zip(c.chunks_exact(LANES));
    for ((a, b), c) in chunks {
        for l in 0..LANES {
            lanes[l] += term(a[l], b[l], c[l]);
        }
    }
    let tail = a.len() / LANES * LANES;
    let rest = (tail..a.len()).map(|i| term(a[i], b[i], c[i])).sum::<f64>();
    lanes.iter().sum::<f64>() + rest
}

/// The largest of `xs` (−∞ for none; NaNs are passed over, as by `if x > max`) over [`LANES`]
/// partial maxima, which vectorise where one running maximum does not.
#[inline(always)]
pub(crate) fn lane_max<T: Float>(xs: &[T]) -> T {
    let larger = |a: T, b: T| if b > a { b } else { a };
    let mut lanes = [T::from_f64(f64::NEG_INFINITY); LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks
        .remainder()
        .iter()
        .fold(lanes[0], |m, &x| larger(m, x));
    for chunk in chunks {
        for l in 0..LANES {
            lanes[l] = larger(lanes[l], chunk[l]);
        }
    }
    lanes.iter().fold(rest, |m, &x| larger(m, x))
}

/// `1/√(2π)`.
const INV_SQRT_2PI: f64 = 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;

impl Float for f32 {
    fn with_scratch_pool<R>(f: impl FnOnce(&mut Vec<Vec<f32>>) -> R) -> R {
        thread_local! {
            static POOL: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
        }
        POOL.with_borrow_mut(f)
    }
    fn exp_in_place(xs: &mut [f32]) {
        for x in xs {
            *x = exp_f32(*x);
        }
    }
    #[inline(always)]
    fn normal_cdf(self) -> f32 {
        normal_cdf_f32(self)
    }
    #[inline(always)]
    fn normal_density(self) -> f32 {
        exp_f32(-0.5 * self * self) * INV_SQRT_2PI as f32
    }
}

impl Float for f64 {
    fn with_scratch_pool<R>(f: impl FnOnce(&mut Vec<Vec<f64>>) -> R) -> R {
        thread_local! {
            static POOL: RefCell<Vec<Vec<f64>>> = const { RefCell::new(Vec::new()) };
        }
        POOL.with_borrow_mut(f)
    }
    fn exp_in_place(xs: &mut [f64]) {
        for x in xs {
            *x = x.exp();
        }
    }
    fn normal_cdf(self) -> f64 {
        0.5 * (1.0 + candle_core::cpu::erf::erf_f64(self * std::f64::consts::FRAC_1_SQRT_2))
    }
    fn normal_density(self) -> f64 {
        (-0.5 * self * self).exp() * INV_SQRT_2PI
    }
}

/// `Φ(x) = erfc(−x/√2)/2` in f32, branch-free so that a loop vectorises: Numerical Recipes'
/// Chebyshev fit `erfc(z) ≈ t·exp(−z² + P(t))`, `t = 1/(1 + z/2)` for `z ≥ 0` (relative error
/// below 1.2·10⁻⁷), reflected as `erfc(−z) = 2 − erfc(z)`. Candle's `erf_f32` branches per
/// value.
#[inline(always)]
pub(crate) fn normal_cdf_f32(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = 0.170_872_77_f32;
    for c in [
        -0.822_152_23,
        1.488_515_9,
        -1.135_204,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_7,
        -1.265_512_2,
    ] {
        p = p * t + c;
    }
    // erfc(|x|/√2) / 2, the tail beyond |x|.
    let tail = 0.5 * t * exp_f32(-z * z + p);
    if x < 0.0 {
        tail
    } else {
        1.0 - tail
    }
}

/// The contiguous data of `s` under layout `l`; errors on strided layouts.
pub(crate) fn contiguous_slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let data = s.as_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => candle_core::bail!("custom op expects a contiguous input"),
    }
}

/// The batch-major view `x.transpose(0, 1)` (`[N, C, *S]`) of a channel-major `x` (`[C, N, *S]`)
/// that lies batch-major in memory, as on CUDA our convolutions leave activations
/// (`conv/cudnn.rs`); `None` when `x` lies otherwise (channel-major, as on the CPU). An op
/// that treats the first two axes alike (elementwise, or per `(c, n)` plane) runs on this view
/// and transposes its result back, so the activations stay where they are, without a copy.
pub(crate) fn batch_major_in_memory(x: &Tensor) -> Result<Option<Tensor>> {
    if x.rank() < 2 || x.is_contiguous() {
        return Ok(None);
    }
    let view = x.transpose(0, 1)?;
    Ok(view.is_contiguous().then_some(view))
}

/// `len` values of a backward's single output buffer `all` from `start`, as a tensor of its own:
/// a parameter's gradient lives until the optimizer step, and a view would keep the whole
/// buffer (the input gradient with it) alive that long.
pub(crate) fn owned_part(all: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    all.narrow(0, start, len)?.force_contiguous()
}

/// The distance to keep between rows of `len` values of a row-major left operand of
/// [`gemm_in`](ssl_linalg::bf16_gemm::gemm_in) whose columns the product reads (`k` along the
/// rows): `len` rounded up to an odd number of cache lines. The `gemm` crate packs such an
/// operand one value at a time, 64 rows at once; at a power-of-two row length (every chunk of a
/// ResNet on 32² images) those rows all fall in one set of the L1 cache and each read misses it.
pub(crate) fn row_stride<T>(len: usize) -> usize {
    let per_line = (64 / std::mem::size_of::<T>()).max(1);
    let lines = len.div_ceil(per_line);
    (lines | 1) * per_line
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

    /// A dropped buffer comes back to the next task on the thread that asks for no more than it
    /// held, its values as left; a larger one grows it with NaN; the pool keeps at most
    /// [`SCRATCH_POOL`] buffers, the largest ones.
    #[test]
    fn scratch_buffers_are_reused_with_stale_values_and_nan_growth() {
        let mut first = Scratch::<f32>::default();
        first.resize(6);
        assert!(first.iter().all(|v| v.is_nan()));
        first.copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let address = first.as_ptr();
        drop(first);
        let mut again = Scratch::<f32>::default();
        again.resize(4);
        assert_eq!(
            (again.as_ptr(), &again[..]),
            (address, &[1.0, 2.0, 3.0, 4.0][..])
        );
        again.resize(8);
        assert_eq!(&again[..6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(again[6..].iter().all(|v| v.is_nan()));
        drop(again);
        let many: Vec<Scratch<f32>> = (1..=SCRATCH_POOL + 2)
            .map(|len| {
                let mut s = Scratch::default();
                s.resize(len * 100);
                s
            })
            .collect();
        drop(many);
        let kept = f32::with_scratch_pool(|pool| pool.iter().map(Vec::len).collect::<Vec<_>>());
        assert_eq!(kept.len(), SCRATCH_POOL);
        assert!(kept.iter().all(|&len| len >= 300), "{kept:?}");
    }

    /// The lane-wise maximum equals the sequential one for lengths below, at and past a
    /// multiple of [`LANES`], and passes over NaN as `if x > max` does.
    #[test]
    fn lane_max_is_the_sequential_maximum() {
        for len in [0, 1, 5, LANES, LANES + 1, 3 * LANES + 7, 197] {
            let xs: Vec<f32> = (0..len).map(|i| ((i * 37) % 101) as f32 - 60.0).collect();
            let expected = xs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            assert_eq!(lane_max(&xs), expected, "len {len}");
        }
        let mut xs = vec![-3.0f64; 2 * LANES + 3];
        xs[LANES + 2] = 7.5;
        xs[2 * LANES + 1] = f64::NAN;
        xs[0] = f64::NAN;
        assert_eq!(lane_max(&xs), 7.5);
        assert_eq!(lane_max(&[f32::NAN]), f32::NEG_INFINITY);
    }

    #[test]
    fn exp_in_place_takes_the_fast_exp_for_f32_and_propagates_nan() {
        let mut xs = [0.0f32, -1.0, 1.0, f32::NAN];
        f32::exp_in_place(&mut xs);
        assert_eq!(xs[0], 1.0);
        assert!((xs[1] - (-1.0f32).exp()).abs() < 1e-7 && (xs[2] - 1.0f32.exp()).abs() < 1e-6);
        assert!(xs[3].is_nan());
    }

    #[test]
    fn fast_normal_cdf_and_density_match_f64_to_f32_rounding() {
        for i in 0..=40_000 {
            let x = -10.0 + i as f64 * 5e-4;
            let (cdf, density) = (x.normal_cdf(), x.normal_density());
            let xf = x as f32;
            let cdf_error = (xf.normal_cdf() as f64 - cdf).abs();
            let density_error = (xf.normal_density() as f64 - density).abs();
            // Absolute error at f32 resolution; relative in the left tail, where Φ is tiny.
            assert!(cdf_error < 2e-7 + 1e-6 * cdf, "Φ({x}): {cdf_error:e}");
            assert!(
                density_error < 2e-7 * (1.0 + density),
                "φ({x}): {density_error:e}"
            );
        }
        assert_eq!(0.0f32.normal_cdf(), 0.5);
        assert!(1.0f64.normal_cdf() - 0.841_344_746_068_542_9 < 1e-15);
    }
}
