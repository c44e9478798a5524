"""Random clusters for secure aggregation, and sparse neighbour graphs for masking.

SHARE (secure hierarchical robust aggregation) partitions the clients of a round into
random clusters of about ``m`` clients; secure aggregation runs inside each cluster, so the
server learns only each cluster's sum. The same updates are re-aggregated ``R`` times with
fresh clusters ("reclusterings") so that the robust aggregator sees differently mixed sums.
Whether the ``R`` partitions together reveal individual updates is checked by
:mod:`sharefl.protocol.audit`.

Everything here is reproducible: the result depends only on the *set* of client ids (they
are sorted first, so their order does not matter) and on the seed or generator state.

* :class:`Clustering` — an immutable partition of client ids into clusters.
* :func:`random_clustering` / :func:`random_reclusterings` — uniform random partitions into
  ``max(1, n // m)`` clusters of near-equal size (``m`` or ``m + 1`` in the usual regime).
* :func:`random_regular_graph` — a random ``k``-regular neighbour graph (SecAgg+-style sparse
  pairwise masking, ``k = O(log n)``), by the Steger–Wormald pairing algorithm.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

import numpy as np

from sharefl.protocol.errors import ProtocolError

RngLike = np.random.Generator | int | None
"""A numpy ``Generator`` (used and advanced in place), an integer seed, or ``None`` (fresh
OS entropy, not reproducible)."""

MAX_GRAPH_RESTARTS: Final = 1_000
"""Restarts of the Steger–Wormald pairing before :func:`random_regular_graph` gives up."""


class ClusteringError(ProtocolError, ValueError):
    """Bad clustering parameters or an invalid partition: cluster size or degree out of
    range, empty or duplicate client ids, overlapping or empty clusters."""


def as_generator(rng: RngLike) -> np.random.Generator:
    """Return ``rng`` itself if it is a ``Generator``, else ``np.random.default_rng(rng)``."""
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def _check_ids(client_ids: Iterable[int]) -> list[int]:
    """Return the client ids sorted, as Python ints; ClusteringError if empty or duplicated."""
    ids = sorted(int(i) for i in client_ids)
    if not ids:
        raise ClusteringError("no client ids given")
    duplicates = sorted({a for a, b in itertools.pairwise(ids) if a == b})
    if duplicates:
        raise ClusteringError(f"duplicate client ids: {duplicates[:10]}")
    return ids


@dataclass(frozen=True, slots=True)
class Clustering:
    """A partition of client ids into disjoint, non-empty clusters.

    The constructor accepts any iterables of ints and normalises them: each cluster is
    sorted and the clusters are ordered by their smallest id, so two ``Clustering`` objects
    are equal exactly when they describe the same partition. Raises :class:`ClusteringError`
    if a cluster is empty or a client appears twice (within or across clusters).
    """

    clusters: tuple[tuple[int, ...], ...]
    _index: dict[int, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        clusters = [tuple(sorted(int(i) for i in c)) for c in self.clusters]
        if any(not c for c in clusters):
            raise ClusteringError("clusters must be non-empty")
        clusters.sort()
        index: dict[int, int] = {}
        for k, cluster in enumerate(clusters):
            for client in cluster:
                if client in index:
                    raise ClusteringError(f"client {client} appears in more than one place")
                index[client] = k
        object.__setattr__(self, "clusters", tuple(clusters))
        object.__setattr__(self, "_index", index)

    @property
    def members(self) -> tuple[int, ...]:
        """All client ids of the partition, sorted."""
        return tuple(sorted(self._index))

    @property
    def num_clients(self) -> int:
        """The number of clients n."""
        return len(self._index)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The cluster sizes, in cluster order."""
        return tuple(len(c) for c in self.clusters)

    def __len__(self) -> int:
        """The number of clusters c."""
        return len(self.clusters)

    def __contains__(self, client: object) -> bool:
        return client in self._index

    def cluster_index(self, client: int) -> int:
        """The position of ``client``'s cluster in :attr:`clusters`; KeyError if absent."""
        try:
            return self._index[client]
        except KeyError:
            raise KeyError(f"client {client} is not in this clustering") from None

    def cluster_of(self, client: int) -> tuple[int, ...]:
        """The cluster (sorted ids) that contains ``client``; KeyError if absent."""
        return self.clusters[self.cluster_index(client)]


