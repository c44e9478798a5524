"""Tests of random clustering, neighbour graphs, the leakage audit and the safe sampler."""

from __future__ import annotations

from itertools import chain, combinations

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.protocol.audit import (
    AuditError,
    LeakageReport,
    SafeSamplingError,
    audit,
    sample_safe_reclusterings,
)
from sharefl.protocol.clustering import (
    Clustering,
    ClusteringError,
    random_clustering,
    random_reclusterings,
    random_regular_graph,
)

N, M = 60, 3
C = N // M
SEED = 2024

fast = settings(max_examples=examples(60), deadline=None)


def _flat(clustering: Clustering) -> list[int]:
    return sorted(chain.from_iterable(clustering.clusters))


# --------------------------------------------------------------------------- Clustering


def test_clustering_normalises_and_indexes() -> None:
    c = Clustering(((5, 3), (2, 9, 1), (4,)))
    assert c.clusters == ((1, 2, 9), (3, 5), (4,))
    assert c == Clustering(((4,), (3, 5), (9, 1, 2)))
    assert c.members == (1, 2, 3, 4, 5, 9)
    assert c.num_clients == 6 and len(c) == 3 and c.sizes == (3, 2, 1)
    assert c.cluster_of(9) == (1, 2, 9) and c.cluster_index(5) == 1
    assert 4 in c and 7 not in c
    with pytest.raises(KeyError):
        c.cluster_of(7)
    assert hash(c) == hash(Clustering(((1, 2, 9), (3, 5), (4,))))


@pytest.mark.parametrize("clusters", [((1, 2), (2, 3)), ((1, 1),), ((1,), ())])
def test_clustering_rejects_overlap_and_empty(clusters: tuple[tuple[int, ...], ...]) -> None:
    with pytest.raises(ClusteringError):
        Clustering(clusters)


# --------------------------------------------------------------------- random_clustering


