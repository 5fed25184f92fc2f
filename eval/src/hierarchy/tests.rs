//! Tests of the hierarchy metrics: the spec §10 known-answer values (cosine distances, Ward
//! linkage, cophenetic and LCA correlations), rank correlations, hierarchy files and the
//! hierarchical Rand index.

use super::*;
use crate::test_util::Rng;

fn assert_all_close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-8 * w.abs().max(1e-12),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

fn kat_a() -> Features {
    Features::from_rows(&[
        [1.0f32, 0.0, 0.02],
        [0.9, 0.2, 0.0],
        [0.0, 1.0, 0.1],
        [0.1, 0.9, 0.0],
        [0.05, 0.02, 1.0],
    ])
    .unwrap()
}

fn kat_b() -> Features {
    Features::from_rows(&[
        [1.0f32, 0.1],
        [0.8, 0.3],
        [0.1, 1.0],
        [0.3, 0.85],
        [-1.0, 0.2],
    ])
    .unwrap()
}

/// KAT inputs are decimal literals: f32 storage perturbs them by ~1e-8 relative, so the
/// KAT is evaluated on the exact f64 values via distances computed here in f64.
fn cosine_f64(rows: &[&[f64]]) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..rows.len() {
        for j in i + 1..rows.len() {
            let dot: f64 = rows[i].iter().zip(rows[j]).map(|(a, b)| a * b).sum();
            let norm = |r: &[f64]| r.iter().map(|v| v * v).sum::<f64>().sqrt();
            out.push(1.0 - dot / (norm(rows[i]) * norm(rows[j])));
        }
    }
    out
}

fn dist_a() -> Vec<f64> {
    cosine_f64(&[
        &[1.0, 0.0, 0.02],
        &[0.9, 0.2, 0.0],
        &[0.0, 1.0, 0.1],
        &[0.1, 0.9, 0.0],
        &[0.05, 0.02, 1.0],
    ])
}

fn dist_b() -> Vec<f64> {
    cosine_f64(&[
        &[1.0, 0.1],
        &[0.8, 0.3],
        &[0.1, 1.0],
        &[0.3, 0.85],
        &[-1.0, 0.2],
    ])
}

const DIST_A: [f64; 10] = [
    0.024_008_118_7,
    0.998_010_323_5,
    0.889_590_553_6,
    0.930_115_255_3,
    0.784_146_126_8,
    0.676_594_519_6,
    0.946_928_935_2,
    0.011_048_721_3,
    0.880_768_298,
    0.974_637_498,
];

fn merges(t: &Dendrogram) -> Vec<(usize, usize)> {
    t.merges.iter().map(|m| (m.left, m.right)).collect()
}

#[test]
fn section10_cosine_distances_kat() {
    assert_all_close("cosine A (f64)", &dist_a(), &DIST_A);
    let from_features = cosine_distances(&kat_a());
    for (g, w) in from_features.iter().zip(&DIST_A) {
        assert!((g - w).abs() < 1e-6, "cosine A (f32 input): {g} vs {w}");
    }
}

#[test]
fn section10_ward_kat() {
    let a = Dendrogram::ward(&dist_a()).unwrap();
    assert_eq!(merges(&a), vec![(2, 3), (0, 1), (4, 5), (6, 7)]);
    let heights: Vec<f64> = a.merges.iter().map(|m| m.height).collect();
    assert_all_close(
        "Ward A heights",
        &heights,
        &[
            0.011_048_721_3,
            0.024_008_118_7,
            1.072_570_125_2,
            1.178_211_647_4,
        ],
    );
    assert_eq!(
        a.merges.iter().map(|m| m.size).collect::<Vec<_>>(),
        vec![2, 2, 3, 5]
    );
    let b = Dendrogram::ward(&dist_b()).unwrap();
    assert_eq!(merges(&b), vec![(2, 3), (0, 1), (5, 6), (4, 7)]);
    let heights: Vec<f64> = b.merges.iter().map(|m| m.height).collect();
    assert_all_close(
        "Ward B heights",
        &heights,
        &[
            0.028_572_708_6,
            0.033_379_557_8,
            0.839_719_272,
            1.898_448_314,
        ],
    );
    // Same tree from the f32 features.
    assert_eq!(
        merges(&Dendrogram::ward_cosine(&kat_a()).unwrap()),
        merges(&a)
    );
    assert_eq!(
        merges(&Dendrogram::ward_cosine(&kat_b()).unwrap()),
        merges(&b)
    );
}

