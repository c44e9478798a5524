"""Typed messages of the per-cluster secure-aggregation protocol (Bonawitz et al. 2017).

Every message carries the :class:`~sharefl.crypto.kdf.KeyContext` (version, round,
reclustering, cluster) it belongs to; both sides refuse messages of another context.
Server → client messages are named ``*Request`` / ``*Broadcast``; client → server
messages are named after what they carry. The state machines see only these types.

The contract: a message validates itself in its constructor (``__post_init__``; as h11's
events do), so a message that exists has fields of the right type, size and range —
whoever built it. Each refuses, with
:class:`~sharefl.protocol.errors.MalformedMessage` naming the message, the field and what
it must be: bytes of the wrong length (public keys, commitments, signatures, sealed and
dealt bundles — :func:`~sharefl.protocol.bundles.dealt_bytes` of the pair commitments'
count —, shares, pair seeds), client ids outside [0, 2^64) or twice in one list, members
not in ascending order, a list or map over its cap (:data:`MAX_IDS`,
:data:`MAX_DEALT_PEERS`, :data:`MAX_PAIR_SHARES`, the member count for neighbours and key
adverts), a threshold over :data:`MAX_IDS`, a length over :data:`MAX_LENGTH`, a ring width
other than 32 or 64, an empty neighbour map, a vector that is not a 1-D uint32/uint64
array (its dtype and shape: the elements are never read), a context that is not a
:class:`~sharefl.crypto.kdf.KeyContext` (which checks its own fields). The checks and
limits live in :mod:`sharefl.protocol.fields`; :class:`~sharefl.protocol.keys.KeyAdvert`
makes them too. They cost a type test and a length per field and one pass over the ids of
a list or map.

The two codecs only translate shapes: protobuf (:mod:`sharefl.deploy.wire`: presence,
chunk framing, repeated entries into maps) and records (:mod:`sharefl.protocol.records`:
record value types, parallel lists). Each turns ``MalformedMessage`` into its own error
(``WireError``, which the gRPC server answers with ``INVALID_ARGUMENT``; ``RecordError``),
so both refuse exactly what the constructors refuse (``tests/test_message_codecs.py``).
What depends on the cluster — membership, neighbours, who may send what at which stage —
is the client's and the server's to check (:mod:`sharefl.protocol.client`,
:mod:`sharefl.protocol.server`).

Stage by stage (U1 ⊇ U2 ⊇ U3 ⊇ U5 are the clients that completed each stage):

0. server → all: :class:`ClusterAssignment` (members, threshold, neighbour graph, length).
1. client → server: :class:`AdvertiseKeys`; server → U1: :class:`KeysBroadcast`.
2. client → server: :class:`EncryptedShares`; server → U2: :class:`MaskingRequest` with the
   share bundles addressed to that client.
3. client → server: :class:`MaskedInput` (y_u, plus complaints about undelivered shares).
4. untrusted mode only: server → U3: :class:`ConsistencyRequest`; client → server:
   :class:`ConsistencySignature`.
5. server → U3: :class:`UnmaskRequest`; client → server: :class:`UnmaskResponse`.

The two-exchange round (``context.version`` =
:data:`~sharefl.crypto.kdf.TWO_EXCHANGE_VERSION`; keys set up once,
:mod:`sharefl.protocol.keys`):

1. server → all: :class:`ClusterAssignment` with the members' :class:`KeyAdvert` s;
   client → server: :class:`MaskedShares` (y_u, and its encrypted shares of b_u and of
   its pair seeds, with their commitments).
2. signed mode only: :class:`ConsistencyRequest` / :class:`ConsistencySignature`.
3. server → U3: :class:`UnmaskRequest` carrying the bundles addressed to the client;
   client → server: :class:`UnmaskResponse` (seed shares of survivors, shares of the pair
   seeds of survivors with dropped peers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sharefl.crypto.kdf import KEY_BYTES, KeyContext
from sharefl.crypto.shamir import SHARE_BYTES
from sharefl.crypto.signatures import SIGNATURE_BYTES, advertised_keys_message
from sharefl.protocol.bundles import COMMITMENT_BYTES, SEALED_BYTES, dealt_bytes
from sharefl.protocol.errors import MalformedMessage
from sharefl.protocol.fields import (
    DEALT_SIZES,
    MAX_DEALT_PEERS,
    MAX_IDS,
    MAX_LENGTH,
    MAX_PAIR_SHARES,
    check_all,
    check_bytes,
    check_flag,
    check_graph,
    check_id,
    check_ids,
    check_int,
    check_pair_map,
    check_peer_map,
    check_type,
    check_vector,
)
from sharefl.protocol.keys import KeyAdvert

__all__ = [
    "DEALT_SIZES",
    "MAX_DEALT_PEERS",
    "MAX_IDS",
    "MAX_LENGTH",
    "MAX_PAIR_SHARES",
    "AdvertiseKeys",
    "ClientMessage",
    "ClusterAssignment",
    "ConsistencyRequest",
    "ConsistencySignature",
    "EncryptedShares",
    "KeysBroadcast",
    "MalformedMessage",
    "MaskedInput",
    "MaskedShares",
    "MaskingRequest",
    "ServerMessage",
    "UnmaskRequest",
    "UnmaskResponse",
    "check_dealt_fields",
]

_SIGNATURE_SIZES = (0, SIGNATURE_BYTES)
_DEALT_WHAT = f"a dealt bundle's size (dealt_bytes of 1 to {MAX_DEALT_PEERS} neighbours)"


def _context(name: str, context: object) -> None:
    check_type(f"{name}.context", context, KeyContext)


@dataclass(frozen=True)
class ClusterAssignment:
    """What the server tells every member before stage 1.

    Attributes:
        context: where in the protocol (round, reclustering, cluster).
        members: ids of the cluster's clients, sorted, no duplicates.
        threshold: t; at least t clients must complete every stage.
        length: the number of ring elements in every input vector.
        bits: ring width b (32 or 64).
        neighbours: for sparse masking (SecAgg+), each member's neighbours; ``None``
            means every member is a neighbour of every other (complete graph).
        signed: untrusted-server mode: advertisements and the survivor list are signed.
        keys: the two-exchange round only: every member's long-term :class:`KeyAdvert`
            (empty in the four-exchange round).
    """

    context: KeyContext
    members: tuple[int, ...]
    threshold: int
    length: int
    bits: int = 32
    neighbours: dict[int, frozenset[int]] | None = None
    signed: bool = False
    keys: tuple[KeyAdvert, ...] = ()

    def __post_init__(self) -> None:
        _context("ClusterAssignment", self.context)
        check_ids("ClusterAssignment.members", self.members, ascending=True)
        check_int("ClusterAssignment.threshold", self.threshold, 0, MAX_IDS)
        check_int("ClusterAssignment.length", self.length, 0, MAX_LENGTH)
        if self.bits not in (32, 64) or isinstance(self.bits, bool):
            raise MalformedMessage(f"ClusterAssignment.bits must be 32 or 64, got {self.bits!r}")
        check_graph("ClusterAssignment.neighbours", self.neighbours, len(self.members))
        check_flag("ClusterAssignment.signed", self.signed)
        check_all("ClusterAssignment.keys", self.keys, KeyAdvert, len(self.members))
        if len({k.sender for k in self.keys}) != len(self.keys):
            raise MalformedMessage("ClusterAssignment.keys has two adverts of one client")

    def neighbours_of(self, client_id: int) -> frozenset[int]:
        """The peers ``client_id`` masks with and shares with (never itself)."""
        if self.neighbours is None:
            return frozenset(m for m in self.members if m != client_id)
        return self.neighbours.get(client_id, frozenset())


@dataclass(frozen=True)
class AdvertiseKeys:
    """Stage 1: a client's two fresh X25519 public keys and a commitment to its self-mask
    seed b_u; ``signature`` is its Ed25519 signature over all of it (signed mode)."""

    sender: int
    context: KeyContext
    encryption_public: bytes
    mask_public: bytes
    commitment: bytes
    signature: bytes = b""

    def __post_init__(self) -> None:
        check_id("AdvertiseKeys.sender", self.sender)
        _context("AdvertiseKeys", self.context)
        check_bytes("AdvertiseKeys.encryption_public", self.encryption_public, (KEY_BYTES,))
        check_bytes("AdvertiseKeys.mask_public", self.mask_public, (KEY_BYTES,))
        check_bytes("AdvertiseKeys.commitment", self.commitment, (COMMITMENT_BYTES,))
        check_bytes("AdvertiseKeys.signature", self.signature, _SIGNATURE_SIZES)

    def statement(self) -> bytes:
        """The canonical bytes ``signature`` signs (see ``advertised_keys_message``)."""
        return advertised_keys_message(
            self.sender, self.context, self.encryption_public, self.mask_public, self.commitment
        )


@dataclass(frozen=True)
class KeysBroadcast:
    """Stage 1 reply: the advertisements of U1, relayed to every member of U1."""

    context: KeyContext
    advertisements: tuple[AdvertiseKeys, ...]

    def __post_init__(self) -> None:
        _context("KeysBroadcast", self.context)
        check_all("KeysBroadcast.advertisements", self.advertisements, AdvertiseKeys)


@dataclass(frozen=True)
class EncryptedShares:
    """Stage 2: the sender's Shamir shares of (mask secret key, b_u), one AES-GCM bundle per
    receiver (its neighbours in U1, and itself)."""

    sender: int
    context: KeyContext
    bundles: dict[int, bytes]

    def __post_init__(self) -> None:
        check_id("EncryptedShares.sender", self.sender)
        _context("EncryptedShares", self.context)
        check_peer_map("EncryptedShares.bundles", self.bundles, (SEALED_BYTES,))


@dataclass(frozen=True)
class MaskingRequest:
    """Stage 2 reply: U2, and the bundles addressed to this client by members of U2."""

    context: KeyContext
    receiver: int
    survivors: tuple[int, ...]
    bundles: dict[int, bytes]

    def __post_init__(self) -> None:
        _context("MaskingRequest", self.context)
        check_id("MaskingRequest.receiver", self.receiver)
        check_ids("MaskingRequest.survivors", self.survivors)
        check_peer_map("MaskingRequest.bundles", self.bundles, (SEALED_BYTES,))


@dataclass(frozen=True)
class MaskedInput:
    """Stage 3: y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv) (mod 2^b).

    The sum runs over every neighbour v in the share-stage survivor list U2, whether or not
    v's share bundle reached this client. ``complaints`` names the neighbours whose bundle
    did not arrive, decrypt or parse: this client holds none of their shares. A complaint
    reveals nothing and changes no mask; it tells the server whose secrets have fewer
    holders (and, when every peer of v complains, that v is to be left out).
    """

    sender: int
    context: KeyContext
    vector: np.ndarray
    complaints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_id("MaskedInput.sender", self.sender)
        _context("MaskedInput", self.context)
        check_vector("MaskedInput.vector", self.vector)
        check_ids("MaskedInput.complaints", self.complaints)


@dataclass(frozen=True)
class MaskedShares:
    """Two-exchange round, the reply to the assignment: y_u = x_u + PRG(b_u) +
    Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv) (mod 2^b) over *every* neighbour v, and what
    recovers a drop-out without another exchange.

    Attributes:
        vector: y_u.
        seed_commitment: commitment to b_u (:func:`~sharefl.protocol.bundles.seed_commitment`).
        pair_commitments: neighbour v → commitment to s_uv
            (:func:`~sharefl.protocol.bundles.pair_commitment`).
        bundles: neighbour h → AES-GCM bundle (key k_uh) of h's shares of b_u and of every
            s_uv (:class:`~sharefl.protocol.bundles.DealtShares`).
    """

    sender: int
    context: KeyContext
    vector: np.ndarray
    seed_commitment: bytes
    pair_commitments: dict[int, bytes]
    bundles: dict[int, bytes]

    def __post_init__(self) -> None:
        check_id("MaskedShares.sender", self.sender)
        _context("MaskedShares", self.context)
        check_vector("MaskedShares.vector", self.vector)
        check_dealt_fields(self.seed_commitment, self.pair_commitments, self.bundles)


@dataclass(frozen=True)
class ConsistencyRequest:
    """Stage 4 (signed mode): the survivor list U3 the server claims to have."""

    context: KeyContext
    survivors: tuple[int, ...]

    def __post_init__(self) -> None:
        _context("ConsistencyRequest", self.context)
        check_ids("ConsistencyRequest.survivors", self.survivors)


@dataclass(frozen=True)
class ConsistencySignature:
    """Stage 4 reply: the client's Ed25519 signature over the survivor list it saw."""

    sender: int
    context: KeyContext
    signature: bytes

    def __post_init__(self) -> None:
        check_id("ConsistencySignature.sender", self.sender)
        _context("ConsistencySignature", self.context)
        check_bytes("ConsistencySignature.signature", self.signature, (SIGNATURE_BYTES,))


