"""The base exception of :mod:`sharefl.deploy`.

The transport is a driver of the protocol, so its errors are protocol errors: a caller that
catches :class:`~sharefl.protocol.errors.ProtocolError` sees every failure of a deployed
round, and one that catches :class:`DeployError` sees only what the gRPC transport adds
(malformed protobuf, an unreachable or misbehaving server, a results folder that cannot be
resumed). Configuration mistakes raise :class:`~sharefl.protocol.errors.ConfigurationError`,
as everywhere in the secure layer.
"""

from __future__ import annotations

from sharefl.protocol.errors import ProtocolError


class DeployError(ProtocolError):
    """Base class of the errors defined by :mod:`sharefl.deploy`."""
