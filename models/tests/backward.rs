//! The backward pass as the workspace builds it: Candle's core with the first-gradient and hook
//! patches (`vendor/README.md`), and the custom ops' parameter gradients.
//!
//! The patch stores the first gradient a tensor receives instead of adding it to zeros. These
//! tests pin what that must not change: values where a tensor is reached once, twice, through a
//! subtraction, a negation, a broadcast and a transpose; contiguous gradients; and that no
//! parameter gradient is a view that keeps a larger backward buffer alive until the optimizer
//! step (the input gradient of the op that produced it). The hook patch (`backward_with`) must
//! hand each variable over once, complete, in the backward order.

use candle_core::{DType, Device, Result, Storage, Tensor, Var, D};
use ssl_models::{batch_norm::batch_norm, conv::conv, layer_norm::layer_norm, linear};

fn values(t: &Tensor) -> Result<Vec<f64>> {
    t.flatten_all()?.to_dtype(DType::F64)?.to_vec1()
}

/// Elements of the storage behind `t` (f32 CPU tensors).
fn storage_len(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => cpu.as_slice::<f32>().expect("f32 storage").len(),
        _ => unreachable!("these tests run on the CPU"),
    }
}

#[test]
fn gradients_reached_once_twice_and_through_subtraction() -> Result<()> {
    let dev = Device::Cpu;
    let x = Var::new(&[1.0f64, -2.0, 3.0], &dev)?;
    let y = Var::new(&[0.5f64, 4.0, -1.0], &dev)?;
    let w = Tensor::new(&[1.0f64, 10.0, 100.0], &dev)?;
    // L = Σ w·(x·y + x − y − (−y)·2) = Σ w·(x·y + x + y): x is reached twice, y three times,
    // once through a subtraction and once through a negation.
    let (xv, yv) = (x.as_tensor(), y.as_tensor());
    let z = ((xv * yv)? + xv)?;
    let z = (z - yv)?;
    let z = (z - (yv.neg()? * 2.0)?)?;
    let grads = (z * &w)?.sum_all()?.backward()?;
    let dx = values(grads.get(xv).expect("x has a gradient"))?;
    let dy = values(grads.get(yv).expect("y has a gradient"))?;
    // ∂L/∂x = w(y + 1), ∂L/∂y = w(x + 1).
    assert_eq!(dx, [1.5, 50.0, 0.0]);
    assert_eq!(dy, [2.0, -10.0, 400.0]);
    Ok(())
}

#[test]
fn a_broadcast_or_transposed_first_gradient_is_stored_reduced_and_contiguous() -> Result<()> {
    let dev = Device::Cpu;
    let b = Var::new(&[1.0f64, 2.0], &dev)?;
    let m = Var::new(&[[1.0f64, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev)?;
    let r = Tensor::new(&[[1.0f64, 0.0], [2.0, 1.0], [0.0, 3.0]], &dev)?;
    // L = Σ r ⊙ (mᵀ + b): m's gradient arrives transposed, b's through a broadcast over rows.
    let s = m.as_tensor().t()?.broadcast_add(b.as_tensor())?;
    let grads = (s * &r)?.sum_all()?.backward()?;
    let dm = grads.get(m.as_tensor()).expect("m has a gradient");
    let db = grads.get(b.as_tensor()).expect("b has a gradient");
    assert!(
        dm.is_contiguous(),
        "a transposed first gradient is stored contiguous"
    );
    assert_eq!(dm.dims(), [2, 3]);
    assert_eq!(values(dm)?, [1.0, 2.0, 0.0, 0.0, 1.0, 3.0]);
    assert_eq!(values(db)?, [3.0, 4.0]);
    Ok(())
}

#[test]
fn parameter_gradients_own_their_storage() -> Result<()> {
    let dev = Device::Cpu;
    let store = ssl_core::ParamStore::new(7);
    let vb = store.var_builder(&dev);
    let fc = linear(24, 8, vb.pp("fc"))?;
    let cv = conv(3, 16, 2, 3, 1, 1, true, vb.pp("conv"))?;
    let bn = batch_norm(16, vb.pp("bn"))?;
    let ln = layer_norm(8, 1e-6, vb.pp("ln"))?;

    let x = Var::from_tensor(&ssl_core::testing::randn(0f32, 1.0, (4, 3, 8, 8), &dev)?)?;
    let h = candle_core::Module::forward(&cv, x.as_tensor())?;
    let h = bn.forward_channel_major(&h.transpose(0, 1)?, true, true)?;
    let h = h.mean(D::Minus1)?.transpose(0, 1)?.reshape((4, 16 * 8))?;
    let h = h.narrow(1, 0, 24)?;
    let h = ln.forward(&candle_core::Module::forward(&fc, &h)?)?;
    let grads = h.sqr()?.sum_all()?.backward()?;

    let dx = grads.get(x.as_tensor()).expect("the input has a gradient");
    assert_eq!(storage_len(dx), dx.elem_count());
    let vars = store.vars();
    let params = vars.iter().filter(|(name, _)| !name.contains("running_"));
    for (name, var) in params {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name} has no gradient"));
        assert_eq!(
            storage_len(g),
            g.elem_count(),
            "{name}'s gradient is a view of a larger buffer"
        );
    }
    Ok(())
}

/// `2x` as a custom op whose backward notes where the gradient it was given lies and where
/// the one it returns does (addresses of CPU f32 buffers).
struct Doubled(std::sync::Arc<Notes>);

#[derive(Default)]
struct Notes {
    given: std::sync::Mutex<Option<usize>>,
    returned: std::sync::Mutex<Option<usize>>,
}

/// The address of `t`'s first element (a CPU f32 tensor).
fn address(t: &Tensor) -> usize {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => {
            let data = cpu.as_slice::<f32>().expect("f32 storage");
            data[layout.start_offset()..].as_ptr() as usize
        }
        _ => unreachable!("these tests run on the CPU"),
    }
}

