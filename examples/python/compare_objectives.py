"""Two objectives on the embedded digits, same settings and seed, their result tables side by
side, and their loss curves' last values from the runs' logs.

    python examples/python/compare_objectives.py [--epochs 10] [vicreg frossl]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import candle_ssl as cs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("objectives", nargs="*", default=["vicreg", "frossl"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    runs: dict[str, cs.Run] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.objectives:
            print(f"== {cs.describe(name).splitlines()[0]}")
            runs[name] = cs.train(
                objective=name,
                data="digits",
                epochs=args.epochs,
                out=Path(tmp) / name,
                seed=args.seed,
                batch_size=128,
            )
        for name, run in runs.items():
            print(f"\n## {name}\n\n{run.table}")
            loss = run.history["loss"]
            trained = run.results["rows"][-1]["metrics"]
            print(
                f"last loss {loss[-1]:.4f} after {len(loss)} steps; "
                f"linear probe {100 * trained['probe_balanced_accuracy']:.1f} %, "
                f"RankMe {trained['rankme']:.1f}"
            )


if __name__ == "__main__":
    main()
