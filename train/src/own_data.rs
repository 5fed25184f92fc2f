//! Images of your own, held in memory, as a run's data set in place of `data.name`'s.
//!
//! The samples are `f32` values of one shape (`[C, H, W]` images, `[C, D, H, W]` volumes,
//! `[F]` vectors). Labelled samples are split into train and a held-out `data.test_fraction`,
//! stratified by `data.split_seed` (else the run seed): the end-of-run table's linear probe,
//! k-NN and clustering scores are measured against their labels. Samples without labels
//! ([`OwnImages::with_unlabelled`]) join the pretraining only, as STL-10's unlabeled split does;
//! the online probe, which learns from the batches' labels, must then be off
//! (`train.probe_lr: 0`). The training views follow
//! `data.augment` (default: the recipe of `data.name`, the digits' unless set), so images should
//! hold values in the range that recipe expects (`[0, 1]` for the image recipes).

use std::hash::{Hash, Hasher};

use anyhow::{bail, ensure, Result};
use ssl_data::{Dataset, Samples};

/// Samples in memory, labelled ones first; see the module docs.
pub struct OwnImages {
    dataset: Dataset,
    /// How many of the last samples have no label (their `dataset.labels` are placeholders).
    unlabelled: usize,
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
        check_finite(&pixels, sample_len, 0)?;
        let num_classes = labels.iter().max().map_or(0, |&c| c as usize + 1);
        let mut images = Self {
            dataset: Dataset {
                name: String::new(),
                samples: Samples::F32(pixels),
                labels,
                shape: shape.to_vec(),
                num_classes,
            },
            unlabelled: 0,
        };
        images.name_by_values();
        Ok(images)
    }

    /// Adds samples without labels (`pixels`, one sample of the labelled ones' shape after
    /// another), for pretraining only.
    pub fn with_unlabelled(mut self, pixels: Vec<f32>) -> Result<Self> {
        let shape = &self.dataset.shape;
        let sample_len: usize = shape.iter().product();
        ensure!(
            pixels.len().is_multiple_of(sample_len),
            "unlabelled samples of shape {shape:?} take {sample_len} values each, got {} values",
            pixels.len()
        );
        let Samples::F32(values) = &mut self.dataset.samples else {
            unreachable!("OwnImages holds f32 samples")
        };
        check_finite(&pixels, sample_len, values.len() / sample_len)?;
        let added = pixels.len() / sample_len;
        values.extend(pixels);
        self.dataset.labels.extend(std::iter::repeat_n(0, added));
        self.unlabelled += added;
        self.name_by_values();
        Ok(self)
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

    /// The number of samples, with and without labels.
    pub fn len(&self) -> usize {
        self.dataset.labels.len()
    }

    /// The number of samples without labels.
    pub fn unlabelled(&self) -> usize {
        self.unlabelled
    }

    /// Whether there are no samples (never: [`OwnImages::new`] needs two).
    pub fn is_empty(&self) -> bool {
        self.dataset.labels.is_empty()
    }

    /// The data set, and how many of its last samples have no label.
    pub(crate) fn into_parts(self) -> (Dataset, usize) {
        (self.dataset, self.unlabelled)
    }

    /// Names the data set by its values, so that evaluations cached by data set never mix two
    /// sets.
    fn name_by_values(&mut self) {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let d = &self.dataset;
        (&d.shape, &d.labels, self.unlabelled).hash(&mut hasher);
        if let Samples::F32(values) = &d.samples {
            values.iter().for_each(|v| v.to_bits().hash(&mut hasher));
        }
        self.dataset.name = format!("own-{:016x}", hasher.finish());
    }
}

