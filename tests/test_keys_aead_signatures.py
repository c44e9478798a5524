"""Key agreement + HKDF context binding, AES-GCM envelopes, Ed25519 statements."""

from __future__ import annotations

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.crypto.aead import Envelope, decrypt, encrypt
from sharefl.crypto.errors import (
    CryptoParameterError,
    DecryptionError,
    InvalidKeyError,
    SignatureError,
)
from sharefl.crypto.kdf import (
    _PROBE,
    PROTOCOL_VERSION,
    KeyContext,
    Purpose,
    X25519KeyPair,
    agree,
    check_public_key,
    derive_key,
    pairwise_key,
)
from sharefl.crypto.signatures import (
    IdentityKey,
    advertised_keys_message,
    client_list_message,
    verify,
)

CTX = KeyContext(round=3, reclustering=1, cluster=2)


@pytest.fixture(scope="module")
def pair():
    return X25519KeyPair.generate(), X25519KeyPair.generate()


def test_both_sides_derive_the_same_key(pair):
    a, b = pair
    for purpose in Purpose:
        k_ab = pairwise_key(a.private, b.public, CTX, purpose, 7, 11)
        k_ba = pairwise_key(b.private, a.public, CTX, purpose, 11, 7)
        assert k_ab == k_ba and len(k_ab) == 32


def test_every_context_field_and_purpose_changes_the_key(pair):
    a, b = pair
    secret = agree(a.private, b.public)
    base = derive_key(secret, CTX, Purpose.MASK_SEED, 7, 11)
    variants = [
        derive_key(secret, CTX, Purpose.SHARE_ENCRYPTION, 7, 11),
        derive_key(
            secret, KeyContext(round=4, reclustering=1, cluster=2), Purpose.MASK_SEED, 7, 11
        ),
        derive_key(
            secret, KeyContext(round=3, reclustering=2, cluster=2), Purpose.MASK_SEED, 7, 11
        ),
        derive_key(
            secret, KeyContext(round=3, reclustering=1, cluster=3), Purpose.MASK_SEED, 7, 11
        ),
        derive_key(
            secret,
            KeyContext(round=3, reclustering=1, cluster=2, version=PROTOCOL_VERSION + 1),
            Purpose.MASK_SEED,
            7,
            11,
        ),
        derive_key(secret, CTX, Purpose.MASK_SEED, 7, 12),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_low_order_public_key_is_refused(pair):
    a, _ = pair
    with pytest.raises(InvalidKeyError, match="low-order"):
        agree(a.private, bytes(32))  # the all-zero point has order 1


P25519 = 2**255 - 19
ORDER = 2**252 + 27742317777372353535851937790883648493  # the prime subgroup's order
TWIST_ORDER = (2 * (P25519 + 1) - 8 * ORDER) // 4  # the twist's large prime factor
# u-coordinates of order dividing 8 on the curve or its twist: 0, 1, p - 1 and the two
# order-8 points; below 2^255 also 0 + p and 1 + p; X25519 ignores bit 255, so each again
# with that bit set: 14 encodings in all.
SMALL_ORDER_U = [
    0,
    1,
    P25519 - 1,
    0x00B8495F16056286FDB1329CEB8D09DA6AC49FF1FAE35616AEB8413B7C7AEBE0,
    0x57119FD0DD4E22D8868E1C58C45C44045BEF839C55B1D0B1248C50A3BC959C5F,
    P25519,
    P25519 + 1,
]
SMALL_ORDER_KEYS = [(u + top).to_bytes(32, "little") for u in SMALL_ORDER_U for top in (0, 2**255)]


def _ladder(k: int, u: int) -> int:
    """RFC 7748's Montgomery ladder, unclamped, in plain Python: the oracle for the tests."""
    x1, x2, z2, x3, z3, swap = u, 1, 0, u, 1, 0
    for t in reversed(range(k.bit_length())):
        bit = (k >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % P25519, (x2 - z2) % P25519
        aa, bb = a * a % P25519, b * b % P25519
        e = (aa - bb) % P25519
        c, d = (x3 + z3) % P25519, (x3 - z3) % P25519
        da, cb = d * a % P25519, c * b % P25519
        x3, z3 = (da + cb) ** 2 % P25519, x1 * (da - cb) ** 2 % P25519
        x2, z2 = aa * bb % P25519, e * (aa + 121665 * e) % P25519
    if swap:
        x2, z2 = x3, z3
    return x2 * pow(z2, P25519 - 2, P25519) % P25519


@pytest.mark.parametrize("key", SMALL_ORDER_KEYS, ids=lambda k: k.hex()[:8] + k.hex()[-2:])
def test_every_small_order_encoding_is_refused(key):
    u = int.from_bytes(key, "little") % 2**255 % P25519
    assert _ladder(8, u) == 0  # the oracle: 8·P is the identity, so the point is low-order
    with pytest.raises(InvalidKeyError, match="low-order"):
        check_public_key(key)


def test_honest_keys_pass_the_low_order_check_and_the_probe_scalar_is_sound():
    for _ in range(20):
        public = X25519KeyPair.generate().public
        assert _ladder(8, int.from_bytes(public, "little") % 2**255) != 0
        check_public_key(public)
    scalar = int.from_bytes(_PROBE.private_bytes_raw(), "little")
    # Clamped, and not a multiple of either large prime order: only a point of order
    # dividing 8 can give an all-zero result.
    assert scalar % 8 == 0 and scalar >> 254 == 1
    assert scalar % ORDER and scalar % TWIST_ORDER


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33), "x" * 32])
def test_check_public_key_refuses_wrong_lengths_and_types(bad):
    with pytest.raises(InvalidKeyError, match="32 raw bytes"):
        check_public_key(bad)


