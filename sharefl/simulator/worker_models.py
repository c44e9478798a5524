"""Many models trained side by side: per-worker stochastic gradients in one ``torch.func``
call, for loops that keep a model per worker (DP-RSA's ``x_k``, a decentralized agent's
``x_i``) instead of one global model.

The models are the rows of one ``[K, d]`` tensor (flat parameters of a
:class:`~sharefl.simulator.training.FlatModel`); :meth:`WorkerGradients.gradients` returns
the ``[K, d]`` mini-batch gradients of every row on its own worker's batch, through
``vmap(grad(batch loss))`` over workers: no Python loop over workers on the hot path.
A single shared model (gradient baselines) is the same call with ``x.expand(K, d)``.

Batches come from :class:`EpochSampler`: each worker walks a random permutation of its own
examples, ``B`` at a time; when the worker with the fewest examples runs out, every
permutation is redrawn (the DP-RSA authors' loaders, which re-create all loaders when one
is exhausted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from sharefl.simulator.models import dropout_generator
from sharefl.simulator.training import FlatModel, TrainingError


class EpochSampler:
    """Per-worker batches without replacement within an epoch.

    Args:
        partitions: the training-set indices of every worker (worker = list index).
        batch_size: B >= 1, at most the smallest partition.
        device: where the index tensors live.

    Raises:
        TrainingError: an empty partition, or B larger than a partition.
    """

    def __init__(
        self,
        partitions: Sequence[Sequence[int] | np.ndarray],
        batch_size: int,
        device: torch.device,
    ) -> None:
        sizes = [len(p) for p in partitions]
        if not sizes or min(sizes) == 0:
            raise TrainingError("every worker needs at least one training example")
        if not 1 <= batch_size <= min(sizes):
            raise TrainingError(f"batch_size must be in [1, {min(sizes)}], got {batch_size}")
        self.batch_size = batch_size
        self.device = device
        self.sizes = torch.tensor(sizes, device=device)
        padded = torch.zeros(len(sizes), max(sizes), dtype=torch.long)
        for k, part in enumerate(partitions):
            padded[k, : len(part)] = torch.as_tensor(list(part), dtype=torch.long)
        self.index = padded.to(device)
        self.order: Tensor | None = None  # [K, max n]: positions, each row a permutation
        self.position = 0

    @property
    def num_workers(self) -> int:
        return self.index.shape[0]

    def _shuffle(self, generator: torch.Generator) -> None:
        width = self.index.shape[1]
        keys = torch.rand(self.num_workers, width, generator=generator, device=self.device)
        valid = torch.arange(width, device=self.device)[None, :] < self.sizes[:, None]
        self.order = torch.argsort(torch.where(valid, keys, 2.0), dim=1)
        self.position = 0

    def next(self, generator: torch.Generator) -> Tensor:
        """Training-set indices ``[K, B]`` of every worker's next batch."""
        B = self.batch_size
        if self.order is None or self.position + B > int(self.sizes.min()):
            self._shuffle(generator)
        assert self.order is not None
        positions = self.order[:, self.position : self.position + B]
        self.position += B
        return torch.gather(self.index, 1, positions)


class WorkerGradients:
    """Mini-batch cross-entropy gradients of K models at once.

    Args:
        model: the architecture as a :class:`FlatModel` (its ``dim`` is d).
        inputs, targets: the whole training set on the training device.
        sampler: which examples each worker uses at each step.
    """

    def __init__(
        self, model: FlatModel, inputs: Tensor, targets: Tensor, sampler: EpochSampler
    ) -> None:
        self.model = model
        self.inputs, self.targets = inputs, targets
        self.sampler = sampler
        module = model.module

        def batch_loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            out = functional_call(module, (params, model.buffers), (x,))
            return nn.functional.cross_entropy(out, y)

        self._grad = vmap(grad(batch_loss), in_dims=(0, 0, 0), randomness="different")

    def gradients(self, params: Tensor, generator: torch.Generator) -> Tensor:
        """``[K, d]``: row k is ∇f_k(params[k]) on worker k's next batch (``params`` is
        ``[K, d]``; an expanded view of one model is fine). Draws the batches from
        ``generator``."""
        if params.shape != (self.sampler.num_workers, self.model.dim):
            raise TrainingError(
                f"params must be [{self.sampler.num_workers}, {self.model.dim}], "
                f"got {tuple(params.shape)}"
            )
        rows = self.sampler.next(generator)
        with dropout_generator(self.model.module, generator):  # dropout masks: generator's too
            grads = self._grad(self.model.unflatten(params), self.inputs[rows], self.targets[rows])
        return torch.cat([grads[n].reshape(len(params), -1) for n in self.model.names], dim=1)
