"""Known answers for ssl-lejepa, computed by running the official LeJEPA code.

Setup: Python 3 with git on the PATH and `pip install torch numpy scipy` (the official package
imports NumPy and SciPy). Run `python make_golden.py` in any directory. The script rewrites
`golden.json` next to itself, and the crate's tests read that file; the tests need no Python.

The official code is not part of this repository, and nothing of it is copied here. At run time
the script clones https://github.com/rbalestr-lab/lejepa into a temporary directory, checks out
commit eddffdd857a19726342ef6526e01021fb3c32cae (and refuses any other), imports the package
from there and calls `lejepa.univariate.EppsPulley` and `lejepa.multivariate.SlicingUnivariateTest`.
Where GitHub cannot be reached, set `LEJEPA_REPO` to a local clone or mirror of that repository;
the script still checks out and verifies the pinned commit. The official repository is
(c) Randall Balestriero and Yann LeCun and its LICENSE file is CC BY-NC 4.0
(https://creativecommons.org/licenses/by-nc/4.0/). The paper is R. Balestriero and Y. LeCun,
"LeJEPA: Provable and Scalable Self-Supervised Learning Without the Heuristics",
arXiv:2511.08544 (2025).

Three changes make the official code return exact, reproducible float64 values. Each one is made
from outside the package, and none edits its code:
  * float64 buffers: `EppsPulley` builds its knots and weights with `dtype=torch.float32`. While
    an instance is being built, `torch.linspace` and `torch.full` are wrapped so that they return
    float64 when asked for float32. Converting the instance with `.double()` afterwards would
    leave the window e^{-t^2/2} rounded to float32, which is 2e-8 off.
  * fixed directions: `SlicingUnivariateTest.forward` draws its directions with one
    `torch.randn` call. During each forward that call is replaced by one that returns the
    given directions, and the package then normalises them to unit columns itself.
  * one process: the package reduces across processes only when `torch.distributed` is
    initialised, and uses world size 1 otherwise. The script asserts that it is not
    initialised, so nothing needs patching.

The loss around SIGReg (the prediction term and the weighting by lambda) is not package code.
It is written below in our own words from the paper's Algorithm 2, and from the minimal example's
description in the repository's MINIMAL.md. The minimal example's SIGReg class exists only as
text in MINIMAL.md, so it is not run. That case uses the package classes, which compute the
same statistic: the trapezoid rule on [0, 3] with 17 knots, weights doubled for -t, the window
e^{-t^2/2} and the scale N, averaged over the slices and the views. The paper's Algorithm 1
(trapezoid on [-5, 5] with 17 knots) comes from the package's `EppsPulley(t_max=5, n_points=9)`.
The knots on [0, 5] with doubled weights are the same sum. The script checks this against our
own direct trapezoid on [-5, 5] to 1e-12.
"""

import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

import torch

LEJEPA_URL = "https://github.com/rbalestr-lab/lejepa"
LEJEPA_COMMIT = "eddffdd857a19726342ef6526e01021fb3c32cae"

torch.set_default_dtype(torch.float64)


def import_official_package(workdir):
    """Clones the official repository at the pinned commit under `workdir` and imports it."""
    source = os.environ.get("LEJEPA_REPO", LEJEPA_URL)
    checkout = os.path.join(workdir, "lejepa")
    git = lambda *args: subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        git("clone", "--quiet", "--no-checkout", source, checkout)
        git("-C", checkout, "checkout", "--quiet", "--detach", LEJEPA_COMMIT)
    except subprocess.CalledProcessError as error:
        sys.exit(
            f"error: cannot check out {LEJEPA_COMMIT} from {source}: {error.stderr.strip()}\n"
            "help: without access to GitHub, set LEJEPA_REPO to a local clone of "
            f"{LEJEPA_URL} that contains that commit"
        )
    head = git("-C", checkout, "rev-parse", "HEAD")
    if head != LEJEPA_COMMIT:
        sys.exit(f"error: {source} checked out {head}, not the pinned {LEJEPA_COMMIT}")
    # The repository commits compiled bytecode; run the pinned sources instead.
    for cache in glob.glob(os.path.join(checkout, "**", "__pycache__"), recursive=True):
        shutil.rmtree(cache)
    sys.path.insert(0, checkout)
    import lejepa

    if os.path.dirname(os.path.abspath(lejepa.__file__)) != os.path.join(checkout, "lejepa"):
        sys.exit(f"error: imported lejepa from {lejepa.__file__}, not from the pinned checkout")
    return lejepa


