//! Our CUDA kernels ([`kernels.cu`](cuda/kernels.cu)): batch norm in train mode (+ReLU, with
//! its backward) and in eval mode, the residual join `relu(h + shortcut)`, max pooling, layer
//! norm, softmax over the last axis and the erf GELU with their backwards, each the GPU side of
//! the CPU custom op in `batch_norm.rs` / `residual.rs` / `pool.rs` / `layer_norm.rs` /
//! `softmax.rs` / `gelu.rs` with the same formulas (sums in double, the same first-maximum
//! rule), and a linear layer's bias add (`linear.rs`). NVRTC compiles the source once per
//! process, on first use, for the device's architecture ([`function`], which other crates'
//! kernels use too); a train-mode batch norm pass is two launches (per-segment partial sums,
//! then merge and apply) on a (channels × segments) grid; layer norm and softmax give each row
//! one warp.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId};
use candle_core::{CudaStorage, Layout, Result};

const SOURCE: &str = include_str!("cuda/kernels.cu");
const MODULE: &str = "ssl_models_kernels";
/// Threads per block (`THREADS` in the source).
const THREADS: u32 = 256;
/// Blocks a grid-stride kernel launches at most.
const MAX_BLOCKS: usize = 65_535;
/// Blocks a batch norm pass aims for: a few per multiprocessor of an H100 (132).
const TARGET_BLOCKS: usize = 512;
/// The shortest row segment a block takes.
const MIN_SEGMENT: usize = 4096;
/// The fewest rows a block of the layer norm's parameter gradients sums.
const MIN_SEGMENT_ROWS: usize = 32;

/// The function `name` of the CUDA C++ `source` (named `module`), which NVRTC compiles on the
/// first call for `dev`'s architecture, once per process; for other crates' kernels too (the
/// optimiser's). Loaded functions are kept per device, so a launch costs one map lookup.
pub fn function(
    dev: &CudaDevice,
    module: &'static str,
    source: &'static str,
    name: &str,
) -> Result<CudaFunction> {
    type Key = (DeviceId, &'static str, String);
    static LOADED: LazyLock<Mutex<HashMap<Key, CudaFunction>>> = LazyLock::new(Default::default);
    static PTX: Mutex<BTreeMap<&'static str, std::result::Result<String, String>>> =
        Mutex::new(BTreeMap::new());
    let key = (dev.id(), module, name.to_string());
    if let Some(f) = LOADED.lock().expect("the loaded kernels").get(&key) {
        return Ok(f.clone());
    }
    let mut compiled = PTX.lock().expect("the PTX cache");
    let ptx = compiled.entry(module).or_insert_with(|| {
        let (major, minor) = dev
            .cuda_stream()
            .context()
            .compute_capability()
            .map_err(|e| e.to_string())?;
        let options = nvrtc::CompileOptions {
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            ..Default::default()
        };
        nvrtc::compile_ptx_with_opts(source, options)
            .map(|ptx| ptx.to_src())
            .map_err(|e| e.to_string())
    });
    let ptx = ptx.as_deref().map_err(|e| {
        candle_core::Error::Msg(format!("NVRTC could not compile the {module} kernels: {e}"))
    })?;
    let f = dev
        .get_or_load_custom_func(name, module, ptx)?
        .into_cuda_function();
    drop(compiled);
    LOADED
        .lock()
        .expect("the loaded kernels")
        .insert(key, f.clone());
    Ok(f)
}

/// `name` of our kernels, for `T`.
fn kernel<T: Element>(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    function(dev, MODULE, SOURCE, &format!("{name}_{}", T::SUFFIX))
}

/// Element types of our kernels, with the suffix of their instantiations.
pub(crate) trait Element: CudaDType + DeviceRepr + ValidAsZeroBits {
    const SUFFIX: &'static str;
}
impl Element for f32 {
    const SUFFIX: &'static str = "f32";
}
impl Element for f64 {
    const SUFFIX: &'static str = "f64";
}

/// Runs `$body` with `$T` the Rust type of an f32 or f64 storage's dtype.
macro_rules! float_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $T = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $T = f64;
                $body
            }
            other => candle_core::bail!("our CUDA kernels take f32 or f64, got {other:?}"),
        }
    };
}
pub(crate) use float_dtype;

