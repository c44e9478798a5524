"""A cryptographically secure random source for DP noise, with exact integer draws.

:class:`SecureRandom` is the AES-256-CTR keystream (``cryptography``: the encryption of
zeros under ``Cipher(algorithms.AES(key), modes.CTR(nonce))``) read as little-endian
uint64 words. A fresh instance is keyed from ``os.urandom(32)`` with an ``os.urandom(16)``
initial counter block, so its output is indistinguishable from uniform bits to anyone
without the key (AES as a PRF; the counter never repeats within 2^128 blocks). Noise that
protects privacy must come from such a source: an attacker who can predict it can subtract
it. :meth:`SecureRandom.from_seed` keys it from 48 explicit bytes instead; that is **for
reproducible simulations, tests and public streams** (the round's rotation signs) only:
whoever knows the seed knows the noise.

Every draw is exact: the integer and Bernoulli draws are derived from the keystream bits by
exact integer arithmetic with rejection, never by rounding a float, so their distributions
are exactly the stated ones (given uniform keystream bits):

- :meth:`~SecureRandom.below`: uniform on ``[0, bound)`` by rejection (accept a word
  ``u >= 2^64 mod bound``, return ``u mod bound``: the accepted range has a length
  divisible by ``bound``).
- :meth:`~SecureRandom.uniform_ints`: the same for one bound, with Lemire's
  multiply-and-reject method on 32-bit words when ``bound <= 2^32`` (D. Lemire, "Fast Random
  Integer Generation in an Interval", ACM TOMACS 29(1), 2019: every output has exactly
  ``floor(2^32 / bound)`` accepted 32-bit preimages).
- :meth:`~SecureRandom.bernoulli`: ``Bernoulli(num/den)`` by comparing the random real
  ``U = 0.b1b2b3...`` (the keystream bits) with the rational ``num/den``, 64 bits (or 32)
  at a time; see :meth:`~SecureRandom.bernoulli` for the argument.

Draws are vectorised with numpy. The keystream is produced in blocks of ``2^17`` words
(1 MiB), so memory stays bounded apart from the arrays returned. An instance is not
thread-safe; use one per thread.
"""

from __future__ import annotations

import os
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .errors import PrivacyConfigError

__all__ = ["SEED_BYTES", "SecureRandom"]

SEED_BYTES: Final = 48
"""Bytes of an explicit seed: a 32-byte AES-256 key and a 16-byte initial counter block."""

_BLOCK_WORDS: Final = 1 << 17  # keystream words produced per cipher call
_DIRECT_WORDS: Final = 1 << 11  # larger requests get their own keystream, not the pool's
_ZEROS: Final = memoryview(bytes(8 * _BLOCK_WORDS))
_SLACK: Final = 2  # spare words: older `update_into` wants 15 spare bytes after its output
_M32: Final = (1 << 32) - 1
_TWO_64: Final = 1 << 64
_TWO_63: Final = 1 << 63
_U64: Final = np.dtype("<u8")

U64Array = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]


