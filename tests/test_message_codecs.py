"""Both codecs refuse exactly what the messages refuse: a random, often hostile, value of
every protocol message (ids out of range or twice, bytes of the wrong length, maps and
lists over their caps, ring widths, thresholds, lengths, vectors of other dtypes or
shapes, contexts with a bad plan digest) is built without its constructor's check
(``tests/unchecked.py``), written raw into protobuf (``sharefl.deploy.wire``) and into a
record (``sharefl.protocol.records``), and read back by each. Both refuse it — with their
own error — exactly when the message's constructor refuses it, and both read an accepted
one as the same message."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from unchecked import unchecked

from sharefl.crypto.kdf import TWO_EXCHANGE_VERSION, KeyContext
from sharefl.crypto.shamir import SHARE_BYTES
from sharefl.deploy import wire
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol import messages as m
from sharefl.protocol import records
from sharefl.protocol.bundles import SEALED_BYTES, dealt_bytes
from sharefl.protocol.errors import MalformedMessage
from sharefl.protocol.fields import MAX_DEALT_PEERS, MAX_IDS, MAX_PAIR_SHARES
from sharefl.protocol.keys import KeyAdvert

REFUSED = "refused"

# ---- values, hostile now and then ---------------------------------------------------------


def rarely(common: st.SearchStrategy, rare: st.SearchStrategy, odds: int = 16) -> st.SearchStrategy:
    """``common``, and one time in ``odds`` ``rare``."""
    return st.integers(1, odds).flatmap(lambda k: rare if k == odds else common)


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """A field's value: one time in 6 a hostile one (a message has several fields, and
    some are to pass)."""
    return rarely(valid, hostile, 6)


CONTEXTS = mostly(
    st.sampled_from([KeyContext(3, 1, 2), KeyContext(3, 1, 2, TWO_EXCHANGE_VERSION, b"d" * 32)]),
    st.just(unchecked(KeyContext, 3, 1, 2, TWO_EXCHANGE_VERSION, b"d" * 31)),  # bad digest
)
IDS = mostly(st.integers(0, 9), st.sampled_from([2**64 - 1, -1, 2**64]))
ID_TUPLES = rarely(  # over the cap one time in 16: costly to convert
    mostly(
        st.lists(st.integers(0, 9), max_size=5, unique=True).map(tuple),
        st.one_of(
            st.lists(st.integers(0, 9), min_size=2, max_size=5).map(tuple),  # repeated ids
            st.lists(IDS, max_size=3).map(tuple),
        ),
    ),
    st.just(tuple(range(MAX_IDS + 1))),
)


def blobs(*sizes: int) -> st.SearchStrategy[bytes]:
    """Bytes of one of ``sizes``; now and then one byte off, or empty."""
    off = sorted({n + d for n in sizes for d in (-1, 1) if n + d >= 0} | {0} - set(sizes))
    return mostly(st.sampled_from(sizes), st.sampled_from(off)).map(lambda n: b"\x07" * n)


def peer_maps(values: st.SearchStrategy[bytes], cap: int = MAX_IDS) -> st.SearchStrategy:
    """``{client id: bytes}``, now and then one entry over ``cap``."""
    return rarely(
        st.dictionaries(IDS, values, max_size=4),
        values.map(lambda v: dict.fromkeys(range(cap + 1), v)),
    )


VECTORS = mostly(
    st.sampled_from(
        [np.arange(5, dtype=np.uint32), np.arange(3, dtype=np.uint64), np.zeros(0, np.uint32)]
    ),
    st.sampled_from(
        [
            np.arange(5, dtype=np.float32),
            np.arange(4, dtype=np.uint32).reshape(2, 2),  # not 1-D
            np.arange(5, dtype=np.int64),
        ]
    ),
)
SIGNATURES = blobs(0, 64)
KEY_ADVERTS = st.builds(
    lambda *fields: unchecked(KeyAdvert, *fields),
    IDS,
    mostly(st.sampled_from([0, 5, 64]), st.just(65)).map(lambda n: b"s" * n),
    blobs(32),
    blobs(32),
    SIGNATURES,
)
ADVERTS = st.builds(
    lambda *fields: unchecked(m.AdvertiseKeys, *fields),
    IDS,
    CONTEXTS,
    blobs(32),
    blobs(32),
    blobs(32),
    SIGNATURES,
)
GRAPHS = st.one_of(
    st.none(),
    st.just({}),
    st.dictionaries(IDS, st.frozensets(IDS, max_size=3), max_size=3),
)


@st.composite
def masked_shares(draw: st.DrawFn) -> m.MaskedShares:
    commitments = draw(peer_maps(blobs(32), MAX_DEALT_PEERS))
    fitting = dealt_bytes(len(commitments))
    bundles = peer_maps(st.sampled_from([fitting, fitting + 1, dealt_bytes(1), 0]), 3)
    if len(commitments) <= MAX_DEALT_PEERS:
        bundles = st.one_of(
            st.builds(dict.fromkeys, st.just(tuple(commitments)), st.just(b"b" * fitting)),
            bundles.map(lambda sizes: {p: b"b" * n for p, n in sizes.items()}),
        )
    else:
        bundles = st.just({})
    return unchecked(
        m.MaskedShares,
        draw(IDS),
        draw(CONTEXTS),
        draw(VECTORS),
        draw(blobs(32)),
        commitments,
        draw(bundles),
    )


DEALT_SIZES = (dealt_bytes(1), dealt_bytes(3), dealt_bytes(MAX_DEALT_PEERS))
DEALT = mostly(
    st.sampled_from(DEALT_SIZES),
    st.sampled_from([dealt_bytes(MAX_DEALT_PEERS + 1), dealt_bytes(0), dealt_bytes(2) + 1, 0]),
).map(lambda n: b"x" * n)
PAIR_SHARES = rarely(
    st.dictionaries(st.tuples(IDS, IDS), blobs(SHARE_BYTES), max_size=4),  # (v, v) now and then
    st.just({(i, i + 1): b"a" * SHARE_BYTES for i in range(MAX_PAIR_SHARES + 1)}),
)

MESSAGES = st.one_of(
    KEY_ADVERTS,
    ADVERTS,
    st.builds(
        lambda *f: unchecked(m.ClusterAssignment, *f),
        CONTEXTS,
        ID_TUPLES,
        mostly(st.sampled_from([0, 2, MAX_IDS]), st.sampled_from([MAX_IDS + 1, 2**32])),
        mostly(st.sampled_from([0, 5, 2**48]), st.sampled_from([2**48 + 1, 2**64])),
        mostly(st.sampled_from([32, 64]), st.sampled_from([0, 16, 33, 2**32])),
        GRAPHS,
        st.booleans(),
        st.lists(KEY_ADVERTS, max_size=3).map(tuple),
    ),
    st.builds(
        lambda *f: unchecked(m.KeysBroadcast, *f),
        CONTEXTS,
        st.lists(ADVERTS, max_size=3).map(tuple),
    ),
    st.builds(
        lambda *f: unchecked(m.EncryptedShares, *f), IDS, CONTEXTS, peer_maps(blobs(SEALED_BYTES))
    ),
    st.builds(
        lambda *f: unchecked(m.MaskingRequest, *f),
        CONTEXTS,
        IDS,
        ID_TUPLES,
        peer_maps(blobs(SEALED_BYTES)),
    ),
    st.builds(lambda *f: unchecked(m.MaskedInput, *f), IDS, CONTEXTS, VECTORS, ID_TUPLES),
    masked_shares(),
    st.builds(lambda *f: unchecked(m.ConsistencyRequest, *f), CONTEXTS, ID_TUPLES),
    st.builds(lambda *f: unchecked(m.ConsistencySignature, *f), IDS, CONTEXTS, blobs(64)),
    st.builds(
        lambda *f: unchecked(m.UnmaskRequest, *f),
        CONTEXTS,
        ID_TUPLES,
        ID_TUPLES,
        peer_maps(blobs(64)),
        peer_maps(DEALT, MAX_DEALT_PEERS),
    ),
    st.builds(
        lambda *f: unchecked(m.UnmaskResponse, *f),
        IDS,
        CONTEXTS,
        peer_maps(blobs(SHARE_BYTES)),
        peer_maps(blobs(SHARE_BYTES)),
        peer_maps(blobs(32)),
        PAIR_SHARES,
        ID_TUPLES,
    ),
)

# ---- through each codec -------------------------------------------------------------------

_PLAIN = {  # message class -> (to protobuf, from protobuf)
    KeyAdvert: (wire.key_advert_to_proto, wire.key_advert_from_proto),
    m.AdvertiseKeys: (wire.advert_to_proto, wire.advert_from_proto),
    m.KeysBroadcast: (wire.keys_to_proto, wire.keys_from_proto),
    m.EncryptedShares: (wire.shares_to_proto, wire.shares_from_proto),
    m.MaskingRequest: (wire.masking_to_proto, wire.masking_from_proto),
    m.ConsistencyRequest: (wire.consistency_request_to_proto, wire.consistency_request_from_proto),
    m.ConsistencySignature: (wire.signature_to_proto, wire.signature_from_proto),
    m.UnmaskRequest: (wire.unmask_request_to_proto, wire.unmask_request_from_proto),
    m.UnmaskResponse: (wire.unmask_response_to_proto, wire.unmask_response_from_proto),
}


def _vector_through_wire(vector: np.ndarray) -> np.ndarray:
    header = wire.vector_header(vector)
    assembler = wire.VectorAssembler(
        pb.VectorHeader.FromString(header.SerializeToString()), len(vector), vector.dtype
    )
    for frame in wire.chunk_frames(pb.ClientMessage, vector):
        assembler.add(pb.ClientMessage.FromString(frame).chunk)
    return assembler.result()


def through_wire(value):
    """``value`` written into protobuf, serialized, parsed and read; :data:`REFUSED` when
    protobuf cannot hold a field (an id outside uint64, a vector it cannot send) or the
    reader raises :class:`wire.WireError`."""
    cls = type(value)
    try:  # the sender's side: what protobuf can carry at all
        if cls is m.ClusterAssignment:
            proto = wire.assignment_to_proto(value, None)
        elif cls is m.MaskedInput:
            proto = wire.masked_to_proto(value)
        elif cls is m.MaskedShares:
            proto = wire.masked_shares_to_proto(value)
        else:
            proto = _PLAIN[cls][0](value)
        data = proto.SerializeToString()
    except (ValueError, TypeError):  # protobuf's range checks, WireError of a vector
        return REFUSED
    received = type(proto).FromString(data)
    try:
        if cls is m.ClusterAssignment:
            return wire.assignment_from_proto(received)[0]
        if cls is m.MaskedInput:
            return wire.masked_from_parts(received, _vector_through_wire(value.vector))
        if cls is m.MaskedShares:
            complete = wire.masked_shares_check(received)  # before the vector comes
            return complete(_vector_through_wire(value.vector))
        return _PLAIN[cls][1](received)
    except wire.WireError:
        return REFUSED


def through_records(value):
    """``value`` written into its record and read; :data:`REFUSED` on a
    :class:`records.RecordError`."""
    try:
        return records.from_record(records.to_record(value), type(value))
    except records.RecordError:
        return REFUSED


def checked(value):
    """``value`` built by its constructors (nested adverts and the context included), in
    the form both codecs give it (members sorted, an empty neighbour graph as none), or
    :data:`REFUSED` when a constructor refuses it."""
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    try:
        if isinstance(value, m.ClusterAssignment):
            fields["members"] = tuple(sorted(value.members))
            fields["neighbours"] = value.neighbours or None
        for name, item in fields.items():
            if isinstance(item, KeyContext):
                fields[name] = KeyContext(**dataclasses.asdict(item))
            if isinstance(item, tuple) and item and dataclasses.is_dataclass(item[0]):
                fields[name] = tuple(checked_or_raise(a) for a in item)
        return type(value)(**fields)
    except (MalformedMessage, ValueError):  # ValueError: the context's own check
        return REFUSED


def checked_or_raise(value):
    result = checked(value)
    if result is REFUSED:
        raise MalformedMessage("a nested value is refused")
    return result


def same(a, b) -> bool:
    if a is REFUSED or b is REFUSED:
        return a is b
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if not (x.dtype == y.dtype and np.array_equal(x, y)):
                return False
        elif x != y:
            return False
    return True


@settings(max_examples=examples(100), deadline=None)
@given(value=MESSAGES)
def test_both_codecs_refuse_exactly_what_the_messages_refuse(value):
    expected = checked(value)
    by_wire, by_records = through_wire(value), through_records(value)
    assert (by_wire is REFUSED) == (by_records is REFUSED), (by_wire, by_records)
    assert (by_wire is REFUSED) == (expected is REFUSED), (by_wire, expected)
    assert same(by_wire, by_records) and same(by_wire, expected)


@pytest.mark.parametrize(
    "value",
    [
        unchecked(m.ConsistencySignature, 1, KeyContext(1), b"s" * 63),
        unchecked(m.MaskedInput, 1, KeyContext(1), np.zeros(3, np.float32), ()),
    ],
    ids=["short signature", "float vector"],
)
def test_each_codec_names_the_field_the_message_refused(value):
    """The refusal says which field and what it must be, through either codec."""
    with pytest.raises(MalformedMessage) as direct:
        dataclasses.replace(value)  # the constructor, on the same fields
    with pytest.raises(wire.WireError) as by_wire:
        if isinstance(value, m.MaskedInput):
            wire.masked_from_parts(wire.masked_to_proto(value), value.vector)
        else:
            wire.signature_from_proto(wire.signature_to_proto(value))
    with pytest.raises(records.RecordError) as by_records:
        records.from_record(records.to_record(value))
    field = f"{type(value).__name__}.{'vector' if hasattr(value, 'vector') else 'signature'}"
    for error in (direct.value, by_wire.value, by_records.value):
        assert field in str(error) and "must be" in str(error)
