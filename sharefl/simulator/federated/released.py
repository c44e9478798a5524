"""One round's released cluster sums, as the federated server aggregates them.

:class:`Released` is what the server round (:meth:`~sharefl.simulator.federated.loop.
Simulation.server_round`) takes from whoever ran the protocol: the in-process driver
(:func:`~sharefl.protocol.driver.secure_sum`, in :mod:`~sharefl.simulator.federated.share`)
or a deployment's server (the gRPC bridge, which hands in the sums its coordinator
released). Only reclusterings that released at least one cluster are kept; each sum is
decoded (floats, or a discrete mechanism's decoded ring sum) and carries its members, the
clients that survived into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


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
