"""Shamir t-of-n secret sharing over GF(p), p = 2^256 + 297, for secrets of up to 32 bytes.

In secure aggregation (Bonawitz et al. 2017) every client shares its 32-byte X25519 mask
key and its 32-byte self-mask seed with the peers of its cluster; the server reconstructs
the keys of dropped clients and the seeds of survivors, usually hundreds of secrets from
the same set of share holders. Hence the batched API:

* :func:`split_many` draws all random coefficients with one ``randbytes`` call and
  evaluates every polynomial at every holder's x-coordinate.
* :class:`Reconstructor` computes the Lagrange coefficients at 0 once for a set of holders
  (one modular inversion for all denominators); each secret is then one dot product mod p.
* :func:`reconstruct_verified` tolerates corrupted shares: consistency check, then
  Berlekamp–Welch decoding, then (given a predicate such as "the X25519 public key of this
  secret equals the advertised one") a bounded search over t-subsets.

A secret is ``bytes`` of length 1..32 read as a big-endian integer (always < p). The length
is not stored in the shares: reconstruction takes ``secret_len`` (default 32) and raises
:class:`ShamirError` if the interpolated value does not fit, a sign of corrupted shares.
Share x-coordinates are 1..2^32 − 1 (4 bytes on the wire); y-coordinates are field
elements (33 bytes). Internal helpers take the prime as a parameter so the arithmetic can
be checked exhaustively over a small field.
"""

from __future__ import annotations

import math
import operator
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Final

from sharefl.crypto.errors import ShamirError, ShareVerificationError

PRIME: Final = 2**256 + 297
"""The smallest prime above 2^256 (every 32-byte secret is a field element)."""
MAX_SECRET_BYTES: Final = 32
X_BYTES: Final = 4
Y_BYTES: Final = 33
SHARE_BYTES: Final = X_BYTES + Y_BYTES
MAX_X: Final = 2 ** (8 * X_BYTES) - 1
DEFAULT_MAX_SUBSETS: Final = 10_000

RandBytes = Callable[[int], bytes]
Predicate = Callable[[bytes], bool]