#[test]
fn section10_cophenetic_and_lca_kat() {
    let a = Dendrogram::ward(&dist_a()).unwrap();
    let b = Dendrogram::ward(&dist_b()).unwrap();
    let (ta, tb) = (1.178_211_647_4, 1.072_570_125_2);
    assert_all_close(
        "cophenetic A",
        &a.cophenetic(),
        &[
            0.024_008_118_7,
            ta,
            ta,
            ta,
            ta,
            ta,
            ta,
            0.011_048_721_3,
            tb,
            tb,
        ],
    );
    let (m, top) = (0.839_719_272, 1.898_448_314);
    assert_all_close(
        "cophenetic B",
        &b.cophenetic(),
        &[
            0.033_379_557_8,
            m,
            m,
            top,
            m,
            m,
            top,
            0.028_572_708_6,
            top,
            top,
        ],
    );
    assert_eq!(a.lca_path_lengths(), vec![2, 5, 5, 4, 5, 5, 4, 2, 3, 3]);
    assert_eq!(b.lca_path_lengths(), vec![2, 4, 4, 4, 4, 4, 4, 2, 4, 4]);
}

#[test]
fn section10_similarity_kat() {
    let a = Dendrogram::ward(&dist_a()).unwrap();
    let b = Dendrogram::ward(&dist_b()).unwrap();
    let lca = |t: &Dendrogram| {
        t.lca_path_lengths()
            .into_iter()
            .map(f64::from)
            .collect::<Vec<_>>()
    };
    let (la, lb) = (lca(&a), lca(&b));
    let got = [
        pearson(&la, &lb).unwrap(),
        spearman(&la, &lb).unwrap(),
        kendall_tau_b(&la, &lb).unwrap(),
        pearson(&a.cophenetic(), &dist_b()).unwrap(),
        pearson(&b.cophenetic(), &dist_a()).unwrap(),
        pearson(&a.cophenetic(), &dist_a()).unwrap(),
    ];
    let want = [
        0.771_743_633_1,
        0.725_476_250_1,
        0.666_666_666_7,
        0.617_403_846_8,
        0.804_580_289_5,
        0.958_807_466_7,
    ];
    assert_all_close("similarities", &got, &want);
    // The same through the Features entry points (f32 inputs: 1e-6).
    let s = tree_similarity(&kat_a(), &kat_b()).unwrap();
    let via = [
        s.lca_pearson,
        s.lca_spearman,
        s.lca_kendall,
        s.cophenetic_d1_p2,
        s.cophenetic_d2_p1,
        cophenetic_correlation(&kat_a()).unwrap(),
    ];
    for (g, w) in via.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6 * w, "{g} vs {w}");
    }
}

#[test]
fn ward_ties_follow_the_reference() {
    // Reference: scipy.cluster.hierarchy.linkage(y, "ward") on these condensed vectors.
    let square = cosine_free_square();
    let t = Dendrogram::ward(&square).unwrap();
    assert_eq!(merges(&t), vec![(0, 1), (2, 3), (5, 6), (4, 7)]);
    assert_all_close(
        "square heights",
        &t.merges.iter().map(|m| m.height).collect::<Vec<_>>(),
        &[1.0, 1.0, std::f64::consts::SQRT_2, 8.049_844_718_999_243],
    );
    let all_equal = Dendrogram::ward(&[1.0; 6]).unwrap();
    assert_eq!(merges(&all_equal), vec![(0, 1), (2, 4), (3, 5)]);
    let mixed = Dendrogram::ward(&[2.0, 1.0, 1.0, 1.0, 2.0, 1.0]).unwrap();
    assert_eq!(merges(&mixed), vec![(0, 2), (3, 4), (1, 5)]);
    assert_eq!(mixed.merges[2].height, 2.0);
}

/// Euclidean distances of the unit square's corners plus (5, 5).
fn cosine_free_square() -> Vec<f64> {
    let p = [
        [0.0f64, 0.0],
        [1.0, 0.0],
        [0.0, 1.0],
        [1.0, 1.0],
        [5.0, 5.0],
    ];
    let mut out = Vec::new();
    for i in 0..p.len() {
        for j in i + 1..p.len() {
            out.push(((p[i][0] - p[j][0]).powi(2) + (p[i][1] - p[j][1]).powi(2)).sqrt());
        }
    }
    out
}

