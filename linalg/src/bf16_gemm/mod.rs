//! Matrix products with bf16 operands and f32 accumulation on the CPU, the products of
//! `train.precision: bf16`: `dst (+)= a · b` for f32 matrices, each operand rounded to bf16 (to
//! nearest, ties to even, as PyTorch's autocast casts) and the products summed in f32.
//!
//! Where the core has AVX512-BF16 (AMD Zen 4 and later; Intel Cooper Lake, Sapphire Rapids and
//! later), `vdpbf16ps` multiplies 32 bf16 pairs and adds them into 16 f32 lanes: twice the
//! multiply-adds of an f32 FMA per instruction, and half the bytes per operand. The product is
//! blocked as GotoBLAS does (Goto & van de Geijn, "Anatomy of High-Performance Matrix
//! Multiplication", ACM TOMS 34(3), 2008): a `KC`-deep slice of `b` is packed, rounding as it
//! goes, into panels of `NR` columns; a slice of `MC` rows of `a` into panels of `MR` rows; and
//! an `MR × NR` register tile runs over each pair of panels, the `b` panel held in L1 while the
//! `a` panels stream from L2. Both packings interleave consecutive depths in pairs, the operand
//! layout of `vdpbf16ps`: a packed value is a `u32` holding the bf16 of depths `2p` (low half)
//! and `2p + 1` (high half).
//!
//! Where the core also has AMX (Intel Sapphire Rapids and later), the register tile is replaced
//! by four of AMX's tile registers (`tdpbf16ps`: a 16 × 16 f32 tile plus the product of a
//! 16 × 32 and a 32 × 16 bf16 tile in one instruction, 16 times `vdpbf16ps`' multiply-adds), over
//! the same blocking ([`amx`]).
//!
//! Elsewhere the same operands are rounded into f32 copies and multiplied by the `gemm` crate:
//! the same numbers up to the order of the f32 sums, at f32's speed.
//!
//! `SSL_BF16_KERNEL` (`amx`, `avx512` or `f32`) picks a slower kernel than the fastest this core
//! runs, to compare them; [`Bf16Kernel::from_env`] checks it.

use std::cell::RefCell;
use std::sync::OnceLock;

use candle_core::{DType, WithDType};
use serde::{Deserialize, Serialize};

/// Precision of the matrix products' operands (`train.precision`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// Matrix-product operands in bf16, accumulation and everything else in f32.
    Bf16,
}

/// A matrix in memory: pointer, row stride, column stride (in elements).
pub type Strided<T> = (T, usize, usize);

/// The kernels [`gemm_bf16`] multiplies with, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// AMX's tile registers (`tdpbf16ps`), operands packed with AVX-512.
    Amx,
    /// AVX512-BF16's `vdpbf16ps` on a register tile.
    Avx512,
    /// f32 copies of the rounded operands, multiplied by the `gemm` crate (any CPU).
    RoundedF32,
}

impl Bf16Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Bf16Kernel; 3] = [Bf16Kernel::Amx, Bf16Kernel::Avx512, Bf16Kernel::RoundedF32];

    /// The name `SSL_BF16_KERNEL` takes.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Amx => "amx",
            Bf16Kernel::Avx512 => "avx512",
            Bf16Kernel::RoundedF32 => "f32",
        }
    }

    /// Whether this CPU (and, for AMX, the kernel) runs the kernel.
    pub fn available(self) -> bool {
        match self {
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            Bf16Kernel::Amx => Bf16Kernel::Avx512.available() && amx::enabled(),
            #[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
            Bf16Kernel::Amx => false,
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Bf16Kernel::Amx | Bf16Kernel::Avx512 => false,
            Bf16Kernel::RoundedF32 => true,
        }
    }

    /// The kernel `SSL_BF16_KERNEL` names ([`Bf16Kernel::parse`]), `None` where it is unset.
    pub fn from_env() -> Result<Option<Bf16Kernel>, String> {
        match std::env::var("SSL_BF16_KERNEL") {
            Ok(name) => Bf16Kernel::parse(&name).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// The kernel `SSL_BF16_KERNEL={name}` picks; an error where `name` is no kernel's or names
    /// one this CPU cannot run.
    pub fn parse(name: &str) -> Result<Bf16Kernel, String> {
        let names = Bf16Kernel::ALL.map(Bf16Kernel::name).join(", ");
        let kernel = Bf16Kernel::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                format!("SSL_BF16_KERNEL={name} names no bf16 kernel: use one of {names}")
            })?;
        match kernel.available() {
            true => Ok(kernel),
            false => Err(format!(
                "SSL_BF16_KERNEL={name}: this CPU cannot run it; unset it for the fastest it runs"
            )),
        }
    }
}

