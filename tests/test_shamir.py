"""Shamir sharing: field choice, correctness, privacy over a small field, robust decoding."""

from __future__ import annotations

import random
from collections import Counter
from itertools import product

import pytest
from conftest import examples
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.crypto.errors import ShamirError, ShareVerificationError
from sharefl.crypto.shamir import (
    MAX_X,
    PRIME,
    SHARE_BYTES,
    Reconstructor,
    Share,
    VerifiedSecret,
    _berlekamp_welch,
    _eval_poly,
    _lagrange_rows,
    _split_ints,
    reconstruct,
    reconstruct_many,
    reconstruct_verified,
    split,
    split_many,
)

SMALL_PRIMES = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53]
MR_BASES = [q for q in range(2, 400) if all(q % d for d in range(2, q))][:64]


def is_strong_probable_prime(n: int, bases: list[int]) -> bool:
    """Strong Miller–Rabin; False is a proof of compositeness (a witness was found)."""
    if n < 2:
        return False
    for q in SMALL_PRIMES:
        if n % q == 0:
            return n == q
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        y = pow(a, d, n)
        if y in (1, n - 1):
            continue
        for _ in range(s - 1):
            y = y * y % n
            if y == n - 1:
                break
        else:
            return False
    return True


def pubkey(secret: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(secret).public_key().public_bytes_raw()


def corrupt(shares: list[Share], indices: list[int], rng: random.Random) -> list[Share]:
    out = list(shares)
    for i in indices:
        out[i] = Share(out[i].x, (out[i].y + rng.randrange(1, PRIME)) % PRIME)
    return out


# --------------------------------------------------------------------------- field


def test_prime_is_the_smallest_prime_above_2_256() -> None:
    assert 2**256 < PRIME < 2**264
    assert is_strong_probable_prime(PRIME, MR_BASES)
    # Every candidate in between has a Miller–Rabin witness, which proves it composite.
    assert not any(is_strong_probable_prime(n, MR_BASES) for n in range(2**256 + 1, PRIME))


def test_share_bytes_round_trip_and_layout() -> None:
    assert SHARE_BYTES == 37
    for share in (Share(1, 0), Share(MAX_X, PRIME - 1), Share(77, 2**256 + 5)):
        data = share.to_bytes()
        assert len(data) == SHARE_BYTES
        assert int.from_bytes(data[:4], "big") == share.x
        assert Share.from_bytes(data) == share
    assert str(PRIME - 1) not in repr(Share(1, PRIME - 1))  # y is secret: not in repr


@given(st.integers(1, MAX_X), st.integers(0, PRIME - 1))
def test_share_bytes_round_trip_property(x: int, y: int) -> None:
    assert Share.from_bytes(Share(x, y).to_bytes()) == Share(x, y)


# --------------------------------------------------------------------------- correctness


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_any_t_of_n_shares_reconstruct(data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 24), label="n")
    t = data.draw(st.integers(2, n), label="t")
    xs = data.draw(st.lists(st.integers(1, MAX_X), min_size=n, max_size=n, unique=True))
    secret = data.draw(st.binary(min_size=1, max_size=32), label="secret")
    shares = split(secret, t, xs)
    assert [s.x for s in shares] == xs
    k = data.draw(st.integers(t, n), label="k")
    subset = data.draw(st.permutations(shares))[:k]
    assert reconstruct(subset, t, secret_len=len(secret)) == secret
    rec = Reconstructor([s.x for s in subset], t)
    assert rec.reconstruct([s.y for s in subset]) == int.from_bytes(secret, "big")
    assert reconstruct_verified(subset, t, secret_len=len(secret)).secret == secret


@settings(max_examples=examples(40), deadline=None)
@given(st.data())
def test_small_field_arithmetic_reconstructs(data: st.DataObject) -> None:
    prime = data.draw(st.sampled_from([5, 7, 11, 13, 251]))
    n = data.draw(st.integers(2, prime - 1))
    t = data.draw(st.integers(2, n))
    xs = data.draw(st.permutations(range(1, prime)))[:n]
    secret = data.draw(st.integers(0, prime - 1))
    seed = data.draw(st.integers(0, 2**32))
    ys = _split_ints([secret], t, xs, random.Random(seed).randbytes, prime)[0]
    assert ys == [y % prime for y in ys]
    pick = data.draw(st.permutations(range(n)))[:t]
    row = _lagrange_rows([xs[i] for i in pick], [0], prime)[0]
    assert sum(c * ys[i] for c, i in zip(row, pick, strict=True)) % prime == secret


