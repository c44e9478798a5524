"""AES-256-GCM for the share bundles that clients send to each other through the server.

The associated data binds (protocol version, round, reclustering, cluster, sender,
receiver), so the server can neither redirect a ciphertext to another receiver nor replay
it into another round, reclustering or cluster: decryption raises :class:`DecryptionError`.
Wire format: ``nonce (12 bytes) ‖ ciphertext ‖ tag (16 bytes)``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from sharefl.crypto.errors import CryptoParameterError, DecryptionError, InvalidKeyError
from sharefl.crypto.kdf import KEY_BYTES, KeyContext

NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD_BYTES = NONCE_BYTES + TAG_BYTES


@dataclass(frozen=True)
class Envelope:
    """Who sends a ciphertext to whom, and where in the protocol (the associated data)."""

    sender: int
    receiver: int
    context: KeyContext

    def associated_data(self) -> bytes:
        """Canonical bytes bound into the GCM tag."""
        return (
            b"sharefl/share\x00"
            + self.context.to_bytes()
            + struct.pack(">QQ", self.sender, self.receiver)
        )


def _aesgcm(key: bytes) -> AESGCM:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        raise InvalidKeyError(f"an AES-256-GCM key is {KEY_BYTES} bytes")
    return AESGCM(bytes(key))


def encrypt(
    key: bytes, plaintext: bytes, envelope: Envelope, *, nonce: bytes | None = None
) -> bytes:
    """Encrypt ``plaintext`` under a 32-byte ``key`` bound to ``envelope``.

    ``nonce`` defaults to 12 random bytes; pass one only in tests (a repeated nonce under one
    key breaks GCM). Returns ``nonce ‖ ciphertext ‖ tag`` (len(plaintext) + 28 bytes).
    """
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    if not isinstance(nonce, bytes | bytearray) or len(nonce) != NONCE_BYTES:
        raise CryptoParameterError(f"an AES-GCM nonce is {NONCE_BYTES} bytes")
    return nonce + _aesgcm(key).encrypt(nonce, plaintext, envelope.associated_data())


def decrypt(key: bytes, sealed: bytes, envelope: Envelope) -> bytes:
    """Decrypt what :func:`encrypt` produced for the same key and envelope.

    Raises :class:`DecryptionError` when the data is too short, was tampered with, was
    addressed to another receiver or from another sender, or belongs to another
    version/round/reclustering/cluster.
    """
    if len(sealed) < OVERHEAD_BYTES:
        raise DecryptionError(
            f"ciphertext of {len(sealed)} bytes is shorter than the {OVERHEAD_BYTES}-byte "
            "nonce and tag"
        )
    aesgcm = _aesgcm(key)
    try:
        return aesgcm.decrypt(
            sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], envelope.associated_data()
        )
    except InvalidTag as exc:
        raise DecryptionError(
            f"share bundle from client {envelope.sender} to client {envelope.receiver} does "
            f"not authenticate for {envelope.context}: tampered, misaddressed or replayed"
        ) from exc
