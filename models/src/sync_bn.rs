//! Synchronised batch norm (`model.sync_bn`): train-mode statistics over the global batch of a
//! data-parallel job, as PyTorch's `SyncBatchNorm`.
//!
//! Each rank reduces its rows `[C, m]` to per-channel count, mean and centred sum of squares,
//! the ranks' statistics are gathered through [`Collective::all_gather`] and combined (Chan et
//! al.'s parallel variance: `μ = Σ n_r μ_r / N`, `N σ² = Σ [M2_r + n_r (μ_r − μ)²]`), and every
//! rank normalises its rows with the global `μ, σ²`. The whole computation is Candle ops, so its
//! backward is the gather's: the gradient of the global loss with respect to each rank's
//! statistics, summed over ranks — SyncBatchNorm's two all-reduces of `Σ dy` and `Σ dy·x̂` —
//! and exact for any split of the batch.
//!
//! The scope is a closure, and only the data-parallel training step, which every rank takes,
//! runs inside one: `with_global_statistics(collective, || step())`. Outside it (evaluation,
//! baselines, monitoring: work one rank may do alone) every [`crate::BatchNorm`] uses its rank's
//! rows only (the fused single-process op) and enters no collective, so a rank working alone
//! never waits for ranks that will not join it.

use std::cell::RefCell;
use std::sync::Arc;

use candle_core::{DType, Result, Tensor};
use ssl_core::{Collective, SingleProcess};

thread_local! {
    static SYNC: RefCell<Option<Arc<dyn Collective>>> = const { RefCell::new(None) };
}

/// Restores this thread's previous batch-norm setting when dropped, a panic included.
struct Restore(Option<Arc<dyn Collective>>);

impl Drop for Restore {
    fn drop(&mut self) {
        SYNC.with(|s| *s.borrow_mut() = self.0.take());
    }
}

/// Runs `step` with every train-mode [`crate::BatchNorm`] on this thread (and
/// [`standardize_rows`]) using the statistics of the batch gathered over `collective`'s ranks;
/// before and after, batch norm uses this rank's rows. Every rank must run the same `step`: each
/// train-mode batch norm in it is a collective.
pub fn with_global_statistics<R>(collective: Arc<dyn Collective>, step: impl FnOnce() -> R) -> R {
    let _restore = Restore(SYNC.with(|s| s.borrow_mut().replace(collective)));
    step()
}

/// Whether this thread runs inside [`with_global_statistics`].
pub fn synchronised() -> bool {
    SYNC.with(|s| s.borrow().is_some())
}

/// This thread's collective for batch norm inside [`with_global_statistics`].
pub(crate) fn current() -> Option<Arc<dyn Collective>> {
    SYNC.with(|s| s.borrow().clone())
}

/// Train-mode batch norm of rows `x`: `[C, m]` with the statistics of every rank's rows:
/// `(y, mean, unbiased variance)`, `mean` and the variance (`N/(N − 1)` times the population
/// variance of the global count `N`) `[C]` and detached, for the running statistics. Nothing is
/// read back to the host.
pub(crate) fn synced_train_rows(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    eps: f64,
    relu: bool,
    collective: &dyn Collective,
) -> Result<(Tensor, Tensor, Tensor)> {
    let c = x.dim(0)?;
    let stats = GlobalStatistics::of(x, collective)?;
    let dt = stats.x.dtype();
    let y = stats
        .standardized(eps)?
        .broadcast_mul(&weight.to_dtype(dt)?.reshape((c, 1))?)?
        .broadcast_add(&bias.to_dtype(dt)?.reshape((c, 1))?)?;
    let y = if relu { y.relu()? } else { y };
    let bessel = (&stats.total / (&stats.total - 1.0)?)?;
    let unbiased_var = stats.var.broadcast_mul(&bessel)?;
    Ok((
        y,
        stats.mean.detach().reshape(c)?,
        unbiased_var.detach().reshape(c)?,
    ))
}

/// Train-mode batch norm without affine parameters of rows `x`: `[C, m]`, `(x − μ)/√(σ² + ε)`
/// per channel with the population variance, in `x`'s dtype: over the global batch inside
/// [`with_global_statistics`], else over `x`'s own `m` values. For a
/// normalisation without running statistics that must follow `model.sync_bn` (SimSiam's
/// projector-output batch norm); differentiable like [`crate::BatchNorm`] inside the scope.
pub fn standardize_rows(x: &Tensor, eps: f64) -> Result<Tensor> {
    let collective = current().unwrap_or_else(|| Arc::new(SingleProcess));
    GlobalStatistics::of(x, collective.as_ref())?
        .standardized(eps)?
        .to_dtype(x.dtype())
}

/// Per-channel statistics of rows `[C, m]` over every rank's rows (Chan et al.'s combination of
/// the ranks' counts, means and centred sums of squares; see the module docs).
struct GlobalStatistics {
    /// The local rows in the statistics' dtype (f64 for f64, else f32).
    x: Tensor,
    /// `[C, 1]`: global mean and population variance.
    mean: Tensor,
    var: Tensor,
    /// `[1, 1]`: the global count `N`.
    total: Tensor,
}

