//! The deterministic multi-view batch loader.
//!
//! A [`ViewLoader`] iterates over a subset of a [`Dataset`] in batches, producing `views`
//! independently augmented views of every instance. The *instance id* of a sample is its
//! position `k` in the loader's index subset (`0..N`), which is what instance-level objectives
//! (e.g. embedding tables) key on.
//!
//! Determinism: the epoch's order is a shuffle seeded from `(seed, epoch)`, and each view's RNG is
//! seeded from `(seed, epoch, instance id, view)`, so the output does not depend on the rayon
//! thread count or scheduling. Views are augmented in parallel with rayon on the current pool;
//! [`ViewLoader::prefetch`] builds an epoch's batches ahead on a background thread.
//!
//! Data parallelism: [`ViewLoader::with_shard`] makes the loader one rank's of `world`. The
//! epoch's order is the same on every rank, cut into global batches of `world × batch_size`;
//! rank `r` takes rows `r·B..(r+1)·B` of each. Views are seeded by instance id, so the ranks'
//! batches together are exactly the batch one process with `world × B` builds.
//!
//! Stored images: on a data set kept at full resolution ([`crate::Samples::Images`]), a view
//! type with a [`ViewType::from_image`] crop draws its random resized crop on the stored image's
//! own `H × W`, and multi-crop's local views likewise; other view types get the sample, the
//! `[C, S, S]` evaluation view.

use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::augment::ViewTransform;
use crate::crop::LocalCrop;
use crate::{Dataset, Samples};

/// Domain-separation tags for [`mix_seed`].
const TAG_ORDER: u64 = 0x006f_7264_6572; // "order"
const TAG_VIEW: u64 = 0x7669_6577; // "view"

