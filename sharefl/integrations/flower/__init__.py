"""sharefl's cluster secure aggregation inside Flower (flwr 1.42, Message API).

One line on each side, as with Flower's own ``secaggplus_mod`` / ``SecAggPlusWorkflow``::

    # client (Message API: @app.train() functions; or ClientApp(client_fn=..., mods=[...]))
    app = ClientApp(mods=[sharefl_mod])
    # server, Message API: any strategy, wrapped
    strategy = ShareflStrategy(FedAvg(fraction_train=1.0), cluster_size=5, clip=1.0)
    # server, legacy API
    workflow = DefaultWorkflow(fit_workflow=ShareflWorkflow(cluster_size=5, clip=1.0))

Both server forms run the same round (:meth:`ShareflWorkflow.secure_round`);
:class:`ShareflStrategy` runs it in ``configure_train`` and hands the inner strategy the
result as its clients' replies.

:class:`ShareflWorkflow` drives one :class:`~sharefl.protocol.coordinator.RoundCoordinator`
per Flower round (planning, audit, encoding, routing by the sender Flower authenticated,
release checks, decoding); it only moves the coordinator's messages through
``Grid.send_and_receive`` as records (:mod:`sharefl.protocol.records`). Per reclustering:
``assign`` (plan, assignment, encoding) → ``keys`` → ``masking`` (the first reclustering
carries the strategy's fit instructions: clients train after key setup) → [``consistency``]
→ ``unmask``. A client that does not answer within ``timeout`` or answers with an error is
a drop-out, handled by the protocol at every stage.

Signed mode (an untrusted server, ``ShareflWorkflow(signed=True, directory=...)``): every
client holds a long-term Ed25519 identity, and both sides hold the same directory
{client id → public key} (e.g. ``sharefl keygen``'s ``directory.json``), from a source the
server does not control. Flower's node ids are random, so the protocol's client ids are the
directory's ids, not node ids: a round starts with a ``hello`` stage in which each node
that has not proved its id yet (or did not train in the previous round) signs (its node id,
its client id, the server's fresh nonce) with its identity; the workflow checks the
signature against the directory and routes that client id to that node. A node whose
hello does not verify (an id it cannot prove, an id another node proved first) takes no
part in the round and is named in ``last_node_culprits``. The
clients' adverts and consistency signatures are then checked by both sides against their
own directory, so the binding the server chose cannot let it substitute keys.

What is aggregated: each client's *update* (its trained arrays minus the arrays it
received), clipped per coordinate to ``clip`` and weighted by its number of examples
(:class:`~sharefl.rounds.updates.WeightedUpdateCodec`). The server learns only cluster
sums; a robust ``rule`` (any :mod:`sharefl.robust` aggregator, through
:class:`~sharefl.robust.hierarchical.HierarchicalAggregator`) combines them, averaged over
the reclusterings; the default, :class:`~sharefl.robust.coordinate.Mean`, is exactly
FedAvg over the clients whose inputs were summed. The new parameters are handed to the
strategy's ``aggregate_fit`` as every client's result (as ``SecAggPlusWorkflow`` does), so
its metrics aggregation and bookkeeping run unchanged.

:func:`sharefl_mod` keeps the client's protocol state in Flower's ``Context`` as plain
records (:meth:`ClientSession.export_state`), never pickled.

Modules: :mod:`.workflow` (the server side), :mod:`.client` (the mod), :mod:`.common`
(records, errors, identities). The client side imports no torch; the server side's names
(:class:`ShareflWorkflow`, :class:`ShareflStrategy`, ...) are imported from
:mod:`.workflow` when first used, so a ClientApp process that imports
``sharefl.integrations.flower`` for :data:`sharefl_mod` starts without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .client import (
    WEIGHT_METRIC,
    directory_id,
    make_sharefl_mod,
    policy_from_node_config,
    sharefl_mod,
)
from .common import (
    DIRECTORY_CONFIG,
    IDENTITY_CONFIG,
    PREFIX,
    STAGE_RECORD,
    STATE_DIR_CONFIG,
    FlowerIntegrationError,
    NothingReleased,
    checked_directory,
    get_record,
    put_record,
    read_directory,
    read_identity,
    round_seed,
)

if TYPE_CHECKING:
    from .workflow import (
        DEFAULT_FIRST_REPLY_TIMEOUT,
        DEFAULT_IDLE_TIMEOUT,
        Route,
        SecureRoundOutcome,
        ShareflStrategy,
        ShareflWorkflow,
        failure_reasons,
    )

SERVER_SIDE = (
    "DEFAULT_FIRST_REPLY_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "Route",
    "SecureRoundOutcome",
    "ShareflStrategy",
    "ShareflWorkflow",
    "failure_reasons",
)
"""The names :mod:`.workflow` provides, imported on first use (it needs torch, for the
robust rules over cluster sums)."""


def __getattr__(name: str) -> Any:
    if name in SERVER_SIDE:
        return getattr(importlib.import_module(f"{__name__}.workflow"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_FIRST_REPLY_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DIRECTORY_CONFIG",
    "IDENTITY_CONFIG",
    "PREFIX",
    "STAGE_RECORD",
    "STATE_DIR_CONFIG",
    "WEIGHT_METRIC",
    "FlowerIntegrationError",
    "NothingReleased",
    "Route",
    "SecureRoundOutcome",
    "ShareflStrategy",
    "ShareflWorkflow",
    "checked_directory",
    "directory_id",
    "failure_reasons",
    "get_record",
    "make_sharefl_mod",
    "policy_from_node_config",
    "put_record",
    "read_directory",
    "read_identity",
    "round_seed",
    "sharefl_mod",
]
