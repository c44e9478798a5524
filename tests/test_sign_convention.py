"""One sign convention for the learning rate: every loop steps against the aggregate of
what clients upload, w ← w − η·v (simulation and deployment alike)."""

from __future__ import annotations

import numpy as np

from sharefl.deploy.config import AggregatorSection, DeploymentConfig, ModelSection
from sharefl.deploy.strategy import AveragingStrategy
from sharefl.robust_strategy import RobustStrategy
from sharefl.rounds.model_step import descend
from sharefl.rounds.released import Released


def _released(rows: list[np.ndarray], size: int) -> Released:
    """One reclustering whose clusters of ``size`` clients summed to ``rows``."""
    return Released.of([[(row, range(i * size, (i + 1) * size)) for i, row in enumerate(rows)]])


def test_descend_subtracts_the_scaled_aggregate():
    model = np.array([1.0, 2.0, 3.0], np.float32)
    out = descend(model, 0.5, np.array([2.0, -2.0, 0.0]))
    np.testing.assert_array_equal(out, [0.0, 3.0, 3.0])
    assert out.dtype == np.float32


def test_the_default_deployment_strategy_steps_against_the_mean_update():
    config = DeploymentConfig(model=ModelSection(dim=2, learning_rate=0.1, aggregator="mean"))
    strategy = AveragingStrategy(config)
    model = np.array([1.0, 1.0], np.float32)
    sums = [np.array([4.0, -4.0]), np.array([2.0, 2.0])]  # two clusters of two clients
    updated, aggregate, _ = strategy.apply(model, 0, _released(sums, 2))
    np.testing.assert_allclose(aggregate, [1.5, -0.5])  # per-client mean
    np.testing.assert_allclose(updated, model - 0.1 * aggregate)


def test_a_robust_deployment_steps_against_its_aggregate_as_the_simulator_does():
    config = DeploymentConfig(
        model=ModelSection(dim=2, learning_rate=0.5),
        aggregator=AggregatorSection(name="mean"),
    )
    strategy = RobustStrategy(config)
    model = strategy.initial_model()
    sums = [np.array([2.0, 0.0]), np.array([4.0, 2.0])]
    updated, aggregate, _ = strategy.apply(model, 0, _released(sums, 2))
    np.testing.assert_allclose(updated, model - 0.5 * aggregate, rtol=1e-6)
    assert (updated < 0).any() and np.all(aggregate >= 0)  # it moved against the updates
