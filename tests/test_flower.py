"""sharefl inside Flower: ShareflWorkflow + sharefl_mod through an in-process Grid that calls
each client's mod chain directly (no Ray), with drop-outs by error reply and by timeout, and
Byzantine clients under a robust rule."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pytest
from conftest import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

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

from sharefl.crypto.signatures import IdentityKey, node_hello_message
from sharefl.deploy.keygen import keygen
from sharefl.integrations.flower import (
    PREFIX,
    STAGE_RECORD,
    FlowerIntegrationError,
    NothingReleased,
    ShareflWorkflow,
    get_record,
    make_sharefl_mod,
    policy_from_node_config,
    put_record,
)
from sharefl.integrations.flower.common import MODEL_RECORD
from sharefl.privacy.distributed import DistributedDPConfig, DistributedEncoder, epsilon_after
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.errors import ConfigurationError
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


PER_CLIENT_POLICY = ClientPolicy(require_atoms=False)
PER_CLIENT_MOD = make_sharefl_mod(PER_CLIENT_POLICY)
"""This module tests the protocol's mechanics inside Flower with per-client clusters: the
workflows here set ``atoms=False`` and the clients accept plans without atoms (atoms, the
default of both, are tested in test_flower_atoms.py)."""


class FakeGrid:
    """Delivers each message to its node's mod chain at once. ``error_at[nid] = kind`` makes
    the node answer its ``kind`` message (a sharefl protocol message class name, or a
    stage) with an error; ``silent_at`` makes it not answer at all (a timeout). ``mods``
    replaces ``sharefl_mod`` per node, ``node_configs`` sets their node configs; ``sent``
    lists the kinds sent, ``errors`` the error reasons per node."""

    def __init__(self, apps, error_at=None, silent_at=None, mods=None, node_configs=None):
        self.apps = apps
        self.mods = mods or {}
        self.sent: list[str] = []
        self.errors: dict[int, list[str]] = {}
        configs = node_configs or {}
        self.contexts = {
            nid: Context(
                run_id=1,
                node_id=nid,
                node_config=dict(configs.get(nid, {})),
                state=RecordDict(),
                run_config={},
            )
            for nid in apps
        }
        self.error_at = error_at or {}
        self.silent_at = silent_at or {}
        self.run_id = 1
        self.replies_by_id: dict[str, Message | None] = {}  # None: a silent node
        self.ids = itertools.count()

    pull_interval = 0.001

    def push_messages(self, messages):
        """Deliver each message at once (its reply waits to be pulled) and return ids."""
        ids = []
        for msg in messages:
            mid = f"m{next(self.ids)}"
            msg.metadata.__dict__["_message_id"] = mid  # as Flower's in-memory grid does
            self.replies_by_id[mid] = self._answer(msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        replies = [self.replies_by_id.get(mid) for mid in message_ids]
        for mid in message_ids:
            if self.replies_by_id.get(mid) is not None:
                del self.replies_by_id[mid]
        return [r for r in replies if r is not None]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

    def _answer(self, msg):
        """The node's reply to ``msg``, or ``None`` for a node that stays silent."""
        nid = msg.metadata.dst_node_id
        kind = _kind(msg)
        self.sent.append(kind)
        if self.silent_at.get(nid) == kind:
            return None
        if self.error_at.get(nid) == kind:
            return Message(Error(code=0, reason="lost"), reply_to=msg)
        try:
            mod = self.mods.get(nid, PER_CLIENT_MOD)
            return mod(msg, self.contexts[nid], self.apps[nid])
        except Exception as exc:  # what Flower does with an exception in a ClientApp
            self.errors.setdefault(nid, []).append(repr(exc))
            return Message(Error(code=0, reason=repr(exc)), reply_to=msg)


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


def legacy_context(grid, nodes, global_arrays, current_round=1):
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
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({"current_round": current_round})
    ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters(global_arrays), True
    )
    return ctx


def run_round(workflow, updates, global_arrays, **grid_kwargs):
    nodes = sorted(updates)
    calls = dict.fromkeys(nodes, 0)

    def counting(nid):
        inner = trainer(*updates[nid])

        def app(msg, ctxt):
            calls[nid] += 1
            return inner(msg, ctxt)

        return app

    apps = {nid: counting(nid) for nid in nodes}
    grid = FakeGrid(apps, **grid_kwargs)
    ctx = legacy_context(grid, nodes, global_arrays)
    workflow(grid, ctx)
    grid.calls = calls
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
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=3, timeout=0.05)
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


