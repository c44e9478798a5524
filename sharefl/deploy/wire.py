"""The one conversion layer between protobuf (``sharefl.proto``) and the protocol's types.

Everything the gRPC runtime receives passes through here first. For a protocol message this
module translates shapes only — repeated entries into maps (no key twice), repeated fields
no longer than any message holds, large vectors reassembled from ordered chunks whose count
and sizes must match their header — and the message's constructor checks its fields
(:mod:`sharefl.protocol.messages`: byte sizes, id ranges and duplicates, caps, ring
width...); its :class:`~sharefl.protocol.errors.MalformedMessage` becomes a
:class:`WireError` here, as the record codec (:mod:`sharefl.protocol.records`) makes it a
``RecordError``, so the two refuse alike. Malformed input raises :class:`WireError` (the
server maps it to ``INVALID_ARGUMENT``); no protocol logic lives here.

The two-exchange round (protocol version 5) travels in fields appended to the four-exchange
messages (``ClusterAssignment.keys``, ``UnmaskRequest.bundles``, ``UnmaskResponse.
pair_shares`` and ``.complaints``: empty, hence absent, in a four-exchange round) and in
two messages of its own, ``KeyAdvert`` and ``MaskedShares`` (``ClientMessage.key_advert``
and ``.masked_shares``). Its caps are the messages' own
(:data:`~sharefl.protocol.fields.MAX_DEALT_PEERS`,
:data:`~sharefl.protocol.fields.MAX_PAIR_SHARES`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from sharefl.crypto.encoding import RingEncoding
from sharefl.crypto.errors import EncodingError
from sharefl.crypto.kdf import KeyContext
from sharefl.deploy.errors import DeployError
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol import messages as m
from sharefl.protocol.clustering import Clustering, ClusteringError
from sharefl.protocol.errors import ConfigurationError, MalformedMessage
from sharefl.protocol.fields import MAX_IDS, MAX_PAIR_SHARES
from sharefl.protocol.keys import KeyAdvert
from sharefl.protocol.memory import model_digest
from sharefl.protocol.plan import RoundPlan
from sharefl.rounds.round_seed import public_round_seed

CHUNK_BYTES = 3 << 20
"""Payload bytes per VectorChunk (3 MiB, below gRPC's 4 MiB message limit with headroom)."""

_DTYPES: dict[int, np.dtype[Any]] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_UINT32: np.dtype("<u4"),
    pb.DTYPE_UINT64: np.dtype("<u8"),
}
_CODES: dict[np.dtype[Any], Any] = {  # numpy dtype -> the wire enum
    np.dtype(np.float32): pb.DTYPE_FLOAT32,
    np.dtype(np.uint32): pb.DTYPE_UINT32,
}
_CODES[np.dtype(np.uint64)] = pb.DTYPE_UINT64


MAX_CLUSTER_MEMBERS = MAX_IDS
"""Most entries any one repeated field of a cluster's messages is converted with (the
messages' own cap, :data:`~sharefl.protocol.fields.MAX_IDS`; pair shares:
:data:`~sharefl.protocol.fields.MAX_PAIR_SHARES`): members, neighbours, survivors,
dropped, complaints, advertisements, bundles, signatures, shares. A longer field is refused
before anything is built from it; the messages then bound some by less (a cluster's
membership, a dealer's neighbours)."""

MAX_RECLUSTERINGS = 1 << 10
"""Most clusterings a round plan may carry on the wire (the client's policy is stricter)."""

MAX_REASON_BYTES = 1024
"""Refusal reasons are cut to this many UTF-8 bytes of printable characters."""


