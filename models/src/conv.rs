//! 2D convolution as im2col + one GEMM on channel-major ("CNHW") activations.
//!
//! Candle's own CPU conv2d is slow (especially its backward), so [`Conv2d::forward_cnhw`] lowers the
//! convolution to a custom im2col op (whose backward is a col2im op) followed by a single matmul
//! `W[O, C·k·k] × col[C·k·k, N·Ho·Wo]`, which yields the output directly in `[O, N, Ho, Wo]`.
//! Both ops are parallel over disjoint output chunks on Candle's CPU workers, so they are
//! deterministic.

use candle_core::{CpuStorage, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::for_each_chunk_mut;

use crate::util::{contiguous_slice, Float};

/// Geometry of a square-kernel convolution on a `[C, N, H, W]` input.
#[derive(Debug, Clone, Copy)]
struct Geom {
    c: usize,
    n: usize,
    h: usize,
    w: usize,
    k: usize,
    stride: usize,
    pad: usize,
}

impl Geom {
    fn out_hw(&self) -> (usize, usize) {
        let ho = (self.h + 2 * self.pad - self.k) / self.stride + 1;
        let wo = (self.w + 2 * self.pad - self.k) / self.stride + 1;
        (ho, wo)
    }
    fn col_shape(&self) -> (usize, usize) {
        let (ho, wo) = self.out_hw();
        (self.c * self.k * self.k, self.n * ho * wo)
    }
}

fn im2col_kernel<T: Float>(g: Geom, x: &[T]) -> Vec<T> {
    let (ho, wo) = g.out_hw();
    let (rows, cols) = g.col_shape();
    let zero = T::from_f64(0.0);
    let mut out = vec![zero; rows * cols];
    let hw_out = ho * wo;
    // One chunk = one (row, image) pair: Ho·Wo contiguous outputs.
    for_each_chunk_mut(
        &mut out,
        hw_out.max(1),
        || (),
        |_, idx, dst| {
            let row = idx / g.n;
            let n = idx % g.n;
            let c = row / (g.k * g.k);
            let ki = (row / g.k) % g.k;
            let kj = row % g.k;
            let src = &x[(c * g.n + n) * g.h * g.w..][..g.h * g.w];
            for oh in 0..ho {
                let ih = (oh * g.stride + ki) as isize - g.pad as isize;
                let drow = &mut dst[oh * wo..][..wo];
                if ih < 0 || ih >= g.h as isize {
                    continue;
                }
                let srow = &src[ih as usize * g.w..][..g.w];
                for (ow, d) in drow.iter_mut().enumerate() {
                    let iw = (ow * g.stride + kj) as isize - g.pad as isize;
                    if iw >= 0 && iw < g.w as isize {
                        *d = srow[iw as usize];
                    }
                }
            }
        },
    );
    out
}

fn col2im_kernel<T: Float>(g: Geom, col: &[T]) -> Vec<T> {
    let (ho, wo) = g.out_hw();
    let (_, cols) = g.col_shape();
    let zero = T::from_f64(0.0);
    let mut out = vec![zero; g.c * g.n * g.h * g.w];
    let hw_out = ho * wo;
    // One chunk = one (channel, image) plane of the input gradient.
    for_each_chunk_mut(
        &mut out,
        (g.h * g.w).max(1),
        || (),
        |_, idx, dst| {
            let c = idx / g.n;
            let n = idx % g.n;
            for ki in 0..g.k {
                for kj in 0..g.k {
                    let row = (c * g.k + ki) * g.k + kj;
                    let src = &col[row * cols + n * hw_out..][..hw_out];
                    for oh in 0..ho {
                        let ih = (oh * g.stride + ki) as isize - g.pad as isize;
                        if ih < 0 || ih >= g.h as isize {
                            continue;
                        }
                        let drow = &mut dst[ih as usize * g.w..][..g.w];
                        let srow = &src[oh * wo..][..wo];
                        for (ow, &v) in srow.iter().enumerate() {
                            let iw = (ow * g.stride + kj) as isize - g.pad as isize;
                            if iw >= 0 && iw < g.w as isize {
                                drow[iw as usize] += v;
                            }
                        }
                    }
                }
            }
        },
    );
    out
}

/// im2col: `[C, N, H, W]` → `[C·k·k, N·Ho·Wo]`.
struct Im2Col(Geom);
/// col2im (adjoint of im2col): `[C·k·k, N·Ho·Wo]` → `[C, N, H, W]`.
struct Col2Im(Geom);

impl candle_core::CustomOp1 for Im2Col {
    fn name(&self) -> &'static str {
        "ssl-im2col"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = self.0;
        let shape = Shape::from(g.col_shape());
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(im2col_kernel(g, contiguous_slice(s, l)?)),
            CpuStorage::F64(_) => CpuStorage::F64(im2col_kernel(g, contiguous_slice(s, l)?)),
            _ => candle_core::bail!("im2col supports f32 and f64 only"),
        };
        Ok((out, shape))
    }
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(Col2Im(self.0))?))
    }
}

