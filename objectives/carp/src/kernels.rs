//! Fused CPU kernels of the CARP loss and their backward passes. Composed from candle ops, the
//! block softmax, the per-pair block inner products and the column sums of `p̄` each take several
//! passes over the `[V, B, K]` logits, most of them through slow broadcasts and leading-axis
//! reductions; fused they take one pass each way. Every op has a composed twin, used for other
//! devices and dtypes and by the tests as the reference.

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, WithDType, D,
};
use rayon::prelude::*;

/// The float types the kernels compute in.
trait Real: WithDType {
    fn exp(self) -> Self;
}

impl Real for f32 {
    fn exp(self) -> Self {
        f32::exp(self)
    }
}

impl Real for f64 {
    fn exp(self) -> Self {
        f64::exp(self)
    }
}

/// Whether every tensor is an f32 or f64 CPU tensor of one dtype.
fn fused(xs: &[&Tensor]) -> bool {
    let dtype = xs[0].dtype();
    matches!(dtype, DType::F32 | DType::F64)
        && xs.iter().all(|x| x.device().is_cpu() && x.dtype() == dtype)
}

fn slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("the CARP kernels need contiguous inputs");
    };
    Ok(&s.as_slice::<T>()?[start..end])
}

/// A kernel over two same-dtype inputs, given their dims.
trait Kernel2 {
    fn run<T: Real>(&self, a: &[T], a_dims: &[usize], b: &[T], b_dims: &[usize]) -> Vec<T>;
}

/// Runs `k` in the dtype of `s1`; returns the flat output.
fn cpu2<K: Kernel2>(
    k: &K,
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
) -> Result<CpuStorage> {
    let (d1, d2) = (l1.dims(), l2.dims());
    Ok(match s1.dtype() {
        DType::F32 => CpuStorage::F32(k.run(slice(s1, l1)?, d1, slice(s2, l2)?, d2)),
        DType::F64 => CpuStorage::F64(k.run(slice(s1, l1)?, d1, slice(s2, l2)?, d2)),
        other => candle_core::bail!("the CARP kernels support f32 and f64, got {other:?}"),
    })
}

/// Softmax over the last axis: `[…, n]` → `[…, n]`.
pub(crate) fn softmax_last(x: &Tensor) -> Result<Tensor> {
    match fused(&[x]) {
        true => x.contiguous()?.apply_op1(Softmax),
        false => softmax_composed(x),
    }
}

/// [`softmax_last`] from candle ops, the row maximum subtracted as a constant.
pub(crate) fn softmax_composed(x: &Tensor) -> Result<Tensor> {
    let exp = x
        .broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?
        .exp()?;
    exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)
}

struct Softmax;

fn softmax_rows<T: Real>(x: &[T], n: usize) -> Vec<T> {
    let mut out = x.to_vec();
    out.par_chunks_mut(n).for_each(|row| {
        let max = row[1..]
            .iter()
            .fold(row[0], |m, &v| if v > m { v } else { m });
        let mut total = T::zero();
        for r in row.iter_mut() {
            *r = (*r - max).exp();
            total += *r;
        }
        for r in row.iter_mut() {
            *r /= total;
        }
    });
    out
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "carp-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let n = l.dims().last().copied().unwrap_or(1).max(1);
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(softmax_rows(slice::<f32>(s, l)?, n)),
            DType::F64 => CpuStorage::F64(softmax_rows(slice::<f64>(s, l)?, n)),
            other => candle_core::bail!("the CARP softmax supports f32 and f64, got {other:?}"),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, p: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(p.apply_op2_no_bwd(&g.contiguous()?, &SoftmaxGrad)?))
    }
}

/// `p ⊙ (g − ⟨g, p⟩)` row by row, inputs `(p, g)`: the softmax backward.
struct SoftmaxGrad;

impl Kernel2 for SoftmaxGrad {
    fn run<T: Real>(&self, p: &[T], dims: &[usize], g: &[T], _: &[usize]) -> Vec<T> {
        let n = dims.last().copied().unwrap_or(1).max(1);
        let mut out = g.to_vec();
        out.par_chunks_mut(n)
            .zip(p.par_chunks(n))
            .for_each(|(row, p)| {
                let inner = row
                    .iter()
                    .zip(p)
                    .fold(T::zero(), |acc, (&g, &p)| acc + g * p);
                for (r, &p) in row.iter_mut().zip(p) {
                    *r = p * (*r - inner);
                }
            });
        out
    }
}

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "carp-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((cpu2(self, (s1, l1), (s2, l2))?, l1.shape().clone()))
    }
}

