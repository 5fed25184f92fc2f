//! The DINO projection head (spec `docs/spec/objectives.md` §2.22), keyed like the reference
//! `DINOHead`: `mlp` (`nn.Sequential` of Linear [→ BatchNorm1d] → GELU blocks and a final Linear to
//! the bottleneck; a single `nn.Linear` when there is one layer) → L2-normalise → `last_layer`, a
//! bias-free weight-normalised linear map to `K` prototypes whose gain `weight_g` is fixed at 1, so
//! only its direction `last_layer.weight_v` `[K, bottleneck]` is stored:
//!
//! `logits = normalize(mlp(x)) · normalize_rows(V)ᵀ`, every logit a cosine in `[−1, 1]`.

use anyhow::{ensure, Result};
use candle_core::{Module, Tensor, Var};
use candle_nn::{Init, Linear, VarBuilder};
use ssl_linalg::normalize_rows;
use ssl_models::BatchNorm;

/// Layer sizes of a [`DinoHead`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadShape {
    /// Input width (the backbone's feature width `F`).
    pub in_dim: usize,
    /// Linear layers in the MLP (3 in DINO), the last one mapping to the bottleneck.
    pub layers: usize,
    /// Width of the hidden layers (2048).
    pub hidden: usize,
    /// Width of the MLP output before normalisation (256).
    pub bottleneck: usize,
    /// Number of prototypes `K` (65 536).
    pub out_dim: usize,
    /// Batch norm after every hidden Linear (off in DINO).
    pub use_bn: bool,
}

/// One hidden block `GELU(BN(W x + b))` (BN optional).
struct Hidden {
    linear: Linear,
    bn: Option<BatchNorm>,
}

/// The head: MLP → L2-normalise → weight-normalised prototypes (gain 1).
pub struct DinoHead {
    hidden: Vec<Hidden>,
    bottleneck: Linear,
    /// `last_layer.weight_v`, `[K, bottleneck]`; only its row directions matter.
    weight_v: Var,
    /// Every trainable parameter (not the batch-norm running statistics), in creation order,
    /// named relative to the head.
    params: Vec<(String, Var)>,
}

/// A parameter created through `vb` as a variable, so that `Var::set` reaches the copy the
/// checkpoints save.
fn param(vb: &VarBuilder, dims: &[usize], name: &str, init: Init) -> Result<Var> {
    let t = vb.get_with_hints(dims, name, init)?;
    ensure!(
        t.is_variable(),
        "the DINO head needs a VarBuilder that hands out variables (a ParamStore or VarMap) to \
         update its EMA teacher in place; `{name}` is a constant"
    );
    Ok(Var::from_tensor(&t)?)
}

/// A Linear `i → o` of the MLP: weight `N(0, 0.02²)` (the reference's truncated normal, whose
/// ±2 cut-off is 100 standard deviations away), zero bias; both recorded in `params`.
fn linear(
    vb: &VarBuilder,
    prefix: &str,
    (i, o): (usize, usize),
    params: &mut Vec<(String, Var)>,
) -> Result<Linear> {
    let normal = Init::Randn {
        mean: 0.0,
        stdev: 0.02,
    };
    let w = param(vb, &[o, i], "weight", normal)?;
    let b = param(vb, &[o], "bias", Init::Const(0.0))?;
    let layer = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
    params.push((format!("{prefix}weight"), w));
    params.push((format!("{prefix}bias"), b));
    Ok(layer)
}