impl candle_core::CustomOp1 for Col2Im {
    fn name(&self) -> &'static str {
        "ssl-col2im"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = self.0;
        let shape = Shape::from((g.c, g.n, g.h, g.w));
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(col2im_kernel(g, contiguous_slice(s, l)?)),
            CpuStorage::F64(_) => CpuStorage::F64(col2im_kernel(g, contiguous_slice(s, l)?)),
            _ => candle_core::bail!("col2im supports f32 and f64 only"),
        };
        Ok((out, shape))
    }
    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.contiguous()?.apply_op1(Im2Col(self.0))?))
    }
}

/// A 2D convolution with a square kernel, weight `[O, C, k, k]` (key `weight`), optional `bias`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor,
    bias: Option<Tensor>,
    kernel: usize,
    stride: usize,
    padding: usize,
}

/// Builds a [`Conv2d`] with PyTorch's default initialisation (Uniform ±1/√fan_in for weight and bias).
pub fn conv2d(
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    bias: bool,
    vb: VarBuilder,
) -> Result<Conv2d> {
    let bound = 1.0 / ((c_in * kernel * kernel) as f64).sqrt();
    let init = Init::Uniform {
        lo: -bound,
        up: bound,
    };
    let weight = vb.get_with_hints((c_out, c_in, kernel, kernel), "weight", init)?;
    let bias = if bias {
        Some(vb.get_with_hints(c_out, "bias", init)?)
    } else {
        None
    };
    Conv2d::new(weight, bias, stride, padding)
}

impl Conv2d {
    /// Wraps existing tensors; `weight` must be `[O, C, k, k]` with a square kernel.
    pub fn new(
        weight: Tensor,
        bias: Option<Tensor>,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        let (_, _, kh, kw) = weight.dims4()?;
        if kh != kw {
            candle_core::bail!("Conv2d supports square kernels only, got {kh}x{kw}");
        }
        if stride == 0 {
            candle_core::bail!("Conv2d stride must be positive");
        }
        Ok(Self {
            weight,
            bias,
            kernel: kh,
            stride,
            padding,
        })
    }

    /// The weight `[O, C, k, k]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias `[O]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Convolution of a channel-major input `[C, N, H, W]`, giving `[O, N, Ho, Wo]`.
    pub fn forward_cnhw(&self, x: &Tensor) -> Result<Tensor> {
        let (c, n, h, w) = x.dims4()?;
        let (o, wc, _, _) = self.weight.dims4()?;
        if wc != c {
            candle_core::bail!("Conv2d expects {wc} input channels, got {c}");
        }
        if h + 2 * self.padding < self.kernel || w + 2 * self.padding < self.kernel {
            candle_core::bail!("Conv2d input {h}x{w} smaller than the kernel");
        }
        let g = Geom {
            c,
            n,
            h,
            w,
            k: self.kernel,
            stride: self.stride,
            pad: self.padding,
        };
        let (ho, wo) = g.out_hw();
        let x = match x.dtype() {
            DType::F32 | DType::F64 => x.contiguous()?,
            _ => x.to_dtype(DType::F32)?.contiguous()?,
        };
        let col = x.apply_op1(Im2Col(g))?;
        let wm = self.weight.reshape((o, c * self.kernel * self.kernel))?;
        let y = ssl_linalg::matmul(&wm, &col)?.reshape((o, n, ho, wo))?;
        match &self.bias {
            Some(b) => y.broadcast_add(&b.reshape((o, 1, 1, 1))?),
            None => Ok(y),
        }
    }
}

impl Module for Conv2d {
    /// Convolution of a batch-major input `[N, C, H, W]`, giving `[N, O, Ho, Wo]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_cnhw(&x.transpose(0, 1)?)?
            .transpose(0, 1)?
            .contiguous()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{finite_diff, max_abs_diff, rand_tensor};
    use candle_core::Var;

    const CASES: [(usize, usize); 4] = [(1, 0), (1, 1), (2, 0), (2, 1)];

