"""Known answers for ssl-mae, computed by running the official MAE code.

Setup: Python 3 with git on the PATH and `pip install torch numpy pillow torchvision` plus
`pip install --no-deps timm==0.3.2`, the timm release MAE pins (its `Block` still takes the
`qk_scale` argument `models_mae.py` passes). Run `python make_golden.py` in any directory. The
script rewrites `golden.json` next to itself; the crate's tests read that file and need no
Python.

The official code is not part of this repository, and nothing of it is copied here. At run time
the script clones https://github.com/facebookresearch/mae at commit
efb2a8062c206524e35e47d04501ed4f544c0ae8 into a temporary directory, checks out the pinned commit
(and refuses any other) and imports `models_mae.py` and `util/pos_embed.py` from there. Where
GitHub cannot be reached, set `MAE_REPO` to a local clone or mirror; the pinned commit is still
checked out and verified. The repository is (c) Meta Platforms, Inc. and affiliates, under
CC BY-NC 4.0 (https://creativecommons.org/licenses/by-nc/4.0/). The paper: K. He et al.,
"Masked Autoencoders Are Scalable Vision Learners", CVPR 2022.

What is done around the official code, from outside it (none of its lines is edited):
  * timm 0.3.2 imports `torch._six`, which recent torch no longer has: the script registers a
    stand-in module holding what timm reads from it (`container_abcs` = `collections.abc`,
    `string_classes`, `int_classes`) before importing. `util/pos_embed.py` uses `np.float`,
    an alias of `float` that NumPy 1.24 removed: the script sets `numpy.float = float`.
  * `patchify` and `forward_loss` are called as unbound methods on a stand-in `self` that has
    only what they read (`patch_embed.patch_size`, `norm_pix_loss`, `patchify`), in float64.
  * The whole model: `MaskedAutoencoderViT` of a tiny size (8-px RGB images, 2-px patches,
    encoder width 12, depth 2, 2 heads; decoder width 8, depth 2, 2 heads; MLP ratio 4;
    LayerNorm eps 1e-6 as the official constructors), in float64. Every parameter is then
    redrawn from a seeded normal (scaled by 0.3, LayerNorm weights around 1), so that no
    layer is at its zero-bias or unit-norm initialisation and all of them are tested. The
    fixed sin-cos embeddings, which the official code computes in float64 and stores in
    float32, are recomputed with its own `get_2d_sincos_pos_embed` and stored in float64.
    `random_masking` draws its noise with one `torch.rand(N, L)` call; during the forward it
    is replaced by one that returns recorded noise, so the answer is a function of recorded
    inputs. Recorded: the state dict, the images, the noise, the encoder output (`latent`),
    the mask, the decoder's prediction, the loss with `norm_pix_loss` on and off, and the
    loss's gradient with respect to a few parameters.
"""

import collections.abc
import json
import os
import subprocess
import sys
import tempfile
import types
from unittest import mock

import numpy
import torch

MAE_URL = "https://github.com/facebookresearch/mae"
MAE_COMMIT = "efb2a8062c206524e35e47d04501ed4f544c0ae8"

TINY = dict(
    img_size=8,
    patch_size=2,
    in_chans=3,
    embed_dim=12,
    depth=2,
    num_heads=2,
    decoder_embed_dim=8,
    decoder_depth=2,
    decoder_num_heads=2,
    mlp_ratio=4,
)
GRADIENT_KEYS = [
    "decoder_pred.weight",
    "decoder_blocks.1.attn.qkv.weight",
    "mask_token",
    "decoder_embed.bias",
    "blocks.0.mlp.fc1.weight",
    "patch_embed.proj.weight",
    "cls_token",
]


def checkout(workdir):
    """Clones MAE (or $MAE_REPO) at the pinned commit under `workdir`; returns the path."""
    source = os.environ.get("MAE_REPO", MAE_URL)
    path = os.path.join(workdir, "mae")
    git = lambda *args: subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        git("clone", "--quiet", "--no-checkout", source, path)
        git("-C", path, "checkout", "--quiet", "--detach", MAE_COMMIT)
    except subprocess.CalledProcessError as error:
        sys.exit(
            f"error: cannot check out {MAE_COMMIT} from {source}: {error.stderr.strip()}\n"
            f"help: without access to GitHub, set MAE_REPO to a local clone of {MAE_URL} that "
            "contains that commit"
        )
    head = git("-C", path, "rev-parse", "HEAD")
    if head != MAE_COMMIT:
        sys.exit(f"error: {source} checked out {head}, not the pinned {MAE_COMMIT}")
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
    path = checkout(workdir)
    six = types.ModuleType("torch._six")
    six.container_abcs = collections.abc
    six.string_classes = (str, bytes)
    six.int_classes = int
    sys.modules.setdefault("torch._six", six)
    if not hasattr(numpy, "float"):
        numpy.float = float
    import timm

    if timm.__version__ != "0.3.2":
        sys.exit(f"error: MAE pins timm 0.3.2, found {timm.__version__}; pip install --no-deps timm==0.3.2")
    return import_from(path, "models_mae"), import_from(path, "util.pos_embed")


