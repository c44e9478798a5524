"""Samplers of the discrete noise of distributed DP: discrete Gaussian and Skellam.

Both are driven by :class:`~sharefl.privacy.secure_random.SecureRandom` (AES-256-CTR) and
vectorised with numpy: every loop runs over the set of samples still pending, which shrinks
geometrically, never over single samples.

- :class:`DiscreteGaussian` / :func:`discrete_gaussian`: the discrete Gaussian
  ``N_Z(0, σ²)``, ``P[X = x] ∝ exp(-x²/(2σ²))`` on the integers (Kairouz, Liu, Steinke,
  "The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure
  Aggregation", ICML 2021). Sampled **exactly** for the ``σ²`` reported in
  :attr:`DiscreteGaussian.sigma_squared`, by one of two exact methods with the same output
  law: Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy"
  (NeurIPS 2020, arXiv:2004.00010), Algorithms 1-3, in integer arithmetic (any σ up to
  2^26); or, for σ up to :data:`DG_TABLE_MAX_SIGMA`, inversion of the exact CDF
  (:mod:`sharefl.privacy.exact_inversion`), several times faster.
- :class:`Skellam` / :func:`skellam`: the symmetric Skellam ``Sk(μ, μ)``, the difference of
  two independent ``Poisson(μ)`` (variance ``2μ``; Agarwal, Kairouz, Liu, "The Skellam
  Mechanism for Differentially Private Federated Learning", NeurIPS 2021). The Poissons are
  exact (CDF inversion) for ``μ <= POISSON_TABLE_MAX_MU``, and come from Hörmann's PTRS
  beyond, which is exact only up to the float64 rounding of its acceptance test.

"Exact" means: if the keystream bits are uniform, the output has exactly the stated law
(no floating-point ``exp`` or rounding takes part in any accept/reject decision).

Errors: :class:`~sharefl.privacy.errors.PrivacyConfigError` for a negative, NaN or infinite
parameter, one too large for the exact integer arithmetic, a bad ``size`` or ``method``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from .errors import PrivacyConfigError
from .exact_inversion import (
    Bounds,
    ExactInversionTable,
    contexts,
    exp_neg_bounds,
    rational_bounds,
)
from .secure_random import SecureRandom

__all__ = [
    "DG_TABLE_MAX_SIGMA",
    "MAX_DISCRETE_GAUSSIAN_SIGMA",
    "MAX_SKELLAM_MU",
    "POISSON_TABLE_MAX_MU",
    "DiscreteGaussian",
    "Skellam",
    "discrete_gaussian",
    "skellam",
]

IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Size = int | tuple[int, ...]
DGMethod = Literal["auto", "table", "cks"]
PoissonMethod = Literal["auto", "table", "ptrs"]

_INT64_MAX: Final = (1 << 63) - 1
_SQRT_INT64_MAX: Final = math.isqrt(_INT64_MAX)
_CHUNK: Final = 1 << 16  # samples per batch of the rejection samplers: arrays stay in cache


# ------------------------------------------------------------------ arguments


def _to_fraction(value: Any, name: str) -> Fraction:
    """``value`` (Fraction, int or float) as an exact non-negative rational."""
    if isinstance(value, bool):
        raise PrivacyConfigError(f"{name} must be a number, got {value!r}")
    if isinstance(value, Fraction):
        result = value
    elif isinstance(value, int | np.integer):
        result = Fraction(int(value))
    elif isinstance(value, float | np.floating):
        if not math.isfinite(float(value)):
            raise PrivacyConfigError(f"{name} must be finite, got {value!r}")
        result = Fraction(float(value))  # exact: every float is a dyadic rational
    else:
        raise PrivacyConfigError(
            f"{name} must be a Fraction, int or float, got {type(value).__name__}"
        )
    if result < 0:
        raise PrivacyConfigError(f"{name} must be >= 0, got {value!r}")
    return result


def _shape(size: Any) -> tuple[tuple[int, ...], int]:
    try:
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    except TypeError:
        raise PrivacyConfigError(
            f"size must be an int >= 0 or a tuple of them, got {size!r}"
        ) from None
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 0:
            raise PrivacyConfigError(f"size must be an int >= 0 or a tuple of them, got {size!r}")
    shape = tuple(int(d) for d in shape)
    return shape, math.prod(shape)


def _check_method(method: str, allowed: tuple[str, ...]) -> None:
    if method not in allowed:
        raise PrivacyConfigError(f"method must be one of {allowed}, got {method!r}")


# ------------------------------------------------------------------ Bernoulli(exp(-γ))


def _geometric_weights(digits: int) -> tuple[list[Bounds], Bounds]:
    """Weights ``exp(-v)``, ``v >= 0``, and their total ``1/(1 - e^-1)``."""
    down, up, _ = contexts(digits)
    e_lo, e_hi = exp_neg_bounds(Fraction(1), digits)
    eps = Decimal(1).scaleb(-(digits + 3))
    one = Decimal(1)
    weights: list[Bounds] = [(one, one)]
    w_lo, w_hi = one, one
    while True:
        w_lo, w_hi = down.multiply(w_lo, e_lo), up.multiply(w_hi, e_hi)
        weights.append((w_lo, w_hi))
        # Σ_{j > v} e^-j = e^-v · e^-1/(1 - e^-1) < 0.6 e^-v
        if w_hi < eps:
            break
    return weights, (
        down.divide(one, down.subtract(one, e_lo)),
        up.divide(one, up.subtract(one, e_hi)),
    )


@functools.lru_cache(maxsize=1)
def _geometric_table() -> ExactInversionTable:
    return ExactInversionTable(_geometric_weights, "geometric(exp(-1))")


def _geometric_exp_minus_one(m: int, rng: SecureRandom) -> IntArray:
    """``m`` exact draws of ``V`` with ``P(V >= v) = exp(-v)``: the number of successes of
    i.i.d. ``Bernoulli(exp(-1))`` before the first failure, which is what the inner loop of
    CKS Algorithm 2 (and the ``⌊γ⌋`` loop of Algorithm 1) count. Drawn by exact inversion
    (:class:`ExactInversionTable`): one keystream word instead of a loop of ``K``-loops."""
    return _geometric_table().sample(m, rng)


# K-loop steps drawn as one Bernoulli(num / (k·den)); beyond, Bernoulli(num/den) AND
# Bernoulli(1/k) (the same law; P(K > k) <= 1/k! makes that branch unreachable in practice).
_K_FAST: Final = 1 << 8
_DEN_MAX: Final = _INT64_MAX // _K_FAST  # k·den < 2^63 for every k <= _K_FAST


def _bernoulli_exp_fraction(num: U64Array, den: int, rng: SecureRandom) -> BoolArray:
    """Exact ``Bernoulli(exp(-num/den))`` for ``0 <= num <= den <= _DEN_MAX`` (elementwise,
    ``num`` a ``uint64`` array, ``den`` one int): CKS Algorithm 1 for ``γ ∈ [0, 1]``.

    ``K = 1``; while ``A ~ Bernoulli(γ/K)`` is 1, ``K += 1``; return ``[K odd]``. Then
    ``P(K > k) = γ^k/k!`` and ``P(K odd) = Σ_k (-γ)^k/k! = exp(-γ)`` (CKS §5, after von
    Neumann). Each ``Bernoulli(γ/K) = Bernoulli(num/(K·den))`` is an exact integer comparison
    (:meth:`SecureRandom.bernoulli`), vectorised over the samples whose loop still runs.
    """
    a = rng._bernoulli_unchecked(num, den)  # K = 1
    out = ~a
    idx = np.flatnonzero(a)
    cur = num[idx]
    k = 2
    while idx.shape[0]:
        if k <= _K_FAST:
            a = rng._bernoulli_unchecked(cur, den * k)
        else:
            ones = np.ones(cur.shape[0], dtype=np.uint64)
            a = rng._bernoulli_unchecked(cur, den) & rng._bernoulli_unchecked(ones, k)
        out[idx[np.flatnonzero(~a)]] = bool(k & 1)
        go = np.flatnonzero(a)
        idx = idx[go]
        cur = cur[go]
        k += 1
    return out


def _bernoulli_exp(whole: IntArray, num: U64Array, den: int, rng: SecureRandom) -> BoolArray:
    """Exact ``Bernoulli(exp(-(whole + num/den)))``, elementwise, for ``whole >= 0``,
    ``0 <= num < den <= _DEN_MAX``: CKS Algorithm 1, ``exp(-γ) = exp(-1)^⌊γ⌋ ·
    exp(-(γ - ⌊γ⌋))`` with independent factors. The ``⌊γ⌋`` coins ``Bernoulli(exp(-1))``
    all succeed iff ``V >= ⌊γ⌋`` for one geometric ``V`` (:func:`_geometric_exp_minus_one`),
    and only then is the fractional part's K-loop run."""
    passed = np.ones(whole.shape[0], dtype=np.bool_)
    some = np.flatnonzero(whole)
    if some.shape[0]:
        passed[some] = _geometric_exp_minus_one(some.shape[0], rng) >= whole[some]
    rest = np.flatnonzero(passed)
    passed[rest] = _bernoulli_exp_fraction(num[rest], den, rng)
    return passed


