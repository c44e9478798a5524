"""The Message-API example on Flower's deployment engine, as
``examples/flower_share_message/deploy_local.py`` runs it: a SuperLink and N SuperNodes as
separate processes on loopback, TLS between them (a throwaway CA), sharefl's signed mode on
top (each SuperNode's node config names its identity and the directory).

The oracle is the run itself: the server's accuracy after the last round (the example's
median over cluster means filters its Byzantine client, so FedAvg's collapse would show),
every SuperNode's memory measured, and no process of the deployment left running — by the
script's own account and by a scan of /proc for its work folder and ports.

Flower's own SuperExec starts one ClientApp process per message, and takes the task back
when that process has not reported within 30 s: on a loaded two-core machine 10 or 20 such
starts at once never make it (docs/deployment.md). The test therefore runs the example's
``--executor warm`` (``--isolation process``, one long-lived ``warm_superexec.py`` per
SuperNode); the SuperLink, the SuperNodes, TLS and ``flwr run`` are Flower's. N = 20 takes
about 7 minutes there (start-up included), so the run is ``slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

SCRIPT = Path(__file__).resolve().parents[1] / "examples/flower_share_message/deploy_local.py"
REPLAYING_SERVERAPP = Path(__file__).resolve().parent / "flower_replaying_serverapp.py"
REPLAY_MARK = "sharefl-replay "  # the line flower_replaying_serverapp.py logs


def _processes_naming(text: str) -> list[str]:
    """Command lines of live processes that contain ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in line and "pytest" not in line:
            found.append(f"{entry.name}: {line[:200]}")
    return found


def _deploy(tmp_path: Path, supernodes: int, rounds: int, *extra: str) -> dict:
    summary_path = tmp_path / "summary.json"
    work = tmp_path / "work"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--supernodes",
            str(supernodes),
            "--rounds",
            str(rounds),
            "--work",
            str(work),
            "--json",
            str(summary_path),
            "--quiet",
            "--timeout",
            "2400",
            "--executor",
            "warm",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert not _processes_naming(str(work)), "processes of the deployment survived it"
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["left_running"] == []
    for port_mark in (f"127.0.0.1:{p}" for p in summary.get("ports", [])):
        assert not _processes_naming(port_mark)
    return summary


@pytest.mark.slow
def test_twenty_supernodes_run_the_signed_round_over_tls(tmp_path):
    summary = _deploy(tmp_path, supernodes=20, rounds=2)
    assert summary["ok"] and summary["signed"] and summary["tls"]
    assert summary["supernodes"] == 20
    assert len(summary["round_s"]) == 2
    assert summary["accuracy"] >= 0.9  # the median filters the Byzantine client
    nodes = summary["memory"]["supernodes"]
    assert len(nodes) == 20
    # every SuperNode and its executor (which ran its ClientApp) were measured
    assert all(node["main_hwm_mb"] > 0 and node["superexec_hwm_mb"] > 0 for node in nodes)
    assert summary["clientapp_relaunches"] == 0
    assert summary["memory"]["superlink"]["app_hwm_mb"] > 0  # the ServerApp was seen


@pytest.mark.slow
def test_a_server_replaying_a_model_on_the_deployment_engine_gets_only_atom_sums(tmp_path):
    """Atoms where users run them: SuperNodes over TLS, signed, each client's memory (its
    atom) in its ``sharefl-state-dir``. The ServerApp (``flower_replaying_serverapp.py``)
    runs an honest round 1, then sends round 1's model again with its plan forgotten. With
    atoms (the default) the replay can only regroup the same atoms — of 3 clients, in
    clusters of 3, the very same sums — so the clients accept it and the server learns
    nothing it did not have: every released sum is a whole atom's."""
    summary = _deploy(tmp_path, 10, 2, "--serverapp", str(REPLAYING_SERVERAPP))
    assert summary["ok"] and summary["signed"] and summary["tls"]
    log = (Path(summary["work"]) / "logs" / "run.log").read_text()
    (line,) = [line for line in log.splitlines() if REPLAY_MARK in line]
    first, replay = json.loads(line.split(REPLAY_MARK, 1)[1])
    atoms = [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]  # the directory's ids cut in order
    assert first["released"] == 3 and first["errors"] == []
    assert first["clusterings"] == replay["clusterings"] == [atoms]
    assert replay["released"] == 3 and replay["errors"] == []


def test_the_script_refuses_fewer_supernodes_than_the_app_needs():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--supernodes", "5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "at least 10 SuperNodes" in done.stderr


def test_the_script_refuses_a_serverapp_file_that_does_not_exist(tmp_path):
    missing = tmp_path / "no_such_serverapp.py"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--supernodes", "10", "--serverapp", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"--serverapp {missing}: no such file" in done.stderr
