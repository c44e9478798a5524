"""The server side of a federated run: the aggregation rule, the step
``w ← w − η_s · (momentum of) aggregate``, evaluation, and the privacy accountant.

:class:`Server` owns the global model ``w``. Aggregation runs over the individual uploads
(a robust rule, or the DP filter's noise-aware filter with the server's auxiliary data) or, with
clusters (``secure_aggregation.cluster_size >= 2``), over the cluster sums released by
:func:`~sharefl.protocol.driver.secure_sum` or by a deployment
(:class:`~sharefl.rounds.released.Released`): the rule over cluster means
(SHARE, :class:`~sharefl.robust.HierarchicalAggregator`) or Zeno++, reclusterings averaged.
:class:`Ledger` composes the run's :class:`~sharefl.simulator.federated.setup.PrivacyPlan`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from sharefl.privacy.accountant import PrivacyAccountant
from sharefl.robust import ClusterScale, HierarchicalAggregator, NoiseAwareFilter
from sharefl.rounds.model_step import server_step
from sharefl.rounds.released import Released
from sharefl.simulator import components
from sharefl.simulator.config import SimulationConfigError
from sharefl.simulator.federated import share
from sharefl.simulator.federated.cluster_zeno import ClusterZeno, ValidationGradient
from sharefl.simulator.federated.setup import RunSetup, describe_privacy, server_learning_rate


class Ledger:
    """The honest clients' privacy accountant over the run's plan: :meth:`step` composes
    the mechanisms of one 0-based round at the plan's σ of that round."""

    def __init__(self, setup: RunSetup) -> None:
        self.plan = setup.privacy
        p = setup.run.privacy
        self.accountant = (
            PrivacyAccountant(p.accountant, conversion=p.conversion) if p.enabled else None
        )
        self.sigmas: list[float] = []  # σ composed per round, in order

    def step(self, round_index: int) -> None:
        """Account one round of an honest participant's mechanisms (no-op without DP)."""
        if self.accountant is None:
            return
        sigma = self.plan.sigma(round_index)
        self.sigmas.append(sigma)
        self.accountant.step(sigma, self.plan.sample_rate, self.plan.steps_per_round)

    def epsilon(self) -> float | None:
        """ε spent so far by each honest client (``None`` without privacy or steps)."""
        if self.accountant is None or self.accountant.steps == 0:
            return None
        return self.accountant.get_epsilon(self.plan.delta)

    def summary(self) -> tuple[float | None, dict[str, Any]]:
        """(δ of the reported ε or ``None`` without privacy, the JSON-ready parameters)."""
        delta = self.plan.delta if self.accountant is not None else None
        return delta, describe_privacy(self.plan)


