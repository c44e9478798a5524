"""Distance-based selection rules: Krum, MultiKrum, MDA, and the pairwise distances.

All three rules select rows by their pairwise squared distances, computed from one Gram
matrix (matrix products over column slabs of ``X``, no loop over pairs):
``‖x_i - x_j‖² = G_ii + G_jj - 2 G_ij``. To keep the cancellation in that formula small,
the rows are centred at a central row when the data sit far from the origin compared with
their spread (a second Gram matrix, needed only then). The Gram matrix is computed with
the rows in canonical order (:mod:`sharefl.robust._order`), so the *selection* does not
depend on the order of the input rows, bit for bit, and ties between equal scores are
broken by that order; the mean of the selected rows agrees up to rounding.

Non-finite rows (±inf, NaN, or a squared norm that overflows) are infinitely far from
every row: they are never selected while enough finite rows exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sharefl.robust._order import canonical_order
from sharefl.robust._rows import gram, weighted_sum
from sharefl.robust.base import AggregationError, Aggregator, check_nonnegative_int

#: centre the rows when the typical squared norm exceeds this many typical squared distances
_CENTRE_RATIO = 16.0


def _distances_from_gram(G: Tensor) -> Tensor:
    diag = G.diagonal()
    D = (diag[:, None] + diag[None, :] - 2.0 * G).clamp_min_(0.0)
    bad = ~torch.isfinite(diag)
    D[bad, :] = float("inf")
    D[:, bad] = float("inf")
    D.fill_diagonal_(0.0)
    return D


def pairwise_sq_distances(X: Tensor, order: Tensor | None = None) -> Tensor:
    """Squared Euclidean distances between the rows of ``X`` (float64, shape ``[n, n]``).

    Entry ``[a, b]`` is the distance between rows ``order[a]`` and ``order[b]`` (input
    order if ``order`` is ``None``). Rows that are non-finite are at distance +inf from
    every other row (0 from themselves).
    """
    if order is None:
        order = torch.arange(X.shape[0], device=X.device)
    return distances_and_finite(X, order)[0]


def distances_and_finite(X: Tensor, order: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`pairwise_sq_distances` in ``order``, and which of those rows are finite."""
    G = gram(X, order)
    D = _distances_from_gram(G)
    finite = torch.isfinite(G.diagonal())
    if int(finite.sum()) < 2:
        return D, finite
    good = torch.nonzero(finite).flatten()
    Dg = D[good][:, good]
    typical_norm = G.diagonal()[good].median()
    off_diagonal = Dg[~torch.eye(good.numel(), dtype=torch.bool, device=D.device)]
    if typical_norm <= _CENTRE_RATIO * off_diagonal.median():
        return D, finite
    # Centre at the most central finite row: smallest sum of distances to its nearest half.
    half = (good.numel() + 1) // 2
    centrality = torch.topk(Dg, half, dim=1, largest=False).values.sum(dim=1)
    centre = order[good[int(torch.argmin(centrality))]]
    G = gram(X, order, center=X[centre])
    return _distances_from_gram(G), finite & torch.isfinite(G.diagonal())


def krum_ranking(X: Tensor, f: int) -> Tensor:
    """Input-row indices sorted by Krum score, best first (ties: canonical row order).

    The Krum score of row ``i`` is the sum of its squared distances to its ``n - f - 2``
    nearest other rows. Requires ``n >= 2f + 3``.
    """
    n = X.shape[0]
    order = canonical_order(X)
    D = pairwise_sq_distances(X, order)
    D.fill_diagonal_(float("inf"))
    scores = torch.topk(D, n - f - 2, dim=1, largest=False).values.sum(dim=1)
    ranking = torch.sort(scores, stable=True).indices
    return order[ranking]


def mean_of_rows(X: Tensor, rows: Tensor) -> Tensor:
    """The mean of the given rows of ``X`` in ``X``'s dtype (the others may be non-finite)."""
    weights = torch.zeros(X.shape[0], dtype=torch.float64, device=X.device)
    weights[rows] = 1.0 / rows.numel()
    return weighted_sum(X, weights).to(X.dtype)


