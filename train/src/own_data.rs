//! Images of your own, held in memory, as a run's data set in place of `data.name`'s.
//!
//! The samples are `f32` values of one shape (`[C, H, W]` images, `[C, D, H, W]` volumes,
//! `[F]` vectors), each with a class label: the end-of-run table's linear probe, k-NN and
//! clustering scores are measured against the labels on a held-out `data.test_fraction` of
//! them, drawn stratified by `data.split_seed` (else the run seed). The training views follow
//! `data.augment` (default: the recipe of `data.name`, the digits' unless set), so images should
//! hold values in the range that recipe expects (`[0, 1]` for the image recipes).

use std::hash::{Hash, Hasher};

use anyhow::{bail, ensure, Result};
use ssl_data::{Dataset, Samples};

/// Labelled samples in memory; see the module docs.
pub struct OwnImages {
    dataset: Dataset,
}

impl OwnImages {
    /// `pixels` holds the samples one after another, each of `shape`; `labels` one class per
    /// sample, numbered from 0.
    pub fn new(shape: &[usize], pixels: Vec<f32>, labels: Vec<u32>) -> Result<Self> {
        ensure!(
            !shape.is_empty() && !shape.contains(&0),
            "the sample shape must have non-zero sides, e.g. [1, 28, 28]; got {shape:?}"
        );
        let sample_len: usize = shape.iter().product();
        ensure!(
            pixels.len() == labels.len() * sample_len,
            "{} labels need {} values of samples {shape:?} ({sample_len} each), got {} values",
            labels.len(),
            labels.len() * sample_len,
            pixels.len()
        );
        ensure!(
            labels.len() >= 2,
            "a run needs at least 2 samples to train and evaluate on, got {}",
            labels.len()
        );
        if let Some(i) = pixels.iter().position(|v| !v.is_finite()) {
            bail!(
                "sample {} holds a non-finite value ({}) at position {}; replace it before training",
                i / sample_len,
                pixels[i],
                i % sample_len
            );
        }
        let num_classes = labels.iter().max().map_or(0, |&c| c as usize + 1);
        // The name identifies the values, so evaluations cached by data set never mix two sets.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (shape, &labels).hash(&mut hasher);
        pixels.iter().for_each(|v| v.to_bits().hash(&mut hasher));
        Ok(Self {
            dataset: Dataset {
                name: format!("own-{:016x}", hasher.finish()),
                samples: Samples::F32(pixels),
                labels,
                shape: shape.to_vec(),
                num_classes,
            },
        })
    }

    /// Collects `(sample, label)` pairs, each sample `shape`'s values in order.
    pub fn from_samples(
        shape: &[usize],
        samples: impl IntoIterator<Item = (Vec<f32>, u32)>,
    ) -> Result<Self> {
        let sample_len: usize = shape.iter().product();
        let (mut pixels, mut labels) = (Vec::new(), Vec::new());
        for (i, (values, label)) in samples.into_iter().enumerate() {
            ensure!(
                values.len() == sample_len,
                "sample {i} has {} values, samples of shape {shape:?} have {sample_len}",
                values.len()
            );
            pixels.extend(values);
            labels.push(label);
        }
        Self::new(shape, pixels, labels)
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.dataset.labels.len()
    }

    /// Whether there are no samples (never: [`OwnImages::new`] needs two).
    pub fn is_empty(&self) -> bool {
        self.dataset.labels.is_empty()
    }

    pub(crate) fn into_dataset(self) -> Dataset {
        self.dataset
    }
}
