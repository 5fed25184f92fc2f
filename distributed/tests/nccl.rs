//! The NCCL back end (feature `nccl`) on one GPU, world size 1, where every collective is an
//! identity and must be exact: the all-gather and its backward (the all-reduce of the gathered
//! gradient, then this rank's rows), the tensor all-reduce, and the gradient mean over ranks,
//! which NCCL runs even at world size 1 (see [`reduce_gradients`]).
//!
//! Needs a GPU: `cargo test --release -p ssl-dist --features nccl --test nccl`; where the CUDA
//! driver finds none, each test prints so and passes. `tools/cuda/device.sh` runs it on the
//! device machine. Several ranks (several GPUs) are not tested anywhere.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::cuda_backend::cudarc::driver::result::DriverError;
use candle_core::cuda_backend::cudarc::driver::sys::CUresult;
use candle_core::cuda_backend::cudarc::driver::CudaContext;
use candle_core::{DType, Device, Tensor, Var};
use ssl_dist::{reduce_gradients, Collective, Comm, NcclCollective, SingleProcess};

/// The communicator of a one-rank job on `cuda:0`, or `None` (after saying so) where the
/// driver finds no GPU; any other CUDA failure fails the test.
fn nccl() -> Option<NcclCollective> {
    match CudaContext::device_count() {
        Ok(0) | Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => {
            eprintln!("skipped: the CUDA driver finds no GPU");
            None
        }
        Ok(_) => Some(NcclCollective::init(Arc::new(SingleProcess), 0).unwrap()),
        Err(e) => panic!("CUDA failed before looking for a GPU: {e:?}"),
    }
}

/// Fixed values, off any pattern an index mix-up would keep.
fn values(n: usize, shift: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + shift) * 0.37).sin() + (i * 7919 % 101) as f32 / 100.0)
        .collect()
}

/// The largest absolute difference of two tensors of one float dtype (f32 or f64), in f64.
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    let on_cpu = |t: &Tensor| {
        t.to_device(&Device::Cpu)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
    };
    (on_cpu(a) - on_cpu(b))
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// At world size 1, gathering along any dimension returns the input and passes the gradient
/// through unchanged (the all-reduce of one rank, all its rows), for a tensor on the GPU and
/// for one on the CPU (copied to the GPU and back); ids gather too. The tensor all-reduce
/// returns its input, f32 and f64, on the input's device.
#[test]
fn all_gather_and_all_reduce_are_identities_with_the_right_backward() {
    let Some(comm) = nccl() else { return };
    let gpu = comm.device().expect("NCCL is bound to its GPU").clone();
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    for device in [gpu.clone(), Device::Cpu] {
        for dim in 0..3 {
            let x = Var::from_tensor(
                &Tensor::from_vec(values(2 * 5 * 3, 0.0), (2, 5, 3), &device).unwrap(),
            )
            .unwrap();
            let r = Tensor::from_vec(values(2 * 5 * 3, 9.0), (2, 5, 3), &device).unwrap();
            let gathered = comm.all_gather(x.as_tensor(), dim).unwrap();
            assert!(gathered.device().same_device(&device));
            assert_eq!(gathered.dims(), x.dims());
            assert_eq!(max_abs_diff(&gathered, x.as_tensor()), 0.0, "dim {dim}");
            let grads = (&gathered * &r)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let g = grads
                .get(x.as_tensor())
                .expect("a gradient through the gather");
            assert!(g.device().same_device(&device));
            assert_eq!(max_abs_diff(g, &r), 0.0, "dim {dim}: the gradient is r");
        }
    }
    let ids = Tensor::new(&[3u32, 1, 4, 1, 5], &gpu).unwrap();
    let gathered: Vec<u32> = comm.all_gather(&ids, 0).unwrap().to_vec1().unwrap();
    assert_eq!(gathered, [3, 1, 4, 1, 5]);
    for device in [gpu.clone(), Device::Cpu] {
        for dtype in [DType::F32, DType::F64] {
            let t = Tensor::from_vec(values(12, 1.0), (3, 4), &device)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let sum = comm.all_reduce_sum_tensor(&t).unwrap();
            assert!(sum.device().same_device(&device));
            assert_eq!((sum.dims(), sum.dtype()), (t.dims(), dtype));
            assert_eq!(max_abs_diff(&sum, &t), 0.0, "{dtype:?}");
        }
    }
}

/// The gradient mean over NCCL at world size 1 leaves every gradient as it was, on the GPU and
/// in its variable's dtype, whether the variables share one bucket or each travels alone: an
/// `f32` gradient exactly, an `f64` one rounded to `f32`, since NCCL's buckets are `f32`
/// whatever the parameters' dtype (`NcclCollective::bucket_dtype`; on an H200 the `f64` gradient
/// came back 4.1e-7 from its value, one `f32` rounding). A variable without a gradient stays
/// without.
#[test]
fn reduce_gradients_over_nccl_leaves_gradients_equal() {
    let Some(comm) = nccl() else { return };
    let gpu = comm.device().expect("NCCL is bound to its GPU").clone();
    let var = |shape: (usize, usize), shift: f32, dtype: DType| {
        let t = Tensor::from_vec(values(shape.0 * shape.1, shift), shape, &gpu).unwrap();
        Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
    };
    let (w, b, w64, never) = (
        var((6, 5), 0.0, DType::F32),
        var((1, 5), 3.0, DType::F32),
        var((5, 2), 5.0, DType::F64),
        var((3, 1), 2.0, DType::F32),
    );
    let params: Vec<(String, Var)> = [("w", &w), ("b", &b), ("w64", &w64), ("never", &never)]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.clone()))
        .collect();
    let x = Tensor::from_vec(values(4 * 6, 7.0), (4, 6), &gpu).unwrap();
    let h = x
        .matmul(w.as_tensor())
        .unwrap()
        .broadcast_add(b.as_tensor())
        .unwrap()
        .tanh()
        .unwrap();
    let y = h
        .to_dtype(DType::F64)
        .unwrap()
        .matmul(w64.as_tensor())
        .unwrap();
    let loss = y.sqr().unwrap().sum_all().unwrap();
    for bucket in [1, 64] {
        let mut grads: GradStore = loss.backward().unwrap();
        let before: Vec<Tensor> = [&w, &b, &w64]
            .iter()
            .map(|v| grads.get(v.as_tensor()).unwrap().copy().unwrap())
            .collect();
        reduce_gradients(&comm, &params, &mut grads, bucket).unwrap();
        for (v, old) in [&w, &b, &w64].iter().zip(&before) {
            let new = grads.get(v.as_tensor()).unwrap();
            assert!(new.device().same_device(&gpu), "the mean stays on the GPU");
            assert_eq!(new.dtype(), v.dtype());
            let sent = old
                .to_dtype(DType::F32)
                .unwrap()
                .to_dtype(old.dtype())
                .unwrap();
            assert_eq!(max_abs_diff(new, &sent), 0.0, "bucket {bucket}");
        }
        assert!(grads.get(never.as_tensor()).is_none());
    }
}
