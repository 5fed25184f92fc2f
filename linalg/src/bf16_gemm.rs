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
//! Elsewhere the same operands are rounded into f32 copies and multiplied by the `gemm` crate:
//! the same numbers up to the order of the f32 sums, at f32's speed.

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

/// Rows of the register tile (half a vector: `pack_a` packs a pair of depths in one).
const MR: usize = 8;
/// Columns of the register tile: three vectors of 16 f32 (24 accumulators of 32 registers).
const NR: usize = 48;
/// Depth of a packed slice (even: it is packed in pairs).
const KC: usize = 512;
/// Rows of `a` packed at once.
const MC: usize = 16 * MR;
/// Columns of `b` packed at once.
const NC: usize = 32 * NR;

/// A matrix in memory: pointer, row stride, column stride (in elements).
pub type Strided<T> = (T, usize, usize);

/// Whether [`gemm_bf16`] runs on bf16 instructions here (AVX512-BF16), rather than on f32 copies
/// of the rounded operands.
pub fn native_bf16() -> bool {
    static NATIVE: OnceLock<bool> = OnceLock::new();
    *NATIVE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
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
    #[cfg(target_arch = "x86_64")]
    if native_bf16() {
        // SAFETY: the CPU has the instructions, and the caller's contract.
        return unsafe { native::gemm((m, n, k), dst, a, b, accumulate) };
    }
    // SAFETY: the caller's contract.
    unsafe { rounded_f32_gemm((m, n, k), dst, a, b, accumulate) }
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

#[cfg(target_arch = "x86_64")]
mod native {
    use std::arch::x86_64::*;

    use super::{round_bf16, Strided, KC, MC, MR, NC, NR, PACKED};

    /// [`super::gemm_bf16`] on AVX512-BF16.
    ///
    /// # Safety
    /// As [`super::gemm_bf16`], on a CPU with AVX512F, AVX512BW and AVX512-BF16.
    pub(super) unsafe fn gemm(
        (m, n, k): (usize, usize, usize),
        dst: Strided<*mut f32>,
        a: Strided<*const f32>,
        b: Strided<*const f32>,
        accumulate: bool,
    ) {
        PACKED.with_borrow_mut(|(packed_a, packed_b)| {
            packed_a.resize(MC.min(m.next_multiple_of(MR)) * KC / 2, 0);
            packed_b.resize(NC.min(n.next_multiple_of(NR)) * KC / 2, 0);
            for j0 in (0..n).step_by(NC) {
                let nc = NC.min(n - j0);
                for k0 in (0..k).step_by(KC) {
                    let kc = KC.min(k - k0);
                    let pairs = kc.div_ceil(2);
                    let first = k0 == 0 && !accumulate;
                    // SAFETY: the slices lie in `b` and `a`, and the buffers hold the panels.
                    unsafe { pack_b(b, (k0, kc), (j0, nc), packed_b) };
                    for i0 in (0..m).step_by(MC) {
                        let mc = MC.min(m - i0);
                        unsafe { pack_a(a, (i0, mc), (k0, kc), packed_a) };
                        for jr in (0..nc).step_by(NR) {
                            let panel_b = &packed_b[jr * pairs..][..NR * pairs];
                            for ir in (0..mc).step_by(MR) {
                                let panel_a = &packed_a[ir * pairs..][..MR * pairs];
                                let (rows, cols) = (MR.min(mc - ir), NR.min(nc - jr));
                                // SAFETY: the tile lies in `dst`; the panels hold `pairs` depths.
                                unsafe {
                                    let tile = dst.0.add((i0 + ir) * dst.1 + (j0 + jr) * dst.2);
                                    tile_product(
                                        pairs,
                                        panel_a,
                                        panel_b,
                                        (tile, dst.1, dst.2),
                                        (rows, cols),
                                        first,
                                    )
                                }
                            }
                        }
                    }
                }
            }
        })
    }

    /// The bf16 pair of `x` (depth `2p`) and `y` (depth `2p + 1`).
    fn pair(x: f32, y: f32) -> u32 {
        u32::from(round_bf16(x)) | (u32::from(round_bf16(y)) << 16)
    }

    /// Packs `b[k0..k0 + kc, j0..j0 + nc]` as panels of `NR` columns, `[panel][pair][NR]`, the
    /// columns past `nc` and the depth past `kc` zero.
    ///
    /// # Safety
    /// The slice lies in `b`; `packed` holds `nc` rounded up to `NR` times `kc / 2` (rounded up).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pack_b(
        (b, rs, cs): Strided<*const f32>,
        (k0, kc): (usize, usize),
        (j0, nc): (usize, usize),
        packed: &mut [u32],
    ) {
        let pairs = kc.div_ceil(2);
        let at = |kk: usize, j: usize| -> f32 {
            match kk < kc && j < nc {
                // SAFETY: inside the slice.
                true => unsafe { *b.add((k0 + kk) * rs + (j0 + j) * cs) },
                false => 0.0,
            }
        };
        for jr in (0..nc).step_by(NR) {
            let panel = &mut packed[jr * pairs..][..NR * pairs];
            let mut p = 0;
            if rs == 1 && jr + NR <= nc {
                // Each column's depths are consecutive: 32 of them round into 16 pairs, and 16
                // columns' pairs, transposed, are 16 rows of the panel.
                while 2 * p + 32 <= kc {
                    for group in 0..NR / 16 {
                        // SAFETY: depths `2p .. 2p + 32` of the group's 16 columns lie in the
                        // slice; the panel holds pairs `p .. p + 16` of all `NR` columns.
                        unsafe {
                            let columns: [__m512i; 16] = std::array::from_fn(|c| {
                                let src = b.add(k0 + 2 * p + (j0 + jr + 16 * group + c) * cs);
                                _mm512_cvtne2ps_pbh(
                                    _mm512_loadu_ps(src.add(16)),
                                    _mm512_loadu_ps(src),
                                )
                                .into_m512i()
                            });
                            for (q, row) in transpose_16x16(columns).into_iter().enumerate() {
                                let out = panel.as_mut_ptr().add((p + q) * NR + 16 * group);
                                _mm512_storeu_si512(out.cast(), row);
                            }
                        }
                    }
                    p += 16;
                }
            }
            for p in p..pairs {
                let out = &mut panel[p * NR..][..NR];
                let whole = jr + NR <= nc && 2 * p + 1 < kc;
                if whole && cs == 1 {
                    // SAFETY: both rows of the pair hold `NR` columns from `jr`.
                    unsafe {
                        let even = b.add((k0 + 2 * p) * rs + j0 + jr);
                        let odd = even.add(rs);
                        for half in 0..NR / 16 {
                            let h = 16 * half;
                            let packed = interleave(
                                _mm512_loadu_ps(even.add(h)),
                                _mm512_loadu_ps(odd.add(h)),
                            );
                            _mm512_storeu_si512(out.as_mut_ptr().add(h).cast(), packed);
                        }
                    }
                } else {
                    for (j, o) in out.iter_mut().enumerate() {
                        *o = pair(at(2 * p, jr + j), at(2 * p + 1, jr + j));
                    }
                }
            }
        }
    }

    /// Packs `a[i0..i0 + mc, k0..k0 + kc]` as panels of `MR` rows, `[panel][pair][MR]`, the rows
    /// past `mc` and the depth past `kc` zero.
    ///
    /// # Safety
    /// The slice lies in `a`; `packed` holds `mc` rounded up to `MR` times `kc / 2` (rounded up).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pack_a(
        (a, rs, cs): Strided<*const f32>,
        (i0, mc): (usize, usize),
        (k0, kc): (usize, usize),
        packed: &mut [u32],
    ) {
        let pairs = kc.div_ceil(2);
        for ir in (0..mc).step_by(MR) {
            let panel = &mut packed[ir * pairs..][..MR * pairs];
            if rs == 1 && ir + MR <= mc {
                // The panel's rows are consecutive at each depth: a pair of depths is two loads.
                for p in 0..kc / 2 {
                    // SAFETY: depths `2p` and `2p + 1` of the panel's rows lie in the slice.
                    unsafe {
                        let even = a.add(i0 + ir + (k0 + 2 * p) * cs);
                        let packed = interleave(
                            _mm512_zextps256_ps512(_mm256_loadu_ps(even)),
                            _mm512_zextps256_ps512(_mm256_loadu_ps(even.add(cs))),
                        );
                        let out = panel.as_mut_ptr().add(p * MR);
                        _mm256_storeu_si256(out.cast(), _mm512_castsi512_si256(packed));
                    }
                }
                if kc % 2 == 1 {
                    let p = kc / 2;
                    for (r, o) in panel[p * MR..][..MR].iter_mut().enumerate() {
                        // SAFETY: depth `kc − 1` of row `ir + r` lies in the slice.
                        *o = pair(unsafe { *a.add(i0 + ir + r + (k0 + 2 * p) * cs) }, 0.0);
                    }
                }
                continue;
            }
            for r in 0..MR {
                let row = ir + r;
                let mut p = 0;
                if row < mc && cs == 1 {
                    // SAFETY: the row holds `kc` values from `k0`.
                    let src = unsafe { a.add((i0 + row) * rs + k0) };
                    // Sixteen pairs at a time: 32 consecutive depths round into 16 pairs.
                    while 2 * p + 32 <= kc {
                        let mut pairs16 = [0u32; 16];
                        // SAFETY: depths `2p .. 2p + 32` lie in the row.
                        unsafe {
                            let lo = _mm512_loadu_ps(src.add(2 * p));
                            let hi = _mm512_loadu_ps(src.add(2 * p + 16));
                            let bf = _mm512_cvtne2ps_pbh(hi, lo);
                            _mm512_storeu_si512(pairs16.as_mut_ptr().cast(), bf.into_m512i());
                        }
                        for (q, v) in pairs16.into_iter().enumerate() {
                            panel[(p + q) * MR + r] = v;
                        }
                        p += 16;
                    }
                }
                for p in p..pairs {
                    let at = |kk: usize| -> f32 {
                        match kk < kc && row < mc {
                            // SAFETY: inside the slice.
                            true => unsafe { *a.add((i0 + row) * rs + (k0 + kk) * cs) },
                            false => 0.0,
                        }
                    };
                    panel[p * MR + r] = pair(at(2 * p), at(2 * p + 1));
                }
            }
        }
    }

    /// 16 pairs `(even[j], odd[j])` in bf16, in order of `j`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn interleave(even: __m512, odd: __m512) -> __m512i {
        // `cvtne2ps` puts the second operand's 16 values in the low half.
        let halves = _mm512_cvtne2ps_pbh(odd, even).into_m512i();
        let order = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        _mm512_permutexvar_epi16(order, halves)
    }

    /// The transpose of the 16 × 16 matrix of 32-bit lanes whose rows are `r`: in-lane
    /// interleaves of 32 and 64 bits transpose each 4 × 4 block, and two shuffles of 128-bit
    /// lanes the 4 × 4 matrix of blocks.
    #[target_feature(enable = "avx512f")]
    fn transpose_16x16(r: [__m512i; 16]) -> [__m512i; 16] {
        let t: [__m512i; 16] = std::array::from_fn(|i| match i % 2 {
            0 => _mm512_unpacklo_epi32(r[i], r[i + 1]),
            _ => _mm512_unpackhi_epi32(r[i - 1], r[i]),
        });
        // u[4i + k], lane L: rows 4i .. 4i + 4 of column 4L + k.
        let u: [__m512i; 16] = std::array::from_fn(|j| {
            let (i, k) = (j / 4, j % 4);
            let (x, y) = (t[4 * i + k / 2], t[4 * i + 2 + k / 2]);
            match k % 2 {
                0 => _mm512_unpacklo_epi64(x, y),
                _ => _mm512_unpackhi_epi64(x, y),
            }
        });
        let mut out = [_mm512_setzero_si512(); 16];
        for k in 0..4 {
            let a = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
            let b = _mm512_shuffle_i32x4::<0xee>(u[k], u[4 + k]);
            let c = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
            let d = _mm512_shuffle_i32x4::<0xee>(u[8 + k], u[12 + k]);
            out[k] = _mm512_shuffle_i32x4::<0x88>(a, c);
            out[4 + k] = _mm512_shuffle_i32x4::<0xdd>(a, c);
            out[8 + k] = _mm512_shuffle_i32x4::<0x88>(b, d);
            out[12 + k] = _mm512_shuffle_i32x4::<0xdd>(b, d);
        }
        out
    }

    trait IntoM512i {
        fn into_m512i(self) -> __m512i;
    }

    impl IntoM512i for __m512bh {
        fn into_m512i(self) -> __m512i {
            // SAFETY: both are 512 bits of lanes.
            unsafe { std::mem::transmute::<__m512bh, __m512i>(self) }
        }
    }

    /// `tile (+)= panel_a · panel_b` for a `rows × cols` corner of the `MR × NR` register tile,
    /// the panels `pairs` deep; `first` overwrites the tile.
    ///
    /// # Safety
    /// The tile's `rows × cols` values lie in memory at its strides.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn tile_product(
        pairs: usize,
        panel_a: &[u32],
        panel_b: &[u32],
        (tile, rs, cs): Strided<*mut f32>,
        (rows, cols): (usize, usize),
        first: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NR / 16]; MR];
        let (a, b) = (panel_a.as_ptr(), panel_b.as_ptr());
        for p in 0..pairs {
            // SAFETY: the panels hold `pairs` rows of `MR` and `NR` values.
            unsafe {
                let bv: [__m512bh; NR / 16] = std::array::from_fn(|h| {
                    std::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16 * h).cast()))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let ar: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*a.add(p * MR + r) as i32));
                    for (acc, &bv) in acc.iter_mut().zip(&bv) {
                        *acc = _mm512_dpbf16_ps(*acc, ar, bv);
                    }
                }
            }
        }
        if cs == 1 && cols == NR {
            for (r, acc) in acc.iter().enumerate().take(rows) {
                for (h, &v) in acc.iter().enumerate() {
                    // SAFETY: row `r` holds `NR` contiguous values.
                    unsafe {
                        let at = tile.add(r * rs + 16 * h);
                        let v = match first {
                            true => v,
                            false => _mm512_add_ps(v, _mm512_loadu_ps(at)),
                        };
                        _mm512_storeu_ps(at, v);
                    }
                }
            }
            return;
        }
        let mut values = [[0f32; NR]; MR];
        for (row, acc) in values.iter_mut().zip(&acc) {
            for (h, &v) in acc.iter().enumerate() {
                // SAFETY: `row` holds `NR` values.
                unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(16 * h), v) };
            }
        }
        for (r, row) in values.iter().enumerate().take(rows) {
            for (j, &v) in row.iter().enumerate().take(cols) {
                // SAFETY: inside the tile.
                unsafe {
                    let at = tile.add(r * rs + j * cs);
                    *at = if first { v } else { *at + v };
                }
            }
        }
    }
}

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

    /// Every shape class (tile edges, odd depths, several blocks of each loop) and each layout of
    /// each operand, against f64 sums of the rounded operands.
    type Gemm = unsafe fn(
        (usize, usize, usize),
        Strided<*mut f32>,
        Strided<*const f32>,
        Strided<*const f32>,
        bool,
    );

    #[test]
    fn products_equal_f64_sums_of_the_rounded_operands() {
        // Both ways: bf16 instructions where the CPU has them, and f32 copies (everywhere).
        products_equal_f64_sums(gemm_bf16);
        products_equal_f64_sums(rounded_f32_gemm);
    }

    /// Every shape class (tile edges, odd depths, several blocks of each loop) and each layout of
    /// each operand, against f64 sums of the rounded operands.
    fn products_equal_f64_sums(gemm: Gemm) {
        let shapes = [
            (1, 1, 1),
            (3, 5, 7),
            (12, 32, 32),
            (13, 33, 31),
            (25, 70, 300),
            (MC + 5, NC + 17, KC + 3),
            (40, 20, 2 * KC + 64),
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
                    // SAFETY: every matrix is as large as its strides say.
                    unsafe { gemm((m, n, k), dst_mat, a_mat, b_mat, accumulate) };
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
                                "{m}×{n}×{k}, a^T {a_layout}, b^T {b_layout}, dst^T \
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
