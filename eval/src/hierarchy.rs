//! Tree-based comparison of embeddings (`docs/spec/metrics.md` §10) and the hierarchical Rand index
//! (spec §11), from SAG-VICReg (semantic-aware generalisation of VICReg).
//!
//! * [`cosine_distances`]: condensed pairwise cosine distances `1 − cos(a_i, a_j)`, `i < j`, in
//!   the order `(0,1), (0,2), …, (0,n−1), (1,2), …`.
//! * [`Dendrogram::ward`]: Ward linkage on a precomputed condensed distance vector through the
//!   Lance–Williams update
//!   `d(k, i∪j) = sqrt(((n_i+n_k) d(k,i)² + (n_j+n_k) d(k,j)² − n_k d(i,j)²) / (n_i+n_j+n_k))`,
//!   computed like the reference `scipy.cluster.hierarchy.linkage(y, "ward")`: the
//!   nearest-neighbour-chain algorithm (O(n²) time and memory, same tie handling), merges
//!   stable-sorted by height, cluster ids relabelled `n, n+1, …` in that order, each merge
//!   listing the smaller id first.
//! * Cophenetic distances (merge height of the first cluster containing both items) and LCA path
//!   lengths (edges from each leaf up to the lowest common ancestor in the binary dendrogram).
//! * Pearson, Spearman (average ranks) and Kendall τ-b correlations; [`tree_similarity`] gives the
//!   LCA similarity (the three correlations between the LCA path lengths of two embeddings of the
//!   same items) and the cophenetic similarities D1→P2 = Pearson(T_A, dist_B) and
//!   D2→P1 = Pearson(T_B, dist_A); [`cophenetic_correlation`] the classic Pearson(T, dist).
//! * [`ClassHierarchy`]: a class tree read from YAML or JSON, giving per-level labels, and
//!   [`hierarchical_rand_index`]: spectral clustering (spec §11 Default) with as many clusters as
//!   level-ℓ groups present among the samples, unadjusted Rand index against the level-ℓ labels,
//!   for every level.
//!
//! # Class-hierarchy file format
//!
//! A YAML (or JSON, which is valid YAML) document whose root is a list or a mapping of groups.
//! A node is a class id (non-negative integer), a list of nodes (an anonymous group) or a
//! mapping `name: node` (named groups, names are documentation only). Level 1 is the coarsest:
//! the root's children; a class at depth `D` is its own group at every level `≥ D`; the number
//! of levels is the largest depth, whose groups are the single classes. Every class id must
//! occur exactly once; groups must be non-empty. Group ids of a level are numbered in document
//! order from 0. Examples (equivalent trees of two levels over ten classes):
//!
//! ```yaml
//! [[0, 6, 8, 9], [1, 7], [2, 3, 5], [4]]
//! ```
//!
//! ```yaml
//! animals: [0, 6, 8, 9]
//! vehicles: [1, 7]
//! plants: [2, 3, 5]
//! other: [4]
//! ```

use std::cmp::Ordering;
use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_yaml::Value;

use crate::clustering::{
    rand_index, SpectralEmbedding, DEFAULT_RESTARTS, DEFAULT_SPECTRAL_NEIGHBORS,
};
use crate::Features;

/// Largest hierarchy file [`ClassHierarchy::load`] reads (a hierarchy is a few KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// Position of the pair `(i, j)`, `i ≠ j`, in a condensed vector over `n` items.
fn condensed_index(n: usize, i: usize, j: usize) -> usize {
    let (i, j) = if i < j { (i, j) } else { (j, i) };
    n * i - i * (i + 1) / 2 + j - i - 1
}

/// Number of items `n` with `n(n−1)/2 = len`.
fn items_of_condensed(len: usize) -> Result<usize> {
    let n = ((1.0 + (1.0 + 8.0 * len as f64).sqrt()) / 2.0).round() as usize;
    ensure!(
        n * (n - 1) / 2 == len && n >= 2,
        "condensed distance vector of length {len} is not n(n−1)/2 for any n ≥ 2"
    );
    Ok(n)
}

