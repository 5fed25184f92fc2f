//! Bringing a mapped scan to the run's size: `[C, S, S]` images and `[C, S, S, S]` volumes.
//!
//! * **Images** follow the image folders' evaluation convention: the shorter side resized to
//!   `S` (the longer to `⌊S·long/short⌋`), then the centre `S × S` crop.
//! * **Volumes**, without a target spacing, have each axis resized to `S`, as MedMNIST-3D's
//!   cubes were made; with `data.spacing` they are first resampled to that voxel spacing from
//!   the header's, then centre-cropped or zero-padded to `S` along each axis (MONAI's
//!   `Spacing` + `ResizeWithPadOrCrop`), so that a voxel means the same millimetres in every
//!   volume. Zero is the mapped floor (the window's lower end, air in CT).
//!
//! Resizing is separable linear interpolation with half-pixel centres (`align_corners =
//! false`), its triangle widened by the factor when shrinking, as PIL's antialiased bilinear
//! does: a 512-slice CT brought to 64 averages each slab rather than sampling every eighth
//! slice. Its weights are non-negative, so values mapped to `[0, 1]` stay there.

use anyhow::{bail, ensure, Result};

use super::Decoded;
use crate::crop::{half_rounded_even, shorter_side_to};

/// `values` of `shape` with axis `axis` resampled to `len` samples (module docs).
pub fn resample_axis(values: &[f32], shape: &[usize], axis: usize, len: usize) -> Vec<f32> {
    let n = shape[axis];
    if n == len {
        return values.to_vec();
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let taps = linear_taps(n, len);
    let mut out = vec![0f32; outer * len * inner];
    for (source, target) in values
        .chunks_exact(n * inner)
        .zip(out.chunks_exact_mut(len * inner))
    {
        for (row, (first, weights)) in target.chunks_exact_mut(inner).zip(&taps) {
            for (k, &w) in weights.iter().enumerate() {
                let from = &source[(first + k) * inner..(first + k + 1) * inner];
                for (o, &v) in row.iter_mut().zip(from) {
                    *o += w * v;
                }
            }
        }
    }
    out
}

/// For each of `len` outputs over `n` inputs: its first input and the normalised weights of it
/// and the inputs after it.
fn linear_taps(n: usize, len: usize) -> Vec<(usize, Vec<f32>)> {
    let scale = n as f64 / len as f64;
    let support = scale.max(1.0);
    (0..len)
        .map(|o| {
            let centre = (o as f64 + 0.5) * scale;
            let first = (centre - support).floor().max(0.0) as usize;
            let last = ((centre + support).ceil() as usize).min(n);
            let mut weights: Vec<f64> = (first..last)
                .map(|i| (1.0 - ((i as f64 + 0.5 - centre) / support).abs()).max(0.0))
                .collect();
            let total: f64 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= total);
            (first, weights.into_iter().map(|w| w as f32).collect())
        })
        .collect()
}

/// `values` of `shape` cut or zero-padded, centred, to `len` along `axis` (the offset of a
/// crop rounded half to even, as the image folders' centre crop).
fn crop_or_pad_axis(values: &[f32], shape: &[usize], axis: usize, len: usize) -> Vec<f32> {
    let n = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![0f32; outer * len * inner];
    let (from, to, count) = match n >= len {
        true => (half_rounded_even(n - len), 0, len),
        false => (0, (len - n) / 2, n),
    };
    for (source, target) in values
        .chunks_exact(n * inner)
        .zip(out.chunks_exact_mut(len * inner))
    {
        target[to * inner..(to + count) * inner]
            .copy_from_slice(&source[from * inner..(from + count) * inner]);
    }
    out
}

/// `scan` (mapped, `[C, H, W]`) as `[C, S, S]`: shorter side to `size`, centre crop.
pub fn fit_image(scan: &Decoded, size: usize) -> Vec<f32> {
    let [c, h, w] = [scan.shape[0], scan.shape[1], scan.shape[2]];
    let (rh, rw) = shorter_side_to(h, w, size);
    let rows = resample_axis(&scan.values, &[c, h, w], 1, rh);
    let resized = resample_axis(&rows, &[c, rh, w], 2, rw);
    let rows = crop_or_pad_axis(&resized, &[c, rh, rw], 1, size);
    crop_or_pad_axis(&rows, &[c, size, rw], 2, size)
}

