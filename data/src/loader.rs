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
mod tests {
    use super::*;
    use crate::augment::{DigitsAugment, GaussianJitter, Identity};

    fn gmm_loader(batch: usize, drop_last: bool) -> ViewLoader {
        let d = Arc::new(crate::gaussian_mixture(0));
        let idx: Vec<usize> = (0..d.len()).step_by(7).collect(); // 250 instances
        ViewLoader::new(
            d,
            idx,
            batch,
            4,
            drop_last,
            42,
            vec![Arc::new(GaussianJitter::default())],
        )
        .unwrap()
    }

    fn collect(loader: &ViewLoader, epoch: usize, threads: usize) -> Vec<ViewBatch> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| loader.epoch(epoch).collect())
    }

    #[test]
    fn deterministic_across_thread_pools() {
        let loader = gmm_loader(64, false);
        assert_eq!(collect(&loader, 3, 1), collect(&loader, 3, 2));

        let d = Arc::new(crate::digits(16).unwrap());
        let idx: Vec<usize> = (0..200).collect();
        let loader = ViewLoader::new(
            d,
            idx,
            50,
            2,
            true,
            9,
            vec![Arc::new(DigitsAugment::default())],
        )
        .unwrap();
        let a = collect(&loader, 0, 1);
        assert_eq!(a, collect(&loader, 0, 2));
        assert_eq!(a[0].views.len(), 2 * 50 * 256);
    }

    #[test]
    fn local_views_are_extra_and_leave_the_global_views_unchanged() {
        let d = Arc::new(crate::digits(16).unwrap());
        let idx: Vec<usize> = (0..200).collect();
        let aug = Arc::new(DigitsAugment::default());
        let plain =
            ViewLoader::new(d.clone(), idx.clone(), 50, 2, true, 9, vec![aug.clone()]).unwrap();
        let crop = LocalCrop::new(7, (0.05, 0.4), aug.clone());
        let multi = ViewLoader::new(d, idx, 50, 2, true, 9, vec![aug])
            .unwrap()
            .with_local_views(3, crop)
            .unwrap();
        assert_eq!(multi.local_views(), 3);
        let (a, b) = (collect(&plain, 1, 1), collect(&multi, 1, 2));
        assert_eq!(a[0].views, b[0].views);
        assert_eq!(b[0].local_count, 3);
        assert_eq!(b[0].local_shape, vec![1, 7, 7]);
        assert_eq!(b[0].local_views.len(), 3 * 50 * 49);
        assert_eq!(b, collect(&multi, 1, 1), "deterministic across pools");
        // Each local view is its own draw.
        assert_ne!(b[0].local_views[..49], b[0].local_views[50 * 49..51 * 49]);
    }

    /// Two ranks of batch 16 give, step by step, the two halves of one process's batch of 32:
    /// the same instances, labels and augmented views (view-major, so each view's rows split).
    #[test]
    fn shards_of_two_ranks_make_up_the_one_process_batch() {
        let one = gmm_loader(32, true);
        let ranks: Vec<ViewLoader> = (0..2)
            .map(|r| gmm_loader(16, true).with_shard(r, 2).unwrap())
            .collect();
        assert_eq!(ranks[0].steps_per_epoch(), one.steps_per_epoch());
        assert_eq!(one.steps_per_epoch(), 250 / 32);
        let whole = collect(&one, 2, 2);
        let shards: Vec<Vec<ViewBatch>> = ranks.iter().map(|l| collect(l, 2, 1)).collect();
        assert_eq!(whole.len(), shards[1].len());
        for (s, batch) in whole.iter().enumerate() {
            let (a, b) = (&shards[0][s], &shards[1][s]);
            assert_eq!(
                [a.instance_ids.clone(), b.instance_ids.clone()].concat(),
                batch.instance_ids
            );
            assert_eq!([a.labels.clone(), b.labels.clone()].concat(), batch.labels);
            for v in 0..batch.views_count {
                assert_eq!(
                    [a.view(v), b.view(v)].concat(),
                    batch.view(v),
                    "step {s}, view {v}"
                );
            }
        }
        // A last partial global batch (250 = 7 × 32 + 26) cannot be split evenly.
        let e = gmm_loader(16, false)
            .with_shard(1, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.drop_last=true"), "{e}");
        assert!(gmm_loader(16, true).with_shard(2, 2).is_err());
    }

    #[test]
    fn every_instance_once_per_epoch() {
        let loader = gmm_loader(64, false);
        assert_eq!(loader.steps_per_epoch(), 4);
        let batches: Vec<_> = loader.epoch(0).collect();
        assert_eq!(batches.len(), 4);
        assert_eq!(
            batches.iter().map(|b| b.batch_size).collect::<Vec<_>>(),
            vec![64, 64, 64, 58]
        );
        let mut ids: Vec<u32> = batches
            .iter()
            .flat_map(|b| b.instance_ids.clone())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..250).collect::<Vec<u32>>());
        for b in &batches {
            assert_eq!(b.views_count, 4);
            assert_eq!(b.views.len(), 4 * b.batch_size * 2);
            for (row, &id) in b.instance_ids.iter().enumerate() {
                let pos = loader.indices()[id as usize];
                assert_eq!(b.labels[row], loader.dataset().labels[pos]);
                // Each view is the clean sample plus small noise.
                let clean = loader.dataset().sample(pos);
                for v in 0..4 {
                    let got = &b.view(v)[row * 2..row * 2 + 2];
                    assert!((got[0] - clean[0]).abs() < 1.0 && (got[1] - clean[1]).abs() < 1.0);
                }
            }
        }
    }

    #[test]
    fn drop_last_behaviour() {
        let loader = gmm_loader(64, true);
        assert_eq!(loader.steps_per_epoch(), 3);
        let batches: Vec<_> = loader.epoch(1).collect();
        assert_eq!(batches.len(), 3);
        assert!(batches.iter().all(|b| b.batch_size == 64));
        let mut ids: Vec<u32> = batches
            .iter()
            .flat_map(|b| b.instance_ids.clone())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 192);
        // Exact multiple: nothing dropped.
        let d = Arc::new(crate::gaussian_mixture(0));
        let l = ViewLoader::new(
            d,
            (0..128).collect(),
            64,
            1,
            true,
            0,
            vec![Arc::new(Identity)],
        )
        .unwrap();
        assert_eq!(l.steps_per_epoch(), 2);
        // Fewer instances than a batch: no batches at all.
        let d = Arc::new(crate::gaussian_mixture(0));
        let l = ViewLoader::new(
            d,
            (0..10).collect(),
            64,
            1,
            true,
            0,
            vec![Arc::new(Identity)],
        )
        .unwrap();
        assert_eq!(l.epoch(0).count(), 0);
    }

    #[test]
    fn epochs_differ_and_views_differ() {
        let loader = gmm_loader(64, false);
        let e0: Vec<_> = loader.epoch(0).collect();
        let e1: Vec<_> = loader.epoch(1).collect();
        assert_ne!(e0[0].instance_ids, e1[0].instance_ids);
        assert_ne!(e0[0].views, e1[0].views);
        assert_ne!(e0[0].view(0), e0[0].view(1));
        // Same epoch twice is identical.
        assert_eq!(e0, loader.epoch(0).collect::<Vec<_>>());
    }

    #[test]
    fn prefetched_batches_equal_the_lazy_ones_and_stopping_early_ends_the_worker() {
        let loader = Arc::new(gmm_loader(32, true));
        let steps = loader.steps_per_epoch();
        let lazy: Vec<ViewBatch> = loader.epoch(3).collect();
        let ahead: Vec<ViewBatch> = loader.prefetch(3, steps, 2).collect();
        assert_eq!(ahead.len(), steps);
        for (a, b) in lazy.iter().zip(&ahead) {
            assert_eq!((&a.views, &a.instance_ids), (&b.views, &b.instance_ids));
        }
        assert_eq!(loader.prefetch(3, 2, 1).count(), 2);
        // Dropped after one batch, with the worker blocked on a full channel: no hang.
        let mut early = loader.prefetch(4, steps, 1);
        assert!(early.next().is_some());
        drop(early);
    }

    /// A staged prefetch passes every batch, in order, through its stage on the background
    /// thread, not the consumer's.
    #[test]
    fn prefetch_with_stages_each_batch_in_order_on_the_worker() {
        let loader = Arc::new(gmm_loader(32, true));
        let steps = loader.steps_per_epoch();
        let lazy: Vec<Vec<u32>> = loader.epoch(2).map(|b| b.instance_ids).collect();
        let staged: Vec<(std::thread::ThreadId, Vec<u32>)> = loader
            .prefetch_with(2, steps, 1, |b| {
                (std::thread::current().id(), b.instance_ids)
            })
            .collect();
        assert_eq!(staged.len(), steps);
        for ((thread, ids), expected) in staged.iter().zip(&lazy) {
            assert_ne!(*thread, std::thread::current().id());
            assert_eq!(ids, expected);
        }
    }

    #[test]
    fn identity_views_and_clean_batch() {
        let d = Arc::new(crate::gaussian_mixture(0));
        let idx = vec![5, 900, 17];
        let l = ViewLoader::new(
            d.clone(),
            idx.clone(),
            3,
            2,
            false,
            0,
            vec![Arc::new(Identity)],
        )
        .unwrap();
        let b = l.epoch(0).next().unwrap();
        let positions: Vec<usize> = b.instance_ids.iter().map(|&i| idx[i as usize]).collect();
        let clean = clean_batch(&d, &positions);
        assert_eq!(b.view(0), clean.as_slice());
        assert_eq!(b.view(1), clean.as_slice());
        assert_eq!(clean_batch(&d, &[900]), &*d.sample(900));
    }

    #[test]
    fn a_non_finite_view_is_named_with_its_data_set_sample_and_view() {
        let mut values: Vec<f32> = (0..40).map(|i| i as f32 / 40.0).collect();
        values[7 * 2 + 1] = f32::NAN;
        let d = Arc::new(Dataset {
            name: "mine".into(),
            samples: crate::Samples::F32(values),
            labels: vec![0; 20],
            shape: vec![2],
            num_classes: 1,
        });
        let loader = ViewLoader::new(
            d,
            (0..20).collect(),
            20,
            2,
            false,
            0,
            vec![Arc::new(Identity)],
        )
        .unwrap();
        let batch = loader.epoch(0).next().unwrap();
        let err = loader.check_finite(&batch).unwrap_err().to_string();
        for part in [
            "`mine`",
            "view 0 of sample 7",
            "NaN at value 1 of 2",
            "stored sample itself",
        ] {
            assert!(err.contains(part), "{part} missing: {err}");
        }

        // A finite sample whose view type makes an infinity: the view type is blamed.
        let d = Arc::new(crate::gaussian_mixture(0));
        let loader = ViewLoader::new(
            d,
            vec![3, 4],
            2,
            2,
            false,
            0,
            vec![
                Arc::new(Identity) as Arc<dyn ViewTransform>,
                Arc::new(Fill(f32::INFINITY)),
            ],
        )
        .unwrap();
        let batch = loader.epoch(0).next().unwrap();
        let err = loader.check_finite(&batch).unwrap_err().to_string();
        assert!(
            err.contains("view 1 of sample") && err.contains("inf"),
            "{err}"
        );
        assert!(err.contains("view type 1 made it"), "{err}");
        let clean = ViewLoader::new(
            Arc::new(crate::gaussian_mixture(0)),
            vec![3, 4],
            2,
            2,
            false,
            0,
            vec![Arc::new(Identity)],
        )
        .unwrap();
        assert!(clean.check_finite(&clean.epoch(0).next().unwrap()).is_ok());
    }

    #[test]
    fn rejects_bad_configuration() {
        let d = Arc::new(crate::gaussian_mixture(0));
        assert!(
            ViewLoader::new(d.clone(), vec![0], 0, 1, false, 0, vec![Arc::new(Identity)]).is_err()
        );
        assert!(
            ViewLoader::new(d.clone(), vec![0], 1, 0, false, 0, vec![Arc::new(Identity)]).is_err()
        );
        assert!(ViewLoader::new(d, vec![1750], 1, 1, false, 0, vec![Arc::new(Identity)]).is_err());
    }

    /// Writes a constant: marks which view type made a view.
    struct Fill(f32);

    impl ViewTransform for Fill {
        fn apply(&self, _: &[f32], _: &[usize], out: &mut [f32], _: &mut ChaCha8Rng) {
            out.fill(self.0);
        }
    }

    #[test]
    fn views_cycle_through_the_view_types() {
        let d = Arc::new(crate::gaussian_mixture(0));
        let types: Vec<Arc<dyn ViewTransform>> = vec![Arc::new(Fill(1.0)), Arc::new(Fill(2.0))];
        let l = ViewLoader::new(d, (0..8).collect(), 4, 5, false, 0, types).unwrap();
        let batch = l.epoch(0).next().unwrap();
        let marks: Vec<f32> = (0..5).map(|v| batch.view(v)[0]).collect();
        assert_eq!(marks, [1.0, 2.0, 1.0, 2.0, 1.0]);
        let none = ViewLoader::new(
            l.dataset().clone(),
            vec![0],
            1,
            1,
            false,
            0,
            Vec::<ViewType>::new(),
        );
        assert!(none.is_err());
    }

    /// `count` pseudo-random `side × side` RGB images, stored HWC.
    fn random_pixels(count: usize, side: usize) -> Vec<u8> {
        let mut state = 0x9e37_79b9_u64;
        (0..count * side * side * 3)
            .map(|_| {
                state = splitmix(state);
                (state >> 56) as u8
            })
            .collect()
    }

    /// The same pixels as fixed `[3, S, S]` samples and as stored images of size `S × S`.
    fn fixed_and_stored(count: usize, side: usize) -> (Arc<Dataset>, Arc<Dataset>) {
        let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(random_pixels(count, side));
        let dataset = |samples| {
            Arc::new(Dataset {
                name: "photos".into(),
                samples,
                labels: vec![0; count],
                shape: vec![3, side, side],
                num_classes: 1,
            })
        };
        let images: Vec<crate::ImageEntry> = (0..count)
            .map(|i| crate::ImageEntry {
                offset: i * side * side * 3,
                height: side,
                width: side,
            })
            .collect();
        let fixed = dataset(Samples::U8 {
            bytes: bytes.clone(),
            channels_last: Some(3),
        });
        let stored = dataset(Samples::Images {
            bytes,
            images: images.into(),
        });
        (fixed, stored)
    }

    /// On stored images of the sample's own size, the crop drawn on the stored image and the
    /// rest of the pipeline make exactly the views of the fixed samples: the same draws in the
    /// same order, the same resampling (global views of both DINO types, and local views).
    #[test]
    fn stored_images_of_the_sample_size_give_the_fixed_samples_views() {
        let (fixed, stored) = fixed_and_stored(6, 24);
        let recipe = crate::Recipe::Dino;
        let types = recipe
            .view_types(crate::Normalization::Imagenet, &fixed.shape)
            .unwrap();
        assert!(types.views.iter().all(|t| t.from_image.is_some()));
        let loader = |data: &Arc<Dataset>| {
            let crop = LocalCrop {
                interpolation: types.local.1,
                ..LocalCrop::new(10, recipe.local_crop_scale(), types.local.0.clone())
            };
            ViewLoader::new(
                data.clone(),
                (0..6).collect(),
                3,
                4,
                false,
                5,
                types.views.clone(),
            )
            .unwrap()
            .with_local_views(2, crop)
            .unwrap()
        };
        let (a, b) = (
            collect(&loader(&fixed), 2, 2),
            collect(&loader(&stored), 2, 1),
        );
        assert_eq!(a, b);
        for i in 0..6 {
            assert_eq!(fixed.sample(i), stored.sample(i), "the evaluation view");
        }
    }

    #[test]
    fn view_types_without_an_image_crop_see_the_evaluation_view() {
        let (_, stored) = fixed_and_stored(4, 8);
        let identity: Vec<Arc<dyn ViewTransform>> = vec![Arc::new(Identity)];
        let l =
            ViewLoader::new(stored.clone(), (0..4).collect(), 4, 1, false, 0, identity).unwrap();
        let batch = l.epoch(0).next().unwrap();
        let positions: Vec<usize> = batch.instance_ids.iter().map(|&i| i as usize).collect();
        assert_eq!(batch.view(0), clean_batch(&stored, &positions).as_slice());
        // A crop of stored images to another side than the samples' is refused.
        let wrong = ViewType {
            transform: Arc::new(Identity),
            from_image: Some(LocalCrop::new(5, (0.5, 1.0), Arc::new(Identity))),
        };
        let e = ViewLoader::new(stored, vec![0], 1, 1, false, 0, vec![wrong]).unwrap_err();
        assert!(
            e.to_string().contains("crops stored images to [3, 5, 5]"),
            "{e}"
        );
    }
}
