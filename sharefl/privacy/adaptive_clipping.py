"""Adaptive clipping: the two baselines of Fed-αCDP's Table X (Wei et al. §7.6).

Both modes change their bound during training from released (noisy) quantities only, so
the adaptation is post-processing and costs no privacy beyond what is stated here. Both
work on ``[K, ...]`` rows, one per client, so that the simulator's vectorised clients
(:class:`~sharefl.simulator.training.VectorizedClients`) use them as they are.

**Quantile clipping** (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private
Learning with Adaptive Clipping", NeurIPS 2021), :class:`QuantileClipping`. Every
contribution (an example's gradient in DP-SGD, a client's update in DP-FedAvg) is clipped
to the current bound C in l2 norm, and its bit b = 1[‖g‖ ≤ C] is counted. A release is the
pair

    (Σ clip_C(g) + N(0, σ_Δ² C² I),  Σ (b − ½) + N(0, σ_b²)).

The count is centred (b − ½ ∈ {−½, ½}) so that adding or removing one contribution moves it
by ½ whatever its bit; the fraction is recovered with the public expected number of
contributions m: b̄ = (noisy centred count)/m + ½, clamped to [0, 1] (post-processing). The
bound then follows the geometric update C ← C·exp(−η_C (b̄ − γ)): it shrinks while more
than a fraction γ of the contributions is unclipped and grows while fewer are, so without
noise it settles at the γ-quantile of the norms.

*Accounting.* Scaled by 1/(σ_Δ C) and 1/σ_b the pair is one Gaussian mechanism with unit
noise and sensitivity √(σ_Δ⁻² + (2σ_b)⁻²). Andrew et al. (Theorem 1) therefore pick σ_Δ from
the target σ: σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2) (:func:`update_noise_multiplier`), which needs
2σ_b > σ; then the joint release is exactly a Gaussian mechanism with noise multiplier σ.
**The accountant sees σ**: one sampled Gaussian mechanism (σ, q) per release, the same
entry as fixed-bound DP-SGD (or DP-FedAvg) at σ; the update itself carries the larger σ_Δ.
The count noise σ_b is an absolute standard deviation on one release's count; Andrew et al.
take σ_b = m/20 for m expected contributions (b̄'s noise has std 0.05).

**AdaClip** (Pichapati, Suresh, Yu, Reddi, Kumar, "AdaCliP: Adaptive Clipping for Private
SGD", 2019), :class:`AdaClip`. Coordinate-wise: with running estimates m_t of the gradients'
mean and v_t of their per-coordinate variance (s_t = √v_t the standard deviations), each
example's gradient is transformed to w = (g − m_t)/b_t with b_t = √s_t ⊙ √(Σ_i s_t,i),
clipped to l2 norm C (the paper's 1), summed with N(0, σ²C² I), divided by B and mapped
back: g̃ = b_t ⊙ w̃ + m_t. This b is the scale that adds the least noise, Σ_i b_i² σ²,
subject to E‖w‖² = Σ_i v_i / b_i² = 1 (Lagrange: b_i² = s_i · Σ_j s_j): gradients that
match the estimates are then transformed to norm 1 on average, the clip bound. The
estimates then follow

    m_{t+1} = β₁ m_t + (1 − β₁) g̃,
    u_t = clamp((g̃ − m_t)² − b_t² σ² C² / B², h₁, h₂),   v_{t+1} = β₂ v_t + (1 − β₂) u_t,

with u_t the squared deviation minus the variance of the noise g̃ carries (the h's keep the
variance estimate positive and bounded). *Accounting.* The transformed sum has sensitivity C
and noise σC: one sampled Gaussian mechanism (σ, q) per step, exactly DP-SGD's; m_t and v_t
are functions of earlier releases only. The noise on g̃ is b_t σ C / B per coordinate: it
scales with the transformed sensitivity. Defaults are those of the AdaClip implementation
Wei et al. name (github.com/soominkwon/DP-dSNE): β₁ = 0.99, β₂ = 0.9, h₁ = 1e-5,
h₂ = 1e-3, m₀ = 0, v₀ = √(h₁h₂). Two readings differ from that implementation: it forms b
from the variance itself (b = √v ⊙ √(Σ v), which has the units of a squared gradient, so
E‖w‖² = d / Σ_i v_i depends on the units of the loss), and it takes the deviation around
m_{t+1}; here b is formed from s = √v as above and the deviation is taken around m_t, the
mean the step was centred on.
"""

from __future__ import annotations

import math
from abc import ABC
from dataclasses import dataclass

import torch

from .errors import PrivacyConfigError
from .noise import standard_normal

# Norms below this are treated as 0 (as in sharefl.privacy.clipping).
_TINY = 1e-30


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise PrivacyConfigError(f"{name} must be a positive finite number, got {value!r}")


