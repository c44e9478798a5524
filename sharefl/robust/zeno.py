"""Zeno++ as adapted to federated cluster sums by SHARE (Velicheti et al., Algorithm 2).

The server holds a small validation set and computes the gradient ``∇f_s(x)`` of its loss
at the current model ``x`` (a fresh batch for every reclustering round). A candidate
update ``g`` (a model *delta*: the clients' new model minus ``x``, so a good one points
against the gradient) is scored

    Score(g) = -η <∇f_s(x), g> - ρ ‖g‖²

and accepted when ``Score(g) >= -η ε``. The accepted candidates are **summed** (not
averaged): with cluster sums as candidates and every cluster accepted, the sum is the
FedAvg total (SHARE's Lemma 1). No candidate accepted gives the zero vector.

SHARE's defaults (Appendix D, CIFAR-10): ``ρ = 1e-4, ε = 0.2`` (Figure 5: ``ρ = 1e-5``;
Figures 8-9: ``ρ = 1e-5, ε = 1``), with η the server learning rate. This follows SHARE's
Definition B.2; the asynchronous Zeno++ of Xie et al. (2020) also rescales candidates,
which SHARE does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.robust._rows import row_dots, row_sq_distances, weighted_sum
from sharefl.robust.base import check_matrix, check_positive, check_vector

#: the validation gradient, or a function that computes a fresh one at the current model
ValidationGradient = Tensor | Callable[[], Tensor]


@dataclass(frozen=True, kw_only=True)
class ZenoPlusPlus:
    """Zeno++ filter over candidate updates (rows of ``X``); see the module docstring.

    Attributes:
        lr: the server learning rate η in the score.
        rho: the weight ρ of the squared norm.
        epsilon: the threshold ε (accept when ``Score >= -lr * epsilon``).

    Tolerates any number of arbitrary candidates (it needs no ``f``): a candidate passes
    only if it does not increase the validation loss's first-order estimate by more than
    ``ε``. Non-finite candidates are rejected.
    """

    lr: float = 1.0
    rho: float = 1e-4
    epsilon: float = 0.2

    def __post_init__(self) -> None:
        check_positive(self.lr, "lr")
        check_positive(self.rho, "rho", allow_zero=True)
        check_positive(self.epsilon, "epsilon", allow_zero=True)

    def _scores(self, X: Tensor, validation_grad: ValidationGradient) -> tuple[Tensor, Tensor]:
        X = check_matrix(X)
        grad = validation_grad() if callable(validation_grad) else validation_grad
        grad = check_vector(grad, X.shape[1], X, name="validation_grad")
        sq_norms = row_sq_distances(X)
        scores = -self.lr * row_dots(X, grad) - self.rho * sq_norms
        return torch.where(torch.isfinite(sq_norms), scores, float("nan")), sq_norms

    def scores(self, X: Tensor, validation_grad: ValidationGradient) -> Tensor:
        """``-η <∇f_s, g_i> - ρ ‖g_i‖²`` for every row (float64, ``[n]``; NaN if non-finite)."""
        return self._scores(X, validation_grad)[0]

    def accepted(self, X: Tensor, validation_grad: ValidationGradient) -> Tensor:
        """Boolean mask ``[n]`` of the rows whose score is at least ``-lr * epsilon``."""
        return self.scores(X, validation_grad) >= -self.lr * self.epsilon

    @torch.no_grad()
    def __call__(self, X: Tensor, validation_grad: ValidationGradient) -> Tensor:
        """The sum of the accepted rows of ``X`` (zero if none), in ``X``'s dtype."""
        scores, _ = self._scores(X, validation_grad)
        accepted = scores >= -self.lr * self.epsilon
        if not bool(accepted.any()):
            return X.new_zeros(X.shape[1])
        return weighted_sum(X, accepted.to(torch.float64)).to(X.dtype)
