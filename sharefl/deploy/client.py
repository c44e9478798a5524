"""A client process over gRPC: connects, trains with a pluggable trainer, runs the protocol.

The trainer is any callable ``train(model, *, round, client_id) -> update`` (1-D float
arrays of the model's length), given as a Python object or a ``"module:function"`` entry
point, so an existing training loop can be wrapped. The protocol decisions are the sans-IO
:class:`~sharefl.protocol.client.ClientSession`'s: a request it refuses is answered with a
``Refusal`` and nothing more is revealed in that cluster.

Connection loss: the client retries with exponential backoff (``retries`` attempts), then
raises :class:`ConnectionLost` with a clear message.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from grpc._cython.cygrpc import InternalError as _GrpcInternalError

from sharefl.crypto.encoding import encode
from sharefl.crypto.signatures import IdentityKey
from sharefl.deploy import wire
from sharefl.deploy.server import MAX_MESSAGE_BYTES, TRANSPORT_OPTIONS, hello_statement
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.errors import ClientRefusal, ProtocolError
from sharefl.protocol.messages import (
    ConsistencySignature,
    EncryptedShares,
    MaskedInput,
    UnmaskResponse,
)

Trainer = Callable[..., np.ndarray]
STAGES = ("advertise", "share", "mask", "consistency", "unmask")


class ConnectionLost(ProtocolError):
    """The server could not be reached (or was lost) after all retries."""


def load_trainer(spec: str) -> Trainer:
    """Import ``"module:function"``; raises ValueError with what to fix."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"trainer must be 'module:function', got {spec!r}")
    try:
        trainer = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load trainer {spec!r}: {exc}") from exc
    if not callable(trainer):
        raise ValueError(f"trainer {spec!r} is not callable")
    return trainer


def demo_trainer(model: np.ndarray, *, round: int, client_id: int) -> np.ndarray:
    """A deterministic stand-in for local training: an update that depends only on the client
    id and the round, in multiples of 1/256 within [-1, 1) so fixed-point sums are exact."""
    rng = np.random.default_rng([client_id, round])
    steps = rng.integers(-256, 256, size=model.shape[0], dtype=np.int16)
    return steps.astype(np.float32) * np.float32(1 / 256)


