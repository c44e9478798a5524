"""Tests of sharefl.crypto.encoding: fixed-point ring encoding for secure aggregation."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from conftest import examples
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.crypto.encoding import (
    MAX_FRAC_BITS,
    RingEncoding,
    choose_encoding,
    clip_values,
    decode,
    encode,
    encode_into,
)
from sharefl.crypto.errors import EncodingError, UnsafeEncodingError


def ring_sum(vectors: list[np.ndarray], dtype: type) -> np.ndarray:
    total = np.zeros(vectors[0].size, dtype=dtype)
    for v in vectors:
        total += v  # wraps mod 2**b, like the server's aggregation
    return total


def keystream_words(seed: int, n: int, dtype: str) -> np.ndarray:
    """Independent reference of the documented rounding randomness."""
    key_nonce = np.random.default_rng(seed).bytes(32)
    enc = Cipher(algorithms.AES(key_nonce[:16]), modes.CTR(key_nonce[16:])).encryptor()
    return np.frombuffer(enc.update(bytes(4 * n)), dtype=dtype)


# ------------------------------------------------------------------ error bound of sums


@st.composite
def sum_cases(draw: st.DrawFn) -> tuple[RingEncoding, list[np.ndarray]]:
    bits = draw(st.sampled_from([32, 64]))
    k = draw(st.integers(1, 6))
    clip = draw(st.sampled_from([1e-3, 0.1, 1.0, 3.0, 1000.0]))
    l2_clip = draw(st.sampled_from([None, None, 0.05, 2.0]))
    max_summands = draw(st.integers(k, 300))
    enc = choose_encoding(clip, max_summands, bits=bits, l2_clip=l2_clip)
    if draw(st.booleans()):  # not only the largest safe f
        f = draw(st.integers(0, enc.frac_bits))
        enc = choose_encoding(clip, max_summands, bits=bits, l2_clip=l2_clip, frac_bits=f)
    n = draw(st.sampled_from([0, 1, 2, 7, 33]))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    value = st.one_of(
        st.floats(-2 * clip, 2 * clip),  # around the clip range
        st.floats(-1e30, 1e30),  # far beyond it
        st.sampled_from([0.0, -0.0, clip, -clip, 5e-324, 2.0**-40]),
    )
    xs = [np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=dtype) for _ in range(k)]
    return enc, xs


@settings(max_examples=examples(150), deadline=None)
@given(sum_cases(), st.integers(0, 2**32))
def test_decoded_sum_is_within_the_proven_bound(case, seed):
    enc, xs = case
    k = len(xs)
    rng = np.random.default_rng(seed)
    total = ring_sum([encode(x, enc, rng) for x in xs], enc.dtype)
    decoded = decode(total, enc, k)
    assert decoded.dtype == np.float64 and decoded.shape == (xs[0].size,)
    clipped = [clip_values(x, enc) for x in xs]
    bound = Fraction(enc.sum_error_bound(k))
    for j in range(decoded.size):
        exact = sum(Fraction(float(c[j])) for c in clipped)
        assert abs(Fraction(float(decoded[j])) - exact) <= bound
    for c in clipped:
        assert np.all(np.abs(c) <= enc.coordinate_bound)


def test_extreme_sums_do_not_wrap():
    for bits in (32, 64):
        enc = choose_encoding(1.0, 1000, bits=bits)
        for sign in (1.0, -1.0):
            x = np.full(64, sign * 1e9)  # clipped to +-1
            total = ring_sum([encode(x, enc, i) for i in range(1000)], enc.dtype)
            assert np.all(
                np.abs(decode(total, enc, 1000) - sign * 1000) <= 1000 * 2.0**-enc.frac_bits
            )


# ------------------------------------------------------------------ stochastic rounding


@pytest.mark.parametrize(
    ("bits", "frac_bits", "clip", "value"),
    [
        (32, 10, 1.0, 0.3),  # y = 307.2
        (32, 10, 1.0, -0.3),
        (32, 10, 2.0**21 - 1, 2.0**20 + 0.375 / 1024),  # y = 2**30 + 0.375: beyond 2**21
        (32, 10, 2.0**21 - 1, -(2.0**20) - 0.625 / 1024),
        (64, 10, 1.0, 0.3),
        (64, 4, 2.0**50, 2.0**45 + 0.375 / 16),  # y = 2**49 + 0.375
        (64, 4, 2.0**50, -(2.0**45) - 0.625 / 16),
    ],
)
def test_stochastic_rounding_is_unbiased(bits, frac_bits, clip, value):
    enc = RingEncoding(bits, frac_bits, clip, 1)
    y = Fraction(value) * 2**frac_bits
    n = 200_000
    r = encode(np.full(n, value), enc, 2024).view(np.int32 if bits == 32 else np.int64)
    low = math.floor(y)
    assert set(np.unique(r - low).tolist()) == {0, 1}  # only the two neighbours
    p = float(y - low)
    mean_excess = float(np.mean(r - low))
    assert abs(mean_excess - p) <= 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("clip", [4.0, 4.1, 8.0])  # clipped in float32, in float64, not at all
def test_rounding_is_exact_against_integer_reference(bits, clip):
    # float32 inputs give exactly representable y; the reference rounds in exact arithmetic.
    enc = choose_encoding(clip, 3, bits=bits)
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [rng.uniform(-5, 5, 3000), rng.uniform(-4, -3.9, 500), rng.uniform(-1e-6, 1e-6, 500)]
    ).astype(np.float32)
    x[:4] = [4.0, -4.0, 0.0, 2.0**-29]
    r = encode(x, enc, 77).view(np.int32 if bits == 32 else np.int64)
    y = [Fraction(float(v)) * 2**enc.frac_bits for v in clip_values(x, enc)]
    # floor(y) + [U < frac(y) * 2**32], U the keystream word as uint32, for both widths
    u = keystream_words(77, x.size, "=u4")
    expected = [
        math.floor(yj) + (int(uj) < (yj - math.floor(yj)) * 2**32)
        for yj, uj in zip(y, u, strict=True)
    ]
    assert r.tolist() == expected


@pytest.mark.parametrize("bits", [32, 64])
def test_long_vectors_match_the_reference_across_blocks(bits):
    n = 300_001
    enc = RingEncoding(bits, 2, 100.0, 1)
    x = np.random.default_rng(8).integers(-2000, 2000, n) / 16  # some beyond the clip
    r = encode(x, enc, 99).view(np.int32 if bits == 32 else np.int64)
    y = np.clip(x, -100, 100) * 4  # quarters: the float64 reference below is exact
    frac = y - np.floor(y)
    expected = np.floor(y) + (keystream_words(99, n, "=u4") < frac * 2**32)
    assert np.array_equal(r, expected)


def test_encoding_of_representable_values_is_exact():
    enc = RingEncoding(32, 8, 100.0, 1)
    x = np.array([-100.0, -1.5, -(2**-8), 0.0, 2**-8, 3.25, 100.0])
    r = encode(x, enc, 0)
    assert r.dtype == np.uint32
    assert r.view(np.int32).tolist() == [-25600, -384, -1, 0, 1, 832, 25600]
    assert decode(r, enc, 1).tolist() == x.tolist()


# ------------------------------------------------------------------ reproducibility


@pytest.mark.parametrize("bits", [32, 64])
def test_reproducible_from_a_seed(bits):
    enc = choose_encoding(1.0, 10, bits=bits)
    x = np.random.default_rng(1).standard_normal(300_001)  # several blocks, a partial one
    a = encode(x, enc, 42)
    assert np.array_equal(a, encode(x, enc, 42))
    assert np.array_equal(a, encode(x, enc, np.random.default_rng(42)))
    assert not np.array_equal(a, encode(x, enc, 43))
    out = np.empty(x.size, dtype=enc.dtype)
    assert encode_into(x, enc, 42, out) is out
    assert np.array_equal(out, a)
    gen = np.random.default_rng(7)
    first, second = encode(x, enc, gen), encode(x, enc, gen)
    assert not np.array_equal(first, second)  # the generator advances
    assert np.array_equal(encode_into(x, enc, np.random.default_rng(7), out), first)  # reuse
    assert encode(x, enc, None).shape == (x.size,)


def test_input_is_flattened_in_c_order():
    enc = choose_encoding(1.0, 4)
    x = np.random.default_rng(2).standard_normal((3, 5, 7)).astype(np.float32)
    expected = encode(x.ravel(), enc, 9)
    assert np.array_equal(encode(x, enc, 9), expected)
    assert np.array_equal(encode(np.asfortranarray(x), enc, 9), expected)
    assert np.array_equal(encode(x.astype(">f4"), enc, 9), expected)
    assert encode(np.zeros(0), enc, 9).shape == (0,)


# ------------------------------------------------------------------ parameters


@settings(max_examples=examples(200), deadline=None)
@given(
    st.floats(1e-30, 1e30),
    st.integers(1, 10**7),
    st.sampled_from([32, 64]),
    st.one_of(st.none(), st.floats(1e-30, 1e30)),
)
def test_choose_encoding_picks_the_largest_safe_frac_bits(clip, k, bits, l2_clip):
    c = clip if l2_clip is None else min(clip, l2_clip)
    try:
        enc = choose_encoding(clip, k, bits=bits, l2_clip=l2_clip)
    except UnsafeEncodingError:
        assert k * (Fraction(c) + 1) > 2 ** (bits - 1) - 1  # even f = 0 is unsafe
        return
    f = enc.frac_bits
    assert k * (Fraction(c) * 2**f + 1) <= 2 ** (bits - 1) - 1
    assert enc.coordinate_bound == c and enc.max_summands == k
    if f < MAX_FRAC_BITS:
        with pytest.raises(UnsafeEncodingError):
            RingEncoding(bits, f + 1, clip, k, l2_clip)
    assert choose_encoding(clip, k, bits=bits, l2_clip=l2_clip, frac_bits=f) == enc


@pytest.mark.parametrize(
    ("bits", "frac_bits", "clip", "k"),
    [(32, 28, 1.0, 10), (32, 0, 2.0**31, 1), (32, 16, 1.0, 2**15), (64, 60, 1.0, 8)],
)
def test_unsafe_encodings_are_rejected_with_the_numbers(bits, frac_bits, clip, k):
    with pytest.raises(UnsafeEncodingError) as info:
        RingEncoding(bits, frac_bits, clip, k)
    message = str(info.value)
    assert f"max_summands={k}" in message and f"2**{bits - 1} - 1" in message
    assert "max_summands <=" in message or "coordinate bound" in message
    with pytest.raises(UnsafeEncodingError):
        choose_encoding(clip, k, bits=bits, frac_bits=frac_bits)


def test_the_no_wrap_limit_is_exact():
    assert RingEncoding(32, 27, 1.0, 10).frac_bits == 27  # 10 * (2**27 + 1) < 2**31
    with pytest.raises(UnsafeEncodingError, match="frac_bits <= 27"):
        RingEncoding(32, 28, 1.0, 10)
    RingEncoding(32, 0, 2.0**31 - 2, 1)  # 1 * (c + 1) == 2**31 - 1
    with pytest.raises(UnsafeEncodingError):
        RingEncoding(32, 0, 2.0**31 - 1, 1)
    with pytest.raises(UnsafeEncodingError, match="bits=64"):
        choose_encoding(1e12, 1000)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bits": 16},
        {"bits": True},
        {"frac_bits": -1},
        {"frac_bits": MAX_FRAC_BITS + 1},
        {"frac_bits": 1.5},
        {"clip": 0.0},
        {"clip": -1.0},
        {"clip": math.inf},
        {"clip": math.nan},
        {"clip": "1"},
        {"max_summands": 0},
        {"l2_clip": 0.0},
        {"l2_clip": math.inf},
    ],
)
def test_bad_parameters_raise_encoding_error(kwargs):
    params = {"bits": 32, "frac_bits": 8, "clip": 1.0, "max_summands": 4} | kwargs
    with pytest.raises(EncodingError):
        RingEncoding(**params)


def test_encoding_properties():
    enc = RingEncoding(np.int64(32), np.int64(10), np.float32(3.0), np.int64(5), l2_clip=2)
    assert (enc.bits, enc.frac_bits, enc.max_summands) == (32, 10, 5)
    assert type(enc.clip) is float and enc.coordinate_bound == 2.0
    assert enc.dtype is np.uint32 and RingEncoding(64, 10, 1.0, 5).dtype is np.uint64
    assert enc.scale == 1024.0
    assert enc.max_abs_encoded == 2049
    assert enc.sum_error_bound(3) == 3 / 1024
    assert choose_encoding(1.0, np.int64(4), bits=np.int64(64)).frac_bits == 60
    with pytest.raises(UnsafeEncodingError):
        enc.sum_error_bound(6)
    with pytest.raises(EncodingError):
        enc.sum_error_bound(0)


# ------------------------------------------------------------------ L2 clipping


def test_l2_clipping_scales_down_to_the_norm():
    enc = choose_encoding(10.0, 4, l2_clip=1.0)
    x = np.random.default_rng(3).standard_normal(10_000).astype(np.float32)
    clipped = clip_values(x, enc)
    assert np.linalg.norm(clipped) <= 1.0 + 1e-12
    assert np.linalg.norm(clipped) == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(clipped, x / np.linalg.norm(x.astype(np.float64)), rtol=1e-6)
    decoded = decode(encode(x, enc, 0), enc, 1)
    assert np.linalg.norm(decoded) <= 1.0 + math.sqrt(x.size) * 2.0**-enc.frac_bits
    small = x * (0.5 / np.linalg.norm(x.astype(np.float64)))  # already inside: unchanged
    np.testing.assert_array_equal(clip_values(small, enc), small.astype(np.float64))


def test_l2_clip_smaller_than_clip_bounds_coordinates():
    enc = RingEncoding(32, 12, 5.0, 3, l2_clip=0.5)
    x = np.array([100.0, 0.0, 0.0])
    assert clip_values(x, enc).tolist() == [0.5, 0.0, 0.0]
    assert clip_values(np.array([1e200, 1e200]), enc) == pytest.approx([0.5**1.5] * 2)


def test_l2_norm_survives_float64_under_and_overflow():
    tiny = RingEncoding(64, 8, 1.0, 1, l2_clip=1e-301)
    assert clip_values(np.full(4, 1e-300), tiny) == pytest.approx([5e-302] * 4, rel=1e-12)
    assert clip_values(np.full(4, 1e-302), tiny).tolist() == [1e-302] * 4  # norm 2e-302
    huge = RingEncoding(32, 8, 1.0, 1, l2_clip=1.0)
    assert clip_values(np.full(4, 1e300), huge) == pytest.approx([0.5] * 4, rel=1e-12)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_non_finite_input_raises(bad, dtype):
    enc = choose_encoding(1.0, 4)
    x = np.ones(1000, dtype=dtype)
    x[[3, 500]] = bad
    with pytest.raises(EncodingError, match="2 non-finite"):
        encode(x, enc, 0)
    with pytest.raises(EncodingError, match="2 non-finite"):
        encode_into(x, enc, 0, np.empty(1000, np.uint32))
    with pytest.raises(EncodingError):
        clip_values(x, enc)


def test_huge_finite_values_are_clipped_not_rejected():
    enc = choose_encoding(1.0, 4)
    x = np.array([1e300, -1e300, 3e38], dtype=np.float64)
    assert decode(encode(x, enc, 0), enc, 1).tolist() == [1.0, -1.0, 1.0]
    x32 = np.array([3e38, -3e38, 1.0], dtype=np.float32)
    assert decode(encode(x32, enc, 0), enc, 1).tolist() == [1.0, -1.0, 1.0]


def test_bad_out_buffers_raise():
    enc = choose_encoding(1.0, 4)
    x = np.ones(10, dtype=np.float32)
    for out in [
        np.empty(10, np.uint64),  # wrong dtype
        np.empty(10, np.int32),
        np.empty(10, np.float32),
        np.empty(9, np.uint32),  # wrong shape
        np.empty(11, np.uint32),
        np.empty((2, 5), np.uint32),
        [0] * 10,
    ]:
        with pytest.raises(EncodingError):
            encode_into(x, enc, 0, out)  # type: ignore[arg-type]
    read_only = np.empty(10, np.uint32)
    read_only.flags.writeable = False
    with pytest.raises(EncodingError, match="read-only"):
        encode_into(x, enc, 0, read_only)
    with pytest.raises(EncodingError, match="overlaps"):
        encode_into(x, enc, 0, x.view(np.uint32))
    enc64 = choose_encoding(1.0, 4, bits=64)
    with pytest.raises(EncodingError):
        encode_into(x, enc64, 0, np.empty(10, np.uint32))


@pytest.mark.parametrize("x", [np.arange(5), np.ones(3, dtype=bool), np.ones(2, np.complex128)])
def test_non_float_input_raises(x):
    with pytest.raises(EncodingError, match="float"):
        encode(x, choose_encoding(1.0, 4), 0)


def test_bad_rng_raises():
    with pytest.raises(EncodingError, match="rng"):
        encode(np.ones(3), choose_encoding(1.0, 4), "seed")  # type: ignore[arg-type]


def test_decode_checks_its_inputs():
    enc = choose_encoding(1.0, 4)
    total = ring_sum([encode(np.ones(8), enc, i) for i in range(4)], enc.dtype)
    assert decode(total, enc, 4).tolist() == [4.0] * 8
    with pytest.raises(UnsafeEncodingError):
        decode(total, enc, 5)
    with pytest.raises(EncodingError):
        decode(total, enc, 0)
    with pytest.raises(EncodingError):
        decode(total.astype(np.uint64), enc, 4)
    with pytest.raises(EncodingError):
        decode(total.astype(np.int32), enc, 4)
    with pytest.raises(EncodingError):
        decode(list(total), enc, 4)  # type: ignore[arg-type]
    with pytest.raises(EncodingError, match="masks did not cancel"):
        decode(total, enc, 3)  # 4.0 cannot be a sum of 3 values in [-1, 1]
    garbage = np.random.default_rng(0).integers(0, 2**32, 100, dtype=np.uint32)
    with pytest.raises(EncodingError, match="masks did not cancel"):
        decode(garbage, enc, 4)
    assert decode(np.zeros((2, 3), np.uint32), enc, 1).shape == (2, 3)


# ------------------------------------------------------------------ torch


def test_importing_the_module_does_not_import_torch():
    code = "import sys, sharefl.crypto.encoding; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("bits", [32, 64])
def test_torch_tensors_encode_like_numpy_arrays(bits):
    torch = pytest.importorskip("torch")
    enc = choose_encoding(2.0, 8, bits=bits, l2_clip=30.0)
    x = np.random.default_rng(4).standard_normal((40, 30)).astype(np.float32) * 3
    expected = encode(x, enc, 11)
    assert np.array_equal(encode(torch.from_numpy(x), enc, 11), expected)
    t = torch.tensor(x, requires_grad=True)
    assert np.array_equal(encode(t, enc, 11), expected)
    transposed = torch.from_numpy(np.ascontiguousarray(x.T)).T  # non-contiguous view
    assert np.array_equal(encode(transposed, enc, 11), expected)
    x64 = x.astype(np.float64)
    assert np.array_equal(encode(torch.from_numpy(x64), enc, 11), encode(x64, enc, 11))
    bf16 = torch.from_numpy(x).to(torch.bfloat16)
    assert np.array_equal(encode(bf16, enc, 11), encode(bf16.float().numpy(), enc, 11))
    out = np.empty(x.size, dtype=enc.dtype)
    assert np.array_equal(encode_into(torch.from_numpy(x), enc, 11, out), expected)
    with pytest.raises(EncodingError):
        encode(torch.arange(4), enc, 0)
    bad = torch.ones(4)
    bad[1] = float("nan")
    with pytest.raises(EncodingError, match="1 non-finite"):
        encode(bad, enc, 0)


@pytest.mark.parametrize("bits", [32, 64])
def test_tiny_negative_values_round_up_almost_surely(bits):
    # y = x * 2**f in (-2**-25, 0): floor(y) = -1 but r must be 0 with probability 1 - |y|.
    enc = RingEncoding(bits, 10, 1.0, 1)
    x = np.full(4096, -(2.0**-40), dtype=np.float32)
    r = encode(x, enc, 3).view(np.int32 if bits == 32 else np.int64)
    assert np.count_nonzero(r == 0) >= 4090
    assert set(np.unique(r).tolist()) <= {-1, 0}
