"""Named exceptions of :mod:`sharefl.crypto`.

Every error a caller can cause (bad parameters, tampered data, unsafe configuration)
raises a subclass of :class:`CryptoError` with a message that says what to change.
Misuse by the programmer that is also a bad argument (wrong length, wrong type) raises a
subclass that also derives from :class:`ValueError`, so generic handlers still work.
"""

from __future__ import annotations

from sharefl.errors import ShareflError


class CryptoError(ShareflError):
    """Base class of every error raised by :mod:`sharefl.crypto`."""


class CryptoParameterError(CryptoError, ValueError):
    """A parameter outside its domain: a context field out of range, a plan digest of the
    wrong length, a nonce or derived-key length out of range, a client paired with itself,
    a client list with duplicates. The message names the parameter and its allowed values."""


class InvalidKeyError(CryptoError, ValueError):
    """A key has the wrong length or encoding, or is a low-order X25519 point."""


class DecryptionError(CryptoError):
    """AEAD decryption failed: the ciphertext was tampered with, is addressed to another
    receiver, or belongs to another round, reclustering or cluster."""


class SignatureError(CryptoError):
    """An Ed25519 signature does not verify for the claimed signer and message."""


class PRGError(CryptoError, ValueError):
    """Bad arguments to the mask generator (seed length, bit width, buffer shape/dtype)."""


class ShamirError(CryptoError, ValueError):
    """Bad Shamir parameters or shares: t < 2, t > n, duplicate or zero x-coordinates,
    secrets out of range, or too few shares to reconstruct."""


class ShareVerificationError(ShamirError):
    """No subset of the given shares reconstructs a secret that passes the verification
    predicate (too many corrupted shares)."""


class EncodingError(CryptoError, ValueError):
    """Bad fixed-point encoding input (non-finite values, wrong dtype, shape mismatch)."""


class UnsafeEncodingError(EncodingError):
    """The ring Z_2^b is too small: the sum of the configured number of clients could wrap
    around. Lower the fractional bits, the clipping range or the cluster size, or use b = 64."""


class SumOutOfRange(EncodingError):
    """A decoded sum lies outside what the honest summands could add up to: some summand was
    out of range (a Byzantine input), masks did not cancel, or encodings differed. The
    secure-aggregation coordinator flags such a cluster sum as corrupted instead of using it."""
