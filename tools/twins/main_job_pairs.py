"""`ssl run` against its PyTorch twin (`main_job.py`), in alternating pairs, half of them with
PyTorch first: the main job, or `--objective frossl --views 8`.

Each side is a fresh process timed from start to exit (`wall`); its training time (`train`: the
steps with their epoch monitor, without setup and the end-of-run evaluation) comes from the
twin's JSON line and from the `phases` of our `results.json`. The table gives each side's median
and the per-pair ratios ours / PyTorch (median and range), over all pairs and over each order.

    cargo build --release --bin ssl
    python3 tools/twins/main_job_pairs.py [--pairs 4] [--objective frossl --views 8] [--threads 2]
        [--bf16]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ours(a, out):
    cmd = [os.path.join(ROOT, "target", "release", "ssl"), "run", "--out", out, "--overwrite",
           "--threads", str(a.threads), "--objective", a.objective, "--views", str(a.views)]
    if a.bf16:
        cmd += ["--set", "train.precision=bf16"]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    phases = results["phases"]
    train = results["seconds"] - phases["setup"] - phases["evaluation"]
    return {"wall": wall, "train": train, "phases": phases}


def pytorch(a):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "twins", "main_job.py"), "--threads",
           str(a.threads), "--objective", a.objective, "--views", str(a.views)]
    if a.bf16:
        cmd.append("--bf16")
    started = time.perf_counter()
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
    wall = time.perf_counter() - started
    out = json.loads(line.splitlines()[-1])
    return {"wall": wall, "train": out["train_s"]}


def summary(pairs, key):
    ratios = [o[key] / p[key] for o, p, _ in pairs]
    med = lambda xs: statistics.median(xs)
    cell = lambda rs: f"{med(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})" if rs else "–"
    firsts = [o[key] / p[key] for o, p, first in pairs if first == "ours"]
    seconds = [o[key] / p[key] for o, p, first in pairs if first == "pytorch"]
    return (f"| {key} | {med([o[key] for o, _, _ in pairs]):.1f} | "
            f"{med([p[key] for _, p, _ in pairs]):.1f} | **{cell(ratios)}** | {cell(firsts)} | "
            f"{cell(seconds)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--objective", default="vicreg")
    p.add_argument("--views", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true",
                   help="ours under train.precision=bf16, PyTorch under CPU autocast to bf16")
    a = p.parse_args()
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            first = "ours" if i % 2 == 0 else "pytorch"
            if first == "ours":
                o = ours(a, os.path.join(tmp, "run"))
                t = pytorch(a)
            else:
                t = pytorch(a)
                o = ours(a, os.path.join(tmp, "run"))
            pairs.append((o, t, first))
            print(f"pair {i + 1} ({first} first): ours {o['wall']:.1f} s (train {o['train']:.1f}), "
                  f"pytorch {t['wall']:.1f} s (train {t['train']:.1f}); phases "
                  + json.dumps(o["phases"]), file=sys.stderr)
    precision = " --set train.precision=bf16" if a.bf16 else ""
    print(f"`ssl run --objective {a.objective} --views {a.views}{precision}` against its PyTorch twin, "
          f"{a.pairs} pairs, {a.threads} threads (seconds; ratios ours / PyTorch)\n")
    print("| time | ours | PyTorch | ours / PyTorch | ours first | PyTorch first |")
    print("|---|---|---|---|---|---|")
    print(summary(pairs, "wall"))
    print(summary(pairs, "train"))


if __name__ == "__main__":
    main()
