"""Byzantine messages of the decentralized loop, computed per receiving agent.

Every attack is omniscient about what its *receiver* sees: the noisy models x̃_m that the
receiver n's honest neighbours m ∈ R_n and n itself broadcast this iteration (the
messages the Byzantine agent, a neighbour of n, also receives; the note's §6.4 leaves
open whether attackers see models before or after the noise, and the code used noise-free
ones). Nothing outside R_n ∪ {n} enters the message to n.

=================  ===========================================================================
``gaussian``       each Byzantine neighbour b sends c_n + std·N(0, I), a fresh draw per (b, n);
                   c_n = 0 with ``center = "zero"`` (the paper: elements ∼ N(0, 900), std 30)
                   or the mean of x̃ over R_n with ``center = "neighbours"`` (the code)
``sign_flipping``  −scale × the mean of x̃ over R_n ∪ {n}; scale 10 (paper) or 1 (code)
``isolating``      b_n = (x̃_n − Σ_{m ∈ R_n ∪ {n}} w'_nm x̃_m) / Σ_{b ∈ B_n} w'_nb, so that the
                   DSGD mixing Σ w'_nm x̃_m returns x̃_n: n learns alone
=================  ===========================================================================

Options come from ``[attack] options``: ``scale`` (sign_flipping), ``std`` and ``center``
(gaussian).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sharefl.simulator.config import RunConfig, SimulationConfigError

ATTACKS = ("none", "gaussian", "sign_flipping", "isolating")
"""The decentralized loop's ``attack.name`` values (what :func:`build_attack` builds)."""
CENTERS = ("zero", "neighbours")


@dataclass(frozen=True)
class ReceiverView:
    """What the honest receivers see, as matrices over the honest agents (order of
    ``graph.honest``).

    Attributes:
        honest_neighbours: boolean ``[R, R]``, ``[n, m]`` true when m ∈ R_n (no diagonal).
        honest_weights: ``[R, R]`` float64, w'_nm for m ∈ R_n ∪ {n} (diagonal w'_nn).
        byzantine_weight: ``[R]``, Σ_{b ∈ B_n} w'_nb.
        byzantine_neighbours: boolean ``[R, b]``, which Byzantine agents neighbour n.
    """

    honest_neighbours: Tensor
    honest_weights: Tensor
    byzantine_weight: Tensor
    byzantine_neighbours: Tensor


@dataclass(frozen=True)
class NeighbourAttack:
    """One of :data:`ATTACKS` with its options (see the module docstring)."""

    name: str
    scale: float = 10.0
    std: float = 30.0
    center: str = "zero"

    @classmethod
    def from_config(cls, name: str, options: dict[str, Any]) -> NeighbourAttack:
        """From ``[attack] name`` and ``options``.

        Raises:
            SimulationConfigError: an unknown attack, option or center.
        """
        if name not in ATTACKS:
            raise SimulationConfigError(
                f"attack.name must be one of {ATTACKS} for the decentralized loop"
            )
        allowed = {"sign_flipping": {"scale"}, "gaussian": {"std", "center"}}.get(name, set())
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise SimulationConfigError(
                f"attack.options {unknown} do not apply to {name!r}; allowed: {sorted(allowed)}"
            )
        attack = cls(name, **options)
        if attack.center not in CENTERS:
            raise SimulationConfigError(f"attack.options.center must be one of {CENTERS}")
        if attack.std < 0:
            raise SimulationConfigError("attack.options.std must be >= 0")
        return attack

    def messages_per_receiver(self, byzantine: int) -> int:
        """u: how many different messages one receiver gets from its ``byzantine``
        Byzantine neighbours (:meth:`distinct_messages`): one per Byzantine agent for
        ``gaussian`` (a fresh draw each), 1 otherwise (every Byzantine neighbour of n sends
        the same message)."""
        return byzantine if self.name == "gaussian" else 1

    def distinct_messages(
        self, sent: Tensor, view: ReceiverView, generator: torch.Generator
    ) -> Tensor:
        """``[R, u, d]`` (u = :meth:`messages_per_receiver`): the different messages each
        honest receiver n gets; Byzantine agent j sends row n's message ``j`` when u > 1,
        message 0 when u = 1. Draws from ``generator`` exactly as :meth:`messages` does."""
        R, d = sent.shape
        b = view.byzantine_neighbours.shape[1]
        if self.name == "gaussian":
            noise = torch.randn(R, b, d, generator=generator, device=sent.device, dtype=sent.dtype)
            if self.center == "zero":
                return self.std * noise
            H = view.honest_neighbours.to(sent.dtype)
            centre = (H @ sent) / H.sum(dim=1, keepdim=True).clamp_min(1.0)
            return centre[:, None, :] + self.std * noise
        if self.name == "sign_flipping":
            H = view.honest_neighbours.to(sent.dtype) + torch.eye(R, dtype=sent.dtype)
            mean = (H @ sent) / H.sum(dim=1, keepdim=True)
            return (-self.scale * mean)[:, None, :]
        if self.name == "isolating":
            mixed = view.honest_weights.to(sent.dtype) @ sent
            wb = view.byzantine_weight.to(sent.dtype).clamp_min(1e-300)[:, None]
            return ((sent - mixed) / wb)[:, None, :]
        raise SimulationConfigError(f"attack {self.name!r} sends no messages")

    def messages(self, sent: Tensor, view: ReceiverView, generator: torch.Generator) -> Tensor:
        """``[R, b, d]``: what Byzantine agent j sends to honest receiver n (row n, slot j;
        meaningful where ``view.byzantine_neighbours[n, j]``), from the honest agents'
        broadcasts ``sent`` ``[R, d]``."""
        R, d = sent.shape
        b = view.byzantine_neighbours.shape[1]
        return self.distinct_messages(sent, view, generator).expand(R, b, d)


def build_attack(name: str, options: dict[str, Any]) -> NeighbourAttack | None:
    """The attack ``name`` of :data:`ATTACKS` with ``options`` (``[attack]``); ``None`` for
    ``"none"`` (the Byzantine agents and their links are deleted).

    Raises:
        SimulationConfigError: an unknown attack, option or center.
    """
    return None if name == "none" else NeighbourAttack.from_config(name, options)


def check_attack(run: RunConfig) -> None:
    """The decentralized entry's data-free check (:data:`~sharefl.simulator.loops.LOOPS`):
    its ``[attack]`` builds (:func:`build_attack`)."""
    build_attack(run.attack.name, run.attack.options)
