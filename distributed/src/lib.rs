//! Data-parallel training for candle-ssl.
//!
//! One process per rank, started by a launcher (`mpirun`, SLURM's `srun`); every rank holds the
//! whole model, reads its own shard of each global batch, and its gradients are averaged over the
//! ranks in buckets, during the backward pass where the back end allows it ([`GradientAveraging`]),
//! so every rank takes the same optimiser step. Objectives with batch statistics gather the global
//! batch through [`ssl_core::Collective::all_gather`]; [`Comm`] adds what the trainer itself needs
//! (rank, all-reduce, barrier, abort).
//!
//! Back ends: [`SingleProcess`] (world size 1, no communication) always; `MpiCollective` over the
//! system OpenMPI with the cargo feature `mpi`; `NcclCollective` with the feature `nccl`, one
//! process per GPU, NCCL carrying the tensors on the devices and MPI the control (so more than
//! one rank needs both features). The default build needs neither MPI nor CUDA. The NCCL back
//! end is compile-checked only: its tests (`tests/nccl.rs`, world size 1) wait for a session
//! with a GPU, and no machine this project is tested on has several.
//!
//! # Example
//!
//! The launcher and core share of a rank read from its environment, and one process's gradient
//! averaging, which leaves every gradient as it is:
//!
//! ```
//! use candle_core::{Device, Var};
//! use ssl_dist::{detect_launch, reduce_gradients, Collective, CoreShare, SingleProcess};
//!
//! // `mpirun -np 4` gives each process OMPI_COMM_WORLD_SIZE=4.
//! let env = |name: &str| (name == "OMPI_COMM_WORLD_SIZE").then(|| "4".to_string());
//! let launch = detect_launch(env)?.expect("a launcher");
//! assert_eq!((launch.variable, launch.processes), ("OMPI_COMM_WORLD_SIZE", 4));
//! assert_eq!(detect_launch(|_| None)?, None);
//! // Four ranks not bound to cores share a 16-core node: 4 threads each.
//! assert_eq!(CoreShare::of(16, 16, false, Some(4)).threads, 4);
//!
//! let w = Var::new(&[1f32, 2., 3.], &Device::Cpu)?;
//! let mut grads = w.as_tensor().sqr()?.sum_all()?.backward()?; // 2w
//! reduce_gradients(&SingleProcess, &[("w".into(), w.clone())], &mut grads, 1 << 20)?;
//! assert_eq!(grads.get(&w).unwrap().to_vec1::<f32>()?, [2., 4., 6.]);
//! assert_eq!(SingleProcess.world_size(), 1);
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
pub use ssl_core::{Collective, SingleProcess};

mod averaging;
pub use averaging::{reduce_gradients, Averaged, Complete, GradientAveraging, BUCKET_ELEMENTS};
#[cfg(feature = "mpi")]
mod mpi_backend;
#[cfg(feature = "mpi")]
pub use mpi_backend::{CollectiveTimeout, MpiCollective, STALL_VARIABLE};
#[cfg(feature = "nccl")]
mod nccl_backend;
#[cfg(feature = "nccl")]
pub use nccl_backend::NcclCollective;

/// How long a collective waits for the other ranks before it fails, unless
/// [`Comm::set_collective_timeout`] says otherwise.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);

/// When a back end all-reduces the gradient buckets of a step ([`Comm::gradient_reduction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradientReduction {
    /// After the backward pass, one bucket after the other.
    AfterBackward,
    /// While the backward pass goes on, on a thread of its own that waits for each bucket's
    /// all-reduce (MPI at thread level `Multiple`, over a communicator of its own).
    OnThread,
    /// While the backward pass goes on, enqueued from the backward's thread as each bucket
    /// completes and run asynchronously (NCCL on a stream of its own);
    /// [`Comm::gradients_reduced`] waits for them.
    Enqueued,
}

