"""The server's run (:class:`ServerRun`): the clients' links, one sans-IO
:class:`~sharefl.protocol.coordinator.RoundCoordinator` per round driven stage by stage
with a deadline per stage, and the journal it writes before acting (:class:`RunJournal`).
Transport-free: :mod:`sharefl.deploy.service` moves its messages over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import grpc
import numpy as np

from sharefl.deploy import wire
from sharefl.deploy.config import DeploymentConfig, check_secure_deployment
from sharefl.deploy.distributed import deployment_encoder, input_length
from sharefl.deploy.errors import DeployError
from sharefl.deploy.results import Checkpoint, model_id
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol import messages as m
from sharefl.protocol.atoms import chunk_atoms, complete_atoms
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.coordinator import Exclusions, Release, RoundCoordinator
from sharefl.protocol.drive import server_exchanges
from sharefl.protocol.errors import (
    BadAdvertisement,
    ConfigurationError,
    LeakageError,
    RejectedMessage,
)
from sharefl.protocol.keys import KeyAdvert, check_distinct_keys, check_key_advert
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum
from sharefl.protocol.settings import KeySetup, SecureAggregationSettings
from sharefl.rounds.model_plans import ModelPlans
from sharefl.rounds.released import Released
from sharefl.wording import counted

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy this is Any, kept for the reader
    SessionContext: TypeAlias = grpc.aio.ServicerContext[pb.ClientMessage, pb.ServerMessage]
    """The server's end of one ``Session`` stream."""

from sharefl.deploy.errors import ClientsLost, RunStalled, TooFewClients
from sharefl.deploy.reports import Log, RoundReport, stall_message
from sharefl.deploy.strategy import AveragingStrategy, ServerStrategy


class StreamError(DeployError):
    """Ends one client's stream with a gRPC status code and a message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ClientLink:
    """One authenticated client stream."""

    client_id: int
    outbox: asyncio.Queue[pb.ServerMessage | bytes | None] = field(default_factory=asyncio.Queue)
    """Messages for the stream, or messages already serialized (:func:`wire.serialize`)."""
    alive: bool = True
    bytes_in: int = 0
    bytes_out: int = 0
    error: StreamError | None = None
    pending: tuple[wire.VectorAssembler, Callable[[np.ndarray], m.ClientMessage]] | None = None
    """A vector being reassembled, and what makes its message of it once complete."""
    heard: float = 0.0
    """``time.monotonic()`` when the last message of the client arrived."""
    ended: bool = False
    """The stream's handler has returned: everything queued for the client was written."""

    def send(self, message: pb.ServerMessage | bytes) -> None:
        if self.alive:
            self.bytes_out += wire.serialized_size(message)
            self.outbox.put_nowait(message)

    def send_vector(self, header_message: bytes, frames: Iterable[bytes]) -> None:
        """A message announcing a vector, then its chunks, all serialized once for every
        client they go to (:func:`wire.chunk_frames`)."""
        self.send(header_message)
        for frame in frames:
            self.send(frame)

    def close(self, error: StreamError | None = None) -> None:
        if self.alive:
            self.alive = False
            self.error = error
            self.outbox.put_nowait(None)


DRAIN_S = 30.0
"""How long a finished run waits for its clients' streams to end before the server stops."""

RUN_ID_BYTES = 16
"""A run id: drawn from ``os.urandom`` when a run starts, sent in every RoundStart, kept in
the checkpoint and on resume (clients key the round numbers they took part in by it)."""