/// The elements of a contiguous operand of our kernels, from its layout's start.
pub(crate) fn view<'a, T: Element>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    if !l.is_contiguous() {
        candle_core::bail!(
            "our CUDA kernels take contiguous operands, got strides {:?}",
            l.stride()
        );
    }
    Ok(s.as_cuda_slice::<T>()?
        .slice(l.start_offset()..l.start_offset() + l.shape().elem_count()))
}

/// (segments per channel, segment length) for rows of `m` values in `c` channels.
fn segments(c: usize, m: usize) -> (usize, usize) {
    let s = TARGET_BLOCKS
        .div_ceil(c.max(1))
        .min(m.div_ceil(MIN_SEGMENT))
        .max(1);
    (s, m.div_ceil(s).max(1))
}

fn grid(c: usize, s: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (c as u32, s as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// What the batch norm forward leaves for its backward and the running statistics:
/// `[mean, 1/√(var + eps), γ, population variance]`, `4C` doubles.
#[derive(Debug)]
pub(crate) struct BnSaved(pub CudaSlice<f64>);

impl BnSaved {
    pub fn channels(&self) -> usize {
        self.0.len() / 4
    }
}

/// Train-mode batch norm of a contiguous `x` of `C` channels with `gamma`, `beta` (`[C]`):
/// channel `c`'s `M` values lie `inner` at a time, every `C·inner` (`[C, M]` rows: `inner = M`;
/// batch-major `[N, C, *S]`: `inner` the positions per sample). `y` is laid out as `x`.
pub(crate) fn batch_norm<T: Element>(
    dev: &CudaDevice,
    (x, gamma, beta): (CudaView<T>, CudaView<T>, CudaView<T>),
    (c, m, inner): (usize, usize, usize),
    eps: f64,
    relu: bool,
) -> Result<(CudaStorage, BnSaved)> {
    let (s, seg) = segments(c, m);
    // SAFETY: every block of the stats kernel writes its two partial sums (an empty segment
    // its zeros), and the apply kernel writes every element of `y` and `saved`.
    let (mut partial, mut y, mut saved) = unsafe {
        (
            dev.alloc::<f64>(2 * c * s)?,
            dev.alloc::<T>(c * m)?,
            dev.alloc::<f64>(4 * c)?,
        )
    };
    let (m, inner, seg, relu) = (m as i64, inner as i64, seg as i64, i32::from(relu));
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "bn_stats")?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&x)
        .arg(&mut partial)
        .arg(&m)
        .arg(&inner)
        .arg(&seg);
    // SAFETY: the arguments are the kernel's, in its order and types.
    unsafe { launch.launch(grid(c, s)) }?;
    let func = kernel::<T>(dev, "bn_apply")?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&x)
        .arg(&gamma)
        .arg(&beta)
        .arg(&partial)
        .arg(&mut y)
        .arg(&mut saved);
    launch.arg(&m).arg(&inner).arg(&seg).arg(&eps).arg(&relu);
    // SAFETY: as above.
    unsafe { launch.launch(grid(c, s)) }?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev.clone()), BnSaved(saved)))
}

/// Which running statistic [`batch_norm_running`] updates.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Running {
    Mean,
    /// Unbiased with the row length `M`: the saved population variance times `M/(M − 1)`.
    Var {
        m: usize,
    },
}

