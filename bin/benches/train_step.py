"""The PyTorch side of `train_step.rs`: one full training step (forward + loss + backward +
AdamW) of the same four rows, on the CPU, so the two can be timed side by side.

1. resnet18_cifar_vicreg: torchvision ResNet-18 with the CIFAR stem (3×3 stride-1 conv1, no
   max-pool, fc removed), projector Linear(512, 2048)–BatchNorm1d–ReLU–Linear(2048, 2048),
   VICReg (λ = μ = 25, ν = 1), 32×32×3, B = 64 instances × 2 views, lr 1e-3;
2. resnet18_cifar_frossl_v8: the same with FroSSL (λ = 1) at V = 8;
3. vit_s16_icone: timm `vit_small_patch16_224` (num_classes=0: the 384-d class token), IConE
   (L_vv + L_vi + L_div over a table of 1024 × 384), 224×224×3, B = 16 × 2 views, lr 1e-4;
4. resnet3d18_icone: ResNet-18 with every layer in 3D (7³ stride-2 conv1, 3³ stride-2
   max-pool, 1×1×1 stride-2 projections), one input channel, fc 512 → 512, IConE over a table of
   1024 × 512, 64³, B = 4 × 2 views, lr 1e-4.

As in candle-ssl's trainer, the encoder runs view by view in train mode (batch-norm statistics
per view) and the loss sees `[V, B, D]`. AdamW betas (0.9, 0.999), eps 1e-8, weight decay 0.05
on tensors of ≥ 2 dims (the IConE table included), none on biases and norm parameters, the
same grouping as candle-ssl's optimiser. Inputs are N(0, 1) images drawn once; the IConE ids
move by B every step. The losses follow `docs/spec/objectives.md` §2.1, §2.3, §2.11; `--check`
prints each on fixed inputs to compare with candle-ssl's known-answer tests.

    python3 bin/benches/train_step.py --row all --threads 2 [--steps 10] [--warmup 2] [--device cuda]

Each row prints one JSON line: median / min / max milliseconds over `--steps` steps after
`--warmup`, and the process's peak RSS (`ru_maxrss`, KiB on Linux, as MiB). `--row all` runs
every row in a fresh process so that each peak RSS is the row's own. On a GPU the line adds the
peak GPU memory (`torch.cuda.max_memory_allocated`) and PyTorch's TF32 settings (by default
cuDNN convolutions may use TF32, matmuls may not); `--cudnn-benchmark` sets
`torch.backends.cudnn.benchmark = True` (cuDNN times its algorithms per shape); `--bf16` runs
the forward and the loss under `torch.autocast(dtype=torch.bfloat16)`, as candle-ssl's
`train.precision: bf16`.
"""

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

INSTANCES = 1024


def vicreg(z, lam=25.0, mu=25.0, nu=1.0):
    """VICReg on `[V, B, D]` (§2.3; V = 2 is the official form)."""
    v, b, d = z.shape
    pairs = [(i, j) for i in range(v) for j in range(i + 1, v)]
    inv = sum(F.mse_loss(z[i], z[j]) for i, j in pairs) / len(pairs)
    var = cov = 0.0
    for zv in z:
        std = torch.sqrt(zv.var(dim=0) + 1e-4)
        var = var + F.relu(1.0 - std).mean()
        c = zv - zv.mean(dim=0)
        c = c.T @ c / (b - 1)
        cov = cov + (c.pow(2).sum() - c.diagonal().pow(2).sum()) / d
    return lam * inv + mu * var / v + nu * 2.0 * cov / v


def frossl(z, lam=1.0):
    """FroSSL on `[V, B, D]` (§2.11, the official default)."""
    v, b, d = z.shape
    zn = z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)
    mean = zn.mean(dim=0)
    loss = 0.0
    for zv in zn:
        k = zv.T @ zv if b > d else zv @ zv.T
        k = k / torch.trace(k).detach()
        loss = loss + torch.log(k.pow(2).sum()) + lam * v * (zv - mean).pow(2).sum() / b
    return loss


