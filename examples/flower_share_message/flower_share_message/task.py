"""The model, the data and the app's settings (numpy only, nothing downloaded; the same
task as examples/flower_share: a Flower app is packaged alone, so each example has its own).

Each client holds a shard of a synthetic binary task: points in ``DIM`` dimensions labelled
by a fixed hyperplane (with 5 % label noise), shifted per client so the shards differ. The
model is logistic regression: a weight vector and a bias, trained by full-batch gradient
descent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np

DIM = 20
EXAMPLES = 200
"""Examples per client (the test set has as many per client as well)."""
CLIENTS = 10
"""The federation's SuperNodes (README: ``--num-supernodes 10``). Every round waits for all
of them: a simulation registers its nodes while the first round starts, and a round with
fewer than 9 clients makes fewer than the 3 clusters the median needs."""

TRUE_W = np.random.default_rng(2024).normal(size=DIM)


@dataclass(frozen=True)
class AppConfig:
    """The run config (``[tool.flwr.app.config]``; keys with dashes). A key the run config
    lacks keeps its default here.

    Attributes:
        num_server_rounds: Flower rounds.
        cluster_size: clients per secure-aggregation cluster.
        clip: per-coordinate bound of a client's update.
        rule: the robust rule over the cluster means: ``"median"``, ``"trmean"`` (trimmed
            mean, one cluster cut at each end) or ``"mean"`` (FedAvg).
        byzantine_clients: how many clients (the first partitions) send a reversed,
            amplified update with the largest weight.
        local_epochs: gradient steps per round on a client.
        learning_rate: the step size.
    """

    num_server_rounds: int = 5
    cluster_size: int = 3
    clip: float = 0.5
    rule: str = "median"
    byzantine_clients: int = 1
    local_epochs: int = 5
    learning_rate: float = 0.5

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> AppConfig:
        """Raises ``ValueError`` for a key no field has."""
        known = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = set(run_config) - set(known)
        if unknown:
            raise ValueError(f"unknown run config keys {sorted(unknown)}")
        defaults = cls()
        return cls(
            **{
                known[k].name: type(getattr(defaults, known[k].name))(v)
                for k, v in run_config.items()
            }
        )


def load_data(partition_id: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Partition ``partition_id``'s examples ``(X [EXAMPLES, DIM], y [EXAMPLES] in {0, 1})``."""
    rng = np.random.default_rng([seed, partition_id])
    x = rng.normal(size=(EXAMPLES, DIM)) + rng.normal(scale=0.5, size=DIM)
    y = (x @ TRUE_W > 0).astype(np.float64)
    flip = rng.random(EXAMPLES) < 0.05
    y[flip] = 1 - y[flip]
    return x, y


def test_data() -> tuple[np.ndarray, np.ndarray]:
    """A held-out set for the server's evaluation."""
    return load_data(partition_id=10_000, seed=1)


def initial_parameters() -> list[np.ndarray]:
    return [np.zeros(DIM, np.float32), np.zeros(1, np.float32)]


def _logits(params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    w, b = params
    return x @ w.astype(np.float64) + float(b[0])


def train(params: list[np.ndarray], x, y, epochs: int, lr: float) -> list[np.ndarray]:
    """``epochs`` full-batch gradient steps of the logistic loss from ``params``."""
    w, b = params[0].astype(np.float64), float(params[1][0])
    for _ in range(epochs):
        p = 1 / (1 + np.exp(-(x @ w + b)))
        w = w - lr * x.T @ (p - y) / len(y)
        b = b - lr * float(np.mean(p - y))
    return [w.astype(np.float32), np.array([b], np.float32)]


def evaluate(params: list[np.ndarray], x, y) -> tuple[float, float]:
    """(logistic loss, accuracy) of ``params`` on ``(x, y)``."""
    z = _logits(params, x)
    loss = float(np.mean(np.logaddexp(0, z) - y * z))
    return loss, float(np.mean((z > 0) == (y > 0.5)))
