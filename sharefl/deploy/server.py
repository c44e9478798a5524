"""The aggregation server over gRPC: one bidirectional stream per client (grpc.aio).

The service authenticates each stream (a signed Hello against the identity directory,
optionally TLS client certificates), converts messages with :mod:`sharefl.deploy.wire`
and hands them to the :class:`ServerRun`, which drives one sans-IO
:class:`~sharefl.protocol.coordinator.RoundCoordinator` per round, stage by stage with a
deadline per stage, routing every message by the stream's authenticated client id. A
client that misses a deadline or disconnects counts as dropped; a late message (of an
earlier round or reclustering, or of a stage that has closed) is dropped with a log line and
never held against its sender; a client whose message no honest client sends (malformed,
oversized, contradictory) gets its stream ended with ``INVALID_ARGUMENT`` or
``FAILED_PRECONDITION`` and a message, is named a culprit of the round and counts as
dropped. Either way the other clients' rounds continue through the protocol's drop-out
recovery. Every stream the server ends, ends with a status code and a message that says
why (a :class:`StreamError`), never with gRPC's bare ``INTERNAL``.

Across rounds and restarts the server keeps the coordinator's invariant
(:mod:`sharefl.protocol.coordinator`): **the server never releases sums of one model under
two clusterings, and its release audit covers every sum released on that model, across
rounds and restarts.** A round whose model is the one the previous round ran on (nothing
was released, or the strategy left the model as it was) reuses that round's clusterings
under its new round number, its release audit seeded with every sum released on the model
so far; each round's plan and each release are written to the run's journal
(:class:`RunJournal`, :class:`~sharefl.deploy.results.ResultsWriter`) before the RoundStart
or unmask request they justify leaves, and a resumed run restores them with the run id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from sharefl import __version__
from sharefl.crypto.errors import SignatureError
from sharefl.crypto.kdf import KEY_BYTES
from sharefl.crypto.signatures import (
    HELLO_NONCE_BYTES,
    SIGNATURE_BYTES,
    stream_hello_message,
    verify,
)
from sharefl.deploy import wire
from sharefl.deploy.config import DeploymentConfig, check_secure_deployment
from sharefl.deploy.distributed import deployment_encoder, input_length
from sharefl.deploy.errors import DeployError
from sharefl.deploy.results import Checkpoint, ModelRecord, model_id
from sharefl.exit_status import ExitStatus
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol import messages as m
from sharefl.protocol.atoms import chunk_atoms, complete_atoms
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.coordinator import Exclusions, Release, RoundCoordinator, RoundResult
from sharefl.protocol.drive import server_exchanges
from sharefl.protocol.errors import (
    BadAdvertisement,
    ConfigurationError,
    LeakageError,
    RejectedMessage,
)
from sharefl.protocol.keyfiles import read_directory
from sharefl.protocol.keys import ClientKeys, KeyAdvert, check_distinct_keys, check_key_advert
from sharefl.protocol.model_step import descend  # the one model step; re-exported here
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum
from sharefl.protocol.settings import KeySetup, SecureAggregationSettings
from sharefl.wording import counted

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy this is Any, kept for the reader
    SessionContext: TypeAlias = grpc.aio.ServicerContext[pb.ClientMessage, pb.ServerMessage]
    """The server's end of one ``Session`` stream."""

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
TRANSPORT_OPTIONS = (
    ("grpc.http2.lookahead_bytes", 16 * 1024 * 1024),
    ("grpc.http2.max_frame_size", 16 * 1024 * 1024 - 1),
)
MIN_PING_INTERVAL_S = 1.0
"""The server accepts client keepalive pings this often (clients ping every
``server_timeout_s / 4`` seconds, at least this)."""


def keepalive_options(interval_s: float) -> list[tuple[str, int]]:
    """gRPC channel arguments for HTTP/2 keepalive: a ping every ``interval_s`` seconds, the
    connection closed (``UNAVAILABLE``) when one is not answered within ``interval_s``. Pings
    flow while a stream is idle, so a stopped or vanished peer is noticed within about
    ``2 × interval_s`` even when no protocol message is due."""
    ms = int(interval_s * 1000)
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.http2.ping_timeout_ms", ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", min(ms, int(MIN_PING_INTERVAL_S * 1000))),
        ("grpc.http2.min_ping_interval_without_data_ms", min(ms, int(MIN_PING_INTERVAL_S * 1000))),
    ]


def server_keepalive_options(interval_s: float) -> list[tuple[str, int]]:
    """The server's keepalive (it pings each client) and its tolerance of client pings."""
    return [
        *keepalive_options(interval_s),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", int(MIN_PING_INTERVAL_S * 1000)),
        ("grpc.http2.max_ping_strikes", 0),
    ]


