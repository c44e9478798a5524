"""A curious operator restores an old copy of the server's ``--out`` folder and resumes: no
client contributes on one model under a new plan.

The server's own record (``checkpoint.npz``, ``rounds.jsonl``, ``releases.jsonl``) is what
``sharefl serve --resume`` trusts; an operator who puts back an older copy of the whole
folder rolls it back, journal included. The resumed server then starts again at an earlier
round over an older model, and, having forgotten the plans it drew later, draws fresh ones
(no ``reproducible_seed``: plans come from the OS). What still holds is the clients' memory
(:mod:`sharefl.protocol.memory`, a file under each client's ``--keys`` folder): rounds of a
run strictly increase (R1, ``RoundReplayed``) and a model is contributed on under one set of
clusterings only (R2, ``ModelReplayed``).

Real processes over gRPC with TLS, client certificates and signed identities (``keygen``),
six clients in clusters of three, no atoms, twenty rounds (run 1 never ends before its
stop). Run 1 is stopped (SIGTERM) after four rounds; the backup is a copy of the folder
taken (server paused by SIGSTOP, so the copy is what a crash at that instant would leave)
once two rounds were in ``rounds.jsonl``. Two backups:

- ``copy``: the folder as copied. The server commits round 3's plan right after round 2,
  so the copy usually holds it: the resume closes round 3 as interrupted and reuses that
  plan's clusterings (an honest resume, nothing new for the server to learn).
- ``before-plan``: the copy cut back to the instant round 2 had finished and round 3 was
  not yet planned (journal lines of later rounds and their sum files removed) — an equally
  old, consistent folder in which the journal forgot round 3's plan. The resumed server
  draws a FRESH plan on the model the clients already contributed on in run 1's round 3.
  (Plans come from the OS: with six clients in clusters of three there are ten
  clusterings, so about one run in ten draws run 1's plan again — the honest case, which
  the clients accept and the oracle below allows; otherwise every client refuses it.)

Either way rounds the clients already took part in are refused by R1; a later round over
the run-1 model under a new plan is refused by R2. The oracle is the journal itself:
every sum the resumed server approved for release (``releases.jsonl`` lines after the
restored prefix) on a model that run 1 planned must be under run 1's clusterings of it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import HANG_S, PYTHON, start_server

from sharefl.deploy.keygen import keygen
from sharefl.exit_status import ExitStatus

CLIENTS, CLUSTER, ROUNDS, DIM = 6, 3, 20, 16
BACKUP_AFTER, STOP_AFTER = 2, 4


def _config(folder: Path, keys: Path) -> Path:
    tables = {
        "server": {
            "clients": CLIENTS,
            "rounds": ROUNDS,
            "connect_timeout_s": 60.0,
            "stage_timeout_s": HANG_S,  # a refused cluster closes when all members refused
        },
        "model": {"dim": DIM, "aggregator": "sum"},
        # Without atoms: with them every release is a sum of whole atoms whatever the plan, and
        # the clients do not apply R1 and R2, which this test is about.
        "secure_aggregation": {"cluster_size": CLUSTER, "signed": True, "atoms": False},
        "tls": {
            "cert": str(keys / "server.pem"),
            "key": str(keys / "server.key"),
            "client_ca": str(keys / "ca.pem"),
            "directory": str(keys / "directory.json"),
        },
    }
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path = folder / "deploy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _rounds(out: Path) -> int:
    path = out / "rounds.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def _wait_rounds(out: Path, count: int, server: subprocess.Popen, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _rounds(out) >= count:
            return
        if server.poll() is not None:
            raise AssertionError(f"the server exited {server.returncode} before round {count}")
        time.sleep(0.05)
    raise TimeoutError(f"{out / 'rounds.jsonl'} never held {count} rounds")


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "releases.jsonl").read_text().splitlines()]


class Run:
    """A ``sharefl serve`` process (log in ``folder/<name>.log``) and the six clients."""

    def __init__(self, folder: Path, config: Path, keys: Path, name: str, *serve: str) -> None:
        self.log_path = folder / f"{name}.log"
        log = self.log_path.open("w")
        self.server, address = start_server(config, *serve, folder=folder, stderr=log, stdout=log)
        command = [*PYTHON, "client", "--server", address, "--keys", str(keys), "--no-atoms"]
        self.clients = [
            subprocess.Popen(
                [*command, "--id", str(c), "--server-timeout", str(HANG_S)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for c in range(CLIENTS)
        ]
        self.stderr: list[str] = []

    def finish(self, timeout: float = HANG_S) -> tuple[int, list[int]]:
        try:
            status = self.server.wait(timeout=timeout)
        finally:
            if self.server.poll() is None:
                self.server.kill()
                self.server.wait()
            codes = []
            for proc in self.clients:
                try:
                    self.stderr.append(proc.communicate(timeout=HANG_S)[1])
                except subprocess.TimeoutExpired:
                    proc.kill()
                    self.stderr.append(proc.communicate()[1])
                codes.append(proc.returncode)
        return status, codes

    @property
    def log(self) -> str:
        return self.log_path.read_text()


def _snapshot(server: subprocess.Popen, out: Path, backup: Path) -> None:
    """Copy ``out`` with the server stopped (SIGSTOP): what a crash there would leave."""
    server.send_signal(signal.SIGSTOP)
    try:
        shutil.copytree(out, backup)
    finally:
        server.send_signal(signal.SIGCONT)


def _cut_to_finished_rounds(folder: Path) -> None:
    """Make ``folder`` what it was when its last finished round had just finished: drop the
    journal lines (and sum files) of later rounds, i.e. the next round's committed plan."""
    finished = (folder / "rounds.jsonl").read_text().count("\n")
    kept = [e for e in _journal(folder) if e["round"] <= finished]
    (folder / "releases.jsonl").write_text("".join(json.dumps(e) + "\n" for e in kept))
    for path in (folder / "releases").glob("round-*.npy"):
        if int(path.name.split("-")[1]) > finished:
            path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("backup_kind", ["copy", "before-plan"])
