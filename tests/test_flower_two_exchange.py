"""The two-exchange round (``key_setup = "once"``) inside Flower, both APIs, delivered by the
in-process grid of tests/test_flower.py (no Ray).

The oracle is FedAvg computed here from the clients' updates and weights; the exchanges are
counted from what the grid delivered: a key stage in the first round only, then an
assignment (which brings the training instructions) and an unmask request per client and
round."""

from __future__ import annotations

import collections

import numpy as np
import pytest

pytest.importorskip("flwr")

from test_flower import (
    DIRECTORY,
    NODES,
    SHAPES,
    fedavg,
    run_round,
    signed_mods,
    task_identity,
    updates_for,
)
from test_flower_message_api import fedavg_strategy, start, train_app

from sharefl.integrations.flower import ShareflStrategy, ShareflWorkflow
from sharefl.integrations.flower.common import PREFIX, drop_record

__all__ = ["task_identity"]


def _counts(sent):
    return collections.Counter(sent)


def test_rounds_take_two_exchanges_after_the_key_stage_and_equal_fedavg():
    updates = updates_for(NODES, seed=11)
    global_arrays = [np.full(s, 0.25, np.float32) for s in SHAPES]
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)), cluster_size=5, clip=1.0, seed=3, key_setup="once"
    )
    apps = {nid: train_app(*updates[nid]) for nid in NODES}
    result, grid = start(strategy, apps, global_arrays, rounds=3)
    outcome = strategy.secure.last_result
    assert outcome is not None and not outcome.failed and outcome.clusters
    summed = sorted(set().union(*(set(c.members) for c in outcome.clusters)))
    counts = _counts(grid.sent)
    n = len(summed)
    # one key stage per client over three rounds; per round an assignment and an unmask
    assert counts["keys"] == len(NODES)
    assert counts["assign"] == 3 * n and counts["UnmaskRequest"] == 3 * n
    assert set(counts) == {"keys", "assign", "UnmaskRequest"}
    expected = [g + 3 * u for g, u in zip(global_arrays, fedavg(updates, summed), strict=True)]
    for got, want in zip(result.arrays.to_numpy_ndarrays(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_drop_outs_at_either_exchange_and_a_client_that_lost_its_keys():
    updates = updates_for(NODES, seed=12)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)),
        atoms=False,
        cluster_size=5,
        clip=1.0,
        seed=4,
        key_setup="once",
    )
    apps = {nid: train_app(*updates[nid]) for nid in NODES}
    gone_first, gone_unmask = NODES[2], NODES[5]
    result, _grid = start(
        strategy,
        apps,
        global_arrays,
        error_at={gone_first: "assign", gone_unmask: "UnmaskRequest"},
    )
    outcome = strategy.secure.last_result
    summed = sorted(set().union(*(set(c.members) for c in outcome.clusters)))
    assert gone_first not in summed and gone_unmask in summed
    assert len(summed) == len(NODES) - 1
    for got, want in zip(result.arrays.to_numpy_ndarrays(), fedavg(updates, summed), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_client_that_lost_its_keys_sends_new_ones_and_rejoins():
    """A client whose Context lost its keys (a restart) answers its next assignment with a
    new key advert instead of a masked input: it sits that round out, and the server relays
    the new keys from the round after."""
    updates = updates_for(NODES, seed=13)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    strategy = ShareflStrategy(
        fedavg_strategy(len(NODES)),
        atoms=False,
        cluster_size=5,
        clip=1.0,
        seed=5,
        key_setup="once",
    )
    victim = NODES[0]
    apps = {nid: train_app(*updates[nid]) for nid in NODES}
    trained = train_app(*updates[victim])
    calls = []

    def forgetful(msg, ctxt):
        calls.append(1)
        if len(calls) == 1:  # after its first training, its keys are gone
            drop_record(ctxt.state, f"{PREFIX}.state.keys")
        return trained(msg, ctxt)

    apps[victim] = forgetful
    _result, grid = start(strategy, apps, global_arrays, rounds=3)
    assert len(calls) == 2  # rounds 1 and 3: round 2 answered with new keys, untrained
    assert grid.sent.count("keys") == len(NODES)  # no extra key stage
    last = strategy.secure.last_result
    assert victim in {m for c in last.clusters for m in c.members}


def test_signed_two_exchange_round_takes_three_exchanges_and_equals_fedavg():
    """Signed mode (legacy API): hello and key stage in the first round; then assignment,
    consistency and unmask — three exchanges, the adverts signed by each client's identity
    and checked by every peer; a drop-out at the consistency stage still counts."""
    updates = updates_for(NODES, seed=14)
    global_arrays = [np.full(s, -0.25, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        atoms=False,
        cluster_size=5,
        clip=1.0,
        seed=3,
        signed=True,
        directory=DIRECTORY,
        key_setup="once",
    )
    lost = NODES[6]
    new, grid = run_round(
        workflow, updates, global_arrays, mods=signed_mods(), error_at={lost: "ConsistencyRequest"}
    )
    counts = _counts(grid.sent)
    assert counts["keys"] == len(NODES) and counts["hello"] == len(NODES)
    assert counts["assign"] == counts["ConsistencyRequest"] == len(NODES)
    assert "MaskingRequest" not in counts and "KeysBroadcast" not in counts
    result = workflow.last_result
    assert result is not None and not result.failed and not workflow.last_node_culprits
    summed = set().union(*(set(c.members) for c in result.clusters))
    assert summed == set(range(len(NODES)))
    for got, g, want in zip(new, global_arrays, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got - g, want, atol=1e-5)