class Server:
    """The global model and everything the server does with it.

    Args:
        setup: the run's setup.
        generator: randomness of the rule (bucketing's shuffles).

    Raises:
        SimulationConfigError: the noise filter with clusters, or without auxiliary data or privacy;
            an unknown rule or option.
    """

    def __init__(self, setup: RunSetup, generator: torch.Generator) -> None:
        run = setup.run
        self.setup = setup
        self.model = setup.model
        self.device = setup.device
        self.w = setup.initial.clone()
        self.velocity = torch.zeros_like(self.w)
        self.learning_rate = server_learning_rate(run, setup.privacy)
        self.clustered = run.secure_aggregation.cluster_size >= 2
        self.noise_filter: NoiseAwareFilter | None = None
        self.rule: Any = None
        self.share: share.ShareAggregation | None = (
            None  # SHARE hook (simulator/federated/share.py)
        )
        self.build_aggregation(generator)

    def build_aggregation(self, generator: torch.Generator) -> None:
        """(Re)build the rule of ``[aggregator]`` (or the noise filter). With clusters this
        always builds SHARE's aggregation (``self.share``), the one path of every clustered
        round (:meth:`aggregate`); the noise filter, which needs individual uploads, is
        refused there."""
        run, agg = self.setup.run, self.setup.run.aggregator
        self.noise_filter, self.rule, self.share = None, None, None
        if agg.name == "noise_filter":
            if self.clustered:
                raise SimulationConfigError(
                    "the noise filter needs individual uploads: set secure_aggregation."
                    "cluster_size = 1 (its auxiliary-data scores cannot run on cluster sums)"
                )
            if self.setup.auxiliary is None or not run.privacy.enabled:
                raise SimulationConfigError(
                    "the noise filter needs data.auxiliary_per_class and privacy"
                )
            self.noise_filter = components.build_noise_filter(
                agg.options,
                noise_multiplier=self.setup.privacy.noise_multiplier,
                batch_size=run.training.batch_size,
                honest=run.clients.honest,
                total=run.clients.total,
            )
            return
        # -- SHARE (Velicheti et al.): Zeno++, clusterings, audit, cluster DP (federated/share.py)
        zeno = self._build_zeno(generator) if agg.name == "zeno" else None
        if zeno is None:
            rule = components.build_rule(agg.name, agg.options, agg.pre, generator)
            self.rule = (
                HierarchicalAggregator(rule=rule, scale=ClusterScale.MEAN)
                if self.clustered
                else rule
            )
        if self.clustered or zeno is not None or run.training.weighted:
            self.share = share.ShareAggregation.build(
                run,
                rule=self.rule,
                zeno=zeno,
                client_sizes=[len(p) for p in self.setup.honest_parts + self.setup.byzantine_parts],
                noise_split=share.cluster_noise_split(run, self.setup.privacy.noise_multiplier),
                distributed=share.distributed_encoder(
                    run, self.setup.privacy.noise_multiplier, self.setup.model.dim
                ),
            )

    def _build_zeno(self, generator: torch.Generator) -> ClusterZeno:
        """Zeno++ with its validation set: the server's clean data (data.auxiliary_*)."""
        aux = self.setup.auxiliary
        if aux is None:
            raise SimulationConfigError(
                "aggregator zeno needs the server's validation set: set "
                "data.auxiliary_per_class (SHARE: a class-balanced 5 %, e.g. 300 on MNIST)"
            )
        return ClusterZeno.from_options(
            self.setup.run.aggregator.options,
            lr=self.learning_rate,
            validation_factory=lambda n_s: ValidationGradient(
                self.model, aux.inputs, aux.targets, n_s, generator
            ),
        )

    # -- aggregation -----------------------------------------------------------------

    def aggregate(
        self, uploads: Tensor, ids: list[int], round_index: int, rng: np.random.Generator
    ) -> Tensor:
        """The aggregate of this round's ``uploads`` (rows in the order of client ``ids``).

        With clusters, always SHARE's aggregation (:meth:`~sharefl.simulator.federated.share.
        ShareAggregation.aggregate`: the run's settings, the clusterings planned from
        ``rng``, the released sums aggregated as :meth:`aggregate_released` does):
        :meth:`build_aggregation` builds it for every clustered run (or refuses the noise
        filter) and nothing replaces it. Without clusters, the noise filter, Zeno++
        (through SHARE's aggregation too) or the rule over the (weighted) uploads."""
        if self.noise_filter is not None:
            return self.noise_filter(uploads, self.auxiliary_gradient)
        if self.share is not None and (self.clustered or self.share.zeno is not None):
            return self.share.aggregate(  # SHARE hook (simulator/federated/share.py)
                uploads, ids, byzantine=self.byzantine, w=self.w, rng=rng, round=round_index
            )
        if self.share is not None:
            uploads = self.share.weigh(uploads, ids)
        return self.rule(uploads)

    def aggregate_released(self, released: Released, ids: list[int]) -> Tensor:
        """The aggregate of the cluster sums a round of participants ``ids`` released
        (:meth:`~sharefl.simulator.federated.share.ShareAggregation.aggregate_released`:
        the honest participants charged, the robust rule over cluster means or Zeno++).

        Raises:
            SimulationConfigError: the run has no clusters."""
        if self.share is None or not self.clustered:
            raise SimulationConfigError("cluster sums need secure_aggregation.cluster_size >= 2")
        return self.share.aggregate_released(released, ids, byzantine=self.byzantine, w=self.w)

    @property
    def byzantine(self) -> set[int]:
        """The Byzantine client ids (``clients.honest … clients.total − 1``)."""
        clients = self.setup.run.clients
        return set(range(clients.honest, clients.total))

    def check_clusters(self, clusters: int) -> None:
        """Raise the rule's ``ValueError`` when it cannot aggregate ``clusters`` cluster
        sums (``f`` too large...); nothing to check without clusters."""
        if isinstance(self.rule, HierarchicalAggregator):
            self.rule.check_clusters(clusters)

    def auxiliary_gradient(self) -> Tensor:
        """The server's clean gradient on its auxiliary data at the current model."""
        auxiliary = self.setup.auxiliary
        assert auxiliary is not None
        with torch.enable_grad():  # the filter calls this under no_grad
            w = self.w.detach().clone().requires_grad_(True)
            out = self.model(w, auxiliary.inputs)
            loss = nn.functional.cross_entropy(out, auxiliary.targets)
            (g,) = torch.autograd.grad(loss, w)
        return g

    # -- step and evaluation -----------------------------------------------------------

    def step(self, aggregate: Tensor) -> None:
        """``w ← w − η_s · v`` with v the aggregate (or its momentum, ``server.momentum``):
        sharefl's one model step, :func:`~sharefl.rounds.model_step.server_step` (as the
        deployment's :func:`~sharefl.rounds.model_step.descend`), on host copies of the
        tensors: the elementwise operations torch ran here before, in the same order and
        dtype, each rounded once, so the same bits (compared with the torch formula in
        tests/test_model_step.py). The velocity is written back in place (a checkpoint
        sees it change)."""
        momentum = self.setup.run.server.momentum
        velocity = self.velocity.detach().cpu().numpy().copy() if momentum else None
        w = server_step(
            self.w.detach().cpu().numpy(),
            self.learning_rate,
            aggregate.detach().cpu().numpy(),
            momentum=momentum,
            velocity=velocity,
        )
        if velocity is not None:
            self.velocity.copy_(torch.from_numpy(velocity))
        self.w = torch.from_numpy(w).to(self.w.device)

    def evaluate(self) -> tuple[float, float]:
        """(accuracy, mean loss) of ``w`` on the test set."""
        test = self.setup.test
        assert test is not None, "built from a client process's setup, which has no test set"
        return self.model.evaluate(self.w, test.inputs, test.targets)
