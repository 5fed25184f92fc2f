//! Linear centred kernel alignment (CKA; `docs/spec/metrics.md` §8).
//!
//! `CKA(X, Y) = ‖Y_cᵀ X_c‖²_F / (‖X_cᵀ X_c‖_F · ‖Y_cᵀ Y_c‖_F)` with column-centred `X_c`, `Y_c`.
//! When `n < max(p₁, p₂)` the equivalent Gram form `tr(K_c L_c) / (‖K_c‖_F ‖L_c‖_F)` is used,
//! with `K_c = H X Xᵀ H = X_c X_cᵀ` and `L_c = Y_c Y_cᵀ` (`n × n`), so the cost is
//! `O(n · max(p)²)` or `O(n² · max(p))`, whichever is smaller. Computed in `f64`.

use anyhow::{ensure, Result};
use nalgebra::DMatrix;

use crate::Features;

/// Linear CKA between `x` (`n × p₁`) and `y` (`n × p₂`): rows are the same `n ≥ 2` items.
///
/// Invariant to orthogonal transforms and isotropic scaling of either argument and to
/// translations; `CKA(X, X) = 1`; range `[0, 1]`. Fails when either argument is constant over
/// the samples (its centred matrix is zero).
pub fn linear_cka(x: &Features, y: &Features) -> Result<f64> {
    let (xc, yc) = centred_pair(x, y)?;
    if x.n >= x.d.max(y.d) {
        feature_form(&xc, &yc)
    } else {
        gram_form(&xc, &yc)
    }
}

/// Validates the pair and returns both column-centred matrices.
fn centred_pair(x: &Features, y: &Features) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
    ensure!(
        x.n == y.n,
        "linear CKA: X has {} samples, Y has {} (rows must be the same items)",
        x.n,
        y.n
    );
    ensure!(
        x.n >= 2,
        "linear CKA: needs at least 2 samples, got {}",
        x.n
    );
    ensure!(
        x.d > 0 && y.d > 0,
        "linear CKA: zero-dimensional features ({}×{} and {}×{})",
        x.n,
        x.d,
        y.n,
        y.d
    );
    ensure!(
        x.data.iter().chain(&y.data).all(|v| v.is_finite()),
        "linear CKA: the features contain NaN or infinity"
    );
    Ok((centred(x), centred(y)))
}

fn centred(z: &Features) -> DMatrix<f64> {
    let mut m = DMatrix::from_fn(z.n, z.d, |i, j| f64::from(z.data[i * z.d + j]));
    let mean = m.row_mean();
    for mut row in m.row_iter_mut() {
        row -= &mean;
    }
    m
}

/// `‖Y_cᵀX_c‖² / (‖X_cᵀX_c‖ ‖Y_cᵀY_c‖)` with `p × p` cross-products.
fn feature_form(xc: &DMatrix<f64>, yc: &DMatrix<f64>) -> Result<f64> {
    let cross = yc.tr_mul(xc).norm_squared();
    let nx = xc.tr_mul(xc).norm();
    let ny = yc.tr_mul(yc).norm();
    ratio(cross, nx, ny)
}

/// `tr(K_c L_c) / (‖K_c‖ ‖L_c‖)` with `n × n` centred Gram matrices (`tr(K_c L_c)` is the
/// element-wise product summed, both being symmetric).
fn gram_form(xc: &DMatrix<f64>, yc: &DMatrix<f64>) -> Result<f64> {
    let k = xc * xc.transpose();
    let l = yc * yc.transpose();
    ratio(k.dot(&l), k.norm(), l.norm())
}

