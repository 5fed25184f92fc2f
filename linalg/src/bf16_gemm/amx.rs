//! The AMX microkernel of [`super::gemm_bf16`] (Intel Sapphire Rapids and later): a 32 × 32 f32
//! tile of `dst` held in four of AMX's eight tile registers.
//!
//! A tile register holds up to 16 rows of 64 bytes. `tdpbf16ps c, a, b` adds to the 16 × 16
//! f32 tile `c` the product of `a`, 16 rows of 16 bf16 pairs (32 depths), and `b`, 16 rows of
//! pairs for 16 columns: row `p` of `b` holds the pairs of depths `2p`, `2p + 1`, the layout
//! [`super::avx512::pack_b`] already packs. Per 32 depths the kernel loads two tiles of `a` and
//! two of `b` and issues four products (Intel, "Intel 64 and IA-32 Architectures Optimization
//! Reference Manual", ch. 20, "Intel AMX").
//!
//! `a`'s panels are `[chunk of 32 depths][32 rows][16 pairs]`, so each tile of `a` is 1 KiB in
//! a row; `b`'s panels `[pair][32 columns]`, read at a 128-byte stride. A panel's depth is a
//! whole number of chunks, zero past `kc`.
//!
//! Linux hands out AMX's tile state only to a process that asks for it
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`enabled`] asks once, and the kernel
//! runs only where the CPU has the instructions and the request succeeded. Rust's AMX intrinsics
//! are unstable, so the instructions are written as inline assembly.

use std::arch::asm;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use super::avx512::{blocked, interleave, IntoM512i, Microkernel};
use super::Strided;
use crate::transpose::transpose_16x16;

/// Rows of the tile: two tile registers.
const MR: usize = 32;
/// Columns of the tile: two tile registers.
const NR: usize = 32;
/// Pairs in a chunk: one row of a tile register of `a` (64 bytes).
const CHUNK: usize = 16;

/// Whether the CPU has AMX-TILE and AMX-BF16 and Linux lets this process use them (asked once).
pub(super) fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
        let features = __cpuid_count(7, 0).edx;
        let has_amx = features & (1 << 22) != 0 && features & (1 << 24) != 0;
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: the request only changes which state the kernel saves for this process.
        has_amx
            && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
    })
}

