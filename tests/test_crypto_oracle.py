"""A second implementation as oracle: the PRG and the AEAD against pycryptodome.

sharefl's crypto runs on ``cryptography`` (OpenSSL). Here every output is recomputed with
pycryptodome, an independent implementation, over keys, nonces, counters and lengths drawn
by hypothesis:

- PRG(seed) is AES-128 in CTR mode under ``seed[:16]`` from the 128-bit big-endian counter
  block ``seed[16:]``: the oracle encrypts the counter blocks one by one with AES-ECB (so it
  also pins the wrap from 2^128 − 1 to 0) and, away from the wrap, pycryptodome's own CTR
  mode; the words are little-endian uint32/uint64, reduced mod 2^b when masks are combined.
- The AEAD is AES-256-GCM with a 12-byte nonce, ``nonce ‖ ciphertext ‖ tag`` and the
  envelope's associated data, rebuilt here byte by byte from the format in docs.
- HKDF-SHA256, which sharefl computes with one-shot HMAC calls, against ``cryptography``'s
  HKDF and RFC 5869's test case 3.

pycryptodome is in the ``[test]`` extra: this module fails (never skips) without it.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import examples
from Crypto.Cipher import AES
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharefl.crypto.aead import Envelope, decrypt, encrypt
from sharefl.crypto.errors import DecryptionError
from sharefl.crypto.kdf import PLAN_DIGEST_BYTES, KeyContext, hkdf_sha256
from sharefl.crypto.prg import MaskExpander, combine_masks, expand_mask

_WORD = {32: "<u4", 64: "<u8"}


def _oracle_keystream(seed: bytes, nbytes: int) -> bytes:
    """AES-128-CTR keystream from counter blocks encrypted one by one (ECB), mod 2^128."""
    ecb = AES.new(seed[:16], AES.MODE_ECB)
    counter = int.from_bytes(seed[16:], "big")
    blocks = -(-nbytes // 16)
    counters = b"".join(((counter + i) % 2**128).to_bytes(16, "big") for i in range(blocks))
    return ecb.encrypt(counters)[:nbytes]


def _oracle_mask(seed: bytes, length: int, bits: int) -> np.ndarray:
    raw = _oracle_keystream(seed, length * bits // 8)
    return np.frombuffer(raw, dtype=_WORD[bits]).astype(np.uint32 if bits == 32 else np.uint64)


# Seeds whose counter half is sometimes within a few blocks of 2^128 (the wrap).
_near_wrap = st.integers(min_value=1, max_value=40).map(lambda k: (2**128 - k).to_bytes(16, "big"))
seeds = st.tuples(
    st.binary(min_size=16, max_size=16), st.one_of(st.binary(min_size=16, max_size=16), _near_wrap)
).map(lambda kc: kc[0] + kc[1])
lengths = st.one_of(st.integers(0, 70), st.integers(0, 5000))
bit_widths = st.sampled_from([32, 64])


@settings(max_examples=examples(150), deadline=None)
@given(seed=seeds, length=lengths, bits=bit_widths)
def test_prg_matches_aes_ctr_built_from_ecb(seed, length, bits):
    ours = expand_mask(seed, length, bits)
    np.testing.assert_array_equal(ours, _oracle_mask(seed, length, bits))


@settings(max_examples=examples(100), deadline=None)
@given(
    key=st.binary(min_size=16, max_size=16),
    counter=st.integers(0, 2**127),
    length=lengths,
    bits=bit_widths,
)
def test_prg_matches_pycryptodome_ctr_mode(key, counter, length, bits):
    seed = key + counter.to_bytes(16, "big")
    ctr = AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=counter.to_bytes(16, "big"))
    expected = np.frombuffer(ctr.encrypt(bytes(length * bits // 8)), dtype=_WORD[bits])
    np.testing.assert_array_equal(expand_mask(seed, length, bits), expected)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=seeds,
    length=st.integers(0, 600),
    bits=bit_widths,
    block_words=st.integers(1, 40),
)
def test_prg_block_boundaries_do_not_change_the_stream(seed, length, bits, block_words):
    """Small scratch blocks (multiples of 16 bytes) exercise every in-place/tail split."""
    expander = MaskExpander(bits, block_bytes=16 * block_words)
    np.testing.assert_array_equal(expander.expand(seed, length), _oracle_mask(seed, length, bits))
    out = np.empty(length, dtype=expander.dtype)
    assert expander.expand(seed, length, out=out) is out
    np.testing.assert_array_equal(out, _oracle_mask(seed, length, bits))


@settings(max_examples=examples(60), deadline=None)
@given(
    data=st.data(),
    length=st.integers(0, 3000),
    bits=bit_widths,
    count=st.integers(0, 4),
)
def test_combined_masks_match_the_oracle_mod_2_to_the_b(data, length, bits, count):
    dtype = np.uint32 if bits == 32 else np.uint64
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    vector = rng.integers(0, 2**bits, size=length, dtype=dtype, endpoint=False)
    masks = [(data.draw(seeds), data.draw(st.sampled_from([1, -1]))) for _ in range(count)]
    modulus = 2**bits
    expected = [int(x) for x in vector]
    for seed, sign in masks:
        words = _oracle_mask(seed, length, bits)
        expected = [(e + sign * int(w)) % modulus for e, w in zip(expected, words, strict=True)]
    out = np.empty(length, dtype=dtype)
    combine_masks(out, [vector], masks)
    assert [int(x) for x in out] == expected


def _associated_data(context: KeyContext, sender: int, receiver: int) -> bytes:
    """The envelope's associated data, rebuilt from its documented layout."""
    return (
        b"sharefl/share\x00"
        + struct.pack(
            ">IQII", context.version, context.round, context.reclustering, context.cluster
        )
        + context.plan
        + struct.pack(">QQ", sender, receiver)
    )