/// `scan` (mapped, `[C, D, H, W]`) as `[C, S, S, S]`: each axis resized to `size`, or, with a
/// target `spacing` (mm, `[slice, row, column]`), resampled to it and cropped or padded to
/// `size`; `what` names the file in errors.
pub fn fit_volume(
    scan: &Decoded,
    size: usize,
    spacing: Option<[f64; 3]>,
    what: &str,
) -> Result<Vec<f32>> {
    ensure!(
        scan.shape.len() == 4,
        "{what} is an image of shape {:?}, not a volume",
        scan.shape
    );
    let lengths: [usize; 3] = match spacing {
        None => [size; 3],
        Some(target) => {
            let Some(own) = scan.spacing.as_deref().filter(|s| s.len() == 3) else {
                bail!(
                    "{what} has no voxel spacing in its header, so it cannot be resampled to \
                     data.spacing {target:?}; remove data.spacing to resize each axis to {size}"
                );
            };
            std::array::from_fn(|a| {
                ((scan.shape[a + 1] as f64 * own[a] / target[a]).round() as usize).max(1)
            })
        }
    };
    let mut shape = scan.shape.clone();
    let mut values = scan.values.clone();
    for (axis, &len) in (1..4).zip(&lengths) {
        values = resample_axis(&values, &shape, axis, len);
        shape[axis] = len;
    }
    for axis in 1..4 {
        values = crop_or_pad_axis(&values, &shape, axis, size);
        shape[axis] = size;
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsampling_matches_half_pixel_linear_interpolation() {
        // torch.nn.functional.interpolate([0, 1, 2, 3], 8, mode='linear', align_corners=False)
        let out = resample_axis(&[0.0, 1.0, 2.0, 3.0], &[4], 0, 8);
        let want = [0.0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.0];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn shrinking_averages_instead_of_skipping() {
        // A one-voxel stripe every 8 slices: point sampling at 1/8 would see all or none of
        // them; the widened triangle keeps their mean, 1/8, in every output slice.
        let values: Vec<f32> = (0..64).map(|i| f32::from(i % 8 == 3)).collect();
        let out = resample_axis(&values, &[64], 0, 8);
        for v in &out {
            assert!((v - 0.125).abs() < 0.02, "{out:?}");
        }
        // Constants stay constant and weights are non-negative: [0, 1] stays in [0, 1].
        let ramp: Vec<f32> = (0..50).map(|i| (i % 2) as f32).collect();
        let out = resample_axis(&ramp, &[50], 0, 7);
        assert!(out.iter().all(|v| (0.0..=1.0).contains(v)));
        assert!(resample_axis(&[0.5; 30], &[30], 0, 4)
            .iter()
            .all(|v| (v - 0.5).abs() < 1e-6));
    }

    fn volume(shape: [usize; 4], spacing: Option<Vec<f64>>) -> Decoded {
        let n = shape.iter().product();
        Decoded {
            values: (0..n).map(|i| i as f32).collect(),
            shape: shape.to_vec(),
            spacing,
            type_range: None,
            format: "test".into(),
        }
    }

    #[test]
    fn images_take_the_centre_of_their_shorter_side() {
        // A 2 × 4 image at side 2: no resize, the centre two columns.
        let scan = Decoded {
            values: (0..8).map(|i| i as f32).collect(),
            shape: vec![1, 2, 4],
            spacing: None,
            type_range: None,
            format: "test".into(),
        };
        assert_eq!(fit_image(&scan, 2), [1.0, 2.0, 5.0, 6.0]);
    }

    #[test]
    fn volumes_resize_each_axis_or_keep_millimetres() -> Result<()> {
        let scan = volume([1, 4, 8, 8], Some(vec![2.0, 1.0, 1.0]));
        assert_eq!(fit_volume(&scan, 4, None, "v")?.len(), 64);
        // At 2 mm: 4 slices of 2 mm stay 4; 8 rows of 1 mm become 4; the cube is 4³ with no pad.
        let same = fit_volume(&scan, 4, Some([2.0, 2.0, 2.0]), "v")?;
        assert_eq!(same.len(), 64);
        assert!(same.iter().all(|&v| v > 0.0));
        // At 1 mm the 4 slices become 8 and are centre-cropped to 6; the rows are kept and
        // padded from 8 to... cropped to 6 as well: no zeros.
        let fine = fit_volume(&scan, 6, Some([1.0, 1.0, 1.0]), "v")?;
        assert_eq!(fine.len(), 216);
        // At 4 mm there are 2 slices and 2 rows: a 4³ cube padded with zeros around them.
        let coarse = fit_volume(&scan, 4, Some([4.0, 4.0, 4.0]), "v")?;
        let zeros = coarse.iter().filter(|&&v| v == 0.0).count();
        assert_eq!(zeros, 64 - 8);
        let e = fit_volume(&volume([1, 2, 2, 2], None), 4, Some([1.0; 3]), "x.nii")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.nii has no voxel spacing"), "{e}");
        Ok(())
    }
}
