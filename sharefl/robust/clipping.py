"""Norm clipping: the Clipping pre-aggregator and CenteredClipping (stateful).

``clip(z, τ) = z · min(1, τ / ‖z‖)`` shrinks a vector onto the ball of radius ``τ``. A row
whose norm is not finite (±inf, NaN, overflow) has no usable direction; it is clipped to
the zero vector, i.e. it contributes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sharefl.robust._rows import row_sq_distances, weighted_sum
from sharefl.robust.base import (
    Aggregator,
    PreAggregator,
    check_nonnegative_int,
    check_positive,
    check_vector,
    compute_dtype,
)


def clip_factors(sq_distances: Tensor, tau: float) -> Tensor:
    """``min(1, τ / ‖z‖)`` from squared norms (float64); 0 where the norm is not finite."""
    norms = sq_distances.sqrt()
    factors = torch.where(norms > tau, tau / norms, 1.0)
    return torch.where(torch.isfinite(norms), factors, 0.0)


@dataclass(frozen=True, kw_only=True)
class Clipping(PreAggregator):
    """Clip every row to Euclidean norm at most ``threshold``: ``x_i · min(1, c / ‖x_i‖)``
    (ByzFL's ``Clipping``, default ``c = 2``). Rows with a non-finite norm become zero.

    Not translation equivariant (the ball is centred at 0); see :class:`CenteredClipping`.
    """

    threshold: float = 2.0

    def __post_init__(self) -> None:
        check_positive(self.threshold, "threshold")

    def _transform(self, X: Tensor) -> Tensor:
        factors = clip_factors(row_sq_distances(X), self.threshold)
        work = compute_dtype(X.dtype)
        out = X.to(work) * factors.to(work)[:, None]
        out[factors == 0] = 0.0  # 0 * inf is NaN: zero the non-finite rows explicitly
        return out.to(X.dtype)


@dataclass
class CenteredClippingState:
    """The memory of :class:`CenteredClipping`: the previous aggregate.

    Attributes:
        center: the vector the next call starts from (``None``: the zero vector). Set it
            to translate the rule, reset it to ``None`` to forget the history.
    """

    center: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class CenteredClipping(Aggregator):
    """Centered clipping (Karimireddy, He and Jaggi, 2021): starting from the previous
    aggregate ``v_0`` (``state.center``, zero at first), repeat ``iterations`` times

        v_{l+1} = v_l + (1/n) Σ_i clip(x_i - v_l, tau),

    return ``v_L`` and store it in ``state.center`` for the next round. Rows with a
    non-finite distance contribute 0. Defaults follow ByzFL (``tau = 100``, one iteration);
    the paper uses momentum-averaged inputs and ``tau`` of the order of the honest spread.

    Breakdown: each arbitrary row moves ``v`` by at most ``tau / n`` per iteration; the
    analysis needs a minority of arbitrary rows, so ``n >= 2f + 1`` is required (raises
    :class:`~sharefl.robust.base.AggregationError`; ``f`` is used only for that check).
    Permutation invariant; translation equivariant when ``state.center`` is translated too.

    The state is explicit: ``rule.state`` is a :class:`CenteredClippingState`, and a rule
    built with ``state=CenteredClippingState(center=v)`` resumes from ``v``.
    """

    tau: float = 100.0
    iterations: int = 1
    state: CenteredClippingState = field(default_factory=CenteredClippingState, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(self.tau, "tau")
        check_nonnegative_int(self.iterations, "iterations")

    def _aggregate(self, X: Tensor) -> Tensor:
        n, d = X.shape
        work = compute_dtype(X.dtype)
        if self.state.center is None:
            v = torch.zeros(d, dtype=work, device=X.device)
        else:
            v = check_vector(self.state.center, d, X, name="state.center").to(work)
        for _ in range(self.iterations):
            sq_distances = row_sq_distances(X, v)
            factors = clip_factors(sq_distances, self.tau) / n  # 0 for non-finite rows
            pulled = weighted_sum(X, factors)
            v = v * (1.0 - float(factors.sum())) + pulled
        out = v.to(X.dtype)
        self.state.center = out.clone()
        return out