def test_the_legacy_round_keeps_the_secure_aggregate_applied_bit_for_bit():
    """Through ``__call__`` the kept parameters are the released update added to the
    received ones, bit for bit, under weights whose FedAvg of identical float32 arrays
    (what the inner ``aggregate_fit`` computes) moves some of their last bits."""
    rng = np.random.default_rng(11)
    shapes = [(50, 80), (1000,)]
    global_arrays = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    updates = {
        nid: ([rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes], w)
        for nid, w in zip(NODES, (3, 5, 7, 11, 13), strict=False)
    }
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, seed=3)
    new, _ = run_round(workflow, updates, global_arrays)
    assert workflow.last_update is not None
    for got, g, u in zip(new, global_arrays, workflow.last_update, strict=True):
        want = (g + u).astype(g.dtype, copy=False)
        assert got.dtype == want.dtype == np.float32
        assert got.tobytes() == want.tobytes()


def workflow_frac_bits(result) -> int:
    return result.encoding.frac_bits - 10  # generous: rounding of 10 clients, weights


def test_reclusterings_average_the_same_fedavg():
    updates = updates_for(NODES, seed=1)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, reclusterings=2, clip=1.0, seed=4)
    new, _ = run_round(workflow, updates, global_arrays)
    assert len(workflow.last_result.reclusterings) == 2
    for got, want in zip(new, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_byzantine_clients_and_a_robust_rule():
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    honest = {nid: ([np.full(s, 0.1, np.float32) for s in SHAPES], 10) for nid in NODES}
    probe = ShareflWorkflow(atoms=False, cluster_size=3, clip=1.0, seed=5)
    run_round(probe, honest, global_arrays)
    byzantine = probe.last_result.clusters[0].members[:2]  # the same seed draws the same plan
    attacked = dict(honest)
    for nid in byzantine:
        attacked[nid] = ([np.full(s, -1.0, np.float32) for s in SHAPES], 1000)
    robust = ShareflWorkflow(atoms=False, cluster_size=3, clip=1.0, seed=5, rule=Median(f=1))
    new, _ = run_round(robust, attacked, global_arrays)
    assert len(robust.last_result.clusters) == 3
    for got in new:  # the median over 3 cluster means ignores the one bad cluster
        np.testing.assert_allclose(got, 0.1, atol=1e-5)
    plain = ShareflWorkflow(atoms=False, cluster_size=3, clip=1.0, seed=5)
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
        def push_messages(self, messages):
            ids = super().push_messages(messages)
            seen.append(any(f"{PREFIX}.state.input" in c.state for c in self.contexts.values()))
            return ids

    grid = Watching({nid: counting(nid) for nid in NODES})
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, reclusterings=2, clip=1.0, seed=6)
    workflow(grid, legacy_context(grid, NODES, global_arrays))
    assert len(workflow.last_result.reclusterings) == 2
    assert set(calls.values()) == {1}
    # assign, keys, masking (trained: kept), unmask | assign, keys, masking (dropped), unmask
    assert seen == [False, False, True, True, True, True, False, False]


# ---- signed mode: identities, a directory by stable client id, random node ids -------------

IDENTITIES = [IdentityKey.from_private(bytes([i + 1]) * 32) for i in range(N)]
DIRECTORY = {i: key.public for i, key in enumerate(IDENTITIES)}


def signed_mods(nodes=NODES):
    """Client i (directory id i) runs on Flower node ``nodes[i]``; its id comes from its
    identity's entry in the directory."""
    return {
        nid: make_sharefl_mod(
            ClientPolicy(identity=IDENTITIES[i], directory=DIRECTORY, require_signed=True),
            ephemeral_memory=True,
        )
        for i, nid in enumerate(nodes)
    }


def test_signed_round_equals_fedavg_with_a_dropout_at_the_consistency_stage():
    updates = updates_for(NODES, seed=8)
    global_arrays = [np.full(s, -0.25, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        atoms=False, cluster_size=5, clip=1.0, seed=3, signed=True, directory=DIRECTORY
    )
    lost = NODES[6]
    new, grid = run_round(
        workflow, updates, global_arrays, mods=signed_mods(), error_at={lost: "ConsistencyRequest"}
    )
    assert dict(workflow.last_route.nodes) == dict(enumerate(NODES))  # ids from the directory
    assert "hello" in grid.sent and "ConsistencyRequest" in grid.sent
    assert grid.sent.count("ConsistencyRequest") == N  # every client of both clusters
    result = workflow.last_result
    assert result is not None and len(result.clusters) == 2 and not result.failed
    assert not result.culprits and not workflow.last_node_culprits
    assert result.plan.participants == tuple(range(N))
    summed = set().union(*(set(c.members) for c in result.clusters))
    assert summed == set(range(N))  # lost after masking: its masked input still counts
    assert set(grid.calls.values()) == {1}
    bound = 2 * 2.0 ** -workflow_frac_bits(result)
    for got, g, want in zip(new, global_arrays, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got - g, want, atol=bound + 1e-6)


def test_a_node_that_trained_keeps_its_proven_id_and_skips_the_next_hello():
    """Signed mode: the hello stage is one exchange per round; a node that proved its id
    and trained keeps the id in the next round without one (the route is the server's own
    choice; each client still checks its assignment against its own identity). A node that
    did not train, or a new one, proves itself again; every round equals FedAvg on the
    model the last one left."""
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        atoms=False, cluster_size=5, clip=1.0, seed=5, signed=True, directory=DIRECTORY
    )
    hellos, routes = [], []
    lost = NODES[3]
    for round_index, error_at in enumerate([{}, {lost: "MaskingRequest"}, {}]):
        updates = updates_for(NODES, seed=20 + round_index)
        new, grid = run_round(
            workflow, updates, global_arrays, mods=signed_mods(), error_at=error_at
        )
        hellos.append(grid.sent.count("hello"))
        routes.append(dict(workflow.last_route.nodes))
        trained = [n for n in NODES if n not in error_at]
        result = workflow.last_result
        assert not result.culprits and not workflow.last_node_culprits
        bound = 2 * 2.0 ** -workflow_frac_bits(result)
        for got, g, want in zip(new, global_arrays, fedavg(updates, trained), strict=True):
            np.testing.assert_allclose(got - g, want, atol=bound + 1e-6)
        global_arrays = new
    assert hellos == [N, 0, 1]  # round 3: only the node that did not train in round 2
    assert routes == [dict(enumerate(NODES))] * 3


