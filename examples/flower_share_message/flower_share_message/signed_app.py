"""The same app in sharefl's signed mode (an untrusted server), for Flower's deployment
engine: ``deploy_local.py`` runs it on a SuperLink and N SuperNodes over TLS.

Client (``clientapp``): the example's ``@app.train()`` function behind
``make_sharefl_mod(policy_from_node_config)``. Each SuperNode's node config names its
``sharefl keygen`` identity file and the directory (``sharefl-identity``,
``sharefl-directory``); the client takes part as the id the directory lists for its
identity, signs each round's hello with it, checks every advert and consistency signature
against its own copy of the directory, and refuses unsigned rounds (no downgrade).

Server (``serverapp``): the example's strategy with ``signed=True`` and the directory named
by the run config key ``sharefl-directory``; it waits for one node per directory entry and
trains on all of them (``fraction_train=1.0``).

Flower takes an app's components from its ``pyproject.toml``; ``deploy_local.py`` runs a
copy of this app whose ``[tool.flwr.app.components]`` name these two and whose run config
holds ``sharefl-directory`` (a key the unsigned app does not know).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Result

from flower_share_message.client_app import MAX_WEIGHT, train_locally
from flower_share_message.server_app import centralized_evaluation, robust_rule
from flower_share_message.task import AppConfig, initial_parameters
from sharefl.integrations.flower import (
    DIRECTORY_CONFIG,
    ShareflStrategy,
    make_sharefl_mod,
    policy_from_node_config,
    read_directory,
)

DIRECTORY_KEY = DIRECTORY_CONFIG
"""The run config key naming the server's copy of the directory (``directory.json``)."""


def app_context(context: Context) -> Context:
    """``context`` without the server's ``sharefl-directory`` run config key (the app's
    own config, :class:`AppConfig`, rejects keys it does not know); the same ``state``."""
    run_config = {k: v for k, v in context.run_config.items() if k != DIRECTORY_KEY}
    return dataclasses.replace(context, run_config=run_config)


clientapp = ClientApp(mods=[make_sharefl_mod(policy_from_node_config)])


@clientapp.train()
def train_signed(msg: Message, context: Context) -> Message:
    """The example's training step (the first ``byzantine-clients`` partitions attack)."""
    return train_locally(msg, app_context(context))


serverapp = ServerApp()


def run_signed_with(
    grid: Grid, context: Context, kind: type[ShareflStrategy] = ShareflStrategy, **options: Any
) -> tuple[Result, ShareflStrategy]:
    """The example's rounds in signed mode with a strategy of type ``kind`` (more
    ``options`` for it); returns Flower's Result and the strategy. Raises ``KeyError``
    without the ``sharefl-directory`` run config key, and what ``read_directory`` raises."""
    directory = str(context.run_config[DIRECTORY_KEY])
    config = AppConfig.from_run_config(app_context(context).run_config)
    nodes = len(read_directory(directory))
    strategy = kind(
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
        **options,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_parameters()),
        num_rounds=config.num_server_rounds,
        evaluate_fn=centralized_evaluation,
    )
    return result, strategy


@serverapp.main()
def run_signed(grid: Grid, context: Context) -> Result:
    """The example's rounds in signed mode (:func:`run_signed_with`)."""
    return run_signed_with(grid, context)[0]