class RunStalled(DeployError):
    """``server.max_empty_rounds`` rounds in a row released no cluster sum, so the server
    stopped the run: the model cannot change, and a round over an unchanged model reuses its
    plan, so the run would only repeat (e.g. a client that corrupted its cluster's sum and
    left: without it the cluster's smaller sum is withheld in every later round). The
    message names the last round's withheld, failed and corrupted clusters and what to
    change."""

    exit_status = ExitStatus.STALLED


class TooFewClients(DeployError):
    """Fewer than two clients connected within ``server.connect_timeout_s``: no round can
    run. The message says how many came and what to change."""

    exit_status = ExitStatus.NO_CLIENTS


class ClientsLost(DeployError):
    """A round found fewer clients left (connected and not excluded) than it needs: the
    others left (their trainers raised, they were stopped or cut off) or were excluded."""

    exit_status = ExitStatus.CLIENTS_LOST


STALL_REASON_CHARS = 160
"""Most characters of one cluster's reason in a :class:`RunStalled` message."""
STALL_CLUSTERS = 4
"""Most clusters a :class:`RunStalled` message names (then ``and k more``)."""


def unreleased_clusters(report: RoundReport) -> list[str]:
    """One phrase per cluster of ``report`` that released no sum, ``cluster r/i withheld:
    reason`` (also ``failed at <stage>``, ``corrupted``), each reason cut to
    :data:`STALL_REASON_CHARS`."""
    phrases = []
    for key in ("withheld", "failed", "corrupted"):
        for entry in getattr(report, key):
            how = f"failed at {entry['stage']}" if key == "failed" else key
            reason = wire.printable(str(entry["reason"]), STALL_REASON_CHARS)
            phrases.append(f"cluster {entry['reclustering']}/{entry['cluster']} {how}: {reason}")
    return phrases


def stall_message(report: RoundReport, empty: int) -> str:
    """Why the run stops after ``empty`` rounds in a row without a released sum, the last
    being ``report``, and what to change (:class:`RunStalled`)."""
    phrases = unreleased_clusters(report)
    named = "; ".join(phrases[:STALL_CLUSTERS]) or "no cluster ran"
    if len(phrases) > STALL_CLUSTERS:
        named += f"; and {len(phrases) - STALL_CLUSTERS} more"
    first, last = report.round - empty + 2, report.round + 1
    return (
        f"{counted(empty, 'round')} in a row (rounds {first}-{last}) released no cluster sum, "
        f"so the model cannot change and the server stops the run; round {last}: {named}. "
        "Bring back the clusters' missing clients or remove the ones that corrupt them, or "
        "start a new run (a new model gets a new plan); server.max_empty_rounds sets how "
        "many such rounds a run allows (0: never stop)"
    )


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


@dataclass
class RoundReport:
    """What one round did, as written to ``result.json``.

    Attributes:
        round: the round index (from 0, as on the wire; files and logs number it from 1).
        participants: the clients planned into the round.
        clusters: the released sums of every reclustering (reclustering, cluster, members,
            dropped, excluded: left out because every peer disowned it, not named;
            complaints).
        failed: clusters without a sum (reclustering, cluster, members, stage, reason,
            culprits); ``withheld`` lists those the release check held back.
        withheld: clusters whose sum would have made an update or a too-small sum
            recoverable (reclustering, cluster, members, reason).
        corrupted: sums outside the honest range, left out of the aggregate.
        culprits: client id → why it was named (malformed or rejected messages, secrets
            that could not be rebuilt from its own dealing); never a client its peers
            disowned or complained about.
        excluded: clients left out of later rounds by the exclusion policy (cumulative).
        contributors: the largest number of clients one reclustering aggregated.
        seconds: the round's wall time.
        sampled_out: connected, eligible clients that ``server.clients_per_round`` left out
            of this round (they only got its RoundEnd).
        traffic: client id → ``bytes_in`` (received from it) and ``bytes_out`` (sent to it)
            during this round only (the run's totals are ``RunResult.traffic``).
        epsilon: with ``[privacy]``, the worst client's ε so far at ``privacy.delta``
            (:class:`~sharefl.privacy.distributed.ReleaseLedger`); ``None`` otherwise.
        total: the aggregate over the reclusterings (see :class:`AveragingStrategy`;
            ``None`` when nothing was released). Not written to JSON.
    """

    round: int
    participants: list[int]
    clusters: list[dict[str, Any]]
    failed: list[dict[str, Any]]
    withheld: list[dict[str, Any]]
    corrupted: list[dict[str, Any]]
    culprits: dict[int, str]
    excluded: list[int]
    contributors: int
    seconds: float
    total: np.ndarray | None = None
    sampled_out: list[int] = field(default_factory=list)
    traffic: dict[int, dict[str, int]] = field(default_factory=dict)
    epsilon: float | None = None

    @classmethod
    def of(
        cls, result: RoundResult, excluded: list[int], seconds: float, total: np.ndarray | None
    ) -> RoundReport:
        clusters: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        withheld: list[dict[str, Any]] = []
        corrupted: list[dict[str, Any]] = []
        contributors = 0
        for rec in result.reclusterings:
            for s in rec.clusters:
                clusters.append(
                    {
                        "reclustering": rec.index,
                        "cluster": s.cluster,
                        "members": list(s.members),
                        "dropped": list(s.dropped),
                        "excluded": list(s.excluded),
                        "complaints": [list(c) for c in s.complaints],
                    }
                )
            for f in rec.failed:
                entry = {"reclustering": rec.index, **asdict(f)}
                (withheld if f.stage == "release" else failed).append(entry)
            corrupted += [{"reclustering": rec.index, **asdict(c)} for c in rec.corrupted]
            contributors = max(contributors, sum(len(s.members) for s in rec.clusters))
        return cls(
            round=result.plan.round,
            participants=list(result.plan.participants),
            clusters=clusters,
            failed=failed,
            withheld=withheld,
            corrupted=corrupted,
            culprits=dict(sorted(result.culprits.items())),
            excluded=excluded,
            contributors=contributors,
            seconds=seconds,
            total=total,
        )


