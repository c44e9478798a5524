"""Wire format: generated code matches the .proto; vectors, conversions, malformed input;
the two-exchange messages round-trip and hostile ones are refused by the protobuf and the
record codec alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from needs import needs
from unchecked import unchecked

from sharefl.crypto.encoding import choose_encoding
from sharefl.crypto.kdf import TWO_EXCHANGE_VERSION, KeyContext
from sharefl.crypto.shamir import SHARE_BYTES
from sharefl.deploy import wire
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol import records
from sharefl.protocol.bundles import SEALED_BYTES, dealt_bytes
from sharefl.protocol.keys import KeyAdvert
from sharefl.protocol.messages import (
    AdvertiseKeys,
    ClusterAssignment,
    EncryptedShares,
    MaskedShares,
    MaskingRequest,
    UnmaskRequest,
    UnmaskResponse,
)

ROOT = Path(__file__).resolve().parent.parent
CTX = KeyContext(round=3, reclustering=1, cluster=2)
SEALED = b"x" * SEALED_BYTES
SHARE = b"a" * SHARE_BYTES


def test_generated_modules_match_the_proto(tmp_path):
    needs("grpc_tools")
    from sharefl.proto.generate import GENERATED, generate

    generate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / "sharefl" / "proto" / name).read_text()
        committed = (ROOT / "sharefl" / "proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run python -m sharefl.proto.generate"


@settings(max_examples=examples(25), deadline=None)
@given(
    length=st.sampled_from([0, 1, 7, wire.CHUNK_BYTES // 4, wire.CHUNK_BYTES // 4 + 1, 600_000]),
    dtype=st.sampled_from([np.float32, np.uint32, np.uint64]),
)
def test_vectors_round_trip_through_chunks(length, dtype):
    vector = np.arange(length).astype(dtype)
    header, chunks = wire.vector_to_proto(vector)
    chunks = list(chunks)
    assert all(c.ByteSize() < 2 * wire.CHUNK_BYTES for c in chunks)
    assembler = wire.VectorAssembler(header, length, dtype)
    for chunk in chunks:
        assembler.add(chunk)
    np.testing.assert_array_equal(assembler.result(), vector)


LENGTH = wire.CHUNK_BYTES // 4 + 1000  # two chunks


def _pieces(length=LENGTH):
    vector = np.arange(length, dtype=np.uint32)
    header, chunks = wire.vector_to_proto(vector)
    return header, list(chunks)


def test_chunks_out_of_order_truncated_or_extra_are_refused():
    header, chunks = _pieces()
    assert len(chunks) == 2
    with pytest.raises(wire.WireError, match="expected chunk 0"):
        wire.VectorAssembler(header, LENGTH, np.uint32).add(chunks[1])
    truncated = pb.VectorChunk(index=0, data=chunks[0].data[:-1])
    with pytest.raises(wire.WireError, match="bytes, expected"):
        wire.VectorAssembler(header, LENGTH, np.uint32).add(truncated)
    longer = pb.VectorChunk(index=1, data=chunks[1].data + b"\0")
    assembler = wire.VectorAssembler(header, LENGTH, np.uint32)
    assembler.add(chunks[0])
    with pytest.raises(wire.WireError, match="bytes, expected"):
        assembler.add(longer)
    assembler.add(chunks[1])
    with pytest.raises(wire.WireError, match="after the vector"):
        assembler.add(chunks[1])
    incomplete = wire.VectorAssembler(header, LENGTH, np.uint32)
    with pytest.raises(wire.WireError, match="incomplete"):
        incomplete.result()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(length=5), "announced"),
        (dict(dtype=pb.DTYPE_UINT64), "dtype"),
        (dict(chunks=7), "chunks announced"),
    ],
)
def test_headers_that_disagree_are_refused(change, match):
    header, _ = _pieces()
    bad = pb.VectorHeader()
    bad.CopyFrom(header)
    for key, value in change.items():
        setattr(bad, key, value)
    with pytest.raises(wire.WireError, match=match):
        wire.VectorAssembler(bad, LENGTH, np.uint32)


def test_protocol_messages_round_trip():
    advert = AdvertiseKeys(4, CTX, b"e" * 32, b"m" * 32, b"c" * 32, b"s" * 64)
    assert wire.advert_from_proto(wire.advert_to_proto(advert)) == advert
    shares = EncryptedShares(4, CTX, {1: SEALED, 9: SEALED})
    assert wire.shares_from_proto(wire.shares_to_proto(shares)) == shares
    masking = MaskingRequest(CTX, 4, (1, 4, 9), {1: SEALED})
    assert wire.masking_from_proto(wire.masking_to_proto(masking)) == masking
    unmask = UnmaskRequest(CTX, (1, 4), (9,), {1: b"s" * 64})
    assert wire.server_message_from_proto(wire.server_message_to_proto(unmask)) == unmask
    response = UnmaskResponse(4, CTX, {1: SHARE}, {9: SHARE}, {7: bytes(range(32))})
    assert wire.unmask_response_from_proto(wire.unmask_response_to_proto(response)) == response
    assignment = ClusterAssignment(
        CTX, (1, 4, 9), 2, 10, 32, {1: frozenset({4}), 4: frozenset({1})}, True
    )
    encoding = choose_encoding(1.0, 3)
    back, enc = wire.assignment_from_proto(wire.assignment_to_proto(assignment, encoding))
    assert back == assignment and enc == encoding


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a: setattr(a, "encryption_public", b"short"), "32 bytes"),
        (lambda a: setattr(a, "commitment", b""), "32 bytes"),
        (lambda a: setattr(a.context, "cluster", 2**32), None),  # proto rejects the value
    ],
)
def test_malformed_advertisements(mutate, match):
    proto = wire.advert_to_proto(AdvertiseKeys(4, CTX, b"e" * 32, b"m" * 32, b"c" * 32))
    try:
        mutate(proto)
    except ValueError:
        return  # protobuf itself refuses the out-of-range value
    with pytest.raises(wire.WireError, match=match):
        wire.advert_from_proto(proto)


def test_duplicates_and_unsafe_encodings_are_refused():
    with pytest.raises(wire.WireError, match="twice"):
        wire.shares_from_proto(
            pb.EncryptedShares(
                sender=1,
                bundles=[
                    pb.Bundle(peer=2, ciphertext=SEALED),
                    pb.Bundle(peer=2, ciphertext=SEALED),
                ],
            )
        )
    with pytest.raises(wire.WireError, match="duplicate"):
        wire.masking_from_proto(pb.MaskingRequest(survivors=[1, 1]))
    unsafe = pb.ClusterAssignment(
        bits=32, encoding=pb.Encoding(bits=32, frac_bits=40, clip=1.0, max_summands=3)
    )
    with pytest.raises(wire.WireError, match="encoding"):
        wire.assignment_from_proto(unsafe)


@pytest.mark.parametrize("length", [0, 1, 3, wire.CHUNK_BYTES // 4, wire.CHUNK_BYTES // 4 + 1])
@pytest.mark.parametrize("dtype", [np.float32, np.uint32, np.uint64])
@pytest.mark.parametrize("envelope", [pb.ServerMessage, pb.ClientMessage])
def test_chunk_frames_are_the_messages_serialized(length, dtype, envelope):
    """The hand-written frames equal protobuf's own encoding of the chunk messages (index 0
    left out, multi-byte varints), so a receiver parses them as any other message."""
    vector = np.arange(length).astype(dtype)
    frames = wire.chunk_frames(envelope, vector)
    _, chunks = wire.vector_to_proto(vector)
    messages = [envelope(chunk=c) for c in chunks]
    assert frames == [m.SerializeToString() for m in messages]
    # what a receiver counts for a chunk it read, without encoding it again
    assert [wire.serialized_size(m) for m in messages] == [m.ByteSize() for m in messages]


def test_the_stream_serializer_passes_bytes_and_serializes_messages():
    message = pb.ServerMessage(round_end=pb.RoundEnd(round=3))
    assert wire.serialize(message) == message.SerializeToString()
    assert wire.serialize(b"\x01\x02") == b"\x01\x02"
    assert wire.serialized_size(message) == message.ByteSize()
    assert wire.serialized_size(b"abc") == 3


def test_a_header_says_length_dtype_and_chunks_only():
    vector = np.array([1, 2, 3], dtype=np.uint32)
    header = wire.vector_header(vector)
    assert (header.length, header.dtype, header.chunks) == (3, pb.DTYPE_UINT32, 1)
    assert header == wire.vector_to_proto(vector)[0]
    with pytest.raises(wire.WireError, match="cannot send"):
        wire.vector_header(np.zeros((2, 2), np.float32))


# --- size limits: every field is checked before use --------------------------------------


def _advert(**change) -> pb.Advertisement:
    proto = wire.advert_to_proto(AdvertiseKeys(4, CTX, b"e" * 32, b"m" * 32, b"c" * 32, b"s" * 64))
    for key, value in change.items():
        setattr(proto, key, value)
    return proto


@pytest.mark.parametrize(
    "field,size",
    [
        ("encryption_public", 31),
        ("encryption_public", 33),
        ("mask_public", 0),
        ("mask_public", 64),
        ("commitment", 31),
        ("commitment", 33),
        ("signature", 63),
        ("signature", 65),
        ("signature", 4096),
    ],
)
def test_advertisement_fields_have_exact_sizes(field, size):
    with pytest.raises(wire.WireError, match=f"{size}"):
        wire.advert_from_proto(_advert(**{field: b"z" * size}))
    wire.advert_from_proto(_advert(signature=b""))  # unsigned mode: no signature at all


@pytest.mark.parametrize("size", [0, SEALED_BYTES - 1, SEALED_BYTES + 1, 1 << 20])
def test_share_bundles_are_exactly_sealed_bytes(size):
    bundle = [pb.Bundle(peer=2, ciphertext=b"x" * size)]
    with pytest.raises(wire.WireError, match=f"{SEALED_BYTES} bytes"):
        wire.shares_from_proto(pb.EncryptedShares(sender=1, bundles=bundle))
    with pytest.raises(wire.WireError, match=f"{SEALED_BYTES} bytes"):
        wire.masking_from_proto(pb.MaskingRequest(receiver=1, survivors=[1, 2], bundles=bundle))


@pytest.mark.parametrize("size", [0, 63, 65])
def test_signatures_are_exactly_64_bytes(size):
    with pytest.raises(wire.WireError, match="64 bytes"):
        wire.signature_from_proto(pb.ConsistencySignature(sender=1, signature=b"s" * size))
    entry = pb.SignatureEntry(signer=1, signature=b"s" * size)
    with pytest.raises(wire.WireError, match="64 bytes"):
        wire.unmask_request_from_proto(pb.UnmaskRequest(survivors=[1], signatures=[entry]))


@pytest.mark.parametrize("size", [0, SHARE_BYTES - 1, SHARE_BYTES + 1])
def test_unmask_shares_are_exactly_share_bytes(size):
    share = [pb.PeerShare(peer=2, share=b"a" * size)]
    for field in ("seed_shares", "key_shares"):
        with pytest.raises(wire.WireError, match=f"{SHARE_BYTES} bytes"):
            wire.unmask_response_from_proto(pb.UnmaskResponse(sender=1, **{field: share}))


def test_plan_digest_in_a_context_is_empty_or_32_bytes():
    with pytest.raises(wire.WireError, match="plan"):
        wire.context_from_proto(pb.Context(round=1, plan=b"d" * 31))
    assert wire.context_from_proto(pb.Context(round=1, plan=b"d" * 32)).plan == b"d" * 32


TOO_MANY = range(wire.MAX_CLUSTER_MEMBERS + 1)


@pytest.mark.parametrize(
    "convert,message",
    [
        (wire.masking_from_proto, pb.MaskingRequest(survivors=TOO_MANY)),
        (wire.consistency_request_from_proto, pb.ConsistencyRequest(survivors=TOO_MANY)),
        (wire.unmask_request_from_proto, pb.UnmaskRequest(dropped=TOO_MANY)),
        (wire.assignment_from_proto, pb.ClusterAssignment(members=TOO_MANY, bits=32)),
        (
            wire.keys_from_proto,
            pb.KeysBroadcast(advertisements=[pb.Advertisement()] * (wire.MAX_CLUSTER_MEMBERS + 1)),
        ),
        (
            wire.unmask_response_from_proto,
            pb.UnmaskResponse(seed_shares=[pb.PeerShare(peer=i) for i in TOO_MANY]),
        ),
    ],
)
def test_repeated_fields_are_capped(convert, message):
    with pytest.raises(wire.WireError, match=f"at most {wire.MAX_CLUSTER_MEMBERS}"):
        convert(message)


def test_neighbour_entries_are_bounded_by_the_membership():
    entries = [pb.Neighbours(client_id=i, peers=[0]) for i in range(4)]
    with pytest.raises(wire.WireError, match="at most 3"):
        wire.assignment_from_proto(
            pb.ClusterAssignment(members=[0, 1, 2], bits=32, neighbours=entries)
        )


def test_round_plans_are_capped_in_clusterings_and_ids():
    clustering = pb.Clustering(clusters=[pb.Cluster(members=[0, 1, 2])])
    too_long = pb.RoundPlan(clusterings=[clustering] * (wire.MAX_RECLUSTERINGS + 1))
    with pytest.raises(wire.WireError, match=f"at most {wire.MAX_RECLUSTERINGS}"):
        wire.plan_from_proto(0, too_long)
    huge = pb.RoundPlan(
        clusterings=[pb.Clustering(clusters=[pb.Cluster(members=range(wire.MAX_PLAN_IDS + 1))])]
    )
    with pytest.raises(wire.WireError, match="at most"):
        wire.plan_from_proto(0, huge)


@pytest.mark.parametrize(
    "atoms,match",
    [
        ([[0, 1, 2], [3, 4]], "partition exactly"),  # client 5 in no atom
        ([[0, 1, 2], [2, 3, 4, 5]], "more than one place"),  # overlapping atoms
        ([[0, 1, 3], [2, 4, 5]], "cuts atoms"),  # a cluster cuts an atom
        ([[0, 1, 2], [3, 4, 5, 9]], "partition exactly"),  # a client outside the round
        ([[0, 1, 2], []], "non-empty"),  # an empty atom
    ],
)
def test_a_plan_with_hostile_atoms_is_refused_as_malformed(atoms, match):
    """The atoms field of a RoundPlan is hostile input like the rest: anything but a
    partition of the participants into atoms that every cluster respects is a WireError
    (the client then refuses the round), never a crash or a silently repaired plan."""
    plan = pb.RoundPlan(
        clusterings=[
            pb.Clustering(clusters=[pb.Cluster(members=[0, 1, 2]), pb.Cluster(members=[3, 4, 5])])
        ],
        atoms=[pb.Cluster(members=a) for a in atoms],
    )
    with pytest.raises(wire.WireError, match=match):
        wire.plan_from_proto(0, plan)
    huge = pb.RoundPlan(
        clusterings=[pb.Clustering(clusters=[pb.Cluster(members=[0, 1, 2])])],
        atoms=[pb.Cluster(members=range(wire.MAX_PLAN_IDS))],
    )
    with pytest.raises(wire.WireError, match="at most"):  # counted before anything is built
        wire.plan_from_proto(0, huge)


def test_refusal_reasons_are_printable_and_capped():
    nasty = "\x1b[2Jcleared\n\x00" + "é" * 2000
    sent = wire.refusal_to_proto(CTX, nasty)
    assert len(sent.reason.encode()) <= wire.MAX_REASON_BYTES
    assert sent.reason.startswith("\\x1b[2Jcleared\\n\\x00") and sent.reason.isprintable()
    received = wire.refusal_reason(pb.Refusal(reason="ok\r\nforged log line" + "x" * 5000))
    assert received.startswith("ok\\r\\nforged log line") and received.isprintable()
    assert len(received.encode()) <= wire.MAX_REASON_BYTES
    assert wire.context_from_proto(sent.context) == CTX


def test_a_model_header_longer_than_the_bound_is_refused_before_allocation():
    header, _ = wire.vector_to_proto(np.zeros(10, dtype=np.float32))
    with pytest.raises(wire.WireError, match="at most 9"):
        wire.VectorAssembler.bounded(header, 9, np.float32)
    header.length = 2**62  # would be an exabyte buffer if trusted
    with pytest.raises(wire.WireError, match="at most"):
        wire.VectorAssembler.bounded(header, 1 << 20, np.float32)
    assert wire.VectorAssembler.bounded(
        wire.vector_to_proto(np.zeros(10, np.float32))[0], 10, np.float32
    )


# --- the two-exchange round (protocol version 5): both codecs -----------------------------

CTX3 = KeyContext(round=3, reclustering=1, cluster=2, version=TWO_EXCHANGE_VERSION)
MAX_PEERS = records.MAX_DEALT_PEERS


def _key_advert(sender=4, **change) -> KeyAdvert:
    fields = dict(
        scope=b"scope",
        encryption_public=bytes([sender]) * 32,
        mask_public=bytes([sender + 1]) * 32,
        signature=b"s" * 64,
    )
    return unchecked(KeyAdvert, sender, **{**fields, **change})


def _assignment3(keys=None, members=(1, 4, 9)) -> ClusterAssignment:
    keys = tuple(_key_advert(c) for c in members) if keys is None else keys
    return unchecked(ClusterAssignment, CTX3, members, 2, 5, 32, None, True, keys)


def _masked_shares(peers=(1, 9), commitments=None, bundles=None, seed=b"c" * 32) -> MaskedShares:
    size = dealt_bytes(len(peers))
    return unchecked(
        MaskedShares,
        4,
        CTX3,
        np.arange(5, dtype=np.uint32),
        seed,
        {p: b"p" * 32 for p in peers} if commitments is None else commitments,
        {p: bytes([p % 256]) * size for p in peers} if bundles is None else bundles,
    )


def _unmask_request3(bundles=None) -> UnmaskRequest:
    bundles = {1: b"x" * dealt_bytes(2), 9: b"y" * dealt_bytes(1)} if bundles is None else bundles
    return unchecked(UnmaskRequest, CTX3, (1, 4, 9), (7,), {1: b"s" * 64}, bundles)


def _unmask_response3(pair_shares=None, complaints=(9,)) -> UnmaskResponse:
    if pair_shares is None:
        pair_shares = {(1, 7): b"a" * SHARE_BYTES, (4, 7): b"b" * SHARE_BYTES}
    return unchecked(
        UnmaskResponse,
        4,
        CTX3,
        {1: SHARE, 4: SHARE},
        {},
        pair_shares=pair_shares,
        complaints=complaints,
    )


def _masked_shares_through_wire(x: MaskedShares) -> MaskedShares:
    envelope = pb.ClientMessage.FromString(
        pb.ClientMessage(masked_shares=wire.masked_shares_to_proto(x)).SerializeToString()
    )
    assert envelope.WhichOneof("body") == "masked_shares"
    header = envelope.masked_shares
    complete = wire.masked_shares_check(header)  # refusable before the vector is assembled
    assembler = wire.VectorAssembler(header.vector, len(x.vector), x.vector.dtype)
    for frame in wire.chunk_frames(pb.ClientMessage, x.vector):
        assembler.add(pb.ClientMessage.FromString(frame).chunk)
    return complete(assembler.result())


def through_wire(value):
    """``value`` to protobuf, to bytes and back (raises :class:`wire.WireError`)."""
    if isinstance(value, KeyAdvert):
        message = pb.ClientMessage(key_advert=wire.key_advert_to_proto(value))
        back = pb.ClientMessage.FromString(message.SerializeToString())
        return wire.key_advert_from_proto(back.key_advert)
    if isinstance(value, ClusterAssignment):
        proto = wire.assignment_to_proto(value, None)
        return wire.assignment_from_proto(
            pb.ClusterAssignment.FromString(proto.SerializeToString())
        )[0]
    if isinstance(value, MaskedShares):
        return _masked_shares_through_wire(value)
    if isinstance(value, UnmaskRequest):
        envelope = wire.server_message_to_proto(value)
        return wire.server_message_from_proto(
            pb.ServerMessage.FromString(envelope.SerializeToString())
        )
    assert isinstance(value, UnmaskResponse)
    message = pb.ClientMessage(unmask=wire.unmask_response_to_proto(value))
    back = pb.ClientMessage.FromString(message.SerializeToString())
    return wire.unmask_response_from_proto(back.unmask)


def through_records(value):
    """``value`` to its record and back (raises :class:`records.RecordError`)."""
    return records.from_record(records.to_record(value), type(value))


def _equal(a, b) -> bool:
    if isinstance(a, MaskedShares):
        return (
            np.array_equal(a.vector, b.vector)
            and a.vector.dtype == b.vector.dtype
            and (a.sender, a.context, a.seed_commitment, a.pair_commitments, a.bundles)
            == (b.sender, b.context, b.seed_commitment, b.pair_commitments, b.bundles)
        )
    return a == b


TWO_EXCHANGE_VALUES = {
    "key advert": _key_advert(),
    "unsigned key advert, empty scope": _key_advert(scope=b"", signature=b""),
    "assignment with keys": _assignment3(),
    "masked shares": _masked_shares(),
    "masked shares of a dealer without neighbours": _masked_shares(peers=()),
    "masked shares of a dealer of the most neighbours": _masked_shares(peers=range(MAX_PEERS)),
    "unmask request with bundles": _unmask_request3(),
    "unmask request with the largest bundles": _unmask_request3(
        {p: b"z" * dealt_bytes(MAX_PEERS) for p in range(MAX_PEERS)}
    ),
    "unmask response with pair shares": _unmask_response3(),
    "unmask response, only complaints": _unmask_response3({}, (1, 9)),
}


@pytest.mark.parametrize("name", sorted(TWO_EXCHANGE_VALUES))
@pytest.mark.parametrize("codec", [through_wire, through_records], ids=["wire", "records"])
def test_two_exchange_values_round_trip_through_both_codecs(name, codec):
    value = TWO_EXCHANGE_VALUES[name]
    assert _equal(codec(value), value)


@settings(max_examples=examples(25), deadline=None)
@given(
    peers=st.sets(st.integers(0, 2**64 - 1), max_size=12),
    scope=st.binary(max_size=64),
    signed=st.booleans(),
    data=st.data(),
)
def test_two_exchange_values_round_trip_for_any_ids_and_sizes(peers, scope, signed, data):
    peers = sorted(peers)
    signature = b"s" * 64 if signed else b""
    adverts = tuple(_key_advert(p % 200, scope=scope, signature=signature) for p in peers)
    adverts = tuple(
        KeyAdvert(p, a.scope, a.encryption_public, a.mask_public, a.signature)
        for p, a in zip(peers, adverts, strict=True)
    )
    degrees = data.draw(
        st.lists(st.integers(1, MAX_PEERS), min_size=len(peers), max_size=len(peers))
    )
    pairs = data.draw(
        st.sets(
            st.tuples(st.sampled_from(peers), st.sampled_from(peers)).filter(
                lambda p: p[0] != p[1]
            ),
            max_size=20,
        )
        if len(peers) > 1
        else st.just(set())
    )
    values = [
        ClusterAssignment(CTX3, tuple(peers), 1, 3, 64, None, signed, adverts),
        _masked_shares(peers=tuple(peers)),
        UnmaskRequest(
            CTX3,
            tuple(peers),
            (),
            {},
            {p: b"b" * dealt_bytes(d) for p, d in zip(peers, degrees, strict=True)},
        ),
        UnmaskResponse(
            1,
            CTX3,
            {},
            {},
            pair_shares={p: b"a" * SHARE_BYTES for p in pairs},
            complaints=tuple(peers),
        ),
    ]
    for value in values:
        assert _equal(through_wire(value), value)
        assert _equal(through_records(value), value)


def _too_many_pair_shares() -> dict[tuple[int, int], bytes]:
    n = records.MAX_PAIR_SHARES + 1
    return {(i, i + 1): SHARE for i in range(n)}


HOSTILE_VALUES = {
    # key adverts, alone and inside an assignment
    "scope over 64 bytes": _key_advert(scope=b"s" * 65),
    "short encryption key": _key_advert(encryption_public=b"e" * 31),
    "long mask key": _key_advert(mask_public=b"m" * 33),
    "short signature": _key_advert(signature=b"s" * 63),
    "long signature": _key_advert(signature=b"s" * 65),
    "assignment, an advert of a bad size": _assignment3(
        keys=(_key_advert(1), _key_advert(4, mask_public=b""), _key_advert(9))
    ),
    "assignment, two adverts of one client": _assignment3(
        keys=(_key_advert(1), _key_advert(4), _key_advert(4))
    ),
    "assignment, more adverts than members": _assignment3(
        keys=tuple(_key_advert(c) for c in (1, 4, 9, 10))
    ),
    # masked shares
    "short seed commitment": _masked_shares(seed=b"c" * 31),
    "long pair commitment": _masked_shares(commitments={1: b"p" * 33, 9: b"p" * 32}),
    "bundle one byte long": _masked_shares(
        bundles={1: b"x" * dealt_bytes(2), 9: b"x" * (dealt_bytes(2) + 1)}
    ),
    "bundles sized for another neighbour count": _masked_shares(
        bundles={1: b"x" * dealt_bytes(3), 9: b"x" * dealt_bytes(3)}
    ),
    "bundles but no commitments": _masked_shares(commitments={}, bundles={1: b"x" * SEALED_BYTES}),
    "a dealer of too many neighbours": _masked_shares(peers=range(MAX_PEERS + 1)),
    # unmask request
    "empty bundle": _unmask_request3({1: b""}),
    "bundle of no dealt size": _unmask_request3({1: b"x" * (dealt_bytes(2) + 1)}),
    "bundle of a dealer of too many neighbours": _unmask_request3(
        {1: b"x" * dealt_bytes(MAX_PEERS + 1)}
    ),
    "too many bundles": _unmask_request3({p: b"x" * dealt_bytes(1) for p in range(MAX_PEERS + 1)}),
    # unmask response
    "short pair share": _unmask_response3({(1, 7): b"a" * (SHARE_BYTES - 1)}),
    "long pair share": _unmask_response3({(1, 7): b"a" * (SHARE_BYTES + 1)}),
    "a pair of one client": _unmask_response3({(7, 7): SHARE}),
    "too many pair shares": _unmask_response3(_too_many_pair_shares()),
    "a complaint twice": _unmask_response3(complaints=(9, 9)),
    "too many complaints": _unmask_response3(complaints=tuple(range(wire.MAX_CLUSTER_MEMBERS + 1))),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_VALUES))
def test_hostile_two_exchange_values_are_refused_by_both_codecs_alike(name):
    """Each sender's codec writes what it is given; each receiver's refuses it."""
    value = HOSTILE_VALUES[name]
    with pytest.raises(wire.WireError):
        through_wire(value)
    with pytest.raises(records.RecordError):
        through_records(value)


def _repeat_first(proto_field: str, record_keys: tuple[str, ...]):
    def in_proto(message):
        entries = getattr(message, proto_field)
        entries.add().CopyFrom(entries[0])

    def in_record(record):
        for key in record_keys:
            record[key] = [*record[key], record[key][0]]

    return in_proto, in_record


DUPLICATES = {
    "masked shares, a bundle twice": (
        _masked_shares(),
        *_repeat_first("bundles", ("bundles.peers", "bundles.values")),
    ),
    "masked shares, a pair commitment twice": (
        _masked_shares(),
        *_repeat_first("pair_commitments", ("pair_commitments.peers", "pair_commitments.values")),
    ),
    "unmask request, a bundle twice": (
        _unmask_request3(),
        *_repeat_first("bundles", ("bundles.peers", "bundles.values")),
    ),
    "unmask response, a pair share twice": (
        _unmask_response3(),
        *_repeat_first(
            "pair_shares", ("pair_shares.dealers", "pair_shares.peers", "pair_shares.values")
        ),
    ),
}


def _proto_of(value):
    if isinstance(value, MaskedShares):
        return wire.masked_shares_to_proto(value)
    if isinstance(value, UnmaskRequest):
        return wire.unmask_request_to_proto(value)
    return wire.unmask_response_to_proto(value)


def _from_proto(value, proto):
    if isinstance(value, MaskedShares):
        return wire.masked_shares_check(proto)(value.vector)
    if isinstance(value, UnmaskRequest):
        return wire.unmask_request_from_proto(proto)
    return wire.unmask_response_from_proto(proto)


@pytest.mark.parametrize("name", sorted(DUPLICATES))
def test_an_entry_twice_is_refused_by_both_codecs_alike(name):
    """A map cannot hold a key twice; its encodings can, and both receivers refuse that."""
    value, in_proto, in_record = DUPLICATES[name]
    proto = _proto_of(value)
    in_proto(proto)
    with pytest.raises(wire.WireError, match="twice"):
        _from_proto(value, proto)
    record = records.to_record(value)
    in_record(record)
    with pytest.raises(records.RecordError, match="duplicate"):
        records.from_record(record, type(value))


def test_a_four_exchange_message_has_the_bytes_it_had_before():
    """The two-exchange fields are appended, empty in a four-exchange round, so they add no
    byte to its messages (``tests/vectors/wire_messages.json`` pins them all)."""
    response = UnmaskResponse(4, CTX, {1: SHARE}, {9: SHARE}, {7: bytes(range(32))})
    old = pb.UnmaskResponse(
        sender=4,
        context=wire.context_to_proto(CTX),
        seed_shares=[pb.PeerShare(peer=1, share=SHARE)],
        key_shares=[pb.PeerShare(peer=9, share=SHARE)],
        pair_seeds=[pb.PeerShare(peer=7, share=bytes(range(32)))],
    )
    new = wire.unmask_response_to_proto(response)
    assert new.SerializeToString(deterministic=True) == old.SerializeToString(deterministic=True)
    assert not new.pair_shares and not new.complaints


def test_the_round_seed_is_one_derivation_pinned_for_grpc():
    """Both transports derive the public round seed with
    :func:`~sharefl.rounds.round_seed.public_round_seed`; gRPC's bytes are pinned (a
    client and a server of different versions must agree on them)."""
    from sharefl.integrations.flower.common import arrays_digest, round_seed
    from sharefl.protocol.memory import model_digest
    from sharefl.rounds.round_seed import public_round_seed

    run, model = bytes(range(16)), np.linspace(-1, 1, 7, dtype=np.float32)
    seed = wire.round_seed(run, 3, model)
    assert seed.hex() == (
        "d05adf46a7e4af7e087d5f7d9dfca9800118986b12a3ff76"
        "b684c9a2c03064796360c32a773b3a17880c754ac88b1eb1"
    )
    assert seed != wire.round_seed(run, 4, model) != wire.round_seed(run, 3, model + 1)
    from sharefl.protocol.clustering import Clustering
    from sharefl.protocol.plan import RoundPlan

    plan = RoundPlan(3, (Clustering(((0, 1, 2), (3, 4, 5))),))
    arrays = [model[:3], model[3:]]
    flower = round_seed(plan, arrays_digest(arrays))
    assert flower == public_round_seed(plan.digest(), model_digest(model)) != seed
