//! Data-parallel loops on Candle's own CPU workers.
//!
//! Candle runs its CPU ops on a pool of worker threads that spin for a while after each op
//! before they sleep. A kernel of ours that ran on rayon's separate pool right after a Candle
//! op would put rayon's threads beside a spinning worker, two threads to a core; run on
//! Candle's pool instead, the spinning worker takes its share of the work at once.

use std::mem::MaybeUninit;

use crate::bf16_gemm::{gemm_in, Precision};
use candle_core::utils::{barrier_pool, in_barrier_pool};
use candle_core::{
    bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Storage, Tensor, WithDType,
};

/// A pointer that may cross threads: each task writes a disjoint part of the buffer.
struct Shared<T>(*mut T);
unsafe impl<T: Send> Sync for Shared<T> {}

/// `f(&mut scratch, index, chunk)` for every `chunk`-element chunk of `out` (the last may be
/// shorter), the chunks spread over Candle's CPU workers; `init` makes each task's scratch.
/// `f` must not run Candle ops: the calling thread takes part as a worker while it holds the
/// pool, and a Candle op there would wait for the pool forever.
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

/// `f(&mut scratch, index)` for every `index` in `0..count`, spread over Candle's CPU workers in
/// contiguous ranges; `init` makes each task's scratch. As for [`for_each_chunk_mut`], `f` must
/// not run Candle ops, and whatever it writes through shared pointers must be disjoint per
/// index.
pub fn for_each_index<S>(
    count: usize,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, usize) + Sync,
) {
    barrier_pool().execute_chunked(count, |range| {
        let mut scratch = init();
        for index in range {
            f(&mut scratch, index);
        }
    });
}

/// [`for_each_chunk_mut`] whose `f(index, chunk)` also returns a value per chunk: the values in
/// chunk order.
pub fn map_chunks_mut<T, R>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync,
) -> Vec<R>
where
    T: Send,
    R: Send + Default,
{
    let mut results: Vec<R> = (0..out.len().div_ceil(chunk.max(1)))
        .map(|_| R::default())
        .collect();
    let shared = Shared(results.as_mut_ptr());
    for_each_chunk_mut(
        out,
        chunk,
        || (),
        |_, index, part| {
            let shared = &shared;
            let value = f(index, part);
            // SAFETY: `results` has one slot per chunk and each index is visited exactly once.
            unsafe { *shared.0.add(index) = value };
        },
    );
    results
}

/// Appends `len` values to `out`, written chunk by chunk by `f(index, chunk)` as in
/// [`map_chunks_mut`], without filling them with zeros first: for an op's output that its kernel
/// overwrites, the fill is a pass over memory that only delays the kernel's own (`vec![0; n]`
/// is a `calloc`, which on reused heap memory is a `memset`). Returns `f`'s values in chunk
/// order. Should `f` panic, `out` keeps its old length.
///
/// # Safety
/// `f` writes every element of the chunk it is given.
pub unsafe fn extend_by_chunks<T, R>(
    out: &mut Vec<T>,
    len: usize,
    chunk: usize,
    f: impl Fn(usize, &mut [MaybeUninit<T>]) -> R + Sync,
) -> Vec<R>
where
    T: Send,
    R: Send + Default,
{
    out.reserve_exact(len);
    let start = out.len();
    let results = map_chunks_mut(&mut out.spare_capacity_mut()[..len], chunk, f);
    // SAFETY: the chunks cover `start..start + len`, and the caller's `f` wrote each of them.
    unsafe { out.set_len(start + len) };
    results
}

/// `dst = A B` in f32 or f64 for row-major `a`: `[m, k]`, `b`: `[k, n]` read through its
/// element strides (`(n, 1)` row-major, `(1, k)` for the transpose of a row-major `[n, k]`), and
/// row-major `dst`: `[m, n]`: [`matmul_strided`] with a row-major `A`, overwriting `dst`.
pub fn matmul_rows<T: WithDType>(
    a: &[T],
    b: &[T],
    b_strides: (usize, usize),
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
) -> Result<()> {
    matmul_strided(
        Precision::F32,
        (a, (k, 1)),
        (b, b_strides),
        (m, n, k),
        dst,
        false,
    )
}

/// The element count a `[rows, cols]` matrix at `(row_stride, col_stride)` spans.
fn span(rows: usize, cols: usize, (row_stride, col_stride): (usize, usize)) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * row_stride + (cols - 1) * col_stride + 1
    }
}

