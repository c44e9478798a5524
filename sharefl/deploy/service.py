"""The gRPC face of a :class:`~sharefl.deploy.run.ServerRun`: one bidirectional stream per
client, authenticated (a signed Hello against the identity directory, optionally TLS
client certificates) before it reaches the run; a stream the service ends, ends with a
status code and a message."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import grpc
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
from sharefl.deploy.config import DeploymentConfig
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol.errors import (
    RejectedMessage,
)
from sharefl.protocol.keys import KeyAdvert

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy this is Any, kept for the reader
    SessionContext: TypeAlias = grpc.aio.ServicerContext[pb.ClientMessage, pb.ServerMessage]
    """The server's end of one ``Session`` stream."""

from sharefl.deploy.run import OWN_TEXT_CHARS, ClientLink, ServerRun, StreamError


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
