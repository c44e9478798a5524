"""ClientPolicy and ClientRound: what a client refuses when the server plays against it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sharefl.crypto.kdf import KeyContext
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.audit import audit
from sharefl.protocol.client import (
    ClientPolicy,
    ClientSession,
    ClientState,
    default_colluders,
    threshold_floor,
)
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import (
    BadAdvertisement,
    ClusterTooSmall,
    ConfigurationError,
    InconsistentRequest,
    MalformedMessage,
    OffPlan,
    PlanRefused,
    ReclusteringReused,
    ReleaseLeaks,
    ThresholdTooLow,
)
from sharefl.protocol.messages import ClusterAssignment, KeysBroadcast, UnmaskRequest
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, ServerSession

LENGTH = 9


def plan_of(*clusterings, round_index: int = 4) -> RoundPlan:
    return RoundPlan(round_index, tuple(Clustering(c) for c in clusterings))


# Two reclusterings of 0..5 whose sums leak nothing smaller than 3 clients (checked below).
SAFE = plan_of([(0, 1, 2), (3, 4, 5)], [(0, 3, 4), (1, 2, 5)])


def assignment_for(plan: RoundPlan, r: int, k: int, **change) -> ClusterAssignment:
    members = plan.members(r, k)
    base = ClusterAssignment(plan.context(r, k), members, len(members) // 2 + 1, LENGTH)
    return dataclasses.replace(base, **change)


def vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, LENGTH, dtype=np.uint32)


# --- the threshold rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "holders,colluders,floor",
    [(2, 0, 2), (3, 0, 2), (4, 0, 3), (4, 1, 3), (5, 1, 4), (6, 1, 4), (7, 2, 5), (10, 3, 7)],
)
def test_threshold_floor_values(holders, colluders, floor):
    assert threshold_floor(holders, colluders) == floor


def test_threshold_floor_resists_split_views_of_the_colluders():
    """Two disjoint groups of honest holders, each with t − c signatures, cannot exist."""
    for holders in range(2, 40):
        for colluders in range(holders):
            t = threshold_floor(holders, colluders)
            assert t >= 2 and t > colluders
            assert 2 * (t - colluders) > holders - colluders
            if t - 1 >= max(2, colluders + 1):  # one less would allow a split
                assert 2 * (t - 1 - colluders) <= holders - colluders


def test_signed_mode_defaults_to_a_third_colluding():
    assert [default_colluders(h, True) for h in (2, 3, 4, 6, 7, 9, 10)] == [0, 0, 1, 1, 2, 2, 3]
    assert default_colluders(10, False) == 0


@pytest.mark.parametrize("signed,size", [(False, 5), (True, 5), (True, 7), (True, 12)])
def test_the_server_side_threshold_is_the_clients_floor(signed, size):
    """plan_assignment and the client apply one rule: its default is accepted, one less
    is refused."""
    members = tuple(range(size))
    keys = {i: IdentityKey.generate() for i in members}
    policy = ClientPolicy(identity=keys[0], directory={i: k.public for i, k in keys.items()})
    a = plan_assignment(KeyContext(round=1), members, length=LENGTH, bits=32, signed=signed)
    assert a.threshold == ClientPolicy().floor(size, signed)
    ClientSession(0, a, vector(0), policy)
    with pytest.raises(ThresholdTooLow, match=f"t >= {a.threshold}"):
        ClientSession(0, dataclasses.replace(a, threshold=a.threshold - 1), vector(0), policy)
    with pytest.raises(ConfigurationError, match="clients accept"):
        plan_assignment(
            KeyContext(round=1), members, length=LENGTH, bits=32, signed=signed, threshold=2
        )


def test_old_default_threshold_is_refused_against_two_colluders():
    """Seven holders, t = 4 (a bare majority): two colluders plus two disjoint honest
    pairs could sign two different survivor lists. Signed mode asks for t >= 5."""
    a = ClusterAssignment(KeyContext(round=1), tuple(range(7)), 4, LENGTH, signed=True)
    keys = {i: IdentityKey.generate() for i in range(7)}
    policy = ClientPolicy(identity=keys[0], directory={i: k.public for i, k in keys.items()})
    with pytest.raises(ThresholdTooLow, match="2 colluders"):
        ClientSession(0, a, vector(0), policy)


def test_policy_rejects_nonsense():
    with pytest.raises(ConfigurationError):
        ClientPolicy(colluders=-1)
    with pytest.raises(ConfigurationError):
        ClientPolicy(min_cluster_size=1)
    assert ClientPolicy().sum_floor == 3 and ClientPolicy(min_sum_size=5).sum_floor == 5


# --- the plan ----------------------------------------------------------------------------


def test_the_safe_plan_is_safe():
    report = audit(SAFE.clusterings, min_sum_size=3)
    assert not report.leaks and report.complete
    for cid in range(6):
        ClientRound(cid, SAFE)


def test_plan_without_the_client_or_with_too_many_reclusterings_is_refused():
    with pytest.raises(PlanRefused, match="not in the round plan"):
        ClientRound(9, SAFE)
    many = plan_of(*[[(0, 1, 2, 3, 4, 5)]] * 11)
    with pytest.raises(PlanRefused, match="11 reclusterings"):
        ClientRound(0, many)
    ClientRound(0, many, ClientPolicy(max_reclusterings=11))


def test_plan_with_a_small_cluster_for_this_client_is_refused():
    with pytest.raises(ClusterTooSmall, match="cluster of 2"):
        ClientRound(0, plan_of([(0, 1), (2, 3, 4)]))


def test_plan_whose_sums_subtract_to_one_client_is_refused():
    """{0,1,2} and {0,1,2,3} in two reclusterings give x_3 away; every client refuses."""
    plan = plan_of([(0, 1, 2), (3, 4, 5, 6)], [(0, 1, 2, 3), (4, 5, 6)])
    for cid in range(7):
        with pytest.raises(PlanRefused, match=r"clients \[3\]"):
            ClientRound(cid, plan)


def test_plan_with_a_small_recoverable_sum_elsewhere_is_refused():
    plan = plan_of([(0, 1, 2, 3, 4, 5)], [(0, 1, 2, 3), (4, 5)])
    with pytest.raises(PlanRefused, match="fewer than 3"):
        ClientRound(0, plan)


def test_an_audit_that_runs_out_of_budget_is_a_refusal():
    with pytest.raises(PlanRefused, match="budget"):
        ClientRound(0, SAFE, ClientPolicy(min_sum_size=6, audit_search_budget=1))


# --- assignments -------------------------------------------------------------------------


def test_an_honest_assignment_is_accepted_once_per_reclustering():
    guard = ClientRound(1, SAFE)
    session = guard.session(assignment_for(SAFE, 0, 0), vector(1))
    assert session.state is ClientState.NEW
    with pytest.raises(ReclusteringReused, match="reclustering 0"):
        guard.vet(assignment_for(SAFE, 0, 0))
    guard.vet(assignment_for(SAFE, 1, 1))  # client 1's cluster of reclustering 1


@pytest.mark.parametrize(
    "change,error,match",
    [
        (dict(context=KeyContext(round=4, reclustering=0, cluster=0)), OffPlan, "plan"),
        (dict(context=dataclasses.replace(SAFE.context(0, 0), round=5)), OffPlan, "round 5"),
        (dict(context=SAFE.context(2, 0)), OffPlan, "not in the plan"),
        (dict(context=SAFE.context(0, 7)), OffPlan, "not in the plan"),
        (dict(members=(1, 2)), OffPlan, "differ"),
        (dict(members=(0, 1, 2, 5)), OffPlan, "differ"),
        (dict(context=SAFE.context(0, 1), members=(3, 4, 5)), OffPlan, "not a member"),
    ],
)
def test_assignments_off_the_plan_are_refused(change, error, match):
    guard = ClientRound(1, SAFE)
    with pytest.raises(error, match=match):
        guard.vet(assignment_for(SAFE, 0, 0, **change))
    guard.vet(assignment_for(SAFE, 0, 0))  # a refusal records nothing


def test_the_same_clients_in_two_clusters_of_one_round_are_refused():
    """{0,1,2} then {1,2}: as a second cluster of reclustering 0, or claimed as a cluster of
    reclustering 1 that the plan does not have."""
    guard = ClientRound(1, SAFE)
    guard.vet(assignment_for(SAFE, 0, 0))
    with pytest.raises(ReclusteringReused):
        guard.vet(assignment_for(SAFE, 0, 1, members=(1, 2)))
    with pytest.raises(OffPlan, match="differ"):
        guard.vet(assignment_for(SAFE, 1, 1, members=(1, 2)))


def test_degree_one_graphs_and_malformed_graphs_are_refused():
    plan = plan_of([(0, 1, 2, 3, 4, 5)])
    matching = {0: {1}, 1: {0}, 2: {3}, 3: {2}, 4: {5}, 5: {4}}
    graph = {m: frozenset(p) for m, p in matching.items()}
    with pytest.raises(ClusterTooSmall, match="at least 2"):
        ClientRound(0, plan).vet(assignment_for(plan, 0, 0, neighbours=graph, threshold=2))
    # Only client 5 is starved (degree 1): client 0, with degree 2, refuses too.
    ring = {0: {1, 4}, 1: {0, 2}, 2: {1, 3}, 3: {2, 4}, 4: {3, 0}, 5: set()}
    starved = {m: frozenset(p) for m, p in ring.items()} | {5: frozenset({0})}
    with pytest.raises(InconsistentRequest, match="symmetric"):
        ClientRound(0, plan).vet(assignment_for(plan, 0, 0, neighbours=starved, threshold=2))
    lonely = {m: frozenset(p) for m, p in ring.items()}
    with pytest.raises(ClusterTooSmall, match=r"members \[5\]"):
        ClientRound(0, plan).vet(assignment_for(plan, 0, 0, neighbours=lonely, threshold=2))
    outside = dict(graph) | {0: frozenset({1, 9})}
    with pytest.raises(InconsistentRequest, match="non-members"):
        ClientRound(0, plan).vet(assignment_for(plan, 0, 0, neighbours=outside, threshold=2))


def test_downgrade_to_unsigned_is_refused():
    guard = ClientRound(1, SAFE, ClientPolicy(require_signed=True))
    with pytest.raises(InconsistentRequest, match="signed = true"):
        guard.vet(assignment_for(SAFE, 0, 0, signed=False))


def test_a_threshold_below_the_signed_floor_is_refused_and_frees_the_reclustering():
    keys = {i: IdentityKey.generate() for i in range(6)}
    policy = ClientPolicy(
        identity=keys[0], directory={i: k.public for i, k in keys.items()}, require_signed=True
    )
    plan = plan_of([(0, 1, 2, 3, 4, 5)])
    guard = ClientRound(0, plan, policy)
    with pytest.raises(ThresholdTooLow, match="1 colluders"):
        guard.session(assignment_for(plan, 0, 0, signed=True, threshold=3), vector(0))
    guard.session(assignment_for(plan, 0, 0, signed=True, threshold=4), vector(0))


# --- releases: the client's own view of the round ----------------------------------------


class Round:
    """Every client of SAFE behind its ClientRound, an honest ServerSession per cluster."""

    def __init__(self, plan: RoundPlan = SAFE, policy: ClientPolicy | None = None):
        self.plan = plan
        policy = dataclasses.replace(policy or ClientPolicy(), verify_releases=True)
        self.guards = {c: ClientRound(c, plan, policy) for c in plan.participants}
        self.vectors = {c: vector(c) for c in plan.participants}

    def run(self, r: int, k: int, *, skip_mask=(), tamper=None):
        """Run one cluster; ``skip_mask`` clients vanish before masking; returns the outcome
        and the refusals of the unmask stage by client."""
        a = assignment_for(self.plan, r, k)
        server = ServerSession(a)
        sessions = {c: self.guards[c].session(a, self.vectors[c]) for c in a.members}
        for session in sessions.values():
            server.receive(session.advertise())
        refusals = {}
        out = server.advance()
        while out:
            for cid, message in out.items():
                if cid in skip_mask and not isinstance(message, KeysBroadcast):
                    continue
                if isinstance(message, UnmaskRequest) and tamper is not None:
                    message = tamper(message)
                try:
                    server.receive(self.guards[cid].handle(sessions[cid], message))
                except ReleaseLeaks as exc:
                    refusals[cid] = exc
            out = server.advance()
        return server.outcome, refusals, sessions


def test_honest_round_releases_every_cluster():
    rnd = Round()
    for r in range(2):
        for k in range(2):
            outcome, refusals, _ = rnd.run(r, k)
            assert refusals == {} and isinstance(outcome, ClusterSum)
            expected = sum(rnd.vectors[c] for c in SAFE.members(r, k))
            np.testing.assert_array_equal(outcome.sum, expected)


def test_a_claimed_dropout_that_subtracts_to_one_client_is_refused():
    """{0,1,2} in reclustering 0, then {1,2,5} with 5 'dropped': x_0 would follow."""
    rnd = Round(policy=ClientPolicy(min_sum_size=2))  # sums of 2 alone are allowed here
    outcome, refusals, _ = rnd.run(0, 0)
    assert isinstance(outcome, ClusterSum) and refusals == {}
    outcome, refusals, sessions = rnd.run(1, 1, skip_mask=(5,))
    assert set(refusals) == {1, 2} and not isinstance(outcome, ClusterSum)
    assert "clients [0, 5]" in str(refusals[1])  # x_0 from the two sums, then x_5
    assert sessions[1].state is ClientState.ABORTED


def test_a_release_of_fewer_than_the_minimum_is_refused():
    rnd = Round()
    outcome, refusals, _ = rnd.run(1, 1, skip_mask=(5,))  # {1, 2}: a sum of two
    assert set(refusals) == {1, 2} and "fewer than 3" in str(refusals[1])
    assert not isinstance(outcome, ClusterSum)


def test_a_dropout_that_leaks_nothing_is_answered():
    rnd = Round(plan_of([(0, 1, 2, 3, 4, 5)]))
    outcome, refusals, _ = rnd.run(0, 0, skip_mask=(5,))
    assert refusals == {} and isinstance(outcome, ClusterSum)
    assert outcome.members == (0, 1, 2, 3, 4)


def test_a_dropout_is_refused_when_a_planned_sum_would_complete_it():
    """The same six clients in both reclusterings: releasing {0..4} in reclustering 0 while
    the plan still lets the server release all six in reclustering 1 would give x_5. The
    client cannot know the later release will not happen, so it refuses now."""
    rnd = Round(plan_of([(0, 1, 2, 3, 4, 5)], [(0, 1, 2, 3, 4, 5)]))
    outcome, refusals, _ = rnd.run(0, 0, skip_mask=(5,))
    assert set(refusals) == {0, 1, 2, 3, 4} and "clients [5]" in str(refusals[0])
    assert not isinstance(outcome, ClusterSum)


def test_an_unmask_request_naming_non_members_is_refused():
    rnd = Round()

    def stranger(message: UnmaskRequest) -> UnmaskRequest:
        return dataclasses.replace(message, survivors=(*message.survivors, 9))

    with pytest.raises(InconsistentRequest, match="non-members"):
        rnd.run(0, 0, tamper=stranger)


# --- relayed keys ------------------------------------------------------------------------

LOW_ORDER = bytes(32)  # the X25519 point 0: every shared secret with it is zero


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("mask_public", LOW_ORDER, "unusable X25519"),
        ("encryption_public", LOW_ORDER, "unusable X25519"),
        ("encryption_public", (1).to_bytes(32, "little"), "unusable X25519"),
    ],
)
def test_low_order_relayed_keys_are_a_bad_advertisement(field, value, match):
    a = ClusterAssignment(KeyContext(round=1), (0, 1, 2), 2, LENGTH)
    sessions = {c: ClientSession(c, a, vector(c)) for c in a.members}
    adverts = [s.advertise() for s in sessions.values()]
    adverts[1] = dataclasses.replace(adverts[1], **{field: value})
    with pytest.raises(BadAdvertisement, match=match):
        sessions[0].handle(KeysBroadcast(a.context, tuple(adverts)))
    assert sessions[0].state is ClientState.ABORTED


@pytest.mark.parametrize(
    "field,value",
    [
        ("mask_public", b"k" * 31),
        ("commitment", b"c" * 70_000),
        ("signature", b"s" * 63),
        ("signature", b"s" * 65),
    ],
)
def test_relayed_keys_of_the_wrong_sizes_do_not_exist(field, value):
    """The sizes are the advertisement's own: no broadcast can carry such an advert (a
    codec refuses its bytes as malformed, in process the constructor refuses it)."""
    a = ClusterAssignment(KeyContext(round=1), (0, 1, 2), 2, LENGTH)
    advert = ClientSession(1, a, vector(1)).advertise()
    with pytest.raises(MalformedMessage, match=f"AdvertiseKeys.{field} must be"):
        dataclasses.replace(advert, **{field: value})


def test_oversized_signature_in_signed_mode_is_a_bad_advertisement():
    keys = {i: IdentityKey.generate() for i in range(3)}
    directory = {i: k.public for i, k in keys.items()}
    a = ClusterAssignment(KeyContext(round=1), (0, 1, 2), 2, LENGTH, signed=True)
    sessions = {
        c: ClientSession(c, a, vector(c), ClientPolicy(identity=keys[c], directory=directory))
        for c in a.members
    }
    adverts = [s.advertise() for s in sessions.values()]
    adverts[2] = dataclasses.replace(adverts[2], signature=adverts[2].signature[:32] * 2)
    with pytest.raises(BadAdvertisement, match="not signed"):
        sessions[0].handle(KeysBroadcast(a.context, tuple(adverts)))