/// A data-parallel communicator: the trainer's view of the ranks.
///
/// Its rank ([`Collective::rank`]) is the process's, `0..world_size()`; rank 0 writes logs and
/// checkpoints.
pub trait Comm: Collective {
    /// Replaces `buf` on every rank by its element-wise sum over all ranks.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;
    /// [`Self::all_reduce_sum`] in double precision (logged losses).
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;
    /// The element-wise sum over all ranks of `t` (the same shape on every rank), on `t`'s
    /// device; not differentiable. By default through the host in `f32`
    /// ([`Self::all_reduce_sum`]); NCCL keeps it on the GPU.
    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        if t.dtype() == DType::F64 {
            let mut buf = t.flatten_all()?.to_vec1::<f64>()?;
            self.all_reduce_sum_f64(&mut buf)?;
            return Ok(Tensor::from_vec(buf, t.shape(), t.device())?);
        }
        let mut buf = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        self.all_reduce_sum(&mut buf)?;
        Ok(Tensor::from_vec(buf, t.shape(), t.device())?.to_dtype(t.dtype())?)
    }
    /// [`Self::all_reduce_sum_tensor`] of a gradient bucket, in [`Self::bucket_dtype`]; every
    /// rank reduces its buckets in the same order, when and where [`Self::gradient_reduction`]
    /// says.
    fn all_reduce_gradients(&self, bucket: &Tensor) -> Result<Tensor> {
        self.all_reduce_sum_tensor(bucket)
    }
    /// The dtype in which the gradients of parameters of dtype `params` travel and are summed:
    /// `f64` for `f64` parameters, so that double-precision training over several ranks equals
    /// one process to double precision; `f32` for every other (bf16 and f16 gradients are
    /// summed in `f32`, not rounded to their own precision at each rank's addition).
    fn bucket_dtype(&self, params: DType) -> DType {
        match params {
            DType::F64 => DType::F64,
            _ => DType::F32,
        }
    }
    /// When gradient buckets are all-reduced ([`GradientAveraging`]).
    fn gradient_reduction(&self) -> GradientReduction {
        GradientReduction::AfterBackward
    }
    /// With [`GradientReduction::Enqueued`]: makes what runs next on the calling thread wait for
    /// every bucket all-reduce enqueued so far; the sums may be read after it.
    fn gradients_reduced(&self) -> Result<()> {
        Ok(())
    }
    /// The device this rank must train on, when the communicator is bound to one (NCCL:
    /// `cuda:<local rank>`, the very device its collectives run on).
    fn device(&self) -> Option<&Device> {
        None
    }
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
    /// A barrier at which the other ranks wait while rank 0 works alone (monitoring,
    /// checkpoints, the end-of-run evaluation), for as long as that takes; rank 0's side is
    /// bounded like every collective.
    fn wait_for_rank_zero(&self) -> Result<()> {
        self.barrier()
    }
    /// Bounds this rank's later collectives: one that has not completed within `limit` (another
    /// rank never joined it) fails with an error naming it and the rank, instead of waiting
    /// forever. [`DEFAULT_COLLECTIVE_TIMEOUT`] until set; one process has nothing to bound.
    fn set_collective_timeout(&self, _limit: Duration) {}
    /// Ends every rank of the job with exit status `code` (a failed rank must not leave the
    /// others waiting in a collective).
    fn abort(&self, code: i32) -> !;
    /// The same communicator as the objectives' [`Collective`].
    fn as_collective(&self) -> &dyn Collective;
}

impl Comm for SingleProcess {
    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
    fn as_collective(&self) -> &dyn Collective {
        self
    }
}

/// The `--distributed` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// One process, no communication.
    None,
    /// OpenMPI (feature `mpi`).
    Mpi,
    /// NCCL on one GPU per process (feature `nccl`; `mpi` too for more than one process).
    Nccl,
}

