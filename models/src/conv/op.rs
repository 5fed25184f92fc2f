//! The convolution as a Candle custom op on the CPU ([`ConvOp`]) and its two gradients, each an
//! op of its own ([`ConvBwd`]).

use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};

use super::backward::{input_grad, weight_grad};
use super::forward::conv_forward;
use super::geom::Geom;
use crate::util::{contiguous_slice, written_whole, Float};

/// The convolution `x`: `[C, N, D, H, W]`, `W`: `[O, C·k_vol]` → `[O, N·S_out]` as one op,
/// whose backward ([`ConvBwd`]) recomputes the columns instead of keeping them.
pub(super) struct ConvOp(pub(super) Geom);

/// One gradient of [`ConvOp`] from inputs (x, W, dy): `dx` or `dW`, each an op of its own so
/// that each is a buffer of its own (a parameter's gradient lives until the optimiser step).
/// An input that tracks no gradient (the images entering the stem) gets no `dx`: it costs as
/// much as the forward.
struct ConvBwd {
    geom: Geom,
    of: Operand,
}

/// Which gradient a [`ConvBwd`] computes.
#[derive(Clone, Copy)]
enum Operand {
    Input,
    Weight,
}

impl candle_core::CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "ssl-conv"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, o) = (self.0, l2.dims()[0]);
        let y = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(conv_forward(
                g,
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                o,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(conv_forward(
                g,
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                o,
            )),
            _ => {
                candle_core::bail!("the convolution takes f32 or f64 input and weight of one dtype")
            }
        };
        Ok((y, Shape::from((o, g.col_shape().1))))
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let of = |of| ConvBwd { geom: self.0, of };
        let dx = match x.track_op() {
            true => Some(x.apply_op3_no_bwd(w, &grad, &of(Operand::Input))?),
            false => None,
        };
        let dw = x.apply_op3_no_bwd(w, &grad, &of(Operand::Weight))?;
        Ok((dx, Some(dw)))
    }
}

impl candle_core::CustomOp3 for ConvBwd {
    fn name(&self) -> &'static str {
        "ssl-conv-bwd"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        type Arg<'a> = (&'a CpuStorage, &'a Layout);
        fn grad<T: Float>(op: &ConvBwd, [x, w, dy]: [Arg; 3]) -> Result<Vec<T>> {
            let (g, o) = (op.geom, w.1.dims()[0]);
            let (w, dy) = (contiguous_slice(w.0, w.1)?, contiguous_slice(dy.0, dy.1)?);
            Ok(match op.of {
                Operand::Input => input_grad(g, x.1.shape().elem_count(), w, dy, o),
                // SAFETY: weight_grad writes every value of `dW` and reads none.
                Operand::Weight => unsafe {
                    let x = contiguous_slice(x.0, x.1)?;
                    written_whole(w.len(), |dw| weight_grad(g, x, dy, dw))
                },
            })
        }
        let args = [(s1, l1), (s2, l2), (s3, l3)];
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(grad(self, args)?),
            CpuStorage::F64(_) => CpuStorage::F64(grad(self, args)?),
            _ => candle_core::bail!("the convolution supports f32 and f64 only"),
        };
        let shape = match self.of {
            Operand::Input => l1.shape(),
            Operand::Weight => l2.shape(),
        };
        Ok((out, shape.clone()))
    }
}