def icone(f, table, ids):
    """IConE on encoder outputs `[V, B, d]` and the raw table `[N, d]` (§2.1)."""
    v, b, _ = f.shape
    z = F.normalize(f, dim=-1)
    e = F.normalize(table, dim=-1)
    pair_dots = (z.sum(0).pow(2).sum() - z.pow(2).sum()) / 2
    l_vv = 1.0 - pair_dots / (b * v * (v - 1) / 2)
    l_vi = 1.0 - (z * e[ids]).sum() / (b * v)
    n = e.shape[0]
    g = F.relu(e @ e.T)
    l_div = (g.pow(2).sum() - g.diagonal().pow(2).sum()) / (n * (n - 1))
    return l_vv + l_vi + l_div


def resnet18_cifar():
    import torchvision

    net = torchvision.models.resnet18(weights=None)
    net.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
    net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


def resnet18_3d():
    """torchvision's ResNet-18 with each 2D layer replaced by its 3D counterpart."""

    class Block(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv1 = nn.Conv3d(c_in, c_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm3d(c_out)
            self.conv2 = nn.Conv3d(c_out, c_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm3d(c_out)
            self.downsample = None
            if stride != 1 or c_in != c_out:
                self.downsample = nn.Sequential(
                    nn.Conv3d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm3d(c_out)
                )

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + (x if self.downsample is None else self.downsample(x)))

    layers = [nn.Conv3d(1, 64, 7, 2, 3, bias=False), nn.BatchNorm3d(64), nn.ReLU(),
              nn.MaxPool3d(3, 2, 1)]
    c_in = 64
    for stage, width in enumerate([64, 128, 256, 512]):
        for j in range(2):
            layers.append(Block(c_in, width, 2 if stage > 0 and j == 0 else 1))
            c_in = width
    layers += [nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(512, 512)]
    net = nn.Sequential(*layers)
    for m in net.modules():  # torchvision's ResNet init
        if isinstance(m, nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return net


def vit_s16():
    import timm

    return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0)


ROWS = {
    1: ("resnet18_cifar_vicreg", resnet18_cifar, True, "vicreg", 64, 2, (3, 32, 32), 1e-3),
    2: ("resnet18_cifar_frossl_v8", resnet18_cifar, True, "frossl", 64, 8, (3, 32, 32), 1e-3),
    3: ("vit_s16_icone", vit_s16, False, "icone", 16, 2, (3, 224, 224), 1e-4),
    4: ("resnet3d18_icone", resnet18_3d, False, "icone", 4, 2, (1, 64, 64, 64), 1e-4),
}


def run_row(row, threads, steps, warmup, device, cudnn_benchmark=False, bf16=False):
    name, build, with_projector, loss_name, b, v, shape, lr = ROWS[row]
    torch.manual_seed(0)
    encoder = build().train().to(device)
    modules = [encoder]
    projector = None
    if with_projector:
        projector = nn.Sequential(
            nn.Linear(512, 2048), nn.BatchNorm1d(2048), nn.ReLU(), nn.Linear(2048, 2048)
        ).train().to(device)
        modules.append(projector)
    params = [p for m in modules for p in m.parameters()]
    table = None
    if loss_name == "icone":
        d = 384 if row == 3 else 512
        table = nn.Parameter(0.02 * torch.randn(INSTANCES, d, device=device))
        params.append(table)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.999), eps=1e-8,
    )
    views = torch.randn(v, b, *shape, device=device)
    times = []
    for step in range(warmup + steps):
        first = (step * b) % INSTANCES
        ids = torch.arange(first, first + b, device=device)
        t = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            out = []
            for x in views:
                f = encoder(x)
                out.append(projector(f) if projector is not None else f)
            z = torch.stack(out)
            if loss_name == "vicreg":
                loss = vicreg(z)
            elif loss_name == "frossl":
                loss = frossl(z)
            else:
                loss = icone(z, table, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()
        if step >= warmup:
            times.append((time.perf_counter() - t) * 1e3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = {
        "row": row, "name": name, "framework": "pytorch", "torch": torch.__version__,
        "device": device,
        "threads": threads, "median_ms": statistics.median(times), "min_ms": min(times),
        "max_ms": max(times), "peak_rss_mib": peak, "precision": "bf16" if bf16 else "f32",
    }
    if device != "cpu":
        line.update({
            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20,
            "cudnn_benchmark": cudnn_benchmark,
            "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        })
    print(json.dumps(line), flush=True)


def formula(*shape, a=0.37, c=0.1):
    """`x[k] = sin(a·k + c)` over the row-major flat index `k` of `shape`, in float64: inputs
    the Rust side can rebuild without sharing a random stream."""
    k = torch.arange(math.prod(shape), dtype=torch.float64)
    return torch.sin(a * k + c).reshape(shape)


def check():
    """Each loss on fixed float64 inputs, to compare with candle-ssl's losses.

    1. The spec's known-answer inputs (§2.3 `Z_a, Z_b`; §2.11 adds `Z_c`; §2.1's IConE example).
    2. Multi-view inputs the spec has no example for, built by `formula`:
       `z = formula(3, 6, 4)` (`[V, B, D]`, B > D: FroSSL's D×D Gram) and
       `z = formula(3, 4, 6)` (B < D: FroSSL's B×B Gram) for VICReg and FroSSL;
       IConE with `f = formula(3, 4, 6)`, table `E = formula(5, 6, a=0.53, c=0.2)` and ids
       `[4, 0, 2, 1]`.
    """
    za = torch.tensor([[1, 0, 2], [0, 1, 1], [2, 1, 0], [1, 3, 1]], dtype=torch.float64)
    zb = torch.tensor([[1, 1, 2], [0, 0, 1], [2, 2, 1], [0, 3, 0]], dtype=torch.float64)
    zc = torch.tensor([[2, 0, 1], [1, 1, 0], [1, 0, 1], [0, 2, 2]], dtype=torch.float64)
    print("vicreg spec", vicreg(torch.stack([za, zb])).item(), "(spec 15.5072337985)")
    print("frossl spec", frossl(torch.stack([za, zb])).item(), "(spec -1.0128998163)")
    print("frossl spec3", frossl(torch.stack([za, zb, zc])).item(), "(spec -0.7891713671)")
    f = torch.tensor([[[1, 2, 2], [0, 3, 4]], [[2, 1, 2], [0, 4, 3]]], dtype=torch.float64)
    table = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0]], dtype=torch.float64)
    print("icone spec", icone(f, table, torch.tensor([0, 2])).item(), "(spec 0.6655892264)")
    for shape in [(3, 6, 4), (3, 4, 6)]:
        z = formula(*shape)
        tag = "x".join(map(str, shape))
        print(f"vicreg formula({tag})", vicreg(z).item())
        print(f"frossl formula({tag})", frossl(z).item())
    ids = torch.tensor([4, 0, 2, 1])
    loss = icone(formula(3, 4, 6), formula(5, 6, a=0.53, c=0.2), ids)
    print("icone formula(3x4x6) table formula(5x6) ids [4,0,2,1]", loss.item())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", default="all")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--check", action="store_true")
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--bf16", action="store_true")
    a = p.parse_args()
    if a.check:
        return check()
    if a.row == "all":
        for row in ROWS:
            subprocess.run([sys.executable, __file__, "--row", str(row), "--threads",
                            str(a.threads), "--steps", str(a.steps), "--warmup", str(a.warmup),
                            "--device", a.device]
                           + (["--cudnn-benchmark"] if a.cudnn_benchmark else [])
                           + (["--bf16"] if a.bf16 else []), check=True)
        return
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    run_row(int(a.row), a.threads, a.steps, a.warmup, a.device, a.cudnn_benchmark, a.bf16)


if __name__ == "__main__":
    main()
