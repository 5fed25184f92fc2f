use super::*;
use candle_core::{DType, Device};
use rand::Rng;
use ssl_core::testing::{
    batch, close, documented_defaults, first_step, max_gradient_error, scalar,
};
use ssl_core::{Ids, Progress};

/// `e^{−1.5625}`: the weight of every second-nearest neighbour at k = 5, percentile 20.
const SECOND: f64 = 0.2096113872;

/// `Z`, `Z'` of the spec `docs/spec/objectives.md` §2.16 known-answer test, `[7][3]`.
fn spec_views() -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let z = [
        [1.0, 0.0, 0.0],
        [0.9, 0.1, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.9, 0.3],
        [0.0, 0.0, 1.0],
        [0.5, 0.5, 0.0],
        [0.2, 0.0, 0.9],
    ];
    let z_prime = [
        [0.95, 0.05, 0.0],
        [1.0, 0.2, 0.0],
        [0.1, 1.0, 0.0],
        [0.0, 1.0, 0.2],
        [0.12, 0.0, 1.0],
        [0.4, 0.6, 0.0],
        [0.0, 0.15, 1.0],
    ];
    let rows = |m: [[f64; 3]; 7]| m.iter().map(|r| r.to_vec()).collect();
    (rows(z), rows(z_prime))
}

fn spec_affinity() -> Affinity {
    let (z, z_prime) = spec_views();
    knn_affinity(&z, &z_prime, 5, 20.0).unwrap()
}