def _check_non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise PrivacyConfigError(f"{name} must be a finite number ≥ 0, got {value!r}")


def update_noise_multiplier(sigma: float, count_std: float) -> float:
    """σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2): the noise multiplier of the clipped sum that makes the
    release (sum, centred count with noise std ``count_std`` = σ_b) a Gaussian mechanism with
    noise multiplier ``sigma`` = σ (Andrew et al., Theorem 1). σ = 0 (no privacy) gives 0.

    Raises :class:`PrivacyConfigError` unless 2σ_b > σ (otherwise the count alone spends
    more than σ allows)."""
    _check_non_negative("sigma", sigma)
    _check_non_negative("count_std", count_std)
    if sigma == 0:
        return 0.0
    if not 2 * count_std > sigma:
        raise PrivacyConfigError(
            f"quantile clipping needs count_std σ_b > σ/2 = {sigma / 2:g} (got {count_std:g}): "
            "the noisy count of one release spends (2σ_b)⁻² of the budget σ⁻², so σ_b ≤ σ/2 "
            "leaves nothing for the update; Andrew et al. take σ_b = m/20 for m expected "
            "contributions per release"
        )
    return (sigma**-2 - (2 * count_std) ** -2) ** -0.5


def joint_noise_multiplier(update_sigma: float, count_std: float) -> float:
    """σ of the Gaussian mechanism equivalent to a release with update noise multiplier
    σ_Δ and count noise σ_b: (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2), the inverse of
    :func:`update_noise_multiplier`."""
    _check_positive("update_sigma", update_sigma)
    _check_positive("count_std", count_std)
    return (update_sigma**-2 + (2 * count_std) ** -2) ** -0.5


class AdaptiveClipping(ABC):  # noqa: B024 (a marker base: the modes share no method)
    """Base class of the adaptive clipping modes (frozen dataclasses). Unlike a
    :class:`~sharefl.privacy.clipping.ClippingMode` their bound lives in state that the
    caller holds and updates (:class:`QuantileState`, :class:`AdaClipState`)."""


