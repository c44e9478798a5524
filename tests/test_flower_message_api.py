"""sharefl inside Flower's Message API: ``ShareflStrategy`` around the Message-API ``FedAvg``,
run by its own ``start`` loop, with clients written as ``@app.train()`` functions (a
``Message`` with an ``ArrayRecord`` in, one with the trained ``ArrayRecord`` and a
``MetricRecord`` holding ``"num-examples"`` out) behind ``sharefl_mod``. Delivered by the
in-process grid of tests/test_flower.py (no Ray).

The oracle is FedAvg computed here from the clients' updates and weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from test_flower import NODES, SHAPES, FakeGrid, fedavg, task_identity, updates_for

from sharefl.integrations.flower import NothingReleased, ShareflStrategy
from sharefl.protocol.errors import ConfigurationError
from sharefl.robust.coordinate import Median

__all__ = ["task_identity"]  # the fixture that stamps the server app's run id


# Per-client clusters, as in test_flower.py (whose grid's clients accept them); atoms, the
# default, are tested in test_flower_atoms.py.


class MessageGrid(FakeGrid):
    """The in-process grid, with the node list a Message-API strategy samples from."""

    def get_node_ids(self):
        return list(self.apps)


def train_app(update, weight, metrics=True):
    """A Message-API client: returns received + ``update`` and ``num-examples`` = weight."""

    def app(msg, ctxt):
        received = msg.content["arrays"].to_numpy_ndarrays()
        trained = [r + u for r, u in zip(received, update, strict=True)]
        content = RecordDict({"arrays": ArrayRecord(trained)})
        if metrics:
            content["metrics"] = MetricRecord({"num-examples": weight, "train-loss": 0.5})
        return Message(content, reply_to=msg)

    return app


def fedavg_strategy(n: int) -> FedAvg:
    return FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n
    )


def start(strategy, apps, global_arrays, rounds=1, **grid_kwargs):
    grid = MessageGrid(apps, **grid_kwargs)
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(global_arrays), num_rounds=rounds, timeout=10
    )
    return result, grid


def test_the_message_api_round_equals_fedavg_and_keeps_the_clients_metrics():
    updates = updates_for(NODES, seed=5)
    global_arrays = [np.full(s, 0.25, np.float32) for s in SHAPES]
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)), atoms=False, cluster_size=5, clip=1.0, seed=3
    )
    lost = NODES[1]
    apps = {nid: train_app(*updates[nid]) for nid in NODES}
    result, grid = start(strategy, apps, global_arrays, error_at={lost: "MaskingRequest"})
    outcome = strategy.secure.last_result
    assert outcome is not None and len(outcome.clusters) == 2 and not outcome.failed
    summed = sorted(set().union(*(set(c.members) for c in outcome.clusters)))
    assert summed == sorted(set(NODES) - {lost})
    new = result.arrays.to_numpy_ndarrays()
    for got, g, want in zip(new, global_arrays, fedavg(updates, summed), strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got - g, want, atol=1e-5)
    metrics = result.train_metrics_clientapp[1]
    assert metrics["train-loss"] == pytest.approx(0.5)  # the inner strategy's aggregation
    assert "MaskingRequest" in grid.sent and "UnmaskRequest" in grid.sent


def test_a_robust_rule_over_cluster_sums_through_the_message_api():
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    honest = {nid: ([np.full(s, 0.1, np.float32) for s in SHAPES], 10) for nid in NODES}
    probe = ShareflStrategy(
        fedavg_strategy(len(NODES)), atoms=False, cluster_size=3, clip=1.0, seed=5
    )
    start(probe, {nid: train_app(*honest[nid]) for nid in NODES}, global_arrays)
    byzantine = probe.secure.last_result.clusters[0].members[:2]  # the same seed, same plan
    apps = {nid: train_app(*honest[nid]) for nid in NODES}
    for nid in byzantine:
        apps[nid] = train_app([np.full(s, -1.0, np.float32) for s in SHAPES], 1000)
    robust = ShareflStrategy(
        fedavg_strategy(len(NODES)), atoms=False, cluster_size=3, clip=1.0, seed=5, rule=Median(f=1)
    )
    result, _ = start(robust, apps, global_arrays)
    for got in result.arrays.to_numpy_ndarrays():
        np.testing.assert_allclose(got, 0.1, atol=1e-5)


def test_a_client_without_num_examples_is_a_named_dropout_and_the_round_goes_on():
    updates = updates_for(NODES, seed=6)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)), atoms=False, cluster_size=5, clip=1.0, seed=3
    )
    careless = NODES[3]
    apps = {nid: train_app(*updates[nid], metrics=nid != careless) for nid in NODES}
    result, grid = start(strategy, apps, global_arrays)
    assert any("num-examples" in e for e in grid.errors[careless])
    summed = sorted(set().union(*(set(c.members) for c in strategy.secure.last_result.clusters)))
    assert careless not in summed and len(summed) == len(NODES) - 1
    for got, want in zip(result.arrays.to_numpy_ndarrays(), fedavg(updates, summed), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_rounds_chain_and_a_round_that_releases_nothing_keeps_the_arrays():
    updates = updates_for(NODES, seed=7)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)), atoms=False, cluster_size=5, clip=1.0, seed=3
    )
    apps = {nid: train_app(*updates[nid]) for nid in NODES}
    result, _ = start(strategy, apps, global_arrays, rounds=2)
    step = fedavg(updates, NODES)
    for got, want in zip(result.arrays.to_numpy_ndarrays(), step, strict=True):
        np.testing.assert_allclose(got, 2 * want, atol=1e-5)  # the same update twice

    silent = ShareflStrategy(
        fedavg_strategy(len(NODES)), atoms=False, cluster_size=5, clip=1.0, seed=3
    )
    everyone = dict.fromkeys(NODES, "MaskingRequest")
    result, _ = start(silent, apps, global_arrays, error_at=everyone)
    assert silent.secure.last_update is None
    assert len(result.arrays) == 0  # as FedAvg without replies: no new arrays this round


def test_rounds_that_release_nothing_stop_the_run_with_their_reason():
    """``max_empty_rounds`` empty rounds in a row raise NothingReleased naming the last
    round's reasons; a round that releases resets the count."""
    updates = updates_for(NODES, seed=8)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    apps = {nid: train_app(*updates[nid]) for nid in NODES}
    refusing = dict.fromkeys(NODES, "MaskingRequest")
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)),
        atoms=False,
        cluster_size=5,
        clip=1.0,
        seed=3,
        max_empty_rounds=2,
    )
    start(strategy, apps, global_arrays, error_at=refusing)
    assert strategy.secure.empty_rounds == 1
    start(strategy, apps, global_arrays)  # released: the count starts again
    assert strategy.secure.empty_rounds == 0
    with pytest.raises(NothingReleased, match=r"2 rounds in a row .* client error replies"):
        start(strategy, apps, global_arrays, rounds=2, error_at=refusing)
    with pytest.raises(ConfigurationError, match="max_empty_rounds must be >= 1"):
        ShareflStrategy(
            fedavg_strategy(2), atoms=False, cluster_size=3, clip=1.0, max_empty_rounds=0
        )


