"""Atoms (sharefl.protocol.atoms): the planner, the server's drop-out rule, each client's
checks A1–A4 and its budget, and the multi-round property against an exact oracle.

The oracle here is independent of the protocol's audit: the rows the server holds after
several rounds are indicator vectors over client ids, and a set S of clients has a
determined sum iff 1_S lies in their row space over the rationals (exact elimination with
``fractions``)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.protocol import secure_sum
from sharefl.protocol.atoms import (
    atom_floor,
    chunk_atoms,
    complete_atoms,
    form_atoms,
    group_atoms,
    is_union_of_atoms,
    whole_atoms,
)
from sharefl.protocol.budget import ORDERS, PrivacyCharge, epsilon
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.coordinator import plan_round
from sharefl.protocol.errors import AtomRefused, BudgetExhausted, ConfigurationError
from sharefl.protocol.memory import ClientMemory, Limits
from sharefl.protocol.messages import UnmaskRequest
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.settings import SecureAggregationSettings, SettingsError

MODEL = b"m" * 32


# --- the oracle ---------------------------------------------------------------------------


def in_row_space(rows: list[frozenset[int]], target: frozenset[int], ids: list[int]) -> bool:
    """Whether the indicator of ``target`` is a rational combination of the ``rows``."""
    column = {c: j for j, c in enumerate(ids)}

    def vector(row: frozenset[int]) -> list[Fraction]:
        v = [Fraction(0)] * len(ids)
        for c in row:
            v[column[c]] = Fraction(1)
        return v

    basis: list[list[Fraction]] = []
    pivots: list[int] = []

    def reduce(v: list[Fraction]) -> list[Fraction]:
        for b, p in zip(basis, pivots, strict=True):
            if v[p] != 0:
                f = v[p] / b[p]
                v = [x - f * y for x, y in zip(v, b, strict=True)]
        return v

    for row in rows:
        v = reduce(vector(row))
        nz = next((j for j, x in enumerate(v) if x != 0), None)
        if nz is not None:
            basis.append(v)
            pivots.append(nz)
    return not any(reduce(vector(target)))


def small_sums_determined(rows: list[frozenset[int]], ids: list[int], below: int) -> list:
    return [
        s
        for size in range(1, below)
        for s in map(frozenset, itertools.combinations(ids, size))
        if in_row_space(rows, s, ids)
    ]


# --- the pieces -----------------------------------------------------------------------------


def test_atom_floor_keeps_min_sum_size_honest_members():
    assert atom_floor(3, None, False) == 3
    assert atom_floor(3, None, True) == 3  # ⌈3/3⌉ − 1 = 0 colluders
    assert atom_floor(3, 2, True) == 5
    assert atom_floor(4, None, True) == 5  # 4 − 1 = 3 < 4; 5 − 1 = 4
    with pytest.raises(ConfigurationError):
        atom_floor(1, None, False)


@given(n=st.integers(3, 40), size=st.integers(2, 6), seed=st.integers(0, 2**32))
def test_form_atoms_partitions_into_atoms_of_size_to_twice_size(n, size, seed):
    atoms, left = form_atoms(range(n), size, np.random.default_rng(seed))
    if n < size:
        assert left == tuple(range(n)) and len(atoms) == 0
        return
    assert not left and sorted(atoms.members) == list(range(n))
    assert all(size <= len(a) < 2 * size for a in atoms.clusters)


@given(n=st.integers(3, 40), m=st.integers(2, 12), seed=st.integers(0, 2**32))
def test_group_atoms_makes_clusters_of_whole_atoms(n, m, seed):
    rng = np.random.default_rng(seed)
    atoms, left = form_atoms(range(n), 3, rng)
    if left:
        return
    clustering = group_atoms(atoms.clusters, m, rng)
    assert sorted(clustering.members) == list(range(n))
    assert all(is_union_of_atoms(c, atoms) for c in clustering.clusters)
    largest = max(len(a) for a in atoms.clusters)
    assert max(clustering.sizes) - min(clustering.sizes) <= largest


def test_a_plan_whose_cluster_cuts_an_atom_cannot_be_built_and_atoms_change_the_digest():
    atoms = Clustering(((0, 1, 2), (3, 4, 5)))
    with pytest.raises(ConfigurationError, match="cuts atoms"):
        RoundPlan(0, (Clustering(((0, 1, 3), (2, 4, 5))),), atoms)
    plain = RoundPlan(0, (Clustering(((0, 1, 2), (3, 4, 5))),))
    with_atoms = RoundPlan(0, plain.clusterings, atoms)
    assert plain.digest() != with_atoms.digest()
    assert plain.clusterings_digest() != with_atoms.clusterings_digest()


def test_whole_atoms_drops_every_atom_with_a_member_missing():
    atoms = Clustering(((0, 1, 2), (3, 4, 5), (6, 7, 8)))
    assert whole_atoms([0, 1, 2, 3, 4, 6, 7, 8], atoms) == (0, 1, 2, 6, 7, 8)
    assert whole_atoms([0, 1], None) == (0, 1)


def test_deployment_atoms_are_a_function_of_the_ids_and_stable_under_appends():
    atoms = chunk_atoms(range(10), 3)
    assert atoms.clusters == ((0, 1, 2), (3, 4, 5), (6, 7, 8, 9))
    assert chunk_atoms(reversed(range(10)), 3) == atoms  # the ids, not their order
    grown = chunk_atoms(range(13), 3)
    assert grown.clusters[:3] == ((0, 1, 2), (3, 4, 5), (6, 7, 8))  # only the last re-forms
    assert len(chunk_atoms(range(2), 3)) == 0
    # A member gone (for a round or for good): its atom sits out whole.
    assert complete_atoms(atoms, [0, 1, 2, 3, 4, 6, 7, 8, 9]) == [(0, 1, 2), (6, 7, 8, 9)]


def test_settings_refuse_an_atom_size_below_the_floor():
    with pytest.raises(SettingsError, match="atom_size"):
        SecureAggregationSettings(atoms=True, atom_size=2)
    assert SecureAggregationSettings().atoms_on(deployment=True)
    assert not SecureAggregationSettings().atoms_on(deployment=False)
    assert not SecureAggregationSettings(atoms=False).atoms_on(deployment=True)
    assert not SecureAggregationSettings(cluster_size=1, atoms=True).atoms_on(True)


# --- the server -----------------------------------------------------------------------------


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "unmask"])
def test_a_dropout_costs_its_atom_and_the_sums_stay_exact(stage, signed):
    rng = np.random.default_rng(0)
    ids = list(range(30))
    atoms, _ = form_atoms(ids, 3, rng)
    x = {i: rng.normal(size=5).astype(np.float32) for i in ids}
    s = SecureAggregationSettings(cluster_size=10, reclusterings=2, clip=4.0, signed=signed)
    victim = atoms.clusters[0][0]
    result = secure_sum(x, s, seed=1, atom_partition=atoms, dropouts={stage: [victim]})
    for rec in result.reclusterings:
        assert len(rec.clusters) == len(rec.clusters) + len(rec.failed) - len(rec.failed)
        for c in rec.clusters:
            assert is_union_of_atoms(c.members, atoms)
            assert np.allclose(c.float_sum, sum(x[i] for i in c.members), atol=1e-3)
        released = {i for c in rec.clusters for i in c.members}
        if stage in ("mask", "unmask"):  # the victim masked: its whole atom left
            assert not set(atoms.cluster_of(victim)) & released or stage == "unmask"


def test_plan_round_with_atoms_groups_them_and_refuses_atoms_below_the_floor():
    s = SecureAggregationSettings(cluster_size=6, reclusterings=3)
    atoms = Clustering(((0, 1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11)))
    plan, report = plan_round(0, range(12), s, np.random.default_rng(1), atom_partition=atoms)
    assert plan.atoms == atoms and not report.leaks and report.complete
    assert all(is_union_of_atoms(c, atoms) for k in plan.clusterings for c in k.clusters)
    with pytest.raises(Exception, match="fewer than 3 members"):
        plan_round(
            0, range(4), s, np.random.default_rng(1), atom_partition=Clustering(((0, 1), (2, 3)))
        )


@settings(max_examples=examples(40), deadline=None)
@given(
    seed=st.integers(0, 2**32),
    rounds=st.integers(2, 5),
    m=st.sampled_from([3, 6, 9]),
    dropouts=st.lists(st.integers(0, 11), max_size=3),
)
def test_across_rounds_the_server_learns_nothing_finer_than_atom_sums(seed, rounds, m, dropouts):
    """The property, in process: rounds of secure_sum over one atom partition with fresh
    groupings and drop-outs; with updates constant across rounds, every sum released in any
    round is a row, and no set of fewer than min_sum_size clients has a determined sum."""
    rng = np.random.default_rng(seed)
    ids = list(range(12))
    atoms, _ = form_atoms(ids, 3, rng)
    x = {i: rng.normal(size=3).astype(np.float32) for i in ids}
    s = SecureAggregationSettings(cluster_size=m, reclusterings=2, clip=4.0)
    rows: list[frozenset[int]] = []
    for r in range(rounds):
        stage = ["advertise", "share", "mask", "unmask"][r % 4]
        result = secure_sum(
            x, s, seed=seed + r, round=r, atom_partition=atoms, dropouts={stage: dropouts}
        )
        rows += [frozenset(c.members) for rec in result.reclusterings for c in rec.clusters]
    assert small_sums_determined(rows, ids, 3) == []


def test_without_atoms_fresh_clusterings_over_rounds_determine_updates():
    """The oracle can fail: per-client reclustering over rounds (each plan safe alone)."""
    rng = np.random.default_rng(3)
    ids = list(range(12))
    x = {i: rng.normal(size=3).astype(np.float32) for i in ids}
    s = SecureAggregationSettings(cluster_size=3, clip=4.0)
    rows: list[frozenset[int]] = []
    for r in range(6):
        result = secure_sum(x, s, seed=r, round=r)
        rows += [frozenset(c.members) for c in result.clusters]
    assert small_sums_determined(rows, ids, 3)


# --- the client -----------------------------------------------------------------------------

ATOMS = Clustering(((0, 1, 2), (3, 4, 5), (6, 7, 8)))


def atom_plan(number: int, atoms: Clustering = ATOMS, seed: int = 0) -> RoundPlan:
    clustering = group_atoms(atoms.clusters, 6, np.random.default_rng(seed))
    return RoundPlan(number, (clustering,), atoms)


def test_a_client_that_requires_atoms_refuses_a_plan_without_them():
    plan = RoundPlan(0, (Clustering(((0, 1, 2), (3, 4, 5), (6, 7, 8))),))
    with pytest.raises(AtomRefused, match="requires atoms"):
        ClientRound(0, plan, ClientPolicy(require_atoms=True))
    ClientRound(0, plan, ClientPolicy())  # a client that does not: the exact audit


def test_a1_the_first_roster_is_kept_and_another_is_refused():
    memory = ClientMemory(server=b"s")
    guard = ClientRound(0, atom_plan(0), memory=memory, run=b"a", model_digest=MODEL)
    memory.record_round(b"a", 0, MODEL, guard.clusterings, **guard._memory_terms())
    assert memory.atom() == (0, 1, 2)
    moved = Clustering(((0, 1, 2, 3), (4, 5, 6), (7, 8)))
    with pytest.raises(AtomRefused, match="never re-formed"):
        ClientRound(0, atom_plan(1, moved), memory=memory, run=b"a", model_digest=MODEL)
    with pytest.raises(AtomRefused, match="has no atoms"):
        ClientRound(0, RoundPlan(1, (ATOMS,)), memory=memory, run=b"b", model_digest=MODEL)
    # A new run id, the same model, round 0 again: harmless with atoms (nothing finer than
    # atom sums), so accepted.
    ClientRound(0, atom_plan(0, seed=5), memory=memory, run=b"new run", model_digest=MODEL)


def test_a2_an_atom_below_the_floor_is_refused():
    small = Clustering(((0, 1), (2, 3, 4, 5), (6, 7, 8)))
    plan = RoundPlan(0, (Clustering(((0, 1, 2, 3, 4, 5), (6, 7, 8))),), small)
    with pytest.raises(AtomRefused, match="at least 3"):
        ClientRound(0, plan)
    with pytest.raises(AtomRefused, match="at least 4"):
        ClientRound(6, plan, ClientPolicy(colluders=1))  # 3 − 1 colluder < 3
    ClientRound(2, plan, ClientPolicy(colluders=1))  # 4 − 1 = 3: enough


def test_a4_survivors_that_cut_an_atom_are_refused():
    plan = RoundPlan(0, (Clustering(((0, 1, 2, 3, 4, 5), (6, 7, 8))),), ATOMS)
    guards = {u: ClientRound(u, plan) for u in range(6)}
    from sharefl.protocol.assignment import plan_assignment

    assignment = plan_assignment(plan.context(0, 0), plan.members(0, 0), length=2, bits=32)
    sessions = {u: guards[u].session(assignment, np.zeros(2, np.uint32)) for u in range(6)}
    cut = UnmaskRequest(plan.context(0, 0), (0, 1, 2, 3, 4), (5,), {})
    with pytest.raises(AtomRefused, match="cut atoms"):
        guards[0].check_release(sessions[0], cut)
    whole = UnmaskRequest(plan.context(0, 0), (0, 1, 2), (3, 4, 5), {})
    guards[0].check_release(sessions[0], whole)


# --- the budget -----------------------------------------------------------------------------


def test_max_rounds_counts_rounds_whatever_the_run_id():
    memory = ClientMemory(server=b"s")
    policy = ClientPolicy(max_rounds=2)
    for run in (b"a", b"b"):
        guard = ClientRound(0, atom_plan(0), policy, memory=memory, run=run, model_digest=MODEL)
        memory.record_round(run, 0, MODEL, guard.clusterings, **guard._memory_terms())
    assert memory.joined() == 2
    with pytest.raises(BudgetExhausted, match="max_rounds = 2"):
        ClientRound(0, atom_plan(7), policy, memory=memory, run=b"c", model_digest=MODEL)


def test_max_epsilon_refuses_the_round_that_would_exceed_it():
    charge = PrivacyCharge(tuple(a / (2 * 1.0**2) for a in ORDERS))  # Gaussian, σ = 1
    two = epsilon(tuple(2 * v for v in charge.rdp), 1e-5)  # RDP adds up, ε does not
    memory = ClientMemory(server=b"s")
    policy = ClientPolicy(max_epsilon=two * 1.001)
    limits = Limits(None, policy.max_epsilon, policy.budget_delta)
    for r in range(2):
        memory.record_round(b"a", r, MODEL, b"c" * 32, atom=(0, 1, 2), limits=limits, charge=charge)
    assert memory.epsilon(1e-5) == pytest.approx(two)
    with pytest.raises(BudgetExhausted, match="max_epsilon"):
        ClientRound(
            0, atom_plan(5), policy, memory=memory, run=b"a", model_digest=MODEL, charge=charge
        )
    with pytest.raises(BudgetExhausted, match="privacy cost is unknown"):
        ClientRound(0, atom_plan(5), policy, memory=ClientMemory(), run=b"a", model_digest=MODEL)


def test_the_budget_survives_a_restart(tmp_path):
    path = tmp_path / "client-0.json"
    charge = PrivacyCharge((0.5,) * len(ORDERS))
    ClientMemory(path, server=b"s").record_round(
        b"a", 0, MODEL, b"c" * 32, atom=(0, 1, 2), charge=charge
    )
    again = ClientMemory(path, server=b"s")
    assert again.joined() == 1 and again.atom() == (0, 1, 2)
    assert again.epsilon(1e-5) == pytest.approx(epsilon(charge.rdp, 1e-5))