# ------------------------------------------------------------------ discrete Laplace


def _discrete_laplace(n: int, t: int, rng: SecureRandom) -> IntArray:
    """``n`` exact draws of ``Lap_Z(t)``, ``P[Y = y] ∝ exp(-|y|/t)`` (CKS Algorithm 2 with
    ``s = 1``), for an integer ``t >= 1``.

    ``U`` uniform on ``{0..t-1}`` is kept with probability ``exp(-U/t)``; ``V`` counts the
    ``Bernoulli(exp(-1))`` successes before a failure; ``X = U + t·V`` is then geometric,
    ``P[X = x] ∝ exp(-x/t)``; a fair sign ``B`` gives ``Y = (1-2B)·X``, rejecting
    ``B = 1, X = 0`` (0 would be counted twice). Candidates are drawn in batches and the
    accepted ones kept in order: the candidates are i.i.d., so the kept ones are i.i.d.
    ``Lap_Z(t)`` whatever the batch sizes.
    """
    out = np.empty(n, dtype=np.int64)
    e = math.exp(-1.0 / t)  # batch sizing only
    keep_rate = (1.0 - math.exp(-1.0)) / (t * (1.0 - e)) * (1.0 - (1.0 - e) / 2.0)
    filled = 0
    while filled < n:
        need = n - filled
        m = int(need / keep_rate * 1.02) + 32
        if t == 1:  # U = 0 and exp(-0) = 1: nothing to draw
            x = _geometric_exp_minus_one(m, rng)
        else:
            u = rng.uniform_ints(t, m)
            kept = u[np.flatnonzero(_bernoulli_exp_fraction(u, t, rng))]
            x = kept.astype(np.int64) + t * _geometric_exp_minus_one(kept.shape[0], rng)
        negative = rng.bits(x.shape[0])
        y = np.where(negative, -x, x)[np.flatnonzero(~(negative & (x == 0)))]
        take = min(y.shape[0], need)
        out[filled : filled + take] = y[:take]
        filled += take
    return out


