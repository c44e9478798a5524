"""Isolating a repeat corrupter by reclustering: suspicion across rounds, spread plans.

A Byzantine client that corrupts its input (a sum outside the honest range:
:class:`~sharefl.protocol.coordinator.CorruptedCluster`) or makes its cluster fail cannot be
named from one round: secure aggregation shows the server a cluster's sum, not who in the
cluster spoiled it. Each clustering is, however, a *group test*: a corrupter that corrupts
every time always lands in a flagged cluster, so every member of a clean (released,
in-range) cluster is cleared, and the corrupter lies in the intersection of the flagged
clusters it was tested in. The server can choose the next clustering to split that
intersection.

:class:`Suspicion` keeps, per client, the number of flagged clusters it was in since it was
last in a clean one (members of a flagged cluster share the suspicion; a clean cluster
clears its members). A persistent corrupter's score is never cleared, so it always has
the highest score; an honest client's score counts only the flagged clusters it shared
with the corrupter since its last clean cluster.

:func:`spread_clustering` draws the next clustering so that suspects are spread over the
clusters, the highest scores first (round-robin over the clusters in random order, the
non-suspects shuffled into the remaining places): with at most c = ⌊n/m⌋ suspects every
suspect is alone among suspects in its cluster, so the next flagged cluster holds exactly
one of them. After the first flagged cluster (m suspects, m <= c when n >= m²) the next
spread clustering therefore pins a single persistent corrupter: two rounds of R = 1, where
random reclustering leaves another suspect in the corrupter's cluster with probability
about 1 − (1 − (m − 1)/(n − 1))^(m − 1) per round. Measured (``benchmarks/
bench_isolation.py``, 200 trials per setting, R = 1): the isolating planner pinned the
corrupter in exactly 2 rounds in every trial at n = 30, 60, 120 and m = 3, 5; random
reclustering took 2.03–2.54 rounds on average (within 2 rounds in 56–97% of the trials,
worst 5). With R = 3 both pin in 1–2 rounds (mean 1.2–1.8): the safe sampler's block
splits already separate the corrupter from its block-mates within a round, and spreading
adds nothing measurable there.

:attr:`Suspicion.pinned` names a client only when (a) the latest test flagged exactly one
cluster, (b) that cluster holds the client, and (c) its score is strictly higher than
every other client's: the intersection of the flagged memberships since the corrupter's
first flag is that one client. With nobody corrupting nothing is flagged and nobody is
pinned; two corrupters in different clusters flag two clusters per test and are not
pinned either (the single-corrupter reading does not hold). A pin is evidence for the
operator, not a protocol proof: an honest client's cluster fails when members drop out,
so ``count_failures`` decides whether failures count as flags.

Privacy. Spreading changes only which partition is drawn: each round's plan goes through
the same leakage audit as any other (:func:`~sharefl.protocol.coordinator.plan_round`);
for R > 1 the blocks of the safe sampler are spread, and the reclusterings inside each
block are the sampler's audited ones. Rounds over different models sum different inputs,
so plans of different rounds do not combine.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sharefl.protocol.audit import sample_safe_reclusterings
from sharefl.protocol.clustering import Clustering, ClusteringError, RngLike, as_generator

if TYPE_CHECKING:  # the coordinator imports this module
    from sharefl.protocol.coordinator import RoundResult


@dataclass
class Suspicion:
    """Per-client suspicion from the history of flagged clusters (see the module docstring).

    Attributes:
        count_failures: failed clusters (not those the release check withheld, which is
            the server's own decision) count as flagged, like corrupted ones.
        scores: client → flagged clusters it was in since it was last in a clean one.
        tests: the clusterings observed so far.
        last_flagged: the flagged clusters of the latest observed clustering.
    """

    count_failures: bool = True
    scores: dict[int, int] = field(default_factory=dict)
    tests: int = 0
    last_flagged: tuple[frozenset[int], ...] = ()

    def observe(self, flagged: Iterable[Collection[int]], clean: Iterable[Collection[int]]) -> None:
        """One clustering's outcome: ``flagged`` clusters (corrupted, or failed) and
        ``clean`` ones (released in range). Members of a flagged cluster gain one point;
        members of a clean cluster are cleared to 0 (a client never in a flagged cluster
        has no entry). A client listed in both (it cannot be, in one clustering) is
        treated as flagged."""
        flags = tuple(frozenset(int(c) for c in cluster) for cluster in flagged)
        for cluster in clean:
            for client in cluster:
                self.scores.pop(int(client), None)
        for cluster in flags:
            for client in cluster:
                self.scores[client] = self.scores.get(client, 0) + 1
        self.last_flagged = flags
        self.tests += 1

    def record(self, result: RoundResult) -> None:
        """Observe every reclustering of a round's result: corrupted clusters (and failed
        ones with ``count_failures``, except withheld ones) are flagged, released sums
        clean. Clusters that did none of these (none exist today) are ignored."""
        for rec in result.reclusterings:
            flagged = [c.members for c in rec.corrupted]
            if self.count_failures:
                flagged += [f.members for f in rec.failed if f.stage != "release"]
            self.observe(flagged, [c.members for c in rec.clusters])

    @property
    def suspects(self) -> frozenset[int]:
        """Clients with a positive score."""
        return frozenset(self.scores)

    def ranked(self, clients: Iterable[int], rng: RngLike = None) -> list[int]:
        """The suspects among ``clients``, highest score first (ties in random order)."""
        gen = as_generator(rng)
        suspects = sorted(c for c in clients if c in self.scores)
        order = gen.permutation(len(suspects))
        return sorted((suspects[k] for k in order), key=lambda c: -self.scores[c])

    @property
    def pinned(self) -> int | None:
        """The single client the flags point to, or None (conditions (a)–(c) of the module
        docstring)."""
        if len(self.last_flagged) != 1 or not self.scores:
            return None
        top = max(self.scores.values())
        leaders = [c for c, s in self.scores.items() if s == top]
        if len(leaders) != 1 or leaders[0] not in self.last_flagged[0]:
            return None
        return leaders[0]


def spread_clustering(
    client_ids: Sequence[int],
    cluster_size: int,
    suspects: Sequence[int],
    rng: RngLike = None,
) -> Clustering:
    """A random partition of ``client_ids`` with the sizes of
    :func:`~sharefl.protocol.clustering.random_clustering` (c = max(1, n // m) clusters of
    near-equal size) in which ``suspects`` (highest priority first) are dealt round-robin
    over the clusters in a random order, skipping full ones, and every other client is
    placed uniformly at random in the remaining places. So each cluster holds at most
    ⌈|S|/c⌉ suspects (when the sizes allow), and the first c suspects are in c distinct
    clusters. Raises :class:`ClusteringError` for ``cluster_size < 1``, empty or duplicate
    ids, or suspects that are not among the ids.
    """
    if cluster_size < 1:
        raise ClusteringError(f"cluster_size must be >= 1, got {cluster_size}")
    ids = sorted(int(i) for i in client_ids)
    if not ids or len(set(ids)) != len(ids):
        raise ClusteringError("client ids must be distinct, at least one")
    ranked = [int(s) for s in suspects]
    if len(set(ranked)) != len(ranked) or not set(ranked) <= set(ids):
        raise ClusteringError("suspects must be distinct client ids of the clustering")
    gen = as_generator(rng)
    n = len(ids)
    parts = max(1, n // cluster_size)
    base, extra = divmod(n, parts)
    room = [base + 1] * extra + [base] * (parts - extra)
    order = [int(k) for k in gen.permutation(parts)]
    clusters: list[list[int]] = [[] for _ in range(parts)]
    turn = 0
    for suspect in ranked:
        while len(clusters[order[turn % parts]]) >= room[order[turn % parts]]:
            turn += 1
        clusters[order[turn % parts]].append(suspect)
        turn += 1
    chosen = set(ranked)
    others = [ids[k] for k in gen.permutation(n) if ids[k] not in chosen]
    start = 0
    for cluster, size in zip(clusters, room, strict=True):
        take = size - len(cluster)
        cluster.extend(others[start : start + take])
        start += take
    return Clustering(tuple(tuple(c) for c in clusters))


def isolating_reclusterings(
    client_ids: Sequence[int],
    cluster_size: int,
    reclusterings: int,
    suspicion: Suspicion | None,
    rng: RngLike = None,
    *,
    min_sum_size: int | None = None,
    colluders: int = 0,
) -> list[Clustering]:
    """The R clusterings of a round that spread ``suspicion``'s suspects (R > 1: audited
    against ``colluders`` like the safe sampler's).

    R = 1: one :func:`spread_clustering`. R > 1: the safe sampler
    (:func:`~sharefl.protocol.audit.sample_safe_reclusterings`) over blocks of 2m drawn by
    :func:`spread_clustering`, so suspects are spread over the blocks, and the audited
    block splits separate a suspect from its block-mates within the round. Without
    suspects this is the safe planner with uniformly random blocks. Raises what
    :func:`spread_clustering` and the sampler raise.
    """
    gen = as_generator(rng)
    ids = sorted(int(i) for i in client_ids)
    suspects = (suspicion or Suspicion()).ranked(ids, gen)
    if reclusterings == 1:
        return [spread_clustering(ids, cluster_size, suspects, gen)]
    blocks = spread_clustering(ids, 2 * cluster_size, suspects, gen)
    return sample_safe_reclusterings(
        ids,
        cluster_size,
        reclusterings,
        gen,
        min_sum_size=min_sum_size,
        blocks=blocks,
        colluders=colluders,
    )


__all__ = [
    "Suspicion",
    "isolating_reclusterings",
    "spread_clustering",
]
