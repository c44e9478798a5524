"""Which clusters SHARE uses in each round, and what the server could solve for.

``secure_aggregation.clustering``:

- ``"random"`` (the paper's Algorithm 1): fresh clusterings every round;
- ``"fixed"`` (Figure 9's baseline, "clusters are drawn once before training"): **one**
  uniform random partition of the participants into clusters of m, drawn in round 1 and
  used in every round. Needs ``reclusterings = 1`` (the config refuses more): reusing one
  partition R times adds no equation and no mixture, so R > 1 could only mean the variant
  below;
- ``"fixed_plan"``: the round-1 *plan* of R clusterings reused in every round, drawn as
  the protocol plans a round (:func:`~sharefl.protocol.coordinator.plan_round`: every key
  of the run's settings, ``colluders`` included, reaches the planner). With R > 1 this
  still reclusters R times per round (with the safe planner: R partitions inside fixed
  blocks of 2m), so it is not the paper's fixed baseline; it is
  what ``"fixed"`` meant before ``"fixed"`` became one clustering, and
  :attr:`~sharefl.simulator.config.RunConfig.run_id` hashes it as ``"fixed"`` so that the
  runs recorded under that name keep their ids.

Both fixed variants need the same participants every round (``clients.per_round = 0``).

``secure_aggregation.planner`` (R > 1 reclusterings of the same updates):

- ``"safe"``: :func:`~sharefl.protocol.sample_safe_reclusterings`, R clusterings whose sums
  together reveal no update and no sum of fewer than ``min_sum_size`` clients;
- ``"random"``: R independent uniform partitions, as in the paper. For n = 60, m = 3 they
  reach full rank from R = 4, so every update is recoverable: the protocol's release check
  refuses such a plan unless ``secure_aggregation.allow_leakage = true``.

``secure_aggregation.atoms = true`` (a variant: simulations keep the paper's per-client
reclustering by default): the participants are partitioned once, in round 1, into atoms of
``atom_size`` (:mod:`sharefl.protocol.atoms`), and every clustering of every round groups
whole atoms (:meth:`ClusterSchedule.round_atoms`); a fixed schedule fixes such a grouping.
Atoms need the same participants every round (``clients.per_round = 0``).

Every round's plan is audited by the protocol (:func:`~sharefl.protocol.audit`) before
anything is released; :class:`AuditLog` keeps the verdicts for the run's results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sharefl.protocol import Clustering, LeakageReport
from sharefl.protocol.atoms import form_atoms
from sharefl.protocol.coordinator import plan_round
from sharefl.simulator.config import SecureAggregationConfig, SimulationConfigError


@dataclass
class ClusterSchedule:
    """The clusterings of every round (module docstring).

    Attributes:
        settings: the run's ``[secure_aggregation]``; its keys alone decide the plan.
        min_sum_size: ``None``, or ``settings.min_sum_size`` again (kept for callers that
            pass it; another value raises :class:`SimulationConfigError`, since the plan
            and every audit use the settings' one).
        fixed: the clusterings drawn in round 1 when ``clustering`` is ``"fixed"`` (one)
            or ``"fixed_plan"`` (R).
        atoms: the run's atoms, formed in round 1 when the settings ask for atoms.
    """

    settings: SecureAggregationConfig
    min_sum_size: int | None = None
    fixed: list[Clustering] | None = None
    atoms: Clustering | None = None

    def __post_init__(self) -> None:
        if self.min_sum_size not in (None, self.settings.min_sum_size):
            raise SimulationConfigError(
                f"ClusterSchedule(min_sum_size={self.min_sum_size}) differs from "
                f"secure_aggregation.min_sum_size = {self.settings.min_sum_size}: set the "
                "key in the settings and leave min_sum_size out"
            )

    def round_atoms(
        self, participants: Sequence[int], rng: np.random.Generator
    ) -> Clustering | None:
        """The atoms of this round's participants (``None`` without atoms): formed at
        random in the first round (atoms of ``atom_size`` to ``2·atom_size − 1``), the same
        in every later one. Raises :class:`SimulationConfigError` if the participants
        change or are fewer than one atom."""
        if not self.settings.atoms_on(deployment=False):
            return None
        ids = sorted(participants)
        if self.atoms is None:
            atoms, left = form_atoms(ids, self.settings.resolved_atom_size, rng)
            if left:
                raise SimulationConfigError(
                    f"{len(ids)} participants are fewer than one atom of "
                    f"{self.settings.resolved_atom_size}: use more clients or atoms = false"
                )
            self.atoms = atoms
        elif sorted(self.atoms.members) != ids:
            raise SimulationConfigError(
                "secure_aggregation.atoms needs the same participants every round: set "
                "clients.per_round = 0"
            )
        return self.atoms

    def clusterings(
        self, participants: Sequence[int], rng: np.random.Generator
    ) -> list[Clustering] | None:
        """The round's explicit clusterings, or ``None``: let the protocol's planner draw
        them (``clustering = "random"``). Every round of a fixed schedule gets the same list
        (``"fixed"``: of one clustering). Raises :class:`SimulationConfigError` if the
        participants change between rounds of a fixed schedule."""
        if self.settings.clustering == "random":
            return None
        ids = sorted(participants)
        if self.fixed is None:
            self.fixed = self._draw(ids, rng)
        elif sorted(self.fixed[0].members) != ids:
            raise SimulationConfigError(
                f'secure_aggregation.clustering = "{self.settings.clustering}" needs the same '
                "participants every round: set clients.per_round = 0"
            )
        return self.fixed

    def _draw(self, ids: list[int], rng: np.random.Generator) -> list[Clustering]:
        """Round 1's clusterings, drawn as the protocol plans a round
        (:func:`~sharefl.protocol.coordinator.plan_round` with the run's settings: the
        planner, ``min_sum_size`` and ``colluders``, the signed mode's default colluders
        included, so the safe planner's plan resists the colluders every round's audit
        counts) and audited once here. ``"fixed"`` is its R = 1 case: one uniform random
        partition. Raises the protocol's :class:`~sharefl.protocol.errors.LeakageError`
        (a leaking plan without ``allow_leakage``) or
        :class:`~sharefl.protocol.errors.ConfigurationError` (no plan can be drawn), as
        the round's own audit would."""
        plan, _ = plan_round(0, ids, self.settings.as_settings(), rng, atom_partition=self.atoms)
        return list(plan.clusterings)


@dataclass
class AuditLog:
    """The protocol's audit verdict of every round's plan."""

    rounds: int = 0
    leaking_rounds: int = 0
    incomplete_rounds: int = 0
    max_recoverable: int = 0
    min_nullity: int | None = None
    first_leak: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def record(self, report: LeakageReport) -> dict[str, Any]:
        """Add one round's audit; returns its JSON-ready verdict."""
        verdict = {
            "leaks": report.leaks,
            "rank": report.rank,
            "nullity": report.nullity,
            "recoverable_clients": len(report.recoverable_clients),
            "recoverable_small_sums": len(report.recoverable_small_sums),
            "complete": report.complete,
        }
        self.rounds += 1
        self.leaking_rounds += int(report.leaks)
        self.incomplete_rounds += int(not report.complete)
        self.max_recoverable = max(self.max_recoverable, len(report.recoverable_clients))
        self.min_nullity = (
            report.nullity if self.min_nullity is None else min(self.min_nullity, report.nullity)
        )
        if report.leaks and self.first_leak is None:
            self.first_leak = report.summary()
        return verdict

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the run's verdict (``"leaks"`` if any round's plan leaked)."""
        if self.rounds == 0:
            return {"verdict": "not audited (no clusters)"}
        return {
            "verdict": "leaks" if self.leaking_rounds else "no leak found",
            "rounds": self.rounds,
            "leaking_rounds": self.leaking_rounds,
            "incomplete_rounds": self.incomplete_rounds,
            "max_recoverable_clients": self.max_recoverable,
            "min_nullity": self.min_nullity,
            "first_leak": self.first_leak,
        }
