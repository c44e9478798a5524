"""Ed25519 identity keys and every statement a client signs.

When the server is not trusted to behave, clients sign (a) the keys they advertise for a
(round, reclustering, cluster), so the server cannot substitute its own, and (b) the list
of clients they saw survive to the masked-input stage (the consistency check), so the
server cannot show different lists to different clients. The transports bind a connection
to a directory id with a hello: (c) over sharefl's gRPC stream
(:func:`stream_hello_message`), (d) inside Flower, where the node id is Flower's
(:func:`node_hello_message`). Messages are canonical, domain-separated byte strings (each
tag differs from every other); :func:`verify` raises :class:`SignatureError`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sharefl.crypto.errors import CryptoParameterError, InvalidKeyError, SignatureError
from sharefl.crypto.kdf import KEY_BYTES, KeyContext

SIGNATURE_BYTES = 64
HELLO_NONCE_BYTES = 32
STREAM_HELLO_TAG = b"sharefl/hello\x00"
NODE_HELLO_TAG = b"sharefl/flower-hello\x00"


@dataclass(frozen=True, repr=False)
class IdentityKey:
    """A client's long-term Ed25519 identity: raw 32-byte private seed and public key."""

    private: bytes
    public: bytes

    @classmethod
    def generate(cls) -> IdentityKey:
        """A fresh identity from the operating system's CSPRNG."""
        return cls.from_private(Ed25519PrivateKey.generate().private_bytes_raw())

    @classmethod
    def from_private(cls, private: bytes) -> IdentityKey:
        """The identity of a raw 32-byte Ed25519 private key; raises :class:`InvalidKeyError`."""
        if not isinstance(private, bytes | bytearray) or len(private) != KEY_BYTES:
            raise InvalidKeyError(f"an Ed25519 private key is {KEY_BYTES} raw bytes")
        key = Ed25519PrivateKey.from_private_bytes(bytes(private))
        return cls(private=bytes(private), public=key.public_key().public_bytes_raw())

    def sign(self, message: bytes) -> bytes:
        """64-byte Ed25519 signature of ``message``."""
        return Ed25519PrivateKey.from_private_bytes(self.private).sign(message)

    def __repr__(self) -> str:
        return f"IdentityKey(public={self.public.hex()[:16]}…)"


def verify(public: bytes, message: bytes, signature: bytes) -> None:
    """Check an Ed25519 signature; return None or raise :class:`SignatureError`.

    A public key or signature of the wrong length is also a :class:`SignatureError` (the
    peer sent garbage), never an unhandled exception.
    """
    if len(public) != KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        raise SignatureError(
            f"malformed signature material: public key {len(public)} bytes (want {KEY_BYTES}),"
            f" signature {len(signature)} bytes (want {SIGNATURE_BYTES})"
        )
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public)).verify(bytes(signature), message)
    except (InvalidSignature, ValueError) as exc:
        raise SignatureError("Ed25519 signature does not verify") from exc


def advertised_keys_message(
    client_id: int,
    context: KeyContext,
    encryption_public: bytes,
    mask_public: bytes,
    commitment: bytes = b"",
) -> bytes:
    """Canonical bytes a client signs when advertising its two X25519 public keys.

    ``commitment`` is an optional commitment to the self-mask seed (empty when unused).
    """
    for name, key in (("encryption", encryption_public), ("mask", mask_public)):
        if len(key) != KEY_BYTES:
            raise InvalidKeyError(f"the {name} public key is {KEY_BYTES} bytes, got {len(key)}")
    return (
        b"sharefl/advertise\x00"
        + context.to_bytes()
        + struct.pack(">Q", client_id)
        + bytes(encryption_public)
        + bytes(mask_public)
        + struct.pack(">H", len(commitment))
        + bytes(commitment)
    )


def client_list_message(context: KeyContext, client_ids: Iterable[int], label: str) -> bytes:
    """Canonical bytes for a set of client ids (sorted, deduplicated check) under ``label``.

    ``label`` names the list (e.g. ``"survivors"``) so a signature on one list is never
    valid for another. Raises :class:`CryptoParameterError` on duplicate ids.
    """
    ids = sorted(client_ids)
    if len(set(ids)) != len(ids):
        raise CryptoParameterError("a signed client list must not contain duplicates")
    tag = label.encode()
    return (
        b"sharefl/list\x00"
        + struct.pack(">H", len(tag))
        + tag
        + context.to_bytes()
        + struct.pack(f">I{len(ids)}Q", len(ids), *ids)
    )


def _check_hello(nonce: bytes, *ids: int) -> None:
    if len(nonce) != HELLO_NONCE_BYTES:
        raise CryptoParameterError(f"a hello nonce is {HELLO_NONCE_BYTES} bytes, got {len(nonce)}")
    if not all(0 <= i < 2**64 for i in ids):
        raise CryptoParameterError(f"ids are in [0, 2^64), got {list(ids)}")


def stream_hello_message(nonce: bytes, client_id: int) -> bytes:
    """What a client signs to authenticate its gRPC stream as ``client_id``, answering the
    server's fresh ``nonce`` (no replay on another stream). Raises
    :class:`CryptoParameterError` for a nonce of the wrong size or an id outside
    [0, 2^64)."""
    _check_hello(nonce, client_id)
    return STREAM_HELLO_TAG + bytes(nonce) + client_id.to_bytes(8, "big")


def node_hello_message(node_id: int, client_id: int, nonce: bytes) -> bytes:
    """What a client signs in a Flower round's ``hello`` stage: it is ``client_id`` of the
    directory, reachable as Flower node ``node_id``, answering the server's fresh ``nonce``.
    The node id (which Flower authenticates as the reply's sender) stops another node
    replaying it; the nonce stops a replay in a later round. Raises
    :class:`CryptoParameterError` for a nonce of the wrong size or an id outside
    [0, 2^64)."""
    _check_hello(nonce, node_id, client_id)
    return NODE_HELLO_TAG + struct.pack(">QQ", node_id, client_id) + bytes(nonce)