/// The spec's views as one `[2, 7, 3]` tensor.
fn spec_tensor(dtype: DType) -> Tensor {
    let (z, z_prime) = spec_views();
    let flat: Vec<f64> = z.iter().chain(&z_prime).flatten().copied().collect();
    Tensor::from_vec(flat, (2, 7, 3), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

/// `[n][d]` host rows uniform in `[−1, 1)`.
fn random_rows(rng: &mut impl Rng, n: usize, d: usize) -> Vec<Vec<f64>> {
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect()
}

/// The walk of `affinity` as a dense `[n][n]` matrix.
fn dense_walk(affinity: &Affinity) -> Vec<Vec<f64>> {
    let n = affinity.len();
    random_walk(affinity)
        .iter()
        .zip(affinity.neighbours())
        .map(|(p, columns)| {
            let mut row = vec![0.0; n];
            for (&j, &pj) in columns.iter().zip(p) {
                row[j] = pj;
            }
            row
        })
        .collect()
}

fn at_step(step: usize) -> Progress {
    Progress {
        step,
        total_steps: 10,
        ..first_step()
    }
}

fn objective_loss(z: &Tensor, progress: Progress) -> Result<LossOutput> {
    let ids = Ids::range(z.dim(1)?, &Device::Cpu)?;
    let b = Batch {
        progress,
        ..batch(z, &ids, None)
    };
    SagVicreg(SagVicregConfig::default()).loss(&b)
}

#[test]
fn knn_neighbours_spec_2_16() {
    let affinity = spec_affinity();
    let expected: [&[usize]; 7] = [
        &[0, 1, 5, 4, 2],
        &[0, 1, 5, 2, 4],
        &[2, 3, 5, 1, 6],
        &[3, 2, 5, 6, 4],
        &[4, 6, 3, 0, 1],
        &[5, 1, 2, 0, 3],
        &[4, 6, 0, 1, 3],
    ];
    for (i, (row, want)) in affinity.neighbours().iter().zip(expected).enumerate() {
        if i == 4 {
            // Columns 0 and 1 are tied at cosine distance 1: either order is correct.
            assert_eq!(row[..3], want[..3], "row {i}");
            let mut tail = row[3..].to_vec();
            tail.sort_unstable();
            assert_eq!(tail, [0, 1], "row {i}");
        } else {
            assert_eq!(row.as_slice(), want, "row {i}");
        }
    }
}

#[test]
fn local_scales_spec_2_16() {
    let expected = [
        0.0144297229,
        0.0016588653,
        0.0115652116,
        0.0386421707,
        0.0031523885,
        0.1188243051,
        0.0237543027,
    ];
    let affinity = spec_affinity();
    assert_eq!(affinity.scales().len(), 7);
    for (&s, e) in affinity.scales().iter().zip(expected) {
        close(s, e, 1e-7);
    }
}

#[test]
fn affinity_weights_spec_2_16() {
    let expected: [&[(usize, f64)]; 7] = [
        &[(0, 1.0), (1, SECOND)],
        &[(0, 1.0), (1, SECOND)],
        &[(2, 1.0), (3, SECOND)],
        &[(3, 1.0), (2, SECOND)],
        &[(4, 1.0), (6, SECOND)],
        &[
            (5, 1.0),
            (1, SECOND),
            (2, 0.0486177235),
            (0, 0.0185400781),
            (3, 0.0029025163),
        ],
        &[(4, 1.0), (6, SECOND)],
    ];
    let affinity = spec_affinity();
    for (i, row) in expected.iter().enumerate() {
        for j in 0..7 {
            let w = affinity.weight(i, j);
            match row.iter().find(|(c, _)| *c == j) {
                Some(&(_, e)) => close(w, e, 1e-7),
                None => assert!((0.0..1.1e-12).contains(&w), "W[{i}][{j}] = {w}"),
            }
        }
    }
}

#[test]
fn random_walk_rows_spec_2_16() {
    let p = dense_walk(&spec_affinity());
    let row0 = [0.8267117941, 0.1732882059, 0.0, 0.0, 0.0, 0.0, 0.0];
    let row5 = [
        0.0144881519,
        0.1638009080,
        0.0379923408,
        0.0022681726,
        0.0,
        0.7814504268,
        0.0,
    ];
    for (i, want) in [(0, row0), (5, row5)] {
        for (j, (&got, e)) in p[i].iter().zip(want).enumerate() {
            assert!((got - e).abs() < 1e-9, "P[{i}][{j}] = {got}, want {e}");
        }
    }
    for row in &p {
        close(row.iter().sum(), 1.0, 1e-14);
    }
}

#[test]
fn weighted_invariance_spec_2_16() -> Result<()> {
    let pairing = spec_affinity().pairing(vec![1, 1, 3, 2, 6, 1, 6])?;
    for &w in pairing.weights() {
        close(w, SECOND, 1e-9);
    }
    let terms = sag_vicreg_terms(&spec_tensor(DType::F64), &pairing)?;
    close(scalar(&terms.invariance), 0.006438064, 1e-7);
    let terms = sag_vicreg_terms(&spec_tensor(DType::F32), &pairing)?;
    close(scalar(&terms.invariance), 0.006438064, 1e-4);
    Ok(())
}

#[test]
fn loss_is_vicreg_on_z_and_the_paired_batch() -> Result<()> {
    let mut rng = first_step().rng(1);
    let (b, d) = (9, 4);
    let z = random_rows(&mut rng, b, d);
    let z_prime = random_rows(&mut rng, b, d);
    let affinity = knn_affinity(&z, &z_prime, 5, 20.0)?;
    // Arbitrary partners, with duplicates; those outside row i's kNN get weight 0.
    let pairing = affinity.pairing(vec![1, 1, 3, 2, 6, 1, 6, 8, 0])?;
    let paired: Vec<Vec<f64>> = pairing
        .partners()
        .iter()
        .map(|&j| z_prime[j].clone())
        .collect();
    let inv: f64 = (0..b)
        .map(|i| {
            let sq: f64 = (0..d).map(|c| (z[i][c] - paired[i][c]).powi(2)).sum();
            affinity.weight(i, pairing.partners()[i]) * sq
        })
        .sum::<f64>()
        / (b * d) as f64;
    let tensor = |rows: &[Vec<f64>]| Tensor::from_vec(rows.concat(), (b, d), &Device::Cpu).unwrap();
    let (za, zpp) = (tensor(&z), tensor(&paired));
    let var = (scalar(&ssl_vicreg::variance(&za)?) + scalar(&ssl_vicreg::variance(&zpp)?)) / 2.0;
    let cov = scalar(&ssl_vicreg::covariance(&za)?) + scalar(&ssl_vicreg::covariance(&zpp)?);
    let views = Tensor::stack(&[&za, &tensor(&z_prime)], 0)?;
    let terms = sag_vicreg_terms(&views, &pairing)?;
    close(scalar(&terms.invariance), inv, 1e-12);
    close(scalar(&terms.variance), var, 1e-12);
    close(scalar(&terms.covariance), cov, 1e-12);
    let cfg = SagVicregConfig {
        lambda: 2.0,
        mu: 3.0,
        nu: 0.5,
        ..SagVicregConfig::default()
    };
    close(
        scalar(&sag_vicreg_loss(&views, &pairing, &cfg)?),
        2.0 * inv + 3.0 * var + 0.5 * cov,
        1e-12,
    );
    Ok(())
}

#[test]
fn second_nearest_weight_is_constant_and_walk_rows_sum_to_one() {
    let mut rng = first_step().rng(2);
    for (n, d) in [(5, 3), (16, 8), (64, 32)] {
        let z = random_rows(&mut rng, n, d);
        let z_prime = random_rows(&mut rng, n, d);
        let affinity = knn_affinity(&z, &z_prime, 5, 20.0).unwrap();
        for (w, p) in affinity.weights().iter().zip(random_walk(&affinity)) {
            assert_eq!(w.len(), 5);
            assert_eq!(w[0], 1.0);
            close(w[1], SECOND, 1e-9);
            assert!(w[2..].iter().all(|&x| x < SECOND), "{w:?}");
            close(p.iter().sum(), 1.0, 1e-14);
            assert!(p[0] >= 1.0 / (1.0 + 4.0 * SECOND), "{p:?}");
        }
    }
}

#[test]
fn tied_nearest_neighbours_keep_the_minimum_scale() -> Result<()> {
    let z = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
    let z_prime = vec![vec![2.0, 0.0], vec![1.0, 0.0]];
    let affinity = knn_affinity(&z, &z_prime, 5, 20.0)?;
    assert_eq!(affinity.neighbours(), [vec![0, 1], vec![0, 1]]);
    assert_eq!(affinity.scales(), [MIN_SCALE, MIN_SCALE]);
    assert_eq!(affinity.weights(), [vec![1.0, 1.0], vec![1.0, 1.0]]);
    Ok(())
}

#[test]
fn percentile_matches_numpy_linear() {
    let a = [0.0, 1.0, 3.0, 6.0, 10.0];
    for (q, want) in [
        (0.0, 0.0),
        (20.0, 0.8),
        (50.0, 3.0),
        (90.0, 8.4),
        (100.0, 10.0),
    ] {
        close(percentile_linear(&a, q), want, 1e-15);
    }
    close(percentile_linear(&[0.0, 0.5], 20.0), 0.1, 1e-15);
    close(percentile_linear(&[1.0, 2.0, 3.0, 4.0], 20.0), 1.6, 1e-15);
    assert_eq!(percentile_linear(&[2.5], 37.0), 2.5);
}

#[test]
fn sampling_follows_the_walk() {
    let affinity = spec_affinity();
    let p = dense_walk(&affinity);
    let mut rng = first_step().rng(3);
    let draws = 40_000;
    let mut counts = vec![[0usize; 7]; 7];
    for _ in 0..draws {
        let pairing = sample_pairing(&affinity, &mut rng);
        for (i, &j) in pairing.partners().iter().enumerate() {
            counts[i][j] += 1;
        }
        for (i, (&j, &w)) in pairing.partners().iter().zip(pairing.weights()).enumerate() {
            assert_eq!(w, affinity.weight(i, j));
        }
    }
    for i in 0..7 {
        for j in 0..7 {
            let freq = counts[i][j] as f64 / draws as f64;
            assert!(
                (freq - p[i][j]).abs() < 0.01,
                "P[{i}][{j}] {} vs {freq}",
                p[i][j]
            );
        }
    }
}

#[test]
fn gradient_matches_finite_differences_for_a_fixed_pairing() -> candle_core::Result<()> {
    let cfg = SagVicregConfig::default();
    let mut rng = first_step().rng(6);
    let (z, z_prime) = (random_rows(&mut rng, 6, 3), random_rows(&mut rng, 6, 3));
    let affinity = knn_affinity(&z, &z_prime, 5, 20.0).map_err(candle_core::Error::msg)?;
    let z = Tensor::from_vec([z, z_prime].concat().concat(), (2, 6, 3), &Device::Cpu)?;
    let second: Vec<usize> = affinity.neighbours().iter().map(|r| r[1]).collect();
    for partners in [second, vec![1, 1, 3, 0, 5, 4]] {
        let pairing = affinity
            .pairing(partners)
            .map_err(candle_core::Error::msg)?;
        let err = max_gradient_error(&z, |z| {
            sag_vicreg_loss(z, &pairing, &cfg).map_err(candle_core::Error::msg)
        })?;
        assert!(err < 1e-6, "relative gradient error {err}");
    }
    Ok(())
}

#[test]
fn k_is_at_most_the_batch_size() -> Result<()> {
    let mut rng = first_step().rng(4);
    let z = random_rows(&mut rng, 3, 4);
    let z_prime = random_rows(&mut rng, 3, 4);
    let affinity = knn_affinity(&z, &z_prime, 5, 20.0)?;
    for row in affinity.neighbours() {
        let mut sorted = row.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2]);
    }
    let views = Tensor::from_vec([z, z_prime].concat().concat(), (2, 3, 4), &Device::Cpu)?;
    let out = objective_loss(&views, first_step())?;
    assert!(scalar(&out.loss).is_finite());
    let names: Vec<&str> = out.terms.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["invariance", "variance", "covariance", "self_pairs"]
    );
    Ok(())
}

