"""Ye, Zhu and Ling: Gaussian noise on the models agents transmit in decentralized SGD.

At iteration k agent n sends x̃ = x − α^k·ḡ + e with e ~ N(0, (σ^k)² I) and σ^k = C·α^k
(Algorithm 1), where ḡ is the mean of the batch's per-example gradients, each clipped to l2
norm M (without clipping the guarantee is void; Ye, Zhu and Ling note §6.2). Since
x̃ = x − α^k(ḡ + N(0, C² I)), this is DP-SGD with flat clipping to M and noise std C on the
mean gradient: noise multiplier C·B/M on the sum of a batch of B (add/remove adjacency;
replace-one doubles the sensitivity, i.e. halves the multiplier). With Poisson sampling at
rate B/S each iteration is one sampled Gaussian mechanism for the accountant.

One noise draw per iteration is sent to every neighbour (the paper). Drawing fresh noise per
receiver, as the authors' code does, lets colluding receivers average it away.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .accountant import PrivacyAccountant
from .clipping import FlatClipping
from .dpsgd import DPSGD, DPSGDConfig
from .errors import PrivacyConfigError
from .per_example import DEFAULT_CHUNK_BYTES, LossFn


@dataclass(frozen=True)
class ModelNoiseConfig:
    """Ye, Zhu and Ling's noise parameters.

    Attributes:
        noise_scale: C; the transmitted model's noise std is C·α^k.
        clip_norm: M, the per-example gradient bound.
        batch_size: B, (expected) examples per iteration.
        dataset_size: S, the agent's number of examples (gives the sampling rate B/S).
    """

    noise_scale: float
    clip_norm: float
    batch_size: int
    dataset_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("noise_scale", "clip_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise PrivacyConfigError(f"{name} must be > 0, got {value!r}")
        if self.batch_size < 1:
            raise PrivacyConfigError(f"batch_size must be ≥ 1, got {self.batch_size}")
        if self.dataset_size is not None and self.dataset_size < self.batch_size:
            raise PrivacyConfigError(
                f"dataset_size ({self.dataset_size}) must be ≥ batch_size ({self.batch_size})"
            )

    def noise_std(self, lr: float) -> float:
        """σ^k = C·α^k for the step size α^k = ``lr``."""
        return self.noise_scale * lr

    @property
    def noise_multiplier(self) -> float:
        """C·B/M, the accountant's σ (add/remove adjacency)."""
        return self.noise_scale * self.batch_size / self.clip_norm

    @property
    def sample_rate(self) -> float | None:
        """B/S, or None without a dataset size."""
        return None if self.dataset_size is None else self.batch_size / self.dataset_size

    def dpsgd_config(
        self, *, chunk_size: int | None = None, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> DPSGDConfig:
        """The equivalent DP-SGD configuration."""
        return DPSGDConfig(
            clipping=FlatClipping(self.clip_norm),
            noise_multiplier=self.noise_multiplier,
            expected_batch_size=self.batch_size,
            sample_rate=self.sample_rate,
            chunk_size=chunk_size,
            max_chunk_bytes=max_chunk_bytes,
        )


class NoisyModelTransmitter:
    """Computes the model an agent transmits: x̃ = x − α·ḡ_clipped + N(0, (C·α)² I).

    Args:
        model: the agent's model (not modified by :meth:`transmit`).
        loss_fn: per-example loss.
        config: see :class:`ModelNoiseConfig`.
        generator: source of the noise, on the model's device.
        accountant: stepped once per transmission with (C·B/M, B/S) if given.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        config: ModelNoiseConfig,
        *,
        generator: torch.Generator,
        accountant: PrivacyAccountant | None = None,
        chunk_size: int | None = None,
    ) -> None:
        if accountant is not None and config.dataset_size is None:
            raise PrivacyConfigError(
                "accounting needs the sampling rate B/S: set ModelNoiseConfig.dataset_size"
            )
        self.config = config
        self.dpsgd = DPSGD(
            model,
            loss_fn,
            config.dpsgd_config(chunk_size=chunk_size),
            generator=generator,
            accountant=accountant,
        )

    def transmit(self, inputs: torch.Tensor, targets: torch.Tensor, lr: float) -> torch.Tensor:
        """The flat ``[d]`` noisy model x̃ for step size α = ``lr`` on the sampled batch."""
        if not (math.isfinite(lr) and lr > 0):
            raise PrivacyConfigError(f"lr must be > 0, got {lr!r}")
        private = self.dpsgd.privatize(inputs, targets)
        out = private.flat.mul_(-lr)
        for view, p in zip(private.views(), self.dpsgd.parameters, strict=True):
            view.add_(p.detach())
        return out


def theorem3_epsilon(
    noise_scale: float, clip_norm: float, dataset_size: int, iterations: int, delta: float
) -> float:
    """Ye, Zhu and Ling's closed form ε = 2M²K/(C²S²) + (2M/(CS))·√(2K ln(1/δ)), for comparison with
    the paper's numbers (C = 2, M/S = 1/600, K = 50,000, δ = 1e-4 gives 1.669). Use
    :class:`PrivacyAccountant` for the guarantee itself."""
    ratio = clip_norm / (noise_scale * dataset_size)
    return 2.0 * ratio**2 * iterations + 2.0 * ratio * math.sqrt(
        2.0 * iterations * math.log(1.0 / delta)
    )
