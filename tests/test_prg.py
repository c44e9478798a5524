"""PRG mask expansion: determinism, independence, cancellation, buffer contracts."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import examples
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.crypto.errors import PRGError
from sharefl.crypto.prg import MaskExpander, accumulate_mask, combine_masks, expand_mask

seeds = st.binary(min_size=32, max_size=32)
lengths = st.one_of(st.sampled_from([0, 1, 2, 3, 5, 7, 4095, 4097]), st.integers(0, 70_000))


def reference_mask(seed: bytes, length: int, bits: int) -> np.ndarray:
    """Independent reference: one full AES-128-CTR keystream read little-endian."""
    nbytes = length * bits // 8
    enc = Cipher(algorithms.AES(seed[:16]), modes.CTR(seed[16:])).encryptor()
    stream = enc.update(bytes(nbytes)) + enc.finalize()
    return np.frombuffer(stream, dtype="<u4" if bits == 32 else "<u8").astype(
        np.uint32 if bits == 32 else np.uint64
    )


def test_known_answer_is_fixed_across_machines():
    # First words of PRG(0^32): AES-128(key=0^16) of counter block 0^16 is the well-known
    # 66e94bd4ef8a2c3b884cfa59ca342b2e, read as little-endian words.
    mask = expand_mask(bytes(32), 4, bits=32)
    assert mask.tobytes().hex() == "66e94bd4ef8a2c3b884cfa59ca342b2e"
    assert mask[0] == 0xD44BE966


@settings(max_examples=examples(60), deadline=None)
@given(seed=seeds, length=lengths, bits=st.sampled_from([32, 64]))
def test_expand_matches_reference_and_is_deterministic(seed, length, bits):
    expander = MaskExpander(bits, block_bytes=4096)
    first = expander.expand(seed, length)
    again = expand_mask(seed, length, bits)
    np.testing.assert_array_equal(first, reference_mask(seed, length, bits))
    np.testing.assert_array_equal(first, again)


@settings(max_examples=examples(60), deadline=None)
@given(seed=seeds, length=lengths, bits=st.sampled_from([32, 64]), data=st.data())
def test_add_then_subtract_is_identity(seed, length, bits, data):
    dtype = np.uint32 if bits == 32 else np.uint64
    start = np.frombuffer(
        data.draw(st.binary(min_size=length * bits // 8, max_size=length * bits // 8)), dtype=dtype
    ).copy()
    acc = start.copy()
    expander = MaskExpander(bits, block_bytes=1024)
    expander.accumulate(acc, seed, +1)
    if length:
        expected = start + reference_mask(seed, length, bits)  # wraps mod 2^b
        np.testing.assert_array_equal(acc, expected)
    expander.accumulate(acc, seed, -1)
    np.testing.assert_array_equal(acc, start)


def test_pairwise_masks_cancel_in_a_sum():
    rng = np.random.default_rng(0)
    n, d = 5, 1001
    inputs = rng.integers(0, 2**32, size=(n, d), dtype=np.uint32)
    pair_seed = {(u, v): os.urandom(32) for u in range(n) for v in range(u + 1, n)}
    total = np.zeros(d, np.uint32)
    for u in range(n):
        y = inputs[u].copy()
        for v in range(n):
            if v > u:
                accumulate_mask(y, pair_seed[(u, v)], +1)
            elif v < u:
                accumulate_mask(y, pair_seed[(v, u)], -1)
        total += y
    np.testing.assert_array_equal(total, inputs.sum(axis=0, dtype=np.uint32))


def test_distinct_seeds_look_independent_chi_square():
    """Byte frequencies of masks from related seeds are uniform and uncorrelated."""
    base = bytearray(32)
    masks = []
    for i in range(4):
        base[31] = i  # seeds that differ in one bit of the counter block / key
        masks.append(expand_mask(bytes(base), 1 << 16).view(np.uint8))
    base[0] = 1
    masks.append(expand_mask(bytes(base), 1 << 16).view(np.uint8))
    # 255 degrees of freedom: the 99.99% quantile of chi2(255) is about 346.
    for m in masks:
        counts = np.bincount(m, minlength=256)
        expected = m.size / 256
        assert ((counts - expected) ** 2 / expected).sum() < 346
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            # XOR of two independent uniform streams is uniform too; and they differ.
            x = masks[a] ^ masks[b]
            counts = np.bincount(x, minlength=256)
            expected = x.size / 256
            assert ((counts - expected) ** 2 / expected).sum() < 346
            assert np.mean(masks[a] == masks[b]) < 0.01


def test_expand_into_reused_buffer():
    out = np.full(10, 7, dtype=np.uint32)
    result = expand_mask(b"\x01" * 32, 10, out=out)
    assert result is out
    np.testing.assert_array_equal(out, reference_mask(b"\x01" * 32, 10, 32))


@pytest.mark.parametrize(
    "call",
    [
        lambda: expand_mask(b"short", 4),
        lambda: expand_mask(bytes(32), 4, bits=16),
        lambda: expand_mask(bytes(32), -1),
        lambda: expand_mask(bytes(32), 4, out=np.zeros(5, np.uint32)),
        lambda: expand_mask(bytes(32), 4, out=np.zeros(4, np.int32)),
        lambda: accumulate_mask(np.zeros(4, np.float32), bytes(32)),
        lambda: accumulate_mask(np.zeros((2, 2), np.uint32), bytes(32)),
        lambda: accumulate_mask(np.zeros(8, np.uint32)[::2], bytes(32)),
        lambda: accumulate_mask(np.zeros(4, np.uint32), bytes(32), sign=2),
        lambda: MaskExpander(32, block_bytes=100),
    ],
)
def test_misuse_raises_prg_error(call):
    with pytest.raises(PRGError):
        call()


@settings(max_examples=examples(40), deadline=None)
@given(
    length=lengths,
    bits=st.sampled_from([32, 64]),
    nvec=st.integers(0, 3),
    signs=st.lists(st.sampled_from([1, -1]), max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_combine_equals_sum_of_vectors_and_signed_masks(length, bits, nvec, signs, seed):
    dtype = np.uint32 if bits == 32 else np.uint64
    rng = np.random.default_rng(seed)
    vectors = [
        rng.integers(0, np.iinfo(dtype).max, length, dtype=dtype, endpoint=True)
        for _ in range(nvec)
    ]
    masks = [(rng.bytes(32), s) for s in signs]
    expected = np.zeros(length, dtype)
    for v in vectors:
        expected += v
    for s, sign in masks:
        if sign == 1:
            expected += reference_mask(s, length, bits)
        else:
            expected -= reference_mask(s, length, bits)
    out = MaskExpander(bits, block_bytes=512).combine(np.empty(length, dtype), vectors, masks)
    np.testing.assert_array_equal(out, expected)
    if vectors:  # in place into the first vector
        first = vectors[0]
        combine_masks(first, vectors, masks)
        np.testing.assert_array_equal(first, expected)


def test_combine_rejects_mismatched_vectors_and_signs():
    with pytest.raises(PRGError):
        combine_masks(np.zeros(4, np.uint32), [np.zeros(5, np.uint32)])
    with pytest.raises(PRGError):
        combine_masks(np.zeros(4, np.uint32), [np.zeros(4, np.uint64)])
    with pytest.raises(PRGError):
        combine_masks(np.zeros(4, np.uint32), [], [(bytes(32), 0)])
