"""Evaluation metrics of frozen features, on NumPy arrays.

The same Rust code (`ssl-eval`) that fills a run's result table and `ssl eval` computes these:
the definitions, defaults and tie rules are those of `docs/spec/metrics.md`. Features are
`[N, D]` matrices, one sample per row (any real dtype; converted to C-contiguous float32),
labels `[N]` class numbers `0, 1, …` (any integer dtype; converted to int64). Computations run
in float64 (the k-NN similarity product in float32), with the GIL released.

A bad argument (wrong shape, a label that is not a class number, a non-finite feature, a
metric that is undefined on the input) raises `ValueError` with the reason.
"""

from collections.abc import Sequence

import numpy.typing as npt

__all__ = [
    "alignment_uniformity",
    "cka",
    "effective_rank",
    "kmeans_scores",
    "knn",
    "lidar",
    "linear_probe",
    "medmnist_metrics",
    "rankme",
]

def linear_probe(
    train_x: npt.ArrayLike,
    train_y: npt.ArrayLike,
    test_x: npt.ArrayLike,
    test_y: npt.ArrayLike,
    *,
    c: float | None = None,
) -> dict[str, float]:
    """Offline linear probe (spec §1): L2-regularised logistic regression on standardised
    features, scored by balanced accuracy on the test set.

    Both sets are standardised with the training features' mean and population std (a constant
    dimension keeps scale 1). With K ≥ 3 classes the model is multinomial,
    `J = (1/n) Σ CE + ‖W‖²_F / (2Cn)`; with K = 2 it is the binary sigmoid model (the larger
    label is the positive class); the intercept is not penalised. Solved by L-BFGS in float64
    (at most 1000 iterations, stopped at a max-abs gradient ≤ 1e-4).

    `c`: the inverse regularisation strength. `None` (the default, as in `ssl eval`) chooses it
    from {1e-3, 1e-2, 1e-1, 1, 10, 100} by balanced accuracy on a stratified 20 % validation
    split of the training features (ties go to the smaller C), then refits on all of them;
    `c=1.0` is the spec's fixed-C protocol.

    Returns `{"balanced_accuracy": …, "accuracy": …, "c": …}`: the mean per-class recall over
    the classes present in `test_y`, plain top-1 accuracy, both in [0, 1], and the C used.
    """

def knn(
    train_x: npt.ArrayLike,
    train_y: npt.ArrayLike,
    test_x: npt.ArrayLike,
    test_y: npt.ArrayLike,
    *,
    k: int = 20,
    temperature: float = 0.07,
) -> float:
    """Top-1 accuracy of the weighted k-NN classifier (spec §3, DINO / CARP protocol).

    Rows of both sets are L2-normalised; each test sample takes its `k` most cosine-similar
    training samples (ties: the lower index first; all of them when there are fewer than `k`),
    each voting for its label with weight `exp(s / temperature)`. The prediction is the class of
    highest total weight (lowest class number on ties). Returns the accuracy in [0, 1].
    """

def rankme(z: npt.ArrayLike, *, eps: float = 1e-7) -> float:
    """RankMe (spec §4): `exp(−Σ_k p_k log p_k)` with `p_k = σ_k / Σ_l σ_l + eps` over the
    `min(N, D)` singular values of `z` as given (not centred).

    From about 1 (collapse to one direction) to `min(N, D)`; it depends on N, so compare values
    at equal N. Invariant to scaling `z` and to orthogonal maps. Standardise the columns first
    to match a run's table, which reports RankMe of the standardised test features.
    """

def lidar(
    views: npt.ArrayLike | Sequence[npt.ArrayLike],
    *,
    delta: float = 1e-4,
    eps: float = 1e-8,
) -> float:
    """LiDAR, the linear-discriminant rank (spec §6, Thilak et al.).

    `views`: a `[V, N, D]` array, or a list of `V` `[N, D]` matrices; row `x` of view `i` is the
    `i`-th augmented view of sample `x` (V ≥ 2 views of N ≥ 2 samples). Each sample is a
    surrogate class: with its view mean `μ_x` and the grand mean `μ`, the between-class scatter
    `Σ_b = (1/(N−1)) Σ_x (μ_x − μ)(μ_x − μ)ᵀ` and the within-class scatter
    `Σ_w = (1/(N(V−1))) Σ_x Σ_i (e_xi − μ_x)(e_xi − μ_x)ᵀ + delta·I`, LiDAR is the entropy-based
    effective rank `exp(−Σ p_k log p_k)`, `p_k = (λ_k + eps) / Σ_l (λ_l + eps)`, of the eigenvalues
    of `Σ_w^{−1/2} Σ_b Σ_w^{−1/2}` (negative round-off clipped to 0). Range [1, min(D, N−1)].
    """

def effective_rank(z: npt.ArrayLike) -> float:
    """Effective rank (spec §5, Roy & Vetterli): `exp(−Σ_k p_k log p_k)` with
    `p_k = σ_k / Σ_l σ_l` over the non-zero singular values of `z` centred over the samples
    (no eps). In [1, min(N − 1, D)].
    """

def alignment_uniformity(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    alpha: float = 2.0,
    t: float = 2.0,
) -> tuple[float, float]:
    """Alignment and uniformity (spec §7, Wang & Isola) of two views' features of the same N
    samples (row `i` of `a` and row `i` of `b` are a positive pair).

    Rows are L2-normalised first (`z / max(‖z‖, 1e-12)`). Alignment is
    `mean_i ‖ã_i − b̃_i‖^alpha` (0 when the views agree; lower is better); uniformity is
    `log mean_{i<j} exp(−t ‖ã_i − ã_j‖²)` over the N(N−1)/2 pairs of different rows of `a`
    (0 under collapse, about −4 for well-spread features, never below −4t; lower is more
    uniform). Returns `(alignment, uniformity)`.
    """

def cka(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Linear CKA (spec §8) between two representations `x` `[N, P1]` and `y` `[N, P2]` of the
    same N ≥ 2 items: `‖Y_cᵀ X_c‖²_F / (‖X_cᵀ X_c‖_F ‖Y_cᵀ Y_c‖_F)` with column-centred
    `X_c`, `Y_c` (the Gram form when N < max(P1, P2)).

    In [0, 1]; `cka(x, x) = 1`; invariant to orthogonal maps, isotropic scaling and translation
    of either argument. Raises `ValueError` when either is constant over the samples.
    """

def kmeans_scores(
    z: npt.ArrayLike,
    labels: npt.ArrayLike,
    *,
    k: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Clustering quality of `z` against `labels` (spec §9, CARP protocol): spherical k-means
    with `k` clusters (default: the number of distinct labels), k-means++ seeding, 10 restarts
    from ChaCha8 `seed` (the best objective kept), at most 100 iterations each, on `z`
    standardised per dimension (mean 0, population std 1); each sample goes to the centroid of
    largest inner product.

    Returns a dict with `"nmi"` (normalised mutual information, arithmetic mean of the
    entropies), `"ami"` (adjusted for chance under the hypergeometric model) and `"ari"`
    (adjusted Rand index), as scikit-learn defines them; 1 for a clustering equal to the labels
    up to renaming, about 0 for chance.
    """

def medmnist_metrics(
    task: str,
    labels: npt.ArrayLike,
    scores: npt.ArrayLike,
) -> dict[str, float]:
    """The official MedMNIST ACC and AUC (MedMNIST v2 `evaluator.py`, `getACC` / `getAUC`).

    `task`: `"multi-class"`, `"binary-class"`, `"multi-label, binary-class"` or
    `"ordinal-regression"`, as in MedMNIST's `INFO` table. `scores`: `[N, K]` probabilities
    (softmax for the single-label tasks, sigmoid for multi-label; a 1-D `[N]` array is one
    column). `labels`: `[N]` (or MedMNIST's `[N, 1]`) class numbers, or the `[N, K]` 0/1 matrix
    for multi-label.

    * multi-class and ordinal-regression: ACC of the arg-max (ties: the lowest index), AUC
      one-vs-rest averaged over all K classes;
    * binary-class: ACC of `p > 0.5` and AUC of `p`, `p` the last score column (`[N, 2]`
      softmax or `[N, 1]` P(1));
    * multi-label: ACC of `p_l > 0.5` and AUC of `p_l` per label, each averaged over the labels.

    AUC is scikit-learn's `roc_auc_score` (every class or label column needs both outcomes).
    Returns `{"acc": …, "auc": …}`.
    """
