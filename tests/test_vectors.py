"""Known-answer vectors (``tests/vectors/``): every byte format on the wire or under a
signature or MAC is pinned in hex, and a change to any of them fails here until the
protocol version is bumped and the vectors regenerated."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sharefl.crypto import aead, kdf, shamir, signatures
from sharefl.deploy import wire
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol import bundles, plan, records
from sharefl.protocol import messages as m
from sharefl.protocol.keys import KeyAdvert

HERE = Path(__file__).resolve().parent / "vectors"
BUMP = (
    "a wire format changed: bump sharefl.crypto.kdf.PROTOCOL_VERSION and regenerate with "
    "python tests/vectors/generate.py"
)


def _load_generator():
    spec = importlib.util.spec_from_file_location("sharefl_vectors", HERE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def check_vectors(name: str) -> None:
    """Recompute format ``name`` from its stored inputs; raise AssertionError (saying what to
    do) for any output that differs from the stored hex."""
    stored = json.loads(generate.vector_file(name).read_text())
    function, _ = generate.FORMATS[name]
    actual = function(stored["inputs"])
    differing = sorted(
        key
        for key in set(actual) | set(stored["expected"])
        if actual.get(key) != stored["expected"].get(key)
    )
    if differing or stored["protocol_version"] != kdf.PROTOCOL_VERSION:
        raise AssertionError(
            f"{BUMP} (format {name!r}: {differing or 'protocol_version'} differ; stored for "
            f"version {stored['protocol_version']}, code is {kdf.PROTOCOL_VERSION})"
        )


def test_every_format_has_a_vector_file_and_nothing_else_is_stored():
    stored = {p.stem for p in HERE.glob("*.json")}
    assert stored == set(generate.FORMATS)


@pytest.mark.parametrize("name", sorted(generate.FORMATS))
def test_the_code_reproduces_every_stored_vector(name):
    check_vectors(name)


def test_the_stored_inputs_are_the_generators():
    """The files were written by the generator as it stands (no hand-edited inputs)."""
    for name in generate.FORMATS:
        stored = json.loads(generate.vector_file(name).read_text())
        assert stored == json.loads(json.dumps(generate.compute(name))), name


def _flip_last_byte(function: Callable[..., bytes]) -> Callable[..., bytes]:
    def flipped(*args, **kwargs) -> bytes:
        data = function(*args, **kwargs)
        return data[:-1] + bytes([data[-1] ^ 1])

    return flipped


def _flip_header_chunks(function):
    def flipped(vector):
        header, chunks = function(vector)
        header.chunks ^= 1
        return header, chunks

    return flipped


MUTATIONS = [
    ("kdf", kdf.KeyContext, "kdf_info", _flip_last_byte),
    ("kdf", kdf.KeyContext, "to_bytes", _flip_last_byte),
    ("kdf", kdf, "derive_key", _flip_last_byte),
    ("aead", aead.Envelope, "associated_data", _flip_last_byte),
    ("aead", aead, "encrypt", _flip_last_byte),
    ("seed_commitment", bundles, "seed_commitment", _flip_last_byte),
    ("signed_statements", signatures, "advertised_keys_message", _flip_last_byte),
    ("signed_statements", signatures, "client_list_message", _flip_last_byte),
    ("signed_statements", signatures.IdentityKey, "sign", _flip_last_byte),
    ("hello", signatures, "stream_hello_message", _flip_last_byte),
    ("plan_digest", plan.RoundPlan, "digest", _flip_last_byte),
    ("shamir_share", shamir.Share, "to_bytes", _flip_last_byte),
    ("shamir_share", bundles.SharePair, "to_plaintext", _flip_last_byte),
    ("chunk_framing", wire, "vector_to_proto", _flip_header_chunks),
]


@pytest.mark.parametrize(
    ("name", "owner", "attribute", "mutate"),
    MUTATIONS,
    ids=[f"{name}:{attribute}" for name, _, attribute, _ in MUTATIONS],
)
def test_one_changed_byte_of_any_format_fails_with_the_bump_message(
    monkeypatch, name, owner, attribute, mutate
):
    check_vectors(name)  # passes before the change
    monkeypatch.setattr(owner, attribute, mutate(getattr(owner, attribute)))
    with pytest.raises(AssertionError, match=re.escape(BUMP)):
        check_vectors(name)


def test_a_version_bump_without_regenerating_fails(monkeypatch):
    monkeypatch.setattr(kdf, "PROTOCOL_VERSION", kdf.PROTOCOL_VERSION + 1)
    with pytest.raises(AssertionError, match=re.escape(BUMP)):
        check_vectors("hello")


# ---- the codecs: the stored bytes decode to the values they were made of ------------------


def _stored(name: str) -> dict:
    return json.loads(generate.vector_file(name).read_text())


def _record_value(hex_value: str):
    """Invert :func:`generate._value_bytes`."""
    data = bytes.fromhex(hex_value)
    tag, body = data[:1], data[1:]
    if tag == b"b":
        return bool(body[0])
    if tag == b"i":
        return int.from_bytes(body, "big")
    if tag == b"s":
        return body.decode()
    if tag == b"y":
        return body
    if tag == b"a":
        dtype, payload = body.split(b":", 1)
        return np.frombuffer(payload, dtype=np.dtype(dtype.decode())).copy()
    if tag == b"l":
        return [int.from_bytes(body[i : i + 8], "big") for i in range(0, len(body), 8)]
    assert tag == b"L", tag
    items, i = [], 0
    while i < len(body):
        size = int.from_bytes(body[i : i + 4], "big")
        items.append(body[i + 4 : i + 4 + size])
        i += 4 + size
    return items


def _same(a, b) -> bool:
    if isinstance(a, m.MaskedInput | m.MaskedShares):
        names = [n for n in a.__dataclass_fields__ if n != "vector"]
        return (
            type(a) is type(b)
            and np.array_equal(a.vector, b.vector)
            and a.vector.dtype == b.vector.dtype
            and all(getattr(a, n) == getattr(b, n) for n in names)
        )
    return a == b


def test_every_codec_value_is_pinned_in_both_formats():
    """Every message type both codecs carry has a frozen value (four-exchange values and
    the two-exchange ones, whose new fields are all filled)."""
    values = generate.codec_messages(_stored("record_codec")["inputs"])
    assert {type(v) for v in values.values()} == {
        *records.CLIENT_MESSAGES,
        *records.SERVER_MESSAGES,
        m.ClusterAssignment,
        KeyAdvert,
    }
    three = [v for v in values.values() if getattr(v, "context", None) is not None]
    assert any(v.context.version == kdf.TWO_EXCHANGE_VERSION for v in three)
    assert values["assignment_v3"].keys and values["unmask_request_v3"].bundles
    assert values["unmask_response_v3"].pair_shares and values["unmask_response_v3"].complaints


def test_the_stored_records_decode_to_their_values():
    """Read direction of the record codec: a record as a sender wrote it when the vectors
    were frozen (the four-exchange ones before the two-exchange fields existed) decodes to
    the same value."""
    stored = _stored("record_codec")
    values = generate.codec_messages(stored["inputs"])
    for label, value in values.items():
        record = {
            key.split("/", 1)[1]: _record_value(hex_value)
            for key, hex_value in stored["expected"].items()
            if key.split("/", 1)[0] == label
        }
        assert _same(records.from_record(record, type(value)), value), label


def test_the_stored_protobuf_messages_decode_to_their_values():
    """Read direction of the protobuf codec, through the stored bytes of every message."""
    stored = _stored("wire_messages")
    expected = {k: bytes.fromhex(v) for k, v in stored["expected"].items()}
    readers = {
        m.AdvertiseKeys: (pb.Advertisement, wire.advert_from_proto),
        m.KeysBroadcast: (pb.KeysBroadcast, wire.keys_from_proto),
        m.EncryptedShares: (pb.EncryptedShares, wire.shares_from_proto),
        m.MaskingRequest: (pb.MaskingRequest, wire.masking_from_proto),
        m.ConsistencyRequest: (pb.ConsistencyRequest, wire.consistency_request_from_proto),
        m.ConsistencySignature: (pb.ConsistencySignature, wire.signature_from_proto),
        m.UnmaskRequest: (pb.UnmaskRequest, wire.unmask_request_from_proto),
        m.UnmaskResponse: (pb.UnmaskResponse, wire.unmask_response_from_proto),
        KeyAdvert: (pb.KeyAdvert, wire.key_advert_from_proto),
        m.ClusterAssignment: (
            pb.ClusterAssignment,
            lambda p: wire.assignment_from_proto(p)[0],
        ),
    }
    for label, value in generate.codec_messages(stored["inputs"]).items():
        if isinstance(value, m.MaskedInput | m.MaskedShares):
            kind, finish = (
                (pb.MaskedInput, wire.masked_from_parts)
                if isinstance(value, m.MaskedInput)
                else (pb.MaskedShares, lambda p, v: wire.masked_shares_check(p)(v))
            )
            header = kind.FromString(expected[label])
            assembler = wire.VectorAssembler(header.vector, len(value.vector), value.vector.dtype)
            index = 0
            while not assembler.complete:
                assembler.add(pb.VectorChunk.FromString(expected[f"{label}/chunk_{index}"]))
                index += 1
            back = finish(header, assembler.result())
        else:
            kind, read = readers[type(value)]
            back = read(kind.FromString(expected[label]))
        assert _same(back, value), label


@pytest.mark.parametrize(
    "cls", [m.MaskedShares, KeyAdvert, m.UnmaskRequest, m.UnmaskResponse, m.ClusterAssignment]
)
def test_a_changed_record_format_fails_with_the_bump_message(monkeypatch, cls):
    """A record converter that writes one key fewer changes the frozen record vectors."""
    check_vectors("record_codec")
    write, read = records._CONVERTERS[cls]

    def fewer(value, record):
        write(value, record)
        record.pop(sorted(k for k in record if k != records.TYPE_KEY)[-1])

    monkeypatch.setitem(records._CONVERTERS, cls, (fewer, read))
    with pytest.raises(AssertionError, match=re.escape(BUMP)):
        check_vectors("record_codec")


@pytest.mark.parametrize(
    "attribute",
    [
        "key_advert_to_proto",
        "masked_shares_to_proto",
        "unmask_request_to_proto",
        "unmask_response_to_proto",
        "assignment_to_proto",
    ],
)
def test_a_changed_protobuf_format_fails_with_the_bump_message(monkeypatch, attribute):
    """A protobuf converter that drops the message's last field changes the frozen bytes."""
    check_vectors("wire_messages")
    convert = getattr(wire, attribute)

    def drop_last(message):
        last = message.ListFields()[-1][0].name
        message.ClearField(last)

    def changed(*args):
        result = convert(*args)
        drop_last(result[0] if isinstance(result, tuple) else result)
        return result

    monkeypatch.setattr(wire, attribute, changed)
    with pytest.raises(AssertionError, match=re.escape(BUMP)):
        check_vectors("wire_messages")
