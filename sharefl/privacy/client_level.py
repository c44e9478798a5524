"""Client-level DP for FedAvg, with the noise added at the clients so that it survives
secure aggregation.

Each sampled client clips its model update Δ to l2 norm C and adds its share of the noise
before masking. The server only learns sums of clusters of m clients, so each cluster sum
must carry the whole noise N(0, σ²C² I): every member adds N(0, σ²C²/(m − t) I), where t
is the number of members who may collude with the server (each colluder knows, and can
subtract, its own share; t = 0 gives the plain split σ²C²/m). A client's update changes a
single cluster sum by at most C, so one round is a Gaussian mechanism with noise multiplier
σ; with clients Poisson-sampled at rate q it is a sampled Gaussian mechanism (σ, q) in
:class:`sharefl.privacy.PrivacyAccountant` (the server divides the total by the expected
number of sampled clients, q·N, not by the random count).

Two situations reduce the noise a cluster sum carries, and the accounting must use
:meth:`ClientDPConfig.noise_multiplier_for`:

- drop-outs: only s ≤ m members' shares are in the sum, σ_eff = σ·√((s − t)/(m − t));
- reclustering (SHARE's R > 1 clusterings of the same noisy updates): differences of
  cluster sums of different clusterings can isolate single noisy updates, whose noise
  multiplier is only σ/√(m − t). That value is what the round must be accounted with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import PrivacyConfigError
from .noise import add_gaussian_noise_


@dataclass(frozen=True)
class ClientDPConfig:
    """Clipping and noise split of client-level DP.

    Attributes:
        clip_norm: C, the l2 bound on one client's update.
        noise_multiplier: σ; a full cluster sum carries N(0, σ²C² I).
        cluster_size: m, clients whose noisy updates secure aggregation sums.
        colluders: t < m, members of a cluster assumed to collude with the server.
    """

    clip_norm: float
    noise_multiplier: float
    cluster_size: int
    colluders: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise PrivacyConfigError(f"clip_norm must be > 0, got {self.clip_norm!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise PrivacyConfigError(
                f"noise_multiplier must be finite and ≥ 0, got {self.noise_multiplier!r}"
            )
        if self.cluster_size < 1:
            raise PrivacyConfigError(f"cluster_size must be ≥ 1, got {self.cluster_size}")
        if not 0 <= self.colluders < self.cluster_size:
            raise PrivacyConfigError(
                f"colluders must be in [0, cluster_size) = [0, {self.cluster_size}), got "
                f"{self.colluders}: a cluster needs at least one honest member"
            )

    @property
    def client_noise_std(self) -> float:
        """Std of every coordinate of one client's noise: σC/√(m − t)."""
        return (
            self.noise_multiplier * self.clip_norm / math.sqrt(self.cluster_size - self.colluders)
        )

    def noise_multiplier_for(self, survivors: int | None = None, reclusterings: int = 1) -> float:
        """The σ to account for one round.

        Args:
            survivors: members of the smallest cluster whose noisy updates are in its sum
                (default: all m).
            reclusterings: number of clusterings of the same noisy updates whose sums the
                server learns (SHARE's R).

        Returns:
            σ·√((s − t)/(m − t)) for one clustering; σ/√(m − t) for several (a single noisy
            update can be isolated). 0.0 when no honest share is left (ε = ∞).
        """
        m, t = self.cluster_size, self.colluders
        s = m if survivors is None else survivors
        if not 0 <= s <= m:
            raise PrivacyConfigError(f"survivors must be in [0, {m}], got {survivors}")
        if reclusterings < 1:
            raise PrivacyConfigError(f"reclusterings must be ≥ 1, got {reclusterings}")
        if reclusterings > 1:
            return self.noise_multiplier / math.sqrt(m - t)
        return self.noise_multiplier * math.sqrt(max(s - t, 0) / (m - t))


def clip_update_(update: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Scale ``update`` in place to l2 norm at most ``clip_norm``; return it."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise PrivacyConfigError(f"clip_norm must be > 0, got {clip_norm!r}")
    norm = torch.linalg.vector_norm(update)
    return update.mul_((clip_norm / norm.clamp_min(1e-30)).clamp_max(1.0))


def privatize_update_(
    update: torch.Tensor,
    config: ClientDPConfig,
    generator: torch.Generator,
    *,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """One client's share: clip the flat ``update`` to C and add N(0, σ²C²/(m − t) I), in
    place; return it. ``scratch`` (like ``update``) avoids allocating the noise buffer."""
    clip_update_(update, config.clip_norm)
    return add_gaussian_noise_(update, config.client_noise_std, generator, scratch=scratch)