@fast
@given(n=st.integers(1, 90), m=st.integers(1, 25), seed=st.integers(0, 2**32))
def test_random_clustering_is_a_balanced_partition(n: int, m: int, seed: int) -> None:
    ids = [7 * i + 3 for i in range(n)]
    c = random_clustering(ids, m, seed)
    assert _flat(c) == ids
    assert len(c) == max(1, n // m)
    sizes = c.sizes
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= min(m, n)
    if n >= m and n % m <= n // m:
        assert set(sizes) <= {m, m + 1}


def test_random_clustering_sizes_for_paper_setting() -> None:
    assert random_clustering(range(60), 3, 0).sizes == (3,) * 20
    assert sorted(random_clustering(range(62), 3, 0).sizes) == [3] * 18 + [4] * 2


def test_random_clustering_special_cases() -> None:
    assert random_clustering(range(5), 1, 0).clusters == tuple((i,) for i in range(5))
    assert random_clustering(range(5), 5, 0).clusters == (tuple(range(5)),)
    assert random_clustering(range(5), 9, 0).clusters == (tuple(range(5)),)  # n < m


@fast
@given(n=st.integers(1, 60), m=st.integers(1, 10), seed=st.integers(0, 2**32))
def test_random_clustering_reproducible_and_order_free(n: int, m: int, seed: int) -> None:
    ids = list(range(100, 100 + n))
    assert random_clustering(ids, m, seed) == random_clustering(ids[::-1], m, seed)
    assert random_clustering(ids, m, np.random.default_rng(seed)) == random_clustering(ids, m, seed)


def test_random_clustering_depends_on_seed() -> None:
    draws = {random_clustering(range(N), M, s) for s in range(20)}
    assert len(draws) == 20


@pytest.mark.parametrize(("ids", "m"), [(range(5), 0), (range(5), -2), ([1, 2, 2], 2), ([], 2)])
def test_random_clustering_errors(ids: list[int], m: int) -> None:
    with pytest.raises(ClusteringError):
        random_clustering(ids, m, 0)
    assert issubclass(ClusteringError, ValueError)


def test_random_reclusterings() -> None:
    plan = random_reclusterings(range(N), M, 10, SEED)
    assert len(plan) == 10 and len(set(plan)) == 10
    assert plan == random_reclusterings(range(N), M, 10, SEED)
    assert all(_flat(c) == list(range(N)) for c in plan)
    with pytest.raises(ClusteringError):
        random_reclusterings(range(N), M, 0, SEED)


# -------------------------------------------------------------------- random_regular_graph


@st.composite
def _graph_params(draw: st.DrawFn) -> tuple[int, int, int]:
    n = draw(st.integers(1, 50))
    k = draw(st.integers(0, n - 1).filter(lambda k: n * k % 2 == 0))
    return n, k, draw(st.integers(0, 2**32))


@fast
@given(_graph_params())
def test_regular_graph_is_simple_symmetric_and_regular(params: tuple[int, int, int]) -> None:
    n, k, seed = params
    ids = [3 * i + 1 for i in range(n)]
    graph = random_regular_graph(ids, k, seed)
    assert sorted(graph) == ids
    for v, nbrs in graph.items():
        assert len(nbrs) == k
        assert v not in nbrs
        assert nbrs <= set(ids)
        assert all(v in graph[u] for u in nbrs)
    assert graph == random_regular_graph(ids[::-1], k, seed)


def test_regular_graph_log_degree_is_fast_and_varies() -> None:
    graphs = [random_regular_graph(range(1000), 10, s) for s in range(3)]
    assert all(len(g[0]) == 10 for g in graphs)
    assert graphs[0] != graphs[1]


@pytest.mark.parametrize(("n", "k"), [(5, 3), (5, 5), (5, 7), (4, -1)])
def test_regular_graph_errors(n: int, k: int) -> None:
    with pytest.raises(ClusteringError):
        random_regular_graph(range(n), k, 0)


# ------------------------------------------------------------------------------ audit


def test_paper_default_r10_leaks_every_update() -> None:
    report = audit(random_reclusterings(range(N), M, 10, SEED))
    assert report.rank == N
    assert report.recoverable_clients == tuple(range(N))
    assert report.leaks and report.complete
    assert "LEAKS" in str(report)


def test_single_clustering_is_safe() -> None:
    report = audit(random_reclusterings(range(N), M, 1, SEED))
    assert report.rank == C
    assert report.recoverable_clients == ()
    assert report.recoverable_small_sums == ()
    assert report.min_sum_size == M
    assert not report.leaks and report.complete
    assert "no leak found" in report.summary()


@pytest.mark.parametrize("reclusterings", [1, 2, 3, 4, 5])
def test_rank_of_random_reclusterings(reclusterings: int) -> None:
    report = audit(random_reclusterings(range(N), M, reclusterings, SEED))
    assert report.rank == min(N, reclusterings * (C - 1) + 1)
    assert report.leaks == (report.rank == N)


@settings(max_examples=examples(15), deadline=None)
@given(reclusterings=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_rank_never_exceeds_the_bound(reclusterings: int, seed: int) -> None:
    report = audit(random_reclusterings(range(N), M, reclusterings, seed))
    assert report.rank <= min(N, reclusterings * (C - 1) + 1)


def test_pair_sum_recoverable_without_individuals() -> None:
    # a = x0+x1, b = x2+x3, c = x4+x5, d = x6+x7; (a+b) + (a+c) − (b+c) = 2a.
    plan = [
        Clustering(((0, 1, 2, 3), (4, 5, 6, 7))),
        Clustering(((0, 1, 4, 5), (2, 3, 6, 7))),
        Clustering(((0, 1, 6, 7), (2, 3, 4, 5))),
    ]
    report = audit(plan)
    assert report.min_sum_size == 4
    assert report.rank == 4
    assert report.recoverable_clients == ()
    assert report.recoverable_small_sums == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert report.leaks
    assert not audit(plan[:2]).leaks


def test_dropout_in_a_pair_reveals_the_other_member() -> None:
    plan = [Clustering(((0, 1), (2, 3)))]
    assert not audit(plan).leaks
    report = audit(plan, dropouts=[{1}])
    assert report.recoverable_clients == (0,)


def test_dropout_combined_with_full_cluster_sum_reveals_dropped_client() -> None:
    clusters = Clustering(((0, 1, 2), (3, 4, 5)))
    report = audit([clusters, clusters], dropouts=[set(), {2}])
    # the second aggregation reveals x0 + x1 (a pair), the first x0 + x1 + x2.
    assert report.recoverable_clients == (2,)
    assert report.recoverable_small_sums == ((0, 1),)
    assert report.leaks


def test_harmless_dropouts() -> None:
    plan = [Clustering(((0, 1, 2, 3), (4, 5, 6)))]
    assert not audit(plan, dropouts=[{3}]).leaks  # x0+x1+x2 has the minimum size 3
    whole = audit(plan, dropouts=[{4, 5, 6}])
    assert whole.num_equations == 1 and not whole.leaks


def test_unclustered_client_is_unknown_not_recovered() -> None:
    report = audit([Clustering(((0, 1, 2),))], client_ids=[0, 1, 2, 3])
    assert report.num_clients == 4 and report.rank == 1 and report.nullity == 3
    assert not report.leaks


def test_cluster_size_one_is_no_secure_aggregation() -> None:
    report = audit([random_clustering(range(6), 1, 0)])
    assert report.recoverable_clients == tuple(range(6))


def test_search_budget_is_reported() -> None:
    plan = random_reclusterings(range(N), M, 2, SEED)
    report = audit(plan, min_sum_size=10, search_budget=5_000)
    assert not report.complete
    assert report.searched_up_to < 9
    assert "INCOMPLETE" in str(report)


def test_difference_classes_are_informational() -> None:
    # {0,1,2} and {0,1,3} reveal x2 − x3, but no sum of fewer than 3 clients.
    plan = [Clustering(((0, 1, 2), (3, 4, 5))), Clustering(((0, 1, 3), (2, 4, 5)))]
    report = audit(plan)
    assert not report.leaks
    assert (2, 3) in report.difference_classes


def test_audit_input_errors() -> None:
    plan = [Clustering(((0, 1, 2),))]
    with pytest.raises(AuditError):
        audit(plan, client_ids=[0, 1])
    with pytest.raises(AuditError):
        audit(plan, dropouts=[{0}, {1}])
    with pytest.raises(AuditError):
        audit(plan, dropouts=[{9}])
    with pytest.raises(AuditError):
        audit(plan, min_sum_size=0)
    with pytest.raises(AuditError):
        audit([])


def _brute_force(
    ids: list[int], rows: list[set[int]], min_sum_size: int
) -> tuple[int, set[int], set[tuple[int, ...]]]:
    """Rank, recoverable clients and minimal small sums by enumerating every subset."""
    index = {c: k for k, c in enumerate(ids)}
    a = np.zeros((max(len(rows), 1), len(ids)))
    for r, row in enumerate(rows):
        a[r, [index[c] for c in row]] = 1
    rank = int(np.linalg.matrix_rank(a))

    def in_span(subset: tuple[int, ...]) -> bool:
        v = np.zeros(len(ids))
        v[[index[c] for c in subset]] = 1
        return int(np.linalg.matrix_rank(np.vstack([a, v]))) == rank

    singles = {c for c in ids if in_span((c,))}
    hidden = [c for c in ids if c not in singles]
    sums: set[tuple[int, ...]] = set()
    for size in range(2, min_sum_size):
        for subset in combinations(hidden, size):
            if in_span(subset) and not any(set(s) <= set(subset) for s in sums):
                sums.add(subset)
    return rank, singles, sums


@settings(max_examples=examples(80), deadline=None)
@given(
    n=st.integers(2, 9),
    m=st.integers(1, 5),
    reclusterings=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    drop=st.lists(st.sets(st.integers(0, 8), max_size=3), min_size=4, max_size=4),
    min_sum_size=st.none() | st.integers(1, 10),
)
def test_audit_matches_brute_force(
    n: int,
    m: int,
    reclusterings: int,
    seed: int,
    drop: list[set[int]],
    min_sum_size: int | None,
) -> None:
    ids = list(range(n))
    plan = random_reclusterings(ids, m, reclusterings, seed)
    dropouts = [{i for i in d if i < n} for d in drop[:reclusterings]]
    report = audit(plan, dropouts=dropouts, min_sum_size=min_sum_size)
    rows = [
        set(cluster) - gone
        for clustering, gone in zip(plan, dropouts, strict=True)
        for cluster in clustering.clusters
        if set(cluster) - gone
    ]
    rank, singles, sums = _brute_force(ids, rows, report.min_sum_size)
    assert report.complete
    assert report.rank == rank
    assert set(report.recoverable_clients) == singles
    assert set(report.recoverable_small_sums) == sums
    assert isinstance(report, LeakageReport)


# --------------------------------------------------------------------- safe sampling


def test_safe_sampler_paper_setting() -> None:
    plan = sample_safe_reclusterings(range(N), M, 10, SEED)
    assert len(plan) == 10
    assert all(_flat(c) == list(range(N)) and set(c.sizes) == {M} for c in plan)
    report = audit(plan)
    assert not report.leaks and report.complete
    assert report.recoverable_clients == () and report.recoverable_small_sums == ()
    assert len(set(plan)) > 1  # clusters really change between reclusterings
    assert plan == sample_safe_reclusterings(range(N), M, 10, SEED)
    # clients are only ever mixed inside fixed blocks of 2m = 6 clients
    group = {i: frozenset([i]) for i in range(N)}
    for cluster in chain.from_iterable(c.clusters for c in plan):
        merged = frozenset().union(*(group[i] for i in cluster))
        for i in merged:
            group[i] = merged
    assert max(len(g) for g in group.values()) == 2 * M
    # while unrestricted random reclustering leaks everything
    assert audit(random_reclusterings(range(N), M, 10, SEED)).rank == N


@settings(max_examples=examples(15), deadline=None)
@given(
    n=st.integers(4, 40),
    m=st.integers(2, 4),
    reclusterings=st.integers(1, 6),
    seed=st.integers(0, 2**32),
)
def test_safe_sampler_output_audits_clean(n: int, m: int, reclusterings: int, seed: int) -> None:
    plan = sample_safe_reclusterings(range(n), m, reclusterings, seed)
    assert len(plan) == reclusterings
    report = audit(plan, min_sum_size=min(m, n))
    assert not report.leaks and report.complete


def test_safe_sampler_degenerate_cases() -> None:
    plan = sample_safe_reclusterings(range(8), 10, 3, 0)  # n < m: one cluster of all
    assert plan == [Clustering((tuple(range(8)),))] * 3
    with pytest.raises(SafeSamplingError):
        sample_safe_reclusterings(range(8), 1, 2, 0)  # no secure aggregation at all
    with pytest.raises(ClusteringError):
        sample_safe_reclusterings(range(8), 3, 2, 0, block_size=2)