@pytest.mark.parametrize(("prime", "t"), [(5, 2), (5, 3), (5, 4), (7, 2), (7, 3), (11, 3), (13, 3)])
def test_t_minus_1_shares_are_consistent_with_every_secret(prime: int, t: int) -> None:
    """For every secret s and every possible vector of t − 1 shares there is exactly one
    polynomial of degree < t with f(0) = s through them: the shares reveal nothing."""
    rng = random.Random(prime * 100 + t)
    xs = rng.sample(range(1, prime), t - 1)
    for secret in range(prime):
        hits = Counter(
            tuple(_eval_poly([secret, *rest], x, prime) for x in xs)
            for rest in product(range(prime), repeat=t - 1)
        )
        assert len(hits) == prime ** (t - 1)  # every share vector occurs ...
        assert set(hits.values()) == {1}  # ... exactly once
    # The same through interpolation: for any observed shares and any candidate secret, the
    # unique polynomial through (0, s) and the t − 1 shares has degree < t.
    ys = [rng.randrange(prime) for _ in xs]
    probe = next(z for z in range(1, prime) if z not in xs)
    for secret in range(prime):
        (at_probe,) = _lagrange_rows([0, *xs], [probe], prime)
        value = sum(c * y for c, y in zip(at_probe, [secret, *ys], strict=True)) % prime
        coeffs = _berlekamp_welch([0, *xs, probe], [secret, *ys, value], t, prime)
        assert coeffs is not None and coeffs[0] == secret
        assert [_eval_poly(coeffs, x, prime) for x in xs] == ys


def test_split_many_is_indexed_secret_then_holder_and_independent() -> None:
    secrets = [bytes([i]) * 32 for i in range(1, 4)]
    xs = [5, 9, 2, 40, 7]
    shares = split_many(secrets, 3, xs)
    assert len(shares) == 3 and all([s.x for s in row] == xs for row in shares)
    for secret, row in zip(secrets, shares, strict=True):
        assert reconstruct(row[2:], 3) == secret
    # Each secret gets its own polynomial (not the same randomness).
    assert shares[0][0].y - shares[1][0].y != shares[0][1].y - shares[1][1].y


def test_randbytes_is_injectable_and_used_once_per_batch() -> None:
    calls: list[int] = []

    def rb(n: int) -> bytes:
        calls.append(n)
        return random.Random(7).randbytes(n)

    a = split_many([b"\x01" * 32, b"\x02" * 32], 4, range(1, 7), randbytes=rb)
    b = split_many([b"\x01" * 32, b"\x02" * 32], 4, range(1, 7), randbytes=rb)
    # 33 + 16 bytes per coefficient, reduced mod p: distance from uniform < 2^-135
    assert a == b and calls == [2 * 3 * 49] * 2
    c = split(b"\x01" * 32, 4, range(1, 7), randbytes=random.Random(8).randbytes)
    assert c != a[0]


def test_secret_length_is_restored() -> None:
    secret = b"\x00\x00\x07"
    shares = split(secret, 2, [1, 2, 3])
    assert reconstruct(shares, 2, secret_len=3) == secret
    assert reconstruct(shares, 2) == secret.rjust(32, b"\x00")


def test_reconstruct_many_equals_per_secret_reconstruction() -> None:
    rng = random.Random(3)
    xs = list(range(1, 13))
    secrets = [rng.randbytes(32) for _ in range(20)]
    shares = split_many(secrets, 5, xs)
    # Three holder sets, reused across secrets, in different orders.
    holder_sets = [[0, 1, 2, 3, 4], [11, 3, 7, 5, 9, 10], [4, 3, 2, 1, 0]]
    lists = [[row[i] for i in holder_sets[j % 3]] for j, row in enumerate(shares)]
    assert reconstruct_many(lists, 5) == [reconstruct(s, 5) for s in lists] == secrets
    rec = Reconstructor([xs[i] for i in holder_sets[1]], 5)
    rows = [[row[i].y for i in holder_sets[1]] for row in shares]
    assert rec.reconstruct_many(rows) == [int.from_bytes(s, "big") for s in secrets]
    assert reconstruct_many([], 5) == []


