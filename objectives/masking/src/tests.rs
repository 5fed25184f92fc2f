use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use ssl_core::{testing::first_step, Progress};

use super::*;

/// Known answers from the official MAE and I-JEPA code (`golden/make_golden.py`).
fn golden() -> Value {
    serde_json::from_str(include_str!("../golden/golden.json")).unwrap()
}

fn usizes(value: &Value) -> Vec<usize> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect()
}

fn pair(value: &Value) -> (f64, f64) {
    (value[0].as_f64().unwrap(), value[1].as_f64().unwrap())
}

fn step(seed: u64, step: usize) -> Progress {
    Progress {
        seed,
        step,
        total_steps: 100,
        ..first_step()
    }
}

// ---------------------------------------------------------------------------------------------
// MAE

#[test]
fn random_masking_equals_the_official_code_on_fixed_noise() -> Result<()> {
    let cases = golden()["mae"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 5);
    for case in cases {
        let (ratio, len) = (
            case["ratio"].as_f64().unwrap(),
            case["len"].as_u64().unwrap(),
        );
        let rows = case["noise"].as_array().unwrap();
        let noise: Vec<f32> = rows
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter())
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let ours = random_masking(&noise, len as usize, ratio)?;
        let flat = |key: &str| -> Vec<usize> {
            case[key]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(usizes)
                .collect()
        };
        let to_usize = |v: &[u32]| v.iter().map(|&i| i as usize).collect::<Vec<_>>();
        let kept = case["keep"][0].as_array().unwrap().len();
        assert_eq!(ours.keep.per_image(), kept, "ratio {ratio}, L {len}");
        assert_eq!(ours.keep.images(), rows.len());
        assert_eq!(
            to_usize(ours.keep.as_slice()),
            flat("keep"),
            "ratio {ratio}"
        );
        assert_eq!(to_usize(ours.restore()), flat("restore"), "ratio {ratio}");
        let mask: Vec<usize> = ours.mask().iter().map(|&m| m as usize).collect();
        assert_eq!(mask, flat("mask"), "ratio {ratio}");
        // The kept patches are the lowest noise in ascending order; restore inverts the order.
        for n in 0..rows.len() {
            let row = &noise[n * len as usize..(n + 1) * len as usize];
            let keep = ours.keep.row(n);
            assert!(keep
                .windows(2)
                .all(|p| row[p[0] as usize] <= row[p[1] as usize]));
            for (position, &patch) in keep.iter().enumerate() {
                assert_eq!(
                    ours.restore()[n * len as usize + patch as usize],
                    position as u32
                );
            }
        }
    }
    Ok(())
}

#[test]
fn kept_count_is_the_official_truncated_double() {
    assert_eq!(kept_patches(196, 0.75), 49);
    assert_eq!(kept_patches(196, 0.0), 196);
    assert_eq!(kept_patches(16, 0.5), 8);
    // 20·(1 − 0.9) = 1.9999999999999996 and 10·(1 − 0.7) = 3.0000000000000004 in doubles.
    assert_eq!(kept_patches(20, 0.9), 1);
    assert_eq!(kept_patches(10, 0.7), 3);
}

/// Over 10,000 images of 196 patches at MAE's ratio 0.75: exactly 49 kept per image, and every
/// patch kept with probability 1/4 (within 5 standard errors).
#[test]
fn random_masks_over_10000_draws_keep_a_quarter_uniformly() -> Result<()> {
    let (images, len) = (10_000, 196);
    let masks = draw_random_masking(images, len, 0.75, &mut ChaCha8Rng::seed_from_u64(1))?;
    assert_eq!(masks.keep.per_image(), 49);
    let mut kept = vec![0usize; len];
    for n in 0..images {
        let row = &masks.mask()[n * len..(n + 1) * len];
        assert_eq!(row.iter().filter(|&&m| m == 0.0).count(), 49);
        assert_eq!(row.iter().filter(|&&m| m == 1.0).count(), 147);
        let distinct: BTreeSet<u32> = masks.keep.row(n).iter().copied().collect();
        assert_eq!(distinct.len(), 49);
        for &patch in masks.keep.row(n) {
            kept[patch as usize] += 1;
            assert_eq!(row[patch as usize], 0.0);
        }
    }
    let tolerance = 5.0 * (0.25f64 * 0.75 / images as f64).sqrt();
    for (patch, &count) in kept.iter().enumerate() {
        let frequency = count as f64 / images as f64;
        assert!(
            (frequency - 0.25).abs() < tolerance,
            "patch {patch}: {frequency}"
        );
    }
    Ok(())
}

