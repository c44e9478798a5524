"""A malicious ServerApp for Flower's deployment engine (``deploy_local.py --serverapp``;
tests/test_flower_deployment_engine.py): round 1 is the signed example's honest round; in
round 2 the server sends round 1's *initial* model again under freshly drawn clusterings —
a second set of cluster sums of the same updates, the route invariant I4 closes. Every
client must refuse it from its own memory (the SuperNode's ``sharefl-state-dir``) before it
trains, so round 2 releases nothing.

After round 2 it logs one line ``sharefl-replay {json}`` with what it got in each round:
the number of released cluster sums, and the clients' error replies.
"""

from __future__ import annotations

import json
from logging import INFO

from flower_share_message.client_app import MAX_WEIGHT
from flower_share_message.server_app import centralized_evaluation, robust_rule
from flower_share_message.signed_app import DIRECTORY_KEY, app_context
from flower_share_message.task import AppConfig, initial_parameters
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from sharefl.integrations.flower import ShareflStrategy, read_directory

REPLAY_MARK = "sharefl-replay "


class ReplayingStrategy(ShareflStrategy):
    """Round 1 as given; every later round trains the first round's model again, with
    the workflow's memory of its plan wiped (so new clusterings are drawn)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first: ArrayRecord | None = None
        self.outcome: list[dict] = []

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid):
        if self.first is None:
            self.first = arrays
        else:
            arrays = self.first
            self.secure._model = None  # forget round 1's plan: draw new clusterings
        messages = super().configure_train(server_round, arrays, config, grid)
        result = self.secure.last_result
        self.outcome.append(
            {
                "round": server_round,
                "released": 0 if result is None else len(result.clusters),
                "clusterings": None
                if result is None
                else [sorted(map(sorted, c.clusters)) for c in result.plan.clusterings],
                "errors": [str(f) for f in self.secure.last_failures if isinstance(f, Exception)],
            }
        )
        return messages


serverapp = ServerApp()


@serverapp.main()
def run_replaying(grid: Grid, context: Context) -> Result:
    directory = str(context.run_config[DIRECTORY_KEY])
    config = AppConfig.from_run_config(app_context(context).run_config)
    nodes = len(read_directory(directory))
    strategy = ReplayingStrategy(
        FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=nodes,
            min_available_nodes=nodes,
        ),
        cluster_size=config.cluster_size,
        clip=config.clip,
        max_weight=MAX_WEIGHT,
        rule=robust_rule(config.rule),
        signed=True,
        directory=directory,
        max_empty_rounds=None,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_parameters()),
        num_rounds=config.num_server_rounds,
        evaluate_fn=centralized_evaluation,
    )
    log(INFO, "%s%s", REPLAY_MARK, json.dumps(strategy.outcome))
    return result