class RunJournal(Protocol):
    """Where the server records, before acting on it, what it commits and releases
    (:class:`~sharefl.deploy.results.ResultsWriter` writes it to ``--out``).

    ``begin`` and ``plan`` are durable when they return, ``release`` once ``sync`` returns
    (the server syncs before it sends the messages a release justifies); an exception stops
    the run before the message it would justify is sent. ``model`` is the
    :func:`~sharefl.deploy.results.model_id` of the round's model.
    """

    def begin(self, run: bytes, model: np.ndarray, *, keep_aggregates: int) -> None:
        """The run (id and starting model) begins or resumes; its results keep the
        aggregates of the last ``keep_aggregates`` rounds (``server.keep_aggregates``)."""

    def plan(self, model: str, plan: RoundPlan) -> None:
        """A round's plan, before its RoundStart is sent."""

    def release(self, model: str, release: Release) -> None:
        """An approved release (``sum`` None), or its computed sum."""

    def sync(self) -> None:
        """Make every ``release`` so far durable: called before the messages of each stage
        are sent (an approval before its unmask request, a sum before the next
        reclustering opens) and at the end of each round."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


OWN_TEXT_CHARS = 600
"""Most characters of the server's own error messages (they quote ids and sizes)."""


def round_settings(config: DeploymentConfig) -> SecureAggregationSettings:
    """The protocol's settings of a deployment file: its ``[secure_aggregation]`` table as
    parsed (:class:`~sharefl.protocol.settings.SecureAggregationSettings`, without the
    server's own keys), with ``clip=None`` when ``[privacy]`` makes the clients send ring
    words (``clip`` bounds float inputs only). One translation, used by every round."""
    settings = config.secure_aggregation.as_settings()
    if config.privacy.enabled:
        return replace(settings, clip=None)  # ring inputs: no float encoding
    return settings


@dataclass
class PeerLog:
    """Log lines that carry a peer's text (refusal reasons, late messages), rate-limited:
    at most ``limit`` lines per client per round; :meth:`end_round` then writes one
    ``client <id>: ... <k> more suppressed`` line per client that sent more, and starts
    counting afresh. The text itself is already escaped and truncated by the caller."""

    log: Log
    limit: int
    counts: dict[int, int] = field(default_factory=dict)

    def line(self, client_id: int, text: str) -> None:
        """Log ``text`` unless ``client_id`` used up its lines of this round."""
        self.counts[client_id] = self.counts.get(client_id, 0) + 1
        if self.counts[client_id] <= self.limit:
            self.log(text)

    def end_round(self) -> None:
        """Say how many lines each client had suppressed, then reset the counts."""
        for client_id, count in sorted(self.counts.items()):
            if count > self.limit:
                self.log(f"client {client_id}: ... {count - self.limit} more suppressed")
        self.counts.clear()


def sample_participants(
    eligible: Sequence[int], per_round: int, rng: np.random.Generator
) -> list[int]:
    """The sorted participants of a round: ``per_round`` of the ``eligible`` clients drawn
    uniformly without replacement from ``rng`` (:func:`deployment_rng`: the operating
    system's randomness), or all of them when ``per_round`` is 0 or not below their number.
    Raises :class:`ConfigurationError` for a negative ``per_round``."""
    if per_round < 0:
        raise ConfigurationError(f"per_round must be >= 0; got {per_round}")
    pool = sorted(eligible)
    if per_round == 0 or len(pool) <= per_round:
        return pool
    return sorted(int(c) for c in rng.choice(pool, size=per_round, replace=False))


def sample_atoms(
    atoms: Sequence[tuple[int, ...]], per_round: int, rng: np.random.Generator
) -> list[tuple[int, ...]]:
    """The atoms of a round: whole atoms drawn uniformly without replacement from ``rng``
    until they hold at least ``per_round`` clients (all of them when ``per_round`` is 0 or
    they hold fewer): with atoms, client sampling takes whole atoms or none."""
    if per_round < 0:
        raise ConfigurationError(f"per_round must be >= 0; got {per_round}")
    if per_round == 0 or sum(len(a) for a in atoms) <= per_round:
        return sorted(atoms)
    chosen: list[tuple[int, ...]] = []
    held = 0
    for index in rng.permutation(len(atoms)):
        if held >= per_round:
            break
        chosen.append(atoms[int(index)])
        held += len(chosen[-1])
    return sorted(chosen)


