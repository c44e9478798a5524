"""``sharefl simulate`` checks its file before it imports torch, and messages point the
right way: a deployment file given to ``simulate`` names ``launch``/``serve``; a bad
``--keys`` names ``--keys``.

Whether torch was imported is read from ``sys.modules`` of a fresh interpreter, not from
the time the command took (torch's import is what made a missing file wait 9-47 s)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sharefl.cli import main
from sharefl.deploy.keygen import keygen
from sharefl.exit_status import ExitStatus

ROOT = Path(__file__).resolve().parents[1]
GOOD = (ROOT / "experiments" / "quickstart.toml").read_text()


def _simulate_in_a_fresh_interpreter(config: Path, *args: str) -> dict:
    """``sharefl simulate config *args`` in a new Python; its status, its stderr and whether
    it imported torch."""
    code = (
        "import contextlib, io, json, sys\n"
        "from sharefl.cli import main\n"
        "err = io.StringIO()\n"
        "with contextlib.redirect_stderr(err):\n"
        f"    status = main(['simulate', {str(config)!r}, *{list(args)!r}])\n"
        "print(json.dumps({'status': status, 'stderr': err.getvalue(),\n"
        "                  'torch': 'torch' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


BAD_FILES = {
    "missing": None,
    "not TOML": "rounds = = 3\n",
    "unknown key": GOOD + "\nroundz = 3\n",
    "bad value": re.sub(r"(?m)^rounds = \d+$", "rounds = 0", GOOD),
    "unknown table": "[experiment]\nname = 'x'\n",
    "deployment file": (ROOT / "experiments" / "loopback.toml").read_text(),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_file_fails_before_torch_is_imported(case, tmp_path):
    assert BAD_FILES["bad value"] != GOOD  # the case edits a line that exists
    config = tmp_path / "run.toml"
    if BAD_FILES[case] is not None:
        config.write_text(BAD_FILES[case])
    result = _simulate_in_a_fresh_interpreter(config, "--out", str(tmp_path / "out"))
    assert result["status"] == ExitStatus.CONFIG, result
    assert result["stderr"].count("\n") == 1 and "Traceback" not in result["stderr"]
    assert result["torch"] is False, result
    assert not (tmp_path / "out").exists()


def test_the_probe_sees_torch_once_the_file_is_valid(tmp_path):
    """The other side of the line: a valid file reaches the checks that need torch (a
    model name is looked up among torch models), so the probe above can fail."""
    config = tmp_path / "run.toml"
    config.write_text(GOOD.replace('name = "dp_filter_cnn"', 'name = "no-such-model"'))
    assert config.read_text() != GOOD
    result = _simulate_in_a_fresh_interpreter(config, "--out", str(tmp_path / "out"))
    assert result["status"] == ExitStatus.CONFIG and "no-such-model" in result["stderr"]
    assert result["torch"] is True


def test_simulate_of_a_deployment_file_names_launch_and_serve(tmp_path, capsys):
    deployment = ROOT / "experiments" / "loopback.toml"
    assert main(["simulate", str(deployment), "--out", str(tmp_path)]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "is a deployment file" in err and "sharefl launch" in err and "sharefl serve" in err
    assert "unknown key" not in err


def test_a_simulation_file_with_an_error_is_not_called_a_deployment_file(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(GOOD + "\nroundz = 3\n")
    assert main(["simulate", str(config), "--out", str(tmp_path / "o")]) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert "roundz" in err and "deployment" not in err


def test_client_keys_that_do_not_exist_name_the_option(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    args = ["client", "--server", "127.0.0.1:9", "--id", "0", "--keys", str(missing)]
    assert main(args) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"--keys {missing} is not a folder" in err and "keygen" in err
    assert err.count("\n") == 1


def test_client_keys_without_this_clients_files_name_the_option_and_the_id(tmp_path, capsys):
    keys = keygen(tmp_path / "keys", range(2))
    args = ["client", "--server", "127.0.0.1:9", "--id", "5", "--keys", str(keys)]
    assert main(args) == ExitStatus.CONFIG
    err = capsys.readouterr().err
    assert f"--keys {keys} has no client-5.pem" in err and "client 5" in err
