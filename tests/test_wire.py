"""Wire format: generated code matches the .proto; vectors, conversions, malformed input."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.crypto.encoding import choose_encoding
from sharefl.crypto.kdf import KeyContext
from sharefl.deploy import wire
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.messages import (
    AdvertiseKeys,
    ClusterAssignment,
    EncryptedShares,
    MaskingRequest,
    UnmaskRequest,
    UnmaskResponse,
)

ROOT = Path(__file__).resolve().parent.parent
CTX = KeyContext(round=3, reclustering=1, cluster=2)


def test_generated_modules_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    from sharefl.proto.generate import GENERATED, generate

    generate(tmp_path)
    for name in GENERATED:
        fresh = (tmp_path / "sharefl" / "proto" / name).read_text()
        committed = (ROOT / "sharefl" / "proto" / name).read_text()
        assert fresh == committed, f"{name} is stale: run python -m sharefl.proto.generate"


@settings(max_examples=25, deadline=None)
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


def test_chunks_out_of_order_truncated_or_tampered_are_refused():
    header, chunks = _pieces()
    assert len(chunks) == 2
    with pytest.raises(wire.WireError, match="expected chunk 0"):
        wire.VectorAssembler(header, LENGTH, np.uint32).add(chunks[1])
    truncated = pb.VectorChunk(index=0, data=chunks[0].data[:-1])
    with pytest.raises(wire.WireError, match="bytes, expected"):
        wire.VectorAssembler(header, LENGTH, np.uint32).add(truncated)
    tampered = pb.VectorChunk(index=1, data=bytes([chunks[1].data[0] ^ 1]) + chunks[1].data[1:])
    assembler = wire.VectorAssembler(header, LENGTH, np.uint32)
    assembler.add(chunks[0])
    assembler.add(tampered)
    with pytest.raises(wire.WireError, match="digest"):
        assembler.result()
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
        (dict(sha256=b"short"), "32 bytes"),
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
    shares = EncryptedShares(4, CTX, {1: b"x", 9: b"y"})
    assert wire.shares_from_proto(wire.shares_to_proto(shares)) == shares
    masking = MaskingRequest(CTX, 4, (1, 4, 9), {1: b"x"})
    assert wire.masking_from_proto(wire.masking_to_proto(masking)) == masking
    unmask = UnmaskRequest(CTX, (1, 4), (9,), {1: b"s" * 64})
    assert wire.server_message_from_proto(wire.server_message_to_proto(unmask)) == unmask
    response = UnmaskResponse(4, CTX, {1: b"a"}, {9: b"b"})
    assert wire.unmask_response_from_proto(wire.unmask_response_to_proto(response)) == response
    assignment = ClusterAssignment(CTX, (1, 4, 9), 2, 10, 32, {1: frozenset({4})}, True)
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
            pb.EncryptedShares(sender=1, bundles=[pb.Bundle(peer=2), pb.Bundle(peer=2)])
        )
    with pytest.raises(wire.WireError, match="duplicate"):
        wire.masking_from_proto(pb.MaskingRequest(survivors=[1, 1]))
    unsafe = pb.ClusterAssignment(
        bits=32, encoding=pb.Encoding(bits=32, frac_bits=40, clip=1.0, max_summands=3)
    )
    with pytest.raises(wire.WireError, match="encoding"):
        wire.assignment_from_proto(unsafe)


def test_payload_digest_is_sha256_of_little_endian_bytes():
    vector = np.array([1, 2, 3], dtype=np.uint32)
    header, _ = wire.vector_to_proto(vector)
    assert header.sha256 == hashlib.sha256(vector.astype("<u4").tobytes()).digest()