def _split_sizes(n: int, parts: int) -> list[int]:
    """``parts`` sizes summing to ``n`` that differ by at most one (larger ones first)."""
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def random_clustering(
    client_ids: Sequence[int], cluster_size: int, rng: RngLike = None
) -> Clustering:
    """A uniformly random partition of ``client_ids`` into clusters of about ``cluster_size``.

    With n clients and m = ``cluster_size`` there are c = max(1, n // m) clusters whose sizes
    differ by at most one, so no cluster is smaller than min(m, n). When the remainder
    n − c·m is at most c (always the case for n ≥ m(m − 1)) it is spread one client each
    over some clusters, giving sizes m or m + 1; otherwise (e.g. n = 5, m = 3) the sizes are
    ⌊n/c⌋ or ⌈n/c⌉, larger than m + 1. Special cases: m = 1 puts every client alone (no
    secure aggregation at all); m ≥ n gives one cluster of everybody (plain SecAgg), and in
    particular if n < m the single cluster has fewer than m clients.

    The ids are sorted before shuffling, so the result depends only on the set of ids and
    on ``rng`` (a ``Generator``, advanced in place, or a seed). Raises
    :class:`ClusteringError` for ``cluster_size < 1`` and for empty or duplicate ids.
    """
    if cluster_size < 1:
        raise ClusteringError(f"cluster_size must be >= 1, got {cluster_size}")
    ids = _check_ids(client_ids)
    n = len(ids)
    gen = as_generator(rng)
    order = gen.permutation(n)
    shuffled = [ids[k] for k in order]
    clusters: list[list[int]] = []
    start = 0
    for size in _split_sizes(n, max(1, n // cluster_size)):
        clusters.append(shuffled[start : start + size])
        start += size
    return Clustering(tuple(tuple(c) for c in clusters))


def spoiled_clusters(clients: int, byzantine: int, cluster_size: int) -> list[Fraction]:
    """The exact distribution of how many clusters of a :func:`random_clustering` hold at
    least one of ``byzantine`` clients: element j is P(exactly j spoiled clusters),
    j = 0 … c, with c the clustering's number of clusters (sizes as it draws them).

    Sizing (SHARE): a robust rule over c cluster sums tolerates f spoiled ones, so pick m
    (and the rule's f) from this distribution, e.g. :func:`clusters_to_tolerate`. The
    Byzantine set is a uniform subset of the shuffled positions, so the count is exact
    combinatorics: a product over the clusters of C(size, k) ways to place k of them.
    Raises :class:`ClusteringError` for counts out of range."""
    if cluster_size < 1 or clients < 1 or not 0 <= byzantine <= clients:
        raise ClusteringError(
            f"need clients >= 1, 0 <= byzantine <= clients and cluster_size >= 1; got "
            f"{clients}, {byzantine}, {cluster_size}"
        )
    sizes = _split_sizes(clients, max(1, clients // cluster_size))
    # ways[placed][spoiled]: placements of `placed` Byzantine clients in the clusters so far
    ways: dict[tuple[int, int], int] = {(0, 0): 1}
    for size in sizes:
        step: dict[tuple[int, int], int] = defaultdict(int)
        for (placed, spoiled), count in ways.items():
            for k in range(min(size, byzantine - placed) + 1):
                step[(placed + k, spoiled + (k > 0))] += count * math.comb(size, k)
        ways = step
    total = math.comb(clients, byzantine)
    return [Fraction(ways.get((byzantine, j), 0), total) for j in range(len(sizes) + 1)]


def clusters_to_tolerate(
    clients: int, byzantine: int, cluster_size: int, confidence: float = 0.99
) -> int:
    """The smallest f such that at most f clusters are spoiled with probability at least
    ``confidence`` (:func:`spoiled_clusters`): the f a rule over the cluster sums needs."""
    if not 0 < confidence <= 1:
        raise ClusteringError(f"confidence must be in (0, 1], got {confidence}")
    cumulative = Fraction(0)
    for f, p in enumerate(spoiled_clusters(clients, byzantine, cluster_size)):
        cumulative += p
        if cumulative >= Fraction(confidence):
            return f
    raise AssertionError("the distribution sums to one")  # pragma: no cover


def tolerance_warning(
    clients: int, byzantine: int, cluster_size: int, tolerated: int, confidence: float = 0.99
) -> str | None:
    """``None`` if a rule that tolerates ``tolerated`` spoiled cluster sums holds with
    probability at least ``confidence`` per random clustering of ``clients`` with
    ``byzantine`` of them Byzantine (:func:`spoiled_clusters`); otherwise one sentence with
    the figures and what to change (transports log it when a run starts)."""
    dist = spoiled_clusters(clients, byzantine, cluster_size)
    holds = sum(dist[: tolerated + 1], Fraction(0))
    if holds >= Fraction(confidence):
        return None
    clusters = len(dist) - 1
    mean = float(sum(j * p for j, p in enumerate(dist)))
    need = clusters_to_tolerate(clients, byzantine, cluster_size, confidence)
    return (
        f"{byzantine} Byzantine clients among {clients} in clusters of {cluster_size} "
        f"({clusters} clusters) spoil {mean:.2f} clusters on average, and more than the "
        f"{tolerated} the rule tolerates with probability {float(1 - holds):.2f} per "
        f"clustering; a rule over the cluster sums needs f >= {need} (and f < "
        f"{clusters}/2 for a majority rule): use more clients per Byzantine one, smaller "
        "clusters, or a rule with a larger f"
    )


def random_reclusterings(
    client_ids: Sequence[int], cluster_size: int, reclusterings: int, rng: RngLike = None
) -> list[Clustering]:
    """``reclusterings`` independent :func:`random_clustering` draws over the same clients.

    All draws come from one generator built from ``rng``, so the list is reproducible from a
    seed. Raises :class:`ClusteringError` if ``reclusterings < 1`` or for the reasons of
    :func:`random_clustering`.
    """
    if reclusterings < 1:
        raise ClusteringError(f"reclusterings must be >= 1, got {reclusterings}")
    gen = as_generator(rng)
    return [random_clustering(client_ids, cluster_size, gen) for _ in range(reclusterings)]


def _pairing_attempt(n: int, degree: int, gen: np.random.Generator) -> set[tuple[int, int]] | None:
    """One run of the Steger–Wormald pairing on vertices 0..n−1; None if it got stuck.

    Every vertex starts with ``degree`` free half-edges ("stubs"). Each pass shuffles the
    free stubs and pairs them consecutively, keeping a pair if it is neither a self-loop nor
    a duplicate edge and returning its stubs to the pool otherwise. The run is stuck when
    no two remaining stubs could ever form a new edge.
    """
    edges: set[tuple[int, int]] = set()
    stubs = np.repeat(np.arange(n), degree)
    while stubs.size:
        leftover: defaultdict[int, int] = defaultdict(int)
        shuffled = gen.permutation(stubs).tolist()
        for a, b in zip(shuffled[0::2], shuffled[1::2], strict=True):
            edge = (a, b) if a < b else (b, a)
            if a != b and edge not in edges:
                edges.add(edge)
            else:
                leftover[a] += 1
                leftover[b] += 1
        if not leftover:
            return edges
        if not _can_continue(edges, leftover):
            return None
        stubs = np.repeat(np.fromiter(leftover, dtype=np.int64), list(leftover.values()))
    return edges


def _can_continue(edges: set[tuple[int, int]], leftover: dict[int, int]) -> bool:
    """True if two distinct vertices with free stubs are not yet adjacent."""
    vertices = sorted(leftover)
    return any((a, b) not in edges for i, a in enumerate(vertices) for b in vertices[i + 1 :])


def random_regular_graph(
    client_ids: Sequence[int], degree: int, rng: RngLike = None
) -> dict[int, frozenset[int]]:
    """A random ``degree``-regular simple undirected graph on ``client_ids``.

    Returns each client's neighbour set (symmetric, no self-loops, every set of size k =
    ``degree``). This is the sparse masking graph of SecAgg+ (Bell et al. 2020), where each
    client agrees pairwise masks with k = O(log n) neighbours instead of all n − 1.

    Algorithm: the Steger–Wormald (1999) pairing algorithm, which pairs free half-edges
    uniformly among the pairs that do not create loops or multi-edges and restarts when
    stuck; it is asymptotically uniform for k = o(n^(1/28)) and fast in practice for
    k up to about sqrt(n). For k > (n − 1) / 2 the complement of a random
    (n − 1 − k)-regular graph is returned instead, which keeps dense cases fast.
    Reproducible from the seed (ids are sorted first). Raises :class:`ClusteringError` if
    ``degree < 0``, ``degree >= n``, n·k is odd, the ids are empty or duplicated, or no
    graph was found within :data:`MAX_GRAPH_RESTARTS` restarts.
    """
    ids = _check_ids(client_ids)
    n = len(ids)
    if not 0 <= degree < n:
        raise ClusteringError(f"degree must satisfy 0 <= k < n = {n}, got {degree}")
    if (n * degree) % 2:
        raise ClusteringError(f"n·k must be even for a k-regular graph (n = {n}, k = {degree})")
    gen = as_generator(rng)
    complement = degree > (n - 1) // 2
    k = n - 1 - degree if complement else degree
    edges = _regular_edges(n, k, gen)
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for a, b in edges:
        neighbours[a].add(b)
        neighbours[b].add(a)
    if complement:
        everyone = set(range(n))
        neighbours = [everyone - nb - {v} for v, nb in enumerate(neighbours)]
    return {ids[v]: frozenset(ids[u] for u in nb) for v, nb in enumerate(neighbours)}


def _regular_edges(n: int, degree: int, gen: np.random.Generator) -> set[tuple[int, int]]:
    """Edges of a random ``degree``-regular graph on 0..n−1 (restarting the pairing)."""
    if degree == 0:
        return set()
    for _ in range(MAX_GRAPH_RESTARTS):
        edges = _pairing_attempt(n, degree, gen)
        if edges is not None:
            return edges
    raise ClusteringError(
        f"no {degree}-regular graph on {n} vertices found in {MAX_GRAPH_RESTARTS} restarts"
    )