/// `running ← (1 − factor)·running + factor·statistic` in place, from a forward's saved batch
/// statistics.
pub(crate) fn batch_norm_running<T: Element>(
    running: &mut CudaStorage,
    l: &Layout,
    saved: &BnSaved,
    which: Running,
    factor: f64,
) -> Result<()> {
    let dev = running.device.clone();
    let c = saved.channels();
    let (offset, scale) = match which {
        Running::Mean => (0, 1.0),
        Running::Var { m } => (3 * c, m as f64 / (m as f64 - 1.0)),
    };
    let (start, end) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("a running statistic must be contiguous".to_string())
    })?;
    let mut values = running.as_cuda_slice_mut::<T>()?.slice_mut(start..end);
    let stream = dev.cuda_stream();
    let func = kernel::<T>(&dev, "bn_running")?;
    let mut launch = stream.launch_builder(&func);
    let (channels, offset) = (c as i64, offset as i64);
    launch
        .arg(&mut values)
        .arg(&saved.0)
        .arg(&channels)
        .arg(&offset)
        .arg(&factor)
        .arg(&scale);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(c)) }?;
    Ok(())
}

/// The batch norm backward from its input `x`, output `res` and output gradient `grad`, laid
/// out as in [`batch_norm`]: flat `[dx (C·M, laid out as x), dγ (C), dβ (C)]`.
pub(crate) fn batch_norm_backward<T: Element>(
    dev: &CudaDevice,
    (x, res, grad): (CudaView<T>, CudaView<T>, CudaView<T>),
    saved: &BnSaved,
    (c, m, inner): (usize, usize, usize),
    relu: bool,
) -> Result<CudaStorage> {
    let (s, seg) = segments(c, m);
    // SAFETY: every block of the sums kernel writes its two partial sums, and the apply kernel
    // writes every element of `out`.
    let (mut partial, mut out) =
        unsafe { (dev.alloc::<f64>(2 * c * s)?, dev.alloc::<T>(c * m + 2 * c)?) };
    let (m, inner, seg, relu) = (m as i64, inner as i64, seg as i64, i32::from(relu));
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "bn_backward_sums")?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&x)
        .arg(&res)
        .arg(&grad)
        .arg(&saved.0)
        .arg(&mut partial);
    launch.arg(&m).arg(&inner).arg(&seg).arg(&relu);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid(c, s)) }?;
    let func = kernel::<T>(dev, "bn_backward_apply")?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&x)
        .arg(&res)
        .arg(&grad)
        .arg(&saved.0)
        .arg(&partial);
    launch
        .arg(&mut out)
        .arg(&m)
        .arg(&inner)
        .arg(&seg)
        .arg(&relu);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid(c, s)) }?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// The elementwise kernel `name(inputs…, out, n)` over contiguous operands of `n` elements
/// (`gelu`, `gelu_backward`, `residual_relu`, `residual_relu_backward`).
pub(crate) fn elementwise<T: Element>(
    dev: &CudaDevice,
    name: &str,
    inputs: &[CudaView<T>],
    n: usize,
) -> Result<CudaStorage> {
    // SAFETY: the kernel writes every element.
    let mut out = unsafe { dev.alloc::<T>(n)? };
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, name)?;
    let mut launch = stream.launch_builder(&func);
    for input in inputs {
        launch.arg(input);
    }
    let n = n as i64;
    launch.arg(&mut out).arg(&n);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(n as usize)) }?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// Eval-mode batch norm of a contiguous `x` of `n` values in `channels` channels laid out as
/// [`batch_norm`]'s (`inner` at a time), from the running `mean` and `var` and `gamma`, `beta`
/// (`[C]` each): one launch.
pub(crate) fn batch_norm_eval<T: Element>(
    dev: &CudaDevice,
    [x, mean, var, gamma, beta]: [CudaView<T>; 5],
    (n, channels, inner): (usize, usize, usize),
    eps: f64,
    relu: bool,
) -> Result<CudaStorage> {
    // SAFETY: the kernel writes every element.
    let mut y = unsafe { dev.alloc::<T>(n)? };
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "bn_eval")?;
    let (n_arg, channels, inner) = (n as i64, channels as i64, inner.max(1) as i64);
    let relu = i32::from(relu);
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&x)
        .arg(&mean)
        .arg(&var)
        .arg(&gamma)
        .arg(&beta)
        .arg(&mut y);
    launch
        .arg(&n_arg)
        .arg(&channels)
        .arg(&inner)
        .arg(&eps)
        .arg(&relu);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(n)) }?;
    Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
}

