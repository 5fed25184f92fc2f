"""Known answers for ssl-lejepa, computed by the official LeJEPA formulas.

Run: `python make_golden.py` (needs PyTorch; any recent CPU build) in this directory. It rewrites
`golden.json`, which the crate's tests read; the tests themselves need no Python.

This script is a reference generator, not part of the crate: it implements nothing of its own.
The functions below are the official lines, pasted with attribution, changed only where marked
`# CHANGED:` (fixed directions instead of a random draw, float64 buffers instead of float32 so
that the reference is exact to double precision, no distributed all-reduce on one process).

Sources (pasted lines are theirs, not ours):
  * https://github.com/rbalestr-lab/lejepa (commit eddffdd857a19726342ef6526e01021fb3c32cae),
    licensed CC BY-NC 4.0 (https://creativecommons.org/licenses/by-nc/4.0/), (c) Randall
    Balestriero and Yann LeCun: MINIMAL.md (class SIGReg, the invariance and total loss lines),
    lejepa/univariate/epps_pulley.py (class EppsPulley), lejepa/multivariate/slicing.py
    (SlicingUnivariateTest.forward).
  * R. Balestriero and Y. LeCun, "LeJEPA: Provable and Scalable Self-Supervised Learning Without
    the Heuristics", arXiv:2511.08544 (2025), Algorithm 1 (SIGReg) and Algorithm 2 (LeJEPA).
"""

import json
import os

import torch

torch.set_default_dtype(torch.float64)


# --- MINIMAL.md ---------------------------------------------------------------------------------
class MinimalSIGReg(torch.nn.Module):
    def __init__(self, knots=17):
        super().__init__()
        t = torch.linspace(0, 3, knots, dtype=torch.float64)  # CHANGED: float32 -> float64
        dt = 3 / (knots - 1)
        weights = torch.full((knots,), 2 * dt, dtype=torch.float64)  # CHANGED: float64
        weights[[0, -1]] = dt
        window = torch.exp(-t.square() / 2.0)
        self.register_buffer("t", t)
        self.register_buffer("phi", window)
        self.register_buffer("weights", weights * window)

    def forward(self, proj, A):  # CHANGED: the directions A are an argument, not a fresh draw
        x_t = (proj @ A).unsqueeze(-1) * self.t
        err = (x_t.cos().mean(-3) - self.phi).square() + x_t.sin().mean(-3).square()
        statistic = (err @ self.weights) * proj.size(-2)
        return statistic.mean()


def minimal_lejepa(proj, A, lamb):
    sigreg = MinimalSIGReg()
    inv_loss = (proj.mean(0) - proj).square().mean()
    sigreg_loss = sigreg(proj, A)
    lejepa_loss = sigreg_loss * lamb + inv_loss * (1 - lamb)
    return lejepa_loss, inv_loss, sigreg_loss


# --- lejepa/univariate/epps_pulley.py -----------------------------------------------------------
class EppsPulley(torch.nn.Module):
    def __init__(self, t_max: float = 3, n_points: int = 17):
        super().__init__()
        assert n_points % 2 == 1
        self.n_points = n_points
        t = torch.linspace(0, t_max, n_points, dtype=torch.float64)  # CHANGED: float64
        self.register_buffer("t", t)
        dt = t_max / (n_points - 1)
        weights = torch.full((n_points,), 2 * dt, dtype=torch.float64)  # CHANGED: float64
        weights[[0, -1]] = dt  # Half-weight at t=0
        self.register_buffer("phi", self.t.square().mul_(0.5).neg_().exp_())
        self.register_buffer("weights", weights * self.phi)

    def forward(self, x):
        N = x.size(-2)
        x_t = x.unsqueeze(-1) * self.t  # (*, N, K, n_points)
        cos_vals = torch.cos(x_t)
        sin_vals = torch.sin(x_t)
        cos_mean = cos_vals.mean(-3)  # (*, n_points)
        sin_mean = sin_vals.mean(-3)  # (*, n_points)
        # CHANGED: the DDP all_reduce of cos_mean and sin_mean is the identity on one process
        err = (cos_mean - self.phi).square() + sin_mean.square()
        return (err @ self.weights) * N  # CHANGED: world_size = 1


# --- lejepa/multivariate/slicing.py (SlicingUnivariateTest.forward, reduction "mean") ---------
def sliced_test(univariate_test, x, A):  # CHANGED: the seeded draw of A is an argument
    stats = univariate_test(x @ A)
    return stats.mean()


# --- arXiv:2511.08544, Algorithm 1 --------------------------------------------------------------
def paper_sigreg(x, A):  # CHANGED: A is an argument (the paper draws it seeded by global_step)
    dev = dict(device=x.device)
    t = torch.linspace(-5, 5, 17, **dev)
    exp_f = torch.exp(-0.5 * t**2)
    x_t = (x @ A).unsqueeze(2) * t  # (N, M, T)
    ecf = (1j * x_t).exp().mean(0)
    # CHANGED: all_reduce(ecf, op="AVG") is the identity on one process
    err = (ecf - exp_f).abs().square().mul(exp_f)
    N = x.size(0)  # CHANGED: world_size = 1
    T = torch.trapz(err, t, dim=1) * N
    return T


