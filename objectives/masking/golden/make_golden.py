"""Known answers for ssl-masking, computed by running the official MAE and I-JEPA code.

Setup: Python 3 with git on the PATH and `pip install torch numpy` (MAE's module imports NumPy).
Run `python make_golden.py` in any directory. The script rewrites `golden.json` next to itself;
the crate's tests read that file and need no Python.

The official code is not part of this repository, and nothing of it is copied here. At run time
the script clones
  * https://github.com/facebookresearch/mae at commit efb2a8062c206524e35e47d04501ed4f544c0ae8
    and calls `MaskedAutoencoderViT.random_masking` from `models_mae.py`;
  * https://github.com/facebookresearch/ijepa at commit 52c1ae95d05f743e000e8f10a1f3a79b10cff048
    and calls `MaskCollator` from `src/masks/multiblock.py`;
into a temporary directory, checks out the pinned commit (and refuses any other) and imports the
modules from there. Where GitHub cannot be reached, set `MAE_REPO` and `IJEPA_REPO` to local
clones or mirrors of those repositories; the pinned commits are still checked out and verified.
Both repositories are (c) Meta Platforms, Inc. and affiliates, under CC BY-NC 4.0
(https://creativecommons.org/licenses/by-nc/4.0/). The papers: K. He et al., "Masked
Autoencoders Are Scalable Vision Learners", CVPR 2022; M. Assran et al., "Self-Supervised
Learning from Images with a Joint-Embedding Predictive Architecture", CVPR 2023.

What is done around the official code, from outside it (none of its lines is edited):
  * `models_mae.py` imports `PatchEmbed` and `Block` from timm, which `random_masking` does not
    use. The script registers an empty stand-in for `timm.models.vision_transformer` before the
    import, so timm need not be installed (MAE pins an old timm that recent torch breaks).
  * MAE's noise: `random_masking` draws its noise with one `torch.rand(N, L)` call. During the
    call it is replaced by one that returns the given noise, so the known answer is a function
    of recorded inputs. The patch sequence passed in holds each patch's index as its feature,
    so the gathered sequence names the kept patches in the order MAE keeps them.
  * I-JEPA's random numbers: the collator draws block sizes with `torch.rand(1, generator=g)`
    (g seeded with the collator's call counter) and block corners with `torch.randint(0, n,
    (1,))` from torch's global generator. While a case runs, both functions are wrapped so
    that every value they return is recorded, in order, with the bound of each `randint`. Our
    implementation consumes the same kinds of draws in the same order, so replaying this
    record must give exactly the official masks. The wrapper returns what torch returned.
  * I-JEPA's warnings ("Valid mask not found, decreasing acceptable-regions") are counted
    through a logging handler: they are the relaxations the Rust side reports.
  * Statistics over 10,000 draws come from the same official calls with torch's own random
    numbers (nothing replayed): the histogram of the sampled block sizes (the collator's
    `_sample_block_size` with generator seeds 0..9999, as its call counter gives them), and
    per-patch frequencies of being in the context or a target block over 10,000 one-image
    batches. The Rust tests compare their own draws with these within sampling error.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
import types
from unittest import mock

import torch

MAE_URL = "https://github.com/facebookresearch/mae"
MAE_COMMIT = "efb2a8062c206524e35e47d04501ed4f544c0ae8"
IJEPA_URL = "https://github.com/facebookresearch/ijepa"
IJEPA_COMMIT = "52c1ae95d05f743e000e8f10a1f3a79b10cff048"

# The official I-JEPA run configurations (configs/in1k_vith14_ep300.yaml, `mask:`), with the
# patch size of a /16 encoder at 224 px: a 14 x 14 grid.
IJEPA_DEFAULTS = dict(
    input_size=(224, 224),
    patch_size=16,
    enc_mask_scale=(0.85, 1.0),
    pred_mask_scale=(0.15, 0.2),
    aspect_ratio=(0.75, 1.5),
    nenc=1,
    npred=4,
    min_keep=10,
    allow_overlap=False,
)


def checkout(workdir, name, url, commit, env):
    """Clones `url` (or $env) at `commit` under `workdir`; returns the checkout's path."""
    source = os.environ.get(env, url)
    path = os.path.join(workdir, name)
    git = lambda *args: subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        git("clone", "--quiet", "--no-checkout", source, path)
        git("-C", path, "checkout", "--quiet", "--detach", commit)
    except subprocess.CalledProcessError as error:
        sys.exit(
            f"error: cannot check out {commit} from {source}: {error.stderr.strip()}\n"
            f"help: without access to GitHub, set {env} to a local clone of {url} that "
            "contains that commit"
        )
    head = git("-C", path, "rev-parse", "HEAD")
    if head != commit:
        sys.exit(f"error: {source} checked out {head}, not the pinned {commit}")
    return path