#[test]
fn three_views_and_one_instance_are_refused() {
    let req = SagVicreg(SagVicregConfig::default()).requirements();
    let err = req.check(NAME, 3, 8, false).unwrap_err().to_string();
    assert!(
        err.contains("at most 2 views") && err.contains("--views 2"),
        "{err}"
    );
    let err = req.check(NAME, 2, 1, false).unwrap_err().to_string();
    assert!(
        err.contains("unbiased batch variance") && err.contains("--batch-size 2"),
        "{err}"
    );
    assert!(req.check(NAME, 2, 2, false).is_ok());

    let three = Tensor::zeros((3, 4, 3), DType::F32, &Device::Cpu).unwrap();
    let err = objective_loss(&three, first_step())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("exactly two views") && err.contains("--views 2"),
        "{err}"
    );
    let one = Tensor::ones((2, 1, 3), DType::F32, &Device::Cpu).unwrap();
    let err = objective_loss(&one, first_step())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("batch size ≥ 2") && err.contains("--batch-size 2"),
        "{err}"
    );
}

#[test]
fn pairing_is_reproducible_for_the_same_step_and_seed() -> Result<()> {
    let mut rng = first_step().rng(5);
    let rows = [random_rows(&mut rng, 32, 8), random_rows(&mut rng, 32, 8)].concat();
    let z = Tensor::from_vec(rows.concat(), (2, 32, 8), &Device::Cpu)?.to_dtype(DType::F32)?;
    let draw =
        |progress: Progress| draw_pairing(&z, 5, 20.0, &mut progress.rng(PAIRING_STREAM)).unwrap();
    assert_eq!(draw(at_step(3)), draw(at_step(3)));
    assert_ne!(draw(at_step(3)), draw(at_step(4)));
    let other_seed = Progress {
        seed: 7,
        ..at_step(3)
    };
    assert_ne!(draw(at_step(3)), draw(other_seed));
    let loss = |progress| scalar(&objective_loss(&z, progress).unwrap().loss);
    assert_eq!(loss(at_step(3)), loss(at_step(3)));
    Ok(())
}

