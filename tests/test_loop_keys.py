"""Every key of every table, written at its default, through every loop: a key the selected
loop reads is accepted, one it does not read is refused naming the key and the loop
(:mod:`sharefl.simulator.loop_keys`), so a file never sets something its run ignores."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sharefl.simulator.config import ALGORITHMS, RunConfig, SimulationConfigError, expand
from sharefl.simulator.loop_keys import READS, readers


def _default(cls: Any, key: str) -> Any:
    (field,) = [f for f in dataclasses.fields(cls) if f.name == key]
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _keys() -> list[tuple[str, str, Any]]:
    """(table, key, default) of every key a simulation file may write."""
    found = []
    for name, field in RunConfig.__dataclass_fields__.items():
        if field.default_factory is dataclasses.MISSING:
            continue
        instance = field.default_factory()
        if not dataclasses.is_dataclass(instance):
            continue
        for key in dataclasses.fields(instance):
            found.append((name, key.name, _default(type(instance), key.name)))
    return found


KEYS = _keys()


def _file(loop: str, table: str, key: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"clients": {"honest": 4}, "algorithm": {"name": loop}}
    data.setdefault(table, {})[key] = value
    if value is None:  # TOML has no null: such a key is written by leaving it out
        del data[table][key]
    return data


def test_every_table_is_listed_and_the_walk_sees_every_key():
    tables = {table for table, _, _ in KEYS}
    assert {"algorithm", "dp_rsa", "decentralized", "secure_aggregation", "privacy"} <= tables
    assert len(KEYS) > 80
    assert set(READS) == set(ALGORITHMS)
    listed = {table for reads in READS.values() for table in reads}
    assert listed <= tables, listed - tables  # no table named that a file cannot hold


@pytest.mark.parametrize("loop", ALGORITHMS)
def test_every_key_at_its_default_is_accepted_where_read_and_refused_elsewhere(loop):
    wrong = []
    for table, key, value in KEYS:
        if value is None:
            continue
        data = _file(loop, table, key, value)
        read = loop in readers(f"{table}.{key}")
        try:
            expand(data)
            refused = ""
        except SimulationConfigError as exc:
            refused = str(exc)
        unread = f"{table}.{key} = " in refused and f"not read by the {loop} loop" in refused
        if (read and unread) or (not read and not unread):
            wrong.append(f"{loop}: {table}.{key} = {value!r}: {refused or 'accepted'}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("loop", "table", "key", "value"),
    [
        ("federated", "dp_rsa", "penalty", 0.01),
        ("federated", "dp_rsa", "sigma_rule", "coordinate"),
        ("decentralized", "dp_rsa", "method", "rsa"),
        ("federated", "decentralized", "edge_probability", 0.7),
        ("decentralized", "secure_aggregation", "cluster_size", 3),  # its default
        ("decentralized", "aggregator", "name", "mean"),
        ("dp_rsa", "secure_aggregation", "clustering", "random"),
        ("dp_rsa", "server", "learning_rate", 1.0),
    ],
)
def test_a_key_the_loop_does_not_read_is_refused_even_at_its_default(loop, table, key, value):
    with pytest.raises(SimulationConfigError) as refused:
        expand(_file(loop, table, key, value))
    message = str(refused.value)
    assert message.startswith(f"{table}.{key} = ")
    assert f'not read by the {loop} loop ([algorithm] name = "{loop}"): remove it' in message


def test_the_refusal_names_the_loops_that_read_the_key_and_every_other_unread_key():
    data = _file("federated", "dp_rsa", "penalty", 0.01)
    data["decentralized"] = {"graph": "erdos_renyi"}
    with pytest.raises(SimulationConfigError) as refused:
        expand(data)
    message = str(refused.value)
    assert "(the dp_rsa loop reads it)" in message
    assert "also decentralized.graph" in message


def test_an_empty_table_sets_nothing_and_is_accepted():
    (run,) = expand(
        {"clients": {"honest": 4}, "algorithm": {"name": "decentralized"}, "server": {}}
    )
    assert run.algorithm.name == "decentralized"


@pytest.mark.parametrize("loop", ["dp_rsa", "decentralized"])
def test_launch_refuses_another_loop_than_the_federated_before_any_process(
    loop, tmp_path, capsys, monkeypatch
):
    import sharefl.launch
    from sharefl.cli import main
    from sharefl.exit_status import ExitStatus

    def no_process(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(sharefl.launch.subprocess, "Popen", no_process)
    path = tmp_path / "run.toml"
    method = '\n[dp_rsa]\nmethod = "rsa"' if loop == "dp_rsa" else ""
    path.write_text(f'[clients]\nhonest = 4\n[algorithm]\nname = "{loop}"{method}\n')
    assert main(["launch", str(path)]) == ExitStatus.CONFIG
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"sharefl launch: {path} runs the {loop} loop"), line
    assert "federated loop only: run it with sharefl simulate" in line


def test_the_algorithm_table_holds_the_selector_only():
    """[algorithm] name selects the loop; every key of the DP-RSA loop is [dp_rsa]'s, and
    every [dp_rsa] key is one the dp_rsa loop reads and no other loop does."""
    from sharefl.simulator.config import DP_RSA_KEYS, AlgorithmConfig, DPRSAConfig

    assert [f.name for f in dataclasses.fields(AlgorithmConfig)] == ["name"]
    assert {f.name for f in dataclasses.fields(DPRSAConfig)} == DP_RSA_KEYS
    for key in DP_RSA_KEYS:
        assert readers(f"dp_rsa.{key}") == ["dp_rsa"], key
        assert readers(f"algorithm.{key}") == [], key
    assert readers("algorithm.name") == list(ALGORITHMS)


OLD_FILE = """\
name = "old"
label = "{algorithm.method}"
[clients]
honest = 4
[algorithm]
name = "dp_rsa"
method = "dp_rsa_f"
epsilon = 0.4
"""


@pytest.mark.parametrize("where", ["table", "variant"])
def test_a_file_with_the_dp_rsa_keys_under_algorithm_is_told_how_to_move_them(where, tmp_path):
    from sharefl.simulator.config import load_runs

    text = OLD_FILE
    if where == "variant":  # the base has moved them; a variant has not
        text = text.replace('method = "dp_rsa_f"\nepsilon = 0.4\n', "")
        text = text.replace("{algorithm.method}", "{dp_rsa.method}")
        text += '[dp_rsa]\nmethod = "rsa"\n[[variant]]\nalgorithm = { method = "sgd" }\n'
    path = tmp_path / "old.toml"
    path.write_text(text)
    with pytest.raises(SimulationConfigError) as refused:
        load_runs(path)
    message = str(refused.value)
    assert "\n" not in message
    moved = "method, epsilon" if where == "table" else "method"
    assert message.startswith(f"[algorithm] holds the DP-RSA loop's keys {moved}, which moved")
    assert f"keep only name in [algorithm] and write {moved} under [dp_rsa]" in message
    # moved as the message says, the file runs the same
    fixed = text.replace('method = "dp_rsa_f"\nepsilon = 0.4\n', "")
    fixed = fixed.replace("{algorithm.method}", "{dp_rsa.method}")
    if where == "table":
        fixed += '[dp_rsa]\nmethod = "dp_rsa_f"\nepsilon = 0.4\n'
    else:
        fixed = fixed.replace('algorithm = { method = "sgd" }', 'dp_rsa = { method = "sgd" }')
    path.write_text(fixed)
    (run,) = load_runs(path)
    assert run.dp_rsa.method == ("dp_rsa_f" if where == "table" else "sgd")


def test_the_command_line_prints_the_move_in_one_line(tmp_path, capsys):
    from sharefl.cli import main
    from sharefl.exit_status import ExitStatus

    path = tmp_path / "old.toml"
    path.write_text(OLD_FILE)
    assert main(["simulate", str(path), "--out", str(tmp_path / "out")]) == ExitStatus.CONFIG
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "moved to a [dp_rsa] table" in line and "{dp_rsa.method}" in line
    assert not (tmp_path / "out").exists()


def test_a_label_naming_a_moved_key_says_where_it_went():
    data = {
        "label": "{algorithm.penalty}",
        "clients": {"honest": 4},
        "algorithm": {"name": "dp_rsa"},
        "dp_rsa": {"method": "rsa", "penalty": 0.02},
    }
    with pytest.raises(SimulationConfigError, match=r"moved to \[dp_rsa\]: \{dp_rsa\.penalty\}"):
        expand(data)
