"""A client process over gRPC: connects, trains with a pluggable trainer, runs the protocol.

The trainer is any callable ``train(model, *, round, client_id) -> update`` (1-D float
arrays of the model's length), given as a Python object or a ``"module:function"`` entry
point, so an existing training loop can be wrapped. The protocol decisions are the sans-IO
:class:`~sharefl.protocol.client.ClientSession`'s and, for the round, the
:class:`~sharefl.protocol.client_round.ClientRound`'s built from ``RoundStart.plan``: a
request either refuses is answered with a ``Refusal`` (its reason printable, capped) and
nothing more is revealed in that cluster. A client whose policy requires signed mode (one
started with keys) refuses every assignment of a round that comes without a plan.

Malformed server input never ends in a traceback: a bad stage message or assignment gets a
``Refusal``; a bad challenge or model stream (a length above ``max_model_length``, or one
that changes between rounds) raises :class:`ServerMisbehaved` and the stream is closed.

Liveness: the channel sends HTTP/2 keepalive pings every ``server_timeout_s / 4`` seconds
and drops the connection when one goes unanswered for as long, so a stopped (SIGSTOP) or
vanished server is noticed even while no protocol message is due; the Challenge must arrive
within what is left of ``server_timeout_s``, and no gap between two server messages may
exceed ``read_timeout_s``. Connection loss: the client retries with exponential backoff
(at most ``retries`` attempts) and raises :class:`ConnectionLost` with a clear message once
the attempts are spent or the server has been silent for ``server_timeout_s`` seconds: a
client notices a dead server within about ``server_timeout_s`` (plus one backoff step).

Transport security: a client with a signing policy (started with keys) requires TLS;
without TLS the address must be loopback unless ``insecure=True``.

Memory (invariant I4, :mod:`sharefl.protocol.memory`): the client remembers, per server
identity (SHA-256 of the TLS CA it trusts, else the address), the last round it took part in
of each run (``RoundStart.run``) and the clusterings and releases of every model it
contributed on (SHA-256 of the model's float32 bytes and length,
:func:`~sharefl.protocol.memory.model_digest`). A RoundStart whose round number does not
increase within its run, or whose model it already contributed on under other clusterings,
is refused like an unsafe plan. With a ``state_dir`` the memory is a file that survives
restarts; without one it lasts as long as the process (a restarted client forgets).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import importlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias, cast

import grpc
import numpy as np
from grpc._cython.cygrpc import InternalError as _GrpcInternalError

from sharefl.crypto.encoding import RingEncoding, encode
from sharefl.crypto.signatures import HELLO_NONCE_BYTES, IdentityKey, stream_hello_message
from sharefl.deploy import wire
from sharefl.deploy.config import is_loopback
from sharefl.deploy.errors import DeployError
from sharefl.deploy.service import BUSY
from sharefl.deploy.transport import (
    MAX_MESSAGE_BYTES,
    MIN_PING_INTERVAL_S,
    TRANSPORT_OPTIONS,
    keepalive_options,
)
from sharefl.exit_status import ExitStatus
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.budget import PrivacyCharge
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.errors import (
    ClientRefusal,
    ConfigurationError,
    MalformedRequest,
    PlanRefused,
    ProtocolError,
)
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.memory import UNAUTHENTICATED, ClientMemory, memory_path, model_digest
from sharefl.protocol.messages import (
    ClusterAssignment,
    ConsistencySignature,
    EncryptedShares,
    MaskedInput,
    MaskedShares,
    UnmaskResponse,
)
from sharefl.wording import counted

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy these are Any, kept for the reader
    from grpc.aio._typing import EOFType  # the type of grpc.aio.EOF, what read() gives at the end

    SessionCall: TypeAlias = grpc.aio.StreamStreamCall[pb.ClientMessage | bytes, pb.ServerMessage]
    """The client's end of the ``Session`` stream."""

Trainer = Callable[..., np.ndarray]
"""``f(model, round=r, client_id=i)`` → the update the server steps against:
``model ← model − learning_rate · aggregate`` (:func:`~sharefl.rounds.model_step.descend`), so
a trainer returns ``model − trained_model`` (or a gradient), never the trained model."""