/// Blocks of `dst` per worker in [`matmul_strided`]: enough for the workers to even out a
/// slow one, few enough that the operand every block packs again (a linear layer's weight) is
/// not packed many times over (ViT-S's linear layers, 2 threads: 2 measured 0.92–0.97 of 4 in
/// isolation, and 0.96 of it over the whole training step).
const BLOCKS_PER_WORKER: usize = 2;

/// How many parts the depth `k` of an `[m, k] × [k, n]` product is split into: two where the
/// depth is at least twice the product's longer side (a weight gradient `Gᵀ X` over the rows of
/// a batch), else one. A function of the shape alone, so the order of the sums, and the result,
/// do not depend on the thread count. More parts measured slower on 2 cores (each adds an
/// `[m, n]` partial to write and add) and remove no more packing.
fn depth_parts(m: usize, n: usize, k: usize) -> usize {
    if k >= 2 * m.max(n) {
        2
    } else {
        1
    }
}

/// `dst = A B`, or `dst += A B` where `accumulate`, in f32 or f64 for `a`: `[m, k]` and `b`:
/// `[k, n]` each read through its element strides `(row, column)` and row-major `dst`: `[m, n]`.
/// Each task is one single-threaded GEMM (`gemm` crate, as Candle's own matmul) on Candle's CPU
/// workers, so a GEMM after a Candle op does not share the cores with Candle's spinning workers
/// as a rayon-parallel one does.
///
/// The tasks are blocks of `dst`'s rows (or of its columns, when it is wider than tall),
/// `BLOCKS_PER_WORKER` a worker. Each block's GEMM packs its own copy of the operand all
/// blocks share, which for a deep product (`Gᵀ X` over the rows of a batch, `k` ≫ `m`, `n`) is
/// most of its work beyond the multiply-adds. Such a product is instead split along its depth
/// (`depth_parts`): each part multiplies its own rows of both operands into a partial
/// `[m, n]`, nothing is packed twice, and the partials are added in part order.
///
/// Under [`Precision::Bf16`] f32 operands are multiplied as
/// [`gemm_bf16`](crate::bf16_gemm::gemm_bf16) multiplies them.
pub fn matmul_strided<T: WithDType>(
    precision: Precision,
    a: (&[T], (usize, usize)),
    b: (&[T], (usize, usize)),
    dims: (usize, usize, usize),
    dst: &mut [T],
    accumulate: bool,
) -> Result<()> {
    // SAFETY: `dst` is initialised, and it is checked to hold the product's `m · n` values.
    unsafe {
        matmul_raw(
            precision,
            a,
            b,
            dims,
            (dst.as_mut_ptr(), dst.len()),
            accumulate,
        )
    }
}

/// [`matmul_strided`]'s `dst = A B` into uninitialised memory (a fresh gradient buffer), every
/// value written: the `gemm` crate reads no output it is told not to accumulate into.
pub fn matmul_strided_uninit<T: WithDType>(
    precision: Precision,
    a: (&[T], (usize, usize)),
    b: (&[T], (usize, usize)),
    dims: (usize, usize, usize),
    dst: &mut [MaybeUninit<T>],
) -> Result<()> {
    // SAFETY: `dst` is checked to hold the product's `m · n` values, each written before any
    // is read (the depth split adds its partials into values its first part wrote).
    unsafe {
        matmul_raw(
            precision,
            a,
            b,
            dims,
            (dst.as_mut_ptr().cast(), dst.len()),
            false,
        )
    }
}

