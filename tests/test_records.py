"""Plain records: every protocol message, assignment, encoding and plan round-trips (in a
four-exchange and a two-exchange cluster); malformed records are refused, records of a
sender that predates the two-exchange fields still decode; a ClientSession survives
export/import at every stage of a signed cluster (and its input can come after key setup);
the weighted multi-tensor codec. Hostile two-exchange values refused by both codecs alike:
``tests/test_wire.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sharefl.crypto.encoding import choose_encoding
from sharefl.crypto.kdf import TWO_EXCHANGE_VERSION, KeyContext
from sharefl.crypto.shamir import SHARE_BYTES
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol import records
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.bundles import dealt_bytes
from sharefl.protocol.client import ClientPolicy, ClientSession, ClientState
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import random_clustering
from sharefl.protocol.errors import StageError
from sharefl.protocol.keys import ClientKeys, KeyAdvert
from sharefl.protocol.messages import (
    ClusterAssignment,
    MaskedShares,
    UnmaskRequest,
    UnmaskResponse,
)
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, ServerSession
from sharefl.rounds.updates import UpdateError, WeightedUpdateCodec

IDS = [3, 7, 11, 2**64 - 2]


def _same(a, b) -> bool:
    """``a == b``, with a message's vector compared by value and dtype."""
    if hasattr(a, "vector"):
        rest = [f.name for f in dataclasses.fields(a) if f.name != "vector"]
        return (
            type(a) is type(b)
            and np.array_equal(a.vector, b.vector)
            and a.vector.dtype == b.vector.dtype
            and all(getattr(a, n) == getattr(b, n) for n in rest)
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


def run_two_exchange_cluster() -> set[str]:
    """A signed two-exchange cluster of 6 driven by hand, every message, key advert and the
    assignment round-tripped through its record: client 5 is gone before its masked input
    and client 11 before unmasking, so the unmask requests carry bundles and the responses
    pair shares."""
    members = (2, 5, 7, 11, 13, 17)
    identities = {c: IdentityKey.generate() for c in members}
    directory = {c: k.public for c, k in identities.items()}
    keys = {c: ClientKeys.generate(c, b"run") for c in members}
    seen: set[str] = set()

    def carry(message):
        back = records.from_record(records.to_record(message))
        assert _same(back, message), type(message).__name__
        seen.add(type(message).__name__)
        return back

    adverts = tuple(carry(keys[c].advert(identities[c])) for c in members)
    context = KeyContext(round=4, version=TWO_EXCHANGE_VERSION)
    assignment = carry(ClusterAssignment(context, members, 4, 6, 32, None, True, adverts))
    policies = {c: ClientPolicy(identity=identities[c], directory=directory) for c in members}
    inputs = {c: np.arange(6, dtype=np.uint32) * (i + 1) for i, c in enumerate(members)}
    server = ServerSession(assignment, directory)
    sessions = {
        c: ClientSession(c, assignment, inputs[c], policies[c], keys=keys[c]) for c in members
    }
    for c in members:
        if c != 5:
            server.receive(carry(sessions[c].start()))
    while outgoing := server.advance():
        for c, message in outgoing.items():
            if isinstance(message, UnmaskRequest):
                assert message.bundles, "the unmask request carries the dealt bundles"
                if c == 11:
                    continue
            reply = carry(sessions[c].handle(carry(message)))
            if isinstance(reply, UnmaskResponse):
                assert reply.pair_shares, "shares of the pair seeds with the dropped client"
            server.receive(reply)
    assert isinstance(server.outcome, ClusterSum)
    survivors = [c for c in members if c != 5]
    assert np.array_equal(server.outcome.ring_sum, sum(inputs[c] for c in survivors))
    return seen


@pytest.mark.parametrize("export_every_step", [False, True])
def test_every_message_round_trips_and_sessions_survive_export(export_every_step):
    seen, sessions = run_signed_cluster(export_every_step)
    seen |= run_two_exchange_cluster()
    assert seen == {
        cls.__name__
        for cls in (
            *records.CLIENT_MESSAGES,
            *records.SERVER_MESSAGES,
            ClusterAssignment,
            KeyAdvert,
        )
    }
    assert all(s.state is ClientState.DONE and not s.has_input for s in sessions.values())


CTX3 = KeyContext(round=4, version=TWO_EXCHANGE_VERSION)


def test_records_without_the_two_exchange_fields_decode_with_them_empty():
    """A sender that predates the two-exchange round writes no ``keys.*``, ``bundles.*``,
    ``pair_shares.*`` or ``complaints``; a four-exchange value is written that way still."""
    assignment = ClusterAssignment(KeyContext(1), (1, 2, 3), 2, 4)
    request = UnmaskRequest(KeyContext(1), (1, 2), (3,), {1: b"s" * 64})
    response = UnmaskResponse(1, KeyContext(1), {1: b"a" * SHARE_BYTES}, {}, {3: b"k" * 32})
    for value, new in (
        (assignment, "keys."),
        (request, "bundles."),
        (response, "pair_shares."),
        (response, "complaints"),
    ):
        record = records.to_record(value)
        assert not any(k.startswith(new) for k in record)
        assert records.from_record(record) == value


@pytest.mark.parametrize(
    ("value", "present", "match"),
    [
        (
            UnmaskResponse(1, CTX3, {}, {}, pair_shares={(2, 3): b"a" * SHARE_BYTES}),
            "pair_shares.dealers",
            "pair_shares.dealers",
        ),
        (
            UnmaskRequest(CTX3, (1,), (), bundles={2: b"x" * dealt_bytes(1)}),
            "bundles.values",
            "bundles.values",
        ),
        (
            ClusterAssignment(CTX3, (1, 2), 2, 4, keys=(KeyAdvert(1, b"", b"e" * 32, b"m" * 32),)),
            "keys.mask_public",
            "keys.mask_public",
        ),
    ],
)
def test_a_two_exchange_field_half_present_is_refused(value, present, match):
    """Absent means empty; one list of a field without the others is malformed."""
    record = records.to_record(value)
    record.pop(present)
    with pytest.raises(records.RecordError, match=match):
        records.from_record(record)


def _masked_shares(peers=(2, 3)) -> MaskedShares:
    size = dealt_bytes(len(peers))
    return MaskedShares(
        1,
        CTX3,
        np.arange(4, dtype=np.uint32),
        b"c" * 32,
        {p: b"p" * 32 for p in peers},
        {p: bytes([p]) * size for p in peers},
    )


def _duplicate(*keys):
    """Repeat the first entry of each of the parallel lists ``keys``."""

    def mutate(record):
        for key in keys:
            record[key] = [*record[key], record[key][0]]

    return mutate


@pytest.mark.parametrize(
    ("value", "mutate", "match"),
    [
        (_masked_shares(), _duplicate("bundles.peers", "bundles.values"), "duplicate"),
        (
            _masked_shares(),
            _duplicate("pair_commitments.peers", "pair_commitments.values"),
            "duplicate",
        ),
        (_masked_shares(), lambda r: r.pop("seed_commitment"), "lacks 'seed_commitment'"),
        (_masked_shares(), lambda r: r["bundles.values"].pop(), "2 peers but 1 values"),
        (
            _masked_shares(),
            lambda r: r.update({"bundles.values": [b"x"] * 2}),
            f"must be {dealt_bytes(2)} bytes",
        ),
        (
            UnmaskRequest(CTX3, (1,), (), bundles={2: b"x" * dealt_bytes(3)}),
            _duplicate("bundles.peers", "bundles.values"),
            "duplicate",
        ),
        (
            UnmaskResponse(1, CTX3, {}, {}, pair_shares={(2, 3): b"a" * SHARE_BYTES}),
            _duplicate("pair_shares.dealers", "pair_shares.peers", "pair_shares.values"),
            "duplicate pair",
        ),
        (
            UnmaskResponse(1, CTX3, {}, {}, pair_shares={(2, 3): b"a" * SHARE_BYTES}),
            lambda r: r["pair_shares.peers"].append(4),
            "differ in length",
        ),
        (
            ClusterAssignment(CTX3, (1, 2), 2, 4, keys=(KeyAdvert(1, b"", b"e" * 32, b"m" * 32),)),
            lambda r: r.update({"keys.scope": [5]}),
            "must be bytes",
        ),
        (KeyAdvert(1, b"s", b"e" * 32, b"m" * 32), lambda r: r.update(sender=-1), "outside"),
    ],
)
def test_malformed_two_exchange_records_are_refused(value, mutate, match):
    record = records.to_record(value)
    mutate(record)
    with pytest.raises(records.RecordError, match=match):
        records.from_record(record, type(value))


def test_a_key_advert_is_not_a_round_message():
    """A client sends its key advert once, outside any cluster's round: a server that reads
    round messages (``CLIENT_MESSAGES``) refuses it, one that asks for it by name reads it."""
    advert = ClientKeys.generate(3, b"scope").advert()
    record = records.to_record(advert)
    with pytest.raises(records.RecordError, match="expected"):
        records.from_record(record, records.CLIENT_MESSAGES)
    assert records.from_record(record, KeyAdvert) == advert


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
