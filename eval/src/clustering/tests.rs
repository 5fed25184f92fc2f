//! Tests of the clustering module: the agreement scores against reference values, spherical
//! k-means and the CARP protocol, and spectral clustering against a dense eigensolver.

use anyhow::Result;
use nalgebra::DMatrix;

use super::kmeans::{best_run, dot, Geometry, Points};
use super::scores::ln_gamma;
use super::spectral::{nearest_neighbours, top_eigenpairs, SparseSymmetric};
use super::*;
use crate::test_util::{close, Rng};
use crate::Features;

fn assert_close(what: &str, got: f64, want: f64) {
    assert!(close(got, want, 1e-9), "{what}: got {got}, want {want}");
}

const U: [u32; 9] = [0, 0, 0, 1, 1, 1, 2, 2, 2];
const V: [u32; 9] = [0, 0, 1, 1, 1, 2, 2, 2, 2];

#[test]
fn section9_kat() {
    let t = Contingency::new(&U, &V).unwrap();
    assert_eq!(t.dense(), vec![vec![2, 1, 0], vec![0, 2, 1], vec![0, 0, 3]]);
    assert_close("MI", t.mutual_information(), 0.636_514_168_3);
    let (hu, hv) = t.entropies();
    assert_close("H(U)", hu, 1.098_612_288_7);
    assert_close("H(V)", hv, 1.060_856_947_2);
    assert_close("E[MI]", t.expected_mutual_information(), 0.330_202_492_6);
    assert_close("NMI", t.nmi(), 0.589_509_827_4);
    assert_close("AMI", t.ami(), 0.408_670_509_7);
    assert_close("ARI", t.ari(), 0.357_142_857_1);
    assert_close("RI", t.rand_index(), 0.75);
    let s = clustering_metrics(&U, &V).unwrap();
    assert_eq!(
        (s.nmi, s.ami, s.ari),
        (
            normalized_mutual_info(&U, &V).unwrap(),
            adjusted_mutual_info(&U, &V).unwrap(),
            adjusted_rand_index(&U, &V).unwrap()
        )
    );
}

#[test]
fn scores_match_scikit_learn_on_larger_labelings() {
    // Reference values: scikit-learn 1.9 normalized_mutual_info_score,
    // adjusted_mutual_info_score, adjusted_rand_score, rand_score.
    let cases: [(Vec<u32>, Vec<u32>, [f64; 4]); 2] = [
        (
            (0..200).map(|i| (i * 7) % 5).collect(),
            (0..200)
                .map(|i| (i * i + 3) % 4 + if i % 3 == 0 { 4 } else { 0 })
                .collect(),
            [
                0.000_772_139_233_179_272_1,
                -0.020_716_423_818_922_98,
                -0.015_562_965_827_958_563,
                0.632_010_050_251_256_2,
            ],
        ),
        (
            (0..5000).map(|i| i % 50).collect(),
            (0..5000).map(|i| (i * i) % 37).collect(),
            [
                0.002_144_480_659_878_944_3,
                -0.025_519_775_440_342_16,
                -0.004_818_357_054_612_086,
                0.928_833_926_785_357,
            ],
        ),
    ];
    for (u, v, want) in cases {
        let t = Contingency::new(&u, &v).unwrap();
        let got = [t.nmi(), t.ami(), t.ari(), t.rand_index()];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-10, "got {got:?}, want {want:?}");
        }
    }
}

#[test]
fn section11_rand_index_kat() {
    assert_close("RI", rand_index(&U, &V).unwrap(), 0.75);
    assert_close("RI", rand_index(&[0, 0, 1, 1], &[0, 1, 1, 1]).unwrap(), 0.5);
}

#[test]
fn identical_and_degenerate_partitions() {
    let a = [0u32, 0, 1, 1, 2, 2, 2];
    let relabelled = [7u32, 7, 3, 3, 9, 9, 9];
    let s = clustering_metrics(&a, &relabelled).unwrap();
    assert!(close(s.nmi, 1.0, 1e-12) && close(s.ami, 1.0, 1e-12) && s.ari == 1.0);
    assert_eq!(rand_index(&a, &relabelled).unwrap(), 1.0);
    let single = clustering_metrics(&[4, 4, 4], &[1, 1, 1]).unwrap();
    assert_eq!((single.nmi, single.ami, single.ari), (1.0, 1.0, 1.0));
    // One single cluster against a split: no information, chance-level agreement.
    let split = clustering_metrics(&[0, 0, 0, 0], &[0, 0, 1, 1]).unwrap();
    assert_eq!((split.nmi, split.ami, split.ari), (0.0, 0.0, 0.0));
    // All-singleton partitions agree on every pair.
    assert_eq!(adjusted_rand_index(&[0, 1, 2], &[5, 4, 3]).unwrap(), 1.0);
}