impl candle_core::CustomOp1 for Doubled {
    fn name(&self) -> &'static str {
        "doubled"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        assert!(l.is_contiguous(), "the test hands contiguous views");
        let x = &s.as_slice::<f32>()?[l.start_offset()..][..l.shape().elem_count()];
        let y = x.iter().map(|v| 2.0 * v).collect();
        Ok((candle_core::CpuStorage::F32(y), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, _y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        assert!(
            grad.is_contiguous(),
            "an op other than a transposition takes it contiguous"
        );
        *self.0.given.lock().unwrap() = Some(address(grad));
        let dx = (grad * 2.0)?;
        *self.0.returned.lock().unwrap() = Some(address(&dx));
        Ok(Some(dx))
    }
}

/// Activations that are channel-major in shape and lie batch-major in memory (`[C, N, S]` views
/// of packed `[N, C, S]`, as our ops leave them on CUDA), each op running on the batch-major
/// view: an op's input gradient reaches the op before it as it was written, not copied to
/// channel-major when stored and back when transposed; the values are the chain rule's where a
/// gradient is summed over two uses, and a variable's gradient is contiguous.
#[test]
fn gradients_of_transposed_activations_pass_between_ops_uncopied() -> Result<()> {
    use std::sync::Arc;
    let dev = Device::Cpu;
    let (n, c, s) = (2, 3, 4);
    let p = Tensor::arange(0f32, (n * c * s) as f32, &dev)?.reshape((n, c, s))?;
    let p = Var::from_tensor(&p)?;
    // `op` on the batch-major view of `x`: [C, N, S] → [C, N, S], lying as `x` does.
    let apply = |x: &Tensor| -> Result<(Tensor, Arc<Notes>)> {
        let notes = Arc::new(Notes::default());
        let y = x.transpose(0, 1)?.apply_op1(Doubled(notes.clone()))?;
        Ok((y.transpose(0, 1)?, notes))
    };
    let x = p.as_tensor().transpose(0, 1)?;
    // x feeds two ops, joined on their batch-major views (as a residual block's input feeds
    // its first convolution and its shortcut), and the join feeds a third.
    let (a, first) = apply(&x)?;
    let (b, second) = apply(&x)?;
    let join = (a.transpose(0, 1)? + b.transpose(0, 1)?)?.transpose(0, 1)?;
    let (y, third) = apply(&join)?;
    let r = Tensor::arange(1f32, (n * c * s + 1) as f32, &dev)?.reshape((c, n, s))?;
    let grads = (y * &r)?.sum_all()?.backward()?;
    let third_out = third
        .returned
        .lock()
        .unwrap()
        .expect("the third op's backward ran");
    assert_eq!(*first.given.lock().unwrap(), Some(third_out));
    assert_eq!(*second.given.lock().unwrap(), Some(third_out));
    // dL/dp = (2 + 2)·2·rᵀ, contiguous in p's shape.
    let dp = grads.get(p.as_tensor()).expect("p has a gradient");
    assert!(dp.is_contiguous());
    assert_eq!(values(dp)?, values(&(r.transpose(0, 1)? * 8.0)?)?);
    Ok(())
}

/// `backward_with` hands each variable over once, after every op that consumes it: with the
/// gradient the finished store holds, the last layer's first, and a weight used both at the
/// start and at the end of the graph only once its first use is taken back.
#[test]
fn variables_are_handed_over_complete_last_layer_first() -> Result<()> {
    let dev = Device::Cpu;
    let init = |shift: f64| -> Result<Var> {
        let v: Vec<f64> = (0..9).map(|i| ((i as f64 + shift) * 0.7).sin()).collect();
        Var::from_tensor(&Tensor::from_vec(v, (3, 3), &dev)?)
    };
    let (w1, w2, w3) = (init(0.0)?, init(1.0)?, init(2.0)?);
    let x = Tensor::new(&[[1.0f64, -0.5, 2.0], [0.3, 0.8, -1.2]], &dev)?;
    let h1 = x.matmul(w1.as_tensor())?.tanh()?;
    let h2 = h1.matmul(w2.as_tensor())?.tanh()?;
    let out = (h2.matmul(w3.as_tensor())? + h2.matmul(w1.as_tensor())?)?;
    let loss = out.sqr()?.sum_all()?;
    let mut handed = Vec::new();
    let grads = loss.backward_with(|var, grad| {
        handed.push((var.id(), grad.map(values).transpose()?));
        Ok(())
    })?;
    let ids = [&w1, &w2, &w3].map(|w| w.as_tensor().id());
    let order: Vec<usize> = handed
        .iter()
        .map(|(id, _)| ids.iter().position(|w| w == id).expect("a weight"))
        .collect();
    // w3 and w1's late use are taken back first, but w1 also feeds h1, which needs w2's layer.
    assert_eq!(order, [2, 1, 0]);
    for (id, grad) in &handed {
        let whole = grads.get_id(*id).expect("every weight has a gradient");
        assert_eq!(grad.as_deref(), Some(values(whole)?.as_slice()));
    }
    Ok(())
}
