"""Ours against PyTorch on the training-step rows, in alternating pairs with the order balanced.

Each pair runs `train_step` (this crate's bench binary) and `train_step.py` (PyTorch) once each,
one fresh process after the other; even pairs run ours first, odd pairs PyTorch first. On a
shared machine the order can matter (the second process of a pair ran 5.5 % faster in one set
of row 3 pairs on the 2-core VM of the README's table), and single runs drift by ±10 % within
minutes, so a ratio is only worth the pairs behind it: the per-pair ratio ours / PyTorch is
reported at the median over all pairs and over each order alone, with its range.

    python3 tools/twins/train_step_pairs.py [--rows 1,2,3,4] [--pairs 4] [--threads 2]
        [--steps 5] [--warmup 1] [--ours PATH] [--bf16]

`--rows` takes any of the bench's six rows (default the first four; 5 is ViT-S/16 MAE and 6
ViT-S/16 I-JEPA, both at B = 64 and several times row 3's step and memory).

Without `--ours` the bench binary is built first (`cargo bench -p ssl-train --bench train_step
--no-run`). Prints one line per pair as it goes, then a Markdown table. `--bf16` runs ours
under `train.precision: bf16` and PyTorch under `torch.autocast("cpu", dtype=torch.bfloat16)`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_bench():
    """Builds the `train_step` bench binary and returns its path."""
    done = subprocess.run(
        ["cargo", "bench", "-p", "ssl-train", "--bench", "train_step", "--no-run",
         "--message-format=json"],
        cwd=ROOT, capture_output=True, text=True,
    )
    if done.returncode != 0:
        sys.exit(f"error: building the train_step bench failed:\n{done.stderr[-2000:]}")
    for line in done.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "train_step":
            if msg.get("executable"):
                return msg["executable"]
    sys.exit("error: cargo built no `train_step` executable; run `cargo bench -p ssl-train "
             "--bench train_step --no-run` to see why")


def run(cmd):
    """Runs one step-timing process and returns its JSON record (the last line it prints)."""
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"error: cannot run `{cmd[0]}`: {e.strerror}; check --ours or build the bench")
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"error: `{' '.join(cmd)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def summary(ratios):
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,2,3,4", help="comma-separated rows of train_step (1–6)")
    p.add_argument("--pairs", type=int, default=4, help="pairs per row (even), half in each order")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--ours", help="a built train_step bench binary (default: build it)")
    p.add_argument("--bf16", action="store_true",
                   help="ours under train.precision: bf16, PyTorch under CPU autocast to bf16")
    a = p.parse_args()
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    bad = [r for r in rows if r not in {"1", "2", "3", "4", "5", "6"}]
    if bad or a.pairs < 2 or a.pairs % 2:
        p.error(f"--rows takes rows 1–6 (got {a.rows}) and --pairs an even number ≥ 2, half in "
                f"each order (got {a.pairs})")
    ours_bin = a.ours or build_bench()
    common = ["--threads", str(a.threads), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    table = []
    for row in rows:
        cmds = {
            "ours": [ours_bin, "--row", row, "--precision", "bf16" if a.bf16 else "f32"] + common,
            "torch": [sys.executable, os.path.join(ROOT, "tools/twins/train_step.py"),
                      "--row", row] + common + (["--bf16"] if a.bf16 else []),
        }
        pairs = []
        for i in range(a.pairs):
            order = ("ours", "torch") if i % 2 == 0 else ("torch", "ours")
            rec = {who: run(cmds[who]) for who in order}
            o, t = rec["ours"], rec["torch"]
            pairs.append((order[0], o, t))
            print(f"row {row} pair {i + 1} ({order[0]} first): ours {o['median_ms']:.0f} ms, "
                  f"PyTorch {t['median_ms']:.0f} ms, ratio {o['median_ms'] / t['median_ms']:.3f}",
                  flush=True)

        def ratios(first=None):
            return [o["median_ms"] / t["median_ms"] for f, o, t in pairs if first in (None, f)]

        ours = [o for _, o, _ in pairs]
        torch = [t for _, _, t in pairs]
        table.append((
            row, ours[0]["name"],
            statistics.median(r["median_ms"] for r in ours),
            statistics.median(r["median_ms"] for r in torch),
            summary(ratios()), summary(ratios("ours")), summary(ratios("torch")),
            max(r["peak_rss_mib"] for r in ours), max(r["peak_rss_mib"] for r in torch),
        ))
    print()
    precision = "bf16 (PyTorch: autocast)" if a.bf16 else "f32"
    print(f"{a.pairs} pairs a row in {precision}, --threads {a.threads} --steps {a.steps} "
          f"--warmup {a.warmup}; "
          "ratios ours / PyTorch per pair, median (range)")
    print()
    print("| row | step | ours (ms) | PyTorch (ms) | ours / PyTorch | ours first | PyTorch first "
          "| peak RSS ours / PyTorch (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for row, name, o, t, r, rf, tf, ro, rt in table:
        print(f"| {row} | {name} | {o:,.0f} | {t:,.0f} | **{r}** | {rf} | {tf} | {ro:,.0f} / {rt:,.0f} |")


if __name__ == "__main__":
    main()
