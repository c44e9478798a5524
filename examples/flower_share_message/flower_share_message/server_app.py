"""The ServerApp, Message-API style: Flower's ``FedAvg`` wrapped in sharefl's
``ShareflStrategy`` (cluster secure aggregation, a robust rule over the cluster means) and
started on the grid, with the server evaluating the model after every round."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from flower_share_message.client_app import MAX_WEIGHT
from flower_share_message.task import (
    CLIENTS,
    AppConfig,
    evaluate,
    initial_parameters,
    test_data,
)
from sharefl.integrations.flower import ShareflStrategy
from sharefl.robust.base import Aggregator
from sharefl.robust.coordinate import Mean, Median, TrimmedMean


def robust_rule(name: str) -> Aggregator:
    """The rule named in the run config; raises ``ValueError`` for another name."""
    rules = {"median": lambda: Median(f=1), "trmean": lambda: TrimmedMean(f=1), "mean": Mean}
    if name not in rules:
        raise ValueError(f"rule must be one of {sorted(rules)}, got {name!r}")
    return rules[name]()


def centralized_evaluation(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    x, y = test_data()
    loss, accuracy = evaluate(arrays.to_numpy_ndarrays(), x, y)
    return MetricRecord({"loss": loss, "accuracy": accuracy})


def run(grid: Grid, context: Context) -> Result:
    """Run the app's rounds; returns Flower's Result (the server's accuracy per round)."""
    config = AppConfig.from_run_config(context.run_config)
    strategy = ShareflStrategy(
        FedAvg(
            fraction_train=1.0,
            fraction_evaluate=0.0,
            min_train_nodes=CLIENTS,
            min_available_nodes=CLIENTS,
        ),
        cluster_size=config.cluster_size,
        clip=config.clip,
        max_weight=MAX_WEIGHT,
        rule=robust_rule(config.rule),
    )
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_parameters()),
        num_rounds=config.num_server_rounds,
        evaluate_fn=centralized_evaluation,
    )


app = ServerApp()
app.main()(run)
