"""The server side of the Flower integration: :class:`ShareflWorkflow` (legacy API) and
:class:`ShareflStrategy` (Message API), one secure round per Flower round."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sharefl.crypto.errors import SignatureError
from sharefl.crypto.signatures import HELLO_NONCE_BYTES, SIGNATURE_BYTES, node_hello_message, verify
from sharefl.privacy.distributed import DistributedDPConfig, DistributedEncoder, ReleaseLedger
from sharefl.protocol import records
from sharefl.protocol.atoms import chunk_atoms, complete_atoms
from sharefl.protocol.clustering import Clustering, tolerance_warning
from sharefl.protocol.coordinator import RoundCoordinator, RoundResult
from sharefl.protocol.drive import Outgoing, server_exchanges
from sharefl.protocol.errors import (
    BadAdvertisement,
    ConfigurationError,
    LeakageError,
    RejectedMessage,
)
from sharefl.protocol.keys import KeyAdvert, check_distinct_keys, check_key_advert
from sharefl.protocol.messages import ClusterAssignment, MaskingRequest, ServerMessage
from sharefl.protocol.settings import (
    KeySetup,
    Planner,
    SecureAggregationSettings,
    SettingsError,
    settings_from,
)
from sharefl.robust.base import AggregationError, Aggregator
from sharefl.robust.coordinate import Mean
from sharefl.robust.hierarchical import ClusterScale, HierarchicalAggregator
from sharefl.rounds.model_plans import ModelPlans
from sharefl.rounds.released import Released
from sharefl.rounds.updates import WeightedUpdateCodec
from sharefl.wording import counted

from ..collect import ReplyDeadlines, send_and_collect
from .common import (
    MODEL_RECORD,
    PREFIX,
    STAGE_RECORD,
    FlowerIntegrationError,
    NothingReleased,
    arrays_digest,
    checked_directory,
    get_record,
    has_record,
    put_record,
    read_directory,
    round_seed,
)

if TYPE_CHECKING:
    from flwr.common import FitRes
    from flwr.server.client_proxy import ClientProxy

try:  # flwr is the [flower] extra
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Context,
        Message,
        MetricRecord,
        RecordDict,
    )
    from flwr.app.message_type import MessageType
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import Strategy
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'sharefl.integrations.flower needs flwr: pip install "sharefl[flower]"'
    ) from exc

log = logging.getLogger(__name__)


DEFAULT_IDLE_TIMEOUT = 120.0
"""Seconds a stage waits for the next reply (:class:`ShareflWorkflow`'s ``timeout``)."""
DEFAULT_FIRST_REPLY_TIMEOUT = 600.0
"""Seconds a stage waits for its first reply (``first_reply_timeout``)."""

Failures = list["tuple[ClientProxy, FitRes] | BaseException"]
"""What Flower's ``Strategy.aggregate_fit`` takes as ``failures``."""


@dataclass(frozen=True)
class Route:
    """The round's binding of protocol client ids to Flower node ids (one to one).

    Unsigned rounds use the node ids themselves; signed rounds the directory ids the nodes
    proved in the hello stage.
    """

    nodes: Mapping[int, int]
    """client id → node id."""

    def __post_init__(self) -> None:
        if len(set(self.nodes.values())) != len(self.nodes):
            raise FlowerIntegrationError("two client ids routed to one node")

    @classmethod
    def identity(cls, node_ids: Iterable[int]) -> Route:
        """The unsigned route: every node is its own client id."""
        return cls({nid: nid for nid in node_ids})

    @property
    def clients(self) -> dict[int, int]:
        """node id → client id."""
        return {nid: cid for cid, nid in self.nodes.items()}


# ---- the server side ----------------------------------------------------------------------


@dataclass(frozen=True)
class SecureRoundOutcome:
    """What :meth:`ShareflWorkflow.secure_round` returns: the new global arrays (``None``:
    nothing was released, the model stays), each trained node's training reply (node id →
    the reply message, its arrays cleared: they never left the client), and the round's
    failures."""

    arrays: list[np.ndarray] | None
    train_replies: dict[int, Message]
    failures: Failures


@dataclass(init=False)
class ShareflWorkflow:
    """A Flower fit workflow that aggregates with sharefl's cluster secure aggregation.

    Use it as ``DefaultWorkflow(fit_workflow=ShareflWorkflow(...))``; clients need
    :func:`sharefl_mod` (signed mode: :func:`make_sharefl_mod` with the client's identity).

    The round's rules are one :class:`~sharefl.protocol.settings.SecureAggregationSettings`:
    ``ShareflWorkflow(settings)``, or its keywords (``cluster_size=5, clip=1.0, ...``, the
    type's defaults), not both; every key reaches the round's
    :class:`~sharefl.protocol.coordinator.RoundCoordinator` as given (keys documented in
    docs/architecture.md), and ``cluster_size``, ``clip``, ``signed``, ... read them back.
    ``clip`` bounds every client's update (trained − received arrays) per coordinate;
    ``signed`` is untrusted-server mode: a hello stage binds each node to the directory id
    it proves, adverts and consistency signatures are checked against ``directory``, and
    the clients verify each other (see the module docstring). Refused, naming the key:
    ``cluster_size`` 1 (use FedAvg) and ``planner = "isolate"`` (the workflow keeps no
    history of flagged clusters).

    Attributes:
        settings: the rules of every round.
        max_weight: the largest number of examples a client may report.
        timeout: a stage stops waiting when no new reply has come for this many seconds;
            the clock restarts with every reply, so steady progress (a simulation's actor
            pool serving clients in turn) is never cut short, and a hung client costs at
            most this much per stage (:mod:`sharefl.integrations.collect`). ``None``: wait
            for every client.
        first_reply_timeout: the longest wait for the first reply of a stage (a
            simulation engine starting, the first training); ``None``: no limit.
        byzantine: the number of Byzantine clients the deployment should withstand; when
            the first round knows its clients, a warning is logged if ``rule`` cannot
            tolerate the clusters they would spoil
            (:func:`~sharefl.protocol.clustering.tolerance_warning`). ``None``: no check.
        rule: a robust rule over the released cluster sums (``f`` counts clusters);
            default :class:`~sharefl.robust.coordinate.Mean` (FedAvg).
        seed: seeds the cluster plan (simulations only; ``None``: the OS).
        directory: signed mode: {client id → Ed25519 public key}, or the path of a
            ``sharefl keygen`` ``directory.json`` (:func:`read_directory`); the same
            directory the clients hold.
        privacy: distributed DP inside the clusters
            (:class:`~sharefl.privacy.distributed.DistributedDPConfig`, σ given: calibrate
            it with :func:`~sharefl.privacy.distributed.calibrate_distributed`): every
            client clips its *unweighted* update to l2 ``privacy.clip``, and adds its noise
            share in the ring with the same config held by its own mod
            (``make_sharefl_mod(privacy=...)``, which refuses a round that proposes a float
            encoding instead); the server decodes each cluster sum, the rule runs over the
            cluster means (weighted by member counts), and ``last_epsilon`` is the worst
            client's ε at ``delta`` so far (:class:`~sharefl.privacy.distributed.
            ReleaseLedger`). ``clip`` and ``max_weight`` are then unused (the coordinator
            gets ``clip=None``: ring inputs).
        delta: δ of ``last_epsilon``.
        max_empty_rounds: after this many rounds in a row that released no cluster sum (or
            only sums the rule cannot aggregate: too few for its ``f``), the round raises
            :class:`NothingReleased` with the last round's reasons, stopping the run
            (``None``: never; every such round is logged with its reasons and keeps the
            model).

    Attributes set by each round: ``last_result`` (the :class:`RoundResult`, its culprits
    by client id), ``last_update`` (the aggregated update arrays, or ``None``),
    ``last_route`` (the :class:`Route` of client ids to node ids),
    ``last_node_culprits`` (signed mode: node id → why its hello was refused) and
    ``last_failures`` (Flower's failures list: the nodes' error replies, as exceptions).

    Raises :class:`ConfigurationError` for settings no round could run with (a
    :class:`~sharefl.protocol.settings.SettingsError` naming the key), both a settings
    object and keywords, signed mode without a directory (or a directory without signed
    mode), and what :func:`read_directory` raises.
    """

    settings: SecureAggregationSettings
    max_weight: float = 1000.0
    timeout: float | None = DEFAULT_IDLE_TIMEOUT
    first_reply_timeout: float | None = DEFAULT_FIRST_REPLY_TIMEOUT
    byzantine: int | None = None
    rule: Aggregator | None = None
    seed: int | None = None
    directory: Mapping[int, bytes] | str | Path | None = None
    privacy: DistributedDPConfig | None = None
    delta: float = 1e-5
    max_empty_rounds: int | None = 3
    last_result: RoundResult | None = field(default=None, init=False)
    last_update: list[np.ndarray] | None = field(default=None, init=False)
    last_route: Route | None = field(default=None, init=False)
    last_node_culprits: dict[int, str] = field(default_factory=dict, init=False)
    last_failures: Failures = field(default_factory=list, init=False)
    last_epsilon: float | None = field(default=None, init=False)
    empty_rounds: int = field(default=0, init=False)

    def __init__(
        self,
        settings: SecureAggregationSettings | None = None,
        *,
        max_weight: float = 1000.0,
        timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        first_reply_timeout: float | None = DEFAULT_FIRST_REPLY_TIMEOUT,
        byzantine: int | None = None,
        rule: Aggregator | None = None,
        seed: int | None = None,
        directory: Mapping[int, bytes] | str | Path | None = None,
        privacy: DistributedDPConfig | None = None,
        delta: float = 1e-5,
        max_empty_rounds: int | None = 3,
        **keywords: Any,
    ) -> None:
        self.settings = settings_from(settings, keywords)
        self.max_weight, self.timeout, self.rule, self.seed = max_weight, timeout, rule, seed
        self.first_reply_timeout, self.byzantine = first_reply_timeout, byzantine
        self._deadlines = ReplyDeadlines(idle=timeout, first=first_reply_timeout)
        self.directory, self.privacy, self.delta = directory, privacy, delta
        self.max_empty_rounds = max_empty_rounds
        self.last_result, self.last_update, self.last_route = None, None, None
        self.last_node_culprits, self.last_epsilon, self.empty_rounds = {}, None, 0
        self.last_failures = []
        self._proven: dict[int, int] = {}
        """Signed mode: node id → the client id it proved and trained under last round."""
        self._plans = ModelPlans()
        """The plan of the last round's model (reused while the model stays unchanged)."""
        self._key_adverts: dict[int, KeyAdvert] = {}
        """``key_setup = "once"``: each client's long-term key advert, collected by the
        key stage of the first round it is selected in (and again after it failed)."""
        self._check()
        self.atom_size: int | None = (
            self.settings.resolved_atom_size if self.settings.atoms_on(deployment=True) else None
        )
        """Atoms of this size (``atoms`` setting, on by default; :mod:`sharefl.protocol.
        atoms`): the directory's ids cut in order in signed mode (the same in every Flower
        run), else the ids of the clients that reply in the round."""

    # The settings' keys, read back (``workflow.clip``...): the settings are the one record.
    @property
    def cluster_size(self) -> int:
        return self.settings.cluster_size

    @property
    def reclusterings(self) -> int:
        return self.settings.reclusterings

    @property
    def threshold(self) -> int | None:
        return self.settings.threshold

    @property
    def bits(self) -> int:
        return self.settings.bits

    @property
    def clip(self) -> float | None:
        return self.settings.clip

    @property
    def signed(self) -> bool:
        return self.settings.signed

    @property
    def neighbour_degree(self) -> int | None:
        return self.settings.neighbour_degree

    @property
    def min_sum_size(self) -> int:
        return self.settings.min_sum_size

    def _check(self) -> None:
        settings = self.settings
        if not settings.secure:
            raise SettingsError("cluster_size", "1 is no secure aggregation; use FedAvg")
        if settings.planner is Planner.ISOLATE:
            raise SettingsError(
                "planner",
                '"isolate" needs a history of flagged clusters across rounds, which the '
                'workflow does not keep: use planner="safe"',
            )
        if self.privacy is None and settings.clip is None:
            raise SettingsError(
                "clip", "is required: it bounds every client's float update per coordinate"
            )
        # ring inputs with distributed DP: no float encoding (clip bounds float inputs only)
        self._round_settings = settings if self.privacy is None else replace(settings, clip=None)
        if self.max_empty_rounds is not None and self.max_empty_rounds < 1:
            raise ConfigurationError(
                f"max_empty_rounds must be >= 1 (or None: never stop), got {self.max_empty_rounds}"
            )
        self._directory = self._load_directory()
        self._aggregator = HierarchicalAggregator(rule=self.rule or Mean(), scale=ClusterScale.MEAN)
        self._rng = np.random.default_rng(self.seed)
        self._ledger: ReleaseLedger | None = None
        self._warned = False
        if self.byzantine is not None and (
            not isinstance(self.byzantine, int) or self.byzantine < 0
        ):
            raise ConfigurationError(
                f"byzantine must be a number of clients >= 0 (or None), got {self.byzantine!r}"
            )

    def _load_directory(self) -> dict[int, bytes]:
        if self.signed != (self.directory is not None):
            raise ConfigurationError(
                "signed mode needs the clients' directory, and a directory needs signed=True"
            )
        if self.directory is None:
            return {}
        if isinstance(self.directory, str | Path):
            return read_directory(self.directory)
        return checked_directory(self.directory)

    # -- one round --------------------------------------------------------------------------

    def __call__(self, grid: Grid, context: Context) -> None:
        """Run one fit round (the ``fit_workflow`` contract of ``DefaultWorkflow``): the
        strategy's ``configure_fit`` samples the clients and writes their instructions; the
        kept parameters are the secure aggregate applied, bit for bit (the arrays of
        :meth:`secure_round`); the strategy's ``aggregate_fit`` aggregates the metrics only."""
        if not isinstance(context, LegacyContext):
            raise TypeError(f"Expect a LegacyContext, but get {type(context).__name__}.")
        cfg = context.state.config_records[MAIN_CONFIGS_RECORD]
        current_round = int(cast(int, cfg[WorkflowKey.CURRENT_ROUND]))
        parameters = compat.arrayrecord_to_parameters(
            context.state.array_records[MAIN_PARAMS_RECORD], keep_input=True
        )
        instructions = context.strategy.configure_fit(
            current_round, parameters, context.client_manager
        )
        if not instructions:
            log.info("configure_fit: no clients selected, cancel")
            return
        proxies = {proxy.node_id: proxy for proxy, _ in instructions}
        contents = {
            proxy.node_id: compat.fitins_to_recorddict(ins, True) for proxy, ins in instructions
        }
        outcome = self.secure_round(
            grid, current_round, contents, parameters_to_ndarrays(parameters)
        )
        if outcome.arrays is None:
            return
        new_parameters = ndarrays_to_parameters(outcome.arrays)
        results = []
        for node_id, reply in outcome.train_replies.items():
            fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
            fitres.parameters = new_parameters
            results.append((proxies[node_id], fitres))
        # The strategy aggregates the metrics only: the kept model is the secure aggregate
        # itself (its weighted average of identical float32 copies would move last bits).
        _, metrics = context.strategy.aggregate_fit(current_round, results, outcome.failures)
        context.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
            new_parameters, True
        )
        context.history.add_metrics_distributed_fit(server_round=current_round, metrics=metrics)

    def secure_round(
        self,
        grid: Grid,
        current_round: int,
        contents: Mapping[int, RecordDict],
        global_arrays: Sequence[np.ndarray],
    ) -> SecureRoundOutcome:
        """One secure round over the nodes of ``contents`` (node id → the strategy's train
        instructions, legacy fit instructions or Message-API ``arrays`` + ``config``): the
        clients train when the first masking request brings them their instructions and
        mask their updates; the rule's aggregate of the released sums is added to
        ``global_arrays``. Serves both APIs (:meth:`__call__`, :class:`ShareflStrategy`).
        """
        failures: Failures = []
        self.last_node_culprits, self.last_failures = {}, failures
        if self.signed:
            route = self._hello(grid, current_round, sorted(contents), failures)
        else:
            route = Route.identity(sorted(contents))
        self.last_route = route
        clients = route.clients
        fitins = {clients[nid]: content for nid, content in contents.items() if nid in clients}
        if self.settings.key_setup is KeySetup.ONCE:
            self._key_stage(grid, current_round, route, fitins, failures)
            fitins = {cid: c for cid, c in fitins.items() if cid in self._key_adverts}
        self._warn_if_intolerable(len(fitins))
        clip = self.settings.clip if self.settings.clip is not None else 1.0  # unused with DP
        codec = WeightedUpdateCodec.like(global_arrays, clip, self.max_weight)
        encoder = None
        if self.privacy is not None:
            if self._ledger is None or self._ledger.encoder.dim != codec.size:
                built = DistributedEncoder(self.privacy, codec.size)
                self._ledger = ReleaseLedger(built, self.privacy.colluders)
            encoder = self._ledger.encoder  # built once: its tables serve every round
        digest = arrays_digest(global_arrays)
        model_id = digest.hex()  # the plan book's key for this model
        known = self._plans.reusable(model_id, atoms=self.atom_size is not None)
        participants = known.participants if known is not None else sorted(fitins)
        partition = None
        if self.atom_size is not None:
            # selected clients outside a complete atom of this round sit it out (sent nothing)
            ids = sorted(self._directory) if self._directory else sorted(fitins)
            chosen = complete_atoms(chunk_atoms(ids, self.atom_size), fitins)
            participants = sorted(i for atom in chosen for i in atom)
            partition = Clustering(tuple(chosen))
            if not participants:
                reason = (
                    f" — no complete atom among {counted(len(fitins), 'selected client')} "
                    f"(atoms of {self.atom_size}: select every client of an atom)"
                )
                return self._nothing_released(current_round, reason, failures)
        if known is not None:
            log.info(
                "sharefl: round %d: the model is unchanged, so its clusterings are reused "
                "(%s already released on it; %s of them not in this round)",
                current_round,
                counted(len(known.releases), "sum"),
                counted(len(set(participants) - set(fitins)), "client"),
            )

        try:
            rc = self._plans.coordinator(
                self._round_settings,
                model=model_id,
                reuse=known,
                round=current_round,
                participants=participants,
                length=codec.length if encoder is None else encoder.padded,
                rng=self._rng,
                directory=self._directory,
                atom_partition=partition,
                keys=self._key_adverts,
            )
        except (ConfigurationError, LeakageError) as exc:
            reason = f" — no round with {counted(len(fitins), 'client')}: {exc}"
            return self._nothing_released(current_round, reason, failures)
        train_replies: dict[int, Message] = {}
        for outgoing in server_exchanges(rc):
            # a planned client that is not in this round (the model's plan is reused) is
            # sent nothing: it counts as dropped
            contents = {
                route.nodes[cid]: self._content(rc, outgoing, cid, message, fitins, digest)
                for cid, message in outgoing.messages.items()
                if cid in fitins
            }
            self._collect(grid, rc, route, contents, str(current_round), train_replies, failures)
        self._proven = {route.nodes[cid]: cid for cid in train_replies}
        result = rc.result()
        self.last_result = result
        self.last_update = None
        try:
            if encoder is None:
                update = self._aggregate(result, codec)
            else:
                update = self._aggregate_ring(result, codec, encoder, round_seed(rc.plan, digest))
        except AggregationError as exc:  # e.g. drop-outs left fewer sums than the rule's f needs
            sums = counted(len(result.all_clusters), "cluster sum")
            released = f"{sums}, which the rule cannot aggregate"
            return self._nothing_released(current_round, f" — {exc}", failures, released)
        self.last_update = update
        if update is None:
            return self._nothing_released(
                current_round, failure_reasons(result, failures), failures
            )
        self.empty_rounds = 0
        new = [
            (g + u).astype(g.dtype, copy=False) for g, u in zip(global_arrays, update, strict=True)
        ]
        replies = {route.nodes[cid]: reply for cid, reply in train_replies.items()}
        return SecureRoundOutcome(new, replies, failures)

    def _nothing_released(
        self,
        current_round: int,
        reasons: str,
        failures: Failures,
        released: str = "no cluster sum",
    ) -> SecureRoundOutcome:
        """Log a round that leaves the model unchanged (it ``released`` nothing, or sums the
        rule cannot aggregate), and raise :class:`NothingReleased` when it is the
        ``max_empty_rounds``-th in a row."""
        self.empty_rounds += 1
        message = f"round {current_round} released {released}; the model is unchanged{reasons}"
        log.error("sharefl: %s", message)
        if self.max_empty_rounds is not None and self.empty_rounds >= self.max_empty_rounds:
            raise NothingReleased(
                f"{counted(self.empty_rounds, 'round')} in a row released no cluster sum, the "
                f"run stops (ShareflWorkflow(max_empty_rounds=...)); the last: {message}"
            )
        return SecureRoundOutcome(None, {}, failures)

    def _send(self, grid: Grid, contents: Mapping[int, RecordDict], group: str) -> list[Message]:
        """Send each node its content (a TRAIN message) and return the replies that came
        before the stage's deadlines (``timeout``, ``first_reply_timeout``)."""
        messages = [
            Message(content=c, dst_node_id=nid, message_type=MessageType.TRAIN, group_id=group)
            for nid, c in contents.items()
        ]
        return send_and_collect(grid, messages, self._deadlines)

    def _warn_if_intolerable(self, clients: int) -> None:
        """Log, once, when ``byzantine`` clients among ``clients`` spoil more clusters than
        the rule tolerates (Zeno++-like rules without an ``f`` are not checked)."""
        if self.byzantine is None or self._warned:
            return
        self._warned = True
        tolerated = self._aggregator.tolerance
        if tolerated is None or clients < 1:
            return
        text = tolerance_warning(
            clients, min(self.byzantine, clients), self.cluster_size, tolerated
        )
        if text is not None:
            log.warning("sharefl: ShareflWorkflow(byzantine=%d): %s", self.byzantine, text)

    def _hello(
        self, grid: Grid, current_round: int, node_ids: list[int], failures: Failures
    ) -> Route:
        """The hello stage of a signed round: the route of the client ids each selected
        node proved. A node that trained in the previous round under the id it proved keeps
        that id without a new hello (:attr:`_proven`); every other node gets a fresh nonce,
        and the ids whose signed replies verify against the directory are routed (the first
        node to prove an id gets it; a node that kept its id proved it first). Error replies
        are failures; replies that do not verify name their node in
        ``last_node_culprits``. When every node kept its id, no message is sent.

        Why keeping a proven id cannot leak: the route is the server's own choice, which a
        malicious server makes as it likes anyway; each client checks every advert and
        consistency signature against its own directory and refuses an assignment for an
        id that is not its own, so no route can substitute a key or a member."""
        nodes = {cid: nid for nid, cid in self._proven.items() if nid in node_ids}
        nonce = os.urandom(HELLO_NONCE_BYTES)
        contents = {}
        for nid in sorted(set(node_ids) - set(nodes.values())):
            content = RecordDict()
            put_record(content, STAGE_RECORD, {"stage": "hello", "nonce": nonce})
            contents[nid] = content
        for reply in self._send(grid, contents, str(current_round)) if contents else ():
            nid = reply.metadata.src_node_id
            if nid not in contents or nid in nodes.values():
                continue
            if reply.has_error():
                failures.append(Exception(reply.error))
                continue
            try:
                cid = self._verified_hello(reply.content, nid, nonce)
                if cid in nodes:
                    raise RejectedMessage(f"client {cid} was proved by node {nodes[cid]} first")
            except RejectedMessage as exc:
                log.warning("sharefl: node %d refused: %s", nid, exc)
                self.last_node_culprits[nid] = str(exc)
                continue
            nodes[cid] = nid
        return Route(nodes)

    def _key_stage(
        self,
        grid: Grid,
        current_round: int,
        route: Route,
        fitins: Mapping[int, RecordDict],
        failures: Failures,
    ) -> None:
        """``key_setup = "once"``: ask the selected clients without a key advert for one
        (one exchange, in the first round a client is selected in; none afterwards; a
        client that lost its keys sends new ones in its reply to the assignment), kept
        as :meth:`_accept_advert` says."""
        missing = sorted(cid for cid in fitins if cid not in self._key_adverts)
        if not missing:
            return
        contents = {}
        for cid in missing:
            content = RecordDict()
            put_record(content, STAGE_RECORD, {"stage": "keys", "signed": self.signed})
            contents[route.nodes[cid]] = content
        for reply in self._send(grid, contents, str(current_round)):
            nid = reply.metadata.src_node_id
            sender = route.clients.get(nid)
            if sender is None or sender not in missing:
                continue
            cid = sender
            if reply.has_error():
                failures.append(Exception(reply.error))
                continue
            self._accept_advert(nid, cid, reply.content)

    def _accept_advert(self, nid: int, cid: int, content: RecordDict) -> None:
        """Keep the key advert in ``content`` as client ``cid``'s when it names ``cid``,
        passes :func:`~sharefl.protocol.keys.check_key_advert` (signed mode: signed by the
        directory's key of ``cid``) and repeats no key another client advertised; else name
        node ``nid`` in ``last_node_culprits``."""
        try:
            advert = records.from_record(get_record(content, f"{PREFIX}.keys"), KeyAdvert)
            if advert.sender != cid:
                raise RejectedMessage(f"a key advert for client {advert.sender}", cid)
            check_key_advert(advert, self._directory.get(cid) if self.signed else None)
            others = [a for c, a in self._key_adverts.items() if c != cid]
            check_distinct_keys([*others, advert])
        except (records.RecordError, RejectedMessage, BadAdvertisement) as exc:
            log.warning("sharefl: node %d: key advert refused: %s", nid, exc)
            self.last_node_culprits[nid] = f"key advert refused: {exc}"
            return
        self._key_adverts[cid] = advert

    def _verified_hello(self, content: RecordDict, node_id: int, nonce: bytes) -> int:
        """The client id a hello reply proves. Raises :class:`RejectedMessage` for a reply
        that is malformed, names an id the directory lacks, or whose signature does not
        verify with that id's key."""
        try:
            hello = get_record(content, f"{PREFIX}.hello")
            cid = records.get_int(hello, "client_id")
            signature = records.get_bytes(hello, "signature", (SIGNATURE_BYTES,))
        except records.RecordError as exc:
            raise RejectedMessage(f"an unreadable hello: {exc}") from exc
        if cid not in self._directory:
            raise RejectedMessage(f"it claims client {cid}, which the directory lacks", cid)
        try:
            verify(self._directory[cid], node_hello_message(node_id, cid, nonce), signature)
        except SignatureError as exc:
            raise RejectedMessage(
                f"its hello as client {cid} is not signed by that client's identity", cid
            ) from exc
        return cid

    def _content(
        self,
        rc: RoundCoordinator,
        outgoing: Outgoing,
        cid: int,
        message: ClusterAssignment | ServerMessage,
        fitins: Mapping[int, RecordDict],
        model: bytes,
    ) -> RecordDict:
        """The RecordDict that carries ``message`` to client ``cid``: an assignment with
        its encoding (float updates) and, in the first reclustering, the round plan and the
        digest of the model (``model``: the client's memory checks it before it
        advertises); a stage message, the first reclustering's masking request with the
        training instructions (``fitins``), whose model the client checks against that
        digest. In the two-exchange round (the assignment carries keys) the first
        reclustering's assignment brings the instructions: the client trains, then replies
        with its masked input."""
        first = outgoing.reclustering == 0
        content = RecordDict()
        if isinstance(message, ClusterAssignment):
            if first and message.keys:  # two-exchange: the client trains on the assignment
                content = RecordDict(dict(fitins[cid].items()))
            if first:
                put_record(content, MODEL_RECORD, {"digest": model})
            put_record(content, STAGE_RECORD, {"stage": "assign", "max_weight": self.max_weight})
            put_record(content, f"{PREFIX}.assignment", records.to_record(message))
            if rc.encoding is not None:  # float updates; none for ring inputs (privacy)
                put_record(content, f"{PREFIX}.encoding", records.to_record(rc.encoding))
            if first:
                put_record(content, f"{PREFIX}.plan", records.to_record(rc.plan))
            return content
        if isinstance(message, MaskingRequest) and first:
            content = RecordDict(dict(fitins[cid].items()))
        put_record(content, STAGE_RECORD, {"stage": "step"})
        put_record(content, f"{PREFIX}.message", records.to_record(message))
        return content

    def _collect(
        self,
        grid: Grid,
        rc: RoundCoordinator,
        route: Route,
        contents: Mapping[int, RecordDict],
        group: str,
        train_replies: dict[int, Message],
        failures: Failures,
    ) -> None:
        """Send each node its content and deliver the replies that come before the
        stage's deadlines to the coordinator (errors are kept in ``failures``)."""
        if not contents:
            return
        for reply in self._send(grid, contents, group):
            sender = route.clients.get(reply.metadata.src_node_id)
            if sender is None:
                continue
            if reply.has_error():
                failures.append(Exception(reply.error))
                continue
            if has_record(reply.content, f"{PREFIX}.keys"):
                # A client that lost its keys (a restart) answers its assignment with new
                # ones: it sits this round out and takes part with them from the next.
                self._accept_advert(reply.metadata.src_node_id, sender, reply.content)
                continue
            self._deliver(rc, sender, reply, train_replies)

    def _deliver(
        self,
        rc: RoundCoordinator,
        cid: int,
        reply: Message,
        train_replies: dict[int, Message],
    ) -> None:
        content = reply.content
        try:
            message = records.from_record(
                get_record(content, f"{PREFIX}.message"), records.CLIENT_MESSAGES
            )
        except records.RecordError as exc:
            rc.name_culprit(cid, f"sent an unreadable message: {exc}")
            return
        try:
            rc.receive(cid, message)
        except RejectedMessage as exc:
            log.warning("sharefl: %s", exc)
            return
        if any(not name.startswith(PREFIX) for name in content):  # the training reply
            train_replies[cid] = reply

    def _aggregate(
        self, result: RoundResult, codec: WeightedUpdateCodec
    ) -> list[np.ndarray] | None:
        """The rule over each reclustering's cluster means (weighted by the clusters' total
        weights where the rule takes weights: Mean gives FedAvg exactly), averaged over
        the reclusterings; ``None`` when nothing was released."""
        weighted = []
        for sums in Released.from_reclusterings(result.reclusterings).sums:
            means, weights = codec.cluster_means(np.stack(sums))
            # the MEAN scale divides each sum by its size and weights by it: with the
            # clusters' total weights as sizes, Mean is FedAvg exactly
            weighted.append(
                [(m * w, float(w)) for m, w in zip(means, weights, strict=True) if w > 0]
            )
        if not any(weighted):
            return None
        return codec.split(self._aggregator.aggregate_released(weighted).numpy())

    def _aggregate_ring(
        self,
        result: RoundResult,
        codec: WeightedUpdateCodec,
        encoder: DistributedEncoder,
        seed: bytes,
    ) -> list[np.ndarray] | None:
        """With ``privacy``: each cluster's ring sum decoded, the rule over the cluster
        means (weighted by member counts), averaged over the reclusterings; the released
        sums are charged to :attr:`last_epsilon`'s ledger."""
        assert self._ledger is not None
        released = Released.from_reclusterings(
            result.reclusterings, lambda c: encoder.decode(c.ring_sum, seed)
        )
        self._ledger.record_round(released.all_members())
        self.last_epsilon = self._ledger.epsilon(self.delta)
        if not released:
            return None
        sized = [[(s, float(n)) for s, n in sums] for sums in released.pairs()]
        return codec.split(self._aggregator.aggregate_released(sized).numpy())


