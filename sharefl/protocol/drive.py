"""The server side of a round as a sequence of sends: one drive loop for every transport.

A transport (in-process play, the gRPC server, the Flower workflow) owns its I/O: how a
message reaches a client, how replies come back, how long a stage waits. What it sends
when is not its to decide, and is written once here, sans I/O::

    for outgoing in server_exchanges(coordinator):
        send(outgoing)       # the transport's own encoding and channel
        collect()            # replies into coordinator.receive(...), until the stage is
                             # complete or the transport's deadline passed
    result = coordinator.result()

Per reclustering: the assignments (``opening``), then each stage close's messages
(:meth:`RoundCoordinator.advance`) until every cluster has an outcome; the reclustering
is closed before the next opens. A client that does not answer before the transport
resumes the loop counts as dropped at that stage — who is dropped is the server's to
decide in any case; every guarantee of the secure layer is enforced by each client on
its own view (:mod:`sharefl.protocol.client_round`), never by this loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from sharefl.protocol.coordinator import RoundCoordinator
from sharefl.protocol.messages import ClusterAssignment, ServerMessage


@dataclass(frozen=True)
class Outgoing:
    """One batch of server messages, all of one stage of one reclustering.

    Attributes:
        reclustering: the index of the open reclustering (0-based).
        messages: client id → what that client is sent now.
        opening: ``True`` for the reclustering's assignments (then ``messages`` holds
            :class:`ClusterAssignment`; clusters of one client get none), ``False`` for
            a stage close's messages (:class:`ServerMessage`).
    """

    reclustering: int
    messages: Mapping[int, ClusterAssignment | ServerMessage]
    opening: bool


StageObserver = Callable[[str, float], None]
"""``observe(stage, seconds)``: called after every stage close with the stage closed and
the wall time the close took (for benchmarks and progress displays)."""


def stage_messages(
    advance: Callable[[], Mapping[int, ServerMessage]],
    finished: Callable[[], bool],
    stage: Callable[[], str],
    observe: StageObserver | None = None,
) -> Iterator[Mapping[int, ServerMessage]]:
    """Close stages with ``advance`` until ``finished()``; yields each non-empty batch
    (``stage()`` names the stage each close ends, for ``observe``). The caller delivers
    the replies to a batch before it asks for the next. Finite: every ``advance`` moves
    each unfinished cluster one stage on, missing replies counting as drop-outs."""
    while not finished():
        closing = stage()
        start = time.perf_counter()
        messages = advance()
        if observe is not None:
            observe(closing, time.perf_counter() - start)
        if messages:
            yield messages


def server_exchanges(
    coordinator: RoundCoordinator, observe: StageObserver | None = None
) -> Iterator[Outgoing]:
    """Every batch the server sends in ``coordinator``'s round, reclustering by
    reclustering. Before resuming the iterator the transport sends the batch and delivers
    the replies it collects (:meth:`RoundCoordinator.receive`); when the iterator ends,
    :meth:`RoundCoordinator.result` holds the round's result.

    Raises whatever the coordinator raises (:class:`~sharefl.protocol.errors.StageError`
    when the round was already driven)."""
    while not coordinator.done:
        assignments = coordinator.open_reclustering()
        index = coordinator.reclustering
        yield Outgoing(index, assignments, opening=True)
        for messages in stage_messages(
            coordinator.advance,
            lambda: coordinator.reclustering_done,
            lambda: coordinator.stage,
            observe,
        ):
            yield Outgoing(index, messages, opening=False)
        coordinator.close_reclustering()
