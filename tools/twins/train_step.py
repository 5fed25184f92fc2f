"""The PyTorch side of `train_step.rs`: one full training step (forward + loss + backward +
AdamW) of the same six rows, on the CPU, so the two can be timed side by side.

1. resnet18_cifar_vicreg: torchvision ResNet-18 with the CIFAR stem (3×3 stride-1 conv1, no
   max-pool, fc removed), projector Linear(512, 2048)–BatchNorm1d–ReLU–Linear(2048, 2048),
   VICReg (λ = μ = 25, ν = 1), 32×32×3, B = 64 instances × 2 views, lr 1e-3;
2. resnet18_cifar_frossl_v8: the same with FroSSL (λ = 1) at V = 8;
3. vit_s16_icone: timm `vit_small_patch16_224` (num_classes=0: the 384-d class token), IConE
   (L_vv + L_vi + L_div over a table of 1024 × 384), 224×224×3, B = 16 × 2 views, lr 1e-4;
4. resnet3d18_icone: ResNet-18 with every layer in 3D (7³ stride-2 conv1, 3³ stride-2
   max-pool, 1×1×1 stride-2 projections), one input channel, fc 512 → 512, IConE over a table of
   1024 × 512, 64³, B = 4 × 2 views, lr 1e-4;
5. vit_s16_mae: MAE (He et al., CVPR 2022) on a ViT-S/16 in timm's layout written here in plain
   PyTorch (`Vit`: class token, learned positions added before the kept patches are gathered,
   as candle-ssl's `VisionTransformer::forward_tokens`), 224×224×3, B = 64 × 1 view, lr 1.5e-4:
   per image 75 % of the 196 patches removed by sorting uniform noise (49 kept); the encoder on
   the class token and the kept patches; the decoder (Linear 384 → 512, mask tokens for the
   removed patches, unshuffled to patch order, fixed 2D sine-cosine positions with a zero row
   for the class token, 8 pre-norm blocks of width 512 with 16 heads, LayerNorm, Linear
   512 → 16·16·3) on all 197 tokens; loss: each target patch normalised by its own mean and
   unbiased variance (+1e-6), the mean squared error averaged over the removed patches;
6. vit_s16_ijepa: I-JEPA (Assran et al., CVPR 2023) on the same ViT-S/16, B = 64 × 1 view,
   lr 1e-3: per batch one target block size (15–20 % of the 196 patches, aspect 0.75–1.5) and
   one context block size (85–100 %, square, each side below the grid's), per image 4 target
   blocks and 1 context block with the targets taken out, every mask cut to the batch's
   shortest (`multiblock_masks`, a sampler of the same sizes as candle-ssl's, not its random
   stream); the EMA target encoder (a copy, no gradient) on all 196 patches, `layer_norm` of its
   patch tokens gathered at each target block; the context encoder on the class token and the
   context patches (the class token's output dropped); the predictor (Linear 384 → 384 plus
   fixed sine-cosine positions, mask tokens plus the targets' positions, 12 blocks of width
   384 with 12 heads, LayerNorm, Linear 384 → 384) on [context ; one target block's mask
   tokens], the context repeated for each target (batch 4·B); smooth L1 (β = 1); after the
   optimiser step the target encoder's EMA update, momentum 0.996 + k·0.004/1000 at step k.
   The sizes are the constants `MAE_*` and `IJEPA_*` below.

Rows 5 and 6 sample their masks inside the timed step, as candle-ssl's objectives do.

As in candle-ssl's trainer, the encoder runs view by view in train mode (batch-norm statistics
per view) and the loss sees `[V, B, D]`. AdamW betas (0.9, 0.999), eps 1e-8, weight decay 0.05
on tensors of ≥ 2 dims (the IConE table included), none on biases and norm parameters, the
same grouping as candle-ssl's optimiser. Inputs are N(0, 1) images drawn once; the IConE ids
move by B every step. The losses follow `docs/spec/objectives.md` §2.1, §2.3, §2.11 (rows 5 and 6: the
`ssl-mae` and `ssl-ijepa` crates, masks §3.1); `--check` prints each on fixed inputs to compare
with candle-ssl's known-answer tests.

    python3 tools/twins/train_step.py --row all --threads 2 [--steps 10] [--warmup 2] [--device cuda]

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
import copy
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


# Rows 5 and 6: sizes of MAE's decoder and I-JEPA's predictor (candle-ssl's defaults).
MAE_MASK_RATIO = 0.75
MAE_DECODER_DIM = 512
MAE_DECODER_DEPTH = 8
MAE_DECODER_HEADS = 16
IJEPA_PREDICTOR_DIM = 384
IJEPA_PREDICTOR_DEPTH = 12
IJEPA_PREDICTOR_HEADS = 12
IJEPA_TARGETS = 4
IJEPA_CONTEXTS = 1
IJEPA_TARGET_SCALE = (0.15, 0.2)
IJEPA_CONTEXT_SCALE = (0.85, 1.0)
IJEPA_ASPECT_RATIO = (0.75, 1.5)
IJEPA_MIN_KEEP = 10
IJEPA_EMA = (0.996, 1.0)
# candle-ssl's bench steps with `total_steps` 1000 (the momentum schedule's length).
IJEPA_TOTAL_STEPS = 1000


class Block(nn.Module):
    """A pre-norm transformer block in timm's layout: `x + attn(norm1(x))`, then
    `x + mlp(norm2(x))`, LayerNorm ε 1e-6, exact-erf GELU, attention by
    `F.scaled_dot_product_attention` (timm's fused path)."""

    def __init__(self, d, heads, mlp_ratio=4):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.fc1 = nn.Linear(d, mlp_ratio * d)
        self.fc2 = nn.Linear(mlp_ratio * d, d)

    def forward(self, x):
        n, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(n, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def init_linears(module, std=0.02):
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=std)
            nn.init.zeros_(m.bias)


def gather_rows(x, idx):
    """`x[n, idx[n, k]]`: `[N, L, D]` with `idx` `[N, K]` → `[N, K, D]`."""
    return torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[-1]))


