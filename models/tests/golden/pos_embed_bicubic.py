"""Golden values of timm's positional-embedding resampling for the ViT tests.

Resamples a 4×4 grid of 2-d embeddings (values `sin(0.7·k)` for flat index k, behind one
class-token row) with `timm.layers.resample_abs_pos_embed` and its defaults (bicubic,
antialiased, `align_corners=False`), which timm's ViT applies to inputs of another size
(`dynamic_img_size=True`), and writes `pos_embed_bicubic.txt`: per case a line `gh gw`
followed by the `gh·gw·2` resampled grid values in row-major `[gh, gw, 2]` order.
Made with torch 2.15.0 and timm 1.0.31. Run: `python3 models/tests/golden/pos_embed_bicubic.py`.
"""

from pathlib import Path

import torch
from timm.layers import resample_abs_pos_embed

posemb = torch.sin(0.7 * torch.arange((1 + 4 * 4) * 2, dtype=torch.float32)).reshape(1, 17, 2)
lines = []
for gh, gw in [(6, 5), (3, 3), (2, 7), (1, 1)]:
    out = resample_abs_pos_embed(posemb, new_size=[gh, gw], old_size=[4, 4], num_prefix_tokens=1)
    assert torch.equal(out[:, :1], posemb[:, :1])
    lines.append(f"{gh} {gw}")
    lines.append(" ".join(f"{v:.9g}" for v in out[0, 1:].flatten().tolist()))
(Path(__file__).resolve().parent / "pos_embed_bicubic.txt").write_text("\n".join(lines) + "\n")