#[test]
fn seeded_random_masks_depend_on_the_seed_and_step_only() -> Result<()> {
    let draw = |seed, at| random_masking_for_step(4, 196, 0.75, &step(seed, at));
    assert_eq!(draw(3, 7)?, draw(3, 7)?);
    assert_ne!(draw(3, 7)?.keep, draw(3, 8)?.keep);
    assert_ne!(draw(3, 7)?.keep, draw(4, 7)?.keep);
    let masks = draw(3, 7)?;
    let device = candle_core::Device::Cpu;
    assert_eq!(masks.keep.to_tensor(&device)?.dims(), &[4, 49]);
    assert_eq!(masks.mask_tensor(&device)?.dims(), &[4, 196]);
    let restore = masks.restore_tensor(&device)?;
    assert_eq!(restore.dims(), &[4, 196]);
    assert_eq!(restore.flatten_all()?.to_vec1::<u32>()?, masks.restore());
    Ok(())
}

#[test]
fn bad_random_masking_inputs_are_clear_errors() {
    let error =
        |noise: &[f32], len, ratio| random_masking(noise, len, ratio).unwrap_err().to_string();
    let noise = [0.1, 0.2, 0.3, 0.4];
    for ratio in [1.0, -0.1, f64::NAN] {
        let message = error(&noise, 4, ratio);
        assert!(
            message.contains("[0, 1)") && message.contains("0.75"),
            "{message}"
        );
    }
    assert!(error(&noise, 3, 0.5).contains("4 noise values do not form rows of 3"));
    assert!(error(&noise, 0, 0.5).contains("rows of 0"));
    assert!(error(&[], 4, 0.5).contains("0 noise values"));
    assert!(error(&noise, 4, 0.8).contains("keeps none"));
    assert!(error(&[0.1, f32::NAN, 0.3, 0.4], 4, 0.5).contains("NaN"));
}

// ---------------------------------------------------------------------------------------------
// I-JEPA

/// A recorded sequence of the official collator's draws, handed back in order; a draw of the
/// wrong kind or bound fails the test.
#[derive(Debug)]
enum Draw {
    Unit(f64),
    Below { bound: usize, value: usize },
}

struct Replay(std::vec::IntoIter<Draw>);

impl MaskRandomness for Replay {
    fn unit(&mut self) -> f64 {
        match self.0.next() {
            Some(Draw::Unit(u)) => u,
            other => panic!("we draw a uniform number where the official code drew {other:?}"),
        }
    }
    fn below(&mut self, bound: usize) -> usize {
        match self.0.next() {
            Some(Draw::Below { bound: b, value }) if b == bound => value,
            other => {
                panic!("we draw an integer below {bound} where the official code drew {other:?}")
            }
        }
    }
}

fn official_config(config: &Value) -> MultiBlockConfig {
    MultiBlockConfig {
        context_scale: pair(&config["enc_mask_scale"]),
        target_scale: pair(&config["pred_mask_scale"]),
        aspect_ratio: pair(&config["aspect_ratio"]),
        context_blocks: config["nenc"].as_u64().unwrap() as usize,
        target_blocks: config["npred"].as_u64().unwrap() as usize,
        min_keep: config["min_keep"].as_u64().unwrap() as usize,
        allow_overlap: config["allow_overlap"].as_bool().unwrap(),
    }
}

fn rows(masks: &[PatchIndices]) -> Vec<Vec<Vec<usize>>> {
    masks
        .iter()
        .map(|m| {
            (0..m.images())
                .map(|n| m.row(n).iter().map(|&i| i as usize).collect())
                .collect()
        })
        .collect()
}