class Vit(nn.Module):
    """ViT-S/16 (by default) in timm's layout, with candle-ssl's `forward_tokens`: a learned
    positional embedding added to every patch token before the kept ones are gathered, then the
    class token in front."""

    def __init__(self, d=384, depth=12, heads=6, patch=16, img=224, channels=3):
        super().__init__()
        self.patch, self.grid = patch, img // patch
        self.patch_embed = nn.Conv2d(channels, d, patch, patch)
        self.cls_token = nn.Parameter(1e-6 * torch.randn(1, 1, d))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, 1 + self.grid**2, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        init_linears(self.blocks)

    def forward_tokens(self, x, keep=None):
        """`(cls [N, D], patches [N, K, D])` after the final norm; `keep` `[N, K]` long."""
        t = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed[:, 1:]
        if keep is not None:
            t = gather_rows(t, keep)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(t.shape[0], -1, -1)
        h = torch.cat([cls, t], 1)
        for block in self.blocks:
            h = block(h)
        h = self.norm(h)
        return h[:, 0], h[:, 1:]


def sincos_2d(d, gh, gw):
    """`[gh·gw, d]`: cell (i, j) is `[e(j), e(i)]`, `e(x) = [sin(x·ω), cos(x·ω)]`,
    `ω_k = 10000^(−k/(d/4))` (candle-ssl's `ssl_masking::sincos_2d`)."""
    m = d // 4
    omega = 1.0 / 10000 ** (torch.arange(m, dtype=torch.float64) / m)

    def one_d(x):
        a = x[:, None] * omega[None]
        return torch.cat([a.sin(), a.cos()], 1)

    i, j = torch.meshgrid(torch.arange(gh, dtype=torch.float64),
                          torch.arange(gw, dtype=torch.float64), indexing="ij")
    return torch.cat([one_d(j.flatten()), one_d(i.flatten())], 1).float()


