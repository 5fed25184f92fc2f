//! Tests of the batch norm: the fused op against the composed and Candle paths, running
//! statistics, a refused one-value channel and finite-difference gradients.

use super::*;
use crate::util::testing::{finite_diff, max_abs_diff, rand_tensor};
use candle_core::Device;

fn store_bn(momentum: Option<f64>) -> (ssl_core::ParamStore, BatchNorm) {
    let store = ssl_core::ParamStore::new(3);
    let vb = store.var_builder(&Device::Cpu);
    let bn = BatchNorm::new(4, 1e-5, momentum, vb.pp("bn")).unwrap();
    (store, bn)
}

/// Eval mode as one op (the CUDA path, run on the CPU) against the composed eval: values
/// and the gradients of x, γ and β, with and without the ReLU, on channel-major rows and on
/// an input that lies batch-major (as on CUDA), whose result lies batch-major too.
#[test]
fn fused_eval_equals_the_composed_one_where_the_input_lies() {
    use candle_core::Var;
    let (store, bn) = store_bn(Some(0.1));
    let set = |name: &str, values: [f32; 4]| {
        let vars = store.vars();
        let (_, var) = vars
            .iter()
            .find(|(n, _)| n == name)
            .expect("a batch norm tensor");
        var.set(&Tensor::new(&values, &Device::Cpu).unwrap())
            .unwrap();
    };
    set("bn.running_mean", [0.5, -1.0, 0.0, 2.0]);
    set("bn.running_var", [1.5, 0.25, 4.0, 1.0]);
    set("bn.weight", [1.2, -0.7, 0.9, 1.1]);
    set("bn.bias", [0.1, 0.2, -0.3, 0.0]);
    // [N, C, S] = [3, 4, 5] in memory; seen channel-major as [C, N, S].
    let packed = Var::from_tensor(&rand_tensor(33, &[3, 4, 5], DType::F32)).unwrap();
    let rows = Var::from_tensor(&rand_tensor(34, &[4, 3, 5], DType::F32)).unwrap();
    let r = rand_tensor(35, &[4, 3, 5], DType::F32);
    for relu in [false, true] {
        let inputs = [
            (
                packed.as_tensor().transpose(0, 1).unwrap(),
                packed.as_tensor(),
            ),
            (rows.as_tensor().clone(), rows.as_tensor()),
        ];
        for (x, var) in inputs {
            let run = |fused: bool| {
                let y = match fused {
                    true => bn.eval_fused(&x, relu).unwrap(),
                    false => bn.forward_channel_major(&x, relu, false).unwrap(),
                };
                let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
                let grad = |t: &Tensor| grads.get(t).unwrap().clone();
                (y.clone(), [grad(var), grad(&bn.weight), grad(&bn.bias)])
            };
            let ((y, g), (y_ref, g_ref)) = (run(true), run(false));
            assert_eq!(y.stride(), x.stride(), "the result lies as the input does");
            assert!(
                max_abs_diff(&y, &y_ref) < 1e-6,
                "{}",
                max_abs_diff(&y, &y_ref)
            );
            for (a, b) in g.iter().zip(&g_ref) {
                assert!(
                    max_abs_diff(a, b) < 1e-5,
                    "{:?}: {}",
                    a.dims(),
                    max_abs_diff(a, b)
                );
            }
        }
    }
}

/// The CPU op takes `[C, M]` rows only: an operand whose channels repeat more often (the
/// CUDA kernels' batch-major form) is a clear error, not a wrong normalisation.
#[test]
fn the_cpu_op_refuses_channels_that_are_not_rows() {
    let (_store, bn) = store_bn(Some(0.1));
    let x = rand_tensor(32, &[2, 4, 3], DType::F64);
    let Err(err) = bn.train_fused(&x, 3, false) else {
        panic!("channels every 3 values of 6 were normalised as rows");
    };
    let err = err.to_string();
    assert!(
        err.contains("channel-major rows [C, M]") && err.contains("every 3 values, not every 6"),
        "{err}"
    );
    assert!(bn
        .train_fused(&x.reshape((4, 6)).unwrap(), 6, false)
        .is_ok());
}