@dataclass(frozen=True, kw_only=True)
class Krum(Aggregator):
    """Krum (Blanchard et al., 2017): the row with the smallest Krum score, where the score
    of row ``i`` is ``Σ_{j ∈ N_i} ‖x_i - x_j‖²`` over the ``n - f - 2`` rows ``N_i`` nearest
    to ``x_i`` (the original neighbour count; ByzFL uses ``n - f - 1``).

    Breakdown: needs ``n >= 2f + 3`` (raises
    :class:`~sharefl.robust.base.AggregationError` otherwise). With ``f`` arbitrary rows the
    selected row is within ``sqrt((n - f - 2) / (n - 2f - 1))`` times the honest diameter
    of some honest row; non-finite rows are never selected. Ties are broken by the
    canonical row order, so the result does not depend on the input order.
    """

    _ROWS_OFFSET: ClassVar[int] = 3

    def _aggregate(self, X: Tensor) -> Tensor:
        return X[int(krum_ranking(X, self.f)[0])].clone()


@dataclass(frozen=True, kw_only=True)
class MultiKrum(Aggregator):
    """Multi-Krum (Blanchard et al., 2017): the mean of the ``m`` rows with the smallest
    Krum scores (see :class:`Krum`; ``n - f - 2`` neighbours), ``m = n - f`` by default
    (``m = 1`` is Krum).

    Breakdown: needs ``n >= 2f + 3`` and ``1 <= m <= n - f`` (raises
    :class:`~sharefl.robust.base.AggregationError` otherwise). Non-finite rows are never
    selected while at least ``m`` rows are finite.
    """

    m: int | None = None
    _ROWS_OFFSET: ClassVar[int] = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.m is not None and check_nonnegative_int(self.m, "m") == 0:
            raise AggregationError("m must be at least 1 (the number of rows averaged)")

    def _aggregate(self, X: Tensor) -> Tensor:
        n = X.shape[0]
        m = n - self.f if self.m is None else self.m
        if m > n - self.f:
            raise AggregationError(
                f"MultiKrum(f={self.f}, m={m}) averages at most n - f = {n - self.f} rows "
                f"with n = {n}: lower m"
            )
        return mean_of_rows(X, krum_ranking(X, self.f)[:m])


def _vertex_cover(adjacency: list[set[int]], k: int, budget: list[int]) -> list[int] | None:
    """A vertex cover of at most ``k`` vertices of the graph, or ``None`` if there is none.

    Exact search: a vertex of degree > k must be in the cover (Buss); a graph with more
    than k * max-degree edges has no cover of size k; otherwise branch on a vertex v of
    maximum degree: v is in the cover, or all its neighbours are. Deterministic: the
    smallest index wins ties. ``budget[0]`` counts down the search nodes.
    """
    budget[0] -= 1
    if budget[0] < 0:
        raise _SearchBudgetExceeded
    adj = [set(nb) for nb in adjacency]
    cover: list[int] = []

    def take(v: int) -> None:
        for u in adj[v]:
            adj[u].discard(v)
        adj[v] = set()
        cover.append(v)

    while True:
        forced = [v for v, nb in enumerate(adj) if len(nb) > k - len(cover)]
        if not forced:
            break
        if len(cover) + 1 > k:
            return None
        take(forced[0])
    left = k - len(cover)
    degrees = [len(nb) for nb in adj]
    edges = sum(degrees) // 2
    if edges == 0:
        return cover
    top = max(degrees)
    if left == 0 or edges > left * top:
        return None
    v = degrees.index(top)
    with_v = _vertex_cover(_without(adj, [v]), left - 1, budget)
    if with_v is not None:
        return [*cover, v, *with_v]
    neighbours = sorted(adj[v])
    if len(neighbours) > left:
        return None
    with_neighbours = _vertex_cover(_without(adj, neighbours), left - len(neighbours), budget)
    if with_neighbours is not None:
        return [*cover, *neighbours, *with_neighbours]
    return None


