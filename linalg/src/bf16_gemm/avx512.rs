//! The blocked product of [`super::gemm_bf16`] on AVX-512 ([`blocked`]), its packing of `b`
//! (shared by every microkernel) and its AVX512-BF16 register tile ([`RegisterTile`]).

use std::arch::x86_64::*;

use super::{round_bf16, Strided, PACKED};
use crate::transpose::transpose_16x16;

/// A microkernel of the blocked product: its block sizes, its packing of `a` and its tile.
///
/// Both packings hold a slice of `kc` depths as [`Microkernel::pairs`]`(kc)` pairs (zero past
/// `kc`). `b`'s panels are `[pair][NR]` ([`pack_b`]); `a`'s panel layout is the kernel's own.
/// The panel of rows (columns) from `r` starts at `r · pairs` in its buffer.
pub(super) trait Microkernel {
    /// Rows of the tile.
    const MR: usize;
    /// Columns of the tile (a multiple of 16).
    const NR: usize;
    /// Depth of a packed slice (even).
    const KC: usize;
    /// Rows of `a` packed at once (a multiple of `MR`).
    const MC: usize;
    /// Columns of `b` packed at once (a multiple of `NR`).
    const NC: usize;

    /// Pairs a packed slice of `kc` depths holds.
    fn pairs(kc: usize) -> usize;

    /// Packs `a[i0..i0 + mc, k0..k0 + kc]` as panels of `MR` rows, `pairs` deep, the rows past
    /// `mc` and the depths past `kc` zero.
    ///
    /// # Safety
    /// The slice lies in `a`; `packed` holds `mc` rounded up to `MR` times `pairs`.
    unsafe fn pack_a(
        a: Strided<*const f32>,
        rows: (usize, usize),
        depths: (usize, usize),
        pairs: usize,
        packed: &mut [u32],
    );

    /// `tile (+)= panel_a · panel_b` for a `rows × cols` corner of the `MR × NR` tile, the
    /// panels `pairs` deep; `first` overwrites the tile.
    ///
    /// # Safety
    /// The tile's `rows × cols` values lie in memory at its strides; the panels are packed.
    unsafe fn tile_product(
        pairs: usize,
        panel_a: &[u32],
        panel_b: &[u32],
        tile: Strided<*mut f32>,
        corner: (usize, usize),
        first: bool,
    );
}

