//! A loss's terms as one CPU op each way: the forward keeps what its backward needs, and the
//! backward is one more op on the terms' gradient. An objective writes the two passes over
//! plain slices ([`TermsKernel`]); [`apply_terms`] makes them a Candle op in f32 and f64.
//!
//! An objective's terms composed of Candle ops cost a pass and a buffer per op each way; at the
//! sizes of a projector's output (`[2, 128, 512]`) that dispatch outweighs the arithmetic.

use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, WithDType};

/// The two passes of a loss's terms over a contiguous input `z` of shape `dims`.
pub trait TermsKernel: Send + Sync + 'static {
    /// The op's name in Candle's graph.
    const NAME: &'static str;
    /// What the forward keeps for the backward.
    type Saved<T: WithDType>: Send + Sync;
    /// The terms' shape for an input of `dims`.
    fn terms_shape(dims: &[usize]) -> Shape;
    /// The terms, and what the backward needs.
    fn forward<T: WithDType>(z: &[T], dims: &[usize]) -> Result<(Vec<T>, Self::Saved<T>)>;
    /// `∂L/∂z` (the input's shape) from the terms' gradient `grad`.
    fn backward<T: WithDType>(saved: &Self::Saved<T>, grad: &[T], dims: &[usize])
        -> Result<Vec<T>>;
}

/// `K`'s terms of `z` (f32 or f64, on the CPU) as a node of the graph.
pub fn apply_terms<K: TermsKernel>(z: &Tensor) -> Result<Tensor> {
    z.contiguous()?.apply_op1(Terms::<K> {
        kept: OnceLock::new(),
    })
}

enum Kept<K: TermsKernel> {
    F32(K::Saved<f32>),
    F64(K::Saved<f64>),
}

struct Terms<K: TermsKernel> {
    kept: OnceLock<Arc<Kept<K>>>,
}

impl<K: TermsKernel> CustomOp1 for Terms<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{} expects a contiguous input", K::NAME);
        };
        let (out, kept) = match storage {
            CpuStorage::F32(z) => {
                let (out, saved) = K::forward(&z[start..end], dims)?;
                (CpuStorage::F32(out), Kept::F32(saved))
            }
            CpuStorage::F64(z) => {
                let (out, saved) = K::forward(&z[start..end], dims)?;
                (CpuStorage::F64(out), Kept::F64(saved))
            }
            other => candle_core::bail!("{} supports f32 and f64, got {:?}", K::NAME, other),
        };
        // A graph evaluated again would run a new op; this one keeps its first forward.
        let _ = self.kept.set(Arc::new(kept));
        Ok((out, K::terms_shape(dims)))
    }

    fn bwd(&self, z: &Tensor, _terms: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let Some(kept) = self.kept.get() else {
            candle_core::bail!("{}: backward before forward", K::NAME);
        };
        let backward = Backward::<K> {
            kept: kept.clone(),
            dims: z.dims().to_vec(),
        };
        Ok(Some(grad.contiguous()?.apply_op1_no_bwd(&backward)?))
    }
}

/// `∂L/∂z` from the terms' gradient.
struct Backward<K: TermsKernel> {
    kept: Arc<Kept<K>>,
    dims: Vec<usize>,
}

impl<K: TermsKernel> CustomOp1 for Backward<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}'s backward expects a contiguous gradient", K::NAME);
        };
        let dims = &self.dims;
        let out = match (&*self.kept, storage) {
            (Kept::F32(saved), CpuStorage::F32(g)) => {
                CpuStorage::F32(K::backward(saved, &g[start..end], dims)?)
            }
            (Kept::F64(saved), CpuStorage::F64(g)) => {
                CpuStorage::F64(K::backward(saved, &g[start..end], dims)?)
            }
            _ => candle_core::bail!("{}'s backward: the gradient's dtype differs", K::NAME),
        };
        Ok((out, Shape::from(dims.clone())))
    }
}
