//! Thread pools across `os.fork()`.
//!
//! `fork` copies only the calling thread: a child of a process whose pools had started (rayon's
//! global pool, which the evaluation, faer and gemm use) inherits pools whose worker threads do
//! not exist, and the first parallel call waits for them forever. PyTorch's `DataLoader`
//! workers are such children. So a call made in a process other than the one that imported the
//! module runs inside a rayon pool of its own, built for the call: every rayon operation inside
//! it (`par_iter`, gemm's and faer's parallel loops) runs on that pool's live threads. Candle's
//! own barrier pool notices the fork itself and runs its calls on the calling thread there
//! (`vendor/README.md`, the seventh change).

use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::prelude::*;

/// The process that imported the module (0 before it is imported).
static IMPORTED_IN: AtomicU32 = AtomicU32::new(0);

/// Records this process as the one whose pools are live; called when the module is imported.
pub fn record_start() {
    IMPORTED_IN.store(std::process::id(), Ordering::SeqCst);
}

/// Whether this process was forked from the one that imported the module.
pub fn is_forked() -> bool {
    IMPORTED_IN.load(Ordering::SeqCst) != std::process::id()
}

/// Whether this process is a fork of the one that imported `candle_ssl` (its calls then run on
/// thread pools of their own).
#[pyfunction]
pub fn forked() -> bool {
    is_forked()
}

/// Runs `f` with the GIL released, on live thread pools (see the module docs).
pub fn run<R: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> anyhow::Result<R> + Send,
) -> anyhow::Result<R> {
    py.detach(|| in_live_pools(f))
}

/// Runs `f` here, or in a process forked from the importing one, inside a rayon pool built for
/// the call.
pub fn in_live_pools<R: Send>(f: impl FnOnce() -> anyhow::Result<R> + Send) -> anyhow::Result<R> {
    if !is_forked() {
        return f();
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("candle-ssl-forked-{i}"))
        .build()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot start the threads of this forked process ({e}); its parent's pools did \
                 not survive the fork"
            )
        })?;
    pool.install(f)
}
