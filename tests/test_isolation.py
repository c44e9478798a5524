"""Isolating a repeat corrupter: suspicion across rounds and plans that spread suspects."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sharefl.protocol import Planner, secure_sum
from sharefl.protocol.audit import audit
from sharefl.protocol.clustering import ClusteringError, random_clustering
from sharefl.protocol.coordinator import SecureAggregationSettings, plan_round
from sharefl.protocol.isolation import Suspicion, isolating_reclusterings, spread_clustering

LENGTH = 4
BAD = np.full(LENGTH, 2**31, dtype=np.uint32)  # out of every honest range


def run_rounds(n, m, planner, seed, rounds, corrupter=None, reclusterings=1, protocol=False):
    """Rounds of secure_sum with one Suspicion; returns it and `pinned` after each round."""
    rng = np.random.default_rng(seed)
    suspicion, pins = Suspicion(), []
    for t in range(rounds):
        inputs = {cid: rng.uniform(-1, 1, LENGTH) for cid in range(n)}
        secure_sum(
            inputs,
            cluster_size=m,
            reclusterings=reclusterings,
            clip=1.0,
            planner=planner,
            seed=rng,
            round=t,
            protocol=protocol,
            byzantine_inputs=None if corrupter is None else {corrupter: BAD},
            suspicion=suspicion,
        )
        pins.append(suspicion.pinned)
    return suspicion, pins


# --- Suspicion --------------------------------------------------------------------------


def test_flagged_members_share_suspicion_and_clean_clusters_clear_it():
    s = Suspicion()
    s.observe([(0, 1, 2)], [(3, 4, 5), (6, 7, 8)])
    assert s.scores == {0: 1, 1: 1, 2: 1} and s.pinned is None  # three tie
    s.observe([(0, 3, 6)], [(1, 4, 7), (2, 5, 8)])
    assert s.scores == {0: 2, 3: 1, 6: 1}
    assert s.pinned == 0  # one flagged cluster; its member 0 alone has the top score
    s.observe([], [(0, 1, 2), (3, 4, 5), (6, 7, 8)])
    assert s.scores == {} and s.pinned is None and s.tests == 3


def test_two_flagged_clusters_or_a_tie_pin_nobody():
    s = Suspicion()
    s.observe([(0, 1, 2), (3, 4, 5)], [])
    s.observe([(0, 3, 6), (1, 4, 7)], [(2, 5, 8)])
    assert s.pinned is None  # two corrupters (or noise): the single-corrupter reading fails
    t = Suspicion()
    t.observe([(0, 1, 2)], [(3, 4, 5)])
    t.observe([(0, 1, 3)], [(2, 4, 5)])
    assert t.scores == {0: 2, 1: 2, 3: 1} and t.pinned is None


def test_suspects_are_ranked_by_score():
    s = Suspicion(scores={4: 1, 7: 3, 9: 2})
    assert s.ranked(range(10), 0) == [7, 9, 4]
    assert s.ranked([4, 9], 0) == [9, 4]


# --- spreading --------------------------------------------------------------------------


@pytest.mark.parametrize("n,m,suspects", [(30, 3, 3), (30, 3, 12), (31, 5, 6), (60, 5, 60)])
def test_spread_clustering_spreads_suspects_and_keeps_the_random_sizes(n, m, suspects):
    rng = np.random.default_rng(n * m + suspects)
    ranked = [int(i) for i in rng.permutation(n)[:suspects]]
    clustering = spread_clustering(range(n), m, ranked, rng)
    assert sorted(clustering.sizes) == sorted(random_clustering(range(n), m, 0).sizes)
    per_cluster = [len(set(c) & set(ranked)) for c in clustering.clusters]
    assert max(per_cluster) <= math.ceil(suspects / len(clustering))
    top = ranked[: len(clustering)]  # the highest-ranked suspects are all apart
    assert len({clustering.cluster_index(s) for s in top}) == len(top)


def test_spread_clustering_refuses_strangers_and_duplicates():
    with pytest.raises(ClusteringError, match="suspects"):
        spread_clustering(range(6), 3, [7])
    with pytest.raises(ClusteringError, match="suspects"):
        spread_clustering(range(6), 3, [1, 1])


def test_isolating_plans_pass_the_same_audit():
    """R > 1: the blocks are spread, the reclusterings inside them are the safe sampler's;
    plan_round audits the result like any other plan."""
    suspicion = Suspicion(scores={0: 3, 1: 2, 2: 2, 3: 1})
    settings = SecureAggregationSettings(
        cluster_size=3, reclusterings=4, planner=Planner.ISOLATE, min_sum_size=3
    )
    plan, report = plan_round(0, range(60), settings, np.random.default_rng(5), suspicion=suspicion)
    assert not report.leaks and report.complete and plan.reclusterings == 4
    assert not audit(plan.clusterings, min_sum_size=3).leaks
    # the four suspects sit in four different blocks of 2m, so no cluster holds two
    for clustering in plan.clusterings:
        assert all(len(set(c) & {0, 1, 2, 3}) <= 1 for c in clustering.clusters)
    assert isolating_reclusterings(range(12), 3, 1, None, 0)[0].num_clients == 12


# --- rounds -----------------------------------------------------------------------------


@pytest.mark.parametrize("n,m", [(30, 3), (30, 5), (60, 3), (120, 5)])
def test_the_isolating_planner_pins_a_persistent_corrupter_in_two_rounds(n, m):
    """The module's argument: round 1 flags the corrupter's cluster (m suspects, m <= n/m
    clusters), round 2 puts each suspect in its own cluster, so the one flagged cluster
    holds exactly one suspect with two flags. Fixed seeds; protocol=False runs the plan,
    the audit, the release and range checks as a real round."""
    corrupter = 7
    suspicion, pins = run_rounds(n, m, Planner.ISOLATE, seed=n + m, rounds=3, corrupter=corrupter)
    assert pins[0] is None and pins[1] == corrupter and pins[2] == corrupter
    assert suspicion.scores[corrupter] == 3


def test_the_isolating_planner_pins_through_the_protocol_with_r_above_one():
    corrupter = 11
    _, pins = run_rounds(
        30, 3, Planner.ISOLATE, seed=2, rounds=2, corrupter=corrupter, reclusterings=3,
        protocol=True,
    )  # fmt: skip
    assert pins[-1] == corrupter and all(p in (None, corrupter) for p in pins)


@pytest.mark.parametrize("planner", [Planner.ISOLATE, Planner.RANDOM])
def test_nobody_is_pinned_when_nobody_corrupts(planner):
    suspicion, pins = run_rounds(30, 3, planner, seed=3, rounds=6)
    assert pins == [None] * 6 and suspicion.scores == {} and suspicion.tests == 6


def test_two_corrupters_in_different_clusters_are_not_pinned_as_one():
    rng = np.random.default_rng(4)
    suspicion, apart = Suspicion(), 0
    for t in range(4):
        inputs = {cid: rng.uniform(-1, 1, LENGTH) for cid in range(30)}
        result = secure_sum(
            inputs,
            cluster_size=3,
            clip=1.0,
            planner=Planner.ISOLATE,
            seed=rng,
            round=t,
            protocol=False,
            byzantine_inputs={0: BAD, 1: BAD},
            suspicion=suspicion,
        )
        if len(result.reclusterings[0].corrupted) == 2:
            apart += 1
            assert suspicion.pinned is None
    assert apart >= 2  # the case was exercised (spreading keeps the two suspects apart)