@contextlib.contextmanager
def float32_factories_make_float64():
    def promoted(factory):
        def make(*args, **kwargs):
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
            return factory(*args, **kwargs)

        return make

    with mock.patch.object(torch, "linspace", promoted(torch.linspace)):
        with mock.patch.object(torch, "full", promoted(torch.full)):
            yield


def epps_pulley(lejepa, t_max, knots):
    """The package's EppsPulley with its buffers built in float64."""
    with float32_factories_make_float64():
        test = lejepa.univariate.EppsPulley(t_max=t_max, n_points=knots)
    assert all(buffer.dtype == torch.float64 for buffer in test.buffers())
    return test


def sliced(lejepa, univariate_test, directions):
    """The package's SlicingUnivariateTest (mean over slices) on `directions` [D, M].

    It returns a function of x [*, N, D]. In each call, the package's one draw of directions
    returns a copy of `directions`, which the package then normalises in place.
    """
    test = lejepa.multivariate.SlicingUnivariateTest(
        univariate_test, num_slices=directions.size(1), reduction="mean"
    )

    def statistic(x):
        draws = []

        def draw(shape, **kwargs):
            assert tuple(shape) == tuple(directions.shape), (shape, directions.shape)
            draws.append(shape)
            return directions.clone()

        assert not torch.distributed.is_initialized()
        with mock.patch.object(torch, "randn", draw):
            value = test(x)
        assert len(draws) == 1, "the package's direction draw was not replaced"
        return value

    return statistic


def algorithm2(z, global_views, lamb, sigreg):
    """(loss, prediction, sigreg) of the paper's Algorithm 2 for z [V, B, D].

    Every view is compared with its instance's centre over the first `global_views` views, and
    SIGReg is averaged over the views.
    """
    centres = z[:global_views].mean(dim=0)
    prediction = (z - centres).square().mean()
    regulariser = torch.stack([sigreg(view) for view in z]).mean()
    return (1 - lamb) * prediction + lamb * regulariser, prediction, regulariser


def minimal_example(z, lamb, sigreg):
    """(loss, prediction, sigreg) of MINIMAL.md's objective for z [V, B, D] (all views global).

    `sigreg` takes the whole [V, B, D] tensor.
    """
    invariance = (z - z.mean(dim=0)).square().mean()
    regulariser = sigreg(z)
    return lamb * regulariser + (1 - lamb) * invariance, invariance, regulariser


def direct_trapezoid_sigreg(x, directions, t_max=5.0, knots=17):
    """A cross-check: N ∫ |ψ(t) − e^{−t²/2}|² e^{−t²/2} dt over [−t_max, t_max] by the trapezoid
    rule, where ψ is the empirical characteristic function of x [N, D] @ directions. The result
    is averaged over the directions. This is the paper's Algorithm 1 and our own code.
    """
    t = torch.linspace(-t_max, t_max, knots)
    angles = (x @ directions).unsqueeze(-1) * t
    window = torch.exp(-0.5 * t.square())
    gap = (angles.cos().mean(0) - window).square() + angles.sin().mean(0).square()
    return (torch.trapezoid(gap * window, t, dim=-1) * x.size(0)).mean()


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


def assert_close(actual, expected, tolerance, where):
    if isinstance(expected, list):
        for a, e in zip(actual, expected, strict=True):
            assert_close(a, e, tolerance, where)
    elif isinstance(expected, float):
        assert abs(actual - expected) <= tolerance * max(1.0, abs(expected)), where


