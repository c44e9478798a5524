"""Keys set up once: the long-term X25519 pairs of the two-exchange round.

In the four-exchange round (protocol version 4) every cluster of every round starts with a
key exchange. In the two-exchange round (version 5,
:data:`~sharefl.crypto.kdf.TWO_EXCHANGE_VERSION`) each client advertises two X25519
public keys once per *scope* (the server it talks to: its identity digest, or a run) in a
:class:`KeyAdvert`; the server relays the adverts of a cluster's members with the
cluster's assignment. Every per-cluster secret is derived from the pairwise agreement with
the cluster's :class:`~sharefl.crypto.kdf.KeyContext` bound into HKDF
(:func:`~sharefl.crypto.kdf.derive_key`), as Flamingo (Ma et al., IEEE S&P 2023) reuses its
pairwise secrets:

- the pair seed s_uv^c = HKDF(DH(mask_u, mask_v), c, MASK_SEED, u, v);
- the share-encryption key k_uv^c = HKDF(DH(enc_u, enc_v), c, SHARE_ENCRYPTION, u, v).

Why reuse is safe: HKDF is a PRF keyed by the agreement, so the seeds of distinct
contexts are independent; a seed the server learns for one context (a dropped peer's pair
seed) says nothing about any other. The private keys never leave the client, and no share
of them is ever dealt (the recovery of a dropped client uses shares of its per-context
pair seeds, :mod:`sharefl.protocol.client`), so nothing the server collects in any
number of rounds rebuilds a long-term key. What reuse costs: a client's long-term keys,
stolen from the client, expose the pair masks of every context of the scope (the
self-mask seeds stay fresh per context); a client limits that by advertising new keys
(a fresh :class:`ClientKeys`, e.g. per run).

Signed mode: an advert is signed with the client's Ed25519 identity over its scope, id and
keys (:meth:`KeyAdvert.statement`), so the server can neither substitute keys nor move an
advert to another scope.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from sharefl.crypto.errors import CryptoError, InvalidKeyError, SignatureError
from sharefl.crypto.kdf import (
    KEY_BYTES,
    KeyContext,
    Purpose,
    X25519KeyPair,
    agree,
    check_public_key,
    derive_key,
)
from sharefl.crypto.signatures import SIGNATURE_BYTES, IdentityKey, verify
from sharefl.protocol.errors import BadAdvertisement
from sharefl.protocol.fields import check_bytes, check_id, fail

MAX_SCOPE_BYTES = 64
"""The longest scope a key advert may name."""
KEY_ADVERT_TAG = b"sharefl/long-term-keys\x00"


@dataclass(frozen=True)
class KeyAdvert:
    """A client's two long-term X25519 public keys for one scope (client → server once;
    relayed by the server inside every two-exchange :class:`ClusterAssignment`).

    Attributes:
        sender: the client's id.
        scope: what the keys are bound to (at most :data:`MAX_SCOPE_BYTES` bytes; e.g.
            the server identity's digest); part of the signed statement.
        encryption_public: X25519 key of the share-encryption agreement.
        mask_public: X25519 key of the pair-seed agreement.
        signature: Ed25519 signature over :meth:`statement` (signed mode), else empty.
    """

    sender: int
    scope: bytes
    encryption_public: bytes
    mask_public: bytes
    signature: bytes = b""

    def __post_init__(self) -> None:
        check_id("KeyAdvert.sender", self.sender)
        if not isinstance(self.scope, bytes) or len(self.scope) > MAX_SCOPE_BYTES:
            got = len(self.scope) if isinstance(self.scope, bytes) else type(self.scope).__name__
            raise fail("KeyAdvert.scope", f"bytes, at most {MAX_SCOPE_BYTES}", got)
        check_bytes("KeyAdvert.encryption_public", self.encryption_public, (KEY_BYTES,))
        check_bytes("KeyAdvert.mask_public", self.mask_public, (KEY_BYTES,))
        check_bytes("KeyAdvert.signature", self.signature, (0, SIGNATURE_BYTES))

    def statement(self) -> bytes:
        """The canonical bytes ``signature`` signs: tag, scope length and scope, id, keys."""
        return (
            KEY_ADVERT_TAG
            + struct.pack(">H", len(self.scope))
            + bytes(self.scope)
            + struct.pack(">Q", self.sender)
            + bytes(self.encryption_public)
            + bytes(self.mask_public)
        )


def check_key_advert(advert: KeyAdvert, identity_public: bytes | None = None) -> None:
    """Refuse an advert no honest client sends: raise :class:`BadAdvertisement` for keys
    that are low-order or otherwise unusable, and for what
    :func:`check_advert_fields` refuses. The server's check: it holds no private key to
    agree with, so it tests each key's order with a probe."""
    check_advert_fields(advert, identity_public)
    for what, key in (("encryption", advert.encryption_public), ("mask", advert.mask_public)):
        try:
            check_public_key(key)
        except InvalidKeyError as exc:
            raise BadAdvertisement(
                f"client {advert.sender}: {what} public key refused: {exc}"
            ) from exc


def check_advert_fields(advert: KeyAdvert, identity_public: bytes | None = None) -> None:
    """Raise :class:`BadAdvertisement` for equal encryption and mask keys and — when
    ``identity_public`` is given (signed mode) — a signature that does not verify. The
    sizes (32-byte keys, a scope of at most :data:`MAX_SCOPE_BYTES`, a signature empty or
    of 64 bytes) are the advert's own: :class:`KeyAdvert` refuses to exist without them.

    Not the keys' order: a client checks the adverts of its cluster with this alone, since
    the only keys that touch its secrets are those it agrees with, and the agreement itself
    refuses a low-order key (:meth:`ClientKeys.derive`) before anything leaves the client.
    """
    who = f"client {advert.sender}"
    if advert.encryption_public == advert.mask_public:
        raise BadAdvertisement(f"{who}: the encryption and mask public keys must differ")
    if identity_public is not None:
        try:
            verify(identity_public, advert.statement(), advert.signature)
        except SignatureError as exc:
            raise BadAdvertisement(
                f"{who}: the key advert is not signed by its identity key (substituted keys?)"
            ) from exc


def check_distinct_keys(adverts: Iterable[KeyAdvert]) -> None:
    """Raise :class:`BadAdvertisement` when two adverts (or one) repeat a public key: a key
    copied from another client would let its owner read shares meant for the copier."""
    seen: dict[bytes, int] = {}
    for advert in adverts:
        for key in (advert.encryption_public, advert.mask_public):
            if key in seen:
                raise BadAdvertisement(
                    f"client {advert.sender} advertised a public key client {seen[key]} "
                    "already advertised"
                )
            seen[key] = advert.sender


@dataclass(frozen=True, repr=False)
class ClientKeys:
    """One client's long-term key pairs for one scope; ``repr`` shows no private key.

    The pairwise agreements are computed once per peer key and kept (:meth:`derive`), so a
    round costs one HKDF per peer and purpose, not one X25519 agreement.
    """

    client_id: int
    scope: bytes
    encryption: X25519KeyPair
    mask: X25519KeyPair
    _agreed: dict[tuple[Purpose, bytes], bytes] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def generate(
        cls, client_id: int, scope: bytes = b"", randbytes: Callable[[int], bytes] = os.urandom
    ) -> ClientKeys:
        """Fresh key pairs from ``randbytes`` (a cryptographic source)."""
        if len(scope) > MAX_SCOPE_BYTES:
            raise InvalidKeyError(f"a key scope is at most {MAX_SCOPE_BYTES} bytes")
        return cls(
            client_id,
            bytes(scope),
            X25519KeyPair.from_private(randbytes(KEY_BYTES)),
            X25519KeyPair.from_private(randbytes(KEY_BYTES)),
        )

    @classmethod
    def from_private(
        cls, client_id: int, scope: bytes, encryption_private: bytes, mask_private: bytes
    ) -> ClientKeys:
        """The keys of saved private halves; raises :class:`InvalidKeyError`."""
        return cls(
            client_id,
            bytes(scope),
            X25519KeyPair.from_private(encryption_private),
            X25519KeyPair.from_private(mask_private),
        )

    def advert(self, identity: IdentityKey | None = None) -> KeyAdvert:
        """The advert of these keys, signed with ``identity`` when given."""
        advert = KeyAdvert(
            self.client_id, self.scope, self.encryption.public, self.mask.public, b""
        )
        if identity is None:
            return advert
        return KeyAdvert(
            advert.sender,
            advert.scope,
            advert.encryption_public,
            advert.mask_public,
            identity.sign(advert.statement()),
        )

    def derive(self, peer: KeyAdvert, context: KeyContext, purpose: Purpose) -> bytes:
        """The per-context key this client shares with ``peer`` for ``purpose``:
        HKDF(DH(own, peer's), context, purpose, own id, peer id). Raises
        :class:`BadAdvertisement` for an unusable peer key or a peer with this client's id."""
        own = self.mask if purpose is Purpose.MASK_SEED else self.encryption
        public = peer.mask_public if purpose is Purpose.MASK_SEED else peer.encryption_public
        if peer.sender == self.client_id:
            raise BadAdvertisement(f"client {peer.sender}: a pairwise key needs another client")
        try:
            secret = self._agreed.get((purpose, public))
            if secret is None:
                secret = agree(own, public)
                self._agreed[(purpose, public)] = secret
            return derive_key(secret, context, purpose, self.client_id, peer.sender)
        except (CryptoError, ValueError) as exc:
            raise BadAdvertisement(
                f"client {peer.sender} advertised an unusable X25519 public key ({exc})"
            ) from exc


def adverts_by_sender(adverts: Iterable[KeyAdvert]) -> Mapping[int, KeyAdvert]:
    """``{sender: advert}``; raises :class:`BadAdvertisement` for two adverts of a sender."""
    result: dict[int, KeyAdvert] = {}
    for advert in adverts:
        if advert.sender in result:
            raise BadAdvertisement(f"two key adverts for client {advert.sender}")
        result[advert.sender] = advert
    return result
