"""Plain records: every protocol message, assignment, encoding and plan round-trips; malformed
records are refused; a ClientSession survives export/import at every stage of a signed
cluster (and its input can come after key setup); the weighted multi-tensor codec."""

from __future__ import annotations

import numpy as np
import pytest

from sharefl.crypto.encoding import choose_encoding
from sharefl.crypto.kdf import KeyContext
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol import records
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.client import ClientPolicy, ClientSession, ClientState
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import random_clustering
from sharefl.protocol.errors import StageError
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, ServerSession
from sharefl.protocol.updates import UpdateError, WeightedUpdateCodec

IDS = [3, 7, 11, 2**64 - 2]


def _same(a, b) -> bool:
    if hasattr(a, "vector"):
        return (
            type(a) is type(b)
            and np.array_equal(a.vector, b.vector)
            and a.vector.dtype == b.vector.dtype
            and (a.sender, a.context, a.complaints) == (b.sender, b.context, b.complaints)
        )
    return a == b


def run_signed_cluster(export_every_step: bool):
    """A signed cluster of 4 driven by hand; every message is round-tripped through its
    record, and (optionally) every client session through export/import."""
    plan = RoundPlan(5, (random_clustering(IDS, 4, np.random.default_rng(0)),))
    identities = {cid: IdentityKey.generate() for cid in IDS}
    directory = {cid: k.public for cid, k in identities.items()}
    policies = {cid: ClientPolicy(identity=identities[cid], directory=directory) for cid in IDS}
    assignment = plan_assignment(plan.context(0, 0), IDS, length=6, bits=32, signed=True)
    assert records.from_record(records.to_record(assignment)) == assignment
    server = ServerSession(assignment, directory)
    vectors = {cid: np.arange(6, dtype=np.uint32) * (i + 1) for i, cid in enumerate(IDS)}
    sessions = {cid: ClientSession(cid, assignment, None, policies[cid]) for cid in IDS}
    seen: set[str] = set()

    def carry(message):
        back = records.from_record(records.to_record(message))
        assert _same(back, message), type(message).__name__
        seen.add(type(message).__name__)
        return back

    def reload(cid):
        if export_every_step:
            state = sessions[cid].export_state()
            sessions[cid] = ClientSession.from_state(state, policies[cid])

    for cid in IDS:
        reload(cid)
        server.receive(carry(sessions[cid].advertise()))
        reload(cid)
    while True:
        outgoing = server.advance()
        if not outgoing:
            break
        for cid, message in outgoing.items():
            if type(message).__name__ == "MaskingRequest":
                sessions[cid].set_input(vectors[cid])
                reload(cid)
            reply = sessions[cid].handle(carry(message))
            reload(cid)
            server.receive(carry(reply))
    assert isinstance(server.outcome, ClusterSum)
    assert np.array_equal(server.outcome.ring_sum, sum(vectors.values()).astype(np.uint32))
    return seen, sessions


@pytest.mark.parametrize("export_every_step", [False, True])
def test_every_message_round_trips_and_sessions_survive_export(export_every_step):
    seen, sessions = run_signed_cluster(export_every_step)
    assert seen == {cls.__name__ for cls in (*records.CLIENT_MESSAGES, *records.SERVER_MESSAGES)}
    assert all(s.state is ClientState.DONE and not s.has_input for s in sessions.values())


def test_assignment_with_graph_encoding_and_plan_round_trip():
    rng = np.random.default_rng(1)
    ids = list(range(10, 22))
    assignment = plan_assignment(
        KeyContext(1, 2, 3), ids, length=9, bits=64, neighbour_degree=4, rng=rng
    )
    assert assignment.neighbours is not None
    assert records.from_record(records.to_record(assignment)) == assignment
    encoding = choose_encoding(0.5, 20, bits=64)
    assert records.from_record(records.to_record(encoding)) == encoding
    plan = RoundPlan(9, tuple(random_clustering(ids, 4, rng) for _ in range(3)))
    back = records.from_record(records.to_record(plan))
    assert back == plan and back.digest() == plan.digest()
    guard = ClientRound(ids[0], RoundPlan(9, plan.clusterings[:1]), ClientPolicy())
    again = ClientRound.from_state(guard.export_state(), ClientPolicy())
    assert again.export_state() == guard.export_state()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda r: r.pop("context"), "lacks 'context'"),
        (lambda r: r.update(type="Nope"), "unknown record type"),
        (lambda r: r.update(context=b"short"), "key context"),
        (lambda r: r.update(sender=-1), "outside"),
        (lambda r: r.update(sender=True), "must be an int"),
        (lambda r: r.update(vector=np.zeros(3, np.float32)), "uint32 or uint64"),
        (lambda r: r.update(complaints=[1, 1]), "dup"),
        (lambda r: r.update(complaints=[-1]), "client ids"),
    ],
)
def test_malformed_records_are_refused(mutate, match):
    from sharefl.protocol.messages import MaskedInput

    record = records.to_record(MaskedInput(1, KeyContext(0), np.zeros(4, np.uint32), (2,)))
    mutate(record)
    with pytest.raises(records.RecordError, match=match):
        records.from_record(record, MaskedInput)


def test_expected_type_is_enforced():
    record = records.to_record(choose_encoding(1.0, 4))
    with pytest.raises(records.RecordError, match="expected"):
        records.from_record(record, records.CLIENT_MESSAGES)


def test_masking_without_input_is_a_caller_error_that_keeps_the_session():
    plan = RoundPlan(0, (random_clustering(IDS[:3], 3, np.random.default_rng(0)),))
    assignment = plan_assignment(plan.context(0, 0), IDS[:3], length=2, bits=32)
    server = ServerSession(assignment)
    sessions = {cid: ClientSession(cid, assignment) for cid in IDS[:3]}
    for s in sessions.values():
        server.receive(s.advertise())
    for cid, message in server.advance().items():
        server.receive(sessions[cid].handle(message))
    masking = server.advance()
    cid, request = next(iter(masking.items()))
    with pytest.raises(StageError, match="set_input"):
        sessions[cid].handle(request)
    assert sessions[cid].state is ClientState.SHARED
    sessions[cid].set_input(np.ones(2, np.uint32))
    sessions[cid].handle(request)
    with pytest.raises(StageError):
        sessions[cid].set_input(np.ones(2, np.uint32))


def test_weighted_codec_gives_the_weighted_mean():
    rng = np.random.default_rng(2)
    arrays = [[rng.uniform(-1, 1, s) for s in [(2, 3), (4,)]] for _ in range(5)]
    weights = [3, 1, 7, 2, 5]
    codec = WeightedUpdateCodec.like(arrays[0], clip=1.0, max_weight=10)
    total = sum(codec.encode(a, w) for a, w in zip(arrays, weights, strict=True))
    mean, weight = codec.decode_sum(total)
    assert weight == pytest.approx(sum(weights))
    for k in range(2):
        want = sum(a[k] * w for a, w in zip(arrays, weights, strict=True)) / sum(weights)
        np.testing.assert_allclose(mean[k], want)
    with pytest.raises(UpdateError, match="max_weight"):
        codec.encode(arrays[0], 11)
    with pytest.raises(UpdateError, match="shapes"):
        codec.encode(arrays[0][:1], 1)
