"""ε of a constant-σ run, and the smallest σ that meets a target ε.

Both functions account ``steps`` Poisson-sampled Gaussian mechanisms with rate
``sample_rate`` through :class:`PrivacyAccountant` (same backends and conversions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .accountant import PrivacyAccountant, check_delta, check_step
from .errors import CalibrationError, PrivacyConfigError
from .vocabulary import Backend, Conversion

# Below this σ the accountant's arithmetic is unreliable; no useful target lies there.
_MIN_NOISE_MULTIPLIER = 1e-3


def compute_epsilon(
    noise_multiplier: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: Backend = "rdp",
    *,
    conversion: Conversion = "improved",
    orders: Sequence[float] | None = None,
) -> float:
    """ε after ``steps`` sampled Gaussian mechanisms of noise multiplier σ and rate q.

    Raises:
        PrivacyConfigError: σ < 0, q outside [0, 1], steps < 1, δ outside (0, 1), or an
            unknown backend/conversion.
    """
    acc = PrivacyAccountant(accountant, conversion=conversion, orders=orders)
    acc.step(noise_multiplier, sample_rate, steps)
    return acc.get_epsilon(delta)


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: Backend = "rdp",
    *,
    conversion: Conversion = "improved",
    orders: Sequence[float] | None = None,
    rtol: float = 1e-4,
    max_noise_multiplier: float = 1e4,
) -> float:
    """The smallest noise multiplier σ (up to a relative ``rtol``) with ε(σ) ≤ target.

    The result never overshoots: the returned σ was itself accounted and its ε is at most
    ``target_epsilon`` (bisection keeps that invariant, so it holds even where the
    accountant's ε is not exactly monotone in σ). Returns 0.0 when q = 0 (nothing is
    sampled, nothing is spent).

    Raises:
        PrivacyConfigError: target ε ≤ 0 or invalid δ, q, steps, rtol.
        CalibrationError: even σ = ``max_noise_multiplier`` overshoots the target.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise PrivacyConfigError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    if not 0 < rtol < 1:
        raise PrivacyConfigError(f"rtol must be in (0, 1), got {rtol!r}")
    check_delta(delta)
    check_step(1.0, sample_rate, steps)
    if float(sample_rate) == 0.0:
        return 0.0

    def epsilon(sigma: float) -> float:
        return compute_epsilon(
            sigma, delta, sample_rate, steps, accountant, conversion=conversion, orders=orders
        )

    hi = 1.0  # invariant below: epsilon(hi) <= target < epsilon(lo)
    while epsilon(hi) > target_epsilon:
        if hi >= max_noise_multiplier:
            raise CalibrationError(
                f"even noise_multiplier={hi:g} gives ε > {target_epsilon:g} at δ={delta:g}, "
                f"q={sample_rate:g}, {steps} steps: raise the target ε or δ, sample less or "
                "take fewer steps (or raise max_noise_multiplier)"
            )
        hi = min(2.0 * hi, max_noise_multiplier)
    lo = hi / 2.0
    while lo > _MIN_NOISE_MULTIPLIER and epsilon(lo) <= target_epsilon:
        hi, lo = lo, lo / 2.0
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        if epsilon(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi
