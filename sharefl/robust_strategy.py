"""The gRPC server's strategy for a deployment file with an ``[aggregator]`` table.

``sharefl serve`` / ``launch`` with such a file step the model with any
:mod:`sharefl.robust` rule over the released cluster sums (:class:`RobustStrategy`). It
joins the deployment (the :class:`~sharefl.deploy.strategy.ServerStrategy` it implements,
its configuration) and the robust rules, which need torch; ``sharefl.deploy`` imports no
torch and ``sharefl.robust`` no transport, so it lives in the top layer beside ``launch``,
its one user. A simulation file's strategy is the simulator's own federated round
(:class:`sharefl.simulation_bridge.SimulationStrategy`).
"""

from __future__ import annotations

import secrets

import numpy as np
import torch

from sharefl.deploy.config import DeploymentConfig
from sharefl.robust.base import AggregationError
from sharefl.robust.hierarchical import ClusterScale, HierarchicalAggregator
from sharefl.robust.registry import build_rule
from sharefl.rounds.model_step import descend
from sharefl.rounds.released import Released


class RobustStrategy:
    """The server strategy of a deployment file with an ``[aggregator]`` table: any
    :mod:`sharefl.robust` rule (named as in simulation configs, with its options and
    pre-aggregators) over the released cluster sums, reclusterings averaged (SHARE's
    Algorithm 1), then ``model ← model − learning_rate × aggregate``
    (:func:`~sharefl.rounds.model_step.descend`); the model starts at zero.

    Raises :class:`~sharefl.robust.base.AggregationError` (a ``ValueError``) for an unknown
    rule, option or pre-aggregator (:mod:`sharefl.robust.registry`).
    """

    def __init__(self, config: DeploymentConfig) -> None:
        section = config.aggregator
        rule = build_rule(section.name, section.options, section.pre, os_seeded_generator())
        self.rule = HierarchicalAggregator(rule=rule, scale=ClusterScale(section.scale))
        self.dim = config.model.dim
        self.learning_rate = config.model.learning_rate

    def initial_model(self) -> np.ndarray:
        """The model of round 0: float32 zeros ``[model.dim]``."""
        return np.zeros(self.dim, dtype=np.float32)

    def check(self, clusters: int) -> None:
        """Raise :class:`~sharefl.robust.base.AggregationError` when the rule cannot
        aggregate ``clusters`` cluster sums (``f`` too large for them...)."""
        self.rule.check_clusters(clusters)

    def apply(
        self, model: np.ndarray, round_index: int, released: Released
    ) -> tuple[np.ndarray, np.ndarray | None, str]:
        """``(model − learning_rate × aggregate, the aggregate, a note naming the rule)``
        for the sums of every reclustering that released at least one cluster; the model
        unchanged (and no aggregate) when nothing was released, or when the rule refuses
        every reclustering's sums (too few for its ``f`` once drop-outs failed clusters:
        the note says so, and the run goes on)."""
        if not released:
            return model, None, ""
        try:
            aggregate = self.rule.aggregate_released(released.pairs()).cpu().numpy()
        except AggregationError as exc:
            return model, None, f", the model unchanged: {exc}"
        updated = descend(model, self.learning_rate, aggregate)
        return updated, aggregate, f", {type(self.rule.rule).__name__} over cluster sums"


def os_seeded_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded with 64 bits from the operating system (``secrets``):
    the randomness of a deployment's rule (bucketing's shuffles). Its seed is never derived
    from the configuration, so no client can predict it; tests pin a rule's randomness by
    building the rule with their own generator instead."""
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(64))
    return generator