impl GlobalStatistics {
    fn of(x: &Tensor, collective: &dyn Collective) -> Result<Self> {
        let (c, m) = x.dims2()?;
        let dt = match x.dtype() {
            DType::F64 => DType::F64,
            _ => DType::F32,
        };
        let x = x.to_dtype(dt)?;
        let local_mean = x.mean_keepdim(1)?;
        let local_m2 = x.broadcast_sub(&local_mean)?.sqr()?.sum_keepdim(1)?;
        let count = Tensor::full(m as f64, (c, 1), x.device())?.to_dtype(dt)?;
        // [world, C, 3]: count, mean and M2 of every rank, in rank order.
        let local = Tensor::cat(&[&count, &local_mean, &local_m2], 1)?.unsqueeze(0)?;
        let all = collective.all_gather(&local, 0)?;
        let counts = all.narrow(2, 0, 1)?;
        let means = all.narrow(2, 1, 1)?;
        let m2s = all.narrow(2, 2, 1)?;
        let total = counts.sum_keepdim(0)?;
        let mean = ((&counts * &means)?.sum_keepdim(0)? / &total)?;
        let spread = (&counts * means.broadcast_sub(&mean)?.sqr()?)?;
        let var = ((m2s.sum_keepdim(0)? + spread.sum_keepdim(0)?)? / &total)?;
        Ok(Self {
            x,
            mean: mean.reshape((c, 1))?,
            var: var.reshape((c, 1))?,
            total: total.narrow(1, 0, 1)?.reshape((1, 1))?,
        })
    }