def patchify(x, p):
    """`[N, C, H, W]` → `[N, (H/p)(W/p), p·p·C]`, each patch's values by pixel row, column,
    channel."""
    n, c, h, w = x.shape
    x = x.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(n, (h // p) * (w // p), p * p * c)


def mae_loss(pred, target, mask, norm_pix=True):
    """Mean over the removed patches (`mask` 1) of each patch's mean squared error, the target
    patches normalised by their own mean and unbiased variance (+1e-6) under `norm_pix`."""
    if norm_pix:
        mean = target.mean(-1, keepdim=True)
        var = target.var(-1, keepdim=True)
        target = (target - mean) / (var + 1e-6).sqrt()
    per_patch = (pred - target).pow(2).mean(-1)
    return (per_patch * mask).sum() / mask.sum()


def random_masking(n, length, ratio, device):
    """MAE's per-sample masks: the patches sorted by uniform noise, the first
    `int(L·(1 − ratio))` kept. Returns `keep` `[N, K]`, `restore` `[N, L]` (each patch's place
    in that order) and `mask` `[N, L]` (1 = removed)."""
    kept = int(length * (1 - ratio))
    order = torch.argsort(torch.rand(n, length, device=device), dim=1)
    restore = torch.argsort(order, dim=1)
    mask = (restore >= kept).float()
    return order[:, :kept], restore, mask


class MaeDecoder(nn.Module):
    def __init__(self, enc_dim=384, d=MAE_DECODER_DIM, depth=MAE_DECODER_DEPTH,
                 heads=MAE_DECODER_HEADS, patch_values=16 * 16 * 3, grid=14):
        super().__init__()
        self.embed = nn.Linear(enc_dim, d)
        self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, d))
        pos = torch.cat([torch.zeros(1, d), sincos_2d(d, grid, grid)])
        self.register_buffer("pos", pos[None], persistent=False)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.pred = nn.Linear(d, patch_values)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, cls, visible, restore):
        """Every patch's predicted pixels `[N, L, p·p·C]` in patch order."""
        x = self.embed(torch.cat([cls[:, None], visible], 1))
        n, length = restore.shape
        masked = self.mask_token.expand(n, length - visible.shape[1], -1)
        patches = gather_rows(torch.cat([x[:, 1:], masked], 1), restore)
        h = torch.cat([x[:, :1], patches], 1) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.pred(self.norm(h))[:, 1:]


def multiblock_masks(b, grid=14, gen=None):
    """Multi-block masks of I-JEPA's sizes: one target block size and one context block size
    for the batch; per image `IJEPA_TARGETS` target blocks at uniform corners, then
    `IJEPA_CONTEXTS` context blocks with every target cell of that image taken out (drawn again
    until more than `IJEPA_MIN_KEEP` cells remain); each kind cut to the batch's shortest.
    Returns the context and target masks, lists of `[B, K]` long tensors (row-major cells)."""
    rand = lambda: torch.rand((), generator=gen).item()
    below = lambda hi: int(torch.randint(hi, (), generator=gen))

    def size(scale, aspect):
        u = rand()
        area = int(grid * grid * (scale[0] + u * (scale[1] - scale[0])))
        a = aspect[0] + u * (aspect[1] - aspect[0])
        return (min(round(math.sqrt(area * a)), grid - 1),
                min(round(math.sqrt(area / a)), grid - 1))

    (th, tw), (ch, cw) = size(IJEPA_TARGET_SCALE, IJEPA_ASPECT_RATIO), size(IJEPA_CONTEXT_SCALE,
                                                                          (1.0, 1.0))

    def block(h, w, excluded=frozenset()):
        while True:
            top, left = below(grid - h), below(grid - w)
            cells = [r * grid + c for r in range(top, top + h) for c in range(left, left + w)
                     if r * grid + c not in excluded]
            if len(cells) > IJEPA_MIN_KEEP:
                return cells

    targets = [[] for _ in range(IJEPA_TARGETS)]
    contexts = [[] for _ in range(IJEPA_CONTEXTS)]
    for _ in range(b):
        taken = set()
        for t in targets:
            t.append(block(th, tw))
            taken.update(t[-1])
        for c in contexts:
            c.append(block(ch, cw, taken))

    def cut(masks):
        k = min(len(m) for per_image in masks for m in per_image)
        return [torch.tensor([m[:k] for m in per_image]) for per_image in masks]

    return cut(contexts), cut(targets)


