"""Every error a user can cause, played through the real ``sharefl`` command (a subprocess
with ``PYTHONPATH``): the documented exit status, one line on stderr naming what to change,
no traceback (``--debug`` shows it), and nothing left behind."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import HANG_S

from sharefl.cli import build_parser, main
from sharefl.exit_status import MEANING, ExitStatus
from sharefl.simulator.config import SimulationConfigError, load_runs
from sharefl.simulator.preflight import check_runs

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = (ROOT / "experiments" / "quickstart.toml").read_text()


def sharefl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)])}
    env.pop("SHAREFL_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "sharefl.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def in_process(
    *args: str, cwd: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> subprocess.CompletedProcess:
    """``sharefl.cli.main`` in this process, for the cases whose process start (importing
    torch) would only slow the default run: the same result object as :func:`sharefl`."""
    monkeypatch.chdir(cwd)
    try:
        status = main(list(args))
    except SystemExit as exc:  # argparse
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def one_line(result: subprocess.CompletedProcess, status: int, command: str, *words: str) -> str:
    """Assert the exit status and a one-line message that contains ``words``."""
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    prefix = f"sharefl {command}: " if command else "sharefl: "  # "": argparse's top level
    assert lines[0].startswith(prefix), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def quickstart(tmp_path: Path, old: str, new: str) -> str:
    assert old in QUICKSTART
    (tmp_path / "run.toml").write_text(QUICKSTART.replace(old, new))
    return "run.toml"


@pytest.mark.parametrize(
    "old, new, words",
    [
        ('dataset = "mnist"', 'dataset = "mnsit"', ["data.dataset", "'mnsit'", "mnist"]),
        ('name = "trimmed_mean"', 'name = "trimed_mean"', ["aggregator.name", "trimmed_mean"]),
        ("options = { f = 1 }", "options = { f = 3 }", ["f", "6 cluster means", "at most 2"]),
    ],
    ids=["dataset", "aggregator", "f-too-large"],
)
def test_a_wrong_name_fails_at_load_time_and_writes_nothing(tmp_path, old, new, words):
    config = quickstart(tmp_path, old, new)
    result = sharefl("simulate", config, "--out", "out", cwd=tmp_path)
    one_line(result, ExitStatus.CONFIG, "simulate", *words)
    assert not (tmp_path / "out").exists()  # no folder with only config.json


@pytest.mark.parametrize(
    "old, new, words",
    [
        ('name = "label_flipping"', 'name = "label_flip"', ["attack.name", "label_flipping"]),
        ('name = "dp_filter_cnn"', 'name = "dp_filter_cn"', ["model.name", "dp_filter_cnn"]),
        ("options = { f = 1 }", "options = { f = 1, g = 2 }", ["aggregator", "'g'"]),
        ('partition = "iid"', 'partition = "idd"', ["data.partition", "iid"]),
        ("cluster_size = 3", "cluster_size = 3\nbits = 33", ["bits"]),
    ],
    ids=["attack", "model", "option", "partition", "bits"],
)
def test_more_wrong_names_in_process(tmp_path, capsys, monkeypatch, old, new, words):
    config = quickstart(tmp_path, old, new)
    result = in_process("simulate", config, "--out", "out", cwd=tmp_path, capsys=capsys,
                        monkeypatch=monkeypatch)  # fmt: skip
    one_line(result, ExitStatus.CONFIG, "simulate", *words)
    assert not (tmp_path / "out").exists()


def test_missing_dataset_files_exit_6_and_write_nothing(tmp_path):
    config = quickstart(
        tmp_path,
        'dataset = "mnist"',
        'dataset = "fashion_mnist"\nroot = "data"\ndownload = false',
    )
    result = sharefl("simulate", config, "--out", "out", cwd=tmp_path)
    one_line(result, ExitStatus.DATA_MISSING, "simulate", "not found", "SHAREFL_DATA")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["gpu", "mps"])
def test_an_unknown_device_is_refused(tmp_path, device):
    result = sharefl("simulate", str(ROOT / "experiments/quickstart.toml"), "--device", device,
                     cwd=tmp_path)  # fmt: skip
    one_line(result, ExitStatus.CONFIG, "simulate", repr(device), "cpu")
    assert not (tmp_path / "runs").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_refused(tmp_path):
    result = sharefl("simulate", str(ROOT / "experiments/quickstart.toml"), "--device", "cuda",
                     cwd=tmp_path)  # fmt: skip
    one_line(result, ExitStatus.CONFIG, "simulate", "CUDA is not available", "--device cpu")


def test_out_pointing_at_a_file_is_refused(tmp_path):
    (tmp_path / "results").write_text("mine")
    result = sharefl("simulate", str(ROOT / "experiments/quickstart.toml"), "--out", "results",
                     cwd=tmp_path)  # fmt: skip
    one_line(result, ExitStatus.CONFIG, "simulate", "--out results is a file")
    assert (tmp_path / "results").read_text() == "mine"


@pytest.mark.parametrize(
    "args, command, words",
    [
        (["simulate", "FILE", "--rounds", "0"], "simulate", ["--rounds", ">= 1"]),
        (["launch", "FILE", "--clients", "0"], "launch", ["--clients", ">= 1"]),
        (["simulate", "FILE", "--rounds", "many"], "simulate", ["--rounds", "'many'"]),
        (["simulate", "FILE", "--checkpoint-every", "-1"], "simulate", [">= 0 seconds"]),
        (["simulate", "FILE", "--checkpoint-every", "nan"], "simulate", [">= 0 seconds"]),
        (["simulate", "FILE", "--checkpoint-every", "soon"], "simulate", ["'soon'"]),
        (["keygen", "--out", "k", "--clients", "0"], "keygen", ["--clients"]),
        (["simulate", "FILE", "--bogus", "1"], "simulate", ["--bogus"]),
        (["bogus"], "", ["'bogus'"]),
        (["simulate", "FILE", "--device", "cuda:x"], "simulate", ["'cuda:x'"]),
        (["launch"], "launch", ["FILE"]),
        (["launch", "a.toml", "--config", "b.toml"], "launch", ["FILE"]),
    ],
)
def test_a_bad_command_line_is_one_line(tmp_path, capsys, monkeypatch, args, command, words):
    args = [str(ROOT / "experiments/quickstart.toml") if a == "FILE" else a for a in args]
    result = in_process(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    one_line(result, ExitStatus.CONFIG, command, *words)


def test_a_bad_command_line_through_the_process(tmp_path):
    result = sharefl("simulate", "x.toml", "--rounds", "0", cwd=tmp_path)
    one_line(result, ExitStatus.CONFIG, "simulate", "--rounds", ">= 1")


def test_a_file_that_does_not_exist(tmp_path):
    one_line(sharefl("simulate", "nope.toml", cwd=tmp_path), 2, "simulate", "nope.toml")


def test_no_run_matches(tmp_path):
    result = sharefl("simulate", str(ROOT / "experiments/quickstart.toml"), "--seeds", "7",
                     cwd=tmp_path)  # fmt: skip
    one_line(result, ExitStatus.CONFIG, "simulate", "--seeds")


def test_keygen_into_a_used_folder_is_refused_and_touches_nothing(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "notes.txt").write_text("mine")
    result = sharefl("keygen", "--out", "keys", "--clients", "2", cwd=tmp_path)
    one_line(result, ExitStatus.CONFIG, "keygen", "--out keys is not empty")
    assert [p.name for p in (tmp_path / "keys").iterdir()] == ["notes.txt"]


def test_debug_shows_the_traceback(tmp_path):
    config = quickstart(tmp_path, 'dataset = "mnist"', 'dataset = "mnsit"')
    result = sharefl("--debug", "simulate", config, cwd=tmp_path)
    assert result.returncode == ExitStatus.CONFIG
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("sharefl simulate: data.dataset")


def test_launch_takes_clients_from_the_file_and_a_raising_trainer_exits_7(tmp_path):
    (tmp_path / "fails.py").write_text(
        "def train(model, *, round, client_id):\n    raise RuntimeError('no data here')\n"
    )
    (tmp_path / "deploy.toml").write_text(
        f"[server]\nclients = 3\nrounds = 1\nstage_timeout_s = {HANG_S}\n"
        "[model]\ndim = 10\n[secure_aggregation]\ncluster_size = 3\n"
    )
    result = sharefl("launch", "deploy.toml", "--trainer", "fails:train", cwd=tmp_path)
    assert result.returncode == ExitStatus.USER_CODE_FAILED, result.stderr
    assert "Traceback" not in result.stderr
    assert "client 0: the trainer fails:train raised in round 1: RuntimeError: no data here" in (
        result.stderr
    )
    assert "3 clients" in result.stderr or "0 of 3 clients" in result.stderr
    assert "no --out: the results are not kept" in result.stderr


def test_serve_without_clients_exits_10_and_serve_whose_trainers_all_raised_exits_11(tmp_path):
    (tmp_path / "fails.py").write_text(
        "def train(model, *, round, client_id):\n    raise RuntimeError('no data here')\n"
    )
    (tmp_path / "deploy.toml").write_text(
        "[server]\nclients = 3\nrounds = 1\nconnect_timeout_s = 0.1\n"
        "[model]\ndim = 10\n[secure_aggregation]\ncluster_size = 3\n"
    )
    alone = sharefl("serve", "--config", "deploy.toml", "--address", "127.0.0.1:0", cwd=tmp_path)
    line = alone.stderr.strip().splitlines()[-1]
    assert alone.returncode == ExitStatus.NO_CLIENTS, alone.stderr
    assert line.startswith("sharefl serve: only 0 clients connected"), line
    assert "connect_timeout_s" in line and "Traceback" not in alone.stderr

    (tmp_path / "deploy.toml").write_text(
        f"[server]\nclients = 3\nrounds = 2\nstage_timeout_s = {HANG_S}\n"
        "[model]\ndim = 10\n[secure_aggregation]\ncluster_size = 3\n"
    )
    raised = sharefl("launch", "deploy.toml", "--trainer", "fails:train", cwd=tmp_path)
    assert f"server exited {int(ExitStatus.CLIENTS_LOST)};" in raised.stderr, raised.stderr
    assert "sharefl serve: round 2: only 0" in raised.stderr
    assert "Traceback" not in raised.stderr


def test_main_maps_only_sharefl_errors_a_bug_keeps_its_traceback(monkeypatch):
    """A ``ValueError`` that no sharefl error class names is a bug: ``main`` lets it
    through (exit 1 with its traceback), never "bad configuration"."""
    import sharefl.launch

    def broken(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(sharefl.launch, "run_server", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["serve", "--config", "any.toml"])


def test_launch_file_is_positional_and_config_is_its_alias():
    parser = build_parser()
    assert parser.parse_args(["launch", "a.toml"]).file == "a.toml"
    assert parser.parse_args(["launch", "--config", "a.toml"]).config == "a.toml"


def test_every_status_is_documented_in_help_and_readme():
    readme = (ROOT / "README.md").read_text()
    help_text = build_parser().format_help()
    for status in ExitStatus:
        assert f"| {int(status)} | {MEANING[status]} |" in readme.replace("`", "")
        assert f"{int(status):>3}  {MEANING[status]}" in help_text


@pytest.mark.parametrize(
    ("module", "name", "status"),
    [
        ("sharefl.simulator.datasets", "MissingDataError", ExitStatus.DATA_MISSING),
        ("sharefl.simulator.errors", "SimulatorError", ExitStatus.CONFIG),
        ("sharefl.simulator.checkpoint", "CheckpointError", ExitStatus.CONFIG),
        ("sharefl.robust.base", "AggregationError", ExitStatus.CONFIG),
        ("sharefl.privacy.errors", "PrivacyError", ExitStatus.CONFIG),
        ("sharefl.protocol.errors", "ConfigurationError", ExitStatus.CONFIG),
        ("sharefl.protocol.errors", "LeakageError", ExitStatus.CONFIG),
        ("sharefl.deploy.results", "ResumeError", ExitStatus.CONFIG),
        ("sharefl.rounds.keyfiles", "KeyFileError", ExitStatus.CONFIG),
        ("sharefl.deploy.client", "ConnectionLost", ExitStatus.UNREACHABLE),
        ("sharefl.deploy.client", "ServerSilent", ExitStatus.UNREACHABLE),
        ("sharefl.deploy.client", "ServerRefused", ExitStatus.REFUSED),
        ("sharefl.deploy.client", "ServerEnded", ExitStatus.REFUSED),
        ("sharefl.deploy.client", "ServerMisbehaved", ExitStatus.SERVER_MISBEHAVED),
        ("sharefl.deploy.client", "TrainerFailed", ExitStatus.USER_CODE_FAILED),
        ("sharefl.deploy.client", "RoundsRefused", ExitStatus.ROUNDS_REFUSED),
        ("sharefl.deploy.errors", "RunStalled", ExitStatus.STALLED),
        ("sharefl.deploy.errors", "TooFewClients", ExitStatus.NO_CLIENTS),
        ("sharefl.deploy.errors", "ClientsLost", ExitStatus.CLIENTS_LOST),
        ("sharefl.protocol.errors", "StageError", None),  # sharefl went wrong: a traceback
        ("sharefl.crypto.errors", "DecryptionError", None),
    ],
)
def test_each_error_states_the_status_the_command_exits_with(module, name, status):
    import importlib

    assert getattr(importlib.import_module(module), name).exit_status is status


def test_every_experiment_passes_the_load_time_checks():
    """Every file passes on this machine with ``--device cpu`` (the CIFAR-10 files ask for
    cuda, which CI lacks); the device each file names is a valid one."""
    files = sorted(glob.glob(str(ROOT / "experiments" / "*.toml")))
    for file in files:
        if "[data]" in Path(file).read_text() or "[clients]" in Path(file).read_text():
            runs = load_runs(file)
            check_runs(runs, device="cpu")
            for run in runs:
                assert run.device == "cpu" or run.device.split(":")[0] == "cuda", file


def test_old_codenames_pass_the_load_time_checks():
    (run,) = load_runs(
        ROOT / "experiments" / "quickstart.toml",
        {"model": {"name": "seed000_cnn"}, "data": {"partition": "seed000"}},
    )
    check_runs([run])


def test_f_is_checked_against_the_sampled_clients():
    (run,) = load_runs(
        ROOT / "experiments" / "quickstart.toml",
        {"clients": {"per_round": 12}, "aggregator": {"options": {"f": 2}}},
    )
    with pytest.raises(SimulationConfigError, match="4 cluster means"):
        check_runs([run])