fn ratio(num: f64, nx: f64, ny: f64) -> Result<f64> {
    ensure!(
        nx > 0.0 && ny > 0.0,
        "linear CKA: {} is constant over the samples",
        if nx > 0.0 { "Y" } else { "X" }
    );
    Ok(num / (nx * ny))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{close, matmul, Rng};

    fn kat_x() -> Features {
        Features::from_rows(&[[1.0f32, 0.0], [2.0, 1.0], [0.0, 3.0], [1.0, 1.0]]).unwrap()
    }

    #[test]
    fn cka_kat() {
        let x = kat_x();
        let y = Features::from_rows(&[
            [1.0f32, 2.0, 0.0],
            [0.0, 1.0, 1.0],
            [3.0, 0.0, 1.0],
            [1.0, 1.0, 1.0],
        ])
        .unwrap();
        let v = linear_cka(&x, &y).unwrap();
        assert!(close(v, 0.9649927916, 1e-6), "{v}");
        // n = 4 ≥ max(2, 3): the feature form; the Gram form agrees.
        let (xc, yc) = centred_pair(&x, &y).unwrap();
        assert!(close(gram_form(&xc, &yc).unwrap(), 0.9649927916, 1e-6));
        // Symmetric in its arguments.
        assert!(close(linear_cka(&y, &x).unwrap(), v, 1e-12));
    }

    #[test]
    fn cka_of_transformed_copy_is_one() {
        let x = kat_x();
        assert!(close(linear_cka(&x, &x).unwrap(), 1.0, 1e-12));
        // 3·X·R + 1 with R = [[0, 1], [−1, 0]] (exact in f32).
        let rows: Vec<[f32; 2]> = x
            .data
            .chunks(2)
            .map(|r| [3.0 * -r[1] + 1.0, 3.0 * r[0] + 1.0])
            .collect();
        let y = Features::from_rows(&rows).unwrap();
        assert!(close(linear_cka(&x, &y).unwrap(), 1.0, 1e-12));
    }

    #[test]
    fn cka_invariant_to_orthogonal_transform() {
        let mut rng = Rng::new(3);
        let x = rng.features(30, 5);
        let y = rng.features(30, 4);
        let base = linear_cka(&x, &y).unwrap();
        assert!(base > 0.0 && base < 1.0, "{base}");
        let qx = matmul(&x, &rng.orthogonal(5), 5);
        let qy = matmul(&y, &rng.orthogonal(4), 4);
        assert!(close(linear_cka(&qx, &y).unwrap(), base, 1e-5));
        assert!(close(linear_cka(&qx, &qy).unwrap(), base, 1e-5));
    }

    #[test]
    fn feature_and_gram_forms_agree() {
        let mut rng = Rng::new(5);
        // n < p (the Gram form is used) and n > p (the feature form is used).
        for (n, p1, p2) in [(5, 8, 8), (5, 8, 3), (50, 3, 3), (50, 3, 7)] {
            let x = rng.features(n, p1);
            let y = rng.features(n, p2);
            let (xc, yc) = centred_pair(&x, &y).unwrap();
            let f = feature_form(&xc, &yc).unwrap();
            let g = gram_form(&xc, &yc).unwrap();
            assert!(close(f, g, 1e-10), "n={n}, p=({p1},{p2}): {f} vs {g}");
            assert!(close(linear_cka(&x, &y).unwrap(), f, 1e-10));
            assert!((0.0..=1.0 + 1e-12).contains(&f));
        }
    }

    #[test]
    fn cka_errors() {
        let x = kat_x();
        let three = Features::from_rows(&[[1.0f32], [2.0], [3.0]]).unwrap();
        assert!(linear_cka(&x, &three).is_err());
        let one = Features::from_rows(&[[1.0f32, 2.0]]).unwrap();
        assert!(linear_cka(&one, &one).is_err());
        let constant = Features::from_rows(&[[1.0f32]; 4]).unwrap();
        assert!(linear_cka(&x, &constant).is_err());
        assert!(linear_cka(&constant, &x).is_err());
        let empty = Features::new(vec![], 4, 0).unwrap();
        assert!(linear_cka(&x, &empty).is_err());
    }
}
