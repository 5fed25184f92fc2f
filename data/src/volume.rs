//! IConE's 3D augmentations (Appendix A.2; `docs/spec/data.md` §4) for volumes `[C, D, H, W]`:
//! random resized crop with trilinear resampling → random flips per axis → random 90°
//! rotation in a random plane → intensity shift → contrast → Gaussian noise → average-pool
//! blur. Where the paper leaves a choice open, the spec's assumption is taken (crop scale is
//! a fraction of the volume; `k ∈ {1, 2, 3}`; shift and contrast always applied; contrast
//! about 0; pooling counts the zero padding; no clipping or normalisation).
//!
//! As for 2D images, [`VolumeAugment::sample`] draws a view's [`VolumeViewParams`] and
//! [`VolumeAugment::apply_params`] applies them, so the ops can be checked against PyTorch's
//! `F.interpolate(mode="trilinear")`, `torch.rot90` and `F.avg_pool3d`.

use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::augment::ViewTransform;

/// The 3D view type; defaults are IConE's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VolumeAugment {
    /// Range of the crop's volume fraction (each side scales by its cube root).
    pub crop_scale: (f64, f64),
    /// Flip probability per spatial axis.
    pub flip: f64,
    /// Probability of a 90° rotation (k ∈ {1, 2, 3}) in a random plane.
    pub rotate: f64,
    /// Additive intensity offset drawn from `U(−shift, shift)`.
    pub shift: f32,
    /// Multiplicative contrast factor range.
    pub contrast: (f32, f32),
    /// Probability of additive Gaussian noise.
    pub noise: f64,
    /// Standard deviation of that noise.
    pub noise_std: f32,
    /// Probability of the 3 × 3 × 3 average-pool blur.
    pub blur: f64,
}

impl Default for VolumeAugment {
    fn default() -> Self {
        Self {
            crop_scale: (0.5, 1.0),
            flip: 0.5,
            rotate: 0.5,
            shift: 0.1,
            contrast: (0.8, 1.2),
            noise: 0.3,
            noise_std: 0.1,
            blur: 0.3,
        }
    }
}

/// Everything random about one 3D view.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeViewParams {
    /// Crop corner `(z, y, x)` and extent `(d, h, w)`.
    pub crop_corner: [usize; 3],
    pub crop_size: [usize; 3],
    /// Flip along D, H, W.
    pub flips: [bool; 3],
    /// Rotation plane (two spatial axes, 0 = D) and quarter turns, as `torch.rot90(k, dims)`.
    pub rotation: Option<([usize; 2], usize)>,
    pub shift: f32,
    pub contrast: f32,
    /// Seed of the per-voxel noise when noise is added.
    pub noise_seed: Option<u64>,
    pub blur: bool,
}

fn volume_dims(shape: &[usize]) -> (usize, [usize; 3]) {
    match *shape {
        [c, d, h, w] => (c, [d, h, w]),
        _ => panic!("3D augmentations need [C, D, H, W] samples, got shape {shape:?}"),
    }
}

impl VolumeAugment {
    /// Draws one view's parameters for a volume of spatial extent `size`, in a fixed order:
    /// scale, corner (z, y, x), flips (D, H, W), rotation (apply?, plane, k), shift, contrast,
    /// noise (apply?, seed), blur.
    pub fn sample(&self, size: [usize; 3], rng: &mut ChaCha8Rng) -> VolumeViewParams {
        let scale: f64 = rng.random_range(self.crop_scale.0..=self.crop_scale.1);
        let side = scale.cbrt();
        let crop_size = size.map(|n| ((n as f64 * side).round() as usize).clamp(1, n));
        let mut crop_corner = [0; 3];
        for a in 0..3 {
            crop_corner[a] = rng.random_range(0..=size[a] - crop_size[a]);
        }
        let flips = [0; 3].map(|_| rng.random::<f64>() < self.flip);
        let rotation = if rng.random::<f64>() < self.rotate {
            let planes = [[0, 1], [0, 2], [1, 2]];
            let plane = planes[rng.random_range(0..3)];
            let k = rng.random_range(1..=3);
            // A quarter turn of a non-square plane would change the shape: only half turns.
            let k = if size[plane[0]] == size[plane[1]] {
                k
            } else {
                2
            };
            Some((plane, k))
        } else {
            None
        };
        let shift = rng.random_range(-self.shift..=self.shift);
        let contrast = rng.random_range(self.contrast.0..=self.contrast.1);
        let noise_seed = (rng.random::<f64>() < self.noise).then(|| rng.random());
        let blur = rng.random::<f64>() < self.blur;
        VolumeViewParams {
            crop_corner,
            crop_size,
            flips,
            rotation,
            shift,
            contrast,
            noise_seed,
            blur,
        }
    }

