//! The dataset container shared by every data source.
//!
//! Samples are stored sample-major: sample `i` occupies the `i`-th block of `sample_len()`
//! values, laid out per `shape` (e.g. `[1, 16, 16]` for a grayscale image, `[2]` for a 2D point).
//! They are either decoded `f32` values or stored 8-bit pixels — in memory or memory-mapped from
//! a cache file, so a large image set is never held decoded — read as `v / 255`.
//!
//! An image folder kept at full resolution ([`Samples::Images`]) stores each image at its own
//! size instead; its sample is the `[C, S, S]` evaluation view of that image, and the loader's
//! training views crop the stored image itself ([`Dataset::image`]).

use std::borrow::Cow;
use std::sync::Arc;

use crate::crop::resize_center_crop;
use crate::stored::StoredImage;

/// Where a dataset's sample values live.
#[derive(Clone)]
pub enum Samples {
    /// Decoded values, `len() * sample_len()` of them.
    F32(Vec<f32>),
    /// 8-bit pixels, `sample_len()` bytes per sample, read as `v / 255`. With
    /// `channels_last = Some(C)` each sample is stored `[…, C]` (e.g. HWC) and read as the
    /// dataset's channels-first `shape` `[C, …]`.
    U8 {
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
        channels_last: Option<usize>,
    },
    /// 16-bit values, `2 · sample_len()` bytes per sample (little-endian `u16`), stored in the
    /// dataset's own channels-first layout and read as `v / 65535`: scans mapped to `[0, 1]`
    /// with 65,536 levels ([`crate::scans`]), so a 16-bit source keeps its precision.
    U16(Arc<dyn AsRef<[u8]> + Send + Sync>),
    /// 8-bit images of their own sizes, each stored HWC (`[H, W, C]`, `C` = `shape[0]`) at
    /// `images[i].offset` in `bytes`: a folder kept at full resolution (`data.keep_side`). Sample
    /// `i` reads as the dataset's `[C, S, S]` evaluation view of image `i` (torchvision's
    /// `Resize(S)` of the shorter side, bilinear, then `CenterCrop(S)`; `docs/spec/data.md` §2.2).
    Images {
        bytes: Arc<dyn AsRef<[u8]> + Send + Sync>,
        images: Arc<[ImageEntry]>,
    },
}

/// Where one image of [`Samples::Images`] is stored and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageEntry {
    /// Byte offset of its first pixel.
    pub offset: usize,
    pub height: usize,
    pub width: usize,
}

impl std::fmt::Debug for Samples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Samples::F32(v) => write!(f, "F32({} values)", v.len()),
            Samples::U8 {
                bytes,
                channels_last,
            } => write!(
                f,
                "U8({} bytes, channels_last {channels_last:?})",
                (**bytes).as_ref().len()
            ),
            Samples::U16(bytes) => write!(f, "U16({} bytes)", (**bytes).as_ref().len()),
            Samples::Images { bytes, images } => write!(
                f,
                "Images({} images, {} bytes)",
                images.len(),
                (**bytes).as_ref().len()
            ),
        }
    }
}

