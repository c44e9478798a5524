"""Plan reuse per model: the clusterings a server commits on one model, the sums released
on it, and the round coordinator built over them.

Why reuse (docs/security.md, "Across rounds"): two rounds on the same model under
different clusterings would give the server two sets of sums of the *same* updates, whose
differences can isolate one client. A client's memory (invariant I4,
:mod:`sharefl.protocol.memory`) refuses a second plan on a model it has seen; the server
side keeps to it on its own view: while the model stays unchanged (a round that released
nothing, a restart), every round reuses the first plan's clusterings and participants, and
the release audit of each round covers every sum released on that model so far
(:class:`~sharefl.protocol.coordinator.ReleaseAuditor`'s prior). With atoms
(``atom_partition``) any grouping of whole atoms is safe on any model, so nothing is
reused: a cluster that failed, or a client that left, does not stall the run.

The gRPC server (:mod:`sharefl.deploy.run`, which journals plans and releases so that a
restart resumes them) and the Flower workflow
(:mod:`sharefl.integrations.flower.workflow`) both build their round coordinators here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sharefl.protocol.clustering import Clustering
from sharefl.protocol.coordinator import Release, RoundCoordinator
from sharefl.protocol.keys import KeyAdvert
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.settings import SecureAggregationSettings


@dataclass
class ModelPlan:
    """What a server committed and released on one model.

    Attributes:
        model: the model's id (hex :func:`~sharefl.protocol.memory.model_digest` of what
            the clients received, or the transport's digest of its arrays).
        clusterings: the clusterings every round on this model uses (the first plan's).
        releases: every sum approved on it so far (``sum`` left ``None``: the audit needs
            the members and positions only), across rounds and restarts.
    """

    model: str
    clusterings: tuple[Clustering, ...]
    releases: list[Release] = field(default_factory=list)

    @property
    def participants(self) -> list[int]:
        """The clients of the plan (every clustering holds the same ones), ascending."""
        return list(self.clusterings[0].members)


OnPlan = Callable[[str, RoundPlan], None]
"""Called with ``(model id, plan)`` once a round's plan is drawn or reused, before any
client sees it (a journal persists it there)."""
OnRelease = Callable[[str, Release], None]
"""Called with ``(model id, release)`` at each approval and each computed sum, before the
coordinator acts on it (a journal persists it there: the unmask request waits for it)."""


class ModelPlans:
    """The plan of the model the last round ran on, reused while the model stays.

    ``current`` seeds it (a resumed run's journal; copied, so the caller's record is not
    appended to). ``on_plan`` and ``on_release`` are the journal's hooks (see :data:`OnPlan`,
    :data:`OnRelease`).
    """

    def __init__(
        self,
        current: ModelPlan | None = None,
        *,
        on_plan: OnPlan | None = None,
        on_release: OnRelease | None = None,
    ) -> None:
        self.current = (
            None
            if current is None
            else ModelPlan(current.model, current.clusterings, list(current.releases))
        )
        self._on_plan = on_plan
        self._on_release = on_release

    def reusable(self, model: str, *, atoms: bool = False) -> ModelPlan | None:
        """The plan a round on ``model`` must reuse: :attr:`current` when it was drawn on
        ``model``, else ``None`` (a new plan is drawn); always ``None`` with ``atoms``."""
        if atoms or self.current is None or self.current.model != model:
            return None
        return self.current

    def coordinator(
        self,
        settings: SecureAggregationSettings,
        *,
        model: str,
        reuse: ModelPlan | None,
        round: int,
        participants: Sequence[int],
        length: int,
        rng: np.random.Generator,
        directory: Mapping[int, bytes] | None = None,
        atom_partition: Clustering | None = None,
        keys: Mapping[int, KeyAdvert] | None = None,
    ) -> RoundCoordinator:
        """The round's :class:`~sharefl.protocol.coordinator.RoundCoordinator` over
        ``model``: with ``reuse`` (what :meth:`reusable` returned) its clusterings and its
        releases as the audit's prior; without, a new plan over ``participants``, which
        becomes :attr:`current`. The plan goes to ``on_plan``; each approval to
        ``on_release`` and then (its sum dropped) to the current plan's releases.

        Raises what the coordinator raises (``ConfigurationError``, ``LeakageError``: no
        safe plan over these participants); :attr:`current` is then unchanged.
        """

        def released(release: Release) -> None:
            if self._on_release is not None:
                self._on_release(model, release)
            if release.sum is None and self.current is not None:
                self.current.releases.append(release)

        rc = RoundCoordinator(
            settings,
            round=round,
            participants=participants,
            length=length,
            rng=rng,
            directory=directory,
            clusterings=reuse.clusterings if reuse is not None else None,
            prior_releases=list(reuse.releases) if reuse is not None else (),
            on_release=released,
            atom_partition=atom_partition,
            keys=keys,
        )
        if reuse is None:
            self.current = ModelPlan(model, tuple(rc.plan.clusterings))
        if self._on_plan is not None:
            self._on_plan(model, rc.plan)
        return rc