    /// Applies `params` to `input` (`[C, D, H, W]`), writing a view of the same shape to `out`.
    pub fn apply_params(
        &self,
        input: &[f32],
        shape: &[usize],
        params: &VolumeViewParams,
        out: &mut [f32],
    ) {
        let (_, size) = volume_dims(shape);
        let n: usize = size.iter().product();
        let mut scratch = vec![0f32; n];
        let orientation = Orientation::new(size, params.flips, params.rotation);
        for (src, dst) in input.chunks(n).zip(out.chunks_mut(n)) {
            resized_crop_trilinear(src, size, params.crop_corner, params.crop_size, dst);
            let affine = |x: f32| params.contrast * (x + params.shift);
            if orientation.is_identity() {
                dst.iter_mut().for_each(|x| *x = affine(*x));
            } else {
                scratch.copy_from_slice(dst);
                orientation.gather(&scratch, dst, affine);
            }
        }
        if let Some(seed) = params.noise_seed {
            let normal = Normal::new(0.0, self.noise_std).expect("finite std");
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for x in out.iter_mut() {
                *x += normal.sample(&mut rng);
            }
        }
        if params.blur {
            for dst in out.chunks_mut(n) {
                average_pool3(dst, size, &mut scratch);
            }
        }
    }

    /// This view type for every view of samples of `shape`, checked.
    pub fn view_types(&self, shape: &[usize]) -> anyhow::Result<crate::ViewTypes> {
        self.validate(shape)?;
        Ok(crate::ViewTypes::single(std::sync::Arc::new(self.clone())))
    }

    /// Checks the ranges.
    pub fn validate(&self, shape: &[usize]) -> anyhow::Result<()> {
        use anyhow::bail;
        if shape.len() != 4 {
            bail!("3D augmentations need [C, D, H, W] samples, got shape {shape:?}");
        }
        let (lo, hi) = self.crop_scale;
        if !(0.0 < lo && lo <= hi && hi <= 1.0) {
            bail!("crop_scale must satisfy 0 < min ≤ max ≤ 1, got ({lo}, {hi})");
        }
        for (name, p) in [
            ("flip", self.flip),
            ("rotate", self.rotate),
            ("noise", self.noise),
            ("blur", self.blur),
        ] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{name} is a probability in [0, 1], got {p}");
            }
        }
        if !(self.shift >= 0.0 && self.noise_std >= 0.0) {
            bail!("shift and noise_std must be ≥ 0");
        }
        if self.contrast.0.is_nan() || self.contrast.0 > self.contrast.1 {
            bail!(
                "contrast must be a range (min ≤ max), got {:?}",
                self.contrast
            );
        }
        Ok(())
    }
}

impl ViewTransform for VolumeAugment {
    fn apply(&self, input: &[f32], shape: &[usize], out: &mut [f32], rng: &mut ChaCha8Rng) {
        let (_, size) = volume_dims(shape);
        let params = self.sample(size, rng);
        self.apply_params(input, shape, &params, out);
    }
}

/// Source index pairs and weights of `F.interpolate(mode="trilinear", align_corners=False)`
/// along one axis from `n_in` to `n_out`: `src = max((o + ½)·n_in/n_out − ½, 0)`.
fn linear_taps(n_in: usize, n_out: usize) -> Vec<(usize, usize, f32)> {
    let scale = n_in as f32 / n_out as f32;
    (0..n_out)
        .map(|o| {
            let src = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
            let i0 = (src.floor() as usize).min(n_in - 1);
            let i1 = (i0 + 1).min(n_in - 1);
            (i0, i1, src - i0 as f32)
        })
        .collect()
}

/// Crops `[corner, corner + crop)` of one `size` volume and resizes it trilinearly back to
/// `size`, one axis at a time (W, then H, then D).
fn resized_crop_trilinear(
    src: &[f32],
    size: [usize; 3],
    corner: [usize; 3],
    crop: [usize; 3],
    out: &mut [f32],
) {
    let [d, h, w] = size;
    let [cd, ch, cw] = crop;
    let taps = [linear_taps(cd, d), linear_taps(ch, h), linear_taps(cw, w)];
    // Along W: [cd, ch, cw] → [cd, ch, w].
    let mut a = vec![0f32; cd * ch * w];
    for z in 0..cd {
        for y in 0..ch {
            let row = &src[((corner[0] + z) * h + corner[1] + y) * w + corner[2]..][..cw];
            let dst = &mut a[(z * ch + y) * w..][..w];
            for (o, &(i0, i1, t)) in dst.iter_mut().zip(&taps[2]) {
                *o = (1.0 - t) * row[i0] + t * row[i1];
            }
        }
    }
    // Along H: → [cd, h, w].
    let mut b = vec![0f32; cd * h * w];
    for z in 0..cd {
        for (y, &(i0, i1, t)) in taps[1].iter().enumerate() {
            let (r0, r1) = (&a[(z * ch + i0) * w..][..w], &a[(z * ch + i1) * w..][..w]);
            for ((o, &p), &q) in b[(z * h + y) * w..][..w].iter_mut().zip(r0).zip(r1) {
                *o = (1.0 - t) * p + t * q;
            }
        }
    }
    // Along D: → [d, h, w].
    let slab = h * w;
    for (z, &(i0, i1, t)) in taps[0].iter().enumerate() {
        let (s0, s1) = (&b[i0 * slab..][..slab], &b[i1 * slab..][..slab]);
        for ((o, &p), &q) in out[z * slab..][..slab].iter_mut().zip(s0).zip(s1) {
            *o = (1.0 - t) * p + t * q;
        }
    }
}

