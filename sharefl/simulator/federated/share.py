"""SHARE (Velicheti et al.) in the federated loop: secure aggregation inside clusters, the robust
rule over the released cluster sums, the audit of every round's plan, Zeno++, and client
DP whose noise is split over each cluster.

:class:`ShareAggregation` is what the loop calls with a round's uploads (steps 1–4), or
with the sums a deployment's protocol released (:meth:`ShareAggregation.aggregate_released`,
steps 3–4, the same code). It

1. weights the uploads (``training.weighted``: client i uploads N·(n_i/n)·u_i, the
   paper's (n_i/n)-weighted Δ_i rescaled by the N participants so that their mean is the
   FedAvg step; :func:`delta_weights`);
2. without clusters (``cluster_size = 1``, the paper's "No SHARE") runs Zeno++ over the
   individual uploads; otherwise sums them inside clusters with the protocol
   (:func:`~sharefl.protocol.secure_sum` with the run's settings as parsed: the real
   protocol, or the identical ring sums in the clear with ``secure_aggregation.enabled =
   false``), with the clusterings of
   :class:`~sharefl.simulator.federated.clustering_schedule.ClusterSchedule` (fixed or per round,
   safe or random planner), and records the protocol's audit of the plan;
3. aggregates: Zeno++ sums the accepted clusters (:mod:`~sharefl.simulator.federated.cluster_zeno`);
   the other rules run over cluster means (:class:`~sharefl.robust.HierarchicalAggregator`
   with ``ClusterScale.MEAN``), and the R reclusterings are averaged;
4. with ``privacy.noise_split = "cluster"``, accounts every honest client's ε from the sums
   that were released (:class:`~sharefl.privacy.cluster_noise.ClusterPrivacyLedger`); with
   ``privacy.distributed = "discrete_gaussian"`` or ``"skellam"`` the clients' step before
   masking is :class:`~sharefl.privacy.distributed.DistributedEncoder`'s (rotation,
   conditional rounding, discrete noise, mod 2^b), the protocol sums the ring vectors, and
   each honest client is accounted by the mechanism of its cell
   (:func:`~sharefl.privacy.distributed_accounting.released_cells`) with
   :class:`~sharefl.privacy.distributed_accounting.DistributedDPLedger`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sharefl.privacy.cluster_noise import ClusterNoiseSplit, ClusterPrivacyLedger
from sharefl.privacy.distributed import (
    DistributedDPConfig,
    DistributedEncoder,
    DistributedMechanism,
    Rotation,
    calibrate_distributed,
)
from sharefl.privacy.distributed_accounting import DistributedDPLedger, cell_noise_adders
from sharefl.privacy.secure_random import SecureRandom
from sharefl.protocol.client import min_released_members
from sharefl.protocol.driver import secure_sum
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.settings import DEFAULTS, KeySetup
from sharefl.robust import AggregationError, HierarchicalAggregator
from sharefl.rounds.released import Released
from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.federated.cluster_zeno import ClusterZeno
from sharefl.simulator.federated.clustering_schedule import AuditLog, ClusterSchedule


def delta_weights(sizes: Sequence[int]) -> Tensor:
    """N·n_i/n for every client (N clients, n = Σ n_i): 1 for equal shares."""
    counts = torch.as_tensor(list(sizes), dtype=torch.float64)
    if len(counts) == 0 or bool((counts <= 0).any()):
        raise SimulationConfigError("every client needs at least one example to weight its update")
    return (len(counts) * counts / counts.sum()).to(torch.float32)


def weigh(uploads: Tensor, weights: Tensor | None, ids: Sequence[int]) -> Tensor:
    """The uploads ``[K, d]`` of clients ``ids`` times their weights (:func:`delta_weights`,
    a new tensor); ``uploads`` itself without weights. The one weighing of the in-process
    round (:meth:`ShareAggregation.weigh`) and of a client process
    (:class:`~sharefl.simulator.federated.client.ClientPart`)."""
    if weights is None:
        return uploads
    w = weights[list(ids)].to(uploads.device, uploads.dtype)
    return uploads * w[:, None]


MIN_SUM_SIZE = DEFAULTS.min_sum_size
"""The default of ``secure_aggregation.min_sum_size`` (:class:`~sharefl.protocol.settings.
SecureAggregationSettings`); a run takes its own from its settings (:func:`split_survivors`,
the schedule and the protocol all read ``run.secure_aggregation.min_sum_size``)."""


def cluster_noise_split(run: RunConfig, noise_multiplier: float) -> ClusterNoiseSplit | None:
    """The noise split of ``privacy.noise_split = "cluster"`` (``None`` otherwise); the
    default s is :func:`~sharefl.protocol.client.min_released_members`: a cluster that
    loses members still carries the whole noise in any sum the protocol releases; t is
    :attr:`~sharefl.simulator.config.RunConfig.noise_colluders` (the protocol's colluder
    bound unless ``privacy.colluders`` is set)."""
    p = run.privacy
    if not (p.enabled and p.level == "client" and p.noise_split == "cluster"):
        return None
    if p.distributed != "gaussian":
        return None
    return ClusterNoiseSplit(p.clip, noise_multiplier, split_survivors(run), run.noise_colluders)


#: Standard deviations of one member's noise share the float encoding must carry unclipped.
SHARE_TAIL_STDDEVS = 7.0


def check_encoding_keeps_the_noise(run: RunConfig, split: ClusterNoiseSplit) -> None:
    """Refuse a float encoding that would clip the members' noisy shares.

    The cluster split's guarantee is that of the *sum* Σ(x_i + z_i) of the members' shares:
    each share alone carries only 1/(s − t) of the noise variance. The float encoding clips
    every coordinate to ``secure_aggregation.clip`` before summing, and a clipped share
    clip(x_i + z_i) is a function of that one member's weakly noised value, so the
    released sum is no longer the Gaussian mechanism the ledger accounts (in the worst case
    a client keeps only its own share's protection). So the encoding must carry
    ``C + 7·share_std`` (a coordinate exceeds it with probability about 10⁻¹², once in a
    run of 10⁵ clients × 10⁶ coordinates). Raises :class:`SimulationConfigError` naming the
    value to set. The discrete mechanisms need no such check: they add the noise in the ring
    after rounding, and reduce mod 2^b, which commutes with the sum."""
    if not run.secure_aggregation.cluster_size >= 2:
        return
    needed = split.clip_norm + SHARE_TAIL_STDDEVS * split.share_std
    clip = run.secure_aggregation.clip  # None: no float encoding at all
    if clip is None or clip < needed:
        shown = "none" if clip is None else f"{clip:g}"
        raise SimulationConfigError(
            f"secure_aggregation.clip = {shown} would clip the "
            f"members' noisy shares (one share's noise has std {split.share_std:.3g}), and a "
            "sum of clipped shares is not the Gaussian mechanism the accounting assumes: set "
            f"secure_aggregation.clip >= {needed:.3g}, or add the noise in the ring with "
            'privacy.distributed = "discrete_gaussian" or "skellam"'
        )


def split_survivors(run: RunConfig) -> int:
    """s of the cluster split: ``privacy.min_survivors`` or the fewest members a released
    sum can hold (:func:`~sharefl.protocol.client.min_released_members`)."""
    m, least = run.secure_aggregation.cluster_size, run.secure_aggregation.min_sum_size
    survivors = run.privacy.min_survivors or min_released_members(m, least)
    if survivors > m:
        raise SimulationConfigError(
            f"privacy.min_survivors = {survivors} exceeds the cluster size {m}"
        )
    colluders = run.noise_colluders
    if not colluders < survivors:
        source = (
            f"privacy.colluders = {colluders}"
            if run.privacy.colluders is not None
            else f"the protocol's colluder bound ({colluders}, which privacy.colluders takes "
            "when it is omitted)"
        )
        raise SimulationConfigError(
            f"{source} must be below the {survivors} members a released sum holds "
            "(privacy.min_survivors): a sum needs one honest share; set privacy.colluders "
            "lower or privacy.min_survivors higher"
        )
    return survivors


def distributed_encoder(
    run: RunConfig,
    noise_multiplier: float,
    dim: int,
    *,
    target: tuple[float, float] | None = None,
) -> DistributedEncoder | None:
    """The discrete pipeline of ``privacy.distributed`` = ``"discrete_gaussian"`` or
    ``"skellam"`` for updates of ``dim`` values (``None`` otherwise): the cluster split's s,
    the cluster size as the most summands, ``privacy.bits`` and ``privacy.rotation``, σ =
    ``noise_multiplier``; or, with ``target = (ε, δ)``, σ calibrated by the discrete
    mechanism's own accounting for the smallest cell a client can be charged in each of
    the run's rounds (:func:`~sharefl.privacy.distributed.calibrate_distributed`; raises
    its ``CalibrationError`` when the ring is too narrow for ε): s members with one
    clustering; with R > 1 overlapping reclusterings a cell can be one client
    (:func:`~sharefl.privacy.distributed_accounting.released_cells`), so σ is calibrated
    for one member's share."""
    p = run.privacy
    if not (p.enabled and p.level == "client" and p.distributed != "gaussian"):
        return None
    config = DistributedDPConfig(
        mechanism=DistributedMechanism(p.distributed),
        clip=p.clip,
        noise_multiplier=noise_multiplier,
        min_survivors=split_survivors(run),
        max_summands=run.secure_aggregation.cluster_size,
        colluders=run.noise_colluders,
        bits=p.bits,
        rotation=Rotation(p.rotation),
    )
    if target is None:
        return DistributedEncoder(config, dim)
    epsilon, delta = target
    members = None if run.secure_aggregation.reclusterings == 1 else 1
    return calibrate_distributed(
        config, dim, epsilon, delta, run.rounds, conversion=p.conversion, members=members
    )


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
        client_keys: with ``key_setup = "once"``, each client's long-term keys, made the
            first time it takes part and kept for the run (the two-exchange round).
    """

    run: RunConfig
    rule: HierarchicalAggregator | None
    zeno: ClusterZeno | None
    weights: Tensor | None
    ledger: ClusterPrivacyLedger | DistributedDPLedger | None
    schedule: ClusterSchedule
    audits: AuditLog
    distributed: DistributedEncoder | None = None
    last_clusterings: tuple = ()
    client_keys: dict[int, ClientKeys] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        run: RunConfig,
        *,
        rule: HierarchicalAggregator | None,
        zeno: ClusterZeno | None,
        client_sizes: Sequence[int],
        noise_split: ClusterNoiseSplit | None,
        distributed: DistributedEncoder | None = None,
    ) -> ShareAggregation:
        if (rule is None) == (zeno is None):
            raise SimulationConfigError("SHARE needs exactly one of a hierarchical rule and Zeno++")
        if run.training.weighted and run.privacy.enabled and run.privacy.level == "client":
            raise SimulationConfigError(
                "training.weighted scales updates after the client-level clip, which would "
                "change their sensitivity: set training.weighted = false with privacy.level "
                '= "client"'
            )
        ledger: ClusterPrivacyLedger | DistributedDPLedger | None = None
        if noise_split is not None:
            check_encoding_keeps_the_noise(run, noise_split)
            ledger = ClusterPrivacyLedger(
                noise_split, run.privacy.accountant, run.privacy.conversion
            )
        if distributed is not None:
            if run.secure_aggregation.bits != distributed.ring_bits:
                # the ring words go to the protocol as they are: their width is the ring's
                raise SimulationConfigError(
                    f"privacy.bits = {run.privacy.bits} is carried in "
                    f"{distributed.ring_bits}-bit words: set secure_aggregation.bits = "
                    f"{distributed.ring_bits}"
                )
            if run.privacy.accountant != "rdp":
                raise SimulationConfigError(
                    f'privacy.distributed = "{run.privacy.distributed}" is accounted by its '
                    'RDP bound: set privacy.accountant = "rdp"'
                )
            ledger = DistributedDPLedger(
                distributed.config.mechanism.value, conversion=run.privacy.conversion
            )
        return cls(
            run=run,
            rule=rule,
            zeno=zeno,
            weights=delta_weights(client_sizes) if run.training.weighted else None,
            ledger=ledger,
            schedule=ClusterSchedule(
                run.secure_aggregation, min_sum_size=run.secure_aggregation.min_sum_size
            ),
            audits=AuditLog(),
            distributed=distributed,
        )

    @property
    def clustered(self) -> bool:
        return self.run.secure_aggregation.cluster_size >= 2

    def weigh(self, uploads: Tensor, ids: Sequence[int]) -> Tensor:
        """The uploads of clients ``ids`` with their weights applied (:func:`weigh`)."""
        return weigh(uploads, self.weights, ids)

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
        clients ``ids`` (rows in that order); ``byzantine`` names the Byzantine ids. With
        clusters, the protocol sums the weighted uploads (:meth:`secure_sums`) and
        :meth:`aggregate_released` takes the released sums; without, Zeno++ runs over the
        weighted uploads."""
        uploads = self.weigh(uploads, ids)
        if not self.clustered:
            assert self.zeno is not None, "without clusters only Zeno++ runs here"
            flags = [[c in byzantine for c in ids]]
            return self.zeno.aggregate([uploads], w, len(ids), flags)
        released = self.secure_sums(uploads, ids, rng, round, byzantine)
        return self.aggregate_released(released, ids, byzantine=byzantine, w=w)

    def aggregate_released(
        self, released: Released, ids: Sequence[int], *, byzantine: set[int], w: Tensor
    ) -> Tensor:
        """The server's aggregate (a pseudo-gradient ``[d]``, ``w``'s dtype and device) of
        the cluster sums one round released, whoever ran the protocol; ``ids`` are the
        round's participants (the clients asked for an upload), ``byzantine`` the
        Byzantine ids.

        The honest participants (``ids`` less ``byzantine``) are charged for the released
        sums (:meth:`account`); zero when nothing was released; otherwise Zeno++ over the
        sums (normalised by the ``len(ids)`` participants) or the hierarchical rule over
        cluster means, reclusterings averaged; zero as well when the rule refuses every
        reclustering's sums (drop-outs left fewer than its ``f`` needs: the preflight
        checked the planned clusters only)."""
        self.account(released.all_members(), [c for c in ids if c not in byzantine])
        if not released:  # every cluster failed: no update this round
            return torch.zeros_like(w)
        if self.zeno is not None:
            rounds = [torch.as_tensor(np.stack(sums)) for sums in released.sums]
            flags = [[any(c in byzantine for c in m) for m in r] for r in released.members]
            return self.zeno.aggregate(rounds, w, len(ids), flags)
        assert self.rule is not None
        try:
            aggregate = self.rule.aggregate_released(released.pairs())
        except AggregationError:
            return torch.zeros_like(w)
        return aggregate.to(w.dtype).to(w.device)

    def account(self, released: list[tuple[int, ...]], honest: list[int]) -> None:
        """Record one round's released sums (survivors) for the ``honest`` clients, counting
        only the noise of the members the split's t colluders leave honest
        (:func:`~sharefl.privacy.distributed_accounting.cell_noise_adders`)."""
        if isinstance(self.ledger, ClusterPrivacyLedger):
            self.ledger.record_round(released, honest)
        elif isinstance(self.ledger, DistributedDPLedger):
            assert self.distributed is not None
            colluders = self.distributed.config.colluders
            for cell, adders in cell_noise_adders(released, honest, colluders):
                mechanism = self.distributed.released_mechanism(adders)
                for c in cell:
                    self.ledger.record(c, mechanism)
            self.ledger.end_round()

    def secure_sums(
        self,
        uploads: Tensor,
        ids: Sequence[int],
        rng: np.random.Generator,
        round: int,
        byzantine: set[int],
    ) -> Released:
        """The cluster sums the protocol releases from the (weighted) ``uploads`` of
        clients ``ids``, in process, with the run's settings and the clusterings of the
        schedule drawn from ``rng``; records the audit of the plan.

        With a discrete mechanism every client's step before masking runs here (honest
        clients add their noise share, Byzantine ones none), the protocol sums the ring
        vectors and the server decodes each released sum."""
        atoms = self.schedule.round_atoms(ids, rng)
        clusterings = self.schedule.clusterings(ids, rng)
        encoder = self.distributed
        inputs: Tensor | dict[int, np.ndarray] = uploads
        if encoder is not None:
            public_seed = rng.bytes(48)  # the round's rotation, known to all
            # Reproducible runs: the clients' AES-CTR noise stream is keyed from the run's
            # seed here; deployed clients key it from OS entropy (SecureRandom()).
            noise_rng = SecureRandom.from_seed(rng.bytes(48))
            rows = uploads.detach().cpu().numpy()
            inputs = {
                cid: encoder.encode(rows[i], public_seed, noise_rng, noise=cid not in byzantine)
                for i, cid in enumerate(ids)
            }
        sa = self.run.secure_aggregation
        if not isinstance(inputs, dict):
            inputs = {cid: inputs[i].detach().cpu().numpy() for i, cid in enumerate(ids)}
        # Every key of the run's settings reaches the protocol as parsed (its clip bounds
        # float uploads; ring words of a discrete mechanism are summed as they are).
        result = secure_sum(
            inputs,
            sa.as_settings(),
            seed=int(rng.integers(2**63)),
            round=round,
            protocol=sa.enabled,
            clusterings=clusterings,
            atom_partition=atoms,
            client_keys=self._keys(ids) if sa.key_setup is KeySetup.ONCE else None,
        )
        self.audits.record(result.planned_audit)
        self.last_clusterings = result.plan.clusterings
        return Released.from_reclusterings(
            result.reclusterings,
            None if encoder is None else lambda s: encoder.decode(s.ring_sum, public_seed),
        )

    def _keys(self, ids: Sequence[int]) -> dict[int, ClientKeys]:
        """The long-term keys of ``ids``, each client's made once (OS entropy: masks
        cancel, so they change no result)."""
        for cid in ids:
            if cid not in self.client_keys:
                self.client_keys[cid] = ClientKeys.generate(cid)
        return {cid: self.client_keys[cid] for cid in ids}

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
        if isinstance(self.ledger, ClusterPrivacyLedger) and delta:
            out["client_dp"] = {
                "mechanism": "gaussian",
                "share_std": self.ledger.split.share_std,
                "min_survivors": self.ledger.split.min_survivors,
                "colluders": self.ledger.split.colluders,
                **self.ledger.summary(delta),
            }
        elif isinstance(self.ledger, DistributedDPLedger) and delta:
            assert self.distributed is not None
            encoder = self.distributed
            out["client_dp"] = {
                "noise_multiplier": encoder.config.noise_multiplier,
                "bits": encoder.config.bits,
                "rotation": encoder.config.rotation.value,
                "gamma": encoder.gamma,
                "sensitivity_l1": encoder.sensitivity[0],
                "sensitivity_l2": encoder.sensitivity[1],
                "min_survivors": encoder.config.min_survivors,
                "colluders": encoder.config.colluders,
                **self.ledger.summary(delta),
            }
        return out