#[test]
fn bad_inputs_are_clear_errors() {
    let (z, z_prime) = spec_views();
    let affinity = spec_affinity();
    let err = affinity.pairing(vec![0; 3]).unwrap_err().to_string();
    assert!(err.contains("needs 7 partners"), "{err}");
    let err = affinity.pairing(vec![9; 7]).unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
    assert!(knn_affinity(&z, &z_prime[..6], 5, 20.0).is_err());
    assert!(knn_affinity(&z, &z_prime, 0, 20.0).is_err());
    assert!(knn_affinity(&z, &z_prime, 5, 101.0).is_err());
    let pairing = affinity.pairing(vec![0; 7]).unwrap();
    let narrow = spec_tensor(DType::F64).narrow(1, 0, 5).unwrap();
    let err = sag_vicreg_terms(&narrow, &pairing)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("7 partners for a batch of 5"), "{err}");
}

#[test]
fn registered_with_documented_defaults() {
    assert_eq!(ssl_core::find("sagvicreg").unwrap().name, NAME);
    let config = documented_defaults(NAME);
    for (key, value) in [
        ("lambda", 25.0),
        ("mu", 25.0),
        ("nu", 1.0),
        ("percentile", 20.0),
    ] {
        assert_eq!(config[key].as_f64(), Some(value), "default of {key}");
    }
    assert_eq!(config["k"].as_u64(), Some(5));
}

