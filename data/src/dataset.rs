//! The in-memory dataset container shared by every data source.
//!
//! Samples are stored flat and contiguous: sample `i` occupies
//! `images[i * sample_len() .. (i + 1) * sample_len()]`, laid out per `shape`
//! (e.g. `[1, 16, 16]` for a grayscale image, `[2]` for a 2D point).

use serde::{Deserialize, Serialize};

/// A labelled, in-memory dataset of fixed-shape `f32` samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dataset {
    /// Human-readable name (e.g. `"digits"`, `"gmm"`).
    pub name: String,
    /// All samples, flat, `len() * sample_len()` values.
    pub images: Vec<f32>,
    /// One label per sample, in `0..num_classes`.
    pub labels: Vec<u32>,
    /// Per-sample shape, e.g. `[1, 16, 16]` or `[2]`.
    pub shape: Vec<usize>,
    /// Number of classes.
    pub num_classes: usize,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the dataset holds no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Number of `f32` values per sample (product of `shape`).
    pub fn sample_len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The flat values of sample `i`. Panics if `i >= len()`.
    pub fn sample(&self, i: usize) -> &[f32] {
        let n = self.sample_len();
        &self.images[i * n..(i + 1) * n]
    }

    /// A new dataset holding the samples at `indices`, in that order (repeats allowed).
    /// Panics if an index is out of range.
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        let n = self.sample_len();
        let mut images = Vec::with_capacity(indices.len() * n);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            images.extend_from_slice(self.sample(i));
            labels.push(self.labels[i]);
        }
        Dataset {
            name: self.name.clone(),
            images,
            labels,
            shape: self.shape.clone(),
            num_classes: self.num_classes,
        }
    }

    /// Number of samples per class (length `num_classes`).
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.num_classes];
        for &l in &self.labels {
            counts[l as usize] += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Dataset {
        Dataset {
            name: "toy".into(),
            images: (0..8).map(|v| v as f32).collect(),
            labels: vec![0, 1, 0, 1],
            shape: vec![2],
            num_classes: 2,
        }
    }

    #[test]
    fn accessors_and_subset() {
        let d = toy();
        assert_eq!(d.len(), 4);
        assert!(!d.is_empty());
        assert_eq!(d.sample_len(), 2);
        assert_eq!(d.sample(2), &[4.0, 5.0]);
        let s = d.subset(&[3, 0]);
        assert_eq!(s.len(), 2);
        assert_eq!(s.images, vec![6.0, 7.0, 0.0, 1.0]);
        assert_eq!(s.labels, vec![1, 0]);
        assert_eq!(s.shape, vec![2]);
        assert_eq!(d.class_counts(), vec![2, 2]);
    }
}