/// Given the random numbers the official collator drew, the masks are the official masks:
/// the defaults, a case whose context exclusions are relaxed after 20 failed draws, and a
/// non-square grid with overlap allowed and two context blocks.
#[test]
fn multiblock_masks_equal_the_official_collator_given_its_random_numbers() -> Result<()> {
    let cases = golden()["ijepa"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 3);
    let mut relaxations = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let config = official_config(&case["config"]);
        let grid = usizes(&case["grid"]);
        let images = case["batch"].as_u64().unwrap() as usize;
        for (i, batch) in case["batches"].as_array().unwrap().iter().enumerate() {
            let draws: Vec<Draw> = batch["draws"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| match d.get("unit") {
                    Some(u) => Draw::Unit(u.as_f64().unwrap()),
                    None => Draw::Below {
                        bound: d["below"].as_u64().unwrap() as usize,
                        value: d["value"].as_u64().unwrap() as usize,
                    },
                })
                .collect();
            let mut replay = Replay(draws.into_iter());
            let ours = config.sample(images, (grid[0], grid[1]), &mut replay)?;
            let leftover: Vec<Draw> = replay.0.collect();
            assert!(
                leftover.is_empty(),
                "{name} batch {i}: we drew fewer: {leftover:?}"
            );
            let official = |key: &str| -> Vec<Vec<Vec<usize>>> {
                batch[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|mask| mask.as_array().unwrap().iter().map(usizes).collect())
                    .collect()
            };
            assert_eq!(rows(&ours.context), official("context"), "{name} batch {i}");
            assert_eq!(rows(&ours.targets), official("targets"), "{name} batch {i}");
            assert_eq!(
                ours.relaxations as u64,
                batch["relaxations"].as_u64().unwrap(),
                "{name} batch {i}"
            );
            relaxations += ours.relaxations;
        }
    }
    assert!(relaxations > 0, "the golden cases exercise the relaxation");
    Ok(())
}

/// Is `h × w` the rounding of a block of `m` patches, `m` in `areas`, with aspect ratio in
/// `ratios`, each side within ½ of `√(m·a)` and `√(m/a)`?
fn rounds_a_block_in_range(
    BlockSize { height, width }: BlockSize,
    areas: std::ops::RangeInclusive<usize>,
    (low, high): (f64, f64),
) -> bool {
    let (h, w) = (height as f64, width as f64);
    areas.into_iter().any(|m| {
        let m = m as f64;
        // √(m·a) ∈ [h − ½, h + ½] and √(m/a) ∈ [w − ½, w + ½], as bounds on a.
        let lowest = low.max((h - 0.5).powi(2) / m).max(m / (w + 0.5).powi(2));
        let highest = high.min((h + 0.5).powi(2) / m).min(m / (w - 0.5).powi(2));
        lowest <= highest
    })
}

