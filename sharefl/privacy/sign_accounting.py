"""DP-RSA (Zhu and Ling): ε of the sign randomisers per round and composed over a run.

Both of the paper's mechanisms are *pure* ε-DP per round and per coordinate (nominally,
see :mod:`sharefl.privacy.sign`): Sign-Flipping is binary randomised response with keep
probability γ = e^ε/(1 + e^ε) (Theorem 1), and Sign-Gaussian with Theorem 2's σ rule is
claimed (ε, 0)-DP for its target ε. A binary pure ε-DP mechanism is dominated by binary
randomised response with the same ε (Kairouz, Oh and Viswanath 2015), so the composition
of T rounds of either is that of T randomised responses, which ``dp-accounting``'s
privacy-loss distributions compute (tightly, under replace-one adjacency: the worker's
sample is replaced, its message keeps its length).

What the composed ε covers, and what it does not:

- one coordinate of one worker's message stream (the paper's per-coordinate guarantee);
  a d-coordinate message composes d of them (:meth:`SignFlip.vector_epsilon`), which no
  run here reports as private;
- Sign-Gaussian's per-round ε is the paper's nominal value; its σ depends on u (the data),
  which Theorem 2 does not account for. The composition is only as sound as that input.

``dp-accounting``'s ``PLDAccountant`` returns the one-round ε for a
``SelfComposedDpEvent`` of ``RandomizedResponseDpEvent`` (checked with dp-accounting 0.6.0:
5,000 rounds at ε = 0.4 give 0.39998), so this module composes the distribution directly
(``from_randomized_response(...).self_compose(T)``). :func:`exact_composed_epsilon` is the
closed form used as the test oracle.
"""

from __future__ import annotations

import math

from .errors import PrivacyConfigError


def _check(epsilon: float, rounds: int, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise PrivacyConfigError(f"per-round epsilon must be > 0, got {epsilon!r}")
    if rounds < 1:
        raise PrivacyConfigError(f"rounds must be >= 1, got {rounds!r}")
    if not 0 < delta < 1:
        raise PrivacyConfigError(f"delta must be in (0, 1), got {delta!r}")


def composed_epsilon(
    epsilon: float, rounds: int, delta: float, *, discretization: float = 1e-4
) -> float:
    """ε after ``rounds`` rounds of a pure ``epsilon``-DP binary mechanism, at ``delta``.

    Args:
        epsilon: the per-round (per-coordinate) ε of Theorem 1 or 2, > 0.
        rounds: T >= 1.
        delta: δ in (0, 1).
        discretization: the PLD's value discretization interval (pessimistic rounding).

    Raises:
        PrivacyConfigError: a value out of range.
    """
    _check(epsilon, rounds, delta)
    from dp_accounting.pld import privacy_loss_distribution as pld

    gamma = 1.0 / (1.0 + math.exp(-epsilon))
    # dp-accounting's randomised response: with probability p a uniform bucket, else the
    # true one, so the keep probability is 1 - p/2 = γ.
    one = pld.from_randomized_response(
        2.0 * (1.0 - gamma), 2, value_discretization_interval=discretization
    )
    composed = one.self_compose(rounds) if rounds > 1 else one
    return max(0.0, float(composed.get_epsilon_for_delta(delta)))


def exact_delta(epsilon: float, rounds: int, target: float) -> float:
    """δ(target) of T binary randomised responses with per-round ``epsilon``, exactly:

        δ = Σ_k Bin(k; T, γ) · (1 − e^{target − L_k})_+,   L_k = (2k − T)·ε,

    k the number of rounds whose output favours the first dataset (the hockey-stick
    divergence of the composed pair of output distributions)."""
    gamma = 1.0 / (1.0 + math.exp(-epsilon))
    total = 0.0
    for k in range(rounds + 1):
        loss = (2 * k - rounds) * epsilon
        if loss <= target:
            continue
        log_p = (
            math.lgamma(rounds + 1)
            - math.lgamma(k + 1)
            - math.lgamma(rounds - k + 1)
            + k * math.log(gamma)
            + (rounds - k) * math.log1p(-gamma)
        )
        total += math.exp(log_p) * -math.expm1(target - loss)
    return total


def exact_composed_epsilon(epsilon: float, rounds: int, delta: float) -> float:
    """The smallest ε with :func:`exact_delta` <= ``delta`` (bisection): the reference
    oracle of :func:`composed_epsilon`, O(T) per evaluation."""
    _check(epsilon, rounds, delta)
    lo, hi = 0.0, rounds * epsilon
    if exact_delta(epsilon, rounds, 0.0) <= delta:
        return 0.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if exact_delta(epsilon, rounds, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi
