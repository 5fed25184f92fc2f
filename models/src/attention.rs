//! Multi-head scaled dot-product attention, Vaswani et al., "Attention Is All You Need",
//! NeurIPS 2017 (Eq. 1: `softmax(Q Kᵀ / √d) V` per head), as one CPU op on the packed `qkv`
//! projection of timm's ViT.
//!
//! Composed of Candle ops, attention copies `q`, `k` and `v` out of the packed projection,
//! runs batched matmuls of `[T, T]` scores through Candle's rayon GEMM (192 small products per
//! ViT-S block at 32 images), softmaxes, and transposes the heads back, and its autograd stores
//! the scores and the weights, `[N·H, T, T]` each. [`multi_head_attention`] reads every head
//! straight from `qkv`: `[N, T, 3·D]` through strides, computes each `(image, head)` pair on
//! one of Candle's workers with its scores in a `[T, T]` scratch, and writes `[N, T, D]`
//! directly. Where `qkv` takes part in autograd, the forward keeps the weights `P` of every pair
//! (`[N·H, T, T]`, 15 MB a layer for ViT-S at 16 images) for the backward, as PyTorch's
//! composed attention does; recomputing them there instead (as FlashAttention does: Dao et al.,
//! NeurIPS 2022, Alg. 2) was a fifth of the backward's products and half of all the exponentials.
//! The backward writes the gradient of `qkv` in `qkv`'s own layout:
//!
//! `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP − rowsum(P ⊙ dP))`, `dQ = dS K / √d`,
//! `dK = dSᵀ Q / √d`.
//!
//! Under bf16 autocast every product of the op rounds its operands as its GEMM packs them
//! (`q`, `k`, `P`, `v` and, in the backward, `dO` and `dS`), as autocast's bf16 products do.
//! Other devices and dtypes take the composed path, whose gradients the tests compare with the
//! fused op's; on CUDA (feature `cuda`) its softmax is our kernel
//! ([`softmax_last_dim`]).

use std::sync::Mutex;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use ssl_linalg::bf16_gemm::gemm_in;
use ssl_linalg::for_each_index;

use crate::autocast::{matrix_product, precision, Precision};
use crate::dispatch::{cuda_ops, fused_kernels};
use crate::softmax::{softmax_last_dim, softmax_last_dim_backward};
use crate::util::{contiguous_slice, lane_max, lane_sum, vectorized, Float};

/// Self-attention of the packed projection `qkv`: `[N, T, 3·D]` laid out as `[N, T, 3, H,
/// D/H]` (timm's `qkv` linear layer), giving `[N, T, D]` with the heads concatenated.
pub fn multi_head_attention(qkv: &Tensor, heads: usize) -> Result<Tensor> {
    let (n, t, width) = qkv.dims3()?;
    if heads == 0 || width % (3 * heads) != 0 {
        candle_core::bail!(
            "attention needs a packed q/k/v width divisible by 3 × {heads} heads, got {width}"
        );
    }
    let fused = fused_kernels(qkv.device()) && matches!(qkv.dtype(), DType::F32 | DType::F64);
    let dims = (n, t, width / 3);
    if fused {
        let weights = qkv.track_op().then(Default::default);
        let precision = precision();
        qkv.contiguous()?.apply_op1(Attention {
            heads,
            weights,
            precision,
        })
    } else if cuda_ops(qkv.device()) && qkv.track_op() {
        keeping_weights(qkv, heads, dims)
    } else {
        composed(qkv, heads, dims)
    }
}

/// The same function of Candle ops (and the bf16 operands of autocast).
fn composed(qkv: &Tensor, heads: usize, dims: (usize, usize, usize)) -> Result<Tensor> {
    Ok(composed_with_weights(qkv, heads, dims)?.0)
}

/// [`composed`]'s output `[N, T, D]` and its weights `P`: `[N·H, T, T]`.
fn composed_with_weights(
    qkv: &Tensor,
    heads: usize,
    dims: (usize, usize, usize),
) -> Result<(Tensor, Tensor)> {
    let (per_head, weights) = per_head_with_weights(qkv, heads, dims)?;
    Ok((merge_heads(&per_head, dims)?.reshape(dims)?, weights))
}

/// [`composed`]'s heads before their merge, `P V`: `[N·H, T, D/H]`, and `P`.
fn per_head_with_weights(
    qkv: &Tensor,
    heads: usize,
    (n, t, d): (usize, usize, usize),
) -> Result<(Tensor, Tensor)> {
    let hd = d / heads;
    let [q, k, v] = split_heads(qkv, heads, (n, t, d))?;
    let scores = matrix_product(&(q * (hd as f64).powf(-0.5))?, &k.t()?, |a, b| a.matmul(b))?;
    let weights = softmax_last_dim(&scores)?;
    Ok((matrix_product(&weights, &v, |a, b| a.matmul(b))?, weights))
}

/// `q`, `k` and `v` of `qkv`: `[N, T, 3·D]` (`[N, T, 3, H, D/H]`), each `[N·H, T, D/H]`.
fn split_heads(
    qkv: &Tensor,
    heads: usize,
    (n, t, d): (usize, usize, usize),
) -> Result<[Tensor; 3]> {
    let hd = d / heads;
    // [N, T, 3, H, hd] → [3, N, H, T, hd]
    let qkv = qkv
        .reshape((n, t, 3, heads, hd))?
        .permute((2, 0, 3, 1, 4))?;
    let part =
        |i: usize| -> Result<Tensor> { qkv.get(i)?.contiguous()?.reshape((n * heads, t, hd)) };
    Ok([part(0)?, part(1)?, part(2)?])
}

/// Heads `[N·H, T, D/H]` by token: the view `[N, T, H, D/H]` whose packed copy is `[N, T, D]`.
fn merge_heads(x: &Tensor, (n, t, d): (usize, usize, usize)) -> Result<Tensor> {
    let heads = x.dim(0)? / n;
    x.reshape((n, heads, t, d / heads))?.transpose(1, 2)
}

/// Attention whose autograd keeps only the weights `P` (`[N·H, T, T]`), as the CPU op does, for
/// devices where that op does not run (CUDA). Through Candle's autograd, [`composed`] holds every
/// intermediate until the backward: beside the output and `P`, the copies of `q`, `k` and `v`,
/// the scaled `q` and the heads before their merge (5/3 of `qkv`) and the scores (`[N·H, T, T]`):
/// ViT-S/16 at 32 images, 78 MB a block, 0.94 GB over its 12. Here the same ops run on a
/// detached `qkv`, so that all but the heads' outputs and `P` are freed at once, and one op node
/// on `qkv` merges the heads into its output (the copy the composed merge makes) and takes `P`
/// for the backward, which recomputes `q`, `k` and `v` from
/// `qkv` (three copies, freed as it goes): `dV = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ⊙ (dP −
/// rowsum(P ⊙ dP)) / √d`, `dQ = dS K`, `dK = dSᵀ Q`. The products are those of [`composed`]
/// (bf16 operands under autocast).
fn keeping_weights(qkv: &Tensor, heads: usize, dims: (usize, usize, usize)) -> Result<Tensor> {
    let (per_head, weights) = per_head_with_weights(&qkv.detach(), heads, dims)?;
    let merged = merge_heads(&per_head, dims)?;
    let out = qkv.apply_op1(KeptWeights {
        heads,
        merged: Mutex::new(Some(merged)),
        weights: Mutex::new(Some(weights)),
    })?;
    out.reshape(dims)
}

/// The gradient of `qkv` from [`composed`]'s weights `P` and the output gradient `d_out`:
/// `[N, T, D]`, in the layout of `qkv`: `[N, T, 3·D]`.
fn backward_from_weights(
    qkv: &Tensor,
    weights: &Tensor,
    d_out: &Tensor,
    heads: usize,
    (n, t, d): (usize, usize, usize),
) -> Result<Tensor> {
    let hd = d / heads;
    let product = |a: &Tensor, b: &Tensor| matrix_product(a, b, |a, b| a.matmul(b));
    let [q, k, v] = split_heads(qkv, heads, (n, t, d))?;
    let d_out = d_out
        .reshape((n, t, heads, hd))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((n * heads, t, hd))?;
    let dv = product(&weights.t()?, &d_out)?;
    let dp = product(&d_out, &v.t()?)?;
    let ds = (softmax_last_dim_backward(weights, &dp)? * (hd as f64).powf(-0.5))?;
    let dq = product(&ds, &k)?;
    let dk = product(&ds.t()?, &q)?;
    // [3, N, H, T, hd] → [N, T, 3, H, hd]
    Tensor::stack(&[dq, dk, dv], 0)?
        .reshape((3, n, heads, t, hd))?
        .permute((1, 3, 0, 2, 4))?
        .contiguous()?
        .reshape((n, t, 3 * d))
}

/// The op node of [`keeping_weights`] on `qkv`: its forward writes the heads computed detached
/// packed by token (`[N, T, H, D/H]`), its backward is [`backward_from_weights`].
struct KeptWeights {
    heads: usize,
    /// The heads' outputs viewed by token, until the forward takes them.
    merged: Mutex<Option<Tensor>>,
    /// `P`, until the backward takes it (a second backward recomputes it).
    weights: Mutex<Option<Tensor>>,
}

impl KeptWeights {
    /// The merged heads, taken (the forward runs once).
    fn merged(&self) -> Result<Tensor> {
        let merged = self.merged.lock().unwrap_or_else(|e| e.into_inner()).take();
        merged.ok_or_else(|| candle_core::Error::Msg("ssl-attention-kept-weights ran twice".into()))
    }
}

/// A packed copy of the view `(storage, layout)` on its own device.
fn packed_copy<S>((storage, layout): (&S, &Layout), device: &S::Device) -> Result<(S, Shape)>
where
    S: BackendStorage,
    S::Device: BackendDevice<Storage = S>,
{
    // SAFETY: `copy_strided_src` writes every element of the fresh buffer.
    let mut out = unsafe { device.alloc_uninit(layout.shape(), storage.dtype())? };
    storage.copy_strided_src(&mut out, 0, layout)?;
    Ok((out, layout.shape().clone()))
}

impl candle_core::CustomOp1 for KeptWeights {
    fn name(&self) -> &'static str {
        "ssl-attention-kept-weights"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let merged = self.merged()?;
        let (storage, layout) = merged.storage_and_layout();
        let candle_core::Storage::Cpu(s) = &*storage else {
            candle_core::bail!("ssl-attention-kept-weights: the heads are not on the CPU");
        };
        packed_copy((s, layout), &candle_core::cpu_backend::CpuDevice)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let merged = self.merged()?;
        let (storage, layout) = merged.storage_and_layout();
        let candle_core::Storage::Cuda(s) = &*storage else {
            candle_core::bail!("ssl-attention-kept-weights: the heads are not on CUDA");
        };
        packed_copy((s, layout), &s.device)
    }

    fn bwd(&self, qkv: &Tensor, _out: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (n, t, width) = qkv.dims3()?;
        let dims = (n, t, width / 3);
        let qkv = qkv.detach();
        let kept = self
            .weights
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let weights = match kept {
            Some(w) => w,
            None => composed_with_weights(&qkv, self.heads, dims)?.1,
        };
        backward_from_weights(&qkv, &weights, &grad.detach(), self.heads, dims).map(Some)
    }
}

/// Where one `(image, head)` pair lives in `qkv`: `[N, T, 3·D]` and in `[N, T, D]`.
#[derive(Clone, Copy)]
struct Heads {
    n: usize,
    t: usize,
    d: usize,
    heads: usize,
    /// Precision of the pair's products.
    precision: Precision,
}

impl Heads {
    fn from_layout(l: &Layout, heads: usize, precision: Precision) -> Result<Self> {
        let (n, t, width) = l.shape().dims3()?;
        Ok(Self {
            n,
            t,
            d: width / 3,
            heads,
            precision,
        })
    }

    fn head_dim(&self) -> usize {
        self.d / self.heads
    }

    /// Offset in `qkv` of part `part` (0 = q, 1 = k, 2 = v) of pair `pair` = image · H + head;
    /// its rows are `3·D` apart.
    fn packed(&self, pair: usize, part: usize) -> usize {
        let (image, head) = (pair / self.heads, pair % self.heads);
        image * self.t * 3 * self.d + part * self.d + head * self.head_dim()
    }

    /// Offset in `[N, T, D]` of pair `pair`; its rows are `D` apart.
    fn merged(&self, pair: usize) -> usize {
        let (image, head) = (pair / self.heads, pair % self.heads);
        image * self.t * self.d + head * self.head_dim()
    }

    fn scale(&self) -> f64 {
        (self.head_dim() as f64).powf(-0.5)
    }
}