@dataclass(frozen=True)
class UnmaskRequest:
    """Stage 5: reveal b-shares of ``survivors`` and mask-key shares of ``dropped``.

    ``signatures`` (signed mode) are the consistency signatures the server collected over
    ``survivors``: the client checks at least t of them before revealing anything.
    ``bundles`` (two-exchange round): the share bundles survivors dealt to this client.
    """

    context: KeyContext
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    signatures: dict[int, bytes] = field(default_factory=dict)
    bundles: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _context("UnmaskRequest", self.context)
        check_ids("UnmaskRequest.survivors", self.survivors)
        check_ids("UnmaskRequest.dropped", self.dropped)
        check_peer_map("UnmaskRequest.signatures", self.signatures, (SIGNATURE_BYTES,))
        check_peer_map(
            "UnmaskRequest.bundles", self.bundles, DEALT_SIZES, MAX_DEALT_PEERS, _DEALT_WHAT
        )


@dataclass(frozen=True)
class UnmaskResponse:
    """Stage 5 reply: serialized Shamir shares held by the sender, keyed by the peer whose
    secret they are a share of (b_u for survivors, mask secret key for dropped peers).

    ``pair_seeds`` maps a *dropped* peer w whose shares the sender does not hold (it
    complained about w) to the pair seed s_vw it masked with, so that the server can remove
    that pair mask without w's key: for a dropped peer the server may learn its pair masks
    (Bonawitz et al. reveal its whole mask key), never its self-mask seed.

    Two-exchange round: ``key_shares`` and ``pair_seeds`` stay empty; ``pair_shares`` maps
    (survivor w, dropped v) to the sender's share of s_wv, and ``complaints`` names the
    survivors whose bundle did not arrive, decrypt or parse.
    """

    sender: int
    context: KeyContext
    seed_shares: dict[int, bytes]
    key_shares: dict[int, bytes]
    pair_seeds: dict[int, bytes] = field(default_factory=dict)
    pair_shares: dict[tuple[int, int], bytes] = field(default_factory=dict)
    complaints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_id("UnmaskResponse.sender", self.sender)
        _context("UnmaskResponse", self.context)
        check_peer_map("UnmaskResponse.seed_shares", self.seed_shares, (SHARE_BYTES,))
        check_peer_map("UnmaskResponse.key_shares", self.key_shares, (SHARE_BYTES,))
        check_peer_map("UnmaskResponse.pair_seeds", self.pair_seeds, (KEY_BYTES,))
        check_pair_map("UnmaskResponse.pair_shares", self.pair_shares, SHARE_BYTES, MAX_PAIR_SHARES)
        check_ids("UnmaskResponse.complaints", self.complaints)