@dataclass
class ClientTLS:
    """Root CA to trust, and an optional client certificate/key (mutual TLS)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None


@dataclass
class ClientReport:
    """What a client did: rounds completed, bytes sent, refusals, the final model."""

    client_id: int
    rounds: int = 0
    bytes_sent: int = 0
    refusals: list[str] = field(default_factory=list)
    model: np.ndarray | None = None


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
            ``unmask``), to play a client that vanishes at that stage.
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
    ) -> None:
        if exit_before is not None and exit_before not in STAGES:
            raise ValueError(f"exit_before must be one of {STAGES}")
        self.client_id = client_id
        self.address = address
        self.trainer = trainer
        self.identity = identity or IdentityKey.generate()
        self.policy = policy or ClientPolicy(identity=self.identity)
        self.tls = tls
        self.retries = retries
        self.exit_before = exit_before
        self.report = ClientReport(client_id)

    def _channel(self) -> grpc.aio.Channel:
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *TRANSPORT_OPTIONS,
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

        Raises :class:`ConnectionLost` when the server stays unreachable, and
        ``grpc.aio.AioRpcError`` when the server refuses this client (wrong identity,
        certificate, malformed message) — those are not retried.
        """
        delay = 0.5
        for attempt in range(1, self.retries + 1):
            try:
                async with self._channel() as channel:
                    await self._session(pb_grpc.AggregationStub(channel))
                return self.report
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                if attempt == self.retries:
                    raise ConnectionLost(
                        f"client {self.client_id}: server {self.address} unreachable after "
                        f"{self.retries} attempts ({exc.details()})"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 8.0)
        return self.report

    def _send(self, call, message: pb.ClientMessage):
        self.report.bytes_sent += message.ByteSize()
        return call.write(message)

    def _maybe_exit(self, stage: str) -> None:
        if stage == self.exit_before:
            os.kill(os.getpid(), signal.SIGKILL)

    async def _session(self, stub: pb_grpc.AggregationStub) -> None:
        call = stub.Session()
        challenge = await call.read()
        if challenge is grpc.aio.EOF or challenge.WhichOneof("body") != "challenge":
            raise ProtocolError("the server did not open with a Challenge")
        nonce = challenge.challenge.nonce
        await self._send(
            call,
            pb.ClientMessage(
                hello=pb.Hello(
                    client_id=self.client_id,
                    identity_public=self.identity.public,
                    signature=self.identity.sign(hello_statement(nonce, self.client_id)),
                )
            ),
        )
        update: np.ndarray | None = None
        model: np.ndarray | None = None
        session: ClientSession | None = None
        finished = False
        while (envelope := await call.read()) is not grpc.aio.EOF:
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
                update = await asyncio.to_thread(
                    self.trainer, model, round=envelope.round_start.round, client_id=self.client_id
                )
                update = np.asarray(update, dtype=np.float32)
            elif kind == "assignment":
                session = await self._start_cluster(call, envelope.assignment, update)
            elif kind == "round_end":
                self.report.rounds += 1
                session = None
            elif session is not None and kind in ("keys", "masking", "consistency", "unmask"):
                session = await self._step(call, session, envelope)
        try:
            await call.done_writing()
        except (grpc.aio.AioRpcError, _GrpcInternalError):
            # After `finished` the server may close the RPC before this half-close reaches
            # it; grpc aio then fails the write (grpc/grpc#24758, #36066). Nothing is lost.
            if not finished:
                raise

    async def _read_vector(self, call, header: pb.VectorHeader) -> np.ndarray:
        assembler = wire.VectorAssembler(header, header.length, np.float32)
        while not assembler.complete:
            envelope = await call.read()
            if envelope is grpc.aio.EOF or envelope.WhichOneof("body") != "chunk":
                raise ProtocolError("the server interrupted a vector")
            assembler.add(envelope.chunk)
        return assembler.result()

    async def _start_cluster(
        self, call, proto: pb.ClusterAssignment, update
    ) -> ClientSession | None:
        try:
            assignment, encoding = wire.assignment_from_proto(proto)
            if update is None or update.shape != (assignment.length,):
                raise ProtocolError("cluster assignment before a model of the right length")
            vector = encode(update, encoding, rng=None)
            session = ClientSession(self.client_id, assignment, vector, self.policy)
        except (ClientRefusal, wire.WireError, ProtocolError, ValueError) as exc:
            await self._refuse(
                call, wire.context_to_proto(wire.context_from_proto(proto.context)), exc
            )
            return None
        self._maybe_exit("advertise")
        await self._send(
            call, pb.ClientMessage(advertise=wire.advert_to_proto(session.advertise()))
        )
        return session

    async def _refuse(self, call, context: pb.Context, exc: Exception) -> None:
        self.report.refusals.append(f"{type(exc).__name__}: {exc}")
        await self._send(
            call, pb.ClientMessage(refusal=pb.Refusal(context=context, reason=str(exc)))
        )

    async def _step(self, call, session: ClientSession, envelope: pb.ServerMessage):
        try:
            reply = session.handle(wire.server_message_from_proto(envelope))
        except (ClientRefusal, wire.WireError) as exc:
            await self._refuse(call, wire.context_to_proto(session.context), exc)
            return None
        if isinstance(reply, EncryptedShares):
            self._maybe_exit("share")
            await self._send(call, pb.ClientMessage(shares=wire.shares_to_proto(reply)))
        elif isinstance(reply, MaskedInput):
            self._maybe_exit("mask")
            header, chunks = wire.masked_header_to_proto(reply)
            await self._send(call, pb.ClientMessage(masked=header))
            for chunk in chunks:
                await self._send(call, pb.ClientMessage(chunk=chunk))
        elif isinstance(reply, ConsistencySignature):
            self._maybe_exit("consistency")
            await self._send(call, pb.ClientMessage(consistency=wire.signature_to_proto(reply)))
        elif isinstance(reply, UnmaskResponse):
            self._maybe_exit("unmask")
            await self._send(call, pb.ClientMessage(unmask=wire.unmask_response_to_proto(reply)))
        return session


def read_tls(ca: str | None, cert: str | None = None, key: str | None = None) -> ClientTLS | None:
    """TLS settings from PEM files (None when no CA is given)."""
    if not ca:
        return None
    return ClientTLS(
        Path(ca).read_bytes(),
        Path(cert).read_bytes() if cert else None,
        Path(key).read_bytes() if key else None,
    )
