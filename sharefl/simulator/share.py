"""SHARE (seed001) in the federated loop: secure aggregation inside clusters, the robust
rule over the released cluster sums, the audit of every round's plan, Zeno++, and client
DP whose noise is split over each cluster.

:class:`ShareAggregation` is what the loop calls with a round's uploads. It

1. weights the uploads (``training.weighted``: client i uploads N·(n_i/n)·u_i, the
   paper's (n_i/n)-weighted Δ_i rescaled by the N participants so that their mean is the
   FedAvg step; :func:`delta_weights`);
2. without clusters (``cluster_size = 1``, the paper's "No SHARE") runs Zeno++ over the
   individual uploads; otherwise sums them inside clusters with the protocol
   (:func:`~sharefl.protocol.secure_sum`: the real protocol, or the identical ring sums in
   the clear with ``secure_aggregation.enabled = false``), with the clusterings of
   :class:`~sharefl.simulator.clustering_schedule.ClusterSchedule` (fixed or per round,
   safe or random planner), and records the protocol's audit of the plan;
3. aggregates: Zeno++ sums the accepted clusters (:mod:`~sharefl.simulator.cluster_zeno`);
   the other rules run over cluster means (:class:`~sharefl.robust.HierarchicalAggregator`
   with ``ClusterScale.MEAN``), and the R reclusterings are averaged;
4. with ``privacy.noise_split = "cluster"``, accounts every honest client's ε from the sums
   that were released (:class:`~sharefl.privacy.cluster_noise.ClusterPrivacyLedger`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sharefl.privacy.cluster_noise import ClusterNoiseSplit, ClusterPrivacyLedger
from sharefl.protocol import threshold_floor
from sharefl.robust import HierarchicalAggregator
from sharefl.simulator.cluster_sums import secure_cluster_sums
from sharefl.simulator.cluster_zeno import ClusterZeno
from sharefl.simulator.clustering_schedule import AuditLog, ClusterSchedule
from sharefl.simulator.config import RunConfig, SimulationConfigError


def delta_weights(sizes: Sequence[int]) -> Tensor:
    """N·n_i/n for every client (N clients, n = Σ n_i): 1 for equal shares."""
    counts = torch.as_tensor(list(sizes), dtype=torch.float64)
    if len(counts) == 0 or bool((counts <= 0).any()):
        raise SimulationConfigError("every client needs at least one example to weight its update")
    return (len(counts) * counts / counts.sum()).to(torch.float32)


MIN_SUM_SIZE = 3
"""The protocol's ``min_sum_size`` as the simulator runs it (:func:`secure_sum`'s default):
no sum of fewer clients is ever released."""


def min_releasing_survivors(cluster_size: int) -> int:
    """The fewest members whose inputs a released cluster sum can contain: the Shamir
    threshold (:func:`threshold_floor`, t > m/2) and the release check's ``min_sum_size``
    (3) both must be met, so s = min(m, max(threshold_floor(m), 3)): 3 for m = 3, 4 and 5,
    6 for m = 10."""
    return min(cluster_size, max(threshold_floor(cluster_size), MIN_SUM_SIZE))


def cluster_noise_split(run: RunConfig, noise_multiplier: float) -> ClusterNoiseSplit | None:
    """The noise split of ``privacy.noise_split = "cluster"`` (``None`` otherwise); the
    default s is :func:`min_releasing_survivors`: a cluster that loses members still
    carries the whole noise in any sum the protocol releases."""
    p, m = run.privacy, run.secure_aggregation.cluster_size
    if not (p.enabled and p.level == "client" and p.noise_split == "cluster"):
        return None
    survivors = p.min_survivors or min_releasing_survivors(m)
    if survivors > m:
        raise SimulationConfigError(
            f"privacy.min_survivors = {survivors} exceeds the cluster size {m}"
        )
    return ClusterNoiseSplit(p.clip, noise_multiplier, survivors)


@dataclass
class ShareAggregation:
    """The aggregation of one run (module docstring).

    Attributes:
        run: the configuration.
        rule: the hierarchical rule (``None`` with Zeno++).
        zeno: Zeno++ over cluster sums (``None`` otherwise).
        weights: per client id, N·n_i/n (``None``: unweighted uploads).
        ledger: per-client accounting of the cluster noise split (``None`` otherwise).
        schedule, audits: the clusterings and the audit verdicts.
    """

    run: RunConfig
    rule: HierarchicalAggregator | None
    zeno: ClusterZeno | None
    weights: Tensor | None
    ledger: ClusterPrivacyLedger | None
    schedule: ClusterSchedule
    audits: AuditLog
    last_clusterings: tuple = ()

    @classmethod
    def build(
        cls,
        run: RunConfig,
        *,
        rule: HierarchicalAggregator | None,
        zeno: ClusterZeno | None,
        client_sizes: Sequence[int],
        noise_split: ClusterNoiseSplit | None,
    ) -> ShareAggregation:
        if (rule is None) == (zeno is None):
            raise SimulationConfigError("SHARE needs exactly one of a hierarchical rule and Zeno++")
        if run.training.weighted and run.privacy.enabled and run.privacy.level == "client":
            raise SimulationConfigError(
                "training.weighted scales updates after the client-level clip, which would "
                "change their sensitivity: set training.weighted = false with privacy.level "
                '= "client"'
            )
        ledger = None
        if noise_split is not None:
            ledger = ClusterPrivacyLedger(
                noise_split, run.privacy.accountant, run.privacy.conversion
            )
        return cls(
            run=run,
            rule=rule,
            zeno=zeno,
            weights=delta_weights(client_sizes) if run.training.weighted else None,
            ledger=ledger,
            schedule=ClusterSchedule(run.secure_aggregation),
            audits=AuditLog(),
        )

    @property
    def clustered(self) -> bool:
        return self.run.secure_aggregation.cluster_size >= 2

    def weigh(self, uploads: Tensor, ids: Sequence[int]) -> Tensor:
        """The uploads of clients ``ids`` with their weights applied (a new tensor)."""
        if self.weights is None:
            return uploads
        w = self.weights[list(ids)].to(uploads.device, uploads.dtype)
        return uploads * w[:, None]

    def aggregate(
        self,
        uploads: Tensor,
        ids: Sequence[int],
        *,
        byzantine: set[int],
        w: Tensor,
        rng: np.random.Generator,
        round: int,
    ) -> Tensor:
        """The server's aggregate (a pseudo-gradient ``[d]``) of one round's uploads of
        clients ``ids`` (rows in that order); ``byzantine`` names the Byzantine ids."""
        uploads = self.weigh(uploads, ids)
        if not self.clustered:
            assert self.zeno is not None, "without clusters only Zeno++ runs here"
            flags = [[c in byzantine for c in ids]]
            return self.zeno.aggregate([uploads], w, len(ids), flags)
        released, members = self._secure_sums(uploads, ids, rng, round)
        if self.ledger is not None:
            honest = [c for c in ids if c not in byzantine]
            self.ledger.record_round([m for r in members for m in r], honest)
        if not released:  # every cluster failed: no update this round
            return torch.zeros_like(w)
        rounds = [torch.as_tensor(np.stack(sums)) for sums in released]
        if self.zeno is not None:
            flags = [[any(c in byzantine for c in m) for m in r] for r in members]
            return self.zeno.aggregate(rounds, w, len(ids), flags)
        assert self.rule is not None
        sizes = [[len(m) for m in r] for r in members]
        return self.rule.average(rounds, sizes).to(w.dtype).to(w.device)

    def _secure_sums(
        self, uploads: Tensor, ids: Sequence[int], rng: np.random.Generator, round: int
    ) -> tuple[list[list[np.ndarray]], list[list[tuple[int, ...]]]]:
        """Per reclustering with a released sum: the decoded sums and their members."""
        clusterings = self.schedule.clusterings(ids, rng)
        result = secure_cluster_sums(
            uploads,
            ids,
            self.run.secure_aggregation,
            rng,
            round,
            planner=self.schedule.planner,
            clusterings=clusterings,
        )
        self.audits.record(result.planned_audit)
        self.last_clusterings = result.plan.clusterings
        kept = [r for r in result.reclusterings if r.clusters]
        sums = [[s.float_sum for s in r.clusters] for r in kept]
        members = [[tuple(s.members) for s in r.clusters] for r in kept]
        return sums, members

    def epsilon(self, delta: float) -> float | None:
        """The worst client's ε under the cluster split (``None`` without it)."""
        if self.ledger is None or self.ledger.rounds == 0:
            return None
        eps = self.ledger.epsilons(delta)
        return max(eps.values()) if eps else None

    def summary(self, delta: float | None) -> dict[str, Any]:
        """JSON-ready results of the SHARE parts of the run."""
        out: dict[str, Any] = {"audit": self.audits.summary()}
        if self.zeno is not None:
            out.update(self.zeno.summary())
        if self.ledger is not None and delta:
            out["client_dp"] = {
                "share_std": self.ledger.split.share_std,
                "min_survivors": self.ledger.split.min_survivors,
                **self.ledger.summary(delta),
            }
        return out
