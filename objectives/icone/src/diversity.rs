//! The instance-diversity term `L_div` of IConE (spec `docs/spec/objectives.md` §2.1): the squared
//! positive part of every off-diagonal entry of the Gram matrix of the row-normalised table,
//! `L_div = 1/|Ω| Σ_{(a,b)∈Ω} max(0, ⟨ẽ_a, ẽ_b⟩)²`, with `Ω` all ordered pairs `a ≠ b`
//! (`|Ω| = N(N−1)`), or only the cross-class ones for IConE-Instance.
//!
//! The `N × N` Gram is never held: the table is swept in `tile × tile` blocks (upper triangle
//! only, the Gram being symmetric), and each block contributes both to the value and to the
//! gradient `∂L/∂ẽ_a = (4/|Ω|) Σ_{b:(a,b)∈Ω} max(0, G_ab) ẽ_b`. The gradient is attached through
//! a linear surrogate, so memory is `O(N·d + tile²)` on any device and the backward pass costs
//! one element-wise product. The sweep costs `1.5·N²·d` multiply-adds (half the Gram, and two
//! block products per off-diagonal block), against `3·N²·d` for the Gram and its two backward
//! products under autograd. The value is accumulated on the table's device (in f64 for an f64
//! table, else f32) and `|Ω|` is counted once per table ([`Diversity::new`]), so a training step
//! reads nothing back to the host.

use candle_core::{bail, DType, Result, Tensor};

/// Default block side: a 2048² f32 block is 16 MiB.
pub const DEFAULT_TILE: usize = 2048;

/// `L_div` of the row-normalised table `e`: `[N, d]`, swept in `tile × tile` blocks; with
/// `labels` (`[N]` u32), only pairs of different classes count (IConE-Instance). Differentiable
/// in `e` (first order). Counts `|Ω|` from the labels on the host each call; a training loop
/// holds a [`Diversity`] instead.
pub fn squared_hinge_diversity(e: &Tensor, tile: usize, labels: Option<&Tensor>) -> Result<Tensor> {
    Diversity::new(e.dim(0)?, tile, labels)?.loss(e)
}

/// `L_div` of a table of fixed rows and classes: the block side, the row labels (IConE-Instance)
/// and the pair count `|Ω|`, checked and counted once.
#[derive(Debug, Clone)]
pub struct Diversity {
    rows: usize,
    tile: usize,
    labels: Option<Tensor>,
    pairs: f64,
}

impl Diversity {
    /// For tables of `rows` rows labelled `labels` (`[rows]` u32, IConE-Instance), swept in
    /// `tile × tile` blocks. Errors if `tile` is 0, the labels do not match the rows, or no pair
    /// counts (fewer than two rows, or of two classes with labels).
    pub fn new(rows: usize, tile: usize, labels: Option<&Tensor>) -> Result<Self> {
        if tile == 0 {
            bail!("the diversity tile size must be at least 1");
        }
        let pairs = ordered_pairs(rows, labels)?;
        if pairs == 0.0 {
            bail!(
                "L_div needs at least two table rows{}; got {rows} rows",
                if labels.is_some() {
                    " of different classes"
                } else {
                    ""
                }
            );
        }
        Ok(Self {
            rows,
            tile,
            labels: labels.cloned(),
            pairs,
        })
    }

    /// `L_div` of the row-normalised table `e`: `[rows, d]`, a scalar in `e`'s dtype,
    /// differentiable in `e` (first order).
    pub fn loss(&self, e: &Tensor) -> Result<Tensor> {
        let (value, gradient) = self.value_and_gradient(e)?;
        // ⟨e, sg(g)⟩ − sg(⟨e, g⟩) is zero in value and has gradient g.
        let linear = (e * &gradient)?.sum_all()?;
        (&linear - linear.detach())? + value.to_dtype(e.dtype())?
    }

