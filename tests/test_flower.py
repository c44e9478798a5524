"""sharefl inside Flower: ShareflWorkflow + sharefl_mod through an in-process Grid that calls
each client's mod chain directly (no Ray), with drop-outs by error reply and by timeout, and
Byzantine clients under a robust rule."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

import flwr.compat.common.recorddict_compat as compat
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common import parameters_to_ndarrays as to_ndarrays
from flwr.server import ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD

from sharefl.integrations.flower import (
    PREFIX,
    STAGE_RECORD,
    ShareflWorkflow,
    get_record,
    sharefl_mod,
)
from sharefl.robust.coordinate import Median

SHAPES = [(3, 4), (5,)]


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """A server app's messages are stamped with its run id (set by Flower's runtime)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)


N = 10


def updates_for(nodes, seed=0):
    rng = np.random.default_rng(seed)
    return {
        nid: ([rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in SHAPES], int(10 + i))
        for i, nid in enumerate(nodes)
    }


class FakeGrid:
    """Delivers each message to its node's mod chain at once. ``error_at[nid] = kind`` makes
    the node answer its ``kind`` message (a sharefl protocol message class name) with an
    error; ``silent_at`` makes it not answer at all (a timeout)."""

    def __init__(self, apps, error_at=None, silent_at=None):
        self.apps = apps
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={})
            for nid in apps
        }
        self.error_at = error_at or {}
        self.silent_at = silent_at or {}
        self.run_id = 1

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            nid = msg.metadata.dst_node_id
            kind = _kind(msg)
            if self.silent_at.get(nid) == kind:
                continue
            if self.error_at.get(nid) == kind:
                replies.append(Message(Error(code=0, reason="lost"), reply_to=msg))
                continue
            try:
                replies.append(sharefl_mod(msg, self.contexts[nid], self.apps[nid]))
            except Exception as exc:  # what Flower does with an exception in a ClientApp
                replies.append(Message(Error(code=0, reason=repr(exc)), reply_to=msg))
        return replies


def _kind(msg) -> str:
    if f"{PREFIX}.message" in msg.content.config_records:
        return str(get_record(msg.content, f"{PREFIX}.message")["type"])
    return str(get_record(msg.content, STAGE_RECORD)["stage"])


def trainer(update, weight):
    def app(msg, ctxt):
        ins = compat.recorddict_to_fitins(msg.content, keep_input=True)
        received = to_ndarrays(ins.parameters)
        trained = [r + u for r, u in zip(received, update, strict=True)]
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(trained), weight, {})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

    return app


def legacy_context(grid, nodes, global_arrays):
    manager = SimpleClientManager()
    for nid in nodes:
        manager.register(GridClientProxy(nid, grid, 1))
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    ctx = LegacyContext(
        base,
        ServerConfig(num_rounds=1),
        FedAvg(fraction_fit=1.0, min_fit_clients=len(nodes), min_available_clients=len(nodes)),
        manager,
    )
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({"current_round": 1})
    ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters(global_arrays), True
    )
    return ctx


def run_round(workflow, updates, global_arrays, **grid_kwargs):
    nodes = sorted(updates)
    apps = {nid: trainer(*updates[nid]) for nid in nodes}
    grid = FakeGrid(apps, **grid_kwargs)
    ctx = legacy_context(grid, nodes, global_arrays)
    workflow(grid, ctx)
    new = compat.arrayrecord_to_parameters(ctx.state.array_records[MAIN_PARAMS_RECORD], True)
    return to_ndarrays(new), grid


def fedavg(updates, nodes):
    total = sum(updates[n][1] for n in nodes)
    return [
        sum(updates[n][0][k].astype(np.float64) * updates[n][1] for n in nodes) / total
        for k in range(len(SHAPES))
    ]


# Flower node ids are random 64-bit integers.
NODES = [int(x) for x in np.random.default_rng(7).integers(1, 2**63, N, dtype=np.int64)]
NODES[0] = 2**64 - 5  # an id above 2^63 goes through the records too