class RingInputs(Protocol):
    """A trainer's own encoding of its update into ring words, which replaces the float
    encoding the server proposes: a distributed-DP pipeline whose noise the client adds
    before masking (e.g. :class:`~sharefl.simulation_bridge.SimulationTrainer` with a
    discrete ``privacy.distributed``). A trainer offers one as its ``ring_inputs``
    attribute; the client then encodes each round's update once, with the round's public
    seed (:func:`~sharefl.deploy.wire.round_seed`), and sends those words in every
    reclustering of the round.

    The client's own view decides: it refuses an assignment that proposes a float encoding
    (the server would get an update without the client's noise), one of another length,
    or one of another ring width (wider words than it pads would hand the server the
    carries of the residues, see :mod:`sharefl.privacy.distributed`).
    """

    length: int
    """Words per input (the rotated, padded length)."""
    bits: int
    """The ring width of its words: 32 or 64."""

    def encode(self, update: np.ndarray, seed: bytes) -> np.ndarray:
        """The words of ``update`` (float32 ``[model length]``) for the round of ``seed``:
        ``uint32``/``uint64`` ``[length]``."""
        ...

    def tighten(self, policy: ClientPolicy) -> ClientPolicy:
        """``policy`` with what the noise's guarantee assumes of every round (e.g. no
        released sum of fewer members than the noise is sized for)."""
        ...


STAGES = ("advertise", "share", "mask", "consistency", "unmask")


MAX_MODEL_LENGTH = 1 << 28
"""Default bound on the model length a client accepts (2^28 float32 = 1 GiB)."""

SERVER_TIMEOUT_S = 60.0
"""Default bound on how long a client waits for a silent server before it gives up."""
READ_TIMEOUT_S = 900.0
"""Default longest gap between two server messages during a run (training, stage
deadlines and other clients' work happen in these gaps)."""
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    # What a write that met an ended stream reports when neither the server's Goodbye nor
    # its status could be read (the server never ends a stream with INTERNAL itself): a
    # reconnection gets the server's answer, or finds it gone.
    grpc.StatusCode.INTERNAL,
)


def retryable(error: grpc.aio.AioRpcError) -> bool:
    """Whether a failed session is worth another attempt: the server was unreachable or
    silent, or it was busy with streams that have not authenticated yet (``RESOURCE_EXHAUSTED``
    saying :data:`~sharefl.deploy.service.BUSY`); any other status is the server's answer."""
    if error.code() in RETRYABLE:
        return True
    busy = error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return busy and (error.details() or "").startswith(BUSY)


class ConnectionLost(DeployError):
    """The server could not be reached (or was lost) after all retries."""

    exit_status = ExitStatus.UNREACHABLE


class ServerSilent(DeployError):
    """The server sent nothing within a read deadline (it may be stopped or unreachable)."""

    exit_status = ExitStatus.UNREACHABLE


class TrainerFailed(DeployError):
    """The user's trainer raised; the client leaves the run (the server counts it as
    dropped). The original exception is the ``__cause__``."""

    exit_status = ExitStatus.USER_CODE_FAILED