@dataclass
class RunResult:
    """The outcome of a server run: one report per round, the final model, and the bytes
    received from (``bytes_in``) and sent to (``bytes_out``) each client over the whole run,
    as protobuf message sizes (each report has its round's share)."""

    reports: list[RoundReport]
    model: np.ndarray
    traffic: dict[int, dict[str, int]]


Log = Callable[[str], None]


class ReleasedSum(NamedTuple):
    """One released cluster sum: its value (float64 ``[model dim]``: the float inputs'
    decoded sum, or the decoded ring sum of a run with ``[privacy]``) and the clients in
    it."""

    value: np.ndarray
    members: tuple[int, ...]


Released = list[ReleasedSum]
"""One reclustering's released cluster sums."""


class ServerStrategy(Protocol):
    """What the server does with the released sums (the protocol part is fixed).

    ``initial_model()`` is the model broadcast in round 0 (float32 ``[dim]``);
    ``apply(model, round, released)`` gets the sums of every reclustering that released
    at least one cluster and returns ``(new model, the aggregate, a note for the log)``.
    A strategy may also define ``check(clusters)``, called before the server listens with
    the number of clusters of a reclustering, raising ``ValueError`` (e.g. a robust rule's
    ``f`` too large for that many cluster sums).
    """

    def initial_model(self) -> np.ndarray: ...

    def apply(
        self, model: np.ndarray, round_index: int, released: list[Released]
    ) -> tuple[np.ndarray, np.ndarray, str]: ...


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


class AveragingStrategy:
    """The default: ``model ← model − learning_rate × aggregate`` (:func:`descend`), where
    the aggregate is each
    reclustering's total (``aggregator = "sum"``) or per-client mean (``"mean"``), averaged
    over the reclusterings; the model starts at zero."""

    def __init__(self, config: DeploymentConfig) -> None:
        self.config = config

    def initial_model(self) -> np.ndarray:
        return np.zeros(self.config.model.dim, dtype=np.float32)

    def apply(
        self, model: np.ndarray, round_index: int, released: list[Released]
    ) -> tuple[np.ndarray, np.ndarray, str]:
        aggregates = []
        for sums in released:
            total = np.sum([s.value for s in sums], axis=0)
            members = sum(len(s.members) for s in sums)
            aggregates.append(total / members if self.config.model.aggregator == "mean" else total)
        total = np.mean(aggregates, axis=0)
        updated = descend(model, self.config.model.learning_rate, total)
        return updated, total, ""


