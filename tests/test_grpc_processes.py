"""Real processes on 127.0.0.1: a server and client processes talking gRPC."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S, PYTHON, start_server

from sharefl.deploy.client import demo_trainer
from sharefl.deploy.keygen import keygen


def write_config(
    folder: Path,
    *,
    clients: int,
    rounds: int = 1,
    dim: int = 200,
    stage_timeout_s: float = HANG_S,
    **extra,
) -> Path:
    """A deployment file; its deadlines are hang bounds (``HANG_S``) unless a test passes the
    stage deadline it waits out on purpose."""
    sa = {"cluster_size": 4, "reproducible_seed": 1, **extra.pop("secure_aggregation", {})}
    tls = extra.pop("tls", None)
    lines = [
        "[server]",
        f"clients = {clients}",
        f"rounds = {rounds}",
        f"connect_timeout_s = {HANG_S}",
        f"stage_timeout_s = {stage_timeout_s}",
        "[model]",
        f"dim = {dim}",
        'aggregator = "sum"',
        "[secure_aggregation]",
        *(f"{k} = {json.dumps(v)}" for k, v in sa.items()),
    ]
    if tls:
        lines += ["[tls]", *(f"{k} = {json.dumps(v)}" for k, v in tls.items())]
    path = folder / "deploy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Deployment:
    """A server process and client processes; results read from the server's --out."""

    def __init__(self, folder: Path, config: Path, clients: int) -> None:
        self.folder, self.config, self.clients = folder, config, clients
        self.out = folder / "out"
        # Returns once the server listens, on the port the OS gave it.
        self.server, self.address = start_server(
            config, "--out", str(self.out), folder=folder, stderr=subprocess.PIPE, text=True
        )
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, str] = {}

    def client(self, cid: int, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [*PYTHON, "client", "--server", self.address, "--id", str(cid), *args],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs[cid] = proc
        return proc

    def finish(self, timeout: float = HANG_S) -> tuple[int, str]:
        try:
            _, log = self.server.communicate(timeout=timeout)
        finally:
            for cid, proc in self.procs.items():
                try:
                    self.logs[cid] = proc.communicate(timeout=HANG_S)[1]
                except subprocess.TimeoutExpired:
                    proc.kill()
        return self.server.returncode, log

    def result(self) -> dict:
        return json.loads((self.out / "result.json").read_text())

    def aggregate(self, round_index: int) -> np.ndarray:
        return np.load(self.out / f"round-{round_index + 1}-aggregate.npy")


def clear_sum(ids, round_index: int, dim: int) -> np.ndarray:
    return sum(demo_trainer(np.zeros(dim), round=round_index, client_id=c) for c in ids)


def test_eight_processes_two_rounds_equal_the_clear_sum(tmp_path):
    config = write_config(tmp_path, clients=8, rounds=2)
    run = Deployment(tmp_path, config, 8)
    for cid in range(8):
        run.client(cid)
    status, log = run.finish()
    assert status == 0, log
    result = run.result()
    assert len(result["rounds"]) == 2
    for r, record in enumerate(result["rounds"]):
        assert record["failed"] == [] and len(record["clusters"]) == 2
        np.testing.assert_array_equal(run.aggregate(r), clear_sum(range(8), r, 200))
    assert all(p.returncode == 0 for p in run.procs.values())
    assert "round 2/2" in log


@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "unmask"])
def test_a_client_killed_at_any_stage_is_recovered(tmp_path, stage):
    """Without atoms (per-client clusters): the dropped client's masks are recovered."""
    sa = {"threshold": 3, "atoms": False}
    config = write_config(tmp_path, clients=8, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 8)
    for cid in range(8):
        run.client(cid, "--no-atoms", *(["--exit-before", stage] if cid == 5 else []))
    status, log = run.finish()
    assert status == 0, log
    assert run.procs[5].returncode == -9  # SIGKILL, as requested
    (record,) = run.result()["rounds"]
    assert record["failed"] == [] and len(record["clusters"]) == 2
    contributors = {m for c in record["clusters"] for m in c["members"]}
    # Killed before its masked input: not in the sum; killed at unmask: its input counts.
    assert (5 in contributors) == (stage == "unmask")
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(contributors, 0, 200))


