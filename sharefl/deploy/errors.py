"""The base exception of :mod:`sharefl.deploy`.

The transport is a driver of the protocol, so its errors are protocol errors: a caller that
catches :class:`~sharefl.protocol.errors.ProtocolError` sees every failure of a deployed
round, and one that catches :class:`DeployError` sees only what the gRPC transport adds
(malformed protobuf, an unreachable or misbehaving server, a results folder that cannot be
resumed). Configuration mistakes raise :class:`~sharefl.protocol.errors.ConfigurationError`,
as everywhere in the secure layer.
"""

from __future__ import annotations

from sharefl.exit_status import ExitStatus
from sharefl.protocol.errors import ProtocolError


class DeployError(ProtocolError):
    """Base class of the errors defined by :mod:`sharefl.deploy`."""


class RunStalled(DeployError):
    """``server.max_empty_rounds`` rounds in a row released no cluster sum (or only sums the
    robust rule refused: fewer than its ``f`` needs), so the server stopped the run: the
    model cannot change, and a round over an unchanged model reuses its plan, so the run
    would only repeat (e.g. a client that corrupted its cluster's sum and left: without it
    the cluster's smaller sum is withheld in every later round). The message names the last
    round's withheld, failed and corrupted clusters and what to change."""

    exit_status = ExitStatus.STALLED


class TooFewClients(DeployError):
    """Fewer than two clients connected within ``server.connect_timeout_s``: no round can
    run. The message says how many came and what to change."""

    exit_status = ExitStatus.NO_CLIENTS


class ClientsLost(DeployError):
    """A round found fewer clients left (connected and not excluded) than it needs: the
    others left (their trainers raised, they were stopped or cut off) or were excluded."""

    exit_status = ExitStatus.CLIENTS_LOST