def test_secure_aggregate_equals_fedavg_with_dropouts_at_masking_and_unmasking():
    updates = updates_for(NODES)
    global_arrays = [np.full(s, 0.25, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(cluster_size=5, clip=1.0, seed=3)
    lost_masking, lost_unmask = NODES[1], NODES[2]
    new, _ = run_round(
        workflow,
        updates,
        global_arrays,
        error_at={lost_masking: "MaskingRequest"},
        silent_at={lost_unmask: "UnmaskRequest"},
    )
    result = workflow.last_result
    assert result is not None and len(result.clusters) == 2 and not result.failed
    summed = set().union(*(set(c.members) for c in result.clusters))
    assert summed == set(NODES) - {lost_masking}  # lost at unmasking: its input still counts
    expected = fedavg(updates, sorted(summed))
    bound = 2 * 2.0 ** -workflow_frac_bits(result)
    for got, g, want in zip(new, global_arrays, expected, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got - g, want, atol=bound + 1e-6)


def workflow_frac_bits(result) -> int:
    return result.encoding.frac_bits - 10  # generous: rounding of 10 clients, weights


def test_reclusterings_average_the_same_fedavg():
    updates = updates_for(NODES, seed=1)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(cluster_size=5, reclusterings=2, clip=1.0, seed=4)
    new, _ = run_round(workflow, updates, global_arrays)
    assert len(workflow.last_result.reclusterings) == 2
    for got, want in zip(new, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_byzantine_clients_and_a_robust_rule():
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    honest = {nid: ([np.full(s, 0.1, np.float32) for s in SHAPES], 10) for nid in NODES}
    probe = ShareflWorkflow(cluster_size=3, clip=1.0, seed=5)
    run_round(probe, honest, global_arrays)
    byzantine = probe.last_result.clusters[0].members[:2]  # the same seed draws the same plan
    attacked = dict(honest)
    for nid in byzantine:
        attacked[nid] = ([np.full(s, -1.0, np.float32) for s in SHAPES], 1000)
    robust = ShareflWorkflow(cluster_size=3, clip=1.0, seed=5, rule=Median(f=1))
    new, _ = run_round(robust, attacked, global_arrays)
    assert len(robust.last_result.clusters) == 3
    for got in new:  # the median over 3 cluster means ignores the one bad cluster
        np.testing.assert_allclose(got, 0.1, atol=1e-5)
    plain = ShareflWorkflow(cluster_size=3, clip=1.0, seed=5)
    moved, _ = run_round(plain, attacked, global_arrays)
    assert float(moved[0].mean()) < -0.5  # the attack drags plain FedAvg


def test_the_input_leaves_the_context_after_the_rounds_last_masking():
    """Flower ships a client's Context with each of its messages: the encoded input (d ring
    elements) stays only while a masking of the round is still to come, and the client
    trains once per round whatever the number of reclusterings."""
    updates = updates_for(NODES, seed=2)
    calls = dict.fromkeys(NODES, 0)

    def counting(nid):
        inner = trainer(*updates[nid])

        def app(msg, ctxt):
            calls[nid] += 1
            return inner(msg, ctxt)

        return app

    seen: list[bool] = []

    class Watching(FakeGrid):
        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages, timeout=timeout)
            seen.append(any(f"{PREFIX}.state.input" in c.state for c in self.contexts.values()))
            return replies

    grid = Watching({nid: counting(nid) for nid in NODES})
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(cluster_size=5, reclusterings=2, clip=1.0, seed=6)
    workflow(grid, legacy_context(grid, NODES, global_arrays))
    assert len(workflow.last_result.reclusterings) == 2
    assert set(calls.values()) == {1}
    # assign, keys, masking (trained: kept), unmask | assign, keys, masking (dropped), unmask
    assert seen == [False, False, True, True, True, True, False, False]
