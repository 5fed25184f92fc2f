use candle_core::{Device, Var};

use super::*;
use crate::util::testing::{finite_diff, max_abs_diff, rand_tensor};

/// Direct max pooling of `x`: `[C, N, *S]` (f64 loops over every window, −∞ outside).
fn reference(x: &Tensor, kernel: usize, stride: usize, pad: usize) -> Tensor {
    let dims = x.dims().to_vec();
    let spatial = &dims[2..];
    let out: Vec<usize> = spatial
        .iter()
        .map(|s| (s + 2 * pad - kernel) / stride + 1)
        .collect();
    let xv: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
    let volume: usize = spatial.iter().product();
    let per: usize = out.iter().product();
    let rank = spatial.len();
    let mut y = Vec::new();
    for plane in 0..dims[0] * dims[1] {
        for o in 0..per {
            let mut pos = vec![0; rank];
            let mut rest = o;
            for a in (0..rank).rev() {
                pos[a] = rest % out[a];
                rest /= out[a];
            }
            let mut best = f64::NEG_INFINITY;
            for k in 0..kernel.pow(rank as u32) {
                let mut flat = 0;
                let mut inside = true;
                let mut kr = k;
                let mut offs = vec![0; rank];
                for a in (0..rank).rev() {
                    offs[a] = kr % kernel;
                    kr /= kernel;
                }
                for a in 0..rank {
                    let i = (pos[a] * stride + offs[a]) as isize - pad as isize;
                    inside &= i >= 0 && (i as usize) < spatial[a];
                    flat = flat * spatial[a] + i.max(0) as usize;
                }
                if inside {
                    best = best.max(xv[plane * volume + flat]);
                }
            }
            y.push(best);
        }
    }
    let mut shape = dims[..2].to_vec();
    shape.extend(out);
    Tensor::from_vec(y, shape, &Device::Cpu).unwrap()
}

const CASES: [(usize, usize, usize); 4] = [(3, 2, 1), (2, 2, 0), (3, 1, 1), (3, 3, 0)];

#[test]
fn forward_matches_direct_pooling_in_2d_and_3d() {
    for shape in [vec![3, 2, 7, 6], vec![2, 2, 5, 6, 7]] {
        for (k, s, p) in CASES {
            let x = rand_tensor(1, &shape, DType::F64);
            let ours = max_pool_channel_major(&x, k, s, p).unwrap();
            let expected = reference(&x, k, s, p);
            assert_eq!(ours.dims(), expected.dims(), "{shape:?} k {k} s {s} p {p}");
            assert_eq!(max_abs_diff(&ours, &expected), 0.0);
        }
    }
}

#[test]
fn forward_matches_candle_max_pool2d_without_padding() {
    let x = rand_tensor(2, &[2, 3, 8, 6], DType::F32);
    let candle = x.max_pool2d_with_stride(2, 2).unwrap();
    let ours = max_pool_channel_major(&x.transpose(0, 1).unwrap(), 2, 2, 0)
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    assert_eq!(max_abs_diff(&ours, &candle), 0.0);
}

