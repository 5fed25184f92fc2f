//! im2col and col2im on the CPU: the columns of a chunk of images (and their transpose, the
//! patches of output positions) gathered from the input, and a column gradient added back, the
//! input read and the gradient summed in the [`PhaseRows`] layout.

use std::borrow::Cow;

use ssl_linalg::{for_each_chunk_mut, for_each_index, transpose, transpose_raw};

use super::geom::{chunk_images, Geom};
use super::Shared;
use crate::util::{written_whole, Float, Scratch};

/// Into `runs`, for every output row `(od, oh)` readable at kernel offsets `(kd, kh)`, its
/// `(output row start, input row start)` in units of elements of one `[D, H, W]` volume: the
/// same for every image, so found once a column-matrix row (finding them for each image of a
/// small layer cost 8 % of the main job).
fn row_runs(g: &Geom, [kd, kh, _]: [usize; 3], runs: &mut Vec<(usize, usize)>) {
    let [_, h, w] = g.size;
    let [_, h_out, w_out] = g.out();
    runs.clear();
    for od in g.valid_outputs(0, kd) {
        let id = od * g.stride[0] + kd - g.pad[0];
        for oh in g.valid_outputs(1, kh) {
            let ih = oh * g.stride[1] + kh - g.pad[1];
            runs.push(((od * h_out + oh) * w_out, (id * h + ih) * w));
        }
    }
}