#[test]
fn ln_gamma_matches_known_values() {
    assert_close("lnΓ(1/2)", ln_gamma(0.5), 0.5 * std::f64::consts::PI.ln());
    assert!(ln_gamma(1.0).abs() < 1e-14 && ln_gamma(2.0).abs() < 1e-14);
    assert_close("ln 10!", ln_gamma(11.0), 3_628_800f64.ln());
    let ln_fact_200: f64 = (1..=200).map(|m| (m as f64).ln()).sum();
    assert_close("ln 200!", ln_gamma(201.0), ln_fact_200);
}

#[test]
fn score_errors() {
    let err = Contingency::new(&[0, 1], &[0]).unwrap_err().to_string();
    assert!(err.contains("2 true labels but 1 predicted"), "{err}");
    let err = rand_index(&[], &[]).unwrap_err().to_string();
    assert!(err.contains("no samples"), "{err}");
}

/// `per_class` rows around each of `centres` (`[k, d]` row-major) with Gaussian noise `sigma`.
fn blobs(
    centres: &[Vec<f64>],
    per_class: usize,
    sigma: f64,
    rng: &mut Rng,
) -> (Features, Vec<u32>) {
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for _ in 0..per_class {
        for (c, centre) in centres.iter().enumerate() {
            rows.push(
                centre
                    .iter()
                    .map(|m| (m + sigma * rng.normal()) as f32)
                    .collect::<Vec<f32>>(),
            );
            labels.push(c as u32);
        }
    }
    (Features::from_rows(&rows).unwrap(), labels)
}

fn basis_centres(k: usize, d: usize, scale: f64) -> Vec<Vec<f64>> {
    (0..k)
        .map(|c| (0..d).map(|j| if j == c { scale } else { 0.0 }).collect())
        .collect()
}

#[test]
fn kmeans_recovers_separated_blobs_and_predicts() {
    let mut rng = Rng::new(1);
    let centres = basis_centres(5, 12, 8.0);
    let (x, y) = blobs(&centres, 40, 0.5, &mut rng);
    let model = SphericalKMeans::fit(&x, &KMeansConfig::new(5)).unwrap();
    assert_eq!(adjusted_rand_index(&y, &model.labels).unwrap(), 1.0);
    for c in model.centroids.chunks(model.d) {
        assert!((dot(c, c) - 1.0).abs() < 1e-5);
    }
    assert_eq!(model.predict(&x).unwrap(), model.labels);
    let (val, val_y) = blobs(&centres, 10, 0.5, &mut rng);
    let carp = clustering_scores(&x, Some(&y), &val, &val_y, 5, 3, 7).unwrap();
    assert_eq!(carp.val.ari, 1.0);
    assert!(close(carp.val.nmi, 1.0, 1e-12) && close(carp.val.ami, 1.0, 1e-12));
    assert_eq!(carp.train.map(|s| s.ari), Some(1.0));
    assert!(carp.objective > 0.0);
}

#[test]
fn kmeans_is_deterministic_per_seed_and_thread_count() {
    let mut rng = Rng::new(2);
    let x = rng.features(600, 16);
    let cfg = KMeansConfig {
        seed: 11,
        ..KMeansConfig::new(8)
    };
    let a = SphericalKMeans::fit(&x, &cfg).unwrap();
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let b = one_thread.install(|| SphericalKMeans::fit(&x, &cfg).unwrap());
    assert_eq!(a, b);
    // Structureless data: different seeds end in different local optima.
    let c = SphericalKMeans::fit(
        &x,
        &KMeansConfig {
            seed: 12,
            restarts: 1,
            ..cfg
        },
    )
    .unwrap();
    let d = SphericalKMeans::fit(
        &x,
        &KMeansConfig {
            seed: 13,
            restarts: 1,
            ..cfg
        },
    )
    .unwrap();
    assert!(adjusted_rand_index(&c.labels, &d.labels).unwrap() < 0.99);
    // More restarts never lose objective against the first restart alone.
    let first = SphericalKMeans::fit(&x, &KMeansConfig { restarts: 1, ..cfg }).unwrap();
    assert!(a.objective >= first.objective);
    assert!(a.iterations >= 1 && a.iterations <= DEFAULT_MAX_ITER);
}

