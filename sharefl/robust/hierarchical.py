"""SHARE's hierarchical aggregation: a robust rule over secure cluster sums.

In each reclustering round the protocol reveals only the sum ``g_j = Σ_{i ∈ M_j} Δ_i`` of
each cluster ``M_j`` (about ``m`` clients, ``c`` clusters); a robust rule combines the
``c`` sums, and the ``R`` rounds of one global step are averaged (Algorithm 1):

    g^r = RobustAggr({g_j^r}),        x^t = x^{t-1} + η · (1/R) Σ_r g^r.

Scale convention (:class:`ClusterScale`), chosen explicitly because a robust rule returns
one candidate's scale while the average of the sums does not:

* ``TOTAL`` (SHARE's own): the result estimates the *sum* of all clients' updates, i.e.
  FedAvg when clients upload ``(n_i/n)``-weighted deltas (Lemma 1). A rule that returns
  one input's scale (median, trimmed mean, Krum...) is applied to the cluster sums and
  multiplied by the number of clusters ``c``; Zeno++, which sums the clusters it accepts,
  is used as is. With :class:`~sharefl.robust.coordinate.Mean` this is exactly the sum.
* ``MEAN``: the result estimates the *mean* client update. Each cluster sum is divided by
  its size first (sizes differ when clients drop out), and rules that take weights
  (Mean, GeometricMedian) weight the cluster means by the cluster sizes, so Mean gives
  exactly ``Σ_i Δ_i / n``; Zeno++'s sum is divided by the number of clients.

Tolerance (Lemma 2): clustering lets one Byzantine client corrupt its whole cluster, so a
rule that tolerates ``q0`` arbitrary inputs among the ``n`` individual updates tolerates
only ``q = q0 / m`` Byzantine clients (:func:`share_tolerance`); equivalently, a rule
configured with ``f`` over the cluster sums tolerates ``f`` Byzantine clients
(:attr:`HierarchicalAggregator.tolerance`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sharefl.robust.base import AggregationError, Aggregator, check_matrix
from sharefl.robust.preagg import Pipeline
from sharefl.robust.zeno import ZenoPlusPlus


class ClusterScale(enum.StrEnum):
    """What the hierarchical result estimates: the total update or the mean update."""

    TOTAL = "total"
    MEAN = "mean"


def share_tolerance(q0: float, cluster_size: int) -> float:
    """SHARE's Lemma 2: ``q = q0 / m`` Byzantine clients are tolerated with clusters of
    ``m`` clients when the rule tolerates ``q0`` arbitrary inputs out of the ``n``
    individual updates (worst case: every Byzantine client is in a different cluster).

    Example from the paper: a rule tolerating ``q0 = 40`` of 60 inputs with ``m = 3``
    tolerates 13.3 clients. Configure the rule over the ``c = n/m`` cluster sums with
    ``f = floor(q0 / m)``.
    """
    if cluster_size < 1:
        raise AggregationError(f"cluster_size must be at least 1, got {cluster_size}")
    if q0 < 0:
        raise AggregationError(f"q0 must be non-negative, got {q0}")
    return q0 / cluster_size


def prob_always_with_byzantine(n: int, q: int, m: int, rounds: int) -> float:
    """Probability that a given honest client shares its cluster with at least one of the
    ``q`` Byzantine clients in every one of ``rounds`` independent random clusterings of
    ``n`` clients into clusters of ``m``: ``(1 - C(n-1-q, m-1) / C(n-1, m-1))^R``.

    (SHARE's Appendix E prints ``c - 1`` where ``m - 1`` belongs; this is the corrected
    hypergeometric form, e.g. 0.368 per round for n = 60, q = 12, m = 3.)
    """
    if not 0 <= q < n or not 1 <= m <= n or rounds < 0:
        raise AggregationError("need 0 <= q < n, 1 <= m <= n and rounds >= 0")
    clean = math.comb(n - 1 - q, m - 1) / math.comb(n - 1, m - 1)
    return (1.0 - clean) ** rounds


ClusterRule = Aggregator | Pipeline | ZenoPlusPlus


def _sizes(sizes: Sequence[float] | Tensor | None, c: int, like: Tensor) -> Tensor:
    if sizes is None:
        raise AggregationError(
            "the MEAN scale needs the cluster sizes (len(members) of each cluster sum)"
        )
    s = torch.as_tensor(sizes, dtype=torch.float64).to(like.device)
    if s.shape != (c,) or not bool((s >= 1).all()):
        raise AggregationError(f"sizes must be {c} positive client counts, got {sizes!r}")
    return s


@dataclass(frozen=True, kw_only=True)
class HierarchicalAggregator:
    """A robust rule applied to cluster sums, with an explicit scale convention.

    Attributes:
        rule: an :class:`~sharefl.robust.base.Aggregator` whose ``f`` counts corrupted
            *clusters*, a :class:`~sharefl.robust.preagg.Pipeline` (pre-aggregators over
            the cluster means, then its aggregator; no weights), or
            :class:`~sharefl.robust.zeno.ZenoPlusPlus`.
        scale: :class:`ClusterScale` (``TOTAL`` by default, as in SHARE).

    Call with the ``[c, d]`` cluster sums of one reclustering round, the cluster sizes
    (needed for ``MEAN``) and the rule's extra inputs (Zeno++'s ``validation_grad``);
    :meth:`average` runs Algorithm 1's average over the ``R`` rounds of a global step.
    """

    rule: ClusterRule
    scale: ClusterScale = ClusterScale.TOTAL

    def __post_init__(self) -> None:
        if not isinstance(self.rule, Aggregator | Pipeline | ZenoPlusPlus):
            raise AggregationError(
                "rule must be an Aggregator, a Pipeline or ZenoPlusPlus, got "
                f"{type(self.rule).__name__}"
            )
        object.__setattr__(self, "scale", ClusterScale(self.scale))

    @property
    def tolerance(self) -> int | None:
        """Byzantine clients tolerated in the worst case (Lemma 2): the rule's ``f`` over
        clusters; ``None`` for Zeno++, which tolerates any number of bad clusters."""
        if isinstance(self.rule, ZenoPlusPlus):
            return None
        return self.rule.aggregator.f if isinstance(self.rule, Pipeline) else self.rule.f

    @torch.no_grad()
    def __call__(
        self, sums: Tensor, sizes: Sequence[float] | Tensor | None = None, **rule_inputs: Any
    ) -> Tensor:
        """Aggregate one round's cluster sums (shape ``[c, d]``) into one vector ``[d]``."""
        sums = check_matrix(sums, name="sums")
        c = sums.shape[0]
        if isinstance(self.rule, ZenoPlusPlus):
            total = self.rule(sums, **rule_inputs)
            if self.scale is ClusterScale.TOTAL:
                return total
            return (total / _sizes(sizes, c, sums).sum()).to(sums.dtype)
        if self.scale is ClusterScale.TOTAL:
            return self.rule(sums, **rule_inputs) * c
        s = _sizes(sizes, c, sums)
        means = (sums / s.to(sums.dtype)[:, None]).to(sums.dtype)
        # a Pipeline's pre-aggregators make other rows than the clusters: no weights then
        if isinstance(self.rule, Aggregator) and self.rule.accepts_weights:
            weighted: Callable[..., Tensor] = self.rule  # a rule that takes weights=
            return weighted(means, weights=s, **rule_inputs)
        return self.rule(means, **rule_inputs)

    @torch.no_grad()
    def average(
        self,
        rounds: Sequence[Tensor],
        sizes: Sequence[Sequence[float] | Tensor | None] | None = None,
        **rule_inputs: Any,
    ) -> Tensor:
        """Algorithm 1's ``(1/R) Σ_r g^r`` over the reclustering rounds of one global step.

        ``rounds[r]`` holds round r's cluster sums, ``sizes[r]`` their sizes. A callable
        ``validation_grad`` is called again in every round, as Algorithm 2 draws a fresh
        validation batch per reclustering.

        A round whose sums the rule refuses (fewer than its ``f`` needs, once drop-outs
        failed clusters) is left out, and the others are averaged: leaving released sums
        unused costs progress only, whereas a weaker rule over them would let the spoiled
        clusters through.

        Raises:
            AggregationError: no rounds, mismatched sizes, or the rule refused every round
                (the message gives each distinct reason).
        """
        if not rounds:
            raise AggregationError("average needs at least one reclustering round")
        if sizes is not None and len(sizes) != len(rounds):
            raise AggregationError(f"got {len(rounds)} rounds but {len(sizes)} size lists")
        total: Tensor | None = None
        refused: list[str] = []
        for r, sums in enumerate(rounds):
            try:
                g = self(sums, None if sizes is None else sizes[r], **rule_inputs)
            except AggregationError as exc:
                refused.append(str(exc))
                continue
            total = g.clone() if total is None else total.add_(g)
        if total is None:
            reasons = "; ".join(dict.fromkeys(refused))  # each distinct reason once, in order
            raise AggregationError(f"the rule refused the sums of every reclustering: {reasons}")
        return total / (len(rounds) - len(refused))

    def aggregate_released(
        self, released: Sequence[Sequence[tuple[Tensor | np.ndarray, float]]], **rule_inputs: Any
    ) -> Tensor:
        """The aggregate of the sums a secure round released: ``released[r]`` holds
        reclustering r's ``(cluster sum [d], members)`` pairs; the rule runs over each
        reclustering's sums (:meth:`__call__`) and the reclusterings that released something
        it takes are averaged (:meth:`average`). This is what every transport does with a
        round.

        Raises:
            AggregationError: nothing was released, or the rule refused every
                reclustering's sums (too few for its ``f``...): the round cannot move the
                model, and a transport keeps it unchanged.
        """
        kept = [sums for sums in released if sums]
        rounds = [torch.stack([torch.as_tensor(s) for s, _ in sums]) for sums in kept]
        sizes = [[n for _, n in sums] for sums in kept]
        return self.average(rounds, sizes, **rule_inputs)

    def check_clusters(self, clusters: int) -> None:
        """Raise :class:`AggregationError` when the rule cannot aggregate ``clusters`` cluster
        sums (``f`` too large for them...): it runs once over zero sums of 2 members."""
        self(torch.zeros(clusters, 2, dtype=torch.float64), [2] * clusters)