# --------------------------------------------------------------------------- verified


def test_verified_fast_path_uses_all_shares() -> None:
    secret = random.Random(1).randbytes(32)
    shares = split(secret, 3, [9, 4, 6, 1, 20])
    for predicate in (None, lambda s: pubkey(s) == pubkey(secret)):
        got = reconstruct_verified(shares, 3, predicate)
        assert got == VerifiedSecret(secret, (1, 4, 6, 9, 20), ())


@settings(max_examples=examples(40), deadline=None)
@given(st.data())
def test_berlekamp_welch_finds_and_excludes_bad_shares(data: st.DataObject) -> None:
    t = data.draw(st.integers(2, 6), label="t")
    n = data.draw(st.integers(t + 2, t + 10), label="n")
    n_bad = data.draw(st.integers(1, (n - t) // 2), label="n_bad")
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    secret = rng.randbytes(32)
    xs = rng.sample(range(1, 1000), n)
    bad_idx = rng.sample(range(n), n_bad)
    shares = corrupt(split(secret, t, xs), bad_idx, rng)
    got = reconstruct_verified(shares, t)  # no predicate: unique decoding
    assert got.secret == secret
    assert got.bad == tuple(sorted(xs[i] for i in bad_idx))
    assert got.used == tuple(sorted(set(xs) - set(got.bad)))


@pytest.mark.parametrize("bad_index", [0, 2, 5])
def test_only_the_predicate_decides_with_one_spare_share(bad_index: int) -> None:
    rng = random.Random(bad_index)
    secret = rng.randbytes(32)
    t, xs = 5, [3, 1, 4, 15, 9, 26]  # k = t + 1: one bad share is detectable, not correctable
    shares = corrupt(split(secret, t, xs), [bad_index], rng)
    with pytest.raises(ShareVerificationError, match="inconsistent"):
        reconstruct_verified(shares, t)
    advertised = pubkey(secret)
    got = reconstruct_verified(shares, t, lambda s: pubkey(s) == advertised)
    assert got.secret == secret and got.bad == (xs[bad_index],)
    assert got.used == tuple(sorted(set(xs) - {xs[bad_index]}))


def test_subset_search_beyond_berlekamp_welch_and_its_bound() -> None:
    rng = random.Random(11)
    secret = rng.randbytes(32)
    t, xs = 4, list(range(1, 8))  # k = t + 3: Berlekamp–Welch corrects 1, two are bad
    shares = corrupt(split(secret, t, xs), [0, 6], rng)
    with pytest.raises(ShareVerificationError, match="at most 1 bad"):
        reconstruct_verified(shares, t)

    def predicate(s: bytes) -> bool:
        return s == secret

    got = reconstruct_verified(shares, t, predicate)
    assert got == VerifiedSecret(secret, (2, 3, 4, 5, 6), (1, 7))
    # C(7, 4) = 35 subsets: with max_subsets >= 35 all are tried in order, else at random.
    assert reconstruct_verified(shares, t, predicate, max_subsets=35).secret == secret
    with pytest.raises(ShareVerificationError, match=r"7 shares .* 0 of the 35 4-subsets"):
        reconstruct_verified(shares, t, predicate, max_subsets=0)


def test_random_subset_search_when_there_are_too_many_subsets() -> None:
    rng = random.Random(12)
    secret = rng.randbytes(32)
    t, xs = 3, list(range(1, 13))  # C(12, 3) = 220 subsets, 35 of them clean
    shares = corrupt(split(secret, t, xs), [0, 1, 2, 3, 4], rng)  # Berlekamp–Welch fixes 4
    got = reconstruct_verified(shares, t, lambda s: s == secret, max_subsets=200)
    assert got == VerifiedSecret(secret, tuple(range(6, 13)), (1, 2, 3, 4, 5))  # P(miss) < 1e-14
    hopeless = corrupt(shares, list(range(5, 11)), rng)  # only 2 good shares left
    with pytest.raises(ShareVerificationError, match=r"12 shares .* 50 of the 220 3-subsets"):
        reconstruct_verified(hopeless, t, lambda s: s == secret, max_subsets=50)


def test_too_many_bad_shares_raise() -> None:
    rng = random.Random(5)
    secret = rng.randbytes(32)
    t, xs = 3, list(range(1, 6))
    shares = corrupt(split(secret, t, xs), [0, 2, 4], rng)  # every 3-subset has a bad share
    with pytest.raises(ShareVerificationError, match="cannot correct"):
        reconstruct_verified(shares, t)
    calls = Counter[bytes]()

    def predicate(s: bytes) -> bool:
        calls[s] += 1
        return s == secret

    with pytest.raises(ShareVerificationError, match=r"5 shares .* 10 of the 10 3-subsets"):
        reconstruct_verified(shares, t, predicate)
    assert set(calls.values()) == {1}  # each candidate secret is tested once


def test_consistent_shares_failing_the_predicate_raise() -> None:
    shares = split(b"\x05" * 32, 2, [1, 2, 3])
    with pytest.raises(ShareVerificationError, match="fails the predicate"):
        reconstruct_verified(shares, 2, lambda s: False)
    with pytest.raises(ShareVerificationError, match="does not fit in 16 bytes"):
        reconstruct_verified(shares, 2, secret_len=16)


# --------------------------------------------------------------------------- errors

XS = [1, 2, 3, 4]
S32 = b"\xab" * 32


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: split(S32, 1, XS), "at least 2"),
        (lambda: split(S32, 0, XS), "at least 2"),
        (lambda: split(S32, 5, XS), "exceeds the 4 share holders"),
        (lambda: split(S32, 2, [1, 2, 2]), "duplicate x-coordinate 2"),
        (lambda: split(S32, 2, [0, 1, 2]), "x-coordinate 0 out of range"),
        (lambda: split(S32, 2, [-1, 1]), "out of range"),
        (lambda: split(S32, 2, [1, MAX_X + 1]), "out of range"),
        (lambda: split(b"\x01" * 33, 2, XS), "33 bytes"),
        (lambda: split(b"", 2, XS), "0 bytes"),
        (lambda: split(S32, 2, XS, randbytes=lambda n: b"\x00"), "randbytes returned"),
        (lambda: split_many([S32, b"\x01" * 40], 2, XS), "secret 1 is 40 bytes"),
        (lambda: reconstruct(split(S32, 3, XS)[:2], 3), "too few shares"),
        (lambda: reconstruct([Share(1, 5), Share(1, 6)], 2), "duplicate x-coordinate 1"),
        (lambda: reconstruct(split(S32, 2, XS), 1), "at least 2"),
        (lambda: reconstruct(split(S32, 2, XS), 2, secret_len=0), "secret_len"),
        (lambda: reconstruct(split(S32, 2, XS), 2, secret_len=33), "secret_len"),
        (lambda: reconstruct(split(S32, 2, XS), 2, secret_len=16), "does not fit"),
        (lambda: reconstruct_many([split(S32, 2, XS), [Share(1, 5)]], 2), "too few"),
        (lambda: reconstruct_verified(split(S32, 3, XS)[:2], 3), "too few shares"),
        (lambda: reconstruct_verified([Share(2, 1)] * 3, 2), "duplicate"),
        (lambda: reconstruct_verified(split(S32, 2, XS), 2, max_subsets=-1), "max_subsets"),
        (lambda: Reconstructor([1, 2, 2], 2), "duplicate"),
        (lambda: Reconstructor([1, 2], 3), "needs at least 3"),
        (lambda: Reconstructor([0, 2], 2), "out of range"),
        (lambda: Reconstructor([1, 2, 3], 2).reconstruct([1, 2]), "expected 3 y-values"),
        (lambda: Reconstructor([1, 2], 2).reconstruct([1, PRIME]), "not a field element"),
        (lambda: Share(0, 1), "out of range"),
        (lambda: Share(1, PRIME), "not a field element"),
        (lambda: Share(1, -1), "not a field element"),
        (lambda: Share.from_bytes(b"\x00" * 36), "37 bytes"),
        (lambda: Share.from_bytes(b"\x00\x00\x00\x01" + PRIME.to_bytes(33, "big")), "field"),
        (lambda: Share.from_bytes(bytes(37)), "x-coordinate 0"),
    ],
)
def test_errors(call, match: str) -> None:
    with pytest.raises(ShamirError, match=match):
        call()


def test_verification_error_is_a_shamir_error() -> None:
    assert issubclass(ShareVerificationError, ShamirError)
    assert issubclass(ShamirError, ValueError)
