"""The ClientApp, Message-API style: an ``@app.train()`` function that replies with the
trained ``ArrayRecord`` and ``"num-examples"``; ``sharefl_mod`` runs the secure aggregation
around it (the trained arrays never leave the client: only its masked update does)."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flower_share_message.task import AppConfig, load_data, train
from sharefl.integrations.flower import sharefl_mod

MAX_WEIGHT = 1000
"""The largest number of examples a client may report (the server's ``max_weight``)."""

app = ClientApp(mods=[sharefl_mod])


@app.train()
def train_locally(msg: Message, context: Context) -> Message:
    """Gradient steps from the received arrays; the first ``byzantine-clients`` partitions
    reverse and amplify their update and claim the largest weight allowed."""
    config = AppConfig.from_run_config(context.run_config)
    pid = int(context.node_config["partition-id"])
    x, y = load_data(pid)
    received = msg.content["arrays"].to_numpy_ndarrays()
    trained = train(received, x, y, config.local_epochs, config.learning_rate)
    weight = len(y)
    if pid < config.byzantine_clients:
        trained = [p - 10 * (t - p) for p, t in zip(received, trained, strict=True)]
        weight = MAX_WEIGHT
    metrics = MetricRecord({"num-examples": weight})
    return Message(RecordDict({"arrays": ArrayRecord(trained), "metrics": metrics}), reply_to=msg)
