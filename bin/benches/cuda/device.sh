#!/usr/bin/env bash
# On the GPU machine, from the repository root, with DIR/cuda-bins.txz from build.sh: the CUDA
# parity tests, the four-row train_step bench (ours, then PyTorch's script, row by row) and
# the main job on the GPU. Logs go to OUT (default DIR).
#
#   bin/benches/cuda/device.sh DIR [OUT]
set -u
dir=$(realpath "${1:?usage: device.sh DIR [OUT]}")
out=${2:-$dir}
export PYTHONUNBUFFERED=1
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
  "$dir/cuda-bins.txz" "$dir"
libs=$(for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcuda.so.1; do
  find /opt /usr -name "$l" 2>/dev/null | head -1 | xargs -r dirname; done | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ldd "$dir/ssl" | grep "not found"
timeout 300 "$dir/cuda_test" --test-threads 1 --nocapture 2>&1 | tee "$out/cuda_test.log"
for r in 1 2 3 4; do
  timeout 60 "$dir/train_step" --row $r --device cuda --steps 10 --warmup 3
  timeout 60 python3 bin/benches/train_step.py --row $r --device cuda --steps 10 --warmup 3
done 2>&1 | tee "$out/train_step.jsonl"
timeout 150 "$dir/ssl" run --device cuda --out /tmp/ssl-cuda-run 2>&1 | tail -8 | tee "$out/ssl_run.log"
