"""Plan reuse per model (`sharefl.rounds.model_plans`), the one place the gRPC server and
the Flower workflow build their round coordinators: a model keeps its first plan and the
sums released on it; a new model, or atoms, get a new plan; the journal's hooks see every
plan and release before the round acts on it."""

from __future__ import annotations

import numpy as np
import pytest

from sharefl.protocol import ClientPolicy, ClientSession, RoundCoordinator
from sharefl.protocol.drive import server_exchanges
from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.messages import ClusterAssignment
from sharefl.protocol.settings import SecureAggregationSettings
from sharefl.rounds.model_plans import ModelPlan, ModelPlans
from sharefl.rounds.released import Released

LENGTH = 3
SETTINGS = SecureAggregationSettings(cluster_size=3, reclusterings=2)


def _round(
    plans: ModelPlans, model: str, round: int, participants=range(9), *, seed: int = 0
) -> RoundCoordinator:
    return plans.coordinator(
        SETTINGS,
        model=model,
        reuse=plans.reusable(model),
        round=round,
        participants=list(participants),
        length=LENGTH,
        rng=np.random.default_rng(seed),
    )


def _play(rc: RoundCoordinator, silent: frozenset[int] = frozenset()) -> Released:
    """Drive ``rc`` with honest clients in this process (those in ``silent`` never
    answer); the round's released sums."""
    sessions: dict[int, ClientSession] = {}
    for outgoing in server_exchanges(rc):
        for cid, message in outgoing.messages.items():
            if cid in silent:
                continue
            if outgoing.opening:
                assert isinstance(message, ClusterAssignment)
                vector = np.full(LENGTH, cid + 1, dtype=np.uint32)
                sessions[cid] = ClientSession(cid, message, vector, ClientPolicy())
                reply = sessions[cid].advertise()
            else:
                reply = sessions[cid].handle(message)
            rc.receive(cid, reply)
    return Released.from_reclusterings(rc.result().reclusterings, lambda s: s.ring_sum)


def test_rounds_on_one_model_reuse_its_plan_and_audit_with_what_was_released_on_it():
    journal: list[tuple[str, str, object]] = []
    plans = ModelPlans(
        on_plan=lambda model, plan: journal.append(("plan", model, plan)),
        on_release=lambda model, release: journal.append(("release", model, release)),
    )
    first = _round(plans, "a", 0)
    released = _play(first)
    assert released and plans.current is not None and plans.current.model == "a"
    assert plans.current.clusterings == tuple(first.plan.clusterings)
    approvals = [r for kind, _, r in journal if kind == "release" and r.sum is None]
    # every approval is journaled, and kept (without its sum) for the audit of later rounds
    assert plans.current.releases == approvals
    assert len(approvals) == sum(len(m) for m in released.members)
    assert [(kind, model) for kind, model, _ in journal[:1]] == [("plan", "a")]

    second = _round(plans, "a", 1, seed=1)  # another rng: a new plan would differ
    assert second.plan.clusterings == first.plan.clusterings
    assert second.plan.participants == first.plan.participants
    assert journal[len(journal) - 1][:2] == ("plan", "a")
    again = _play(second)
    assert again and len(plans.current.releases) == 2 * len(approvals)

    third = _round(plans, "b", 2, seed=2)
    assert plans.current.model == "b" and plans.current.releases == []
    assert plans.current.clusterings == tuple(third.plan.clusterings)


def test_a_new_model_is_never_held_to_the_old_plan_and_atoms_reuse_nothing():
    plans = ModelPlans(ModelPlan("a", (), []))
    assert plans.reusable("b") is None
    assert plans.reusable("a") is plans.current
    assert plans.reusable("a", atoms=True) is None


def test_a_resumed_record_is_copied_not_appended_to():
    plans = ModelPlans()
    _play(_round(plans, "a", 0))
    assert plans.current is not None
    restored = ModelPlan("a", plans.current.clusterings, list(plans.current.releases))
    before = list(restored.releases)
    resumed = ModelPlans(restored)
    rc = _round(resumed, "a", 1)
    assert rc.plan.clusterings == restored.clusterings
    _play(rc)
    assert restored.releases == before
    assert resumed.current is not None and len(resumed.current.releases) > len(before)


def test_a_round_that_cannot_be_planned_leaves_the_current_plan():
    plans = ModelPlans()
    _round(plans, "a", 0)
    current = plans.current
    with pytest.raises(ConfigurationError):
        _round(plans, "b", 1, participants=[0])
    assert plans.current is current