@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "unmask"])
def test_with_atoms_a_client_killed_at_any_stage_takes_its_atom_out_whole(tmp_path, stage):
    """The default (atoms of 3): one cluster of three atoms; client 5 killed before its
    masked input takes its whole atom out of the sum (its atom-mates' mask keys are
    rebuilt, never their self masks) and the other two atoms are summed exactly; killed at
    unmask, its input counts. A second round plans only complete atoms of live clients."""
    sa = {"cluster_size": 9, "threshold": 3}
    config = write_config(tmp_path, clients=9, rounds=2, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 9)
    for cid in range(9):
        run.client(cid, *(["--exit-before", stage] if cid == 5 else []))
    status, log = run.finish()
    assert status == 0, log
    first, second = run.result()["rounds"]
    assert first["failed"] == [] and len(first["clusters"]) == 1
    contributors = set(first["clusters"][0]["members"])
    if stage == "unmask":
        assert contributors == set(range(9))
    else:
        assert len(contributors) == 6 and 5 not in contributors
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(contributors, 0, 200))
    assert 5 not in second["participants"] and len(second["participants"]) == 6


def test_a_client_refuses_rounds_past_its_own_budget(tmp_path):
    """``sharefl client --max-rounds 2``: the client counts the rounds it joins in its
    memory and refuses the third with a named refusal, before any key leaves it."""
    # Every client refuses round 3 and stays connected; the server stops waiting for a
    # client that refused its cluster, so round 3 closes without its stage deadline (a hang
    # bound here: waiting it out would fail the test's time only by hanging).
    sa = {"cluster_size": 3}
    config = write_config(tmp_path, clients=3, rounds=3, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 3)
    for cid in range(3):
        run.client(cid, "--max-rounds", "2", "--state-dir", str(tmp_path / f"state-{cid}"))
    status, log = run.finish()
    assert status == 0, log
    rounds = run.result()["rounds"]
    assert [len(r["clusters"]) for r in rounds] == [1, 1, 0], rounds
    assert "BudgetExhausted" in log and "max_rounds = 2" in log, log
    for cid in range(3):
        memory = json.loads(
            (tmp_path / f"state-{cid}" / "memory" / f"client-{cid}.json").read_text()
        )
        assert memory["joined"] == 2 and memory["atom"] == [0, 1, 2]


def test_cluster_below_threshold_is_reported_and_the_server_goes_on(tmp_path):
    sa = {"threshold": 3, "atoms": False}
    config = write_config(tmp_path, clients=8, rounds=2, secure_aggregation=sa)
    run = Deployment(tmp_path, config, 8)
    # Seeded clustering: find two members of one cluster by a dry run of the same seed.
    from sharefl.protocol.clustering import as_generator, random_clustering

    cluster = random_clustering(range(8), 4, as_generator(1)).clusters[0]
    doomed = set(cluster[:2])
    for cid in range(8):
        run.client(cid, "--no-atoms", *(["--exit-before", "mask"] if cid in doomed else []))
    status, log = run.finish()
    assert status == 0, log
    first, second = run.result()["rounds"]
    assert len(first["failed"]) == 1 and set(first["failed"][0]["members"]) == set(cluster)
    survivors = {m for c in first["clusters"] for m in c["members"]}
    assert survivors == set(range(8)) - set(cluster)
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(survivors, 0, 200))
    assert second["participants"] == sorted(set(range(8)) - doomed)
    assert second["failed"] == []


