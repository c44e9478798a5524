"""sharefl inside a real Flower simulation: ``flwr.simulation.run_simulation`` with 10
virtual clients on the Ray backend (2 CPUs, no dashboard), compared with Flower's own FedAvg
run on the same clients in the same process.

The client apps live in this module: Ray's workers import it by name (Flower puts the
driver's ``sys.path`` on their ``PYTHONPATH``). Each client's update depends only on its
partition id, so the two runs see the same updates whatever node ids Flower draws.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from conftest import ray_backend
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client import ClientApp, NumPyClient
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.simulation import run_simulation

from sharefl.crypto.signatures import IdentityKey
from sharefl.integrations.flower import PREFIX, ShareflWorkflow, get_record, make_sharefl_mod
from sharefl.protocol.client import ClientPolicy
from sharefl.robust.coordinate import Median

N = 10
SHAPES = [(20, 8), (8,)]
LOST_AT_MASKING = 1  # partition ids
LOST_AT_UNMASKING = 2
LOST_AT_CONSISTENCY = 3
BYZANTINE = 0

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def honest_update(pid: int) -> tuple[list[np.ndarray], int]:
    rng = np.random.default_rng(100 + pid)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in SHAPES], 10 + 3 * pid


class UpdateClient(NumPyClient):
    """Trains by adding its partition's fixed update. The server's fit config names the
    scenario: in ``"dropout"`` partition LOST_AT_MASKING crashes while training (a drop-out
    at the masking stage); in ``"byzantine"`` partition BYZANTINE sends -1 everywhere with a
    weight of 1000."""

    def __init__(self, pid: int):
        self.pid = pid

    def fit(self, parameters, config):
        scenario = config["scenario"]
        if scenario == "dropout" and self.pid == LOST_AT_MASKING:
            raise RuntimeError(f"client {self.pid} crashed while training")
        update, weight = scenario_update(scenario, self.pid)
        trained = [(p + u).astype(np.float32) for p, u in zip(parameters, update, strict=True)]
        return trained, weight, {"pid": self.pid}


def scenario_update(scenario: str, pid: int) -> tuple[list[np.ndarray], int]:
    if scenario == "byzantine" and pid == BYZANTINE:
        return [np.full(s, -1.0, np.float32) for s in SHAPES], 1000
    rng = np.random.default_rng(100 + pid)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in SHAPES], 10 + 3 * pid


def _pid(context: Context) -> int:
    return int(context.node_config["partition-id"])


def client_fn(context: Context):
    return UpdateClient(_pid(context)).to_client()


LOSSES = {
    ("dropout", LOST_AT_UNMASKING): "UnmaskRequest",
    ("signed", LOST_AT_CONSISTENCY): ("ConsistencyRequest"),
}


def lose_a_client(msg: Message, ctxt: Context, call_next) -> Message:
    """An outer mod: in the ``"dropout"`` scenario (remembered from the fit instructions),
    the client of partition LOST_AT_UNMASKING fails its unmask request; in ``"signed"``,
    that of LOST_AT_CONSISTENCY its consistency request."""
    if "fitins.config" in msg.content.config_records:
        ctxt.state["scenario"] = ConfigRecord(dict(msg.content.config_records["fitins.config"]))
    scenario = ctxt.state.config_records.get("scenario", {}).get("scenario")
    lost_at = LOSSES.get((scenario, _pid(ctxt)))
    if (
        lost_at is not None
        and f"{PREFIX}.message" in msg.content.config_records
        and get_record(msg.content, f"{PREFIX}.message")["type"] == lost_at
    ):
        raise RuntimeError(f"lost at {lost_at}")
    return call_next(msg, ctxt)


def identity(pid: int) -> IdentityKey:
    """Partition ``pid``'s identity: derived from the partition id, so the driver and Ray's
    workers (which import this module anew) agree; a deployment uses ``sharefl keygen``."""
    return IdentityKey.from_private(hashlib.sha256(f"sharefl-test/{pid}".encode()).digest())


DIRECTORY = {pid: identity(pid).public for pid in range(N)}


def policy(context: Context) -> ClientPolicy:
    """Each client's identity and the directory, keyed by partition id. Signed rounds run
    on directory ids, unsigned rounds (the other scenarios) on node ids."""
    return ClientPolicy(identity=identity(_pid(context)), directory=DIRECTORY)


CLIENT_APP = ClientApp(client_fn=client_fn, mods=[lose_a_client, make_sharefl_mod(policy)])


class Recording(FedAvg):
    """FedAvg that keeps what its ``aggregate_fit`` returned, its number of failures, and
    each node's partition id (from the clients' fit metrics)."""

    aggregated: list[np.ndarray] | None = None
    failures = -1
    pids: dict[int, int]

    def aggregate_fit(self, server_round, results, failures):
        self.pids = {proxy.node_id: int(res.metrics["pid"]) for proxy, res in results}
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        self.aggregated = parameters_to_ndarrays(parameters) if parameters else None
        self.failures = len(failures)
        return parameters, metrics


GLOBAL = [np.full(s, 0.25, np.float32) for s in SHAPES]
OFFSETS = {"dropout": 0.0, "byzantine": 1.0, "signed": 2.0}


def initial(scenario: str) -> list[np.ndarray]:
    """The scenario's initial model. The runs share one Flower run and the clients remember
    the models they contributed on (invariant I4): each scenario starts from its own."""
    return [(g + OFFSETS[scenario]).astype(np.float32) for g in GLOBAL]


def numbered(workflow: ShareflWorkflow, number: int):
    """``workflow`` as round ``number`` of the run: the clients refuse a round number of
    the run they already took part in (I4), and each one-round run here starts at 1."""

    def fit(grid, context: LegacyContext) -> None:
        context.state.config_records[MAIN_CONFIGS_RECORD][WorkflowKey.CURRENT_ROUND] = number
        workflow(grid, context)

    return fit


@dataclass
class Run:
    """One Flower round of a scenario: its strategy and (for sharefl) its workflow."""

    scenario: str
    workflow: ShareflWorkflow | None
    strategy: Recording = field(init=False)

    def __post_init__(self) -> None:
        self.strategy = Recording(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=N,
            min_available_clients=N,
            initial_parameters=ndarrays_to_parameters(initial(self.scenario)),
            on_fit_config_fn=lambda _: {"scenario": self.scenario},
        )


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """Five one-round runs in one ``run_simulation`` (one Ray start): the drop-out and
    Byzantine scenarios with Flower's FedAvg and with sharefl, and a signed sharefl round;
    the clients keep their node ids and contexts. Per-client clusters (``atoms=False``;
    the clients' policy accepts them): these are the protocol's mechanics in a real Flower
    simulation; atoms are test_flower_atoms.py's and the example's."""
    runs = {
        "dropout/fedavg": Run("dropout", None),
        "dropout/sharefl": Run(
            "dropout", ShareflWorkflow(atoms=False, cluster_size=5, clip=1.0, seed=11)
        ),
        "byzantine/fedavg": Run("byzantine", None),
        "byzantine/sharefl": Run(
            "byzantine",
            ShareflWorkflow(atoms=False, cluster_size=3, clip=1.0, seed=12, rule=Median(f=1)),
        ),
        "signed/sharefl": Run(
            "signed",
            ShareflWorkflow(
                atoms=False, cluster_size=5, clip=1.0, seed=13, signed=True, directory=DIRECTORY
            ),
        ),
    }
    server = ServerApp()

    @server.main()
    def main(grid, context: Context) -> None:
        for number, run in enumerate(runs.values(), start=1):
            legacy = LegacyContext(
                Context(context.run_id, 0, {}, RecordDict(), {}),
                config=ServerConfig(num_rounds=1),
                strategy=run.strategy,
            )
            if run.workflow is None:
                DefaultWorkflow()(grid, legacy)
            else:
                DefaultWorkflow(fit_workflow=numbered(run.workflow, number))(grid, legacy)

    run_simulation(server, CLIENT_APP, num_supernodes=N, backend_config=ray_backend())
    for name, run in runs.items():
        assert run.strategy.aggregated is not None, f"{name} aggregated nothing"
    return runs


def test_secure_aggregate_equals_flowers_fedavg_with_dropouts(runs):
    plain, secure = runs["dropout/fedavg"].strategy, runs["dropout/sharefl"].strategy
    assert plain.failures == 1  # the client lost while training
    assert sorted(plain.pids.values()) == [p for p in range(N) if p != LOST_AT_MASKING]
    result = runs["dropout/sharefl"].workflow.last_result
    assert result is not None and not result.failed
    summed = {secure.pids[nid] for c in result.clusters for nid in c.members}
    # Lost at masking: left out. Lost at unmasking: its masked input was summed, it counts.
    assert summed == set(range(N)) - {LOST_AT_MASKING}
    assert secure.failures == 2  # the workflow hands both error replies to the strategy
    bound = N * 2.0**-result.encoding.frac_bits + 1e-6  # rounding, and float32 on both sides
    for got, want, g in zip(secure.aggregated, plain.aggregated, initial("dropout"), strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=bound)
        assert float(np.abs(got - g).max()) > 0.01  # the round moved the model


def test_byzantine_client_and_a_robust_rule(runs):
    plain, robust = runs["byzantine/fedavg"].strategy, runs["byzantine/sharefl"].strategy
    result = runs["byzantine/sharefl"].workflow.last_result
    assert len(result.clusters) == 3 and not result.failed
    # The rule's result on the same updates: the coordinate-wise median of the three
    # clusters' weighted means (the attacker's cluster mean is pulled to about -1).
    means = []
    for c in result.clusters:
        updates = [scenario_update("byzantine", robust.pids[nid]) for nid in c.members]
        total = sum(w for _, w in updates)
        means.append(
            [sum(u[k].astype(np.float64) * w for u, w in updates) / total for k in range(2)]
        )
    start = initial("byzantine")
    for k, got in enumerate(robust.aggregated):
        want = start[k] + np.median(np.stack([m[k] for m in means]), axis=0)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        assert float(np.abs(got - start[k]).max()) <= 0.5  # honest updates are in ±0.5
    # Flower's FedAvg on the same updates is dragged towards the attacker's -1.
    assert float(plain.aggregated[0].mean() - start[0].mean()) < -0.5


def test_signed_round_with_a_dropout_at_the_consistency_stage(runs):
    run = runs["signed/sharefl"]
    workflow, strategy = run.workflow, run.strategy
    route = workflow.last_route.nodes
    assert sorted(route) == list(range(N)) and not workflow.last_node_culprits
    # Every client proved its partition's directory entry from its Flower node.
    assert {cid: strategy.pids[nid] for cid, nid in route.items()} == {p: p for p in range(N)}
    result = workflow.last_result
    assert len(result.clusters) == 2 and not result.failed and not result.culprits
    # Lost after masking: its masked input is summed, it counts.
    assert {i for c in result.clusters for i in c.members} == set(range(N))
    assert strategy.failures == 1  # the error reply at the consistency stage
    updates = [honest_update(pid) for pid in range(N)]
    total = sum(w for _, w in updates)
    bound = N * 2.0**-result.encoding.frac_bits + 1e-6
    for k, got in enumerate(strategy.aggregated):
        want = initial("signed")[k] + sum(u[k].astype(np.float64) * w for u, w in updates) / total
        np.testing.assert_allclose(got, want, rtol=0, atol=bound)
