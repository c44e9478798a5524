"""The ClientApp: trains locally; ``sharefl_mod`` runs the secure aggregation around it."""

from __future__ import annotations

from flwr.app import Context
from flwr.client import ClientApp, NumPyClient

from flower_share.task import AppConfig, evaluate, load_data, train
from sharefl.integrations.flower import sharefl_mod

MAX_WEIGHT = 1000
"""The largest number of examples a client may report (the server's ``max_weight``)."""


class LogRegClient(NumPyClient):
    """An honest client, or (``byzantine``) one that reverses and amplifies its update and
    claims the largest weight allowed."""

    def __init__(self, partition_id: int, config: AppConfig, byzantine: bool):
        self.x, self.y = load_data(partition_id)
        self.config = config
        self.byzantine = byzantine

    def fit(self, parameters, config):
        trained = train(
            parameters, self.x, self.y, self.config.local_epochs, self.config.learning_rate
        )
        if self.byzantine:
            trained = [p - 10 * (t - p) for p, t in zip(parameters, trained, strict=True)]
            return trained, MAX_WEIGHT, {}
        return trained, len(self.y), {}

    def evaluate(self, parameters, config):
        loss, accuracy = evaluate(parameters, self.x, self.y)
        return loss, len(self.y), {"accuracy": accuracy}


def client_fn(context: Context):
    config = AppConfig.from_run_config(context.run_config)
    pid = int(context.node_config["partition-id"])
    return LogRegClient(pid, config, byzantine=pid < config.byzantine_clients).to_client()


app = ClientApp(client_fn=client_fn, mods=[sharefl_mod])
