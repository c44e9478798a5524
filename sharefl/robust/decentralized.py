"""Robust neighbour aggregation for decentralized learning (Ye, Zhu and Ling, 2023).

Agent ``n`` combines its own (noisy) model ``x_n`` with the models ``x_m`` received from
its neighbours, some of which may be Byzantine. The rules take ``own`` (shape ``[d]``) and
``received`` (shape ``[k, d]``, one row per neighbour) and, for the weighted rules, the
neighbours' Metropolis-Hastings weights ``w'_nm`` (:func:`metropolis_hastings_weights` on
the full graph, Byzantine agents included, as in the authors' code); the own weight is
``w'_nn = 1 - Σ_m w'_nm``. Without weights every one of the ``k + 1`` models weighs
``1 / (k + 1)``.

* :class:`DecentralizedTrimmedMean` — Eq. (10): per coordinate, trim ``q`` largest and
  ``q`` smallest neighbour values, never the own value, and average the rest with it.
* :class:`SelfCenteredClipping` — Eq. (11): ``x_n + Σ_m w'_nm clip(x_m - x_n, τ)``.
* :class:`IOS` — Eq. (12), iterative outlier scissor: ``q`` times, drop the neighbour
  farthest from the current weighted mean; return the weighted mean of what is left.

The paper sets ``q`` to the number of Byzantine neighbours ``|B_n|`` and tunes SCC's
``τ`` (0.1 i.i.d., 0.3 non-i.i.d. on MNIST); Lemma 2's ``τ_n`` needs to know which
neighbours are Byzantine and is for analysis only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.robust._rows import row_sq_distances, weighted_sum
from sharefl.robust.base import (
    AggregationError,
    check_matrix,
    check_nonnegative_int,
    check_positive,
    check_vector,
    compute_dtype,
)
from sharefl.robust.clipping import clip_factors
from sharefl.robust.coordinate import TrimmedMean


def metropolis_hastings_weights(adjacency: Tensor) -> Tensor:
    """Metropolis-Hastings mixing weights of an undirected graph (float64 ``[N, N]``):
    ``w_nm = 1 / max(deg_n + 1, deg_m + 1)`` on edges, ``w_nn = 1 - Σ_{m≠n} w_nm``.

    ``adjacency`` is a symmetric boolean (or 0/1) ``[N, N]`` matrix; its diagonal is
    ignored. The result is symmetric and doubly stochastic.
    """
    A = torch.as_tensor(adjacency).to(torch.bool)
    if A.dim() != 2 or A.shape[0] != A.shape[1]:
        raise AggregationError(f"adjacency must be square, got shape {tuple(A.shape)}")
    A = A & ~torch.eye(A.shape[0], dtype=torch.bool, device=A.device)
    if not bool((A == A.T).all()):
        raise AggregationError("adjacency must be symmetric (an undirected graph)")
    degree = A.sum(dim=1).to(torch.float64)
    W = torch.where(A, 1.0 / torch.maximum(degree[:, None], degree[None, :]).add(1.0), 0.0)
    W.diagonal().copy_(1.0 - W.sum(dim=1))
    return W


def _check_neighbourhood(own: Tensor, received: Tensor) -> tuple[Tensor, Tensor]:
    received = check_matrix(received, name="received")
    own = check_vector(own, received.shape[1], received, name="own")
    return own, received


def _neighbour_weights(weights: Tensor | None, k: int, like: Tensor) -> Tensor:
    """Neighbour weights as float64 ``[k]`` (uniform ``1/(k+1)`` if ``None``)."""
    if weights is None:
        return torch.full((k,), 1.0 / (k + 1), dtype=torch.float64, device=like.device)
    w = torch.as_tensor(weights).to(device=like.device, dtype=torch.float64)
    if w.shape != (k,) or not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise AggregationError(f"weights must be {k} finite non-negative neighbour weights")
    if float(w.sum()) > 1 + 1e-9:
        raise AggregationError("neighbour weights must sum to at most 1 (the rest is own)")
    return w


@dataclass(frozen=True, kw_only=True)
class DecentralizedTrimmedMean:
    """Eq. (10): for each coordinate, drop the ``q`` largest and ``q`` smallest values
    among the ``k`` neighbours (the own value is never dropped) and average the
    ``k - 2q`` kept values together with the own value: ``(Σ kept + x_n) / (k - 2q + 1)``.

    Needs ``k >= 2q`` received models (raises
    :class:`~sharefl.robust.base.AggregationError`); ``k = 2q`` returns the own model.
    With at most ``q`` arbitrary neighbours the result stays, per coordinate, within the
    range of the honest neighbours' and own values.
    """

    q: int

    def __post_init__(self) -> None:
        check_nonnegative_int(self.q, "q")

    @torch.no_grad()
    def __call__(self, own: Tensor, received: Tensor) -> Tensor:
        """Aggregate ``own`` (``[d]``) with the ``received`` models (``[k, d]``)."""
        own, received = _check_neighbourhood(own, received)
        k = received.shape[0]
        if k < 2 * self.q:
            raise AggregationError(
                f"DecentralizedTrimmedMean(q={self.q}) needs at least 2q = {2 * self.q} "
                f"received models, got {k}: lower q to at most {k // 2}"
            )
        kept = k - 2 * self.q
        if kept == 0:
            return own.clone()
        work = compute_dtype(own.dtype)
        trimmed_sum = TrimmedMean(f=self.q)(received).to(work) * kept
        return ((trimmed_sum + own.to(work)) / (kept + 1)).to(own.dtype)


@dataclass(frozen=True, kw_only=True)
class SelfCenteredClipping:
    """SCC, Eq. (11): ``x_n + Σ_m w'_nm clip(x_m - x_n, τ)`` over the neighbours, with
    ``clip(z, τ) = z min(1, τ/‖z‖)``; a neighbour at a non-finite distance contributes 0.

    Each arbitrary neighbour moves the result by at most ``w'_nm τ``. The default is the
    paper's tuned ``τ = 0.1`` (MNIST, i.i.d.; 0.3 non-i.i.d.).
    """

    tau: float = 0.1

    def __post_init__(self) -> None:
        check_positive(self.tau, "tau")

    @torch.no_grad()
    def __call__(self, own: Tensor, received: Tensor, weights: Tensor | None = None) -> Tensor:
        """Aggregate ``own`` with ``received`` (``[k, d]``), neighbour weights ``[k]``."""
        own, received = _check_neighbourhood(own, received)
        k = received.shape[0]
        w = _neighbour_weights(weights, k, received)
        sq_distances = row_sq_distances(received, own)
        pull = w * clip_factors(sq_distances, self.tau)  # 0 for non-finite neighbours
        work = compute_dtype(own.dtype)
        out = own.to(work) * (1.0 - float(pull.sum()))
        out += weighted_sum(received, pull)
        return out.to(own.dtype)


@dataclass(frozen=True, kw_only=True)
class IOS:
    """Iterative outlier scissor, Eq. (12): with ``U`` = the neighbours and the agent
    itself, weighted by ``w'``, repeat ``q`` times: compute the weighted mean of ``U`` and
    remove from ``U`` the neighbour farthest from it (never the agent itself); return the
    weighted mean of ``U``. Non-finite neighbours are the farthest; ties go to the lower
    neighbour index.

    Needs ``q <= k`` (raises :class:`~sharefl.robust.base.AggregationError`). The paper
    sets ``q = |B_n|``; with Metropolis-Hastings weights its virtual mixing matrix is
    doubly stochastic, the reason IOS trades privacy noise for robustness best.
    """

    q: int

    def __post_init__(self) -> None:
        check_nonnegative_int(self.q, "q")

    @torch.no_grad()
    def __call__(self, own: Tensor, received: Tensor, weights: Tensor | None = None) -> Tensor:
        """Aggregate ``own`` with ``received`` (``[k, d]``), neighbour weights ``[k]``."""
        own, received = _check_neighbourhood(own, received)
        k = received.shape[0]
        if self.q > k:
            raise AggregationError(
                f"IOS(q={self.q}) removes q of the {k} received models: lower q to at most {k}"
            )
        w = _neighbour_weights(weights, k, received)
        models = torch.cat([own[None], received])  # row 0 is the agent itself
        weight = torch.cat([(1.0 - w.sum()).clamp_min(0.0)[None], w])
        members = torch.arange(k + 1, device=received.device)
        finite = torch.isfinite(row_sq_distances(models))
        for _ in range(self.q):
            outliers = torch.nonzero(~finite[members[1:]]).flatten()
            if outliers.numel():  # a non-finite neighbour is the farthest from any mean
                drop = int(outliers[0])
            else:
                mean = self._weighted_mean(models, members, weight)
                dist = row_sq_distances(models, mean)[members[1:]]
                drop = int(torch.argmax(dist))  # the first maximum: ties go to the lower index
            members = torch.cat([members[: drop + 1], members[drop + 2 :]])
        return self._weighted_mean(models, members, weight).to(own.dtype)

    @staticmethod
    def _weighted_mean(models: Tensor, members: Tensor, weight: Tensor) -> Tensor:
        w = weight[members]
        total = float(w.sum())
        if total <= 0:  # every remaining neighbour has weight 0: fall back to uniform
            w, total = torch.ones_like(w), float(members.numel())
        weights = torch.zeros(models.shape[0], dtype=torch.float64, device=models.device)
        weights[members] = w / total
        return weighted_sum(models, weights)


# ---------------------------------------------------------------------------------------------
# Batched over receiving agents
#
# The decentralized loop aggregates for every honest agent at once. ``own`` is ``[R, d]``
# (row r: agent r's own noisy model), ``received`` is ``[R, N, d]`` (row r, slot m: what
# agent m sent to agent r; slots of non-neighbours are ignored), ``weights`` is ``[R, N]``
# (w'_rm on neighbours, 0 elsewhere; the own weight is 1 − Σ_m w'_rm), ``mask`` is ``[R, N]``
# boolean (the neighbours) and ``q`` is ``[R]`` (each receiver's trimming count). Each
# function computes, row by row, what its per-agent rule above computes; the messages must
# be finite (the per-agent rules also handle non-finite ones).


def _check_batch(own: Tensor, received: Tensor, mask: Tensor) -> None:
    if received.dim() != 3 or own.shape != (received.shape[0], received.shape[2]):
        raise AggregationError(
            f"own must be [R, d] and received [R, N, d], got {tuple(own.shape)} and "
            f"{tuple(received.shape)}"
        )
    if mask.shape != received.shape[:2]:
        raise AggregationError(f"mask must be [R, N] = {tuple(received.shape[:2])}")


def _finite(out: Tensor) -> Tensor:
    """``out``, or :class:`AggregationError` when a message was not finite (checked on the
    ``[R, d]`` result: a non-finite message always reaches it here)."""
    if not bool(torch.isfinite(out).all()):
        raise AggregationError("the batched rules need finite messages")
    return out


def _sq_distances(models: Tensor, sq_norms: Tensor, point: Tensor) -> Tensor:
    """``[R, K]`` squared distances from each ``models[r, k]`` to ``point[r]``, from the
    precomputed ``sq_norms`` = ‖models[r, k]‖² (no ``[R, K, d]`` temporary)."""
    cross = torch.einsum("rkd,rd->rk", models, point)
    return (sq_norms - 2 * cross + (point * point).sum(dim=1, keepdim=True)).clamp_min(0.0)


def batched_weighted_mean(own: Tensor, received: Tensor, weights: Tensor) -> Tensor:
    """DSGD's mixing: ``(1 − Σ_m w_rm) own_r + Σ_m w_rm received_rm`` for every row r."""
    _check_batch(own, received, weights != 0)
    w = weights.to(own.dtype)
    mixed = own * (1.0 - w.sum(dim=1, keepdim=True)) + torch.einsum("rn,rnd->rd", w, received)
    return _finite(mixed)


