#!/usr/bin/env python3
"""Summarizes the JSON written by libkernel_profile.so (kernel_profile.c) as markdown tables.

    kernel_profile.py FILE.json [--steps N] [--top 25]
        the top kernels by total GPU time and a summary by category
    kernel_profile.py A.json B.json [--steps N | --steps NA,NB] [--labels A,B]
        the two category summaries side by side (ours vs PyTorch, before vs after)
    kernel_profile.py SHORT.json LONG.json --copies-per-step NS,NL
        memcpys per training step, by kind, from two runs of NS and NL steps that differ in
        nothing else (set-up and warm-up cancel); exits 1 when a step copies device to host

--steps divides by the steps the profiled run made (everything from process start to exit is
recorded, warm-up included, so profile runs that differ only in step count to isolate steps).
Categories come from regexes on the kernel name, first match wins (see RULES). Kernel names
are demangled with c++filt when it is on PATH. Stdlib only.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys

_CANDLE_DT = r"(?:f16|bf16|f32|f64|u8|u32|i64|i16|i32|f8_e4m3)"
# First match wins. Order matters: cuDNN's BN kernels before the cuDNN conv rule, conv's
# implicit-GEMM kernels before the GEMM rule, index and explicit reductions before the broad
# elementwise tokens (cast, copy, ...), and bare sum/max/min only after elementwise (PyTorch
# elementwise functors such as clamp_min would otherwise count as reductions).
RULES = [
    ("batch norm", r"batch_?norm|(?:^|[^a-z])bn_"),
    ("convolution", r"cudnn|conv|implicit|winograd|wgrad|dgrad|fprop|im2col|col2im"
                    r"|nchwtonhwc|nhwctonchw"),
    ("gemm", r"gemm|gemv|cublas|cutlass|nvjet|sm90_|sm80_|ampere_|volta_|turing_|splitk"
             r"|matmul|mul_mat"),
    ("pooling", r"pool"),
    ("index", r"index_?select|index_?add|index_put|indexing|gather|scatter"
              r"|^(?:is|ia|sa|s)_(?:u8|u32|i64|i16|i32)_"),
    ("reduction", r"reduce|softmax|argmax|argmin|fast_(?:sum|max|min)"),
    ("elementwise/copy", r"ucopy|copy|elementwise|vectorized|affine|unary|binary|bmul|badd"
                         r"|bsub|bdiv|fill|const_set|cast|where|relu|functor"
                         r"|^[ub][a-z0-9]+_" + _CANDLE_DT + r"$"),
    ("reduction", r"sum|max|min|mean"),
]
_COMPILED = [(cat, re.compile(rx, re.IGNORECASE)) for cat, rx in RULES]
CATEGORIES = ["convolution", "gemm", "batch norm", "pooling", "elementwise/copy", "reduction",
              "index", "other", "memcpy", "memset"]


def category(name):
    for cat, rx in _COMPILED:
        if rx.search(name):
            return cat
    return "other"


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True,
                             text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {n: n for n in names}
    return {n: (d if d else n) for n, d in zip(names, out)}


def load(path):
    with open(path) as f:
        d = json.load(f)
    d.setdefault("kernels", [])
    d.setdefault("memcpy", [])
    d.setdefault("memset", {"count": 0, "total_ns": 0})
    if "gpu_total_ns" not in d:
        d["gpu_total_ns"] = (sum(k["total_ns"] for k in d["kernels"])
                             + sum(m["total_ns"] for m in d["memcpy"]) + d["memset"]["total_ns"])
    return d


def categories(d):
    """{category: [ns, count]} over kernels, memcpys and memsets."""
    cats = {c: [0, 0] for c in CATEGORIES}
    for k in d["kernels"]:
        c = cats.setdefault(category(k["name"]), [0, 0])
        c[0] += k["total_ns"]
        c[1] += k["count"]
    for m in d["memcpy"]:
        cats["memcpy"][0] += m["total_ns"]
        cats["memcpy"][1] += m["count"]
    cats["memset"][0] += d["memset"]["total_ns"]
    cats["memset"][1] += d["memset"]["count"]
    return cats


def ms(ns):
    return f"{ns / 1e6:.3f}"


def pct(part, whole):
    return f"{100.0 * part / whole:.1f}" if whole else "-"


def per(x, steps, fmt="{:.1f}"):
    return fmt.format(x / steps) if steps else "-"


def md_name(s, width):
    if width and len(s) > width:
        s = s[: width - 1] + "…"
    return "`" + s.replace("`", "'").replace("|", "\\|") + "`"


def notes(path, d):
    out = [f"{path}: GPU busy (sum of durations) {ms(d['gpu_total_ns'])} ms"]
    if d.get("span_ns"):
        out.append(f"first-to-last span {ms(d['span_ns'])} ms")
    out.append(f"{len(d['kernels'])} distinct kernels, "
               f"{sum(k['count'] for k in d['kernels'])} launches")
    line = ", ".join(out)
    for key in ("dropped_records", "incomplete_records"):
        if d.get(key):
            line += f"; WARNING {d[key]} {key.replace('_', ' ')}"
    return line


def single(path, steps, top, width, do_demangle):
    d = load(path)
    total = d["gpu_total_ns"]
    print(notes(path, d) + "\n")
    kernels = sorted(d["kernels"], key=lambda k: -k["total_ns"])
    shown = kernels[:top] if top else kernels
    names = demangle([k["name"] for k in shown]) if do_demangle else {}
    print(f"Top {len(shown)} kernels\n")
    print("| # | ms total | ms/step | count | count/step | share % | category | kernel |")
    print("|--:|--:|--:|--:|--:|--:|---|---|")
    for i, k in enumerate(shown, 1):
        print(f"| {i} | {ms(k['total_ns'])} | {per(k['total_ns'] / 1e6, steps, '{:.3f}')} "
              f"| {k['count']} | {per(k['count'], steps)} | {pct(k['total_ns'], total)} "
              f"| {category(k['name'])} | {md_name(names.get(k['name'], k['name']), width)} |")
    print("\nBy category\n")
    print("| category | ms total | ms/step | count | count/step | share % |")
    print("|---|--:|--:|--:|--:|--:|")
    cats = categories(d)
    for c, (ns, n) in sorted(cats.items(), key=lambda kv: -kv[1][0]):
        if n:
            print(f"| {c} | {ms(ns)} | {per(ns / 1e6, steps, '{:.3f}')} | {n} | {per(n, steps)} "
                  f"| {pct(ns, total)} |")
    print(f"| **total** | {ms(total)} | {per(total / 1e6, steps, '{:.3f}')} "
          f"| {sum(n for _, n in cats.values())} "
          f"| {per(sum(n for _, n in cats.values()), steps)} | 100.0 |")
    if d["memcpy"]:
        print("\nCopies\n")
        print("| kind | count | MB | ms total |")
        print("|---|--:|--:|--:|")
        for m in d["memcpy"]:
            if m["count"]:
                print(f"| {m['kind']} | {m['count']} | {m['bytes'] / 1e6:.1f} "
                      f"| {ms(m['total_ns'])} |")


def compare(paths, steps, labels):
    ds = [load(p) for p in paths]
    for p, d in zip(paths, ds):
        print(notes(p, d))
    print()
    cats = [categories(d) for d in ds]
    unit = "ms/step" if all(steps) else "ms"
    a, b = labels
    print(f"| category | {a} {unit} | {a} % | {a} launches{'/step' if all(steps) else ''} "
          f"| {b} {unit} | {b} % | {b} launches{'/step' if all(steps) else ''} | {b}/{a} |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    order = sorted(set(cats[0]) | set(cats[1]),
                   key=lambda c: -(cats[0].get(c, [0])[0] + cats[1].get(c, [0])[0]))
    totals = [d["gpu_total_ns"] for d in ds]

    def cells(i, ns, n):
        s = steps[i] or 1
        return [f"{ns / 1e6 / s:.3f}", pct(ns, totals[i]), f"{n / s:.1f}" if steps[i] else str(n)]

    for c in order + ["**total**"]:
        if c == "**total**":
            vals = [(totals[i], sum(n for _, n in cats[i].values())) for i in range(2)]
        else:
            vals = [tuple(cats[i].get(c, [0, 0])) for i in range(2)]
        if not vals[0][1] and not vals[1][1]:
            continue
        ra = vals[0][0] / (steps[0] or 1)
        rb = vals[1][0] / (steps[1] or 1)
        ratio = f"{rb / ra:.2f}" if ra else "-"
        print("| " + " | ".join([c] + cells(0, *vals[0]) + cells(1, *vals[1]) + [ratio]) + " |")


def copies_per_step(paths, steps):
    """Prints `{kind: copies per step}` from two runs that differ only in their step counts, and
    returns whether a step copies from the device to the host (a host synchronisation)."""
    counts = []
    for p in paths:
        by_kind = {}
        for m in load(p)["memcpy"]:
            by_kind[m["kind"]] = by_kind.get(m["kind"], 0) + m["count"]
        counts.append(by_kind)
    extra = steps[1] - steps[0]
    kinds = sorted(set(counts[0]) | set(counts[1]))
    per_step = {k: (counts[1].get(k, 0) - counts[0].get(k, 0)) / extra for k in kinds}
    print(json.dumps({"copies_per_step": per_step, "steps": steps}))
    return per_step.get("DtoH", 0) > 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", metavar="FILE.json", help="one profile, or two to compare")
    ap.add_argument("--steps", help="steps in the profiled run(s): N, or NA,NB for two files")
    ap.add_argument("--top", type=int, default=25, help="kernels to list (0: all)")
    ap.add_argument("--labels", help="column labels for two files, e.g. candle,torch")
    ap.add_argument("--width", type=int, default=100, help="truncate kernel names (0: never)")
    ap.add_argument("--no-demangle", action="store_true", help="show names as recorded")
    ap.add_argument("--copies-per-step", metavar="NS,NL",
                    help="two files' step counts: print memcpys per step, fail on DtoH")
    args = ap.parse_args(argv)
    if args.copies_per_step:
        steps = [int(s) for s in args.copies_per_step.split(",")]
        if len(args.files) != 2 or len(steps) != 2 or steps[1] <= steps[0]:
            ap.error("--copies-per-step NS,NL with two files, NL > NS")
        return int(copies_per_step(args.files, steps))
    if len(args.files) > 2:
        ap.error("give one or two files")
    steps = [int(s) for s in args.steps.split(",")] if args.steps else [0]
    if len(steps) == 1:
        steps = steps * len(args.files)
    if len(steps) != len(args.files) or any(s < 0 for s in steps):
        ap.error("--steps: N, or NA,NB with two files")
    if len(args.files) == 1:
        single(args.files[0], steps[0], args.top, args.width, not args.no_demangle)
    else:
        labels = args.labels.split(",") if args.labels else ["A", "B"]
        if len(labels) != 2:
            ap.error("--labels: two comma-separated labels")
        compare(args.files, steps, labels)


if __name__ == "__main__":
    sys.exit(main())
