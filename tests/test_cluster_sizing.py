"""How many clusters a random clustering's Byzantine clients spoil (sizing m and the rule's
f): the exact distribution against brute force over every Byzantine set, and against the
clusterings `random_clustering` really draws."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.protocol.clustering import (
    ClusteringError,
    clusters_to_tolerate,
    random_clustering,
    spoiled_clusters,
    tolerance_warning,
)


@settings(max_examples=examples(60), deadline=None)
@given(
    clients=st.integers(1, 11),
    byzantine=st.integers(0, 11),
    cluster_size=st.integers(1, 6),
)
def test_the_distribution_is_the_count_over_every_byzantine_set(clients, byzantine, cluster_size):
    """Oracle: every Byzantine set of that size is equally likely for a uniform shuffle, so
    P(j spoiled) is the share of the C(n, b) sets that touch exactly j clusters of a fixed
    clustering with the drawn sizes."""
    byzantine = min(byzantine, clients)
    clustering = random_clustering(range(clients), cluster_size, rng=0)
    counts = [0] * (len(clustering.clusters) + 1)
    for bad in combinations(range(clients), byzantine):
        counts[sum(any(c in bad for c in cl) for cl in clustering.clusters)] += 1
    total = sum(counts)
    assert spoiled_clusters(clients, byzantine, cluster_size) == [
        Fraction(c, total) for c in counts
    ]


def test_the_clusterings_random_clustering_draws_follow_it():
    """20 clients, 4 Byzantine, m = 3 (the main job): 4,000 drawn clusterings' spoiled
    counts match the exact distribution (each probability within 4 standard errors)."""
    exact = [float(p) for p in spoiled_clusters(20, 4, 3)]
    rng = np.random.default_rng(1)
    seen = np.zeros(len(exact))
    draws = 4000
    for _ in range(draws):
        clustering = random_clustering(range(20), 3, rng=rng)
        seen[sum(any(c < 4 for c in cl) for cl in clustering.clusters)] += 1
    for p, n in zip(exact, seen, strict=True):
        assert abs(n / draws - p) <= 4 * np.sqrt(p * (1 - p) / draws) + 1e-9


def test_the_f_to_tolerate_is_the_confidence_quantile():
    """20 clients, 4 Byzantine, clusters of 3 (6 clusters): 3 spoiled is the likeliest
    count (0.5375), 4 the 99 % quantile; none spoiled without Byzantine clients."""
    dist = spoiled_clusters(20, 4, 3)
    assert sum(dist) == 1 and max(range(len(dist)), key=dist.__getitem__) == 3
    assert round(float(dist[3]), 4) == 0.5375
    assert clusters_to_tolerate(20, 4, 3, confidence=0.99) == 4
    assert clusters_to_tolerate(20, 4, 3, confidence=0.5) == 3
    assert clusters_to_tolerate(20, 0, 3) == 0
    with pytest.raises(ClusteringError, match="byzantine <= clients"):
        spoiled_clusters(3, 4, 2)
    with pytest.raises(ClusteringError, match="confidence"):
        clusters_to_tolerate(10, 2, 3, confidence=0)


def test_the_start_up_warning_says_when_the_rule_cannot_hold():
    """10 clients, 2 Byzantine, clusters of 3: 3 clusters, at most 1 spoiled only with
    probability 0.27 (the exact distribution), so Median(f=1) draws a warning naming the
    figures; 60 clients with 1 Byzantine and f = 1 hold always and draw none."""
    text = tolerance_warning(10, 2, 3, tolerated=1)
    dist = spoiled_clusters(10, 2, 3)
    assert text is not None
    assert f"{float(1 - dist[0] - dist[1]):.2f}" in text
    assert "3 clusters" in text and "f >= 2" in text
    assert tolerance_warning(60, 1, 3, tolerated=1) is None
    assert tolerance_warning(60, 0, 3, tolerated=0) is None
    assert tolerance_warning(20, 4, 3, tolerated=4) is None  # f at 99 % is 4 (table above)
    assert tolerance_warning(20, 4, 3, tolerated=3) is not None
