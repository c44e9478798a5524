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
