"""The decentralized iteration with a Python loop over agents: the yardstick for the
vectorised :class:`~.loop.DecentralizedLoop` (equal results, tests) and for its speed
(``benchmarks/bench_decentralized.py``).

:class:`PerAgentLoop` draws the same batches and noise from the same generator, then
computes each agent's clipped gradient with its own ``vmap(grad)`` over its examples and
aggregates each receiver with the per-agent rules of :mod:`sharefl.robust.decentralized`
(:class:`~sharefl.robust.decentralized.DecentralizedTrimmedMean`,
:class:`~sharefl.robust.decentralized.SelfCenteredClipping`,
:class:`~sharefl.robust.decentralized.IOS`). Not for production runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from sharefl.robust.decentralized import IOS, DecentralizedTrimmedMean, SelfCenteredClipping
from sharefl.simulator.decentralized.loop import DecentralizedLoop


class PerAgentLoop(DecentralizedLoop):
    """:class:`DecentralizedLoop` with one Python iteration per agent in the gradient and
    aggregation steps (same arguments)."""

    def _per_example_gradients(self, module: nn.Module) -> Any:
        buffers = self.model.buffers

        def example_loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            out = functional_call(module, (params, buffers), (x[None],))
            return nn.functional.cross_entropy(out, y[None])

        return vmap(grad(example_loss), in_dims=(None, 0, 0))

    def clipped_gradients(self, x: Tensor) -> Tensor:
        rows = self.sampler.next(self.generator)
        out = []
        for n in range(len(self.honest)):
            inputs = self.train_set.inputs[rows[n]].to(self.dtype)
            grads = self._per_example(
                self.model.unflatten(x[n]), inputs, self.train_set.targets[rows[n]]
            )
            flat = torch.cat([grads[k].reshape(len(inputs), -1) for k in self.model.names], dim=1)
            norms = torch.linalg.vector_norm(flat, dim=1, keepdim=True)
            flat = flat * (self.cfg.clip / norms.clamp_min(1e-300)).clamp_max(1.0)
            out.append(flat.mean(dim=0))
        return torch.stack(out)

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