def test_tls_round_and_refusal_of_wrong_certificate_or_identity(tmp_path):
    keys = keygen(tmp_path / "keys", range(4))
    other = keygen(tmp_path / "other", range(4))
    tls = {
        "cert": str(keys / "server.pem"),
        "key": str(keys / "server.key"),
        "client_ca": str(keys / "ca.pem"),
        "directory": str(keys / "directory.json"),
    }
    config = write_config(
        tmp_path, clients=4, tls=tls, secure_aggregation={"signed": True, "cluster_size": 4}
    )
    run = Deployment(tmp_path, config, 4)  # listening: the impostors below try only once
    # An impostor with a certificate from another CA, and one with a valid certificate but
    # the identity key of another deployment.
    impostor = tmp_path / "impostor"  # everything from another deployment's CA
    impostor.mkdir()
    for name in ("ca.pem", "directory.json"):
        (impostor / name).write_bytes((keys / name).read_bytes())
    for suffix in ("pem", "key", "identity"):
        (impostor / f"client-10.{suffix}").write_bytes((other / f"client-0.{suffix}").read_bytes())
    wrong_cert = run.client(10, "--keys", str(impostor), "--retries", "1")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("ca.pem", "directory.json"):
        (mixed / name).write_bytes((keys / name).read_bytes())
    for suffix in ("pem", "key"):  # a genuine certificate of this deployment ...
        (mixed / f"client-11.{suffix}").write_bytes((keys / f"client-0.{suffix}").read_bytes())
    # ... with an identity the server's directory does not know
    (mixed / "client-11.identity").write_bytes((other / "client-0.identity").read_bytes())
    wrong_identity = run.client(11, "--keys", str(mixed), "--retries", "1")
    # The impostors are refused before the honest clients start: the server, waiting for
    # four clients, is certainly still there for them (no race with the end of the run).
    wrong_cert.wait(timeout=HANG_S)
    wrong_identity.wait(timeout=HANG_S)
    for cid in range(4):
        run.client(cid, "--keys", str(keys))
    status, log = run.finish()
    assert status == 0, log
    (record,) = run.result()["rounds"]
    assert record["participants"] == [0, 1, 2, 3]
    # Clients with keys require signed mode and the committed round plan, which they get.
    assert record["failed"] == [] and record["culprits"] == {}
    np.testing.assert_array_equal(run.aggregate(0), clear_sum(range(4), 0, 200))
    assert wrong_cert.returncode == 3  # the TLS handshake fails: unreachable, said clearly
    assert "unreachable" in run.logs[10]
    assert wrong_identity.returncode == 4
    assert "PERMISSION_DENIED" in run.logs[11]


def test_launch_runs_a_server_and_clients_and_reports(tmp_path):
    config = write_config(tmp_path, clients=4, dim=50, secure_aggregation={"cluster_size": 3})
    out = tmp_path / "launched"
    done = subprocess.run(
        [*PYTHON, "launch", "--config", str(config), "--clients", "4", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    assert "round 1/1" in done.stderr and "4 of 4 clients exited cleanly" in done.stderr
    aggregate = np.load(out / "round-1-aggregate.npy")
    np.testing.assert_array_equal(aggregate, clear_sum(range(4), 0, 50))


def test_server_stops_cleanly_on_sigterm(tmp_path):
    import signal
    import time

    config = write_config(tmp_path, clients=4)
    run = Deployment(tmp_path, config, 4)
    run.client(0)  # the server waits for three more that never come
    time.sleep(1.5)
    run.server.send_signal(signal.SIGTERM)
    status, log = run.finish()
    assert status == 130 and "interrupted" in log


def test_client_without_a_server_retries_then_exits_with_a_clear_message():
    with socket.socket() as bound:  # a port held by this test, where nothing listens
        bound.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{bound.getsockname()[1]}"
        done = subprocess.run(
            [*PYTHON, "client", "--server", address, "--id", "1", "--retries", "2"],
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
    assert done.returncode == 3
    assert "unreachable after 2 attempts" in done.stderr


def test_bad_config_is_reported_without_a_traceback(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[secure_aggregation]\ncluster_size = 1\n")
    done = subprocess.run(
        [*PYTHON, "serve", "--config", str(config)], capture_output=True, text=True, timeout=HANG_S
    )
    assert done.returncode == 2
    assert "cluster_size must be >= 2" in done.stderr and "Traceback" not in done.stderr
