"""Pre-aggregators (NNM, Bucketing) and the Pipeline that chains them to an aggregator.

A pre-aggregator maps the ``n`` input rows to ``n'`` rows that an aggregator then
combines; the pair is written ``Pipeline(aggregator=Krum(f=2), pre=(NNM(f=2),))``.
(:class:`~sharefl.robust.clipping.Clipping` is the third pre-aggregator.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.robust._order import canonical_order
from sharefl.robust._rows import combine_rows, weighted_sum
from sharefl.robust.base import (
    AggregationError,
    Aggregator,
    PreAggregator,
    check_matrix,
    check_nonnegative_int,
    require_rows,
)
from sharefl.robust.distance import distances_and_finite, mean_of_rows


@dataclass(frozen=True, kw_only=True)
class NNM(PreAggregator):
    """Nearest-neighbour mixing (Allouah et al., 2023): replace every row by the mean of
    the ``n - f`` rows nearest to it (itself included). Ties between equally near rows are
    broken by the canonical row order, so permuting the input permutes the output.

    Needs ``n >= 2f + 1`` (raises :class:`~sharefl.robust.base.AggregationError`). With at
    most ``f`` arbitrary rows, every honest row's neighbourhood mean stays within the
    honest diameter of it; non-finite rows are passed through unchanged (the aggregator
    that follows must be robust to them, as every robust rule here is).
    """

    f: int = 0

    def __post_init__(self) -> None:
        check_nonnegative_int(self.f, "f")

    def _transform(self, X: Tensor) -> Tensor:
        n = X.shape[0]
        require_rows("NNM", self.f, n)
        keep = n - self.f
        order = canonical_order(X)
        D, finite = distances_and_finite(X, order)
        neighbours = torch.sort(D, dim=1, stable=True).indices[:, :keep]
        clean = torch.isfinite(D.gather(1, neighbours)).all(dim=1)
        out = torch.empty_like(X)
        rows = torch.nonzero(clean).flatten()
        if rows.numel():
            # read the finite rows in canonical order and write each mix to its input row:
            # bitwise permutation-equivariant, so a rule after NNM breaks ties consistently
            cols = torch.nonzero(finite).flatten()
            position = torch.full((n,), -1, dtype=torch.long, device=D.device)
            position[cols] = torch.arange(cols.numel(), device=D.device)
            W = torch.zeros(rows.numel(), cols.numel(), dtype=torch.float64, device=D.device)
            W.scatter_(1, position[neighbours[rows]], 1.0 / keep)
            combine_rows(X, W, order[cols], out=out, out_rows=order[rows])
        for a in torch.nonzero(~clean).flatten().tolist():
            row = int(order[a])
            if finite[a]:  # more than f non-finite rows: the mean is non-finite too
                out[row] = mean_of_rows(X, order[neighbours[a]])
            else:  # a non-finite row is passed through unchanged
                out[row] = X[row]
        return out


@dataclass(frozen=True, kw_only=True)
class Bucketing(PreAggregator):
    """Bucketing (Karimireddy, He and Jaggi, 2022): shuffle the rows with ``generator``,
    cut them into consecutive buckets of ``bucket_size`` rows (the last one may be
    smaller; the paper's ``s = 2`` by default) and return the ``⌈n / bucket_size⌉``
    bucket means.

    The shuffle permutes the canonical row order, so for a given generator state the
    output does not depend on the input order (up to rounding). ``generator`` is a CPU
    :class:`torch.Generator`; it is advanced by every call. With ``f`` arbitrary rows at
    most ``f`` buckets are affected: follow it by a rule configured for ``f`` rows out of
    ``⌈n / s⌉``.
    """

    generator: torch.Generator
    bucket_size: int = 2

    def __post_init__(self) -> None:
        if check_nonnegative_int(self.bucket_size, "bucket_size") == 0:
            raise AggregationError("bucket_size must be at least 1")
        if not isinstance(self.generator, torch.Generator):
            raise AggregationError(
                "generator must be a torch.Generator, e.g. torch.Generator().manual_seed(0)"
            )

    def _transform(self, X: Tensor) -> Tensor:
        n = X.shape[0]
        s = self.bucket_size
        shuffle = torch.randperm(n, generator=self.generator, device=self.generator.device)
        rows = canonical_order(X)[shuffle.to(X.device)]
        buckets = (n + s - 1) // s
        bucket = torch.arange(n, device=X.device) // s  # bucket of the i-th shuffled row
        sizes = torch.bincount(bucket, minlength=buckets).to(torch.float64)
        W = torch.zeros(buckets, n, dtype=torch.float64, device=X.device)
        W[bucket, rows] = 1.0 / sizes[bucket]
        return weighted_sum(X, W).to(X.dtype)


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """Pre-aggregators applied in order, then an aggregator: ``aggregator(pre_k(...pre_1(X)))``.

    Example: ``Pipeline(aggregator=MultiKrum(f=2), pre=(NNM(f=2),))``.
    """

    aggregator: Aggregator
    pre: Sequence[PreAggregator] = ()

    @torch.no_grad()
    def __call__(self, X: Tensor) -> Tensor:
        """Apply the pre-aggregators, then the aggregator; returns shape ``[d]``."""
        X = check_matrix(X)
        for step in self.pre:
            X = step(X)
        return self.aggregator(X)