def known_answers(lejepa):
    generator = torch.Generator().manual_seed(2511_08544)
    V, V_g, B, D, M, lamb = 4, 2, 6, 5, 7, 0.05
    # Embeddings away from N(0, I) (scaled, shifted, one dimension squeezed) so that SIGReg is
    # clearly non-zero, and a gradient in every entry.
    z = torch.randn(V, B, D, generator=generator) * 1.3 + 0.2
    z[..., 0] *= 0.1
    # The draws the package turns into unit directions.
    draws = torch.randn(D, M, generator=generator)
    A = draws / draws.norm(p=2, dim=0)

    sigreg_3_17 = sliced(lejepa, epps_pulley(lejepa, 3.0, 17), draws)
    sigreg_5_9 = sliced(lejepa, epps_pulley(lejepa, 5.0, 9), draws)
    algorithm1 = with_gradients(lambda zz: algorithm2(zz, V_g, lamb, sigreg_5_9), z)
    cross_check = with_gradients(
        lambda zz: algorithm2(zz, V_g, lamb, lambda view: direct_trapezoid_sigreg(view, A)), z
    )
    assert_close(algorithm1, cross_check, 1e-12, "Algorithm 1 against [0, 5] with 9 knots")
    cases = [
        {
            "name": "minimal_md",
            "source": "MINIMAL.md's objective (invariance to the mean of all views, both views "
            "global); its SIGReg by the package's EppsPulley(t_max=3, n_points=17) sliced by "
            "SlicingUnivariateTest on the whole [V, B, D] tensor",
            "views": 2,
            "global_views": 2,
            "t_max": 3.0,
            "knots": 17,
            **with_gradients(lambda zz: minimal_example(zz, lamb, sigreg_3_17), z[:2].clone()),
        },
        {
            "name": "algorithm2_package",
            "source": "paper Algorithm 2 (centres from the global views, SIGReg per view) with "
            "the package's EppsPulley(t_max=3, n_points=17) sliced by SlicingUnivariateTest",
            "views": V,
            "global_views": V_g,
            "t_max": 3.0,
            "knots": 17,
            **with_gradients(lambda zz: algorithm2(zz, V_g, lamb, sigreg_3_17), z),
        },
        {
            "name": "algorithm1_paper",
            "source": "paper Algorithm 2 with the paper's Algorithm 1 SIGReg (trapezoid on "
            "[-5, 5] with 17 knots), by the package's EppsPulley(t_max=5, n_points=9) sliced "
            "by SlicingUnivariateTest (the same sum; checked against a direct trapezoid)",
            "views": V,
            "global_views": V_g,
            "t_max": 5.0,
            "knots": 9,
            **algorithm1,
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
    sigreg_spec = sliced(lejepa, epps_pulley(lejepa, 3.0, 17), A_spec)
    cases.append(
        {
            "name": "spec_kat",
            "source": "paper Algorithm 2 with the package's EppsPulley(t_max=3, n_points=17) "
            "sliced by SlicingUnivariateTest on the spec's inputs",
            "embeddings": z_spec.tolist(),
            "directions": A_spec.tolist(),
            "views": 3,
            "global_views": 2,
            "t_max": 3.0,
            "knots": 17,
            **with_gradients(lambda zz: algorithm2(zz, 2, lamb, sigreg_spec), z_spec),
        }
    )
    return {
        "generator": "objectives/lejepa/golden/make_golden.py",
        "official_code": f"{LEJEPA_URL} at {LEJEPA_COMMIT}",
        "torch": torch.__version__,
        "lambda": lamb,
        "embeddings": z.tolist(),
        "directions": A.tolist(),
        "cases": cases,
    }


def main():
    with tempfile.TemporaryDirectory() as workdir:
        golden = known_answers(import_official_package(workdir))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
    # One line per value: small enough to read and to review in a diff.
    compact = lambda value: json.dumps(value, separators=(",", ":"))
    top = [f" {json.dumps(k)}: {compact(v)}" for k, v in golden.items() if k != "cases"]
    rows = [f"  {compact(case)}" for case in golden["cases"]]
    text = "{\n" + ",\n".join(top) + ',\n "cases": [\n' + ",\n".join(rows) + "\n ]\n}\n"
    assert json.loads(text) == golden
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    for case in golden["cases"]:
        print(
            f"{case['name']}: loss {case['loss']!r}, prediction {case['prediction']!r}, "
            f"sigreg {case['sigreg']!r}"
        )


if __name__ == "__main__":
    main()