@pytest.mark.parametrize("bad", [b"", bytes(31), bytes(33)])
def test_wrong_key_lengths(pair, bad):
    a, _ = pair
    with pytest.raises(InvalidKeyError):
        agree(a.private, bad)
    with pytest.raises(InvalidKeyError):
        X25519KeyPair.from_private(bad)


def test_context_validation_and_self_pair(pair):
    with pytest.raises(CryptoParameterError):
        KeyContext(round=-1)
    with pytest.raises(CryptoParameterError):
        KeyContext(round=0, cluster=2**32)
    with pytest.raises(CryptoParameterError, match="digest"):
        KeyContext(round=0, plan=b"short")
    a, b = pair
    with pytest.raises(CryptoParameterError, match="distinct"):
        pairwise_key(a.private, b.public, CTX, Purpose.MASK_SEED, 5, 5)
    with pytest.raises(CryptoParameterError, match="8160"):
        derive_key(bytes(32), CTX, Purpose.MASK_SEED, 1, 2, length=0)
    with pytest.raises(CryptoParameterError, match="nonce"):
        encrypt(bytes(32), b"x", Envelope(1, 2, CTX), nonce=bytes(11))


def test_private_key_not_in_repr(pair):
    a, _ = pair
    assert a.private.hex() not in repr(a)
    ident = IdentityKey.generate()
    assert ident.private.hex() not in repr(ident)


# --- AEAD ---------------------------------------------------------------------------------

KEY = bytes(range(32))
ENV = Envelope(sender=1, receiver=2, context=CTX)


@settings(max_examples=examples(30), deadline=None)
@given(plaintext=st.binary(max_size=300))
def test_roundtrip(plaintext):
    sealed = encrypt(KEY, plaintext, ENV)
    assert len(sealed) == len(plaintext) + 28
    assert decrypt(KEY, sealed, ENV) == plaintext


@settings(max_examples=examples(30), deadline=None)
@given(plaintext=st.binary(min_size=1, max_size=100), data=st.data())
def test_any_flipped_bit_is_detected(plaintext, data):
    sealed = bytearray(encrypt(KEY, plaintext, ENV))
    i = data.draw(st.integers(0, len(sealed) - 1))
    sealed[i] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(DecryptionError):
        decrypt(KEY, bytes(sealed), ENV)


@pytest.mark.parametrize(
    "other",
    [
        Envelope(sender=1, receiver=3, context=CTX),  # redirected to another receiver
        Envelope(sender=4, receiver=2, context=CTX),  # claimed to come from someone else
        Envelope(sender=1, receiver=2, context=KeyContext(round=4, reclustering=1, cluster=2)),
        Envelope(sender=1, receiver=2, context=KeyContext(round=3, reclustering=0, cluster=2)),
        Envelope(sender=1, receiver=2, context=KeyContext(round=3, reclustering=1, cluster=9)),
    ],
)
def test_wrong_receiver_or_replay_is_refused(other):
    sealed = encrypt(KEY, b"shares", ENV)
    with pytest.raises(DecryptionError):
        decrypt(KEY, sealed, other)


def test_wrong_key_truncation_and_bad_key_length():
    sealed = encrypt(KEY, b"shares", ENV)
    with pytest.raises(DecryptionError):
        decrypt(bytes(32), sealed, ENV)
    with pytest.raises(DecryptionError, match="shorter"):
        decrypt(KEY, sealed[:20], ENV)
    with pytest.raises(InvalidKeyError):
        encrypt(b"k" * 16, b"x", ENV)


# --- signatures ---------------------------------------------------------------------------


def test_advertised_keys_signature_binds_every_field():
    ident = IdentityKey.generate()
    enc, mask = X25519KeyPair.generate().public, X25519KeyPair.generate().public
    message = advertised_keys_message(5, CTX, enc, mask, b"commit")
    sig = ident.sign(message)
    verify(ident.public, message, sig)
    forged = [
        advertised_keys_message(6, CTX, enc, mask, b"commit"),
        advertised_keys_message(
            5, KeyContext(round=4, reclustering=1, cluster=2), enc, mask, b"commit"
        ),
        advertised_keys_message(5, CTX, mask, enc, b"commit"),  # swapped keys
        advertised_keys_message(5, CTX, enc, bytes(32), b"commit"),  # substituted key
        advertised_keys_message(5, CTX, enc, mask, b""),
    ]
    for other in forged:
        with pytest.raises(SignatureError):
            verify(ident.public, other, sig)
    with pytest.raises(SignatureError):
        verify(IdentityKey.generate().public, message, sig)


def test_client_list_signature():
    ident = IdentityKey.generate()
    message = client_list_message(CTX, [3, 1, 2], "survivors")
    assert message == client_list_message(CTX, [1, 2, 3], "survivors")
    sig = ident.sign(message)
    verify(ident.public, message, sig)
    for other in (
        client_list_message(CTX, [1, 2], "survivors"),
        client_list_message(CTX, [1, 2, 3], "dropped"),
        client_list_message(KeyContext(round=9), [1, 2, 3], "survivors"),
    ):
        with pytest.raises(SignatureError):
            verify(ident.public, other, sig)
    with pytest.raises(CryptoParameterError, match="duplicates"):
        client_list_message(CTX, [1, 1], "survivors")


@pytest.mark.parametrize(
    "public,sig", [(bytes(31), bytes(64)), (bytes(32), bytes(63)), (bytes(32), bytes(64))]
)
def test_malformed_signature_material(public, sig):
    with pytest.raises(SignatureError):
        verify(public, b"m", sig)