/// Mixes a sequence of words into one 64-bit seed (SplitMix64 finaliser chained over the words).
pub fn mix_seed(words: &[u64]) -> u64 {
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for &w in words {
        h = splitmix(h ^ splitmix(w.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    }
    h
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How a [`ViewLoader`] makes one view type.
#[derive(Clone)]
pub struct ViewType {
    /// The view of a sample of the data set's shape.
    pub transform: Arc<dyn ViewTransform>,
    /// The same view from a stored image of its own size ([`Samples::Images`]): a random resized
    /// crop of the stored image at the sample's side, then the rest of the transform (for a 2D
    /// pipeline view type, [`crate::ImageAugment`] without its crop). `None`: `transform` of the
    /// sample.
    pub from_image: Option<LocalCrop>,
}

impl From<Arc<dyn ViewTransform>> for ViewType {
    fn from(transform: Arc<dyn ViewTransform>) -> Self {
        Self {
            transform,
            from_image: None,
        }
    }
}

impl<T: ViewTransform + 'static> From<Arc<T>> for ViewType {
    fn from(transform: Arc<T>) -> Self {
        Self::from(transform as Arc<dyn ViewTransform>)
    }
}

/// One batch of multi-view data. Two batches are equal when their values are: `made_in` is
/// how long this one took, not part of it.
#[derive(Debug, Clone)]
pub struct ViewBatch {
    /// View-major values, shape `[views_count, batch_size, sample_shape...]`.
    pub views: Vec<f32>,
    /// Instance id (position in the loader's subset) of each batch row.
    pub instance_ids: Vec<u32>,
    /// Class label of each batch row.
    pub labels: Vec<u32>,
    /// Number of instances in this batch (the last batch may be smaller unless `drop_last`).
    pub batch_size: usize,
    /// Number of (global) views per instance.
    pub views_count: usize,
    /// Multi-crop local views, view-major `[local_count, batch_size, local_shape...]`; empty
    /// without local crops.
    pub local_views: Vec<f32>,
    /// Number of local views per instance.
    pub local_count: usize,
    /// Shape of one local view (empty without local crops).
    pub local_shape: Vec<usize>,
    /// How long the views took to make.
    pub made_in: std::time::Duration,
}

impl PartialEq for ViewBatch {
    fn eq(&self, other: &Self) -> bool {
        let Self {
            views,
            instance_ids,
            labels,
            batch_size,
            views_count,
            local_views,
            local_count,
            local_shape,
            made_in: _,
        } = self;
        (views, instance_ids, labels, batch_size, views_count)
            == (
                &other.views,
                &other.instance_ids,
                &other.labels,
                &other.batch_size,
                &other.views_count,
            )
            && (local_views, local_count, local_shape)
                == (&other.local_views, &other.local_count, &other.local_shape)
    }
}

impl ViewBatch {
    /// The values of view `v` for all rows, shape `[batch_size, sample_shape...]`.
    pub fn view(&self, v: usize) -> &[f32] {
        let n = self.views.len() / self.views_count.max(1);
        &self.views[v * n..(v + 1) * n]
    }
}

/// Multi-view loader over a subset of a dataset.
#[derive(Clone)]
pub struct ViewLoader {
    dataset: Arc<Dataset>,
    indices: Vec<usize>,
    batch_size: usize,
    views: usize,
    drop_last: bool,
    seed: u64,
    view_types: Vec<ViewType>,
    local: Option<(usize, LocalCrop)>,
    /// This loader's rank and the number of ranks sharing each global batch.
    rank: usize,
    world: usize,
}

impl std::fmt::Debug for ViewLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewLoader")
            .field("dataset", &self.dataset.name)
            .field("instances", &self.indices.len())
            .field("batch_size", &self.batch_size)
            .field("views", &self.views)
            .field("drop_last", &self.drop_last)
            .field("seed", &self.seed)
            .field("local_views", &self.local_views())
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl ViewLoader {
    /// Builds a loader; `indices` are positions in `dataset` (instance `k` is `indices[k]`);
    /// view `v` of every instance is made by `view_types[v % view_types.len()]`.
    ///
    /// Errors if `batch_size`, `views` or `view_types` is empty, an index is out of range, the
    /// subset has more than `u32::MAX` instances, or a view type's crop of stored images makes
    /// views of another shape than the samples'.
    pub fn new(
        dataset: Arc<Dataset>,
        indices: Vec<usize>,
        batch_size: usize,
        views: usize,
        drop_last: bool,
        seed: u64,
        view_types: Vec<impl Into<ViewType>>,
    ) -> Result<Self> {
        let view_types: Vec<ViewType> = view_types.into_iter().map(Into::into).collect();
        if view_types.is_empty() {
            bail!("ViewLoader: at least one view transform is needed");
        }
        if batch_size == 0 {
            bail!("ViewLoader: batch_size must be at least 1");
        }
        if views == 0 {
            bail!("ViewLoader: views must be at least 1");
        }
        if let Some(&bad) = indices.iter().find(|&&i| i >= dataset.len()) {
            bail!(
                "ViewLoader: index {bad} out of range for dataset {:?} of {} samples",
                dataset.name,
                dataset.len()
            );
        }
        if indices.len() > u32::MAX as usize {
            bail!("ViewLoader: too many instances ({})", indices.len());
        }
        if matches!(dataset.samples, Samples::Images { .. }) {
            for crop in view_types.iter().filter_map(|t| t.from_image.as_ref()) {
                let shape = crop.output_shape(&dataset.shape)?;
                if shape != dataset.shape {
                    bail!(
                        "ViewLoader: a view type crops stored images to {shape:?}, but data set \
                         {:?} has samples of shape {:?}",
                        dataset.name,
                        dataset.shape
                    );
                }
            }
        }
        Ok(Self {
            dataset,
            indices,
            batch_size,
            views,
            drop_last,
            seed,
            view_types,
            local: None,
            rank: 0,
            world: 1,
        })
    }

    /// Makes this loader rank `rank` of `world`: `batch_size` stays per rank, each step's global
    /// batch is `world × batch_size` rows of the epoch order, and this rank yields its slice
    /// (see the module docs). Errors unless `rank < world` and every global batch can be split
    /// into equal shards (`drop_last`, or the instances a multiple of the global batch): ranks
    /// must gather batches of one size.
    pub fn with_shard(mut self, rank: usize, world: usize) -> Result<Self> {
        if rank >= world {
            bail!("ViewLoader: rank {rank} out of range for {world} ranks");
        }
        let (n, global) = (self.indices.len(), world * self.batch_size);
        if world > 1 && !self.drop_last && n % global != 0 {
            bail!(
                "{n} training instances end each epoch with a partial global batch of {} \
                 ({world} ranks × batch size {}), which cannot be split into equal shards; set \
                 train.drop_last=true",
                n % global,
                self.batch_size
            );
        }
        (self.rank, self.world) = (rank, world);
        Ok(self)
    }

    /// Number of ranks sharing each global batch (1 unless [`Self::with_shard`]).
    pub fn world(&self) -> usize {
        self.world
    }

    /// Adds `count` multi-crop local views per instance, made by `crop`; their random streams
    /// continue the view index after the global views, so global views are unchanged.
    pub fn with_local_views(mut self, count: usize, crop: LocalCrop) -> Result<Self> {
        if count > 0 {
            crop.output_shape(&self.dataset.shape)?;
        }
        self.local = (count > 0).then_some((count, crop));
        Ok(self)
    }

    /// Local views per instance (0 without multi-crop).
    pub fn local_views(&self) -> usize {
        self.local.as_ref().map_or(0, |(count, _)| *count)
    }

    /// The underlying dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// Dataset positions of the instances (instance `k` is `indices()[k]`).
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// Number of instances (N).
    pub fn num_instances(&self) -> usize {
        self.indices.len()
    }

    /// Configured batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Views per instance.
    pub fn views(&self) -> usize {
        self.views
    }

    /// Batches per epoch: `floor(N / G)` with `drop_last`, else `ceil(N / G)`, for the global
    /// batch `G = world × B`.
    pub fn steps_per_epoch(&self) -> usize {
        let (n, global) = (self.indices.len(), self.world * self.batch_size);
        if self.drop_last {
            n / global
        } else {
            n.div_ceil(global)
        }
    }

    /// The instance ids of `epoch` in visiting order (a permutation of `0..N`).
    pub fn epoch_order(&self, epoch: usize) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.indices.len() as u32).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(mix_seed(&[TAG_ORDER, self.seed, epoch as u64]));
        order.shuffle(&mut rng);
        order
    }

    /// Lazily yields the batches of `epoch`; each batch is augmented in parallel when pulled.
    pub fn epoch(&self, epoch: usize) -> impl Iterator<Item = ViewBatch> + '_ {
        let order = self.epoch_order(epoch);
        let steps = self.steps_per_epoch();
        let b = self.batch_size;
        let skip = self.rank * b;
        (0..steps).map(move |s| {
            let start = s * self.world * b + skip;
            let end = (start + b).min(order.len());
            self.make_batch(epoch, &order[start..end])
        })
    }

    /// The first `steps` batches of `epoch`, the same as [`Self::epoch`]'s, built on a background
    /// thread up to `depth` batches ahead of the consumer (augmenting on the global rayon pool),
    /// so a training step does not wait for its views.
    pub fn prefetch(self: &Arc<Self>, epoch: usize, steps: usize, depth: usize) -> Prefetch {
        self.prefetch_with(epoch, steps, depth, |batch| batch)
    }

    /// [`Self::prefetch`], each batch passed through `stage` on the background thread: the
    /// trainer makes the step's device tensors there, so that a batch's upload overlaps the
    /// steps before it.
    pub fn prefetch_with<T: Send + 'static>(
        self: &Arc<Self>,
        epoch: usize,
        steps: usize,
        depth: usize,
        mut stage: impl FnMut(ViewBatch) -> T + Send + 'static,
    ) -> Prefetch<T> {
        let (sender, batches) = sync_channel(depth);
        let loader = Arc::clone(self);
        let worker = std::thread::spawn(move || {
            for batch in loader.epoch(epoch).take(steps) {
                // The consumer stopped early: nothing more is wanted.
                if sender.send(stage(batch)).is_err() {
                    break;
                }
            }
        });
        Prefetch {
            batches,
            worker: Some(worker),
        }
    }

    /// Builds the batch for the given instance ids (augmentations seeded as in [`Self::epoch`]).
    pub fn make_batch(&self, epoch: usize, ids: &[u32]) -> ViewBatch {
        let started = std::time::Instant::now();
        let sl = self.dataset.sample_len();
        let bs = ids.len();
        let shape = &self.dataset.shape;
        let view_rng = |id: u32, v: usize| {
            ChaCha8Rng::seed_from_u64(mix_seed(&[
                TAG_VIEW,
                self.seed,
                epoch as u64,
                id as u64,
                v as u64,
            ]))
        };
        let mut views = vec![0f32; self.views * bs * sl];
        if sl > 0 {
            views.par_chunks_mut(sl).enumerate().for_each(|(j, out)| {
                let (v, row) = (j / bs, j % bs);
                let id = ids[row];
                let i = self.indices[id as usize];
                let view = &self.view_types[v % self.view_types.len()];
                let rng = &mut view_rng(id, v);
                match (self.dataset.image(i), &view.from_image) {
                    (Some(image), Some(crop)) => crop.apply_to_image(image, out, rng),
                    _ => view
                        .transform
                        .apply(&self.dataset.sample(i), shape, out, rng),
                }
            });
        }
        let (local_views, local_count, local_shape) = match &self.local {
            Some((count, crop)) => {
                let local_shape = crop
                    .output_shape(shape)
                    .expect("checked in with_local_views");
                let ll: usize = local_shape.iter().product();
                let mut local = vec![0f32; count * bs * ll];
                local.par_chunks_mut(ll).enumerate().for_each(|(j, out)| {
                    let (v, row) = (j / bs, j % bs);
                    let id = ids[row];
                    let i = self.indices[id as usize];
                    let rng = &mut view_rng(id, self.views + v);
                    match self.dataset.image(i) {
                        Some(image) => crop.apply_to_image(image, out, rng),
                        None => crop.apply(&self.dataset.sample(i), shape, out, rng),
                    }
                });
                (local, *count, local_shape)
            }
            None => (Vec::new(), 0, Vec::new()),
        };
        ViewBatch {
            views,
            local_views,
            local_count,
            local_shape,
            instance_ids: ids.to_vec(),
            labels: ids
                .iter()
                .map(|&id| self.dataset.labels[self.indices[id as usize]])
                .collect(),
            batch_size: bs,
            views_count: self.views,
            made_in: started.elapsed(),
        }
    }
}

