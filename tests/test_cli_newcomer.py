"""What a newcomer tripped on at the command line: ``--rounds`` changing σ silently, a bad
value hidden by a flag, ``info``'s columns, the error prefixes, a flag without help, "1
clusters", and experiment files that cite a wrong spelling or a missing section."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_cli_errors import in_process, one_line

from sharefl.cli import build_parser, main
from sharefl.exit_status import ExitStatus
from sharefl.simulator.config import SimulationConfigError, load_runs
from sharefl.simulator.federated.notes import rounds_override_note
from sharefl.simulator.federated.setup import PrivacyPlan
from sharefl.wording import counted

ROOT = Path(__file__).resolve().parent.parent

# Client-level DP with every client in every round: one Gaussian mechanism per round with
# q = 1, whose RDP is α/(2σ²) per round (Mironov 2017, Prop. 7), so T rounds at σ have the
# RDP curve, hence the ε, of one round at σ/√T: the σ calibrated for a target ε over T
# rounds is √T times the one for a single round, whatever the RDP → (ε, δ) conversion.
PRIVATE_RUN = """\
name = "newcomer"
seed = 1
rounds = 4
eval_every = 4

[data]
dataset = "synthetic"
partition = "iid"
options = { num_examples = 400, shape = [1, 8, 8], noise = 0.4 }

[model]
name = "mlp"
options = { hidden = [16] }

[clients]
honest = 4

[training]
batch_size = 16
local_steps = 1
learning_rate = 0.5
upload = "delta"

[privacy]
enabled = true
level = "client"
epsilon = 2.0
clip = 0.05
delta = 1e-5

[secure_aggregation]
cluster_size = 1

[aggregator]
name = "mean"
"""


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("SHAREFL_DEBUG", raising=False)


# -- 1. --rounds says what it did to σ -------------------------------------------------------


def test_rounds_override_says_how_sigma_was_recalibrated(tmp_path, capsys, monkeypatch):
    (tmp_path / "run.toml").write_text(PRIVATE_RUN)
    result = in_process("simulate", "run.toml", "--rounds", "1", "--out", "out", cwd=tmp_path,
                        capsys=capsys, monkeypatch=monkeypatch)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "recalibrated" in x]
    assert "--rounds 1: σ recalibrated to reach ε = 2 in 1 round instead of the file's 4" in line
    before, after = map(float, re.search(r": ([\d.]+) → ([\d.]+)$", line).groups())
    assert before / after == pytest.approx(math.sqrt(4), rel=1e-2)  # 3 significant digits
    summary = json.loads(next((tmp_path / "out").glob("*/summary.json")).read_text())
    assert f"{summary['privacy']['noise_multiplier']:.3g}" == f"{after:.3g}"  # the σ that ran


def test_rounds_override_names_the_discrete_sigma_too(tmp_path, capsys, monkeypatch):
    """A discrete mechanism calibrates by its own accounting; the line still says what
    σ was for the file's rounds and what runs now (fewer rounds: less noise)."""
    discrete = (
        PRIVATE_RUN.replace(
            'level = "client"\n',
            'level = "client"\nnoise_split = "cluster"\ndistributed = "skellam"\n'
            'accountant = "rdp"\n',
        )
        .replace(
            "[secure_aggregation]\ncluster_size = 1\n", "[secure_aggregation]\ncluster_size = 3\n"
        )
        .replace("[clients]\nhonest = 4\n", "[clients]\nhonest = 6\n")
    )
    (tmp_path / "run.toml").write_text(discrete)
    result = in_process("simulate", "run.toml", "--rounds", "1", "--out", "out", cwd=tmp_path,
                        capsys=capsys, monkeypatch=monkeypatch)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "recalibrated" in x]
    assert "(by the skellam mechanism's accounting)" in line
    before, after = map(float, re.search(r": ([\d.]+) → ([\d.]+)$", line).groups())
    assert before > after * 1.5


def test_no_note_where_sigma_did_not_change(tmp_path):
    (tmp_path / "run.toml").write_text(PRIVATE_RUN)
    (run,) = load_runs(tmp_path / "run.toml")
    calibrated = PrivacyPlan(1.0, 1e-5, 1.0, 1, target_epsilon=2.0, level="client")
    configured = PrivacyPlan(1.0, 1e-5, 1.0, 1, target_epsilon=None, level="client")
    assert rounds_override_note(SimpleNamespace(run=run, privacy=calibrated), run.rounds) is None
    assert rounds_override_note(SimpleNamespace(run=run, privacy=configured), 9) is None
    assert rounds_override_note(SimpleNamespace(run=run), 9) is None  # a loop without a plan


# -- 2. the file is checked as written, before the command line's overrides ---------------


