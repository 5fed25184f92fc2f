use candle_core::{Device, Var};

use super::backward::{
    flipped_transpose, im2col_weight_grad, input_grad_patches, patch_weight_grad,
    row_block_weight_grad, stem_weight_grad, WEIGHT_GRAD_BLOCKS, WEIGHT_GRAD_GROUPS,
};
use super::forward::{conv_forward, im2col_forward_into};
use super::geom::{balanced_chunks, chunk_images, CHUNK_VALUES};
use super::im2col::{channels_last, im2col_chunk, im2row, Copying, PhaseRows};
use super::skinny::{skinny_forward_into, skinny_input_grad, skinny_weight_grad};
use super::winograd::{Minimal, Winograd};
use super::*;
use crate::util::testing::{finite_diff, max_abs_diff, rand_tensor};

const CASES: [(usize, usize); 4] = [(1, 0), (1, 1), (2, 0), (2, 1)];

#[test]
fn forward_2d_matches_candle_conv2d() {
    for (stride, pad) in CASES {
        let x = rand_tensor(1, &[2, 3, 7, 8], DType::F32);
        let w = rand_tensor(2, &[4, 3, 3, 3], DType::F32);
        let b = rand_tensor(3, &[4], DType::F32);
        let conv = Conv::new(w.clone(), Some(b.clone()), stride, pad).unwrap();
        let ours = conv.forward(&x).unwrap();
        let reference = x
            .conv2d(&w, pad, stride, 1, 1)
            .unwrap()
            .broadcast_add(&b.reshape((1, 4, 1, 1)).unwrap())
            .unwrap();
        assert_eq!(ours.dims(), reference.dims());
        let d = max_abs_diff(&ours, &reference);
        assert!(d < 1e-5, "stride {stride} pad {pad}: diff {d}");
    }
}