/// The flips and quarter turns of one view composed into a single gather: output voxel
/// `(z, y, x)` reads source voxel `base + z·step[0] + y·step[1] + x·step[2]`, since flips and
/// rotations map coordinates affinely.
struct Orientation {
    size: [usize; 3],
    base: isize,
    step: [isize; 3],
}

impl Orientation {
    /// The source coordinate of output coordinate `c` after `flips` (along D, H, W) and then
    /// `rotation` (`k` quarter turns in `plane`, as `torch.rot90(x, k, dims=plane)`).
    fn source(
        c: [isize; 3],
        size: [usize; 3],
        flips: [bool; 3],
        rotation: Option<([usize; 2], usize)>,
    ) -> [isize; 3] {
        let last = size.map(|n| n as isize - 1);
        let mut s = c;
        match rotation {
            // A half turn flips both axes, whatever their extents.
            Some(([a, b], 2)) => {
                s[a] = last[a] - s[a];
                s[b] = last[b] - s[b];
            }
            // Quarter turns (square planes only):
            // out[…, i_a, …, i_b, …] = x[…, i_b, …, n − 1 − i_a, …].
            Some(([a, b], k)) => {
                for _ in 0..k {
                    let t = s;
                    s[a] = t[b];
                    s[b] = last[b] - t[a];
                }
            }
            None => {}
        }
        for axis in 0..3 {
            if flips[axis] {
                s[axis] = last[axis] - s[axis];
            }
        }
        s
    }

    fn new(size: [usize; 3], flips: [bool; 3], rotation: Option<([usize; 2], usize)>) -> Self {
        let linear = |s: [isize; 3]| (s[0] * size[1] as isize + s[1]) * size[2] as isize + s[2];
        let base = linear(Self::source([0; 3], size, flips, rotation));
        let step = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
            .map(|unit| linear(Self::source(unit, size, flips, rotation)) - base);
        Self { size, base, step }
    }

    fn is_identity(&self) -> bool {
        let [_, h, w] = self.size.map(|n| n as isize);
        self.base == 0 && self.step == [h * w, w, 1]
    }

    /// `out[z, y, x] = f(src[source(z, y, x)])`.
    fn gather(&self, src: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
        let [_, h, w] = self.size;
        for (z, slab) in out.chunks_mut(h * w).enumerate() {
            for (y, row) in slab.chunks_mut(w).enumerate() {
                let start = self.base + z as isize * self.step[0] + y as isize * self.step[1];
                if self.step[2] == 1 {
                    let run = &src[start as usize..][..w];
                    row.iter_mut().zip(run).for_each(|(o, &v)| *o = f(v));
                } else {
                    for (x, o) in row.iter_mut().enumerate() {
                        *o = f(src[(start + x as isize * self.step[2]) as usize]);
                    }
                }
            }
        }
    }
}

/// `F.avg_pool3d(kernel 3, stride 1, padding 1, count_include_pad=True)` on one volume: the
/// box sum of each 3 × 3 × 3 neighbourhood (zeros outside) over 27, separably (W, H, D).
fn average_pool3(x: &mut [f32], size: [usize; 3], scratch: &mut [f32]) {
    let [_, h, w] = size;
    for (row, sums) in x.chunks(w).zip(scratch.chunks_mut(w)) {
        for (i, s) in sums.iter_mut().enumerate() {
            *s = row[i];
            if i > 0 {
                *s += row[i - 1];
            }
            if i + 1 < w {
                *s += row[i + 1];
            }
        }
    }
    box_sum_of_blocks(scratch, x, w, h);
    box_sum_of_blocks(x, scratch, h * w, size[0]);
    for (v, &s) in x.iter_mut().zip(scratch.iter()) {
        *v = s / 27.0;
    }
}

