//! The forward of Winograd's algorithm: per chunk of images, the input transform, one GEMM per
//! transform point and the output transform; or, of few chunks, each step shared out.

use ssl_linalg::bf16_gemm::gemm_in;
use ssl_linalg::for_each_index;

use super::super::Shared;
use super::chunks::for_each_step_channel;
use super::transforms::Transforms;
use super::Minimal;
use crate::autocast::Precision;
use crate::util::{vectorized, Float, Scratch};

impl<const M: usize, const N: usize> Minimal<M, N>
where
    Self: Transforms<M, N>,
{
    /// The convolution of `x`: `[C, N, D, H, W]` with `w`: `[O, C·k_vol]` into `y`:
    /// `[O, N·S_out]`, every value written, on Candle's workers: chunk by chunk of images, or
    /// step by step of few chunks ([`Self::stepwise`]).
    pub fn forward<T: Float>(&self, x: &[T], w: &[T], y: &mut [T]) {
        let o = w.len() / (self.g.c * self.g.kernel_volume());
        self.forward_by(x, w, y, Self::stepwise(self.chunks(o)));
    }

    /// [`Self::forward`] step by step ([`Self::forward_stepwise`]) or chunk by chunk.
    pub(in crate::conv) fn forward_by<T: Float>(
        &self,
        x: &[T],
        w: &[T],
        y: &mut [T],
        stepwise: bool,
    ) {
        let g = self.g;
        let o = w.len() / (g.c * g.kernel_volume());
        let points = self.points();
        let u = self.kernel_transform(w);
        let chunks = self.chunks(o);
        if stepwise {
            return self.forward_stepwise(x, &u, o, chunks, y);
        }
        let out = Shared(y.as_mut_ptr());
        for_each_index(
            chunks,
            <[Scratch<T>; 4]>::default,
            |[v, m, rows, stage]: &mut [Scratch<T>; 4], chunk| {
                let chunk = (chunk, chunks);
                let (images, lane, ld) = self.chunk_input_transform(x, chunk, v, [rows, stage]);
                m.resize(points * o * lane);
                for xi in 0..points {
                    // SAFETY: m, u and v hold `points` blocks of the sizes read and written.
                    unsafe {
                        gemm_in(
                            Precision::F32,
                            (o, lane, g.c),
                            (m[xi * o * lane..].as_mut_ptr(), lane, 1),
                            (u[xi * o * g.c..].as_ptr(), g.c, 1),
                            (v[xi * g.c * ld..].as_ptr(), ld, 1),
                            false,
                        );
                    }
                }
                let out = &out;
                vectorized(
                    #[inline(always)]
                    || {
                        for oi in 0..o {
                            // SAFETY: `y` is [O, N·S_out]; this chunk writes its own images.
                            let images = images.clone();
                            unsafe { self.output_transform(m, o, oi, images, out.0, stage) };
                        }
                    },
                );
            },
        );
    }

    /// [`Self::forward`] of few chunks, each step shared among the workers: the input transform
    /// a block of [`STEP_CHANNELS`] input channels of a chunk a task, then the products a point
    /// of a chunk a task, then the output transform a block of output channels of a chunk a
    /// task. The same values as chunk by chunk.
    ///
    /// [`STEP_CHANNELS`]: super::chunks::STEP_CHANNELS
    fn forward_stepwise<T: Float>(&self, x: &[T], u: &[T], o: usize, chunks: usize, y: &mut [T]) {
        let (c, points) = (self.g.c, self.points());
        let (layout, v, mut m) = self.stepwise_inputs(x, chunks, |lane, _| points * o * lane);
        let m_ptr = Shared(m.as_mut_ptr());
        for_each_index(
            chunks * points,
            || (),
            |_, task| {
                let m_ptr = &m_ptr;
                let (step, xi) = (&layout[task / points], task % points);
                // SAFETY: the chunk's M and V, from `out_at` and `v_at`, hold `points` blocks of
                // the sizes written and read; this task alone writes block ξ of its M.
                unsafe {
                    gemm_in(
                        Precision::F32,
                        (o, step.lane, c),
                        (m_ptr.0.add(step.out_at + xi * o * step.lane), step.lane, 1),
                        (u[xi * o * c..].as_ptr(), c, 1),
                        (v[step.v_at + xi * c * step.ld..].as_ptr(), step.ld, 1),
                        false,
                    );
                }
            },
        );
        let out = Shared(y.as_mut_ptr());
        for_each_step_channel(
            &layout,
            o,
            Scratch::default,
            #[inline(always)]
            |tmp, step, oi| {
                let out = &out;
                let m = &m[step.out_at..];
                // SAFETY: `y` is [O, N·S_out]; this task alone writes channel oi of the chunk's
                // images.
                unsafe { self.output_transform(m, o, oi, step.images.clone(), out.0, tmp) };
            },
        );
    }
}
