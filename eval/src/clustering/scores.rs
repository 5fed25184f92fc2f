//! Partition-comparison scores from the contingency table of two labelings: NMI, AMI, ARI and
//! the unadjusted Rand index (spec §9, §11).

use std::collections::HashMap;

use anyhow::{ensure, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Contingency table of two labelings (spec §9): rows = distinct true labels (ascending),
/// columns = distinct predicted labels (ascending), stored sparsely.
#[derive(Debug, Clone, PartialEq)]
pub struct Contingency {
    /// Distinct true labels `U`, ascending (row order).
    pub classes: Vec<u32>,
    /// Distinct predicted labels `V`, ascending (column order).
    pub clusters: Vec<u32>,
    /// Row sums `a_u`.
    pub row_sums: Vec<u64>,
    /// Column sums `b_v`.
    pub col_sums: Vec<u64>,
    /// Non-zero cells `(u, v, n_uv)`, sorted by `(u, v)`.
    pub cells: Vec<(usize, usize, u64)>,
    /// Number of samples `n`.
    pub n: u64,
}

impl Contingency {
    /// Builds the table; fails on different lengths or no samples.
    pub fn new(labels_true: &[u32], labels_pred: &[u32]) -> Result<Self> {
        ensure!(
            labels_true.len() == labels_pred.len(),
            "contingency table: {} true labels but {} predicted labels",
            labels_true.len(),
            labels_pred.len()
        );
        ensure!(
            !labels_true.is_empty(),
            "contingency table: no samples to compare"
        );
        let dense = |labels: &[u32]| {
            let mut distinct = labels.to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            let index: HashMap<u32, usize> =
                distinct.iter().enumerate().map(|(i, &l)| (l, i)).collect();
            (distinct, index)
        };
        let (classes, ci) = dense(labels_true);
        let (clusters, ki) = dense(labels_pred);
        let mut counts: HashMap<(usize, usize), u64> = HashMap::new();
        let mut row_sums = vec![0u64; classes.len()];
        let mut col_sums = vec![0u64; clusters.len()];
        for (t, p) in labels_true.iter().zip(labels_pred) {
            let (u, v) = (ci[t], ki[p]);
            *counts.entry((u, v)).or_insert(0) += 1;
            row_sums[u] += 1;
            col_sums[v] += 1;
        }
        let mut cells: Vec<(usize, usize, u64)> =
            counts.into_iter().map(|((u, v), c)| (u, v, c)).collect();
        cells.sort_unstable();
        Ok(Self {
            classes,
            clusters,
            row_sums,
            col_sums,
            cells,
            n: labels_true.len() as u64,
        })
    }

    /// The dense `|U| × |V|` table.
    pub fn dense(&self) -> Vec<Vec<u64>> {
        let mut table = vec![vec![0u64; self.clusters.len()]; self.classes.len()];
        for &(u, v, c) in &self.cells {
            table[u][v] = c;
        }
        table
    }

    /// Whether both labelings are a single cluster (the reference's perfect-match special case).
    fn both_single(&self) -> bool {
        self.classes.len() == 1 && self.clusters.len() == 1
    }

    /// `MI = Σ_{u,v} (n_uv/n) log(n·n_uv / (a_u b_v))` (natural log); 0 when either labeling is a
    /// single cluster, per-cell terms below machine epsilon zeroed and the sum clipped at 0 (as
    /// the reference).
    pub fn mutual_information(&self) -> f64 {
        if self.classes.len() == 1 || self.clusters.len() == 1 {
            return 0.0;
        }
        let n = self.n as f64;
        let mi: f64 = self
            .cells
            .iter()
            .map(|&(u, v, c)| {
                let c = c as f64;
                let outer = self.row_sums[u] as f64 * self.col_sums[v] as f64;
                let term = (c / n) * ((c.ln() - n.ln()) + (2.0 * n.ln() - outer.ln()));
                if term.abs() < f64::EPSILON {
                    0.0
                } else {
                    term
                }
            })
            .sum();
        mi.max(0.0)
    }

    /// Entropies `(H(U), H(V))`, `H = −Σ (a/n) log(a/n)`.
    pub fn entropies(&self) -> (f64, f64) {
        let n = self.n as f64;
        let h = |sums: &[u64]| -> f64 {
            -sums
                .iter()
                .map(|&a| (a as f64 / n) * ((a as f64).ln() - n.ln()))
                .sum::<f64>()
        };
        (h(&self.row_sums), h(&self.col_sums))
    }

    /// Expected MI under the permutation (hypergeometric) model (spec §9):
    /// `E[MI] = Σ_u Σ_v Σ_{m=max(1, a_u+b_v−n)}^{min(a_u,b_v)} (m/n) log(n m/(a_u b_v)) ·
    /// a_u! b_v! (n−a_u)! (n−b_v)! / (n! m! (a_u−m)! (b_v−m)! (n−a_u−b_v+m)!)`,
    /// factorials through a Lanczos `ln Γ`; 0 when either labeling is a single cluster.
    pub fn expected_mutual_information(&self) -> f64 {
        if self.classes.len() == 1 || self.clusters.len() == 1 {
            return 0.0;
        }
        let n = self.n as usize;
        let nf = n as f64;
        let ln_fact: Vec<f64> = (0..=n).map(|m| ln_gamma(m as f64 + 1.0)).collect();
        let per_row: Vec<f64> = self
            .row_sums
            .par_iter()
            .map(|&a| {
                let a = a as usize;
                let mut emi = 0.0;
                for &b in &self.col_sums {
                    let b = b as usize;
                    let fixed =
                        ln_fact[a] + ln_fact[b] + ln_fact[n - a] + ln_fact[n - b] - ln_fact[n];
                    let log_ab = (a as f64).ln() + (b as f64).ln();
                    for m in (a + b).saturating_sub(n).max(1)..=a.min(b) {
                        let mf = m as f64;
                        let term2 = nf.ln() + mf.ln() - log_ab;
                        let gln = fixed
                            - ln_fact[m]
                            - ln_fact[a - m]
                            - ln_fact[b - m]
                            - ln_fact[n + m - a - b];
                        emi += (mf / nf) * term2 * gln.exp();
                    }
                }
                emi
            })
            .collect();
        per_row.iter().sum()
    }

    /// `(Σ_uv C(n_uv,2), Σ_u C(a_u,2), Σ_v C(b_v,2), C(n,2))` as `f64`.
    fn pair_sums(&self) -> (f64, f64, f64, f64) {
        let c2 = |m: u64| (m as f64) * (m as f64 - 1.0) / 2.0;
        (
            self.cells.iter().map(|&(_, _, c)| c2(c)).sum(),
            self.row_sums.iter().map(|&a| c2(a)).sum(),
            self.col_sums.iter().map(|&b| c2(b)).sum(),
            c2(self.n),
        )
    }

    /// NMI with the arithmetic mean (spec §9); 1 when both labelings are a single cluster, 0
    /// when MI = 0 otherwise.
    pub fn nmi(&self) -> f64 {
        if self.both_single() {
            return 1.0;
        }
        let mi = self.mutual_information();
        if mi == 0.0 {
            return 0.0;
        }
        let (hu, hv) = self.entropies();
        mi / (0.5 * (hu + hv))
    }

    /// AMI = `(MI − E[MI]) / (mean(H(U), H(V)) − E[MI])` (arithmetic mean, spec §9); 1 when both
    /// labelings are a single cluster; the denominator keeps its sign and is at least machine
    /// epsilon in magnitude (reference behaviour for a perfect match).
    pub fn ami(&self) -> f64 {
        if self.both_single() {
            return 1.0;
        }
        let mi = self.mutual_information();
        let emi = self.expected_mutual_information();
        let (hu, hv) = self.entropies();
        let denominator = 0.5 * (hu + hv) - emi;
        let denominator = if denominator < 0.0 {
            denominator.min(-f64::EPSILON)
        } else {
            denominator.max(f64::EPSILON)
        };
        (mi - emi) / denominator
    }

    /// ARI (spec §9): `(Σ C(n_uv,2) − Σ_u C(a_u,2) Σ_v C(b_v,2)/C(n,2)) /
    /// (½[Σ_u C(a_u,2) + Σ_v C(b_v,2)] − Σ_u C(a_u,2) Σ_v C(b_v,2)/C(n,2))`; 1 when the two
    /// labelings agree on every pair (identical partitions, including one sample).
    pub fn ari(&self) -> f64 {
        let (sum_cells, sum_rows, sum_cols, pairs) = self.pair_sums();
        if sum_cells == sum_rows && sum_cells == sum_cols {
            return 1.0;
        }
        let expected = sum_rows * sum_cols / pairs;
        (sum_cells - expected) / (0.5 * (sum_rows + sum_cols) - expected)
    }

    /// Unadjusted Rand index (spec §11): `(#pairs together in both + #pairs apart in both) /
    /// C(n, 2)`; 1 for a single sample.
    pub fn rand_index(&self) -> f64 {
        let (sum_cells, sum_rows, sum_cols, pairs) = self.pair_sums();
        if pairs == 0.0 {
            return 1.0;
        }
        let agree = pairs + 2.0 * sum_cells - sum_rows - sum_cols;
        agree / pairs
    }
}

/// NMI, AMI and ARI of a clustering against the true labels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClusteringScores {
    /// Normalised mutual information (arithmetic mean).
    pub nmi: f64,
    /// Adjusted mutual information (arithmetic mean).
    pub ami: f64,
    /// Adjusted Rand index.
    pub ari: f64,
}

/// NMI, AMI and ARI of `labels_pred` against `labels_true` (spec §9) from one contingency table.
pub fn clustering_metrics(labels_true: &[u32], labels_pred: &[u32]) -> Result<ClusteringScores> {
    let table = Contingency::new(labels_true, labels_pred)?;
    Ok(ClusteringScores {
        nmi: table.nmi(),
        ami: table.ami(),
        ari: table.ari(),
    })
}

/// Normalised mutual information, arithmetic mean (spec §9).
pub fn normalized_mutual_info(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.nmi())
}

/// Adjusted mutual information, arithmetic mean (spec §9).
pub fn adjusted_mutual_info(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.ami())
}

/// Adjusted Rand index (spec §9).
pub fn adjusted_rand_index(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.ari())
}

/// Unadjusted Rand index (spec §11).
pub fn rand_index(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.rand_index())
}

/// `ln Γ(x)` for `x ≥ 0.5` by the Lanczos approximation (`g = 7`, 9 coefficients; relative error
/// about 1e-15).
pub(super) fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let series = COEFFICIENTS[1..]
        .iter()
        .enumerate()
        .fold(COEFFICIENTS[0], |acc, (i, c)| {
            acc + c / (x + i as f64 + 1.0)
        });
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}