# ------------------------------------------------------------------ discrete Gaussian

MAX_DISCRETE_GAUSSIAN_SIGMA: Final = 1 << 26
"""Largest σ :class:`DiscreteGaussian` accepts: beyond about 2^27 the rejection exponent's
denominator ``2σ²q²`` no longer fits the 64-bit comparisons even with ``q = 1``."""

DG_TABLE_MAX_SIGMA: Final = 1 << 12
"""``method="auto"`` samples by CDF inversion up to this σ (a table of about ``9.2σ``
levels, built once per σ² in about ``0.2 ms·σ`` and cached), by CKS Algorithms 1-3 above."""

_Q_MAX_EXP: Final = 32  # q <= 2^32 keeps |Y|·q in int64 for every |Y| <= y_max


@dataclass(frozen=True)
class DiscreteGaussian:
    """The discrete Gaussian ``N_Z(0, σ²)`` with exact samplers.

    Args:
        sigma_squared: the requested ``σ² >= 0`` (Fraction, int or float; a float is taken
            at its exact binary value). After construction the field holds the ``σ²``
            **actually used**, ``t·r/q >= requested`` (below): the noise is never smaller
            than asked. The increase is at most ``t/q``: below ``2^-25`` relative for
            ``σ >= 1``, below ``max(2^-32, 2^-26·σ)`` absolute for ``σ < 1``.

    Raises:
        PrivacyConfigError: ``σ²`` negative, NaN, infinite, or ``σ > 2^26``.

    **Exact arithmetic for CKS** (the design that keeps every rational within 64 bits).
    CKS Algorithm 3 draws ``Y ~ Lap_Z(t)`` and accepts it with probability
    ``exp(-(|Y| - σ²/t)²/(2σ²))``; for every ``t > 0`` the accepted ``Y`` is exactly
    ``N_Z(0, σ²)``, since ``exp(-|y|/t) · exp(-(|y| - σ²/t)²/(2σ²)) =
    exp(-y²/(2σ²)) · exp(-σ²/(2t²))`` (CKS §5; ``t = ⌊σ⌋ + 1`` only makes it fast).
    Here ``t = ⌊σ⌋ + 1`` for the requested σ, ``q`` is a power of two and
    ``r = ⌈σ²q/t⌉``, so ``σ² := t·r/q`` is the request rounded **up** and ``σ²/t = r/q``.
    The rejection exponent is then a ratio of integers::

        γ = (|Y| - r/q)² / (2·t·r/q) = (|Y|·q - r)² / D,     D = 2·q·t·r = 2σ²q².

    ``q`` is the largest power of two ``<= 2^32`` with ``D·2^8 < 2^63``, so that each
    Bernoulli of the K-loop, ``(γ - ⌊γ⌋)/k = f/(k·D)`` with ``f < D`` and ``k <= 2^8``, is
    an exact 64-bit comparison (a rarer ``k > 2^8``, probability ``< 1/256!``, is split
    into ``Bernoulli(f/D)·Bernoulli(1/k)``). ``N = (|Y|q - r)²`` fits in int64 whenever
    ``|Y| <= y_max = ⌊(⌊√(2^63-1)⌋ + r)/q⌋``; then ``g = N // D`` and ``f = N - g·D`` are
    exact int64. Every ``|Y| > y_max`` has ``γ >= γ(y_max + 1) >= 2^63/D > 2^8`` (γ grows
    with ``|Y| >= r/q``); such a sample first needs ``g_tail = ⌊γ(y_max + 1)⌋``
    ``exp(-1)``-coins to succeed (probability ``< e^-256``), and only then finishes
    Algorithm 1 on ``γ - g_tail`` in exact Python integers: nothing is dropped or
    approximated. CKS Algorithm 1 (``exp(-γ) = exp(-1)^⌊γ⌋·exp(-(γ - ⌊γ⌋))``, independent
    factors) justifies both splits.

    **Table method**: inversion of the CDF of ``|X|`` (weights ``1`` at 0 and
    ``2·exp(-m²/(2σ²))`` at ``m >= 1``, σ² the value used) with a random sign; see
    :mod:`sharefl.privacy.exact_inversion` for why it is exact.
    """

    sigma_squared: Fraction
    t: int = field(init=False, repr=False)
    r: int = field(init=False, repr=False)
    q: int = field(init=False, repr=False)
    denominator: int = field(init=False, repr=False)
    y_max: int = field(init=False, repr=False)
    g_tail: int = field(init=False, repr=False)
    _accept_rate: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        s2 = _to_fraction(self.sigma_squared, "sigma_squared")
        if s2 > MAX_DISCRETE_GAUSSIAN_SIGMA**2:
            raise PrivacyConfigError(
                f"sigma_squared = {float(s2):.6g} is too large for the exact discrete "
                f"Gaussian sampler: σ must be <= 2^26 (use a coarser integer scale)"
            )
        t, r, q = (1, 0, 1) if s2 == 0 else _dg_parameters(s2)
        used = Fraction(t * r, q)
        den = 2 * q * t * r
        y_max = (_SQRT_INT64_MAX + r) // q
        set_ = functools.partial(object.__setattr__, self)
        set_("sigma_squared", used)
        set_("t", t)
        set_("r", r)
        set_("q", q)
        set_("denominator", den)
        set_("y_max", y_max)
        set_("g_tail", ((y_max + 1) * q - r) ** 2 // den if den else 0)
        set_("_accept_rate", _algorithm3_rate(float(used), t) if den else 1.0)

    @property
    def variance(self) -> float:
        """``E[X²]`` of ``N_Z(0, σ²)`` as a float: below ``σ²`` (much below for σ < 0.5:
        about 0.0077 at σ = 0.3), equal to it up to ``8π²σ⁴e^{-2π²σ²}`` for ``σ >= 1``."""
        return _dg_variance(float(self.sigma_squared))

    def sample(
        self, size: Size, rng: SecureRandom | None = None, method: DGMethod = "auto"
    ) -> IntArray:
        """``int64`` array of shape ``size`` of i.i.d. exact ``N_Z(0, sigma_squared)``
        draws from ``rng`` (a fresh :class:`SecureRandom` if None).

        ``method``: ``"cks"`` (CKS Algorithms 1-3), ``"table"`` (CDF inversion; builds and
        caches a table of about ``9.2σ`` levels, so only for moderate σ) or ``"auto"``
        (table up to :data:`DG_TABLE_MAX_SIGMA`). Both have exactly the same output law.
        Raises :class:`PrivacyConfigError` on a bad ``size`` or ``method``.
        """
        _check_method(method, ("auto", "table", "cks"))
        shape, n = _shape(size)
        if self.sigma_squared == 0 or n == 0:
            return np.zeros(shape, dtype=np.int64)
        rng = SecureRandom() if rng is None else rng
        if method == "table" or (method == "auto" and self.t <= DG_TABLE_MAX_SIGMA):
            return _dg_table(self.sigma_squared).sample(n, rng, signed=True).reshape(shape)
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, _CHUNK):
            self._fill(out[start : start + _CHUNK], rng)
        return out.reshape(shape)

    def _fill(self, out: IntArray, rng: SecureRandom) -> None:
        """CKS Algorithm 3 in batches (i.i.d. candidates: keeping the accepted ones in order
        gives i.i.d. outputs)."""
        filled, n = 0, out.shape[0]
        while filled < n:
            need = n - filled
            y = _discrete_laplace(int(need / self._accept_rate * 1.02) + 32, self.t, rng)
            accepted = y[np.flatnonzero(self._accept(y, rng))]
            take = min(accepted.shape[0], need)
            out[filled : filled + take] = accepted[:take]
            filled += take

    def _accept(self, y: IntArray, rng: SecureRandom) -> BoolArray:
        """CKS Algorithm 3's coin ``Bernoulli(exp(-(|Y|q - r)²/D))`` for each ``Y``."""
        a = np.abs(y)
        den = self.denominator
        tail = np.flatnonzero(a > self.y_max)
        if not tail.shape[0]:
            w = a * self.q - self.r
            n_all = w * w
            g = n_all // den
            return _bernoulli_exp(g, (n_all - g * den).astype(np.uint64), den, rng)
        m = a.shape[0]
        main = np.flatnonzero(a <= self.y_max)
        w = a[main] * self.q - self.r
        n_main = w * w
        g_main = n_main // den
        passed = np.empty(m, dtype=np.bool_)
        passed[main] = _bernoulli_exp(g_main, (n_main - g_main * den).astype(np.uint64), den, rng)
        survive = _geometric_exp_minus_one(tail.shape[0], rng) >= self.g_tail
        passed[tail] = False
        for i in tail[np.flatnonzero(survive)]:  # probability < e^-256 each
            passed[i] = self._finish_tail(int(a[i]), rng)
        return passed

    def _finish_tail(self, a: int, rng: SecureRandom) -> bool:
        """``Bernoulli(exp(-(γ - g_tail)))`` for ``|Y| = a > y_max``, in Python ints."""
        den = self.denominator
        g, f = divmod((a * self.q - self.r) ** 2 - self.g_tail * den, den)
        while g > 0:  # exp(-1)^g, at most 2^62 coins at a time
            step = min(g, 1 << 62)
            if _geometric_exp_minus_one(1, rng)[0] < step:
                return False
            g -= step
        return bool(_bernoulli_exp_fraction(np.array([f], dtype=np.uint64), den, rng)[0])