def bound_address(address: str, port: int) -> str:
    """``address`` (``host:port``, ``[v6]:port``) with its port replaced by ``port``, the
    one the operating system bound (they differ for port 0)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return f"{host}:{port}"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
    whose model has a :class:`~sharefl.deploy.results.ModelRecord` (an earlier round, or
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
        self.current: ModelRecord | None = None
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
            if resume.current is not None:  # a copy: the run appends to its releases
                known = resume.current
                self.current = ModelRecord(known.model, known.clusterings, list(known.releases))
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
        """Rounds in a row, up to the last, that released no cluster sum."""

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
        link.bytes_in += envelope.ByteSize()
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
                self.peer_log.line(
                    link.client_id, f"client {link.client_id} refused: {envelope.refusal.reason}"
                )
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
                if self.on_round is not None:
                    self.on_round(report, self.model)
                    report.total = None
                self.reports.append(report)
                self._check_progress(report)
        except (ConfigurationError, LeakageError, RunStalled, TooFewClients, ClientsLost) as exc:
            self.abort(f"the server stopped the run: {exc}")
            raise
        self._finish()
        return self.reports

    def _check_progress(self, report: RoundReport) -> None:
        """Count the rounds in a row that released no cluster sum (``report`` is the
        latest); raise :class:`RunStalled` when they reach ``server.max_empty_rounds``
        (0: never)."""
        self.empty_rounds = 0 if report.clusters else self.empty_rounds + 1
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
        value = self._cluster_value(round_index)  # before the strategy replaces the model
        released = [
            [ReleasedSum(value(s), s.members) for s in rec.clusters]
            for rec in result.reclusterings
            if rec.clusters
        ]
        total, note = None, ""
        if released:
            self.model, total, note = self.strategy.apply(self.model, round_index, released)
        self._exclude(result.culprits)
        report = RoundReport.of(
            result, sorted(self.exclusions.excluded), time.monotonic() - start, total
        )
        report.sampled_out = sorted(set(eligible) - set(participants))
        if self.privacy_ledger is not None:
            self.privacy_ledger.record_round([s.members for sums in released for s in sums])
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

    def _cluster_value(self, round_index: int) -> Callable[[ClusterSum], np.ndarray]:
        """How a released cluster's value is read this round: the float inputs' decoded
        sum, or the ring sum decoded with the round's public seed (``[privacy]``)."""
        encoder = self.encoder
        if encoder is None:
            return lambda s: s.float_sum
        seed = wire.round_seed(self.run_id, round_index, self.model)
        return lambda s: encoder.decode(s.ring_sum, seed)

    def _coordinator(self, round_index: int, eligible: list[int]) -> RoundCoordinator:
        """The round's coordinator, its plan committed to the journal. Over the model of
        :attr:`current` it reuses that plan's clusterings and participants with its releases
        as the audit's prior; over a new model it samples participants and draws a plan.
        Raises :class:`ConfigurationError` when fewer than ``max(2, min_sum_size)`` of the
        round's participants are connected and not excluded."""
        digest = model_id(self.model)
        record = self.current if self.current and self.current.model == digest else None
        partition = None
        if self.atoms is not None:
            # Any grouping of whole atoms is safe on any model (sharefl.protocol.atoms):
            # no plan is reused, so a cluster that failed (or a client that left) does not
            # stall the run; only complete atoms of connected clients are planned.
            record = None
            chosen = sample_atoms(
                complete_atoms(self.atoms, eligible), self.config.server.clients_per_round, self.rng
            )
            participants = sorted(i for atom in chosen for i in atom)
            partition = Clustering(tuple(chosen)) if chosen else None
        elif record is not None:
            participants = list(record.clusterings[0].members)
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

        def released(release: Release) -> None:
            # Persist first: the unmask request (or the next reclustering) waits for it.
            if self.journal is not None:
                self.journal.release(digest, release)
            if release.sum is None:
                assert self.current is not None
                self.current.releases.append(release)

        rc = RoundCoordinator(
            self.settings,
            round=round_index,
            participants=participants,
            length=input_length(self.config, self.encoder),
            rng=self.rng,
            directory=self.directory,
            clusterings=record.clusterings if record is not None else None,
            prior_releases=list(record.releases) if record is not None else (),
            on_release=released,
            atom_partition=partition,
            keys=self.key_adverts,
        )
        if record is None:
            self.current = ModelRecord(digest, rc.plan.clusterings)
        else:
            self.log(
                f"round {round_index + 1}: the model is unchanged, so its clusterings are "
                f"reused ({counted(len(record.releases), 'sum')} already released on it)"
            )
        if self.journal is not None:
            self.journal.plan(digest, rc.plan)
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


