"""The bounds on the plan a client audits: participants, reclusterings and the audit's work.

A plan is the first thing a client takes from an untrusted server, and its exact audit is
the client's costliest check (about k³ for k clients linked by shared sums). The cheap
bounds (participants, R, the client's own cluster sizes) are checked before the audit, and
the audit itself runs within ``ClientPolicy.max_audit_work``.
"""

from __future__ import annotations

import numpy as np
import pytest

from sharefl.deploy import wire
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol import client_round
from sharefl.protocol.audit import AuditBudgetExceeded, audit, sample_safe_reclusterings
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering, random_clustering
from sharefl.protocol.errors import ClusterTooSmall, ConfigurationError, PlanRefused
from sharefl.protocol.plan import RoundPlan


def random_plan(n: int, reclusterings: int, seed: int = 0, m: int = 3) -> RoundPlan:
    """R independent random partitions: one component linking every client (the costly
    shape for the exact audit)."""
    rng = np.random.default_rng(seed)
    return RoundPlan(7, tuple(random_clustering(range(n), m, rng) for _ in range(reclusterings)))


@pytest.fixture
def no_audit(monkeypatch):
    """Make any audit fail the test: the cheap bounds must refuse before it."""
    client_round._plan_audit.cache_clear()

    def forbidden(*args, **kwargs):
        raise AssertionError("the plan was audited before the cheap checks refused it")

    monkeypatch.setattr(client_round, "audit", forbidden)
    yield
    client_round._plan_audit.cache_clear()


def test_the_policy_bounds_are_validated():
    for bad in ({"max_participants": 0}, {"max_audit_work": 0}, {"audit_search_budget": 0}):
        with pytest.raises(ConfigurationError, match="must be >= 1"):
            ClientPolicy(**bad)
    assert ClientPolicy(max_audit_work=None).max_audit_work is None


def test_too_many_participants_is_refused_before_the_audit(no_audit):
    plan = RoundPlan(0, (Clustering(tuple((i, i + 1, i + 2) for i in range(0, 30, 3))),))
    with pytest.raises(PlanRefused, match=r"30 participants.*at most 29.*smaller"):
        ClientRound(0, plan, ClientPolicy(max_participants=29))


def test_too_many_reclusterings_and_a_small_own_cluster_are_refused_before_the_audit(no_audit):
    plan = random_plan(30, 3)
    with pytest.raises(PlanRefused, match=r"3 reclusterings.*at most 2.*fewer"):
        ClientRound(0, plan, ClientPolicy(max_reclusterings=2))
    small = RoundPlan(0, (Clustering(((0, 1), (2, 3, 4))),))
    with pytest.raises(ClusterTooSmall, match="cluster of 2"):
        ClientRound(0, small)


def test_the_audit_spends_exactly_what_it_reports():
    """The work count is a hard bound: a budget of exactly the reported work passes with
    the same verdict, one unit less raises, whatever the plan shape."""
    for plan in (random_plan(60, 3), random_plan(40, 10, seed=1)):
        report = audit(plan.clusterings, min_sum_size=3)
        assert report.work > 0
        again = audit(plan.clusterings, min_sum_size=3, work_budget=report.work)
        assert again == report
        with pytest.raises(AuditBudgetExceeded, match=str(report.work - 1)):
            audit(plan.clusterings, min_sum_size=3, work_budget=report.work - 1)


def test_an_audit_beyond_the_work_budget_is_refused_with_what_to_change():
    plan = random_plan(120, 3)
    client_round._plan_audit.cache_clear()
    with pytest.raises(PlanRefused, match=r"budget of 10000 operations.*safe planner"):
        ClientRound(0, plan, ClientPolicy(max_audit_work=10_000))
    ClientRound(0, plan, ClientPolicy(max_audit_work=None))  # 120 clients, rank 118: no leak


def test_the_default_policy_accepts_a_large_safe_plan_and_refuses_a_linked_one_quickly():
    """The safe planner's plans (small blocks) fit the default work budget easily; one
    component of 600 clients linked by near 600 independent sums (5-10 s to audit exactly
    on a 2-core VM) is refused once the budget is spent."""
    ids = list(range(1000))
    safe = RoundPlan(0, tuple(sample_safe_reclusterings(ids, 3, 10, 0, min_sum_size=3)))
    client_round._plan_audit.cache_clear()
    ClientRound(0, safe)
    report = audit(safe.clusterings, min_sum_size=3)
    assert report.work < ClientPolicy().max_audit_work // 10
    linked = random_plan(600, 3)
    with pytest.raises(PlanRefused, match="budget"):
        ClientRound(0, linked)
    # quickly = within the default budget's work (the audit stops there: it spends exactly
    # what it reports, test_the_audit_spends_exactly_what_it_reports), not a clock
    with pytest.raises(AuditBudgetExceeded):
        audit(linked.clusterings, min_sum_size=3, work_budget=ClientPolicy().max_audit_work)


def test_plan_from_proto_refuses_what_the_policy_would_before_building_it():
    plan = pb.RoundPlan(clusterings=[pb.Clustering(clusters=[pb.Cluster(members=range(12))])] * 3)
    assert wire.plan_from_proto(0, plan).reclusterings == 3
    with pytest.raises(wire.WireError, match=r"12 participants.*at most 11"):
        wire.plan_from_proto(0, plan, max_participants=11)
    with pytest.raises(wire.WireError, match="at most 2"):
        wire.plan_from_proto(0, plan, max_reclusterings=2)
    policy = ClientPolicy()
    built = wire.plan_from_proto(
        0,
        plan,
        max_reclusterings=policy.max_reclusterings,
        max_participants=policy.max_participants,
    )
    assert built.participants == tuple(range(12))
