//! Convolutions of CUDA tensors through cuDNN: forward, input gradient and weight gradient of the
//! 2D and 3D convolutions [`Conv`](super::Conv) computes, one cuDNN call each, in place of the
//! gathered columns and GEMM of the composed path.
//!
//! Activations are channel-major in shape (`[C, N, *S]`), as on the CPU, but on CUDA they lie
//! batch-major in memory (`[N, C, *S]` packed, `NCHW`/`NCDHW`): the layout cuDNN's algorithms
//! take (most refuse the strides of a channel-major buffer seen batch-major), PyTorch's, and the
//! one our batch norm, residual and pooling kernels leave as they find it. [`Conv`](super::Conv)
//! hands [`conv`] the batch-major view `x.transpose(0, 1)` (copied only when `x` lies
//! channel-major, as a network's input does not) and returns its packed `[N, O, *S]` result as
//! `[O, N, *S]`, a view.
//!
//! Algorithms are the first that cuDNN's heuristics rank and support (what PyTorch uses with
//! `cudnn.benchmark` off), cached per shape with their descriptors, and one workspace per device
//! grows to the largest asked for. f32 convolutions may use TF32 tensor cores, as PyTorch lets
//! cuDNN by default (`torch.backends.cudnn.allow_tf32`); [`set_tf32`] turns that off for exact
//! f32 (the parity tests do). bf16 operands run on tensor cores (`TENSOR_OP_MATH`) and accumulate
//! in f32.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cudnn::{result, sys, CudnnDataType};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId};
use candle_core::{
    CpuStorage, CudaStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, WithDType,
};
use half::bf16;

use super::Geom;

/// Runs `$body` with `$T` bound to the Rust type of a float dtype cuDNN convolves.
macro_rules! dispatch_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            other => candle_core::bail!("cuDNN convolutions take f32, f64 or bf16, got {other:?}"),
        }
    };
}

static TF32: AtomicBool = AtomicBool::new(true);

/// Whether f32 convolutions may run on TF32 tensor cores (the default, as in PyTorch).
pub fn set_tf32(allowed: bool) {
    TF32.store(allowed, Ordering::Relaxed);
}

/// The convolution `g` (spatial rank `rank`, geometry of the channel-major input) with `o`
/// output channels of a batch-major `x` (`[N, C, *S]`, copied packed unless it is) by `w`
/// (`[O, C, k, …]`), giving packed `[N, O, *S_out]`; its backward runs cuDNN's two gradient
/// calls.
pub(crate) fn conv(x: &Tensor, w: &Tensor, g: Geom, o: usize, rank: usize) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2(&w.contiguous()?, Forward { g, o, rank })
}

/// The forward convolution of a packed batch-major input `[N, C, *S]`: writes `[N, O, *S_out]`.
struct Forward {
    g: Geom,
    o: usize,
    rank: usize,
}

/// `dx` (`[N, C, *S]`) of [`Forward`] from `dy` (`[N, O, *S_out]`).
struct BackwardData {
    g: Geom,
    o: usize,
    rank: usize,
}

/// `dW` (`[O, C, k, …]`) of [`Forward`] from `x` and `dy`, both batch-major.
struct BackwardFilter {
    g: Geom,
    o: usize,
    rank: usize,
}

