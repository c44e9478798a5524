"""Privacy of one honest agent's broadcasts in the decentralized loop (Theorem 3).

Agent n releases, at every iteration k, x̃ = x − α_k ḡ + N(0, (C α_k)² I) where ḡ is the
mean of B per-example gradients clipped to norm M, on a batch drawn from its S examples.
Given x (known to the curious neighbours), the release is a Gaussian mechanism on α_k ḡ:

* sensitivity α_k M / B under add/remove-one adjacency, 2 α_k M / B under replace-one;
* noise multiplier z = C α_k / sensitivity = C B / M (add/remove) or C B / (2M), the same
  at every k (the noise shrinks with the step size);
* sampling rate B / S, K iterations.

:func:`rdp_epsilon` composes K Poisson-subsampled Gaussian mechanisms with the RDP
accountant (:class:`~sharefl.privacy.accountant.PrivacyAccountant`; the loop samples
without replacement within an epoch, the usual DP-SGD gap between analysis and sampler).
:func:`~sharefl.privacy.model_noise.theorem3_epsilon` is the paper's closed form, reported
beside it (it ignores B).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sharefl.privacy.accountant import PrivacyAccountant
from sharefl.privacy.model_noise import theorem3_epsilon

ADJACENCIES = ("add_remove", "replace_one")


@dataclass(frozen=True)
class AgentPrivacy:
    """The parameters of one agent's accounting and its two ε values."""

    noise: float  # C
    clip: float  # M
    batch_size: int  # B
    examples: int  # S
    iterations: int  # K
    delta: float
    adjacency: str

    @property
    def noise_multiplier(self) -> float:
        z = self.noise * self.batch_size / self.clip
        return z if self.adjacency == "add_remove" else z / 2

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.examples

    def rdp_epsilon(self) -> float:
        """ε after K iterations from the RDP accountant (improved conversion)."""
        if self.iterations == 0:
            return 0.0
        accountant = PrivacyAccountant(backend="rdp")
        accountant.step(self.noise_multiplier, self.sample_rate, self.iterations)
        return accountant.get_epsilon(self.delta)

    def theorem3_epsilon(self) -> float:
        """Theorem 3's ε = 2M²K/(C²S²) + (2M/(CS))√(2K ln(1/δ))."""
        return theorem3_epsilon(self.noise, self.clip, self.examples, self.iterations, self.delta)

    def to_json(self) -> dict[str, Any]:
        return {
            "C": self.noise,
            "M": self.clip,
            "B": self.batch_size,
            "S": self.examples,
            "K": self.iterations,
            "delta": self.delta,
            "adjacency": self.adjacency,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "epsilon_rdp": self.rdp_epsilon(),
            "epsilon_theorem3": self.theorem3_epsilon(),
        }