UNEQUAL_WEIGHTS = (3, 5, 7, 11, 13)
"""Weights under which a weighted average of identical float32 arrays is not the identity
(of 5,000 elements, thousands move in their last bits)."""


def unequal_apps(seed: int) -> tuple[list[np.ndarray], dict]:
    """The float32 global arrays (5,000 elements) and five clients, weighted
    :data:`UNEQUAL_WEIGHTS`, whose updates are uniform in ±0.5."""
    rng = np.random.default_rng(seed)
    shapes = [(50, 80), (1000,)]
    global_arrays = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    apps = {
        nid: train_app([rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes], w)
        for nid, w in zip(NODES, UNEQUAL_WEIGHTS, strict=False)
    }
    return global_arrays, apps


def test_the_kept_arrays_are_the_secure_aggregate_applied_bit_for_bit():
    """``aggregate_train`` returns the released update added to the arrays the clients
    received, bit for bit; the inner strategy aggregates only the metrics (its weighted
    average of five copies of the new arrays would move some of their last bits)."""
    global_arrays, apps = unequal_apps(seed=11)
    strategy = ShareflStrategy(fedavg_strategy(len(apps)), atoms=False, cluster_size=5, seed=3)
    result, _ = start(strategy, apps, global_arrays)
    update = strategy.secure.last_update
    assert update is not None
    want = [(g + u).astype(g.dtype, copy=False) for g, u in zip(global_arrays, update, strict=True)]
    got = result.arrays.to_numpy_ndarrays()
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype == np.float32
        assert a.tobytes() == b.tobytes()
    assert result.train_metrics_clientapp[1]["train-loss"] == pytest.approx(0.5)
