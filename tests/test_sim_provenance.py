"""``summary.json`` records what changes a run's float results besides its configuration
(``sharefl.simulator.provenance``): the commit, the command, threads, torch's CPU kernels,
the BLAS. The oracles are independent readings: ``git`` run here, torch's own calls, the
environment of a child process started with known variables."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sharefl.simulator.config import expand
from sharefl.simulator.provenance import command_line, git_state, run_environment, torch_build
from sharefl.simulator.results import SUMMARY_FILE, SUMMARY_KEYS
from sharefl.simulator.runner import run_one

ROOT = Path(__file__).resolve().parents[1]

TINY: dict[str, Any] = {
    "name": "provenance",
    "seed": 1,
    "rounds": 2,
    "eval_every": 1,
    "data": {
        "dataset": "synthetic",
        "options": {"num_examples": 200, "shape": [1, 4, 4], "noise": 0.4},
        "partition": "iid",
    },
    "model": {"name": "mlp", "options": {"hidden": [8]}, "init_seed": 5},
    "clients": {"honest": 2},
    "training": {"batch_size": 16, "local_steps": 1, "learning_rate": 0.5, "upload": "delta"},
    "secure_aggregation": {"cluster_size": 1},
    "aggregator": {"name": "mean"},
}


def _git(*args: str, strip: bool = True) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout
    return out.strip() if strip else out


def _in_git_checkout() -> bool:
    try:
        return _git("rev-parse", "--is-inside-work-tree") == "true"
    except (OSError, subprocess.CalledProcessError):
        return False


def test_a_finished_run_records_its_environment(tmp_path: Path) -> None:
    (run,) = expand(TINY)
    outcome = run_one(run, tmp_path)
    summary = json.loads((outcome.folder / SUMMARY_FILE).read_text())
    env = summary["environment"]
    assert env["torch"] == torch.__version__
    assert env["torch_threads"] == torch.get_num_threads()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["torch_blas"] == torch_build(torch.__config__.show())["torch_blas"]
    assert env["torch_blas"]  # every torch build names one
    assert env["numpy_blas"]
    assert env["command"] == command_line(sys.argv)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", env["finished"])
    if _in_git_checkout():
        # the state when the simulator was imported: the code this process runs (a commit may
        # land in a shared checkout between that import and this read)
        assert env["commit"] in {_git("rev-parse", "HEAD"), _git("rev-parse", "HEAD~1")}
        assert isinstance(env["uncommitted"], list)
    # and sharefl report still reads the folder
    from sharefl.simulator.results import load_runs

    (record,) = load_runs(tmp_path)
    assert record.final_accuracy == summary["final_accuracy"]
    # the keys RunRecord does not type come back as read, the environment among them
    assert record.extra["environment"] == env
    assert set(record.extra) == set(summary) - set(SUMMARY_KEYS)


@pytest.mark.skipif(not _in_git_checkout(), reason="not a git checkout")
def test_git_state_is_head_and_the_changed_tracked_files() -> None:
    commit, uncommitted = git_state(ROOT)
    head = _git("rev-parse", "HEAD")
    assert commit is not None and len(commit) == 40
    assert uncommitted is not None
    changed = _git("status", "--porcelain", "--untracked-files=no", strip=False)
    if commit == head and len(changed.splitlines()) <= 50:  # nobody committed in between
        assert sorted(uncommitted) == sorted(line[3:] for line in changed.splitlines())


def test_outside_a_checkout_the_commit_is_null(tmp_path: Path) -> None:
    assert git_state(tmp_path) == (None, None)


def test_command_line_names_the_program_as_a_reader_would_type_it() -> None:
    assert command_line(["/v/bin/sharefl", "simulate", "a b.toml", "--seeds", "1"]) == (
        "sharefl simulate 'a b.toml' --seeds 1"
    )
    assert command_line(["experiments/x_summary.py", "--page"]) == (
        "python experiments/x_summary.py --page"
    )
    assert command_line(["/v/lib/pytest/__main__.py", "-q"]) == "python -m pytest -q"
    # `python -m sharefl.cli`: argv[0] is the module's file, which no reader would type
    assert command_line(["/w/tree/sharefl/cli.py", "simulate", "f.toml"], "sharefl.cli") == (
        "python -m sharefl.cli simulate f.toml"
    )
    assert command_line([]) == ""


def test_torch_build_reads_blas_and_lapack() -> None:
    text = "  - Build settings: BLAS_INFO=open, BUILD_TYPE=Release, LAPACK_INFO=mkl, USE_MKL=ON"
    assert torch_build(text) == {"torch_blas": "open", "torch_lapack": "mkl"}
    assert torch_build("nothing") == {"torch_blas": None, "torch_lapack": None}


def test_threads_kernels_and_variables_come_from_the_process_that_runs() -> None:
    """A child with one thread and the AVX2 kernels forced records exactly that."""
    code = (
        "import json, torch; from sharefl.simulator.provenance import run_environment;"
        "torch.set_num_threads(1); print(json.dumps(run_environment()))"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    recorded = json.loads(out.stdout)
    assert recorded["torch_threads"] == 1
    assert recorded["cpu_capability"] == "DEFAULT"
    assert recorded["env"]["OMP_NUM_THREADS"] == "1"
    assert recorded["env"]["ATEN_CPU_CAPABILITY"] == "default"
    assert recorded["command"] == "python -c"


def test_a_failing_lookup_records_null(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> str:
        raise RuntimeError("no capability here")

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", broken)
    env = run_environment(["sharefl"])
    assert env["cpu_capability"] is None
    assert env["command"] == "sharefl"