    /// `(x − μ)/√(σ² + ε)`: `[C, m]`.
    fn standardized(&self, eps: f64) -> Result<Tensor> {
        self.x
            .broadcast_sub(&self.mean)?
            .broadcast_div(&(&self.var + eps)?.sqrt()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{max_abs_diff, rand_tensor};
    use crate::BatchNorm;
    use candle_core::{Device, Var};
    use ssl_core::ParamStore;

    fn bn(store: &ParamStore) -> BatchNorm {
        let bn = BatchNorm::new(3, 1e-5, Some(0.1), store.var_builder(&Device::Cpu).pp("bn"));
        for (name, v) in store.vars() {
            if name.ends_with("weight") || name.ends_with("bias") {
                v.set(&rand_tensor(7, &[3], DType::F32)).unwrap();
            }
        }
        bn.unwrap()
    }

    /// A second rank whose rows are fixed: the gather appends their statistics after ours.
    struct OtherRank(Tensor);

    impl OtherRank {
        /// The rank holding `rows` `[C, n]`: it contributes `[1, C, 3]` of count, mean and M2
        /// per channel, computed here directly.
        fn holding(rows: &Tensor) -> Self {
            let (channels, n) = rows.dims2().unwrap();
            let mean = rows.mean_keepdim(1).unwrap();
            let m2 = rows
                .broadcast_sub(&mean)
                .unwrap()
                .sqr()
                .unwrap()
                .sum_keepdim(1)
                .unwrap();
            let count = Tensor::full(n as f64, (channels, 1), &Device::Cpu).unwrap();
            let stats = Tensor::cat(&[&count, &mean, &m2], 1).unwrap();
            Self(stats.unsqueeze(0).unwrap())
        }
    }

    impl Collective for OtherRank {
        fn world_size(&self) -> usize {
            2
        }
        fn rank(&self) -> usize {
            0
        }
        fn all_gather(&self, t: &Tensor, dim: usize) -> Result<Tensor> {
            Tensor::cat(&[t, &self.0], dim)
        }
    }

    /// At one rank the synchronised statistics are the batch's own: output, running statistics
    /// and the gradients of input, weight and bias equal the fused op's in f64.
    #[test]
    fn one_rank_equals_the_fused_batch_norm() {
        let (plain_store, synced_store) = (ParamStore::new(1), ParamStore::new(1));
        let (plain, synced) = (bn(&plain_store), bn(&synced_store));
        let x = Var::from_tensor(&rand_tensor(8, &[3, 10], DType::F64)).unwrap();
        let r = rand_tensor(9, &[3, 10], DType::F64);
        for relu in [false, true] {
            let y = plain
                .forward_channel_major(x.as_tensor(), relu, true)
                .unwrap();
            let ys = with_global_statistics(Arc::new(SingleProcess), || {
                synced
                    .forward_channel_major(x.as_tensor(), relu, true)
                    .unwrap()
            });
            assert!(max_abs_diff(&y, &ys) < 1e-12);
            let g = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            let gs = (&ys * &r).unwrap().sum_all().unwrap().backward().unwrap();
            let params = |s: &ParamStore| -> Vec<Tensor> {
                ["bn.weight", "bn.bias"]
                    .map(|n| s.vars().into_iter().find(|(k, _)| k == n).unwrap().1)
                    .map(|v| v.as_tensor().clone())
                    .to_vec()
            };
            let pairs = [(x.as_tensor().clone(), x.as_tensor().clone())]
                .into_iter()
                .chain(params(&plain_store).into_iter().zip(params(&synced_store)));
            for (a, b) in pairs {
                let d = max_abs_diff(g.get(&a).unwrap(), gs.get(&b).unwrap());
                assert!(d < 1e-10, "relu {relu}: gradient differs by {d}");
            }
        }
        assert!(max_abs_diff(plain.running_mean(), synced.running_mean()) < 1e-12);
        assert!(max_abs_diff(plain.running_var(), synced.running_var()) < 1e-12);
        assert!(
            current().is_none(),
            "the scope's end restores the unsynchronised setting"
        );
    }

    /// A rank holding 4 of a batch's 10 rows, the other rank the remaining 6: its output is the
    /// full batch's first 4 columns and the running statistics are the full batch's (count 10,
    /// unbiased over 10), as one process with the whole batch computes them.
    #[test]
    fn a_shard_is_normalised_with_the_global_batch_statistics() {
        let (whole_store, shard_store) = (ParamStore::new(2), ParamStore::new(2));
        let (whole, shard) = (bn(&whole_store), bn(&shard_store));
        let x = rand_tensor(10, &[3, 10], DType::F64);
        let (mine, theirs) = (x.narrow(1, 0, 4).unwrap(), x.narrow(1, 4, 6).unwrap());
        let want = whole.forward_channel_major(&x, true, true).unwrap();
        let got = with_global_statistics(Arc::new(OtherRank::holding(&theirs)), || {
            shard.forward_channel_major(&mine, true, true).unwrap()
        });
        assert!(max_abs_diff(&got, &want.narrow(1, 0, 4).unwrap()) < 1e-12);
        assert!(max_abs_diff(whole.running_mean(), shard.running_mean()) < 1e-12);
        assert!(max_abs_diff(whole.running_var(), shard.running_var()) < 1e-12);
        // Outside the scope the shard uses its own 4 rows: a different output.
        let own = shard.forward_channel_major(&mine, true, true).unwrap();
        assert!(max_abs_diff(&own, &got) > 1e-3);
    }

    /// A rank holding one row of a 10-row batch (one value a channel, which an unsynchronised
    /// train-mode batch norm refuses) is normalised with the statistics of all 10.
    #[test]
    fn a_rank_with_one_row_is_normalised_with_the_global_statistics() {
        let (whole_store, shard_store) = (ParamStore::new(2), ParamStore::new(2));
        let (whole, shard) = (bn(&whole_store), bn(&shard_store));
        let x = rand_tensor(13, &[3, 10], DType::F64);
        let (mine, theirs) = (x.narrow(1, 0, 1).unwrap(), x.narrow(1, 1, 9).unwrap());
        assert!(shard.forward_channel_major(&mine, false, true).is_err());
        let want = whole.forward_channel_major(&x, false, true).unwrap();
        let got = with_global_statistics(Arc::new(OtherRank::holding(&theirs)), || {
            shard.forward_channel_major(&mine, false, true).unwrap()
        });
        assert!(max_abs_diff(&got, &want.narrow(1, 0, 1).unwrap()) < 1e-12);
        assert!(max_abs_diff(whole.running_var(), shard.running_var()) < 1e-12);
    }

    /// Outside [`with_global_statistics`], `standardize_rows` is batch norm without affine over the rows' own
    /// values: the batch-axis standardisation of `ssl_linalg` on the transposed rows; in bf16 the
    /// result keeps the input's dtype.
    #[test]
    fn standardized_rows_are_the_batch_axis_standardisation() {
        let x = rand_tensor(11, &[5, 12], DType::F64);
        let got = standardize_rows(&x, 1e-5).unwrap();
        let want = ssl_linalg::centre_and_scale_columns(
            &x.t().unwrap(),
            ssl_linalg::ColumnScale::BatchNorm { eps: 1e-5 },
        )
        .unwrap()
        .t()
        .unwrap();
        assert!(max_abs_diff(&got, &want) < 1e-12);
        let half = standardize_rows(&x.to_dtype(DType::BF16).unwrap(), 1e-5).unwrap();
        assert_eq!(half.dtype(), DType::BF16);
        assert!(max_abs_diff(&half.to_dtype(DType::F64).unwrap(), &want) < 3e-2);
    }

    /// Inside the scope a shard of 4 of 10 rows is standardised with the statistics of all 10:
    /// the whole batch's first 4 columns, not the shard's own standardisation.
    #[test]
    fn a_shard_is_standardized_with_the_global_batch_statistics() {
        let x = rand_tensor(12, &[3, 10], DType::F64);
        let (mine, theirs) = (x.narrow(1, 0, 4).unwrap(), x.narrow(1, 4, 6).unwrap());
        let want = standardize_rows(&x, 1e-5).unwrap().narrow(1, 0, 4).unwrap();
        let got = with_global_statistics(Arc::new(OtherRank::holding(&theirs)), || {
            standardize_rows(&mine, 1e-5).unwrap()
        });
        assert!(max_abs_diff(&got, &want) < 1e-12);
        let own = standardize_rows(&mine, 1e-5).unwrap();
        assert!(max_abs_diff(&own, &got) > 1e-3);
    }
}