impl CustomOp2 for Forward {
    fn name(&self) -> &'static str {
        "cudnn-conv"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("cudnn-conv runs on CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let mut out = self.g.out_dims(self.o, self.rank);
        out.swap(0, 1);
        let call = Call {
            kind: Kind::Forward,
            g: self.g,
            o: self.o,
            rank: self.rank,
        };
        call.run((x, xl), (w, wl), out)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (g, o, rank) = (self.g, self.o, self.rank);
        let dy = dy.contiguous()?;
        let dx = dy.apply_op2_no_bwd(w, &BackwardData { g, o, rank })?;
        let dw = x.apply_op2_no_bwd(&dy, &BackwardFilter { g, o, rank })?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp2 for BackwardData {
    fn name(&self) -> &'static str {
        "cudnn-conv-backward-data"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("cudnn-conv-backward-data runs on CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        dy: &CudaStorage,
        dyl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let g = &self.g;
        let mut dims = vec![g.n, g.c];
        dims.extend(&g.size[3 - self.rank..]);
        let call = Call {
            kind: Kind::BackwardData,
            g: self.g,
            o: self.o,
            rank: self.rank,
        };
        call.run((dy, dyl), (w, wl), dims)
    }
}

impl CustomOp2 for BackwardFilter {
    fn name(&self) -> &'static str {
        "cudnn-conv-backward-filter"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("cudnn-conv-backward-filter runs on CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let dims = filter_dims(&self.g, self.o, self.rank);
        let call = Call {
            kind: Kind::BackwardFilter,
            g: self.g,
            o: self.o,
            rank: self.rank,
        };
        call.run((x, xl), (dy, dyl), dims)
    }
}

/// `[O, C, k, …]`.
fn filter_dims(g: &Geom, o: usize, rank: usize) -> Vec<usize> {
    let mut dims = vec![o, g.c];
    dims.extend(&g.k[3 - rank..]);
    dims
}

/// The strides of a packed buffer of `dims`.
fn packed_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for a in (0..dims.len() - 1).rev() {
        strides[a] = strides[a + 1] * dims[a + 1];
    }
    strides
}

/// Which of the three cuDNN convolution calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// One cuDNN call of a convolution: `launch` takes its two operands (forward: `x`, `w`; backward
/// data: `dy`, `w`; backward filter: `x`, `dy`) and the result's batch-major dims and strides.
struct Call {
    kind: Kind,
    g: Geom,
    o: usize,
    rank: usize,
}

/// Element types cuDNN convolves, with the type it accumulates in.
trait Element: CudnnDataType + CudaDType + DeviceRepr + WithDType {
    type Compute: CudnnDataType;
}
impl Element for f32 {
    type Compute = f32;
}
impl Element for f64 {
    type Compute = f64;
}
impl Element for bf16 {
    type Compute = f32;
}

fn to_i32(v: &[usize]) -> Result<Vec<i32>> {
    v.iter()
        .map(|&x| {
            i32::try_from(x).map_err(|_| {
                candle_core::Error::Msg(format!("cuDNN takes extents below 2³¹, got {x}"))
            })
        })
        .collect()
}

/// The cache key of a call: its kind, dtype, math and every operand's dims and strides.
#[derive(Clone, PartialEq, Eq, Hash)]
struct PlanKey {
    device: DeviceId,
    kind: Kind,
    dtype: DType,
    tf32: bool,
    /// The two operands' and the result's dims and strides, batch-major.
    operands: [(Vec<usize>, Vec<usize>); 3],
    conv: ([usize; 3], [usize; 3]),
}

/// A call's descriptors, algorithm and workspace size, built once per [`PlanKey`].
struct Plan {
    conv: ConvDesc,
    filter: FilterDesc,
    /// Forward: `x`, `y`; backward data: `dy`, `dx`; backward filter: `x`, `dy`.
    tensors: [TensorDesc; 2],
    algo: Algorithm,
    workspace: usize,
}

/// The algorithm chosen for a call, of its kind.
#[derive(Clone, Copy)]
enum Algorithm {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

thread_local! {
    // cuDNN handles are not thread-safe: one per thread and device, as Candle keeps its own.
    static HANDLES: RefCell<HashMap<DeviceId, Handle>> = RefCell::new(HashMap::new());
    static PLANS: RefCell<HashMap<PlanKey, std::rc::Rc<Plan>>> = RefCell::new(HashMap::new());
    static WORKSPACES: RefCell<HashMap<DeviceId, CudaSlice<u8>>> = RefCell::new(HashMap::new());
}

/// Owners of cuDNN's raw handle and descriptors, destroyed on drop.
macro_rules! owned {
    ($name:ident, $raw:ty, $destroy:path) => {
        struct $name($raw);
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching cuDNN call and dropped once.
                let _ = unsafe { $destroy(self.0) };
            }
        }
    };
}
owned!(Handle, sys::cudnnHandle_t, result::destroy_handle);
owned!(
    TensorDesc,
    sys::cudnnTensorDescriptor_t,
    result::destroy_tensor_descriptor
);
owned!(
    FilterDesc,
    sys::cudnnFilterDescriptor_t,
    result::destroy_filter_descriptor
);
owned!(
    ConvDesc,
    sys::cudnnConvolutionDescriptor_t,
    result::destroy_convolution_descriptor
);

