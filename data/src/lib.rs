//! Datasets, augmentations and the multi-view loader of candle-ssl.
//!
//! * [`dataset`]: the in-memory [`Dataset`] container (flat `f32` samples plus labels).
//! * [`digits`](mod@digits): the vendored UCI 8x8 handwritten digits, bilinearly upsampled.
//! * [`gmm`]: the synthetic 2D Gaussian mixture of IConE Appendix E.
//! * [`folder`]: ImageNet-style image folders (torchvision `ImageFolder` order), decoded to RGB
//!   at `S × S` or kept at their aspect ratio for crops from the whole image.
//! * [`split`]: deterministic stratified train/test splits.
//! * [`augment`]: per-view stochastic transforms ([`ViewTransform`]).
//! * [`pipeline`]: torchvision-style 2D augmentations and the seeds' named recipes, built on
//!   [`resample`] (antialiased resize), [`color`] (jitter, grayscale, solarise, normalise)
//!   and [`blur`].
//! * [`volume`]: IConE's 3D augmentations.
//! * [`crop`]: multi-crop local views (torchvision's random resized crop box).
//! * [`loader`]: the deterministic, rayon-parallel multi-view batch loader ([`ViewLoader`]).
//! * [`source`]: every data set a run can name, as one [`DataSource`].
//! * [`medmnist`]: the 18 MedMNIST datasets' facts and their `.npz` files as a [`Dataset`].
//! * [`npy`]: NumPy `.npy` arrays and `.npz` archives.
//! * [`archive`]: the benchmark sets read from their official archives into an 8-bit cache:
//!   [`cifar`] (CIFAR-10/100, through a private Python-pickle reader), [`stl10`],
//!   [`tiny_imagenet`].
//! * `download` (feature `download`): `ssl data download`, the MedMNIST files and the benchmark
//!   archives fetched and verified into their default directories ([`default_medmnist_root`],
//!   [`default_benchmark_root`]).
//!
//! # Example
//!
//! The embedded digits, a stratified split, and a loader making two noisy views of each training
//! instance, the same on every run:
//!
//! ```
//! use std::sync::Arc;
//! use ssl_data::{clean_batch, digits, stratified_split, GaussianJitter, ViewLoader};
//!
//! let data = Arc::new(digits(8)?); // the original 8×8 pixels, scaled to [0, 1]
//! assert_eq!((data.len(), data.num_classes), (1797, 10));
//! assert_eq!(data.shape, [1, 8, 8]);
//!
//! let (train, test) = stratified_split(&data.labels, 0.2, 0)?;
//! assert_eq!(train.len() + test.len(), data.len());
//! assert!(train.iter().all(|i| test.binary_search(i).is_err()));
//!
//! // Batches of 64 instances × 2 views, the last partial batch dropped, seed 0.
//! let jitter = Arc::new(GaussianJitter { std: 0.1 });
//! let loader = ViewLoader::new(data.clone(), train.clone(), 64, 2, true, 0, vec![jitter])?;
//! assert_eq!(loader.steps_per_epoch(), train.len() / 64);
//! let batch = loader.epoch(0).next().unwrap();
//! assert_eq!(batch.views.len(), 2 * 64 * 64); // [V, B, 1, 8, 8]
//! assert_ne!(batch.view(0), batch.view(1));
//! assert_eq!(Some(&batch), loader.epoch(0).next().as_ref()); // reproducible
//!
//! // Instance ids are positions in `train`; the views are noisy copies of those samples.
//! let rows: Vec<usize> = batch.instance_ids.iter().map(|&k| train[k as usize]).collect();
//! let clean = clean_batch(&data, &rows);
//! let noise = batch.view(0).iter().zip(&clean).map(|(v, c)| (v - c).powi(2)).sum::<f32>();
//! let std = (noise / clean.len() as f32).sqrt();
//! assert!((std - 0.1).abs() < 0.01, "{std}");
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod archive;
pub mod augment;
pub mod benchmark;
pub mod blur;
mod cache;
pub mod caltech256;
pub mod cifar;
pub mod color;
pub mod crop;
pub mod dataset;
pub mod digits;
#[cfg(feature = "download")]
pub mod download;
pub mod folder;
pub mod gmm;
pub mod loader;
pub mod medmnist;
pub mod npy;
mod pickle;
pub mod pipeline;
pub mod resample;
mod roots;
pub mod scans;
pub mod source;
pub mod split;
pub mod stl10;
pub mod stored;
pub mod tiny_imagenet;
pub mod volume;

pub use archive::{archive_info, synthetic_pixel, ArchiveInfo, Benchmark, ARCHIVES};
pub use augment::{
    apply_affine, AffineParams, DigitsAugment, GaussianJitter, Identity, ViewTransform,
};
pub use benchmark::{load_benchmark, write_synthetic_archive};
pub use color::Normalization;
pub use crop::{random_resized_crop_box, resize_center_crop, resized_image_crop, LocalCrop};
pub use dataset::{Dataset, ImageEntry, Samples};
pub use digits::{bilinear_resize, digits, DEFAULT_DIGITS_SIZE};
pub use folder::{
    load_image_folder, load_image_folder_kept, write_synthetic_folder, ImageFolder, IMAGENET100,
};
pub use gmm::gaussian_mixture;
pub use loader::{clean_batch, mix_seed, Prefetch, ViewBatch, ViewLoader, ViewType};
pub use medmnist::{
    load_medmnist, load_npz, medmnist_info, npz_geometry, write_digits_as_medmnist,
    write_medmnist_npz, MedMnist, MedMnistInfo, MedMnistTask, NpzLayout,
};
pub use pipeline::{ImageAugment, ImageViewParams, JitterOp, Pipeline, Recipe, ViewTypes};
pub use resample::Interpolation;
pub use roots::{default_benchmark_root, default_medmnist_root, user_cache};
pub use source::DataSource;
pub use split::{imbalanced_subset, stratified_split, stratified_subset};
pub use stored::{CropBox, StoredImage};
pub use volume::{VolumeAugment, VolumeViewParams};
