"""The ServerApp: Flower's FedAvg strategy, with the fit round replaced by sharefl's cluster
secure aggregation and a robust rule over the cluster means."""

from __future__ import annotations

from flwr.app import Context
from flwr.common import ndarrays_to_parameters
from flwr.server import History, ServerApp, ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow

from flower_share.client_app import MAX_WEIGHT
from flower_share.task import CLIENTS, AppConfig, evaluate, initial_parameters, test_data
from sharefl.integrations.flower import ShareflWorkflow
from sharefl.robust.base import Aggregator
from sharefl.robust.coordinate import Mean, Median, TrimmedMean


def robust_rule(name: str) -> Aggregator:
    """The rule named in the run config; raises ``ValueError`` for another name."""
    rules = {"median": lambda: Median(f=1), "trmean": lambda: TrimmedMean(f=1), "mean": Mean}
    if name not in rules:
        raise ValueError(f"rule must be one of {sorted(rules)}, got {name!r}")
    return rules[name]()


def centralized_evaluation(server_round, parameters, config):
    x, y = test_data()
    loss, accuracy = evaluate(parameters, x, y)
    return loss, {"accuracy": accuracy}


def run(grid, context: Context) -> History:
    """Run the app's rounds; returns Flower's History (centralized accuracy per round)."""
    config = AppConfig.from_run_config(context.run_config)
    strategy = FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=CLIENTS,
        min_available_clients=CLIENTS,
        initial_parameters=ndarrays_to_parameters(initial_parameters()),
        evaluate_fn=centralized_evaluation,
    )
    legacy = LegacyContext(
        context, config=ServerConfig(num_rounds=config.num_server_rounds), strategy=strategy
    )
    secure = ShareflWorkflow(
        cluster_size=config.cluster_size,
        clip=config.clip,
        max_weight=MAX_WEIGHT,
        rule=robust_rule(config.rule),
    )
    DefaultWorkflow(fit_workflow=secure)(grid, legacy)
    return legacy.history


app = ServerApp()
app.main()(run)