/// A labelled dataset of fixed-shape samples.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Human-readable name (e.g. `"digits"`, `"gmm"`).
    pub name: String,
    /// All samples.
    pub samples: Samples,
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

    /// The values of sample `i` in `shape`'s layout: borrowed when decoded, else decoded into a
    /// new buffer. Panics if `i >= len()`.
    pub fn sample(&self, i: usize) -> Cow<'_, [f32]> {
        let n = self.sample_len();
        match &self.samples {
            Samples::F32(values) => Cow::Borrowed(&values[i * n..(i + 1) * n]),
            Samples::U8 { .. } | Samples::U16(_) | Samples::Images { .. } => {
                let mut out = vec![0f32; n];
                self.sample_into(i, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Writes the values of sample `i` into `out` (`sample_len()` long). Panics if `i >= len()`.
    pub fn sample_into(&self, i: usize, out: &mut [f32]) {
        let n = self.sample_len();
        match &self.samples {
            Samples::F32(values) => out.copy_from_slice(&values[i * n..(i + 1) * n]),
            Samples::U8 {
                bytes,
                channels_last,
            } => {
                let stored = &(**bytes).as_ref()[i * n..(i + 1) * n];
                match *channels_last {
                    None | Some(1) => {
                        for (o, &v) in out.iter_mut().zip(stored) {
                            *o = f32::from(v) / 255.0;
                        }
                    }
                    Some(c) => {
                        let plane = n / c;
                        for (p, pixel) in stored.chunks_exact(c).enumerate() {
                            for (ch, &v) in pixel.iter().enumerate() {
                                out[ch * plane + p] = f32::from(v) / 255.0;
                            }
                        }
                    }
                }
            }
            Samples::U16(bytes) => {
                let stored = &(**bytes).as_ref()[2 * i * n..2 * (i + 1) * n];
                for (o, v) in out.iter_mut().zip(stored.chunks_exact(2)) {
                    *o = f32::from(u16::from_le_bytes([v[0], v[1]])) / 65535.0;
                }
            }
            Samples::Images { bytes, images } => {
                let image = self.stored(bytes, images[i]);
                resize_center_crop(image, self.shape[2], out);
            }
        }
    }

    /// Sample `i`'s stored image at its own size, for [`Samples::Images`]; `None` for
    /// fixed-shape samples. Panics if `i >= len()`.
    pub fn image(&self, i: usize) -> Option<StoredImage<'_>> {
        match &self.samples {
            Samples::Images { bytes, images } => Some(self.stored(bytes, images[i])),
            _ => None,
        }
    }

    /// The image at `entry` in `bytes`, of `shape[0]` channels.
    fn stored<'a>(
        &self,
        bytes: &'a Arc<dyn AsRef<[u8]> + Send + Sync>,
        entry: ImageEntry,
    ) -> StoredImage<'a> {
        let channels = self.shape[0];
        let len = entry.height * entry.width * channels;
        StoredImage {
            pixels: &(**bytes).as_ref()[entry.offset..entry.offset + len],
            height: entry.height,
            width: entry.width,
            channels,
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

    fn toy(samples: Samples, shape: Vec<usize>) -> Dataset {
        Dataset {
            name: "toy".into(),
            samples,
            labels: vec![0, 1, 0, 1],
            shape,
            num_classes: 2,
        }
    }

    #[test]
    fn accessors() {
        let d = toy(Samples::F32((0..8).map(|v| v as f32).collect()), vec![2]);
        assert_eq!(d.len(), 4);
        assert!(!d.is_empty());
        assert_eq!(d.sample_len(), 2);
        assert_eq!(&*d.sample(2), &[4.0, 5.0]);
        assert!(matches!(d.sample(2), Cow::Borrowed(_)));
        assert_eq!(d.class_counts(), vec![2, 2]);
    }

    #[test]
    fn stored_pixels_read_scaled_and_channels_first() {
        // Two 1×2 RGB images stored HWC: pixel p, channel c holds 10·(3p + c) (+ 60 for image 1).
        let bytes: Vec<u8> = (0..12)
            .map(|v| 10 * (v % 6) as u8 + 60 * (v / 6) as u8)
            .collect();
        let hwc = Samples::U8 {
            bytes: Arc::new(bytes.clone()),
            channels_last: Some(3),
        };
        let d = toy(hwc, vec![3, 1, 2]);
        let want: Vec<f32> = [60, 90, 70, 100, 80, 110]
            .iter()
            .map(|&v| v as f32 / 255.0)
            .collect();
        assert_eq!(&*d.sample(1), want.as_slice());
        let flat = toy(
            Samples::U8 {
                bytes: Arc::new(bytes),
                channels_last: None,
            },
            vec![6],
        );
        let mut out = vec![0f32; 6];
        flat.sample_into(0, &mut out);
        assert_eq!(out[1], 10.0 / 255.0);
    }

    #[test]
    fn sixteen_bit_samples_keep_their_levels() {
        let levels: [u16; 4] = [0, 1, 40_000, 65_535];
        let bytes: Vec<u8> = levels.iter().flat_map(|v| v.to_le_bytes()).collect();
        let d = toy(Samples::U16(Arc::new(bytes)), vec![1]);
        let read: Vec<f32> = (0..4).map(|i| d.sample(i)[0]).collect();
        assert_eq!(read, levels.map(|v| f32::from(v) / 65535.0));
        assert_ne!(read[0], read[1], "one level apart, unlike 8 bits");
    }
}
