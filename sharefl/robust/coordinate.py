"""Coordinate-wise rules: Mean, Median, TrimmedMean, MeaMed.

Each output coordinate depends only on that coordinate of the ``n`` rows, so these rules
are permutation invariant and translation equivariant (``agg(X + t) = agg(X) + t``) and
return ``x`` when every row equals ``x``. The robust ones cost a few order statistics per
coordinate, computed in cache-sized blocks (:mod:`sharefl.robust._columns`).

Non-finite values: NaN ranks above +inf. Median, TrimmedMean and MeaMed survive up to
``f`` rows containing ±inf or NaN (the trimmed ranks absorb them); Mean does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sharefl.robust._columns import Array, Reduce, columnwise, namespace
from sharefl.robust.base import Aggregator, check_matrix, check_weights, compute_dtype


@dataclass(frozen=True, kw_only=True)
class Mean(Aggregator):
    """The (weighted) arithmetic mean: ``Σ_i w_i x_i / Σ_i w_i`` (plain mean without weights).

    Breakdown point 0: one row moves the result arbitrarily far, a single ±inf or NaN row
    makes it non-finite. It is the no-defence baseline; ``f`` is accepted so that every
    rule is configured alike, and is ignored (any ``n >= 1`` is accepted).
    """

    accepts_weights: ClassVar[bool] = True
    _ROWS_PER_F: ClassVar[int] = 0
    _ROWS_OFFSET: ClassVar[int] = 1

    @torch.no_grad()
    def __call__(self, X: Tensor, weights: Tensor | None = None) -> Tensor:
        """Mean of the rows of ``X``, weighted by ``weights`` (shape ``[n]``, >= 0) if given."""
        X = check_matrix(X)
        if weights is None:
            return self._aggregate(X)
        w = check_weights(weights, X.shape[0], X)
        work = compute_dtype(X.dtype)
        w = (w / w.sum()).to(work)
        return (X.to(work).T @ w).to(X.dtype)

    def _aggregate(self, X: Tensor) -> Tensor:
        return X.mean(dim=0, dtype=compute_dtype(X.dtype)).to(X.dtype)


def _median_reduce(block: Array, ranks: Array) -> Array:
    n = block.shape[1]
    lo, hi = block[:, (n - 1) // 2], block[:, n // 2]
    if n % 2:
        return lo
    # halves first: (lo + hi) / 2 would overflow near the largest float; equal middles
    # are returned as they are (halving a subnormal would round)
    return namespace(block).where(lo == hi, lo, 0.5 * lo + 0.5 * hi)


@dataclass(frozen=True, kw_only=True)
class Median(Aggregator):
    """Coordinate-wise median: for each coordinate, the middle value of the ``n`` rows
    (for even ``n``, the average of the two middle values, like ``numpy.median``; note
    that ``torch.median`` returns the lower one).

    Breakdown point ``⌊(n-1)/2⌋ / n``: with ``f`` arbitrary rows (±inf and NaN included)
    each coordinate stays within the range of the honest values. Raises
    :class:`~sharefl.robust.base.AggregationError` unless ``n >= 2f + 1``; ``f`` is used
    only for that check (the rule itself has no parameter).
    """

    def _aggregate(self, X: Tensor) -> Tensor:
        return columnwise(X, _median_reduce)


def _trimmed_reduce(f: int) -> Reduce:
    def reduce(block: Array, ranks: Array) -> Array:
        n = block.shape[1]
        return block[:, f : n - f].sum(1) / (n - 2 * f)

    return reduce


@dataclass(frozen=True, kw_only=True)
class TrimmedMean(Aggregator):
    """Coordinate-wise trimmed mean: for each coordinate, drop the ``f`` largest and the
    ``f`` smallest of the ``n`` values and average the ``n - 2f`` others.

    Breakdown point ``⌊(n-1)/2⌋ / n`` (with ``f`` at its maximum): with at most ``f``
    arbitrary rows (±inf and NaN included), each coordinate stays within the range of the
    honest values. Raises :class:`~sharefl.robust.base.AggregationError` unless
    ``n >= 2f + 1``. ``TrimmedMean(f=0)`` is the mean. (ByzFL calls it ``TrMean``.)
    """

    def _aggregate(self, X: Tensor) -> Tensor:
        return columnwise(X, _trimmed_reduce(self.f))


def _meamed_reduce(f: int) -> Reduce:
    def reduce(block: Array, ranks: Array) -> Array:
        xp = namespace(block)
        n = block.shape[1]
        keep = n - f
        median = _median_reduce(block, ranks)
        # The `keep` values nearest the median are a window [s, s + keep) of the sorted
        # values. Moving the window one step right drops v[i] for v[i + keep]; that is an
        # improvement while v[i] is strictly farther from the median, i.e. while
        # (v[i] + v[i + keep]) / 2 < median. That midpoint increases with i, so s counts
        # the improvements; on a tie the smaller value stays.
        midpoints = 0.5 * block[:, :f] + 0.5 * block[:, keep:]
        start = (midpoints < median[:, None]).sum(1)[:, None]
        window = (ranks >= start) & (ranks < start + keep)
        return xp.where(window, block, 0).sum(1) / keep

    return reduce


@dataclass(frozen=True, kw_only=True)
class MeaMed(Aggregator):
    """Mean around the median (Xie et al., 2018): for each coordinate, the average of the
    ``n - f`` values nearest to the coordinate-wise median (:class:`Median`); of two values
    at the same distance the smaller one is kept.

    Breakdown point ``⌊(n-1)/2⌋ / n``. With ``f`` arbitrary rows the result stays within
    the honest values' range widened by its width on each side (a kept arbitrary value is
    no farther from the median than a dropped honest one); rows with ±inf or NaN are
    dropped. Raises :class:`~sharefl.robust.base.AggregationError` unless ``n >= 2f + 1``.
    """

    def _aggregate(self, X: Tensor) -> Tensor:
        return columnwise(X, _meamed_reduce(self.f))