def stand_in(models_mae, patch_size, norm_pix_loss=False):
    """The parts of a MaskedAutoencoderViT that `patchify` and `forward_loss` read."""
    this = types.SimpleNamespace(
        patch_embed=types.SimpleNamespace(patch_size=(patch_size, patch_size)),
        norm_pix_loss=norm_pix_loss,
    )
    this.patchify = lambda imgs: models_mae.MaskedAutoencoderViT.patchify(this, imgs)
    return this


def patchify_cases(models_mae, generator):
    cases = []
    for n, side, p in [(2, 8, 4), (1, 6, 2), (1, 4, 1)]:
        imgs = torch.randn(n, 3, side, side, generator=generator, dtype=torch.float64)
        out = models_mae.MaskedAutoencoderViT.patchify(stand_in(models_mae, p), imgs)
        cases.append({"p": p, "imgs": imgs.tolist(), "patches": out.tolist()})
    return cases


def loss_cases(models_mae, generator):
    cases = []
    n, side, p = 2, 8, 4
    length = (side // p) ** 2
    imgs = torch.randn(n, 3, side, side, generator=generator, dtype=torch.float64) * 2 + 0.5
    pred = torch.randn(n, length, p * p * 3, generator=generator, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    for norm_pix_loss in [True, False]:
        pred_var = pred.clone().requires_grad_(True)
        this = stand_in(models_mae, p, norm_pix_loss)
        loss = models_mae.MaskedAutoencoderViT.forward_loss(this, imgs, pred_var, mask)
        loss.backward()
        cases.append(
            {
                "norm_pix_loss": norm_pix_loss,
                "p": p,
                "imgs": imgs.tolist(),
                "pred": pred.tolist(),
                "mask": mask.tolist(),
                "loss": loss.item(),
                "grad_pred": pred_var.grad.tolist(),
            }
        )
    return cases


def model_case(models_mae, pos_embed, generator):
    from functools import partial

    model = models_mae.MaskedAutoencoderViT(
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), **TINY
    ).double()
    grid = TINY["img_size"] // TINY["patch_size"]
    with torch.no_grad():
        for name, param in model.named_parameters():
            values = torch.randn(param.shape, generator=generator, dtype=torch.float64) * 0.3
            if "norm" in name and name.endswith("weight"):
                values += 1.0
            param.copy_(values)
        for name in ["pos_embed", "decoder_pos_embed"]:
            buffer = getattr(model, name)
            fixed = pos_embed.get_2d_sincos_pos_embed(buffer.shape[-1], grid, cls_token=True)
            buffer.copy_(torch.from_numpy(fixed).unsqueeze(0))
    n, length = 2, grid * grid
    imgs = torch.randn(n, 3, TINY["img_size"], TINY["img_size"], generator=generator, dtype=torch.float64)
    noise = torch.rand(n, length, generator=generator)  # float32, as the official draw
    ratio = 0.75
    calls = []

    def fixed_noise(*shape, **kwargs):
        assert tuple(shape) == (n, length), shape
        calls.append(shape)
        return noise.clone()

    case = {"config": TINY, "mask_ratio": ratio, "noise": noise.tolist(), "imgs": imgs.tolist()}
    for norm_pix_loss in [True, False]:
        model.norm_pix_loss = norm_pix_loss
        model.zero_grad()
        with mock.patch.object(torch, "rand", fixed_noise):
            latent, mask, ids_restore = model.forward_encoder(imgs, ratio)
            pred = model.forward_decoder(latent, ids_restore)
            loss = model.forward_loss(imgs, pred, mask)
            loss_again, _, _ = model(imgs, ratio)
        assert loss_again.item() == loss.item()
        loss.backward()
        key = "norm_pix" if norm_pix_loss else "raw_pix"
        case[key] = {
            "loss": loss.item(),
            "grads": {k: dict(model.named_parameters())[k].grad.tolist() for k in GRADIENT_KEYS},
        }
        case["latent"] = latent.tolist()
        case["mask"] = mask.tolist()
        case["ids_restore"] = ids_restore.tolist()
        case["pred"] = pred.tolist()
    assert len(calls) == 4, "MAE's noise draw was not replaced"
    case["state_dict"] = {k: v.tolist() for k, v in model.state_dict().items()}
    return case


def main():
    generator = torch.Generator().manual_seed(2111_06377)
    with tempfile.TemporaryDirectory() as workdir:
        models_mae, pos_embed = import_mae(workdir)
        golden = {
            "generator": "objectives/mae/golden/make_golden.py",
            "official_code": f"{MAE_URL} at {MAE_COMMIT}",
            "torch": torch.__version__,
            "patchify": patchify_cases(models_mae, generator),
            "forward_loss": loss_cases(models_mae, generator),
            "model": model_case(models_mae, pos_embed, generator),
        }
    golden = json.loads(json.dumps(golden))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    compact = lambda value: json.dumps(value, separators=(",", ":"))
    lines = []
    for key, value in golden.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join(f"  {compact(item)}" for item in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        elif isinstance(value, dict):
            rows = ",\n".join(f"  {json.dumps(k)}: {compact(v)}" for k, v in value.items())
            lines.append(f" {json.dumps(key)}: {{\n{rows}\n }}")
        else:
            lines.append(f" {json.dumps(key)}: {compact(value)}")
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    assert json.loads(text) == golden
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    model = golden["model"]
    print(f"model loss: norm_pix {model['norm_pix']['loss']:.6f}, raw {model['raw_pix']['loss']:.6f}")


if __name__ == "__main__":
    main()
