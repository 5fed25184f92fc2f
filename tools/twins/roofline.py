"""The roofline of the training-step rows: the floating-point work of one step of each row of
`train_step.py` against what this CPU's matrix products can do, as the time floor each row's
step cannot beat.

- work: the multiply-adds of one step (forward and backward, the loss included), counted by
  `torch.utils.flop_counter.FlopCounterMode` on the PyTorch twin of the row: 2 FLOP per
  multiply-add of every matrix product and convolution, a convolution counted as direct (as
  im2col computes it; Winograd's algorithm does fewer, so a step can beat its floor);
- peak: the best of `--reps` square products `torch.mm` of `--size` in f32 and in bf16 on
  `--threads` threads (oneDNN or MKL through PyTorch: the fastest GEMM on the machine that we
  know of), in GFLOP/s;
- floor: work / peak, in ms, per precision.

A measured step time `t` then has the roofline share floor / t (1 would be a step made of
nothing but peak-speed products).

    python3 tools/twins/roofline.py [--rows 1,2,3,4,5,6] [--threads 2] [--size 2048] [--reps 5]

Prints one JSON line per row and the peaks, then a Markdown table.
"""

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # noqa: E402  (the rows' models and losses)


def step_flops(row):
    """FLOP of one training step of `row` (forward, loss, backward)."""
    torch.manual_seed(0)
    if row == 5:
        params, loss, _ = train_step.mae_row("cpu")
    elif row == 6:
        params, loss, _ = train_step.ijepa_row("cpu")
    else:
        params, loss, _ = train_step.embedding_row(row, "cpu")
    counter = FlopCounterMode(display=False)
    with counter:
        loss(0).backward()
    return counter.get_total_flops()


def peak_gflops(size, reps, dtype):
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,3,4,5,6")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    rows = [int(r) for r in a.rows.split(",") if r.strip()]
    if any(r not in train_step.ROWS for r in rows):
        p.error(f"--rows takes rows of train_step.py ({sorted(train_step.ROWS)}), got {a.rows}")
    peaks = {name: peak_gflops(a.size, a.reps, dtype)
             for name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]}
    print(json.dumps({"peak_gflops": peaks, "threads": a.threads, "size": a.size,
                      "torch": torch.__version__}))
    table = []
    for row in rows:
        gflop = step_flops(row) / 1e9
        floors = {name: gflop / peak * 1e3 for name, peak in peaks.items()}
        print(json.dumps({"row": row, "name": train_step.ROWS[row][0], "gflop": gflop,
                          "floor_ms": floors}), flush=True)
        table.append((row, train_step.ROWS[row][0], gflop, floors))
    print()
    print(f"peak {peaks['f32']:.0f} GFLOP/s f32, {peaks['bf16']:.0f} bf16 "
          f"(`torch.mm` {a.size}², {a.threads} threads, best of {a.reps})")
    print()
    print("| row | step | GFLOP a step | floor f32 (ms) | floor bf16 (ms) |")
    print("|---|---|---:|---:|---:|")
    for row, name, gflop, floors in table:
        print(f"| {row} | {name} | {gflop:,.0f} | {floors['f32']:,.0f} | {floors['bf16']:,.0f} |")


if __name__ == "__main__":
    main()
