"""The noise-aware two-stage filter of Xiang et al. (SIGMOD 2023, Algorithms 2-3).

Workers upload DP-SGD gradients ``g_i = (1/b_c)(Σ_j u_j + N(0, σ² I_d))`` with unit-norm
per-example terms ``u_j`` and small batches, so an honest upload is dominated by Gaussian
noise of per-coordinate standard deviation ``s = σ / b_c``. The server uses that:

**First stage** (FirstAGG, Algorithm 2), per upload; a failing upload is set to zero:

* norm test: ``‖g‖²`` must lie within ``s² d ± 3 s² sqrt(2d)`` (±3 standard deviations of
  ``s² χ²_d``);
* Kolmogorov-Smirnov test: the ``d`` coordinates, as a sample, against ``N(0, s²)``; the
  upload fails when the p-value is below ``alpha = 0.05``.

**Second stage** (Algorithm 3), with a clean gradient ``g_s`` computed by the server on
its small auxiliary dataset at the current model and a persistent score per worker:

    S_i = <g_i, g_s>;   μ = mean of the top ⌈γn⌉ of S;   S_i ← 0 where S_i < μ;
    cumulative_i += S_i;   selected = the ⌈γn⌉ workers with the largest cumulative score;
    aggregate = (1/n) Σ_{i selected} g_i.

``γ`` is the server's lower bound on the honest fraction; no bound on the Byzantine
fraction is needed. The paper's version is the default. Options reproduce what the
authors' code does instead (seed note §6.3-6.4): ``score="cosine"`` (its score is
``10 <g_i, ĝ_s> / ‖g_i‖``, a scaled cosine with the same ranking), ``server_momentum=0.99``
(an exponential average of ``g_s``, normalised to unit norm), ``top_k="floor"`` and
``normalize="selected"`` (average over the selected uploads rather than divide by n).

Ties in the cumulative score (all zero at first) go to the lower worker index. A
non-finite upload is rejected like one failing the first stage. The state (cumulative
scores, momentum) lives in an explicit :class:`NoiseFilterState`, indexed by worker: row
``i`` of every call must be the same worker.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from sharefl.robust._parallel import thread_pool
from sharefl.robust._rows import row_dots, row_sq_distances, weighted_sum
from sharefl.robust.base import (
    AggregationError,
    check_matrix,
    check_nonnegative_int,
    check_positive,
    check_vector,
    compute_dtype,
)

#: the auxiliary (server) gradient, or a function computing it at the current model
AuxiliaryGradient = Tensor | Callable[[], Tensor]


def ks_statistic(x: Tensor, std: float) -> float:
    """One-sample Kolmogorov-Smirnov statistic of the values ``x`` against ``N(0, std²)``:
    ``sup_t |F_emp(t) - Φ(t / std)|``, as :func:`scipy.stats.kstest` computes it."""
    from scipy import special  # the [sim] extra; imported here so that the Flower
    # integration ([flower]: torch, no scipy) can import this package's other rules

    values = np.sort(x.detach().to("cpu", compute_dtype(x.dtype)).numpy().ravel())
    d = values.size
    cdf = special.ndtr(values.astype(np.float64) / std)
    above = np.arange(1, d + 1) / d - cdf
    below = cdf - np.arange(0, d) / d
    return float(max(above.max(), below.max()))


def ks_pvalue(statistic: float, d: int) -> float:
    """P-value of a one-sample KS statistic over ``d`` values (exact distribution, as
    :func:`scipy.stats.kstest` uses)."""
    from scipy import stats  # the [sim] extra (see ks_statistic)

    return float(stats.kstwo.sf(statistic, d))


@dataclass
class NoiseFilterState:
    """Memory of :class:`NoiseAwareFilter` across rounds.

    Attributes:
        cumulative: float64 ``[n]`` cumulative scores (``None`` until the first round).
        momentum: the server-momentum average of the auxiliary gradient (if enabled).
        rounds: rounds aggregated so far.
    """

    cumulative: Tensor | None = None
    momentum: Tensor | None = None
    rounds: int = 0


@dataclass(frozen=True)
class NoiseFilterResult:
    """One round of :class:`NoiseAwareFilter`.

    Attributes:
        aggregate: the aggregated gradient ``[d]`` (input dtype).
        selected: indices of the selected workers (``⌈γn⌉`` of them), best first.
        passed: bool ``[n]``, uploads that passed the first stage (all True when it is off).
        ks_pvalues: float64 ``[n]`` KS p-values (NaN when the stage is off or not reached).
        scores: float64 ``[n]`` this round's scores after zeroing those below the mean.
        cumulative: float64 ``[n]`` cumulative scores after this round.
    """

    aggregate: Tensor
    selected: Tensor
    passed: Tensor
    ks_pvalues: Tensor
    scores: Tensor
    cumulative: Tensor


@dataclass(frozen=True, kw_only=True)
class NoiseAwareFilter:
    """Two-stage filter of DP-noised uploads (see the module docstring).

    Attributes:
        noise_multiplier: σ of the workers' DP-SGD (noise std before dividing by ``b_c``).
        batch_size: the workers' batch size ``b_c`` (16 in the paper).
        honest_fraction: γ, the server's lower bound on the honest fraction, in (0, 1].
        first_stage: run the norm and KS tests (the authors' code never does).
        ks_alpha: KS significance level (0.05).
        norm_band: half-width of the norm test, in standard deviations of ``‖g‖²`` (3).
        score: ``"inner"`` (paper) or ``"cosine"`` (code).
        server_momentum: β of the auxiliary-gradient average, 0 = off (paper; code 0.99).
        top_k: ``"ceil"`` (paper, ⌈γn⌉) or ``"floor"`` (code, at least 1).
        normalize: ``"n"`` (paper: divide the selected sum by n) or ``"selected"`` (code).
        state: the explicit cross-round state.
    """

    noise_multiplier: float
    batch_size: int = 16
    honest_fraction: float
    first_stage: bool = True
    ks_alpha: float = 0.05
    norm_band: float = 3.0
    score: Literal["inner", "cosine"] = "inner"
    server_momentum: float = 0.0
    top_k: Literal["ceil", "floor"] = "ceil"
    normalize: Literal["n", "selected"] = "n"
    state: NoiseFilterState = field(default_factory=NoiseFilterState, compare=False)

    def __post_init__(self) -> None:
        check_positive(self.noise_multiplier, "noise_multiplier")
        if check_nonnegative_int(self.batch_size, "batch_size") == 0:
            raise AggregationError("batch_size must be at least 1")
        if not 0 < self.honest_fraction <= 1:
            raise AggregationError(f"honest_fraction must be in (0, 1], got {self.honest_fraction}")
        if not 0 < self.ks_alpha < 1:
            raise AggregationError(f"ks_alpha must be in (0, 1), got {self.ks_alpha}")
        check_positive(self.norm_band, "norm_band")
        if not 0 <= self.server_momentum < 1:
            raise AggregationError(f"server_momentum must be in [0, 1), got {self.server_momentum}")
        for name, value, allowed in (
            ("score", self.score, ("inner", "cosine")),
            ("top_k", self.top_k, ("ceil", "floor")),
            ("normalize", self.normalize, ("n", "selected")),
        ):
            if value not in allowed:
                raise AggregationError(f"{name} must be one of {allowed}, got {value!r}")

    @property
    def noise_std(self) -> float:
        """Per-coordinate standard deviation of an honest upload's noise: ``σ / b_c``."""
        return self.noise_multiplier / self.batch_size

    def norm_bounds(self, d: int) -> tuple[float, float]:
        """The accepted range of ``‖g‖²``: ``s² d ± norm_band · s² sqrt(2d)``."""
        s2 = self.noise_std**2
        half = self.norm_band * s2 * math.sqrt(2 * d)
        return max(0.0, s2 * d - half), s2 * d + half

    def selected_count(self, n: int) -> int:
        """How many workers are selected each round: ⌈γn⌉ (or ⌊γn⌋, at least 1)."""
        k = math.ceil(self.honest_fraction * n - 1e-9)
        if self.top_k == "floor":
            k = math.floor(self.honest_fraction * n + 1e-9)
        return min(n, max(1, k))

    def first_stage_tests(self, X: Tensor, sq_norms: Tensor) -> tuple[Tensor, Tensor]:
        """(passed, ks_pvalues) of the norm and KS tests, for every row of ``X``."""
        n, d = X.shape
        lo, hi = self.norm_bounds(d)
        passed = torch.isfinite(sq_norms) & (sq_norms >= lo) & (sq_norms <= hi)
        pvalues = torch.full((n,), float("nan"), dtype=torch.float64)
        candidates = torch.nonzero(passed).flatten().tolist()
        # scipy's first import happens here, once, not concurrently in the pool's threads.
        import scipy.stats  # noqa: F401

        def test(i: int) -> float:  # sorts d values: numpy releases the GIL, rows in parallel
            return ks_pvalue(ks_statistic(X[i], self.noise_std), d)

        for i, p in zip(candidates, thread_pool().map(test, candidates), strict=True):
            pvalues[i] = p
        passed = passed & ~(pvalues.to(passed.device) < self.ks_alpha)
        return passed, pvalues

    def _auxiliary_direction(self, aux: Tensor) -> Tensor:
        g = aux.to(torch.float64)
        if self.server_momentum == 0:
            return g
        beta = self.server_momentum
        previous = self.state.momentum
        m = (1 - beta) * g if previous is None else beta * previous + (1 - beta) * g
        self.state.momentum = m
        norm = float(m.norm())
        return m / norm if norm > 0 else m

    @torch.no_grad()
    def filter(self, X: Tensor, aux_grad: AuxiliaryGradient) -> NoiseFilterResult:
        """Run one round on the uploads ``X`` (``[n, d]``, row i = worker i)."""
        X = check_matrix(X)
        n, d = X.shape
        aux = aux_grad() if callable(aux_grad) else aux_grad
        aux = check_vector(aux, d, X, name="aux_grad")
        if self.state.cumulative is not None and self.state.cumulative.shape != (n,):
            raise AggregationError(
                f"the filter's state has {self.state.cumulative.numel()} workers, got n = {n}: "
                "keep one row per worker in every round, or use a fresh NoiseAwareFilter"
            )
        sq_norms = row_sq_distances(X)
        if self.first_stage:
            passed, pvalues = self.first_stage_tests(X, sq_norms)
        else:
            passed = torch.isfinite(sq_norms)
            pvalues = torch.full((n,), float("nan"), dtype=torch.float64)
        passed = passed.to(X.device)

        direction = self._auxiliary_direction(aux).to(X.device)
        rows = torch.nonzero(passed).flatten()
        scores = torch.zeros(n, dtype=torch.float64, device=X.device)
        dots = row_dots(X, direction.to(X.dtype))[rows]
        if self.score == "cosine":
            denom = sq_norms[rows].sqrt() * float(direction.norm())
            dots = torch.where(denom > 0, dots / denom, 0.0)
        scores[rows] = dots
        k = self.selected_count(n)
        threshold = torch.topk(scores, k).values.mean()
        scores = torch.where(scores < threshold, 0.0, scores)
        cumulative = scores if self.state.cumulative is None else self.state.cumulative + scores
        self.state.cumulative = cumulative
        self.state.rounds += 1

        selected = torch.sort(-cumulative, stable=True).indices[:k]
        divisor = n if self.normalize == "n" else k
        weights = torch.zeros(n, dtype=torch.float64, device=X.device)
        weights[selected] = 1.0 / divisor
        weights[~passed] = 0.0  # a rejected upload counts as zero
        aggregate = weighted_sum(X, weights).to(X.dtype)
        return NoiseFilterResult(aggregate, selected, passed, pvalues, scores, cumulative.clone())

    def __call__(self, X: Tensor, aux_grad: AuxiliaryGradient) -> Tensor:
        """The aggregated gradient of one round (see :meth:`filter`)."""
        return self.filter(X, aux_grad).aggregate