#[test]
fn kmeans_handles_duplicates_and_constant_dimensions() {
    // Only three distinct rows but k = 3; a constant column is harmless.
    let rows: Vec<[f32; 3]> = (0..12)
        .map(|i| [(i % 3) as f32, ((i % 3) * 2 % 3) as f32, 5.0])
        .collect();
    let x = Features::from_rows(&rows).unwrap();
    let model = SphericalKMeans::fit(&x, &KMeansConfig::new(3)).unwrap();
    let truth: Vec<u32> = (0..12).map(|i| i % 3).collect();
    assert_eq!(adjusted_rand_index(&truth, &model.labels).unwrap(), 1.0);
    assert_eq!(model.scale[2], 1.0);
}

#[test]
fn kmeans_errors() {
    let x = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0]]).unwrap();
    let err = |r: Result<SphericalKMeans>| r.unwrap_err().to_string();
    assert!(err(SphericalKMeans::fit(&x, &KMeansConfig::new(3))).contains("k ≤ n"));
    assert!(err(SphericalKMeans::fit(&x, &KMeansConfig::new(0))).contains("positive"));
    let no_restarts = KMeansConfig {
        restarts: 0,
        ..KMeansConfig::new(1)
    };
    assert!(err(SphericalKMeans::fit(&x, &no_restarts)).contains("restarts"));
    let nan = Features::from_rows(&[[f32::NAN, 0.0], [0.0, 1.0]]).unwrap();
    assert!(err(SphericalKMeans::fit(&nan, &KMeansConfig::new(1))).contains("NaN"));
    let constant = Features::from_rows(&[[2.0f32, 3.0], [2.0, 3.0]]).unwrap();
    assert!(
        err(SphericalKMeans::fit(&constant, &KMeansConfig::new(1))).contains("every row is zero")
    );
    let model = SphericalKMeans::fit(&x, &KMeansConfig::new(2)).unwrap();
    let wide = Features::from_rows(&[[1.0f32, 0.0, 0.0]]).unwrap();
    assert!(model
        .predict(&wide)
        .unwrap_err()
        .to_string()
        .contains("dimension 3"));
    let labels_err = clustering_scores(&x, None, &x, &[0], 2, 1, 0).unwrap_err();
    assert!(labels_err.to_string().contains("1 validation labels for 2"));
}

#[test]
fn spectral_clustering_separates_two_blobs() {
    let mut rng = Rng::new(3);
    let centres = vec![vec![1.0, 0.2, 0.0, 0.0, 0.0], vec![0.0, 0.2, 1.0, 0.0, 0.0]];
    let (x, y) = blobs(&centres, 40, 0.05, &mut rng);
    let labels = spectral_clustering(&x, 2, &SpectralConfig::default()).unwrap();
    assert_eq!(adjusted_rand_index(&y, &labels).unwrap(), 1.0);
    let emb = SpectralEmbedding::new(&x, 10, 3).unwrap();
    // Two connected components: the Laplacian has eigenvalue 0 twice.
    assert!(
        emb.laplacian_eigenvalues[0].abs() < 1e-10 && emb.laplacian_eigenvalues[1].abs() < 1e-10
    );
    assert!(emb.laplacian_eigenvalues[2] > 1e-3);
    assert_eq!(emb.embedding(3).unwrap().d, 3);
    assert!(emb.embedding(0).is_err());
    assert!(emb.embedding(4).is_err());
    let few = rng.features(5, 3);
    let err = SpectralEmbedding::new(&few, 10, 2).unwrap_err().to_string();
    assert!(err.contains("too few"), "{err}");
    assert!(SpectralEmbedding::new(&x, 10, 0).is_err());
}

