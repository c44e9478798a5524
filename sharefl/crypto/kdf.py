"""X25519 key agreement and HKDF-SHA256 key derivation bound to a protocol context.

Every symmetric key of the protocol is derived as

    HKDF-SHA256(ikm = X25519(sk_u, pk_v), salt = none,
                info = "sharefl/kdf" ‖ version ‖ round ‖ reclustering ‖ cluster ‖ [plan digest]
                       ‖ min(u, v) ‖ max(u, v) ‖ purpose)

so a key is only ever valid for one protocol version, one round, one reclustering, one
cluster, one committed round plan (when the server commits to one), one unordered pair of
clients and one purpose. Keys derived for distinct purposes
from the same shared secret are independent (HKDF with distinct ``info``).
"""

from __future__ import annotations

import enum
import hmac
import struct
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from sharefl.crypto.errors import CryptoParameterError, InvalidKeyError

PROTOCOL_VERSION = 4
"""The four-exchange round (keys per round and cluster; Bonawitz et al. 2017). Versions 2
and 3 (before them) carried a SHA-256 in every vector header; nothing else changed."""
TWO_EXCHANGE_VERSION = 5
"""The two-exchange round (keys set up once per client and scope; shares travel with the
masked input: :mod:`sharefl.protocol.keys`)."""
SPOKEN_VERSIONS = (PROTOCOL_VERSION, TWO_EXCHANGE_VERSION)
"""The protocol versions this code speaks; a client refuses any other with a named reason."""
KEY_BYTES = 32
PLAN_DIGEST_BYTES = 32
_U64_MAX = 2**64 - 1
_U32_MAX = 2**32 - 1


class Purpose(enum.IntEnum):
    """What a derived key is for; part of the HKDF context, so purposes never share keys."""

    MASK_SEED = 1
    """Seed s_uv of the pairwise mask PRG(s_uv)."""
    SHARE_ENCRYPTION = 2
    """AES-256-GCM key for the Shamir share bundles sent from u to v through the server."""