/// `out[i] = x[i] + x[i − 1] + x[i + 1]` over consecutive blocks of `len` values, in groups of
/// `count` blocks (neighbours outside a group count as zero).
fn box_sum_of_blocks(x: &[f32], out: &mut [f32], len: usize, count: usize) {
    for (group_in, group_out) in x.chunks(len * count).zip(out.chunks_mut(len * count)) {
        for (i, dst) in group_out.chunks_mut(len).enumerate() {
            dst.copy_from_slice(&group_in[i * len..][..len]);
            if i > 0 {
                let prev = &group_in[(i - 1) * len..][..len];
                dst.iter_mut().zip(prev).for_each(|(d, &p)| *d += p);
            }
            if i + 1 < count {
                let next = &group_in[(i + 1) * len..][..len];
                dst.iter_mut().zip(next).for_each(|(d, &p)| *d += p);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crop_sides_scale_with_the_cube_root_of_the_volume_fraction() {
        let aug = VolumeAugment::default();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for _ in 0..500 {
            let p = aug.sample([64, 64, 64], &mut rng);
            // 64·0.5^(1/3) = 50.8 → sides 51..=64, cubic, inside the volume.
            assert!(p.crop_size.iter().all(|&s| (51..=64).contains(&s)), "{p:?}");
            assert!(p.crop_size[0] == p.crop_size[1] && p.crop_size[1] == p.crop_size[2]);
            assert!((0..3).all(|a| p.crop_corner[a] + p.crop_size[a] <= 64));
            assert!((-0.1..=0.1).contains(&p.shift) && (0.8..=1.2).contains(&p.contrast));
            if let Some((_, k)) = p.rotation {
                assert!((1..=3).contains(&k));
            }
        }
    }

    /// The one-pass gather against the ops one at a time on a non-cubic volume: flips along
    /// each axis, then `k` turns, read off `torch.rot90`'s definition.
    #[test]
    fn composed_orientation_equals_flips_then_turns() {
        let size = [2, 3, 3];
        let x: Vec<f32> = (0..18).map(|v| v as f32).collect();
        let at = |v: &[f32], c: [usize; 3]| v[(c[0] * 3 + c[1]) * 3 + c[2]];
        for flips in [
            [false; 3],
            [true, false, false],
            [false, true, true],
            [true; 3],
        ] {
            for rotation in [
                None,
                Some(([1, 2], 1)),
                Some(([1, 2], 3)),
                Some(([0, 1], 2)),
            ] {
                let mut expected = x.clone();
                for (axis, &on) in flips.iter().enumerate() {
                    if on {
                        let prev = expected.clone();
                        for (i, e) in expected.iter_mut().enumerate() {
                            let mut c = [i / 9, i / 3 % 3, i % 3];
                            c[axis] = size[axis] - 1 - c[axis];
                            *e = at(&prev, c);
                        }
                    }
                }
                if let Some(([a, b], k)) = rotation {
                    // torch.rot90: k = 2 flips both axes; odd k turns a square plane k times.
                    let turns = if k == 2 { 0 } else { k };
                    for _ in 0..turns {
                        let prev = expected.clone();
                        for (i, e) in expected.iter_mut().enumerate() {
                            let c = [i / 9, i / 3 % 3, i % 3];
                            let mut s = c;
                            s[a] = c[b];
                            s[b] = size[b] - 1 - c[a];
                            *e = at(&prev, s);
                        }
                    }
                    if k == 2 {
                        expected = expected
                            .iter()
                            .enumerate()
                            .map(|(i, _)| {
                                let mut c = [i / 9, i / 3 % 3, i % 3];
                                c[a] = size[a] - 1 - c[a];
                                c[b] = size[b] - 1 - c[b];
                                at(&expected, c)
                            })
                            .collect();
                    }
                }
                let orientation = Orientation::new(size, flips, rotation);
                let mut got = vec![0f32; 18];
                orientation.gather(&x, &mut got, |v| v);
                assert_eq!(got, expected, "flips {flips:?}, rotation {rotation:?}");
                assert_eq!(orientation.is_identity(), got == x);
            }
        }
    }

    #[test]
    fn average_pool_of_a_constant_counts_the_zero_padding() {
        let size = [3, 4, 5];
        let mut x = vec![27f32; 60];
        let mut scratch = vec![0f32; 60];
        average_pool3(&mut x, size, &mut scratch);
        // A corner sees 2·2·2 voxels, an edge-of-face voxel 2·3·3 and so on; the centre all 27.
        let at = |z: usize, y: usize, w: usize| x[(z * 4 + y) * 5 + w];
        assert_eq!(at(0, 0, 0), 8.0);
        assert_eq!(at(1, 1, 1), 27.0);
        assert_eq!(at(1, 0, 2), 18.0);
    }
}
