//! The online linear probe: a linear classifier trained during pretraining on the encoder's
//! detached features of the global views, with its own learning rate (`train.probe_lr`) and
//! the backbone's optimiser and schedule, evaluated by the epoch monitor on clean test images.
//! Its cross-entropy cannot move the encoder.
//!
//! **The probe standardises its input**, as the offline probe does (train-statistics
//! standardisation) and as MAE's linear-probe head does (a batch norm without affine parameters
//! before the linear layer). In training each feature is centred and scaled by the global
//! batch's mean and variance (the rows of every rank, gathered, so that a data-parallel run
//! equals one process). Without it the probe stayed at chance on ViT-T features (10 % on the
//! digits after 10 epochs of MAE, at a probe rate of 0.1, 0.01 or 0.001, where the offline probe
//! gave 94 %): a ViT's class token varies little around a large common offset, which an
//! unnormalised linear layer trained by AdamW does not get past.
//!
//! **In evaluation the statistics are those of the clean train images' features**, which the
//! monitor embeds for the k-NN anyway: re-estimated for the weights being evaluated, as "precise
//! batch norm" re-estimates population statistics (Wu & Johnson, "Rethinking 'Batch' in
//! BatchNorm", 2021, §3), and as the offline probe standardises. Running averages of the
//! training batches' statistics (a batch norm's momentum 0.1, which this probe kept before)
//! describe augmented views under weights several steps old; where an objective learns no
//! invariance to the augmentation they standardise clean features far off. I-JEPA on a ViT-T,
//! 10 epochs: the running statistics' mean sat 0.52 feature standard deviations from the clean
//! features', their variance 2.3× theirs, and the probe read 20.8 %; the clean statistics give
//! 53.1 % (54 % and 82 % with `data.augment: none`). VICReg on the same ViT-T: 55.0 and 56.1 %;
//! the main job: 98.3 and 98.1 % (one test image of 360). A linear layer on standardised
//! features is still a linear classifier of the features.

use anyhow::Result;
use candle_core::{DType, Tensor, D};
use candle_nn::{Linear, Module, VarBuilder};
use ssl_core::Collective;

/// Added to the variance before its square root.
const EPS: f64 = 1e-5;

/// The probe: `probe.weight` `[K, F]` and `probe.bias` `[K]`.
#[derive(Debug, Clone)]
pub struct OnlineProbe {
    linear: Linear,
}

impl OnlineProbe {
    /// A probe from `features` features to `classes` classes under `vb` (`probe`).
    pub fn new(features: usize, classes: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            linear: candle_nn::linear(features, classes, vb)?,
        })
    }

    /// The training cross-entropy on `features` `[V·B, F]` of `views` views (detached here),
    /// each instance's label repeated per view, standardised with the statistics of every
    /// rank's rows.
    pub fn loss(
        &self,
        features: &Tensor,
        labels: &[u32],
        views: usize,
        collective: &dyn Collective,
    ) -> Result<Tensor> {
        let features = features.detach();
        let all = collective.all_gather(&features, 0)?;
        let logits = self.linear.forward(&standardised(&features, &all)?)?;
        let targets = Tensor::new(labels.repeat(views).as_slice(), features.device())?;
        Ok(candle_nn::loss::cross_entropy(&logits, &targets)?)
    }

    /// Predicted classes of eval-mode `features` `[N, F]`, standardised with the statistics
    /// of `reference` `[M, F]`: the same encoder's features of the clean train images.
    pub fn predict(&self, features: &Tensor, reference: &Tensor) -> Result<Vec<u32>> {
        let logits = self.linear.forward(&standardised(features, reference)?)?;
        Ok(logits.argmax(D::Minus1)?.to_dtype(DType::U32)?.to_vec1()?)
    }
}