def batched_trimmed_mean(own: Tensor, received: Tensor, mask: Tensor, q: Tensor) -> Tensor:
    """:class:`DecentralizedTrimmedMean` of every row: per coordinate, drop the ``q_r``
    largest and ``q_r`` smallest neighbour values and average the rest with the own value.

    Raises:
        AggregationError: a row with fewer than ``2 q_r`` neighbours.
    """
    _check_batch(own, received, mask)
    k = mask.sum(dim=1)
    if bool((k < 2 * q).any()):
        raise AggregationError("every receiver needs at least 2q neighbours: lower q")
    values = torch.where(mask[:, :, None], received, torch.inf)
    ordered = torch.sort(values, dim=1).values  # the k_r valid values come first
    slot = torch.arange(received.shape[1], device=received.device)[None, :]
    keep = (slot >= q[:, None]) & (slot < (k - q)[:, None])  # [R, N]
    kept_sum = torch.where(keep[:, :, None], ordered, 0.0).sum(dim=1)
    count = (k - 2 * q + 1).to(own.dtype)[:, None]
    return _finite((kept_sum + own) / count)


def batched_self_centered_clipping(
    own: Tensor, received: Tensor, weights: Tensor, tau: float
) -> Tensor:
    """:class:`SelfCenteredClipping` of every row: ``own_r + Σ_m w_rm clip(received_rm −
    own_r, τ)``."""
    check_positive(tau, "tau")
    _check_batch(own, received, weights != 0)
    sq_norms = torch.einsum("rnd,rnd->rn", received, received)
    norms = _sq_distances(received, sq_norms, own).sqrt()
    factor = (tau / norms.clamp_min(1e-300)).clamp_max(1.0)
    pull = weights.to(own.dtype) * factor
    out = own * (1.0 - pull.sum(dim=1, keepdim=True)) + torch.einsum("rn,rnd->rd", pull, received)
    return _finite(out)