/// `dst.copy_from_slice(src)`, inlined for the short runs of small layers (a 3-wide kernel's
/// taps, a 4- or 8-wide output row): a call to `memcpy` cost more than such a copy (6 % of the
/// main job's samples).
#[inline(always)]
fn copy_run<T: Copy>(dst: &mut [T], src: &[T]) {
    #[inline(always)]
    fn fixed<T: Copy, const N: usize>(dst: &mut [T], src: &[T]) {
        let dst: &mut [T; N] = dst.try_into().expect("a run of N values");
        *dst = src[..N].try_into().expect("a run of N values");
    }
    match dst.len() {
        0 => {}
        1 => fixed::<T, 1>(dst, src),
        2 => fixed::<T, 2>(dst, src),
        3 => fixed::<T, 3>(dst, src),
        4 => fixed::<T, 4>(dst, src),
        5 => fixed::<T, 5>(dst, src),
        6 => fixed::<T, 6>(dst, src),
        7 => fixed::<T, 7>(dst, src),
        8 => fixed::<T, 8>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// `dst.fill(value)`, inlined for short runs as [`copy_run`].
#[inline(always)]
fn fill_run<T: Copy>(dst: &mut [T], value: T) {
    match dst.len() {
        len @ 0..=8 => copy_run(dst, &[value; 8][..len]),
        _ => dst.fill(value),
    }
}

/// The layout im2col reads its input in and col2im adds its gradient in: every row of `W`
/// values stored phase by phase modulo the width stride `s`, `x[w]` at `w / s` after the
/// values of the phases below `w mod s`. The values one kernel column reads along a row
/// (`w0 + j·s`, `j = 0, 1, …`) then lie next to each other, so im2col copies runs and col2im
/// adds runs instead of gathering and scattering single values (the 3D stem's forward, 7³ at
/// stride 2 on 4 volumes of 64³, went from 65–80 to 50–56 ms). At stride 1 it is the input's
/// own layout, and a 1-wide kernel keeps it too: it reads one value in `s`, and rearranging
/// the whole input for that cost more than it saved (a ResNet's 1×1 stride-2 projections).
#[derive(Debug, Clone, Copy)]
pub(super) struct PhaseRows {
    width: usize,
    /// The phases a row is stored in.
    pub(super) stride: usize,
    /// How far apart the values one kernel column reads along a row lie in this layout.
    pub(super) step: usize,
}

/// Rows per task when [`PhaseRows`] converts a whole input on Candle's workers.
const PHASE_ROWS_PER_TASK: usize = 1024;

impl PhaseRows {
    /// The layout im2col and col2im of `g` use: the input's own where they gather
    /// ([`Copying::Gather`], which needs no runs), else [`PhaseRows::runs`].
    pub(super) fn of(g: &Geom) -> Self {
        match g.copying() {
            Copying::Gather => Self {
                width: g.size[2],
                stride: 1,
                step: g.stride[2],
            },
            Copying::Runs => Self::runs(g),
        }
    }

    /// The layout in which a kernel column's values along a row lie next to each other.
    pub(super) fn runs(g: &Geom) -> Self {
        let (width, stride) = (g.size[2], g.stride[2]);
        match g.k[2] {
            1 => Self {
                width,
                stride: 1,
                step: stride,
            },
            _ => Self {
                width,
                stride,
                step: 1,
            },
        }
    }

    /// Where `x[w]` of a row lies in this layout.
    pub(super) fn offset(&self, w: usize) -> usize {
        let phase = w % self.stride;
        let before: usize = (0..phase)
            .map(|q| self.width.saturating_sub(q).div_ceil(self.stride))
            .sum();
        before + w / self.stride
    }

    /// `x` (rows of `W` values) in this layout: `x` itself at stride 1.
    pub(super) fn arrange<'a, T: Float>(&self, x: &'a [T]) -> Cow<'a, [T]> {
        if self.stride == 1 {
            return Cow::Borrowed(x);
        }
        let mut out = vec![T::from_f64(0.0); x.len()];
        let w = self.width;
        for_each_chunk_mut(
            &mut out,
            w * PHASE_ROWS_PER_TASK,
            || (),
            |_, i, rows| {
                let first = i * w * PHASE_ROWS_PER_TASK;
                for (dst, src) in rows.chunks_mut(w).zip(x[first..].chunks(w)) {
                    let mut at = 0;
                    for phase in 0..self.stride.min(w) {
                        for &v in src[phase..].iter().step_by(self.stride) {
                            dst[at] = v;
                            at += 1;
                        }
                    }
                }
            },
        );
        Cow::Owned(out)
    }

    /// `x[i] += rows[i']` for every value, `rows` in this layout and `x` in the input's.
    pub(super) fn add_into<T: Float>(&self, rows: &[T], x: &mut [T]) {
        let w = self.width;
        for (dst, src) in x.chunks_mut(w).zip(rows.chunks(w)) {
            let mut values = src.iter();
            for phase in 0..self.stride.min(w) {
                for (d, v) in dst[phase..]
                    .iter_mut()
                    .step_by(self.stride)
                    .zip(&mut values)
                {
                    *d += *v;
                }
            }
        }
    }
}

/// Rows `first_row..` of the columns `[C·k_vol, nb·S_out]` of images `n0..n0 + nb` of `x`:
/// `[C, N, D, H, W]` in its [`PhaseRows`] layout, as many as `col` holds, each `ld` ≥
/// `nb·S_out` values after the one before. Every value is written once: a copy where the
/// window lies inside the input, a zero in the padding.
pub(super) fn im2col_chunk<T: Float>(
    g: &Geom,
    x: &[T],
    images: (usize, usize),
    first_row: usize,
    col: (&mut [T], usize),
) {
    match g.copying() {
        Copying::Runs => im2col_runs(g, x, images, first_row, col),
        Copying::Gather => im2col_gather(g, x, images, first_row, col),
    }
}

/// How im2col and col2im move a row's values: in runs along the width, or value by value
/// through a table of where each output position reads ([`row_taps`]) for small images,
/// whose runs are too short to be worth a copy each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Copying {
    Runs,
    Gather,
}

/// Output widths up to which [`Copying::Gather`] is used: 8² outputs at stride 2 (the digits
/// CNN's second layer), whose runs of 3–4 values cost more to set up than to copy.
const GATHER_MAX_WIDTH: usize = 8;