# ---- the client's memory (invariant I4): no replayed round or model -----------------------


def replay_grid(mods=None, **kwargs):
    """One grid whose nodes keep their Contexts across rounds, each client's trainer
    deterministic (the worst case: a replayed model gives the same update)."""
    updates = updates_for(NODES, seed=30)
    return FakeGrid({nid: trainer(*updates[nid]) for nid in NODES}, mods=mods, **kwargs), updates


def play(workflow, grid, global_arrays, current_round):
    ctx = legacy_context(grid, NODES, global_arrays, current_round)
    workflow(grid, ctx)
    return to_ndarrays(
        compat.arrayrecord_to_parameters(ctx.state.array_records[MAIN_PARAMS_RECORD], True)
    )


def test_a_model_replayed_under_other_clusterings_is_refused_by_every_client():
    """A server that sends the same model again under a new plan (a later round number)
    would get a second set of cluster sums of the same updates; every client refuses it
    before it trains, and nothing is released."""
    grid, _ = replay_grid()
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    honest = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1)
    play(honest, grid, global_arrays, 1)
    assert len(honest.last_result.clusters) == 2
    first = {tuple(c.members) for c in honest.last_result.clusters}
    hostile = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=2, max_empty_rounds=None)
    new = play(hostile, grid, global_arrays, 2)
    assert {tuple(c) for c in hostile.last_result.plan.clusterings[0].clusters} != first
    assert set(grid.errors) == set(NODES)
    assert all(
        "ModelReplayed" in e[-1] and "other clusterings" in e[-1] for e in grid.errors.values()
    )
    assert hostile.last_update is None and not hostile.last_result.clusters
    assert len(hostile.last_failures) == len(NODES)  # the error replies, as the server got them
    assert all("ModelReplayed" in str(f) for f in hostile.last_failures)
    for got, g in zip(new, global_arrays, strict=True):
        np.testing.assert_array_equal(got, g)


def test_a_masking_request_on_another_model_than_the_assignment_named_is_refused(monkeypatch):
    """The memory records the model the round's first assignment names; a server that then
    sends another model to train on is refused at the masking request, before training."""
    import sharefl.integrations.flower.workflow as workflow_module

    monkeypatch.setattr(workflow_module, "arrays_digest", lambda arrays: bytes(32))
    grid, _ = replay_grid()
    arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1, max_empty_rounds=None)
    play(workflow, grid, arrays, 1)
    assert set(grid.errors) == set(NODES)
    assert all("not the one the round's assignment named" in e[-1] for e in grid.errors.values())
    assert workflow.last_update is None


def test_an_assignment_that_names_no_model_is_refused_before_any_key_leaves():
    """A server that leaves out the model digest (so the memory could not check the model)
    gets an error reply from every client at its first assignment, and no advert."""

    def stripping(msg, ctxt, call_next):
        msg.content.pop(MODEL_RECORD, None)
        return PER_CLIENT_MOD(msg, ctxt, call_next)

    grid, _ = replay_grid(mods=dict.fromkeys(NODES, stripping))
    arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1, max_empty_rounds=None)
    play(workflow, grid, arrays, 1)
    assert set(grid.errors) == set(NODES)
    assert all("names no model digest" in e[-1] for e in grid.errors.values())
    assert set(grid.sent) == {"assign"} and workflow.last_update is None


