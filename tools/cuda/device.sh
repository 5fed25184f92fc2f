#!/usr/bin/env bash
# On the GPU machine, from the repository root, with DIR/cuda-bins.txz from build.sh, in one
# call: the CUDA parity tests, the NCCL tests at world size 1 (distributed/tests/nccl.rs, then
# bin/tests/nccl.rs with ssl_nccl), the six train_step rows in f32 — ours, (rows 1 and 3) ours
# with cudarc's per-buffer events on as before, ours through the composed ops (the GPU path
# before cuDNN and our kernels), PyTorch with its defaults and with cudnn.benchmark, in that
# order, row by row (rows 5 and 6, MAE and I-JEPA on a ViT-S/16: ours and PyTorch's defaults
# only, a ViT's one convolution being its patch embedding) — then the rows in bf16 (ours
# against PyTorch autocast), kernel profiles of the step (CUPTI, libkernel_profile.so: ours,
# PyTorch, composed) with the check that a step copies nothing from the device to the host
# (copies_per_step.log); the main job on the GPU runs after the f32 rows. Logs and JSON go to
# OUT (default DIR), packed after each phase into ARCHIVE (a .tgz) if given, so a run cut short
# still returns what it finished, the profiles coming last.
#
#   tools/cuda/device.sh DIR [OUT [ARCHIVE]]
set -u
dir=$(realpath "${1:?usage: device.sh DIR [OUT [ARCHIVE]]}")
out=$(realpath -m "${2:-$dir}")
archive=${3:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$dir/cuda-bins.txz" "$dir"
# The driver's library and PyTorch's CUDA 13 wheels (runtime, cuBLAS, NVRTC, cuDNN, CUPTI, NCCL).
roots="/usr /opt $(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null)"
libs=$(for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcuda.so.1 \
  libnvrtc.so.13 libcudnn.so.9 libcupti.so.13 libnccl.so.2; do
  find $roots -name "$l" 2>/dev/null | head -1 | xargs -r dirname; done | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
ldd "$dir/ssl" "$dir/libkernel_profile.so" "$dir/ssl_nccl" | grep "not found"
kp=$dir/libkernel_profile.so
ldd "$kp" | grep -q "not found" && kp=

stamp() {
  echo "$(date +%T) $*" | tee -a "$out/progress.log"
  [ -z "$archive" ] || tar -czf "$archive" -C "$out" .
}
stamp start
timeout 200 "$dir/cuda_test" --test-threads 1 --nocapture > "$out/cuda_test.log" 2>&1
echo "cuda_test exit $?" | tee -a "$out/cuda_test.log"
stamp tests
timeout 60 "$dir/nccl_dist_test" --test-threads 1 --nocapture > "$out/nccl_test.log" 2>&1
echo "nccl_dist_test exit $?" | tee -a "$out/nccl_test.log"
SSL_BIN="$dir/ssl_nccl" timeout 240 "$dir/nccl_run_test" --nocapture >> "$out/nccl_test.log" 2>&1
echo "nccl_run_test exit $?" | tee -a "$out/nccl_test.log"
stamp nccl

bench="--device cuda --steps 10 --warmup 3"
for r in 1 2 3 4 5 6; do
  timeout 60 "$dir/train_step" --row $r $bench
  case $r in 1 | 3) timeout 60 "$dir/train_step" --row $r $bench --event-tracking ;; esac
  case $r in [1-4]) timeout 90 "$dir/train_step" --row $r $bench --composed ;; esac
  timeout 90 python3 tools/twins/train_step.py --row $r $bench
  case $r in [1-4]) timeout 90 python3 tools/twins/train_step.py --row $r $bench --cudnn-benchmark ;; esac
done > "$out/train_step.jsonl" 2> "$out/train_step.err"
stamp f32 rows
start=$SECONDS
timeout 150 "$dir/ssl" run --device cuda --out /tmp/ssl-cuda-run > "$out/ssl_run.log" 2>&1
echo "exit $?, wall $((SECONDS - start)) s" >> "$out/ssl_run.log"
tail -3 /tmp/ssl-cuda-run/metrics.jsonl >> "$out/ssl_run.log"
stamp main job
for r in 1 2 3 4 5 6; do
  timeout 60 "$dir/train_step" --row $r $bench --precision bf16
  timeout 90 python3 tools/twins/train_step.py --row $r $bench --bf16
done > "$out/train_step_bf16.jsonl" 2> "$out/train_step_bf16.err"
stamp bf16 rows

# Kernel profiles: 2 untimed + 5 steps each (step times under CUPTI are not quoted).
profile="--device cuda --steps 5 --warmup 2"
if [ -n "$kp" ]; then
  for r in 1 3 4; do
    timeout 90 env SSL_KERNEL_PROFILE="$out/kprof_ours_r$r.json" LD_PRELOAD="$kp" \
      "$dir/train_step" --row $r $profile
    timeout 120 env SSL_KERNEL_PROFILE="$out/kprof_torch_r$r.json" LD_PRELOAD="$kp" \
      python3 tools/twins/train_step.py --row $r $profile
  done > "$out/kprof.log" 2>&1
  timeout 120 env SSL_KERNEL_PROFILE="$out/kprof_composed_r1.json" LD_PRELOAD="$kp" \
    "$dir/train_step" --row 1 $profile --composed >> "$out/kprof.log" 2>&1
  timeout 120 env SSL_KERNEL_PROFILE="$out/kprof_bf16_r1.json" LD_PRELOAD="$kp" \
    "$dir/train_step" --row 1 $profile --precision bf16 >> "$out/kprof.log" 2>&1
  for r in 1 3 4; do
    python3 tools/cuda/kernel_profile.py "$out/kprof_ours_r$r.json" \
      "$out/kprof_torch_r$r.json" --steps 7 --labels ours,torch
  done > "$out/kprof_summary.txt" 2>&1
  python3 tools/cuda/kernel_profile.py "$out/kprof_composed_r1.json" \
    "$out/kprof_ours_r1.json" --steps 7 --labels composed,ours >> "$out/kprof_summary.txt" 2>&1
  python3 tools/cuda/kernel_profile.py "$out/kprof_bf16_r1.json" --steps 7 --top 25 \
    >> "$out/kprof_summary.txt" 2>&1
  # No host synchronisation inside a step: rows 1 (VICReg) and 3 (IConE), and row 1's encoder
  # with SwAV (Sinkhorn on the device), at 2 + 3 and 2 + 8 steps; the difference is 5 steps'
  # copies, which must hold no device-to-host copy.
  for case in "1 vicreg" "3 icone" "1 swav"; do
    set -- $case
    for n in 3 8; do
      timeout 90 env SSL_KERNEL_PROFILE="$out/kprof_copies_$2_$n.json" LD_PRELOAD="$kp" \
        "$dir/train_step" --row $1 --set objective.name=$2 --device cuda --steps $n --warmup 2 \
        >> "$out/kprof.log" 2>&1
    done
    python3 tools/cuda/kernel_profile.py "$out/kprof_copies_$2_3.json" \
      "$out/kprof_copies_$2_8.json" --copies-per-step 5,10
    echo "row $1 $2 copies check exit $?"
  done > "$out/copies_per_step.log" 2>&1
fi
stamp profiles

tail -12 "$out/ssl_run.log"
cat "$out/train_step.jsonl" "$out/train_step_bf16.jsonl"