/// 10,000 one-image batches with the official defaults on 14 × 14 patches, against the same
/// number of official draws: the target sizes' histogram, how often each patch is in the
/// context and in a target, and the context's mean size agree within sampling error; every
/// target block is a rounded block of 15–20 % of the patches with aspect ratio 0.75–1.5;
/// every context block is 13 × 13; the context keeps no target and more than `min_keep`.
#[test]
fn multiblock_statistics_over_10000_draws_match_the_official_collator() -> Result<()> {
    let golden = golden();
    let stats = &golden["ijepa_statistics"];
    let draws = stats["draws"].as_u64().unwrap() as usize;
    assert_eq!(draws, 10_000);
    let (grid, cells) = ((14, 14), 196);
    let config = MultiBlockConfig::default();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    let (mut in_context, mut in_target) = (vec![0usize; cells], vec![0usize; cells]);
    let (mut context_kept, mut relaxed) = (Vec::with_capacity(draws), 0);
    for _ in 0..draws {
        let masks = config.sample(1, grid, &mut rng)?;
        let BlockSize { height, width } = masks.target_block;
        *sizes.entry(format!("{height}x{width}")).or_default() += 1;
        assert!(
            rounds_a_block_in_range(masks.target_block, 29..=39, (0.75, 1.5)),
            "{height}x{width}"
        );
        assert_eq!(
            masks.context_block,
            BlockSize {
                height: 13,
                width: 13
            }
        );
        let context = masks.context[0].row(0);
        assert!(context.len() > config.min_keep);
        context_kept.push(context.len() as f64);
        let mut covered = vec![false; cells];
        for target in &masks.targets {
            assert_eq!(target.per_image(), height * width);
            for &cell in target.row(0) {
                covered[cell as usize] = true;
            }
        }
        match masks.relaxations {
            0 => assert!(context.iter().all(|&c| !covered[c as usize])),
            _ => relaxed += 1,
        }
        for &cell in context {
            in_context[cell as usize] += 1;
        }
        for (count, hit) in in_target.iter_mut().zip(covered) {
            *count += usize::from(hit);
        }
    }
    assert!(relaxed < draws / 100, "{relaxed} relaxed draws");
    // Two samples of `draws` each: the difference of frequencies has variance 2p(1 − p)/n.
    let close = |ours: f64, official: f64, what: &str| {
        let tolerance = 5.0 * (2.0 * official * (1.0 - official) / draws as f64).sqrt() + 1e-12;
        assert!(
            (ours - official).abs() <= tolerance,
            "{what}: {ours} vs official {official}"
        );
    };
    let official_sizes = stats["block_sizes"]["target"].as_object().unwrap();
    for (size, count) in official_sizes {
        let ours = sizes.get(size).copied().unwrap_or(0);
        close(
            ours as f64 / draws as f64,
            count.as_f64().unwrap() / draws as f64,
            size,
        );
    }
    for size in sizes.keys() {
        assert!(
            official_sizes.contains_key(size),
            "{size} never drawn officially"
        );
    }
    assert_eq!(
        stats["block_sizes"]["context"]["13x13"].as_u64(),
        Some(draws as u64)
    );
    for (key, ours) in [
        ("context_frequency", &in_context),
        ("target_frequency", &in_target),
    ] {
        for (cell, (&count, official)) in
            ours.iter().zip(stats[key].as_array().unwrap()).enumerate()
        {
            let official = official.as_f64().unwrap();
            close(
                count as f64 / draws as f64,
                official,
                &format!("{key} of patch {cell}"),
            );
            // The official corner bounds never reach the last row or column.
            if cell / 14 == 13 || cell % 14 == 13 {
                assert_eq!((count, official), (0, 0.0), "{key} of patch {cell}");
            }
        }
    }
    let mean = context_kept.iter().sum::<f64>() / draws as f64;
    let (official_mean, official_std) = (
        stats["context_kept_mean"].as_f64().unwrap(),
        stats["context_kept_std"].as_f64().unwrap(),
    );
    let tolerance = 5.0 * official_std * (2.0 / draws as f64).sqrt();
    assert!(
        (mean - official_mean).abs() < tolerance,
        "{mean} vs {official_mean}"
    );
    Ok(())
}