/// This thread's cuDNN handle for `dev`, on the device's stream.
fn handle(dev: &CudaDevice) -> Result<sys::cudnnHandle_t> {
    HANDLES.with(|handles| {
        if let Some(h) = handles.borrow().get(&dev.id()) {
            return Ok(h.0);
        }
        let h = Handle(result::create_handle()?);
        // SAFETY: a live handle and the device's live stream.
        unsafe { result::set_stream(h.0, dev.cuda_stream().cu_stream() as _) }?;
        let raw = h.0;
        handles.borrow_mut().insert(dev.id(), h);
        Ok(raw)
    })
}

fn tensor_desc<T: CudnnDataType>(dims: &[usize], strides: &[usize]) -> Result<TensorDesc> {
    let desc = TensorDesc(result::create_tensor_descriptor()?);
    let (dims, strides) = (to_i32(dims)?, to_i32(strides)?);
    // SAFETY: a live descriptor; the arrays hold `dims.len()` values.
    unsafe {
        result::set_tensornd_descriptor(
            desc.0,
            T::DATA_TYPE,
            dims.len() as i32,
            dims.as_ptr(),
            strides.as_ptr(),
        )
    }?;
    Ok(desc)
}

impl Call {
    /// This call on the storages `a` and `b`, writing a packed result of `dims`.
    fn run(
        &self,
        (a, al): (&CudaStorage, &Layout),
        (b, bl): (&CudaStorage, &Layout),
        dims: Vec<usize>,
    ) -> Result<(CudaStorage, Shape)> {
        let storage = dispatch_dtype!(a.dtype(), T => {
            let out = self.launch::<T>(
                &a.device,
                &[(a.as_cuda_slice::<T>()?, al), (b.as_cuda_slice::<T>()?, bl)],
                (dims.clone(), packed_strides(&dims)),
            )?;
            CudaStorage::wrap_cuda_slice(out, a.device.clone())
        });
        Ok((storage, Shape::from(dims)))
    }