/// [`matmul_strided`] for `dst`: `(pointer, length)`.
///
/// # Safety
/// `dst` is valid for writes of `length` values, and for reads too where `accumulate`.
unsafe fn matmul_raw<T: WithDType>(
    precision: Precision,
    (a, a_strides): (&[T], (usize, usize)),
    (b, b_strides): (&[T], (usize, usize)),
    (m, n, k): (usize, usize, usize),
    (dst, dst_len): (*mut T, usize),
    accumulate: bool,
) -> Result<()> {
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        bail!("matmul supports f32 and f64, got {:?}", T::DTYPE);
    }
    let (a_end, b_end) = (span(m, k, a_strides), span(k, n, b_strides));
    if a.len() < a_end || b.len() < b_end || dst_len != m * n {
        bail!(
            "matmul: [{m}, {k}] × [{k}, {n}] needs {a_end} + {b_end} inputs and {} outputs, got {}, {} and {dst_len}",
            m * n,
            a.len(),
            b.len(),
        );
    }
    if n == 0 || m == 0 {
        return Ok(());
    }
    // Inside a share of a pool call (one view's backward on a worker) the product runs on this
    // thread alone, as one block.
    let threads = match in_barrier_pool() {
        true => 1,
        false => barrier_pool().n_workers() + 1,
    };
    let parts = depth_parts(m, n, k);
    // Split the longer side of `dst` into blocks: row blocks repack B, column blocks repack A,
    // so a wide product (a convolution's [O, N·H·W]) is cut by columns.
    let by_rows = m >= n;
    let len = if by_rows { m } else { n };
    let wanted = match parts {
        1 if threads == 1 => 1,
        1 => BLOCKS_PER_WORKER * threads,
        _ => threads.div_ceil(parts),
    };
    let size = len.div_ceil(wanted.min(len.div_ceil(8)).max(1));
    let blocks = len.div_ceil(size);
    // The partial products of parts 1.. (part 0 goes to `dst`), each written whole by its
    // part's GEMMs before the sum reads it, so never zeroed.
    let partials_len = (parts - 1) * m * n;
    let mut partials: Vec<T> = Vec::with_capacity(partials_len);
    let dst_ptr = Shared(dst);
    let partials_ptr = Shared(partials.as_mut_ptr());
    barrier_pool().execute_chunked(parts * blocks, |range| {
        let (dst_ptr, partials_ptr) = (&dst_ptr, &partials_ptr);
        for task in range {
            let (part, block) = (task / blocks, task % blocks);
            let (depth_start, depth_end) = (k * part / parts, k * (part + 1) / parts);
            let start = block * size;
            let count = size.min(len - start);
            let (rows, cols) = if by_rows { (count, n) } else { (m, count) };
            let (a_offset, b_offset, dst_offset) = match by_rows {
                true => (start * a_strides.0, 0, start * n),
                false => (0, start * b_strides.1, start),
            };
            let a_offset = a_offset + depth_start * a_strides.1;
            let b_offset = b_offset + depth_start * b_strides.0;
            let out = match part {
                0 => dst_ptr.0,
                // SAFETY: `partials` holds `parts - 1` outputs of `m · n` values.
                _ => unsafe { partials_ptr.0.add((part - 1) * m * n) },
            };
            // SAFETY: the block's rows or columns of `a`, `b` and `dst` (or its partial) lie in
            // the bounds checked above, and no two tasks write the same entries.
            unsafe {
                gemm_in(
                    precision,
                    (rows, cols, depth_end - depth_start),
                    (out.add(dst_offset), n, 1),
                    (a.as_ptr().add(a_offset), a_strides.0, a_strides.1),
                    (b.as_ptr().add(b_offset), b_strides.0, b_strides.1),
                    accumulate && part == 0,
                )
            }
        }
    });
    // SAFETY: the blocks of each part > 0 wrote every value of its partial (see above).
    unsafe { partials.set_len(partials_len) };
    if parts > 1 {
        const SUM_CHUNK: usize = 1 << 14;
        // SAFETY: part 0 wrote every value of `dst`, which the caller lends for `m · n` values.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst, dst_len) };
        for_each_chunk_mut(
            dst,
            SUM_CHUNK,
            || (),
            |_, index, chunk| {
                let start = index * SUM_CHUNK;
                for partial in partials.chunks_exact(m * n) {
                    let partial = &partial[start..start + chunk.len()];
                    for (d, &p) in chunk.iter_mut().zip(partial) {
                        *d += p;
                    }
                }
            },
        );
    }
    Ok(())
}

/// `X Xᵀ` of each row-major `[r, k]` block of `x` (`batch` of them): `[batch, r, r]` values.
pub fn gram_blocks<T: WithDType>(x: &[T], batch: usize, r: usize, k: usize) -> Result<Vec<T>> {
    let mut out = vec![T::zero(); batch * r * r];
    for (x, out) in x.chunks_exact(r * k).zip(out.chunks_exact_mut(r * r)) {
        matmul_rows(x, x, (1, k), (r, r, k), out)?;
    }
    Ok(out)
}