#[test]
fn kendall_matches_brute_force_with_ties() {
    let mut rng = Rng::new(5);
    let x: Vec<f64> = (0..300).map(|_| (rng.uniform() * 6.0).floor()).collect();
    let y: Vec<f64> = x
        .iter()
        .map(|v| (v + rng.uniform() * 4.0).floor())
        .collect();
    let (mut c, mut d, mut tx, mut ty) = (0i64, 0i64, 0i64, 0i64);
    for i in 0..x.len() {
        for j in i + 1..x.len() {
            let (sx, sy) = ((x[i] - x[j]).signum(), (y[i] - y[j]).signum());
            match (x[i] == x[j], y[i] == y[j]) {
                (true, true) => {}
                (true, false) => tx += 1,
                (false, true) => ty += 1,
                _ if sx == sy => c += 1,
                _ => d += 1,
            }
        }
    }
    let want = (c - d) as f64 / (((c + d + tx) * (c + d + ty)) as f64).sqrt();
    let got = kendall_tau_b(&x, &y).unwrap();
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    assert!(kendall_tau_b(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0])
        .unwrap()
        .is_nan());
}

#[test]
fn spearman_uses_average_ranks() {
    assert_eq!(
        average_ranks(&[3.0, 1.0, 3.0, 2.0]),
        vec![3.5, 1.0, 3.5, 2.0]
    );
    let r = spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 20.0, 40.0]).unwrap();
    // Pearson of ranks (1,2,3,4) and (1,2.5,2.5,4).
    assert!((r - 0.948_683_298_050_513_8).abs() < 1e-12, "{r}");
    assert!(pearson(&[1.0, 1.0], &[1.0, 2.0]).unwrap().is_nan());
}

#[test]
fn correlation_and_tree_errors() {
    let e = pearson(&[1.0, 2.0], &[1.0]).unwrap_err().to_string();
    assert!(e.contains("different lengths"), "{e}");
    let e = spearman(&[1.0, f64::NAN], &[1.0, 2.0])
        .unwrap_err()
        .to_string();
    assert!(e.contains("NaN"), "{e}");
    let e = Dendrogram::ward(&[1.0, 2.0]).unwrap_err().to_string();
    assert!(e.contains("not n(n−1)/2"), "{e}");
    let e =
        tree_similarity(&kat_a(), &Features::from_rows(&[[1.0f32, 0.0]; 4]).unwrap()).unwrap_err();
    assert!(e.to_string().contains("A has 5 items but B has 4"), "{e}");
}

#[test]
fn ward_dendrogram_is_consistent_at_scale() {
    let x = Rng::new(6).features(300, 8);
    let t = Dendrogram::ward_cosine(&x).unwrap();
    assert_eq!(t.merges.len(), 299);
    assert_eq!(t.merges.last().unwrap().size, 300);
    assert!(t.merges.windows(2).all(|w| w[0].height <= w[1].height));
    assert!(t
        .merges
        .iter()
        .enumerate()
        .all(|(k, m)| m.left < m.right && m.right < 300 + k));
    // Ultrametric: the cophenetic matrix and the LCA path lengths are fully populated.
    assert!(t.cophenetic().iter().all(|&h| h > 0.0));
    assert!(t.lca_path_lengths().iter().all(|&l| l >= 2));
}