class AggregationService(pb_grpc.AggregationServicer):
    """The gRPC face of a :class:`ServerRun`: one bidirectional stream per client.

    A client can only ever end its own stream: bytes that do not decode, a Hello of the
    wrong shape, a malformed or out-of-place message, or any unexpected exception while
    handling one of its messages end that stream at once with a status and a message (the
    client counts as dropped from then on); every other stream goes on.

    Args:
        run: what the messages are routed to.
        directory: ``{client id: Ed25519 public key}``; when given, only these identities
            may connect. The same mapping is what the round coordinator hands to its
            :class:`~sharefl.protocol.server.ServerSession` s (``directory=``).
        require_certificate: the server requires TLS client certificates
            (``tls.client_ca``): the certificate's common name must be ``client-<id>`` for
            the id of the Hello (:func:`check_certificate`), which binds certificate, client
            id and (through the directory) Ed25519 identity together.

    Unauthenticated streams are bounded (``server.max_unauthenticated`` at once, each
    closed with ``DEADLINE_EXCEEDED`` unless a valid Hello arrives within
    ``server.hello_timeout_s``): a stream beyond the cap is ended at once with
    ``RESOURCE_EXHAUSTED`` and :data:`BUSY`, before the challenge (clients retry it). An
    idle stream holds its slot for at most one Hello deadline; a party that keeps opening
    new ones can still crowd honest clients out (there is no per-address limit: put the
    server behind a firewall or proxy that has one).
    """

    def __init__(
        self,
        run: ServerRun,
        directory: Mapping[int, bytes] | None,
        *,
        require_certificate: bool = False,
    ) -> None:
        self.run = run
        self.directory = directory
        self.require_certificate = require_certificate
        self.unauthenticated = 0

    async def Session(
        self, request_iterator: AsyncIterable[pb.ClientMessage], context: SessionContext
    ) -> None:
        server = self.run.config.server
        if self.unauthenticated >= server.max_unauthenticated:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{BUSY} ({server.max_unauthenticated} at once); retry shortly",
            )
            return
        incoming = request_iterator.__aiter__()
        self.unauthenticated += 1
        try:
            link = await self._open(incoming, context)
        except StreamError as exc:
            await context.abort(exc.code, str(exc))
            return
        finally:
            self.unauthenticated -= 1
        await self._serve(link, incoming, context)

    async def _open(
        self, incoming: AsyncIterator[pb.ClientMessage], context: SessionContext
    ) -> ClientLink:
        """Challenge, authenticate and register the stream's client. Raises
        :class:`StreamError` (see :meth:`_authenticate`, :func:`check_certificate`,
        :meth:`ServerRun.register`)."""
        nonce = os.urandom(HELLO_NONCE_BYTES)
        await context.write(
            pb.ServerMessage(challenge=pb.Challenge(nonce=nonce, server_version=__version__))
        )
        client_id, identity, advert = await self._authenticate(incoming, nonce)
        if self.require_certificate:
            check_certificate(context.auth_context(), client_id)
        if advert is not None:
            try:
                self.run.check_key_advert(client_id, advert)
            except RejectedMessage as exc:
                raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        link = self.run.register(client_id, identity)
        if advert is not None:
            self.run.on_key_advert(link, advert)
        return link

    async def _serve(
        self,
        link: ClientLink,
        incoming: AsyncIterator[pb.ClientMessage],
        context: SessionContext,
    ) -> None:
        """Move the link's outbox to the stream and its messages to the run until it ends;
        a link closed with an error sends a ``Goodbye`` with its code and reason, then ends
        the stream with the same status once the client has stopped writing
        (:meth:`_let_client_finish`)."""
        reader = asyncio.create_task(self._read(link, incoming))
        try:
            while (message := await link.outbox.get()) is not None and link.error is None:
                await context.write(message)
            if link.error is not None:
                reason = wire.printable(str(link.error), 600)
                goodbye = pb.Goodbye(code=link.error.code.name, reason=reason)
                with contextlib.suppress(Exception):  # the client may be gone already
                    await context.write(pb.ServerMessage(goodbye=goodbye))
                await self._let_client_finish(link, reader)
        finally:
            reader.cancel()
            self.run.disconnect(link)
        if link.error is not None:
            await context.abort(link.error.code, str(link.error))

    @staticmethod
    async def _let_client_finish(link: ClientLink, reader: asyncio.Task[None]) -> None:
        """Wait, reading and dropping (see :meth:`_read`), until the client has sent
        nothing for :data:`END_QUIET_S` (at most :data:`END_GRACE_S`).

        Why: a client still answers the messages it had received when its stream ends. A
        grpc.aio client whose write meets a stream the server has already ended reports
        ``INTERNAL: Internal error from Core`` instead of the server's status (the write's
        failure replaces it; measured with grpcio 1.85), so the status is sent once the
        client is reading. A client paused for longer than the quiet period can still see
        ``INTERNAL`` as the status; it has the ``Goodbye`` with the reason before it."""
        start = time.monotonic()
        while not reader.done():
            now = time.monotonic()
            until = min(max(link.heard, start) + END_QUIET_S, start + END_GRACE_S)
            if now >= until:
                return
            await asyncio.wait({reader}, timeout=until - now)

    async def _authenticate(
        self, incoming: AsyncIterator[pb.ClientMessage], nonce: bytes
    ) -> tuple[int, bytes, KeyAdvert | None]:
        """The client id, Ed25519 identity and long-term key advert (``None`` when the
        Hello carries none) of a stream whose first message is a valid signed Hello.

        Raises :class:`StreamError`: ``DEADLINE_EXCEEDED`` when no message came within
        ``server.hello_timeout_s``; ``INVALID_ARGUMENT`` for no Hello, bytes that do not
        decode, or fields of the wrong size; ``PERMISSION_DENIED`` for an identity the
        directory does not know; ``UNAUTHENTICATED`` for a signature that does not verify.
        """
        timeout = self.run.config.server.hello_timeout_s
        try:
            first = await asyncio.wait_for(incoming.__anext__(), timeout)
        except TimeoutError as exc:
            raise StreamError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no Hello within {timeout:g} s"
            ) from exc
        except StopAsyncIteration as exc:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "expected a Hello") from exc
        except DecodeError as exc:
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, UNDECODABLE) from exc
        if first.WhichOneof("body") != "hello":
            raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
        hello = first.hello
        check_hello(hello)
        client_id = int(hello.client_id)
        if self.directory is not None:
            known = self.directory.get(client_id)
            if known is None or known != bytes(hello.identity_public):
                raise StreamError(
                    grpc.StatusCode.PERMISSION_DENIED, f"client {client_id} is not in the directory"
                )
        try:
            verify(
                bytes(hello.identity_public),
                stream_hello_message(nonce, client_id),
                hello.signature,
            )
        except SignatureError as exc:
            raise StreamError(
                grpc.StatusCode.UNAUTHENTICATED, f"client {client_id}: Hello signature invalid"
            ) from exc
        advert = None
        if hello.HasField("key_advert"):
            try:
                advert = wire.key_advert_from_proto(hello.key_advert)
            except wire.WireError as exc:
                raise StreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return client_id, bytes(hello.identity_public), advert

    async def _read(self, link: ClientLink, incoming: AsyncIterator[pb.ClientMessage]) -> None:
        """Route the client's messages until its stream ends; a failure ends this stream.

        grpc.aio raises protobuf's ``DecodeError`` out of the request iterator for bytes
        that are not a ``ClientMessage`` (measured with grpcio 1.85 by a client whose
        serializer sends raw bytes): that, a :class:`StreamError` from the coordinator, or
        any other exception closes the link with ``INVALID_ARGUMENT`` (or the
        coordinator's code) and a message, never the server. Once the link is closed (by
        this or by the run: exclusion, a stopped run) the messages still arriving are read
        and dropped until :meth:`_serve` ends the stream.
        """
        try:
            async for envelope in incoming:
                link.heard = time.monotonic()
                if not link.alive:
                    continue  # the stream is ending (see _serve): what still comes is dropped
                try:
                    self.run.on_message(link, bounded_refusal(envelope))
                except StreamError as exc:
                    self._end(link, exc)
                except Exception as exc:  # one client must never take the server down
                    self.run.peer_log.line(
                        link.client_id,
                        f"client {link.client_id}: unexpected {type(exc).__name__} while "
                        f"handling its message: {wire.printable(str(exc), OWN_TEXT_CHARS)}",
                    )
                    message = (
                        f"the server could not handle this message ({type(exc).__name__}); "
                        "the stream is closed"
                    )
                    self.run.misbehaved(
                        link, StreamError(grpc.StatusCode.INVALID_ARGUMENT, message)
                    )
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            link.close()
        except DecodeError:
            self._end(link, StreamError(grpc.StatusCode.INVALID_ARGUMENT, UNDECODABLE))
        else:
            link.close()
        finally:
            self.run.changed.set()

    def _end(self, link: ClientLink, error: StreamError) -> None:
        text = wire.printable(str(error), OWN_TEXT_CHARS)
        self.run.peer_log.line(
            link.client_id, f"client {link.client_id}: {error.code.name}: {text}"
        )
        self.run.misbehaved(link, error)


