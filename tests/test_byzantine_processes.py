"""Byzantine clients against real processes: ``sharefl serve``, honest ``sharefl client``
processes and one attacker per cluster (``tests/byzantine_client.py``, a subclass of the
real client runtime).

Three deployments of 16 clients in clusters of 4 (t = 3), two rounds each, shared by the
tests below: attackers thrown out at the door (low-order key, oversized field, undecodable
bytes mid-round), attackers whose input reaches the unmasking (out-of-range input, false
complaint, wrong seed commitment), and a signed deployment (bad advertisement signature,
equal keys). Round 0's clusters are predicted from the seed so each attacker starts in its
own cluster; every assertion reads the clusters from ``result.json``, so it holds for any
clustering. In every case the server finishes every round, honest clients exit 0, the
sums the server releases hold exactly the honest updates of the clusters it does not flag,
and the culprit is named.

Each round of ``result.json`` carries ``culprits`` (client id -> reason), ``corrupted`` and
``withheld`` (clusters). Secure aggregation hides which member of a cluster sent an
out-of-range input: that cluster is flagged as corrupted. A false complaint costs nobody
anything: the accused stays in the exact sum and nobody is named.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S
from test_grpc_processes import Deployment, clear_sum, write_config

from sharefl.deploy.keygen import keygen
from sharefl.protocol.clustering import as_generator, random_clustering

CLIENTS, CLUSTER, ROUNDS, DIM, SEED = 16, 4, 2, 64, 5
HELPER = Path(__file__).with_name("byzantine_client.py")
ALL_PLANS = ["door", "mid-round", "signed"]


@dataclass(frozen=True)
class Plan:
    """One deployment: the attacks (one per round-0 cluster), signed mode, and for each
    attack that the server rejects at once, the status and words its log line carries."""

    attacks: tuple[str, ...]
    signed: bool = False
    rejected: dict[str, tuple[str, str]] = field(default_factory=dict)


PLANS = {
    "door": Plan(
        ("low-order-key", "oversized-field", "undecodable"),
        rejected={
            "low-order-key": ("FAILED_PRECONDITION", "low-order"),
            "oversized-field": ("INVALID_ARGUMENT", "got 3000000"),
            "undecodable": ("INVALID_ARGUMENT", "undecodable"),
        },
    ),
    "mid-round": Plan(("out-of-range", "false-complaint", "wrong-commitment")),
    "signed": Plan(
        ("bad-signature", "equal-keys"),
        signed=True,
        rejected={
            "bad-signature": ("FAILED_PRECONDITION", "signature does not verify"),
            "equal-keys": ("FAILED_PRECONDITION", "must differ"),
        },
    ),
}


@dataclass
class Outcome:
    status: int
    log: str
    result: dict
    attackers: dict[int, str]
    run: Deployment


_RUNS: dict[str, Outcome] = {}


def _attackers(plan: Plan) -> dict[int, str]:
    """One attacker per cluster of round 0 (the server draws them from the seed)."""
    clusters = random_clustering(range(CLIENTS), CLUSTER, as_generator(SEED)).clusters
    return {cluster[1]: attack for cluster, attack in zip(clusters, plan.attacks, strict=False)}


def _deploy(folder: Path, plan: Plan) -> Outcome:
    # Per-client clusters (atoms off, clients --no-atoms): one attacker per planned cluster
    # of round 0, each attack's effect on its own cluster (test_atoms.py and
    # test_grpc_processes.py cover atoms).
    sa = {
        "cluster_size": CLUSTER,
        "threshold": 3,
        "reproducible_seed": SEED,
        "signed": plan.signed,
        "atoms": False,
    }
    keys_args: list[str] = []
    tls = None
    if plan.signed:
        keys = keygen(folder / "keys", range(CLIENTS))
        keys_args = ["--keys", str(keys)]
        tls = {
            "cert": str(keys / "server.pem"),
            "key": str(keys / "server.key"),
            "directory": str(keys / "directory.json"),
        }
    config = write_config(
        folder, clients=CLIENTS, rounds=ROUNDS, dim=DIM, secure_aggregation=sa, tls=tls
    )
    attackers = _attackers(plan)
    run = Deployment(folder, config, CLIENTS)
    for cid in range(CLIENTS):
        if cid not in attackers:
            run.client(cid, "--retries", "1", "--no-atoms", *keys_args)  # server listening
            continue
        command = [sys.executable, str(HELPER), "--server", run.address, "--id", str(cid)]
        run.procs[cid] = subprocess.Popen(
            [*command, "--attack", attackers[cid], *keys_args],
            stderr=subprocess.PIPE,
            text=True,
        )
    status, log = run.finish()
    result = run.result() if status == 0 else {}
    return Outcome(status, log, result, attackers, run)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    def get(name: str) -> Outcome:
        if name not in _RUNS:
            _RUNS[name] = _deploy(tmp_path_factory.mktemp(name), PLANS[name])
        return _RUNS[name]

    return get


def _cluster_id(entry) -> int:
    return entry["cluster"] if isinstance(entry, dict) else int(entry)


def _flagged(record: dict) -> set[int]:
    """Clusters the server flags as corrupted or withholds (their sums are not released)."""
    return {_cluster_id(c) for key in ("corrupted", "withheld") for c in record.get(key, [])}


def _cluster_of(record: dict, client: int) -> int | None:
    for key in ("clusters", "failed", "corrupted", "withheld"):
        for entry in record[key]:
            if client in entry["members"]:
                return entry["cluster"]
    return None


@pytest.mark.parametrize("name", ALL_PLANS)
def test_server_finishes_every_round_and_honest_clients_exit_cleanly(deployments, name):
    outcome = deployments(name)
    assert outcome.status == 0, outcome.log
    assert len(outcome.result["rounds"]) == ROUNDS
    assert f"round {ROUNDS}/{ROUNDS}" in outcome.log
    for cid, proc in outcome.run.procs.items():
        assert proc.returncode == 0, (cid, outcome.run.logs.get(cid))
        if cid not in outcome.attackers:
            assert f"client {cid}: {ROUNDS} rounds" in outcome.run.logs[cid]


@pytest.mark.parametrize("name", ALL_PLANS)
def test_no_round_waits_for_a_stage_deadline(deployments, name):
    # A stream ended for a bad message is dropped at once, never waited for as a zombie: the
    # stage deadline is HANG_S (write_config), so a round that waited for one would take
    # that long (no speed check here, which a loaded machine would break).
    outcome = deployments(name)
    assert outcome.status == 0, outcome.log
    for record in outcome.result["rounds"]:
        assert record["seconds"] < HANG_S, record


@pytest.mark.parametrize("name", ALL_PLANS)
def test_released_sums_are_exactly_the_honest_updates_of_unflagged_clusters(deployments, name):
    outcome = deployments(name)
    assert outcome.status == 0, outcome.log
    for r, record in enumerate(outcome.result["rounds"]):
        flagged = _flagged(record)
        released = [c for c in record["clusters"] if c["cluster"] not in flagged]
        contributors = {m for c in released for m in c["members"]}
        assert len(released) >= 1, record  # at least the cluster without an attacker
        np.testing.assert_array_equal(
            outcome.run.aggregate(r), clear_sum(contributors, r, DIM), err_msg=str(record)
        )


@pytest.mark.parametrize("name", ["door", "signed"])
def test_rejected_attackers_are_named_with_their_status(deployments, name):
    outcome = deployments(name)
    plan = PLANS[name]
    for cid, attack in outcome.attackers.items():
        code, words = plan.rejected[attack]
        lines = [line for line in outcome.log.splitlines() if line.startswith(f"client {cid}: ")]
        assert any(code in line and words in line for line in lines), (attack, lines)
        assert f"ended: {code}" in outcome.run.logs[cid]
    first = outcome.result["rounds"][0]
    contributors = {m for c in first["clusters"] for m in c["members"]}
    assert contributors == set(range(CLIENTS)) - set(outcome.attackers)
    assert outcome.result["rounds"][1]["participants"] == sorted(contributors)


@pytest.mark.parametrize("name", list(PLANS))
def test_culprits_are_named_and_honest_clients_are_not(deployments, name):
    outcome = deployments(name)
    first = outcome.result["rounds"][0]
    culprits = first["culprits"]
    for cid, attack in outcome.attackers.items():
        if attack == "out-of-range":  # hidden: the cluster is flagged
            assert _cluster_of(first, cid) in {_cluster_id(c) for c in first["corrupted"]}
        elif attack == "false-complaint":  # the accused (and the complainer) stay in the sum
            released = [c for c in first["clusters"] if cid in c["members"]]
            assert released and len(released[0]["members"]) == 4, first
            assert str(cid) not in culprits
        else:
            assert str(cid) in culprits, (attack, culprits)
    for record in outcome.result["rounds"]:
        honest = {str(c) for c in range(CLIENTS)} - {str(a) for a in outcome.attackers}
        assert not honest & set(record["culprits"]), record["culprits"]