/// `(x − mean) / √(var + EPS)` per column of `x` `[N, F]`, with the mean and (biased) variance
/// of the columns of `reference` `[M, F]`.
fn standardised(x: &Tensor, reference: &Tensor) -> Result<Tensor> {
    let mean = reference.mean(0)?;
    let var = reference.broadcast_sub(&mean)?.sqr()?.mean(0)?;
    let scale = (var + EPS)?.sqrt()?;
    Ok(x.broadcast_sub(&mean)?.broadcast_div(&scale)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use ssl_core::testing::randn;
    use ssl_core::{ParamStore, SingleProcess};

    /// Rank 0 of two whose other rank holds `other`'s rows.
    struct WithOtherRank(Tensor);

    impl Collective for WithOtherRank {
        fn world_size(&self) -> usize {
            2
        }
        fn rank(&self) -> usize {
            0
        }
        fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
            Tensor::cat(&[t, &self.0], dim)
        }
    }

    fn probe(seed: u64, features: usize, classes: usize) -> (ParamStore, OnlineProbe) {
        let store = ParamStore::new(seed);
        let vb = store.var_builder(&Device::Cpu).pp("probe");
        let probe = OnlineProbe::new(features, classes, vb).unwrap();
        (store, probe)
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Training: cross-entropy of the linear layer on the columns standardised by the batch's
    /// mean and (biased) variance; prediction standardises with the reference features'. Columns
    /// of offset 50 and spread 0.01 (a ViT class token's shape) are standardised like any other.
    /// The probe holds its weight and bias only.
    #[test]
    fn it_trains_on_batch_standardised_features_and_predicts_with_the_references() {
        let (store, probe) = probe(0, 3, 2);
        let shaped = || {
            let raw = randn(0f32, 1.0, (6, 3), &Device::Cpu).unwrap();
            let scales = Tensor::new(&[[1f32, 0.01, 4.0]], &Device::Cpu).unwrap();
            let offsets = Tensor::new(&[[0f32, 50.0, -2.0]], &Device::Cpu).unwrap();
            raw.broadcast_mul(&scales)
                .unwrap()
                .broadcast_add(&offsets)
                .unwrap()
        };
        let (x, reference) = (shaped(), shaped());
        let by_hand = |x: &Tensor, by: &Tensor| {
            let mean = by.mean(0).unwrap();
            let var = by
                .broadcast_sub(&mean)
                .unwrap()
                .sqr()
                .unwrap()
                .mean(0)
                .unwrap();
            let scale = (&var + EPS).unwrap().sqrt().unwrap();
            let z = x
                .broadcast_sub(&mean)
                .unwrap()
                .broadcast_div(&scale)
                .unwrap();
            probe.linear.forward(&z).unwrap()
        };
        let labels = [0u32, 1, 1];
        let ce = probe.loss(&x, &labels, 2, &SingleProcess).unwrap();
        let targets = Tensor::new(&[0u32, 1, 1, 0, 1, 1], &Device::Cpu).unwrap();
        let expected = candle_nn::loss::cross_entropy(&by_hand(&x, &x), &targets).unwrap();
        let (ce, expected) = (
            ce.to_scalar::<f32>().unwrap(),
            expected.to_scalar::<f32>().unwrap(),
        );
        assert!((ce - expected).abs() < 1e-6, "{ce} vs {expected}");

        let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["probe.bias", "probe.weight"]);
        let argmax: Vec<u32> = by_hand(&x, &reference)
            .argmax(D::Minus1)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(probe.predict(&x, &reference).unwrap(), argmax);
    }

    /// The probe's loss reaches no feature (the backbone gets no gradient from it).
    #[test]
    fn its_loss_sends_no_gradient_to_the_features() {
        let (_store, probe) = probe(0, 4, 3);
        let x = Var::from_tensor(&randn(0f32, 1.0, (5, 4), &Device::Cpu).unwrap()).unwrap();
        let ce = probe
            .loss(x.as_tensor(), &[0, 1, 2, 0, 1], 1, &SingleProcess)
            .unwrap();
        let grads = ce.backward().unwrap();
        assert!(grads.get(x.as_tensor()).is_none());
        assert!(grads.get(&probe.linear.weight().clone()).is_some());
    }

    /// Two ranks, each with half the batch, standardise with the whole batch's statistics:
    /// the mean of their gradients is one process's gradient.
    #[test]
    fn two_ranks_standardise_as_one_process() {
        let x = randn(0f32, 1.0, (8, 4), &Device::Cpu).unwrap();
        let labels = [0u32, 1, 2, 0, 2, 1, 1, 0];
        let (_s, whole) = probe(5, 4, 3);
        let ce = whole.loss(&x, &labels, 1, &SingleProcess).unwrap();
        let g_whole = ce.backward().unwrap();
        let g_whole = values(g_whole.get(whole.linear.weight()).unwrap());

        let (a, b) = (x.narrow(0, 0, 4).unwrap(), x.narrow(0, 4, 4).unwrap());
        let mut mean_grad = vec![0f32; g_whole.len()];
        for (mine, theirs, labels) in [(&a, &b, &labels[..4]), (&b, &a, &labels[4..])] {
            let (_s, rank) = probe(5, 4, 3);
            let ce = rank
                .loss(mine, labels, 1, &WithOtherRank(theirs.clone()))
                .unwrap();
            let g = ce.backward().unwrap();
            for (m, g) in mean_grad
                .iter_mut()
                .zip(values(g.get(rank.linear.weight()).unwrap()))
            {
                *m += g / 2.0;
            }
        }
        for (m, w) in mean_grad.iter().zip(&g_whole) {
            assert!((m - w).abs() < 1e-6, "{mean_grad:?} vs {g_whole:?}");
        }
    }
}
