"""The PyTorch twin of the main job (`ssl run`), and of `ssl run --objective frossl --views 8`:
the whole job, so the two can be timed side by side as users meet them.

The same work as candle-ssl's run, written as a PyTorch user would:
- data: the embedded digits (`data/assets/digits.csv.gz`, 1,797 images of 8×8, pixels / 16),
  resized to 16×16 by `F.interpolate(mode="bilinear", align_corners=False)`, a seeded 80 / 20
  split (1,437 train, 360 test);
- views: each image's own random affine (rotation ±15°, scale 0.9–1.1, shift ±2 px, bilinear,
  zero padding) and additive N(0, 0.1²) noise, made for the whole batch at once with
  `affine_grid` + `grid_sample`;
- model: the digits CNN (three 3×3 convolutions 32 / 64 / 128, strides 1 / 2 / 2, no bias,
  each followed by BatchNorm2d and ReLU; global average pool; Linear 128 → 128), projector
  Linear(128, 512)–BatchNorm1d–ReLU–Linear(512, 512), the encoder run view by view in train
  mode (batch-norm statistics per view), the loss on `[V, B, D]`;
- objective: VICReg (λ = μ = 25, ν = 1), or FroSSL (λ = 1) with `--objective frossl`: the
  losses of `train_step.py`, which `train/tests/bench_reference.rs` checks against candle-ssl's;
- the online linear probe on the detached features of the global views (standardised by the
  batch's statistics, cross-entropy, its own learning rate 0.1), as candle-ssl's;
- AdamW (lr 1e-3, betas (0.9, 0.999), weight decay 1e-4 on tensors of ≥ 2 dims), B = 128,
  drop_last (11 steps an epoch), 50 epochs, 2 of linear warm-up then a cosine to 0, stepped
  per step;
- the monitor every 5 epochs (and after the last): the clean train and test images embedded in
  eval mode, the weighted k-NN (k = 20, T = 0.07, cosine) and the online probe's accuracy;
- the end: the k-NN and a logistic-regression probe (L-BFGS, C = 1 on standardised features)
  of the trained encoder and of a random-init one.

It prints one JSON line: seconds of training (the loop with its monitor), of the end-of-run
evaluation, and in all, with the final accuracies. `tools/twins/main_job_pairs.py` runs it and
`ssl run` in alternating pairs.

    python3 tools/twins/main_job.py [--objective vicreg|frossl] [--views 2] [--epochs 50] [--threads 2]
        [--bf16]

`--bf16` runs the encoder and projector under `torch.autocast("cpu", dtype=torch.bfloat16)`
(the twin of `--set train.precision=bf16`); the loss and the probe stay f32.
"""