# --- arXiv:2511.08544, Algorithm 2 (SIGReg per view, averaged) ----------------------------------
def paper_lejepa(g_emb, a_emb, bs, K, lambd, SIGReg):
    centers = g_emb.view(-1, bs, K).mean(0)
    a_emb = a_emb.view(-1, bs, K)
    sim = (centers - a_emb).square().mean()
    sigreg = torch.stack([SIGReg(emb) for emb in a_emb]).mean()
    return (1 - lambd) * sim + lambd * sigreg, sim, sigreg


# --- the known answers --------------------------------------------------------------------------
def with_gradients(fn, z):
    """(loss, prediction, sigreg) of fn at z, each with its gradient w.r.t. z."""
    out = {}
    for index, name in enumerate(["loss", "prediction", "sigreg"]):
        leaf = z.clone().requires_grad_(True)
        value = fn(leaf)[index]
        (grad,) = torch.autograd.grad(value, leaf)
        out[name] = value.item()
        out[f"grad_{name}"] = grad.tolist()
    return out


def main():
    generator = torch.Generator().manual_seed(2511_08544)
    V, V_g, B, D, M, lamb = 4, 2, 6, 5, 7, 0.05
    # Embeddings away from N(0, I) (scaled, shifted, one dimension squeezed) so that SIGReg is
    # clearly non-zero, and a gradient in every entry.
    z = torch.randn(V, B, D, generator=generator) * 1.3 + 0.2
    z[..., 0] *= 0.1
    A = torch.randn(D, M, generator=generator)
    A /= A.norm(p=2, dim=0)

    def algorithm2(sigreg):
        def fn(zz):
            a_emb = zz.reshape(V * B, D)  # torch.cat(all_views): view-major rows
            g_emb = zz[:V_g].reshape(V_g * B, D)  # torch.cat(global_views)
            return paper_lejepa(g_emb, a_emb, B, D, lamb, sigreg)

        return fn

    package = EppsPulley(t_max=3, n_points=17)
    cases = [
        {
            "name": "minimal_md",
            "source": "MINIMAL.md: SIGReg on [0, 3] with 17 knots; invariance to the mean of all "
            "views (both views global)",
            "views": 2,
            "global_views": 2,
            "t_max": 3.0,
            "knots": 17,
            **with_gradients(lambda zz: minimal_lejepa(zz, A, lamb), z[:2].clone()),
        },
        {
            "name": "algorithm2_package",
            "source": "paper Algorithm 2 (centres from the global views, SIGReg per view) with "
            "the package's EppsPulley(t_max=3, n_points=17) sliced by SlicingUnivariateTest",
            "views": V,
            "global_views": V_g,
            "t_max": 3.0,
            "knots": 17,
            **with_gradients(algorithm2(lambda emb: sliced_test(package, emb, A)), z),
        },
        {
            "name": "algorithm1_paper",
            "source": "paper Algorithm 2 with the paper's Algorithm 1 SIGReg (trapezoid on "
            "[-5, 5] with 17 knots = [0, 5] with 9 knots, doubled)",
            "views": V,
            "global_views": V_g,
            "t_max": 5.0,
            "knots": 9,
            **with_gradients(algorithm2(lambda emb: paper_sigreg(emb, A)), z),
        },
    ]
    # The spec's small known answer (docs/spec/objectives.md §2.26): 2 global views and 1 local
    # view of 3 instances in 2 dimensions, two directions.
    z_spec = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]],
            [[0.5, 0.5], [0.0, 2.0], [-1.0, 0.0]],
            [[2.0, 0.0], [1.0, 1.0], [0.0, -1.0]],
        ]
    )
    A_spec = torch.tensor([[1.0, 0.6], [0.0, 0.8]])

    def spec_kat(zz):
        a_emb, g_emb = zz.reshape(9, 2), zz[:2].reshape(6, 2)
        return paper_lejepa(g_emb, a_emb, 3, 2, lamb, lambda emb: sliced_test(package, emb, A_spec))

    cases.append(
        {
            "name": "spec_kat",
            "source": "paper Algorithm 2 with the package's EppsPulley(t_max=3, n_points=17) on "
            "the spec's inputs",
            "embeddings": z_spec.tolist(),
            "directions": A_spec.tolist(),
            "views": 3,
            "global_views": 2,
            "t_max": 3.0,
            "knots": 17,
            **with_gradients(spec_kat, z_spec),
        }
    )
    golden = {
        "generator": "objectives/lejepa/golden/make_golden.py",
        "torch": torch.__version__,
        "lambda": lamb,
        "embeddings": z.tolist(),
        "directions": A.tolist(),
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    # One line per value: small enough to read and to review in a diff.
    compact = lambda value: json.dumps(value, separators=(",", ":"))
    top = [f" {json.dumps(k)}: {compact(v)}" for k, v in golden.items() if k != "cases"]
    rows = [f"  {compact(case)}" for case in cases]
    text = "{\n" + ",\n".join(top) + ',\n "cases": [\n' + ",\n".join(rows) + "\n ]\n}\n"
    assert json.loads(text) == golden
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    for case in cases:
        print(
            f"{case['name']}: loss {case['loss']!r}, prediction {case['prediction']!r}, "
            f"sigreg {case['sigreg']!r}"
        )


if __name__ == "__main__":
    main()