    /// The descriptors of this call on operands `a`, `b` and the result `out` (dims, strides),
    /// with the first algorithm cuDNN's heuristics rank that supports them.
    fn plan<T: Element>(&self, handle: sys::cudnnHandle_t, key: &PlanKey) -> Result<Plan> {
        let (lo, rank) = (3 - self.rank, self.rank);
        let conv = ConvDesc(result::create_convolution_descriptor()?);
        let (pad, stride) = (to_i32(&self.g.pad[lo..])?, to_i32(&self.g.stride[lo..])?);
        let dilation = vec![1; rank];
        // The math the heuristics may rank algorithms for. Half-precision operands need
        // `TENSOR_OP_MATH` to reach tensor cores (`DEFAULT_MATH` allows them only as TF32, for
        // f32), as PyTorch sets for bf16; the ranked entries then carry each algorithm's own
        // math, which the descriptor takes before the workspace is sized and the call runs
        // (cuDNN picks the kernel by algorithm and math together).
        let math = match (T::DTYPE, key.tf32) {
            (DType::F32, false) | (DType::F64, _) => sys::cudnnMathType_t::CUDNN_FMA_MATH,
            (DType::BF16, _) => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            _ => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        };
        let filter = FilterDesc(result::create_filter_descriptor()?);
        let filter_dims = to_i32(&filter_dims(&self.g, self.o, rank))?;
        // SAFETY: live descriptors; each array holds the length passed with it.
        unsafe {
            result::set_convolutionnd_descriptor(
                conv.0,
                rank as i32,
                pad.as_ptr(),
                stride.as_ptr(),
                dilation.as_ptr(),
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                T::Compute::DATA_TYPE,
            )?;
            result::set_convolution_math_type(conv.0, math)?;
            result::set_filternd_descriptor(
                filter.0,
                T::DATA_TYPE,
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                filter_dims.len() as i32,
                filter_dims.as_ptr(),
            )?;
        }
        let [a, b, out] = &key.operands;
        let tensors = match self.kind {
            Kind::Forward | Kind::BackwardData => [
                tensor_desc::<T>(&a.0, &a.1)?,
                tensor_desc::<T>(&out.0, &out.1)?,
            ],
            Kind::BackwardFilter => [tensor_desc::<T>(&a.0, &a.1)?, tensor_desc::<T>(&b.0, &b.1)?],
        };
        let (t0, t1) = (tensors[0].0, tensors[1].0);
        let mut plan = Plan {
            conv,
            filter,
            tensors,
            algo: Algorithm::Forward(
                sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            ),
            workspace: 0,
        };
        // Every algorithm, ranked; the first that takes these descriptors.
        // SAFETY: live handle and descriptors; the results array holds `COUNT` entries.
        unsafe {
            let mut count = 0;
            match self.kind {
                Kind::Forward => {
                    const COUNT: usize = 8;
                    let mut perf =
                        [std::mem::zeroed::<sys::cudnnConvolutionFwdAlgoPerf_t>(); COUNT];
                    result::get_convolution_forward_algorithm(
                        handle,
                        t0,
                        plan.filter.0,
                        plan.conv.0,
                        t1,
                        COUNT as i32,
                        &mut count,
                        perf.as_mut_ptr(),
                    )?;
                    let p = first_supported(&perf[..count as usize], |p| p.status)?;
                    result::set_convolution_math_type(plan.conv.0, p.mathType)?;
                    plan.algo = Algorithm::Forward(p.algo);
                    plan.workspace = result::get_convolution_forward_workspace_size(
                        handle,
                        t0,
                        plan.filter.0,
                        plan.conv.0,
                        t1,
                        p.algo,
                    )?;
                }
                Kind::BackwardData => {
                    const COUNT: usize = 6;
                    let mut perf =
                        [std::mem::zeroed::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(); COUNT];
                    result::get_convolution_backward_data_algorithm(
                        handle,
                        plan.filter.0,
                        t0,
                        plan.conv.0,
                        t1,
                        COUNT as i32,
                        &mut count,
                        perf.as_mut_ptr(),
                    )?;
                    let p = first_supported(&perf[..count as usize], |p| p.status)?;
                    result::set_convolution_math_type(plan.conv.0, p.mathType)?;
                    plan.algo = Algorithm::BackwardData(p.algo);
                    plan.workspace = result::get_convolution_backward_data_workspace_size(
                        handle,
                        plan.filter.0,
                        t0,
                        plan.conv.0,
                        t1,
                        p.algo,
                    )?;
                }
                Kind::BackwardFilter => {
                    const COUNT: usize = 7;
                    let mut perf =
                        [std::mem::zeroed::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(); COUNT];
                    result::get_convolution_backward_filter_algorithm(
                        handle,
                        t0,
                        t1,
                        plan.conv.0,
                        plan.filter.0,
                        COUNT as i32,
                        &mut count,
                        perf.as_mut_ptr(),
                    )?;
                    let p = first_supported(&perf[..count as usize], |p| p.status)?;
                    result::set_convolution_math_type(plan.conv.0, p.mathType)?;
                    plan.algo = Algorithm::BackwardFilter(p.algo);
                    plan.workspace = result::get_convolution_backward_filter_workspace_size(
                        handle,
                        t0,
                        t1,
                        plan.conv.0,
                        plan.filter.0,
                        p.algo,
                    )?;
                }
            }
        }
        Ok(plan)
    }