/// Condensed cosine distances `1 − cos(x_i, x_j)` (`i < j`) of the rows of `x` (`[n, d]`), in
/// `f64`, clamped to `[0, 2]`. Rows are normalised with `max(‖x‖, 1e-12)`, so a zero row is at
/// distance 1 from everything (the reference gives NaN).
pub fn cosine_distances(x: &Features) -> Vec<f64> {
    let (n, d) = (x.n, x.d);
    let z = x.normalized_rows_f64();
    let per_row: Vec<Vec<f64>> = (0..n)
        .into_par_iter()
        .map(|i| {
            let a = &z[i * d..(i + 1) * d];
            (i + 1..n)
                .map(|j| {
                    let cos: f64 = a
                        .iter()
                        .zip(&z[j * d..(j + 1) * d])
                        .map(|(p, q)| p * q)
                        .sum();
                    (1.0 - cos).clamp(0.0, 2.0)
                })
                .collect()
        })
        .collect();
    per_row.into_iter().flatten().collect()
}

/// One agglomeration step: clusters `left < right` (ids `< n` are leaves, `n + t` is the cluster
/// formed by merge `t`) joined at `height` into a cluster of `size` leaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Merge {
    /// Smaller cluster id.
    pub left: usize,
    /// Larger cluster id.
    pub right: usize,
    /// Linkage distance of the merge.
    pub height: f64,
    /// Number of leaves of the merged cluster.
    pub size: usize,
}

/// A binary dendrogram over `n` leaves: `n − 1` merges in order of non-decreasing height (the
/// reference's linkage matrix `Z`, one [`Merge`] per row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dendrogram {
    /// Number of leaves.
    pub n: usize,
    /// Merges; merge `t` creates cluster id `n + t`.
    pub merges: Vec<Merge>,
}

/// Lance–Williams update of Ward linkage, in the reference's operation order.
fn ward_update(
    d_xi: f64,
    d_yi: f64,
    d_xy: f64,
    size_x: usize,
    size_y: usize,
    size_i: usize,
) -> f64 {
    let t = 1.0 / (size_x + size_y + size_i) as f64;
    let (sx, sy, si) = (size_x as f64, size_y as f64, size_i as f64);
    ((si + sx) * t * d_xi * d_xi + (si + sy) * t * d_yi * d_yi - si * t * d_xy * d_xy).sqrt()
}

impl Dendrogram {
    /// Ward linkage of the condensed distance vector `condensed` (`n(n−1)/2` finite values) by
    /// the nearest-neighbour chain, with the reference's merge order, heights and cluster ids.
    pub fn ward(condensed: &[f64]) -> Result<Self> {
        let n = items_of_condensed(condensed.len())?;
        ensure!(
            condensed.iter().all(|v| v.is_finite()),
            "Ward linkage: the distance vector contains NaN or infinite values"
        );
        let mut dist = condensed.to_vec();
        let mut size = vec![1usize; n];
        let mut chain: Vec<usize> = Vec::with_capacity(n);
        let mut raw: Vec<(usize, usize, f64)> = Vec::with_capacity(n - 1);
        for _ in 0..n - 1 {
            if chain.is_empty() {
                chain.extend(size.iter().position(|&s| s > 0));
            }
            let (x, y, current) = loop {
                let x = chain[chain.len() - 1];
                // Prefer the previous chain element as the minimum (avoids cycles on ties).
                let previous = (chain.len() > 1).then(|| chain[chain.len() - 2]);
                let (mut y, mut current) = match previous {
                    Some(p) => (p, dist[condensed_index(n, x, p)]),
                    None => (x, f64::INFINITY),
                };
                for (i, &s) in size.iter().enumerate() {
                    if s == 0 || i == x {
                        continue;
                    }
                    let d = dist[condensed_index(n, x, i)];
                    if d < current {
                        current = d;
                        y = i;
                    }
                }
                if previous == Some(y) {
                    break (x, y, current);
                }
                chain.push(y);
            };
            chain.truncate(chain.len() - 2);
            let (x, y) = (x.min(y), x.max(y));
            let (nx, ny) = (size[x], size[y]);
            raw.push((x, y, current));
            size[x] = 0;
            size[y] = nx + ny;
            for i in 0..n {
                let ni = size[i];
                if ni == 0 || i == y {
                    continue;
                }
                let updated = ward_update(
                    dist[condensed_index(n, i, x)],
                    dist[condensed_index(n, i, y)],
                    current,
                    nx,
                    ny,
                    ni,
                );
                dist[condensed_index(n, i, y)] = updated;
            }
        }
        raw.sort_by(|a, b| a.2.total_cmp(&b.2));
        Ok(Self {
            n,
            merges: relabel(&raw, n),
        })
    }

