"""The budget a client keeps itself: rounds joined and the privacy loss of its own noise.

The server's ε ledger is a report, not a guarantee: a server that lies about it, replays
rounds or starts new runs spends a client's privacy without saying so. So each client keeps
its own ledger in its memory (:class:`~sharefl.protocol.memory.ClientMemory`, per server
identity) and refuses a round that would take it past its limits
(:class:`~sharefl.protocol.errors.BudgetExhausted`), before anything of the round leaves it:

- ``max_rounds``: the rounds it joins (a round counts when its first assignment is
  accepted, whatever its number or run id, so replays and new runs count too);
- ``max_epsilon``: the ε, at ``delta``, of the Rényi-DP it accumulated. Each round the
  transport charges the RDP of the noise *this client adds itself* at :data:`ORDERS`
  (:class:`PrivacyCharge`, computed by the privacy layer from the client's own DP
  configuration, counting no other member's noise). RDP composes by addition, and ε is
  converted with the classic bound ε = min_α RDP(α) + log(1/δ)/(α − 1) (Mironov 2017),
  which is never below the tighter conversions (conservative for a refusal).

This module is pure arithmetic (the protocol layer does not depend on the privacy layer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sharefl.protocol.errors import ConfigurationError

ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0,
    32.0, 48.0, 64.0, 128.0, 256.0,
)  # fmt: skip
"""The Rényi orders α at which a client's ledger is kept."""


@dataclass(frozen=True)
class PrivacyCharge:
    """The Rényi-DP of one round of a client's own noise, one value per order of
    :data:`ORDERS` (each >= 0, may be ``inf``: no noise). Raises ConfigurationError for
    the wrong length or a negative value."""

    rdp: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "rdp", tuple(float(v) for v in self.rdp))
        if len(self.rdp) != len(ORDERS) or any(not v >= 0 for v in self.rdp):
            raise ConfigurationError(
                f"a privacy charge is {len(ORDERS)} Rényi-DP values >= 0 (one per order of "
                f"sharefl.protocol.budget.ORDERS); got {len(self.rdp)}"
            )


def epsilon(rdp: Sequence[float], delta: float) -> float:
    """ε at ``delta`` of an accumulated RDP curve at :data:`ORDERS` (classic conversion);
    0 for an empty ledger. Raises ConfigurationError unless 0 < delta < 1."""
    if not 0 < delta < 1:
        raise ConfigurationError(f"delta must be in (0, 1), got {delta}")
    if not any(rdp):
        return 0.0
    return min(r + math.log(1 / delta) / (a - 1) for a, r in zip(ORDERS, rdp, strict=True))


def add(ledger: Sequence[float], charge: PrivacyCharge | None) -> tuple[float, ...]:
    """The ledger after one more round (RDP adds up); an empty ledger is all zeros."""
    base = tuple(ledger) or (0.0,) * len(ORDERS)
    if charge is None:
        return base
    return tuple(a + b for a, b in zip(base, charge.rdp, strict=True))