class ShareflStrategy(Strategy):
    """sharefl's secure aggregation around any Message-API strategy (``FedAvg``, ``FedProx``,
    ...), the way Flower's ``DifferentialPrivacyClientSideFixedClipping`` wraps one::

        strategy = ShareflStrategy(FedAvg(fraction_train=1.0), cluster_size=3, clip=1.0)
        result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=5)

    ``options`` are :class:`ShareflWorkflow`'s (``settings=`` a
    :class:`~sharefl.protocol.settings.SecureAggregationSettings` or its keywords: cluster
    size, clip, R, ...; rule, timeout, a directory for signed mode, distributed DP, ...);
    the workflow is :attr:`secure`, and
    its ``last_result``, ``last_update``, ``last_epsilon`` describe the last round.

    Each round, :meth:`configure_train` takes the inner strategy's train messages (its
    sampling, its ``ArrayRecord`` and ``ConfigRecord``) and runs the whole secure round
    through the grid (:meth:`ShareflWorkflow.secure_round`): the clients' ``@app.train()``
    functions run on those instructions when the first masking request reaches them, behind
    :func:`make_sharefl_mod`, and reply with a ``MetricRecord`` holding ``"num-examples"``.
    It returns no message for ``start`` to send. :meth:`aggregate_train` returns the
    secure aggregate itself: the received arrays plus the rule's aggregate of the released
    cluster sums (``secure.last_update``), bit for bit; it hands the inner strategy one
    reply per trained client (the new arrays and that client's metrics) for its metric
    aggregation and bookkeeping only, and discards the arrays it computes. The inner
    strategy thus supplies the sampling, the instructions and the metrics; a server-side
    optimiser of its own does not act on the model (docs/embedding.md). A round that
    released nothing leaves the arrays as they were (``aggregate_train`` returns ``None``
    for them). Evaluation is the inner strategy's.
    """

    def __init__(self, strategy: Strategy, **options: Any) -> None:
        self.strategy = strategy
        self.secure = ShareflWorkflow(**options)
        self._replies: list[Message] = []
        self._arrays: ArrayRecord | None = None

    def summary(self) -> None:
        log.info("ShareflStrategy: %s, around:", self.secure.settings)
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._replies = []
        self._arrays = None
        if not messages:
            return []
        contents = {m.metadata.dst_node_id: m.content for m in messages}
        outcome = self.secure.secure_round(grid, server_round, contents, arrays.to_numpy_ndarrays())
        if outcome.arrays is not None:
            new = ArrayRecord(dict(zip(arrays.keys(), map(Array, outcome.arrays), strict=True)))
            self._arrays = new
            for reply in outcome.train_replies.values():
                metrics = {k: v for k, v in reply.content.items() if isinstance(v, MetricRecord)}
                reply.content = RecordDict({"arrays": new, **metrics})
                self._replies.append(reply)
        return []  # the round ran above; ``start`` has nothing more to send

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The secure aggregate applied (the arrays :meth:`configure_train`'s round
        released, bit for bit; ``None`` when it released nothing) and the inner strategy's
        aggregate of the trained clients' metrics (its arrays are not used)."""
        if self._arrays is None:
            return None, None
        _, metrics = self.strategy.aggregate_train(server_round, self._replies)
        return self._arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)


def failure_reasons(result: RoundResult, failures: Failures, most: int = 3) -> str:
    """Why a round released nothing, for the log: the clients' error replies (refusals
    of their policy, exceptions) and the failed clusters' reasons, each distinct text once
    with its count, at most ``most`` of each kind."""

    def top(texts: list[str]) -> str:
        counts: dict[str, int] = {}
        for text in texts:
            counts[text] = counts.get(text, 0) + 1
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:most]
        return "; ".join(f"{text} (×{n})" for text, n in ranked)

    errors = [str(f) for f in failures if isinstance(f, BaseException)]
    clusters = [f"{f.stage}: {f.reason}" for r in result.reclusterings for f in r.failed]
    parts = []
    if errors:
        parts.append(
            f"{counted(len(errors), 'client error reply', 'client error replies')}: {top(errors)}"
        )
    if clusters:
        parts.append(f"{counted(len(clusters), 'cluster')} failed: {top(clusters)}")
    return (" — " + " | ".join(parts)) if parts else ""