/// `dst (+)= a · b` blocked as GotoBLAS blocks it, around `K`'s tile.
///
/// # Safety
/// As [`super::gemm_bf16`], with `k` > 0, on a CPU that runs `K` (and AVX512F, AVX512BW and
/// AVX512-BF16, which the packing uses).
pub(super) unsafe fn blocked<K: Microkernel>(
    (m, n, k): (usize, usize, usize),
    dst: Strided<*mut f32>,
    a: Strided<*const f32>,
    b: Strided<*const f32>,
    accumulate: bool,
) {
    PACKED.with_borrow_mut(|(packed_a, packed_b)| {
        packed_a.resize(K::MC.min(m.next_multiple_of(K::MR)) * K::pairs(K::KC), 0);
        packed_b.resize(K::NC.min(n.next_multiple_of(K::NR)) * K::pairs(K::KC), 0);
        for j0 in (0..n).step_by(K::NC) {
            let nc = K::NC.min(n - j0);
            for k0 in (0..k).step_by(K::KC) {
                let kc = K::KC.min(k - k0);
                let pairs = K::pairs(kc);
                let first = k0 == 0 && !accumulate;
                // SAFETY: the slices lie in `b` and `a`, and the buffers hold the panels.
                unsafe { pack_b(K::NR, b, (k0, kc), (j0, nc), pairs, packed_b) };
                for i0 in (0..m).step_by(K::MC) {
                    let mc = K::MC.min(m - i0);
                    unsafe { K::pack_a(a, (i0, mc), (k0, kc), pairs, packed_a) };
                    for jr in (0..nc).step_by(K::NR) {
                        let panel_b = &packed_b[jr * pairs..][..K::NR * pairs];
                        for ir in (0..mc).step_by(K::MR) {
                            let panel_a = &packed_a[ir * pairs..][..K::MR * pairs];
                            let corner = (K::MR.min(mc - ir), K::NR.min(nc - jr));
                            // SAFETY: the tile lies in `dst`; the panels hold `pairs` depths.
                            unsafe {
                                let tile = dst.0.add((i0 + ir) * dst.1 + (j0 + jr) * dst.2);
                                K::tile_product(
                                    pairs,
                                    panel_a,
                                    panel_b,
                                    (tile, dst.1, dst.2),
                                    corner,
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

/// The AVX512-BF16 microkernel: an `MR × NR` tile of f32 accumulators in registers, `a`'s
/// panels `[pair][MR]`.
pub(super) struct RegisterTile;

/// Rows of the register tile (half a vector: `pack_a` packs a pair of depths in one).
const MR: usize = 8;
/// Columns of the register tile: three vectors of 16 f32 (24 accumulators of 32 registers).
const NR: usize = 48;

impl Microkernel for RegisterTile {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 512;
    const MC: usize = 16 * MR;
    const NC: usize = 32 * NR;

    fn pairs(kc: usize) -> usize {
        kc.div_ceil(2)
    }

    unsafe fn pack_a(
        a: Strided<*const f32>,
        rows: (usize, usize),
        depths: (usize, usize),
        pairs: usize,
        packed: &mut [u32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { pack_a_depth_major(a, rows, depths, pairs, packed) }
    }

    unsafe fn tile_product(
        pairs: usize,
        panel_a: &[u32],
        panel_b: &[u32],
        tile: Strided<*mut f32>,
        corner: (usize, usize),
        first: bool,
    ) {
        // SAFETY: the caller's contract.
        unsafe { register_tile_product(pairs, panel_a, panel_b, tile, corner, first) }
    }
}

/// The bf16 pair of `x` (depth `2p`) and `y` (depth `2p + 1`).
pub(super) fn pair(x: f32, y: f32) -> u32 {
    u32::from(round_bf16(x)) | (u32::from(round_bf16(y)) << 16)
}

/// Packs `b[k0..k0 + kc, j0..j0 + nc]` as panels of `nr` columns (a multiple of 16),
/// `[panel][pair][nr]`, `pairs` deep, the columns past `nc` and the depths past `kc` zero.
///
/// # Safety
/// The slice lies in `b`; `packed` holds `nc` rounded up to `nr` times `pairs`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_b(
    nr: usize,
    (b, rs, cs): Strided<*const f32>,
    (k0, kc): (usize, usize),
    (j0, nc): (usize, usize),
    pairs: usize,
    packed: &mut [u32],
) {
    let at = |kk: usize, j: usize| -> f32 {
        match kk < kc && j < nc {
            // SAFETY: inside the slice.
            true => unsafe { *b.add((k0 + kk) * rs + (j0 + j) * cs) },
            false => 0.0,
        }
    };
    for jr in (0..nc).step_by(nr) {
        let panel = &mut packed[jr * pairs..][..nr * pairs];
        let mut p = 0;
        if rs == 1 && jr + nr <= nc {
            // Each column's depths are consecutive: 32 of them round into 16 pairs, and 16
            // columns' pairs, transposed, are 16 rows of the panel.
            while 2 * p + 32 <= kc {
                for group in 0..nr / 16 {
                    // SAFETY: depths `2p .. 2p + 32` of the group's 16 columns lie in the
                    // slice; the panel holds pairs `p .. p + 16` of all `nr` columns.
                    unsafe {
                        let columns: [__m512i; 16] = std::array::from_fn(|c| {
                            let src = b.add(k0 + 2 * p + (j0 + jr + 16 * group + c) * cs);
                            _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src.add(16)), _mm512_loadu_ps(src))
                                .into_m512i()
                        });
                        for (q, row) in transpose_16x16(columns).into_iter().enumerate() {
                            let out = panel.as_mut_ptr().add((p + q) * nr + 16 * group);
                            _mm512_storeu_si512(out.cast(), row);
                        }
                    }
                }
                p += 16;
            }
        }
        for p in p..pairs {
            let out = &mut panel[p * nr..][..nr];
            let whole = jr + nr <= nc && 2 * p + 1 < kc;
            if whole && cs == 1 {
                // SAFETY: both rows of the pair hold `nr` columns from `jr`.
                unsafe {
                    let even = b.add((k0 + 2 * p) * rs + j0 + jr);
                    let odd = even.add(rs);
                    for half in 0..nr / 16 {
                        let h = 16 * half;
                        let packed =
                            interleave(_mm512_loadu_ps(even.add(h)), _mm512_loadu_ps(odd.add(h)));
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

/// [`RegisterTile`]'s packing of `a`: panels of `MR` rows, `[panel][pair][MR]`.
///
/// # Safety
/// As [`Microkernel::pack_a`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_a_depth_major(
    (a, rs, cs): Strided<*const f32>,
    (i0, mc): (usize, usize),
    (k0, kc): (usize, usize),
    pairs: usize,
    packed: &mut [u32],
) {
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
pub(super) fn interleave(even: __m512, odd: __m512) -> __m512i {
    // `cvtne2ps` puts the second operand's 16 values in the low half.
    let halves = _mm512_cvtne2ps_pbh(odd, even).into_m512i();
    let order = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    _mm512_permutexvar_epi16(order, halves)
}

pub(super) trait IntoM512i {
    fn into_m512i(self) -> __m512i;
}

impl IntoM512i for __m512bh {
    fn into_m512i(self) -> __m512i {
        // SAFETY: both are 512 bits of lanes.
        unsafe { std::mem::transmute::<__m512bh, __m512i>(self) }
    }
}

/// [`RegisterTile`]'s tile product.
///
/// # Safety
/// As [`Microkernel::tile_product`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn register_tile_product(
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