/// `P = softmax(Q Kᵀ / √d)` of pair `pair` into `p`: `[T, T]`.
fn attention_weights<T: Float>(h: Heads, qkv: &[T], pair: usize, p: &mut [T]) {
    let (t, row) = (h.t, 3 * h.d);
    // SAFETY: q and k of the pair lie inside `qkv` at row stride 3·D; `p` holds T·T values.
    unsafe {
        gemm_in(
            h.precision,
            (t, t, h.head_dim()),
            (p.as_mut_ptr(), t, 1),
            (qkv[h.packed(pair, 0)..].as_ptr(), row, 1),
            (qkv[h.packed(pair, 1)..].as_ptr(), 1, row),
            false,
        );
    }
    let scale = T::from_f64(h.scale());
    vectorized(
        #[inline(always)]
        || {
            for scores in p.chunks_mut(t) {
                let max = lane_max(scores);
                for s in scores.iter_mut() {
                    *s = (*s - max) * scale;
                }
                T::exp_in_place(scores);
                let sum = lane_sum(scores, scores, scores, |e, _, _| e.to_f64());
                let inv = T::from_f64(1.0 / sum);
                for s in scores.iter_mut() {
                    *s *= inv;
                }
            }
        },
    )
}

/// A pointer handed to the tasks of one op, each writing a disjoint part.
struct Shared<T>(*mut T);
unsafe impl<T: Send> Sync for Shared<T> {}

/// `O = P V` per pair into `[N, T, D]`, and where `keep`, the weights `P` of every pair:
/// `[N·H, T, T]`.
fn attention_forward<T: Float>(h: Heads, qkv: &[T], keep: bool) -> (Vec<T>, Option<Vec<T>>) {
    let len = h.n * h.t * h.d;
    let mut out: Vec<T> = Vec::with_capacity(len);
    let dst = Shared(out.as_mut_ptr());
    let t = h.t;
    let kept_len = if keep { h.n * h.heads * t * t } else { 0 };
    let mut kept: Vec<T> = Vec::with_capacity(kept_len);
    let kept_ptr = Shared(kept.as_mut_ptr());
    for_each_index(
        h.n * h.heads,
        || match keep {
            true => Vec::new(),
            false => vec![T::zero(); t * t],
        },
        |scratch: &mut Vec<T>, pair| {
            let (dst, kept_ptr) = (&dst, &kept_ptr);
            let p = match keep {
                // SAFETY: `kept` has room for `T·T` values per pair; this pair's are its own.
                true => unsafe {
                    std::slice::from_raw_parts_mut(kept_ptr.0.add(pair * t * t), t * t)
                },
                false => &mut scratch[..],
            };
            attention_weights(h, qkv, pair, p);
            // SAFETY: v lies in `qkv` at row stride 3·D; the pair's columns of `out` (allocated,
            // not yet initialised: the product writes them without reading) are its own.
            unsafe {
                gemm_in(
                    h.precision,
                    (t, h.head_dim(), t),
                    (dst.0.add(h.merged(pair)), h.d, 1),
                    (p.as_ptr(), t, 1),
                    (qkv[h.packed(pair, 2)..].as_ptr(), 3 * h.d, 1),
                    false,
                );
            }
        },
    );
    // SAFETY: every pair wrote its head's columns of every row of `out`, which the pairs cover,
    // and (where kept) all `T·T` of its weights.
    unsafe {
        out.set_len(len);
        kept.set_len(kept_len);
    }
    (out, keep.then_some(kept))
}