impl ViewLoader {
    /// Refuses a batch with a NaN or infinite value in any view, where it enters training: the
    /// error names the data set, the instance (its index in the data set and its id in the
    /// loader), the view, and whether the stored sample itself is non-finite or its
    /// augmentation made it so. One pass over the values; a batch is checked before it is
    /// staged on the device.
    pub fn check_finite(&self, batch: &ViewBatch) -> Result<()> {
        let bs = batch.batch_size;
        let groups = [
            ("view", &batch.views, batch.views_count, 0),
            (
                "local view",
                &batch.local_views,
                batch.local_count,
                self.views,
            ),
        ];
        for (kind, values, count, first_view) in groups {
            let Some(at) = values.iter().position(|v| !v.is_finite()) else {
                continue;
            };
            let len = values.len() / (count * bs).max(1);
            let (v, row) = (at / len / bs, at / len % bs);
            let id = batch.instance_ids[row];
            let index = self.indices[id as usize];
            let cause = if self.dataset.sample(index).iter().all(|x| x.is_finite()) {
                format!(
                    "the stored sample is finite, so view type {} made it: report this with \
                     the data set and index",
                    (first_view + v) % self.view_types.len().max(1)
                )
            } else {
                "the stored sample itself holds a non-finite value: check the file or the \
                 values handed in"
                    .to_string()
            };
            bail!(
                "data set `{}`: {kind} {v} of sample {index} (instance {id} of this run) holds \
                 {} at value {} of {len}; {cause}",
                self.dataset.name,
                values[at],
                at % len
            );
        }
        Ok(())
    }
}

