"""Atoms inside Flower, the default of both sides: ``ShareflWorkflow`` plans complete atoms
(its directory's ids cut in order, the same atoms in every Flower run) and ``sharefl_mod`` /
``policy_from_node_config`` clients require them, keep them in a memory that outlives the
run (signed: a persistent state folder by default), and keep their own budget.

The attack of the issue this answers: twelve Flower runs on the same initial model, each a
new run (fresh Contexts, a new run id) under new clusterings. With per-client clusters and
a Context-held memory every update was recoverable; with atoms every run is accepted and,
over everything released in all twelve runs, exact linear algebra finds no sum of fewer
than three clients (updates are the same in every run: a deterministic trainer on one
model). A run that re-forms the atoms is refused by every client.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_atoms import small_sums_determined
from test_flower import (
    DIRECTORY,
    IDENTITIES,
    NODES,
    SHAPES,
    FakeGrid,
    play,
    trainer,
    updates_for,
)

from sharefl.integrations.flower import ShareflWorkflow, make_sharefl_mod, sharefl_mod
from sharefl.protocol.atoms import chunk_atoms, is_union_of_atoms
from sharefl.protocol.client import ClientPolicy

RUNS = 12


@pytest.fixture(autouse=True)
def _task(flower_task_identity):
    """Messages are stamped with a run id, as Flower's runtime does (set per run below)."""


def new_run(run: int) -> None:
    """What a new Flower run looks like to the messages: another run id."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity._run_id = run


def signed_grid(run: int, updates, **policy) -> FakeGrid:
    """A new Flower run: fresh Contexts and run id; client i on node ``NODES[i]`` with its
    identity (the signed default: its memory in the persistent state folder)."""
    mods = {
        nid: make_sharefl_mod(
            ClientPolicy(
                identity=IDENTITIES[i],
                directory=DIRECTORY,
                require_signed=True,
                require_atoms=True,
                **policy,
            )
        )
        for i, nid in enumerate(NODES)
    }
    new_run(run)
    grid = FakeGrid({nid: trainer(*updates[nid]) for nid in NODES}, mods=mods)
    grid.run_id = run
    for context in grid.contexts.values():
        context.run_id = run
    return grid


def signed_workflow(seed: int, **settings) -> ShareflWorkflow:
    return ShareflWorkflow(
        cluster_size=5, clip=1.0, seed=seed, signed=True, directory=DIRECTORY, **settings
    )


def test_twelve_flower_runs_on_one_model_release_nothing_finer_than_atom_sums():
    updates = updates_for(NODES, seed=40)
    initial = [np.zeros(s, np.float32) for s in SHAPES]
    atoms = chunk_atoms(range(len(NODES)), 3)
    rows, groupings = [], set()
    for run in range(1, RUNS + 1):
        workflow = signed_workflow(seed=run)
        grid = signed_grid(run, updates)
        play(workflow, grid, initial, 1)  # round 1 of a new run, the same initial model
        result = workflow.last_result
        assert not grid.errors and result.plan.atoms == atoms, grid.errors
        assert all(is_union_of_atoms(c.members, atoms) for c in result.clusters)
        rows += [frozenset(c.members) for c in result.clusters]
        groupings.add(result.plan.clusterings)
    assert len(groupings) > 1  # the runs really drew different clusterings
    assert small_sums_determined(rows, list(range(len(NODES))), 3) == []
    # A thirteenth run that re-forms the atoms gets an error reply from every client.
    hostile = signed_workflow(seed=99, atom_size=4, max_empty_rounds=None)
    grid = signed_grid(RUNS + 1, updates)
    play(hostile, grid, initial, 1)
    assert set(grid.errors) == set(NODES)
    assert all("AtomRefused" in e[-1] for e in grid.errors.values()), grid.errors
    assert hostile.last_update is None


def test_the_default_mod_refuses_a_workflow_without_atoms_and_completes_with_them():
    updates = updates_for(NODES, seed=41)
    initial = [np.zeros(s, np.float32) for s in SHAPES]
    apps = {nid: trainer(*updates[nid]) for nid in NODES}
    grid = FakeGrid(apps, mods=dict.fromkeys(NODES, sharefl_mod))
    play(ShareflWorkflow(cluster_size=5, clip=1.0, seed=1, atoms=False), grid, initial, 1)
    assert set(grid.errors) == set(NODES)
    assert all("requires atoms" in e[-1] for e in grid.errors.values())
    grid = FakeGrid(apps, mods=dict.fromkeys(NODES, sharefl_mod))
    workflow = ShareflWorkflow(cluster_size=5, clip=1.0, seed=1)
    new = play(workflow, grid, initial, 1)
    assert not grid.errors and workflow.last_result.plan.atoms is not None
    # Unsigned: atoms over the node ids of the round, every client in a released sum.
    summed = {m for c in workflow.last_result.clusters for m in c.members}
    assert summed == set(NODES)
    mean = [sum(updates[n][0][k] * updates[n][1] for n in NODES) for k in range(len(SHAPES))]
    total = sum(updates[n][1] for n in NODES)
    for got, want in zip(new, mean, strict=True):
        np.testing.assert_allclose(got, want / total, atol=1e-4)


def test_a_flower_client_refuses_rounds_past_its_own_budget():
    """``ClientPolicy(max_rounds=2)`` in the mod: the client counts the rounds it joins in
    its persistent memory, whatever the run, and refuses the third before any key leaves."""
    updates = updates_for(NODES, seed=42)
    arrays = [np.zeros(s, np.float32) for s in SHAPES]
    for run in (1, 2):  # two Flower runs, one round each
        grid = signed_grid(run, updates, max_rounds=2)
        play(signed_workflow(seed=run), grid, arrays, 1)
        assert not grid.errors
    grid = signed_grid(3, updates, max_rounds=2)
    workflow = signed_workflow(seed=3, max_empty_rounds=None)
    play(workflow, grid, arrays, 1)
    assert set(grid.errors) == set(NODES)
    assert all(
        "BudgetExhausted" in e[-1] and "max_rounds = 2" in e[-1] for e in grid.errors.values()
    )
    assert workflow.last_update is None