END_QUIET_S = 0.5
"""A stream the server ends with an error gets its status once the client has sent nothing
for this long (:meth:`AggregationService._let_client_finish`)..."""
END_GRACE_S = 5.0
"""... or this long after the server decided to end it, whichever comes first."""
BUSY = "the server is busy: too many streams without a Hello"
"""The start of the ``RESOURCE_EXHAUSTED`` message of a stream beyond the cap on
unauthenticated streams (clients retry it)."""
UNDECODABLE = "undecodable message: the bytes are not a sharefl.v1.ClientMessage"
CLIENT_TEXT_CHARS = 200
"""Most characters of a client's own text (a refusal reason) that reach the log."""
OWN_TEXT_CHARS = 600
"""Most characters of the server's own error messages (they quote ids and sizes)."""


def bounded_refusal(envelope: pb.ClientMessage) -> pb.ClientMessage:
    """The envelope with a refusal's reason passed through :func:`wire.printable` (a client's
    free text is logged); other messages unchanged."""
    if envelope.WhichOneof("body") == "refusal":
        envelope.refusal.reason = wire.printable(envelope.refusal.reason, CLIENT_TEXT_CHARS)
    return envelope


CERTIFICATE_PREFIX = "client-"
"""A client certificate's common name is ``client-<id>`` (what :func:`~sharefl.deploy.keygen.
keygen` writes)."""


