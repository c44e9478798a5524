"""DP-RSA (Zhu and Ling): local randomisers of the sign messages sign(x_0 − x_k) a worker sends.

- :class:`SignFlip` (eq. 8, Theorem 1): each coordinate of the sign is kept with
  probability γ = e^ε/(1 + e^ε) and negated otherwise.
- :class:`SignGaussian` (eq. 9, Theorem 2): the worker sends sign(u + e), e ~ N(0, σ² I),
  with σ > max{max_i 2|u_i|/3, 4Δu/ε}, ε ∈ (0, 8), Δu the l2 sensitivity of u (2αM with
  step α and gradient bound M, :func:`rsa_sensitivity`; enforce M by clipping).

``sign`` is the paper's: +1 for an input ≥ 0, −1 otherwise (never 0, unlike torch.sign).

Caveats (DP-RSA note §6), to state with any ε these mechanisms are reported with:

- Theorem 1's proof covers one coordinate. A d-coordinate message whose coordinates may all
  change between neighbouring datasets is only (d·ε)-DP by composition
  (:meth:`SignFlip.vector_epsilon`).
- Theorem 2's proof treats all coordinates as having the same sign, drops a cross term and
  bounds Σ|v_i| by √2·Δu where √d·Δu is needed for an l2 sensitivity: its ε is nominal,
  per coordinate in effect. σ also depends on u (the data) through max_i |u_i|.
- The paper uses the signed u_i in the σ rule and its code a per-coordinate σ_i; here σ
  uses |u_i| (symmetric) and is one scalar by default (``per_coordinate=True`` gives the
  code's σ_i = max(2|u_i|/3, 4Δu/ε)).
- Both guarantees are per round; the paper applies no composition across rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sharefl.sign import rsa_sign  # sign(0) = +1: one definition for RSA and DP-RSA

from .errors import PrivacyConfigError
from .noise import check_generator


def sign_flip_gamma(epsilon: float) -> float:
    """γ = e^ε/(1 + e^ε), the probability of keeping a sign, for ε > 0."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise PrivacyConfigError(f"epsilon must be > 0, got {epsilon!r}")
    return 1.0 / (1.0 + math.exp(-epsilon))


def sign_flip_epsilon(gamma: float) -> float:
    """ε = ln(γ/(1 − γ)) for a keep probability γ in (1/2, 1)."""
    if not 0.5 < gamma < 1.0:
        raise PrivacyConfigError(f"gamma must be in (0.5, 1), got {gamma!r}")
    return math.log(gamma / (1.0 - gamma))


def rsa_sensitivity(lr: float, grad_bound: float) -> float:
    """Δu = 2αM: l2 sensitivity of u = x_0 − x_k under a constant step α and ‖g‖ ≤ M."""
    if not (lr > 0 and grad_bound > 0):
        raise PrivacyConfigError(f"lr and grad_bound must be > 0, got {lr!r}, {grad_bound!r}")
    return 2.0 * lr * grad_bound


@dataclass(frozen=True)
class SignFlip:
    """Randomised response on each sign coordinate: (ε, 0)-DP per coordinate (Theorem 1)."""

    epsilon: float

    def __post_init__(self) -> None:
        sign_flip_gamma(self.epsilon)  # validates ε

    @property
    def gamma(self) -> float:
        """Probability of keeping each sign, e^ε/(1 + e^ε)."""
        return sign_flip_gamma(self.epsilon)

    def vector_epsilon(self, dim: int) -> float:
        """d·ε: the guarantee of a whole d-coordinate message by basic composition."""
        return dim * self.epsilon

    def __call__(self, u: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """sign(u) with each coordinate negated independently with probability 1 − γ."""
        check_generator(generator, u.device)
        keep = torch.rand(u.shape, generator=generator, device=u.device, dtype=u.dtype)
        s = rsa_sign(u)
        return torch.where(keep < self.gamma, s, -s)


@dataclass(frozen=True)
class SignGaussian:
    """sign(u + N(0, σ² I)) with Theorem 2's σ rule (nominal ε, see the module caveats).

    Attributes:
        epsilon: ε in (0, 8).
        sensitivity: Δu > 0.
        per_coordinate: one σ_i per coordinate (the authors' code) instead of one scalar.
    """

    epsilon: float
    sensitivity: float
    per_coordinate: bool = False
    signed_u: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.epsilon < 8:
            raise PrivacyConfigError(
                f"Theorem 2 holds for ε in (0, 8), got {self.epsilon!r}: use SignFlip, or "
                "a smaller ε"
            )
        if not (math.isfinite(self.sensitivity) and self.sensitivity > 0):
            raise PrivacyConfigError(f"sensitivity must be > 0, got {self.sensitivity!r}")
        if self.signed_u and not self.per_coordinate:
            raise PrivacyConfigError(
                "signed_u is the code's per-coordinate σ_i: set per_coordinate"
            )

    @property
    def noise_floor(self) -> float:
        """4Δu/ε, the part of σ that does not depend on u."""
        return 4.0 * self.sensitivity / self.epsilon

    def sigma(self, u: torch.Tensor) -> torch.Tensor:
        """σ (0-d for ``[d]``, ``[K, 1]`` for ``[K, d]``) or σ_i (u's shape), just above
        max{2|u_i|/3, 4Δu/ε} (u_i signed with ``signed_u``)."""
        scaled = (u if self.signed_u else u.abs()) * (2.0 / 3.0)
        bound = scaled.clamp_min(self.noise_floor)
        if not self.per_coordinate:
            if bound.shape[-1] == 0:
                bound = bound.new_full((*bound.shape[:-1], 1), self.noise_floor)
                bound = bound.squeeze(-1) if u.dim() == 1 else bound
            else:
                bound = bound.amax(dim=-1, keepdim=u.dim() > 1)
        return torch.nextafter(bound, bound.new_tensor(math.inf))  # Theorem 2 is strict

    def keep_probability(self, u: torch.Tensor) -> torch.Tensor:
        """Pr[sign(u_i + e_i) = sign(u_i)] = Φ(|u_i|/σ) (eq. 10); γ = its max, γ̃ its min."""
        return torch.special.ndtr(u.abs() / self.sigma(u))

    def __call__(self, u: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """sign(u + e) with e ~ N(0, σ²) drawn from ``generator``."""
        check_generator(generator, u.device)
        noise = torch.randn(u.shape, generator=generator, device=u.device, dtype=u.dtype)
        return rsa_sign(noise.mul_(self.sigma(u)).add_(u))
