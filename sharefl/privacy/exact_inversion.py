"""Exact sampling of a distribution on ``{0, 1, 2, ...}`` by inversion of its CDF.

The sample is ``X = min{k : U < F(k)}`` for the uniform real ``U = 0.b1b2b3...`` whose bits
are the keystream of a :class:`~sharefl.privacy.secure_random.SecureRandom`; then
``P[X = k] = F(k) - F(k-1)`` exactly. The comparisons ``U < F(k)`` are decided exactly
although ``F(k)`` is irrational (``exp`` of rationals):

- ``L_k = ⌊F(k)·2^64⌋`` is tabulated once. With ``u`` the first 64 bits of ``U``
  (``U ∈ [u/2^64, (u+1)/2^64)``): ``u < L_k`` implies ``U < F(k)`` and ``u > L_k``
  implies ``U > F(k)``. Only ``u == L_k`` (probability ``2^-64`` per level) leaves it open.
- An open comparison draws more keystream words (``U``'s next bits) and recomputes ``F(k)``
  to more digits until the interval of ``U`` and the interval of ``F(k)`` separate, which
  happens with probability 1 because ``F(k)`` is irrational. Nothing is approximated.

The table entries and refinements come from **rigorous interval bounds**: every
probability is bracketed by two :class:`decimal.Decimal` values computed with directed
rounding (``ROUND_FLOOR`` for lower bounds, ``ROUND_CEILING`` for upper ones), ``exp``
being correctly rounded in :mod:`decimal` (its documented contract), so the true value lies
between ``exp(x).next_minus()`` and ``exp(x).next_plus()``. ``L_k`` is accepted only when
the floors of both bounds times ``2^64`` agree; otherwise the table is rebuilt with twice
the digits.

Vectorised sampling: a guide table indexed by the top bits of ``u`` gives the first
candidate ``k`` (Chen and Asau's indexed search), and the few samples whose ``u`` lies above
``L_k`` step forward together. A sample costs one keystream word and two gathers.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal
from fractions import Fraction
from typing import Final

import numpy as np
import numpy.typing as npt

from .errors import PrivacyConfigError
from .secure_random import SecureRandom

__all__ = [
    "Bounds",
    "ExactInversionTable",
    "WeightBounds",
    "contexts",
    "exp_neg_bounds",
    "rational_bounds",
]

Bounds = tuple[Decimal, Decimal]
"""``(lo, hi)`` with ``lo <= true value <= hi``."""

WeightBounds = Callable[[int], tuple[list[Bounds], Bounds]]
"""``digits -> (weights, total)``: bounds of the unnormalised weights ``w_0, w_1, ..., w_M``
(computed with ``digits`` significant digits, enough entries that the weight beyond
``M`` is below ``10^-digits`` of the total) and of the total ``Σ_k w_k`` (all of them)."""

_TWO_64: Final = 1 << 64
_MAX_LEVELS: Final = 1 << 22
_START_DIGITS: Final = 40
_CHUNK: Final = 1 << 16  # samples per pass: the working arrays stay in cache


def contexts(digits: int) -> tuple[Context, Context, Context]:
    """Decimal contexts with ``digits`` significant digits rounding down, up and to
    nearest (for the correctly rounded ``exp``), with an exponent range wide enough that
    nothing relevant under- or overflows."""
    common = {
        "prec": digits,
        "Emax": decimal.MAX_EMAX,
        "Emin": decimal.MIN_EMIN,
        "traps": [decimal.InvalidOperation, decimal.DivisionByZero, decimal.Overflow],
    }
    return (
        Context(rounding=ROUND_FLOOR, **common),  # type: ignore[arg-type]
        Context(rounding=ROUND_CEILING, **common),  # type: ignore[arg-type]
        Context(rounding=ROUND_HALF_EVEN, **common),  # type: ignore[arg-type]
    )


def rational_bounds(value: Fraction, digits: int) -> Bounds:
    """``value`` rounded down and up to ``digits`` significant digits."""
    down, up, _ = contexts(digits)
    num, den = Decimal(value.numerator), Decimal(value.denominator)
    return down.divide(num, den), up.divide(num, den)


def exp_neg_bounds(x: Fraction, digits: int) -> Bounds:
    """Bounds of ``exp(-x)`` for a rational ``x >= 0``: ``exp`` is correctly rounded, so the
    true value lies within one unit in the last place of the rounded result."""
    down, up, nearest = contexts(digits)
    x_lo, x_hi = rational_bounds(x, digits)
    lo = nearest.exp(-x_hi).next_minus(down)
    hi = nearest.exp(-x_lo).next_plus(up)
    return max(lo, Decimal(0)), hi


class ExactInversionTable:
    """Exact sampler of the distribution with weights ``w_k / Σ w`` on ``k = 0, 1, ...``.

    Args:
        weight_bounds: rigorous bounds of the weights and their total (see
            :data:`WeightBounds`); called again with more digits when a comparison or a
            table entry needs them.
        name: what the distribution is, for error messages.

    Raises:
        PrivacyConfigError: the table would exceed ``2^22`` levels (the distribution is too
            spread out for inversion; callers fall back to another exact method).
    """

    def __init__(self, weight_bounds: WeightBounds, name: str) -> None:
        self._weight_bounds = weight_bounds
        self._name = name
        self._cdf_cache: dict[int, list[Bounds]] = {}
        digits = _START_DIGITS
        while True:
            levels = self._levels(digits)
            if levels is not None:
                break
            digits *= 2
        self.digits = digits
        self._cdf_cache.clear()  # large; `_resolve` recomputes what it needs (rarely)
        # The leading run of L_k = 0 (a left tail of mass < 2^-64) is cut off: `offset` is
        # the index of the first level kept. Any u >= 1 is above all of them; u = 0 ties
        # with them and is resolved from k = 0.
        offset = next(i for i, level in enumerate(levels) if level > 0)
        self.offset = offset
        self.levels: npt.NDArray[np.uint64] = np.array(levels[offset:], dtype=np.uint64)
        self.guide_bits = min(20, max(8, (len(self.levels) - 1).bit_length() + 3))
        starts = np.arange(1 << self.guide_bits, dtype=np.uint64) << np.uint64(64 - self.guide_bits)
        # Bucket b starts at the first kept k with L_k >= b·2^(64-G): levels below the
        # bucket's start can only hold for smaller u.
        self.guide: npt.NDArray[np.int64] = np.searchsorted(
            self.levels, starts, side="left"
        ).astype(np.int64)

    def _cdf(self, digits: int) -> list[Bounds]:
        """Bounds of ``F(0), ..., F(M)`` (cached per precision)."""
        if digits not in self._cdf_cache:
            down, up, _ = contexts(digits)
            weights, (total_lo, total_hi) = self._weight_bounds(digits)
            cdf: list[Bounds] = []
            s_lo = s_hi = Decimal(0)
            one = Decimal(1)
            for w_lo, w_hi in weights:
                s_lo = down.add(s_lo, w_lo)
                s_hi = up.add(s_hi, w_hi)
                cdf.append((down.divide(s_lo, total_hi), min(up.divide(s_hi, total_lo), one)))
            self._cdf_cache[digits] = cdf
        return self._cdf_cache[digits]

    def _levels(self, digits: int) -> list[int] | None:
        """``⌊F(k)·2^64⌋`` up to the first level equal to ``2^64 - 1``, or None if the
        bounds at this precision do not determine them."""
        down, up, _ = contexts(digits)
        scale = Decimal(_TWO_64)
        levels: list[int] = []
        for lo, hi in self._cdf(digits):
            low = int(down.multiply(lo, scale))
            high = min(int(up.multiply(hi, scale)), _TWO_64 - 1)  # F(k) < 1
            if low != high:
                return None
            levels.append(low)
            if low == _TWO_64 - 1:
                return levels
            if len(levels) > _MAX_LEVELS:
                raise PrivacyConfigError(
                    f"{self._name}: more than {_MAX_LEVELS} CDF levels; too spread out for "
                    "an inversion table"
                )
        return None  # the bounds did not reach F = 1 - 2^-64: more digits

    def sample(self, n: int, rng: SecureRandom, *, signed: bool = False) -> npt.NDArray[np.int64]:
        """``n`` exact i.i.d. draws as ``int64``: one keystream word each (a few more in
        the probability-``2^-64`` event ``u == L_k``). With ``signed``, each draw is negated
        with probability 1/2 (one keystream bit each)."""
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, _CHUNK):
            chunk = out[start : start + _CHUNK]
            self._sample_into(chunk, rng)
            if signed:  # times 1 - 2B, B a fair bit (a masked negative is much slower)
                sign = rng.bits(chunk.shape[0]).view(np.int8) * np.int8(-2) + np.int8(1)
                np.multiply(chunk, sign, out=chunk)
        return out

    def _sample_into(self, out: npt.NDArray[np.int64], rng: SecureRandom) -> None:
        u = rng.words(out.shape[0])
        k = out
        np.take(self.guide, (u >> np.uint64(64 - self.guide_bits)).view(np.int64), out=k)
        level = self.levels[k]
        step = np.flatnonzero(u > level)  # U > F(k) for sure: the answer is further on
        if step.shape[0]:
            # First k with L_k >= u (a binary search, for the few u beyond the first guess).
            k[step] = np.searchsorted(self.levels, u[step], side="left")
            level[step] = self.levels[k[step]]
        if np.count_nonzero(u == level):
            for i in np.flatnonzero(u == level):
                k[i] = self._resolve(int(u[i]), int(k[i]) + self.offset, rng) - self.offset
        if self.offset:
            k += self.offset
            if np.count_nonzero(u == 0):
                for i in np.flatnonzero(u == 0):
                    k[i] = self._resolve(0, 0, rng)

    def _resolve(self, prefix: int, k: int, rng: SecureRandom) -> int:
        """``min{j >= k : U < F(j)}`` given that ``U > F(j)`` for ``j < k`` and that the
        first 64 bits of ``U`` are ``prefix``: refine ``U`` and ``F`` until they separate."""
        bits = 64
        digits = self.digits
        while True:
            cdf = self._cdf(digits)
            while k < len(cdf):
                lo, hi = (Fraction(v) for v in cdf[k])
                if Fraction(prefix + 1, 1 << bits) <= lo:
                    return k
                if Fraction(prefix, 1 << bits) >= hi:
                    k += 1
                    continue
                break
            prefix = (prefix << 64) | int(rng.words(1)[0])
            bits += 64
            digits = max(2 * digits, math.ceil(bits * math.log10(2)) + 20)