def _without(adjacency: list[set[int]], removed: list[int]) -> list[set[int]]:
    gone = set(removed)
    return [set() if v in gone else nb - gone for v, nb in enumerate(adjacency)]


class _SearchBudgetExceeded(Exception):
    pass


def min_diameter_subset(D: Tensor, f: int, max_search_nodes: int) -> list[int]:
    """Indices (into ``D``) of ``n - f`` rows whose largest pairwise distance is minimal.

    The optimal diameter is one of the pairwise distances; binary search over them for the
    smallest ``δ`` such that removing ``f`` rows leaves no pair farther than ``δ`` apart,
    i.e. such that the graph of pairs with ``D > δ`` has a vertex cover of ``f`` rows.
    Rows removed beyond that cover (if it is smaller than ``f``) are the ones farthest from
    the rest, one at a time. Ties: smallest index.
    """
    n = D.shape[0]
    if f == 0:
        return list(range(n))
    Dc = D.to("cpu")
    iu = torch.triu_indices(n, n, 1)
    candidates = torch.unique(Dc[iu[0], iu[1]]).tolist()
    budget = [max_search_nodes]

    def cover_at(delta: float) -> list[int] | None:
        far = (Dc > delta).tolist()
        adjacency = [
            {j for j, is_far in enumerate(row) if is_far and j != i} for i, row in enumerate(far)
        ]
        return _vertex_cover(adjacency, f, budget)

    lo, hi = 0, len(candidates) - 1
    try:
        while lo < hi:
            mid = (lo + hi) // 2
            if cover_at(candidates[mid]) is not None:
                hi = mid
            else:
                lo = mid + 1
        removed = cover_at(candidates[lo])
    except _SearchBudgetExceeded:
        raise AggregationError(
            f"MDA(f={f}): the exact minimum-diameter search needed more than "
            f"{max_search_nodes} steps on this input; lower f, raise max_search_nodes, or "
            "use MeaMed or MultiKrum"
        ) from None
    assert removed is not None  # the largest distance always has the empty cover
    dropped = set(removed)
    kept = [i for i in range(n) if i not in dropped]
    while len(kept) > n - f:
        spread = Dc[kept][:, kept].max(dim=1).values.tolist()
        kept.pop(max(range(len(kept)), key=lambda a: (spread[a], -a)))
    return kept


@dataclass(frozen=True, kw_only=True)
class MDA(Aggregator):
    """Minimum-diameter averaging (El Mhamdi et al., 2018; Rousseeuw's MVE idea): the mean
    of the ``n - f`` rows whose largest pairwise distance (diameter) is smallest.

    Computed exactly without enumerating the C(n, f) subsets: a binary search over the
    pairwise distances with an exact vertex-cover search (fast when the honest rows are
    tight, exponential in ``f`` in the worst case; ``max_search_nodes`` bounds it and
    :class:`~sharefl.robust.base.AggregationError` tells you when it is hit). Between
    subsets of equal diameter the canonical row order decides.

    Breakdown point ``⌊(n-1)/2⌋ / n``; needs ``n >= 2f + 1``. With ``f`` arbitrary rows the
    result is within the honest diameter of every honest row that was kept; non-finite rows
    are never kept while ``n - f`` rows are finite.
    """

    max_search_nodes: int = 100_000

    def __post_init__(self) -> None:
        super().__post_init__()
        if check_nonnegative_int(self.max_search_nodes, "max_search_nodes") == 0:
            raise AggregationError("max_search_nodes must be at least 1")

    def _aggregate(self, X: Tensor) -> Tensor:
        order = canonical_order(X)
        D = pairwise_sq_distances(X, order)
        kept = min_diameter_subset(D, self.f, self.max_search_nodes)
        rows = order[torch.tensor(kept, dtype=torch.long, device=order.device)]
        return mean_of_rows(X, rows)
