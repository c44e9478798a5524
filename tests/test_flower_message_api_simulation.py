"""sharefl inside a real Flower simulation written the Message-API way:
``flwr.simulation.run_simulation`` with 10 virtual clients (Ray, 2 CPUs), a ``ServerApp``
whose ``@app.main()`` runs ``ShareflStrategy(FedAvg(...)).start(...)`` and Flower's own
``FedAvg.start(...)`` on the same clients, and a ``ClientApp`` whose ``@app.train()``
function returns an ``ArrayRecord`` and ``"num-examples"``, behind ``sharefl_mod``.

The client app lives in this module: Ray's workers import it by name. Each client's update
depends only on its partition id, so both runs see the same updates.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from conftest import ray_backend
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

from sharefl.integrations.flower import ShareflStrategy, sharefl_mod

N = 10
SHAPES = [(20, 8), (8,)]
ROUNDS = 2

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def update_of(pid: int) -> tuple[list[np.ndarray], int]:
    rng = np.random.default_rng(200 + pid)
    return [rng.uniform(-0.3, 0.3, s).astype(np.float32) for s in SHAPES], 10 + 3 * pid


CLIENT_APP = ClientApp(mods=[sharefl_mod])


@CLIENT_APP.train()
def train(msg: Message, context: Context) -> Message:
    """Adds this partition's fixed update to the arrays it received."""
    update, weight = update_of(int(context.node_config["partition-id"]))
    received = msg.content["arrays"].to_numpy_ndarrays()
    trained = [(r + u).astype(np.float32) for r, u in zip(received, update, strict=True)]
    metrics = MetricRecord({"num-examples": weight, "train-loss": float(weight)})
    return Message(RecordDict({"arrays": ArrayRecord(trained), "metrics": metrics}), reply_to=msg)


def strategy() -> FedAvg:
    # min_train_nodes = N: FedAvg samples fraction_train of the nodes connected when it
    # samples, which at the first round may be fewer than N (seen: 2 of 10)
    return FedAvg(
        fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=N, min_available_nodes=N
    )


@pytest.fixture(scope="module")
def results():
    """Flower's FedAvg and sharefl's secure FedAvg, ``ROUNDS`` rounds each, one Ray start."""
    runs: dict[str, object] = {}
    initial = ArrayRecord([np.full(s, 0.25, np.float32) for s in SHAPES])
    server = ServerApp()

    @server.main()
    def main(grid, context: Context) -> None:
        runs["fedavg"] = strategy().start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS)
        secure = ShareflStrategy(strategy(), cluster_size=5, clip=1.0, seed=21)
        runs["sharefl"] = secure.start(grid=grid, initial_arrays=initial, num_rounds=ROUNDS)
        runs["clusters"] = [len(secure.secure.last_result.clusters)]

    run_simulation(server, CLIENT_APP, num_supernodes=N, backend_config=ray_backend())
    return runs


def test_the_message_api_app_reaches_flowers_fedavg_through_secure_aggregation(results):
    assert results["clusters"] == [2]
    plain = results["fedavg"].arrays.to_numpy_ndarrays()
    secure = results["sharefl"].arrays.to_numpy_ndarrays()
    weights = [update_of(p)[1] for p in range(N)]
    for k, (a, b) in enumerate(zip(plain, secure, strict=True)):
        step = sum(update_of(p)[0][k] * w for p, w in enumerate(weights)) / sum(weights)
        np.testing.assert_allclose(a, 0.25 + ROUNDS * step, atol=1e-5)  # Flower's own FedAvg
        np.testing.assert_allclose(b, a, atol=1e-4)  # sharefl's, through the ring
    plain_loss = results["fedavg"].train_metrics_clientapp[ROUNDS]["train-loss"]
    secure_loss = results["sharefl"].train_metrics_clientapp[ROUNDS]["train-loss"]
    assert secure_loss == pytest.approx(plain_loss)  # the inner strategy saw every reply