/// `A B` of CPU tensors `a`: `[…, m, k]` and `b`: `[…, k, n]` (same leading dims) with
/// [`matmul_rows`], outside autograd (for backward passes); other devices and dtypes use
/// Candle's matmul.
pub fn matmul_detached(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let cpu = a.device().is_cpu() && b.device().is_cpu();
    if !cpu || a.dtype() != b.dtype() || !matches!(a.dtype(), DType::F32 | DType::F64) {
        return Ok(a.matmul(b)?.detach());
    }
    let (rank, dims) = (a.rank(), a.dims());
    let (m, k, n) = (dims[rank - 2], dims[rank - 1], b.dim(rank - 1)?);
    let mut shape = dims[..rank - 1].to_vec();
    shape.push(n);
    if rank < 2
        || b.rank() != rank
        || b.dims()[..rank - 2] != dims[..rank - 2]
        || b.dim(rank - 2)? != k
    {
        bail!(
            "matmul_detached: shapes {:?} and {:?} do not multiply",
            a.dims(),
            b.dims()
        );
    }
    let batch = a.elem_count() / (m * k).max(1);
    let (a, b) = (a.contiguous()?, b.contiguous()?);
    fn run<T: WithDType>(
        a: &Tensor,
        b: &Tensor,
        batch: usize,
        (m, n, k): (usize, usize, usize),
    ) -> Result<Vec<T>> {
        let (a_storage, a_layout) = a.storage_and_layout();
        let (b_storage, b_layout) = b.storage_and_layout();
        let (Storage::Cpu(a_cpu), Storage::Cpu(b_cpu)) = (&*a_storage, &*b_storage) else {
            bail!("matmul_detached: the operands left the CPU");
        };
        let a = &a_cpu.as_slice::<T>()?[a_layout.start_offset()..][..batch * m * k];
        let b = &b_cpu.as_slice::<T>()?[b_layout.start_offset()..][..batch * k * n];
        let mut out = vec![T::zero(); batch * m * n];
        for ((a, b), out) in a
            .chunks_exact(m * k)
            .zip(b.chunks_exact(k * n))
            .zip(out.chunks_exact_mut(m * n))
        {
            matmul_rows(a, b, (n, 1), (m, n, k), out)?;
        }
        Ok(out)
    }
    match a.dtype() {
        DType::F32 => Tensor::from_vec(run::<f32>(&a, &b, batch, (m, n, k))?, shape, a.device()),
        _ => Tensor::from_vec(run::<f64>(&a, &b, batch, (m, n, k))?, shape, a.device()),
    }
}

/// `A B` of matrices `a`: `[m, k]` and `b`: `[k, n]` with autograd, its three GEMMs (forward
/// and the two gradients) as [`matmul_rows`] on Candle's CPU workers; other devices and dtypes
/// use Candle's matmul. `b` is read through its strides (a transposed view costs no copy).
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    matmul_in(Precision::F32, a, b)
}

/// [`matmul`] with its three products in `precision`: under [`Precision::Bf16`] f32 operands
/// are rounded to bf16 as the products pack them ([`gemm_bf16`](crate::bf16_gemm::gemm_bf16)),
/// gradients included, and other dtypes and devices multiply as [`matmul`] does.
pub fn matmul_in(precision: Precision, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (_, k) = a.dims2()?;
    let (kb, _) = b.dims2()?;
    let cpu = a.device().is_cpu() && b.device().is_cpu();
    if k != kb || !cpu || a.dtype() != b.dtype() || !matches!(a.dtype(), DType::F32 | DType::F64) {
        return a.matmul(b);
    }
    a.contiguous()?.apply_op2(b, Matmul(precision))
}

/// Row-major `A` and strided `B` of [`matmul_in`], in its precision.
struct Matmul(Precision);

