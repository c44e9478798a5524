"""One round's released cluster sums, in the one shape every server aggregates them.

:class:`Released` is what a round hands its server step, whoever ran the protocol: the
in-process driver (:func:`~sharefl.protocol.driver.secure_sum`, in
:mod:`~sharefl.simulator.federated.share`), the gRPC server (:mod:`sharefl.deploy.run`,
whose strategies and the simulation bridge take it) and the Flower workflow. Each builds it
with :meth:`Released.from_reclusterings` from the coordinator's result and the round's
reader of a sum (the float inputs' decoded sum, or a discrete mechanism's ring sum decoded
with the round's public seed). Only reclusterings that released at least one cluster are
kept; each sum carries its members, the clients that survived into it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sharefl.protocol.coordinator import ReclusteringResult
from sharefl.protocol.server import ClusterSum


@dataclass(frozen=True)
class Released:
    """Per reclustering with a release: the decoded cluster sums ``[d]`` and their members.

    Attributes:
        sums: ``sums[r][k]``, cluster k's decoded sum in reclustering r.
        members: ``members[r][k]``, the client ids whose inputs that sum holds.

    Raises:
        ValueError: ``sums`` and ``members`` differ in shape, or a reclustering is empty
            (build with :meth:`of`, which leaves out the reclusterings that released
            nothing).
    """

    sums: tuple[tuple[np.ndarray, ...], ...]
    members: tuple[tuple[tuple[int, ...], ...], ...]

    def __post_init__(self) -> None:
        if [len(r) for r in self.sums] != [len(r) for r in self.members]:
            raise ValueError("every released sum needs its members (sums and members differ)")
        if any(not r for r in self.sums):
            raise ValueError("a reclustering without released sums is left out, not kept empty")

    @classmethod
    def of(cls, reclusterings: Iterable[Iterable[tuple[np.ndarray, Sequence[int]]]]) -> Released:
        """From ``(decoded sum, members)`` pairs per reclustering; reclusterings that
        released nothing are left out."""
        kept = [list(r) for r in reclusterings]
        kept = [r for r in kept if r]
        return cls(
            sums=tuple(tuple(s for s, _ in r) for r in kept),
            members=tuple(tuple(tuple(int(c) for c in m) for _, m in r) for r in kept),
        )

    @classmethod
    def from_reclusterings(
        cls,
        reclusterings: Iterable[ReclusteringResult],
        read: Callable[[ClusterSum], np.ndarray] | None = None,
    ) -> Released:
        """From a round's reclusterings (``RoundResult.reclusterings``,
        ``SecureSumResult.reclusterings``): each released cluster's value is ``read(sum)``
        (by default its decoded float sum, :attr:`~sharefl.protocol.server.ClusterSum.
        float_sum`; a discrete mechanism passes its decoder of ``ring_sum``)."""
        value = read if read is not None else _float_sum
        return cls.of([(value(s), s.members) for s in r.clusters] for r in reclusterings)

    def __bool__(self) -> bool:
        """Whether any cluster sum was released."""
        return bool(self.sums)

    def all_members(self) -> list[tuple[int, ...]]:
        """The members of every released sum, all reclusterings in order (what the privacy
        ledgers charge)."""
        return [m for r in self.members for m in r]

    def pairs(self) -> list[list[tuple[np.ndarray, int]]]:
        """Per reclustering, ``(sum, cluster size)``: the input of
        :meth:`~sharefl.robust.HierarchicalAggregator.aggregate_released`."""
        return [
            list(zip(sums, map(len, members), strict=True))
            for sums, members in zip(self.sums, self.members, strict=True)
        ]


def _float_sum(cluster: ClusterSum) -> np.ndarray:
    return cluster.float_sum