@dataclass(frozen=True)
class QuantileClipping(AdaptiveClipping):
    """Andrew et al.'s quantile clipping (see the module docstring).

    Attributes:
        initial_norm: C₀ (Andrew et al.: 0.1; Fed-αCDP §7.6: 4).
        count_std: σ_b, the std of the noise on one release's centred count (0 only
            without privacy, σ = 0).
        target_quantile: γ, the fraction of contributions to leave unclipped (0.5).
        learning_rate: η_C of the geometric update (0.2).
    """

    initial_norm: float
    count_std: float
    target_quantile: float = 0.5
    learning_rate: float = 0.2

    def __post_init__(self) -> None:
        _check_positive("initial_norm", self.initial_norm)
        _check_non_negative("count_std", self.count_std)
        if not 0.0 <= self.target_quantile <= 1.0:
            raise PrivacyConfigError(
                f"target_quantile must be in [0, 1], got {self.target_quantile!r}"
            )
        _check_non_negative("learning_rate", self.learning_rate)

    def update_sigma(self, sigma: float) -> float:
        """σ_Δ of the clipped sum for the accounted noise multiplier σ."""
        return update_noise_multiplier(sigma, self.count_std)

    def next_norm(self, norm: float, fraction: float) -> float:
        """C·exp(−η_C (b̄ − γ)) for the (noisy) unclipped fraction b̄ = ``fraction``."""
        return norm * math.exp(-self.learning_rate * (fraction - self.target_quantile))

    def factors(self, norms: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
        """min(1, C/‖g‖) for contributions of l2 norms ``norms`` and bounds ``bounds``
        (broadcast: one bound per contribution, or one for all)."""
        return (bounds / norms.clamp_min(_TINY)).clamp_max(1.0)

    def centred_bits(self, norms: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
        """b − ½ with b = 1[‖g‖ ≤ C] (a contribution exactly at the bound is unclipped)."""
        return (norms <= bounds).to(norms.dtype) - 0.5

    def noisy_counts_(
        self, counts: torch.Tensor, generator: torch.Generator, *, private: bool = True
    ) -> torch.Tensor:
        """Add N(0, σ_b²) to every entry of ``counts`` (one release each) in place."""
        if private and self.count_std > 0:
            noise = standard_normal(counts.shape, generator, device=counts.device)
            counts.add_(noise.to(counts.dtype), alpha=self.count_std)
        return counts


@dataclass
class QuantileState:
    """The bound C of :class:`QuantileClipping` and what the releases since the last
    update counted: the sum of their noisy centred counts and their public expected number
    of contributions m."""

    norm: float
    counted: float = 0.0
    expected: float = 0.0

    def add(self, noisy_centred_count: float, expected_contributions: float) -> None:
        """Record one or more releases' noisy centred count and expected contributions."""
        self.counted += float(noisy_centred_count)
        self.expected += float(expected_contributions)

    def fraction(self) -> float:
        """b̄ = counted/m + ½ clamped to [0, 1] (``nan`` when nothing was counted)."""
        if self.expected <= 0:
            return math.nan
        return min(1.0, max(0.0, self.counted / self.expected + 0.5))

    def update(self, mode: QuantileClipping) -> float:
        """Apply the geometric update from the counts so far, reset them; return b̄
        (``nan``, C unchanged, when nothing was counted)."""
        fraction = self.fraction()
        if not math.isnan(fraction):
            self.norm = mode.next_norm(self.norm, fraction)
        self.counted = 0.0
        self.expected = 0.0
        return fraction


@dataclass(frozen=True)
class AdaClip(AdaptiveClipping):
    """Pichapati et al.'s coordinate-wise adaptive clipping (see the module docstring).

    Attributes:
        max_norm: C, the l2 bound of each transformed gradient w (the paper's 1); the
            transformed sum has sensitivity C and gets N(0, σ²C²).
        beta1, beta2: decay of the running mean and variance estimates.
        h1, h2: the bounds the per-step variance estimate is clamped to.
        initial_variance: v₀, the initial per-coordinate variance (default √(h₁h₂)).
    """

    max_norm: float = 1.0
    beta1: float = 0.99
    beta2: float = 0.9
    h1: float = 1e-5
    h2: float = 1e-3
    initial_variance: float | None = None

    def __post_init__(self) -> None:
        _check_positive("max_norm", self.max_norm)
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise PrivacyConfigError(f"{name} must be in [0, 1), got {value!r}")
        _check_positive("h1", self.h1)
        _check_positive("h2", self.h2)
        if self.h1 > self.h2:
            raise PrivacyConfigError(f"h1 must be ≤ h2, got h1 = {self.h1}, h2 = {self.h2}")
        if self.initial_variance is not None:
            _check_positive("initial_variance", self.initial_variance)

    @property
    def v0(self) -> float:
        """v₀, the initial per-coordinate variance estimate."""
        if self.initial_variance is not None:
            return float(self.initial_variance)
        return math.sqrt(self.h1 * self.h2)

    def initial_state(
        self, rows: int, dim: int, *, dtype: torch.dtype = torch.float32, device=None
    ) -> AdaClipState:
        """m₀ = 0 and v₀ for ``rows`` independent estimators of ``dim`` coordinates."""
        return AdaClipState(
            mean=torch.zeros(rows, dim, dtype=dtype, device=device),
            variance=torch.full((rows, dim), self.v0, dtype=dtype, device=device),
        )

    @staticmethod
    def scale(variance: torch.Tensor) -> torch.Tensor:
        """b = √s ⊙ √(Σ_i s_i) with s = √v, per row of the variance estimates ``variance``
        (``[K, d]``): the noise-minimising scale for E‖w‖² = 1."""
        std = variance.sqrt()
        return std.sqrt() * std.sum(dim=-1, keepdim=True).sqrt()

    def noise_std(self, sigma: float, scale: torch.Tensor, denominator: float) -> torch.Tensor:
        """Std of the noise on each coordinate of g̃: b σ C / B."""
        return scale * (sigma * self.max_norm / denominator)

    def release(
        self,
        summed: torch.Tensor,
        state: AdaClipState,
        scale: torch.Tensor,
        sigma: float,
        denominator: float,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """g̃ = b ⊙ (Σ clip_C(w) + N(0, σ²C²I))/B + m from the ``[K, d]`` sums of clipped
        transformed gradients ``summed`` (modified in place and returned), then the update
        of ``state`` (in place)."""
        if sigma > 0:
            noise = standard_normal(summed.shape, generator, device=summed.device)
            summed.add_(noise.to(summed.dtype), alpha=sigma * self.max_norm)
        summed.div_(denominator).mul_(scale).add_(state.mean)
        self.update_(state, summed, scale, sigma, denominator)
        return summed

    def update_(
        self,
        state: AdaClipState,
        released: torch.Tensor,
        scale: torch.Tensor,
        sigma: float,
        denominator: float,
    ) -> None:
        """The running estimates after releasing g̃ = ``released`` with scale b (in place)."""
        noise_var = self.noise_std(sigma, scale, denominator).square_()
        deviation = (released - state.mean).square_().sub_(noise_var)
        deviation.clamp_(self.h1, self.h2)
        state.mean.mul_(self.beta1).add_(released, alpha=1 - self.beta1)
        state.variance.mul_(self.beta2).add_(deviation, alpha=1 - self.beta2)


@dataclass
class AdaClipState:
    """Running estimates of :class:`AdaClip`, one row per estimator: ``mean`` m and
    ``variance`` v, both ``[K, d]``."""

    mean: torch.Tensor
    variance: torch.Tensor
