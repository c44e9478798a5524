"""The geometric median, by the smoothed Weiszfeld algorithm (RFA, Pillutla et al., 2022).

The geometric median of weighted points minimises ``g(z) = Σ_i w_i ‖x_i - z‖``. Weiszfeld's
fixed-point iteration re-weights the points by the inverse of their distance to the
current estimate:

    β_i = w_i / max(ν, ‖x_i - z_t‖),        z_{t+1} = Σ_i β_i x_i / Σ_i β_i.

The smoothing ``ν > 0`` keeps the weights finite when ``z_t`` lands on a data point (it
minimises a smoothed objective that differs from ``g`` only within ``ν`` of a point). The
iteration starts at the weighted mean of the finite rows and stops when the objective no
longer improves by more than ``tol`` relatively: ``|g(z_{t-1}) - g(z_t)| <= tol · g(z_t)``
(RFA's criterion), or after ``max_iter`` updates.

Each update costs two passes over ``X`` in cache-sized column blocks (distances, then the
weighted sum); nothing of size ``[n, d]`` is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sharefl.robust._rows import row_sq_distances, weighted_sum
from sharefl.robust.base import (
    Aggregator,
    check_matrix,
    check_nonnegative_int,
    check_positive,
    check_weights,
    compute_dtype,
)


@dataclass(frozen=True)
class WeiszfeldResult:
    """The outcome of :func:`weiszfeld`.

    Attributes:
        median: the estimate, shape ``[d]``, in the input's dtype.
        iterations: Weiszfeld updates performed (each one pass for the distances and one
            for the weighted sum).
        converged: whether the relative objective change fell to ``tol``.
        objective: ``Σ_i w_i ‖x_i - median‖`` over the finite rows (float).
    """

    median: Tensor
    iterations: int
    converged: bool
    objective: float


@torch.no_grad()
def weiszfeld(
    X: Tensor,
    weights: Tensor | None = None,
    *,
    nu: float = 1e-6,
    tol: float = 1e-6,
    max_iter: int = 100,
) -> WeiszfeldResult:
    """Smoothed Weiszfeld iteration for the geometric median of the rows of ``X``.

    Rows that are non-finite (±inf, NaN, or an overflowing squared distance) get weight 0,
    i.e. the result is the geometric median of the finite rows; if no row is finite the
    median is all NaN.

    When the minimiser is one of the rows the iteration approaches it only sublinearly; so
    at the end the row nearest the iterate is tested with Vardi and Zhang's condition (the
    others' weighted unit vectors towards it sum to at most its own weight) and, when it
    holds, that row is returned as the exact median (``converged``).
    """
    X = check_matrix(X)
    n, d = X.shape
    nu = check_positive(nu, "nu")
    tol = check_positive(tol, "tol", allow_zero=True)
    check_nonnegative_int(max_iter, "max_iter")
    w = (
        torch.ones(n, dtype=torch.float64, device=X.device)
        if weights is None
        else check_weights(weights, n, X)
    )
    # Start at the weighted mean of the rows with a finite squared norm (no ±inf or NaN
    # entry, no overflow); zero weights keep the other rows out of every sum.
    finite = torch.isfinite(row_sq_distances(X))
    start = torch.where(finite, w, 0.0)
    if not float(start.sum()) > 0:
        return WeiszfeldResult(X.new_full((d,), float("nan")), 0, False, float("nan"))
    z = weighted_sum(X, start / start.sum())
    previous = float("inf")
    iterations = 0
    while True:
        dist = row_sq_distances(X, z).sqrt()
        usable = torch.isfinite(dist) & (w > 0)
        objective = float((w * dist)[usable].sum())
        converged = abs(previous - objective) <= tol * objective
        if converged or iterations == max_iter or not bool(usable.any()):
            break
        beta = torch.where(usable, w / dist.clamp_min(nu), 0.0)
        z = weighted_sum(X, beta / beta.sum())
        previous = objective
        iterations += 1
    if not converged and bool(usable.any()):
        vertex = _optimal_row(X, w, usable, int(torch.argmin(torch.where(usable, dist, math.inf))))
        if vertex is not None:
            z, objective = vertex
            converged = True
    return WeiszfeldResult(z.to(X.dtype), iterations, converged, objective)


def _optimal_row(X: Tensor, w: Tensor, usable: Tensor, k: int) -> tuple[Tensor, float] | None:
    """``(x_k, objective at x_k)`` when row k minimises Σ_i w_i ‖x_i − z‖, else ``None``:
    0 is in the subdifferential at x_k iff ‖Σ_{i≠k} w_i (x_i − x_k)/‖x_i − x_k‖‖ ≤ w_k
    (rows equal to x_k count towards w_k)."""
    z = X[k].to(compute_dtype(X.dtype))
    dist = row_sq_distances(X, z).sqrt()
    same = usable & (dist == 0)
    pull_weights = torch.where(usable & ~same, w / dist.clamp_min(1e-300), 0.0)
    # Σ c_i (x_i − z) without an [n, d] temporary
    pull = weighted_sum(X, pull_weights) - float(pull_weights.sum()) * z
    if float(torch.linalg.vector_norm(pull.to(torch.float64))) > float(w[same].sum()):
        return None
    return z, float((w * dist)[usable].sum())


@dataclass(frozen=True, kw_only=True)
class GeometricMedian(Aggregator):
    """The (weighted) geometric median ``argmin_z Σ_i w_i ‖x_i - z‖`` (RFA), computed by the
    smoothed Weiszfeld algorithm (:func:`weiszfeld`): smoothing ``nu``, relative objective
    tolerance ``tol`` (RFA's stopping rule), at most ``max_iter`` updates. ByzFL instead
    runs three fixed updates with ``nu = 0.1``, which trades accuracy for time.

    Breakdown point 1/2: needs ``n >= 2f + 1`` (raises
    :class:`~sharefl.robust.base.AggregationError` otherwise; ``f`` is used only for that
    check). With a fraction ``α = f/n < 1/2`` of arbitrary rows, for every point ``c``,
    ``‖result - c‖ <= 2(1-α)/(1-2α) · max_honest ‖x_i - c‖`` (up to the tolerance); rows
    with ±inf or NaN are ignored. Permutation invariant and translation equivariant up to
    the tolerance. :meth:`solve` also reports the iteration count.
    """

    nu: float = 1e-6
    tol: float = 1e-6
    max_iter: int = 100
    accepts_weights: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self.nu, "nu")
        check_positive(self.tol, "tol", allow_zero=True)
        check_nonnegative_int(self.max_iter, "max_iter")

    def __call__(self, X: Tensor, weights: Tensor | None = None) -> Tensor:
        """Geometric median of the rows of ``X``, weighted by ``weights`` (shape ``[n]``)."""
        return self.solve(X, weights).median

    def solve(self, X: Tensor, weights: Tensor | None = None) -> WeiszfeldResult:
        """Like calling the rule, but returns the iteration count and convergence flag too."""
        self.check_rows(check_matrix(X).shape[0])
        return weiszfeld(X, weights, nu=self.nu, tol=self.tol, max_iter=self.max_iter)

    def _aggregate(self, X: Tensor) -> Tensor:
        return self.solve(X).median
