"""RSA and DP-RSA (Zhu and Ling): robust aggregation of *models* through an ℓ1 penalty.

Each worker ``k`` keeps its own model ``x_k``; the master keeps ``x_0``. Relaxing the
consensus constraint ``x_k = x_0`` with the penalty ``λ Σ_k ‖x_k - x_0‖₁`` gives
stochastic subgradient steps in which a worker sends the master only the element-wise
sign ``s_k = sign(x_0 - x_k)``:

    worker (Eq. 5):   x_k ← x_k - α (∇f_k(x_k) - λ s_k)
    master (Eq. 6-7): x_0 ← x_0 - α (∇f_0(x_0) + λ Σ_k s_k)

A Byzantine worker can only send some ±1 vector, so it moves each coordinate of ``x_0`` by
at most ``αλ`` per step, whatever it sends: the damage grows with the number of Byzantine
workers, not with the size of their messages. The master needs only the *sum* of the sign
vectors, so the messages can be summed by secure aggregation and ``x_0``'s update computed
from that sum alone (:meth:`RSAMaster.step` accepts either).

DP-RSA (Eq. 8-9, Algorithm 1) perturbs the regular workers' signs with a local randomiser
(sign flipping or sign-Gaussian, :mod:`sharefl.privacy`); the worker then uses the
perturbed sign it sent in its own step (the authors' code and analysis), and the master's
update is unchanged: it cannot tell noisy, honest and Byzantine signs apart anyway.

Defaults are the paper's experiments: ``α = 0.01``, ``λ = 0.01`` (MNIST; 0.002 for
CIFAR-10), ``f_0(x) = 0.002 ‖x‖²``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.robust.base import AggregationError, check_positive
from sharefl.sign import rsa_sign

__all__ = ["RSAMaster", "rsa_sign", "rsa_worker_step"]


@torch.no_grad()
def rsa_worker_step(
    xk: Tensor, grad: Tensor, message: Tensor, *, lr: float = 0.01, penalty: float = 0.01
) -> Tensor:
    """Worker update ``x_k - α (∇f_k(x_k) - λ s_k)`` with ``s_k`` the message it sent
    (``sign(x_0 - x_k)``, possibly perturbed). Returns a new tensor."""
    return xk - lr * (grad - penalty * message)


@dataclass(frozen=True, kw_only=True)
class RSAMaster:
    """The master's step of RSA / DP-RSA (Eq. 7, 11):

        x_0 ← x_0 - α (∇f_0(x_0) + λ Σ_k s_k),

    summing the messages of all workers, regular and Byzantine alike (it cannot tell them
    apart). ``f_0(x) = regularization · ‖x‖²`` unless ``regularizer_grad`` is given.

    Attributes:
        lr: step size α (0.01).
        penalty: λ (0.01 for MNIST, 0.002 for CIFAR-10 in the paper).
        regularization: the weight of ``f_0(x) = regularization · ‖x‖²`` (0.002).
        regularizer_grad: ``x_0 -> ∇f_0(x_0)``, replacing the quadratic ``f_0``.
    """

    lr: float = 0.01
    penalty: float = 0.01
    regularization: float = 0.002
    regularizer_grad: Callable[[Tensor], Tensor] | None = None

    def __post_init__(self) -> None:
        check_positive(self.lr, "lr")
        check_positive(self.penalty, "penalty")
        check_positive(self.regularization, "regularization", allow_zero=True)

    @torch.no_grad()
    def step(self, x0: Tensor, signs: Tensor) -> Tensor:
        """The new master model from the stacked messages ``[K, d]`` or their sum ``[d]``."""
        if signs.dim() == 2:
            signs = signs.sum(dim=0)
        if signs.shape != x0.shape:
            raise AggregationError(
                f"signs must have shape [K, {x0.numel()}] or [{x0.numel()}], "
                f"got {tuple(signs.shape)}"
            )
        if self.regularizer_grad is not None:
            reg = self.regularizer_grad(x0)
        else:
            reg = 2.0 * self.regularization * x0
        return x0 - self.lr * (reg + self.penalty * signs.to(x0.dtype))
