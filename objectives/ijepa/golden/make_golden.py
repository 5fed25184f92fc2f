"""Known answers for ssl-ijepa, computed by running the official I-JEPA code in float64.

Setup: Python 3 with git on the PATH and `pip install torch numpy`. Run `python make_golden.py`
in any directory. The script rewrites `golden.json` next to itself; the crate's tests read that
file and need no Python.

The official code is not part of this repository, and nothing of it is copied here. At run time
the script clones https://github.com/facebookresearch/ijepa at commit
52c1ae95d05f743e000e8f10a1f3a79b10cff048 into a temporary directory, checks out that commit (and
refuses any other) and imports from there:
  * `apply_masks` from `src/masks/utils.py`;
  * `repeat_interleave_batch` from `src/utils/tensors.py`;
  * `vit_predictor` (a `VisionTransformerPredictor` with the layer-norm eps and MLP ratio of
    the released models) and `get_2d_sincos_pos_embed` from `src/models/vision_transformer.py`;
  * the momentum schedule: the `momentum_scheduler = (...)` statement of `main()` in
    `src/train.py` is located with Python's `ast` module and executed on its own (importing
    `train.py` would pull in the data pipeline), with `ema`, `ipe`, `num_epochs` and
    `ipe_scale` bound to the values recorded below.
Where GitHub cannot be reached, set `IJEPA_REPO` to a local clone or mirror of the repository;
the pinned commit is still checked out and verified. The repository is (c) Meta Platforms, Inc.
and affiliates, under CC BY-NC 4.0 (https://creativecommons.org/licenses/by-nc/4.0/). The paper:
M. Assran et al., "Self-Supervised Learning from Images with a Joint-Embedding Predictive
Architecture", CVPR 2023.

What is done around the official code, from outside it (none of its lines is edited):
  * Everything runs in float64 (`torch.set_default_dtype`, the predictor converted with
    `.double()`).
  * The predictor's constructor stores its fixed sin-cos positional embedding through
    `.float()`, i.e. rounded to float32. After construction the script sets that buffer to the
    same official function's float64 values (`get_2d_sincos_pos_embed`), so the comparison can
    be made to 1e-10.
  * The predictor's weights are not its initial values (zero biases and unit layer norms would
    test little): every parameter is overwritten with seeded random values, recorded in the
    file as a state dict under the official keys.
  * The target side of the loss follows `forward_target` and `loss_fn` of `src/train.py` (a
    closure inside `main()` that cannot be imported): `F.layer_norm` over the feature axis,
    then the official `apply_masks` and `repeat_interleave_batch`, then `F.smooth_l1_loss`.
"""

import ast
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

IJEPA_URL = "https://github.com/facebookresearch/ijepa"
IJEPA_COMMIT = "52c1ae95d05f743e000e8f10a1f3a79b10cff048"


def checkout(workdir):
    """Clones the official repository (or $IJEPA_REPO) at the pinned commit; returns its path."""
    source = os.environ.get("IJEPA_REPO", IJEPA_URL)
    path = os.path.join(workdir, "ijepa")
    git = lambda *args: subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        git("clone", "--quiet", "--no-checkout", source, path)
        git("-C", path, "checkout", "--quiet", "--detach", IJEPA_COMMIT)
    except subprocess.CalledProcessError as error:
        sys.exit(
            f"error: cannot check out {IJEPA_COMMIT} from {source}: {error.stderr.strip()}\n"
            f"help: without access to GitHub, set IJEPA_REPO to a local clone of {IJEPA_URL} "
            "that contains that commit"
        )
    head = git("-C", path, "rev-parse", "HEAD")
    if head != IJEPA_COMMIT:
        sys.exit(f"error: {source} checked out {head}, not the pinned {IJEPA_COMMIT}")
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


def momentum_statement(path):
    """The official `momentum_scheduler = ...` statement of train.py's main(), compiled."""
    with open(os.path.join(path, "src", "train.py")) as f:
        tree = ast.parse(f.read())
    found = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) == "momentum_scheduler" for t in node.targets)
    ]
    if len(found) != 1:
        sys.exit(f"error: expected one momentum_scheduler assignment in train.py, found {len(found)}")
    return compile(ast.Module(body=found, type_ignores=[]), "train.py", "exec")


def tolist(t):
    return t.detach().tolist()


def randperm_masks(generator, count, batch, keep, length):
    """`count` masks of `batch` rows, each `keep` distinct indices below `length`."""
    return [
        torch.stack([torch.randperm(length, generator=generator)[:keep] for _ in range(batch)])
        for _ in range(count)
    ]