    /// Ward linkage of the cosine distances of the rows of `x` (`[n, d]`, `n ≥ 2`).
    pub fn ward_cosine(x: &Features) -> Result<Self> {
        ensure!(
            x.n >= 2 && x.d > 0,
            "Ward linkage needs at least 2 non-empty rows (got {}×{})",
            x.n,
            x.d
        );
        ensure!(
            x.data.iter().all(|v| v.is_finite()),
            "Ward linkage: features contain NaN or infinite values; check the encoder output"
        );
        Self::ward(&cosine_distances(x))
    }

    /// Condensed cophenetic distances: `T(i, j)` = height of the first merge joining `i` and `j`.
    pub fn cophenetic(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.n * (self.n - 1) / 2];
        let mut members: Vec<Vec<usize>> = (0..self.n).map(|i| vec![i]).collect();
        for m in &self.merges {
            let (a, b) = (&members[m.left], &members[m.right]);
            for &i in a {
                for &j in b {
                    out[condensed_index(self.n, i, j)] = m.height;
                }
            }
            let mut joined = std::mem::take(&mut members[m.left]);
            joined.append(&mut members[m.right]);
            members.push(joined);
        }
        out
    }

    /// Condensed LCA path lengths: edges from leaf `i` up to the lowest common ancestor of `i`
    /// and `j` plus edges from leaf `j` up to it.
    pub fn lca_path_lengths(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.n * (self.n - 1) / 2];
        // (leaf, edges from the leaf up to the cluster's root)
        let mut members: Vec<Vec<(usize, u32)>> = (0..self.n).map(|i| vec![(i, 0)]).collect();
        for m in &self.merges {
            let (a, b) = (&members[m.left], &members[m.right]);
            for &(i, di) in a {
                for &(j, dj) in b {
                    out[condensed_index(self.n, i, j)] = di + dj + 2;
                }
            }
            let mut joined = std::mem::take(&mut members[m.left]);
            joined.append(&mut members[m.right]);
            joined.iter_mut().for_each(|(_, depth)| *depth += 1);
            members.push(joined);
        }
        out
    }
}

