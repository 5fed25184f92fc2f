//! Data-parallel loops on Candle's own CPU workers.
//!
//! Candle runs its CPU ops on a pool of worker threads that spin for a while after each op
//! before they sleep. A kernel of ours that ran on rayon's separate pool right after a Candle
//! op would put rayon's threads beside a spinning worker, two threads to a core; run on
//! Candle's pool instead, the spinning worker takes its share of the work at once.

use candle_core::utils::barrier_pool;

/// A pointer that may cross threads: each task writes a disjoint part of the buffer.
struct Shared<T>(*mut T);
unsafe impl<T: Send> Sync for Shared<T> {}

/// `f(&mut scratch, index, chunk)` for every `chunk`-element chunk of `out` (the last may be
/// shorter), the chunks spread over Candle's CPU workers; `init` makes each task's scratch.
pub fn for_each_chunk_mut<T, S>(
    out: &mut [T],
    chunk: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize, &mut [T]) + Sync,
) where
    T: Send,
{
    let (len, chunk) = (out.len(), chunk.max(1));
    let shared = Shared(out.as_mut_ptr());
    barrier_pool().execute_chunked(len.div_ceil(chunk), |range| {
        let shared = &shared;
        let mut scratch = init();
        for index in range {
            let start = index * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: `start..end` lies inside `out`, which outlives this call, and each index
            // is handed to exactly one task, so no two slices alias.
            let part = unsafe { std::slice::from_raw_parts_mut(shared.0.add(start), end - start) };
            f(&mut scratch, index, part);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_visited_once_with_its_index() {
        for (len, chunk) in [(0, 3), (1, 3), (10, 3), (12, 4), (1000, 7)] {
            let mut out = vec![0usize; len];
            for_each_chunk_mut(
                &mut out,
                chunk,
                || 0usize,
                |calls, index, part| {
                    *calls += 1;
                    assert!(*calls >= 1);
                    for (offset, v) in part.iter_mut().enumerate() {
                        *v += index * chunk + offset + 1;
                    }
                },
            );
            let expected: Vec<usize> = (1..=len).collect();
            assert_eq!(out, expected, "len {len}, chunk {chunk}");
        }
    }
}
