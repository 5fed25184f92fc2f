//! The CARP head (spec `docs/spec/objectives.md` §1.4), keyed like the reference `CARPHead` with
//! batch norm: `mlp` (`nn.Sequential` Linear → BatchNorm1d → GELU, Linear → BatchNorm1d → GELU,
//! Linear to the bottleneck; no L2 normalisation) → `prototypes`, a bias-free weight-normalised
//! linear map to `K` prototypes whose gain `weight_g` is fixed at 1, so only its direction
//! `prototypes.weight_v` `[K, bottleneck]` is stored:
//!
//! `logits = mlp(x) · normalize_rows(V)ᵀ`.

use anyhow::{ensure, Result};
use candle_core::{Module, Tensor, Var};
use candle_nn::{Init, Linear, VarBuilder};
use ssl_linalg::normalize_rows;
use ssl_models::BatchNorm;

/// Linear layers of the head's MLP (the last one maps to the bottleneck).
pub const HEAD_LAYERS: usize = 3;

/// Layer sizes of a [`CarpHead`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadShape {
    /// Input width (the backbone's feature width `F`).
    pub in_dim: usize,
    /// Width of the two hidden layers (2048).
    pub hidden: usize,
    /// Width of the MLP output (256).
    pub bottleneck: usize,
    /// Number of prototypes `K` (65 536).
    pub prototypes: usize,
}

/// One hidden block `GELU(BN(W x + b))`.
struct Hidden {
    linear: Linear,
    bn: BatchNorm,
}

/// The head: MLP → weight-normalised prototypes (gain 1).
pub struct CarpHead {
    hidden: Vec<Hidden>,
    bottleneck: Linear,
    /// `prototypes.weight_v`, `[K, bottleneck]`; only its row directions matter.
    weight_v: Var,
    /// Every trainable parameter (not the batch-norm running statistics) in creation order,
    /// named relative to the head.
    params: Vec<(String, Var)>,
}

/// A parameter created through `vb` as a variable, so that `Var::set` reaches the copy the
/// checkpoints save.
fn param(vb: &VarBuilder, dims: &[usize], name: &str, init: Init) -> Result<Var> {
    let t = vb.get_with_hints(dims, name, init)?;
    ensure!(
        t.is_variable(),
        "the CARP head needs a VarBuilder that hands out variables (a ParamStore or VarMap) to \
         update its EMA teacher in place; `{name}` is a constant"
    );
    Ok(Var::from_tensor(&t)?)
}

/// Linear `i → o` at `mlp.{index}`: weight `N(0, 0.02²)` (the reference's truncated normal,
/// whose ±2 cut-off is 100 standard deviations away), zero bias; both recorded in `params`.
fn linear(
    mlp: &VarBuilder,
    index: usize,
    (i, o): (usize, usize),
    params: &mut Vec<(String, Var)>,
) -> Result<Linear> {
    let vb = mlp.pp(index.to_string());
    let normal = Init::Randn {
        mean: 0.0,
        stdev: 0.02,
    };
    let w = param(&vb, &[o, i], "weight", normal)?;
    let b = param(&vb, &[o], "bias", Init::Const(0.0))?;
    let layer = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
    params.push((format!("mlp.{index}.weight"), w));
    params.push((format!("mlp.{index}.bias"), b));
    Ok(layer)
}

