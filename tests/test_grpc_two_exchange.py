"""The two-exchange round (``key_setup = "once"``) over gRPC between real processes on
127.0.0.1: each client advertises its long-term keys in its Hello; a round is the
assignment (after the RoundStart) answered by the masked input with its shares, then the
unmask request. A client killed (SIGKILL) before either reply is recovered exactly."""

from __future__ import annotations

import signal

import numpy as np
import pytest
from test_grpc_processes import Deployment, clear_sum, write_config

from sharefl.deploy import client as client_module
from sharefl.deploy.client import ClientRuntime
from sharefl.deploy.keygen import keygen


def test_two_rounds_equal_the_clear_sum(tmp_path):
    sa = {"key_setup": "once", "atoms": False}
    config = write_config(tmp_path, clients=8, rounds=2, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 8)
    for cid in range(8):
        run.client(cid, "--no-atoms")
    status, log = run.finish()
    assert status == 0, log
    for r, record in enumerate(run.result()["rounds"]):
        assert record["failed"] == [] and len(record["clusters"]) == 2
        np.testing.assert_array_equal(run.aggregate(r), clear_sum(range(8), r, 200))
    assert all(p.returncode == 0 for p in run.procs.values())


@pytest.mark.parametrize("stage", ["mask", "unmask"])
def test_a_client_killed_before_either_reply_is_recovered(tmp_path, stage):
    """Killed before its masked input: not in the sum, its pair masks removed through the
    survivors' shares of their pair seeds; killed before its unmask reply: its input
    counts (its self-mask seed rebuilt from the others' shares)."""
    sa = {"threshold": 3, "atoms": False, "key_setup": "once"}
    config = write_config(tmp_path, clients=8, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 8)
    for cid in range(8):
        run.client(cid, "--no-atoms", *(["--exit-before", stage] if cid == 5 else []))
    status, log = run.finish()
    assert status == 0, log
    assert run.procs[5].returncode == -9
    (record,) = run.result()["rounds"]
    assert record["failed"] == [] and len(record["clusters"]) == 2
    contributors = {m for c in record["clusters"] for m in c["members"]}
    assert (5 in contributors) == (stage == "unmask")
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(contributors, 0, 200))


def test_with_atoms_a_client_killed_before_its_input_takes_its_atom_out_whole(tmp_path):
    sa = {"cluster_size": 9, "threshold": 3, "key_setup": "once"}
    config = write_config(tmp_path, clients=9, rounds=2, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 9)
    for cid in range(9):
        run.client(cid, *(["--exit-before", "mask"] if cid == 5 else []))
    status, log = run.finish()
    assert status == 0, log
    first, second = run.result()["rounds"]
    contributors = set(first["clusters"][0]["members"])
    assert len(contributors) == 6 and 5 not in contributors
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(contributors, 0, 200))
    assert 5 not in second["participants"] and len(second["participants"]) == 6


def test_signed_tls_two_exchange_round_with_a_client_killed_before_its_input(tmp_path):
    """Signed mode over TLS (``sharefl keygen``'s keys): the key adverts are signed with each
    client's identity and checked by the server and every peer; a round is three exchanges
    (assignment, consistency, unmask). Client 2 killed before its masked input is left out
    of the exact sum of the other four."""
    keys = keygen(tmp_path / "keys", range(5))
    tls = {
        "cert": str(keys / "server.pem"),
        "key": str(keys / "server.key"),
        "client_ca": str(keys / "ca.pem"),
        "directory": str(keys / "directory.json"),
    }
    sa = {"signed": True, "cluster_size": 5, "key_setup": "once", "atoms": False}
    config = write_config(tmp_path, clients=5, tls=tls, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 5)
    for cid in range(5):
        extra = ["--exit-before", "mask"] if cid == 2 else []
        run.client(cid, "--keys", str(keys), "--no-atoms", *extra)
    status, log = run.finish()
    assert status == 0, log
    (record,) = run.result()["rounds"]
    assert record["failed"] == [] and record["culprits"] == {}
    contributors = {m for c in record["clusters"] for m in c["members"]}
    assert contributors == {0, 1, 3, 4}
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(contributors, 0, 200))


@pytest.mark.parametrize(
    ("exit_before", "killed_at"),
    [
        ("advertise", "mask"),  # no advertise exchange in this round: the next reply
        ("share", "mask"),
        ("mask", "mask"),
        ("consistency", "unmask"),  # unsigned: no consistency exchange
        ("unmask", "unmask"),
    ],
)
def test_exit_before_a_stage_the_round_lacks_kills_at_the_next_reply(
    monkeypatch, exit_before, killed_at
):
    """``--exit-before`` names a stage of the four-exchange round; in the two-exchange
    round (stages ``mask``, ``unmask``) it kills before the first reply at or after it."""
    killed = []
    monkeypatch.setattr(client_module.os, "kill", lambda pid, sig: killed.append(sig))
    runtime = ClientRuntime(1, "127.0.0.1:1", exit_before=exit_before)
    for stage in ("mask", "unmask"):
        runtime._maybe_exit(stage)
        if killed:
            break
    assert killed == [signal.SIGKILL] and stage == killed_at
