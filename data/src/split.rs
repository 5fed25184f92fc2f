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

    // Proportional allocation of the test count (sklearn's `_approximate_mode`).
    let exact: Vec<f64> = classes
        .values()
        .map(|m| n_test as f64 * m.len() as f64 / n as f64)
        .collect();
    let mut alloc: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut left = n_test - alloc.iter().sum::<usize>();
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
        let size = classes.values().nth(c).map_or(0, Vec::len);
        if alloc[c] < size {
            alloc[c] += 1;
            left -= 1;
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

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
