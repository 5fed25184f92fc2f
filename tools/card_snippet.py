"""Runs the Python code of `ssl push` model cards as written, on staged repositories.

For each repository directory given (`RUN/hub` from `ssl push RUN --repo user/name --dry-run`, or
a fixture directory below), it takes the ```python block of `README.md` and executes it with one
stand-in: `huggingface_hub.hf_hub_download(repo, file)` returns the directory's own file (after
checking that `repo` is the card's repository), so nothing is downloaded. The block builds the
module, loads `model.safetensors` with `load_state_dict(..., strict=True)` and asserts the
features' shape itself; this script then checks that `encoder` and `features` exist and, when the
directory holds `reference.safetensors` (`input` and the Candle encoder's eval-mode `output`),
that the PyTorch module gives the same features.

The reference directories, one per encoder family (digits CNN, MLP, ResNet-18 with the CIFAR
stem, ResNet-34/50 with the ImageNet stem on 1 and 3 channels, 3D ResNet-18, ViT-T/16), come
from a Rust test:

    SSL_CARD_SNIPPETS=/tmp/card-snippets cargo test --release -p ssl --test publish card_snippet
    python3 tools/card_snippet.py /tmp/card-snippets/*

Needs torch, safetensors, and torchvision / timm for the cards that use them. Prints one line
per directory and exits non-zero if any fails.
"""

import re
import sys
import traceback
import types
from pathlib import Path

import torch
from safetensors.torch import load_file

TOLERANCE = 1e-4


def python_block(card: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.S)
    if len(blocks) != 1:
        raise ValueError(f"expected one ```python block in README.md, found {len(blocks)}")
    return blocks[0]


def card_repo(card: str) -> str:
    match = re.search(r"^# (\S+/\S+)$", card, flags=re.M)
    if not match:
        raise ValueError("README.md has no `# user/name` heading")
    return match.group(1)


def offline_hub(directory: Path, repo: str) -> types.ModuleType:
    """A `huggingface_hub` whose `hf_hub_download` serves `directory`'s files for `repo`."""
    module = types.ModuleType("huggingface_hub")

    def hf_hub_download(repo_id, filename, **_):
        if repo_id != repo:
            raise ValueError(f"the snippet downloads from {repo_id}, the card is {repo}")
        path = directory / filename
        if not path.is_file():
            raise FileNotFoundError(path)
        return str(path)

    module.hf_hub_download = hf_hub_download
    return module


def check(directory: Path) -> str:
    card = (directory / "README.md").read_text()
    code = python_block(card)
    sys.modules["huggingface_hub"] = offline_hub(directory, card_repo(card))
    namespace = {"__name__": "card_snippet"}
    exec(compile(code, str(directory / "README.md"), "exec"), namespace)
    encoder, features = namespace.get("encoder"), namespace.get("features")
    if not isinstance(encoder, torch.nn.Module) or not isinstance(features, torch.Tensor):
        raise ValueError("the snippet must leave `encoder` (a module) and `features`")
    if encoder.training:
        raise ValueError("the snippet leaves the encoder in training mode")
    report = f"strict load, features {tuple(features.shape)}"
    reference = directory / "reference.safetensors"
    if reference.is_file():
        tensors = load_file(str(reference))
        with torch.no_grad():
            got = encoder(tensors["input"])
        want = tensors["output"]
        if got.shape != want.shape:
            raise ValueError(f"features {tuple(got.shape)}, Candle's {tuple(want.shape)}")
        scale = want.abs().max().item()
        error = (got - want).abs().max().item()
        if error > TOLERANCE * max(1.0, scale):
            raise ValueError(f"features differ from Candle's by {error:.3g} (scale {scale:.3g})")
        report += f", max |PyTorch - Candle| {error:.2g} (scale {scale:.2g})"
    return report


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    failed = 0
    for arg in sys.argv[1:]:
        directory = Path(arg)
        try:
            print(f"ok   {directory}: {check(directory)}")
        except Exception:  # report every directory, then fail
            failed += 1
            print(f"FAIL {directory}:\n{traceback.format_exc()}")
    print(f"{len(sys.argv) - 1 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
