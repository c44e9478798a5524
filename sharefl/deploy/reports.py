"""What a deployment round and run report: :class:`RoundReport` (one per round, the
result file's rows), :class:`RunResult`, and the message of a run that stalls."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc
import numpy as np

from sharefl.deploy import wire
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.coordinator import RoundResult
from sharefl.wording import counted

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy this is Any, kept for the reader
    SessionContext: TypeAlias = grpc.aio.ServicerContext[pb.ClientMessage, pb.ServerMessage]
    """The server's end of one ``Session`` stream."""


STALL_REASON_CHARS = 160
"""Most characters of one cluster's reason in a :class:`RunStalled` message."""
STALL_CLUSTERS = 4
"""Most clusters a :class:`RunStalled` message names (then ``and k more``)."""


def unreleased_clusters(report: RoundReport) -> list[str]:
    """One phrase per cluster of ``report`` that released no sum, ``cluster r/i withheld:
    reason`` (also ``failed at <stage>``, ``corrupted``), each reason cut to
    :data:`STALL_REASON_CHARS`."""
    phrases = []
    for key in ("withheld", "failed", "corrupted"):
        for entry in getattr(report, key):
            how = f"failed at {entry['stage']}" if key == "failed" else key
            reason = wire.printable(str(entry["reason"]), STALL_REASON_CHARS)
            phrases.append(f"cluster {entry['reclustering']}/{entry['cluster']} {how}: {reason}")
    return phrases


def stall_message(report: RoundReport, empty: int) -> str:
    """Why the run stops after ``empty`` rounds in a row without a released sum the
    aggregator could use, the last being ``report``, and what to change
    (:class:`RunStalled`)."""
    phrases = unreleased_clusters(report)
    named = "; ".join(phrases[:STALL_CLUSTERS]) or "no cluster ran"
    if len(phrases) > STALL_CLUSTERS:
        named += f"; and {len(phrases) - STALL_CLUSTERS} more"
    first, last = report.round - empty + 2, report.round + 1
    return (
        f"{counted(empty, 'round')} in a row (rounds {first}-{last}) released no cluster sum"
        f"{'' if not report.clusters else ' the aggregator could use'}, so the model cannot "
        f"change and the server stops the run; round {last}: {named}. "
        "Bring back the clusters' missing clients or remove the ones that corrupt them, or "
        "start a new run (a new model gets a new plan); server.max_empty_rounds sets how "
        "many such rounds a run allows (0: never stop)"
    )


@dataclass
class RoundReport:
    """What one round did, as written to ``result.json``.

    Attributes:
        round: the round index (from 0, as on the wire; files and logs number it from 1).
        participants: the clients planned into the round.
        clusters: the released sums of every reclustering (reclustering, cluster, members,
            dropped, excluded: left out because every peer disowned it, not named;
            complaints).
        failed: clusters without a sum (reclustering, cluster, members, stage, reason,
            culprits); ``withheld`` lists those the release check held back.
        withheld: clusters whose sum would have made an update or a too-small sum
            recoverable (reclustering, cluster, members, reason).
        corrupted: sums outside the honest range, left out of the aggregate.
        culprits: client id → why it was named (malformed or rejected messages, secrets
            that could not be rebuilt from its own dealing); never a client its peers
            disowned or complained about.
        excluded: clients left out of later rounds by the exclusion policy (cumulative).
        contributors: the largest number of clients one reclustering aggregated.
        seconds: the round's wall time.
        sampled_out: connected, eligible clients that ``server.clients_per_round`` left out
            of this round (they only got its RoundEnd).
        traffic: client id → ``bytes_in`` (received from it) and ``bytes_out`` (sent to it)
            during this round only (the run's totals are ``RunResult.traffic``).
        epsilon: with ``[privacy]``, the worst client's ε so far at ``privacy.delta``
            (:class:`~sharefl.privacy.distributed.ReleaseLedger`); ``None`` otherwise.
        total: the aggregate over the reclusterings (see :class:`AveragingStrategy`;
            ``None`` when nothing was released). Not written to JSON.
    """

    round: int
    participants: list[int]
    clusters: list[dict[str, Any]]
    failed: list[dict[str, Any]]
    withheld: list[dict[str, Any]]
    corrupted: list[dict[str, Any]]
    culprits: dict[int, str]
    excluded: list[int]
    contributors: int
    seconds: float
    total: np.ndarray | None = None
    sampled_out: list[int] = field(default_factory=list)
    traffic: dict[int, dict[str, int]] = field(default_factory=dict)
    epsilon: float | None = None

    @classmethod
    def of(
        cls, result: RoundResult, excluded: list[int], seconds: float, total: np.ndarray | None
    ) -> RoundReport:
        clusters: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        withheld: list[dict[str, Any]] = []
        corrupted: list[dict[str, Any]] = []
        contributors = 0
        for rec in result.reclusterings:
            for s in rec.clusters:
                clusters.append(
                    {
                        "reclustering": rec.index,
                        "cluster": s.cluster,
                        "members": list(s.members),
                        "dropped": list(s.dropped),
                        "excluded": list(s.excluded),
                        "complaints": [list(c) for c in s.complaints],
                    }
                )
            for f in rec.failed:
                entry = {"reclustering": rec.index, **asdict(f)}
                (withheld if f.stage == "release" else failed).append(entry)
            corrupted += [{"reclustering": rec.index, **asdict(c)} for c in rec.corrupted]
            contributors = max(contributors, sum(len(s.members) for s in rec.clusters))
        return cls(
            round=result.plan.round,
            participants=list(result.plan.participants),
            clusters=clusters,
            failed=failed,
            withheld=withheld,
            corrupted=corrupted,
            culprits=dict(sorted(result.culprits.items())),
            excluded=excluded,
            contributors=contributors,
            seconds=seconds,
            total=total,
        )


@dataclass
class RunResult:
    """The outcome of a server run: one report per round, the final model, and the bytes
    received from (``bytes_in``) and sent to (``bytes_out``) each client over the whole run,
    as protobuf message sizes (each report has its round's share)."""

    reports: list[RoundReport]
    model: np.ndarray
    traffic: dict[int, dict[str, int]]


Log = Callable[[str], None]