class Predictor(nn.Module):
    def __init__(self, enc_dim=384, d=IJEPA_PREDICTOR_DIM, depth=IJEPA_PREDICTOR_DEPTH,
                 heads=IJEPA_PREDICTOR_HEADS, grid=14):
        super().__init__()
        self.embed = nn.Linear(enc_dim, d)
        self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, d))
        self.register_buffer("pos", sincos_2d(d, grid, grid)[None], persistent=False)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.proj = nn.Linear(d, enc_dim)
        init_linears(self)

    def forward(self, z, context, targets):
        """`z` `[B, K_c, E]` (one context mask), `context` `[B, K_c]`, `targets` T × `[B, K_t]`
        → `[T·B, K_t, E]`, target-major."""
        b = z.shape[0]
        pos = self.pos.expand(b, -1, -1)
        x = self.embed(z) + gather_rows(pos, context)
        queries = self.mask_token + torch.cat([gather_rows(pos, t) for t in targets], 0)
        h = torch.cat([x.repeat(len(targets), 1, 1), queries], 1)
        for block in self.blocks:
            h = block(h)
        return self.proj(self.norm(h)[:, x.shape[1]:])


ROWS = {
    1: ("resnet18_cifar_vicreg", resnet18_cifar, True, "vicreg", 64, 2, (3, 32, 32), 1e-3),
    2: ("resnet18_cifar_frossl_v8", resnet18_cifar, True, "frossl", 64, 8, (3, 32, 32), 1e-3),
    3: ("vit_s16_icone", vit_s16, False, "icone", 16, 2, (3, 224, 224), 1e-4),
    4: ("resnet3d18_icone", resnet18_3d, False, "icone", 4, 2, (1, 64, 64, 64), 1e-4),
    5: ("vit_s16_mae", Vit, False, "mae", 64, 1, (3, 224, 224), 1.5e-4),
    6: ("vit_s16_ijepa", Vit, False, "ijepa", 64, 1, (3, 224, 224), 1e-3),
}


def embedding_row(row, device):
    """Rows 1–4: the encoder (and projector) view by view, the loss on `[V, B, D]`. Returns the
    trained parameters, the step's loss as a function of the step, and no after-step hook."""
    _, build, with_projector, loss_name, b, v, shape, _ = ROWS[row]
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
    views = torch.randn(v, b, *shape, device=device)

    def loss(step):
        out = []
        for x in views:
            f = encoder(x)
            out.append(projector(f) if projector is not None else f)
        z = torch.stack(out)
        if loss_name == "vicreg":
            return vicreg(z)
        if loss_name == "frossl":
            return frossl(z)
        first = (step * b) % INSTANCES
        return icone(z, table, torch.arange(first, first + b, device=device))

    return params, loss, None


def mae_row(device):
    """Row 5: MAE's masks, encoder on the visible patches, decoder, normalised-pixel loss."""
    _, build, _, _, b, _, shape, _ = ROWS[5]
    encoder = build().train().to(device)
    decoder = MaeDecoder().train().to(device)
    images = torch.randn(b, *shape, device=device)
    length = encoder.grid**2

    def loss(step):
        keep, restore, mask = random_masking(b, length, MAE_MASK_RATIO, device)
        cls, visible = encoder.forward_tokens(images, keep)
        pred = decoder(cls, visible, restore)
        return mae_loss(pred, patchify(images, encoder.patch), mask)

    return list(encoder.parameters()) + list(decoder.parameters()), loss, None


