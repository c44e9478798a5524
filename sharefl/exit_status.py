"""The exit statuses of the ``sharefl`` command: one table, used by the CLI, its ``--help``
and README.

A user-caused error ends the command with one line on stderr naming what to change and
one of these statuses; only a bug in sharefl exits 1 with a traceback. ``--debug`` shows
the traceback of any error.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """Process exit statuses of ``sharefl`` (the values are part of the interface)."""

    OK = 0
    BUG = 1
    CONFIG = 2
    UNREACHABLE = 3
    REFUSED = 4
    SERVER_MISBEHAVED = 5
    DATA_MISSING = 6
    USER_CODE_FAILED = 7
    STALLED = 8
    ROUNDS_REFUSED = 9
    NO_CLIENTS = 10
    CLIENTS_LOST = 11
    INTERRUPTED = 130


MEANING: dict[ExitStatus, str] = {
    ExitStatus.OK: "done",
    ExitStatus.BUG: "a bug in sharefl: the traceback is printed; please report it",
    ExitStatus.CONFIG: "bad command line or configuration: the message names the option or key",
    ExitStatus.UNREACHABLE: "the server is unreachable or went silent (client)",
    ExitStatus.REFUSED: "the server refused this client or stopped the run (client)",
    ExitStatus.SERVER_MISBEHAVED: "the client left a server whose stream it could not follow",
    ExitStatus.DATA_MISSING: "data missing: a dataset's files are neither on disk nor downloadable",
    ExitStatus.USER_CODE_FAILED: "user code failed: a --trainer function raised",
    ExitStatus.STALLED: "stalled: server.max_empty_rounds rounds in a row released no sum (server)",
    ExitStatus.ROUNDS_REFUSED: "this client refused every round it was offered (client)",
    ExitStatus.NO_CLIENTS: "too few clients connected within server.connect_timeout_s (server)",
    ExitStatus.CLIENTS_LOST: "too few clients left for a round: they left (e.g. their trainers "
    "raised) or were excluded (server)",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); finished rounds and runs are kept",
}
"""One line per status, as ``sharefl --help`` and README print them."""


def epilog() -> str:
    """The exit-status table of ``sharefl --help``."""
    lines = ["exit statuses:"]
    lines += [f"  {int(status):>3}  {MEANING[status]}" for status in ExitStatus]
    lines.append("--debug (before the command) prints the traceback behind an error.")
    return "\n".join(lines)