impl FromStr for Backend {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Self::None),
            "mpi" => Ok(Self::Mpi),
            "nccl" => Ok(Self::Nccl),
            other => bail!("unknown --distributed `{other}`; choose mpi, nccl or none"),
        }
    }
}

/// A launcher's process count, read from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The variable it came from.
    pub variable: &'static str,
    pub processes: usize,
}

/// The environment variables that carry a launcher's process count, in the order they are read:
/// OpenMPI's `mpirun`, a PMI launcher (MPICH's Hydra, `srun --mpi=pmi2`), and SLURM's `srun`.
/// `SLURM_STEP_NUM_TASKS` rather than `SLURM_NTASKS`: the latter is also set in an `sbatch`
/// script outside any `srun`, where `ssl run` is one process.
pub const LAUNCH_VARIABLES: [&str; 3] =
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"];

/// The launcher this process was started by, if any, as `env` (a variable's value) reports it.
pub fn detect_launch(env: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    for variable in LAUNCH_VARIABLES {
        if let Some(value) = env(variable) {
            let processes = value.trim().parse().with_context(|| {
                format!("the launcher set {variable}={value:?}, which is not a process count")
            })?;
            return Ok(Some(Launch {
                variable,
                processes,
            }));
        }
    }
    Ok(None)
}

/// The environment variables that carry a process's rank on its node, in the order they are
/// read: OpenMPI's `mpirun`, SLURM's `srun` and MPICH's Hydra.
pub const LOCAL_RANK_VARIABLES: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
    "MPI_LOCALRANKID",
];

/// This process's rank on its node (under NCCL, the GPU it trains on), if a launcher set one,
/// as `env` (a variable's value) reports it.
pub fn local_rank(env: impl Fn(&str) -> Option<String>) -> Result<Option<usize>> {
    LOCAL_RANK_VARIABLES
        .into_iter()
        .find_map(|variable| env(variable).map(|value| (variable, value)))
        .map(|(variable, value)| {
            value.trim().parse().with_context(|| {
                format!("the launcher set {variable}={value:?}, which is not a local rank")
            })
        })
        .transpose()
}

/// The environment variables that carry how many ranks a launcher started on this node, in the
/// order they are read: OpenMPI's `mpirun`, SLURM's `srun` (given `--ntasks-per-node`) and
/// MPICH's Hydra.
pub const LOCAL_SIZE_VARIABLES: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE",
    "MPI_LOCALNRANKS",
];

/// How many ranks the launcher started on this node, if it said, as `env` (a variable's value)
/// reports it.
pub fn local_ranks(env: impl Fn(&str) -> Option<String>) -> Result<Option<usize>> {
    LOCAL_SIZE_VARIABLES
        .into_iter()
        .find_map(|variable| env(variable).map(|value| (variable, value)))
        .map(|(variable, value)| match value.trim().parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("the launcher set {variable}={value:?}, which is not a number of ranks"),
        })
        .transpose()
}

/// A rank's share of its node's cores: the CPU threads it trains with when none are asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreShare {
    pub threads: usize,
    /// The cores this process may use: its affinity mask, narrowed by a CPU quota.
    pub usable: usize,
    /// The node's online cores.
    pub online: usize,
    /// Whether the launcher bound this rank to some of the cores (its mask is not all of them).
    pub bound: bool,
    /// The ranks on this node, `None` where the launcher did not say.
    pub local_ranks: Option<usize>,
}

impl CoreShare {
    /// The share of `usable` cores (of `online`) for one of `local_ranks` ranks on the node: an
    /// unbound rank shares its cores with the others (`usable ÷ ranks`); a bound one keeps its
    /// own, at most `online ÷ ranks` (ranks bound to one socket together share it). At least 1.
    pub fn of(usable: usize, online: usize, bound: bool, local_ranks: Option<usize>) -> Self {
        let ranks = local_ranks.unwrap_or(1).max(1);
        let threads = match bound {
            true => usable.min(online / ranks),
            false => usable / ranks,
        };
        Self {
            threads: threads.max(1),
            usable,
            online,
            bound,
            local_ranks,
        }
    }