def _check_u64(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U64_MAX:
        raise CryptoParameterError(f"{name} must be an integer in [0, 2^64); got {value!r}")
    return value


def _check_u32(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U32_MAX:
        raise CryptoParameterError(f"{name} must be an integer in [0, 2^32); got {value!r}")
    return value


@dataclass(frozen=True)
class KeyContext:
    """Where in the protocol a key is used: (version, round, reclustering, cluster, plan).

    All integer fields are non-negative (round < 2^64; the others < 2^32). ``plan`` is the
    SHA-256 digest of the round plan the server committed to
    (:meth:`sharefl.protocol.plan.RoundPlan.digest`), or empty when there is none. The
    context is bound into every derived key, every AEAD associated data and every signed
    message, so a message from one round, reclustering, cluster or plan is useless in any
    other: members shown different plans cannot even decrypt each other's shares.
    """

    round: int
    reclustering: int = 0
    cluster: int = 0
    version: int = PROTOCOL_VERSION
    plan: bytes = b""

    def __post_init__(self) -> None:
        _check_u64("round", self.round)
        _check_u32("reclustering", self.reclustering)
        _check_u32("cluster", self.cluster)
        _check_u32("version", self.version)
        if not isinstance(self.plan, bytes) or len(self.plan) not in (0, PLAN_DIGEST_BYTES):
            raise CryptoParameterError(f"plan must be b'' or a {PLAN_DIGEST_BYTES}-byte digest")

    def to_bytes(self) -> bytes:
        """Canonical bytes, big-endian: version u32, round u64, reclustering u32, cluster u32
        (24 bytes), followed by the 32-byte plan digest when there is one."""
        head = struct.pack(">IQII", self.version, self.round, self.reclustering, self.cluster)
        return head + self.plan

    def kdf_info(self, purpose: Purpose, client_a: int, client_b: int) -> bytes:
        """HKDF ``info`` for the unordered pair {client_a, client_b} and ``purpose``."""
        lo, hi = sorted((_check_u64("client id", client_a), _check_u64("client id", client_b)))
        return b"sharefl/kdf\x00" + self.to_bytes() + struct.pack(">QQH", lo, hi, int(purpose))


@dataclass(frozen=True, repr=False)
class X25519KeyPair:
    """An X25519 key pair as raw 32-byte values. ``repr`` never shows the private key.

    Pass the pair itself (not ``pair.private``) to :func:`agree` / :func:`pairwise_key`
    when agreeing with many peers: it keeps the parsed key, which saves a parse per peer.
    """

    private: bytes
    public: bytes
    _key: X25519PrivateKey | None = field(default=None, compare=False)

    @classmethod
    def generate(cls) -> X25519KeyPair:
        """A fresh key pair from the operating system's CSPRNG."""
        return cls.from_private(
            X25519PrivateKey.generate().private_bytes_raw(),
        )

    @classmethod
    def from_private(cls, private: bytes) -> X25519KeyPair:
        """The key pair of a raw 32-byte private key; raises :class:`InvalidKeyError`."""
        key = _private_key(private)
        return cls(bytes(private), key.public_key().public_bytes_raw(), key)

    def __repr__(self) -> str:
        return f"X25519KeyPair(public={self.public.hex()[:16]}…)"


def _private_key(private: bytes | X25519KeyPair) -> X25519PrivateKey:
    if isinstance(private, X25519KeyPair):
        return private._key or _private_key(private.private)
    if not isinstance(private, bytes | bytearray) or len(private) != KEY_BYTES:
        raise InvalidKeyError(f"an X25519 private key is {KEY_BYTES} raw bytes")
    return X25519PrivateKey.from_private_bytes(bytes(private))


def _public_key(public: bytes) -> X25519PublicKey:
    if not isinstance(public, bytes | bytearray) or len(public) != KEY_BYTES:
        raise InvalidKeyError(f"an X25519 public key is {KEY_BYTES} raw bytes")
    return X25519PublicKey.from_public_bytes(bytes(public))


_PROBE = X25519PrivateKey.from_private_bytes(
    bytes.fromhex("a8abababababababababababababababababababababababababababababab6b")
)
"""A fixed, public X25519 scalar (already clamped) used only to test peers' public keys."""


def check_public_key(public: bytes) -> None:
    """Refuse an X25519 public key that is malformed or of small order.

    Any u-coordinate whose point has order dividing 8 (on Curve25519 or its twist, in any
    of its encodings: the all-zero key, 1, p - 1, the two order-8 points, p, p + 1, and the
    same values with the ignored top bit set) makes every clamped scalar multiple zero, so
    a pairwise key with it would be known to everybody. The check is one X25519 exchange
    with a fixed scalar, refused by ``cryptography`` when the result is all zeros (about
    25 µs on one core, measured here: cheap enough for the server to run on every
    advertisement). Returns None; raises :class:`InvalidKeyError` for a key that is not
    32 raw bytes or is of small order.
    """
    peer = _public_key(public)
    try:
        _PROBE.exchange(peer)
    except ValueError as exc:  # cryptography refuses an all-zero shared secret
        raise InvalidKeyError(
            "the X25519 public key is a low-order point (every shared secret with it is "
            "zero); generate a fresh key pair"
        ) from exc


def x25519_public_key(private: bytes) -> bytes:
    """The raw 32-byte public key of a raw 32-byte X25519 private key.

    Raises :class:`InvalidKeyError` for a key of the wrong length.
    """
    return _private_key(private).public_key().public_bytes_raw()


def agree(private: bytes | X25519KeyPair, peer_public: bytes) -> bytes:
    """Raw X25519 shared secret (32 bytes) of our private key and a peer's public key.

    Raises :class:`InvalidKeyError` for keys of the wrong length and for a peer public key
    of small order (the shared secret would be all zeros, i.e. known to everybody).
    """
    try:
        return _private_key(private).exchange(_public_key(peer_public))
    except ValueError as exc:  # cryptography refuses an all-zero shared secret
        raise InvalidKeyError(
            "the peer's X25519 public key is a low-order point; refuse this peer"
        ) from exc


def derive_key(
    shared_secret: bytes,
    context: KeyContext,
    purpose: Purpose,
    client_a: int,
    client_b: int,
    length: int = KEY_BYTES,
) -> bytes:
    """HKDF-SHA256 of ``shared_secret`` bound to the context, pair and purpose.

    The pair is unordered: ``derive_key(s, c, p, u, v) == derive_key(s, c, p, v, u)``.
    Returns ``length`` bytes (1 ≤ length ≤ 8160).
    """
    if len(shared_secret) != KEY_BYTES:
        raise InvalidKeyError(f"an X25519 shared secret is {KEY_BYTES} bytes")
    if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= 255 * 32:
        raise CryptoParameterError(f"an HKDF-SHA256 output is 1 to 8160 bytes; got {length!r}")
    return hkdf_sha256(shared_secret, context.kdf_info(purpose, client_a, client_b), length)


_ZERO_SALT = bytes(32)


def hkdf_sha256(secret: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) without salt (the RFC's default: 32 zero bytes):
    ``PRK = HMAC(salt, secret)``, then ``T(i) = HMAC(PRK, T(i-1) | info | i)`` until
    ``length`` bytes (at most 8160). Byte for byte ``cryptography``'s ``HKDF(SHA256(),
    length, salt=None, info)`` (tested against it), with ``hmac.digest``'s one-shot C calls:
    a key agreement in a cluster derives two keys per peer, and HKDF objects cost more than
    the hashing."""
    prk = hmac.digest(_ZERO_SALT, secret, "sha256")
    blocks, block = [], b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes((counter,)), "sha256")
        blocks.append(block)
    return b"".join(blocks)[:length]


def pairwise_key(
    private: bytes | X25519KeyPair,
    peer_public: bytes,
    context: KeyContext,
    purpose: Purpose,
    own_id: int,
    peer_id: int,
    length: int = KEY_BYTES,
) -> bytes:
    """Key agreement then derivation: the key both u and v compute for ``purpose``.

    ``pairwise_key(sk_u, pk_v, c, p, u, v) == pairwise_key(sk_v, pk_u, c, p, v, u)``.
    Raises :class:`InvalidKeyError` (bad or low-order keys) and
    :class:`CryptoParameterError` (ids out of range, or ``own_id == peer_id``).
    """
    if own_id == peer_id:
        raise CryptoParameterError(f"a pairwise key needs two distinct clients; got {own_id} twice")
    return derive_key(agree(private, peer_public), context, purpose, own_id, peer_id, length)
