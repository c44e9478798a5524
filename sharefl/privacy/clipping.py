"""Per-example clipping modes: how each example's gradient is bounded before summation.

A mode turns the per-layer norms of a chunk of per-example gradients into per-example,
per-layer scale factors, and states the l2 sensitivity of the sum of the scaled gradients
(add/remove one example), which the Gaussian noise is calibrated to: noise std on the sum
= σ_t × sensitivity. A "layer" is one parameter tensor (weight and bias are separate), as
in Opacus's per-layer mode.

- :class:`FlatClipping` — g·min(1, C/‖g‖); sensitivity C.
- :class:`PerLayerClipping` — each layer g_l·min(1, C_l/‖g_l‖); sensitivity √(Σ_l C_l²).
- :class:`L2MaxClipping` — Fed-αCDP (Wei et al.): per-layer clipping to C and the l2-max
  sensitivity S_t = max over examples and layers of the clipped norms = min(C, max ‖g_l‖),
  recomputed every step. S_t is data-dependent and the M layers together have sensitivity
  √M·C, which the paper's accounting ignores: the ε an accountant reports for this mode is
  the paper's nominal value, not a rigorous guarantee.
- :class:`Normalization` — the DP filter's per-example normalisation φ_j/‖φ_j‖ with per-example
  momentum φ_j = (1 − β)g_j + β·m, m the previous noisy output (Algorithm 1); every example
  contributes a unit vector, so the sensitivity is 1.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .errors import PrivacyConfigError

# Norms below this are treated as 0 (an all-zero gradient contributes nothing either way).
_TINY = 1e-30


def _check_bound(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise PrivacyConfigError(f"{name} must be a positive finite number, got {value!r}")


class ClippingMode(ABC):
    """Base class of the clipping modes (frozen dataclasses)."""

    #: True when the sensitivity depends on the batch (Fed-αCDP's l2-max S_t).
    data_dependent: bool = False

    @abstractmethod
    def sensitivity(self, numels: Sequence[int]) -> float:
        """l2 sensitivity of the sum of contributions for a model whose layers have
        ``numels`` entries (the worst case for :class:`L2MaxClipping`)."""

    @abstractmethod
    def factors(self, layer_norms: torch.Tensor) -> torch.Tensor:
        """Scale factors from the ``[L, b]`` per-layer norms of b examples: a tensor of shape
        ``[L, b]`` or ``[1, b]`` (the same factor for every layer)."""

    def batch_sensitivity(self, max_layer_norm: float, numels: Sequence[int]) -> float:
        """Sensitivity used for this step's noise given the largest raw per-layer norm of
        the batch (``nan`` for an empty batch). Static modes ignore it."""
        return self.sensitivity(numels)

    def prepare_(self, grads: list[torch.Tensor], state: list[torch.Tensor]) -> None:  # noqa: B027
        """Transform a chunk of ``[b, numel]`` per-example gradients in place before their
        norms are taken, given per-layer views of the privatizer's state. Default: nothing."""


@dataclass(frozen=True)
class FlatClipping(ClippingMode):
    """Clip each example's whole gradient to l2 norm ``max_norm`` (standard DP-SGD)."""

    max_norm: float

    def __post_init__(self) -> None:
        _check_bound("max_norm", self.max_norm)

    def sensitivity(self, numels: Sequence[int]) -> float:
        return float(self.max_norm)

    def factors(self, layer_norms: torch.Tensor) -> torch.Tensor:
        total = torch.linalg.vector_norm(layer_norms, dim=0, keepdim=True)
        return (self.max_norm / total.clamp_min(_TINY)).clamp_max_(1.0)