def test_a_round_number_that_does_not_increase_is_refused():
    grid, _ = replay_grid()
    arrays = [np.zeros(s, np.float32) for s in SHAPES]
    play(ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1), grid, arrays, 3)
    moved = [a + 1 for a in arrays]  # a new model: only the round number is replayed
    replay = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1, max_empty_rounds=None)
    play(replay, grid, moved, 3)
    assert set(grid.errors) == set(NODES)
    assert all("RoundReplayed" in e[-1] for e in grid.errors.values())


def test_an_unchanged_model_is_planned_again_with_its_clusterings_and_completes():
    """The honest workflow's side of I4: a round that released nothing leaves the model as
    it was, so the next round reuses that model's clusterings (the clients accept them)."""
    grid, updates = replay_grid(error_at=dict.fromkeys(NODES, "UnmaskRequest"))
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1, timeout=0.05)
    unchanged = play(workflow, grid, global_arrays, 1)
    assert workflow.last_update is None  # no unmask answer in either cluster
    planned = workflow.last_result.plan.clusterings
    grid.error_at = {}
    new = play(workflow, grid, unchanged, 2)
    assert workflow.last_result.plan.clusterings == planned
    assert not grid.errors or all("Replayed" not in e[-1] for e in grid.errors.values())
    for got, g, want in zip(new, global_arrays, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got - g, want, atol=1e-4)


def test_a_state_dir_keeps_the_memory_across_a_restart(tmp_path):
    """With ``sharefl-state-dir`` the memory is a file: a restarted SuperNode (a fresh
    Context) still refuses the replayed model."""
    configs = {nid: {"sharefl-state-dir": str(tmp_path / str(i))} for i, nid in enumerate(NODES)}
    grid, _ = replay_grid(node_configs=configs)
    arrays = [np.zeros(s, np.float32) for s in SHAPES]
    play(ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=1), grid, arrays, 1)
    assert list((tmp_path / "0" / "memory").glob("client-*.json"))
    restarted, _ = replay_grid(node_configs=configs)  # new Contexts
    play(
        ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=2, max_empty_rounds=None),
        restarted,
        arrays,
        2,
    )
    assert set(restarted.errors) == set(NODES)
    assert all("ModelReplayed" in e[-1] for e in restarted.errors.values())


def searched_workflow(cluster_size: int, seed: int) -> ShareflWorkflow:
    """The signed workflow the searches drive: it never stops the run on empty rounds and
    counts a silent node as dropped after 50 ms."""
    return ShareflWorkflow(
        atoms=False,
        cluster_size=cluster_size,
        clip=1.0,
        seed=seed,
        signed=True,
        directory=DIRECTORY,
        max_empty_rounds=None,
        timeout=0.05,
    )


def revealed_small_sums(member_sets, clients, below: int) -> list[tuple[int, ...]]:
    """The oracle: every set of fewer than ``below`` clients whose sum lies in the row space
    (over Q) of the released sums' indicator vectors — what the server can solve from them,
    by exact linear algebra, sharing no code with the audits."""
    index = {c: i for i, c in enumerate(clients)}
    rows = np.zeros((len(member_sets), len(clients)))
    for r, members in enumerate(member_sets):
        for c in members:
            rows[r, index[c]] = 1.0
    rank = np.linalg.matrix_rank(rows) if len(member_sets) else 0
    found = []
    for size in range(1, below):
        for subset in itertools.combinations(clients, size):
            probe = np.zeros(len(clients))
            probe[[index[c] for c in subset]] = 1.0
            if np.linalg.matrix_rank(np.vstack([rows, probe])) == rank:
                found.append(subset)
    return found


@settings(max_examples=examples(8), deadline=None)
# Without the memory (a client that forgets between messages) four plans on one model
# solve client 1's update and four two-client sums: the case the memory exists for.
@example(rounds=[(0, 1, 0, None), (0, 2, 1, None), (0, 3, 2, None), (0, 4, 3, None)])
@given(
    rounds=st.lists(
        st.tuples(
            st.integers(0, 1),  # which model
            st.integers(1, 4),  # the round number the server claims
            st.integers(0, 3),  # the plan's seed
            st.one_of(st.none(), st.integers(0, N - 1)),  # a client lost at unmasking
        ),
        min_size=2,
        max_size=4,
    )
)
def test_a_server_replaying_rounds_and_models_learns_no_small_sum(rounds):
    """A malicious ServerApp that forgets nothing it was sent: each round it picks the model
    (one of two), the round number and the plan, and may lose a client at unmasking (other
    survivor sets), against signed clients that keep their Contexts; each round is
    otherwise the honest workflow's, a fresh one that knows no earlier release. Oracle
    (:func:`revealed_small_sums`): from every sum released on a model, across the rounds,
    no update and no sum of fewer than ``min_sum_size`` clients can be solved."""
    grid, _ = replay_grid(mods=signed_mods())
    models = [[np.full(s, v, np.float32) for s in SHAPES] for v in (0.0, 0.5)]
    released: dict[int, list[tuple[int, ...]]] = {0: [], 1: []}
    for model, number, seed, lost in rounds:
        grid.error_at = {} if lost is None else {NODES[lost]: "UnmaskRequest"}
        hostile = searched_workflow(cluster_size=3, seed=seed)
        play(hostile, grid, models[model], number)
        if hostile.last_result is not None:
            released[model] += [c.members for c in hostile.last_result.clusters]
    for sums in released.values():
        assert revealed_small_sums(sums, list(range(N)), below=3) == []


