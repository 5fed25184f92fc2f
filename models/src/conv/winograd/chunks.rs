//! How a call's work is laid out for the workers: the input transform of a chunk of images, and
//! the chunks and channel blocks of the step-by-step schedule of few chunks.

use std::ops::Range;

use ssl_linalg::for_each_index;

use super::super::geom::chunk_images;
use super::super::Shared;
use super::transforms::Transforms;
use super::Minimal;
use crate::util::{row_stride, vectorized, Float, Scratch};

/// Input or output channels per task of the transforms shared out step by step.
pub(super) const STEP_CHANNELS: usize = 16;

impl<const M: usize, const N: usize> Minimal<M, N>
where
    Self: Transforms<M, N>,
{
    /// `V` of every input channel of chunk `chunk` of `chunks` of `x` into `v`, as
    /// [`Self::input_transform`] lays it out; returns the chunk's images, its tiles `T` and
    /// `V`'s row stride `ld`.
    pub(super) fn chunk_input_transform<T: Float>(
        &self,
        x: &[T],
        (chunk, chunks): (usize, usize),
        v: &mut Scratch<T>,
        [rows, stage]: [&mut Scratch<T>; 2],
    ) -> (Range<usize>, usize, usize) {
        let images = chunk_images(self.g.n, chunks, chunk);
        let lane = images.len() * self.tiles_per_image();
        let ld = row_stride::<T>(lane);
        v.resize(self.points() * self.g.c * ld);
        vectorized(
            #[inline(always)]
            || {
                for c in 0..self.g.c {
                    // SAFETY: v holds `points·C·ld` values, and this task alone writes them.
                    unsafe {
                        self.input_transform(
                            x,
                            c,
                            images.clone(),
                            (v.as_mut_ptr(), ld),
                            [rows, stage],
                        )
                    };
                }
            },
        );
        (images, lane, ld)
    }

    /// The first step of [`Self::forward_stepwise`] and [`Self::weight_grad_stepwise`]: their
    /// chunks laid out one after another, every chunk's `V` of `x` in one buffer (a block of
    /// [`STEP_CHANNELS`] input channels of a chunk a task), and room for every chunk's
    /// `out_values(T, ld)` products or transformed gradients in another.
    pub(super) fn stepwise_inputs<T: Float>(
        &self,
        x: &[T],
        chunks: usize,
        out_values: impl Fn(usize, usize) -> usize,
    ) -> (Vec<StepChunk>, Scratch<T>, Scratch<T>) {
        let (mut v_len, mut out_len) = (0, 0);
        let layout: Vec<_> = (0..chunks)
            .map(|chunk| {
                let images = chunk_images(self.g.n, chunks, chunk);
                let lane = images.len() * self.tiles_per_image();
                let ld = row_stride::<T>(lane);
                let step = StepChunk {
                    images,
                    lane,
                    ld,
                    v_at: v_len,
                    out_at: out_len,
                };
                v_len += self.points() * self.g.c * ld;
                out_len += out_values(lane, ld);
                step
            })
            .collect();
        let (mut v, mut out) = (Scratch::<T>::default(), Scratch::<T>::default());
        v.resize(v_len);
        out.resize(out_len);
        let v_ptr = Shared(v.as_mut_ptr());
        for_each_step_channel(
            &layout,
            self.g.c,
            <[Scratch<T>; 2]>::default,
            #[inline(always)]
            |[rows, stage]: &mut [Scratch<T>; 2], step, ci| {
                let v_ptr = &v_ptr;
                // SAFETY: the chunk's V, `points·C·ld` values from `v_at`, lies in `v`; this task
                // alone writes channel ci's rows of it.
                unsafe {
                    let v = (v_ptr.0.add(step.v_at), step.ld);
                    self.input_transform(x, ci, step.images.clone(), v, [rows, stage]);
                }
            },
        );
        (layout, v, out)
    }
}

/// `f(scratch, chunk, channel)` for every chunk of `layout` and each of `channels` channels, a
/// block of [`STEP_CHANNELS`] channels of a chunk a task on Candle's workers, vectorised: the
/// transforms of [`Minimal::forward_stepwise`] and [`Minimal::weight_grad_stepwise`].
#[inline(always)]
pub(super) fn for_each_step_channel<S>(
    layout: &[StepChunk],
    channels: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &StepChunk, usize) + Sync,
) {
    let blocks = channels.div_ceil(STEP_CHANNELS);
    for_each_index(layout.len() * blocks, init, |scratch, task| {
        let (step, block) = (&layout[task / blocks], task % blocks);
        vectorized(
            #[inline(always)]
            || {
                for channel in block * STEP_CHANNELS..channels.min((block + 1) * STEP_CHANNELS) {
                    f(scratch, step, channel);
                }
            },
        );
    });
}

/// A chunk of images of [`Minimal::forward_stepwise`] or [`Minimal::weight_grad_stepwise`]:
/// its tiles `T` (`lane`), its `V`'s row stride, and where its `V` and its products (or
/// transformed gradients) begin in the buffers of every chunk.
pub(super) struct StepChunk {
    pub(super) images: Range<usize>,
    pub(super) lane: usize,
    pub(super) ld: usize,
    pub(super) v_at: usize,
    pub(super) out_at: usize,
}
