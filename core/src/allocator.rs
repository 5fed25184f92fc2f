//! Keep freed memory in the process.
//!
//! A training step allocates and frees the same few hundred tensors every step, many of them
//! between 128 KiB and a few MiB. glibc's malloc hands such blocks back to the kernel on free
//! (`munmap`, or trimming the heap top) and maps fresh zeroed pages on the next allocation, so
//! every step pays page faults for memory it just released: VICReg-exp's covariance term took
//! 577,000 page faults in 300 steps and spent a third of its time in the kernel. Serving every
//! block from the heap (no `mmap` at all: `M_MMAP_MAX = 0`) and never trimming it lets freed
//! blocks be reused: 5,000 page faults and 1.8× faster on that run (`perf stat`, two threads).
//! Blocks over 32 MiB matter as much: glibc maps those whatever its threshold, and I-JEPA's
//! ViT-S/16 step (`train_step --row 6`, predictor activations of 200 MiB) took 11.9 M page
//! faults and 85 s of kernel time in 3 steps with only the threshold raised, 3.0 M (the first
//! touch of its 11.6 GiB peak) and 32 s with no `mmap`, at the same peak RSS. The process
//! keeps its peak heap, as PyTorch's caching allocator does. Other C libraries (musl, macOS)
//! are left as they are, and so is glibc when `SSL_GLIBC_MALLOC_DEFAULTS` is set (to give
//! memory back, or to measure the difference).

/// Tune the C allocator for tensor workloads; call once at the start of `main`.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("SSL_GLIBC_MALLOC_DEFAULTS").is_none() {
        const NEVER_TRIM: libc::c_int = libc::c_int::MAX;
        const TOP_PAD: libc::c_int = 64 << 20;
        // SAFETY: mallopt only changes allocator parameters; it is called before any thread
        // that allocates is started. A refused value (return 0) leaves glibc's default. Where
        // the heap cannot grow (`brk` refused), glibc still falls back to `mmap` for it.
        unsafe {
            libc::mallopt(libc::M_MMAP_MAX, 0);
            libc::mallopt(libc::M_TRIM_THRESHOLD, NEVER_TRIM);
            libc::mallopt(libc::M_TOP_PAD, TOP_PAD);
        }
    }
}