/// The kernel [`gemm_bf16`] uses: `SSL_BF16_KERNEL`'s where it names one this CPU runs, else
/// the fastest this CPU runs.
pub fn bf16_kernel() -> Bf16Kernel {
    static KERNEL: OnceLock<Bf16Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| match Bf16Kernel::from_env() {
        Ok(Some(kernel)) => kernel,
        _ => Bf16Kernel::ALL
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Bf16Kernel::RoundedF32),
    })
}

/// Whether [`gemm_bf16`] runs on bf16 instructions here (AVX512-BF16 or AMX), rather than on f32
/// copies of the rounded operands.
pub fn native_bf16() -> bool {
    bf16_kernel() != Bf16Kernel::RoundedF32
}

/// `x` rounded to bf16 as `vcvtne2ps2bf16` rounds: to nearest, ties to even, subnormals to zero
/// of their sign, NaN kept a (quiet) NaN.
pub fn round_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    if x.is_subnormal() {
        return ((bits >> 16) as u16) & 0x8000;
    }
    let tie_to_even = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(tie_to_even) >> 16) as u16
}

/// The f32 value of the bf16 `h`.
pub fn widen_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `dst (+)= a · b` for `a`: `[m, k]`, `b`: `[k, n]`, `dst`: `[m, n]`, each given as pointer,
/// row stride and column stride; the operands rounded to bf16 and the products summed in f32.
/// With `accumulate` the product is added to `dst`, else `dst` is overwritten (and not read).
/// Single-threaded: callers share out rows or columns.
///
/// # Safety
/// Every matrix lies in memory valid for its strides, and nothing else writes `dst`.
pub unsafe fn gemm_bf16(
    dims: (usize, usize, usize),
    dst: Strided<*mut f32>,
    a: Strided<*const f32>,
    b: Strided<*const f32>,
    accumulate: bool,
) {
    // SAFETY: `bf16_kernel` runs here; the caller's contract.
    unsafe { gemm_bf16_on(bf16_kernel(), dims, dst, a, b, accumulate) }
}

/// [`gemm_bf16`] on `kernel`.
///
/// # Safety
/// As [`gemm_bf16`], and `kernel` is [`available`](Bf16Kernel::available).
pub unsafe fn gemm_bf16_on(
    kernel: Bf16Kernel,
    (m, n, k): (usize, usize, usize),
    dst: Strided<*mut f32>,
    a: Strided<*const f32>,
    b: Strided<*const f32>,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: `dst` is valid for `[m, n]` at its strides.
                    unsafe { *dst.0.add(i * dst.1 + j * dst.2) = 0.0 };
                }
            }
        }
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        match kernel {
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            Bf16Kernel::Amx => amx::gemm((m, n, k), dst, a, b, accumulate),
            #[cfg(target_arch = "x86_64")]
            Bf16Kernel::Avx512 => {
                avx512::blocked::<avx512::RegisterTile>((m, n, k), dst, a, b, accumulate)
            }
            _ => rounded_f32_gemm((m, n, k), dst, a, b, accumulate),
        }
    }
}

