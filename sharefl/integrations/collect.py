"""How a Flower stage waits for its replies: the clock restarts with every reply.

Flower's ``Grid.send_and_receive(messages, timeout=T)`` waits at most T seconds from the
send. Neither choice of T works for a multi-stage protocol:

- ``T = None`` waits for every client: one hung client blocks the round forever;
- a finite T counts every client as a drop-out when all of them are slow together, as in
  the first round of a simulation, where Ray starts its actors, or when a simulation's
  actor pool serves 20 clients two at a time, so that the last reply comes long after the
  first even though the clients progress steadily.

:func:`send_and_collect` waits instead while replies keep coming: a stage ends when every
reply is in, or when no new reply has come for ``idle`` seconds since the last one (or
since the first reply, if only one came), or when not even one reply has come
``first`` seconds after the send. A hung client then costs at most ``idle`` seconds per
stage (plus one polling interval), and steady progress, however slow in total, is never
cut short.

Each stage of a multi-stage protocol is one more wait for replies, so the time between a
reply's arrival and its pull counts once per stage. Pulls therefore start
:data:`FIRST_POLL_INTERVAL` after the send and after each reply, and the interval doubles
while nothing comes, up to the grid's own ``pull_interval``: a reply that comes quickly is
pulled within about its own latency instead of a whole interval later, and a stage that
waits long polls no more often than Flower's ``send_and_receive`` (a few more pulls per
stage, each one small request to a SuperLink).

Why the waiting policy cannot leak anything: which clients count as drop-outs is the
server's to decide in any case (a malicious server can always pretend a client did not
answer); the guarantees of the secure layer are enforced by every client on its own view
(release checks, thresholds, signed client lists), so no choice of deadlines changes what
the server can learn.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sharefl.protocol.errors import ConfigurationError

if TYPE_CHECKING:  # the waiting policy needs no Flower; its callers bring the grid
    from flwr.app import Message

#: Seconds between pulls when the grid does not say (Flower's gRPC grid sleeps 3 s in its
#: own ``send_and_receive``; a pull on a SuperLink is one small request).
DEFAULT_POLL_INTERVAL = 0.1
#: Seconds from a send, or from a reply, to the next pull; the interval then doubles up to
#: the grid's ``pull_interval`` (module docstring).
FIRST_POLL_INTERVAL = 0.002


@dataclass(frozen=True)
class ReplyDeadlines:
    """When a stage stops waiting (seconds; ``None``: no limit).

    Attributes:
        idle: the longest wait for the next reply once a first one came; the clock
            restarts with every reply.
        first: the longest wait for the first reply of a stage.

    Raises:
        ConfigurationError: a value that is not a positive finite number or ``None``.
    """

    idle: float | None = None
    first: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("timeout", self.idle), ("first_reply_timeout", self.first)):
            if value is not None and not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds or None (no limit), got {value!r}"
                )


def send_and_collect(
    grid: Any,
    messages: Iterable[Message],
    deadlines: ReplyDeadlines,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Message]:
    """Push ``messages`` through ``grid`` (any Flower ``Grid``: ``push_messages`` and
    ``pull_messages``) and return the replies that came before :class:`ReplyDeadlines`
    ended the stage (module docstring), in the order they arrived. Pulls
    :data:`FIRST_POLL_INTERVAL` after the send and after each reply, then at doubling
    intervals up to ``grid.pull_interval`` seconds (:data:`DEFAULT_POLL_INTERVAL` if the
    grid has none); ``clock`` and ``sleep`` are injectable for tests."""
    pending = set(grid.push_messages(list(messages)))
    interval = float(getattr(grid, "pull_interval", DEFAULT_POLL_INTERVAL))
    shortest = min(FIRST_POLL_INTERVAL, interval)
    wait = shortest
    replies: list[Message] = []
    last = clock()
    while pending:
        arrived = list(grid.pull_messages(pending))
        now = clock()
        if arrived:
            replies.extend(arrived)
            pending.difference_update(m.metadata.reply_to_message_id for m in arrived)
            last, wait = now, shortest
            continue
        limit = deadlines.idle if replies else deadlines.first
        if limit is not None and now - last >= limit:
            break
        sleep(wait if limit is None else min(wait, max(0.0, last + limit - now)))
        wait = min(2 * wait, interval)
    return replies