impl DinoHead {
    /// Creates the head under `vb`, initialised as the reference: the MLP's Linear weights
    /// `N(0, 0.02²)` with zero biases, `weight_v` PyTorch's Linear default `U(±1/√bottleneck)`.
    pub fn new(shape: HeadShape, vb: VarBuilder) -> Result<Self> {
        ensure!(
            shape.layers >= 1,
            "the DINO head needs at least 1 layer, got 0"
        );
        let mut params = Vec::new();
        let mlp = vb.pp("mlp");
        let stride = if shape.use_bn { 3 } else { 2 };
        let mut hidden = Vec::new();
        let mut width = shape.in_dim;
        for block in 0..shape.layers - 1 {
            let index = block * stride;
            let layer = linear(
                &mlp.pp(index.to_string()),
                &format!("mlp.{index}."),
                (width, shape.hidden),
                &mut params,
            )?;
            let bn = match shape.use_bn {
                false => None,
                true => {
                    let bvb = mlp.pp((index + 1).to_string());
                    let bn = ssl_models::batch_norm::batch_norm(shape.hidden, bvb.clone())?;
                    for (name, init) in [("weight", 1.0), ("bias", 0.0)] {
                        let var = param(&bvb, &[shape.hidden], name, Init::Const(init))?;
                        params.push((format!("mlp.{}.{name}", index + 1), var));
                    }
                    Some(bn)
                }
            };
            hidden.push(Hidden { linear: layer, bn });
            width = shape.hidden;
        }
        let bottleneck = match shape.layers {
            1 => linear(&mlp, "mlp.", (width, shape.bottleneck), &mut params)?,
            _ => {
                let index = (shape.layers - 1) * stride;
                let prefix = format!("mlp.{index}.");
                let dims = (width, shape.bottleneck);
                linear(&mlp.pp(index.to_string()), &prefix, dims, &mut params)?
            }
        };
        let bound = 1.0 / (shape.bottleneck as f64).sqrt();
        let weight_v = param(
            &vb.pp("last_layer"),
            &[shape.out_dim, shape.bottleneck],
            "weight_v",
            Init::Uniform {
                lo: -bound,
                up: bound,
            },
        )?;
        params.push(("last_layer.weight_v".into(), weight_v.clone()));
        Ok(Self {
            hidden,
            bottleneck,
            weight_v,
            params,
        })
    }

    /// Trainable parameters `(name relative to the head, variable)` in a fixed order (two heads
    /// of one [`HeadShape`] list the same names in the same order).
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The prototypes `normalize_rows(V)`, `[K, bottleneck]`: the effective weight of the
    /// last layer.
    pub fn prototypes(&self) -> candle_core::Result<Tensor> {
        normalize_rows(self.weight_v.as_tensor())
    }

    /// The bottleneck embedding `mlp(x)` before normalisation: `x` `[N, F]` → `[N, bottleneck]`.
    /// `train` selects batch statistics in the optional batch norms (needs `N ≥ 2`).
    pub fn embed(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for block in &self.hidden {
            h = block.linear.forward(&h)?;
            if let Some(bn) = &block.bn {
                h = bn.forward_rows(&h, false, train)?;
            }
            h = h.gelu_erf()?;
        }
        self.bottleneck.forward(&h)
    }

    /// Logits `normalize(mlp(x)) · normalize_rows(V)ᵀ`: `x` `[N, F]` → `[N, K]`. With
    /// `freeze_last_layer` the prototypes are used as constants (no gradient reaches
    /// `weight_v`, so the optimiser leaves it unchanged).
    pub fn forward(
        &self,
        x: &Tensor,
        train: bool,
        freeze_last_layer: bool,
    ) -> candle_core::Result<Tensor> {
        let h = normalize_rows(&self.embed(x, train)?)?;
        let v = match freeze_last_layer {
            true => self.weight_v.as_tensor().detach(),
            false => self.weight_v.as_tensor().clone(),
        };
        h.matmul(&normalize_rows(&v)?.t()?)
    }

    /// [`DinoHead::forward`] of every view at once: `x` `[V, B, F]` → `[V, B, K]` (the
    /// reference concatenates all crops before the head, so batch norm sees all `V·B` rows).
    pub fn forward_views(
        &self,
        x: &Tensor,
        train: bool,
        freeze_last_layer: bool,
    ) -> candle_core::Result<Tensor> {
        let (v, b, f) = x.dims3()?;
        let logits = self.forward(&x.reshape((v * b, f))?, train, freeze_last_layer)?;
        logits.reshape((v, b, ()))
    }

    /// `θ_self ← m·θ_self + (1 − m)·θ_student` for every parameter (spec §3; batch-norm running
    /// statistics are left to this head's own forward passes, as in the reference).
    pub fn ema_from(&self, student: &DinoHead, momentum: f64) -> Result<()> {
        ssl_core::ema_update(&self.params, &student.params, momentum)
    }

    /// Copies every parameter of `student` into this head (the teacher's start).
    pub fn copy_from(&self, student: &DinoHead) -> Result<()> {
        for (t, s) in ssl_core::paired_parameters(&self.params, &student.params)? {
            t.set(s.as_tensor())?;
        }
        Ok(())
    }
}