impl Geom {
    pub(super) fn copying(&self) -> Copying {
        match self.out_along(2) <= GATHER_MAX_WIDTH {
            true => Copying::Gather,
            false => Copying::Runs,
        }
    }
}

/// A tap pointing into the padding: outside every volume.
const PADDING: u32 = u32::MAX;

/// Into `taps`, for column-matrix row `row` and every output position of one image, the offset
/// in its channel's `[D, H, W]` volume (in the [`PhaseRows`] layout) of the input value it
/// reads, or [`PADDING`].
fn row_taps(g: &Geom, row: usize, taps: &mut Vec<u32>) {
    let [kd, kh, kw] = g.offsets(row);
    let [_, h, w] = g.size;
    let [_, h_out, w_out] = g.out();
    let phases = PhaseRows::of(g);
    let input = |a: usize, o: usize, k: usize| o * g.stride[a] + k - g.pad[a];
    taps.clear();
    taps.resize(g.out().iter().product(), PADDING);
    let ows = g.valid_outputs(2, kw);
    if ows.is_empty() {
        return;
    }
    // Along a row the values a kernel column reads lie `step` apart in this layout.
    let run = phases.offset(input(2, ows.start, kw));
    for od in g.valid_outputs(0, kd) {
        let id = input(0, od, kd);
        for oh in g.valid_outputs(1, kh) {
            let (ih, at) = (input(1, oh, kh), (od * h_out + oh) * w_out);
            let first = (id * h + ih) * w + run;
            for (j, tap) in taps[at..][ows.clone()].iter_mut().enumerate() {
                *tap =
                    u32::try_from(first + j * phases.step).expect("a volume of under 4 G values");
            }
        }
    }
}

/// [`im2col_chunk`] as [`Copying::Gather`]: each row's taps found once, then read for every
/// image, a padding tap as zero.
fn im2col_gather<T: Float>(
    g: &Geom,
    x: &[T],
    (n0, nb): (usize, usize),
    first_row: usize,
    (col, ld): (&mut [T], usize),
) {
    let zero = T::from_f64(0.0);
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let mut taps = Vec::new();
    for (i, dst_row) in col.chunks_mut(ld).enumerate() {
        let row = first_row + i;
        let c = row / g.kernel_volume();
        row_taps(g, row, &mut taps);
        for (j, dst) in dst_row[..nb * per_image].chunks_mut(per_image).enumerate() {
            let src = &x[(c * g.n + n0 + j) * volume..][..volume];
            for (d, &t) in dst.iter_mut().zip(&taps) {
                *d = src.get(t as usize).copied().unwrap_or(zero);
            }
        }
    }
}

/// [`im2col_chunk`] as [`Copying::Runs`]: a row's runs of output positions along the width
/// copied a run at a time, the padding around them zeroed.
fn im2col_runs<T: Float>(
    g: &Geom,
    x: &[T],
    (n0, nb): (usize, usize),
    first_row: usize,
    (col, ld): (&mut [T], usize),
) {
    let zero = T::from_f64(0.0);
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let w_out = g.out()[2];
    let phases = PhaseRows::of(g);
    let mut runs = Vec::new();
    for (i, dst_row) in col.chunks_mut(ld).enumerate() {
        let dst_row = &mut dst_row[..nb * per_image];
        let row = first_row + i;
        let c = row / g.kernel_volume();
        let offsets = g.offsets(row);
        let kw = offsets[2];
        let ows = g.valid_outputs(2, kw);
        let iw0 = (ows.start * g.stride[2] + kw).checked_sub(g.pad[2]);
        let Some(iw0) = iw0.filter(|_| !ows.is_empty()) else {
            dst_row.fill(zero);
            continue;
        };
        let run = phases.offset(iw0);
        row_runs(g, offsets, &mut runs);
        for (j, dst) in dst_row.chunks_mut(per_image).enumerate() {
            let src = &x[(c * g.n + n0 + j) * volume..][..volume];
            // Output rows before `next` are written; rows the window misses are zero.
            let mut next = 0;
            for &(o, i) in &runs {
                fill_run(&mut dst[next..o + ows.start], zero);
                let drow = &mut dst[o..o + w_out];
                let values = &src[i + run..];
                match phases.step {
                    1 => copy_run(&mut drow[ows.clone()], &values[..ows.len()]),
                    step => {
                        for (d, &v) in drow[ows.clone()]
                            .iter_mut()
                            .zip(values.iter().step_by(step))
                        {
                            *d = v;
                        }
                    }
                }
                fill_run(&mut drow[ows.end..], zero);
                next = o + w_out;
            }
            dst[next..].fill(zero);
        }
    }
}