impl CarpHead {
    /// Creates the head under `vb` (`mlp.0`, `mlp.1` (BN), `mlp.3`, `mlp.4` (BN), `mlp.6`,
    /// `prototypes.weight_v`), initialised as the reference: MLP Linear weights `N(0, 0.02²)`
    /// with zero biases, batch norm weight 1 and bias 0, `weight_v` PyTorch's Linear default
    /// `U(±1/√bottleneck)`.
    pub fn new(shape: HeadShape, vb: VarBuilder) -> Result<Self> {
        ensure!(
            shape.in_dim >= 1
                && shape.hidden >= 1
                && shape.bottleneck >= 1
                && shape.prototypes >= 1,
            "every width of the CARP head must be ≥ 1, got {shape:?}"
        );
        let mut params = Vec::new();
        let mlp = vb.pp("mlp");
        let mut hidden = Vec::new();
        let mut width = shape.in_dim;
        for block in 0..HEAD_LAYERS - 1 {
            let index = 3 * block;
            let layer = linear(&mlp, index, (width, shape.hidden), &mut params)?;
            let bvb = mlp.pp((index + 1).to_string());
            let bn = ssl_models::batch_norm::batch_norm(shape.hidden, bvb.clone())?;
            for (name, init) in [("weight", 1.0), ("bias", 0.0)] {
                let var = param(&bvb, &[shape.hidden], name, Init::Const(init))?;
                params.push((format!("mlp.{}.{name}", index + 1), var));
            }
            hidden.push(Hidden { linear: layer, bn });
            width = shape.hidden;
        }
        let index = 3 * (HEAD_LAYERS - 1);
        let bottleneck = linear(&mlp, index, (width, shape.bottleneck), &mut params)?;
        let bound = 1.0 / (shape.bottleneck as f64).sqrt();
        let weight_v = param(
            &vb.pp("prototypes"),
            &[shape.prototypes, shape.bottleneck],
            "weight_v",
            Init::Uniform {
                lo: -bound,
                up: bound,
            },
        )?;
        params.push(("prototypes.weight_v".into(), weight_v.clone()));
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
    /// weight-normalised layer with gain 1.
    pub fn prototypes(&self) -> candle_core::Result<Tensor> {
        normalize_rows(self.weight_v.as_tensor())
    }

    /// The bottleneck embedding `mlp(x)`: `x` `[N, F]` → `[N, bottleneck]`. `train` selects
    /// batch statistics in the batch norms (needs `N ≥ 2`).
    pub fn embed(&self, x: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for block in &self.hidden {
            let z = block.linear.forward(&h)?;
            h = block.bn.forward_rows(&z, false, train)?.gelu_erf()?;
        }
        self.bottleneck.forward(&h)
    }

    /// Logits `mlp(x) · normalize_rows(V)ᵀ`: `x` `[N, F]` → `[N, K]`; with a `partition`
    /// (`[M]` u32 prototype indices) only those prototypes, in that order: `[N, M]`, the
    /// columns `index_select`ed from the full logits without computing the others.
    pub fn forward(
        &self,
        x: &Tensor,
        train: bool,
        partition: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let v = match partition {
            Some(index) => self.weight_v.as_tensor().index_select(index, 0)?,
            None => self.weight_v.as_tensor().clone(),
        };
        self.embed(x, train)?.matmul(&normalize_rows(&v)?.t()?)
    }

    /// [`CarpHead::forward`] of every view at once: `x` `[V, B, F]` → `[V, B, K]` (or
    /// `[V, B, M]`). The reference concatenates the crops before the head, so batch norm sees
    /// all `V·B` rows.
    pub fn forward_views(
        &self,
        x: &Tensor,
        train: bool,
        partition: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (v, b, f) = x.dims3()?;
        let logits = self.forward(&x.reshape((v * b, f))?, train, partition)?;
        logits.reshape((v, b, ()))
    }

    /// `θ_self ← m·θ_self + (1 − m)·θ_student` for every parameter (spec §3; batch-norm running
    /// statistics are left to this head's own forward passes, as in the reference).
    pub fn ema_from(&self, student: &CarpHead, momentum: f64) -> Result<()> {
        ssl_core::ema_update(&self.params, &student.params, momentum)
    }

    /// Copies every parameter of `student` into this head (the teacher's start).
    pub fn copy_from(&self, student: &CarpHead) -> Result<()> {
        for (t, s) in ssl_core::paired_parameters(&self.params, &student.params)? {
            t.set(s.as_tensor())?;
        }
        Ok(())
    }
}