class SecureRandom:
    """AES-256-CTR random source with exact vectorised draws (see the module docstring).

    ``SecureRandom()`` is keyed from ``os.urandom``; two instances never share output.
    Every method consumes fresh keystream and returns new arrays (or views of keystream no
    other call will hand out). Not thread-safe.
    """

    __slots__ = ("_encryptor", "_pool", "_pos")

    def __init__(self) -> None:
        self._start(os.urandom(SEED_BYTES))

    @classmethod
    def from_seed(cls, seed: bytes) -> SecureRandom:
        """A generator keyed from ``seed`` (``seed[:32]`` the AES key, ``seed[32:48]`` the
        initial counter block): the same seed gives the same draws.

        **For reproducible simulations, tests and public streams only**: anyone who knows
        the seed knows every draw, so noise drawn this way protects nothing against them.
        Raises :class:`PrivacyConfigError` unless ``seed``
        is exactly 48 bytes.
        """
        if not isinstance(seed, bytes | bytearray | memoryview) or len(seed) != SEED_BYTES:
            got = len(seed) if hasattr(seed, "__len__") else type(seed).__name__
            raise PrivacyConfigError(
                f"a SecureRandom seed is {SEED_BYTES} bytes (32-byte key + 16-byte nonce), "
                f"got {got}"
            )
        rng = cls.__new__(cls)
        rng._start(bytes(seed))
        return rng

    def _start(self, seed: bytes) -> None:
        cipher = Cipher(algorithms.AES(seed[:32]), modes.CTR(seed[32:SEED_BYTES]))
        self._encryptor = cipher.encryptor()
        self._pool: U64Array = np.empty(0, dtype=_U64)
        self._pos = 0

    # ----------------------------------------------------------------- raw keystream

    def _fill(self, count: int) -> U64Array:
        """``count`` fresh keystream words in a new array (block by block)."""
        out = np.empty(count + _SLACK, dtype=_U64)
        raw = out.view(np.uint8)
        pos, nbytes = 0, 8 * count
        while pos < nbytes:
            take = min(8 * _BLOCK_WORDS, nbytes - pos)
            self._encryptor.update_into(_ZEROS[:take], raw[pos : pos + take + 15].data)
            pos += take
        words = out[:count]
        if words.dtype.byteorder == ">":  # pragma: no cover - big-endian hosts only
            words = words.byteswap().view(words.dtype.newbyteorder())
        return words

    def words(self, n: int) -> U64Array:
        """``n`` raw keystream words: a 1-D ``uint64`` array of independent uniform words.

        Requests below 2^11 words are served from a 1 MiB block of keystream (a request
        that does not fit the rest of the block starts a new one; no word is ever handed
        out twice, so the result may be a view of a block no one else sees). Raises
        :class:`PrivacyConfigError` if ``n`` is not an integer ``>= 0``.
        """
        n = _count(n)
        if n >= _DIRECT_WORDS:
            return self._fill(n)
        if self._pos + n > self._pool.shape[0]:
            self._pool = self._fill(_BLOCK_WORDS)
            self._pos = 0
        out = self._pool[self._pos : self._pos + n]
        self._pos += n
        return out

    def words32(self, n: int) -> npt.NDArray[np.uint32]:
        """``n`` independent uniform ``uint32`` words (half a keystream word each)."""
        n = _count(n)
        return self.words((n + 1) // 2).view(np.uint32)[:n]

    def bits(self, n: int) -> BoolArray:
        """``n`` independent fair coin flips as a ``bool`` array (one keystream bit each)."""
        n = _count(n)
        raw = self.words((n + 63) // 64).view(np.uint8)
        return np.unpackbits(raw, count=n).view(np.bool_)

    def uniform(self, n: int) -> npt.NDArray[np.float64]:
        """``n`` floats uniform on the grid ``{k / 2^53 : 0 <= k < 2^53}`` ⊂ [0, 1): the top
        53 bits of a word times ``2^-53`` (exact, every grid point equally likely)."""
        return (self.words(n) >> 11).astype(np.float64) * (2.0**-53)

    # ----------------------------------------------------------------- integers

    def below(self, bounds: Any) -> U64Array:
        """Uniform integers in ``[0, bounds[i])``, one per element of ``bounds``.

        ``bounds`` is an integer array (or scalar) with every element in ``[1, 2^64)``; the
        result is ``uint64`` with its shape. Exact rejection sampling: a word ``u`` is
        accepted iff ``u >= 2^64 mod b``, and then ``u mod b`` is returned. The accepted
        range ``[2^64 mod b, 2^64)`` has length ``b * floor(2^64 / b)``, so every residue
        has exactly ``floor(2^64 / b)`` preimages; rejected elements redraw (probability
        ``< b / 2^64 <= 1/2`` each time). Raises :class:`PrivacyConfigError` on a bound
        outside ``[1, 2^64)`` or a non-integer array.
        """
        b = _as_u64(bounds, "bounds", low=1)
        flat = b.reshape(-1)
        out = np.empty(flat.shape[0], dtype=_U64)
        threshold = np.subtract(0, flat, dtype=_U64) % flat  # (2^64 - b) mod b = 2^64 mod b
        pending = np.arange(flat.shape[0])
        while pending.shape[0]:
            u = self.words(pending.shape[0])
            bound = flat[pending]
            ok = u >= threshold[pending]
            if ok.all():
                out[pending] = u % bound
                break
            keep = np.flatnonzero(ok)
            out[pending[keep]] = u[keep] % bound[keep]
            pending = pending[np.flatnonzero(~ok)]
        return out.reshape(b.shape)

    def uniform_ints(self, bound: int, n: int) -> U64Array:
        """``n`` uniform integers in ``[0, bound)`` for one Python-int ``bound`` in
        ``[1, 2^64)``, as ``uint64``.

        For ``bound <= 2^32``: Lemire's method on 32-bit words ``u`` (``m = u * bound``;
        accept iff ``m mod 2^32 >= 2^32 mod bound``; return ``m >> 32``), exact because each
        output value ``j`` has exactly ``floor(2^32 / bound)`` accepted preimages: the ``u``
        with ``m >> 32 == j`` are ``ceil(j·2^32/bound)`` onwards, and their ``m mod 2^32``
        run through one residue class mod ``bound`` from which the threshold removes exactly
        the surplus (Lemire 2019); no division per element. Larger bounds use :meth:`below`. Raises
        :class:`PrivacyConfigError` on a bad bound or count.
        """
        n = _count(n)
        if isinstance(bound, bool) or not isinstance(bound, int | np.integer):
            raise PrivacyConfigError(f"bound must be an int, got {type(bound).__name__}")
        bound = int(bound)
        if not 1 <= bound < _TWO_64:
            raise PrivacyConfigError(f"bound must be in [1, 2^64), got {bound}")
        if bound > 1 << 32:
            return self.below(np.full(n, bound, dtype=_U64))
        return self._lemire32(bound, n)

    def _lemire32(self, bound: int, n: int) -> U64Array:
        threshold = (1 << 32) % bound
        product = self.words32(n).astype(np.uint64) * np.uint64(bound)
        if threshold:
            bad = np.flatnonzero((product & _M32) < threshold)
            while bad.shape[0]:  # probability < bound / 2^32 per element
                redo = self.words32(bad.shape[0]).astype(np.uint64) * np.uint64(bound)
                product[bad] = redo
                bad = bad[np.flatnonzero((redo & _M32) < threshold)]
        return product >> np.uint64(32)

    # ----------------------------------------------------------------- Bernoulli

    def bernoulli(self, num: Any, den: Any) -> BoolArray:
        """Exact ``Bernoulli(num / den)`` draws, elementwise over the broadcast shape.

        ``num`` and ``den`` are integer arrays (or scalars) with ``0 <= num <= den`` and
        ``1 <= den < 2^63``; the result is a ``bool`` array.

        Method (exact): the keystream bits ``b1 b2 ...`` of each element form a uniform real
        ``U = sum_i b_i 2^-i``, and the result is ``[U < num/den]``, which has probability
        exactly ``num/den``. The first ``w`` bits (``w = 32`` when ``den < 2^32``, else 64)
        give an integer ``u`` with ``U ∈ [u/2^w, (u+1)/2^w)``, and::

            u*den + den <= num*2^w  →  U < num/den       (1)
            u*den >= num*2^w        →  U >= num/den      (0)
            otherwise                  U < num/den  iff  U' < rem/den,

        where ``U' = 2^w U - u`` is again uniform on [0, 1) (the later bits) and
        ``rem = num*2^w - u*den`` is in ``(0, den)``: the undecided case (probability
        ``< 2^-(w-1)``) recurses on the fresh bits. The 128-bit product ``u*den`` is formed
        exactly from 32-bit limbs. Raises :class:`PrivacyConfigError` on out-of-range input.
        """
        n_arr = _as_u64(num, "num", low=0)
        d_arr = _as_u64(den, "den", low=1)
        if np.any(d_arr >= np.uint64(_TWO_63)):
            raise PrivacyConfigError("den must be < 2^63")
        n_b, d_b = np.broadcast_arrays(n_arr, d_arr)
        if np.any(n_b > d_b):
            raise PrivacyConfigError("num must be <= den (a probability num/den in [0, 1])")
        shape = n_b.shape
        out = self._bernoulli_unchecked(n_b.reshape(-1).copy(), d_b.reshape(-1).copy())
        return out.reshape(shape)

    def _bernoulli_unchecked(self, num: U64Array, den: int | U64Array) -> BoolArray:
        """:meth:`bernoulli` without checks: ``num`` a 1-D ``uint64`` array, ``den`` one
        Python int or an array of ``num``'s shape, ``0 <= num <= den``, ``1 <= den < 2^63``.
        For :mod:`sharefl.privacy.discrete_samplers`, whose loops call it on known-good
        input."""
        m = num.shape[0]
        if m == 0:
            return np.zeros(0, dtype=np.bool_)
        scalar = isinstance(den, int)
        den_max = den if isinstance(den, int) else int(den.max())
        if den_max < 1 << 32:
            u = self.words32(m).astype(np.uint64)
            product = u * (np.uint64(den) if scalar else den)
            target = num << np.uint64(32)
            result = product < target
            # Decided 1 iff u*den + den <= num*2^32; the other elements of `result` are
            # undecided (u*den < num*2^32 < u*den + den), looked for only if there are any.
            if np.count_nonzero(product + den <= target) == np.count_nonzero(result):
                return result
            undecided = np.flatnonzero(result & ~(product + den <= target))
            remainder = (target - product)[undecided]
        else:
            u = self.words(m)
            d = np.uint64(den) if scalar else den
            high = _mul_high(u, d)
            result = high < num
            # Undecided iff high == num - 1 (probability about 1/den) and low + den > 2^64,
            # with low = u*den mod 2^64; then rem = num*2^64 - u*den = 2^64 - low.
            near = np.flatnonzero(high + np.uint64(1) == num)
            if not near.shape[0]:
                return result
            d_near = d if scalar else den[near]  # type: ignore[index]
            low = u[near] * d_near
            wraps = np.flatnonzero(low > np.negative(np.asarray(d_near, dtype=np.uint64)))
            undecided = near[wraps]
            remainder = np.negative(low[wraps])
        if undecided.shape[0]:
            sub_den = den if scalar else np.asarray(den)[undecided]
            result[undecided] = self._bernoulli_unchecked(remainder, sub_den)
        return result


def _mul_high(u: U64Array, d: Any) -> U64Array:
    """The high 64 bits of the exact 128-bit product ``u * d`` (``uint64`` operands), from
    32-bit limbs: every partial product and the middle sum fit in 64 bits."""
    u0 = u & np.uint64(_M32)
    u1 = u >> np.uint64(32)
    d0 = d & np.uint64(_M32)
    d1 = d >> np.uint64(32)
    p00 = u0 * d0
    p01 = u0 * d1
    p10 = u1 * d0
    middle = (p00 >> np.uint64(32)) + (p01 & np.uint64(_M32)) + (p10 & np.uint64(_M32))
    return u1 * d1 + (p01 >> np.uint64(32)) + (p10 >> np.uint64(32)) + (middle >> np.uint64(32))


def _count(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise PrivacyConfigError(f"a sample count must be an int >= 0, got {n!r}")
    return int(n)


def _as_u64(values: Any, name: str, *, low: int) -> U64Array:
    """``values`` as a ``uint64`` array, checked to be integers in ``[low, 2^64)``."""
    if isinstance(values, int | np.integer) and not isinstance(values, bool):
        if not low <= int(values) < _TWO_64:
            raise PrivacyConfigError(f"{name} must be in [{low}, 2^64), got {values}")
        return np.asarray(int(values), dtype=_U64)
    array = np.asarray(values)
    if array.dtype.kind not in "iu":
        raise PrivacyConfigError(f"{name} must be an integer array, got dtype {array.dtype}")
    if array.size and (array.dtype.kind == "i" and int(array.min()) < low):
        raise PrivacyConfigError(f"{name} must be >= {low}, got {int(array.min())}")
    if array.size and array.dtype.kind == "u" and int(array.min()) < low:
        raise PrivacyConfigError(f"{name} must be >= {low}, got {int(array.min())}")
    return array.astype(_U64)