STAGES = [
    "hello",
    "assign",
    "KeysBroadcast",
    "MaskingRequest",
    "ConsistencyRequest",
    "UnmaskRequest",
]
EVENTS = st.one_of(
    st.sampled_from(["ok", "ok", "ok", "absent", "restart"]),
    st.sampled_from(STAGES).map(lambda stage: f"error:{stage}"),
)


@settings(max_examples=examples(12), deadline=None)
@given(
    rounds=st.lists(
        st.tuples(
            st.lists(EVENTS, min_size=N, max_size=N),
            st.one_of(
                st.none(),
                st.tuples(st.sampled_from(["wrong_key", "replay"]), st.integers(0, N - 1)),
            ),
        ),
        min_size=2,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_the_kept_hello_routes_only_proven_holders_and_asks_exactly_the_others(rounds, seed):
    """A search over signed rounds in a row: each directory client i, per round, is present,
    absent, restarted on a new Flower node id, or errs at a stage; at times an impostor
    node claims an id with a key that is not its own, or replays another node's hello.
    The oracle is the harness's own ground truth, not the workflow's bookkeeping: (1) every
    routed node holds the identity of the id it is routed under; (2) every honest node that
    answers (or kept its id) is routed; (3) hellos go to exactly the selected nodes that did
    not train in the previous round on the same node id (trained: its training app ran);
    (4) a released round is FedAvg over its summed members, each of which trained."""
    workflow = searched_workflow(cluster_size=5, seed=seed)
    node_of = list(NODES)  # directory id -> its Flower node id now
    fresh = itertools.count(1000)
    trained_before: set[int] = set()
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    for index, (events, impostor) in enumerate(rounds):
        holder, mods, error_at = {}, {}, {}
        for i, event in enumerate(events):
            if event == "restart":
                node_of[i] = next(fresh)
            if event == "absent":
                continue
            nid = node_of[i]
            holder[nid] = i
            mods[nid] = make_sharefl_mod(
                ClientPolicy(identity=IDENTITIES[i], directory=DIRECTORY, require_signed=True),
                ephemeral_memory=True,
            )
            if event.startswith("error:"):
                error_at[nid] = event.removeprefix("error:")
        if len(holder) < 2:
            continue
        selected = set(holder)
        if impostor is not None:
            kind, claimed = impostor
            bad = next(fresh)
            selected.add(bad)
            if kind == "wrong_key":
                mods[bad] = make_sharefl_mod(
                    ClientPolicy(
                        identity=IdentityKey.from_private(b"\xee" * 32),
                        directory=DIRECTORY,
                        require_signed=True,
                    ),
                    client_id=claimed,
                    ephemeral_memory=True,
                )
            else:
                mods[bad] = replaying(node_of[claimed], claimed)
        updates = updates_for(sorted(selected), seed=100 * seed + index)
        new, grid = run_round(workflow, updates, global_arrays, mods=mods, error_at=error_at)
        route = dict(workflow.last_route.nodes)
        assert all(holder.get(nid) == cid for cid, nid in route.items())  # (1)
        answering = {nid for nid in holder if nid in trained_before or error_at.get(nid) != "hello"}
        assert set(route.values()) == answering  # (2)
        assert grid.sent.count("hello") == len(selected - trained_before)  # (3)
        trained = {nid for nid, calls in grid.calls.items() if calls == 1}
        assert trained <= set(holder)
        result = workflow.last_result
        if workflow.last_update is not None:  # (4)
            summed = {route[c] for cluster in result.clusters for c in cluster.members}
            assert summed <= trained
            bound = 2 * 2.0 ** -workflow_frac_bits(result)
            for got, g, want in zip(
                new, global_arrays, fedavg(updates, sorted(summed)), strict=True
            ):
                np.testing.assert_allclose(got - g, want, atol=bound + 1e-6)
        trained_before, global_arrays = trained, new


def replaying(node_id: int, client: int):
    """A node that answers the hello with client ``client``'s valid signature for the node
    ``node_id`` it really runs on (as if it had copied that node's reply)."""

    def mod(msg, ctxt, call_next):
        nonce = get_record(msg.content, STAGE_RECORD)["nonce"]
        signature = IDENTITIES[client].sign(node_hello_message(node_id, client, nonce))
        out = RecordDict()
        put_record(out, f"{PREFIX}.hello", {"client_id": client, "signature": signature})
        return Message(out, reply_to=msg)

    return mod


def test_an_impostor_node_is_refused_at_hello_and_the_others_round_completes():
    impostor, stranger, replayer = 11, 12, 13  # Flower node ids
    nodes = [*NODES, impostor, stranger, replayer]
    updates = updates_for(nodes, seed=9)
    mods = signed_mods()
    wrong = IdentityKey.from_private(b"\xee" * 32)
    # Claims to be client 4 (on NODES[4] too) with a key that is not client 4's.
    mods[impostor] = make_sharefl_mod(
        ClientPolicy(identity=wrong, directory=DIRECTORY, require_signed=True),
        client_id=4,
        ephemeral_memory=True,
    )
    # A client id the directory does not list.
    mods[stranger] = make_sharefl_mod(
        ClientPolicy(
            identity=wrong, directory={**DIRECTORY, 99: wrong.public}, require_signed=True
        ),
        ephemeral_memory=True,
    )
    mods[replayer] = replaying(NODES[5], 5)  # client 5's signature, bound to another node
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        atoms=False, cluster_size=5, clip=1.0, seed=4, signed=True, directory=DIRECTORY
    )
    new, grid = run_round(workflow, updates, global_arrays, mods=mods)
    culprits = workflow.last_node_culprits
    assert set(culprits) == {impostor, stranger, replayer}
    assert "client 4" in culprits[impostor] and "not signed" in culprits[impostor]
    assert "client 5" in culprits[replayer] and "not signed" in culprits[replayer]
    assert "99" in culprits[stranger] and "lacks" in culprits[stranger]
    assert dict(workflow.last_route.nodes) == dict(enumerate(NODES))
    assert grid.calls[impostor] == grid.calls[stranger] == grid.calls[replayer] == 0
    result = workflow.last_result
    assert len(result.clusters) == 2 and not result.failed and not result.culprits
    for got, want in zip(new, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def corrupt_advert_signature(inner):
    """A Byzantine client: an honest hello, but its advertised keys carry a signature that
    does not verify (as if the server or the client had substituted them)."""

    def mod(msg, ctxt, call_next):
        reply = inner(msg, ctxt, call_next)
        if f"{PREFIX}.message" in reply.content.config_records:
            record = get_record(reply.content, f"{PREFIX}.message")
            if record["type"] == "AdvertiseKeys":
                record["signature"] = bytes([record["signature"][0] ^ 1]) + record["signature"][1:]
                put_record(reply.content, f"{PREFIX}.message", record)
        return reply

    return mod


def test_a_client_whose_advert_signature_does_not_verify_is_named_and_left_out():
    updates = updates_for(NODES, seed=10)
    mods = signed_mods()
    bad = 2
    mods[NODES[bad]] = corrupt_advert_signature(mods[NODES[bad]])
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        atoms=False, cluster_size=5, clip=1.0, seed=5, signed=True, directory=DIRECTORY
    )
    new, _ = run_round(workflow, updates, global_arrays, mods=mods)
    result = workflow.last_result
    assert set(result.culprits) == {bad} and "signature" in result.culprits[bad].lower()
    assert len(result.clusters) == 2 and not result.failed
    summed = set().union(*(set(c.members) for c in result.clusters))
    assert summed == set(range(N)) - {bad}
    honest = [nid for i, nid in enumerate(NODES) if i != bad]
    for got, want in zip(new, fedavg(updates, honest), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_clients_that_require_signed_mode_refuse_an_unsigned_workflow():
    updates = updates_for(NODES, seed=11)
    global_arrays = [np.full(s, 0.5, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=6)  # no downgrade
    new, grid = run_round(workflow, updates, global_arrays, mods=signed_mods())
    assert set(grid.errors) == set(NODES)
    assert all("requires signed mode" in e[0] for e in grid.errors.values())
    assert set(grid.sent) == {"assign"}  # refused before any key left a client
    assert set(grid.calls.values()) == {0}
    assert workflow.last_update is None and not workflow.last_result.clusters
    for got, g in zip(new, global_arrays, strict=True):
        np.testing.assert_array_equal(got, g)


def test_a_signed_workflow_runs_no_round_with_unsigned_clients():
    updates = updates_for(NODES, seed=12)
    global_arrays = [np.full(s, 0.5, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        atoms=False, cluster_size=5, clip=1.0, seed=7, signed=True, directory=DIRECTORY
    )
    new, grid = run_round(workflow, updates, global_arrays)  # sharefl_mod: no identity
    assert set(grid.errors) == set(NODES) and set(grid.sent) == {"hello"}
    assert not workflow.last_route.nodes and workflow.last_result is None
    for got, g in zip(new, global_arrays, strict=True):
        np.testing.assert_array_equal(got, g)


def test_signed_mode_and_the_directory_come_together(tmp_path):
    with pytest.raises(ConfigurationError):
        ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, signed=True)
    with pytest.raises(ConfigurationError):
        ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, directory=DIRECTORY)
    with pytest.raises(ConfigurationError, match="one public key under clients"):
        ShareflWorkflow(
            atoms=False,
            cluster_size=5,
            clip=1.0,
            signed=True,
            directory={**DIRECTORY, 50: DIRECTORY[0]},
        )
    path = tmp_path / "directory.json"
    path.write_text(json.dumps({"identities": {str(i): k.hex() for i, k in DIRECTORY.items()}}))
    assert ShareflWorkflow(
        atoms=False, cluster_size=5, clip=1.0, signed=True, directory=path
    )._directory == (DIRECTORY)


def test_a_signed_round_from_sharefl_keygen_files_and_node_configs(tmp_path):
    """The deployment path: ``sharefl keygen`` writes the identities and directory.json;
    each SuperNode's node config names its identity file and the directory, the server
    reads the same directory.json."""
    keys = keygen(tmp_path / "keys", range(N))
    configs = {
        nid: {
            "sharefl-identity": str(keys / f"client-{i}.identity"),
            "sharefl-directory": str(keys / "directory.json"),
        }
        for i, nid in enumerate(NODES)
    }
    mod = make_sharefl_mod(policy_from_node_config)
    updates = updates_for(NODES, seed=13)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(
        cluster_size=5, clip=1.0, seed=8, signed=True, directory=keys / "directory.json"
    )
    new, _ = run_round(
        workflow,
        updates,
        global_arrays,
        mods=dict.fromkeys(NODES, mod),
        node_configs=configs,
    )
    assert dict(workflow.last_route.nodes) == dict(enumerate(NODES))
    assert len(workflow.last_result.clusters) == 2
    for got, want in zip(new, fedavg(updates, NODES), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    bare = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(FlowerIntegrationError, match="sharefl-identity"):
        policy_from_node_config(bare)


# -- distributed DP in the clusters (privacy=) ----------------------------------------------


def ddg(noise_multiplier: float) -> DistributedDPConfig:
    """32 bits: no coordinate of a sum wraps around (at 16 bits one beyond k = 4 standard
    deviations would, rarely, by design)."""
    return DistributedDPConfig(
        "skellam",
        clip=1.0,
        noise_multiplier=noise_multiplier,
        min_survivors=3,
        max_summands=5,
        bits=32,
    )


def clipped_mean(updates, nodes, clip=1.0):
    """The unweighted mean of the updates each clipped to l2 norm ``clip`` (per array)."""
    flat = []
    for n in nodes:
        u = np.concatenate([a.astype(np.float64).reshape(-1) for a in updates[n][0]])
        flat.append(u * min(1.0, clip / np.linalg.norm(u)))
    mean = np.mean(flat, axis=0)
    return [mean[:12].reshape(3, 4), mean[12:]]


def test_with_privacy_the_round_is_the_mean_of_clipped_updates_and_the_ledger_charges_it():
    """σ tiny: the new arrays are the unweighted mean of the clipped updates (the clients'
    ring inputs decode on the server with the round's seed); ε is the mechanism's own for
    sums of 5 members, as charged by the server's ledger."""
    updates = updates_for(NODES, seed=21)
    global_arrays = [np.full(s, 0.25, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=3, privacy=ddg(1e-4))
    mod = make_sharefl_mod(PER_CLIENT_POLICY, privacy=ddg(1e-4))
    new, grid = run_round(workflow, updates, global_arrays, mods=dict.fromkeys(NODES, mod))
    assert not grid.errors and len(workflow.last_result.clusters) == 2
    assert workflow.last_result.encoding is None  # no float encoding was proposed
    for got, g, want in zip(new, global_arrays, clipped_mean(updates, NODES), strict=True):
        np.testing.assert_allclose(got - g, want, atol=2e-4)  # noise std 2e-5, rounding
    encoder = DistributedEncoder(ddg(1e-4), 17)
    assert workflow.last_epsilon == pytest.approx(
        epsilon_after(encoder, 1, workflow.delta, members=5)
    )


def test_a_private_client_refuses_a_float_round_and_a_float_client_a_private_one():
    """Its own config decides: a client holding privacy refuses the assignment of a round
    that proposes a float encoding (before any key leaves it); a client without it refuses
    a round that proposes none."""
    updates = updates_for(NODES, seed=22)
    global_arrays = [np.full(s, 0.5, np.float32) for s in SHAPES]
    mod = make_sharefl_mod(PER_CLIENT_POLICY, privacy=ddg(1.0))
    _, grid = run_round(
        ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=4),
        updates,
        global_arrays,
        mods=dict.fromkeys(NODES, mod),
    )
    assert set(grid.errors) == set(NODES) and set(grid.sent) == {"assign"}
    assert all("proposed a float encoding" in e[0] for e in grid.errors.values())
    _, grid = run_round(
        ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=4, privacy=ddg(1.0)),
        updates,
        global_arrays,
    )
    assert set(grid.errors) == set(NODES) and set(grid.sent) == {"assign"}
    assert all("no privacy config" in e[0] for e in grid.errors.values())


def test_a_round_that_releases_nothing_says_why_in_the_servers_log(caplog):
    """The server's log names the clients' error replies (here: every client requires
    signed mode) instead of only "released no cluster sum"."""
    updates = updates_for(NODES, seed=23)
    global_arrays = [np.full(s, 0.5, np.float32) for s in SHAPES]
    with caplog.at_level("ERROR"):
        run_round(
            ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=5),
            updates,
            global_arrays,
            mods=signed_mods(),
        )
    (line,) = [
        r.getMessage() for r in caplog.records if "released no cluster sum" in r.getMessage()
    ]
    assert f"{N} client error replies" in line and "requires signed mode" in line
    assert f"(×{N})" in line


def test_a_round_whose_sums_the_rule_cannot_aggregate_keeps_the_model(caplog):
    """4 clients in clusters of 3 release one cluster sum and Median(f=1) needs 3 (as when a
    simulation's round 1 starts before all its nodes registered): the round keeps the model
    instead of ending the run, the server's log says why, and the round counts towards
    ``max_empty_rounds``."""
    nodes = NODES[:4]
    updates = updates_for(nodes, seed=24)
    global_arrays = [np.full(s, 0.5, np.float32) for s in SHAPES]
    options = dict(atoms=False, cluster_size=3, clip=1.0, seed=5, rule=Median(f=1))
    workflow = ShareflWorkflow(**options)
    with caplog.at_level("ERROR"):
        new, grid = run_round(workflow, updates, global_arrays)
    assert not grid.errors and len(workflow.last_result.clusters) == 1
    assert all(np.array_equal(n, g) for n, g in zip(new, global_arrays, strict=True))
    assert workflow.last_update is None and workflow.empty_rounds == 1
    (line,) = [r.getMessage() for r in caplog.records if "cannot aggregate" in r.getMessage()]
    assert "round 1 released 1 cluster sum, which the rule cannot aggregate" in line
    assert "Median(f=1) needs n >= 2f + 1 = 3 rows, got n = 1" in line
    with pytest.raises(NothingReleased, match="1 cluster sum, which the rule cannot aggregate"):
        run_round(ShareflWorkflow(**options, max_empty_rounds=1), updates, global_arrays)


def test_the_first_round_warns_when_the_rule_cannot_withstand_the_named_byzantine_count(caplog):
    """10 clients in clusters of 3 (3 clusters): Median(f=1) cannot hold against 2 Byzantine
    clients (2 or more clusters spoiled with probability 0.73: the exact distribution),
    and the workflow says so once, at its first round; against 1 it holds and says
    nothing. A negative count is refused by name."""
    updates = updates_for(NODES)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    for byzantine, warned in ((2, True), (1, False)):
        caplog.clear()
        workflow = ShareflWorkflow(
            atoms=False, cluster_size=3, clip=1.0, seed=5, rule=Median(f=1), byzantine=byzantine
        )
        with caplog.at_level("WARNING"):
            run_round(workflow, updates, global_arrays)
            run_round(workflow, updates, global_arrays)
        lines = [r.getMessage() for r in caplog.records if "byzantine=" in r.getMessage()]
        assert len(lines) == (1 if warned else 0), lines
        if warned:
            assert "2 Byzantine clients among 10" in lines[0] and "0.73" in lines[0]
    with pytest.raises(ConfigurationError, match="byzantine"):
        ShareflWorkflow(atoms=False, cluster_size=3, clip=1.0, byzantine=-1)


def test_a_silent_client_costs_the_idle_timeout_not_the_round():
    """A client that never answers its masking request is a drop-out after ``timeout``
    seconds without a new reply (not a hung round); the others' FedAvg is exact."""
    updates = updates_for(NODES)
    global_arrays = [np.zeros(s, np.float32) for s in SHAPES]
    workflow = ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=3, timeout=0.2)
    hung = NODES[4]
    started = time.monotonic()
    new, _ = run_round(workflow, updates, global_arrays, silent_at={hung: "MaskingRequest"})
    # not hung: less than the stage's other deadline (a bound on work, not a time budget)
    assert time.monotonic() - started < workflow.first_reply_timeout
    summed = set().union(*(set(c.members) for c in workflow.last_result.clusters))
    assert summed == set(NODES) - {hung}
    for got, want in zip(new, fedavg(updates, sorted(summed)), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
