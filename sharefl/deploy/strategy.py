"""What the server does with a round's released sums: :class:`ServerStrategy`, and the
default :class:`AveragingStrategy` (``model ← model − learning_rate × aggregate``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

import grpc
import numpy as np

from sharefl.deploy.config import DeploymentConfig
from sharefl.proto import sharefl_pb2 as pb
from sharefl.rounds.model_step import descend
from sharefl.rounds.released import Released

if TYPE_CHECKING:  # grpc ships no type stubs here: to mypy this is Any, kept for the reader
    SessionContext: TypeAlias = grpc.aio.ServicerContext[pb.ClientMessage, pb.ServerMessage]
    """The server's end of one ``Session`` stream."""


class ServerStrategy(Protocol):
    """What the server does with the released sums (the protocol part is fixed).

    ``initial_model()`` is the model broadcast in round 0 (float32 ``[dim]``);
    ``apply(model, round, released)`` is called after every round with the sums it
    released (:class:`~sharefl.rounds.released.Released`: every reclustering that released
    at least one cluster; each value float64 ``[model dim]``, the float inputs' decoded sum
    or, with ``[privacy]``, the decoded ring sum; empty when every cluster failed) and
    returns ``(new model, the aggregate or None when nothing was released, a note for the
    log)``. The averaging and robust strategies keep the model when nothing was released;
    a simulation file's strategy runs its loop's round as in process (a zero aggregate:
    server momentum still moves the model, the accountant composes the round, evaluation
    when due). A strategy may also define ``check(clusters)``, called before the
    server listens with the number of clusters of a reclustering, raising ``ValueError``
    (e.g. a robust rule's ``f`` too large for that many cluster sums).
    """

    def initial_model(self) -> np.ndarray: ...

    def apply(
        self, model: np.ndarray, round_index: int, released: Released
    ) -> tuple[np.ndarray, np.ndarray | None, str]: ...


class AveragingStrategy:
    """The default: ``model ← model − learning_rate × aggregate`` (:func:`descend`), where
    the aggregate is each
    reclustering's total (``aggregator = "sum"``) or per-client mean (``"mean"``), averaged
    over the reclusterings; the model starts at zero."""

    def __init__(self, config: DeploymentConfig) -> None:
        self.config = config

    def initial_model(self) -> np.ndarray:
        return np.zeros(self.config.model.dim, dtype=np.float32)

    def apply(
        self, model: np.ndarray, round_index: int, released: Released
    ) -> tuple[np.ndarray, np.ndarray | None, str]:
        if not released:
            return model, None, ""
        aggregates = []
        for sums, clusters in zip(released.sums, released.members, strict=True):
            total = np.sum(sums, axis=0)
            members = sum(len(m) for m in clusters)
            aggregates.append(total / members if self.config.model.aggregator == "mean" else total)
        total = np.mean(aggregates, axis=0)
        updated = descend(model, self.config.model.learning_rate, total)
        return updated, total, ""
