"""Yardsticks for :class:`~.loop.DecentralizedLoop` (equal results up to float64 rounding,
tests; speed, ``benchmarks/bench_decentralized.py``).

:class:`StraightLoop` is the loop before the rules moved to the distinct messages
(:mod:`.distinct`): every iteration copies what each receiver gets into ``[R, N, d]``
(:meth:`~.loop.DecentralizedLoop.received`) and aggregates it with the batched rules of
:mod:`sharefl.robust.decentralized`; batches are gathered and converted per iteration; every
evaluation builds a fresh privacy accountant per agent.

:class:`PerAgentLoop` draws the same batches and noise from the same generator, then
computes each agent's clipped gradient on its own (the ``vmap(grad)`` path of
:mod:`.gradients`, one agent at a time) and
aggregates each receiver with the per-agent rules of :mod:`sharefl.robust.decentralized`
(:class:`~sharefl.robust.decentralized.DecentralizedTrimmedMean`,
:class:`~sharefl.robust.decentralized.SelfCenteredClipping`,
:class:`~sharefl.robust.decentralized.IOS`). Not for production runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from sharefl.robust.decentralized import IOS, DecentralizedTrimmedMean, SelfCenteredClipping
from sharefl.simulator.decentralized.gradients import VmapClippedMean
from sharefl.simulator.decentralized.loop import DecentralizedLoop


class StraightLoop(DecentralizedLoop):
    """:class:`DecentralizedLoop` on the straight path (same arguments)."""

    def clipped_gradients(self, x: Tensor) -> Tensor:
        rows = self.sampler.next(self.generator)
        inputs = self.train_set.inputs[rows].to(self.dtype)
        return self._clipped_mean(x, inputs, self.train_set.targets[rows], self.cfg.clip)

    def mix(self, sent: Tensor) -> Tensor:
        return self.aggregate(sent, self.received(sent))

    def epsilon(self) -> float | None:
        """As before the accountant's cache: a fresh accountant per agent and evaluation."""
        if self.cfg.noise == 0 or self.round == 0:
            return None
        return max(a.rdp_epsilon_uncached() for a in self.agent_privacy())


class PerAgentLoop(StraightLoop):
    """:class:`DecentralizedLoop` with one Python iteration per agent in the gradient and
    aggregation steps (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._per_agent = VmapClippedMean(self.model, self.model.module)

    def clipped_gradients(self, x: Tensor) -> Tensor:
        rows = self.sampler.next(self.generator)
        inputs = self.train_set.inputs[rows].to(self.dtype)
        targets = self.train_set.targets[rows]
        return torch.cat(
            [
                self._per_agent(x[n : n + 1], inputs[n : n + 1], targets[n : n + 1], self.cfg.clip)
                for n in range(len(self.honest))
            ]
        )

    def aggregate(self, sent: Tensor, received: Tensor) -> Tensor:
        out = []
        for n in range(len(self.honest)):
            slots = torch.nonzero(self.mask[n]).flatten()
            msgs, w, q = received[n, slots], self.weights[n, slots], int(self.q[n])
            rule = self.cfg.rule
            if rule == "mean":
                out.append(sent[n] * (1 - w.sum()) + w @ msgs)
            elif rule == "trimmed_mean":
                out.append(DecentralizedTrimmedMean(q=q)(sent[n], msgs))
            elif rule == "scc":
                out.append(SelfCenteredClipping(tau=self.cfg.scc_tau)(sent[n], msgs, w))
            else:
                out.append(IOS(q=q)(sent[n], msgs, w))
        return torch.stack(out)