/// The previous solver: nalgebra's one-thread dense `SymmetricEigen` of `D^{-1/2} A D^{-1/2}`,
/// the `k` largest eigenvalues (descending, ties by index) and their eigenvectors.
fn dense_reference(s: &SparseSymmetric, k: usize) -> (Vec<f64>, DMatrix<f64>) {
    let dense = s.dense();
    let m = DMatrix::from_fn(s.n, s.n, |i, j| dense[(i, j)]);
    let eig = nalgebra::SymmetricEigen::new(m);
    let mut order: Vec<usize> = (0..s.n).collect();
    order.sort_by(|&a, &b| {
        eig.eigenvalues[b]
            .total_cmp(&eig.eigenvalues[a])
            .then(a.cmp(&b))
    });
    let values = order[..k].iter().map(|&j| eig.eigenvalues[j]).collect();
    let vectors = DMatrix::from_fn(s.n, k, |i, c| eig.eigenvectors[(i, order[c])]);
    (values, vectors)
}

/// Largest entry of `P_a − P_b` for the orthogonal projectors onto the column spans.
fn projector_difference(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    (a * a.transpose() - b * b.transpose()).amax()
}

#[test]
fn block_krylov_matches_the_dense_solver() {
    let mut rng = Rng::new(4);
    // 600 rows around 12 centres (one cluster each), and unstructured rows.
    let centres: Vec<Vec<f64>> = (0..12)
        .map(|_| (0..16).map(|_| rng.normal()).collect())
        .collect();
    let (clustered, _) = blobs(&centres, 50, 0.6, &mut rng);
    for (x, k) in [
        (clustered, 12),
        (rng.features(600, 16), 5),
        (rng.features(600, 16), 40),
    ] {
        let (s, _) = SparseSymmetric::normalized_affinity(&nearest_neighbours(&x, 10));
        let (values, vectors) = top_eigenpairs(&s, k).unwrap();
        let (want, want_vectors) = dense_reference(&s, k);
        for (c, (v, w)) in values.iter().zip(&want).enumerate() {
            assert!((v - w).abs() < 1e-12, "k = {k}: eigenvalue {c}: {v} vs {w}");
        }
        let got = DMatrix::from_fn(x.n, k, |i, c| vectors[(i, c)]);
        let diff = projector_difference(&got, &want_vectors);
        assert!(diff < 1e-7, "k = {k}: eigenvector spans differ by {diff}");
    }
}

#[test]
fn spectral_clustering_matches_the_dense_solver() {
    let mut rng = Rng::new(5);
    let centres: Vec<Vec<f64>> = (0..8)
        .map(|_| (0..32).map(|_| rng.normal()).collect())
        .collect();
    let (x, y) = blobs(&centres, 100, 0.9, &mut rng);
    let k = centres.len();
    let labels = spectral_clustering(&x, k, &SpectralConfig::default()).unwrap();
    // The old pipeline: dense eigenvectors, the same k-means.
    let (s, inv_sqrt_deg) = SparseSymmetric::normalized_affinity(&nearest_neighbours(&x, 10));
    let (_, vectors) = dense_reference(&s, k);
    let (vectors, inv_sqrt_deg) = (&vectors, &inv_sqrt_deg);
    let data: Vec<f32> = (0..x.n)
        .flat_map(|i| (0..k).map(move |c| (vectors[(i, c)] * inv_sqrt_deg[i]) as f32))
        .collect();
    let points = Points::new(&data, x.n, k, Geometry::Euclidean);
    let cfg = KMeansConfig {
        k,
        restarts: DEFAULT_RESTARTS,
        max_iter: SPECTRAL_MAX_ITER,
        seed: 0,
    };
    let reference = best_run(&points, &cfg).unwrap().assignment.labels;
    assert_eq!(adjusted_rand_index(&reference, &labels).unwrap(), 1.0);
    assert!(adjusted_rand_index(&y, &labels).unwrap() > 0.5);
}

#[test]
fn block_krylov_finds_every_connected_component() {
    // Five far-apart tight blobs: the kNN graph has five components, eigenvalue 1 of
    // D^{-1/2} A D^{-1/2} five times, which a single Lanczos vector could not resolve.
    let mut rng = Rng::new(6);
    let centres = basis_centres(5, 8, 10.0);
    let (x, _) = blobs(&centres, 30, 0.05, &mut rng);
    let (s, _) = SparseSymmetric::normalized_affinity(&nearest_neighbours(&x, 10));
    let (values, _) = top_eigenpairs(&s, 6).unwrap();
    for v in &values[..5] {
        assert!((v - 1.0).abs() < 1e-10, "{values:?}");
    }
    assert!(values[5] < 1.0 - 1e-3, "{values:?}");
}