/// Adds the column gradient `dcol`: `[C·k_vol, nb·S_out]` of images `n0..n0 + nb` into their
/// volumes of `dx`: `[C, N, D, H, W]`, summing them first in `acc` in the [`PhaseRows`]
/// layout.
///
/// # Safety
/// `dx` points to `C·N·D·H·W` values, and no other thread touches images `n0..n0 + nb`.
pub(super) unsafe fn col2im_chunk<T: Float>(
    g: &Geom,
    dcol: &[T],
    (n0, nb): (usize, usize),
    acc: &mut Scratch<T>,
    dx: *mut T,
) {
    let volume = g.size.iter().product::<usize>();
    let phases = PhaseRows::of(g);
    acc.resize(g.c * nb * volume);
    acc.fill(T::from_f64(0.0));
    let sums = (&mut acc[..], nb);
    match g.copying() {
        Copying::Runs => col2im_runs(g, dcol, sums),
        Copying::Gather => col2im_gather(g, dcol, sums),
    }
    for c in 0..g.c {
        // SAFETY: these volumes lie inside `dx` and belong to this chunk alone.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(dx.add((c * g.n + n0) * volume), nb * volume) };
        phases.add_into(&acc[c * nb * volume..][..nb * volume], dst);
    }
}

/// Adds the column gradient `dcol` of `nb` images into `acc`: `[C, nb, D, H, W]` in the
/// [`PhaseRows`] layout, a run along the width at a time ([`Copying::Runs`]).
fn col2im_runs<T: Float>(g: &Geom, dcol: &[T], (acc, nb): (&mut [T], usize)) {
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let phases = PhaseRows::of(g);
    let mut runs = Vec::new();
    for (row, src_row) in dcol.chunks(nb * per_image).enumerate() {
        let c = row / g.kernel_volume();
        let offsets = g.offsets(row);
        let kw = offsets[2];
        let ows = g.valid_outputs(2, kw);
        let Some(iw0) = (ows.start * g.stride[2] + kw).checked_sub(g.pad[2]) else {
            continue;
        };
        let run = phases.offset(iw0);
        row_runs(g, offsets, &mut runs);
        for (j, src) in src_row.chunks(per_image).enumerate() {
            let dst = &mut acc[(c * nb + j) * volume..][..volume];
            for &(o, i) in &runs {
                let values = &src[o + ows.start..o + ows.end];
                match phases.step {
                    1 => {
                        for (d, &v) in dst[i + run..][..ows.len()].iter_mut().zip(values) {
                            *d += v;
                        }
                    }
                    step => {
                        for (d, &v) in dst[i + run..].iter_mut().step_by(step).zip(values) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// [`col2im_runs`] as [`Copying::Gather`]: each row's taps found once, then every image's
/// values added through them.
fn col2im_gather<T: Float>(g: &Geom, dcol: &[T], (acc, nb): (&mut [T], usize)) {
    let volume = g.size.iter().product::<usize>();
    let per_image = g.out().iter().product::<usize>();
    let mut taps = Vec::new();
    for (row, src_row) in dcol.chunks(nb * per_image).enumerate() {
        let c = row / g.kernel_volume();
        row_taps(g, row, &mut taps);
        for (j, src) in src_row.chunks(per_image).enumerate() {
            let dst = &mut acc[(c * nb + j) * volume..][..volume];
            for (&v, &t) in src.iter().zip(&taps) {
                if let Some(d) = dst.get_mut(t as usize) {
                    *d += v;
                }
            }
        }
    }
}

/// The columns `[C·k_vol, width]` of chunk `chunk` of `chunks` of `x` (in its [`PhaseRows`]
/// layout) into `col`, `width` the chunk's images times `S_out`; returns its first image and
/// `width`.
pub(super) fn chunk_columns<T: Float>(
    g: &Geom,
    x: &[T],
    (chunk, chunks): (usize, usize),
    col: &mut Scratch<T>,
) -> (usize, usize) {
    let images = chunk_images(g.n, chunks, chunk);
    let width = images.len() * g.out().iter().product::<usize>();
    col.resize(g.col_shape().0 * width);
    im2col_chunk(g, x, (images.start, images.len()), 0, (col, width));
    (images.start, width)
}

/// Positions per task when [`channels_last`] transposes an input on Candle's workers.
const CHANNELS_LAST_POSITIONS: usize = 256;

/// `x`: `[C, N, D, H, W]` as `[N, D, H, W, C]`, where [`im2row`] reads a window's row across
/// every channel as one run (`x` itself for one channel).
pub(super) fn channels_last<'a, T: Float>(g: &Geom, x: &'a [T]) -> Cow<'a, [T]> {
    if g.c == 1 {
        return Cow::Borrowed(x);
    }
    let positions = x.len() / g.c;
    let write = |out: &mut [T]| {
        for_each_chunk_mut(
            out,
            CHANNELS_LAST_POSITIONS * g.c,
            || (),
            |_, block, dst| {
                let first = block * CHANNELS_LAST_POSITIONS;
                let count = dst.len() / g.c;
                transpose(&x[first..], positions, (g.c, count), dst, g.c);
            },
        )
    };
    // SAFETY: each block's transpose writes all of it: `count` positions of every channel.
    Cow::Owned(unsafe { written_whole(x.len(), write) })
}

/// The window of output position `p` (flat in one image's `S_out`) on a channels-last image:
/// which of its kernel columns lie inside the input's width, and where each of its rows starts.
struct Window<'a> {
    g: &'a Geom,
    /// Kernel columns `first..end` read inside the row; the rest lie in the padding.
    first: usize,
    end: usize,
    /// The input indices of kernel offset 0 along depth and height (below 0 in the padding),
    /// and the first column read inside the row.
    d0: isize,
    h0: isize,
    iw: usize,
}

impl<'a> Window<'a> {
    fn of(g: &'a Geom, p: usize) -> Self {
        let width = g.size[2];
        let [_, h_out, w_out] = g.out();
        let kw = g.k[2];
        let at = [p / (h_out * w_out), (p / w_out) % h_out, p % w_out];
        let [d0, h0, w0]: [isize; 3] =
            std::array::from_fn(|a| (at[a] * g.stride[a]) as isize - g.pad[a] as isize);
        let first = usize::try_from(-w0).unwrap_or(0).min(kw);
        let end = (width as isize - w0).clamp(first as isize, kw as isize) as usize;
        let iw = (w0 + first as isize) as usize;
        Self {
            g,
            first,
            end,
            d0,
            h0,
            iw,
        }
    }

    /// Per kernel row `(kd, kh)` in order: the offset in the image of its first value read, or
    /// `None` where the row lies in the padding.
    fn rows(&self) -> impl Iterator<Item = Option<usize>> + '_ {
        let [depth, height, width] = self.g.size;
        let [kd, kh, _] = self.g.k;
        let inside = |i: isize, n: usize| usize::try_from(i).ok().filter(|&i| i < n);
        (0..kd * kh).map(move |kdh| {
            let id = inside(self.d0 + (kdh / kh) as isize, depth)?;
            let ih = inside(self.h0 + (kdh % kh) as isize, height)?;
            Some(((id * height + ih) * width + self.iw) * self.g.c)
        })
    }
}

/// The patches of output positions `positions` (flat over the batch's `N·S_out`) of `x`:
/// `[N, D, H, W, C]` ([`channels_last`]), one row of `k_vol·C` values per position, ordered
/// kernel offset by kernel offset and channel by channel within one, `ld` values apart: the
/// transposed columns of im2col with their rows reordered. A window's row across every channel
/// is one run of `k_w·C` values. Every value is written once: a copy, or a zero in the padding.
pub(super) fn im2row<T: Float>(
    g: &Geom,
    x: &[T],
    positions: std::ops::Range<usize>,
    (patches, ld): (&mut [T], usize),
) {
    let zero = T::from_f64(0.0);
    let channels = g.c;
    let volume = g.size.iter().product::<usize>() * channels;
    let per_image = g.out().iter().product::<usize>();
    let [kd, kh, kw] = g.k;
    for (q, patch) in positions.zip(patches.chunks_mut(ld)) {
        let image = &x[q / per_image * volume..][..volume];
        let window = Window::of(g, q % per_image);
        let (values, after) = (window.first * channels, window.end * channels);
        let patch = &mut patch[..kd * kh * kw * channels];
        for (run, row) in patch.chunks_mut(kw * channels).zip(window.rows()) {
            let Some(row) = row else {
                fill_run(run, zero);
                continue;
            };
            fill_run(&mut run[..values], zero);
            copy_run(&mut run[values..after], &image[row..][..after - values]);
            fill_run(&mut run[after..], zero);
        }
    }
}

/// `x`: `[N, D, H, W, C]` back to `[C, N, D, H, W]` ([`channels_last`]'s inverse) into `out`,
/// every value of which it writes.
pub(super) fn channels_first<T: Float>(g: &Geom, x: &[T], out: &mut [T]) {
    if g.c == 1 {
        return out.copy_from_slice(x);
    }
    let positions = x.len() / g.c;
    let blocks = positions.div_ceil(CHANNELS_LAST_POSITIONS);
    let dst = Shared(out.as_mut_ptr());
    for_each_index(
        blocks,
        || (),
        |_, block| {
            let dst = &dst;
            let first = block * CHANNELS_LAST_POSITIONS;
            let count = CHANNELS_LAST_POSITIONS.min(positions - first);
            let src = &x[first * g.c..][..count * g.c];
            // SAFETY: positions `first..first + count` of every channel belong to this block.
            unsafe { transpose_raw(src.as_ptr(), g.c, (count, g.c), dst.0.add(first), positions) };
        },
    );
}

/// Adds the patch rows `patches` (`[P, k_vol·C]` as [`im2row`] makes them, `ld` values apart)
/// of positions `positions` (flat over the batch's `N·S_out`) back into `dx`: the
/// channels-last volumes of the images those positions lie in, from the first one's on. Each
/// window's row across every channel is added as one run of `k_w·C` values.
pub(super) fn row2im<T: Float>(
    g: &Geom,
    (patches, ld): (&[T], usize),
    positions: std::ops::Range<usize>,
    dx: &mut [T],
) {
    let channels = g.c;
    let volume = g.size.iter().product::<usize>() * channels;
    let per_image = g.out().iter().product::<usize>();
    let [kd, kh, kw] = g.k;
    let first_image = positions.start / per_image;
    for (q, patch) in positions.zip(patches.chunks(ld)) {
        let image = &mut dx[(q / per_image - first_image) * volume..][..volume];
        let window = Window::of(g, q % per_image);
        let patch = &patch[..kd * kh * kw * channels];
        for (run, row) in patch.chunks(kw * channels).zip(window.rows()) {
            let Some(row) = row else {
                continue;
            };
            let values = &run[window.first * channels..window.end * channels];
            for (d, &v) in image[row..][..values.len()].iter_mut().zip(values) {
                *d += v;
            }
        }
    }
}
