//! The geometry of a convolution (input, kernel, stride and padding per axis, and the column
//! matrix they make) and how its batch is split into chunks of images.

use std::ops::Range;

use candle_core::Result;

use crate::autocast::Precision;

/// Geometry of a convolution on a `[C, N, D, H, W]` input (`D = 1`, kernel depth 1 in 2D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Geom {
    pub c: usize,
    pub n: usize,
    /// Input extent per axis (D, H, W).
    pub size: [usize; 3],
    /// Kernel extent, stride and padding per axis.
    pub k: [usize; 3],
    pub stride: [usize; 3],
    pub pad: [usize; 3],
    /// Precision of the im2col and skinny paths' products. Winograd's run in f32 whatever it
    /// says: rounded to bf16, F(4×4, 3×3)'s transformed operands gave 35× im2col's bf16 error
    /// against the f64 convolution (6 % of the outputs' scale on a 64-channel layer), and
    /// F(2, 3)'s 2–3× it with no speed-up (row 4 of the step bench, 3D: 1,313 against 1,210 ms,
    /// 4 alternating pairs; its small per-point GEMMs repack both operands every call).
    pub products: Precision,
}

/// Workers whose counts [`balanced_chunks`] shares chunks evenly among: 1, 2, 4 or 8.
const WORKER_MULTIPLE: usize = 8;

/// How many chunks `n` images make at `per_chunk` images a chunk, rounded up to a multiple of
/// [`WORKER_MULTIPLE`] where every chunk keeps at least `min_images`: Candle's workers take
/// contiguous ranges of chunks, and 19 chunks of 7 images (the last of 2) gave one of two
/// workers 70 images and the other 58. Fixed by the shapes; [`chunk_images`] sizes them.
pub(super) fn balanced_chunks(n: usize, per_chunk: usize, min_images: usize) -> usize {
    let count = n.div_ceil(per_chunk.max(1));
    let balanced = count.next_multiple_of(WORKER_MULTIPLE).max(1);
    if n / balanced >= min_images.max(1) {
        balanced
    } else {
        count
    }
}

/// The images of chunk `chunk` of `chunks` over `n` images: sizes within one of each other.
pub(super) fn chunk_images(n: usize, chunks: usize, chunk: usize) -> Range<usize> {
    chunk * n / chunks..(chunk + 1) * n / chunks
}

impl Geom {
    /// The geometry of a cubic window `kernel` on a channel-major `[C, N, *S]` input of spatial
    /// rank 2 or 3 (`what` names the operation in errors).
    pub fn new(
        what: &str,
        dims: &[usize],
        kernel: usize,
        stride: usize,
        pad: usize,
    ) -> Result<Self> {
        if !(4..=5).contains(&dims.len()) {
            candle_core::bail!(
                "{what} takes channel-major [C, N, H, W] or [C, N, D, H, W] input, got {dims:?}"
            );
        }
        let spatial = &dims[2..];
        if spatial.iter().any(|&s| s + 2 * pad < kernel) {
            candle_core::bail!(
                "{what}: input {spatial:?} (padding {pad}) is smaller than the window {kernel}"
            );
        }
        let lead = 5 - dims.len();
        let per_axis = |v: usize, flat: usize| -> [usize; 3] {
            std::array::from_fn(|a| if a < lead { flat } else { v })
        };
        Ok(Self {
            c: dims[0],
            n: dims[1],
            size: std::array::from_fn(|a| if a < lead { 1 } else { spatial[a - lead] }),
            k: per_axis(kernel, 1),
            stride: per_axis(stride, 1),
            pad: per_axis(pad, 0),
            products: Precision::F32,
        })
    }

    /// `[C, N, *S_out]` for an input of spatial rank `rank` with `channels` output channels.
    pub fn out_dims(&self, channels: usize, rank: usize) -> Vec<usize> {
        let mut dims = vec![channels, self.n];
        dims.extend(&self.out()[3 - rank..]);
        dims
    }

    pub fn out(&self) -> [usize; 3] {
        std::array::from_fn(|a| self.out_along(a))
    }

    /// Output extent along axis `a`.
    pub fn out_along(&self, a: usize) -> usize {
        (self.size[a] + 2 * self.pad[a] - self.k[a]) / self.stride[a] + 1
    }

    /// The input as `[C, N, D, H, W]`.
    pub fn size_5d(&self) -> (usize, usize, usize, usize, usize) {
        let [d, h, w] = self.size;
        (self.c, self.n, d, h, w)
    }

    pub fn kernel_volume(&self) -> usize {
        self.k.iter().product()
    }

    pub(super) fn col_shape(&self) -> (usize, usize) {
        let o = self.out();
        (self.c * self.kernel_volume(), self.n * o[0] * o[1] * o[2])
    }

    /// Output positions along axis `a` whose input index `o·stride + k − pad` at kernel
    /// offset `k` lies inside the input.
    pub fn valid_outputs(&self, a: usize, k: usize) -> std::ops::Range<usize> {
        let (s, p) = (self.stride[a], self.pad[a]);
        let first = p.saturating_sub(k).div_ceil(s);
        let end = match (self.size[a] + p).checked_sub(k + 1) {
            Some(v) => (v / s + 1).min(self.out_along(a)),
            None => 0,
        };
        first..end.max(first)
    }

    /// Kernel offsets `[kd, kh, kw]` of column-matrix row `row`.
    pub fn offsets(&self, row: usize) -> [usize; 3] {
        let r = row % self.kernel_volume();
        [
            r / (self.k[1] * self.k[2]),
            (r / self.k[2]) % self.k[1],
            r % self.k[2],
        ]
    }
}

/// Column-matrix values per chunk of images (4 MiB of f32): the chunk's columns stay in the
/// cache between im2col and the GEMM, and no column matrix of the whole batch is ever made.
pub(super) const CHUNK_VALUES: usize = 1 << 20;

impl Geom {
    /// Chunks of images: about [`CHUNK_VALUES`] column values each, and at least 8 chunks
    /// when the batch allows (work for every thread), shared evenly among workers
    /// ([`balanced_chunks`]); independent of the thread count.
    pub(super) fn chunks(&self) -> usize {
        let (rows, _) = self.col_shape();
        let per_image = rows * self.out().iter().product::<usize>();
        let nb = (CHUNK_VALUES / per_image.max(1)).clamp(1, self.n.div_ceil(8).max(1));
        balanced_chunks(self.n, nb, 1)
    }
}
