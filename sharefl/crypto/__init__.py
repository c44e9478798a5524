"""Cryptographic core of sharefl.

- :mod:`~sharefl.crypto.kdf` — X25519 key agreement and HKDF-SHA256 bound to a context.
- :mod:`~sharefl.crypto.aead` — AES-256-GCM share bundles bound to sender, receiver, round.
- :mod:`~sharefl.crypto.signatures` — Ed25519 identities and the protocol's signed statements.
- :mod:`~sharefl.crypto.prg` — AES-CTR mask expansion into Z_2^32 / Z_2^64, fused accumulate.
- :mod:`~sharefl.crypto.shamir` — t-of-n Shamir over GF(2^256 + 297), batched and verified.
- :mod:`~sharefl.crypto.encoding` — fixed-point encoding of floats into Z_2^b, overflow-checked.

Every misuse raises a subclass of :class:`~sharefl.crypto.errors.CryptoError`.
"""

from sharefl.crypto.aead import Envelope, decrypt, encrypt
from sharefl.crypto.encoding import RingEncoding, choose_encoding, decode, encode, encode_into
from sharefl.crypto.errors import (
    CryptoError,
    CryptoParameterError,
    DecryptionError,
    EncodingError,
    InvalidKeyError,
    PRGError,
    ShamirError,
    ShareVerificationError,
    SignatureError,
    UnsafeEncodingError,
)
from sharefl.crypto.kdf import (
    PROTOCOL_VERSION,
    KeyContext,
    Purpose,
    X25519KeyPair,
    agree,
    derive_key,
    pairwise_key,
    x25519_public_key,
)
from sharefl.crypto.prg import (
    MaskExpander,
    accumulate_mask,
    combine_masks,
    expand_mask,
    ring_dtype,
)
from sharefl.crypto.shamir import (
    PRIME,
    Reconstructor,
    Share,
    VerifiedSecret,
    reconstruct,
    reconstruct_many,
    reconstruct_verified,
    split,
    split_many,
)
from sharefl.crypto.signatures import (
    IdentityKey,
    advertised_keys_message,
    client_list_message,
    verify,
)

__all__ = [
    "PRIME",
    "PROTOCOL_VERSION",
    "CryptoError",
    "CryptoParameterError",
    "DecryptionError",
    "EncodingError",
    "Envelope",
    "IdentityKey",
    "InvalidKeyError",
    "KeyContext",
    "MaskExpander",
    "PRGError",
    "Purpose",
    "Reconstructor",
    "RingEncoding",
    "ShamirError",
    "Share",
    "ShareVerificationError",
    "SignatureError",
    "UnsafeEncodingError",
    "VerifiedSecret",
    "X25519KeyPair",
    "accumulate_mask",
    "advertised_keys_message",
    "agree",
    "choose_encoding",
    "client_list_message",
    "combine_masks",
    "decode",
    "decrypt",
    "derive_key",
    "encode",
    "encode_into",
    "encrypt",
    "expand_mask",
    "pairwise_key",
    "reconstruct",
    "reconstruct_many",
    "reconstruct_verified",
    "ring_dtype",
    "split",
    "split_many",
    "verify",
    "x25519_public_key",
]
