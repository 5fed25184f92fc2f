//! The loader's batches: deterministic, disjoint, resumable, prefetched, and their views.

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
    let plain = ViewLoader::new(d.clone(), idx.clone(), 50, 2, true, 9, vec![aug.clone()]).unwrap();
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
    assert!(ViewLoader::new(d.clone(), vec![0], 0, 1, false, 0, vec![Arc::new(Identity)]).is_err());
    assert!(ViewLoader::new(d.clone(), vec![0], 1, 0, false, 0, vec![Arc::new(Identity)]).is_err());
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
    let l = ViewLoader::new(stored.clone(), (0..4).collect(), 4, 1, false, 0, identity).unwrap();
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
