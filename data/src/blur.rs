//! Gaussian blur as torchvision's `GaussianBlur` on tensors (`docs/spec/data.md` §3.6): an exact
//! Gaussian kernel of odd size `k` normalised to sum 1, applied separably along rows and
//! columns of each channel with reflect padding (mirror without repeating the edge:
//! index −1 → 1, `W` → `W − 2`). The result is clamped to `[0, 1]`: the weights sum to 1 only
//! up to `f32` rounding, so a white image would come out at `1 + 2⁻²³`.

/// The kernel size SimCLR and BYOL use for output side `side`: `2·⌊side/20⌋ + 1`, about 10 % of
/// the side (224 → 23, 96 → 9, 64 → 7, 32 → 3).
pub fn blur_kernel_size(side: usize) -> usize {
    2 * (side / 20) + 1
}

/// torchvision's `_get_gaussian_kernel1d`: taps at `x = −(k−1)/2 … (k−1)/2`,
/// `w(x) ∝ exp(−x²/(2σ²))`, normalised to sum 1.
pub fn gaussian_kernel(size: usize, sigma: f32) -> Vec<f32> {
    let half = (size as f32 - 1.0) * 0.5;
    let pdf: Vec<f32> = (0..size)
        .map(|i| {
            let x = (i as f32 - half) / sigma;
            (-0.5 * x * x).exp()
        })
        .collect();
    let sum: f32 = pdf.iter().sum();
    pdf.into_iter().map(|w| w / sum).collect()
}

/// The reflect-padded index of `i` (may be out of `0..n` by less than `n`).
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    let r = if i < 0 {
        -i
    } else if i >= n {
        2 * (n - 1) - i
    } else {
        i
    };
    r as usize
}

/// Blurs every `height × width` plane of `image` (`[C, H, W]`) in place with the Gaussian
/// kernel of `size` taps and standard deviation `sigma`, clamping the result to `[0, 1]`. Requires `(size − 1)/2 < min(H, W)`, as torchvision's reflect padding does.
pub fn gaussian_blur(image: &mut [f32], height: usize, width: usize, size: usize, sigma: f32) {
    let half = size / 2;
    assert!(
        size % 2 == 1 && half < height.min(width),
        "blur kernel of {size} taps needs an odd size below twice the image side ({height}×{width})"
    );
    let kernel = gaussian_kernel(size, sigma);
    let plane = height * width;
    let mut rows = vec![0f32; plane];
    // Interior columns need no reflection; precompute the reflected indices of the borders.
    let taps = |n: usize| -> Vec<Vec<usize>> {
        (0..n)
            .map(|i| {
                (0..size)
                    .map(|t| reflect(i as isize + t as isize - half as isize, n))
                    .collect()
            })
            .collect()
    };
    let (column_taps, row_taps) = (taps(width), taps(height));
    for channel in image.chunks_mut(plane) {
        // Horizontal pass into `rows`.
        for y in 0..height {
            let src = &channel[y * width..(y + 1) * width];
            let dst = &mut rows[y * width..(y + 1) * width];
            for (x, out) in dst.iter_mut().enumerate() {
                *out = if x >= half && x + half < width {
                    src[x - half..x + half + 1]
                        .iter()
                        .zip(&kernel)
                        .map(|(v, w)| v * w)
                        .sum()
                } else {
                    column_taps[x]
                        .iter()
                        .zip(&kernel)
                        .map(|(&i, w)| src[i] * w)
                        .sum()
                };
            }
        }
        // Vertical pass back into the channel, a whole row at a time.
        for (y, taps) in row_taps.iter().enumerate() {
            let dst = &mut channel[y * width..(y + 1) * width];
            dst.fill(0.0);
            for (&i, &w) in taps.iter().zip(&kernel) {
                for (out, v) in dst.iter_mut().zip(&rows[i * width..(i + 1) * width]) {
                    *out += w * v;
                }
            }
            for out in dst {
                *out = out.clamp(0.0, 1.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_sizes_follow_the_ten_percent_rule() {
        assert_eq!(
            [224, 96, 64, 32].map(blur_kernel_size),
            [23, 9, 7, 3],
            "spec data §3.6"
        );
    }

    #[test]
    fn kernel_is_symmetric_and_sums_to_one() {
        let k = gaussian_kernel(7, 1.3);
        assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for i in 0..7 {
            assert!((k[i] - k[6 - i]).abs() < 1e-7);
        }
        // Ratio of neighbouring taps is exp(-(2x+1)/(2σ²)).
        let want = (-(1.0f32) / (2.0 * 1.3 * 1.3)).exp();
        assert!((k[2] / k[3] - want).abs() < 1e-5);
    }

    #[test]
    fn constant_image_is_unchanged_and_reflection_mirrors_without_the_edge() {
        let mut flat = vec![0.25f32; 2 * 5 * 6];
        gaussian_blur(&mut flat, 5, 6, 5, 1.0);
        assert!(flat.iter().all(|&v| (v - 0.25).abs() < 1e-6));
        assert_eq!(
            [-2, -1, 0, 4, 5, 6].map(|i| reflect(i, 6)),
            [2, 1, 0, 4, 5, 4]
        );
    }
}