/// The gradient of `qkv`, `[N, T, 3·D]`, from the output gradient `dO`: `[N, T, D]` and the
/// forward's weights `[N·H, T, T]` where it kept them (else they are recomputed).
fn attention_backward<T: Float>(h: Heads, qkv: &[T], d_out: &[T], kept: Option<&[T]>) -> Vec<T> {
    let mut grad: Vec<T> = Vec::with_capacity(qkv.len());
    let dst = Shared(grad.as_mut_ptr());
    let (t, hd, row) = (h.t, h.head_dim(), 3 * h.d);
    for_each_index(
        h.n * h.heads,
        || {
            let recomputed = if kept.is_some() { 0 } else { t * t };
            (vec![T::zero(); recomputed], vec![T::zero(); t * t])
        },
        |(scratch, dp): &mut (Vec<T>, Vec<T>), pair| {
            let dst = &dst;
            let p = match kept {
                Some(kept) => &kept[pair * t * t..][..t * t],
                None => {
                    attention_weights(h, qkv, pair, scratch);
                    &scratch[..]
                }
            };
            let d_o = d_out[h.merged(pair)..].as_ptr();
            let at = |part: usize| qkv[h.packed(pair, part)..].as_ptr();
            // SAFETY: every operand lies in its buffer at the strides given; the pair's q, k
            // and v columns of `grad` are written by this task alone.
            unsafe {
                // dV = Pᵀ dO, dP = dO Vᵀ
                gemm_in(
                    h.precision,
                    (t, hd, t),
                    (dst.0.add(h.packed(pair, 2)), row, 1),
                    (p.as_ptr(), 1, t),
                    (d_o, h.d, 1),
                    false,
                );
                gemm_in(
                    h.precision,
                    (t, t, hd),
                    (dp.as_mut_ptr(), t, 1),
                    (d_o, h.d, 1),
                    (at(2), 1, row),
                    false,
                );
            }
            // dS / √d = P ⊙ (dP − rowsum(P ⊙ dP)) / √d, in place of dP.
            let scale = T::from_f64(h.scale());
            vectorized(
                #[inline(always)]
                || {
                    for (pr, dpr) in p.chunks(t).zip(dp.chunks_mut(t)) {
                        let dot =
                            T::from_f64(lane_sum(pr, dpr, pr, |x, y, _| x.to_f64() * y.to_f64()));
                        for (g, &w) in dpr.iter_mut().zip(pr) {
                            *g = w * (*g - dot) * scale;
                        }
                    }
                },
            );
            // SAFETY: as above.
            unsafe {
                // dQ = dS K / √d, dK = dSᵀ Q / √d
                gemm_in(
                    h.precision,
                    (t, hd, t),
                    (dst.0.add(h.packed(pair, 0)), row, 1),
                    (dp.as_ptr(), t, 1),
                    (at(1), row, 1),
                    false,
                );
                gemm_in(
                    h.precision,
                    (t, hd, t),
                    (dst.0.add(h.packed(pair, 1)), row, 1),
                    (dp.as_ptr(), 1, t),
                    (at(0), row, 1),
                    false,
                );
            }
        },
    );
    // SAFETY: every pair wrote its head's q, k and v columns of every row of `grad`, which the
    // pairs cover.
    unsafe { grad.set_len(qkv.len()) };
    grad
}

/// [`multi_head_attention`] on the CPU: `qkv` → `[N, T, D]`.
struct Attention {
    heads: usize,
    /// The autocast precision of the products, the backward's too.
    precision: Precision,
    /// Where `qkv` takes part in autograd: the forward's weights `[N·H, T, T]`, until the
    /// backward takes them.
    weights: Option<Mutex<Option<CpuStorage>>>,
}

impl candle_core::CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "ssl-attention"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let h = Heads::from_layout(l, self.heads, self.precision)?;
        let keep = self.weights.is_some();
        let (out, kept) = match s {
            CpuStorage::F32(_) => {
                let (out, kept) = attention_forward(h, contiguous_slice(s, l)?, keep);
                (CpuStorage::F32(out), kept.map(CpuStorage::F32))
            }
            CpuStorage::F64(_) => {
                let (out, kept) = attention_forward(h, contiguous_slice(s, l)?, keep);
                (CpuStorage::F64(out), kept.map(CpuStorage::F64))
            }
            _ => candle_core::bail!("ssl-attention supports f32 and f64 only"),
        };
        if let Some(weights) = &self.weights {
            *weights.lock().unwrap_or_else(|e| e.into_inner()) = kept;
        }
        Ok((out, Shape::from((h.n, h.t, h.d))))
    }

    fn bwd(&self, qkv: &Tensor, _out: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        // A second backward over the same graph finds the weights taken and recomputes them.
        let weights = self
            .weights
            .as_ref()
            .and_then(|w| w.lock().unwrap_or_else(|e| e.into_inner()).take());
        let op = AttentionBwd {
            heads: self.heads,
            precision: self.precision,
            weights,
        };
        Ok(Some(qkv.apply_op2_no_bwd(&grad.contiguous()?, &op)?))
    }
}

/// Backward of [`Attention`]: (qkv, dO) → dqkv, from the forward's weights where it kept them.
struct AttentionBwd {
    heads: usize,
    precision: Precision,
    weights: Option<CpuStorage>,
}

