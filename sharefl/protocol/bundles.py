"""What travels inside a share bundle, and the commitment to a self-mask seed.

A share bundle from u to v is AES-256-GCM(key_uv, plaintext) where the plaintext is
``sender u64 ‖ receiver u64 ‖ share of u's mask secret key ‖ share of b_u`` (two
:data:`~sharefl.crypto.shamir.SHARE_BYTES`-byte shares). The ids are repeated inside the
plaintext as well as in the associated data, so a bundle is self-describing.

A holder's Shamir x-coordinate is its 1-based position in the cluster's sorted member list.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from sharefl.crypto.aead import OVERHEAD_BYTES
from sharefl.crypto.errors import ShamirError
from sharefl.crypto.kdf import KeyContext
from sharefl.crypto.shamir import SHARE_BYTES, Share
from sharefl.protocol.errors import ProtocolError

COMMITMENT_BYTES = 32
"""Size of a seed commitment (SHA-256, :func:`seed_commitment`)."""
PLAINTEXT_BYTES = 16 + 2 * SHARE_BYTES
SEALED_BYTES = PLAINTEXT_BYTES + OVERHEAD_BYTES


class BundleError(ProtocolError, ValueError):
    """A decrypted bundle does not parse or is addressed to somebody else."""


@dataclass(frozen=True)
class SharePair:
    """The two shares one holder keeps for one peer: of its mask key and of its seed b."""

    key_share: Share
    seed_share: Share

    def to_plaintext(self, sender: int, receiver: int) -> bytes:
        """The bundle plaintext (``PLAINTEXT_BYTES`` long)."""
        return (
            struct.pack(">QQ", sender, receiver)
            + self.key_share.to_bytes()
            + self.seed_share.to_bytes()
        )

    @classmethod
    def from_plaintext(cls, data: bytes, sender: int, receiver: int) -> SharePair:
        """Parse a bundle plaintext; raises :class:`BundleError` if it is malformed or its
        ids are not (sender, receiver)."""
        if len(data) != PLAINTEXT_BYTES:
            raise BundleError(f"bundle plaintext is {len(data)} bytes, want {PLAINTEXT_BYTES}")
        got = struct.unpack(">QQ", data[:16])
        if got != (sender, receiver):
            raise BundleError(f"bundle names {got}, expected ({sender}, {receiver})")
        try:
            key = Share.from_bytes(data[16 : 16 + SHARE_BYTES])
            seed = Share.from_bytes(data[16 + SHARE_BYTES :])
        except ShamirError as exc:
            raise BundleError(f"bundle holds a malformed share: {exc}") from exc
        return cls(key, seed)


def seed_commitment(context: KeyContext, client_id: int, seed: bytes) -> bytes:
    """SHA-256 commitment to the 32-byte self-mask seed b_u (hiding: b_u is uniform)."""
    return hashlib.sha256(
        b"sharefl/commit\x00" + context.to_bytes() + struct.pack(">Q", client_id) + seed
    ).digest()


def pair_commitment(context: KeyContext, a: int, b: int, seed: bytes) -> bytes:
    """SHA-256 commitment to the pair seed s_ab of one context (hiding: s_ab is a PRF
    output). Symmetric in ``a`` and ``b``: both ends of a pair commit to the same value."""
    lo, hi = sorted((a, b))
    return hashlib.sha256(
        b"sharefl/pair-commit\x00" + context.to_bytes() + struct.pack(">QQ", lo, hi) + seed
    ).digest()


def dealt_bytes(peers: int) -> int:
    """Sealed size of a two-exchange bundle of a dealer with ``peers`` neighbours."""
    return 16 + (1 + peers) * SHARE_BYTES + OVERHEAD_BYTES


@dataclass(frozen=True)
class DealtShares:
    """Two-exchange round: what dealer u gives holder h — h's share of b_u and of the pair
    seed s_uv of every neighbour v of u (``pairs``, keyed by v).

    Plaintext: ``dealer u64 ‖ holder u64 ‖ seed share ‖ pair shares in ascending v``; the
    neighbour list comes from the assignment, so the plaintext names no peer."""

    seed_share: Share
    pairs: dict[int, Share]

    def to_plaintext(self, dealer: int, holder: int) -> bytes:
        return (
            struct.pack(">QQ", dealer, holder)
            + self.seed_share.to_bytes()
            + b"".join(self.pairs[v].to_bytes() for v in sorted(self.pairs))
        )

    @classmethod
    def from_plaintext(
        cls, data: bytes, dealer: int, holder: int, peers: tuple[int, ...]
    ) -> DealtShares:
        """Parse a plaintext of ``dealer``, whose neighbours are ``peers`` (sorted); raises
        :class:`BundleError` if it is malformed or addressed to somebody else."""
        want = 16 + (1 + len(peers)) * SHARE_BYTES
        if len(data) != want:
            raise BundleError(f"bundle plaintext is {len(data)} bytes, want {want}")
        got = struct.unpack(">QQ", data[:16])
        if got != (dealer, holder):
            raise BundleError(f"bundle names {got}, expected ({dealer}, {holder})")
        try:
            shares = [
                Share.from_bytes(data[16 + i * SHARE_BYTES : 16 + (i + 1) * SHARE_BYTES])
                for i in range(1 + len(peers))
            ]
        except ShamirError as exc:
            raise BundleError(f"bundle holds a malformed share: {exc}") from exc
        return cls(shares[0], dict(zip(peers, shares[1:], strict=True)))