    fn launch<T: Element>(
        &self,
        dev: &CudaDevice,
        operands: &[(&CudaSlice<T>, &Layout); 2],
        (out_dims, out_strides): (Vec<usize>, Vec<usize>),
    ) -> Result<CudaSlice<T>> {
        let handle = handle(dev)?;
        let [(a, al), (b, bl)] = *operands;
        let shape_of = |l: &Layout| (l.dims().to_vec(), l.stride().to_vec());
        let key = PlanKey {
            device: dev.id(),
            kind: self.kind,
            dtype: T::DTYPE,
            tf32: TF32.load(Ordering::Relaxed),
            operands: [shape_of(al), shape_of(bl), (out_dims.clone(), out_strides)],
            conv: (self.g.stride, self.g.pad),
        };
        let cached = PLANS.with(|plans| plans.borrow().get(&key).cloned());
        let plan = match cached {
            Some(plan) => plan,
            None => {
                let plan = std::rc::Rc::new(self.plan::<T>(handle, &key)?);
                PLANS.with(|plans| plans.borrow_mut().insert(key, plan.clone()));
                plan
            }
        };
        // SAFETY: cuDNN writes every element of the result (beta = 0: the buffer is not read).
        let mut out = unsafe { dev.alloc::<T>(out_dims.iter().product())? };
        let stream = dev.cuda_stream();
        let (one, zero) = (
            T::from_f64(1.0).into_scaling_parameter(),
            T::from_f64(0.0).into_scaling_parameter(),
        );
        let (alpha, beta) = (
            (&one as *const T::Scalar).cast::<c_void>(),
            (&zero as *const T::Scalar).cast::<c_void>(),
        );
        let (a_view, b_view) = (a.slice(al.start_offset()..), b.slice(bl.start_offset()..));
        let (a_ptr, _a) = a_view.device_ptr(&stream);
        let (b_ptr, _b) = b_view.device_ptr(&stream);
        let (out_ptr, _out) = out.device_ptr_mut(&stream);
        let (a_ptr, b_ptr) = (a_ptr as *const c_void, b_ptr as *const c_void);
        let out_ptr = out_ptr as *mut c_void;
        let [t0, t1] = [plan.tensors[0].0, plan.tensors[1].0];
        let (conv, filter) = (plan.conv.0, plan.filter.0);
        with_workspace(dev, plan.workspace, |ws, size| {
            // SAFETY: the plan's descriptors describe these buffers (built from their layouts),
            // its algorithm supports them, and the workspace holds `size` bytes.
            unsafe {
                match plan.algo {
                    Algorithm::Forward(algo) => result::convolution_forward(
                        handle, alpha, t0, a_ptr, filter, b_ptr, conv, algo, ws, size, beta, t1,
                        out_ptr,
                    ),
                    Algorithm::BackwardData(algo) => result::convolution_backward_data(
                        handle, alpha, filter, b_ptr, t0, a_ptr, conv, algo, ws, size, beta, t1,
                        out_ptr,
                    ),
                    Algorithm::BackwardFilter(algo) => result::convolution_backward_filter(
                        handle, alpha, t0, a_ptr, t1, b_ptr, conv, algo, ws, size, beta, filter,
                        out_ptr,
                    ),
                }
            }
        })?;
        drop((_a, _b, _out));
        Ok(out)
    }
}

/// The first of cuDNN's ranked results whose status is success, else cuDNN's refusal.
fn first_supported<P: Copy>(ranked: &[P], status: impl Fn(&P) -> sys::cudnnStatus_t) -> Result<P> {
    match ranked
        .iter()
        .find(|p| status(p) == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
    {
        Some(p) => Ok(*p),
        None => Err(result::CudnnError(sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED).into()),
    }
}

/// Runs `call` with this device's workspace pointer and size (null and 0 when `bytes` is 0).
/// Launches on the device's one stream run in order, so one buffer serves them all; a larger
/// request replaces it (the old one is freed in stream order).
fn with_workspace(
    dev: &CudaDevice,
    bytes: usize,
    call: impl FnOnce(*mut c_void, usize) -> std::result::Result<(), result::CudnnError>,
) -> Result<()> {
    if bytes == 0 {
        return Ok(call(std::ptr::null_mut(), 0)?);
    }
    WORKSPACES.with(|spaces| {
        let mut spaces = spaces.borrow_mut();
        let fits = spaces.get(&dev.id()).is_some_and(|w| w.len() >= bytes);
        if !fits {
            // SAFETY: a workspace is scratch that cuDNN writes before it reads.
            let fresh = unsafe { dev.alloc::<u8>(bytes)? };
            spaces.insert(dev.id(), fresh);
        }
        let ws = spaces.get_mut(&dev.id()).expect("inserted above");
        let stream = dev.cuda_stream();
        let (ptr, _record) = ws.device_ptr_mut(&stream);
        Ok(call(ptr as *mut c_void, bytes)?)
    })
}