/// Refuses a non-finite value, naming its sample (counted from `first`) and position.
fn check_finite(pixels: &[f32], sample_len: usize, first: usize) -> Result<()> {
    match pixels.iter().position(|v| !v.is_finite()) {
        Some(i) => bail!(
            "sample {} holds a non-finite value ({}) at position {}; replace it before training",
            first + i / sample_len,
            pixels[i],
            i % sample_len
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;
    use crate::setup;

    /// `n` 2-D points in 4 classes, 20 of each class for `n` = 80.
    fn points(n: usize) -> (Vec<f32>, Vec<u32>) {
        let labels: Vec<u32> = (0..n as u32).map(|i| i % 4).collect();
        let pixels = labels
            .iter()
            .enumerate()
            .flat_map(|(i, &c)| [c as f32 + 0.01 * i as f32, -(c as f32)])
            .collect();
        (pixels, labels)
    }

    fn message(e: anyhow::Error) -> String {
        format!("{e:#}")
    }

    #[test]
    fn shapes_counts_and_values_are_checked_naming_the_sample() {
        let (pixels, labels) = points(80);
        let short = OwnImages::new(&[2], pixels[..10].to_vec(), labels.clone());
        assert!(message(short.err().unwrap()).contains("80 labels need 160 values"));
        let mut bad = pixels.clone();
        bad[7] = f32::NAN;
        let nan = OwnImages::new(&[2], bad, labels.clone()).err().unwrap();
        assert!(message(nan).contains("sample 3 holds a non-finite value (NaN) at position 1"));
        let zero = OwnImages::new(&[0, 2], pixels.clone(), labels)
            .err()
            .unwrap();
        assert!(message(zero).contains("non-zero sides"));
        let samples = (0..3).map(|i| (vec![i as f32; 2 + i % 2], 0));
        let ragged = OwnImages::from_samples(&[2], samples).err().unwrap();
        assert!(message(ragged).contains("sample 1 has 3 values"));
        let (pixels, labels) = points(8);
        let labelled = || OwnImages::new(&[2], pixels.clone(), labels.clone()).unwrap();
        let odd = labelled().with_unlabelled(vec![0.0; 3]).err().unwrap();
        assert!(message(odd).contains("take 2 values each, got 3 values"));
        let inf = labelled()
            .with_unlabelled(vec![0.0, 0.0, 0.0, f32::INFINITY])
            .err()
            .unwrap();
        assert!(message(inf).contains("sample 9 holds a non-finite value (inf) at position 1"));
    }

    #[test]
    fn labelled_samples_are_split_and_unlabelled_ones_only_pretrain() -> Result<()> {
        let (pixels, labels) = points(80);
        let images = OwnImages::new(&[2], pixels, labels)?.with_unlabelled(vec![0.5; 2 * 30])?;
        assert_eq!((images.len(), images.unlabelled()), (110, 30));
        let (dataset, unlabelled) = images.into_parts();
        let cfg = RunConfig::builder().set("train.probe_lr", 0.0).build()?;
        let split = setup::own_data(&cfg, dataset, unlabelled)?;
        assert_eq!(split.unlabeled, (80..110).collect::<Vec<_>>());
        assert_eq!(split.train.len() + split.test.len(), 80);
        assert!(split.train.iter().chain(&split.test).all(|&i| i < 80));
        // Stratified: every class in the test split.
        let mut classes: Vec<u32> = split
            .test
            .iter()
            .map(|&i| split.dataset.labels[i])
            .collect();
        classes.sort_unstable();
        classes.dedup();
        assert_eq!(classes, [0, 1, 2, 3]);
        Ok(())
    }

    #[test]
    fn unlabelled_samples_need_the_online_probe_off() -> Result<()> {
        let (pixels, labels) = points(80);
        let (dataset, unlabelled) = OwnImages::new(&[2], pixels, labels)?
            .with_unlabelled(vec![0.5; 4])?
            .into_parts();
        let Err(e) = setup::own_data(&RunConfig::default(), dataset, unlabelled) else {
            panic!("the online probe is on by default");
        };
        assert!(message(e).contains("2 of the images have no label"));
        Ok(())
    }

    #[test]
    fn the_name_follows_the_values() -> Result<()> {
        let (pixels, labels) = points(8);
        let a = OwnImages::new(&[2], pixels.clone(), labels.clone())?;
        let mut moved = pixels;
        moved[0] += 1.0;
        let b = OwnImages::new(&[2], moved, labels)?;
        assert_ne!(a.dataset.name, b.dataset.name);
        Ok(())
    }
}
