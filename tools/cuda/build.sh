#!/usr/bin/env bash
# Builds the CUDA `ssl`, the train_step bench and the CUDA parity tests on a machine WITHOUT a
# CUDA toolkit or GPU, for a GPU machine with driver 580 (CUDA 13.0) and an sm_90 card (H100,
# H200), and with the feature nccl an `ssl_nccl` and the two NCCL tests (distributed/tests/nccl.rs,
# bin/tests/nccl.rs), then packs them stripped into DIR/cuda-bins.txz for
# tools/cuda/device.sh.
#
#   tools/cuda/build.sh DIR    (CUDA_WHEELS: where the toolkit wheels go, /tmp/cuda13)
#
# nvcc comes from NVIDIA's PyPI wheels, pinned to 13.0: PTX from a newer nvcc has an ISA the
# 13.0 driver cannot load. cudarc links libcuda.so.1 at build time, and the driver library is
# not on PyPI, so the link uses a stub of the driver functions cudarc declares; the real one is
# loaded on the GPU machine. cuBLAS, cuRAND and the CUDA runtime are the wheels' (13.x sonames),
# cuDNN 9 its wheel's (the GPU machine's PyTorch brings its own libcudnn.so.9). cudarc links
# NCCL at build time too (`-lnccl`): libnccl.so is the nvidia-nccl-cu13 wheel's libnccl.so.2
# (340 MB, too large to travel; the GPU machine's PyTorch brings its own libnccl.so.2). Only the
# NCCL builds link it, so the other binaries run without it.
set -euo pipefail
out=$(realpath "${1:?usage: build.sh DIR}")
root=${CUDA_WHEELS:-/tmp/cuda13}
cu=$root/nvidia/cu13
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
if [ ! -x "$cu/bin/nvcc" ]; then
  mkdir -p "$root/wheels"
  for p in nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl \
           nvidia-cuda-nvrtc nvidia-cublas; do
    python3 -m pip download -q --no-deps -d "$root/wheels" "$p==13.0.*"
  done
  python3 -m pip download -q --no-deps -d "$root/wheels" "nvidia-curand==10.4.*"
  python3 -m pip download -q --no-deps -d "$root/wheels" "nvidia-cudnn-cu13==9.*"
  for w in "$root"/wheels/*.whl; do python3 -m zipfile -e "$w" "$root"; done
  chmod +x "$cu"/bin/* "$cu"/nvvm/bin/*
  (cd "$cu/lib" && for l in cublas cublasLt cudart nvrtc; do ln -sf "lib$l.so.13" "lib$l.so"; done \
     && ln -sf libcurand.so.10 libcurand.so)
  ln -sf "$(find "$root/nvidia" -name libcudnn.so.9 | head -1)" "$cu/lib/libcudnn.so"
  mkdir -p "$cu/lib/stubs"
  (cd "$repo" && cargo fetch -q)
  sys=$(find ~/.cargo/registry/src -path '*cudarc-*/src/driver/sys/mod.rs' | head -1)
  grep -oE '^ *fn cu[A-Za-z0-9_]*\(' "$sys" | sed -E 's/ *fn (cu[A-Za-z0-9_]*)\(/\1/' | sort -u \
    | awk '{print "int " $1 "(void) { return 999; }"}' > "$root/cuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cu/lib/stubs/libcuda.so" "$root/cuda_stub.c"
fi
if [ ! -e "$cu/lib/libnccl.so" ]; then
  mkdir -p "$root/wheels"
  python3 -m pip download -q --no-deps -d "$root/wheels" "nvidia-nccl-cu13==2.*"
  python3 -m zipfile -e "$(ls "$root"/wheels/nvidia_nccl_cu13-*.whl | tail -1)" "$root"
  ln -sf "$root/nvidia/nccl/lib/libnccl.so.2" "$cu/lib/libnccl.so"
fi
export PATH=$cu/bin:$PATH CUDA_ROOT=$cu CUDA_HOME=$cu CUDA_COMPUTE_CAP=90 \
  LIBRARY_PATH=$cu/lib/stubs:$cu/lib CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/target_cuda}
cd "$repo"
mkdir -p "$out" && staging=$(mktemp -d)
# The NCCL builds first: the CUDA-only build below relinks release/ssl. A test binary's path is
# the one cargo prints as `Executable`.
executable() { tee -a /dev/stderr | sed -n 's/^ *Executable .*(\(.*\))$/\1/p'; }
cp "$(cargo test --release -p ssl-dist --features nccl --test nccl --no-run 2>&1 | executable)" \
  "$staging/nccl_dist_test"
cp "$(cargo test --release -p ssl --features nccl --test nccl --no-run 2>&1 | executable)" \
  "$staging/nccl_run_test"
cp "$CARGO_TARGET_DIR/release/ssl" "$staging/ssl_nccl"
cargo build --release -p ssl --features cuda --bins
cargo build --release -p ssl-train --features cuda --bench train_step
cargo test --release -p ssl-train --features cuda --test cuda --no-run
# CUPTI (headers, and libcupti.so.13 to link against; the GPU machine's PyTorch brings its own)
# for the LD_PRELOAD kernel profiler kernel_profile.c.
if [ ! -f "$cu/include/cupti.h" ]; then
  mkdir -p "$root/wheels"
  python3 -m pip download -q --no-deps -d "$root/wheels" "nvidia-cuda-cupti==13.0.*"
  for w in "$root"/wheels/nvidia_cuda_cupti-*.whl; do python3 -m zipfile -e "$w" "$root"; done
fi
newest() { ls -t "$CARGO_TARGET_DIR"/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
cp "$CARGO_TARGET_DIR/release/ssl" "$staging/ssl"
cp "$(newest train_step)" "$staging/train_step"
cp "$(newest cuda)" "$staging/cuda_test"
cc -O2 -Wall -Wextra -shared -fPIC -I"$cu/include" -o "$staging/libkernel_profile.so" \
  "$repo/tools/cuda/kernel_profile.c" -L"$cu/lib" -l:libcupti.so.13 -lpthread
strip "$staging"/*
# One xz stream with a dictionary wider than a binary: the binaries share most of their bytes
# (Candle's PTX), which then compress once (19 MB where -T0 -6 gave 56 MB; about 5 minutes).
tar -C "$staging" -cf - ssl ssl_nccl train_step cuda_test nccl_dist_test nccl_run_test \
  libkernel_profile.so | xz -T1 --lzma2=preset=6,dict=192MiB > "$out/cuda-bins.txz"
rm -r "$staging"
ls -l "$out/cuda-bins.txz"