#[test]
fn hierarchy_parses_lists_and_named_groups() {
    let h = ClassHierarchy::parse("[[0,6,8,9],[1,7],[2,3,5],[4]]").unwrap();
    assert_eq!(h.num_levels(), 2);
    assert_eq!(
        (h.num_groups(1).unwrap(), h.num_groups(2).unwrap()),
        (4, 10)
    );
    assert_eq!(
        h.level_labels(1, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap(),
        vec![0, 1, 2, 2, 3, 2, 0, 1, 0, 0]
    );
    assert_eq!(h.level_labels(2, &[9, 0]).unwrap(), vec![3, 0]);
    let named = ClassHierarchy::parse(
        "animals: [0, 6, 8, 9]\nvehicles: [1, 7]\nplants: [2, 3, 5]\nother: [4]\n",
    )
    .unwrap();
    assert_eq!(named, h);
    // Uneven depths: class 4 is its own group below level 1.
    let deep = ClassHierarchy::parse("[[[0, 1], [2]], 4]").unwrap();
    assert_eq!(deep.num_levels(), 3);
    let all = [0, 1, 2, 4];
    assert_eq!(deep.level_labels(1, &all).unwrap(), vec![0, 0, 0, 1]);
    assert_eq!(deep.level_labels(2, &all).unwrap(), vec![0, 0, 1, 2]);
    assert_eq!(deep.level_labels(3, &all).unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(deep.classes(), &all);
}

#[test]
fn hierarchy_files_are_read_up_to_a_size_limit() {
    let path = std::env::temp_dir().join(format!("ssl-hierarchy-{}.yaml", std::process::id()));
    std::fs::write(&path, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
    let e = format!("{:#}", ClassHierarchy::load(&path).unwrap_err());
    assert!(e.contains("is larger than 1 MiB"), "{e}");
    std::fs::write(&path, "[[0, 1], [2]]").unwrap();
    assert_eq!(ClassHierarchy::load(&path).unwrap().classes(), &[0, 1, 2]);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn hierarchy_errors_are_clear() {
    let err = |text: &str| format!("{:#}", ClassHierarchy::parse(text).unwrap_err());
    let e = err("[[0, 1], [1, 2]]");
    assert!(e.contains("class id 1 appears more than once"), "{e}");
    let e = err("[[0, cat], [2]]");
    assert!(
        e.contains("at root[0][1]") && e.contains("found a string"),
        "{e}"
    );
    let e = err("[[0, -3]]");
    assert!(e.contains("class id -3"), "{e}");
    let e = err("[[0], []]");
    assert!(e.contains("at root[1]: empty group"), "{e}");
    let e = err("[[0, 1]");
    assert!(e.contains("not valid YAML or JSON"), "{e}");
    let e = err("7");
    assert!(e.contains("root must be a list"), "{e}");
    let h = ClassHierarchy::parse("[[0], [1]]").unwrap();
    assert!(h
        .level_labels(3, &[0])
        .unwrap_err()
        .to_string()
        .contains("levels are 1..=2"));
    assert!(h
        .level_labels(1, &[5])
        .unwrap_err()
        .to_string()
        .contains("label 5 is not a class"));
    let path = std::env::temp_dir().join(format!("ssl-eval-hierarchy-{}.yaml", std::process::id()));
    std::fs::write(&path, "groups: [[0, 1], [2, x]]\n").unwrap();
    let e = format!("{:#}", ClassHierarchy::load(&path).unwrap_err());
    std::fs::remove_file(&path).unwrap();
    assert!(
        e.contains(&path.display().to_string()) && e.contains("at root.groups[1][1]"),
        "{e}"
    );
    let missing = format!(
        "{:#}",
        ClassHierarchy::load(Path::new("/nonexistent/h.yaml")).unwrap_err()
    );
    assert!(
        missing.contains("cannot read class-hierarchy file /nonexistent/h.yaml"),
        "{missing}"
    );
}

#[test]
fn hierarchical_rand_index_recovers_a_two_level_tree() {
    // Two superclasses = two arcs in orthogonal planes; each arc is two subclasses (25
    // points each) separated by a gap of ~3.6 point spacings, so the 10-NN graph connects
    // the siblings (one component per superclass) while the gap stays visible at level 2.
    let mut rng = Rng::new(7);
    let mut rows = Vec::new();
    let mut labels = Vec::new();
    for class in 0..4u32 {
        let (plane, half) = ((class / 2) as usize, f64::from(class % 2));
        for p in 0..25 {
            let theta = half * 0.23 + 0.2 * f64::from(p) / 24.0 + 1e-4 * rng.normal();
            let mut row = [0.0f32; 4];
            row[2 * plane] = theta.cos() as f32;
            row[2 * plane + 1] = theta.sin() as f32;
            rows.push(row);
            labels.push(class);
        }
    }
    let x = Features::from_rows(&rows).unwrap();
    let h = ClassHierarchy::parse("[[0, 1], [2, 3]]").unwrap();
    let ri = hierarchical_rand_index(&x, &h, &labels, 0).unwrap();
    assert_eq!(ri.len(), 2);
    assert_eq!((ri[0].level, ri[0].clusters, ri[1].clusters), (1, 2, 4));
    assert!(ri.iter().all(|r| r.rand_index == 1.0), "{ri:?}");
    let e = hierarchical_rand_index(&x, &h, &labels[1..], 0).unwrap_err();
    assert!(e.to_string().contains("99 labels for 100 samples"), "{e}");
}
