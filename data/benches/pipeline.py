"""The reference side of data/benches/pipeline.rs: views per second per core of the same three
pipelines, torchvision (PIL backend) for the 2D recipes and PyTorch ops for IConE's 3D one.

    python3 data/benches/pipeline.py --views 2000

One thread (torch.set_num_threads(1)), the same inputs as the Rust bench: tests/golden/photo.png
resized to 224 and 32 px as PIL images, seeded random uint8 volumes at 64^3; every view ends in
a normalised float tensor, as ours do.
"""

import argparse
import json
import os
import random
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
INSTANCES = 64


def icone_2d(side):
    return T.Compose([
        T.RandomResizedCrop(side, scale=(0.2, 1.0)),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.RandomApply([T.GaussianBlur(2 * (side // 20) + 1, (0.1, 2.0))], p=0.5),
        T.ToTensor(),
        T.Normalize(*IMAGENET),
    ])


def frossl(side):
    """solo-learn's `symmetric` preset (FroSSL's default), as candle-ssl's `frossl` recipe."""
    return T.Compose([
        T.RandomResizedCrop(side, scale=(0.08, 1.0), interpolation=T.InterpolationMode.BICUBIC),
        T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.RandomApply([T.GaussianBlur(2 * (side // 20) + 1, (0.1, 2.0))], p=0.5),
        T.RandomHorizontalFlip(),
        T.ToTensor(),
        T.Normalize(*IMAGENET),
    ])


def icone_3d(volume_u8):
    """IConE App. A.2 with the spec's choices (docs/spec/data.md section 4), in PyTorch ops."""
    x = torch.from_numpy(volume_u8).float().div_(255.0)  # [1, D, H, W]
    n = x.shape[-1]
    side = min(max(round(n * random.uniform(0.5, 1.0) ** (1 / 3)), 1), n)
    z, y, w = (random.randint(0, n - side) for _ in range(3))
    crop = x[:, z:z + side, y:y + side, w:w + side]
    x = F.interpolate(crop[None], size=(n, n, n), mode="trilinear", align_corners=False)[0]
    for axis in (1, 2, 3):
        if random.random() < 0.5:
            x = torch.flip(x, dims=(axis,))
    if random.random() < 0.5:
        dims = random.choice([(1, 2), (1, 3), (2, 3)])
        x = torch.rot90(x, random.randint(1, 3), dims=dims)
    x = random.uniform(0.8, 1.2) * (x + random.uniform(-0.1, 0.1))
    if random.random() < 0.3:
        x = x + 0.1 * torch.randn_like(x)
    if random.random() < 0.3:
        x = F.avg_pool3d(x[None], 3, stride=1, padding=1, count_include_pad=True)[0]
    return x.contiguous()


def rate(make_view, inputs, views):
    for item in inputs[:8]:
        make_view(item)
    start = time.perf_counter()
    made = 0
    while made < views:
        for item in inputs:
            make_view(item)
            make_view(item)
            made += 2
    return made / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--views", type=int, default=2000)
    args = p.parse_args()
    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    photo = Image.open(os.path.join(HERE, "..", "tests", "golden", "photo.png")).convert("RGB")
    rows = []
    for name, side, pipeline, views in (
        ("icone_224", 224, icone_2d, args.views),
        ("frossl_32", 32, frossl, 10 * args.views),
    ):
        image = photo.resize((side, side), Image.BILINEAR)
        transform = pipeline(side)
        rows.append((name, rate(transform, [image] * INSTANCES, views), views))
    volumes = list(np.random.default_rng(0).integers(0, 256, (INSTANCES, 1, 64, 64, 64), dtype=np.uint8))
    rows.append(("icone3d_64", rate(icone_3d, volumes, args.views // 10), args.views // 10))
    for name, r, views in rows:
        print(json.dumps({"pipeline": name, "framework": "torchvision-pil", "threads": 1,
                          "views": views, "views_per_s": r}))


if __name__ == "__main__":
    main()