@dataclass(frozen=True, slots=True)
class Share:
    """One share: the point (x, y) of the dealer's polynomial, 1 <= x <= 2^32 − 1, 0 <= y < p.

    Raises :class:`ShamirError` on construction if a coordinate is out of range. ``y`` is
    secret material and is left out of ``repr``.
    """

    x: int
    y: int = field(repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.x <= MAX_X:
            raise ShamirError(f"share x-coordinate {self.x} out of range: use 1..{MAX_X}")
        if not 0 <= self.y < PRIME:
            raise ShamirError("share y-coordinate is not a field element: need 0 <= y < PRIME")

    def to_bytes(self) -> bytes:
        """Fixed-width encoding: x as 4-byte and y as 33-byte big-endian (SHARE_BYTES = 37)."""
        return self.x.to_bytes(X_BYTES, "big") + self.y.to_bytes(Y_BYTES, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> Share:
        """Decode :meth:`to_bytes` output; raises :class:`ShamirError` if ``data`` is not
        SHARE_BYTES long, x is 0 or y >= PRIME."""
        if len(data) != SHARE_BYTES:
            raise ShamirError(f"an encoded share is {SHARE_BYTES} bytes, got {len(data)}")
        return cls(int.from_bytes(data[:X_BYTES], "big"), int.from_bytes(data[X_BYTES:], "big"))


@dataclass(frozen=True, slots=True)
class VerifiedSecret:
    """Result of :func:`reconstruct_verified`: the secret, the x-coordinates of the shares
    on its polynomial (``used``, at least t) and of those off it (``bad``), both sorted."""

    secret: bytes = field(repr=False)
    used: tuple[int, ...]
    bad: tuple[int, ...]


# --------------------------------------------------------------------------- validation


def _check_threshold(threshold: int, count: int, too_few: str) -> None:
    if threshold < 2:
        raise ShamirError(
            f"threshold must be at least 2, got {threshold} (with t = 1 each share is the secret)"
        )
    if count < threshold:
        raise ShamirError(too_few)


def _check_xs(xs: Sequence[int], prime: int) -> list[int]:
    xs = [operator.index(x) for x in xs]
    top = min(prime - 1, MAX_X)
    for x in xs:
        if not 1 <= x <= top:
            raise ShamirError(
                f"x-coordinate {x} out of range: use 1..{top} (x = 0 is where the secret lives)"
            )
    seen: set[int] = set()
    for x in xs:
        if x in seen:
            raise ShamirError(f"duplicate x-coordinate {x}: every share needs a distinct x")
        seen.add(x)
    return xs


def _check_secret_len(secret_len: int) -> None:
    if not 1 <= secret_len <= MAX_SECRET_BYTES:
        raise ShamirError(f"secret_len must be 1..{MAX_SECRET_BYTES}, got {secret_len}")


def _to_secret(value: int, secret_len: int) -> bytes:
    if value >> (8 * secret_len):
        raise ShamirError(
            f"reconstructed value does not fit in {secret_len} bytes: the shares are corrupted, "
            "belong to different secrets, or secret_len is wrong"
        )
    return value.to_bytes(secret_len, "big")


# --------------------------------------------------------------------------- field core


def _batch_inverse(values: Sequence[int], prime: int) -> list[int]:
    """Inverses of nonzero ``values`` mod ``prime`` with one pow (Montgomery's trick)."""
    prefix = []
    acc = 1
    for v in values:
        prefix.append(acc)
        acc = acc * v % prime
    inv = pow(acc, -1, prime)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % prime
        inv = inv * values[i] % prime
    return out


def _random_elements(count: int, randbytes: RandBytes, prime: int) -> list[int]:
    """``count`` field elements, each from 16 extra bytes of randomness reduced mod ``prime``
    (statistical distance from uniform < 2^-127)."""
    width = (prime.bit_length() + 7) // 8 + 16
    buf = randbytes(count * width)
    if len(buf) != count * width:
        raise ShamirError(f"randbytes returned {len(buf)} bytes, expected {count * width}")
    return [int.from_bytes(buf[i : i + width], "big") % prime for i in range(0, len(buf), width)]


def _eval_poly(coeffs: Sequence[int], x: int, prime: int) -> int:
    """coeffs[0] + coeffs[1]·x + … mod ``prime`` (Horner, reducing only when large)."""
    bound = prime << 2048
    y = 0
    for c in reversed(coeffs):
        y = y * x + c
        if y > bound:
            y %= prime
    return y % prime


def _split_ints(
    secrets: Sequence[int], threshold: int, xs: Sequence[int], randbytes: RandBytes, prime: int
) -> list[list[int]]:
    """ys[secret][holder] of random degree-(threshold − 1) polynomials with f(0) = secret."""
    rand = _random_elements(len(secrets) * (threshold - 1), randbytes, prime)
    out = []
    for i, s in enumerate(secrets):
        coeffs = [s, *rand[i * (threshold - 1) : (i + 1) * (threshold - 1)]]
        out.append([_eval_poly(coeffs, x, prime) for x in xs])
    return out


def _lagrange_rows(xs: Sequence[int], targets: Sequence[int], prime: int) -> list[list[int]]:
    """rows[m][i] with f(targets[m]) = Σ_i rows[m][i]·f(xs[i]) mod ``prime`` for every f of
    degree < len(xs). ``xs`` distinct, no target in ``xs``; one modular inversion in all."""
    k = len(xs)
    denoms = [math.prod(xi - xj for xj in xs if xj != xi) % prime for xi in xs]
    diffs = [(z - xi) % prime for z in targets for xi in xs]
    inv = _batch_inverse(denoms + diffs, prime)
    weights = inv[:k]
    rows = []
    for m, z in enumerate(targets):
        ell = math.prod(z - xi for xi in xs) % prime
        inv_d = inv[k + m * k : k + (m + 1) * k]
        rows.append([ell * w % prime * d % prime for w, d in zip(weights, inv_d, strict=True)])
    return rows


def _dot(row: Sequence[int], ys: Sequence[int], prime: int) -> int:
    total: int = sum(map(operator.mul, row, ys))
    return total % prime


def _solve(matrix: list[list[int]], n: int, prime: int) -> list[int] | None:
    """Solve the augmented system ``matrix`` (rows of n coefficients + right-hand side) mod
    ``prime`` by Gauss–Jordan elimination; free variables are 0; None if inconsistent."""
    rows = [r[:] for r in matrix]
    pivots: list[int] = []
    for c in range(n):
        r = len(pivots)
        p = next((i for i in range(r, len(rows)) if rows[i][c]), None)
        if p is None:
            continue
        rows[r], rows[p] = rows[p], rows[r]
        inv = pow(rows[r][c], -1, prime)
        pivot = [v * inv % prime for v in rows[r]]  # entries before c are already 0
        rows[r] = pivot
        for i, row in enumerate(rows):
            f = row[c]
            if i != r and f:
                row[c:] = [(a - f * b) % prime for a, b in zip(row[c:], pivot[c:], strict=True)]
        pivots.append(c)
        if len(pivots) == len(rows):
            break
    if any(row[n] for row in rows[len(pivots) :]):
        return None
    sol = [0] * n
    for r, c in enumerate(pivots):
        sol[c] = rows[r][n]
    return sol


def _berlekamp_welch(
    xs: Sequence[int], ys: Sequence[int], threshold: int, prime: int
) -> list[int] | None:
    """Coefficients (length ``threshold``) of the polynomial of degree < threshold agreeing
    with all but at most e = (k − threshold) // 2 of the k points, or None if there is none."""
    k, t = len(xs), threshold
    e = (k - t) // 2
    # Unknowns: Q_0..Q_{e+t-1}, E_0..E_{e-1} (E monic of degree e); Q(x) = y·E(x) at each point.
    matrix = []
    for x, y in zip(xs, ys, strict=True):
        pw = [pow(x, j, prime) for j in range(e + t)]
        matrix.append(pw + [-y * pw[j] % prime for j in range(e)] + [y * pw[e] % prime])
    sol = _solve(matrix, 2 * e + t, prime)
    if sol is None:
        return None
    q, err = sol[: e + t], [*sol[e + t :], 1]
    # Q / E by long division (E monic); the quotient has degree < t.
    quotient = [0] * t
    for i in range(e + t - 1, e - 1, -1):
        c = quotient[i - e] = q[i]
        if c:
            for j in range(e + 1):
                q[i - e + j] = (q[i - e + j] - c * err[j]) % prime
    if any(q[:e]):
        return None
    agree = sum(_eval_poly(quotient, x, prime) == y for x, y in zip(xs, ys, strict=True))
    return quotient if agree >= k - e else None


def _subsets(k: int, t: int, limit: int) -> Iterator[tuple[int, ...]]:
    """All t-subsets of range(k) in order if there are at most ``limit``, else ``limit``
    random ones from the OS generator (so corrupting parties cannot aim at the ones tried)."""
    if math.comb(k, t) <= limit:
        return combinations(range(k), t)
    rng = random.SystemRandom()
    return (tuple(sorted(rng.sample(range(k), t))) for _ in range(limit))


# --------------------------------------------------------------------------- sharing


def split_many(
    secrets: Sequence[bytes],
    threshold: int,
    xs: Sequence[int],
    *,
    randbytes: RandBytes = os.urandom,
) -> list[list[Share]]:
    """Share each secret (bytes of length 1..32) t-of-n among the holders at ``xs``.

    Returns shares indexed ``[secret][holder]``, holders in the order of ``xs``. Each
    polynomial has f(0) = the secret (big-endian) and threshold − 1 coefficients drawn from
    ``randbytes`` (one call for all secrets, 49 bytes per coefficient reduced mod p; must be
    a cryptographic source, injectable for tests). Raises :class:`ShamirError` if
    threshold < 2, threshold > len(xs), an x is 0, above 2^32 − 1 or repeated, or a secret
    is empty or longer than 32 bytes.
    """
    xs = _check_xs(xs, PRIME)
    _check_threshold(
        threshold,
        len(xs),
        f"threshold {threshold} exceeds the {len(xs)} share holders: "
        "lower the threshold or add holders",
    )
    values = []
    for i, s in enumerate(secrets):
        if not 1 <= len(s) <= MAX_SECRET_BYTES:
            raise ShamirError(
                f"secret {i} is {len(s)} bytes: secrets must be 1..{MAX_SECRET_BYTES} bytes "
                "(share longer data as several secrets or share a key that encrypts it)"
            )
        values.append(int.from_bytes(s, "big"))
    ys = _split_ints(values, threshold, xs, randbytes, PRIME)
    return [[Share(x, y) for x, y in zip(xs, row, strict=True)] for row in ys]


def split(
    secret: bytes,
    threshold: int,
    xs: Sequence[int],
    *,
    randbytes: RandBytes = os.urandom,
) -> list[Share]:
    """Share one secret; the list has one share per x in the order of ``xs``.

    Same contract and errors as :func:`split_many`.
    """
    return split_many([secret], threshold, xs, randbytes=randbytes)[0]


# --------------------------------------------------------------------------- reconstruction


class Reconstructor:
    """Lagrange interpolation at 0 for one fixed set of share holders, computed once.

    ``Reconstructor(xs, threshold)`` uses the first ``threshold`` of ``xs`` (distinct, in
    1..2^32 − 1); it raises :class:`ShamirError` if threshold < 2, len(xs) < threshold or an
    x is invalid or repeated. :meth:`reconstruct` and :meth:`reconstruct_many` take
    y-values aligned with ``xs`` (len(xs) of them, the first ``threshold`` used) and return
    the secrets as field integers; each is one dot product mod p.
    """

    __slots__ = ("coefficients", "n_inputs", "threshold", "xs")

    def __init__(self, xs: Sequence[int], threshold: int) -> None:
        all_xs = _check_xs(xs, PRIME)
        _check_threshold(
            threshold,
            len(all_xs),
            f"threshold {threshold} needs at least {threshold} x-coordinates, got {len(all_xs)}",
        )
        self.threshold = threshold
        self.n_inputs = len(all_xs)
        self.xs: tuple[int, ...] = tuple(all_xs[:threshold])
        self.coefficients: tuple[int, ...] = tuple(_lagrange_rows(self.xs, [0], PRIME)[0])

    def reconstruct(self, ys: Sequence[int]) -> int:
        """The secret f(0) as an int in [0, p); raises :class:`ShamirError` if ``ys`` does not
        have len(xs) entries or a used entry is not in [0, p)."""
        if len(ys) != self.n_inputs:
            raise ShamirError(f"expected {self.n_inputs} y-values (one per x), got {len(ys)}")
        used = ys[: self.threshold]
        if not all(0 <= y < PRIME for y in used):
            raise ShamirError("a y-value is not a field element: need 0 <= y < PRIME")
        total: int = sum(map(operator.mul, self.coefficients, used))
        return total % PRIME

    def reconstruct_many(self, rows: Sequence[Sequence[int]]) -> list[int]:
        """:meth:`reconstruct` for each row of y-values."""
        return [self.reconstruct(ys) for ys in rows]


def _check_shares(shares: Sequence[Share], threshold: int) -> None:
    _check_threshold(
        threshold,
        len(shares),
        f"too few shares to reconstruct: threshold {threshold} needs {threshold}, "
        f"got {len(shares)}",
    )
    _check_xs([s.x for s in shares], PRIME)


def reconstruct(shares: Sequence[Share], threshold: int, secret_len: int = 32) -> bytes:
    """The ``secret_len``-byte secret from the first ``threshold`` of ``shares``.

    No consistency check: corrupted shares give a wrong secret (see
    :func:`reconstruct_verified`). Raises :class:`ShamirError` if threshold < 2, fewer than
    ``threshold`` shares are given, two shares have the same x, secret_len is not 1..32, or
    the value does not fit in ``secret_len`` bytes.
    """
    return reconstruct_many([shares], threshold, secret_len)[0]


def reconstruct_many(
    share_lists: Sequence[Sequence[Share]], threshold: int, secret_len: int = 32
) -> list[bytes]:
    """:func:`reconstruct` for each list of shares, in order.

    Lists are grouped by the x-coordinates of their first ``threshold`` shares, so each
    distinct holder set computes its Lagrange coefficients once. Same errors as
    :func:`reconstruct`.
    """
    _check_secret_len(secret_len)
    cache: dict[tuple[int, ...], Reconstructor] = {}
    out = []
    for shares in share_lists:
        _check_shares(shares, threshold)
        used = shares[:threshold]
        key = tuple(s.x for s in used)
        rec = cache.get(key)
        if rec is None:
            rec = cache[key] = Reconstructor(key, threshold)
        value = sum(map(operator.mul, rec.coefficients, [s.y for s in used])) % PRIME
        out.append(_to_secret(value, secret_len))
    return out


def reconstruct_verified(
    shares: Sequence[Share],
    threshold: int,
    predicate: Predicate | None = None,
    *,
    secret_len: int = 32,
    max_subsets: int = DEFAULT_MAX_SUBSETS,
) -> VerifiedSecret:
    """Reconstruct despite corrupted shares and report which shares are off the polynomial.

    A candidate secret is accepted if it fits in ``secret_len`` bytes and ``predicate``
    (given the secret bytes, e.g. "its X25519 public key is the advertised one") holds.
    Tried in order: (1) the polynomial through the first ``threshold`` shares, if every
    other share lies on it; (2) Berlekamp–Welch decoding, which corrects up to
    (k − threshold) // 2 bad shares among k; (3) only if ``predicate`` is given, a search
    over threshold-subsets until one yields an accepted secret: all of them in order if
    there are at most ``max_subsets``, else ``max_subsets`` random ones. Without
    a predicate the result is the unique decoding; with k == threshold nothing is checked
    beyond the predicate. Raises :class:`ShamirError` for the errors of :func:`reconstruct`
    and :class:`ShareVerificationError` if no candidate is accepted.
    """
    _check_secret_len(secret_len)
    _check_shares(shares, threshold)
    if max_subsets < 0:
        raise ShamirError(f"max_subsets must be >= 0, got {max_subsets}")
    t, k, p = threshold, len(shares), PRIME
    xs = [s.x for s in shares]
    ys = [s.y for s in shares]
    rejected: set[int] = set()

    def accept(value: int) -> bytes | None:
        if value in rejected or value >> (8 * secret_len):
            return None
        secret = value.to_bytes(secret_len, "big")
        if predicate is None or predicate(secret):
            return secret
        rejected.add(value)
        return None

    def result(secret: bytes, on_poly: Sequence[bool]) -> VerifiedSecret:
        used = tuple(sorted(x for x, ok in zip(xs, on_poly, strict=True) if ok))
        bad = tuple(sorted(x for x, ok in zip(xs, on_poly, strict=True) if not ok))
        return VerifiedSecret(secret, used, bad)

    # (1) Fast path: interpolate from the first t shares, check the others lie on it.
    rows = _lagrange_rows(xs[:t], [0, *xs[t:]], p)
    values = [_dot(row, ys[:t], p) for row in rows]
    consistent = all(v == y for v, y in zip(values[1:], ys[t:], strict=True))
    secret = accept(values[0])
    if consistent:
        if secret is not None:
            return result(secret, [True] * k)
        fits = not values[0] >> (8 * secret_len)
        raise ShareVerificationError(
            f"all {k} shares lie on one polynomial, but its secret "
            + ("fails the predicate" if fits else f"does not fit in {secret_len} bytes")
            + f": the shares were dealt for another secret or more than {k - t} are corrupted"
        )

    # (2) Berlekamp–Welch: unique decoding with up to e bad shares.
    e = (k - t) // 2
    if e:
        poly = _berlekamp_welch(xs, ys, t, p)
        if poly is not None and (secret := accept(poly[0])) is not None:
            on = [_eval_poly(poly, x, p) == y for x, y in zip(xs, ys, strict=True)]
            return result(secret, on)
    if predicate is None:
        raise ShareVerificationError(
            f"the {k} shares (threshold {t}) are inconsistent and Berlekamp–Welch cannot "
            f"correct them (at most {e} bad shares): supply more shares or a predicate"
        )

    # (3) Bounded search over t-subsets for a secret that passes the predicate.
    tried = 0
    for subset in _subsets(k, t, max_subsets):
        tried += 1
        sx = [xs[i] for i in subset]
        sy = [ys[i] for i in subset]
        if (secret := accept(_dot(_lagrange_rows(sx, [0], p)[0], sy, p))) is not None:
            others = [i for i in range(k) if i not in subset]
            on = [True] * k
            rows = _lagrange_rows(sx, [xs[i] for i in others], p)
            for i, row in zip(others, rows, strict=True):
                on[i] = _dot(row, sy, p) == ys[i]
            return result(secret, on)
    raise ShareVerificationError(
        f"no secret passing the predicate from {k} shares (threshold {t}): tried the first "
        f"{t} shares, Berlekamp–Welch (corrects up to {e}) and {tried} of the "
        f"{math.comb(k, t)} {t}-subsets (max_subsets={max_subsets}): too many shares are "
        "corrupted, or raise max_subsets"
    )