def test_a_bad_value_is_not_hidden_by_the_flag_that_replaces_it(tmp_path, capsys, monkeypatch):
    text = (ROOT / "experiments" / "quickstart.toml").read_text()
    assert re.search(r"^rounds = \d+$", text, flags=re.M)
    (tmp_path / "run.toml").write_text(
        re.sub(r"^rounds = \d+$", 'rounds = "many"', text, flags=re.M)
    )
    result = in_process("simulate", "run.toml", "--rounds", "1", "--out", "out", cwd=tmp_path,
                        capsys=capsys, monkeypatch=monkeypatch)  # fmt: skip
    one_line(result, ExitStatus.CONFIG, "simulate", "rounds", "'many'")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SimulationConfigError, match=r"run\.toml: rounds .*'many'"):
        load_runs(tmp_path / "run.toml", {"rounds": 1})


# -- 3. info's table -------------------------------------------------------------------------


def test_info_aligns_every_colon_also_after_a_long_key(capsys, monkeypatch):
    import sharefl.cli

    def colons() -> set[int]:
        assert main(["info"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert all(":" not in line[: line.index(": ")] for line in lines)  # key, then ": "
        return {line.index(": ") for line in lines}

    assert len(colons()) == 1  # torch_cuda_build was one column off
    real = sharefl.cli.machine_info
    long_key = "a_key_longer_than_any_other_key"
    monkeypatch.setattr(sharefl.cli, "machine_info", lambda: {**real(), long_key: "x"})
    assert colons() == {len(long_key)}


# -- 4. one error prefix: "sharefl COMMAND: " --------------------------------------------------


@pytest.mark.parametrize(
    "args, command, words",
    [
        (["serve", "--config", "bad.toml"], "serve", ["server.clients"]),
        (["launch", "bad.toml"], "launch", ["server.clients"]),
        (["client", "--server", "127.0.0.1:9", "--id", "0", "--keys", "nokeys"], "client",
         ["--keys nokeys"]),
        (["simulate", "x.toml", "--bogus"], "simulate", ["unrecognized", "--bogus"]),
    ],
    ids=["serve", "launch", "client", "unknown-option"],
)  # fmt: skip
def test_every_command_prefixes_its_error_with_its_name(
    tmp_path, capsys, monkeypatch, args, command, words
):
    (tmp_path / "bad.toml").write_text("[server]\nclients = 0\n")
    result = in_process(*args, cwd=tmp_path, capsys=capsys, monkeypatch=monkeypatch)
    one_line(result, ExitStatus.CONFIG, command, *words)


# -- 5. every option has help ----------------------------------------------------------------


def test_every_option_of_every_command_has_help():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, f"sharefl {name} {'/'.join(action.option_strings)}"


# -- 6. counted nouns ------------------------------------------------------------------------


def test_counted_nouns():
    assert [counted(n, "cluster") for n in (0, 1, 2)] == ["0 clusters", "1 cluster", "2 clusters"]
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(3, "entry", "entries") == "3 entries"


def test_keygen_says_one_client(tmp_path, capsys):
    assert main(["keygen", "--out", str(tmp_path / "keys"), "--clients", "1"]) == 0
    assert "wrote keys for 1 client to" in capsys.readouterr().out


# -- 7, 8. experiment files cite the current spelling and sections that exist --------------


def _comments(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [x.lstrip("#").strip() for x in lines if x.lstrip().startswith("#")]


def _sections(document: Path) -> set[str]:
    return {x.lstrip("#").strip() for x in document.read_text().splitlines() if x.startswith("#")}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "experiments").glob("*.toml")), ids=lambda p: p.name
)
def test_experiment_comments_use_current_commands_and_existing_sections(path):
    comments = _comments(path)
    for line in comments:  # a command is on one line, up to a closing backquote
        for command in re.findall(r"sharefl ((?:launch|simulate) [^`]+)", line):
            args = build_parser().parse_args(shlex.split(command))
            if args.command == "launch":
                assert args.file and args.config is None, f"{path.name}: {command}"
    joined = " ".join(comments)  # a section's title may wrap
    for document, section in re.findall(r"(README|docs/[\w-]+\.md),? \"([^\"]+)\"", joined):
        file = ROOT / ("README.md" if document == "README" else document)
        assert file.is_file() and section in _sections(file), f"{path.name}: {document} {section!r}"


def test_readme_uses_the_current_launch_spelling():
    assert "launch --config" not in (ROOT / "README.md").read_text()


def test_an_interrupt_before_the_first_run_still_exits_130(monkeypatch, tmp_path, capsys):
    """SIGTERM (or Ctrl-C) while the grid is still being checked is the same stop as during a
    run: exit 130 and one line, not an uncaught KeyboardInterrupt (seen once in CI as -2)."""
    import signal

    import sharefl.simulator.preflight as preflight

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(preflight, "check_runs", interrupted)
    try:
        status = main(["simulate", "experiments/quickstart.toml", "--out", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == ExitStatus.INTERRUPTED == 130
    assert "interrupted" in capsys.readouterr().err
