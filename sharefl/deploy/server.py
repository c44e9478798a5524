"""``sharefl serve``: check a deployment (:func:`validate_deployment`), start the gRPC
server (:mod:`sharefl.deploy.service`: one bidirectional stream per client, each
authenticated by a signed Hello against the identity directory, optionally TLS client
certificates) around a :class:`~sharefl.deploy.run.ServerRun`, and run it to its result
(:func:`serve`). The run drives one sans-IO
:class:`~sharefl.protocol.coordinator.RoundCoordinator` per round, stage by stage with a
deadline per stage, routing every message by the stream's authenticated client id. A
client that misses a deadline or disconnects counts as dropped; a late message (of an
earlier round or reclustering, or of a stage that has closed) is dropped with a log line and
never held against its sender; a client whose message no honest client sends (malformed,
oversized, contradictory) gets its stream ended with ``INVALID_ARGUMENT`` or
``FAILED_PRECONDITION`` and a message, is named a culprit of the round and counts as
dropped; a client that refuses its cluster counts as dropped there at once. Either way the
other clients' rounds continue through the protocol's drop-out recovery. Every stream the
server ends, ends with a status code and a message that says why (a
:class:`~sharefl.deploy.run.StreamError`), never with gRPC's bare ``INTERNAL``.

Across rounds and restarts the server keeps the coordinator's invariant
(:mod:`sharefl.protocol.coordinator`): **the server never releases sums of one model under
two clusterings, and its release audit covers every sum released on that model, across
rounds and restarts.** A round whose model is the one the previous round ran on (nothing
was released, or the strategy left the model as it was) reuses that round's clusterings
under its new round number, its release audit seeded with every sum released on the model
so far; each round's plan and each release are written to the run's journal
(:class:`~sharefl.deploy.run.RunJournal`, :class:`~sharefl.deploy.results.ResultsWriter`)
before the RoundStart or unmask request they justify leaves, and a resumed run restores them
with the run id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeAlias

import grpc
import numpy as np

from sharefl import __version__
from sharefl.deploy.config import DeploymentConfig, check_secure_deployment
from sharefl.deploy.distributed import deployment_encoder, input_length
from sharefl.deploy.results import Checkpoint
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.atoms import chunk_atoms
from sharefl.protocol.coordinator import RoundCoordinator
from sharefl.protocol.errors import (
    ConfigurationError,
)
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.settings import KeySetup
from sharefl.rounds.keyfiles import read_directory
from sharefl.wording import counted

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy this is Any, kept for the reader
    SessionContext: TypeAlias = grpc.aio.ServicerContext[pb.ClientMessage, pb.ServerMessage]
    """The server's end of one ``Session`` stream."""

from sharefl.deploy.reports import Log, RoundReport, RunResult
from sharefl.deploy.run import (
    DRAIN_S,
    RunJournal,
    ServerRun,
    _stderr,
    deployment_rng,
    round_settings,
)
from sharefl.deploy.service import AggregationService, add_session_handler, server_credentials
from sharefl.deploy.strategy import ServerStrategy
from sharefl.deploy.transport import MAX_MESSAGE_BYTES, TRANSPORT_OPTIONS, server_keepalive_options


def bound_address(address: str, port: int) -> str:
    """``address`` (``host:port``, ``[v6]:port``) with its port replaced by ``port``, the
    one the operating system bound (they differ for port 0)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return f"{host}:{port}"


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


def load_directory(path: str) -> dict[int, bytes] | None:
    """``{client id: Ed25519 public key}`` from a keygen ``directory.json`` (None if unset),
    read by :func:`~sharefl.rounds.keyfiles.read_directory` (raises its
    :class:`~sharefl.rounds.keyfiles.KeyFileError`)."""
    return read_directory(path) if path else None


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