    /// The value of `L_div` (a scalar on `e`'s device, f64 for an f64 `e`, else f32) and its
    /// gradient with respect to `e` (`[rows, d]`, `e`'s dtype), computed block by block from a
    /// detached `e`.
    pub fn value_and_gradient(&self, e: &Tensor) -> Result<(Tensor, Tensor)> {
        let (n, _) = e.dims2()?;
        if n != self.rows {
            bail!(
                "L_div was set up for a table of {} rows, got {n}",
                self.rows
            );
        }
        let (tile, pairs) = (self.tile, self.pairs);
        let sum_dtype = match e.dtype() {
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let sum = |t: &Tensor| t.sum_all()?.to_dtype(sum_dtype);
        let e = e.detach();
        let starts: Vec<usize> = (0..n).step_by(tile).collect();
        let blocks: Vec<Tensor> = starts
            .iter()
            .map(|&s| e.narrow(0, s, tile.min(n - s)))
            .collect::<Result<_>>()?;
        let block_labels: Option<Vec<Tensor>> = self
            .labels
            .as_ref()
            .map(|y| {
                starts
                    .iter()
                    .map(|&s| y.narrow(0, s, tile.min(n - s)))
                    .collect::<Result<_>>()
            })
            .transpose()?;
        let mut gradient: Vec<Option<Tensor>> = vec![None; blocks.len()];
        let mut total = None;
        for i in 0..blocks.len() {
            for j in i..blocks.len() {
                let gram = blocks[i].matmul(&blocks[j].t()?)?;
                let mut hinge = gram.relu()?;
                if let Some(y) = &block_labels {
                    let other_class = y[i]
                        .unsqueeze(1)?
                        .broadcast_ne(&y[j].unsqueeze(0)?)?
                        .to_dtype(hinge.dtype())?;
                    hinge = (hinge * other_class)?;
                }
                let weight = if i == j { 1.0 } else { 2.0 };
                accumulate(&mut total, (sum(&hinge.sqr()?)? * weight)?)?;
                let mut block_gradient = hinge.matmul(&blocks[j])?;
                if i != j {
                    accumulate(&mut gradient[j], hinge.t()?.matmul(&blocks[i])?)?;
                } else if block_labels.is_none() {
                    // Take the diagonal `a = b` back out: `G_aa = ‖ẽ_a‖² ≥ 0` and its gradient
                    // term `G_aa ẽ_a` (with labels, the class mask has already removed it).
                    let diagonal = blocks[i].sqr()?.sum_keepdim(1)?;
                    accumulate(&mut total, sum(&diagonal.sqr()?)?.neg()?)?;
                    block_gradient = (block_gradient - blocks[i].broadcast_mul(&diagonal)?)?;
                }
                accumulate(&mut gradient[i], block_gradient)?;
            }
        }
        let gradient: Vec<Tensor> = gradient.into_iter().flatten().collect();
        let gradient = (Tensor::cat(&gradient, 0)? * (4.0 / pairs))?;
        let total = total.expect("a table of at least two rows has a block");
        Ok(((total / pairs)?, gradient))
    }
}

/// `|Ω|`: `N(N−1)`, or `N² − Σ_c n_c²` ordered pairs of different classes.
fn ordered_pairs(n: usize, labels: Option<&Tensor>) -> Result<f64> {
    let Some(labels) = labels else {
        return Ok(n as f64 * (n as f64 - 1.0));
    };
    let labels = labels.to_vec1::<u32>()?;
    if labels.len() != n {
        bail!("{} labels for a table of {n} rows", labels.len());
    }
    let mut counts = std::collections::HashMap::new();
    for y in labels {
        *counts.entry(y).or_insert(0f64) += 1.0;
    }
    Ok(n as f64 * n as f64 - counts.values().map(|c| c * c).sum::<f64>())
}

fn accumulate(slot: &mut Option<Tensor>, part: Tensor) -> Result<()> {
    *slot = Some(match slot.take() {
        Some(acc) => (acc + part)?,
        None => part,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};
    use ssl_core::testing::close;

    /// `L_div` composed from whole-matrix tensor ops, differentiated by autograd.
    fn full_matrix(e: &Tensor, labels: Option<&[u32]>) -> Result<Tensor> {
        let n = e.dim(0)?;
        let mut mask = vec![0f64; n * n];
        for a in 0..n {
            for b in 0..n {
                let counted = a != b && labels.is_none_or(|y| y[a] != y[b]);
                mask[a * n + b] = if counted { 1.0 } else { 0.0 };
            }
        }
        let pairs: f64 = mask.iter().sum();
        let mask = Tensor::from_vec(mask, (n, n), e.device())?.to_dtype(e.dtype())?;
        let g = e.matmul(&e.t()?)?.relu()?;
        (g * mask)?.sqr()?.sum_all()? / pairs
    }

    /// The value of `L_div` of `e` on the host.
    fn value(e: &Tensor, tile: usize, labels: Option<&Tensor>) -> Result<f64> {
        let d = Diversity::new(e.dim(0)?, tile, labels)?;
        d.value_and_gradient(e)?.0.to_dtype(DType::F64)?.to_scalar()
    }

    fn random_rows(n: usize, d: usize, seed: u64) -> Result<Tensor> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let v: Vec<f64> = (0..n * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        ssl_linalg::normalize_rows(&Tensor::from_vec(v, (n, d), &Device::Cpu)?)
    }

    fn gradient_of(e: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<(f64, Vec<f64>)> {
        let var = Var::from_tensor(e)?;
        let loss = f(var.as_tensor())?;
        let grads = loss.backward()?;
        let g = grads.get(var.as_tensor()).expect("gradient");
        Ok((loss.to_scalar::<f64>()?, g.flatten_all()?.to_vec1::<f64>()?))
    }

    #[test]
    fn tiles_of_any_size_give_the_full_matrix_value_and_gradient() -> Result<()> {
        let e = random_rows(37, 5, 1)?;
        let labels: Vec<u32> = (0..37).map(|i| (i * 7 % 4) as u32).collect();
        let label_tensor = Tensor::new(labels.as_slice(), &Device::Cpu)?;
        for with_labels in [false, true] {
            let y = with_labels.then_some(labels.as_slice());
            let (want, want_grad) = gradient_of(&e, |e| full_matrix(e, y))?;
            for tile in [1, 5, 16, 36, 37, 100] {
                let yt = with_labels.then_some(&label_tensor);
                let (got, got_grad) = gradient_of(&e, |e| squared_hinge_diversity(e, tile, yt))?;
                close(got, want, 1e-12);
                for (g, w) in got_grad.iter().zip(&want_grad) {
                    assert!((g - w).abs() < 1e-12, "tile {tile}: {g} vs {w}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn spec_known_answers() -> Result<()> {
        // Spec §2.1: E = [[1,0,1],[0,1,0],[1,1,0]] → L_div = 0.25, also with labels [0,1,0].
        let e = Tensor::new(&[[1f64, 0., 1.], [0., 1., 0.], [1., 1., 0.]], &Device::Cpu)?;
        let e = ssl_linalg::normalize_rows(&e)?;
        close(value(&e, 2, None)?, 0.25, 1e-12);
        let y = Tensor::new(&[0u32, 1, 0], &Device::Cpu)?;
        close(value(&e, 2, Some(&y))?, 0.25, 1e-12);
        Ok(())
    }

    #[test]
    fn zero_iff_no_positive_off_diagonal_entry_and_at_most_one() -> Result<()> {
        // Orthogonal and opposite rows: nothing to push apart.
        let e = Tensor::new(&[[1f64, 0.], [0., 1.], [-1., 0.], [0., -1.]], &Device::Cpu)?;
        assert_eq!(value(&e, 3, None)?, 0.0);
        // Collapse: every off-diagonal entry is 1.
        let e = Tensor::new(&[[0.6f64, 0.8]; 5], &Device::Cpu)?;
        close(value(&e, 2, None)?, 1.0, 1e-12);
        Ok(())
    }

    #[test]
    fn a_single_row_or_class_is_refused() -> Result<()> {
        let e = random_rows(1, 3, 0)?;
        let err = squared_hinge_diversity(&e, 4, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least two table rows"), "{err}");
        let y = Tensor::new(&[2u32, 2, 2], &Device::Cpu)?;
        let err = Diversity::new(3, 4, Some(&y)).unwrap_err().to_string();
        assert!(err.contains("of different classes"), "{err}");
        // A table of another size than the one counted for is refused, not misweighted.
        let d = Diversity::new(4, 4, None)?;
        let err = d.loss(&random_rows(3, 3, 0)?).unwrap_err().to_string();
        assert!(err.contains("set up for a table of 4 rows, got 3"), "{err}");
        Ok(())
    }

    /// N = 50,000 rows, d = 128: the full Gram would be 2.5·10⁹ entries (10 GB in f32); the tiled
    /// sweep holds one 2048² block. Rows are drawn (with multiplicity, in shuffled order, at
    /// random scales before normalisation) from K = 64 directions `u_k`, so the exact value and
    /// gradient follow from the K×K Gram `g` and the counts `n_k`:
    /// `Σ_{a≠b} max(0,G_ab)² = Σ_{k,l} n_k n_l max(0,g_kl)² − N` and
    /// `∂/∂ẽ_a = (4/(N(N−1))) (Σ_l n_l max(0, g_{k(a) l}) u_l − u_{k(a)})`.
    #[test]
    fn fifty_thousand_rows_match_the_closed_form() -> Result<()> {
        let (n, d, k) = (50_000usize, 128usize, 64usize);
        let dirs = random_rows(k, d, 7)?.to_vec2::<f64>()?;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let assignment: Vec<usize> = (0..n).map(|_| rng.random_range(0..k)).collect();
        let mut counts = vec![0f64; k];
        let mut rows = Vec::with_capacity(n * d);
        for &a in &assignment {
            counts[a] += 1.0;
            let scale: f64 = rng.random_range(0.01..3.0);
            rows.extend(dirs[a].iter().map(|x| (x * scale) as f32));
        }
        let e = ssl_linalg::normalize_rows(&Tensor::from_vec(rows, (n, d), &Device::Cpu)?)?;
        let (value, gradient) = Diversity::new(n, DEFAULT_TILE, None)?.value_and_gradient(&e)?;
        let value: f64 = value.to_dtype(DType::F64)?.to_scalar()?;

        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let pairs = n as f64 * (n as f64 - 1.0);
        let mut sum = -(n as f64);
        for a in 0..k {
            for b in 0..k {
                sum += counts[a] * counts[b] * dot(&dirs[a], &dirs[b]).max(0.0).powi(2);
            }
        }
        close(value, sum / pairs, 1e-5);

        let gradient = gradient.to_dtype(DType::F64)?;
        for row in [0, 1, 2047, 2048, 31_337, n - 1] {
            let c = assignment[row];
            let mut want = dirs[c].iter().map(|x| -x).collect::<Vec<_>>();
            for l in 0..k {
                let w = counts[l] * dot(&dirs[c], &dirs[l]).max(0.0);
                for (t, x) in want.iter_mut().zip(&dirs[l]) {
                    *t += w * x;
                }
            }
            let got = gradient.get(row)?.to_vec1::<f64>()?;
            for (g, w) in got.iter().zip(&want) {
                let w = w * 4.0 / pairs;
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs() + 1e-12,
                    "row {row}: {g} vs {w}"
                );
            }
        }
        Ok(())
    }
}