    /// This process's share, its cores read from the system (the affinity mask and online count
    /// on Linux; elsewhere every core counts as usable and unbound).
    pub fn of_this_process(local_ranks: Option<usize>) -> Self {
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (mask, online) = affinity_and_online().unwrap_or((usable, usable));
        Self::of(usable.min(mask), online, mask < online, local_ranks)
    }
}

impl std::fmt::Display for CoreShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let threads = self.threads;
        let ranks = match self.local_ranks {
            Some(n) => format!("{n} rank(s) on this node"),
            None => "the launcher did not say how many ranks share this node; 1 assumed".into(),
        };
        match self.bound {
            true => write!(
                f,
                "{threads} CPU thread(s) per rank: the {} core(s) the launcher bound this rank to, \
                 at most {} online ÷ {ranks}",
                self.usable, self.online
            ),
            false => write!(
                f,
                "{threads} CPU thread(s) per rank: {} core(s) ÷ {ranks}",
                self.usable
            ),
        }
    }
}

/// The number of cores in this process's affinity mask and online on the machine.
#[cfg(target_os = "linux")]
fn affinity_and_online() -> Option<(usize, usize)> {
    // SAFETY: `cpu_set_t` is plain data, zeroed is an empty set; sched_getaffinity writes at
    // most its size; sysconf takes no pointers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let mask = libc::CPU_COUNT(&set) as usize;
        let online = libc::sysconf(libc::_SC_NPROCESSORS_ONLN);
        (mask > 0 && online > 0).then_some((mask, online as usize))
    }
}

#[cfg(not(target_os = "linux"))]
fn affinity_and_online() -> Option<(usize, usize)> {
    None
}

/// The communicator `ssl run` trains with: `requested` (`--distributed`), or when absent `mpi`
/// under a launcher of more than one process and `none` otherwise. Refuses `mpi` or `nccl` in a
/// build without its feature, and `none` under a multi-process launcher (every process would
/// train the whole job into the same run directory).
pub fn connect(requested: Option<Backend>) -> Result<Arc<dyn Comm>> {
    let launch = detect_launch(|v| std::env::var(v).ok())?;
    let many = launch.as_ref().filter(|l| l.processes > 1);
    match (requested, many) {
        (Some(Backend::None), Some(l)) => bail!(
            "--distributed none, but the launcher started {} processes ({}={}): each would train \
             the whole job into the same run directory; launch one process, or use --distributed \
             mpi (nccl on GPUs)",
            l.processes,
            l.variable,
            l.processes
        ),
        (Some(Backend::None), None) | (None, None) => Ok(Arc::new(SingleProcess)),
        (Some(Backend::Mpi), _) | (None, Some(_)) => mpi(launch.as_ref()),
        (Some(Backend::Nccl), _) => nccl(launch.as_ref()),
    }
}

#[cfg(feature = "mpi")]
fn mpi(launch: Option<&Launch>) -> Result<Arc<dyn Comm>> {
    let comm = MpiCollective::init()?;
    if let Some(l) = launch {
        if l.processes != comm.world_size() {
            bail!(
                "the launcher started {} processes ({}), but MPI sees a world of {}: this OpenMPI \
                 cannot talk to that launcher; start the job with mpirun, or with srun --mpi=pmix \
                 (srun --mpi=list shows what SLURM offers)",
                l.processes,
                l.variable,
                comm.world_size()
            );
        }
    }
    Ok(Arc::new(comm))
}

#[cfg(not(feature = "mpi"))]
fn mpi(launch: Option<&Launch>) -> Result<Arc<dyn Comm>> {
    let by = match launch {
        Some(l) => format!(
            " (the launcher started {} processes: {})",
            l.processes, l.variable
        ),
        None => String::new(),
    };
    bail!(
        "data-parallel training over MPI was asked for{by}, but ssl was built without the mpi \
         feature; rebuild with `--features mpi` (needs OpenMPI: apt-get install openmpi-bin \
         libopenmpi-dev libclang-dev), or run one process with --distributed none"
    )
}

