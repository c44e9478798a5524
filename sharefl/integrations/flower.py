"""sharefl's cluster secure aggregation inside Flower (flwr 1.42, Message API).

One line on each side, as with Flower's own ``secaggplus_mod`` / ``SecAggPlusWorkflow``::

    # client
    app = ClientApp(client_fn=client_fn, mods=[sharefl_mod])
    # server
    workflow = DefaultWorkflow(fit_workflow=ShareflWorkflow(cluster_size=5, clip=1.0))

:class:`ShareflWorkflow` drives one :class:`~sharefl.protocol.coordinator.RoundCoordinator`
per Flower round (planning, audit, encoding, routing by the sender Flower authenticated,
release checks, decoding); it only moves the coordinator's messages through
``Grid.send_and_receive`` as records (:mod:`sharefl.protocol.records`). Per reclustering:
``assign`` (plan, assignment, encoding) → ``keys`` → ``masking`` (the first reclustering
carries the strategy's fit instructions: clients train after key setup) → [``consistency``]
→ ``unmask``. A client that does not answer within ``timeout`` or answers with an error is
a drop-out, handled by the protocol at every stage.

What is aggregated: each client's *update* (its trained arrays minus the arrays it
received), clipped per coordinate to ``clip`` and weighted by its number of examples
(:class:`~sharefl.protocol.updates.WeightedUpdateCodec`). The server learns only cluster
sums; a robust ``rule`` (any :mod:`sharefl.robust` aggregator, through
:class:`~sharefl.robust.hierarchical.HierarchicalAggregator`) combines them, averaged over
the reclusterings; the default, :class:`~sharefl.robust.coordinate.Mean`, is exactly
FedAvg over the clients whose inputs were summed. The new parameters are handed to the
strategy's ``aggregate_fit`` as every client's result (as ``SecAggPlusWorkflow`` does), so
its metrics aggregation and bookkeeping run unchanged.

:func:`sharefl_mod` keeps the client's protocol state in Flower's ``Context`` as plain
records (:meth:`ClientSession.export_state`), never pickled.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sharefl.crypto.encoding import RingEncoding, encode
from sharefl.protocol import records
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.coordinator import (
    Planner,
    RoundCoordinator,
    RoundResult,
    SecureAggregationSettings,
)
from sharefl.protocol.errors import (
    ConfigurationError,
    LeakageError,
    ProtocolError,
    RejectedMessage,
)
from sharefl.protocol.messages import ClusterAssignment, MaskingRequest
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.updates import WeightedUpdateCodec
from sharefl.robust.base import Aggregator
from sharefl.robust.coordinate import Mean
from sharefl.robust.hierarchical import ClusterScale, HierarchicalAggregator

try:  # flwr is the [flower] extra
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.app.message_type import MessageType
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'sharefl.integrations.flower needs flwr: pip install "sharefl[flower]"'
    ) from exc

log = logging.getLogger(__name__)

PREFIX = "sharefl"
STAGE_RECORD = f"{PREFIX}.stage"
"""The ConfigRecord naming the stage (``stage``) and its parameters, in every message."""
_FITINS_PARAMS = "fitins.parameters"
_STATE = f"{PREFIX}.state"
_ARRAYS = ".arrays"


class FlowerIntegrationError(ProtocolError):
    """A Flower message or context lacks what the sharefl protocol needs (e.g. a stage
    message without the sharefl mod, or fit instructions without parameters)."""


# ---- records <-> Flower records -----------------------------------------------------------


def put_record(content: RecordDict, name: str, record: Mapping[str, Any]) -> None:
    """Store one sharefl record in ``content``: its arrays in the ArrayRecord
    ``name + ".arrays"``, the rest in the ConfigRecord ``name``."""
    arrays = {k: v for k, v in record.items() if isinstance(v, np.ndarray)}
    config = {k: v for k, v in record.items() if not isinstance(v, np.ndarray)}
    content[name] = ConfigRecord(config)
    if arrays:
        content[name + _ARRAYS] = ArrayRecord({k: Array(v) for k, v in arrays.items()})


def get_record(content: RecordDict, name: str) -> dict[str, Any]:
    """The sharefl record :func:`put_record` stored under ``name``; raises
    :class:`~sharefl.protocol.records.RecordError` when there is none."""
    if name not in content.config_records:
        raise records.RecordError(f"the message has no {name!r} record")
    record = dict(content.config_records[name])
    if name + _ARRAYS in content.array_records:
        record.update({k: a.numpy() for k, a in content.array_records[name + _ARRAYS].items()})
    return record


def _drop_record(content: RecordDict, name: str) -> None:
    content.pop(name, None)
    content.pop(name + _ARRAYS, None)


# ---- the server side ----------------------------------------------------------------------


@dataclass
class ShareflWorkflow:
    """A Flower fit workflow that aggregates with sharefl's cluster secure aggregation.

    Use it as ``DefaultWorkflow(fit_workflow=ShareflWorkflow(...))``; clients need
    :func:`sharefl_mod`.

    Attributes:
        cluster_size: m, clients per cluster (SHARE); at least ``min_sum_size``.
        clip: per-coordinate bound of every client's update (trained − received arrays).
        reclusterings: R clusterings of the same updates per round (the safe planner draws
            them so that together they reveal no update).
        threshold: t per cluster; ``None``: the clients' floor.
        bits: ring width (32 or 64).
        max_weight: the largest number of examples a client may report.
        neighbour_degree: SecAgg+ sparse masking inside clusters (``None``: complete).
        min_sum_size: no update and no sum of fewer clients may become recoverable.
        timeout: seconds to wait for each stage's replies (``None``: wait for all).
        rule: a robust rule over the released cluster sums (``f`` counts clusters);
            default :class:`~sharefl.robust.coordinate.Mean` (FedAvg).
        seed: seeds the cluster plan (simulations only; ``None``: the OS).

    Attributes set by each round: ``last_result`` (the :class:`RoundResult`),
    ``last_update`` (the aggregated update arrays, or ``None``).

    Raises :class:`ConfigurationError` for settings no round could run with.
    """

    cluster_size: int
    clip: float
    reclusterings: int = 1
    threshold: int | None = None
    bits: int = 32
    max_weight: float = 1000.0
    neighbour_degree: int | None = None
    min_sum_size: int = 3
    timeout: float | None = None
    rule: Aggregator | None = None
    seed: int | None = None
    last_result: RoundResult | None = field(default=None, init=False)
    last_update: list[np.ndarray] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.settings = SecureAggregationSettings(
            cluster_size=self.cluster_size,
            reclusterings=self.reclusterings,
            threshold=self.threshold,
            bits=self.bits,
            clip=self.clip,
            neighbour_degree=self.neighbour_degree,
            min_sum_size=self.min_sum_size,
            planner=Planner.SAFE,
        )
        if not self.settings.secure:
            raise ConfigurationError("cluster_size 1 is no secure aggregation; use FedAvg")
        self._aggregator = HierarchicalAggregator(rule=self.rule or Mean(), scale=ClusterScale.MEAN)
        self._rng = np.random.default_rng(self.seed)

    # -- one round --------------------------------------------------------------------------

    def __call__(self, grid, context: Context) -> None:
        """Run one fit round (the ``fit_workflow`` contract of ``DefaultWorkflow``)."""
        if not isinstance(context, LegacyContext):
            raise TypeError(f"Expect a LegacyContext, but get {type(context).__name__}.")
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        current_round = int(cfg[WorkflowKey.CURRENT_ROUND])
        parameters = compat.arrayrecord_to_parameters(
            context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
        )
        global_arrays = parameters_to_ndarrays(parameters)
        instructions = context.strategy.configure_fit(
            current_round, parameters, context.client_manager
        )
        if not instructions:
            log.info("configure_fit: no clients selected, cancel")
            return
        fitins = {
            proxy.node_id: compat.fitins_to_recorddict(ins, True) for proxy, ins in instructions
        }
        proxies = {proxy.node_id: proxy for proxy, _ in instructions}
        codec = WeightedUpdateCodec.like(global_arrays, self.clip, self.max_weight)
        try:
            rc = RoundCoordinator(
                self.settings,
                round=current_round,
                participants=sorted(fitins),
                length=codec.length,
                rng=self._rng,
            )
        except (ConfigurationError, LeakageError) as exc:
            log.error("sharefl: no round with %d clients: %s", len(fitins), exc)
            return
        assert rc.encoding is not None
        fit_results: dict[int, Any] = {}
        failures: list[BaseException] = []
        while not rc.done:
            self._reclustering(grid, rc, current_round, fitins, fit_results, failures)
        result = rc.result()
        self.last_result = result
        update = self._aggregate(result, codec)
        self.last_update = update
        if update is None:
            log.error(
                "sharefl: round %d released no cluster sum; the model is unchanged", current_round
            )
            return
        new = [
            (g + u).astype(g.dtype, copy=False) for g, u in zip(global_arrays, update, strict=True)
        ]
        new_parameters = ndarrays_to_parameters(new)
        results = []
        for nid, fitres in fit_results.items():
            fitres.parameters = new_parameters
            results.append((proxies[nid], fitres))
        aggregated, metrics = context.strategy.aggregate_fit(current_round, results, failures)
        if aggregated:
            context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
                aggregated, True
            )
            context.history.add_metrics_distributed_fit(server_round=current_round, metrics=metrics)

    def _reclustering(
        self,
        grid,
        rc: RoundCoordinator,
        current_round: int,
        fitins: Mapping[int, RecordDict],
        fit_results: dict[int, Any],
        failures: list[BaseException],
    ) -> None:
        first = rc.reclustering == 0
        group = str(current_round)
        outgoing: dict[int, RecordDict] = {}
        for nid, assignment in rc.open_reclustering().items():
            content = RecordDict()
            put_record(content, STAGE_RECORD, {"stage": "assign", "max_weight": self.max_weight})
            put_record(content, f"{PREFIX}.assignment", records.to_record(assignment))
            put_record(content, f"{PREFIX}.encoding", records.to_record(rc.encoding))
            if first:
                put_record(content, f"{PREFIX}.plan", records.to_record(rc.plan))
            outgoing[nid] = content
        while outgoing:
            replies = grid.send_and_receive(
                [
                    Message(
                        content=c, dst_node_id=nid, message_type=MessageType.TRAIN, group_id=group
                    )
                    for nid, c in outgoing.items()
                ],
                timeout=self.timeout,
            )
            for reply in replies:
                nid = reply.metadata.src_node_id
                if reply.has_error():
                    failures.append(Exception(reply.error))
                    continue
                self._deliver(rc, nid, reply.content, fit_results)
            outgoing = {}
            if rc.reclustering_done:
                break
            for nid, message in rc.advance().items():
                content = RecordDict()
                if isinstance(message, MaskingRequest) and first:
                    content = RecordDict(dict(fitins[nid].items()))
                put_record(content, STAGE_RECORD, {"stage": "step"})
                put_record(content, f"{PREFIX}.message", records.to_record(message))
                outgoing[nid] = content
        rc.close_reclustering()

    def _deliver(
        self, rc: RoundCoordinator, nid: int, content: RecordDict, fit_results: dict[int, Any]
    ) -> None:
        try:
            message = records.from_record(
                get_record(content, f"{PREFIX}.message"), records.CLIENT_MESSAGES
            )
        except records.RecordError as exc:
            rc.name_culprit(nid, f"sent an unreadable message: {exc}")
            return
        try:
            rc.receive(nid, message)
        except RejectedMessage as exc:
            log.warning("sharefl: %s", exc)
            return
        if "fitres.status" in content.config_records:  # the first masking stage's reply
            fit_results[nid] = compat.recorddict_to_fitres(content, keep_input=True)

    def _aggregate(
        self, result: RoundResult, codec: WeightedUpdateCodec
    ) -> list[np.ndarray] | None:
        """The rule over each reclustering's cluster means (weighted by the clusters' total
        weights where the rule takes weights: Mean gives FedAvg exactly), averaged over
        the reclusterings; ``None`` when nothing was released."""
        rounds, sizes = [], []
        for reclustering in result.reclusterings:
            if not reclustering.clusters:
                continue
            means, weights = codec.cluster_means(np.stack([c.sum for c in reclustering.clusters]))
            keep = weights > 0
            if not keep.any():
                continue
            # HierarchicalAggregator's MEAN scale divides by the sizes and weights by them.
            rounds.append(torch.from_numpy(means[keep] * weights[keep][:, None]))
            sizes.append(torch.from_numpy(weights[keep]))
        if not rounds:
            return None
        mean = self._aggregator.average(rounds, sizes).numpy()
        return codec.split(mean)


# ---- the client side ----------------------------------------------------------------------


def make_sharefl_mod(
    policy: ClientPolicy | Callable[[Context], ClientPolicy] | None = None,
    *,
    randbytes: Callable[[int], bytes] = os.urandom,
):
    """A client mod with this client's :class:`ClientPolicy` (or a function of the
    ``Context`` that returns it); :data:`sharefl_mod` uses the default policy."""

    def policy_of(context: Context) -> ClientPolicy:
        if callable(policy):
            return policy(context)
        return policy or ClientPolicy()

    def mod(msg: Message, ctxt: Context, call_next) -> Message:
        if (
            msg.metadata.message_type != MessageType.TRAIN
            or STAGE_RECORD not in msg.content.config_records
        ):
            return call_next(msg, ctxt)
        stage = get_record(msg.content, STAGE_RECORD)
        client = _Client(msg.metadata.dst_node_id, ctxt, policy_of(ctxt), randbytes)
        if stage.get("stage") == "assign":
            out = client.assign(msg.content, float(stage["max_weight"]))
        else:
            out = client.step(msg, ctxt, call_next)
        return Message(out, reply_to=msg)

    return mod


@dataclass
class _Client:
    """One message's worth of a client: loads its state from the Context, runs the step,
    stores the state back."""

    nid: int
    ctxt: Context
    policy: ClientPolicy
    randbytes: Callable[[int], bytes]

    def _load(self, name: str) -> dict[str, Any]:
        return get_record(self.ctxt.state, f"{_STATE}.{name}")

    def _save(self, name: str, record: Mapping[str, Any]) -> None:
        _drop_record(self.ctxt.state, f"{_STATE}.{name}")
        put_record(self.ctxt.state, f"{_STATE}.{name}", record)

    def assign(self, content: RecordDict, max_weight: float) -> RecordDict:
        assignment = records.from_record(
            get_record(content, f"{PREFIX}.assignment"), ClusterAssignment
        )
        encoding = records.from_record(get_record(content, f"{PREFIX}.encoding"), RingEncoding)
        if f"{PREFIX}.plan" in content.config_records:  # a new round
            plan = records.from_record(get_record(content, f"{PREFIX}.plan"), RoundPlan)
            guard = ClientRound(self.nid, plan, self.policy)
            _drop_record(self.ctxt.state, f"{_STATE}.input")
            self._save("encoding", {**records.to_record(encoding), "max_weight": max_weight})
        else:
            guard = ClientRound.from_state(self._load("round"), self.policy)
        session = guard.session(assignment, None, randbytes=self.randbytes)
        advert = session.advertise()
        self._save("round", guard.export_state())
        self._save("session", session.export_state())
        out = RecordDict()
        put_record(out, f"{PREFIX}.message", records.to_record(advert))
        return out

    def step(self, msg: Message, ctxt: Context, call_next) -> RecordDict:
        guard = ClientRound.from_state(self._load("round"), self.policy)
        session = ClientSession.from_state(
            self._load("session"), self.policy, randbytes=self.randbytes
        )
        message = records.from_record(
            get_record(msg.content, f"{PREFIX}.message"), records.SERVER_MESSAGES
        )
        out = RecordDict()
        if isinstance(message, MaskingRequest):
            if f"{_STATE}.input" not in self.ctxt.state.config_records:
                out = self._train(msg, ctxt, call_next)
            session.set_input(self._load("input")["vector"])
            if message.context.reclustering + 1 >= guard.plan.reclusterings:
                # The round's last masking: the input (d ring elements) leaves the Context,
                # which Flower ships with every later message of this client.
                _drop_record(self.ctxt.state, f"{_STATE}.input")
        reply = guard.handle(session, message)
        self._save("round", guard.export_state())
        self._save("session", session.export_state())
        put_record(out, f"{PREFIX}.message", records.to_record(reply))
        return out

    def _train(self, msg: Message, ctxt: Context, call_next) -> RecordDict:
        if _FITINS_PARAMS not in msg.content.array_records:
            raise FlowerIntegrationError(
                "the first masking request carries no fit instructions; the server must be "
                "a ShareflWorkflow"
            )
        received = parameters_to_ndarrays(
            compat.arrayrecord_to_parameters(msg.content.array_records[_FITINS_PARAMS], True)
        )
        inner = RecordDict({k: v for k, v in msg.content.items() if not k.startswith(PREFIX)})
        out = call_next(_with_content(msg, inner), ctxt)
        fitres = compat.recorddict_to_fitres(out.content, keep_input=True)
        trained = parameters_to_ndarrays(fitres.parameters)
        encoding_record = self._load("encoding")
        max_weight = float(encoding_record.pop("max_weight"))
        encoding = records.from_record(encoding_record, RingEncoding)
        codec = WeightedUpdateCodec.like(received, encoding.clip, max_weight)
        delta = [t.astype(np.float64) - r for t, r in zip(trained, received, strict=True)]
        ring = encode(codec.encode(delta, fitres.num_examples), encoding, rng=None)
        self._save("input", {"vector": ring})
        content = out.content
        for arrays in content.array_records.values():
            arrays.clear()  # the trained arrays never leave the client in the clear
        return content


def _with_content(msg: Message, content: RecordDict) -> Message:
    """``msg`` with ``content`` (the strategy's fit instructions, without sharefl's records)
    for the inner client app."""
    msg.content = content
    return msg


sharefl_mod = make_sharefl_mod()
"""The client mod with the default :class:`ClientPolicy`:
``ClientApp(client_fn=..., mods=[sharefl_mod])``."""
