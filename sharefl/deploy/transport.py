"""gRPC transport settings shared by the server and its clients: message size limits,
HTTP/2 flow control and keepalive."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import grpc

from sharefl.proto import sharefl_pb2 as pb

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