/// The reference's relabelling of (stable-sorted) nearest-neighbour-chain merges: a union–find
/// over `2n − 1` ids gives every merge the ids of the clusters that currently hold its two slots.
fn relabel(raw: &[(usize, usize, f64)], n: usize) -> Vec<Merge> {
    let mut parent: Vec<usize> = (0..2 * n - 1).collect();
    let mut sizes: Vec<usize> = vec![1; 2 * n - 1];
    let find = |parent: &mut Vec<usize>, mut x: usize| {
        let mut p = x;
        while parent[x] != x {
            x = parent[x];
        }
        while parent[p] != x {
            let next = parent[p];
            parent[p] = x;
            p = next;
        }
        x
    };
    raw.iter()
        .enumerate()
        .map(|(t, &(x, y, height))| {
            let (rx, ry) = (find(&mut parent, x), find(&mut parent, y));
            let label = n + t;
            parent[rx] = label;
            parent[ry] = label;
            sizes[label] = sizes[rx] + sizes[ry];
            Merge {
                left: rx.min(ry),
                right: rx.max(ry),
                height,
                size: sizes[label],
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Correlations.

fn check_pair(x: &[f64], y: &[f64], what: &str) -> Result<()> {
    ensure!(
        x.len() == y.len(),
        "{what}: the two vectors have different lengths ({} and {})",
        x.len(),
        y.len()
    );
    ensure!(
        x.len() >= 2,
        "{what}: needs at least 2 paired values (got {})",
        x.len()
    );
    ensure!(
        x.iter().chain(y).all(|v| v.is_finite()),
        "{what}: values contain NaN or infinite entries"
    );
    Ok(())
}

/// Pearson correlation `Σ (x−x̄)(y−ȳ) / (‖x−x̄‖ ‖y−ȳ‖)`, clipped to `[−1, 1]`; NaN when either
/// vector is constant (as the reference).
pub fn pearson(x: &[f64], y: &[f64]) -> Result<f64> {
    check_pair(x, y, "Pearson correlation")?;
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let xm: Vec<f64> = x.iter().map(|v| v - mx).collect();
    let ym: Vec<f64> = y.iter().map(|v| v - my).collect();
    let (nx, ny) = (
        xm.iter().map(|v| v * v).sum::<f64>().sqrt(),
        ym.iter().map(|v| v * v).sum::<f64>().sqrt(),
    );
    if nx == 0.0 || ny == 0.0 {
        return Ok(f64::NAN);
    }
    let r: f64 = xm.iter().zip(&ym).map(|(a, b)| (a / nx) * (b / ny)).sum();
    Ok(r.clamp(-1.0, 1.0))
}

/// Ranks `1..=n` with ties given their average rank.
fn average_ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| cmp_f64(x[a], x[b]));
    let mut ranks = vec![0.0; x.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && x[order[end]] == x[order[start]] {
            end += 1;
        }
        let rank = (start + end + 1) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

/// Total order on finite values (`-0.0 == 0.0`).
fn cmp_f64(a: f64, b: f64) -> Ordering {
    a.partial_cmp(&b).unwrap_or(Ordering::Equal)
}

/// Spearman correlation: Pearson of the average ranks; NaN when either vector is constant.
pub fn spearman(x: &[f64], y: &[f64]) -> Result<f64> {
    check_pair(x, y, "Spearman correlation")?;
    pearson(&average_ranks(x), &average_ranks(y))
}

/// `Σ c(c−1)/2` over the runs of equal consecutive values of `v`.
fn tied_pairs<T: PartialEq>(v: &[T]) -> u64 {
    let mut total = 0u64;
    let mut run = 1u64;
    for w in v.windows(2) {
        if w[0] == w[1] {
            run += 1;
        } else {
            total += run * (run - 1) / 2;
            run = 1;
        }
    }
    total + run * (run - 1) / 2
}

/// Number of pairs `i < j` with `v[i] > v[j]`, by merge sort (sorts `v`).
fn inversions(v: &mut [f64], buf: &mut Vec<f64>) -> u64 {
    if v.len() < 2 {
        return 0;
    }
    let mid = v.len() / 2;
    let mut count = inversions(&mut v[..mid], buf) + inversions(&mut v[mid..], buf);
    buf.clear();
    let (mut i, mut j) = (0, mid);
    while i < mid && j < v.len() {
        if v[j] < v[i] {
            count += (mid - i) as u64;
            buf.push(v[j]);
            j += 1;
        } else {
            buf.push(v[i]);
            i += 1;
        }
    }
    buf.extend_from_slice(&v[i..mid]);
    buf.extend_from_slice(&v[j..]);
    v.copy_from_slice(buf);
    count
}

/// Kendall τ-b `(n_c − n_d) / sqrt((n_0 − n_x)(n_0 − n_y))` in `O(m log m)` (Knight's
/// algorithm); NaN when either vector is constant.
pub fn kendall_tau_b(x: &[f64], y: &[f64]) -> Result<f64> {
    check_pair(x, y, "Kendall τ-b")?;
    let m = x.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| cmp_f64(x[a], x[b]).then(cmp_f64(y[a], y[b])));
    let xs: Vec<f64> = order.iter().map(|&i| x[i]).collect();
    let mut ys: Vec<f64> = order.iter().map(|&i| y[i]).collect();
    let joint: Vec<(f64, f64)> = xs.iter().copied().zip(ys.iter().copied()).collect();
    let (x_ties, joint_ties) = (tied_pairs(&xs), tied_pairs(&joint));
    let discordant = inversions(&mut ys, &mut Vec::with_capacity(m));
    let y_ties = tied_pairs(&ys);
    let total = (m as u64) * (m as u64 - 1) / 2;
    if x_ties == total || y_ties == total {
        return Ok(f64::NAN);
    }
    let numerator =
        total as f64 - x_ties as f64 - y_ties as f64 + joint_ties as f64 - 2.0 * discordant as f64;
    Ok(numerator / ((total - x_ties) as f64).sqrt() / ((total - y_ties) as f64).sqrt())
}

// ---------------------------------------------------------------------------------------------
// Tree similarity.

/// LCA and cophenetic similarity of two embeddings of the same items (spec §10).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TreeSimilarity {
    /// Pearson correlation of the LCA path lengths of A and B.
    pub lca_pearson: f64,
    /// Spearman correlation (average ranks) of the LCA path lengths.
    pub lca_spearman: f64,
    /// Kendall τ-b of the LCA path lengths.
    pub lca_kendall: f64,
    /// D1→P2: Pearson(cophenetic distances of A, cosine distances of B).
    pub cophenetic_d1_p2: f64,
    /// D2→P1: Pearson(cophenetic distances of B, cosine distances of A).
    pub cophenetic_d2_p1: f64,
}

/// Cosine distances and Ward dendrogram of one embedding.
fn tree_of(x: &Features, what: &str) -> Result<(Vec<f64>, Dendrogram)> {
    ensure!(
        x.n >= 3,
        "tree similarity: embedding {what} has {} items; correlations over pairs need at least 3",
        x.n
    );
    let dist = cosine_distances(x);
    let tree = Dendrogram::ward_cosine(x)?;
    Ok((dist, tree))
}

/// LCA similarity and cophenetic similarity (spec §10) of `a` (`[n, d₁]`) and `b` (`[n, d₂]`),
/// rows = the same `n` items in the same order.
pub fn tree_similarity(a: &Features, b: &Features) -> Result<TreeSimilarity> {
    ensure!(
        a.n == b.n,
        "tree similarity: A has {} items but B has {}; both must embed the same items",
        a.n,
        b.n
    );
    let (dist_a, tree_a) = tree_of(a, "A")?;
    let (dist_b, tree_b) = tree_of(b, "B")?;
    let lca =
        |t: &Dendrogram| -> Vec<f64> { t.lca_path_lengths().into_iter().map(f64::from).collect() };
    let (lca_a, lca_b) = (lca(&tree_a), lca(&tree_b));
    Ok(TreeSimilarity {
        lca_pearson: pearson(&lca_a, &lca_b)?,
        lca_spearman: spearman(&lca_a, &lca_b)?,
        lca_kendall: kendall_tau_b(&lca_a, &lca_b)?,
        cophenetic_d1_p2: pearson(&tree_a.cophenetic(), &dist_b)?,
        cophenetic_d2_p1: pearson(&tree_b.cophenetic(), &dist_a)?,
    })
}

/// Classic cophenetic correlation coefficient of one embedding: Pearson(T, cosine distances)
/// of its Ward dendrogram.
pub fn cophenetic_correlation(x: &Features) -> Result<f64> {
    let (dist, tree) = tree_of(x, "X")?;
    pearson(&tree.cophenetic(), &dist)
}

// ---------------------------------------------------------------------------------------------
// Class hierarchy and hierarchical Rand index.

/// A tree over class ids (see the module documentation for the file format).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassHierarchy {
    /// Class ids in document order.
    classes: Vec<u32>,
    /// `groups[ℓ − 1][c]`: group id at level ℓ of the class at position `c` of `classes`.
    groups: Vec<Vec<u32>>,
    /// Number of groups per level.
    counts: Vec<usize>,
    /// Position of every class id in `classes`.
    position: HashMap<u32, usize>,
}

/// A parsed hierarchy node.
enum Node {
    Class(u32),
    Group(Vec<Node>),
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn parse_node(v: &Value, path: &str) -> Result<Node> {
    match v {
        Value::Number(num) => match num.as_u64().and_then(|c| u32::try_from(c).ok()) {
            Some(c) => Ok(Node::Class(c)),
            None => bail!(
                "class hierarchy: at {path}: class id {num} is not an integer in 0..=4294967295"
            ),
        },
        Value::Sequence(items) => {
            ensure!(!items.is_empty(), "class hierarchy: at {path}: empty group");
            items
                .iter()
                .enumerate()
                .map(|(i, item)| parse_node(item, &format!("{path}[{i}]")))
                .collect::<Result<Vec<_>>>()
                .map(Node::Group)
        }
        Value::Mapping(map) => {
            ensure!(!map.is_empty(), "class hierarchy: at {path}: empty group");
            map.iter()
                .map(|(key, item)| {
                    let name = match key {
                        Value::String(s) => s.clone(),
                        Value::Number(num) => num.to_string(),
                        other => bail!(
                            "class hierarchy: at {path}: group names must be strings, found {}",
                            kind_of(other)
                        ),
                    };
                    parse_node(item, &format!("{path}.{name}"))
                })
                .collect::<Result<Vec<_>>>()
                .map(Node::Group)
        }
        other => bail!(
            "class hierarchy: at {path}: expected a class id (non-negative integer), a list of \
             nodes or a mapping of named groups, found {}",
            kind_of(other)
        ),
    }
}

/// Pre-order walk: every class with the node ids of its ancestors at depths `1..=depth` (the
/// last one is the class's own node).
fn walk(
    node: &Node,
    chain: &mut Vec<usize>,
    next_id: &mut usize,
    out: &mut Vec<(u32, Vec<usize>)>,
) {
    match node {
        Node::Class(c) => {
            chain.push(*next_id);
            *next_id += 1;
            out.push((*c, chain.clone()));
            chain.pop();
        }
        Node::Group(children) => {
            for child in children {
                if let Node::Group(_) = child {
                    chain.push(*next_id);
                    *next_id += 1;
                    walk(child, chain, next_id, out);
                    chain.pop();
                } else {
                    walk(child, chain, next_id, out);
                }
            }
        }
    }
}

impl ClassHierarchy {
    /// Parses a hierarchy from YAML or JSON text.
    pub fn parse(text: &str) -> Result<Self> {
        let value: Value =
            serde_yaml::from_str(text).context("class hierarchy: not valid YAML or JSON")?;
        let root = parse_node(&value, "root")?;
        ensure!(
            matches!(root, Node::Group(_)),
            "class hierarchy: the root must be a list or a mapping of groups, not a single class id"
        );
        let mut leaves = Vec::new();
        walk(&root, &mut Vec::new(), &mut 0, &mut leaves);
        let mut position = HashMap::new();
        for (i, (c, _)) in leaves.iter().enumerate() {
            if let Some(first) = position.insert(*c, i) {
                bail!(
                    "class hierarchy: class id {c} appears more than once (as leaf {} and leaf {i} \
                     in document order); every class must occur exactly once",
                    first
                );
            }
        }
        let levels = leaves
            .iter()
            .map(|(_, chain)| chain.len())
            .max()
            .unwrap_or(0);
        let mut groups = Vec::with_capacity(levels);
        let mut counts = Vec::with_capacity(levels);
        for level in 1..=levels {
            let mut dense: HashMap<usize, u32> = HashMap::new();
            let ids: Vec<u32> = leaves
                .iter()
                .map(|(_, chain)| {
                    let node = chain[level.min(chain.len()) - 1];
                    let next = dense.len() as u32;
                    *dense.entry(node).or_insert(next)
                })
                .collect();
            counts.push(dense.len());
            groups.push(ids);
        }
        Ok(Self {
            classes: leaves.into_iter().map(|(c, _)| c).collect(),
            groups,
            counts,
            position,
        })
    }

    /// Reads and parses a hierarchy file (YAML or JSON).
    pub fn load(path: &Path) -> Result<Self> {
        use std::io::Read;
        let file = std::fs::File::open(path)
            .with_context(|| format!("cannot read class-hierarchy file {}", path.display()))?;
        let mut text = String::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("cannot read class-hierarchy file {}", path.display()))?;
        ensure!(
            text.len() as u64 <= MAX_FILE_BYTES,
            "class-hierarchy file {} is larger than {} MiB; a hierarchy is a few KiB of YAML",
            path.display(),
            MAX_FILE_BYTES >> 20
        );
        Self::parse(&text).with_context(|| format!("in class-hierarchy file {}", path.display()))
    }

    /// Number of levels (level 1 = coarsest, the last level = single classes).
    pub fn num_levels(&self) -> usize {
        self.groups.len()
    }

    /// Class ids in document order.
    pub fn classes(&self) -> &[u32] {
        &self.classes
    }

    fn check_level(&self, level: usize) -> Result<()> {
        ensure!(
            (1..=self.num_levels()).contains(&level),
            "class hierarchy: level {level} does not exist; levels are 1..={}",
            self.num_levels()
        );
        Ok(())
    }

    /// Number of groups at `level` (1-based).
    pub fn num_groups(&self, level: usize) -> Result<usize> {
        self.check_level(level)?;
        Ok(self.counts[level - 1])
    }

    /// Group id at `level` (1-based) of every label in `labels`.
    pub fn level_labels(&self, level: usize, labels: &[u32]) -> Result<Vec<u32>> {
        self.check_level(level)?;
        let groups = &self.groups[level - 1];
        labels
            .iter()
            .map(|c| match self.position.get(c) {
                Some(&i) => Ok(groups[i]),
                None => bail!(
                    "class hierarchy: label {c} is not a class of the hierarchy ({} classes); \
                     use the hierarchy file of this dataset",
                    self.classes.len()
                ),
            })
            .collect()
    }
}

/// Rand index of one hierarchy level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelRandIndex {
    /// Level (1 = coarsest).
    pub level: usize,
    /// Number of clusters = distinct level labels among the samples.
    pub clusters: usize,
    /// Unadjusted Rand index of the spectral clustering against the level labels.
    pub rand_index: f64,
}