def check_certificate(auth_context: Mapping[str, Sequence[bytes]], client_id: int) -> None:
    """Raise :class:`StreamError` (``PERMISSION_DENIED``) unless the stream's verified TLS
    client certificate names ``client-<client_id>`` as its common name."""
    names = [n.decode(errors="replace") for n in auth_context.get("x509_common_name", [])]
    expected = f"{CERTIFICATE_PREFIX}{client_id}"
    if names != [expected]:
        shown = wire.printable(", ".join(names) or "none", 80)
        raise StreamError(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the Hello claims client {client_id} but the TLS certificate's common name is "
            f"{shown}; connect with the certificate issued for {expected}",
        )


def deployment_rng(config: DeploymentConfig) -> np.random.Generator:
    """The generator of cluster plans and SecAgg+ graphs: seeded from the operating system
    (``secrets``), unless the file sets ``secure_aggregation.reproducible_seed`` (tests)."""
    seed = config.secure_aggregation.reproducible_seed
    return np.random.default_rng(secrets.randbits(128) if seed is None else seed)


def validate_deployment(
    config: DeploymentConfig,
    directory: Mapping[int, bytes] | None = None,
    strategy: ServerStrategy | None = None,
) -> None:
    """Check, before listening, what round 1 would check: the protocol settings, the plan of
    ``server.clients`` clients (``server.clients_per_round`` when rounds sample), the
    encoding (clip and bits) and every cluster's assignment (threshold, SecAgg+ degree), the
    directory's size, and the strategy's ``check`` for the planned number of clusters.
    Raises :class:`ConfigurationError` / :class:`LeakageError` saying what to change."""
    check_secure_deployment(config)
    try:
        encoder = deployment_encoder(config)
    except ValueError as exc:  # the privacy layer's PrivacyConfigError / CalibrationError
        raise ConfigurationError(f"privacy: {exc}") from exc
    wanted = config.server.clients
    ids = sorted(directory)[:wanted] if directory else list(range(wanted))
    if len(ids) < wanted:
        raise ConfigurationError(
            f"server.clients is {wanted} but tls.directory knows only {len(ids)} identities"
        )
    settings, rng = round_settings(config), deployment_rng(config)
    participants, partition = ids[: config.server.sampled], None
    if settings.atoms_on(deployment=True):
        partition = chunk_atoms(participants, settings.resolved_atom_size)
        if not partition.clusters:
            raise ConfigurationError(
                f"{len(participants)} clients a round are fewer than one atom of "
                f"{settings.resolved_atom_size} (secure_aggregation.atom_size): use more "
                "clients, or secure_aggregation.atoms = false (docs/security.md: what leaks then)"
            )
    keys = None
    if settings.key_setup is KeySetup.ONCE:  # stand-ins for the adverts clients will send
        keys = {cid: ClientKeys.generate(cid).advert() for cid in participants}
    rc = RoundCoordinator(
        settings,
        round=0,
        participants=participants,
        length=input_length(config, encoder),
        rng=rng,
        directory=directory,
        atom_partition=partition,
        keys=keys,
    )
    rc.open_reclustering()
    check = getattr(strategy, "check", None)
    if check is not None:
        clusters = min(len(c.clusters) for c in rc.plan.clusterings)
        try:
            check(clusters)
        except ValueError as exc:
            raise ConfigurationError(
                f"the aggregator cannot run over {clusters} cluster sums per reclustering "
                f"({config.server.sampled} clients a round, clusters of "
                f"{config.secure_aggregation.cluster_size}): {exc}"
            ) from exc


def check_hello(hello: pb.Hello) -> None:
    """Raise :class:`StreamError` (``INVALID_ARGUMENT``) unless the Hello's identity key is
    32 bytes and its signature 64 bytes (checked before either is used)."""
    for what, value, size in (
        ("identity_public", hello.identity_public, KEY_BYTES),
        ("signature", hello.signature, SIGNATURE_BYTES),
    ):
        if len(value) != size:
            raise StreamError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Hello.{what} must be {size} bytes, got {len(value)}",
            )


def load_directory(path: str) -> dict[int, bytes] | None:
    """``{client id: Ed25519 public key}`` from a keygen ``directory.json`` (None if unset),
    read by :func:`~sharefl.protocol.keyfiles.read_directory` (raises its
    :class:`~sharefl.protocol.keyfiles.KeyFileError`)."""
    return read_directory(path) if path else None