def _dg_parameters(s2: Fraction) -> tuple[int, int, int]:
    """``(t, r, q)`` for ``σ² = s2 > 0``: ``t = ⌊σ⌋ + 1``, ``q`` the largest power of two
    ``<= 2^32`` with ``2·q·t·r <= _DEN_MAX``, ``r = ⌈s2·q/t⌉``."""
    a, b = s2.numerator, s2.denominator
    t = math.isqrt(a * b) // b + 1  # ⌊√(a/b)⌋ = ⌊√(ab)⌋ // b
    for e in range(_Q_MAX_EXP, -1, -1):
        q = 1 << e
        r = -((-a * q) // (b * t))
        if 2 * q * t * r <= _DEN_MAX:
            return t, r, q
    raise PrivacyConfigError(  # pragma: no cover - excluded by MAX_DISCRETE_GAUSSIAN_SIGMA
        f"sigma_squared = {float(s2):.6g} is too large for the exact sampler"
    )


def _algorithm3_rate(s2: float, t: int) -> float:
    """Probability that CKS Algorithm 3 accepts a ``Lap_Z(t)`` candidate (float; used only
    to size batches, never in a decision)."""
    step = max(1, t // 512)
    y = np.arange(0, 60 * t + 60, step, dtype=np.float64)
    lap = np.exp(-y / t)
    weight = lap * np.exp(-((y - s2 / t) ** 2) / (2 * s2))
    weight[0] /= 2  # y = 0 is counted once, every other |y| twice
    lap[0] /= 2
    return float(max(weight.sum() / lap.sum(), 1e-3))


def _dg_variance(s2: float) -> float:
    if s2 == 0:
        return 0.0
    if s2 < 1:
        y = np.arange(1, 64, dtype=np.float64)
        w = np.exp(-(y**2) / (2 * s2))
        return float(2 * (y**2 * w).sum() / (1 + 2 * w.sum()))
    # Poisson summation: Z(σ) = √(2π)σ·θ, θ = Σ_k exp(-2π²σ²k²), and E[X²] = σ³ Z'/Z.
    k = np.arange(1, 4, dtype=np.float64)
    e = np.exp(-2 * math.pi**2 * s2 * k**2)
    return float(s2 * (1 - 8 * math.pi**2 * s2 * (k**2 * e).sum() / (1 + 2 * e.sum())))


def _dg_magnitude_weights(s2: Fraction) -> Any:
    """Weight bounds of ``|X|`` for ``X ~ N_Z(0, s2)``: ``w_0 = 1``,
    ``w_m = 2·exp(-m²/(2·s2))``, by the running products ``w_{m+1} = w_m·ρ_m``,
    ``ρ_m = exp(-(2m+1)/(2·s2)) = ρ_0·τ^m`` (``τ = ρ_0²``), and the tail
    ``Σ_{j>m} w_j <= w_m·ρ_m/(1 - ρ_m)`` (the ratios decrease)."""

    def weights(digits: int) -> tuple[list[Bounds], Bounds]:
        down, up, _ = contexts(digits)
        one, two = Decimal(1), Decimal(2)
        eps = one.scaleb(-(digits + 3))
        r_lo, r_hi = exp_neg_bounds(1 / (2 * s2), digits)
        tau_lo, tau_hi = down.multiply(r_lo, r_lo), up.multiply(r_hi, r_hi)
        out: list[Bounds] = [(one, one)]
        total_lo = total_hi = one
        w_lo = w_hi = one
        while True:
            w_lo, w_hi = down.multiply(w_lo, r_lo), up.multiply(w_hi, r_hi)
            out.append((down.multiply(two, w_lo), up.multiply(two, w_hi)))
            total_lo = down.add(total_lo, down.multiply(two, w_lo))
            total_hi = up.add(total_hi, up.multiply(two, w_hi))
            r_lo, r_hi = down.multiply(r_lo, tau_lo), up.multiply(r_hi, tau_hi)
            if r_hi < one:
                tail = up.divide(up.multiply(w_hi, r_hi), down.subtract(one, r_hi))
                if tail < eps:
                    total_hi = up.add(total_hi, up.multiply(two, tail))
                    return out, (total_lo, total_hi)

    return weights


@functools.lru_cache(maxsize=16)
def _dg_table(s2: Fraction) -> ExactInversionTable:
    return ExactInversionTable(_dg_magnitude_weights(s2), f"|N_Z(0, {float(s2):.6g})|")


@functools.lru_cache(maxsize=64)
def _discrete_gaussian_cached(s2: Fraction) -> DiscreteGaussian:
    return DiscreteGaussian(s2)


def discrete_gaussian(
    sigma_squared: Fraction | float | int,
    size: Size,
    rng: SecureRandom | None = None,
    method: DGMethod = "auto",
) -> IntArray:
    """``int64`` array of shape ``size`` of exact ``N_Z(0, σ²)`` draws (see
    :class:`DiscreteGaussian`; ``σ²`` is rounded up as described there: read
    ``DiscreteGaussian(σ²).sigma_squared`` for the value used). ``σ² = 0`` gives zeros.
    Raises :class:`PrivacyConfigError` for a negative, NaN, infinite or too large ``σ²``,
    a bad ``size`` or ``method``."""
    s2 = _to_fraction(sigma_squared, "sigma_squared")
    return _discrete_gaussian_cached(s2).sample(size, rng, method)


# ------------------------------------------------------------------ Poisson and Skellam

MAX_SKELLAM_MU: Final = 1 << 40
"""Largest μ :class:`Skellam` accepts (variance 2^41: far beyond any ring of interest)."""

POISSON_TABLE_MAX_MU: Final = 1 << 16
"""``method="auto"`` draws ``Poisson(μ)`` by exact CDF inversion up to this μ (a table of
about ``19√μ`` levels, built in about ``10 µs·μ`` and cached), by PTRS above it."""


def _poisson_weights(mu: Fraction) -> Any:
    """Bounds of ``P[N = k] = e^-μ μ^k / k!`` by the running product
    ``p_k = p_{k-1}·μ/k``; beyond ``k >= μ`` the tail is below ``p_k·ρ/(1-ρ)``,
    ``ρ = μ/(k+1)``. The total is 1."""

    def weights(digits: int) -> tuple[list[Bounds], Bounds]:
        down, up, _ = contexts(digits)
        one = Decimal(1)
        eps = one.scaleb(-(digits + 3))
        mu_lo, mu_hi = rational_bounds(mu, digits)
        p_lo, p_hi = exp_neg_bounds(mu, digits)
        out: list[Bounds] = [(p_lo, p_hi)]
        k = 0
        while True:
            k += 1
            p_lo = down.divide(down.multiply(p_lo, mu_lo), k)
            p_hi = up.divide(up.multiply(p_hi, mu_hi), k)
            out.append((p_lo, p_hi))
            if k + 1 > mu_hi:
                ratio = up.divide(mu_hi, k + 1)
                if up.divide(up.multiply(p_hi, ratio), down.subtract(one, ratio)) < eps:
                    return out, (one, one)

    return weights


@functools.lru_cache(maxsize=16)
def _poisson_table(mu: Fraction) -> ExactInversionTable:
    return ExactInversionTable(_poisson_weights(mu), f"Poisson({float(mu):.6g})")


# Stirling series of log Γ as in NumPy's `random_loggam` (from the same PTRS code path).
_LOGGAM_COEFFS: Final = (
    8.333333333333333e-02,
    -2.777777777777778e-03,
    7.936507936507937e-04,
    -5.952380952380952e-04,
    8.417508417508418e-04,
    -1.917526917526918e-03,
    6.410256410256410e-03,
    -2.955065359477124e-02,
    1.796443723688307e-01,
    -1.39243221690590e00,
)
_LOG_FACTORIAL_SMALL: Final = np.array([math.lgamma(k + 1) for k in range(8)])


def _log_factorial(k: IntArray) -> FloatArray:
    """``log(k!)`` in float64 for ``k >= 0``: exact table below 8, Stirling series (NumPy's
    ``loggam`` coefficients) from ``x = k + 1 >= 8``."""
    x = k.astype(np.float64) + 1.0
    x2 = 1.0 / (x * x)
    series = np.full_like(x, _LOGGAM_COEFFS[-1])
    for c in reversed(_LOGGAM_COEFFS[:-1]):
        series = series * x2 + c
    out = series / x + 0.5 * math.log(2 * math.pi) + (x - 0.5) * np.log(x) - x
    small = np.flatnonzero(k < 8)
    if small.shape[0]:
        out[small] = _LOG_FACTORIAL_SMALL[k[small]]
    return out


def _poisson_ptrs(n: int, lam: float, rng: SecureRandom) -> IntArray:
    """``n`` draws of ``Poisson(lam)``, ``lam >= 10``, by W. Hörmann, "The transformed
    rejection method for generating Poisson random variables", Insurance: Mathematics and
    Economics 12 (1993), algorithm PTRS, vectorised over float64 uniforms (53 bits) from
    ``rng``. The constants and acceptance test are Hörmann's, as in NumPy's
    ``random_poisson_ptrs`` and TensorFlow's Poisson sampler; the test compares float64
    logarithms (``log V + log α⁻¹ - log(a/us² + b) <= -λ + k log λ - log k!``), so the law
    is exact only up to float64 rounding near the acceptance boundary."""
    slam = math.sqrt(lam)
    loglam = math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
    vr = 0.9277 - 3.6224 / (b - 2)
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        need = n - filled
        m = min(int(need * 1.15) + 32, _CHUNK)
        u = rng.uniform(m) - 0.5
        v = rng.uniform(m)
        us = 0.5 - np.abs(u)
        # us == 0 (u = -0.5 exactly) gives k = -inf, which PTRS rejects (k < 0): clip to -1.
        # Huge k (us near 0) are rejected by the log test: clip them to 2^62 to stay in int64.
        with np.errstate(divide="ignore", invalid="ignore"):
            kf = np.floor((2 * a / us + b) * u + (lam + 0.43))
        k = np.clip(kf, -1.0, 2.0**62, out=kf).astype(np.int64)
        accept = (us >= 0.07) & (v <= vr)
        check = np.flatnonzero(~accept & (k >= 0) & ((us >= 0.013) | (v <= us)))
        if check.shape[0]:
            kc, usc, vc = k[check], us[check], v[check]
            with np.errstate(divide="ignore"):  # v = 0: log v = -inf, accepted as in PTRS
                lhs = np.log(vc) + log_invalpha - np.log(a / (usc * usc) + b)
            accept[check] = lhs <= -lam + kc * loglam - _log_factorial(kc)
        good = k[np.flatnonzero(accept)]
        take = min(good.shape[0], need)
        out[filled : filled + take] = good[:take]
        filled += take
    return out


def _poisson(n: int, mu: Fraction, rng: SecureRandom, method: PoissonMethod) -> IntArray:
    if mu == 0:
        return np.zeros(n, dtype=np.int64)
    if method == "table" or (method == "auto" and mu <= POISSON_TABLE_MAX_MU):
        return _poisson_table(mu).sample(n, rng)
    if mu < 10:
        raise PrivacyConfigError(f"PTRS needs μ >= 10, got μ = {float(mu)}; use method='table'")
    return _poisson_ptrs(n, float(mu), rng)


@dataclass(frozen=True)
class Skellam:
    """The symmetric Skellam ``Sk(μ, μ) = Poisson(μ) - Poisson(μ)``: mean 0, variance
    ``2μ``.

    Args:
        mu: ``μ >= 0`` (Fraction, int or float, taken exactly), at most 2^40.

    Raises:
        PrivacyConfigError: μ negative, NaN, infinite or above 2^40.

    The two Poissons are drawn by exact CDF inversion (:mod:`sharefl.privacy.exact_inversion`;
    table of about ``19√μ`` levels) for ``μ <= POISSON_TABLE_MAX_MU``, and above it by
    Hörmann's PTRS (1993), vectorised over ``rng.uniform`` floats. PTRS's acceptance test
    uses float64 logarithms and log-gamma (the algorithm NumPy and TensorFlow use), so that
    path is exact only up to float64 rounding of the acceptance test, unlike the discrete
    Gaussian, whose every decision is exact.
    """

    mu: Fraction

    def __post_init__(self) -> None:
        mu = _to_fraction(self.mu, "mu")
        if mu > MAX_SKELLAM_MU:
            raise PrivacyConfigError(f"mu = {float(mu):.6g} is above the supported 2^40")
        object.__setattr__(self, "mu", mu)

    @property
    def variance(self) -> Fraction:
        """``2μ``, exactly."""
        return 2 * self.mu

    def sample(
        self, size: Size, rng: SecureRandom | None = None, method: PoissonMethod = "auto"
    ) -> IntArray:
        """``int64`` array of shape ``size`` of i.i.d. ``Sk(μ, μ)`` draws from ``rng`` (a
        fresh :class:`SecureRandom` if None). ``method``: ``"table"`` (exact; any μ whose
        table fits), ``"ptrs"`` (μ >= 10) or ``"auto"``. Raises
        :class:`PrivacyConfigError` on a bad ``size`` or ``method``."""
        _check_method(method, ("auto", "table", "ptrs"))
        shape, n = _shape(size)
        rng = SecureRandom() if rng is None else rng
        first = _poisson(n, self.mu, rng, method)
        return np.subtract(first, _poisson(n, self.mu, rng, method), out=first).reshape(shape)


def skellam(
    mu: Fraction | float | int,
    size: Size,
    rng: SecureRandom | None = None,
    method: PoissonMethod = "auto",
) -> IntArray:
    """``int64`` array of shape ``size`` of ``Sk(μ, μ)`` draws (variance ``2μ``); see
    :class:`Skellam`. ``μ = 0`` gives zeros. Raises :class:`PrivacyConfigError` for a
    negative, NaN, infinite or too large ``μ``, a bad ``size`` or ``method``."""
    return Skellam(_to_fraction(mu, "mu")).sample(size, rng, method)