/// `dst (+)= a · b` on AMX tiles.
///
/// # Safety
/// As [`super::gemm_bf16`], with `k` > 0, where [`enabled`] and AVX512-BF16.
pub(super) unsafe fn gemm(
    dims: (usize, usize, usize),
    dst: Strided<*mut f32>,
    a: Strided<*const f32>,
    b: Strided<*const f32>,
    accumulate: bool,
) {
    // Palette 1; every register used is 16 rows of 64 bytes (bytes 16.. hold each register's
    // bytes per row as a u16, bytes 48.. its rows).
    let mut config = [0u8; 64];
    config[0] = 1;
    for register in 0..8 {
        config[16 + 2 * register] = 64;
        config[48 + register] = 16;
    }
    // SAFETY: AMX is enabled for this process; the configuration is valid. The tile registers
    // are this thread's, and no other code of this process uses them.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) config.as_ptr(), options(nostack, readonly));
        blocked::<TileRegisters>(dims, dst, a, b, accumulate);
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// The AMX microkernel.
struct TileRegisters;

impl Microkernel for TileRegisters {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 512;
    const MC: usize = 4 * MR;
    const NC: usize = 32 * NR;

    fn pairs(kc: usize) -> usize {
        kc.div_ceil(2 * CHUNK) * CHUNK
    }

    unsafe fn pack_a(
        a: Strided<*const f32>,
        rows: (usize, usize),
        depths: (usize, usize),
        pairs: usize,
        packed: &mut [u32],
    ) {
        // SAFETY: the caller's contract.
        unsafe { pack_a_row_chunks(a, rows, depths, pairs, packed) }
    }

    unsafe fn tile_product(
        pairs: usize,
        panel_a: &[u32],
        panel_b: &[u32],
        (tile, rs, cs): Strided<*mut f32>,
        (rows, cols): (usize, usize),
        first: bool,
    ) {
        let in_place = cs == 1 && rows == MR && cols == NR;
        // The four f32 tiles: in `dst` itself where it is a whole row-major tile, else in
        // `spill`, added or written to `dst` after (every value stored before it is read).
        let mut spill = MaybeUninit::<[[f32; NR]; MR]>::uninit();
        let (c, c_stride) = match in_place {
            true => (tile, rs * 4),
            false => (spill.as_mut_ptr().cast::<f32>(), NR * 4),
        };
        let c_low = c.wrapping_add(16 * c_stride / 4);
        // SAFETY: `c` and `c_low` address the tile's top and bottom 16 rows, 32 columns each,
        // at `c_stride` bytes a row.
        unsafe {
            match in_place && !first {
                true => asm!(
                    "tileloadd tmm0, [{c} + {s} * 1]",
                    "tileloadd tmm1, [{c} + {s} * 1 + 64]",
                    "tileloadd tmm2, [{l} + {s} * 1]",
                    "tileloadd tmm3, [{l} + {s} * 1 + 64]",
                    c = in(reg) c, l = in(reg) c_low, s = in(reg) c_stride,
                    options(nostack, readonly),
                ),
                false => asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem),
                ),
            }
        }
        let (a, b) = (panel_a.as_ptr(), panel_b.as_ptr());
        for chunk in 0..pairs / CHUNK {
            // SAFETY: chunk `chunk` of the `a` panel is two 1 KiB tiles in a row; of the `b`
            // panel, 16 rows of `NR` pairs, its two tiles 64 bytes apart.
            unsafe {
                asm!(
                    "tileloadd tmm4, [{a} + {row} * 1]",
                    "tileloadd tmm5, [{a} + {row} * 1 + 1024]",
                    "tileloadd tmm6, [{b} + {b_row} * 1]",
                    "tileloadd tmm7, [{b} + {b_row} * 1 + 64]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a = in(reg) a.add(chunk * MR * CHUNK),
                    b = in(reg) b.add(chunk * CHUNK * NR),
                    row = in(reg) CHUNK * 4,
                    b_row = in(reg) NR * 4,
                    options(nostack, readonly),
                );
            }
        }
        // SAFETY: as the loads of `c` above.
        unsafe {
            asm!(
                "tilestored [{c} + {s} * 1], tmm0",
                "tilestored [{c} + {s} * 1 + 64], tmm1",
                "tilestored [{l} + {s} * 1], tmm2",
                "tilestored [{l} + {s} * 1 + 64], tmm3",
                c = in(reg) c, l = in(reg) c_low, s = in(reg) c_stride,
                options(nostack),
            );
        }
        if in_place {
            return;
        }
        // SAFETY: the stores above wrote the whole of `spill`.
        let spill = unsafe { spill.assume_init() };
        for (r, row) in spill.iter().enumerate().take(rows) {
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

/// Packs `a[i0..i0 + mc, k0..k0 + kc]` as panels of `MR` rows, `[chunk][MR][CHUNK]` each.
///
/// # Safety
/// As [`Microkernel::pack_a`].
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_a_row_chunks(
    (a, rs, cs): Strided<*const f32>,
    (i0, mc): (usize, usize),
    (k0, kc): (usize, usize),
    pairs: usize,
    packed: &mut [u32],
) {
    // The lanes of the first `count` values, `count` clamped to 0..=16.
    let lanes = |count: usize| -> __mmask16 { ((1u32 << count.min(16)) - 1) as __mmask16 };
    for ir in (0..mc).step_by(MR) {
        let panel = &mut packed[ir * pairs..][..MR * pairs];
        let rows = MR.min(mc - ir);
        for chunk in 0..pairs / CHUNK {
            let block = &mut panel[chunk * MR * CHUNK..][..MR * CHUNK];
            let d0 = 2 * CHUNK * chunk;
            let depth_left = kc.saturating_sub(d0);
            if cs == 1 {
                // A row's 32 depths round into its 16 pairs.
                for (r, out) in block.chunks_exact_mut(CHUNK).enumerate() {
                    // SAFETY: the masks load only depths below `kc` of rows below `mc`.
                    unsafe {
                        let src = a.wrapping_add((i0 + ir + r) * rs + k0 + d0);
                        let (lo, hi) = match r < rows {
                            true => (lanes(depth_left), lanes(depth_left.saturating_sub(16))),
                            false => (0, 0),
                        };
                        let pairs16 = _mm512_cvtne2ps_pbh(
                            _mm512_maskz_loadu_ps(hi, src.wrapping_add(16)),
                            _mm512_maskz_loadu_ps(lo, src),
                        );
                        _mm512_storeu_si512(out.as_mut_ptr().cast(), pairs16.into_m512i());
                    }
                }
            } else if rs == 1 {
                // 16 rows are consecutive at each depth: a pair of depths is two loads, 16 rows'
                // pairs, and 16 of those, transposed, are the rows' 16 pairs.
                for group in 0..MR / 16 {
                    let row_lanes = lanes(rows.saturating_sub(16 * group));
                    let columns: [__m512i; 16] = std::array::from_fn(|q| {
                        let depth = d0 + 2 * q;
                        let load = |d: usize| -> __m512 {
                            let mask = if d < kc { row_lanes } else { 0 };
                            // SAFETY: the mask loads only rows below `mc` at depths below `kc`.
                            unsafe {
                                let src = a.wrapping_add(i0 + ir + 16 * group + (k0 + d) * cs);
                                _mm512_maskz_loadu_ps(mask, src)
                            }
                        };
                        interleave(load(depth), load(depth + 1))
                    });
                    for (r, row) in transpose_16x16(columns).into_iter().enumerate() {
                        let out = &mut block[(16 * group + r) * CHUNK..][..CHUNK];
                        // SAFETY: `out` holds 16 values.
                        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), row) };
                    }
                }
            } else {
                for (r, out) in block.chunks_exact_mut(CHUNK).enumerate() {
                    for (q, o) in out.iter_mut().enumerate() {
                        let at = |d: usize| -> f32 {
                            match d < kc && r < rows {
                                // SAFETY: inside the slice.
                                true => unsafe { *a.add((i0 + ir + r) * rs + (k0 + d) * cs) },
                                false => 0.0,
                            }
                        };
                        *o = super::avx512::pair(at(d0 + 2 * q), at(d0 + 2 * q + 1));
                    }
                }
            }
        }
    }
}