    #[test]
    fn forward_matches_candle_conv2d() {
        for (stride, pad) in CASES {
            let x = rand_tensor(1, &[2, 3, 7, 8], DType::F32);
            let w = rand_tensor(2, &[4, 3, 3, 3], DType::F32);
            let b = rand_tensor(3, &[4], DType::F32);
            let conv = Conv2d::new(w.clone(), Some(b.clone()), stride, pad).unwrap();
            let ours = conv.forward(&x).unwrap();
            let reference = x
                .conv2d(&w, pad, stride, 1, 1)
                .unwrap()
                .broadcast_add(&b.reshape((1, 4, 1, 1)).unwrap())
                .unwrap();
            assert_eq!(ours.dims(), reference.dims());
            let d = max_abs_diff(&ours, &reference);
            assert!(d < 1e-5, "stride {stride} pad {pad}: diff {d}");
            // Channel-major entry point gives the transposed result.
            let cm = conv
                .forward_cnhw(&x.transpose(0, 1).unwrap())
                .unwrap()
                .transpose(0, 1)
                .unwrap();
            assert!(max_abs_diff(&cm, &reference) < 1e-5);
        }
    }

    #[test]
    fn gradients_match_candle_conv2d() {
        for (stride, pad) in CASES {
            // Sizes with (H + 2p - k) % s == 0: candle's own conv2d backward mis-shapes the rest.
            let x = Var::from_tensor(&rand_tensor(4, &[3, 2, 7, 9], DType::F32)).unwrap();
            let w = Var::from_tensor(&rand_tensor(5, &[5, 2, 3, 3], DType::F32)).unwrap();
            let b = Var::from_tensor(&rand_tensor(6, &[5], DType::F32)).unwrap();
            let conv = Conv2d::new(
                w.as_tensor().clone(),
                Some(b.as_tensor().clone()),
                stride,
                pad,
            )
            .unwrap();
            let y = conv.forward(x.as_tensor()).unwrap();
            let r = rand_tensor(7, y.dims(), DType::F32);
            let g = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            let yr = x
                .as_tensor()
                .conv2d(w.as_tensor(), pad, stride, 1, 1)
                .unwrap()
                .broadcast_add(&b.as_tensor().reshape((1, 5, 1, 1)).unwrap())
                .unwrap();
            let gr = (&yr * &r).unwrap().sum_all().unwrap().backward().unwrap();
            for v in [&x, &w, &b] {
                let d = max_abs_diff(g.get(v).unwrap(), gr.get(v).unwrap());
                assert!(d < 1e-4, "stride {stride} pad {pad}: grad diff {d}");
            }
        }
    }

    #[test]
    fn gradients_match_finite_differences_f64() {
        for (stride, pad) in CASES {
            let x0 = rand_tensor(8, &[2, 2, 5, 5], DType::F64);
            let w0 = rand_tensor(9, &[3, 2, 3, 3], DType::F64);
            let shape_y = {
                let c = Conv2d::new(w0.clone(), None, stride, pad).unwrap();
                c.forward_cnhw(&x0).unwrap().dims().to_vec()
            };
            let r = rand_tensor(10, &shape_y, DType::F64);
            let loss = |x: &Tensor, w: &Tensor| -> Tensor {
                let c = Conv2d::new(w.clone(), None, stride, pad).unwrap();
                (c.forward_cnhw(x).unwrap() * &r)
                    .unwrap()
                    .sum_all()
                    .unwrap()
            };
            let x = Var::from_tensor(&x0).unwrap();
            let w = Var::from_tensor(&w0).unwrap();
            let g = loss(x.as_tensor(), w.as_tensor()).backward().unwrap();
            let gx: Vec<f64> = g.get(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let gw: Vec<f64> = g.get(&w).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for i in (0..gx.len()).step_by(7) {
                let fd = finite_diff(&x0, i, &|xp| loss(xp, &w0).to_scalar::<f64>().unwrap());
                assert!((fd - gx[i]).abs() < 1e-6, "dx[{i}]: {fd} vs {}", gx[i]);
            }
            for (i, &gwi) in gw.iter().enumerate() {
                let fd = finite_diff(&w0, i, &|wp| loss(&x0, wp).to_scalar::<f64>().unwrap());
                assert!((fd - gwi).abs() < 1e-6, "dw[{i}]: {fd} vs {gwi}");
            }
        }
    }

    #[test]
    fn init_is_pytorch_uniform() {
        let store = ssl_core::ParamStore::new(0);
        let vb = store.var_builder(&candle_core::Device::Cpu);
        let c = conv2d(8, 16, 3, 1, 1, true, vb.pp("c")).unwrap();
        assert_eq!(c.weight().dims(), &[16, 8, 3, 3]);
        let bound = 1.0 / 72f64.sqrt();
        let w: Vec<f32> = c.weight().flatten_all().unwrap().to_vec1().unwrap();
        assert!(w.iter().all(|v| (*v as f64).abs() <= bound + 1e-6));
        assert!(w.iter().any(|v| (*v as f64).abs() > bound * 0.5));
        assert!(c.bias().is_some());
        let names: Vec<String> = store.vars().into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, vec!["c.bias".to_string(), "c.weight".to_string()]);
    }
}
