//! Deterministic stratified train/test splits.
//!
//! Mirrors scikit-learn's `StratifiedShuffleSplit` allocation: the test set has
//! `ceil(test_fraction * n)` samples, shared among classes proportionally to their size
//! (floor of the exact share, then the leftover samples go to the classes with the largest
//! fractional remainders; ties go to the lower class label, where sklearn breaks them at random).
//! Within each class the members are shuffled with a seeded RNG before the test part is taken.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Splits positions `0..labels.len()` into `(train, test)`, each sorted ascending.
///
/// The two sets are disjoint and together cover every position. Errors if `labels` is empty or
/// `test_fraction` is not strictly between 0 and 1.
pub fn stratified_split(
    labels: &[u32],
    test_fraction: f64,
    seed: u64,
) -> Result<(Vec<usize>, Vec<usize>)> {
    if labels.is_empty() {
        bail!("stratified_split: no labels");
    }
    if !(test_fraction > 0.0 && test_fraction < 1.0) {
        bail!("stratified_split: test_fraction must be in (0, 1), got {test_fraction}");
    }
    let n = labels.len();
    let n_test = ((test_fraction * n as f64).ceil() as usize).min(n);

    let mut classes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, &l) in labels.iter().enumerate() {
        classes.entry(l).or_default().push(i);
    }

    let sizes: Vec<usize> = classes.values().map(Vec::len).collect();
    let alloc = proportional_allocation(&sizes, n_test);

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut train = Vec::with_capacity(n - n_test);
    let mut test = Vec::with_capacity(n_test);
    for (members, &t) in classes.values().zip(&alloc) {
        let mut members = members.clone();
        members.shuffle(&mut rng);
        test.extend_from_slice(&members[..t]);
        train.extend_from_slice(&members[t..]);
    }
    train.sort_unstable();
    test.sort_unstable();
    Ok((train, test))
}

/// Shares `total` units among classes of the given `sizes` proportionally (scikit-learn's
/// `_approximate_mode`): the floor of each exact share, then one more to the classes with the
/// largest fractional remainders (ties to the lower class), never more than a class has.
fn proportional_allocation(sizes: &[usize], total: usize) -> Vec<usize> {
    let n: usize = sizes.iter().sum();
    let exact: Vec<f64> = sizes
        .iter()
        .map(|&m| total as f64 * m as f64 / n as f64)
        .collect();
    let mut alloc: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut left = total - alloc.iter().sum::<usize>();
    let mut order: Vec<usize> = (0..alloc.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - exact[a].floor();
        let rb = exact[b] - exact[b].floor();
        rb.partial_cmp(&ra)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    for &c in order.iter().cycle() {
        if left == 0 {
            break;
        }
        if alloc[c] < sizes[c] {
            alloc[c] += 1;
            left -= 1;
        }
    }
    alloc
}

/// Members of `positions` grouped by their class in `labels`, classes ascending.
fn by_class(labels: &[u32], positions: &[usize]) -> BTreeMap<u32, Vec<usize>> {
    let mut classes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for &p in positions {
        classes.entry(labels[p]).or_default().push(p);
    }
    classes
}

/// A stratified subset of `n` of the `positions` (IConE's `N ∈ {500, 1k, 2k, 5k}` subsets,
/// `docs/spec/data.md` §5.2): class quotas by `proportional_allocation`, members drawn without
/// replacement by a seeded shuffle. Sorted ascending.
pub fn stratified_subset(
    labels: &[u32],
    positions: &[usize],
    n: usize,
    seed: u64,
) -> Result<Vec<usize>> {
    if n == 0 || n > positions.len() {
        bail!(
            "a subset of {n} training instances was asked for, but the training partition has {}; \
             use a size between 1 and {}",
            positions.len(),
            positions.len()
        );
    }
    let classes = by_class(labels, positions);
    let sizes: Vec<usize> = classes.values().map(Vec::len).collect();
    let alloc = proportional_allocation(&sizes, n);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5b5e7);
    let mut subset = Vec::with_capacity(n);
    for (members, &q) in classes.values().zip(&alloc) {
        let mut members = members.clone();
        members.shuffle(&mut rng);
        subset.extend_from_slice(&members[..q]);
    }
    subset.sort_unstable();
    Ok(subset)
}

