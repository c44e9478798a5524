"""Across runs, against real ``sharefl client --keys`` processes (mutual TLS, signed mode,
state in the keys folder, atoms required by default): a server double sends "round 0"
under a new run id each time, the model moved by one ulp each time (for the clients, a new
model every time), with four plans:

1. atoms {0, 1, 2}, {3, 4, 5} in one cluster of six — the first contact: accepted, and the
   roster is remembered;
2. the same atoms, two clusters — accepted: its sums are atom sums;
3. atoms re-formed ({0, 1, 3}, {2, 4, 5}) — refused by every client (A1);
4. no atoms (the earlier leak: four plans on near-equal models) — refused by every client.

Then a restarted set of client processes (same state folder) still refuses plan 3. The
verdict is checked twice: every client refuses what it must, and, over every cluster that
received masked inputs in any round, exact linear algebra finds no set of fewer than three
clients whose sum is determined (updates modelled as constant across the runs).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S, keyed_client
from test_atoms import small_sums_determined
from test_malicious_server import (
    CLIENTS,
    DIM,
    ENCODING,
    assign,
    finish_run,
    serve_double,
    start_round,
)

from sharefl.deploy import wire
from sharefl.deploy.keygen import keygen
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.plan import RoundPlan

ATOMS = Clustering(((0, 1, 2), (3, 4, 5)))
REFORMED = Clustering(((0, 1, 3), (2, 4, 5)))
PLANS = {
    "first contact": RoundPlan(0, (Clustering((CLIENTS,)),), ATOMS),
    "same atoms, new grouping": RoundPlan(0, (ATOMS,), ATOMS),
    "atoms re-formed": RoundPlan(0, (REFORMED,), REFORMED),
    "no atoms": RoundPlan(0, (Clustering(((0, 1, 2), (3, 4, 5))),)),
}


def ulp_model(steps: int) -> np.ndarray:
    """The initial model moved by ``steps`` ulp in every coordinate."""
    model = np.full(DIM, 0.5, dtype=np.float32)
    for _ in range(steps):
        model = np.nextafter(model, np.float32(1))
    return model


async def _play(double, plans: dict[str, RoundPlan], first_step: int) -> dict[str, dict]:
    await asyncio.wait_for(double.connected.wait(), HANG_S)
    seen: dict[str, dict[int, list[pb.ClientMessage]]] = {}
    for step, (name, plan) in enumerate(plans.items(), first_step):
        start_round(double, 0, ulp_model(step), plan, os.urandom(16))  # a new run id
        for k, members in enumerate(plan.clusterings[0].clusters):
            a = wire.assignment_to_proto(assign(plan, 0, k), ENCODING)
            for cid in members:
                double.links[cid].outbox.put_nowait(pb.ServerMessage(assignment=a))
        replies = {}
        for cid in CLIENTS:
            replies[cid] = [await asyncio.wait_for(double.links[cid].inbox.get(), HANG_S)]
        seen[name] = replies
        for cid in CLIENTS:
            double.links[cid].outbox.put_nowait(pb.ServerMessage(round_end=pb.RoundEnd(round=0)))
    finish_run(double, ulp_model(0))
    return seen


def _session(keys: Path, plans: dict[str, RoundPlan], first_step: int) -> dict[str, dict]:
    async def main():
        server, double, address = await serve_double(keys)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                keyed_client(address, c, keys), stderr=subprocess.PIPE, text=True, env=env
            )
            for c in CLIENTS
        ]
        try:
            seen = await _play(double, plans, first_step)
            await asyncio.wait_for(double.ended.wait(), HANG_S)  # the Finished messages are out
        finally:
            await server.stop(grace=2.0)
        for proc in procs:
            try:
                proc.communicate(timeout=HANG_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
        return seen

    return asyncio.run(main())


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    keys = keygen(tmp_path_factory.mktemp("atoms") / "keys", CLIENTS)
    first = _session(keys, PLANS, 0)
    again = _session(keys, {"atoms re-formed after a restart": PLANS["atoms re-formed"]}, 10)
    return {**first, **again}, keys


def _kind(message: pb.ClientMessage) -> str:
    return message.WhichOneof("body")


def test_plans_of_the_remembered_atoms_are_accepted_under_new_run_ids(played):
    seen, _ = played
    for name in ("first contact", "same atoms, new grouping"):
        assert all(_kind(seen[name][c][0]) == "advertise" for c in CLIENTS), seen[name]


@pytest.mark.parametrize("name", ["atoms re-formed", "no atoms", "atoms re-formed after a restart"])
def test_re_formed_atoms_and_plans_without_atoms_are_refused_by_every_client(played, name):
    seen, _ = played
    for cid in CLIENTS:
        (reply,) = seen[name][cid]
        assert _kind(reply) == "refusal", (name, cid, reply)
        assert reply.refusal.reason.startswith("AtomRefused"), reply.refusal.reason


def test_nothing_finer_than_atom_sums_is_determined_across_the_runs(played):
    """The oracle: every cluster any client sent keys for, in any run, is a row; with updates
    constant across the runs, no sum of fewer than 3 clients is in their span."""
    seen, keys = played
    rows = []
    for name, plan in PLANS.items():
        for cluster in plan.clusterings[0].clusters:
            if all(_kind(seen[name][c][0]) == "advertise" for c in cluster):
                rows.append(frozenset(cluster))
    assert len(rows) == 3
    assert small_sums_determined(rows, list(CLIENTS), 3) == []
    memory = (keys / "memory" / "client-0.json").read_text()
    assert '"atom":[0,1,2]' in memory


def test_an_unsigned_client_that_requires_atoms_refuses_a_round_without_a_plan():
    """Without a plan nothing could be checked (a plaintext client trusts the server with
    the key exchange, not with its atom): the round is refused before any key leaves."""
    from sharefl.deploy.client import RoundGuard
    from sharefl.protocol.client import ClientPolicy

    refused = RoundGuard.start(0, pb.RoundStart(round=4), ClientPolicy(require_atoms=True))
    assert refused.refusal is not None and "requires atoms" in str(refused.refusal)
    assert RoundGuard.start(0, pb.RoundStart(round=4), ClientPolicy()).refusal is None