def batched_ios(own: Tensor, received: Tensor, weights: Tensor, mask: Tensor, q: Tensor) -> Tensor:
    """:class:`IOS` of every row: ``q_r`` times, drop the neighbour farthest from the
    weighted mean of what is left (ties to the lower slot); return that weighted mean.

    Raises:
        AggregationError: a row with ``q_r`` larger than its number of neighbours.
    """
    _check_batch(own, received, mask)
    if bool((q > mask.sum(dim=1)).any()):
        raise AggregationError("IOS removes q of the received models: lower q")
    R = own.shape[0]
    models = torch.cat([own[:, None, :], received], dim=1)  # slot 0 is the agent itself
    w = weights.to(own.dtype)
    weight = torch.cat([(1.0 - w.sum(dim=1, keepdim=True)).clamp_min(0.0), w], dim=1)
    members = torch.cat([torch.ones(R, 1, dtype=torch.bool, device=mask.device), mask], dim=1)
    rows = torch.arange(R, device=own.device)

    def mean() -> Tensor:
        mw = torch.where(members, weight, 0.0)
        return torch.einsum("rn,rnd->rd", mw, models) / mw.sum(dim=1, keepdim=True)

    sq_norms = torch.einsum("rnd,rnd->rn", models, models)
    for t in range(int(q.max()) if q.numel() else 0):
        dist = _sq_distances(models, sq_norms, mean())
        candidates = members.clone()
        candidates[:, 0] = False
        drop = torch.argmax(torch.where(candidates, dist, -1.0), dim=1)
        active = t < q
        members[rows[active], drop[active]] = False
    return _finite(mean())
