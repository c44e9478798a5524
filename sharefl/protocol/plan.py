"""The round plan: the R clusterings of one round that the server commits to.

A :class:`RoundPlan` lists, for one round, every reclustering's partition of the round's
participants into clusters. Its SHA-256 :meth:`~RoundPlan.digest` is bound into the
:class:`~sharefl.crypto.kdf.KeyContext` of every cluster of the round, hence into every
derived key, AEAD associated data and signature: members of one cluster who were shown
different plans derive different keys and refuse each other's signed advertisements, so
a server cannot show one plan to some clients and another to the rest of a cluster. With
the whole plan in hand a client can check what it may take part in: at most one cluster
per reclustering, only the clusters of the plan, and a plan whose sums leak nothing
(:func:`sharefl.protocol.audit.audit`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from sharefl.crypto.kdf import PROTOCOL_VERSION, KeyContext
from sharefl.protocol.atoms import Atoms, check_plan_atoms
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import ConfigurationError

PLAN_TAG = b"sharefl/round-plan\x00"
CLUSTERINGS_TAG = b"sharefl/plan-clusterings\x00"
ATOMS_TAG = b"sharefl/plan-atoms\x00"


@dataclass(frozen=True)
class RoundPlan:
    """The clusterings of one round, over the same participants.

    Attributes:
        round: the round number.
        clusterings: one :class:`Clustering` per reclustering (R >= 1), each a partition of
            the same client ids.
        atoms: the round's atoms (:mod:`sharefl.protocol.atoms`): a partition of the same
            clients of which every cluster is a union; ``None``: a plan without atoms.

    Raises :class:`ConfigurationError` for an empty plan, clusterings over different
    clients, or atoms that do not partition the participants or that a cluster cuts.
    """

    round: int
    clusterings: tuple[Clustering, ...]
    atoms: Atoms | None = None

    def __post_init__(self) -> None:
        if not self.clusterings:
            raise ConfigurationError("a round plan needs at least one clustering")
        object.__setattr__(self, "clusterings", tuple(self.clusterings))
        first = set(self.clusterings[0].members)
        if any(set(c.members) != first for c in self.clusterings[1:]):
            raise ConfigurationError("every clustering of a round plan must cover the same clients")
        if self.atoms is not None:
            check_plan_atoms(self.clusterings, self.atoms)
        KeyContext(round=self.round)  # range check

    @property
    def participants(self) -> tuple[int, ...]:
        """The round's clients, sorted."""
        return self.clusterings[0].members

    @property
    def reclusterings(self) -> int:
        """R, the number of clusterings."""
        return len(self.clusterings)

    @cached_property
    def _hash(self) -> int:
        return hash((self.round, self.clusterings, self.atoms))

    def __hash__(self) -> int:
        # Hashed once: the plan is immutable, and every client of an in-process round looks
        # its audit up by the plan (hashing 10^4 clients' plan for each of them was O(n^2)).
        return self._hash

    @cached_property
    def _digest(self) -> bytes:
        h = hashlib.sha256(PLAN_TAG)
        h.update(struct.pack(">IQI", PROTOCOL_VERSION, self.round, self.reclusterings))
        for clustering in self.clusterings:
            h.update(struct.pack(">I", len(clustering)))
            for cluster in clustering.clusters:
                h.update(struct.pack(f">I{len(cluster)}Q", len(cluster), *cluster))
        self._hash_atoms(h)
        return h.digest()

    def _hash_atoms(self, h: hashlib._Hash) -> None:
        if self.atoms is not None:
            h.update(ATOMS_TAG)
            h.update(struct.pack(">I", len(self.atoms)))
            for atom in self.atoms.clusters:
                h.update(struct.pack(f">I{len(atom)}Q", len(atom), *atom))

    def digest(self) -> bytes:
        """SHA-256 over a canonical encoding: tag, protocol version, round, R, then per
        clustering its number of clusters and per cluster its size and sorted member ids;
        with atoms, then the atoms' tag, their number and each atom as a cluster (a plan
        without atoms hashes as before atoms existed)."""
        return self._digest

    @cached_property
    def _clusterings_digest(self) -> bytes:
        h = hashlib.sha256(CLUSTERINGS_TAG)
        h.update(struct.pack(">II", PROTOCOL_VERSION, self.reclusterings))
        for clustering in self.clusterings:
            h.update(struct.pack(">I", len(clustering)))
            for cluster in clustering.clusters:
                h.update(struct.pack(f">I{len(cluster)}Q", len(cluster), *cluster))
        self._hash_atoms(h)
        return h.digest()

    def clusterings_digest(self) -> bytes:
        """SHA-256 over the clusterings alone (tag, protocol version, R, then each
        clustering and the atoms as in :meth:`digest`), without the round number: two
        plans have the same clusterings digest exactly when they put the same participants
        in the same clusters at the same positions (reclustering, cluster) over the same
        atoms. A client's memory
        (:mod:`sharefl.protocol.memory`) keys what it contributed on one model by it."""
        return self._clusterings_digest

    def context(self, reclustering: int, cluster: int) -> KeyContext:
        """The key context of one cluster of this plan (the plan digest bound in)."""
        return KeyContext(
            round=self.round, reclustering=reclustering, cluster=cluster, plan=self.digest()
        )

    def members(self, reclustering: int, cluster: int) -> tuple[int, ...]:
        """The planned members of a cluster; raises IndexError if it is not in the plan."""
        return self.clusterings[reclustering].clusters[cluster]

    def rows(
        self, released: Mapping[tuple[int, int], frozenset[int]] | None = None
    ) -> list[frozenset[int]]:
        """The member sets of every planned sum, with those in ``released`` ((reclustering,
        cluster) → the members whose sum was released) replaced as they were (empty sums
        left out): what a party that saw those releases must assume the server holds."""
        released = released or {}
        return [
            row
            for r, clustering in enumerate(self.clusterings)
            for k, cluster in enumerate(clustering.clusters)
            if (row := released.get((r, k), frozenset(cluster)))
        ]