contexts = st.builds(
    KeyContext,
    round=st.integers(0, 2**64 - 1),
    reclustering=st.integers(0, 2**32 - 1),
    cluster=st.integers(0, 2**32 - 1),
    plan=st.one_of(st.just(b""), st.binary(min_size=PLAN_DIGEST_BYTES, max_size=PLAN_DIGEST_BYTES)),
)
ids = st.integers(0, 2**64 - 1)


@settings(max_examples=examples(150), deadline=None)
@given(
    key=st.binary(min_size=32, max_size=32),
    nonce=st.binary(min_size=12, max_size=12),
    plaintext=st.binary(max_size=600),
    context=contexts,
    sender=ids,
    receiver=ids,
)
def test_aead_matches_pycryptodome_gcm(key, nonce, plaintext, context, sender, receiver):
    envelope = Envelope(sender, receiver, context)
    sealed = encrypt(key, plaintext, envelope, nonce=nonce)

    gcm = AES.new(key, AES.MODE_GCM, nonce=nonce, mac_len=16)
    gcm.update(_associated_data(context, sender, receiver))
    ciphertext, tag = gcm.encrypt_and_digest(plaintext)
    assert sealed == nonce + ciphertext + tag

    # And the other way: what pycryptodome seals, sharefl opens.
    assert decrypt(key, nonce + ciphertext + tag, envelope) == plaintext


@settings(max_examples=examples(80), deadline=None)
@given(
    key=st.binary(min_size=32, max_size=32),
    plaintext=st.binary(min_size=1, max_size=200),
    context=contexts,
    sender=ids,
    receiver=ids,
    data=st.data(),
)
def test_aead_tampering_fails_in_both_implementations(
    key, plaintext, context, sender, receiver, data
):
    envelope = Envelope(sender, receiver, context)
    sealed = bytearray(encrypt(key, plaintext, envelope))
    position = data.draw(st.integers(0, len(sealed) - 1))
    sealed[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(DecryptionError):
        decrypt(key, bytes(sealed), envelope)
    gcm = AES.new(key, AES.MODE_GCM, nonce=bytes(sealed[:12]), mac_len=16)
    gcm.update(_associated_data(context, sender, receiver))
    with pytest.raises(ValueError, match="MAC check failed"):
        gcm.decrypt_and_verify(bytes(sealed[12:-16]), bytes(sealed[-16:]))


# -- HKDF-SHA256: sharefl's one-shot HMAC form against cryptography's HKDF and RFC 5869 ---


def test_hkdf_matches_rfc5869_test_case_3():
    """RFC 5869 A.3 (SHA-256, no salt, no info, L = 42)."""
    okm = hkdf_sha256(bytes([0x0B]) * 22, b"", 42)
    assert okm.hex() == (
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
    )


@given(
    secret=st.binary(min_size=0, max_size=80),
    info=st.binary(max_size=120),
    length=st.integers(1, 255 * 32),
)
def test_hkdf_matches_cryptography_byte_for_byte(secret, info, length):
    expected = HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)
    assert hkdf_sha256(secret, info, length) == expected