class WireError(DeployError, ValueError):
    """A protobuf message is malformed: missing fields, values out of range, fields of the
    wrong size, repeated fields longer than their cap, vectors whose chunks arrive out of
    order or do not match their header's length or digest."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _refusing(convert: Callable[_P, _R]) -> Callable[_P, _R]:
    """``convert`` with a message's :class:`~sharefl.protocol.errors.MalformedMessage` (its
    constructor refused the fields) raised as :class:`WireError`."""

    @functools.wraps(convert)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return convert(*args, **kwargs)
        except MalformedMessage as exc:
            raise WireError(str(exc)) from exc

    return wrapper


# ---- vectors ------------------------------------------------------------------------------


SESSION_METHOD = "/sharefl.v1.Aggregation/Session"
"""The one RPC of ``sharefl.proto``: a bidirectional stream of Client/ServerMessages."""
Envelope = type[pb.ServerMessage] | type[pb.ClientMessage]
"""The two stream message types; both carry a vector's chunks in their ``chunk`` field."""


def _payload(vector: np.ndarray) -> memoryview:
    """The little-endian bytes of ``vector`` (1-D float32/uint32/uint64); raises
    :class:`WireError` for any other array."""
    if vector.dtype not in _CODES or vector.ndim != 1:
        raise WireError(f"cannot send a {vector.dtype} array of shape {vector.shape}")
    return np.ascontiguousarray(vector, dtype=vector.dtype.newbyteorder("<")).data.cast("B")