#[test]
fn the_composed_path_of_other_devices_equals_the_fused_op() {
    let (_store, bn) = store_bn(Some(0.1));
    let x = candle_core::Var::from_tensor(&rand_tensor(30, &[4, 9], DType::F64)).unwrap();
    let r = rand_tensor(31, &[4, 9], DType::F64);
    for relu in [false, true] {
        let (yf, stats) = bn.train_fused(x.as_tensor(), 9, relu).unwrap();
        let (mf, vf) = match stats {
            BatchStats::Tensors { mean, unbiased_var } => (mean, unbiased_var),
            #[cfg(feature = "cuda")]
            BatchStats::Device { .. } => {
                unreachable!("a CPU pass keeps its statistics in tensors")
            }
        };
        let (yc, mc, vc) = bn.train_composed(x.as_tensor(), relu).unwrap();
        assert!(max_abs_diff(&yf, &yc) < 1e-12);
        assert!(max_abs_diff(&mf, &mc) < 1e-12);
        assert!(max_abs_diff(&vf, &unbiased(&vc, 9).unwrap()) < 1e-12);
        let gf = (&yf * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let gc = (&yc * &r).unwrap().sum_all().unwrap().backward().unwrap();
        for t in [x.as_tensor(), &bn.weight, &bn.bias] {
            let d = max_abs_diff(gf.get(t).unwrap(), gc.get(t).unwrap());
            assert!(d < 1e-10, "relu {relu}: gradient diff {d}");
        }
    }
}

#[test]
fn matches_candle_forward_train_and_running_stats() {
    let (store, bn) = store_bn(Some(0.1));
    // Non-trivial affine parameters.
    for (k, v) in store.vars() {
        if k.ends_with("weight") || k.ends_with("bias") {
            v.set(&rand_tensor(11, &[4], DType::F32)).unwrap();
        }
    }
    let refvb =
        candle_nn::VarBuilder::from_varmap(&candle_nn::VarMap::new(), DType::F32, &Device::Cpu);
    let refbn = candle_nn::batch_norm(4, 1e-5, refvb).unwrap();
    let (w, b) = refbn.weight_and_bias().unwrap();
    let w = candle_core::Var::from_tensor(w).unwrap();
    let b = candle_core::Var::from_tensor(b).unwrap();
    w.set(&bn.weight).unwrap();
    b.set(&bn.bias).unwrap();
    for step in 0..2 {
        let x = rand_tensor(12 + step, &[6, 4, 3, 5], DType::F32);
        let reference = refbn.forward_train(&x).unwrap();
        let ours = bn
            .forward_channel_major(&x.transpose(0, 1).unwrap(), false, true)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        assert!(max_abs_diff(&ours, &reference) < 1e-5);
        let ours_relu = bn
            .forward_channel_major(&x.transpose(0, 1).unwrap(), true, true)
            .unwrap()
            .transpose(0, 1)
            .unwrap();
        assert!(max_abs_diff(&ours_relu, &reference.relu().unwrap()) < 1e-5);
        // Candle updated once, we twice: redo candle's update to compare.
        refbn.forward_train(&x).unwrap();
        assert!(max_abs_diff(bn.running_mean(), refbn.running_mean()) < 1e-6);
        assert!(max_abs_diff(bn.running_var(), refbn.running_var()) < 1e-5);
    }
    // Buffers live in the store.
    let stored = store.tensors();
    assert!(max_abs_diff(&stored["bn.running_mean"], bn.running_mean()) == 0.0);
    // Eval uses running stats.
    let x = rand_tensor(20, &[6, 4], DType::F32);
    let ev = bn.forward_rows(&x, false, false).unwrap();
    let want = x
        .broadcast_sub(bn.running_mean())
        .unwrap()
        .broadcast_div(&(bn.running_var() + 1e-5).unwrap().sqrt().unwrap())
        .unwrap()
        .broadcast_mul(&bn.weight)
        .unwrap()
        .broadcast_add(&bn.bias)
        .unwrap();
    assert!(max_abs_diff(&ev, &want) < 1e-5);
}

/// One value a channel (one sample whose 3D feature map is 1 × 1 × 1) has no batch variance:
/// refused in train mode with the shape and the fix, and without touching the running
/// statistics; eval mode normalises it.
#[test]
fn one_value_a_channel_is_refused_in_train_mode_with_the_fix() {
    let (_store, bn) = store_bn(Some(0.1));
    let x = rand_tensor(32, &[4, 1, 1, 1, 1], DType::F32);
    let e = bn
        .forward_channel_major(&x, true, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shape [4, 1, 1, 1, 1]") && e.contains("batch size of 2 or more"),
        "{e}"
    );
    assert_eq!(bn.running_mean().to_vec1::<f32>().unwrap(), [0.0; 4]);
    assert!(bn.forward_channel_major(&x, true, false).is_ok());
    assert!(bn
        .forward_channel_major(&rand_tensor(33, &[4, 2], DType::F32), true, true)
        .is_ok());
}

#[test]
fn cumulative_average_without_momentum() {
    let (_store, bn) = store_bn(None);
    let xs: Vec<Tensor> = (0..3)
        .map(|s| rand_tensor(30 + s, &[4, 10], DType::F32))
        .collect();
    for x in &xs {
        bn.forward_channel_major(x, false, true).unwrap();
    }
    let avg = |f: &dyn Fn(&Tensor) -> Tensor| {
        let s = (f(&xs[0]) + f(&xs[1])).unwrap();
        ((s + f(&xs[2])).unwrap() / 3.0).unwrap()
    };
    let mean = avg(&|x| x.mean(1).unwrap());
    let var = avg(&|x| x.var(1).unwrap());
    assert!(max_abs_diff(bn.running_mean(), &mean) < 1e-6);
    assert!(max_abs_diff(bn.running_var(), &var) < 1e-6);
}

#[test]
fn gradients_match_finite_differences_f64() {
    for relu in [false, true] {
        let x0 = rand_tensor(40, &[3, 2, 5], DType::F64);
        let g0 = (rand_tensor(41, &[3], DType::F64) + 1.0).unwrap();
        let b0 = rand_tensor(42, &[3], DType::F64);
        let r = rand_tensor(43, &[3, 2, 5], DType::F64);
        let loss = |x: &Tensor, g: &Tensor, b: &Tensor| -> Tensor {
            let bn = BatchNorm {
                weight: g.clone(),
                bias: b.clone(),
                running_mean: Var::zeros(3, DType::F64, &Device::Cpu).unwrap(),
                running_var: Var::ones(3, DType::F64, &Device::Cpu).unwrap(),
                eps: 1e-5,
                momentum: Some(0.1),
                count: Arc::new(Mutex::new(0)),
            };
            let y = bn.forward_channel_major(x, relu, true).unwrap();
            (y * &r).unwrap().sum_all().unwrap()
        };
        let (x, g, b) = (
            Var::from_tensor(&x0).unwrap(),
            Var::from_tensor(&g0).unwrap(),
            Var::from_tensor(&b0).unwrap(),
        );
        let grads = loss(x.as_tensor(), g.as_tensor(), b.as_tensor())
            .backward()
            .unwrap();
        let f = |v: &Var| -> Vec<f64> {
            grads
                .get(v)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let (gx, gg, gb) = (f(&x), f(&g), f(&b));
        for (i, &want) in gx.iter().enumerate() {
            let fd = finite_diff(&x0, i, &|t| loss(t, &g0, &b0).to_scalar().unwrap());
            assert!(
                (fd - want).abs() < 1e-5,
                "relu {relu} dx[{i}] {fd} vs {want}"
            );
        }
        for i in 0..3 {
            let fd = finite_diff(&g0, i, &|t| loss(&x0, t, &b0).to_scalar().unwrap());
            assert!((fd - gg[i]).abs() < 1e-5, "dgamma[{i}] {fd} vs {}", gg[i]);
            let fd = finite_diff(&b0, i, &|t| loss(&x0, &g0, t).to_scalar().unwrap());
            assert!((fd - gb[i]).abs() < 1e-5, "dbeta[{i}] {fd} vs {}", gb[i]);
        }
    }
}
