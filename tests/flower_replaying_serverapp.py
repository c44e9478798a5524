"""A malicious ServerApp for Flower's deployment engine (``deploy_local.py --serverapp``;
tests/test_flower_deployment_engine.py): round 1 is the signed example's honest round; in
round 2 the server sends round 1's *initial* model again with its plan forgotten — a second
set of cluster sums of the same updates. With atoms (the default) the new plan can only
regroup the clients' remembered atoms, so whatever it releases is atom sums again; without
atoms every client refuses it from its memory (I4).

After round 2 it logs one line ``sharefl-replay {json}`` with what it got in each round:
the number of released cluster sums, and the clients' error replies.
"""

from __future__ import annotations

import json
from logging import INFO
from typing import cast

from flower_share_message.signed_app import run_signed_with
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from sharefl.integrations.flower import ShareflStrategy

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
    result, strategy = run_signed_with(grid, context, ReplayingStrategy, max_empty_rounds=None)
    log(INFO, "%s%s", REPLAY_MARK, json.dumps(cast(ReplayingStrategy, strategy).outcome))
    return result