class ServerRun:
    """The server's side of a training run over gRPC: client links and rounds.

    Each round is one :class:`~sharefl.protocol.coordinator.RoundCoordinator` (planning,
    audit, encoding, routing, release); this class only moves its messages over the
    authenticated links, closes stages on the configured deadline, and applies the
    strategy to what the round released. A client named a culprit is excluded from later
    rounds by the configured policy (``secure_aggregation.exclude_after``) and its stream
    ended with ``PERMISSION_DENIED``. With ``server.clients_per_round = k`` each round's
    participants are k of the connected, eligible clients (:func:`sample_participants`);
    the others only get the round's RoundEnd.

    One model, one plan (the invariant of :mod:`sharefl.protocol.coordinator`): a round
    whose model has a :class:`~sharefl.rounds.model_plans.ModelPlan` (an earlier round, or
    the run before a restart, planned on it) reuses its clusterings and participants
    exactly, with its releases seeding the audit; a participant that is gone, excluded or
    not connected counts as dropped (its clusters' sums shrink, and the audit decides).
    Only a new model gets a new plan (and, with ``clients_per_round``, new participants).

    ``resume`` (a :class:`~sharefl.deploy.results.Checkpoint`) continues a stopped run: its
    run id, model, the clusterings and releases of that model, the exclusions its rounds
    recorded, and rounds from its ``next_round`` on. ``journal`` records plans and releases
    before they are acted on (:class:`RunJournal`). ``on_round(report, model)`` is called
    after every finished round (the results writer); once it returned, the report's
    aggregate is dropped so memory does not grow with the rounds. Raises
    :class:`ConfigurationError` for an insecure configuration off loopback
    (:func:`~sharefl.deploy.config.check_secure_deployment`).
    """

    def __init__(
        self,
        config: DeploymentConfig,
        log: Log = _stderr,
        strategy: ServerStrategy | None = None,
        directory: Mapping[int, bytes] | None = None,
        on_round: Callable[[RoundReport, np.ndarray], None] | None = None,
        resume: Checkpoint | None = None,
        journal: RunJournal | None = None,
    ) -> None:
        self.config = config
        self.settings = round_settings(config)
        self.strategy = strategy or AveragingStrategy(config)
        self.encoder = deployment_encoder(config)
        self.privacy_ledger = None
        if self.encoder is not None:
            from sharefl.privacy.distributed import ReleaseLedger

            self.privacy_ledger = ReleaseLedger(self.encoder, self.encoder.config.colluders)
        self.log = log
        self.peer_log = PeerLog(log, config.server.peer_log_lines)
        self.directory = dict(directory or {})
        self.links: dict[int, ClientLink] = {}
        self.accepting = True
        self.changed = asyncio.Event()
        self.round: RoundCoordinator | None = None
        self.rng = deployment_rng(config)
        self.insecure = check_secure_deployment(config)
        self.on_round = on_round
        self.identities: dict[int, bytes] = {}
        self.exclusions = Exclusions(config.secure_aggregation.exclude_after)
        self.start_round = 0
        self.model = np.asarray(self.strategy.initial_model(), dtype=np.float32)
        self.journal = journal
        self.run_id = os.urandom(RUN_ID_BYTES)
        self.plans = ModelPlans(
            resume.current if resume is not None else None,
            on_plan=journal.plan if journal is not None else None,
            on_release=journal.release if journal is not None else None,
        )
        """The plan and releases of the model the last round ran on (see the class doc)."""
        self.atoms: Clustering | None = None
        """The atoms of this server (``secure_aggregation.atoms``, on by default): the
        directory's ids (or ``server.clients`` ids) cut in order (:func:`chunk_atoms`), the
        same in every run and restart over these clients."""
        if self.settings.atoms_on(deployment=True):
            ids = sorted(self.directory) or range(config.server.clients)
            self.atoms = chunk_atoms(ids, self.settings.resolved_atom_size)
        if resume is not None:
            self.start_round = resume.next_round
            self.model = np.asarray(resume.model, dtype=np.float32)
            if resume.run is not None:
                self.run_id = resume.run
            for row in resume.rows:  # the exclusion policy's and the ledger's state, replayed
                self.exclusions.record({int(c): r for c, r in row["culprits"].items()})
                if self.privacy_ledger is not None:
                    self.privacy_ledger.record_round([c["members"] for c in row["clusters"]])
        if self.model.shape != (config.model.dim,):
            raise ConfigurationError(
                f"the strategy's model has shape {self.model.shape}; "
                f"model.dim is {config.model.dim}"
            )
        self.key_adverts: dict[int, KeyAdvert] = {}
        """Each client's long-term key advert (in its Hello; a reconnect replaces it): what
        the two-exchange round (``key_setup = "once"``) relays."""
        self.reports: list[RoundReport] = []
        self.empty_rounds = 0
        """Rounds in a row, up to the last, that released no cluster sum the strategy could
        aggregate."""

    # -- links ------------------------------------------------------------------------------

    def register(self, client_id: int, identity: bytes | None = None) -> ClientLink:
        """A link for an authenticated client. An id is bound to the first Ed25519 identity
        that authenticated as it in this run: a later stream for that id (a reconnect) must
        prove the same identity. Raises :class:`StreamError`: ``PERMISSION_DENIED`` for
        another identity or an excluded client, ``ALREADY_EXISTS`` while the id is
        connected, ``FAILED_PRECONDITION`` for a new id once the run started."""
        bound = self.identities.get(client_id)
        if identity is not None and bound is not None and bound != identity:
            raise StreamError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client id {client_id} is bound to another identity in this run; "
                "a reconnecting client must sign with the same identity key",
            )
        old = self.links.get(client_id)
        if old is not None and old.alive:
            raise StreamError(grpc.StatusCode.ALREADY_EXISTS, f"client {client_id} is connected")
        if client_id in self.exclusions.excluded:
            raise StreamError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"client {client_id} is excluded: {self.exclusions.reasons[client_id]}",
            )
        if not self.accepting and old is None:
            raise StreamError(
                grpc.StatusCode.FAILED_PRECONDITION, "the run has started; new clients are closed"
            )
        link = ClientLink(client_id)
        if identity is not None:
            self.identities[client_id] = identity
        self.links[client_id] = link
        self.log(f"client {client_id} {'reconnected' if old is not None else 'connected'}")
        self.changed.set()
        return link

    def disconnect(self, link: ClientLink) -> None:
        link.close(link.error)
        link.ended = True
        self.changed.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait, at most ``timeout_s``, until every client's stream has ended, so that the
        ``Finished`` each was sent has been written before the server stops (a fixed grace
        can end a slow client's stream first: it then retries a server that is gone)."""
        deadline = time.monotonic() + timeout_s
        while any(not link.ended for link in self.links.values()):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def alive(self) -> list[int]:
        return sorted(cid for cid, link in self.links.items() if link.alive)

    def ready(self) -> list[int]:
        """The connected clients a round can plan: with ``key_setup = "once"`` those whose
        key advert arrived (in their Hello)."""
        if self.settings.key_setup is not KeySetup.ONCE:
            return self.alive()
        return [cid for cid in self.alive() if cid in self.key_adverts]

    def misbehaved(self, link: ClientLink, error: StreamError) -> None:
        """End ``link`` for what only the transport sees (undecodable or oversized bytes,
        broken chunking) and name its client in the current round."""
        if self.round is not None:
            self.round.name_culprit(link.client_id, f"{error.code.name}: {error}")
        link.close(error)
        self.changed.set()

    # -- incoming ---------------------------------------------------------------------------

    def on_message(self, link: ClientLink, envelope: pb.ClientMessage) -> None:
        """Route one client message; raises :class:`StreamError` for one that no honest
        client sends (the caller ends the stream and names the client)."""
        link.bytes_in += wire.serialized_size(envelope)
        kind = envelope.WhichOneof("body")
        try:
            if kind == "chunk":
                self._on_chunk(link, envelope.chunk)
            elif link.pending is not None:
                raise wire.WireError("a vector's chunks were interrupted by another message")
            elif kind == "masked":
                header = envelope.masked
                self._expect_vector(
                    link, header.vector, functools.partial(wire.masked_from_parts, header)
                )
            elif kind == "masked_shares":
                complete = wire.masked_shares_check(envelope.masked_shares)  # before the vector
                self._expect_vector(link, envelope.masked_shares.vector, complete)
            elif kind == "key_advert":
                self.on_key_advert(link, wire.key_advert_from_proto(envelope.key_advert))
            elif kind == "refusal":
                self._on_refusal(link, envelope.refusal)
            else:
                # each takes the envelope's field of that name (a pb message of its own type)
                converters: dict[str, Callable[[Any], m.ClientMessage]] = {
                    "advertise": wire.advert_from_proto,
                    "shares": wire.shares_from_proto,
                    "consistency": wire.signature_from_proto,
                    "unmask": wire.unmask_response_from_proto,
                }
                if kind not in converters:
                    raise wire.WireError(f"unexpected message {kind!r} after the Hello")
                self._deliver(link, converters[kind](getattr(envelope, kind)))
        except wire.WireError as exc:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except RejectedMessage as exc:
            raise StreamError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc

    def _on_refusal(self, link: ClientLink, refusal: pb.Refusal) -> None:
        """Log a client's refusal and, when it names the client's open cluster, stop
        waiting for it there (:meth:`RoundCoordinator.withdraw`): the stage closes when
        the others have answered instead of at its deadline. A refusal whose context does
        not parse is only logged: a refusal carries no data the round uses."""
        self.peer_log.line(link.client_id, f"client {link.client_id} refused: {refusal.reason}")
        if self.round is None:
            return
        with contextlib.suppress(wire.WireError):
            if self.round.withdraw(link.client_id, wire.context_from_proto(refusal.context)):
                self.changed.set()

    def _deliver(self, link: ClientLink, message: m.ClientMessage) -> None:
        """Hand ``message`` to the round as sent by the link's authenticated client. A late
        message (its stage or reclustering has closed) is dropped with a log line; anything
        else the round rejects ends the stream."""
        if self.round is None:
            raise RejectedMessage("no round is running", link.client_id)
        try:
            self.round.receive(link.client_id, message)
        except RejectedMessage as exc:
            if exc.misbehaviour:
                raise
            text = wire.printable(str(exc), OWN_TEXT_CHARS)
            self.peer_log.line(
                link.client_id, f"client {link.client_id}: late message dropped: {text}"
            )
        self.changed.set()

    def check_key_advert(self, cid: int, advert: KeyAdvert) -> None:
        """Raise :class:`RejectedMessage` unless ``advert`` may be client ``cid``'s: it names
        ``cid``, passes :func:`~sharefl.protocol.keys.check_key_advert` (signed mode:
        signed by the directory's key of ``cid``) and repeats no key another client
        advertised."""
        if advert.sender != cid:
            raise RejectedMessage(f"client {cid} sent a key advert for client {advert.sender}", cid)
        try:
            check_key_advert(advert, self.directory.get(cid) if self.settings.signed else None)
            check_distinct_keys([*(a for c, a in self.key_adverts.items() if c != cid), advert])
        except BadAdvertisement as exc:
            raise RejectedMessage(f"client {cid}: key advert refused: {exc}", cid) from exc

    def on_key_advert(self, link: ClientLink, advert: KeyAdvert) -> None:
        """Keep a client's long-term key advert (its Hello's, or a later one), checked
        (:meth:`check_key_advert`; its :class:`RejectedMessage` ends the stream)."""
        self.check_key_advert(link.client_id, advert)
        self.key_adverts[link.client_id] = advert
        self.changed.set()

    def _expect_vector(
        self,
        link: ClientLink,
        header: pb.VectorHeader,
        complete: Callable[[np.ndarray], m.ClientMessage],
    ) -> None:
        # Every cluster of a run has the inputs' length and the ring's width, so a masked
        # input is reassembled before its context is checked (a late one is then dropped).
        dtype = np.uint32 if self.settings.bits == 32 else np.uint64
        length = input_length(self.config, self.encoder)
        link.pending = (wire.VectorAssembler(header, length, dtype), complete)
        if link.pending[0].complete:
            self._finish_vector(link)

    def _on_chunk(self, link: ClientLink, chunk: pb.VectorChunk) -> None:
        if link.pending is None:
            raise wire.WireError("a vector chunk without a vector header")
        if link.pending[0].add(chunk):
            self._finish_vector(link)

    def _finish_vector(self, link: ClientLink) -> None:
        assert link.pending is not None
        assembler, complete = link.pending
        link.pending = None
        self._deliver(link, complete(assembler.result()))

    # -- the run ----------------------------------------------------------------------------

    async def wait_for_clients(self) -> None:
        wanted = self.config.server.clients
        deadline = time.monotonic() + self.config.server.connect_timeout_s
        while len(self.ready()) < wanted and time.monotonic() < deadline:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())
        self.accepting = False
        have = len(self.ready())
        self.log(f"{have} of {counted(wanted, 'client')} connected")
        if have < 2:
            raise TooFewClients(
                f"only {counted(have, 'client')} connected within server.connect_timeout_s = "
                f"{self.config.server.connect_timeout_s:g} s; a run needs at least 2 (start the "
                "clients with this server's address, or raise connect_timeout_s)"
            )

    async def run(self) -> list[RoundReport]:
        """All rounds, then the final model to every client. A failure of the run (too few
        clients, a configuration error in a round) ends every stream with
        ``FAILED_PRECONDITION`` and the reason, so clients report the server's refusal, and
        is raised again."""
        try:
            if self.journal is not None:
                self.journal.begin(
                    self.run_id,
                    self.model,
                    keep_aggregates=self.config.server.keep_aggregates,
                )
            await self.wait_for_clients()
            for round_index in range(self.start_round, self.config.server.rounds):
                self._warn_insecure()
                report = await self._round(round_index)
                moved = report.total is not None
                if self.on_round is not None:
                    self.on_round(report, self.model)
                    report.total = None
                self.reports.append(report)
                self._check_progress(report, moved)
        except (ConfigurationError, LeakageError, RunStalled, TooFewClients, ClientsLost) as exc:
            self.abort(f"the server stopped the run: {exc}")
            raise
        self._finish()
        return self.reports

    def _check_progress(self, report: RoundReport, aggregated: bool) -> None:
        """Count the rounds in a row that released no cluster sum, or only sums the
        strategy could not aggregate (``aggregated``: it returned an aggregate; a robust
        rule refuses fewer sums than its ``f`` needs); ``report`` is the latest. Raise
        :class:`RunStalled` when they reach ``server.max_empty_rounds`` (0: never)."""
        self.empty_rounds = 0 if report.clusters and aggregated else self.empty_rounds + 1
        limit = self.config.server.max_empty_rounds
        if limit and self.empty_rounds >= limit:
            raise RunStalled(stall_message(report, self.empty_rounds))

    def abort(self, reason: str) -> None:
        """End every client's stream with ``FAILED_PRECONDITION`` and ``reason``."""
        error = StreamError(grpc.StatusCode.FAILED_PRECONDITION, wire.printable(reason, 600))
        for link in self.links.values():
            link.close(error)

    def _sync_journal(self) -> None:
        if self.journal is not None:
            self.journal.sync()

    def _warn_insecure(self) -> None:
        """Off loopback (``server.insecure = true``), say before every round what is
        insecure (on loopback, testing, the start-up line says it once)."""
        if self.insecure and not self.config.server.loopback:
            self.log("WARNING: INSECURE DEPLOYMENT: " + "; ".join(self.insecure))

    async def _round(self, round_index: int) -> RoundReport:
        start = time.monotonic()
        before = {cid: (link.bytes_in, link.bytes_out) for cid, link in self.links.items()}
        eligible = self.exclusions.eligible(self.ready())
        rc = self._coordinator(round_index, eligible)
        participants = list(rc.plan.participants)
        self.round = rc
        start_message = pb.ServerMessage(
            round_start=pb.RoundStart(
                round=round_index,
                model=wire.vector_header(self.model),
                reclusterings=rc.plan.reclusterings,
                plan=wire.plan_to_proto(rc.plan),
                run=self.run_id,
            )
        ).SerializeToString()
        frames = wire.chunk_frames(pb.ServerMessage, self.model)
        for cid in sorted(set(participants) & set(eligible)):
            self.links[cid].send_vector(start_message, frames)
        for outgoing in server_exchanges(rc):
            self._sync_journal()  # the approvals these messages act on, one fsync
            for cid, message in outgoing.messages.items():
                if isinstance(message, m.ClusterAssignment):
                    proto = pb.ServerMessage(
                        assignment=wire.assignment_to_proto(message, rc.encoding)
                    )
                else:
                    proto = wire.server_message_to_proto(message)
                self._send(cid, proto)
            await self._wait_stage(rc)
        result = rc.result()
        self._sync_journal()
        self.round = None
        # read before the strategy replaces the model (the ring sums' seed names it)
        released = Released.from_reclusterings(result.reclusterings, self._ring_reader(round_index))
        self.model, total, note = self.strategy.apply(self.model, round_index, released)
        self._exclude(result.culprits)
        report = RoundReport.of(
            result, sorted(self.exclusions.excluded), time.monotonic() - start, total
        )
        report.sampled_out = sorted(set(eligible) - set(participants))
        if self.privacy_ledger is not None:
            self.privacy_ledger.record_round(released.all_members())
            report.epsilon = self.privacy_ledger.epsilon(self.config.privacy.delta)
        report.traffic = {
            cid: {
                "bytes_in": link.bytes_in - before.get(cid, (0, 0))[0],
                "bytes_out": link.bytes_out - before.get(cid, (0, 0))[1],
            }
            for cid, link in sorted(self.links.items())
        }
        for cid in self.alive():
            self.links[cid].send(
                pb.ServerMessage(
                    round_end=pb.RoundEnd(
                        round=round_index,
                        clusters_ok=len(report.clusters),
                        clusters_failed=len(report.failed) + len(report.withheld),
                    )
                )
            )
        self.log(
            f"round {round_index + 1}/{self.config.server.rounds}: "
            f"{counted(len(participants), 'client')}, "
            f"{counted(len(report.clusters), 'cluster')} ok, {len(report.failed)} failed, "
            f"{len(report.withheld)} withheld, {len(report.corrupted)} corrupted, "
            f"{counted(report.contributors, 'contribution')}, {report.seconds:.2f} s"
            + (f", culprits {sorted(report.culprits)}" if report.culprits else "")
            + (f", {len(report.sampled_out)} not sampled" if report.sampled_out else "")
            + (f", ε ≤ {report.epsilon:.3g}" if report.epsilon is not None else "")
            + note
        )
        self.peer_log.end_round()
        return report

    def _ring_reader(self, round_index: int) -> Callable[[ClusterSum], np.ndarray] | None:
        """With ``[privacy]``, how a released cluster's ring sum is read this round:
        decoded with the round's public seed; ``None`` without (the float inputs' decoded
        sum is the value)."""
        encoder = self.encoder
        if encoder is None:
            return None
        seed = wire.round_seed(self.run_id, round_index, self.model)
        return lambda s: encoder.decode(s.ring_sum, seed)

    def _coordinator(self, round_index: int, eligible: list[int]) -> RoundCoordinator:
        """The round's coordinator, its plan committed to the journal. Over the model of
        :attr:`current` it reuses that plan's clusterings and participants with its releases
        as the audit's prior; over a new model it samples participants and draws a plan.
        Raises :class:`ConfigurationError` when fewer than ``max(2, min_sum_size)`` of the
        round's participants are connected and not excluded."""
        digest = model_id(self.model)
        record = self.plans.reusable(digest, atoms=self.atoms is not None)
        partition = None
        if self.atoms is not None:
            chosen = sample_atoms(
                complete_atoms(self.atoms, eligible), self.config.server.clients_per_round, self.rng
            )
            participants = sorted(i for atom in chosen for i in atom)
            partition = Clustering(tuple(chosen)) if chosen else None
        elif record is not None:
            participants = record.participants
        else:
            participants = sample_participants(
                eligible, self.config.server.clients_per_round, self.rng
            )
        live = set(participants) & set(eligible)
        needed = max(2, self.settings.min_sum_size)
        if len(live) < needed:
            again = " of the model's planned clients" if record is not None else ""
            if self.atoms is not None:
                again = " in complete atoms"
            raise ClientsLost(
                f"round {round_index + 1}: only {len(live)}{again} left (connected and not "
                f"excluded); a round needs at least {needed} (the clients' own lines say why "
                "they left)"
            )
        rc = self.plans.coordinator(
            self.settings,
            model=digest,
            reuse=record,
            round=round_index,
            participants=participants,
            length=input_length(self.config, self.encoder),
            rng=self.rng,
            directory=self.directory,
            atom_partition=partition,
            keys=self.key_adverts,
        )
        if record is not None:
            self.log(
                f"round {round_index + 1}: the model is unchanged, so its clusterings are "
                f"reused ({counted(len(record.releases), 'sum')} already released on it)"
            )
        return rc

    def _send(self, cid: int, message: pb.ServerMessage) -> None:
        link = self.links.get(cid)
        if link is not None:
            link.send(message)

    def _exclude(self, culprits: Mapping[int, str]) -> None:
        self.exclusions.record(culprits)
        for cid in sorted(self.exclusions.excluded & set(self.alive())):
            reason = self.exclusions.reasons[cid]
            self.log(f"client {cid} excluded from later rounds: {reason}")
            self.links[cid].close(
                StreamError(grpc.StatusCode.PERMISSION_DENIED, f"excluded: {reason}")
            )

    async def _wait_stage(self, rc: RoundCoordinator) -> None:
        deadline = time.monotonic() + self.config.server.stage_timeout_s
        while time.monotonic() < deadline:
            waiting = {
                cid for cid in rc.waiting_for() if cid in self.links and self.links[cid].alive
            }
            if not waiting:
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), deadline - time.monotonic())

    def _finish(self) -> None:
        finished = pb.ServerMessage(
            finished=pb.Finished(rounds=len(self.reports), model=wire.vector_header(self.model))
        ).SerializeToString()
        frames = wire.chunk_frames(pb.ServerMessage, self.model)
        for cid in self.alive():
            link = self.links[cid]
            link.send_vector(finished, frames)
            link.close()


def deployment_rng(config: DeploymentConfig) -> np.random.Generator:
    """The generator of cluster plans and SecAgg+ graphs: seeded from the operating system
    (``secrets``), unless the file sets ``secure_aggregation.reproducible_seed`` (tests)."""
    seed = config.secure_aggregation.reproducible_seed
    return np.random.default_rng(secrets.randbits(128) if seed is None else seed)
