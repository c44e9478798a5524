"""The root of every exception sharefl defines, and what each means to the command line.

Each package has its own base (:class:`~sharefl.crypto.errors.CryptoError`,
:class:`~sharefl.protocol.errors.ProtocolError`, :class:`~sharefl.privacy.errors.PrivacyError`,
:class:`~sharefl.robust.base.AggregationError`,
:class:`~sharefl.simulator.errors.SimulatorError`, :class:`UserError` for the command line),
and all of them derive from :class:`ShareflError`, so ``except ShareflError`` catches
whatever sharefl raised on purpose. Errors that are also bad arguments derive from
``ValueError`` too, so generic handlers keep working.

An error's :attr:`ShareflError.exit_status` is the status ``sharefl`` exits with when the
error ends a command: an :class:`~sharefl.exit_status.ExitStatus` for errors a user causes
and can fix (the CLI prints the message, which says what to change, as one line), ``None``
for errors that mean sharefl itself went wrong (the CLI lets them through, with their
traceback). A subclass states its status where it is defined.

:class:`ConfigurationError` is the one root of configuration errors, whatever the package (a
file, option or argument that cannot work: exit status 2): the protocol's and deploy's
(``sharefl.protocol.errors`` re-exports it), and the bases whose errors are all the user's
input (:class:`~sharefl.simulator.errors.SimulatorError`,
:class:`~sharefl.privacy.errors.PrivacyError`, :class:`~sharefl.robust.base.AggregationError`)
derive from it. Every error whose status is ``CONFIG`` is one.
"""

from __future__ import annotations

from sharefl.exit_status import ExitStatus


class ShareflError(Exception):
    """Base class of every exception sharefl defines."""

    exit_status: ExitStatus | None = None


class ConfigurationError(ShareflError, ValueError):
    """A configuration that cannot work (a file's key, a command-line option, an argument):
    the message names it and says what to change; the command exits 2."""

    exit_status = ExitStatus.CONFIG


class UserError(ShareflError):
    """An error the user can fix, with the status the command exits with; the CLI prints
    ``sharefl COMMAND: <message>`` as one line, without a traceback."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.CONFIG) -> None:
        super().__init__(message)
        self.exit_status = status