def ijepa_row(device):
    """Row 6: multi-block masks, the EMA target encoder on every patch, the context encoder on
    the context block, the predictor per target block, smooth L1; the EMA update after the
    optimiser step."""
    assert IJEPA_CONTEXTS == 1, "the predictor here takes one context block per image"
    _, build, _, _, b, _, shape, _ = ROWS[6]
    encoder = build().train().to(device)
    target = copy.deepcopy(encoder).requires_grad_(False)
    predictor = Predictor().train().to(device)
    images = torch.randn(b, *shape, device=device)
    gen = torch.Generator().manual_seed(0)

    def loss(step):
        (context,), targets = multiblock_masks(b, encoder.grid, gen)
        context, targets = context.to(device), [t.to(device) for t in targets]
        with torch.no_grad():
            _, h = target.forward_tokens(images)
            h = F.layer_norm(h, h.shape[-1:])
            goal = torch.cat([gather_rows(h, t) for t in targets], 0)
        _, z = encoder.forward_tokens(images, context)
        return F.smooth_l1_loss(predictor(z, context, targets), goal)

    student, teacher = list(encoder.parameters()), list(target.parameters())

    @torch.no_grad()
    def ema(step):
        start, end = IJEPA_EMA
        m = start + step * (end - start) / IJEPA_TOTAL_STEPS
        torch._foreach_mul_(teacher, m)
        torch._foreach_add_(teacher, student, alpha=1 - m)

    return student + list(predictor.parameters()), loss, ema


def run_row(row, threads, steps, warmup, device, cudnn_benchmark=False, bf16=False):
    name, lr = ROWS[row][0], ROWS[row][-1]
    torch.manual_seed(0)
    if row == 5:
        params, step_loss, after_step = mae_row(device)
    elif row == 6:
        params, step_loss, after_step = ijepa_row(device)
    else:
        params, step_loss, after_step = embedding_row(row, device)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.999), eps=1e-8,
    )
    times = []
    for step in range(warmup + steps):
        t = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = step_loss(step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step(step)
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
    3. MAE's loss (row 5): images `formula(2, 3, 4, 4)` in 2-px patches (4 patches of 12
       values), predictions `formula(2, 4, 12, a=0.53, c=0.2)`, removed patches
       `[[1, 0, 1, 0], [0, 1, 1, 1]]`, with and without `norm_pix_loss`.
    4. I-JEPA's loss (row 6): target tokens `layer_norm(formula(2, 5, 6))` gathered at the
       target masks `[[0, 2, 4], [1, 3, 0]]` and `[[4, 4, 1], [2, 0, 3]]` (stacked mask-major),
       predictions `3·formula(4, 3, 6, a=0.53, c=0.2)`, smooth L1.
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
    target = patchify(formula(2, 3, 4, 4), 2)
    pred = formula(2, 4, 12, a=0.53, c=0.2)
    removed = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.float64)
    print("mae norm_pix formula(2x3x4x4) pred formula(2x4x12)",
          mae_loss(pred, target, removed).item())
    print("mae raw formula(2x3x4x4) pred formula(2x4x12)",
          mae_loss(pred, target, removed, norm_pix=False).item())
    h = formula(2, 5, 6)
    h = F.layer_norm(h, h.shape[-1:])
    masks = [torch.tensor([[0, 2, 4], [1, 3, 0]]), torch.tensor([[4, 4, 1], [2, 0, 3]])]
    goal = torch.cat([gather_rows(h, m) for m in masks], 0)
    print("ijepa tokens formula(2x5x6) pred 3*formula(4x3x6)",
          F.smooth_l1_loss(3 * formula(4, 3, 6, a=0.53, c=0.2), goal).item())


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
