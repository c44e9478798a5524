"""What a release reveals on a sparse neighbour graph, and what colluders add to the audit.

- :func:`~sharefl.protocol.audit.revealed_sums`: unmasking survivors S reveals the sum of
  each connected component of the graph induced on S; clients refuse a disconnected graph,
  the coordinator never draws one, and both release checks (client and server) audit the
  component sums.
- ``audit(colluders=c)``: an update that follows from the sums and c colluders' inputs is a
  leak; checked against a brute-force rational rank test on random small systems.
"""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import numpy as np
import pytest

from sharefl.crypto.kdf import KeyContext
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.audit import (
    audit,
    audit_rows,
    revealed_sums,
    sample_safe_reclusterings,
)
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.client_round import ClientRound, plan_colluders
from sharefl.protocol.clustering import Clustering, random_clustering
from sharefl.protocol.coordinator import (
    Planner,
    ReleaseAuditor,
    SecureAggregationSettings,
    plan_round,
)
from sharefl.protocol.errors import ConfigurationError, InconsistentRequest, PlanRefused
from sharefl.protocol.messages import ClusterAssignment
from sharefl.protocol.plan import RoundPlan

CYCLE = {u: frozenset({(u - 1) % 6, (u + 1) % 6}) for u in range(6)}


def test_revealed_sums_are_the_components_induced_on_the_survivors():
    assert revealed_sums(range(6), CYCLE) == [frozenset(range(6))]
    assert revealed_sums({0, 1, 3, 4}, CYCLE) == [frozenset({0, 1}), frozenset({3, 4})]
    assert revealed_sums({0, 1, 3, 4}, None) == [frozenset({0, 1, 3, 4})]
    assert revealed_sums({0, 2, 4}, CYCLE) == [frozenset({0}), frozenset({2}), frozenset({4})]
    assert revealed_sums((), CYCLE) == [] and revealed_sums((), None) == []


def test_the_server_withholds_a_release_whose_components_are_small():
    plan = RoundPlan(0, (Clustering((tuple(range(6)),)),))
    auditor = ReleaseAuditor(plan, 3, plan_is_safe=True)
    assert auditor.check((0, 1, 3, 4), (0, 0), CYCLE) is not None  # {0, 1} and {3, 4}
    assert auditor.check((0, 1, 3, 4), (0, 0)) is None  # complete graph: one sum of four
    assert auditor.approved == [frozenset({0, 1, 3, 4})]


def test_the_server_records_each_component_sum():
    plan = RoundPlan(0, (Clustering((tuple(range(8)),)),))
    auditor = ReleaseAuditor(plan, 3, plan_is_safe=True)
    cycle8 = {u: frozenset({(u - 1) % 8, (u + 1) % 8}) for u in range(8)}
    assert auditor.check((0, 1, 2, 4, 5, 6), (0, 0), cycle8) is None
    assert auditor.approved == [frozenset({0, 1, 2}), frozenset({4, 5, 6})]


