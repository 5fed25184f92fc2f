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
//! * [`medmnist`]: the 18 MedMNIST datasets' facts and their `.npz` files as a [`Dataset`].
//! * [`npy`]: NumPy `.npy` arrays and `.npz` archives.
//! * [`archive`]: the benchmark sets read from their official archives into an 8-bit cache:
//!   [`cifar`] (CIFAR-10/100, through a private Python-pickle reader), [`stl10`],
//!   [`tiny_imagenet`].

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
pub mod folder;
pub mod gmm;
pub mod loader;
pub mod medmnist;
pub mod npy;
mod pickle;
pub mod pipeline;
pub mod resample;
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
    write_medmnist_npz, MedMnist, MedMnistInfo, NpzLayout,
};
pub use pipeline::{ImageAugment, ImageViewParams, JitterOp, Pipeline, Recipe, ViewTypes};
pub use resample::Interpolation;
pub use split::{imbalanced_subset, stratified_split, stratified_subset};
pub use stored::{CropBox, StoredImage};
pub use volume::{VolumeAugment, VolumeViewParams};