/// NCCL for the tensors, on `cuda:<local rank>`; control over MPI under a launcher of more than
/// one process, local otherwise.
#[cfg(feature = "nccl")]
fn nccl(launch: Option<&Launch>) -> Result<Arc<dyn Comm>> {
    let control: Arc<dyn Comm> = match launch.filter(|l| l.processes > 1) {
        Some(l) => nccl_control(l)?,
        None => Arc::new(SingleProcess),
    };
    let local = match local_rank(|v| std::env::var(v).ok())? {
        Some(local) => local,
        None if control.world_size() == 1 => 0,
        None => bail!(
            "--distributed nccl: rank {} cannot tell which GPU is its own, as the launcher set \
             none of {}; start the job with mpirun or srun",
            control.rank(),
            LOCAL_RANK_VARIABLES.join(", ")
        ),
    };
    Ok(Arc::new(NcclCollective::init(control, local)?))
}

#[cfg(all(feature = "nccl", feature = "mpi"))]
fn nccl_control(launch: &Launch) -> Result<Arc<dyn Comm>> {
    mpi(Some(launch))
}

#[cfg(all(feature = "nccl", not(feature = "mpi")))]
fn nccl_control(launch: &Launch) -> Result<Arc<dyn Comm>> {
    bail!(
        "--distributed nccl over {} processes ({}) needs MPI for its control (ranks, the NCCL \
         id, barriers), but ssl was built without the mpi feature; rebuild with `--features \
         mpi,nccl` (needs OpenMPI: apt-get install openmpi-bin libopenmpi-dev libclang-dev), or \
         launch one process",
        launch.processes,
        launch.variable
    )
}

#[cfg(not(feature = "nccl"))]
fn nccl(launch: Option<&Launch>) -> Result<Arc<dyn Comm>> {
    let by = match launch {
        Some(l) => format!(
            " (the launcher started {} processes: {})",
            l.processes, l.variable
        ),
        None => String::new(),
    };
    bail!(
        "data-parallel training over NCCL was asked for{by}, but ssl was built without the nccl \
         feature; rebuild with `--features nccl` (a CUDA build; add mpi for more than one \
         process), or use --distributed mpi or none"
    )
}

