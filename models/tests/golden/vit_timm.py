"""A small timm ViT, its weights, inputs and outputs, for the ViT golden test.

`VisionTransformer(img_size=32, patch_size=16, embed_dim=24, depth=2, num_heads=2,
num_classes=0, dynamic_img_size=True)` with timm's default init (seed 0), eval mode. Writes
`vit_timm.safetensors`: the state dict (timm's keys) plus `test.input_32` [2, 3, 32, 32] →
`test.output_32` [2, 24] and `test.input_48` [2, 3, 48, 48] → `test.output_48` (positional
embedding resampled from the 2×2 to the 3×3 patch grid). Made with torch 2.15.0 and timm
1.0.31. Run: `python3 models/tests/golden/vit_timm.py`.
"""

from pathlib import Path

import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

torch.manual_seed(0)
model = VisionTransformer(
    img_size=32, patch_size=16, embed_dim=24, depth=2, num_heads=2, num_classes=0,
    dynamic_img_size=True,
).eval()
# Non-trivial class token and norms (timm starts them at ~0 / 1 / 0).
with torch.no_grad():
    for name, p in model.named_parameters():
        if "norm" in name or name == "cls_token":
            p.add_(0.3 * torch.randn_like(p))
tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
for side in (32, 48):
    x = torch.randn(2, 3, side, side)
    with torch.no_grad():
        tensors[f"test.input_{side}"] = x
        tensors[f"test.output_{side}"] = model(x).contiguous()
save_file(tensors, str(Path(__file__).resolve().parent / "vit_timm.safetensors"))
