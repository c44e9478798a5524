"""The Message-API example on Flower's deployment engine, as
``examples/flower_share_message/deploy_local.py`` runs it: a SuperLink and N SuperNodes as
separate processes on loopback, TLS between them (a throwaway CA), sharefl's signed mode on
top (each SuperNode's node config names its identity and the directory).

The oracle is the run itself: the server's accuracy after the last round (the example's
median over cluster means filters its Byzantine client, so FedAvg's collapse would show),
every SuperNode's memory measured, and no process of the deployment left running — by the
script's own account and by a scan of /proc for its work folder and ports — while a
bystander naming that folder and the shell around the script live on.

Flower's own SuperExec starts one ClientApp process per message, and takes the task back
when that process has not reported within 30 s: on a loaded two-core machine 10 or 20 such
starts at once never make it (docs/deployment.md). The test therefore runs the example's
``--executor warm`` (``--isolation process``, one long-lived ``warm_superexec.py`` per
SuperNode); the SuperLink, the SuperNodes, TLS and ``flwr run`` are Flower's. N = 20 takes
about 7 minutes there (start-up included), so the run is ``slow``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

SCRIPT = Path(__file__).resolve().parents[1] / "examples/flower_share_message/deploy_local.py"
REPLAYING_SERVERAPP = Path(__file__).resolve().parent / "flower_replaying_serverapp.py"
REPLAY_MARK = "sharefl-replay "  # the line flower_replaying_serverapp.py logs


SHELL = ["sh", "-c", '"$@"; echo "script exited $?"', "sh"]  # a wrapper: runs its arguments
QUICK_FAILURE = ["--supernodes", "10", "--startup-timeout", "0", "--quiet"]  # exit 2 at once
SLEEPER = "import signal; signal.pause()"  # a process that waits until it is signalled
SPAWNER = """
import signal, subprocess, sys
from pathlib import Path
# as Flower starts the SuperLink's SuperExec: in a session (and process group) of its own
own = subprocess.Popen(["sleep", "infinity"], start_new_session=True)
# in the spawner's group, deaf to SIGTERM (it takes SIGKILL)
deaf = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep infinity"])
ready = Path(sys.argv[1])
ready.with_suffix(".tmp").write_text(f"{own.pid} {deaf.pid}")
ready.with_suffix(".tmp").rename(ready)
signal.pause()
"""


@functools.cache
def _load_script():
    """deploy_local.py as a module (its top level imports the standard library only),
    registered as ``deploy_local`` (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("deploy_local", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _bystander(*names: str) -> subprocess.Popen:
    """A process of someone else's whose command line names ``names`` (a port, a folder)."""
    return subprocess.Popen([sys.executable, "-c", SLEEPER, *names])


def _is_running(pid: int) -> bool:
    """Whether ``pid`` exists and has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _processes_naming(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (a check for leaks: nothing
    is ever stopped by its command line)."""
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
    """Run the script inside ``sh -c`` beside a bystander naming its work folder: the
    shell gets the script's status, and the bystander outlives the run."""
    summary_path = tmp_path / "summary.json"
    work = tmp_path / "work"
    script = [
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
    ]
    bystander = _bystander(str(work))
    try:
        done = subprocess.run(
            [*SHELL, *script],
            capture_output=True,
            text=True,
        )
        assert bystander.poll() is None, "the script stopped a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()
    assert not _processes_naming(str(work)), "processes of the deployment survived it"
    assert done.returncode == 0 and "script exited 0" in done.stdout, (done.stdout + done.stderr)[
        -4000:
    ]
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
    )
    assert done.returncode == 2
    assert "at least 10 SuperNodes" in done.stderr


def test_the_script_refuses_a_serverapp_file_that_does_not_exist(tmp_path):
    missing = tmp_path / "no_such_serverapp.py"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--supernodes", "10", "--serverapp", str(missing)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert f"--serverapp {missing}: no such file" in done.stderr


def test_stopping_a_deployment_stops_its_process_groups_and_no_bystander(tmp_path):
    """The script's cleanup signals the groups of the processes it started (and a group
    one of them started) — not a process that merely names its port or folder."""
    script = _load_script()
    work, port = tmp_path / "work", 39999
    work.mkdir()
    bystander = _bystander(f"127.0.0.1:{port}", str(work))
    try:
        deployment = script.Deployment(work, dict(os.environ), [port])
        spawner = deployment.start("spawner", [sys.executable, "-c", SPAWNER, str(work / "ready")])
        while not (work / "ready").exists():  # bounded by the spawner's work, not a clock
            assert script.exit_status(spawner) is None, (work / "logs/spawner.log").read_text()
            time.sleep(0.05)
        grandchildren = [int(pid) for pid in (work / "ready").read_text().split()]
        assert deployment.stop(grace=0.5) == []
        assert not any(_is_running(pid) for pid in [spawner.pid, *grandchildren])
        assert spawner.returncode == -signal.SIGTERM
        assert bystander.poll() is None, "it stopped a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_shell_around_the_script_gets_its_status_and_a_bystander_lives_on(tmp_path):
    """The deployment fails to come up (``--startup-timeout 0``: the SuperLink it started
    is stopped at once): the shell running the script sees exit status 2, and a process
    naming the work folder outlives the cleanup; the SuperLink does not."""
    work = tmp_path / "work"
    bystander = _bystander(str(work))
    try:
        done = subprocess.run(
            [*SHELL, sys.executable, str(SCRIPT), *QUICK_FAILURE, "--work", str(work)],
            capture_output=True,
            text=True,
        )
        assert bystander.poll() is None, "the script stopped a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "script exited 2" in done.stdout, done.stderr[-2000:]
    assert "the SuperLink did not listen on 127.0.0.1:" in done.stderr
    assert not _processes_naming(str(work)), "the SuperLink it started survived it"


def test_without_work_its_temporary_folder_is_removed_or_named(tmp_path, monkeypatch, capsys):
    """The temporary folder (it holds keys) goes at exit, also on Ctrl-C; after a failed
    run it stays for its logs and its path is printed; a ``--work`` folder stays."""
    script = _load_script()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with script.work_folder(None) as work:
        (work / "keys").mkdir()
    assert not work.exists()
    with pytest.raises(KeyboardInterrupt), script.work_folder(None) as work:
        raise KeyboardInterrupt
    assert not work.exists()
    with pytest.raises(script.RunFailed), script.work_folder(None) as work:
        raise script.RunFailed("no accuracy")
    assert work.is_dir()
    assert f"kept in {work}" in capsys.readouterr().err
    with script.work_folder(tmp_path / "given") as given:
        pass
    assert given.is_dir()


def test_the_help_text_is_whole(capsys):
    with pytest.raises(SystemExit) as exit_:
        _load_script().parse_args(["--help"])
    assert exit_.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "a SuperLink and N SuperNodes, each its own process, TLS between them," in help_text
    assert "sharefl's signed mode on top." in help_text
    assert "Exit status: 0 the run finished" in help_text


def test_a_late_heartbeat_refusal_is_not_counted_as_a_relaunch():
    """Flower logs a task-token refusal both when a ClientApp is taken back (counted) and
    when a finished task's last heartbeat arrives after its token was revoked (not)."""
    script = _load_script()
    late = "ERROR: [/v1/runtime/send-task-heartbeat][ApiError:1008] " + script.RELAUNCH_MARK
    taken = "ERROR: [/v1/runtime/pull-task-input][ApiError:1008] " + script.RELAUNCH_MARK
    assert script.relaunches(late) == 0
    assert script.relaunches("\n".join([taken, late, "INFO: Received successfully", taken])) == 2