import argparse
import gzip
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from train_step import frossl, vicreg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def digits(size=16):
    """`[1797, 1, size, size]` in [0, 1] and the labels."""
    with gzip.open(os.path.join(ROOT, "data", "assets", "digits.csv.gz"), "rt") as f:
        rows = [[int(v) for v in line.split(",")] for line in f if line.strip()]
    t = torch.tensor(rows, dtype=torch.float32)
    x = (t[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x, t[:, 64].long()


def views_of(x, gen, rotation=15.0, scale=(0.9, 1.1), shift=2.0, noise=0.1):
    """One random affine + noise per image of `x` `[B, 1, H, W]`."""
    b, _, h, w = x.shape
    u = lambda lo, hi: lo + (hi - lo) * torch.rand(b, generator=gen)
    angle = torch.deg2rad(u(-rotation, rotation))
    s = u(*scale)
    tx, ty = u(-shift, shift), u(-shift, shift)
    cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
    # Output pixel → input pixel, in the normalised coordinates of align_corners=True.
    theta = torch.stack([
        torch.stack([cos, sin, -(cos * tx + sin * ty) * 2 / (w - 1)], 1),
        torch.stack([-sin, cos, -(-sin * tx + cos * ty) * 2 / (h - 1)], 1),
    ], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=True)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out + noise * torch.randn(out.shape, generator=gen)


class DigitsCnn(nn.Module):
    def __init__(self):
        super().__init__()
        layers, c = [], 1
        for c_out, stride in [(32, 1), (64, 2), (128, 2)]:
            layers += [nn.Conv2d(c, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
            c = c_out
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(128, 128)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def embed(encoder, x):
    encoder.eval()
    with torch.no_grad():
        f = torch.cat([encoder(c) for c in x.split(512)])
    encoder.train()
    return f


def knn_accuracy(f_train, y_train, f_test, y_test, k=20, t=0.07):
    a, b = F.normalize(f_train, dim=1), F.normalize(f_test, dim=1)
    sim, idx = (b @ a.T).topk(k, dim=1)
    votes = torch.zeros(len(b), 10).scatter_add_(1, y_train[idx], (sim / t).exp())
    return (votes.argmax(1) == y_test).float().mean().item()


def probe_accuracy(f_train, y_train, f_test, y_test, c=1.0):
    mean, std = f_train.mean(0), f_train.std(0) + 1e-8
    a, b = (f_train - mean) / std, (f_test - mean) / std
    w = torch.zeros(a.shape[1], 10, requires_grad=True)
    bias = torch.zeros(10, requires_grad=True)
    opt = torch.optim.LBFGS([w, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(a @ w + bias, y_train, reduction="sum") + 0.5 / c * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return ((b @ w + bias).argmax(1) == y_test).float().mean().item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--objective", default="vicreg", choices=["vicreg", "frossl"])
    p.add_argument("--views", type=int, default=2)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true",
                   help="encoder and projector under torch.autocast('cpu', bfloat16); loss and probe f32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    started = time.perf_counter()

    x, y = digits()
    order = torch.randperm(len(x), generator=gen)
    test, train = order[:360], order[360:]
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    encoder = DigitsCnn()
    projector = nn.Sequential(nn.Linear(128, 512), nn.BatchNorm1d(512), nn.ReLU(inplace=True),
                              nn.Linear(512, 512))
    probe = nn.Linear(128, 10)
    random_encoder = DigitsCnn()
    random_encoder.load_state_dict(encoder.state_dict())
    decay = [q for m in (encoder, projector) for q in m.parameters() if q.dim() >= 2]
    rest = [q for m in (encoder, projector) for q in m.parameters() if q.dim() < 2]
    base_lr, probe_lr = 1e-3, 0.1
    opt = torch.optim.AdamW([
        {"params": decay, "weight_decay": 1e-4, "scale": 1.0},
        {"params": rest, "weight_decay": 0.0, "scale": 1.0},
        {"params": probe.parameters(), "weight_decay": 0.0, "scale": probe_lr / base_lr},
    ], lr=base_lr, betas=(0.9, 0.999))
    loss_fn = vicreg if a.objective == "vicreg" else frossl
    b = 128
    steps_per_epoch = len(x_train) // b
    total, warmup = steps_per_epoch * a.epochs, 2 * steps_per_epoch

    def lr_at(step):
        if step < warmup:
            return base_lr * (step + 1) / warmup
        q = (step - warmup) / max(1, total - warmup)
        return 0.5 * base_lr * (1 + math.cos(math.pi * q))

    trained_from = time.perf_counter()
    step, knn, online = 0, float("nan"), float("nan")
    for epoch in range(a.epochs):
        perm = torch.randperm(len(x_train), generator=gen)
        for s in range(steps_per_epoch):
            batch = x_train[perm[s * b:(s + 1) * b]]
            labels = y_train[perm[s * b:(s + 1) * b]]
            views = [views_of(batch, gen) for _ in range(a.views)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                feats = [encoder(v) for v in views]
                z = torch.stack([projector(f) for f in feats])
            feats, z = [f.float() for f in feats], z.float()
            loss = loss_fn(z)
            f = torch.cat(feats[:a.views]).detach()
            f = (f - f.mean(0)) / torch.sqrt(f.var(0, unbiased=False) + 1e-5)
            loss = loss + F.cross_entropy(probe(f), labels.repeat(a.views))
            for g in opt.param_groups:
                g["lr"] = lr_at(step) * g["scale"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        if (epoch + 1) % 5 == 0 or epoch + 1 == a.epochs:
            f_train, f_test = embed(encoder, x_train), embed(encoder, x_test)
            knn = knn_accuracy(f_train, y_train, f_test, y_test)
            with torch.no_grad():
                mean, var = f_train.mean(0), f_train.var(0, unbiased=False)
                pred = probe((f_test - mean) / torch.sqrt(var + 1e-5)).argmax(1)
                online = (pred == y_test).float().mean().item()
    trained = time.perf_counter() - trained_from

    evaluated_from = time.perf_counter()
    rows = {}
    for name, enc in [("trained", encoder), ("random init", random_encoder)]:
        f_train, f_test = embed(enc, x_train), embed(enc, x_test)
        rows[name] = {
            "knn": knn_accuracy(f_train, y_train, f_test, y_test),
            "probe": probe_accuracy(f_train, y_train, f_test, y_test),
        }
    evaluated = time.perf_counter() - evaluated_from
    print(json.dumps({
        "framework": "pytorch", "torch": torch.__version__, "objective": a.objective,
        "views": a.views, "epochs": a.epochs, "steps": total, "threads": a.threads,
        "train_s": round(trained, 3), "eval_s": round(evaluated, 3),
        "total_s": round(time.perf_counter() - started, 3),
        "ms_per_step": round(1e3 * trained / total, 2), "monitor_knn": knn,
        "online_probe": online, "rows": rows,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }))


if __name__ == "__main__":
    main()