impl CustomOp2 for Matmul {
    fn name(&self) -> &'static str {
        "ssl-matmul"
    }

    fn cpu_fwd(
        &self,
        a: &CpuStorage,
        a_layout: &Layout,
        b: &CpuStorage,
        b_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (m, k) = a_layout.shape().dims2()?;
        let (_, n) = b_layout.shape().dims2()?;
        let (b_rs, b_cs) = (b_layout.stride()[0], b_layout.stride()[1]);
        fn run<T: WithDType>(
            precision: Precision,
            a: &[T],
            b: &[T],
            strides: (usize, usize),
            dims: (usize, usize, usize),
        ) -> Result<Vec<T>> {
            let mut out = vec![T::zero(); dims.0 * dims.1];
            let k = dims.2;
            matmul_strided(precision, (a, (k, 1)), (b, strides), dims, &mut out, false)?;
            Ok(out)
        }
        let precision = self.0;
        let (a0, b0) = (a_layout.start_offset(), b_layout.start_offset());
        let out = match (a, b) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => {
                CpuStorage::F32(run(precision, &a[a0..], &b[b0..], (b_rs, b_cs), (m, n, k))?)
            }
            (CpuStorage::F64(a), CpuStorage::F64(b)) => {
                CpuStorage::F64(run(precision, &a[a0..], &b[b0..], (b_rs, b_cs), (m, n, k))?)
            }
            _ => bail!("ssl-matmul supports f32 and f64 operands of one dtype"),
        };
        Ok((out, Shape::from((m, n))))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // ∂A = G Bᵀ (Bᵀ a strided view), ∂B = Aᵀ G (Aᵀ copied: the row-major operand), each only
        // for an operand that takes part in autograd (not for ViT's image patches, say).
        let grad = grad.contiguous()?;
        let grad_a = match a.track_op() {
            true => Some(matmul_in(self.0, &grad, &b.t()?)?.detach()),
            false => None,
        };
        let grad_b = match b.track_op() {
            true => Some(matmul_in(self.0, &a.t()?.contiguous()?, &grad)?.detach()),
            false => None,
        };
        Ok((grad_a, grad_b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ssl_core::testing::randn;

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

    #[test]
    fn extend_by_chunks_appends_every_chunk_after_the_old_values() {
        for (len, chunk) in [(0, 3), (1, 3), (10, 3), (1000, 7)] {
            let mut out = vec![-1i64, -2];
            // SAFETY: the closure writes every element of its chunk.
            let firsts = unsafe {
                extend_by_chunks(&mut out, len, chunk, |index, part| {
                    for (offset, v) in part.iter_mut().enumerate() {
                        v.write((index * chunk + offset) as i64);
                    }
                    index * chunk
                })
            };
            let expected: Vec<i64> = [-1, -2].into_iter().chain(0..len as i64).collect();
            assert_eq!(out, expected, "len {len}, chunk {chunk}");
            let starts: Vec<usize> = (0..len.div_ceil(chunk)).map(|i| i * chunk).collect();
            assert_eq!(firsts, starts);
        }
    }

    #[test]
    fn map_chunks_returns_one_value_per_chunk_in_order() {
        let mut out = vec![1u64; 103];
        let sums = map_chunks_mut(&mut out, 10, |index, part| {
            part.iter_mut().for_each(|v| *v += index as u64);
            part.iter().sum::<u64>()
        });
        let expected: Vec<u64> = (0..11u64)
            .map(|i| (i + 1) * if i < 10 { 10 } else { 3 })
            .collect();
        assert_eq!(sums, expected);
    }

    #[test]
    fn matmul_op_matches_candle_in_value_and_gradients() -> Result<()> {
        use candle_core::{Device, Var};
        for transposed in [false, true] {
            let a = Var::from_tensor(&randn(0f64, 1., (7, 5), &Device::Cpu)?)?;
            let b = match transposed {
                false => Var::from_tensor(&randn(0f64, 1., (5, 9), &Device::Cpu)?)?,
                true => Var::from_tensor(&randn(0f64, 1., (9, 5), &Device::Cpu)?)?,
            };
            let b_view = |b: &Tensor| if transposed { b.t() } else { Ok(b.clone()) };
            let w = randn(0f64, 1., (7, 9), &Device::Cpu)?;
            let ours = matmul(a.as_tensor(), &b_view(b.as_tensor())?)?;
            let reference = a.as_tensor().matmul(&b_view(b.as_tensor())?)?;
            let diff = |x: &Tensor, y: &Tensor| -> Result<f64> {
                (x - y)?.abs()?.max_all()?.to_scalar::<f64>()
            };
            assert!(diff(&ours, &reference)? < 1e-12);
            let g_ours = (ours * &w)?.sum_all()?.backward()?;
            let g_ref = (reference * &w)?.sum_all()?.backward()?;
            for v in [&a, &b] {
                let (x, y) = (g_ours.get(v).unwrap(), g_ref.get(v).unwrap());
                assert!(diff(x, y)? < 1e-12, "transposed {transposed}");
            }
            // A constant factor (ViT's image patches) gets no gradient; the other the same one.
            let constant = a.as_tensor().detach();
            let ours = matmul(&constant, &b_view(b.as_tensor())?)?;
            let g_const = (ours * &w)?.sum_all()?.backward()?;
            assert!(g_const.get(&constant).is_none());
            assert!(diff(g_const.get(&b).unwrap(), g_ref.get(&b).unwrap())? < 1e-12);
        }
        Ok(())
    }

    /// Products at least twice as deep as their longer side take the depth-split path: the
    /// same values (f64, to rounding) for row and column blocks, an odd depth, a transposed
    /// factor, and `dst +=` as well as `dst =`; the split depends on the shape alone.
    #[test]
    fn deep_products_split_in_depth_match_the_plain_product() -> Result<()> {
        use candle_core::Device;
        assert_eq!(depth_parts(4, 9, 17), 1);
        assert_eq!(
            (depth_parts(4, 9, 18), depth_parts(1536, 384, 3152)),
            (2, 2)
        );
        for (m, n, k) in [(9, 4, 31), (4, 9, 37), (1, 1, 2), (24, 40, 1001)] {
            assert_eq!(depth_parts(m, n, k), 2);
            let a = randn(0f64, 1., (m, k), &Device::Cpu)?;
            let b = randn(0f64, 1., (k, n), &Device::Cpu)?;
            let c = randn(0f64, 1., (m, n), &Device::Cpu)?;
            let expected = a.matmul(&b)?.flatten_all()?.to_vec1::<f64>()?;
            let c_host = c.flatten_all()?.to_vec1::<f64>()?;
            let a_host = a.flatten_all()?.to_vec1::<f64>()?;
            let bt_host = b.t()?.contiguous()?.flatten_all()?.to_vec1::<f64>()?;
            // `dst =` over NaN (every value must be written), and `dst +=` over `c`.
            for (accumulate, start) in [(false, vec![f64::NAN; m * n]), (true, c_host.clone())] {
                let mut out = start;
                matmul_strided(
                    Precision::F32,
                    (&a_host, (k, 1)),
                    (&bt_host, (1, k)),
                    (m, n, k),
                    &mut out,
                    accumulate,
                )?;
                for i in 0..m * n {
                    let base = if accumulate { c_host[i] } else { 0.0 };
                    assert!(
                        (out[i] - base - expected[i]).abs() < 1e-12 * k as f64,
                        "{m}×{n}×{k} at {i}, accumulate {accumulate}"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn matmul_rows_matches_candle_matmul_for_plain_and_transposed_factors() -> Result<()> {
        use candle_core::Device;
        for (m, n, k) in [
            (1, 1, 1),
            (5, 3, 7),
            (70, 33, 9),
            (9, 70, 33),
            (128, 128, 64),
            (16, 1000, 27),
        ] {
            let a = randn(0f64, 1., (m, k), &Device::Cpu)?;
            let b = randn(0f64, 1., (k, n), &Device::Cpu)?;
            let expected = a.matmul(&b)?.flatten_all()?.to_vec1::<f64>()?;
            let (a_host, b_host) = (a.flatten_all()?.to_vec1()?, b.flatten_all()?.to_vec1()?);
            let mut out = vec![0f64; m * n];
            matmul_rows(&a_host, &b_host, (n, 1), (m, n, k), &mut out)?;
            let bt_host = b.t()?.contiguous()?.flatten_all()?.to_vec1::<f64>()?;
            let mut out_t = vec![0f64; m * n];
            matmul_rows(&a_host, &bt_host, (1, k), (m, n, k), &mut out_t)?;
            for (got, want) in out.iter().chain(&out_t).zip(expected.iter().cycle()) {
                assert!((got - want).abs() < 1e-12, "{m}×{n}×{k}: {got} vs {want}");
            }
        }
        let a = randn(0f32, 1., (2, 3, 5, 4), &Device::Cpu)?;
        let b = randn(0f32, 1., (2, 3, 4, 6), &Device::Cpu)?;
        let diff = (matmul_detached(&a, &b)? - a.matmul(&b)?)?
            .abs()?
            .max_all()?;
        assert!(diff.to_scalar::<f32>()? < 1e-5);
        let gram = gram_blocks(&a.flatten_all()?.to_vec1::<f32>()?, 6, 5, 4)?;
        let expected = a.matmul(&a.t()?)?.flatten_all()?.to_vec1::<f32>()?;
        assert!(gram
            .iter()
            .zip(&expected)
            .all(|(g, e)| (g - e).abs() < 1e-5));
        let mut out = vec![0f32; 4];
        let err = matmul_rows(&[1f32; 3], &[1f32; 4], (2, 1), (2, 2, 2), &mut out).unwrap_err();
        assert!(err.to_string().contains("needs 4 + 4 inputs"), "{err}");
        Ok(())
    }
}