def main():
    torch.set_default_dtype(torch.float64)
    generator = torch.Generator().manual_seed(2301_08243)
    randn = lambda *shape: torch.randn(*shape, generator=generator)
    with tempfile.TemporaryDirectory() as workdir:
        path = checkout(workdir)
        masks_utils = import_from(path, "src.masks.utils")
        tensors = import_from(path, "src.utils.tensors")
        vit = import_from(path, "src.models.vision_transformer")
        momentum = momentum_statement(path)

        # apply_masks: B = 3 images of L = 7 tokens of width 2, two masks of 4 indices.
        x = randn(3, 7, 2)
        masks = randperm_masks(generator, 2, 3, 4, 7)
        apply_case = {
            "x": tolist(x),
            "masks": [tolist(m) for m in masks],
            "out": tolist(masks_utils.apply_masks(x, masks)),
        }
        # repeat_interleave_batch: 3 blocks of B = 2 rows, each repeated 3 times.
        rows = torch.arange(12.0).reshape(6, 2)
        repeat_case = {
            "x": tolist(rows),
            "batch": 2,
            "repeat": 3,
            "out": tolist(tensors.repeat_interleave_batch(rows, 2, repeat=3)),
        }

        # The predictor: encoder width E = 8, predictor width 8, depth 2, 2 heads, a 4 x 4
        # grid; B = 2 images, 2 context masks of 5 patches, 3 target masks of 3 patches.
        E, P, depth, heads, grid, B = 8, 8, 2, 2, 4, 2
        predictor = vit.vit_predictor(
            num_patches=grid * grid,
            embed_dim=E,
            predictor_embed_dim=P,
            depth=depth,
            num_heads=heads,
        ).double()
        pos = torch.from_numpy(vit.get_2d_sincos_pos_embed(P, grid, cls_token=False))
        with torch.no_grad():
            predictor.predictor_pos_embed.copy_(pos.unsqueeze(0))
            state = {}
            for name, param in predictor.named_parameters():
                if name == "predictor_pos_embed":
                    continue
                if "norm" in name and name.endswith("weight"):
                    param.copy_(1.0 + 0.2 * randn(*param.shape))
                else:
                    param.copy_(0.3 * randn(*param.shape))
                state[name] = tolist(param)
        masks_x = randperm_masks(generator, 2, B, 5, grid * grid)
        masks_t = randperm_masks(generator, 3, B, 3, grid * grid)
        context = randn(2 * B, 5, E).requires_grad_(True)
        out = predictor(context, masks_x, masks_t)
        weights = randn(*out.shape)
        (out * weights).sum().backward()
        predictor_case = {
            "embed_dim": E,
            "predictor_dim": P,
            "depth": depth,
            "heads": heads,
            "grid": grid,
            "batch": B,
            "state_dict": state,
            "pos_embed": tolist(predictor.predictor_pos_embed[0]),
            "context": tolist(context),
            "masks_x": [tolist(m) for m in masks_x],
            "masks": [tolist(m) for m in masks_t],
            "out": tolist(out),
            "weights": tolist(weights),
            "grad_context": tolist(context.grad),
            "grad_mask_token": tolist(predictor.mask_token.grad),
            "grad_predictor_embed_weight": tolist(predictor.predictor_embed.weight.grad),
        }

        # The loss: the target encoder's tokens h [B, L, E] through train.py's forward_target
        # steps, against predictions z [T*C*B, K, E] spread so that both branches of the
        # smooth L1 occur.
        h = 2.0 * randn(B, grid * grid, E) + 1.0
        z = (1.5 * randn(3 * 2 * B, 3, E)).requires_grad_(True)
        target = F.layer_norm(h, (h.size(-1),))
        target = masks_utils.apply_masks(target, masks_t)
        target = tensors.repeat_interleave_batch(target, B, repeat=len(masks_x))
        loss = F.smooth_l1_loss(z, target)
        loss.backward()
        loss_case = {
            "h": tolist(h),
            "masks_x_count": len(masks_x),
            "masks": [tolist(m) for m in masks_t],
            "z": tolist(z),
            "target": tolist(target),
            "loss": loss.item(),
            "grad_z": tolist(z.grad),
        }

        # The momentum schedule, every value the generator yields.
        schedules = []
        for ipe, num_epochs, ipe_scale in [(7, 3, 1.0), (5, 2, 1.25)]:
            scope = {"ema": [0.996, 1.0], "ipe": ipe, "num_epochs": num_epochs, "ipe_scale": ipe_scale}
            exec(momentum, scope)
            schedules.append(
                {
                    "ema": scope["ema"],
                    "steps_per_epoch": ipe,
                    "epochs": num_epochs,
                    "ipe_scale": ipe_scale,
                    "values": list(scope["momentum_scheduler"]),
                }
            )

    golden = {
        "commit": IJEPA_COMMIT,
        "apply_masks": apply_case,
        "repeat_interleave_batch": repeat_case,
        "predictor": predictor_case,
        "loss": loss_case,
        "momentum": schedules,
    }
    golden = json.loads(json.dumps(golden))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    compact = lambda value: json.dumps(value, separators=(",", ":"))
    lines = [f" {json.dumps(key)}: {compact(value)}" for key, value in golden.items()]
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    assert json.loads(text) == golden
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    d = (torch.tensor(loss_case["z"]) - torch.tensor(loss_case["target"])).abs()
    print(f"loss {loss_case['loss']:.6f}; |z - h| > 1 in {(d > 1).double().mean():.2f} of entries")


if __name__ == "__main__":
    main()
