"""Checkpoints and ``sharefl simulate --resume``: a run stopped after any round and resumed
is the uninterrupted run, bit for bit, for each of the three loops.

The oracle is an independent uninterrupted run of the same configuration: its records
(accuracy, loss, ε of every evaluated round), its final model (every array, exactly) and
the files it writes. Only wall-clock seconds may differ. A negative control shows the
oracle can fail: a restore that leaves the generators where a fresh build puts them gives
another run.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PYTHON, tiny_simulation
from test_sim_distributed_dp import DP
from test_sim_outputs import DECENTRALIZED, FEDERATED, RSA

from sharefl.machine import stop_at_a_safe_point
from sharefl.simulator import checkpoint as checkpoint_module
from sharefl.simulator.checkpoint import CHECKPOINT_FILE, CheckpointError, LoopCheckpoint, LoopState
from sharefl.simulator.config import expand
from sharefl.simulator.loops import build_loop
from sharefl.simulator.results import MODEL_FILE, ROUNDS_CSV_FILE, ROUNDS_FILE, SUMMARY_FILE
from sharefl.simulator.runner import Progress, UnfinishedRunError, run_grid, run_one

# Every part whose state a round changes: DP-SGD with normalisation and momentum (the
# accountant, the clients' momentum), label flippers, sampled participants, secure
# aggregation inside clusters of 3 (the plans' generator), a trimmed mean.
FEDERATED_PRIVATE: dict[str, Any] = copy.deepcopy(FEDERATED) | {
    "rounds": 6,
    "clients": {"honest": 8, "byzantine": 2, "per_round": 9},
    "attack": {"name": "label_flipping"},
    "privacy": {"enabled": True, "noise_multiplier": 1.0, "clipping": "normalize", "momentum": 0.1},
    "secure_aggregation": {"cluster_size": 3, "enabled": True, "clip": 1.0},
    "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
}
# Skellam noise added inside the clusters (its seeded secure stream, the release ledger).
FEDERATED_DISTRIBUTED: dict[str, Any] = copy.deepcopy(FEDERATED) | {
    "rounds": 6,
    "clients": {"honest": 9, "byzantine": 0},
    "secure_aggregation": {"cluster_size": 3, "enabled": True},
    "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
    "privacy": DP | {"distributed": "skellam", "bits": 16},
}
RSA_BYZANTINE: dict[str, Any] = copy.deepcopy(RSA) | {
    "rounds": 6,
    "clients": {"honest": 4, "byzantine": 1},
    "attack": {"name": "sign_flipping"},
}
DECENTRALIZED_ATTACKED: dict[str, Any] = copy.deepcopy(DECENTRALIZED) | {
    "attack": {"name": "gaussian"}
}
CONFIGS = {
    "federated": FEDERATED,
    "federated_private": FEDERATED_PRIVATE,
    "federated_distributed": FEDERATED_DISTRIBUTED,
    "dp_rsa": RSA_BYZANTINE,
    "decentralized": DECENTRALIZED_ATTACKED,
}


def _records(loop: Any, rounds: int) -> list[tuple]:
    return [(r.round, r.accuracy, r.loss, r.epsilon) for r in (loop.step() for _ in range(rounds))]


def _assert_same_model(a: Any, b: Any) -> None:
    sa, sb = a.final_model().state, b.final_model().state
    assert sa.keys() == sb.keys()
    for name in sa:
        assert np.array_equal(sa[name], sb[name]), name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_loop_restored_after_any_round_is_the_uninterrupted_loop(name, tmp_path):
    (run,) = expand(CONFIGS[name])
    reference = build_loop(run)
    expected = _records(reference, run.rounds)
    for stop in (1, run.rounds // 2, run.rounds - 1):
        stopped = build_loop(run)
        state = LoopState(stopped)
        assert _records(stopped, stop) == expected[:stop]
        LoopCheckpoint(run.run_id, stop, stopped.elapsed(), state.capture()).write(tmp_path)
        saved = LoopCheckpoint.read(tmp_path, run.run_id)
        assert saved is not None and saved.round == stop
        resumed = build_loop(run)
        LoopState(resumed).restore(saved.state)
        assert resumed.round == stop
        assert _records(resumed, run.rounds - stop) == expected[stop:], f"resumed after {stop}"
        _assert_same_model(resumed, reference)


def test_the_oracle_sees_a_restore_that_forgets_the_generators(monkeypatch):
    """Negative control: a capture without the generators' states (a fresh build's
    positions instead) resumes into another run, which the comparison above catches."""
    (run,) = expand(FEDERATED_PRIVATE)
    reference = build_loop(run)
    expected = _records(reference, run.rounds)
    stopped = build_loop(run)
    state = LoopState(stopped)
    _records(stopped, 3)
    monkeypatch.setattr(checkpoint_module, "_GENERATORS", ())  # generators look stateless
    blob = state.capture()
    resumed = build_loop(run)
    LoopState(resumed).restore(blob)
    assert _records(resumed, run.rounds - 3) != expected[3:]


def test_a_state_made_of_what_pickle_cannot_write_is_named():
    (run,) = expand(FEDERATED)
    loop = build_loop(run)
    state = LoopState(loop)
    loop.step()
    loop.server.made_in_a_round = lambda: None  # a closure the rounds made
    with pytest.raises(CheckpointError, match="cannot be checkpointed"):
        state.capture()


def test_a_checkpoint_of_another_run_or_a_damaged_file_is_refused(tmp_path):
    LoopCheckpoint("other-run", 1, 0.0, b"").write(tmp_path)
    with pytest.raises(CheckpointError, match="belongs to run other-run"):
        LoopCheckpoint.read(tmp_path, "this-run")
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"\x80\x05 truncated")
    with pytest.raises(CheckpointError, match=r"delete it \(or give --restart\) to start"):
        LoopCheckpoint.read(tmp_path, "this-run")
    assert LoopCheckpoint.read(tmp_path / "absent", "this-run") is None
    with pytest.raises(CheckpointError, match="resume it with --device cuda:0"):
        LoopCheckpoint("this-run", 1, 0.0, b"", device="cuda:0").check_device("cpu")


# -- the runner: files, signals, --resume ------------------------------------------------


def _rows(folder: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (folder / ROUNDS_FILE).read_text().splitlines() if x]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _csv(folder: Path) -> list[dict[str, str]]:
    with (folder / ROUNDS_CSV_FILE).open(newline="") as f:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]


def _summary(folder: Path) -> dict[str, Any]:
    """The summary but its wall time and its environment (which process finished the run,
    with which command and when: a resumed run's differ by design)."""
    summary = json.loads((folder / SUMMARY_FILE).read_text())
    return {k: v for k, v in summary.items() if k not in ("wall_seconds", "environment")}


def _assert_same_folder(a: Path, b: Path) -> None:
    assert _rows(a) == _rows(b)
    assert _csv(a) == _csv(b)
    assert _summary(a) == _summary(b)
    ma, mb = np.load(a / MODEL_FILE), np.load(b / MODEL_FILE)
    assert set(ma) == set(mb) and all(np.array_equal(ma[k], mb[k]) for k in ma)
    assert not (a / CHECKPOINT_FILE).exists() and not (b / CHECKPOINT_FILE).exists()


class Killed(Exception):
    """The process dies without warning (no handler runs, nothing more is written)."""


def _factory(*, signal_in: int | None = None, die_in: int | None = None):
    """A loop factory whose loop, in the middle of round ``signal_in`` (1-based), sends this
    process SIGINT as a user's Ctrl-C would, and at the start of round ``die_in`` raises
    :class:`Killed`. (The resumed run is built by it too, with neither: a checkpoint
    restores into a build of the same shape.)"""

    def factory(run: Any, *, device: str | None = None) -> Any:
        loop = build_loop(run, device=device)
        step = loop.step

        def interrupted_step() -> Any:
            if loop.round + 1 == die_in:
                raise Killed
            if loop.round + 1 == signal_in:
                os.kill(os.getpid(), signal.SIGINT)
            return step()

        loop.step = interrupted_step
        return loop

    return factory


@pytest.mark.parametrize("name", ["federated_private", "dp_rsa", "decentralized"])
def test_sigint_checkpoints_the_round_under_way_and_resume_finishes_the_same_run(name, tmp_path):
    (run,) = expand(CONFIGS[name])
    run_one(run, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run_one(run, tmp_path / "stopped", simulation_factory=_factory(signal_in=3))
    folder = tmp_path / "stopped" / run.run_id
    saved = LoopCheckpoint.read(folder, run.run_id)
    assert saved is not None and saved.round == 3  # the round the signal landed in
    assert not (folder / SUMMARY_FILE).exists()
    outcome = run_one(run, tmp_path / "stopped", resume=True, simulation_factory=_factory())
    assert not outcome.skipped
    _assert_same_folder(folder, tmp_path / "straight" / run.run_id)


def test_periodic_checkpoints_resume_from_the_last_one_and_rewrite_later_rows(tmp_path):
    """A run killed without warning (no checkpoint of its last rounds): rows it wrote after
    the checkpoint are dropped and written again by the resumed run."""
    (run,) = expand(FEDERATED_PRIVATE | {"eval_every": 1})
    run_one(run, tmp_path / "straight")

    with pytest.raises(Killed):
        run_one(
            run, tmp_path / "stopped", simulation_factory=_factory(die_in=5), checkpoint_every=0
        )
    folder = tmp_path / "stopped" / run.run_id
    saved = LoopCheckpoint.read(folder, run.run_id)
    assert saved is not None and saved.round == 4
    rows = (folder / ROUNDS_FILE).read_text().splitlines()
    (folder / ROUNDS_FILE).write_text(
        "\n".join([*rows, rows[-1].replace('"round": 4', '"round": 5')]) + "\n"
    )
    run_one(run, tmp_path / "stopped", resume=True, simulation_factory=_factory())
    _assert_same_folder(folder, tmp_path / "straight" / run.run_id)


def test_runs_in_folders_named_by_an_earlier_version_are_resumed_and_skipped_there(tmp_path):
    """Earlier versions cut name and label together at 60 characters, so a long name hid the
    label; a run stopped or finished under such a folder name (and a checkpoint holding that
    id) is found there, not run again beside it."""
    (run,) = expand(
        FEDERATED | {"name": "an experiment whose name alone is longer than sixty chars"}
    )
    assert run.earlier_run_id != run.run_id and "s1-" in run.run_id
    run_one(run, tmp_path / "straight")
    with pytest.raises(KeyboardInterrupt):
        run_one(run, tmp_path / "stopped", simulation_factory=_factory(signal_in=2))
    earlier = tmp_path / "stopped" / run.earlier_run_id
    (tmp_path / "stopped" / run.run_id).rename(earlier)
    saved = LoopCheckpoint.read(earlier, run.run_id)
    assert saved is not None
    replace(saved, run_id=run.earlier_run_id).write(earlier)  # as the earlier version wrote it

    with pytest.raises(UnfinishedRunError, match=run.earlier_run_id):
        run_grid([run], tmp_path / "stopped")
    outcome = run_one(run, tmp_path / "stopped", resume=True, simulation_factory=_factory())
    assert outcome.folder == earlier and not outcome.skipped
    assert [p.name for p in (tmp_path / "stopped").iterdir()] == [run.earlier_run_id]
    _assert_same_folder(earlier, tmp_path / "straight" / run.run_id)
    (again,) = run_grid([run], tmp_path / "stopped")
    assert again.skipped and again.folder == earlier


def test_an_unfinished_run_is_refused_unless_resume_or_restart_says_what_to_do(tmp_path):
    """Neither flag: the checkpoint stays and the error names both; ``restart``: the run
    starts again (a line says so) and ends without a checkpoint."""
    (run,) = expand(FEDERATED)
    with pytest.raises(KeyboardInterrupt):
        run_one(run, tmp_path, simulation_factory=_factory(signal_in=2))
    checkpoint = tmp_path / run.run_id / CHECKPOINT_FILE
    saved = checkpoint.read_bytes()

    with pytest.raises(UnfinishedRunError, match="--resume to continue it, or --restart"):
        run_one(run, tmp_path, simulation_factory=_factory())
    with pytest.raises(UnfinishedRunError, match=run.run_id):
        run_grid([run], tmp_path)
    assert checkpoint.read_bytes() == saved
    with pytest.raises(ValueError, match="not both"):
        run_one(run, tmp_path, resume=True, restart=True)

    stream = io.StringIO()
    run_one(run, tmp_path, progress=Progress(stream), simulation_factory=_factory(), restart=True)
    assert "starting again (--restart discarded its checkpoint)" in stream.getvalue()
    assert not checkpoint.exists()


def test_a_second_signal_stops_at_once():
    with stop_at_a_safe_point() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.asked
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs before this returns
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_simulate_stopped_by_sigterm_resumes_as_documented(tmp_path):
    """``sharefl simulate FILE --out DIR``, SIGTERM, then ``... --resume``: exit 130 with a
    checkpoint, then 0 with the files an uninterrupted run writes."""
    config = tiny_simulation(tmp_path / "sim.toml", rounds=300, eval_every=20)
    stopped, straight = tmp_path / "stopped", tmp_path / "straight"
    command = [*PYTHON, "simulate", str(config)]
    sim = subprocess.Popen([*command, "--out", str(stopped)], stderr=subprocess.PIPE, text=True)
    while sim.poll() is None and not [  # until the first evaluated round is written
        p for p in stopped.rglob(ROUNDS_FILE) if p.read_text()
    ]:
        time.sleep(0.1)
    sim.send_signal(signal.SIGTERM)  # a run that ended already fails below (exit 0)
    code = sim.wait()
    err = sim.stderr.read()
    assert code == 130, err[-3000:]
    assert "checkpointed after round" in err and "--resume continues" in err
    (folder,) = stopped.iterdir()
    saved = LoopCheckpoint.read(folder, folder.name)
    assert saved is not None and 20 <= saved.round < 300
    checkpoint = (folder / CHECKPOINT_FILE).read_bytes()
    forgot = subprocess.run([*command, "--out", str(stopped)], capture_output=True, text=True)
    assert forgot.returncode == 2, forgot.stderr[-3000:]
    (line,) = forgot.stderr.strip().splitlines()  # one line, naming both choices
    assert "unfinished run with a checkpoint" in line and folder.name in line
    assert "add --resume to continue it, or --restart to discard the checkpoint" in line
    assert (folder / CHECKPOINT_FILE).read_bytes() == checkpoint  # it survived
    both = [*command, "--out", str(stopped), "--resume", "--restart"]
    assert subprocess.run(both, capture_output=True).returncode == 2  # one or the other
    done = subprocess.run(
        [*command, "--out", str(stopped), "--resume"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed after round {saved.round}" in done.stderr
    subprocess.run([*command, "--out", str(straight)], check=True, capture_output=True)
    _assert_same_folder(folder, straight / folder.name)

    (folder / SUMMARY_FILE).unlink()
    (folder / CHECKPOINT_FILE).write_bytes(b"damaged")
    refused = subprocess.run(
        [*command, "--out", str(stopped), "--resume"], capture_output=True, text=True
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "cannot be read" in refused.stderr and "--restart" in refused.stderr
    restarted = subprocess.run(
        [*command, "--out", str(stopped), "--restart"], capture_output=True, text=True
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "starting again (--restart discarded its checkpoint)" in restarted.stderr
    assert not (folder / CHECKPOINT_FILE).exists()
    _assert_same_folder(folder, straight / folder.name)