def import_from(path, module):
    sys.path.insert(0, path)
    try:
        imported = __import__(module, fromlist=["_"])
    finally:
        sys.path.remove(path)
    where = os.path.abspath(imported.__file__)
    if not where.startswith(os.path.abspath(path) + os.sep):
        sys.exit(f"error: imported {module} from {where}, not from the pinned checkout {path}")
    return imported


def import_mae(workdir):
    path = checkout(workdir, "mae", MAE_URL, MAE_COMMIT, "MAE_REPO")
    stand_in = types.ModuleType("timm.models.vision_transformer")
    stand_in.PatchEmbed = stand_in.Block = None
    for name in ["timm", "timm.models"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["timm.models.vision_transformer"] = stand_in
    return import_from(path, "models_mae")


def import_ijepa(workdir):
    path = checkout(workdir, "ijepa", IJEPA_URL, IJEPA_COMMIT, "IJEPA_REPO")
    return import_from(path, "src.masks.multiblock")


def mae_case(models_mae, noise, ratio):
    """The official random_masking on `noise` [N, L]: kept patches, binary mask, restore ids."""
    n, length = noise.shape
    calls = []

    def fixed_noise(*shape, **kwargs):
        assert tuple(shape) == (n, length), shape
        calls.append(shape)
        return noise.clone()

    patches = torch.arange(length, dtype=torch.float64).repeat(n, 1).unsqueeze(-1)
    with mock.patch.object(torch, "rand", fixed_noise):
        kept, mask, restore = models_mae.MaskedAutoencoderViT.random_masking(
            None, patches, ratio
        )
    assert len(calls) == 1, "MAE's noise draw was not replaced"
    return {
        "ratio": ratio,
        "len": length,
        "noise": noise.tolist(),
        "keep": kept.squeeze(-1).long().tolist(),
        "mask": mask.long().tolist(),
        "restore": restore.tolist(),
    }


def mae_cases(models_mae):
    generator = torch.Generator().manual_seed(2111_06377)
    cases = []
    # (N, L, ratio): MAE's default on a 14 x 14 grid, and counts where int(L (1 - r)) rounds
    # down from a float just below an integer (20 * (1 - 0.9) = 1.9999999999999996 keeps 1).
    for n, length, ratio in [(2, 196, 0.75), (3, 16, 0.5), (2, 20, 0.9), (2, 10, 0.7), (1, 7, 0.0)]:
        noise = torch.rand(n, length, generator=generator)
        cases.append(mae_case(models_mae, noise, ratio))
    return cases


class Recorder:
    """Wraps torch.rand and torch.randint, recording every value the collator draws."""

    def __init__(self):
        self.draws = []
        self.rand, self.randint = torch.rand, torch.randint

    def recorded_rand(self, *args, **kwargs):
        value = self.rand(*args, **kwargs)
        assert value.numel() == 1, "the collator draws one number at a time"
        self.draws.append({"unit": value.item()})
        return value

    def recorded_randint(self, low, high, size, **kwargs):
        assert low == 0 and tuple(size) == (1,) and not kwargs, (low, size, kwargs)
        value = self.randint(low, high, size)
        self.draws.append({"below": int(high), "value": value.item()})
        return value

    def __enter__(self):
        self.patches = [
            mock.patch.object(torch, "rand", self.recorded_rand),
            mock.patch.object(torch, "randint", self.recorded_randint),
        ]
        for patch in self.patches:
            patch.start()
        return self

    def __exit__(self, *exc):
        for patch in reversed(self.patches):
            patch.stop()


class WarningCounter(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        if "Valid mask not found" in record.getMessage():
            self.count += 1


def ijepa_config(**changes):
    config = dict(IJEPA_DEFAULTS)
    config.update(changes)
    return config


def grid_of(config):
    (height, width), patch = config["input_size"], config["patch_size"]
    return [height // patch, width // patch]


def ijepa_case(multiblock, name, config, batch, calls, torch_seed, counter):
    """`calls` consecutive batches of one official collator (call counter 0, 1, ...)."""
    torch.manual_seed(torch_seed)
    collator = multiblock.MaskCollator(**config)
    images = [torch.zeros(1) for _ in range(batch)]
    batches = []
    for _ in range(calls):
        counter.count = 0
        with Recorder() as recorder:
            _, context, targets = collator(images)
        batches.append(
            {
                "draws": recorder.draws,
                "context": [m.tolist() for m in context],
                "targets": [m.tolist() for m in targets],
                "relaxations": counter.count,
            }
        )
    return {
        "name": name,
        "grid": grid_of(config),
        "config": {k: v for k, v in config.items() if k not in ("input_size", "patch_size")},
        "batch": batch,
        "batches": batches,
    }


def ijepa_cases(multiblock, counter):
    hard = ijepa_config(enc_mask_scale=(0.3, 0.4), pred_mask_scale=(0.2, 0.3), min_keep=20)
    cases = [
        ijepa_case(multiblock, "official_defaults", ijepa_config(), 6, 3, 0, counter),
        # Small context blocks and large targets: the context often keeps too few patches, and
        # the collator relaxes its exclusions after 20 failed draws.
        ijepa_case(multiblock, "relaxed_exclusions", hard, 8, 3, 1, counter),
        ijepa_case(
            multiblock,
            "overlap_allowed_non_square",
            ijepa_config(input_size=(160, 224), allow_overlap=True, nenc=2, npred=3),
            4,
            2,
            2,
            counter,
        ),
    ]
    assert sum(b["relaxations"] for b in cases[1]["batches"]) > 0, "no relaxation to test"
    return cases


def ijepa_statistics(multiblock, draws=10_000):
    config = ijepa_config()
    collator = multiblock.MaskCollator(**config)
    sizes = {"target": {}, "context": {}}
    for seed in range(draws):
        generator = torch.Generator().manual_seed(seed)
        target = collator._sample_block_size(
            generator, config["pred_mask_scale"], config["aspect_ratio"]
        )
        context = collator._sample_block_size(generator, config["enc_mask_scale"], (1.0, 1.0))
        for kind, (h, w) in [("target", target), ("context", context)]:
            key = f"{h}x{w}"
            sizes[kind][key] = sizes[kind].get(key, 0) + 1
    height, width = grid_of(config)
    in_context = torch.zeros(height * width, dtype=torch.int64)
    in_target = torch.zeros(height * width, dtype=torch.int64)
    context_kept = []
    torch.manual_seed(3)
    for _ in range(draws):
        _, context, targets = collator([torch.zeros(1)])
        in_context[context[0][0]] += 1
        context_kept.append(len(context[0][0]))
        covered = torch.zeros(height * width, dtype=torch.bool)
        for target in targets:
            covered[target[0]] = True
        in_target += covered
    kept = torch.tensor(context_kept, dtype=torch.float64)
    return {
        "draws": draws,
        "grid": [height, width],
        "block_sizes": sizes,
        "context_frequency": (in_context.double() / draws).tolist(),
        "target_frequency": (in_target.double() / draws).tolist(),
        "context_kept_mean": kept.mean().item(),
        "context_kept_std": kept.std().item(),
    }


def main():
    counter = WarningCounter()
    with tempfile.TemporaryDirectory() as workdir:
        models_mae = import_mae(workdir)
        multiblock = import_ijepa(workdir)
        multiblock.logger.addHandler(counter)
        multiblock.logger.propagate = False
        golden = {
            "generator": "objectives/masking/golden/make_golden.py",
            "official_code": [f"{MAE_URL} at {MAE_COMMIT}", f"{IJEPA_URL} at {IJEPA_COMMIT}"],
            "torch": torch.__version__,
            "mae": mae_cases(models_mae),
            "ijepa": ijepa_cases(multiblock, counter),
            "ijepa_statistics": ijepa_statistics(multiblock),
        }
    golden = json.loads(json.dumps(golden))  # tuples as the lists JSON reads back
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    # One line per case: small enough to review in a diff.
    compact = lambda value: json.dumps(value, separators=(",", ":"))
    lines = []
    for key, value in golden.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join(f"  {compact(item)}" for item in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {compact(value)}")
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    assert json.loads(text) == golden
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    for case in golden["ijepa"]:
        relaxations = [b["relaxations"] for b in case["batches"]]
        print(f"ijepa {case['name']}: relaxations per batch {relaxations}")
    stats = golden["ijepa_statistics"]
    mean, std = stats["context_kept_mean"], stats["context_kept_std"]
    print(f"ijepa context kept: mean {mean:.2f}, std {std:.2f}")


if __name__ == "__main__":
    main()