@dataclass(frozen=True)
class PerLayerClipping(ClippingMode):
    """Clip each layer of each example to its own bound.

    ``max_norm`` is one bound for every layer or one per trainable parameter tensor, in
    ``model.named_parameters()`` order. The sum's sensitivity is √(Σ_l C_l²), so the noise
    is calibrated to the whole gradient and the accountant's σ is exact.
    """

    max_norm: float | tuple[float, ...]

    def __post_init__(self) -> None:
        bounds = self.max_norm if isinstance(self.max_norm, tuple) else (self.max_norm,)
        if not bounds:
            raise PrivacyConfigError("max_norm must not be an empty tuple")
        for bound in bounds:
            _check_bound("max_norm", bound)

    def bounds(self, layers: int) -> tuple[float, ...]:
        """The per-layer bounds for a model with ``layers`` parameter tensors."""
        if not isinstance(self.max_norm, tuple):
            return (float(self.max_norm),) * layers
        if len(self.max_norm) != layers:
            raise PrivacyConfigError(
                f"PerLayerClipping has {len(self.max_norm)} bounds but the model has {layers} "
                "trainable parameter tensors: give one bound per tensor or a single number"
            )
        return self.max_norm

    def sensitivity(self, numels: Sequence[int]) -> float:
        return math.sqrt(sum(c * c for c in self.bounds(len(numels))))

    def factors(self, layer_norms: torch.Tensor) -> torch.Tensor:
        bounds = torch.tensor(
            self.bounds(layer_norms.shape[0]), dtype=layer_norms.dtype, device=layer_norms.device
        )
        return (bounds.unsqueeze(1) / layer_norms.clamp_min(_TINY)).clamp_max_(1.0)


@dataclass(frozen=True)
class L2MaxClipping(ClippingMode):
    """Fed-αCDP (Wei et al.): per-layer clipping to ``max_norm`` (the paper's C, default 4) and
    noise N(0, σ_t² S_t²) on the sum with S_t = min(C, max over examples and layers of the raw
    layer norms), divided by the batch size like standard DP-SGD (the scaling of the
    authors' code, the only one consistent with their accountant).

    Caveats (Fed-αCDP note §6): S_t depends on the batch, so the mechanism is not rigorously
    DP, and per-layer clipping of M layers has whole-gradient sensitivity √M·C. An empty
    batch uses S = C. Report ε for this mode as the paper's nominal value.
    """

    max_norm: float = 4.0
    data_dependent = True

    def __post_init__(self) -> None:
        _check_bound("max_norm", self.max_norm)

    def sensitivity(self, numels: Sequence[int]) -> float:
        return float(self.max_norm)

    def factors(self, layer_norms: torch.Tensor) -> torch.Tensor:
        return (self.max_norm / layer_norms.clamp_min(_TINY)).clamp_max_(1.0)

    def batch_sensitivity(self, max_layer_norm: float, numels: Sequence[int]) -> float:
        if math.isnan(max_layer_norm):
            return float(self.max_norm)
        return min(float(self.max_norm), max_layer_norm)


@dataclass(frozen=True)
class Normalization(ClippingMode):
    """The DP filter's per-example normalisation with per-example momentum β (paper: β = 0.1).

    Each example contributes φ_j/‖φ_j‖ with φ_j = (1 − β)g_j + β·m, where m is the previous
    noisy output of the same privatizer (zero at the first step): Algorithm 1 resets every
    slot's momentum to the last noisy upload, so one d-vector of state suffices. m is public
    (an earlier release), so the sensitivity stays 1. A φ_j of norm 0 contributes 0.
    """

    momentum: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise PrivacyConfigError(f"momentum must be in [0, 1), got {self.momentum!r}")

    def sensitivity(self, numels: Sequence[int]) -> float:
        return 1.0

    def prepare_(self, grads: list[torch.Tensor], state: list[torch.Tensor]) -> None:
        """φ_j = (1 − β)g_j + β·m in place on the ``[b, numel]`` chunk ``grads``, with the
        per-layer views ``state`` of m. Exact norms are then taken of the φ_j themselves."""
        beta = self.momentum
        if beta == 0.0:
            return
        for g, m in zip(grads, state, strict=True):
            g.mul_(1.0 - beta).add_(m, alpha=beta)

    def factors(self, layer_norms: torch.Tensor) -> torch.Tensor:
        total = torch.linalg.vector_norm(layer_norms, dim=0, keepdim=True)
        return torch.where(total > _TINY, total.clamp_min(_TINY).reciprocal(), 0.0)