class ServerRefused(DeployError, grpc.aio.AioRpcError):
    """The server refused this client or stopped the run: a gRPC status that is not retried
    (wrong identity, certificate, malformed message, a run the server stopped, with its
    reason). Also the ``AioRpcError`` of that code and reason; its message is one line,
    naming the client when it is known."""

    exit_status = ExitStatus.REFUSED

    def __init__(
        self, code: grpc.StatusCode, details: str | None, client_id: int | None = None
    ) -> None:
        grpc.aio.AioRpcError.__init__(self, code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
        self.client_id = client_id

    def __str__(self) -> str:
        who = "" if self.client_id is None else f"client {self.client_id}: "
        return f"{who}the server refused this client: {self.code().name}: {self.details()}"


class ServerEnded(ServerRefused):
    """The server ended this client's stream and said why (``Goodbye``: the status code and
    reason it then sends as the gRPC status). Also an ``AioRpcError`` with that code and
    reason, so it is handled as the status would be, even when the status itself only
    reaches the client as ``INTERNAL`` (a write that met the ended stream)."""

    def __init__(self, goodbye: pb.Goodbye) -> None:
        code = grpc.StatusCode.__members__.get(goodbye.code, grpc.StatusCode.UNKNOWN)
        super().__init__(code, wire.printable(goodbye.reason))


class ServerMisbehaved(DeployError):
    """The server's stream cannot be followed (no Challenge, a malformed or oversized model
    stream); the client closes it. Nothing of the protocol was revealed."""

    exit_status = ExitStatus.SERVER_MISBEHAVED

    def __str__(self) -> str:
        return f"leaving the server: {super().__str__()}"


@dataclass
class RoundGuard:
    """What a client knows of the current round: its guard (None without a plan when the
    policy allows that), or the refusal every assignment of the round gets."""

    guard: ClientRound | None = None
    refusal: ClientRefusal | None = None

    @classmethod
    def start(
        cls,
        client_id: int,
        start: pb.RoundStart,
        policy: ClientPolicy,
        memory: ClientMemory | None = None,
        model: bytes | None = None,
        charge: PrivacyCharge | None = None,
    ) -> RoundGuard:
        """The guard of a round from its RoundStart, checked against ``memory`` (the
        round's run ``start.run`` and ``model``, the digest of the model it came with).
        Never raises a refusal; a memory file that cannot be read or locked raises
        (``OSError``, :class:`~sharefl.protocol.memory.ClientMemoryError`): the client
        then stops rather than take part without its memory."""
        if not start.plan.clusterings:
            if policy.require_signed or policy.require_atoms:
                needs = "in signed mode" if policy.require_signed else "that requires atoms"
                return cls(
                    refusal=PlanRefused(
                        f"round {start.round} comes without a committed plan (RoundStart.plan "
                        f"is empty); a client {needs} needs one: the server must send it"
                    )
                )
            return cls()
        try:
            plan = wire.plan_from_proto(
                start.round,
                start.plan,
                max_reclusterings=policy.max_reclusterings,
                max_participants=policy.max_participants,
            )
            if plan.reclusterings != start.reclusterings:
                raise PlanRefused(
                    f"RoundStart announces {start.reclusterings} reclusterings but its plan "
                    f"has {plan.reclusterings}"
                )
            guard = ClientRound(
                client_id,
                plan,
                policy,
                memory=memory,
                run=start.run,
                model_digest=model,
                charge=charge,
            )
            return cls(guard=guard)
        except wire.WireError as exc:
            return cls(refusal=PlanRefused(f"malformed round plan: {exc}"))
        except ClientRefusal as exc:
            return cls(refusal=exc)


def load_trainer(spec: str) -> Trainer:
    """Import ``"module:function"``; raises :class:`ConfigurationError` with what to fix."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"trainer must be 'module:function', got {spec!r}")
    try:
        trainer = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load trainer {spec!r}: {exc}") from exc
    if not callable(trainer):
        raise ConfigurationError(f"trainer {spec!r} is not callable")
    return cast(Trainer, trainer)  # callable, checked; its signature is the spec's contract


def demo_trainer(model: np.ndarray, *, round: int, client_id: int) -> np.ndarray:
    """A deterministic stand-in for local training: an update (the vector the server steps
    against, :func:`~sharefl.rounds.model_step.descend`) that depends only on the client id and
    the round, in multiples of 1/256 within [-1, 1) so fixed-point sums are exact."""
    rng = np.random.default_rng([client_id, round])
    steps = rng.integers(-256, 256, size=model.shape[0], dtype=np.int16)
    return np.asarray(steps.astype(np.float32) * np.float32(1 / 256))


@dataclass
class ClientTLS:
    """Root CA to trust, and an optional client certificate/key (mutual TLS)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None


@dataclass
class ClientReport:
    """What a client did: rounds completed (``rounds``, every RoundEnd it got), of which
    ``sampled_out`` it was not sampled into (a RoundEnd without a RoundStart) and
    ``contributed`` it took part in (sent a masked input in at least one of its clusters),
    bytes sent, refusals, the final model."""

    client_id: int
    rounds: int = 0
    sampled_out: int = 0
    contributed: int = 0
    bytes_sent: int = 0
    refusals: list[str] = field(default_factory=list)
    model: np.ndarray | None = None


class RoundsRefused(DeployError):
    """The client took part in no round and refused at least one: what it was offered was
    unacceptable to it (a replayed round or model, a plan that leaks...). The message quotes
    the last refusal."""

    exit_status = ExitStatus.ROUNDS_REFUSED


def check_took_part(report: ClientReport) -> None:
    """Raise :class:`RoundsRefused` when ``report`` shows no round taken part in and at
    least one refusal; a client that refused nothing (e.g. never sampled) passes."""
    if report.contributed == 0 and report.refusals:
        raise RoundsRefused(
            f"client {report.client_id} refused every round it was offered "
            f"({counted(len(report.refusals), 'refusal')}); the last: {report.refusals[-1]}. "
            "Check that this is the server you meant to trust: this client refuses what "
            "would expose its update"
        )


class ClientRuntime:
    """One client's connection to the aggregation server.

    Args:
        client_id: this client's id.
        address: ``host:port`` of the server.
        trainer: see the module docstring (default :func:`demo_trainer`).
        identity: the Ed25519 identity (default: a fresh one, fine when the server has no
            identity directory).
        policy: the client's protocol policy (threshold floor, signed mode, directory).
        tls: TLS settings, or None for plaintext (loopback testing only).
        retries: connection attempts before giving up.
        exit_before: testing aid: SIGKILL this process right before sending the named
            stage's first message (``advertise``, ``share``, ``mask``, ``consistency``,
            ``unmask``: :data:`STAGES`, in protocol order), to play a client that vanishes
            at that stage; in a round without that exchange (the two-exchange round has no
            ``advertise`` or ``share``), before the first message of a later stage.
        max_model_length: the longest model (elements) this client accepts from the server.
        server_timeout_s: how long the server may stay silent (no answer to keepalive
            pings, no Challenge, unreachable) before the client gives up.
        read_timeout_s: the longest gap between two server messages of a run.
        insecure: allow a plaintext connection to a non-loopback address.
        state_dir: the folder of the client's memory (a file per client id and server
            identity, see :func:`~sharefl.protocol.memory.memory_path`); ``None``: the
            memory lasts as long as this object (a restarted client forgets).

    Raises :class:`ConfigurationError` for a client with a signing policy and no TLS;
    :meth:`run` raises it for a plaintext client aimed at another machine without
    ``insecure``.
    """

    def __init__(
        self,
        client_id: int,
        address: str,
        *,
        trainer: Trainer = demo_trainer,
        identity: IdentityKey | None = None,
        policy: ClientPolicy | None = None,
        tls: ClientTLS | None = None,
        retries: int = 5,
        exit_before: str | None = None,
        max_model_length: int = MAX_MODEL_LENGTH,
        server_timeout_s: float = SERVER_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        insecure: bool = False,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if exit_before is not None and exit_before not in STAGES:
            raise ConfigurationError(f"exit_before must be one of {STAGES}")
        if server_timeout_s <= 0 or read_timeout_s <= 0:
            raise ConfigurationError("server_timeout_s and read_timeout_s must be > 0")
        if tls is None and policy is not None and policy.require_signed:
            raise ConfigurationError(
                f"client {client_id} has identity keys (signed mode) but no TLS: give it the "
                "deployment's CA (ca.pem in the keygen folder)"
            )

        self.client_id = client_id
        self.address = address
        self.trainer = trainer
        self.ring_inputs: RingInputs | None = getattr(trainer, "ring_inputs", None)
        self.identity = identity or IdentityKey.generate()
        # A deployment client requires atoms unless its policy says otherwise: the
        # multi-round leak needs no malicious server (sharefl.protocol.atoms).
        self.policy = policy or ClientPolicy(identity=self.identity, require_atoms=True)
        if self.policy.identity is None:
            self.policy = dataclasses.replace(self.policy, identity=self.identity)
        self.privacy_charge: Callable[[int], PrivacyCharge | None] | None = getattr(
            trainer, "privacy_charge", None
        )
        """What a round's own noise costs this client (a trainer's ``privacy_charge(round)``,
        :mod:`sharefl.protocol.budget`); ``None``: unknown (``policy.max_epsilon`` then
        refuses every round)."""
        if self.ring_inputs is not None:
            self.policy = self.ring_inputs.tighten(self.policy)
        self.tls = tls
        self.retries = retries
        self.exit_before = exit_before
        self.max_model_length = max_model_length
        self.insecure = insecure
        self.server_timeout_s = server_timeout_s
        self.read_timeout_s = read_timeout_s
        self.report = ClientReport(client_id)
        self._contributed: set[int] = set()
        self._heard = time.monotonic()
        self._model_length: int | None = None
        self.state_dir = state_dir
        self.memory = ClientMemory(
            None if state_dir is None else memory_path(state_dir, client_id),
            server=self.server_identity,
        )
        self.keys = ClientKeys.generate(client_id, self.server_identity)
        """This process's long-term keys (the two-exchange round): advertised in every
        Hello, so a restarted server (or client) gets them again."""

    @property
    def server_identity(self) -> bytes:
        """The server identity this client's memory serves: SHA-256 of the TLS CA it
        trusts, else :data:`~sharefl.protocol.memory.UNAUTHENTICATED` (never the address,
        which the server controls: every plaintext server is one identity)."""
        if self.tls is not None:
            return hashlib.sha256(self.tls.ca).digest()
        return UNAUTHENTICATED

    def _channel(self) -> grpc.aio.Channel:
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *TRANSPORT_OPTIONS,
            *keepalive_options(max(MIN_PING_INTERVAL_S, self.server_timeout_s / 4)),
        ]
        if self.tls is None:
            return grpc.aio.insecure_channel(self.address, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.tls.ca,
            private_key=self.tls.key,
            certificate_chain=self.tls.cert,
        )
        return grpc.aio.secure_channel(self.address, credentials, options=options)

    async def run(self) -> ClientReport:
        """Take part until the server finishes; returns the report.

        Raises :class:`ConnectionLost` when the server stays unreachable or silent (see the
        module docstring for the bound), :class:`ServerMisbehaved` when its stream cannot be
        followed, :class:`TrainerFailed` when the trainer raises, and :class:`ServerRefused`
        when the server refuses this client (wrong identity, certificate, malformed message,
        a run it stopped) — not retried;
        :class:`ConfigurationError` before connecting in plaintext to a non-loopback address without
        ``insecure``.
        """
        if self.tls is None and not self.insecure and not is_loopback(self.address):
            raise ConfigurationError(
                f"refusing plaintext gRPC to {self.address}: give --keys (TLS), or --insecure "
                "to send updates unencrypted"
            )
        delay = 0.5
        self._heard = time.monotonic()
        for attempt in range(1, self.retries + 1):
            try:
                async with self._channel() as channel:
                    await self._session(session_method(channel))
                return self.report
            except grpc.aio.AioRpcError as exc:
                if not retryable(exc):
                    raise ServerRefused(exc.code(), exc.details(), self.client_id) from exc
                cause: Exception = exc
                why = f"{exc.code().name}: {exc.details()}"
            except _GrpcInternalError as exc:
                # gRPC core's own error for a call that broke under an operation (the
                # server died mid-write or mid-close): no status to read; retried like
                # INTERNAL, so a lost server is a lost connection, never a crash.
                cause, why = exc, f"INTERNAL: {exc}"
            except ServerSilent as exc:
                cause, why = exc, str(exc)
            silent = time.monotonic() - self._heard
            if attempt == self.retries or silent + delay >= self.server_timeout_s:
                raise ConnectionLost(
                    f"client {self.client_id}: server {self.address} unreachable after "
                    f"{counted(attempt, 'attempt')}, silent for {silent:.1f} s ({why})"
                ) from cause
            await asyncio.sleep(delay)
            delay = min(delay * 2, 8.0)
        return self.report

    async def _read(
        self, call: SessionCall, timeout: float | None = None
    ) -> pb.ServerMessage | EOFType:
        """The next server message, within ``timeout`` (default ``read_timeout_s``);
        raises :class:`ServerSilent` when nothing came."""
        timeout = self.read_timeout_s if timeout is None else timeout
        try:
            message = await asyncio.wait_for(call.read(), max(timeout, 0.1))
        except TimeoutError as exc:
            call.cancel()
            raise ServerSilent(f"no message from the server within {timeout:.1f} s") from exc
        self._heard = time.monotonic()
        return message

    async def _send(self, call: SessionCall, message: pb.ClientMessage | bytes) -> None:
        """Write one message (or one already serialized: :func:`wire.chunk_frames`). A
        write that meets a stream the server ended (or lost) fails with ``INTERNAL`` in
        place of the status: the server's ``Goodbye`` and status are read instead, so the
        reason, not "Internal error from Core", reaches the caller."""
        self.report.bytes_sent += wire.serialized_size(message)
        try:
            await call.write(message)
        except (grpc.aio.AioRpcError, _GrpcInternalError) as exc:
            await self._read_the_end(call)
            if isinstance(exc, grpc.aio.AioRpcError):
                raise
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                f"the stream ended under a write ({exc})",
            ) from exc

    async def _read_the_end(self, call: SessionCall) -> None:
        """Read what is left of an ended stream: raise its ``Goodbye`` (:class:`ServerEnded`)
        or its status (``AioRpcError``) when it has one other than ``INTERNAL``."""
        with contextlib.suppress(TimeoutError, _GrpcInternalError):
            while (envelope := await asyncio.wait_for(call.read(), 5.0)) is not grpc.aio.EOF:
                if envelope.WhichOneof("body") == "goodbye":
                    raise ServerEnded(envelope.goodbye)
        with contextlib.suppress(grpc.aio.AioRpcError, _GrpcInternalError, TimeoutError):
            code = await asyncio.wait_for(call.code(), 5.0)
            if code not in (grpc.StatusCode.OK, grpc.StatusCode.INTERNAL):
                details = await call.details()
                raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    def _maybe_exit(self, stage: str) -> None:
        if self.exit_before is not None and STAGES.index(stage) >= STAGES.index(self.exit_before):
            os.kill(os.getpid(), signal.SIGKILL)

    async def _session(self, method: grpc.aio.StreamStreamMultiCallable) -> None:
        call: SessionCall = method()
        challenge = await self._read(call, self.server_timeout_s - (time.monotonic() - self._heard))
        if challenge is grpc.aio.EOF or challenge.WhichOneof("body") != "challenge":
            raise ServerMisbehaved("the server did not open with a Challenge")
        nonce = challenge.challenge.nonce
        if len(nonce) != HELLO_NONCE_BYTES:
            raise ServerMisbehaved(f"the Challenge nonce must be {HELLO_NONCE_BYTES} bytes")
        await self._send(
            call,
            pb.ClientMessage(
                hello=pb.Hello(
                    client_id=self.client_id,
                    identity_public=self.identity.public,
                    signature=self.identity.sign(stream_hello_message(nonce, self.client_id)),
                    key_advert=wire.key_advert_to_proto(self.keys.advert(self.identity)),
                )
            ),
        )
        update: np.ndarray | None = None
        session: ClientSession | None = None
        round_guard = RoundGuard()
        finished = False
        started = False
        while (envelope := await self._read(call)) is not grpc.aio.EOF:
            kind = envelope.WhichOneof("body")
            if kind in ("round_start", "finished"):
                header = (
                    envelope.round_start.model if kind == "round_start" else envelope.finished.model
                )
                model = await self._read_vector(call, header)
                if kind == "finished":
                    self.report.model = model
                    finished = True
                    break
                session, started = None, True
                charge = self.privacy_charge
                round_guard = RoundGuard.start(
                    self.client_id,
                    envelope.round_start,
                    self.policy,
                    self.memory,
                    model_digest(model),
                    None if charge is None else charge(envelope.round_start.round),
                )
                update = await self._train(model, envelope.round_start)
            elif kind == "assignment":
                session = await self._start_cluster(call, envelope.assignment, update, round_guard)
            elif kind == "goodbye":
                raise ServerEnded(envelope.goodbye)
            elif kind == "round_end":
                self.report.rounds += 1
                self.report.sampled_out += not started
                session, round_guard, started = None, RoundGuard(), False
            elif session is not None and kind in ("keys", "masking", "consistency", "unmask"):
                session = await self._step(call, session, envelope, round_guard.guard)
        try:
            await call.done_writing()
        except (grpc.aio.AioRpcError, _GrpcInternalError):
            # After `finished` the server may close the RPC before this half-close reaches
            # it; grpc aio then fails the write (grpc/grpc#24758, #36066). Nothing is lost.
            if not finished:
                raise

    async def _train(self, model: np.ndarray, start: pb.RoundStart) -> np.ndarray:
        """The trainer's update as float32, or its ring inputs' words for the round
        (:class:`RingInputs`); :class:`TrainerFailed` if either raises."""
        round_index = start.round
        try:
            update = await asyncio.to_thread(
                self.trainer, model, round=round_index, client_id=self.client_id
            )
            update = np.asarray(update, dtype=np.float32)
            if self.ring_inputs is None:
                return update
            seed = wire.round_seed(start.run, round_index, model)
            return await asyncio.to_thread(self.ring_inputs.encode, update, seed)
        except Exception as exc:
            trainer = self.trainer
            name = getattr(trainer, "__qualname__", type(trainer).__name__)
            name = f"{getattr(trainer, '__module__', '?')}:{name}"
            raise TrainerFailed(
                f"client {self.client_id}: the trainer {name} raised in round {round_index + 1}: "
                f"{type(exc).__name__}: {exc} (fix the trainer; --debug shows its traceback)"
            ) from exc

    async def _read_vector(self, call: SessionCall, header: pb.VectorHeader) -> np.ndarray:
        """The model that follows ``header``: at most ``max_model_length`` elements, and the
        same length every time. Raises :class:`ServerMisbehaved`."""
        try:
            if self._model_length is not None and header.length != self._model_length:
                raise wire.WireError(
                    f"the model had {self._model_length} elements; now {header.length} are "
                    "announced"
                )
            assembler = wire.VectorAssembler.bounded(header, self.max_model_length, np.float32)
            while not assembler.complete:
                envelope = await self._read(call)
                if envelope is grpc.aio.EOF or envelope.WhichOneof("body") != "chunk":
                    raise wire.WireError("the server interrupted a vector")
                assembler.add(envelope.chunk)
            model = assembler.result()
        except wire.WireError as exc:
            raise ServerMisbehaved(f"client {self.client_id}: bad model stream: {exc}") from exc
        self._model_length = model.shape[0]
        return model

    async def _start_cluster(
        self,
        call: SessionCall,
        proto: pb.ClusterAssignment,
        update: np.ndarray | None,
        round_guard: RoundGuard,
    ) -> ClientSession | None:
        try:
            assignment, encoding = wire.assignment_from_proto(proto)
            if round_guard.refusal is not None:
                raise round_guard.refusal
            if update is None or update.shape != (assignment.length,):
                raise MalformedRequest(
                    f"an assignment of length {assignment.length} before an input of that length"
                )
            vector = self._input(update, assignment, encoding)
            if round_guard.guard is not None:
                session = round_guard.guard.session(assignment, vector, keys=self.keys)
            else:
                session = ClientSession(
                    self.client_id, assignment, vector, self.policy, keys=self.keys
                )
            first = session.start()
        except (ClientRefusal, wire.WireError, ProtocolError, ValueError) as exc:
            await self._refuse(call, proto.context, exc)
            return None
        if isinstance(first, MaskedShares):  # two-exchange: the masked input and its shares
            self._maybe_exit("mask")
            self._contributed.add(first.context.round)
            self.report.contributed = len(self._contributed)
            await self._send(
                call, pb.ClientMessage(masked_shares=wire.masked_shares_to_proto(first))
            )
            await self._send_vector(call, first.vector)
            return session
        self._maybe_exit("advertise")
        await self._send(call, pb.ClientMessage(advertise=wire.advert_to_proto(first)))
        return session

    async def _send_vector(self, call: SessionCall, vector: np.ndarray) -> None:
        """The chunks of a vector whose header was just sent."""
        for frame in wire.chunk_frames(pb.ClientMessage, vector):
            await self._send(call, frame)

    def _input(
        self,
        update: np.ndarray,
        assignment: ClusterAssignment,
        encoding: RingEncoding | None,
    ) -> np.ndarray:
        """The ring vector this client masks for ``assignment``: its ring inputs' words
        (:class:`RingInputs`, checked against the assignment) or ``update`` encoded with the
        proposed float encoding. Raises :class:`MalformedRequest`."""
        ring = self.ring_inputs
        if ring is None:
            if encoding is None:
                raise MalformedRequest(
                    "the assignment carries no float encoding (ring inputs), but this "
                    "client's trainer encodes none: give the server a float encoding"
                )
            return encode(update, encoding, rng=None)
        if encoding is not None:
            raise MalformedRequest(
                "this client adds its noise to ring inputs it encodes itself; the server "
                "proposed a float encoding instead (it would get the update without it)"
            )
        if assignment.bits != ring.bits:
            raise MalformedRequest(
                f"this client's ring inputs are {ring.bits}-bit words; the assignment's ring "
                f"is {assignment.bits}-bit"
            )
        return update

    async def _refuse(self, call: SessionCall, context: pb.Context, exc: Exception) -> None:
        reason = wire.printable(f"{type(exc).__name__}: {exc}")
        self.report.refusals.append(reason)
        await self._send(call, pb.ClientMessage(refusal=wire.refusal_to_proto(context, reason)))

    async def _step(
        self,
        call: SessionCall,
        session: ClientSession,
        envelope: pb.ServerMessage,
        guard: ClientRound | None,
    ) -> ClientSession | None:
        try:
            message = wire.server_message_from_proto(envelope)
            reply = guard.handle(session, message) if guard else session.handle(message)
        except (ClientRefusal, wire.WireError) as exc:
            session.abort()
            await self._refuse(call, wire.context_to_proto(session.context), exc)
            return None
        if isinstance(reply, EncryptedShares):
            self._maybe_exit("share")
            await self._send(call, pb.ClientMessage(shares=wire.shares_to_proto(reply)))
        elif isinstance(reply, MaskedInput):
            self._maybe_exit("mask")
            self._contributed.add(reply.context.round)
            self.report.contributed = len(self._contributed)
            await self._send(call, pb.ClientMessage(masked=wire.masked_to_proto(reply)))
            await self._send_vector(call, reply.vector)
        elif isinstance(reply, ConsistencySignature):
            self._maybe_exit("consistency")
            await self._send(call, pb.ClientMessage(consistency=wire.signature_to_proto(reply)))
        elif isinstance(reply, UnmaskResponse):
            self._maybe_exit("unmask")
            await self._send(call, pb.ClientMessage(unmask=wire.unmask_response_to_proto(reply)))
        return session


def session_method(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    """The ``Session`` method of ``sharefl.proto`` on ``channel`` (the generated stub's),
    whose serializer also writes bytes already serialized (:func:`wire.serialize`)."""
    return channel.stream_stream(
        wire.SESSION_METHOD,
        request_serializer=wire.serialize,
        response_deserializer=pb.ServerMessage.FromString,
    )


def read_tls(ca: str | None, cert: str | None = None, key: str | None = None) -> ClientTLS | None:
    """TLS settings from PEM files (None when no CA is given); raises
    :class:`ConfigurationError` naming a file that cannot be read."""
    if not ca:
        return None

    def read(path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read {path}: {exc.strerror or exc}; give the files sharefl keygen wrote"
            ) from exc

    return ClientTLS(read(ca), read(cert) if cert else None, read(key) if key else None)