/// An epoch's batches from [`ViewLoader::prefetch`] (or staged by
/// [`ViewLoader::prefetch_with`]), in order.
pub struct Prefetch<T = ViewBatch> {
    batches: Receiver<T>,
    worker: Option<JoinHandle<()>>,
}

impl<T> Prefetch<T> {
    /// Waits for the worker; a panic in it (an augmentation bug) is re-raised here rather than
    /// ending the epoch early.
    fn join(&mut self) {
        if let Some(worker) = self.worker.take() {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl<T> Iterator for Prefetch<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        match self.batches.recv() {
            Ok(batch) => Some(batch),
            Err(_) => {
                self.join();
                None
            }
        }
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        // Closing the channel stops the worker at its next batch.
        let (_, closed) = sync_channel(0);
        drop(std::mem::replace(&mut self.batches, closed));
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Un-augmented samples at dataset positions `indices`, concatenated: `[len, sample_shape...]`
/// (read in parallel: a stored image's evaluation view is a resize).
pub fn clean_batch(dataset: &Dataset, indices: &[usize]) -> Vec<f32> {
    let n = dataset.sample_len();
    let mut out = vec![0f32; indices.len() * n];
    if n > 0 {
        out.par_chunks_mut(n)
            .zip(indices)
            .for_each(|(out, &i)| dataset.sample_into(i, out));
    }
    out
}

#[cfg(test)]
mod tests;
