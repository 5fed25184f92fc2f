//! Which implementation an op takes: our fused CPU kernels, cuDNN and our kernels on CUDA (with
//! the `cuda` feature), or the composition of Candle ops that every other device runs.
//! [`composed_only`] sends this thread's ops down the composed path on every device, so the
//! composed path is checked against the fused kernels on the CPU, a whole network at a time,
//! where CI has no GPU, and against cuDNN on a GPU.

use std::cell::Cell;

use candle_core::Device;

thread_local! {
    static COMPOSED_ONLY: Cell<bool> = const { Cell::new(false) };
}

/// Whether an op on `device` runs our fused CPU kernel (else Candle's ops, composed).
pub fn fused_kernels(device: &Device) -> bool {
    device.is_cpu() && !COMPOSED_ONLY.with(Cell::get)
}

/// Whether an op on `device` runs our CUDA implementation, cuDNN or our kernels (a CUDA
/// device, built with the `cuda` feature).
pub fn cuda_ops(device: &Device) -> bool {
    cfg!(feature = "cuda") && device.is_cuda() && !COMPOSED_ONLY.with(Cell::get)
}

/// Until the returned guard drops, ops built on this thread take the composed path on every
/// device. A backward pass follows the path its forward took.
pub fn composed_only() -> ComposedOnly {
    ComposedOnly {
        previous: COMPOSED_ONLY.with(|c| c.replace(true)),
    }
}

/// Restores the previous dispatch when dropped (see [`composed_only`]).
#[must_use = "the composed path holds only while the guard lives"]
pub struct ComposedOnly {
    previous: bool,
}

impl Drop for ComposedOnly {
    fn drop(&mut self) {
        COMPOSED_ONLY.with(|c| c.set(self.previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_composes_the_cpu_until_dropped_and_nests() {
        let cpu = Device::Cpu;
        assert!(fused_kernels(&cpu));
        {
            let _outer = composed_only();
            assert!(!fused_kernels(&cpu));
            {
                let _inner = composed_only();
                assert!(!fused_kernels(&cpu));
            }
            assert!(
                !fused_kernels(&cpu),
                "the inner guard restores the outer's setting"
            );
        }
        assert!(fused_kernels(&cpu));
        let other_thread = std::thread::spawn(|| {
            let _guard = composed_only();
            fused_kernels(&Device::Cpu)
        });
        assert!(!other_thread.join().unwrap());
        assert!(fused_kernels(&cpu), "a guard holds on its own thread only");
    }
}