/// `y + b` with `b` (`cols` values) added to every row of a contiguous `y` (`rows × cols`).
pub(crate) fn bias_add<T: Element>(
    dev: &CudaDevice,
    (y, b): (CudaView<T>, CudaView<T>),
    (rows, cols): (usize, usize),
) -> Result<CudaStorage> {
    let n = rows * cols;
    // SAFETY: the kernel writes every element.
    let mut out = unsafe { dev.alloc::<T>(n)? };
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "bias_add")?;
    let (n_arg, cols) = (n as i64, cols as i64);
    let mut launch = stream.launch_builder(&func);
    launch.arg(&y).arg(&b).arg(&mut out).arg(&n_arg).arg(&cols);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(n)) }?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// One warp per row, `THREADS / 32` rows a block, for `rows` rows.
fn warp_per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            rows.div_ceil(THREADS as usize / 32).clamp(1, MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The row kernel `name(inputs…, out, rows, k)` (`softmax` or `softmax_backward`) over
/// contiguous operands `[rows, k]`.
pub(crate) fn row_kernel<T: Element>(
    dev: &CudaDevice,
    name: &str,
    inputs: &[CudaView<T>],
    (rows, k): (usize, usize),
) -> Result<CudaStorage> {
    // SAFETY: the kernel writes every element.
    let mut out = unsafe { dev.alloc::<T>(rows * k)? };
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, name)?;
    let mut launch = stream.launch_builder(&func);
    for input in inputs {
        launch.arg(input);
    }
    let (rows_arg, k) = (rows as i64, k as i64);
    launch.arg(&mut out).arg(&rows_arg).arg(&k);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(warp_per_row(rows)) }?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// Layer norm of contiguous rows `x` (`[R, D]`) with `gamma`, `beta` (`[D]`): the output and,
/// per row, its mean and 1/√(σ² + ε) (`2R` doubles) for the backward.
pub(crate) fn layer_norm<T: Element>(
    dev: &CudaDevice,
    (x, gamma, beta): (CudaView<T>, CudaView<T>, CudaView<T>),
    (rows, d): (usize, usize),
    eps: f64,
) -> Result<(CudaStorage, CudaSlice<f64>)> {
    // SAFETY: the kernel writes every element of `y` and `saved`.
    let (mut y, mut saved) = unsafe { (dev.alloc::<T>(rows * d)?, dev.alloc::<f64>(2 * rows)?) };
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "layer_norm")?;
    let mut launch = stream.launch_builder(&func);
    let (rows_arg, d) = (rows as i64, d as i64);
    launch
        .arg(&x)
        .arg(&gamma)
        .arg(&beta)
        .arg(&mut y)
        .arg(&mut saved);
    launch.arg(&rows_arg).arg(&d).arg(&eps);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(warp_per_row(rows)) }?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev.clone()), saved))
}

