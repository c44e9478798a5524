"""The round coordinator's own rules: routing by authenticated sender, late messages, the
release check (including an audit that cannot finish), and the exclusion policy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.protocol import (
    ClientSession,
    Clustering,
    ConfigurationError,
    Exclusions,
    RejectedMessage,
    RoundCoordinator,
    SecureAggregationSettings,
)
from sharefl.protocol.coordinator import ReleaseAuditor, RoundResult
from sharefl.protocol.drive import server_exchanges
from sharefl.protocol.messages import MaskedInput
from sharefl.protocol.plan import RoundPlan

LENGTH = 8
PLAN = [Clustering(((0, 1, 2), (3, 4, 5)))] * 2


def _coordinator(**settings) -> RoundCoordinator:
    return RoundCoordinator(
        SecureAggregationSettings(cluster_size=3, **settings),
        round=4,
        participants=range(6),
        length=LENGTH,
        rng=np.random.default_rng(0),
        clusterings=settings.pop("clusterings", None),
    )


def _adverts(rc: RoundCoordinator, assignments) -> dict[int, ClientSession]:
    vector = np.zeros(LENGTH, dtype=np.uint32)
    return {cid: ClientSession(cid, a, vector) for cid, a in assignments.items()}


def test_a_message_is_routed_by_the_authenticated_sender_not_the_claimed_one():
    rc = _coordinator()
    sessions = _adverts(rc, rc.open_reclustering())
    advert = sessions[1].advertise()
    with pytest.raises(RejectedMessage, match="as client 1") as err:
        rc.receive(2, advert)  # client 2's stream carries client 1's advertisement
    assert err.value.misbehaviour and "as client 1" in rc.culprits[2]
    rc.receive(1, advert)
    assert 1 not in rc.waiting_for()


def test_a_late_message_is_rejected_without_naming_its_sender():
    rc = RoundCoordinator(
        SecureAggregationSettings(cluster_size=3, reclusterings=2, allow_leakage=True),
        round=0,
        participants=range(6),
        length=LENGTH,
        rng=np.random.default_rng(1),
        clusterings=PLAN,
    )
    sessions = _adverts(rc, rc.open_reclustering())
    late = sessions[0].advertise()
    for cid, session in sessions.items():
        if cid != 0:
            rc.receive(cid, session.advertise())
    while not rc.reclustering_done:
        rc.advance()  # nobody answers: every cluster fails
    rc.close_reclustering()
    rc.open_reclustering()
    with pytest.raises(RejectedMessage) as err:
        rc.receive(0, late)  # an advertisement of reclustering 0, now in reclustering 1
    assert not err.value.misbehaviour and rc.culprits == {}


def test_release_check_passes_planned_sums_and_withholds_a_subtracting_one():
    plan = RoundPlan(0, tuple(PLAN))
    auditor = ReleaseAuditor(plan, 2, plan_is_safe=True)
    assert auditor.check((0, 1, 2)) is None and auditor.check((3, 4, 5)) is None
    reason = auditor.check((1, 2))  # (0, 1, 2) − (1, 2) = x_0
    assert reason is not None and "updates of [0]" in reason
    assert auditor.approved == [frozenset({0, 1, 2}), frozenset({3, 4, 5})]


def test_a_planned_sum_after_an_unplanned_one_is_audited_with_it():
    """Invariant of ReleaseAuditor: the plan's audit covers a planned sum only while every
    approved sum is planned. A drop-out sum (0, 1, 2) of the planned cluster (0, 1, 2, 3) is
    safe alone; the planned cluster after it would reveal x_3, so it is withheld."""
    plan = RoundPlan(0, (Clustering(((0, 1, 2, 3), (4, 5, 6, 7))),))
    auditor = ReleaseAuditor(plan, 3, plan_is_safe=True)
    assert auditor.check((0, 1, 2)) is None
    reason = auditor.check((0, 1, 2, 3))
    assert reason is not None and "updates of [3]" in reason
    assert auditor.check((4, 5, 6, 7)) is None  # another component: nothing to subtract


def _recoverable(rows: list[frozenset[int]], n: int) -> list[int]:
    """Oracle: the clients whose update lies in the span of the approved sums (exact rank
    of 0/1 rows over the rationals, by numpy's SVD on matrices this small)."""
    if not rows:
        return []
    A = np.array([[1.0 if c in r else 0.0 for c in range(n)] for r in rows])
    rank = np.linalg.matrix_rank(A)
    return [c for c in range(n) if np.linalg.matrix_rank(np.vstack([A, np.eye(n)[c]])) == rank]


@settings(max_examples=examples(200))
@given(data=st.data())
def test_no_sequence_of_planned_and_drop_out_sums_reveals_an_update(data):
    """Search: a plan of clusters of 4 over 8 or 12 clients, then any sequence of release
    requests, each a planned cluster or the survivors (3 or more) of one; whatever the
    auditor approves must leave no single update in the span of the approved sums."""
    n = data.draw(st.sampled_from([8, 12]))
    order = data.draw(st.permutations(range(n)))
    clusters = [tuple(sorted(order[i : i + 4])) for i in range(0, n, 4)]
    auditor = ReleaseAuditor(RoundPlan(0, (Clustering(tuple(clusters)),)), 3, plan_is_safe=True)
    for _ in range(data.draw(st.integers(1, 6))):
        cluster = data.draw(st.sampled_from(clusters))
        members = data.draw(st.lists(st.sampled_from(cluster), min_size=3, max_size=4, unique=True))
        auditor.check(tuple(sorted(members)))
        assert _recoverable(auditor.approved, n) == [], auditor.approved


def test_an_audit_that_cannot_finish_withholds():
    plan = RoundPlan(0, (Clustering(((0, 1, 2, 3), (4, 5, 6, 7))),))
    auditor = ReleaseAuditor(plan, 3, plan_is_safe=True, search_budget=0)
    assert auditor.check((0, 1, 2, 3)) is None  # planned: covered by the plan's audit
    reason = auditor.check((0, 1, 4, 5))  # not planned: a real audit, out of budget
    assert reason is not None and "could not finish" in reason
    assert auditor.approved == [frozenset({0, 1, 2, 3})]


def test_clusters_below_the_minimum_sum_are_refused_up_front():
    with pytest.raises(ConfigurationError, match="min_sum_size"):
        SecureAggregationSettings(cluster_size=2)
    SecureAggregationSettings(cluster_size=2, min_sum_size=2)  # allowed when asked for


def test_exclusion_policy_counts_rounds_named():
    policy = Exclusions(after=2)
    policy.record({3: "bad key"})
    assert policy.excluded == frozenset() and policy.eligible([1, 3]) == [1, 3]
    policy.record({3: "bad signature", 4: "garbage"})
    assert policy.excluded == {3} and policy.reasons[3] == "bad signature"
    assert policy.eligible([1, 3, 4]) == [1, 4]
    never = Exclusions(after=0)
    never.record({3: "x"})
    assert never.excluded == frozenset()


def _play(rc: RoundCoordinator, complaints: dict[int, tuple[int, ...]]) -> RoundResult:
    """Drive ``rc``'s round with honest client sessions, except that each client of
    ``complaints`` names those peers in its masked input (a lie: their bundles decrypted)."""
    vector = np.zeros(LENGTH, dtype=np.uint32)
    sessions: dict[int, ClientSession] = {}
    for outgoing in server_exchanges(rc):
        for cid, message in outgoing.messages.items():
            if outgoing.opening:
                sessions[cid] = ClientSession(cid, message, vector)
                reply = sessions[cid].advertise()
            else:
                reply = sessions[cid].handle(message)
            if isinstance(reply, MaskedInput) and cid in complaints:
                reply = dataclasses.replace(reply, complaints=complaints[cid])
            rc.receive(cid, reply)
    return rc.result()


def test_two_liars_in_a_cluster_of_three_cannot_get_the_third_named_or_excluded():
    """Byzantine 0 and 1 both claim that honest 2's share bundles did not decrypt. 2 is
    left out of that round's sum (reported as disowned), but it is not a culprit, so the
    exclusion policy keeps it in the next round's plan."""
    policy = Exclusions(after=1)
    participants: list[int] = list(range(6))
    for round_index in range(2):
        rc = RoundCoordinator(
            SecureAggregationSettings(cluster_size=3, min_sum_size=2),
            round=round_index,
            participants=policy.eligible(participants),
            length=LENGTH,
            rng=np.random.default_rng(round_index),
            clusterings=[Clustering(((0, 1, 2), (3, 4, 5)))],
        )
        assert 2 in rc.plan.participants
        result = _play(rc, {0: (2,), 1: (2,)})
        first = {s.cluster: s for s in result.reclusterings[0].clusters}[0]
        assert first.members == (0, 1) and first.excluded == (2,)
        assert result.culprits == {}
        policy.record(result.culprits)
    assert policy.excluded == frozenset()


def test_in_signed_rounds_a_sum_its_members_would_refuse_is_withheld_not_asked():
    """The same six clients in both reclusterings; client 5 drops in reclustering 0. The
    server's exact check could release {0..4} (nothing was released before), but each member
    assumes reclustering 1's planned {0..5} may still be released in full, which would give
    x_5: members would refuse to unmask, so the coordinator withholds the sum instead."""
    plan = RoundPlan(0, (Clustering(((0, 1, 2, 3, 4, 5),)),) * 2)
    exact = ReleaseAuditor(plan, 3, plan_is_safe=True)
    assert exact.check((0, 1, 2, 3, 4), (0, 0)) is None
    views = ReleaseAuditor(plan, 3, plan_is_safe=True, client_views=True)
    reason = views.check((0, 1, 2, 3, 4), (0, 0))
    assert reason is not None and "client 0 would refuse" in reason and "[5]" in reason
    assert views.check((0, 1, 2, 3, 4, 5), (1, 0)) is None  # the planned sum is fine


def test_a_client_that_refuses_its_cluster_is_not_waited_for_and_may_not_send_after():
    """A refusal of the sender's own open cluster ends the wait for it (the stage closes
    when the others have answered, as for a drop-out); a refusal naming another context
    changes nothing; a message after the refusal is misbehaviour."""
    rc = _coordinator()
    assignments = rc.open_reclustering()
    sessions = _adverts(rc, assignments)
    own = assignments[1].context
    mates = set(assignments[1].members)
    other = next(a.context for cid, a in assignments.items() if cid not in mates)
    assert not rc.withdraw(1, other)  # not client 1's cluster
    assert not rc.withdraw(1, dataclasses.replace(own, round=own.round - 1))  # a late refusal
    assert 1 in rc.waiting_for()
    assert rc.withdraw(1, own)
    assert rc.waiting_for() == frozenset(range(6)) - {1}
    for cid in mates - {1}:
        rc.receive(cid, sessions[cid].advertise())
    # client 1's cluster is complete without it
    assert rc.waiting_for() == frozenset(range(6)) - mates
    with pytest.raises(RejectedMessage, match="refused") as err:
        rc.receive(1, sessions[1].advertise())
    assert err.value.misbehaviour and 1 in rc.culprits
    outgoing = rc.advance()
    assert 1 not in outgoing and mates - {1} <= outgoing.keys()  # client 1 counts as dropped