def _chunk_count(size: int) -> int:
    return -(-size // CHUNK_BYTES)


def _header(vector: np.ndarray, payload: memoryview) -> pb.VectorHeader:
    return pb.VectorHeader(
        length=vector.shape[0], dtype=_CODES[vector.dtype], chunks=_chunk_count(len(payload))
    )


def vector_header(vector: np.ndarray) -> pb.VectorHeader:
    """The header announcing ``vector``: its length, dtype and number of chunks (the chunks
    follow as :func:`chunk_frames`). Raises :class:`WireError` for an array that cannot be
    sent."""
    return _header(vector, _payload(vector))


def vector_to_proto(vector: np.ndarray) -> tuple[pb.VectorHeader, Iterator[pb.VectorChunk]]:
    """A header and the chunk messages that carry ``vector`` (1-D float32/uint32/uint64)."""
    payload = _payload(vector)
    header = _header(vector, payload)

    def chunk_messages() -> Iterator[pb.VectorChunk]:
        for index in range(header.chunks):
            start = index * CHUNK_BYTES
            yield pb.VectorChunk(index=index, data=bytes(payload[start : start + CHUNK_BYTES]))

    return header, chunk_messages()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_LENGTH_DELIMITED = 2
_VARINT = 0
_INDEX_TAG = _varint(pb.VectorChunk.DESCRIPTOR.fields_by_name["index"].number << 3 | _VARINT)
_DATA_TAG = _varint(
    pb.VectorChunk.DESCRIPTOR.fields_by_name["data"].number << 3 | _LENGTH_DELIMITED
)


def chunk_frames(envelope: Envelope, vector: np.ndarray) -> list[bytes]:
    """The chunks of ``vector`` as serialized ``envelope`` messages, ready for a stream
    whose serializer passes bytes through (:func:`serialize`).

    Byte for byte ``envelope(chunk=pb.VectorChunk(index=i, data=piece)).SerializeToString()``
    (protobuf's encoding of one length-delimited field holding a varint and a bytes field;
    ``tests/test_wire.py`` holds the two equal), but written with one copy of the payload
    where the message objects make four: the model goes to every client, and every
    client's masked vector comes back, each round. Raises :class:`WireError` for an array
    that cannot be sent.
    """
    payload = _payload(vector)
    frames = []
    for index in range(_chunk_count(len(payload))):
        piece = payload[index * CHUNK_BYTES : (index + 1) * CHUNK_BYTES]
        frames.append(b"".join((_chunk_frame_head(envelope, index, len(piece)), piece)))
    return frames


def _chunk_frame_head(envelope: Envelope, index: int, length: int) -> bytes:
    """The bytes before the payload in ``envelope(chunk=VectorChunk(index, data))``'s
    encoding, for ``length`` bytes of data."""
    field_tag = _varint(envelope.DESCRIPTOR.fields_by_name["chunk"].number << 3 | _LENGTH_DELIMITED)
    # proto3 leaves a zero index out, as SerializeToString does
    head = (_INDEX_TAG + _varint(index) if index else b"") + _DATA_TAG + _varint(length)
    return b"".join((field_tag, _varint(len(head) + length), head))


def serialize(message: Message | bytes) -> bytes:
    """The stream serializer of both directions: a message's bytes, or bytes already
    serialized (:func:`chunk_frames`, a message sent to many clients) as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def serialized_size(message: Message | bytes) -> int:
    """The bytes :func:`serialize` writes for ``message``, or the bytes an envelope read
    from a stream took (for traffic accounting). A chunk's size is counted from its data's
    length: ``ByteSize`` would encode the megabytes again only to measure them."""
    if isinstance(message, bytes):
        return len(message)
    if isinstance(message, (pb.ClientMessage, pb.ServerMessage)) and message.HasField("chunk"):
        length = len(message.chunk.data)
        index = int(message.chunk.index)
        return len(_chunk_frame_head(type(message), index, length)) + length
    return int(message.ByteSize())


class VectorAssembler:
    """Reassembles a vector from its header and chunks, checking everything.

    Args:
        header: the announced vector.
        length: the length the receiver expects (a header that disagrees is refused).
        dtype: the dtype the receiver expects.

    Raises :class:`WireError` on a header that disagrees with the expectation, a chunk out
    of order or of the wrong size. No digest: the stream (TLS records, TCP) delivers the
    chunks intact, and a sender's digest would bind it to nothing it does not choose.
    """

    def __init__(self, header: pb.VectorHeader, length: int, dtype: npt.DTypeLike) -> None:
        if header.dtype not in _DTYPES or _DTYPES[header.dtype] != np.dtype(dtype).newbyteorder(
            "<"
        ):
            raise WireError(f"vector dtype code {header.dtype} is not the expected {dtype}")
        if header.length != length:
            raise WireError(f"vector of length {header.length} announced, expected {length}")
        self._dtype = _DTYPES[header.dtype]
        self._size = length * self._dtype.itemsize
        expected_chunks = _chunk_count(self._size)
        if header.chunks != expected_chunks:
            raise WireError(f"{header.chunks} chunks announced for {self._size} bytes")
        self._header = header
        # allocated only after the length is checked, and not zeroed: every byte is written
        self._vector = np.empty(length, dtype=self._dtype)
        self._buffer = self._vector.data.cast("B")
        self._filled = 0
        self._next = 0

    @classmethod
    def bounded(
        cls, header: pb.VectorHeader, max_length: int, dtype: npt.DTypeLike
    ) -> VectorAssembler:
        """An assembler for a vector whose length the receiver does not know in advance
        (e.g. the model): the announced length is accepted up to ``max_length`` elements.
        Raises :class:`WireError` for a longer one (nothing is allocated)."""
        if header.length > max_length:
            raise WireError(
                f"vector of {header.length} elements announced; this receiver accepts at most "
                f"{max_length}"
            )
        return cls(header, int(header.length), dtype)

    @property
    def complete(self) -> bool:
        """True once every announced chunk has arrived."""
        return self._next == self._header.chunks

    def add(self, chunk: pb.VectorChunk) -> bool:
        """Append one chunk; returns :attr:`complete`. Raises :class:`WireError`."""
        if self.complete:
            raise WireError("chunk after the vector was complete")
        if chunk.index != self._next:
            raise WireError(f"chunk {chunk.index} arrived, expected chunk {self._next}")
        last = self._next == self._header.chunks - 1
        want = self._size - self._filled if last else CHUNK_BYTES
        data = chunk.data
        if len(data) != want:
            raise WireError(f"chunk {chunk.index} has {len(data)} bytes, expected {want}")
        self._buffer[self._filled : self._filled + want] = data
        self._filled += want
        self._next += 1
        return self.complete

    def result(self) -> np.ndarray:
        """The vector (native byte order); raises :class:`WireError` if incomplete."""
        if not self.complete:
            raise WireError(f"vector incomplete: {self._next} of {self._header.chunks} chunks")
        return self._vector.astype(self._dtype.newbyteorder("="), copy=False)


# ---- scalars and small messages -----------------------------------------------------------


def context_to_proto(c: KeyContext) -> pb.Context:
    return pb.Context(
        version=c.version,
        round=c.round,
        reclustering=c.reclustering,
        cluster=c.cluster,
        plan=c.plan,
    )


def context_from_proto(c: pb.Context) -> KeyContext:
    """Raises :class:`WireError` for a missing or out-of-range context."""
    try:
        return KeyContext(
            round=c.round,
            reclustering=c.reclustering,
            cluster=c.cluster,
            version=c.version,
            plan=bytes(c.plan),
        )
    except ValueError as exc:
        raise WireError(f"bad context: {exc}") from exc


_T = TypeVar("_T")


def _capped(values: Sequence[_T], what: str, cap: int = MAX_CLUSTER_MEMBERS) -> Sequence[_T]:
    if len(values) > cap:
        raise WireError(f"{what} has {len(values)} entries; at most {cap}")
    return values


def _ids(values: Sequence[int], what: str) -> tuple[int, ...]:
    """The ids of a repeated field, as they come (the message refuses duplicates)."""
    return tuple(int(v) for v in _capped(values, what))


def _id_set(values: Sequence[int], what: str) -> frozenset[int]:
    """The ids of a repeated field that becomes a set: none twice."""
    ids = frozenset(int(v) for v in _capped(values, what))
    if len(ids) != len(values):
        raise WireError(f"{what} has duplicate client ids")
    return ids


def _peer_map(
    entries: Sequence[pb.Bundle | pb.SignatureEntry | pb.PeerShare | pb.PeerCommitment],
    what: str,
    field: str,
) -> dict[int, bytes]:
    """``{peer: bytes}`` from repeated entries, no peer twice (the message checks the
    sizes and its own cap)."""
    result: dict[int, bytes] = {}
    for entry in _capped(entries, what):
        peer = int(entry.peer if hasattr(entry, "peer") else entry.signer)
        if peer in result:
            raise WireError(f"{what} names client {peer} twice")
        result[peer] = bytes(getattr(entry, field))
    return result


def printable(text: str, limit: int = MAX_REASON_BYTES) -> str:
    """``text`` safe for one log line and for the wire: every non-printable character
    (newline, escape, bidi control...) escaped as in a Python literal, so it cannot forge
    lines; at most ``limit`` UTF-8 bytes (a longer text is cut, never mid-character, and
    says how long it was)."""
    head = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    if len(text) <= limit and len(head.encode()) <= limit:
        return head
    note = f"... ({len(text)} characters)"
    return head.encode()[: max(0, limit - len(note))].decode(errors="ignore") + note


def refusal_to_proto(context: KeyContext | pb.Context, reason: str) -> pb.Refusal:
    """A Refusal whose reason is :func:`printable` (at most ``MAX_REASON_BYTES``)."""
    if isinstance(context, KeyContext):
        context = context_to_proto(context)
    return pb.Refusal(context=context, reason=printable(reason))


def refusal_reason(p: pb.Refusal) -> str:
    """A received Refusal's reason, reduced to printable characters and capped (it is
    written to logs; a client may send anything)."""
    return printable(p.reason)


MAX_PLAN_IDS = 1 << 20
"""Most client ids a round plan may carry in total (R · n): a plan is read before use."""


def plan_to_proto(plan: RoundPlan) -> pb.RoundPlan:
    return pb.RoundPlan(
        clusterings=[
            pb.Clustering(clusters=[pb.Cluster(members=c) for c in clustering.clusters])
            for clustering in plan.clusterings
        ],
        atoms=[] if plan.atoms is None else [pb.Cluster(members=a) for a in plan.atoms.clusters],
    )


def plan_from_proto(
    round_index: int,
    p: pb.RoundPlan,
    *,
    max_reclusterings: int = MAX_RECLUSTERINGS,
    max_participants: int | None = None,
) -> RoundPlan:
    """Raises :class:`WireError` for an oversized plan or one that is not R partitions of
    the same clients. A client passes its policy's ``max_reclusterings`` and
    ``max_participants``: the counts are read off the message, so a plan over them is
    refused before any of it is built (the wire caps apply as well)."""
    _capped(p.clusterings, "round plan", min(max_reclusterings, MAX_RECLUSTERINGS))
    total = sum(len(c.members) for clustering in p.clusterings for c in clustering.clusters)
    total += sum(len(a.members) for a in p.atoms)
    if total > MAX_PLAN_IDS:
        raise WireError(f"round plan lists {total} client ids; at most {MAX_PLAN_IDS}")
    if max_participants is not None and p.clusterings:
        first = sum(len(c.members) for c in p.clusterings[0].clusters)
        if first > max_participants:
            raise WireError(
                f"round plan has {first} participants; this client audits plans of at most "
                f"{max_participants}"
            )
    try:
        atoms = (
            Clustering(tuple(tuple(int(i) for i in a.members) for a in p.atoms))
            if p.atoms
            else None
        )
        return RoundPlan(
            round_index,
            tuple(
                Clustering(tuple(tuple(int(i) for i in c.members) for c in clustering.clusters))
                for clustering in p.clusterings
            ),
            atoms,
        )
    except (ClusteringError, ConfigurationError, ValueError) as exc:
        raise WireError(f"bad round plan: {exc}") from exc


def encoding_to_proto(e: RingEncoding) -> pb.Encoding:
    return pb.Encoding(
        bits=e.bits,
        frac_bits=e.frac_bits,
        clip=e.clip,
        max_summands=e.max_summands,
        l2_clip=e.l2_clip or 0.0,
    )


def encoding_from_proto(e: pb.Encoding) -> RingEncoding:
    """Raises :class:`WireError` for parameters the encoding refuses (e.g. unsafe)."""
    try:
        return RingEncoding(e.bits, e.frac_bits, e.clip, e.max_summands, e.l2_clip or None)
    except (EncodingError, TypeError) as exc:
        raise WireError(f"bad encoding: {exc}") from exc


def assignment_to_proto(
    a: m.ClusterAssignment, encoding: RingEncoding | None
) -> pb.ClusterAssignment:
    """The assignment with the float encoding its inputs use; ``None``: ring inputs, which
    the clients encode themselves (:class:`~sharefl.deploy.client.RingInputs`)."""
    neighbours = [
        pb.Neighbours(client_id=cid, peers=sorted(peers))
        for cid, peers in sorted((a.neighbours or {}).items())
    ]
    return pb.ClusterAssignment(
        context=context_to_proto(a.context),
        members=a.members,
        threshold=a.threshold,
        length=a.length,
        bits=a.bits,
        neighbours=neighbours,
        signed=a.signed,
        encoding=None if encoding is None else encoding_to_proto(encoding),
        keys=[key_advert_to_proto(k) for k in a.keys],
    )


@_refusing
def assignment_from_proto(
    p: pb.ClusterAssignment,
) -> tuple[m.ClusterAssignment, RingEncoding | None]:
    """The assignment and its float encoding (``None`` when the message has none: ring
    inputs). Raises :class:`WireError`."""
    neighbours = None
    members = _ids(p.members, "member list")
    if p.neighbours:
        neighbours = {}
        for entry in _capped(p.neighbours, "neighbour graph"):
            if entry.client_id in neighbours:
                raise WireError(f"neighbours of {entry.client_id} listed twice")
            neighbours[int(entry.client_id)] = _id_set(entry.peers, "neighbour list")
    keys = tuple(key_advert_from_proto(k) for k in _capped(p.keys, "key adverts"))
    assignment = m.ClusterAssignment(
        context=context_from_proto(p.context),
        members=tuple(sorted(members)),
        threshold=int(p.threshold),
        length=int(p.length),
        bits=int(p.bits),
        neighbours=neighbours,
        signed=bool(p.signed),
        keys=keys,
    )
    if not p.HasField("encoding"):
        return assignment, None
    encoding = encoding_from_proto(p.encoding)
    if encoding.bits != assignment.bits:
        raise WireError("encoding and assignment disagree on the ring width")
    return assignment, encoding


def round_seed(run: bytes, round_index: int, model: np.ndarray) -> bytes:
    """The round's public seed (:func:`~sharefl.rounds.round_seed.public_round_seed`),
    which the server and every client derive alike from what the RoundStart carries: the
    run id and the round (length-prefixed) and the model."""
    binding = len(run).to_bytes(2, "big") + run + round_index.to_bytes(8, "big")
    return public_round_seed(binding, model_digest(model))


def advert_to_proto(a: m.AdvertiseKeys) -> pb.Advertisement:
    return pb.Advertisement(
        sender=a.sender,
        context=context_to_proto(a.context),
        encryption_public=a.encryption_public,
        mask_public=a.mask_public,
        commitment=a.commitment,
        signature=a.signature,
    )


@_refusing
def advert_from_proto(p: pb.Advertisement) -> m.AdvertiseKeys:
    return m.AdvertiseKeys(
        sender=int(p.sender),
        context=context_from_proto(p.context),
        encryption_public=bytes(p.encryption_public),
        mask_public=bytes(p.mask_public),
        commitment=bytes(p.commitment),
        signature=bytes(p.signature),
    )


def key_advert_to_proto(a: KeyAdvert) -> pb.KeyAdvert:
    return pb.KeyAdvert(
        sender=a.sender,
        scope=a.scope,
        encryption_public=a.encryption_public,
        mask_public=a.mask_public,
        signature=a.signature,
    )


@_refusing
def key_advert_from_proto(p: pb.KeyAdvert) -> KeyAdvert:
    """Shapes only (the advert checks its sizes): whether the keys are usable X25519 keys
    (and the signature verifies) is :func:`~sharefl.protocol.keys.check_key_advert`'s to
    say."""
    return KeyAdvert(
        sender=int(p.sender),
        scope=bytes(p.scope),
        encryption_public=bytes(p.encryption_public),
        mask_public=bytes(p.mask_public),
        signature=bytes(p.signature),
    )


def keys_to_proto(k: m.KeysBroadcast) -> pb.KeysBroadcast:
    return pb.KeysBroadcast(
        context=context_to_proto(k.context),
        advertisements=[advert_to_proto(a) for a in k.advertisements],
    )


@_refusing
def keys_from_proto(p: pb.KeysBroadcast) -> m.KeysBroadcast:
    return m.KeysBroadcast(
        context_from_proto(p.context),
        tuple(advert_from_proto(a) for a in _capped(p.advertisements, "advertisements")),
    )


def shares_to_proto(s: m.EncryptedShares) -> pb.EncryptedShares:
    return pb.EncryptedShares(
        sender=s.sender,
        context=context_to_proto(s.context),
        bundles=[pb.Bundle(peer=r, ciphertext=c) for r, c in sorted(s.bundles.items())],
    )


@_refusing
def shares_from_proto(p: pb.EncryptedShares) -> m.EncryptedShares:
    return m.EncryptedShares(
        int(p.sender), context_from_proto(p.context), _peer_map(p.bundles, "bundles", "ciphertext")
    )


def masking_to_proto(r: m.MaskingRequest) -> pb.MaskingRequest:
    return pb.MaskingRequest(
        context=context_to_proto(r.context),
        receiver=r.receiver,
        survivors=r.survivors,
        bundles=[pb.Bundle(peer=s, ciphertext=c) for s, c in sorted(r.bundles.items())],
    )


@_refusing
def masking_from_proto(p: pb.MaskingRequest) -> m.MaskingRequest:
    return m.MaskingRequest(
        context_from_proto(p.context),
        int(p.receiver),
        _ids(p.survivors, "survivor list"),
        _peer_map(p.bundles, "bundles", "ciphertext"),
    )


def masked_to_proto(x: m.MaskedInput) -> pb.MaskedInput:
    """The MaskedInput message, its vector as a header (the chunks follow it:
    :func:`chunk_frames`)."""
    return pb.MaskedInput(
        sender=x.sender,
        context=context_to_proto(x.context),
        vector=vector_header(x.vector),
        complaints=list(x.complaints),
    )


@_refusing
def masked_from_parts(p: pb.MaskedInput, vector: np.ndarray) -> m.MaskedInput:
    return m.MaskedInput(
        int(p.sender),
        context_from_proto(p.context),
        vector,
        _ids(p.complaints, "complaints"),
    )


def masked_shares_to_proto(x: m.MaskedShares) -> pb.MaskedShares:
    """The MaskedShares message, its vector as a header (the chunks follow it:
    :func:`chunk_frames`)."""
    return pb.MaskedShares(
        sender=x.sender,
        context=context_to_proto(x.context),
        vector=vector_header(x.vector),
        seed_commitment=x.seed_commitment,
        pair_commitments=[
            pb.PeerCommitment(peer=v, commitment=c) for v, c in sorted(x.pair_commitments.items())
        ],
        bundles=[pb.Bundle(peer=h, ciphertext=c) for h, c in sorted(x.bundles.items())],
    )


@_refusing
def masked_shares_check(p: pb.MaskedShares) -> Callable[[np.ndarray], m.MaskedShares]:
    """Check a MaskedShares header before its vector is assembled — no peer twice, and
    what :func:`~sharefl.protocol.messages.check_dealt_fields` checks of the message (the
    commitments' and bundles' sizes and caps) — and return what completes the message once
    its vector has come. Raises :class:`WireError`."""
    seed = bytes(p.seed_commitment)
    commitments = _peer_map(p.pair_commitments, "pair commitments", "commitment")
    dealt = _peer_map(p.bundles, "dealt bundles", "ciphertext")
    m.check_dealt_fields(seed, commitments, dealt)
    sender, context = int(p.sender), context_from_proto(p.context)

    @_refusing
    def complete(vector: np.ndarray) -> m.MaskedShares:
        return m.MaskedShares(sender, context, vector, seed, commitments, dealt)

    return complete


def consistency_request_to_proto(r: m.ConsistencyRequest) -> pb.ConsistencyRequest:
    return pb.ConsistencyRequest(context=context_to_proto(r.context), survivors=r.survivors)


@_refusing
def consistency_request_from_proto(p: pb.ConsistencyRequest) -> m.ConsistencyRequest:
    return m.ConsistencyRequest(context_from_proto(p.context), _ids(p.survivors, "survivors"))


def signature_to_proto(s: m.ConsistencySignature) -> pb.ConsistencySignature:
    return pb.ConsistencySignature(
        sender=s.sender, context=context_to_proto(s.context), signature=s.signature
    )


@_refusing
def signature_from_proto(p: pb.ConsistencySignature) -> m.ConsistencySignature:
    return m.ConsistencySignature(int(p.sender), context_from_proto(p.context), bytes(p.signature))


def unmask_request_to_proto(r: m.UnmaskRequest) -> pb.UnmaskRequest:
    return pb.UnmaskRequest(
        context=context_to_proto(r.context),
        survivors=r.survivors,
        dropped=r.dropped,
        signatures=[
            pb.SignatureEntry(signer=s, signature=sig) for s, sig in sorted(r.signatures.items())
        ],
        bundles=[pb.Bundle(peer=d, ciphertext=c) for d, c in sorted(r.bundles.items())],
    )


@_refusing
def unmask_request_from_proto(p: pb.UnmaskRequest) -> m.UnmaskRequest:
    return m.UnmaskRequest(
        context_from_proto(p.context),
        _ids(p.survivors, "survivors"),
        _ids(p.dropped, "dropped"),
        _peer_map(p.signatures, "signatures", "signature"),
        _peer_map(p.bundles, "dealt bundles", "ciphertext"),
    )


def unmask_response_to_proto(r: m.UnmaskResponse) -> pb.UnmaskResponse:
    return pb.UnmaskResponse(
        sender=r.sender,
        context=context_to_proto(r.context),
        seed_shares=[pb.PeerShare(peer=p, share=s) for p, s in sorted(r.seed_shares.items())],
        key_shares=[pb.PeerShare(peer=p, share=s) for p, s in sorted(r.key_shares.items())],
        pair_seeds=[pb.PeerShare(peer=p, share=s) for p, s in sorted(r.pair_seeds.items())],
        pair_shares=[
            pb.PairShare(dealer=d, peer=p, share=s) for (d, p), s in sorted(r.pair_shares.items())
        ],
        complaints=list(r.complaints),
    )


def _pair_shares(entries: Sequence[pb.PairShare]) -> dict[tuple[int, int], bytes]:
    """``{(dealer, peer): share}``, no pair twice (the message checks the rest)."""
    result: dict[tuple[int, int], bytes] = {}
    for entry in _capped(entries, "pair shares", MAX_PAIR_SHARES):
        pair = (int(entry.dealer), int(entry.peer))
        if pair in result:
            raise WireError(f"pair shares name the pair {pair} twice")
        result[pair] = bytes(entry.share)
    return result


@_refusing
def unmask_response_from_proto(p: pb.UnmaskResponse) -> m.UnmaskResponse:
    return m.UnmaskResponse(
        int(p.sender),
        context_from_proto(p.context),
        _peer_map(p.seed_shares, "seed shares", "share"),
        _peer_map(p.key_shares, "key shares", "share"),
        _peer_map(p.pair_seeds, "pair seeds", "share"),
        _pair_shares(p.pair_shares),
        _ids(p.complaints, "complaints"),
    )


def server_message_to_proto(message: m.ServerMessage) -> pb.ServerMessage:
    """Wrap one protocol server message in the stream envelope."""
    if isinstance(message, m.KeysBroadcast):
        return pb.ServerMessage(keys=keys_to_proto(message))
    if isinstance(message, m.MaskingRequest):
        return pb.ServerMessage(masking=masking_to_proto(message))
    if isinstance(message, m.ConsistencyRequest):
        return pb.ServerMessage(consistency=consistency_request_to_proto(message))
    if isinstance(message, m.UnmaskRequest):
        return pb.ServerMessage(unmask=unmask_request_to_proto(message))
    raise TypeError(f"not a server message: {type(message).__name__}")


def server_message_from_proto(envelope: pb.ServerMessage) -> m.ServerMessage:
    """Unwrap a protocol stage request; raises :class:`WireError` for anything else."""
    kind = envelope.WhichOneof("body")
    converters: dict[str, Callable[[Any], m.ServerMessage]] = {
        "keys": keys_from_proto,
        "masking": masking_from_proto,
        "consistency": consistency_request_from_proto,
        "unmask": unmask_request_from_proto,
    }
    if kind not in converters:
        raise WireError(f"not a protocol stage message: {kind}")
    return converters[kind](getattr(envelope, kind))