/// The layer norm backward from its input `x` (`[R, D]`), `gamma` (`[D]`), the output gradient
/// `grad` (`[R, D]`) and the forward's saved row statistics: flat `[dx (R·D), dγ (D), dβ (D)]`.
/// Three launches: `dx` a warp per row; per (32 columns × row segment) block the partial sums
/// of `dγ = Σ g·x̂` and `dβ = Σ g`; their merge.
pub(crate) fn layer_norm_backward<T: Element>(
    dev: &CudaDevice,
    (x, gamma, grad): (CudaView<T>, CudaView<T>, CudaView<T>),
    saved: &CudaSlice<f64>,
    (rows, d): (usize, usize),
) -> Result<CudaStorage> {
    let n = rows * d;
    let tiles = d.div_ceil(32).max(1);
    let s = TARGET_BLOCKS
        .div_ceil(tiles)
        .min(rows.div_ceil(MIN_SEGMENT_ROWS))
        .max(1);
    let seg = rows.div_ceil(s).max(1);
    // SAFETY: the three kernels write every element of `out`, the second every partial sum.
    let (mut out, mut partial) =
        unsafe { (dev.alloc::<T>(n + 2 * d)?, dev.alloc::<f64>(2 * s * d)?) };
    let stream = dev.cuda_stream();
    let (rows_arg, d_arg, seg, segments) = (rows as i64, d as i64, seg as i64, s as i64);
    let func = kernel::<T>(dev, "layer_norm_backward")?;
    let mut launch = stream.launch_builder(&func);
    launch
        .arg(&x)
        .arg(&gamma)
        .arg(&grad)
        .arg(saved)
        .arg(&mut out);
    launch.arg(&rows_arg).arg(&d_arg);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(warp_per_row(rows)) }?;
    let func = kernel::<T>(dev, "layer_norm_param_sums")?;
    let mut launch = stream.launch_builder(&func);
    launch.arg(&x).arg(&grad).arg(saved).arg(&mut partial);
    launch.arg(&rows_arg).arg(&d_arg).arg(&seg);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid(tiles, s)) }?;
    let func = kernel::<T>(dev, "layer_norm_param_merge")?;
    let mut launch = stream.launch_builder(&func);
    let n = n as i64;
    launch
        .arg(&partial)
        .arg(&mut out)
        .arg(&n)
        .arg(&d_arg)
        .arg(&segments);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(d)) }?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
}

/// `PoolGeom` in the source: per axis (d, h, w) the input and output extents, window, stride
/// and padding.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct PoolGeom {
    pub size: [i32; 3],
    pub out: [i32; 3],
    pub k: [i32; 3],
    pub stride: [i32; 3],
    pub pad: [i32; 3],
}

// SAFETY: plain `int`s, laid out as the kernel's struct.
unsafe impl DeviceRepr for PoolGeom {}

fn grid_stride(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Max pooling of `volumes` contiguous volumes `x`: the maxima and their flat indices.
pub(crate) fn max_pool<T: Element>(
    dev: &CudaDevice,
    x: CudaView<T>,
    volumes: usize,
    g: PoolGeom,
) -> Result<(CudaStorage, CudaSlice<u32>)> {
    let n = volumes * g.out.iter().product::<i32>() as usize;
    // SAFETY: the kernel writes every output and index.
    let (mut y, mut arg) = unsafe { (dev.alloc::<T>(n)?, dev.alloc::<u32>(n)?) };
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "max_pool")?;
    let mut launch = stream.launch_builder(&func);
    let volumes = volumes as i64;
    launch
        .arg(&x)
        .arg(&mut y)
        .arg(&mut arg)
        .arg(&volumes)
        .arg(&g);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(n)) }?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev.clone()), arg))
}

/// The max pooling's input gradient from the output gradient `grad` and the forward's indices.
pub(crate) fn max_pool_backward<T: Element>(
    dev: &CudaDevice,
    grad: CudaView<T>,
    arg: &CudaSlice<u32>,
    volumes: usize,
    g: PoolGeom,
) -> Result<CudaStorage> {
    let per = g.out.iter().product::<i32>() as usize;
    let volume = g.size.iter().product::<i32>() as usize;
    let mut dx = dev.alloc_zeros::<T>(volumes * volume)?;
    let stream = dev.cuda_stream();
    let func = kernel::<T>(dev, "max_pool_backward")?;
    let mut launch = stream.launch_builder(&func);
    let (volumes, per, volume) = (volumes as i64, per as i64, volume as i64);
    launch
        .arg(&grad)
        .arg(arg)
        .arg(&mut dx)
        .arg(&volumes)
        .arg(&per)
        .arg(&volume);
    // SAFETY: as in `batch_norm`.
    unsafe { launch.launch(grid_stride(volumes as usize * per as usize)) }?;
    Ok(CudaStorage::wrap_cuda_slice(dx, dev.clone()))
}