def test_clients_refuse_a_disconnected_graph():
    plan = RoundPlan(0, (Clustering((tuple(range(6)),)),))
    triangles = {
        u: frozenset({3 * (u // 3) + (u + 1) % 3, 3 * (u // 3) + (u + 2) % 3}) for u in range(6)
    }
    assignment = ClusterAssignment(plan.context(0, 0), tuple(range(6)), 2, 4, 32, triangles)
    with pytest.raises(InconsistentRequest, match="connected graph"):
        ClientRound(0, plan).vet(assignment)
    ClientRound(0, plan).vet(
        ClusterAssignment(plan.context(0, 0), tuple(range(6)), 2, 4, 32, CYCLE)
    )


def test_the_coordinator_draws_connected_graphs_only():
    context = KeyContext(0, 0, 0)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = plan_assignment(
            context, tuple(range(6)), length=4, bits=32, neighbour_degree=2, rng=rng
        )
        assert len(revealed_sums(a.members, a.neighbours)) == 1
    with pytest.raises(ConfigurationError, match="connected"):
        plan_assignment(context, tuple(range(6)), length=4, bits=32, neighbour_degree=1, rng=rng)


# --- colluders ----------------------------------------------------------------------------


def _rank(rows: list[list[int]]) -> int:
    m = [[Fraction(x) for x in row] for row in rows]
    rank, width = 0, len(m[0]) if m else 0
    for col in range(width):
        pivot = next((i for i in range(rank, len(m)) if m[i][col]), None)
        if pivot is None:
            continue
        m[rank], m[pivot] = m[pivot], m[rank]
        for i in range(len(m)):
            if i != rank and m[i][col]:
                f = m[i][col] / m[rank][col]
                m[i] = [a - f * b for a, b in zip(m[i], m[rank], strict=True)]
        rank += 1
    return rank


def _brute_force_leak(rows: list[frozenset[int]], colluders: int) -> bool:
    """Some x_i follows from the sums and the inputs of <= colluders others (rank test)."""
    ids = sorted(set().union(*rows))
    unit = {i: [1 if j == i else 0 for j in ids] for i in ids}
    sums = [[1 if j in row else 0 for j in ids] for row in rows]
    for i in ids:
        others = [j for j in ids if j != i]
        for given in itertools.combinations(others, min(colluders, len(others))):
            known = sums + [unit[j] for j in given]
            if _rank(known) == _rank([*known, unit[i]]):
                return True
    return False


def test_the_colluder_audit_agrees_with_brute_force():
    rng = random.Random(7)
    checked = {1: 0, 2: 0, 3: 0}
    for _ in range(250):
        n = rng.randint(3, 9)
        rows = [
            frozenset(rng.sample(range(n), rng.randint(2, n))) for _ in range(rng.randint(1, 5))
        ]
        c = rng.randint(1, 3)
        report = audit_rows(rows, 2, colluders=c)
        assert report.complete
        found = bool(report.recoverable_clients or report.colluder_leaks)
        assert found == _brute_force_leak(rows, c), (rows, c, report)
        checked[c] += found
    assert all(checked.values())  # each c found some leaks (the test can fail both ways)


def test_a_colluder_and_two_reclusterings():
    plan = [Clustering(((0, 3, 4), (1, 2, 5))), Clustering(((0, 1, 2), (3, 4, 5)))]
    assert not audit(plan, min_sum_size=3).leaks
    report = audit(plan, min_sum_size=3, colluders=1)
    assert report.leaks and (0, 5) in report.colluder_leaks
    one = [Clustering(((0, 1, 2, 3), (4, 5, 6, 7)))]
    assert not audit(one, min_sum_size=3, colluders=2).leaks
    assert audit(one, min_sum_size=3, colluders=3).leaks  # 3 of a sum of 4 give the fourth


def test_a_large_component_the_colluder_search_cannot_decide_is_incomplete():
    rng = np.random.default_rng(3)
    for _ in range(20):
        plan = [random_clustering(range(40), 8, rng) for _ in range(2)]
        report = audit(plan, min_sum_size=3, colluders=2)
        if not report.colluder_leaks and not report.recoverable_clients:
            assert not report.complete and not report.colluder_search_complete
            return
    pytest.fail("every draw leaked: no undecided component to look at")


def test_the_safe_sampler_resists_its_colluders():
    for seed in range(3):
        plan = sample_safe_reclusterings(range(30), 3, 4, seed, min_sum_size=3, colluders=1)
        report = audit(plan, min_sum_size=3, colluders=1)
        assert not report.leaks and report.complete


def test_clients_audit_the_plan_against_their_colluders():
    plan = RoundPlan(0, (Clustering(((0, 3, 4), (1, 2, 5))), Clustering(((0, 1, 2), (3, 4, 5)))))
    ClientRound(5, plan, ClientPolicy(colluders=0))
    with pytest.raises(PlanRefused, match="colluder"):
        ClientRound(5, plan, ClientPolicy(colluders=1))
    # The default: the rule of the threshold floor for the client's smallest cluster.
    big = RoundPlan(0, (Clustering(((0, 1, 2, 3, 4, 5, 6),)),))
    assert plan_colluders(big, 0, ClientPolicy(require_signed=True)) == 2
    assert plan_colluders(big, 0, ClientPolicy()) == 0


@pytest.mark.parametrize("signed", [False, True])
def test_the_server_plans_what_its_clients_accept(signed):
    settings = SecureAggregationSettings(
        cluster_size=4, reclusterings=3, signed=signed, planner=Planner.SAFE
    )
    plan, report = plan_round(0, range(24), settings, np.random.default_rng(1))
    assert not report.leaks and report.colluders == (1 if signed else 0)
    for client in plan.participants:
        ClientRound(client, plan, ClientPolicy(require_signed=signed))
    with pytest.raises(ConfigurationError, match="colluders"):
        SecureAggregationSettings(cluster_size=3, colluders=-1)
