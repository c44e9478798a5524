"""Each agent's mean of B per-example gradients clipped to norm M, for all agents at once.

:func:`clipped_mean_gradients` picks the computation for a module:

* :class:`VmapClippedMean` — any module: one ``vmap(vmap(grad))`` pass over agents and
  examples materialises the ``[R, B, d]`` per-example gradients, then clips and averages;
* :class:`SoftmaxRegressionClippedMean` — ``Sequential(Flatten, Linear)`` under cross-entropy
  (the paper's MNIST model): the gradient of example i is the outer product
  e_i ⊗ (x_i, 1) with e_i = softmax(W x_i + b) − onehot(y_i), so its norm is
  ‖e_i‖·√(‖x_i‖² + 1) and the clipped mean Σ_i c_i e_i ⊗ (x_i, 1) / B is two batched
  matrix products: the same numbers without the ``[R, B, d]`` tensor (equal to the
  ``vmap`` path up to rounding; ``tests/test_decentralized.py`` checks it).

Both take the flat models ``[R, d]`` in :class:`~sharefl.simulator.training.FlatModel`'s
parameter order, inputs ``[R, B, ...]`` and targets ``[R, B]``, and return ``[R, d]``.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from sharefl.simulator.training import FlatModel


class ClippedMean(Protocol):
    def __call__(self, x: Tensor, inputs: Tensor, targets: Tensor, clip: float) -> Tensor: ...


def _clip_weights(norms: Tensor, clip: float) -> Tensor:
    """``[R, B]``: min(1, M/‖g_i‖)/B, the weight of each per-example gradient in the mean."""
    return (clip / norms.clamp_min(1e-300)).clamp_max(1.0) / norms.shape[1]


class VmapClippedMean:
    """The generic path: per-example gradients by ``vmap(vmap(grad))``."""

    def __init__(self, model: FlatModel, module: nn.Module) -> None:
        self.model = model
        buffers = model.buffers

        def example_loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            out = functional_call(module, (params, buffers), (x[None],))
            return nn.functional.cross_entropy(out, y[None])

        self._grads = vmap(vmap(grad(example_loss), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))

    def __call__(self, x: Tensor, inputs: Tensor, targets: Tensor, clip: float) -> Tensor:
        grads = self._grads(self.model.unflatten(x), inputs, targets)
        R, B = targets.shape
        pieces = [grads[n].reshape(R, B, -1) for n in self.model.names]
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(piece, dim=2) for piece in pieces]), dim=0
        )
        weights = _clip_weights(norms, clip)
        return torch.cat([torch.einsum("rb,rbd->rd", weights, piece) for piece in pieces], dim=1)


class SoftmaxRegressionClippedMean:
    """The closed form for ``Sequential(Flatten, Linear)`` (see the module docstring)."""

    def __init__(self, model: FlatModel, linear: nn.Linear) -> None:
        self.model = model
        prefix = next(n for n in model.names if n.endswith("weight")).rsplit(".", 1)[0]
        self.weight, self.bias = f"{prefix}.weight", f"{prefix}.bias"
        self.has_bias = linear.bias is not None

    def __call__(self, x: Tensor, inputs: Tensor, targets: Tensor, clip: float) -> Tensor:
        params = self.model.unflatten(x)
        W = params[self.weight]  # [R, C, F]
        R, B = targets.shape
        features = inputs.reshape(R, B, -1)  # [R, B, F]
        logits = torch.bmm(features, W.transpose(1, 2))  # [R, B, C]
        if self.has_bias:
            logits = logits + params[self.bias][:, None, :]
        err = torch.softmax(logits, dim=2)
        err.scatter_add_(2, targets[:, :, None], torch.full_like(err[:, :, :1], -1.0))
        feature_sq = torch.einsum("rbf,rbf->rb", features, features) + float(self.has_bias)
        norms = torch.linalg.vector_norm(err, dim=2) * feature_sq.sqrt()
        scaled = err * _clip_weights(norms, clip)[:, :, None]  # [R, B, C]
        grads = {self.weight: torch.bmm(scaled.transpose(1, 2), features)}  # [R, C, F]
        if self.has_bias:
            grads[self.bias] = scaled.sum(dim=1)
        return torch.cat([grads[n].reshape(R, -1) for n in self.model.names], dim=1)


def clipped_mean_gradients(model: FlatModel, module: nn.Module) -> ClippedMean:
    """The closed form when ``module`` is ``Sequential(Flatten, Linear)`` with nothing
    else trainable, else the ``vmap`` path."""
    layers = list(module.children()) if isinstance(module, nn.Sequential) else []
    if (
        len(layers) == 2
        and isinstance(layers[0], nn.Flatten)
        and isinstance(layers[1], nn.Linear)
        and len(model.names) == (2 if layers[1].bias is not None else 1)
    ):
        return SoftmaxRegressionClippedMean(model, layers[1])
    return VmapClippedMean(model, module)