/// Hierarchical Rand index (spec §11): for every level of `hierarchy`, spectral clustering of
/// `features` (`[n, d]`; default settings, one shared eigen-decomposition, k-means `seed`) into as
/// many clusters as distinct level labels among `labels` (the fine class ids of the samples), and
/// the unadjusted Rand index against those level labels.
pub fn hierarchical_rand_index(
    features: &Features,
    hierarchy: &ClassHierarchy,
    labels: &[u32],
    seed: u64,
) -> Result<Vec<LevelRandIndex>> {
    ensure!(
        labels.len() == features.n,
        "hierarchical Rand index: {} labels for {} samples",
        labels.len(),
        features.n
    );
    let per_level: Vec<Vec<u32>> = (1..=hierarchy.num_levels())
        .map(|level| hierarchy.level_labels(level, labels))
        .collect::<Result<_>>()?;
    let clusters: Vec<usize> = per_level
        .iter()
        .map(|truth| {
            let mut distinct = truth.clone();
            distinct.sort_unstable();
            distinct.dedup();
            distinct.len()
        })
        .collect();
    let most = clusters.iter().copied().max().unwrap_or(1);
    let embedding = SpectralEmbedding::new(features, DEFAULT_SPECTRAL_NEIGHBORS, most)?;
    per_level
        .iter()
        .zip(&clusters)
        .enumerate()
        .map(|(l, (truth, &clusters))| {
            let predicted = embedding.cluster(clusters, DEFAULT_RESTARTS, seed)?;
            Ok(LevelRandIndex {
                level: l + 1,
                clusters,
                rand_index: rand_index(truth, &predicted)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