impl candle_core::CustomOp2 for AttentionBwd {
    fn name(&self) -> &'static str {
        "ssl-attention-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let h = Heads::from_layout(l1, self.heads, self.precision)?;
        fn run<T: Float>(
            h: Heads,
            (qkv, lq): (&CpuStorage, &Layout),
            (d_out, lo): (&CpuStorage, &Layout),
            weights: Option<&CpuStorage>,
        ) -> Result<Vec<T>> {
            let kept = weights.map(|w| w.as_slice::<T>()).transpose()?;
            Ok(attention_backward(
                h,
                contiguous_slice(qkv, lq)?,
                contiguous_slice(d_out, lo)?,
                kept,
            ))
        }
        let (a, b, w) = ((s1, l1), (s2, l2), self.weights.as_ref());
        let grad = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(run(h, a, b, w)?),
            CpuStorage::F64(_) => CpuStorage::F64(run(h, a, b, w)?),
            _ => candle_core::bail!("ssl-attention supports f32 and f64 only"),
        };
        Ok((grad, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autocast::autocast;
    use crate::util::testing::{max_abs_diff, rand_tensor};
    use candle_core::Var;

    /// `qkv`'s gradient of `Σ r ⊙ attention(qkv)` and the output, by `f`.
    fn value_and_grad(
        qkv: &Var,
        r: &Tensor,
        f: impl Fn(&Tensor) -> Result<Tensor>,
    ) -> (Tensor, Tensor) {
        let y = f(qkv.as_tensor()).unwrap();
        let grads = (&y * r).unwrap().sum_all().unwrap().backward().unwrap();
        (y, grads.get(qkv.as_tensor()).unwrap().clone())
    }

    #[test]
    fn fused_attention_and_its_gradient_equal_the_composed_ones() {
        // 2 images, 7 tokens, 3 heads of width 4; logits scaled up to test the max shift.
        let (n, t, heads, hd) = (2, 7, 3, 4);
        let d = heads * hd;
        let qkv =
            Var::from_tensor(&(rand_tensor(1, &[n, t, 3 * d], DType::F64) * 3.0).unwrap()).unwrap();
        let r = rand_tensor(2, &[n, t, d], DType::F64);
        let (y, g) = value_and_grad(&qkv, &r, |x| multi_head_attention(x, heads));
        let (y_ref, g_ref) = value_and_grad(&qkv, &r, |x| composed(x, heads, (n, t, d)));
        assert!(
            max_abs_diff(&y, &y_ref) < 1e-13,
            "{}",
            max_abs_diff(&y, &y_ref)
        );
        assert!(
            max_abs_diff(&g, &g_ref) < 1e-13,
            "{}",
            max_abs_diff(&g, &g_ref)
        );
        // In f32 (the fast exp) to f32 rounding.
        let qkv32 = Var::from_tensor(&qkv.to_dtype(DType::F32).unwrap()).unwrap();
        let r32 = r.to_dtype(DType::F32).unwrap();
        let (y32, g32) = value_and_grad(&qkv32, &r32, |x| multi_head_attention(x, heads));
        assert!(max_abs_diff(&y32, &y_ref) < 1e-5);
        assert!(max_abs_diff(&g32, &g_ref) < 1e-5);
    }

    #[test]
    fn the_backward_from_kept_weights_equals_the_one_that_recomputes_them() {
        let (n, t, heads, hd) = (2, 9, 2, 4);
        let qkv = rand_tensor(5, &[n, t, 3 * heads * hd], DType::F64) * 2.0;
        let qkv = Var::from_tensor(&qkv.unwrap()).unwrap();
        let r = rand_tensor(6, &[n, t, heads * hd], DType::F64);
        let y = multi_head_attention(qkv.as_tensor(), heads).unwrap();
        let loss = (&y * &r).unwrap().sum_all().unwrap();
        let kept = loss.backward().unwrap();
        // The first backward took the kept weights; a second one recomputes them.
        let recomputed = loss.backward().unwrap();
        let (kept, recomputed) = (
            kept.get(qkv.as_tensor()).unwrap(),
            recomputed.get(qkv.as_tensor()).unwrap(),
        );
        assert!(max_abs_diff(kept, recomputed) < 1e-15);
        // Outside autograd nothing is kept, and the output is the same.
        let plain = multi_head_attention(&qkv.as_tensor().detach(), heads).unwrap();
        assert_eq!(max_abs_diff(&plain, &y), 0.0);
    }

    #[test]
    fn attention_keeping_only_its_weights_has_the_composed_values_and_gradients() {
        // The CUDA path, run on the CPU: 2 images, 6 tokens, 3 heads of width 4.
        let (n, t, heads, hd) = (2, 6, 3, 4);
        let dims = (n, t, heads * hd);
        let qkv = rand_tensor(7, &[n, t, 3 * heads * hd], DType::F64) * 3.0;
        let qkv = Var::from_tensor(&qkv.unwrap()).unwrap();
        let r = rand_tensor(8, &[n, t, heads * hd], DType::F64);
        let (y, g) = value_and_grad(&qkv, &r, |x| keeping_weights(x, heads, dims));
        let (y_ref, g_ref) = value_and_grad(&qkv, &r, |x| composed(x, heads, dims));
        assert!(max_abs_diff(&y, &y_ref) < 1e-14);
        assert!(
            max_abs_diff(&g, &g_ref) < 1e-13,
            "{}",
            max_abs_diff(&g, &g_ref)
        );
        // A second backward over the same graph recomputes the weights it took.
        let loss = (keeping_weights(qkv.as_tensor(), heads, dims).unwrap() * &r)
            .unwrap()
            .sum_all()
            .unwrap();
        let first = loss.backward().unwrap();
        let second = loss.backward().unwrap();
        let [first, second] = [first, second].map(|g| g.get(qkv.as_tensor()).unwrap().clone());
        assert!(max_abs_diff(&first, &g_ref) < 1e-13);
        assert!(max_abs_diff(&second, &g_ref) < 1e-13);
        // Under bf16 autocast its products round as the composed ones do.
        let qkv32 = Var::from_tensor(&qkv.to_dtype(DType::F32).unwrap()).unwrap();
        let r32 = r.to_dtype(DType::F32).unwrap();
        let _bf16 = autocast(Precision::Bf16);
        let (y, g) = value_and_grad(&qkv32, &r32, |x| keeping_weights(x, heads, dims));
        let (y_bf, g_bf) = value_and_grad(&qkv32, &r32, |x| composed(x, heads, dims));
        assert!(
            max_abs_diff(&y, &y_bf) < 1e-6,
            "{}",
            max_abs_diff(&y, &y_bf)
        );
        let (err, scale) = (
            max_abs_diff(&g, &g_bf),
            max_abs_diff(&g_bf, &g_bf.zeros_like().unwrap()),
        );
        assert!(err < 2e-2 * scale, "{err} of {scale}");
        assert!(max_abs_diff(&g, &g_ref.to_dtype(DType::F32).unwrap()) > 0.0);
    }

    /// Under bf16 autocast the op rounds the operands of its products, as the composed path's
    /// casts do: the two agree to bf16's precision, values and gradients, and both differ
    /// from f32.
    #[test]
    fn bf16_autocast_rounds_the_products_operands_and_widths_are_checked() {
        let (n, t, heads, hd) = (2, 7, 3, 8);
        let dims = (n, t, heads * hd);
        let qkv = rand_tensor(3, &[n, t, 3 * heads * hd], DType::F32);
        let qkv = Var::from_tensor(&(qkv * 2.0).unwrap()).unwrap();
        let r = rand_tensor(4, &[n, t, heads * hd], DType::F32);
        let (y32, _) = value_and_grad(&qkv, &r, |x| multi_head_attention(x, heads));
        let _bf16 = autocast(Precision::Bf16);
        let (y, g) = value_and_grad(&qkv, &r, |x| multi_head_attention(x, heads));
        let (y_ref, g_ref) = value_and_grad(&qkv, &r, |x| composed(x, heads, dims));
        let scale = |t: &Tensor| max_abs_diff(t, &t.zeros_like().unwrap());
        let err = max_abs_diff(&y, &y_ref);
        assert!(err < 1e-2 * scale(&y_ref), "values: {err}");
        let err = max_abs_diff(&g, &g_ref);
        assert!(err < 2e-2 * scale(&g_ref), "gradients: {err}");
        let diff = max_abs_diff(&y, &y32);
        assert!(diff > 0.0 && diff < 2e-2, "bf16 operands round: {diff}");
        let err = multi_head_attention(qkv.as_tensor(), 5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("divisible by 3 × 5 heads"), "{err}");
    }
}
