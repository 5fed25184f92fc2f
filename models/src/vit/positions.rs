//! Fixed 2D sine–cosine positional embeddings, as the encoders of MAE and I-JEPA
//! ([`super::PosEmbed::SinCos`]), MAE's decoder and I-JEPA's predictor use them:
//! `util/pos_embed.py` of the official MAE code, from MoCo v3 and the Transformer's 1D
//! embedding.

use candle_core::{DType, Device, Result, Tensor};

/// The embedding of every cell of a `gh × gw` patch grid, row-major, `[gh·gw, dim]` as a
/// row-major `Vec`. Cell `(i, j)` (row `i`, column `j`) gets `[e(j), e(i)]`: the first half of
/// the width encodes the column, the second the row (the official code meshes `w` first), each
/// with the 1D embedding `e(x) = [sin(x·ω_0) … sin(x·ω_{m−1}), cos(x·ω_0) … cos(x·ω_{m−1})]`,
/// `m = dim/4`, `ω_k = 10000^{−k/m}`, computed in double precision. `dim` must be a multiple
/// of 4.
pub fn sincos_2d(dim: usize, gh: usize, gw: usize) -> Vec<f64> {
    assert!(
        dim.is_multiple_of(4) && dim > 0,
        "a 2D sine-cosine embedding needs a width that is a positive multiple of 4, got {dim}"
    );
    let m = dim / 4;
    let omega: Vec<f64> = (0..m)
        .map(|k| 1.0 / 10000f64.powf(k as f64 / m as f64))
        .collect();
    let mut out = Vec::with_capacity(gh * gw * dim);
    let mut one_d = |x: f64| {
        out.extend(omega.iter().map(|w| (x * w).sin()));
        out.extend(omega.iter().map(|w| (x * w).cos()));
    };
    for i in 0..gh {
        for j in 0..gw {
            one_d(j as f64);
            one_d(i as f64);
        }
    }
    out
}

/// The fixed positions of a ViT with a class token on a `gh × gw` patch grid,
/// `[1, 1 + gh·gw, dim]`: a zero row for the class token, then [`sincos_2d`] (computed in f64,
/// then cast to `dtype`), as MAE's `get_2d_sincos_pos_embed(..., cls_token=True)` builds them
/// for its encoder and decoder. Not a parameter: nothing trains it and checkpoints do not hold
/// it.
pub fn sincos_positions(
    dim: usize,
    (gh, gw): (usize, usize),
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let mut values = vec![0f64; dim];
    values.extend(sincos_2d(dim, gh, gw));
    Tensor::from_vec(values, (1, 1 + gh * gw, dim), device)?.to_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_encode_column_then_row_with_sines_before_cosines() {
        // dim 8: m = 2, ω = [1, 0.01]; cell (1, 2) of a 2 × 3 grid is index 5.
        let e = sincos_2d(8, 2, 3);
        assert_eq!(e.len(), 6 * 8);
        let cell = &e[5 * 8..6 * 8];
        let expect = [
            2f64.sin(),
            0.02f64.sin(),
            2f64.cos(),
            0.02f64.cos(),
            1f64.sin(),
            0.01f64.sin(),
            1f64.cos(),
            0.01f64.cos(),
        ];
        for (a, b) in cell.iter().zip(expect) {
            assert!((a - b).abs() < 1e-15, "{a} vs {b}");
        }
        // Cell (0, 0): sines 0, cosines 1.
        assert_eq!(&e[..8], &[0., 0., 1., 1., 0., 0., 1., 1.]);
    }
}