/// In a batch, the targets are cut to the shortest target and the contexts to the shortest
/// context, keeping each row's lowest indices; every row is a block (minus targets) of its own.
#[test]
fn a_batch_shares_its_block_sizes_and_mask_lengths() -> Result<()> {
    let config = MultiBlockConfig::default();
    let masks = config.sample_for_step(16, (14, 14), &step(9, 2))?;
    assert_eq!(masks, config.sample_for_step(16, (14, 14), &step(9, 2))?);
    assert_ne!(masks, config.sample_for_step(16, (14, 14), &step(9, 3))?);
    let BlockSize { height, width } = masks.target_block;
    for target in &masks.targets {
        assert_eq!((target.images(), target.per_image()), (16, height * width));
        for n in 0..16 {
            let row = target.row(n);
            // A full h × w block: rows of `width` consecutive cells, 14 apart.
            for (i, &cell) in row.iter().enumerate() {
                assert_eq!(
                    cell as usize,
                    row[0] as usize + (i / width) * 14 + i % width
                );
            }
        }
    }
    let context = &masks.context[0];
    assert_eq!(context.images(), 16);
    // Without the cut, the shortest context would be as long as the common length and the
    // others longer: the common length is the minimum over the batch of 169 minus targets.
    let own_lengths: Vec<usize> = (0..16)
        .map(|n| {
            let covered: BTreeSet<u32> = masks
                .targets
                .iter()
                .flat_map(|t| t.row(n).iter().copied())
                .collect();
            (0..13 * 14)
                .filter(|c| c % 14 < 13 && !covered.contains(&(*c as u32)))
                .count()
        })
        .collect();
    if masks.relaxations == 0 {
        assert_eq!(context.per_image(), *own_lengths.iter().min().unwrap());
        for n in 0..16 {
            let row = context.row(n);
            assert!(row.windows(2).all(|p| p[0] < p[1]));
            let covered: BTreeSet<u32> = masks
                .targets
                .iter()
                .flat_map(|t| t.row(n).iter().copied())
                .collect();
            // The row is the lowest `K` cells of the 13 × 13 block outside the targets.
            let expected: Vec<u32> = (0..13 * 14)
                .filter(|c| c % 14 < 13 && !covered.contains(&(*c as u32)))
                .map(|c| c as u32)
                .take(context.per_image())
                .collect();
            assert_eq!(row, expected.as_slice());
        }
    }
    Ok(())
}

#[test]
fn multiblock_config_reads_yaml_with_defaults_and_rejects_bad_values() -> Result<()> {
    let config: MultiBlockConfig = serde_yaml::from_str("{target_blocks: 2, min_keep: 4}")?;
    assert_eq!(
        config,
        MultiBlockConfig {
            target_blocks: 2,
            min_keep: 4,
            ..MultiBlockConfig::default()
        }
    );
    let unknown = serde_yaml::from_str::<MultiBlockConfig>("{npred: 4}").unwrap_err();
    assert!(
        unknown.to_string().contains("unknown field `npred`"),
        "{unknown}"
    );
    let error = |config: MultiBlockConfig| config.validate().unwrap_err().to_string();
    let base = MultiBlockConfig::default();
    let message = error(MultiBlockConfig {
        target_scale: (0.2, 0.15),
        ..base.clone()
    });
    assert!(
        message.contains("target_scale") && message.contains("(0.2, 0.15)"),
        "{message}"
    );
    let message = error(MultiBlockConfig {
        context_scale: (0.85, 1.2),
        ..base.clone()
    });
    assert!(message.contains("context_scale"), "{message}");
    let message = error(MultiBlockConfig {
        aspect_ratio: (0.0, 1.5),
        ..base.clone()
    });
    assert!(message.contains("aspect_ratio"), "{message}");
    let message = error(MultiBlockConfig {
        target_blocks: 0,
        ..base.clone()
    });
    assert!(message.contains("target_blocks (0)"), "{message}");
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let message = base.sample(4, (1, 14), &mut rng).unwrap_err().to_string();
    assert!(message.contains("1×14"), "{message}");
    assert!(base.sample(0, (14, 14), &mut rng).is_err());
    // Target blocks of ~6 × 6 can never keep more than 40 patches: an error, not an endless
    // loop (the official collator's).
    let greedy = MultiBlockConfig {
        min_keep: 40,
        ..base
    };
    let message = greedy
        .sample(4, (14, 14), &mut rng)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("min_keep = 40") && message.contains("block"),
        "{message}"
    );
    Ok(())
}

#[test]
fn rows_of_a_batch_mask_are_the_masks_of_those_images_alone() {
    let noise = [
        0.9, 0.1, 0.5, 0.3, 0.2, 0.8, 0.4, 0.6, 0.7, 0.05, 0.35, 0.15,
    ];
    let batch = random_masking(&noise, 4, 0.5).unwrap();
    let tail = batch.rows(1, 2);
    assert_eq!(tail, random_masking(&noise[4..], 4, 0.5).unwrap());
    assert_eq!(tail.keep.row(1), &[1, 3]);
    assert_eq!(batch.rows(0, 3), batch);
}