/// Inner products of every row pair: `s` `[V, R, n]`, `t` `[W, R, n]` →
/// `dots[v, w, r] = ⟨s[v, r], t[w, r]⟩`, `[V, W, R]`.
pub(crate) fn pair_dots(s: &Tensor, t: &Tensor) -> Result<Tensor> {
    let (_, r, n) = s.dims3()?;
    let (w, rt, nt) = t.dims3()?;
    if (rt, nt) != (r, n) {
        candle_core::bail!(
            "pair dots need [V, R, n] and [W, R, n], got {:?} and {:?}",
            s.dims(),
            t.dims()
        );
    }
    match fused(&[s, t]) {
        true => s.contiguous()?.apply_op2(&t.contiguous()?, PairDots),
        false => {
            let per_w = (0..w)
                .map(|i| s.broadcast_mul(&t.get(i)?.unsqueeze(0)?)?.sum(D::Minus1))
                .collect::<Result<Vec<_>>>()?;
            Tensor::stack(&per_w, 1)
        }
    }
}

struct PairDots;

impl Kernel2 for PairDots {
    fn run<T: Real>(&self, s: &[T], s_dims: &[usize], t: &[T], t_dims: &[usize]) -> Vec<T> {
        let (r, n, w) = (s_dims[1], s_dims[2], t_dims[0]);
        let mut out = vec![T::zero(); s_dims[0] * w * r];
        out.par_chunks_mut(r.max(1))
            .enumerate()
            .for_each(|(vw, dst)| {
                let (s_v, t_w) = (&s[vw / w * r * n..], &t[vw % w * r * n..]);
                for (i, d) in dst.iter_mut().enumerate() {
                    let (a, b) = (&s_v[i * n..][..n], &t_w[i * n..][..n]);
                    *d = a.iter().zip(b).fold(T::zero(), |acc, (&x, &y)| acc + x * y);
                }
            });
        out
    }
}

impl CustomOp2 for PairDots {
    fn name(&self) -> &'static str {
        "carp-pair-dots"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = Shape::from((l1.dims()[0], l2.dims()[0], l1.dims()[1]));
        Ok((cpu2(self, (s1, l1), (s2, l2))?, shape))
    }

    fn bwd(
        &self,
        s: &Tensor,
        t: &Tensor,
        _dots: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = g.contiguous()?;
        let ds = g.apply_op2_no_bwd(t, &WeightedRows)?;
        let dt = match t.track_op() {
            true => Some(
                g.transpose(0, 1)?
                    .contiguous()?
                    .apply_op2_no_bwd(s, &WeightedRows)?,
            ),
            false => None,
        };
        Ok((Some(ds), dt))
    }
}

/// `out[a, r] = Σ_b g[a, b, r]·x[b, r]` for `g` `[A, Bx, R]` and rows `x` `[Bx, R, n]` →
/// `[A, R, n]`: the backward of [`PairDots`].
struct WeightedRows;

impl Kernel2 for WeightedRows {
    fn run<T: Real>(&self, g: &[T], g_dims: &[usize], x: &[T], x_dims: &[usize]) -> Vec<T> {
        let (bx, r, n) = (x_dims[0], x_dims[1], x_dims[2]);
        let mut out = vec![T::zero(); g_dims[0] * r * n];
        out.par_chunks_mut(n.max(1))
            .enumerate()
            .for_each(|(ar, dst)| {
                let (a, i) = (ar / r, ar % r);
                for b in 0..bx {
                    let weight = g[(a * bx + b) * r + i];
                    for (d, &v) in dst.iter_mut().zip(&x[(b * r + i) * n..][..n]) {
                        *d += weight * v;
                    }
                }
            });
        out
    }
}

impl CustomOp2 for WeightedRows {
    fn name(&self) -> &'static str {
        "carp-weighted-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = Shape::from((l1.dims()[0], l2.dims()[1], l2.dims()[2]));
        Ok((cpu2(self, (s1, l1), (s2, l2))?, shape))
    }
}

/// Column sums `Σ_r x[r, m]`: `[R, M]` → `[M]`.
pub(crate) fn column_sums(x: &Tensor) -> Result<Tensor> {
    x.dims2()?;
    match fused(&[x]) {
        true => x.contiguous()?.apply_op1(ColumnSums),
        false => x.sum(0),
    }
}

struct ColumnSums;

fn sum_rows<T: Real>(x: &[T], m: usize) -> Vec<T> {
    x.chunks(m.max(1)).fold(vec![T::zero(); m], |mut acc, row| {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a += v;
        }
        acc
    })
}

