"""The federated loop's checks that need no data: its attack, and whether the robust rule's
``f`` fits the rows it will aggregate (:func:`check_federated_run`, the federated entry's
``check`` in :data:`~sharefl.simulator.loops.LOOPS`, run by
:func:`~sharefl.simulator.preflight.check_run`)."""

from __future__ import annotations

import torch

from sharefl.robust.base import AggregationError
from sharefl.simulator import components
from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.federated import attacks
from sharefl.simulator.federated.cluster_zeno import check_zeno_options


def rows_per_round(run: RunConfig) -> int:
    """How many rows the robust rule sees per round: the participants' uploads, or their
    cluster means (``participants // cluster_size`` clusters) with secure aggregation."""
    participants = run.clients.per_round or run.clients.total
    size = run.secure_aggregation.cluster_size
    return participants // size if size >= 2 else participants


def check_federated_run(run: RunConfig) -> None:
    """Raise :class:`SimulationConfigError` (naming the key) for an attack or robust rule of
    the federated ``run`` that cannot work, as far as it can be told without loading data."""
    privacy = run.privacy.enabled
    attacks.build_attack(run.attack.name, run.attack.options, noise_std=1.0 if privacy else 0)
    agg = run.aggregator
    if agg.name == "noise_filter":
        return
    if agg.name == "zeno":  # SHARE's Zeno++ (simulator/federated/cluster_zeno.py): options, data
        check_zeno_options(agg.options)
        _require_validation_set(run)
        return
    rule = components.build_rule(agg.name, agg.options, agg.pre, torch.Generator())
    rows = rows_per_round(run)
    try:
        rule(torch.zeros(rows, 1))
    except AggregationError as exc:
        what = (
            f"{rows} cluster means ({run.clients.per_round or run.clients.total} clients in "
            f"clusters of {run.secure_aggregation.cluster_size})"
            if run.secure_aggregation.cluster_size >= 2
            else f"{rows} uploads"
        )
        raise SimulationConfigError(
            f"aggregator {agg.name!r} with options {agg.options} cannot aggregate the {what} "
            f"of a round: {exc}; change aggregator.options.f, clients or "
            "secure_aggregation.cluster_size"
        ) from exc


def _require_validation_set(run: RunConfig) -> None:
    if not run.data.auxiliary_per_class:
        raise SimulationConfigError(
            "aggregator zeno needs the server's validation set: set data.auxiliary_per_class"
        )