#[test]
fn bad_config_is_a_clear_error() {
    let parse = |yaml: &str| {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        format!(
            "{:#}",
            ssl_core::registry::parse_config::<SagVicregConfig>(NAME, &value).unwrap_err()
        )
    };
    let err = parse("kk: 3");
    assert!(
        err.contains("unknown field `kk`") && err.contains("percentile"),
        "{err}"
    );
    assert!(parse("k: 0").contains("`k` must be ≥ 1"));
    assert!(parse("percentile: 150").contains("`percentile` must lie in [0, 100]"));
    assert!(parse("mu: -1").contains("`mu`"));
}

fn self_pairs(out: &LossOutput) -> f64 {
    let (_, value) = out
        .terms
        .iter()
        .find(|(name, _)| name == "self_pairs")
        .unwrap();
    scalar(value)
}

#[test]
fn warmup_epochs_are_vicreg_then_the_walk_starts() -> Result<()> {
    let mut rng = first_step().rng(9);
    let rows = [random_rows(&mut rng, 32, 8), random_rows(&mut rng, 32, 8)].concat();
    let z = Tensor::from_vec(rows.concat(), (2, 32, 8), &Device::Cpu)?;
    let ids = Ids::range(32, &Device::Cpu)?;
    let mut objective = SagVicreg(SagVicregConfig {
        vicreg_warmup_epochs: 2,
        ..SagVicregConfig::default()
    });
    let mut loss_in_epoch = |epoch| {
        let progress = Progress {
            epoch,
            ..at_step(epoch)
        };
        objective.loss(&Batch {
            progress,
            ..batch(&z, &ids, None)
        })
    };
    let vicreg = ssl_vicreg::vicreg_loss(&z, &ssl_vicreg::VicregConfig::default())?;
    for epoch in [0, 1] {
        let out = loss_in_epoch(epoch)?;
        close(scalar(&out.loss), scalar(&vicreg), 1e-12);
        assert_eq!(
            self_pairs(&out),
            1.0,
            "every instance pairs with its other view"
        );
    }
    let after = loss_in_epoch(2)?;
    assert!((scalar(&after.loss) - scalar(&vicreg)).abs() > 1e-6);
    assert!(self_pairs(&after) < 1.0, "random rows pair elsewhere");
    Ok(())
}

#[test]
fn self_fraction_counts_own_partners() -> Result<()> {
    let pairing = spec_affinity().pairing(vec![0, 1, 3, 2, 6, 5, 6])?;
    close(pairing.self_fraction(), 4.0 / 7.0, 1e-15);
    assert_eq!(Pairing::identity(3).self_fraction(), 1.0);
    Ok(())
}
