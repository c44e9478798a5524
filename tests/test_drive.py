"""The one drive loop (`sharefl.protocol.drive`): what the server sends when, for any
transport — the order of the batches, a transport that answers nobody, and replies that a
transport delivers partly."""

from __future__ import annotations

import numpy as np
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol import (
    ClientPolicy,
    ClientSession,
    Clustering,
    RoundCoordinator,
    SecureAggregationSettings,
)
from sharefl.protocol.drive import server_exchanges
from sharefl.protocol.messages import (
    ClusterAssignment,
    ConsistencyRequest,
    KeysBroadcast,
    MaskingRequest,
    UnmaskRequest,
)

LENGTH = 4
PLAN = [Clustering(((0, 1, 2), (3, 4, 5))), Clustering(((0, 3, 4), (1, 2, 5)))]


IDENTITIES = {cid: IdentityKey.generate() for cid in range(6)}
DIRECTORY = {cid: key.public for cid, key in IDENTITIES.items()}


def _coordinator(signed: bool = False) -> RoundCoordinator:
    return RoundCoordinator(
        SecureAggregationSettings(
            cluster_size=3, reclusterings=2, allow_leakage=True, signed=signed
        ),
        round=0,
        participants=range(6),
        length=LENGTH,
        rng=np.random.default_rng(0),
        clusterings=PLAN,
        directory=DIRECTORY if signed else None,
    )


def _play(rc: RoundCoordinator, answering=lambda index, cid: True) -> list[tuple[int, str]]:
    """Drive ``rc`` with clients in this process; ``answering(batch, cid)`` says whether
    ``cid``'s reply to the ``batch``-th batch is delivered. Returns (reclustering, kind)
    per batch."""
    inputs = {cid: np.full(LENGTH, cid + 1, dtype=np.uint32) for cid in range(6)}
    sessions: dict[int, ClientSession] = {}
    seen = []
    for batch, outgoing in enumerate(server_exchanges(rc)):
        kinds = {type(m).__name__ for m in outgoing.messages.values()}
        assert len(kinds) <= 1, kinds  # one stage per batch
        seen.append((outgoing.reclustering, kinds.pop() if kinds else ""))
        for cid, message in outgoing.messages.items():
            if outgoing.opening:
                assert isinstance(message, ClusterAssignment)
                policy = ClientPolicy(identity=IDENTITIES[cid], directory=DIRECTORY)
                sessions[cid] = ClientSession(cid, message, inputs[cid], policy)
                reply = sessions[cid].advertise()
            else:
                reply = sessions[cid].handle(message)
            if answering(batch, cid):
                rc.receive(cid, reply)
    return seen


def test_batches_come_per_reclustering_assignments_first_then_each_stage():
    rc = _coordinator()
    seen = _play(rc)
    stages = [
        ClusterAssignment.__name__,
        KeysBroadcast.__name__,
        MaskingRequest.__name__,
        UnmaskRequest.__name__,
    ]
    assert seen == [(0, s) for s in stages] + [(1, s) for s in stages]
    result = rc.result()
    assert [len(r.clusters) for r in result.reclusterings] == [2, 2]
    assert sorted(int(c.ring_sum[0]) for c in result.reclusterings[0].clusters) == [6, 15]


def test_signed_rounds_add_the_consistency_stage():
    rc = _coordinator(signed=True)
    assert [kind for _, kind in _play(rc)][:5] == [
        ClusterAssignment.__name__,
        KeysBroadcast.__name__,
        MaskingRequest.__name__,
        ConsistencyRequest.__name__,
        UnmaskRequest.__name__,
    ]
    assert [len(r.clusters) for r in rc.result().reclusterings] == [2, 2]


def test_a_transport_that_delivers_nothing_still_ends_with_every_cluster_failed():
    rc = _coordinator()
    seen = _play(rc, answering=lambda batch, cid: False)
    assert seen == [(0, ClusterAssignment.__name__), (1, ClusterAssignment.__name__)]
    result = rc.result()
    assert all(not r.clusters and len(r.failed) == 2 for r in result.reclusterings)


@settings(max_examples=examples(60))
@given(silent=st.sets(st.tuples(st.integers(0, 9), st.integers(0, 5)), max_size=12))
def test_any_pattern_of_missing_replies_ends_and_releases_only_complete_clusters(silent):
    """Whatever replies a transport fails to deliver, the loop ends; a released sum is
    the sum of exactly its cluster's inputs (no survivor's input lost, none added)."""
    rc = _coordinator()
    _play(rc, answering=lambda batch, cid: (batch, cid) not in silent)
    for reclustering in rc.result().reclusterings:
        for cluster in reclustering.clusters:
            expected = sum(cid + 1 for cid in cluster.members)
            assert int(cluster.ring_sum[0]) == expected