def add_session_handler(server: grpc.aio.Server, service: AggregationService) -> None:
    """Serve ``service.Session`` as :data:`wire.SESSION_METHOD` (the generated servicer's
    method), with a serializer that also writes bytes already serialized: the model's
    chunks are serialized once for all clients (:func:`wire.chunk_frames`)."""
    service_name, method = wire.SESSION_METHOD.strip("/").split("/")
    handler = grpc.stream_stream_rpc_method_handler(
        service.Session,
        request_deserializer=pb.ClientMessage.FromString,
        response_serializer=wire.serialize,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service_name, {method: handler}),)
    )


def server_credentials(config: DeploymentConfig) -> grpc.ServerCredentials | None:
    tls = config.tls
    if not tls.enabled:
        return None
    pair = [(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())]
    if tls.client_ca:
        return grpc.ssl_server_credentials(
            pair, root_certificates=Path(tls.client_ca).read_bytes(), require_client_auth=True
        )
    return grpc.ssl_server_credentials(pair)


async def serve(
    config: DeploymentConfig,
    *,
    log: Log = _stderr,
    listening: Callable[[str], None] | None = None,
    strategy: ServerStrategy | None = None,
    on_round: Callable[[RoundReport, np.ndarray], None] | None = None,
    resume: Checkpoint | None = None,
    journal: RunJournal | None = None,
) -> RunResult:
    """Run the server until the configured rounds are done.

    The port is bound once: an address with port 0 gets a free port from the operating
    system, and ``listening(address)`` is called with the address actually bound (host as
    configured, the real port) once the server accepts connections; the log line says it
    too. ``strategy`` decides
    the initial model and what the released sums do (default :class:`AveragingStrategy`;
    the simulator's robust training is :class:`sharefl.simulation_bridge.
    SimulationStrategy`). ``on_round(report, model)`` runs after each finished round (see
    :class:`ServerRun`); ``resume`` continues a stopped run and ``journal`` records plans
    and releases before they are acted on (see :class:`ServerRun`; ``sharefl serve --out``
    passes its :class:`~sharefl.deploy.results.ResultsWriter` as both). The
    whole configuration is validated before the port is bound
    (:func:`validate_deployment`): raises :class:`ConfigurationError` /
    :class:`LeakageError` for an unusable or (off loopback) insecure configuration.
    """
    directory = load_directory(config.tls.directory)
    validate_deployment(config, directory, strategy)
    run = ServerRun(config, log, strategy, directory, on_round, resume, journal)
    if resume is not None:
        if resume.next_round >= config.server.rounds:
            raise ConfigurationError(
                f"the run to resume finished {resume.next_round} of {config.server.rounds} "
                "rounds: nothing is left (raise server.rounds to go on)"
            )
        if resume.rows and resume.rows[-1].get("interrupted"):
            log(
                f"round {resume.next_round} was interrupted: it is closed without a model "
                "step; its releases stay in the audit"
            )
        known = resume.current
        log(
            f"resuming at round {resume.next_round + 1}/{config.server.rounds}"
            + (
                f" with the model's clusterings and {counted(len(known.releases), 'sum')} "
                "released on it"
                if known is not None
                else ""
            )
        )
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC binds with SO_REUSEPORT by default: a second server on a busy port would
            # silently receive a share of its clients' connections. Refuse the port instead.
            ("grpc.so_reuseport", 0),
            *TRANSPORT_OPTIONS,
            *server_keepalive_options(config.server.keepalive_s),
            # A connection that never opens a stream is closed after one Hello deadline.
            ("grpc.max_connection_idle_ms", int(config.server.hello_timeout_s * 1000)),
        ]
    )
    service = AggregationService(run, directory, require_certificate=bool(config.tls.client_ca))
    add_session_handler(server, service)
    credentials = server_credentials(config)
    address = config.server.address
    try:
        port = (
            server.add_secure_port(address, credentials)
            if credentials
            else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpcio raises for an address it cannot bind
        port = 0
    if port == 0:
        raise ConfigurationError(f"cannot bind {address}: is another server using that port?")
    await server.start()
    mode = ("TLS" if credentials else "plaintext") + (
        ", signed" if config.secure_aggregation.signed else ""
    )
    bound = bound_address(address, port)
    log(f"sharefl server {__version__} listening on {bound} ({mode})")
    if run.insecure:
        log("WARNING: INSECURE DEPLOYMENT: " + "; ".join(run.insecure))
    if listening is not None:
        listening(bound)
    try:
        reports = await run.run()
        await run.drain(DRAIN_S)
        traffic = {
            cid: {"bytes_in": link.bytes_in, "bytes_out": link.bytes_out}
            for cid, link in sorted(run.links.items())
        }
        return RunResult(reports, run.model, traffic)
    finally:
        await server.stop(grace=2.0)
