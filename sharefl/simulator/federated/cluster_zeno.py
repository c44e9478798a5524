"""SHARE's Algorithm 2 in the simulator: Zeno++ over the cluster sums of every reclustering.

The server keeps a validation set drawn from its clean data (``data.auxiliary_per_class``
examples per class, taken out of the clients' pool; the paper uses a class-balanced 5 %
of the training data). For every reclustering r it

1. samples ``n_s`` validation examples and computes ∇f_s at the current model (fresh
   for every r, as line 5 of the algorithm implies);
2. scores every cluster candidate g (in the paper's scale: the sum over the cluster of
   (n_i/n)·Δ_i, see below) with Score(g) = −η⟨∇f_s, g⟩ − ρ‖g‖²
   (:class:`~sharefl.robust.ZenoPlusPlus`);
3. **sums** the accepted candidates: g^r = Σ accepted g (zero if none passes).

The round's step is (1/R) Σ_r g^r, as in Algorithm 1.

Scales. The simulator's uploads are pseudo-gradients u_i = w − w_i (the server steps
w ← w − η·aggregate), uploaded as N·(n_i/n)·u_i with ``training.weighted`` (else u_i), N
the round's participants. The paper's candidate is the cluster sum of (n_i/n)·Δ_i with
Δ_i = −u_i, so a released cluster sum S of uploads is scored as g = −S/N, and the
aggregate returned to the engine is −(1/R) Σ_r g^r: with every cluster accepted it is
exactly the FedAvg step (SHARE's Lemma 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from sharefl.robust import ZenoPlusPlus
from sharefl.simulator.config import SimulationConfigError
from sharefl.simulator.training import FlatModel

ZENO_OPTIONS = ("n_s", "rho", "epsilon", "lr")


def check_zeno_options(options: dict[str, Any], *, lr: float = 1.0) -> tuple[ZenoPlusPlus, int]:
    """(the Zeno++ rule, n_s) of ``aggregator.options``; raises
    :class:`SimulationConfigError` naming a bad option (``lr`` defaults to the server's η)."""
    unknown = sorted(set(options) - set(ZENO_OPTIONS))
    if unknown:
        raise SimulationConfigError(
            f"aggregator zeno: unknown options {unknown}; known {ZENO_OPTIONS}"
        )
    n_s = int(options.get("n_s", 128))
    if n_s < 1:
        raise SimulationConfigError("aggregator zeno: n_s must be >= 1")
    try:
        rule = ZenoPlusPlus(
            lr=float(options.get("lr", lr)),
            rho=float(options.get("rho", 1e-4)),
            epsilon=float(options.get("epsilon", 0.2)),
        )
    except ValueError as exc:
        raise SimulationConfigError(f"aggregator zeno with options {options}: {exc}") from exc
    return rule, n_s


@dataclass
class ValidationGradient:
    """∇f_s at a model: the mean cross-entropy gradient over ``n_s`` examples drawn
    (without replacement) from the server's validation set, fresh at every call."""

    model: FlatModel
    inputs: Tensor
    targets: Tensor
    n_s: int
    generator: torch.Generator

    def __call__(self, w: Tensor) -> Tensor:
        n = len(self.targets)
        take = min(self.n_s, n)
        keys = torch.rand(n, generator=self.generator, device=self.generator.device)
        rows = torch.topk(keys, take, largest=False).indices.to(self.inputs.device)
        with torch.enable_grad():
            params = w.detach().clone().requires_grad_(True)
            loss = nn.functional.cross_entropy(
                self.model(params, self.inputs[rows]), self.targets[rows]
            )
            (grad,) = torch.autograd.grad(loss, params)
        return grad


@dataclass
class ClusterZeno:
    """Zeno++ over released cluster sums (module docstring).

    Attributes:
        rule: the Zeno++ score and threshold (η = ``lr``, ρ, ε).
        validation: computes ∇f_s at a model.
        accepted, candidates: clusters accepted / scored so far (for the run summary);
        ``byzantine_accepted`` / ``byzantine_candidates`` the same for clusters with at
        least one Byzantine member.
    """

    rule: ZenoPlusPlus
    validation: ValidationGradient
    accepted: int = 0
    candidates: int = 0
    byzantine_accepted: int = 0
    byzantine_candidates: int = 0
    last_masks: list[Tensor] = field(default_factory=list)

    @classmethod
    def from_options(cls, options: dict[str, Any], *, lr: float, validation_factory) -> ClusterZeno:
        """Build from ``aggregator.options`` (``n_s`` 128, ``rho`` 1e-4, ``epsilon`` 0.2:
        Appendix D; ``lr`` defaults to the server's η)."""
        rule, n_s = check_zeno_options(options, lr=lr)
        return cls(rule=rule, validation=validation_factory(n_s))

    @torch.no_grad()
    def aggregate(
        self,
        reclusterings: Sequence[Tensor],
        w: Tensor,
        total: int,
        byzantine: Sequence[Sequence[bool]] | None = None,
    ) -> Tensor:
        """The engine's aggregate (a pseudo-gradient) from the released sums.

        Args:
            reclusterings: per reclustering, the ``[c, d]`` released cluster sums of
                uploads (individual uploads when there are no clusters).
            w: the current model (where ∇f_s is taken).
            total: N, the round's participants (the weighted uploads' normaliser).
            byzantine: per reclustering and cluster, whether it holds a Byzantine member
                (statistics only).
        """
        steps = []
        self.last_masks = []
        for r, sums in enumerate(reclusterings):
            candidates = -sums.to(torch.float64) / total
            grad = self.validation(w).to(torch.float64)
            mask = self.rule.accepted(candidates, grad)
            self.last_masks.append(mask)
            self.candidates += len(mask)
            self.accepted += int(mask.sum())
            if byzantine is not None:
                flags = torch.as_tensor(list(byzantine[r]), dtype=torch.bool)
                self.byzantine_candidates += int(flags.sum())
                self.byzantine_accepted += int((flags & mask.cpu()).sum())
            steps.append(candidates[mask].sum(dim=0))
        mean_step = torch.stack(steps).mean(dim=0)
        return (-mean_step).to(w.dtype).to(w.device)

    def summary(self) -> dict[str, Any]:
        """Acceptance rates so far (JSON-ready)."""
        honest_candidates = self.candidates - self.byzantine_candidates
        honest_accepted = self.accepted - self.byzantine_accepted
        return {
            "zeno_accepted": self.accepted,
            "zeno_candidates": self.candidates,
            "zeno_honest_acceptance": honest_accepted / honest_candidates
            if honest_candidates
            else None,
            "zeno_byzantine_acceptance": self.byzantine_accepted / self.byzantine_candidates
            if self.byzantine_candidates
            else None,
        }