#[test]
fn gradients_2d_match_candle_conv2d() {
    for (stride, pad) in CASES {
        // Sizes with (H + 2p - k) % s == 0: candle's own conv2d backward mis-shapes the rest.
        let x = Var::from_tensor(&rand_tensor(4, &[3, 2, 7, 9], DType::F32)).unwrap();
        let w = Var::from_tensor(&rand_tensor(5, &[5, 2, 3, 3], DType::F32)).unwrap();
        let b = Var::from_tensor(&rand_tensor(6, &[5], DType::F32)).unwrap();
        let conv = Conv::new(
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

/// A direct 3D convolution of `x`: `[N, C, D, H, W]` with `w`: `[O, C, k, k, k]` (f64 loops).
fn conv3d_reference(x: &Tensor, w: &Tensor, stride: usize, pad: usize) -> Tensor {
    let (n, c, d, h, wd) = x.dims5().unwrap();
    let (o, _, k, _, _) = w.dims5().unwrap();
    let xv: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
    let wv: Vec<f64> = w.flatten_all().unwrap().to_vec1().unwrap();
    let out = |s: usize| (s + 2 * pad - k) / stride + 1;
    let (od, oh, ow) = (out(d), out(h), out(wd));
    let mut y = vec![0.0; n * o * od * oh * ow];
    let at = |i: usize, p: usize, s: usize| (i * stride + p).checked_sub(pad).filter(|&v| v < s);
    for ni in 0..n {
        for oi in 0..o {
            for (zi, yi, xi) in
                (0..od).flat_map(|z| (0..oh).flat_map(move |y| (0..ow).map(move |x| (z, y, x))))
            {
                let mut acc = 0.0;
                for ci in 0..c {
                    for (a, b, e) in (0..k)
                        .flat_map(|a| (0..k).flat_map(move |b| (0..k).map(move |e| (a, b, e))))
                    {
                        if let (Some(iz), Some(iy), Some(ix)) =
                            (at(zi, a, d), at(yi, b, h), at(xi, e, wd))
                        {
                            acc += xv[(((ni * c + ci) * d + iz) * h + iy) * wd + ix]
                                * wv[(((oi * c + ci) * k + a) * k + b) * k + e];
                        }
                    }
                }
                y[(((ni * o + oi) * od + zi) * oh + yi) * ow + xi] = acc;
            }
        }
    }
    Tensor::from_vec(y, (n, o, od, oh, ow), &Device::Cpu).unwrap()
}

/// (kernel, stride, padding) of the 3D ResNet: stem, 3×3×3 convolutions, 1×1×1 projections.
const CASES_3D: [(usize, usize, usize); 6] = [
    (7, 2, 3),
    (3, 1, 1),
    (3, 2, 1),
    (1, 2, 0),
    (1, 1, 0),
    (2, 3, 0),
];

#[test]
fn forward_3d_matches_a_direct_convolution() {
    for (k, stride, pad) in CASES_3D {
        let x = rand_tensor(11, &[2, 3, 5, 6, 7], DType::F64);
        let w = rand_tensor(12, &[4, 3, k, k, k], DType::F64);
        let b = rand_tensor(13, &[4], DType::F64);
        let conv = Conv::new(w.clone(), Some(b.clone()), stride, pad).unwrap();
        assert_eq!(conv.spatial_rank(), 3);
        let ours = conv.forward(&x).unwrap();
        let reference = conv3d_reference(&x, &w, stride, pad)
            .broadcast_add(&b.reshape((1, 4, 1, 1, 1)).unwrap())
            .unwrap();
        assert_eq!(ours.dims(), reference.dims(), "k {k} s {stride} p {pad}");
        let d = max_abs_diff(&ours, &reference);
        assert!(d < 1e-12, "k {k} s {stride} p {pad}: diff {d}");
    }
}

#[test]
fn gradients_3d_match_finite_differences() {
    for (k, stride, pad) in CASES_3D {
        let x0 = rand_tensor(14, &[2, 2, 4, 5, 4], DType::F64);
        let w0 = rand_tensor(15, &[3, 2, k, k, k], DType::F64);
        let shape_y = Conv::new(w0.clone(), None, stride, pad)
            .unwrap()
            .forward(&x0)
            .unwrap()
            .dims()
            .to_vec();
        let r = rand_tensor(16, &shape_y, DType::F64);
        let loss = |x: &Tensor, w: &Tensor| -> Tensor {
            let c = Conv::new(w.clone(), None, stride, pad).unwrap();
            (c.forward(x).unwrap() * &r).unwrap().sum_all().unwrap()
        };
        let x = Var::from_tensor(&x0).unwrap();
        let w = Var::from_tensor(&w0).unwrap();
        let g = loss(x.as_tensor(), w.as_tensor()).backward().unwrap();
        let gx: Vec<f64> = g.get(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let gw: Vec<f64> = g.get(&w).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        for i in (0..gx.len()).step_by(5) {
            let fd = finite_diff(&x0, i, &|xp| loss(xp, &w0).to_scalar::<f64>().unwrap());
            assert!(
                (fd - gx[i]).abs() < 1e-6,
                "k {k}: dx[{i}]: {fd} vs {}",
                gx[i]
            );
        }
        for i in (0..gw.len()).step_by(7) {
            let fd = finite_diff(&w0, i, &|wp| loss(&x0, wp).to_scalar::<f64>().unwrap());
            assert!(
                (fd - gw[i]).abs() < 1e-6,
                "k {k}: dw[{i}]: {fd} vs {}",
                gw[i]
            );
        }
    }
}

#[test]
fn gradients_2d_match_finite_differences_f64() {
    for (stride, pad) in CASES {
        let x0 = rand_tensor(8, &[2, 2, 5, 5], DType::F64);
        let w0 = rand_tensor(9, &[3, 2, 3, 3], DType::F64);
        let shape_y = {
            let c = Conv::new(w0.clone(), None, stride, pad).unwrap();
            c.forward_channel_major(&x0).unwrap().dims().to_vec()
        };
        let r = rand_tensor(10, &shape_y, DType::F64);
        let loss = |x: &Tensor, w: &Tensor| -> Tensor {
            let c = Conv::new(w.clone(), None, stride, pad).unwrap();
            (c.forward_channel_major(x).unwrap() * &r)
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

/// The chunked op against the composed convolution of other devices (gathered columns, one
/// matmul, Candle's autograd), on batches that split into several chunks and weight-gradient
/// groups, including a last chunk that is shorter, on volumes narrow enough for im2col to
/// gather and wide enough for it to copy runs.
#[test]
fn the_chunked_op_equals_the_composed_convolution_of_other_devices() {
    for (k, stride, pad) in CASES_3D {
        for (n, width) in [(1, 6), (19, 6), (19, 23)] {
            let x = Var::from_tensor(&rand_tensor(17, &[2, n, 4, 5, width], DType::F64)).unwrap();
            let w = Var::from_tensor(&rand_tensor(18, &[3, 2 * k * k * k], DType::F64)).unwrap();
            let g = Geom::new("test", x.dims(), k, stride, pad).unwrap();
            assert!(n == 1 || g.chunks() >= WEIGHT_GRAD_GROUPS);
            let op = x.as_tensor().apply_op2(w.as_tensor(), ConvOp(g)).unwrap();
            let composed = w
                .as_tensor()
                .matmul(&im2col_composed(x.as_tensor(), g).unwrap())
                .unwrap();
            assert_eq!(op.dims(), composed.dims());
            assert!(
                max_abs_diff(&op, &composed) < 1e-12,
                "k {k} s {stride} p {pad} W {width}"
            );
            let r = rand_tensor(19, op.dims(), DType::F64);
            let g_op = (&op * &r).unwrap().sum_all().unwrap().backward().unwrap();
            let g_composed = (&composed * &r)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            for v in [&x, &w] {
                let d = max_abs_diff(g_op.get(v).unwrap(), g_composed.get(v).unwrap());
                assert!(
                    d < 1e-11,
                    "k {k} s {stride} p {pad} n {n} W {width}: gradient diff {d}"
                );
            }
        }
    }
}

#[test]
fn bad_shapes_are_clear_errors() {
    let w = rand_tensor(19, &[4, 3, 3, 3, 3], DType::F32);
    let conv = Conv::new(w, None, 1, 1).unwrap();
    let err = conv
        .forward_channel_major(&rand_tensor(20, &[3, 2, 8, 8], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(err.contains("[C, N, D, H, W]"), "{err}");
    let err = conv
        .forward_channel_major(&rand_tensor(20, &[2, 2, 4, 4, 4], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(err.contains("expects 3 input channels"), "{err}");
    assert!(Conv::new(rand_tensor(21, &[4, 3, 3, 2], DType::F32), None, 1, 0).is_err());
    assert!(Conv::new(rand_tensor(21, &[4, 3, 3], DType::F32), None, 1, 0).is_err());
}

#[test]
fn init_is_pytorch_uniform() {
    let store = ssl_core::ParamStore::new(0);
    let vb = store.var_builder(&Device::Cpu);
    let c = conv(8, 16, 2, 3, 1, 1, true, vb.pp("c")).unwrap();
    assert_eq!(c.weight().dims(), &[16, 8, 3, 3]);
    let bound = 1.0 / 72f64.sqrt();
    let w: Vec<f32> = c.weight().flatten_all().unwrap().to_vec1().unwrap();
    assert!(w.iter().all(|v| (*v as f64).abs() <= bound + 1e-6));
    assert!(w.iter().any(|v| (*v as f64).abs() > bound * 0.5));
    assert!(c.bias().is_some());
    let c3 = conv(2, 4, 3, 3, 1, 1, false, vb.pp("d")).unwrap();
    assert_eq!(c3.weight().dims(), &[4, 2, 3, 3, 3]);
    let names: Vec<String> = store.vars().into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, vec!["c.bias", "c.weight", "d.weight"]);
}

/// Under bf16 autocast the CPU convolution (the stem's: too few channels for Winograd) and its
/// gradients are the f64 ones of bf16-rounded operands — `x`, `W` and, in the backward, the
/// output gradient — up to f32 sums.
#[test]
fn bf16_autocast_convolves_the_rounded_operands() {
    use crate::autocast::{autocast, Precision};
    use candle_core::Var;
    let round = |t: &Tensor, dtype| t.to_dtype(DType::BF16).unwrap().to_dtype(dtype).unwrap();
    let x = Var::from_tensor(&rand_tensor(8, &[2, 3, 7, 8], DType::F32)).unwrap();
    let w = Var::from_tensor(&rand_tensor(9, &[4, 3, 3, 3], DType::F32)).unwrap();
    // An output gradient of bf16 values plus a part that the backward's rounding removes.
    let r = rand_tensor(10, &[2, 4, 7, 8], DType::F32);
    let r = (round(&r, DType::F32) + (r * 1e-4).unwrap()).unwrap();
    let full = Conv::new(w.as_tensor().clone(), None, 1, 1)
        .unwrap()
        .forward(&x)
        .unwrap();
    let (bf16, grads) = {
        let _bf16 = autocast(Precision::Bf16);
        let y = Conv::new(w.as_tensor().clone(), None, 1, 1)
            .unwrap()
            .forward(&x)
            .unwrap();
        let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
        (y, grads)
    };
    let (x64, w64) = (
        Var::from_tensor(&round(&x, DType::F64)).unwrap(),
        Var::from_tensor(&round(&w, DType::F64)).unwrap(),
    );
    let rounded = Conv::new(w64.as_tensor().clone(), None, 1, 1)
        .unwrap()
        .forward(&x64)
        .unwrap();
    let want = (&rounded * round(&r, DType::F64))
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(bf16.dtype(), DType::F32);
    assert!(max_abs_diff(&bf16, &rounded) < 1e-5);
    for (ours, reference) in [(&x, &x64), (&w, &w64)] {
        let (o, e) = (grads.get(ours).unwrap(), want.get(reference).unwrap());
        let d = max_abs_diff(o, e);
        assert!(d < 1e-4, "{:?}: {d}", ours.dims());
    }
    let error = max_abs_diff(&bf16, &full);
    assert!(error > 0.0 && error < 0.05, "bf16 vs f32: {error}");
}

/// A stride that passes the padded input's end: the window as large as the padded input is
/// still its only one, gathered whole (the composed gather slices `out·s` values per axis).
#[test]
fn the_composed_gather_takes_a_window_as_large_as_the_padded_input_at_any_stride() {
    for (size, k, stride, pad) in [(3, 3, 2, 0), (1, 3, 2, 1), (2, 4, 3, 1)] {
        let x = rand_tensor(21, &[2, 1, size, size, size], DType::F64);
        let g = Geom::new("test", x.dims(), k, stride, pad).unwrap();
        assert_eq!(g.out(), [1, 1, 1]);
        let windows = gather_windows(&x, g, f64::NAN).unwrap();
        assert_eq!(windows.dims(), [k * k * k, 2, 1, 1, 1, 1]);
        let padded: Vec<f64> = windows.flatten_all().unwrap().to_vec1().unwrap();
        let values: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
        for (r, pair) in padded.chunks(2).enumerate() {
            let [d, h, w] = g.offsets(r).map(|o| o as isize - pad as isize);
            let inside = [d, h, w].iter().all(|&i| (0..size as isize).contains(&i));
            for (c, &v) in pair.iter().enumerate() {
                match inside {
                    true => {
                        let i = ((c * size + d as usize) * size + h as usize) * size + w as usize;
                        assert_eq!(v, values[i], "size {size} k {k} s {stride} p {pad}");
                    }
                    false => assert!(v.is_nan(), "size {size} k {k}: padding is the fill"),
                }
            }
        }
    }
}

/// im2col writes every value of its rows (a copy or a padding zero), so a reused buffer's old
/// values never leak into the columns, whether its rows are packed or further apart.
#[test]
fn im2col_overwrites_a_reused_buffer() {
    for (k, stride, pad) in CASES_3D.into_iter().chain([(3, 1, 2), (1, 1, 1)]) {
        let x = rand_tensor(20, &[2, 3, 4, 5, 6], DType::F64);
        let g = Geom::new("test", x.dims(), k, stride, pad).unwrap();
        let (rows, cols) = g.col_shape();
        let values = x.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        let composed = im2col_composed(&x, g).unwrap();
        let expected = composed.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        for ld in [cols, cols + 7] {
            let mut col = vec![f64::NAN; rows * ld];
            let arranged = PhaseRows::of(&g).arrange(&values);
            im2col_chunk(&g, &arranged, (0, g.n), 0, (&mut col, ld));
            let written: Vec<f64> = col
                .chunks(ld)
                .flat_map(|row| &row[..cols])
                .copied()
                .collect();
            assert_eq!(written, expected, "k {k} s {stride} p {pad} ld {ld}");
        }
    }
}

/// A stride-1 input gradient computed as the convolution of `dy` with the flipped, transposed
/// kernel equals the scattered `col2im(Wᵀ·dy)` it replaces, for every padding it is used at.
#[test]
fn the_input_gradient_as_a_convolution_equals_the_patch_form() {
    for (k, pad) in [(3, 0), (3, 1), (3, 2), (2, 0), (2, 1), (7, 3)] {
        let x = rand_tensor(21, &[2, 3, 4, 5, 9], DType::F64);
        let g = Geom::new("test", x.dims(), k, 1, pad).unwrap();
        let o = 4;
        let w = rand_tensor(22, &[o, g.c * g.kernel_volume()], DType::F64);
        let dy = rand_tensor(23, &g.out_dims(o, 3), DType::F64);
        let [w, dy] = [w, dy].map(|t| t.flatten_all().unwrap().to_vec1::<f64>().unwrap());
        let dual = g
            .input_grad_geometry(o)
            .expect("stride 1, padding below the kernel");
        let as_convolution = conv_forward(dual, &dy, &flipped_transpose(&w, o, g), g.c);
        let through_patches = input_grad_patches(g, x.elem_count(), &w, &dy, o);
        let d = as_convolution
            .iter()
            .zip(&through_patches)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert_eq!(as_convolution.len(), through_patches.len());
        assert!(d < 1e-12, "k {k} p {pad}: diff {d}");
    }
    let g = Geom::new("test", &[2, 3, 5, 5], 3, 2, 1).unwrap();
    assert!(
        g.input_grad_geometry(4).is_none(),
        "a stride needs the patch form"
    );
}

/// An input that tracks no gradient (the images entering the stem) gets none, and the weight
/// gradient is the one it gets beside an input that does.
#[test]
fn an_untracked_input_gets_no_gradient_and_the_same_weight_gradient() {
    let x = rand_tensor(24, &[2, 3, 6, 7], DType::F64);
    let w = Var::from_tensor(&rand_tensor(25, &[4, 2, 3, 3], DType::F64)).unwrap();
    let r = rand_tensor(26, &[4, 3, 3, 4], DType::F64);
    let loss = |x: &Tensor| {
        let conv = Conv::new(w.as_tensor().clone(), None, 2, 1).unwrap();
        let y = conv.forward_channel_major(x).unwrap();
        (y * &r).unwrap().sum_all().unwrap().backward().unwrap()
    };
    let untracked = loss(&x);
    let x_var = Var::from_tensor(&x).unwrap();
    let tracked = loss(x_var.as_tensor());
    assert!(untracked.get(&x).is_none());
    assert!(tracked.get(x_var.as_tensor()).is_some());
    let d = max_abs_diff(untracked.get(&w).unwrap(), tracked.get(&w).unwrap());
    assert!(d < 1e-12, "weight gradient diff {d}");
}

/// `rand_tensor` as a flat vector of f64.
fn rand_values(seed: u64, shape: &[usize]) -> Vec<f64> {
    rand_tensor(seed, shape, DType::F64)
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

/// Stride-1 3×3 and 3×3×3 geometries with enough channels for Winograd: even and odd output
/// extents, extents that are not whole tiles of 4 or shorter than one, paddings 0 to 2,
/// batches that split into several chunks and weight-gradient groups with a shorter last one,
/// more channel pairs (67 × 18) than one block of the kernel transform takes, and input
/// channels (17, 67) past whole blocks of the weight gradient's last step. Each has
/// the 64 tiles of F(2, 3), F(4, 3) or both.
fn winograd_cases() -> Vec<(Vec<usize>, usize)> {
    vec![
        (vec![16, 8, 5, 6], 1),
        (vec![16, 8, 9, 10], 1),
        (vec![67, 16, 4, 4], 1),
        (vec![67, 64, 4, 4], 1),
        (vec![16, 19, 4, 4], 1),
        (vec![16, 67, 4, 4], 1),
        (vec![17, 11, 7, 5], 0),
        (vec![16, 40, 7, 6], 0),
        (vec![16, 8, 3, 8], 2),
        (vec![16, 16, 3, 8], 2),
        (vec![16, 64, 2, 2], 1),
        (vec![16, 64, 1, 1], 2),
        (vec![16, 6, 3, 4, 5], 1),
        (vec![16, 8, 5, 6, 7], 1),
        (vec![16, 32, 5, 3, 4], 0),
        (vec![16, 67, 2, 2, 2], 1),
        (vec![16, 40, 4, 4, 4], 1),
        (vec![16, 64, 1, 2, 1], 2),
    ]
}

/// F(4, 3) and F(2, 3), each where it has its 64 tiles.
fn winograd_variants(g: Geom, o: usize) -> Vec<Winograd> {
    let f43 = Minimal::new(g, o).map(Winograd::F43);
    [f43, Minimal::new(g, o).map(Winograd::F23)]
        .into_iter()
        .flatten()
        .collect()
}

#[test]
fn winograd_applies_to_stride_1_three_tap_kernels_with_enough_channels() {
    let fits = |dims: &[usize], k, s, p, o| {
        Winograd::new(Geom::new("test", dims, k, s, p).unwrap(), o).is_some()
    };
    assert!(fits(&[64, 8, 32, 32], 3, 1, 1, 64));
    assert!(fits(&[64, 8, 8, 8, 8], 3, 1, 1, 64));
    assert!(!fits(&[1, 8, 64, 64, 64], 7, 2, 3, 64), "the 3D stem");
    assert!(!fits(&[512, 4, 2, 2, 2], 3, 1, 1, 512), "4 tiles in all");
    assert!(!fits(&[64, 8, 32, 32], 3, 2, 1, 64), "stride 2");
    assert!(!fits(&[3, 8, 32, 32], 3, 1, 1, 64), "the stem's 3 channels");
    assert!(!fits(&[64, 8, 32, 32], 3, 1, 1, 8), "8 output channels");
    assert!(!fits(&[64, 8, 32, 32], 7, 1, 3, 64), "a 7×7 kernel");
    assert!(!fits(&[64, 8, 32, 32], 1, 1, 0, 64), "a 1×1 kernel");
}

/// Rows of a GEMM operand read down its columns (Winograd's transformed blocks, im2col's
/// columns in the weight gradient) start an odd number of cache lines apart (so a column of them
/// spreads over every L1 set), hold their `lane` values, and waste less than two lines.
#[test]
fn gemm_operand_rows_are_an_odd_number_of_cache_lines_apart() {
    for lane in [1, 15, 16, 17, 255, 256, 1024, 2048, 4096, 1000] {
        for (ld, per_line) in [
            (crate::util::row_stride::<f32>(lane), 16),
            (crate::util::row_stride::<f64>(lane), 8),
        ] {
            assert_eq!(ld % per_line, 0, "lane {lane}: whole lines");
            assert_eq!(
                (ld / per_line) % 2,
                1,
                "lane {lane}: an odd number of lines"
            );
            assert!(
                ld >= lane && ld < lane + 2 * per_line,
                "lane {lane}: stride {ld}"
            );
        }
    }
}

/// F(4, 3) and F(2, 3) compute the convolution im2col computes (f64, to rounding), its weight
/// gradient (each chunk by chunk and step by step), and through the dual convolution its input
/// gradient; on images and volumes, each of the two takes several of the cases.
#[test]
fn winograd_equals_im2col_forward_and_gradients() {
    let mut taken = [[0; 2]; 2];
    // Images and volumes each in a batch of several chunks (and weight-gradient groups) of
    // unequal sizes.
    let mut split = [false; 2];
    for (i, (dims, pad)) in winograd_cases().into_iter().enumerate() {
        let g = Geom::new("test", &dims, 3, 1, pad).unwrap();
        let o = 18;
        let variants = winograd_variants(g, o);
        assert!(!variants.is_empty(), "{dims:?}: a Winograd geometry");
        let seed = 40 + 3 * i as u64;
        let x = rand_values(seed, &dims);
        let w = rand_values(seed + 1, &[o, g.c * g.kernel_volume()]);
        let dy = rand_values(seed + 2, &g.out_dims(o, dims.len() - 2));
        let dual = g.input_grad_geometry(o).unwrap();
        let mut plain_y = vec![0.0; dy.len()];
        im2col_forward_into(g, &x, &w, &mut plain_y);
        let mut plain_dw = vec![0.0; w.len()];
        im2col_weight_grad(g, &x, &dy, &mut plain_dw);
        let plain_dx = input_grad_patches(g, x.len(), &w, &dy, o);
        for winograd in variants {
            let name = format!("{winograd:?}");
            taken[matches!(winograd, Winograd::F23(_)) as usize][dims.len() - 4] += 1;
            let chunks = match winograd {
                Winograd::F43(f) => f.chunks(o),
                Winograd::F23(f) => f.chunks(o),
            };
            split[dims.len() - 4] |= chunks > 1 && !g.n.is_multiple_of(chunks);
            // Chunk by chunk, and step by step as for few chunks, whatever this one has.
            for stepwise in [false, true] {
                let mut fast = vec![f64::NAN; dy.len()];
                match winograd {
                    Winograd::F43(f) => f.forward_by(&x, &w, &mut fast, stepwise),
                    Winograd::F23(f) => f.forward_by(&x, &w, &mut fast, stepwise),
                }
                let d = max_diff(&fast, &plain_y);
                let how = if stepwise {
                    "step by step"
                } else {
                    "by chunks"
                };
                assert!(
                    d < 1e-12,
                    "{name} {how}, {dims:?} p {pad}: forward diff {d}"
                );

                let mut fast = vec![f64::NAN; w.len()];
                match winograd {
                    Winograd::F43(f) => f.weight_grad_by(&x, &dy, &mut fast, stepwise),
                    Winograd::F23(f) => f.weight_grad_by(&x, &dy, &mut fast, stepwise),
                }
                let d = max_diff(&fast, &plain_dw);
                assert!(
                    d < 1e-11,
                    "{name} {how}, {dims:?} p {pad}: weight gradient diff {d}"
                );
            }

            let same = |d| match winograd {
                Winograd::F43(_) => Minimal::new(d, g.c).map(Winograd::F43),
                Winograd::F23(_) => Minimal::new(d, g.c).map(Winograd::F23),
            };
            // A padding-2 case's dual has fewer tiles, and may take the other algorithm.
            let dual_winograd = same(dual)
                .or_else(|| Winograd::new(dual, g.c))
                .expect("a Winograd dual");
            let mut fast = vec![f64::NAN; x.len()];
            dual_winograd.forward(&dy, &flipped_transpose(&w, o, g), &mut fast);
            let d = max_diff(&fast, &plain_dx);
            assert!(
                d < 1e-12,
                "{name}, {dims:?} p {pad}: input gradient diff {d}"
            );
        }
    }
    assert!(
        taken.iter().flatten().all(|&n| n >= 3),
        "cases taken {taken:?}"
    );
    assert_eq!(split, [true; 2], "images, volumes split into chunks");
}

/// In f32, F(2, 3) is as accurate as im2col on images and volumes, and F(4×4, 3×3) within 20×
/// it and 10⁻⁵ of the outputs' scale: all against the f64 convolution, at the depth of a ResNet
/// layer (576 products per output) and of a 3D ResNet layer (864).
#[test]
fn winograd_in_f32_is_about_as_accurate_as_im2col() {
    for (dims, c) in [(vec![64, 4, 16, 16], 64), (vec![32, 8, 8, 8, 8], 32)] {
        let g = Geom::new("test", &dims, 3, 1, 1).unwrap();
        let o = c;
        let x = rand_values(60, &dims);
        let w = rand_values(61, &[o, g.c * g.kernel_volume()]);
        let mut exact = vec![0.0; o * g.col_shape().1];
        im2col_forward_into(g, &x, &w, &mut exact);
        let [x32, w32] = [&x, &w].map(|v| v.iter().map(|&v| v as f32).collect::<Vec<_>>());
        let error = |y: &[f32]| {
            y.iter()
                .zip(&exact)
                .map(|(&a, &b)| (a as f64 - b).abs())
                .fold(0.0, f64::max)
        };
        let mut y = vec![f32::NAN; exact.len()];
        im2col_forward_into(g, &x32, &w32, &mut y);
        let im2col = error(&y);
        Minimal::<2, 4>::new(g, o)
            .unwrap()
            .forward(&x32, &w32, &mut y);
        let f23 = error(&y);
        assert!(
            f23 < 2.0 * im2col,
            "{dims:?}: F(2, 3) {f23:e}, im2col {im2col:e}"
        );
        let Some(Winograd::F43(f43)) = Winograd::new(g, o) else {
            assert_eq!(dims.len(), 5, "images take F(4, 3)");
            continue;
        };
        f43.forward(&x32, &w32, &mut y);
        let f43 = error(&y);
        let scale = exact.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(
            f43 < 20.0 * im2col && f43 < 1e-5 * scale,
            "{dims:?}: F(4, 3) {f43:e}, im2col {im2col:e}, outputs up to {scale}"
        );
    }
}

/// Images of at least 2×2 tiles of 4×4 outputs take F(4, 3); images of one such tile, and
/// volumes, take F(2, 3).
#[test]
fn winograd_takes_f43_on_images_of_several_tiles() {
    let winograd = |dims: &[usize]| Winograd::new(Geom::new("test", dims, 3, 1, 1).unwrap(), 64);
    assert!(matches!(winograd(&[64, 8, 32, 32]), Some(Winograd::F43(_))));
    assert!(matches!(winograd(&[64, 16, 5, 5]), Some(Winograd::F43(_))));
    assert!(matches!(winograd(&[64, 128, 4, 4]), Some(Winograd::F23(_))));
    assert!(matches!(
        winograd(&[64, 8, 16, 16, 16]),
        Some(Winograd::F23(_))
    ));
}

/// The convolution op of a Winograd geometry against the composed convolution of other
/// devices (f64), gradients of input and weight included.
#[test]
fn the_op_on_a_winograd_geometry_equals_the_composed_convolution() {
    for dims in [vec![16, 8, 5, 6], vec![16, 8, 3, 4, 3]] {
        let x = Var::from_tensor(&rand_tensor(62, &dims, DType::F64)).unwrap();
        let kv = 3usize.pow(dims.len() as u32 - 2);
        let w = Var::from_tensor(&rand_tensor(63, &[20, 16 * kv], DType::F64)).unwrap();
        let g = Geom::new("test", x.dims(), 3, 1, 1).unwrap();
        assert!(Winograd::new(g, 20).is_some());
        let op = x.as_tensor().apply_op2(w.as_tensor(), ConvOp(g)).unwrap();
        let volumes = x.as_tensor().reshape(g.size_5d()).unwrap();
        let composed = w
            .as_tensor()
            .matmul(&im2col_composed(&volumes, g).unwrap())
            .unwrap();
        assert!(max_abs_diff(&op, &composed) < 1e-12, "{dims:?}");
        let r = rand_tensor(64, op.dims(), DType::F64);
        let g_op = (&op * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let g_composed = (&composed * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for v in [&x, &w] {
            let d = max_abs_diff(g_op.get(v).unwrap(), g_composed.get(v).unwrap());
            assert!(d < 1e-11, "{dims:?}: gradient diff {d}");
        }
    }
}

/// The weight gradient shared out in blocks of column rows, each summed over several chunks of
/// images (the last one shorter), equals the one summed as partial sums over chunks of images,
/// and the one summed over chunks of patch rows; each gives an empty batch a zero gradient.
#[test]
fn the_three_weight_gradient_sums_agree() {
    type Sum = fn(Geom, &[f64], &[f64], &mut [f64]);
    let sums: [(&str, Sum); 3] = [
        ("row blocks", row_block_weight_grad),
        ("stem", stem_weight_grad),
        ("patches", patch_weight_grad),
    ];
    let dims = [8, 5, 200, 200];
    let g = Geom::new("test", &dims, 3, 1, 1).unwrap();
    let (rows, _) = g.col_shape();
    let per_image = g.out().iter().product::<usize>();
    let block_rows = rows / WEIGHT_GRAD_BLOCKS;
    let images_per_chunk = CHUNK_VALUES / (block_rows * per_image);
    assert!(
        (1..dims[1]).contains(&images_per_chunk) && dims[1] % images_per_chunk != 0,
        "several chunks per block, the last one shorter"
    );
    assert!(
        per_image % (CHUNK_VALUES / rows) != 0,
        "patch chunks end short"
    );
    let o = 4;
    let x = rand_values(70, &dims);
    let dy = rand_values(71, &g.out_dims(o, 2));
    let mut by_blocks = vec![f64::NAN; o * rows];
    row_block_weight_grad(g, &x, &dy, &mut by_blocks);
    for (name, sum) in &sums[1..] {
        let mut other = vec![f64::NAN; o * rows];
        sum(g, &x, &dy, &mut other);
        let d = max_diff(&by_blocks, &other);
        assert!(d < 1e-9, "{name}: diff {d}");
    }
    let empty = Geom::new("test", &[8, 0, 200, 200], 3, 1, 1).unwrap();
    for (name, sum) in sums {
        let mut none = vec![f64::NAN; o * rows];
        sum(empty, &[], &[], &mut none);
        assert!(none.iter().all(|&v| v == 0.0), "{name}");
    }
}

/// Patch rows are the transposed columns, their rows taken kernel offset by kernel offset,
/// for strides, paddings and kernels of a stem (7³ at stride 2) and of other layers, in 2D and
/// 3D, from a position inside an image on across the next image's positions.
#[test]
fn im2row_is_im2col_transposed() {
    for (dims, k, stride, pad) in [
        (vec![1, 2, 9, 8, 7], 7, 2, 3),
        (vec![3, 2, 7, 6], 3, 1, 1),
        (vec![2, 3, 5, 6, 4], 3, 2, 1),
        (vec![4, 2, 5, 5], 1, 2, 0),
    ] {
        let g = Geom::new("test", &dims, k, stride, pad).unwrap();
        let (rows, cols) = g.col_shape();
        let kv = g.kernel_volume();
        let x = rand_values(80, &dims);
        let mut col = vec![f64::NAN; rows * cols];
        im2col_chunk(
            &g,
            &PhaseRows::of(&g).arrange(&x),
            (0, g.n),
            0,
            (&mut col, cols),
        );
        let positions = cols / g.n / 3..cols;
        let ld = rows + 5;
        let mut patches = vec![f64::NAN; positions.len() * ld];
        im2row(
            &g,
            &channels_last(&g, &x),
            positions.clone(),
            (&mut patches, ld),
        );
        for (j, q) in positions.enumerate() {
            for r in 0..rows {
                let (c, offset) = (r / kv, r % kv);
                assert_eq!(
                    patches[j * ld + offset * g.c + c],
                    col[r * cols + q],
                    "{dims:?} k {k}: position {q}, row {r}"
                );
            }
        }
    }
}

/// Chunks cover the batch once, in order, their sizes within one image of each other; their
/// count is a multiple of 8 where every chunk keeps its fewest images, else as asked.
#[test]
fn chunks_are_balanced_over_the_batch() {
    for (n, per_chunk, min_images, expected) in [
        (128, 7, 1, 24),
        (128, 14, 4, 16),
        (128, 16, 1, 8),
        (128, 7, 6, 19),
        (5, 2, 1, 3),
        (1, 1, 1, 1),
        (0, 1, 1, 0),
    ] {
        let chunks = balanced_chunks(n, per_chunk, min_images);
        assert_eq!(chunks, expected, "{n} images, {per_chunk} a chunk");
        let sizes: Vec<_> = (0..chunks).map(|c| chunk_images(n, chunks, c)).collect();
        assert!(sizes.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(sizes.first().map_or(0, |r| r.start), 0);
        assert_eq!(sizes.last().map_or(0, |r| r.end), n);
        let (min, max) = sizes.iter().fold((usize::MAX, 0), |(lo, hi), r| {
            (lo.min(r.len()), hi.max(r.len()))
        });
        assert!(
            chunks == 0 || max - min <= 1,
            "{n} images: sizes {min}..={max}"
        );
        assert!(
            !chunks.is_multiple_of(8) || min >= min_images,
            "{n} images: {min} a chunk"
        );
    }
}

/// Every row of `W` values in the [`PhaseRows`] layout and back: `x[w]` lies at `offset(w)`,
/// and `add_into` restores the input, for widths the stride does and does not divide; a
/// 1-wide kernel keeps the input's layout and reads every `s`-th value.
#[test]
fn phase_rows_store_each_value_once_at_its_offset() {
    let pointwise = PhaseRows::runs(&Geom::new("test", &[2, 3, 4, 8], 1, 2, 0).unwrap());
    assert_eq!((pointwise.stride, pointwise.step), (1, 2));
    for (width, stride) in [(8, 2), (7, 2), (5, 3), (1, 2), (2, 3), (6, 1)] {
        let g = Geom::new("test", &[2, 3, 4, width], 3, stride, 1).unwrap();
        let phases = PhaseRows::runs(&g);
        assert_eq!((phases.stride, phases.step), (stride, 1));
        let x = rand_values(90, &[2, 3, 4, width]);
        let arranged = phases.arrange(&x);
        for (row, arranged_row) in x.chunks(width).zip(arranged.chunks(width)) {
            for (w, &value) in row.iter().enumerate() {
                assert_eq!(
                    arranged_row[phases.offset(w)],
                    value,
                    "W {width} s {stride}"
                );
            }
        }
        let mut back = vec![0.0; x.len()];
        phases.add_into(&arranged, &mut back);
        assert_eq!(back, x, "W {width} s {stride}");
    }
}

/// im2col gathers value by value from the input's own layout where the output rows are at
/// most 8 wide, and copies runs from the phase layout where they are wider.
#[test]
fn narrow_outputs_gather_and_wide_ones_copy_runs() {
    for (width, copying) in [
        (15, Copying::Gather),
        (16, Copying::Gather),
        (17, Copying::Runs),
    ] {
        let g = Geom::new("test", &[2, 3, 4, width], 3, 2, 1).unwrap();
        assert_eq!(g.copying(), copying, "W {width}");
        let phases = PhaseRows::of(&g);
        let expected = match copying {
            Copying::Gather => (1, 2),
            Copying::Runs => (2, 1),
        };
        assert_eq!((phases.stride, phases.step), expected, "W {width}");
    }
}

/// A skinny convolution (few output positions, a large `W`: the 3D ResNet's 2³ layers) takes
/// the products that read `W` in place, and they equal the chunked ones: the forward, the
/// input gradient and the weight gradient, for 2D and 3D kernels, strides and paddings, fewer
/// output channels than blocks, and an empty batch.
#[test]
fn skinny_products_equal_the_chunked_ones() {
    let deep = Geom::new("test", &[512, 4, 2, 2, 2], 3, 1, 1).unwrap();
    let wide = Geom::new("test", &[64, 4, 16, 16, 16], 3, 1, 1).unwrap();
    assert!(deep.skinny() && !wide.skinny());
    for (dims, k, stride, pad, o) in [
        (vec![6, 4, 2, 2, 2], 3, 1, 1, 10),
        (vec![5, 2, 4, 3, 5], 3, 2, 1, 3),
        (vec![2, 1, 7, 6, 5], 7, 2, 3, 4),
        (vec![7, 3, 4, 4], 3, 1, 1, 9),
        (vec![4, 2, 5, 6], 1, 2, 0, 6),
        (vec![3, 0, 4, 4], 3, 1, 1, 5),
    ] {
        let g = Geom::new("test", &dims, k, stride, pad).unwrap();
        assert!(g.skinny(), "{dims:?}");
        let (rows, cols) = g.col_shape();
        let x = rand_values(91, &dims);
        let w = rand_values(92, &[o, rows]);
        let dy = rand_values(93, &[o, cols]);
        let case = format!("{dims:?} k {k} s {stride} p {pad} o {o}");
        if cols == 0 {
            let mut dw = vec![f64::NAN; o * rows];
            skinny_weight_grad(g, &x, &dy, &mut dw);
            assert!(dw.iter().all(|&v| v == 0.0), "{case}");
            continue;
        }

        let (mut skinny, mut chunked) = (vec![f64::NAN; o * cols], vec![f64::NAN; o * cols]);
        skinny_forward_into(g, &x, &w, &mut skinny);
        im2col_forward_into(g, &x, &w, &mut chunked);
        assert!(max_diff(&skinny, &chunked) < 1e-12, "forward {case}");

        let mut skinny = vec![0.0; x.len()];
        skinny_input_grad(g, &w, &dy, &mut skinny);
        let chunked = input_grad_patches(g, x.len(), &w, &dy, o);
        assert!(max_diff(&skinny, &chunked) < 1e-12, "input gradient {case}");

        let (mut skinny, mut chunked) = (vec![f64::NAN; o * rows], vec![f64::NAN; o * rows]);
        skinny_weight_grad(g, &x, &dy, &mut skinny);
        im2col_weight_grad(g, &x, &dy, &mut chunked);
        assert!(
            max_diff(&skinny, &chunked) < 1e-12,
            "weight gradient {case}"
        );
    }
}