/// IConE's class-imbalance construction (spec data §5.3): `floor(K/2)` minority classes,
/// chosen by a seeded permutation of the class ids, each keep `ceil(n_k / factor)` of their
/// members (seeded, without replacement); the other classes keep all. Returns the kept positions
/// (sorted) and the minority classes (sorted).
pub fn imbalanced_subset(
    labels: &[u32],
    positions: &[usize],
    factor: usize,
    seed: u64,
) -> Result<(Vec<usize>, Vec<u32>)> {
    if factor == 0 {
        bail!("the imbalance factor must be at least 1 (1 keeps every class whole)");
    }
    let classes = by_class(labels, positions);
    let mut ids: Vec<u32> = classes.keys().copied().collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1a4ba1);
    ids.shuffle(&mut rng);
    let mut minority: Vec<u32> = match factor {
        1 => Vec::new(),
        _ => ids[..ids.len() / 2].to_vec(),
    };
    minority.sort_unstable();
    let mut kept = Vec::with_capacity(positions.len());
    for (class, members) in &classes {
        if minority.contains(class) {
            let mut members = members.clone();
            members.shuffle(&mut rng);
            kept.extend_from_slice(&members[..members.len().div_ceil(factor)]);
        } else {
            kept.extend_from_slice(members);
        }
    }
    kept.sort_unstable();
    Ok((kept, minority))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_keep_class_proportions_and_stay_inside_the_partition() {
        let l = labels();
        let (train, _) = stratified_split(&l, 0.2, 0).unwrap();
        let subset = stratified_subset(&l, &train, 8, 1).unwrap();
        assert_eq!(subset.len(), 8);
        assert!(subset.iter().all(|p| train.contains(p)));
        let count = |c: u32| subset.iter().filter(|&&p| l[p] == c).count();
        let whole = |c: u32| train.iter().filter(|&&p| l[p] == c).count();
        for c in 0..4 {
            let exact = 8.0 * whole(c) as f64 / train.len() as f64;
            assert!(
                (count(c) as f64 - exact).abs() < 1.0,
                "class {c}: {} vs {exact}",
                count(c)
            );
        }
        assert_eq!(stratified_subset(&l, &train, 8, 1).unwrap(), subset);
        let err = stratified_subset(&l, &train, 100, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("training partition has"), "{err}");
    }

    #[test]
    fn imbalance_divides_half_of_the_classes() {
        // 4 classes of 10: two minority classes keep ceil(10/3) = 4 each.
        let l: Vec<u32> = (0..40).map(|i| i % 4).collect();
        let all: Vec<usize> = (0..40).collect();
        let (kept, minority) = imbalanced_subset(&l, &all, 3, 0).unwrap();
        assert_eq!(minority.len(), 2);
        for c in 0..4u32 {
            let n = kept.iter().filter(|&&p| l[p] == c).count();
            assert_eq!(n, if minority.contains(&c) { 4 } else { 10 }, "class {c}");
        }
        assert_eq!(
            imbalanced_subset(&l, &all, 1, 0).unwrap(),
            (all.clone(), vec![])
        );
        assert!(imbalanced_subset(&l, &all, 0, 0).is_err());
    }

    fn labels() -> Vec<u32> {
        // class sizes 10, 7, 3, 1
        let mut l = vec![0; 10];
        l.extend([1; 7]);
        l.extend([2; 3]);
        l.push(3);
        l.reverse();
        l
    }

    #[test]
    fn disjoint_covering_and_deterministic() {
        let l = labels();
        let (tr, te) = stratified_split(&l, 0.3, 5).unwrap();
        let mut all: Vec<usize> = tr.iter().chain(&te).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..l.len()).collect::<Vec<_>>());
        assert_eq!(te.len(), (0.3f64 * 21.0).ceil() as usize);
        assert_eq!(
            stratified_split(&l, 0.3, 5).unwrap(),
            (tr.clone(), te.clone())
        );
        let other = stratified_split(&l, 0.3, 6).unwrap();
        assert_ne!(other.1, te);
    }

    #[test]
    fn proportional_per_class() {
        let mut l = Vec::new();
        for (c, n) in [(0u32, 350usize), (1, 350), (2, 350), (3, 350), (4, 350)] {
            l.extend(std::iter::repeat_n(c, n));
        }
        let (tr, te) = stratified_split(&l, 0.3, 0).unwrap();
        assert_eq!(te.len(), 525);
        assert_eq!(tr.len(), 1225);
        for c in 0..5u32 {
            assert_eq!(te.iter().filter(|&&i| l[i] == c).count(), 105);
        }
    }

    #[test]
    fn digits_like_rounding() {
        let d = crate::digits(8).unwrap();
        let (tr, te) = stratified_split(&d.labels, 0.25, 0).unwrap();
        assert_eq!(te.len(), 450); // ceil(0.25 * 1797)
        assert_eq!(tr.len(), 1347);
        let counts = d.class_counts();
        for (c, &count) in counts.iter().enumerate() {
            let t = te.iter().filter(|&&i| d.labels[i] == c as u32).count();
            let exact = 450.0 * count as f64 / 1797.0;
            assert!((t as f64 - exact).abs() < 1.0, "class {c}: {t} vs {exact}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        assert!(stratified_split(&[], 0.3, 0).is_err());
        assert!(stratified_split(&[0, 1], 0.0, 0).is_err());
        assert!(stratified_split(&[0, 1], 1.0, 0).is_err());
        assert!(stratified_split(&[0, 1], f64::NAN, 0).is_err());
    }
}
