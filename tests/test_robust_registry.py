"""The rules by name (``sharefl.robust.registry``): what every configuration file's
``[aggregator]`` is looked up in, by the simulator and the deployment alike, and rules with
pre-aggregators over cluster sums (a ``Pipeline`` under ``HierarchicalAggregator``, which
refused it before: a deployment's ``pre = ["nnm"]`` could not start)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sharefl.deploy.config import AggregatorSection, DeploymentConfig, ModelSection
from sharefl.robust import NNM, AggregationError, Krum, Pipeline
from sharefl.robust.hierarchical import ClusterScale, HierarchicalAggregator
from sharefl.robust.registry import RULES, build_rule
from sharefl.robust_strategy import RobustStrategy
from sharefl.rounds.released import Released
from sharefl.simulator.components import build_rule as simulator_build_rule
from sharefl.simulator.config import SimulationConfigError

OPTIONS = {"krum": {"f": 1}, "multi_krum": {"f": 1}, "mda": {"f": 1}, "trimmed_mean": {"f": 1}}


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_named_rule_builds_and_aggregates(name):
    rule = build_rule(name, OPTIONS.get(name, {}))
    assert isinstance(rule, RULES[name])
    X = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert rule(X).shape == (5,)


def test_a_bad_name_option_or_pre_aggregator_names_the_key():
    with pytest.raises(AggregationError, match=r"aggregator\.name must be one of"):
        build_rule("kurm")
    with pytest.raises(AggregationError, match="'krum' with options"):
        build_rule("krum", {"q": 1})
    with pytest.raises(AggregationError, match=r"aggregator\.pre entries must be one of"):
        build_rule("krum", {"f": 1}, ["bucket"])
    with pytest.raises(SimulationConfigError, match="noise_filter"):  # the simulator's list
        simulator_build_rule("kurm", {}, [], torch.Generator())


def test_a_pipeline_over_cluster_means_is_the_pipeline_of_the_means():
    """Oracle: the means computed here, then NNM and Krum by hand."""
    sums = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    sizes = [3, 3, 2, 3, 3, 2]
    rule = build_rule("krum", {"f": 1}, ["nnm"])
    assert isinstance(rule, Pipeline)
    hierarchical = HierarchicalAggregator(rule=rule, scale=ClusterScale.MEAN)
    assert hierarchical.tolerance == 1
    means = sums / torch.tensor(sizes, dtype=torch.float64)[:, None]
    expected = Krum(f=1)(NNM(f=1)(means))
    torch.testing.assert_close(hierarchical(sums, sizes), expected, rtol=0, atol=0)


def test_a_deployment_with_pre_aggregators_steps_with_them():
    config = DeploymentConfig(
        model=ModelSection(dim=3, learning_rate=1.0),
        aggregator=AggregatorSection(name="krum", options={"f": 1}, pre=["nnm"]),
    )
    strategy = RobustStrategy(config)
    rng = np.random.default_rng(3)
    sums = [rng.normal(size=3) * 3 for _ in range(5)]
    released = Released.of([[(s, (3 * i, 3 * i + 1, 3 * i + 2)) for i, s in enumerate(sums)]])
    model = strategy.initial_model()
    updated, aggregate, _ = strategy.apply(model, 0, released)
    means = torch.as_tensor(np.stack(sums) / 3)
    np.testing.assert_allclose(aggregate, Krum(f=1)(NNM(f=1)(means)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(updated, model - aggregate, rtol=1e-6)


def test_the_released_sums_of_a_round_are_aggregated_in_one_place():
    """``aggregate_released`` (what every transport calls): the rule per reclustering over
    the cluster means, reclusterings that released nothing skipped, the rest averaged."""
    rule = HierarchicalAggregator(rule=build_rule("median"), scale=ClusterScale.MEAN)
    a = [(np.array([3.0, 6.0]), 3), (np.array([2.0, 2.0]), 2), (np.array([9.0, 0.0]), 3)]
    b = [(np.array([4.0, 4.0]), 2), (np.array([0.0, 3.0]), 3), (np.array([6.0, 6.0]), 3)]
    got = rule.aggregate_released([a, [], b])
    median_a = torch.tensor([1.0, 1.0], dtype=torch.float64)  # means (1, 2), (1, 1), (3, 0)
    median_b = torch.tensor([2.0, 2.0], dtype=torch.float64)  # means (2, 2), (0, 1), (2, 2)
    torch.testing.assert_close(got, (median_a + median_b) / 2, rtol=0, atol=1e-12)
    with pytest.raises(AggregationError, match="at least one reclustering"):
        rule.aggregate_released([[], []])
    krum = HierarchicalAggregator(rule=build_rule("krum", {"f": 1}), scale=ClusterScale.MEAN)
    krum.check_clusters(5)
    with pytest.raises(AggregationError, match=r"needs n >= 2f \+ 3 = 5 rows, got n = 4"):
        krum.check_clusters(4)


def test_a_reclustering_with_fewer_sums_than_the_rule_needs_is_left_out():
    """Drop-outs failed clusters of one reclustering: Median(f=1) refuses its 2 sums, so
    the round's aggregate is the other reclustering's median alone (not the median of the 2,
    which one spoiled cluster would move at will); when every reclustering is refused the
    error gives each reason."""
    rule = HierarchicalAggregator(rule=build_rule("median", {"f": 1}), scale=ClusterScale.MEAN)
    full = [(np.array([3.0, 6.0]), 3), (np.array([2.0, 2.0]), 2), (np.array([9.0, 0.0]), 3)]
    short = [(np.array([4.0, 4.0]), 2), (np.array([300.0, -300.0]), 3)]
    got = rule.aggregate_released([short, full])
    torch.testing.assert_close(got, torch.tensor([1.0, 1.0], dtype=torch.float64))
    with pytest.raises(AggregationError, match=r"refused the sums of every reclustering") as e:
        rule.aggregate_released([short, full[:1]])
    assert "Median(f=1) needs n >= 2f + 1 = 3 rows, got n = 2" in str(e.value)
    assert "Median(f=1) needs n >= 2f + 1 = 3 rows, got n = 1" in str(e.value)


def test_a_deployment_keeps_its_model_when_the_rule_refuses_the_released_sums():
    """A gRPC round in which drop-outs left 2 cluster sums for Krum(f=1), which needs 5:
    the server keeps the model and says why in the round's log line, instead of ending the
    run with an exception."""
    config = DeploymentConfig(
        model=ModelSection(dim=3, learning_rate=1.0),
        aggregator=AggregatorSection(name="krum", options={"f": 1}),
    )
    strategy = RobustStrategy(config)
    released = Released.of([[(np.ones(3), (0, 1, 2)), (np.ones(3), (3, 4, 5))]])
    model = strategy.initial_model() + 1
    updated, aggregate, note = strategy.apply(model, 0, released)
    assert aggregate is None and np.array_equal(updated, model)
    assert "the model unchanged: the rule refused" in note and "got n = 2" in note