def test_a_restored_old_out_folder_gets_no_contribution_under_a_new_plan(tmp_path, backup_kind):
    keys = keygen(tmp_path / "keys", range(CLIENTS))
    config = _config(tmp_path, keys)
    out, backup = tmp_path / "out", tmp_path / "backup"

    # Run 1: back up the folder after two rounds, stop the run (SIGTERM) after four.
    first = Run(tmp_path, config, keys, "run1", "--out", str(out))
    try:
        _wait_rounds(out, BACKUP_AFTER, first.server)
        _snapshot(first.server, out, backup)
        _wait_rounds(out, STOP_AFTER, first.server)
        first.server.send_signal(signal.SIGTERM)
    finally:
        status, codes = first.finish()
    assert status == 130, first.log
    assert all(code in (0, 3, 4) for code in codes), (codes, first.stderr)
    assert not any("Traceback" in err for err in first.stderr), first.stderr
    run1 = _journal(out)
    run1_plans: dict[str, set[str]] = {}
    for entry in run1:
        if entry["kind"] == "plan":
            run1_plans.setdefault(entry["model"], set()).add(json.dumps(entry["clusterings"]))
    assert all(len(c) == 1 for c in run1_plans.values()), run1_plans  # one model, one plan
    if backup_kind == "before-plan":
        _cut_to_finished_rounds(backup)
    restored_rounds = (backup / "rounds.jsonl").read_text().count("\n")
    assert BACKUP_AFTER <= restored_rounds < _rounds(out)

    # The operator restores the old copy and resumes: the same keys, the same clients
    # (same --keys folder, hence the same memory files).
    shutil.rmtree(out)
    shutil.copytree(backup, out)
    prefix = len(_journal(out))
    second = Run(tmp_path, config, keys, "run2", "--resume", str(out))
    status, codes = second.finish()
    log = second.log
    # The resumed run ends (nothing hangs): done, or stopped as stalled once its refused
    # rounds released nothing max_empty_rounds times in a row; every client cleanly (done,
    # told the run stopped, or having refused every round it was offered).
    assert status in (ExitStatus.OK, ExitStatus.STALLED), log
    ends = (ExitStatus.OK, ExitStatus.REFUSED, ExitStatus.ROUNDS_REFUSED)
    assert all(c in ends for c in codes), (codes, second.stderr)
    assert not any("Traceback" in err for err in second.stderr), second.stderr
    assert "Traceback" not in log, log

    # Every client refused a replayed round or a replayed model, and said why.
    for cid in range(CLIENTS):
        refusals = [line for line in log.splitlines() if line.startswith(f"client {cid} refused:")]
        assert any(
            "does not increase" in line or "under other clusterings" in line for line in refusals
        ), (cid, refusals, second.stderr[cid])

    # No sum released by the resumed run on a model of run 1 under other clusterings.
    resumed = _journal(out)[prefix:]
    # The plan each round ran under: a round number planned again (after the restore)
    # ran under its later plan.
    plans = {e["round"]: e for e in _journal(out) if e["kind"] == "plan"}
    for entry in resumed:
        if entry["kind"] != "release" or entry["model"] not in run1_plans:
            continue
        plan = plans[entry["round"]]
        assert plan["model"] == entry["model"]
        assert json.dumps(plan["clusterings"]) in run1_plans[entry["model"]], (entry, plan)