/// Every rank's `[rows, row length]` for an all-gather, rank by rank (`2 × world` values),
/// checked equal: the gather takes the same count from every rank, and a rank with fewer rows
/// would read past its buffer.
#[cfg(any(feature = "mpi", feature = "nccl"))]
fn check_gather_shapes(shapes: &[u64]) -> candle_core::Result<()> {
    let world = shapes.len() / 2;
    match (0..world).find(|r| shapes[2 * r..2 * r + 2] != shapes[..2]) {
        Some(r) => candle_core::bail!(
            "all_gather needs the same shape on every rank: rank 0 has {} rows of {} values, \
             rank {r} {} of {}; give every rank batches of the same size (train.drop_last)",
            shapes[0],
            shapes[1],
            shapes[2 * r],
            shapes[2 * r + 1]
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn launchers_are_read_in_order_and_a_bad_count_is_an_error() {
        assert_eq!(detect_launch(env(&[])).unwrap(), None);
        let l = detect_launch(env(&[("SLURM_STEP_NUM_TASKS", "4"), ("PMI_SIZE", "2")])).unwrap();
        assert_eq!(
            l,
            Some(Launch {
                variable: "PMI_SIZE",
                processes: 2
            })
        );
        // SLURM_NTASKS alone is an sbatch script, not a launched step.
        assert_eq!(detect_launch(env(&[("SLURM_NTASKS", "8")])).unwrap(), None);
        let e = detect_launch(env(&[("OMPI_COMM_WORLD_SIZE", "two")])).unwrap_err();
        assert!(e.to_string().contains("OMPI_COMM_WORLD_SIZE"), "{e}");
    }

    #[test]
    fn backend_names_parse_and_others_are_refused() {
        assert_eq!("mpi".parse::<Backend>().unwrap(), Backend::Mpi);
        assert_eq!("nccl".parse::<Backend>().unwrap(), Backend::Nccl);
        assert_eq!("none".parse::<Backend>().unwrap(), Backend::None);
        let e = "gloo".parse::<Backend>().unwrap_err().to_string();
        assert!(e.contains("choose mpi, nccl or none"), "{e}");
    }

    #[test]
    fn local_ranks_are_read_in_order_and_a_bad_one_is_an_error() {
        assert_eq!(local_rank(env(&[])).unwrap(), None);
        let both = [("MPI_LOCALRANKID", "3"), ("SLURM_LOCALID", "1")];
        assert_eq!(local_rank(env(&both)).unwrap(), Some(1));
        let e = local_rank(env(&[("OMPI_COMM_WORLD_LOCAL_RANK", "x")])).unwrap_err();
        assert!(e.to_string().contains("OMPI_COMM_WORLD_LOCAL_RANK"), "{e}");
    }

    #[test]
    fn local_rank_counts_are_read_in_order_and_a_bad_one_is_an_error() {
        assert_eq!(local_ranks(env(&[])).unwrap(), None);
        let both = [("MPI_LOCALNRANKS", "3"), ("SLURM_NTASKS_PER_NODE", "4")];
        assert_eq!(local_ranks(env(&both)).unwrap(), Some(4));
        for bad in ["0", "two"] {
            let e = local_ranks(env(&[("OMPI_COMM_WORLD_LOCAL_SIZE", bad)])).unwrap_err();
            assert!(e.to_string().contains("OMPI_COMM_WORLD_LOCAL_SIZE"), "{e}");
        }
    }

    /// Unbound ranks split their cores; a rank bound to its own cores keeps them, and ranks
    /// bound to one socket together split it; never fewer than one thread.
    #[test]
    fn a_rank_takes_its_share_of_the_cores() {
        assert_eq!(CoreShare::of(2, 2, false, Some(2)).threads, 1);
        assert_eq!(CoreShare::of(16, 16, false, Some(4)).threads, 4);
        assert_eq!(CoreShare::of(16, 16, false, None).threads, 16);
        assert_eq!(CoreShare::of(2, 2, false, Some(3)).threads, 1);
        // mpirun -np 2 binds each rank to a core; srun --cpus-per-task=4 to four.
        assert_eq!(CoreShare::of(1, 2, true, Some(2)).threads, 1);
        assert_eq!(CoreShare::of(4, 32, true, Some(8)).threads, 4);
        // mpirun -np 8 on two 16-core sockets binds four ranks to each socket.
        assert_eq!(CoreShare::of(16, 32, true, Some(8)).threads, 4);
        let line = CoreShare::of(2, 2, false, Some(2)).to_string();
        assert!(
            line.contains("1 CPU thread(s) per rank: 2 core(s) ÷ 2 rank(s)"),
            "{line}"
        );
    }

    /// Without the feature, asking for NCCL names the feature to build with.
    #[cfg(not(feature = "nccl"))]
    #[test]
    fn nccl_without_the_feature_says_how_to_rebuild() {
        let e = connect(Some(Backend::Nccl)).err().unwrap().to_string();
        assert!(e.contains("rebuild with `--features nccl`"), "{e}");
    }

    /// Without the feature, asking for MPI names the feature to build with.
    #[cfg(not(feature = "mpi"))]
    #[test]
    fn mpi_without_the_feature_says_how_to_rebuild() {
        let e = connect(Some(Backend::Mpi)).err().unwrap().to_string();
        assert!(e.contains("rebuild with `--features mpi`"), "{e}");
    }
}