#[test]
fn gradients_match_finite_differences() {
    for shape in [vec![2, 2, 6, 5], vec![2, 1, 4, 5, 4]] {
        for (k, s, p) in CASES {
            // Distinct values (no ties) so the maximum is differentiable.
            let x0 = rand_tensor(3, &shape, DType::F64);
            let y_shape = max_pool_channel_major(&x0, k, s, p)
                .unwrap()
                .dims()
                .to_vec();
            let r = rand_tensor(4, &y_shape, DType::F64);
            let loss = |x: &Tensor| -> f64 {
                (max_pool_channel_major(x, k, s, p).unwrap() * &r)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            };
            let x = Var::from_tensor(&x0).unwrap();
            let g = (max_pool_channel_major(x.as_tensor(), k, s, p).unwrap() * &r)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let gx: Vec<f64> = g.get(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for (i, &gi) in gx.iter().enumerate() {
                let fd = finite_diff(&x0, i, &loss);
                assert!(
                    (fd - gi).abs() < 1e-6,
                    "{shape:?} k {k}: dx[{i}] {fd} vs {gi}"
                );
            }
        }
    }
}

#[test]
fn ties_send_the_gradient_to_the_first_maximum() {
    let x =
        Var::from_tensor(&Tensor::ones((1, 1, 2, 2), DType::F32, &Device::Cpu).unwrap()).unwrap();
    let y = max_pool_channel_major(x.as_tensor(), 2, 2, 0).unwrap();
    let g = y.sum_all().unwrap().backward().unwrap();
    let gx: Vec<f32> = g.get(&x).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(gx, vec![1.0, 0.0, 0.0, 0.0]);
}

/// The argmax of every window, by brute force in PyTorch's scan order (d, h, w): the first
/// maximum, or the last NaN.
fn reference_argmax(x: &[f64], g: &Geom) -> Vec<u32> {
    let [d_in, h_in, w_in] = g.size;
    let out = g.out();
    let axis = |a: usize, o: usize, n: usize| {
        (0..g.k[a])
            .filter_map(move |k| (o * g.stride[a] + k).checked_sub(g.pad[a]))
            .filter(move |&i| i < n)
    };
    let mut args = Vec::new();
    for od in 0..out[0] {
        for oh in 0..out[1] {
            for ow in 0..out[2] {
                let mut best: Option<(f64, usize)> = None;
                for id in axis(0, od, d_in) {
                    for ih in axis(1, oh, h_in) {
                        for iw in axis(2, ow, w_in) {
                            let i = (id * h_in + ih) * w_in + iw;
                            if best.is_none_or(|(b, _)| x[i] > b || x[i].is_nan()) {
                                best = Some((x[i], i));
                            }
                        }
                    }
                }
                args.push(best.unwrap().1 as u32);
            }
        }
    }
    args
}

/// The pooling passes keep each window's first maximum (in (d, h, w) order) where values
/// tie, and its last NaN where it holds NaNs; the NaN is the output.
#[test]
fn argmax_is_the_first_maximum_or_the_last_nan_in_2d_and_3d() {
    for dims in [[1, 1, 5, 6, 7], [1, 1, 1, 7, 6]] {
        let volume: usize = dims[2..].iter().product();
        // Few distinct values (many ties), and NaNs at a few positions.
        let x: Vec<f64> = (0..volume)
            .map(|i| match i % 11 {
                4 => f64::NAN,
                _ => ((i * 7) % 3) as f64,
            })
            .collect();
        let rank = if dims[2] == 1 { 2 } else { 3 };
        let shape = &[&dims[..2], &dims[5 - rank..]].concat();
        for (k, s, p) in CASES {
            let g = Geom::new("max pool", shape, k, s, p).unwrap();
            let (y, arg) = pool_kernel(g, &x);
            assert_eq!(arg, reference_argmax(&x, &g), "{shape:?} k {k} s {s} p {p}");
            for (v, &i) in y.iter().zip(&arg) {
                assert!(
                    v.to_bits() == x[i as usize].to_bits(),
                    "{shape:?} k {k}: {v}"
                );
            }
        }
    }
}

#[test]
fn the_composed_path_of_other_devices_equals_the_op() {
    for (k, s, p) in CASES {
        let x = rand_tensor(5, &[2, 2, 5, 6, 7], DType::F64);
        let g = Geom::new("max pool", x.dims(), k, s, p).unwrap();
        let composed = gather_windows(&x, g, f64::NEG_INFINITY)
            .unwrap()
            .max(0)
            .unwrap();
        let ours = max_pool_channel_major(&x, k, s, p).unwrap();
        assert_eq!(max_abs_diff(&ours, &composed), 0.0);
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let x = rand_tensor(6, &[2, 2, 5, 5], DType::F32);
    let err = max_pool_channel_major(&x, 3, 2, 2).unwrap_err().to_string();
    assert!(err.contains("exceeds half the window"), "{err}");
    let err = max_pool_channel_major(&x.flatten_from(2).unwrap(), 3, 2, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("[C, N, H, W]"), "{err}");
    let err = max_pool_channel_major(&x, 9, 1, 0).unwrap_err().to_string();
    assert!(err.contains("smaller than the window"), "{err}");
}

/// An input that lies batch-major in memory (as activations do on CUDA) is pooled where it lies:
/// the output lies batch-major too, with the values and gradients of the channel-major input.
#[test]
fn an_input_that_lies_batch_major_is_pooled_in_place_with_the_same_values_and_gradients() {
    for shape in [vec![3, 2, 7, 6], vec![2, 3, 5, 6, 4]] {
        let channel_major = Var::from_tensor(&rand_tensor(13, &shape, DType::F64)).unwrap();
        // The same values held batch-major; the pool sees their channel-major view.
        let held = Var::from_tensor(&channel_major.transpose(0, 1).unwrap()).unwrap();
        let lying = held.transpose(0, 1).unwrap();
        assert!(!lying.is_contiguous());
        let ya = max_pool_channel_major(&channel_major, 3, 2, 1).unwrap();
        let yb = max_pool_channel_major(&lying, 3, 2, 1).unwrap();
        assert!(
            yb.transpose(0, 1).unwrap().is_contiguous(),
            "{shape:?}: copied"
        );
        assert_eq!(max_abs_diff(&ya, &yb), 0.0, "{shape:?}");
        let r = rand_tensor(14, ya.dims(), DType::F64);
        let grad = |y: &Tensor, v: &Var| {
            let g = (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            g.get(v).unwrap().clone()
        };
        let held_grad = grad(&yb, &held).transpose(0, 1).unwrap();
        let d = max_abs_diff(&grad(&ya, &channel_major), &held_grad);
        assert_eq!(d, 0.0, "{shape:?}: gradient diff {d}");
    }
}

/// The global average pool is the mean of each (channel, image) plane, `[N, C]`, whether the
/// activations lie channel-major or batch-major in memory.
#[test]
fn the_global_average_pool_is_each_planes_mean_wherever_the_activations_lie() {
    let x = rand_tensor(15, &[3, 2, 4, 5], DType::F64);
    let values: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
    let mean = |c: usize, n: usize| values[(c * 2 + n) * 20..][..20].iter().sum::<f64>() / 20.0;
    let lying = x
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    for input in [&x, &lying] {
        let pooled: Vec<Vec<f64>> = global_average_pool_channel_major(input)
            .unwrap()
            .to_vec2()
            .unwrap();
        for (n, row) in pooled.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                assert!((v - mean(c, n)).abs() < 1e-12, "({n}, {c}): {v}");
            }
        }
    }
    assert!(global_average_pool_channel_major(&x.flatten_from(1).unwrap()).is_err());
}
