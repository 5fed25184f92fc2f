"""The convolutions of models/benches/conv_layers.rs in PyTorch (NCHW, oneDNN on the CPU).

python3 tools/twins/conv_layers.py [--net cifar|3d|digits] [--threads 2] [--reps 5]
"""
import argparse
import time

import torch

CIFAR = [
    (3, 64, 32, 3, 1, 1, 1),
    (64, 64, 32, 3, 1, 1, 4),
    (64, 128, 32, 3, 2, 1, 1),
    (128, 128, 16, 3, 1, 1, 3),
    (64, 128, 32, 1, 2, 0, 1),
    (128, 256, 16, 3, 2, 1, 1),
    (256, 256, 8, 3, 1, 1, 3),
    (128, 256, 16, 1, 2, 0, 1),
    (256, 512, 8, 3, 2, 1, 1),
    (512, 512, 4, 3, 1, 1, 3),
    (256, 512, 8, 1, 2, 0, 1),
]
RESNET_3D = [
    (1, 64, 64, 7, 2, 3, 1),
    (64, 64, 16, 3, 1, 1, 4),
    (64, 128, 16, 3, 2, 1, 1),
    (128, 128, 8, 3, 1, 1, 3),
    (64, 128, 16, 1, 2, 0, 1),
    (128, 256, 8, 3, 2, 1, 1),
    (256, 256, 4, 3, 1, 1, 3),
    (128, 256, 8, 1, 2, 0, 1),
    (256, 512, 4, 3, 2, 1, 1),
    (512, 512, 2, 3, 1, 1, 3),
    (256, 512, 4, 1, 2, 0, 1),
]
DIGITS = [
    (1, 32, 16, 3, 1, 1, 1),
    (32, 64, 16, 3, 2, 1, 1),
    (64, 128, 8, 3, 2, 1, 1),
]
# (layers, spatial rank, batch of one view): the trainer forwards view by view.
NETS = {"cifar": (CIFAR, 2, 64), "3d": (RESNET_3D, 3, 4), "digits": (DIGITS, 2, 128)}
VIEWS = 2


def median_ms(reps, f):
    f()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        f()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[reps // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--net", choices=sorted(NETS), default="cifar")
    args = parser.parse_args()
    layers, rank, batch = NETS[args.net]
    conv = torch.nn.Conv2d if rank == 2 else torch.nn.Conv3d
    torch.set_num_threads(args.threads)
    print("layer                         count  fwd ms  fwd+bwd ms")
    total_fwd = total_both = 0.0
    for c, o, side, k, s, p, count in layers:
        layer = conv(c, o, k, s, p, bias=False)
        # Every layer but the stem back-propagates into its input.
        x = torch.randn(batch, c, *[side] * rank, requires_grad=c > 3)
        side_out = (side + 2 * p - k) // s + 1
        dy = torch.randn(batch, o, *[side_out] * rank)

        def forward():
            with torch.no_grad():
                layer(x)

        def both():
            (layer(x) * dy).sum().backward()

        fwd = median_ms(args.reps, forward)
        bwd = median_ms(args.reps, both)
        total_fwd += fwd * count * VIEWS
        total_both += bwd * count * VIEWS
        name = f"{c}->{o} {side}^{rank} k{k} s{s}"
        print(f"{name:<30}{count:>5}{fwd:>8.1f}{bwd:>12.1f}")
    print(f"{'whole net (× count × 2 views)':<35}{total_fwd:>8.1f}{total_both:>12.1f}")


if __name__ == "__main__":
    main()
