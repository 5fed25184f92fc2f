//! Encoders that run on a subset of their input's patch tokens, for objectives that encode the
//! views themselves ([`Requirements::pixels`](crate::Requirements::pixels)): MAE's encoder
//! sees the visible patches only, I-JEPA's context encoder a context block.

use candle_core::{Result, Tensor};

/// The output tokens of a [`TokenEncoder`], after its final norm.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// The class token, `[N, E]`.
    pub cls: Tensor,
    /// The patch tokens that entered the encoder, `[N, K, E]`, in the order of `keep`.
    pub patches: Tensor,
}

/// An encoder of images cut into a grid of square patches (a ViT).
pub trait TokenEncoder: Send + Sync {
    /// Side of a patch in pixels, `p`: an `H × W` image has `(H/p)·(W/p)` patches, numbered
    /// row-major.
    fn patch_size(&self) -> usize;

    /// Token width `E`.
    fn token_dim(&self) -> usize;

    /// The tokens of `x`: `[N, C, H, W]`. With `keep` (`[N, K]` u32 patch indices per image)
    /// only those `K` patches enter the encoder, each with its own positional embedding, so the
    /// others cost nothing; `patches[n, k]` is the output of patch `keep[n, k]`. Without
    /// `keep`, every patch in order.
    fn forward_tokens(&self, x: &Tensor, keep: Option<&Tensor>) -> Result<Tokens>;
}