/// `dst (+)= a · b` in `precision`, single-threaded: f32 operands under [`Precision::Bf16`] as
/// [`gemm_bf16`], anything else by the `gemm` crate in its own dtype (f64 stays f64).
///
/// # Safety
/// As [`gemm_bf16`].
pub unsafe fn gemm_in<T: WithDType>(
    precision: Precision,
    (m, n, k): (usize, usize, usize),
    dst: Strided<*mut T>,
    a: Strided<*const T>,
    b: Strided<*const T>,
    accumulate: bool,
) {
    if precision == Precision::Bf16 && T::DTYPE == DType::F32 {
        // SAFETY: `T` is f32; the caller's contract.
        return unsafe {
            gemm_bf16(
                (m, n, k),
                (dst.0.cast(), dst.1, dst.2),
                (a.0.cast(), a.1, a.2),
                (b.0.cast(), b.1, b.2),
                accumulate,
            )
        };
    }
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
            T::one(),
            T::one(),
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// [`gemm_bf16`] as f32 products of rounded copies of the operands.
///
/// # Safety
/// As [`gemm_bf16`].
unsafe fn rounded_f32_gemm(
    (m, n, k): (usize, usize, usize),
    dst: Strided<*mut f32>,
    a: Strided<*const f32>,
    b: Strided<*const f32>,
    accumulate: bool,
) {
    let rounded = |(ptr, rs, cs): Strided<*const f32>, rows: usize, cols: usize| {
        let mut copy = Vec::with_capacity(rows * cols);
        for i in 0..rows {
            // SAFETY: the operand is valid for `[rows, cols]` at its strides.
            copy.extend(
                (0..cols).map(|j| widen_bf16(round_bf16(unsafe { *ptr.add(i * rs + j * cs) }))),
            );
        }
        copy
    };
    let (a, b) = (rounded(a, m, k), rounded(b, k, n));
    // SAFETY: `a` and `b` are row-major `[m, k]` and `[k, n]`; `dst` is the caller's.
    unsafe {
        gemm_in(
            Precision::F32,
            (m, n, k),
            dst,
            (a.as_ptr(), k, 1),
            (b.as_ptr(), n, 1),
            accumulate,
        )
    }
}

thread_local! {
    /// This thread's packed panels of `a` and of `b`, kept between calls.
    static PACKED: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded value in [-1, 1) with a full f32 mantissa.
    fn value(seed: u64, i: usize) -> f32 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 31;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 29;
        ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    /// `a · b` in f64 over the bf16 roundings of the operands.
    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f64> {
        let r = |x: f32| f64::from(widen_bf16(round_bf16(x)));
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| r(a[i * k + p]) * r(b[p * n + j])).sum();
            }
        }
        out
    }

    #[test]
    fn rounding_is_to_nearest_with_ties_to_even() {
        // 1 + 2⁻⁸ lies halfway between 1 and 1 + 2⁻⁷: the tie goes to 1 (even mantissa).
        assert_eq!(widen_bf16(round_bf16(1.0 + 2f32.powi(-8))), 1.0);
        // 1 + 3·2⁻⁸ lies halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: it goes to the even 1 + 2⁻⁶.
        assert_eq!(
            widen_bf16(round_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        // Past the half, up.
        assert_eq!(
            widen_bf16(round_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20))),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(widen_bf16(round_bf16(-3.0)), -3.0);
        assert!(widen_bf16(round_bf16(f32::NAN)).is_nan());
        assert_eq!(widen_bf16(round_bf16(f32::INFINITY)), f32::INFINITY);
        // The largest f32 rounds past bf16's largest value, to infinity, as the instruction does.
        assert_eq!(widen_bf16(round_bf16(f32::MAX)), f32::INFINITY);
        assert_eq!(widen_bf16(round_bf16(1e-40)), 0.0);
    }

    #[test]
    fn kernel_names_parse_to_kernels_this_cpu_runs_or_are_refused() {
        for kernel in Bf16Kernel::ALL {
            match kernel.available() {
                true => assert_eq!(Bf16Kernel::parse(kernel.name()), Ok(kernel)),
                false => assert_eq!(
                    Bf16Kernel::parse(kernel.name()),
                    Err(format!(
                        "SSL_BF16_KERNEL={}: this CPU cannot run it; unset it for the fastest \
                         it runs",
                        kernel.name()
                    ))
                ),
            }
        }
        // f32 copies run everywhere; the detected kernel is one this CPU runs.
        assert_eq!(Bf16Kernel::parse("f32"), Ok(Bf16Kernel::RoundedF32));
        assert!(bf16_kernel().available());
        let refused = Bf16Kernel::parse("AMX").expect_err("names are lowercase");
        assert!(refused.contains("use one of amx, avx512, f32"), "{refused}");
    }

    #[test]
    fn products_equal_f64_sums_of_the_rounded_operands() {
        // Every kernel this CPU runs: f32 copies everywhere, AVX512-BF16 and AMX where it has them.
        let kernels: Vec<_> = Bf16Kernel::ALL
            .into_iter()
            .filter(|k| k.available())
            .collect();
        eprintln!("bf16 kernels run here: {kernels:?}");
        for kernel in kernels {
            products_equal_f64_sums(kernel);
        }
    }

    /// Every shape class (tile edges, odd depths, several blocks of each loop) and each layout of
    /// each operand, against f64 sums of the rounded operands.
    fn products_equal_f64_sums(kernel: Bf16Kernel) {
        // Past every kernel's blocks: `MC` 128, `NC` 1536 and `KC` 512 (AVX512-BF16), tiles of
        // 8 × 48 and 32 × 32, chunks of 32 depths (AMX).
        let shapes = [
            (1, 1, 1),
            (3, 5, 7),
            (12, 32, 32),
            (13, 33, 31),
            (32, 64, 64),
            (25, 70, 300),
            (133, 1553, 515),
            (40, 20, 2 * 512 + 64 + 1),
        ];
        for (case, &(m, n, k)) in shapes.iter().enumerate() {
            let a: Vec<f32> = (0..m * k).map(|i| value(case as u64, i)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(100 + case as u64, i)).collect();
            let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
            let want = reference(m, n, k, &a, &b);
            for (a_layout, b_layout, dst_transposed) in [
                (false, false, false),
                (true, false, false),
                (false, true, true),
                (true, true, false),
            ] {
                let a_mat = match a_layout {
                    false => (a.as_ptr(), k, 1),
                    true => (at.as_ptr(), 1, m),
                };
                let b_mat = match b_layout {
                    false => (b.as_ptr(), n, 1),
                    true => (bt.as_ptr(), 1, k),
                };
                for accumulate in [false, true] {
                    let mut dst = vec![if accumulate { 0.5f32 } else { f32::NAN }; m * n];
                    let dst_mat = match dst_transposed {
                        false => (dst.as_mut_ptr(), n, 1),
                        true => (dst.as_mut_ptr(), 1, m),
                    };
                    // SAFETY: the kernel runs here; every matrix is as large as its strides say.
                    unsafe { gemm_bf16_on(kernel, (m, n, k), dst_mat, a_mat, b_mat, accumulate) };
                    let offset = if accumulate { 0.5 } else { 0.0 };
                    for i in 0..m {
                        for j in 0..n {
                            let got = match dst_transposed {
                                false => dst[i * n + j],
                                true => dst[j * m + i],
                            };
                            let want = want[i * n + j] + offset;
                            // f32 sums of k products of magnitude ≤ 1.
                            let tolerance = 4.0 * k as f64 * f64::from(f32::EPSILON);
                            assert!(
                                (f64::from(got) - want).abs() <= tolerance,
                                "{kernel:?} {m}×{n}×{k}, a^T {a_layout}, b^T {b_layout}, dst^T \
                                 {dst_transposed}, accumulate {accumulate}: [{i}, {j}] {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_empty_depth_gives_zero_or_leaves_dst() {
        let none: [f32; 0] = [];
        for (start, accumulate, want) in [(f32::NAN, false, 0.0), (2.0, true, 2.0)] {
            let mut dst = [start; 6];
            // SAFETY: no operand value is read; `dst` is 2 × 3.
            unsafe {
                gemm_bf16(
                    (2, 3, 0),
                    (dst.as_mut_ptr(), 3, 1),
                    (none.as_ptr(), 0, 1),
                    (none.as_ptr(), 3, 1),
                    accumulate,
                )
            };
            assert_eq!(dst, [want; 6]);
        }
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols)
            .map(|i| x[(i % rows) * cols + i / rows])
            .collect()
    }
}
