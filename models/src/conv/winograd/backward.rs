//! The weight gradient of Winograd's algorithm: `dU` summed over the chunks from the transformed
//! inputs and output gradients, then `dW = Gᵀ dU G`.

use ssl_linalg::bf16_gemm::gemm_in;
use ssl_linalg::for_each_index;

use super::super::backward::group_partial_sums;
use super::super::Shared;
use super::chunks::for_each_step_channel;
use super::transforms::{transform_axes, Transforms};
use super::Minimal;
use crate::autocast::Precision;
use crate::util::{vectorized, written_whole, Float, Scratch};

/// Input channels per task of the weight gradient's last step: each task writes a run of
/// `16 · k_vol` values in every row of `dW` (`[O, C·k_vol]`) instead of `k_vol`, a row apart,
/// per channel.
const GRAD_CHANNEL_BLOCK: usize = 16;

impl<const M: usize, const N: usize> Minimal<M, N>
where
    Self: Transforms<M, N>,
{
    /// `dU`: `[points, C, O]` of [`Self::weight_grad`] for few chunks, each step shared among
    /// the workers: `V` and `Ŷ` of every chunk a block of channels of a chunk a task, then the
    /// products a point a task, summed over the chunks in order. Every value written.
    fn weight_grad_stepwise<T: Float>(&self, x: &[T], dy: &[T], o: usize, chunks: usize) -> Vec<T> {
        let (c, points) = (self.g.c, self.points());
        let (layout, v, mut dyt) = self.stepwise_inputs(x, chunks, |_, ld| points * o * ld);
        let dyt_ptr = Shared(dyt.as_mut_ptr());
        for_each_step_channel(
            &layout,
            o,
            <[Scratch<T>; 2]>::default,
            #[inline(always)]
            |[rows, stage]: &mut [Scratch<T>; 2], step, oi| {
                let dyt_ptr = &dyt_ptr;
                // SAFETY: the chunk's Ŷ, `points·O·ld` values from `out_at`, lies in `dyt`; this
                // task alone writes channel oi's rows of it.
                unsafe {
                    let out = (dyt_ptr.0.add(step.out_at + oi * step.ld), o * step.ld);
                    self.output_grad_transform(dy, oi, step.images.clone(), out, [rows, stage]);
                }
            },
        );
        let write = |du: &mut [T]| {
            let du_ptr = Shared(du.as_mut_ptr());
            for_each_index(
                points,
                || (),
                |_, xi| {
                    let du_ptr = &du_ptr;
                    for (i, step) in layout.iter().enumerate() {
                        // SAFETY: dU holds `points` blocks of `C·O` values, this task's block
                        // ξ alone; the chunk's V and Ŷ hold the blocks read.
                        unsafe {
                            gemm_in(
                                Precision::F32,
                                (c, o, step.lane),
                                (du_ptr.0.add(xi * c * o), o, 1),
                                (v[step.v_at + xi * c * step.ld..].as_ptr(), step.ld, 1),
                                (dyt[step.out_at + xi * o * step.ld..].as_ptr(), 1, step.ld),
                                i > 0,
                            );
                        }
                    }
                },
            );
        };
        // SAFETY: chunk 0's product writes every value of each block ξ, the others add to it.
        unsafe { written_whole(points * c * o, write) }
    }

    /// The weight gradient `dW`: `[O, C·k_vol]` of [`Self::forward`] from `dy`:
    /// `[O, N·S_out]`, as partial sums over groups of chunks ([`group_partial_sums`]) of
    /// `dUᵀ[ξ] (C × O) = V[ξ] · Ŷ[ξ]ᵀ` with `Ŷ = A dY Aᵀ`, added in a fixed order, then `Gᵀ dU G`.
    ///
    /// `Ŷ` is kept as `[points, O, T]` and read transposed by the GEMM: on row 1 of the step bench
    /// that costs the GEMMs 60 ms more a step than a `[16, T, O]` copy would, and saves the
    /// copy's 90 ms.
    ///
    /// Of few chunks ([`Self::stepwise`]), `dU` is one sum over the chunks in order, its
    /// steps shared out as in the forward ([`Self::weight_grad_stepwise`]).
    pub fn weight_grad<T: Float>(&self, x: &[T], dy: &[T], dw: &mut [T]) {
        let o = dw.len() / (self.g.c * self.g.kernel_volume());
        self.weight_grad_by(x, dy, dw, Self::stepwise(self.chunks(o)));
    }

    /// [`Self::weight_grad`] step by step or chunk by chunk.
    pub(in crate::conv) fn weight_grad_by<T: Float>(
        &self,
        x: &[T],
        dy: &[T],
        dw: &mut [T],
        stepwise: bool,
    ) {
        let g = self.g;
        let kv = g.kernel_volume();
        let o = dw.len() / (g.c * kv);
        let points = self.points();
        let chunks = self.chunks(o);
        let partials = if stepwise {
            vec![self.weight_grad_stepwise(x, dy, o, chunks)]
        } else {
            group_partial_sums(
                chunks,
                points * g.c * o,
                <[Scratch<T>; 4]>::default,
                |[v, dyt, rows, stage]: &mut [Scratch<T>; 4], chunk, du| {
                    let chunk = (chunk, chunks);
                    let (images, lane, ld) = self.chunk_input_transform(x, chunk, v, [rows, stage]);
                    dyt.resize(points * o * ld);
                    vectorized(
                        #[inline(always)]
                        || {
                            for oi in 0..o {
                                let out = (dyt[oi * ld..].as_mut_ptr(), o * ld);
                                let images = images.clone();
                                // SAFETY: dyt holds `points · O · ld` values, this task's own.
                                unsafe {
                                    self.output_grad_transform(dy, oi, images, out, [rows, stage])
                                };
                            }
                        },
                    );
                    for xi in 0..points {
                        // SAFETY: du, v and dyt hold `points` blocks of the sizes used.
                        unsafe {
                            gemm_in(
                                Precision::F32,
                                (g.c, o, lane),
                                (du[xi * g.c * o..].as_mut_ptr(), o, 1),
                                (v[xi * g.c * ld..].as_ptr(), ld, 1),
                                (dyt[xi * o * ld..].as_ptr(), 1, ld),
                                true,
                            );
                        }
                    }
                },
            )
        };
        // Per block of input channels on the workers: for each channel, the partial sums in
        // group order and `Gᵀ dU G` from the [(n,) n, n, O] points to the [(3,) 3, 3, O] taps;
        // then the block's taps into dW's layout, a run of them per output channel.
        let dw_ptr = Shared(dw.as_mut_ptr());
        let first = self.first_axis();
        for_each_index(
            g.c.div_ceil(GRAD_CHANNEL_BLOCK),
            || [(); 3].map(|_| Vec::new()),
            |[sum, tmp, taps]: &mut [Vec<T>; 3], block| {
                let dw_ptr = &dw_ptr;
                let channels =
                    block * GRAD_CHANNEL_BLOCK..g.c.min((block + 1) * GRAD_CHANNEL_BLOCK);
                taps.clear();
                for c in channels.clone() {
                    sum.clear();
                    for xi in 0..points {
                        let row = (xi * g.c + c) * o;
                        let start = sum.len();
                        sum.extend_from_slice(&partials[0][row..][..o]);
                        for partial in &partials[1..] {
                            for (s, &p) in sum[start..].iter_mut().zip(&partial[row..][..o]) {
                                *s += p;
                            }
                        }
                    }
                    vectorized(
                        #[inline(always)]
                        || transform_axes(&Self::GT, sum, tmp, [points / (N * N), N, N, o], first),
                    );
                    taps.extend_from_slice(sum);
                }
                // taps: [channel, tap, O].
                let run = channels.len() * kv;
                for oi in 0..o {
                    // SAFETY: dW is [O, C, k_vol]; this task alone writes input channels
                    // `channels`, a run of `run` values in each output channel's row.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            dw_ptr.0.add((oi * g.c + channels.start) * kv),
                            run,
                        )
                    };
                    for (i, value) in dst.iter_mut().enumerate() {
                        *value = taps[i * o + oi];
                    }
                }
            },
        );
    }
}