def check_dealt_fields(
    seed_commitment: bytes, pair_commitments: dict[int, bytes], bundles: dict[int, bytes]
) -> None:
    """The fields of a :class:`MaskedShares` other than its vector (a codec can refuse them
    before the vector arrives): a 32-byte seed commitment, at most :data:`MAX_DEALT_PEERS`
    pair commitments of 32 bytes and bundles, every bundle the size a dealer of that many
    neighbours seals (:func:`~sharefl.protocol.bundles.dealt_bytes`). Raises
    :class:`MalformedMessage`."""
    check_bytes("MaskedShares.seed_commitment", seed_commitment, (COMMITMENT_BYTES,))
    check_peer_map(
        "MaskedShares.pair_commitments", pair_commitments, (COMMITMENT_BYTES,), MAX_DEALT_PEERS
    )
    size = dealt_bytes(len(pair_commitments))
    check_peer_map(
        "MaskedShares.bundles",
        bundles,
        (size,),
        MAX_DEALT_PEERS,
        f"{size} bytes (dealt_bytes of {len(pair_commitments)} neighbours)",
    )


ClientMessage = (
    AdvertiseKeys
    | EncryptedShares
    | MaskedInput
    | MaskedShares
    | ConsistencySignature
    | UnmaskResponse
)
ServerMessage = KeysBroadcast | MaskingRequest | ConsistencyRequest | UnmaskRequest