impl CustomOp1 for ColumnSums {
    fn name(&self) -> &'static str {
        "carp-column-sums"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let m = l.dims()[1];
        let out = match s.dtype() {
            DType::F32 => CpuStorage::F32(sum_rows(slice::<f32>(s, l)?, m)),
            DType::F64 => CpuStorage::F64(sum_rows(slice::<f64>(s, l)?, m)),
            other => {
                candle_core::bail!("the CARP column sums support f32 and f64, got {other:?}")
            }
        };
        Ok((out, Shape::from(m)))
    }

    fn bwd(&self, x: &Tensor, _sums: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(g.unsqueeze(0)?.broadcast_as(x.shape())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use rand::{Rng, SeedableRng};
    use ssl_core::testing::{max_gradient_error, scalar};

    fn uniform(seed: u64, dims: &[usize]) -> Tensor {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|_| rng.random_range(-2.0..2.0)).collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        scalar(&(a - b).unwrap().abs().unwrap().max_all().unwrap())
    }

    #[test]
    fn fused_ops_match_their_composed_twins_in_both_dtypes() -> Result<()> {
        let x = uniform(1, &[3, 5, 7]);
        let t = uniform(2, &[2, 5, 7]);
        for dtype in [DType::F64, DType::F32] {
            let (x, t) = (x.to_dtype(dtype)?, t.to_dtype(dtype)?);
            let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
            let d = max_diff(&softmax_last(&x)?, &softmax_composed(&x)?);
            assert!(d < tol, "softmax {dtype:?}: {d}");
            let dots = pair_dots(&x, &t)?;
            assert_eq!(dots.dims(), [3, 2, 5]);
            let want = x.unsqueeze(1)?.broadcast_mul(&t.unsqueeze(0)?)?.sum(3)?;
            assert!(max_diff(&dots, &want) < tol, "pair dots {dtype:?}");
            let flat = x.reshape((15, 7))?;
            assert!(max_diff(&column_sums(&flat)?, &flat.sum(0)?) < tol);
        }
        // Other dtypes take the composed path.
        let (x16, t16) = (x.to_dtype(DType::F16)?, t.to_dtype(DType::F16)?);
        let to64 = |a: Tensor| a.to_dtype(DType::F64);
        let d = max_diff(&to64(softmax_last(&x16)?)?, &softmax_composed(&x)?);
        assert!(d < 1e-2, "f16 softmax: {d}");
        let want = x.unsqueeze(1)?.broadcast_mul(&t.unsqueeze(0)?)?.sum(3)?;
        let d = max_diff(&to64(pair_dots(&x16, &t16)?)?, &want);
        assert!(d < 5e-2, "f16 pair dots: {d}");
        let flat = x.reshape((15, 7))?;
        let d = max_diff(&to64(column_sums(&x16.reshape((15, 7))?)?)?, &flat.sum(0)?);
        assert!(d < 5e-2, "f16 column sums: {d}");
        // A non-contiguous input is made contiguous first.
        let xt = x.transpose(1, 2)?;
        assert!(max_diff(&softmax_last(&xt)?, &softmax_composed(&xt)?) < 1e-12);
        Ok(())
    }

    #[test]
    fn fused_backward_passes_match_finite_differences() -> Result<()> {
        let x = uniform(3, &[2, 3, 4]);
        let t = uniform(4, &[3, 3, 4]);
        let r = uniform(5, &[2, 3, 3]);
        let w4 = uniform(6, &[2, 3, 4]);
        let errors = [
            max_gradient_error(&x, |x| (softmax_last(x)? * &w4)?.sum_all())?,
            max_gradient_error(&x, |x| (pair_dots(x, &t)? * &r)?.sum_all())?,
            max_gradient_error(&t, |t| (pair_dots(&x.narrow(0, 0, 2)?, t)? * &r)?.sum_all())?,
            max_gradient_error(&x, |x| {
                let sums = column_sums(&x.reshape((6, 4))?)?;
                (sums.sqr()? * &w4.get(0)?.get(0)?)?.sum_all()
            })?,
        ];
        for (i, e) in errors.iter().enumerate() {
            assert!(*e < 1e-7, "op {i}: gradient error {e}");
        }
        Ok(())
    }

    #[test]
    fn a_constant_second_argument_gets_no_gradient() -> Result<()> {
        let s = candle_core::Var::from_tensor(&uniform(7, &[2, 3, 4]))?;
        let t = uniform(8, &[2, 3, 4]);
        let grads = pair_dots(s.as_tensor(), &t)?.sum_all()?.backward()?;
        assert!(grads.get(&t).is_none());
        assert!(grads.get(s.as_tensor()).is_some());
        Ok(())
    }
}
