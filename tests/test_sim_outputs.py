"""What a finished ``sharefl simulate`` run leaves beside its JSON: the final model
(``model.npz`` + ``model.json``, loadable into a freshly built module by the snippet of
docs/simulator.md) and ``rounds.csv`` (the rows of ``rounds.jsonl``), for all three loops.

The oracle for the model is the loop itself: the module rebuilt from the files must give the
logits of ``FlatModel(loop's final flat vector, inputs)`` and so the accuracy the run
reported; the oracle for the CSV is ``rounds.jsonl``, parsed independently.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from sharefl.simulator.config import expand
from sharefl.simulator.loops import build_loop
from sharefl.simulator.results import (
    AGENTS_FILE,
    MODEL_FILE,
    MODEL_META_FILE,
    ROUNDS_CSV_FILE,
    ROUNDS_FILE,
    SUMMARY_FILE,
    RoundRecord,
    RunWriter,
    csv_row,
)
from sharefl.simulator.runner import run_one

DOCS = Path(__file__).resolve().parents[1] / "docs" / "simulator.md"

FEDERATED: dict[str, Any] = {
    "name": "outputs",
    "seed": 1,
    "rounds": 4,
    "eval_every": 2,
    "data": {
        "dataset": "synthetic",
        "options": {"num_examples": 600, "shape": [1, 6, 6], "noise": 0.4},
        "partition": "iid",
    },
    "model": {"name": "mlp", "options": {"hidden": [16]}, "init_seed": 5},
    "clients": {"honest": 4},
    "training": {"batch_size": 16, "local_steps": 2, "learning_rate": 0.5, "upload": "delta"},
    "secure_aggregation": {"cluster_size": 1},
    "aggregator": {"name": "mean"},
}
RSA: dict[str, Any] = {
    "name": "outputs_rsa",
    "seed": 1,
    "rounds": 4,
    "eval_every": 2,
    "data": {"dataset": "synthetic", "options": {"shape": [1, 6, 6], "num_examples": 600}},
    "model": {"name": "seed002_mlp", "init_seed": 3},  # an alias: model.json names dp_rsa_mlp
    "clients": {"honest": 4, "byzantine": 0},
    "training": {"batch_size": 4},
    "secure_aggregation": {"cluster_size": 1},
    "algorithm": {"name": "dp_rsa"},
    "dp_rsa": {"method": "dp_rsa_f", "epsilon": 0.4},
}
DECENTRALIZED: dict[str, Any] = {
    "name": "outputs_dec",
    "seed": 1,
    "rounds": 6,
    "eval_every": 3,
    "data": {
        "dataset": "synthetic",
        "options": {"shape": [1, 4, 4], "num_examples": 600, "num_classes": 4},
    },
    "model": {"name": "decentralized_softmax", "init_seed": 100},
    "clients": {"honest": 5, "byzantine": 1},
    "training": {"batch_size": 8},
    "algorithm": {"name": "decentralized"},
    "attack": {"name": "none"},
    "decentralized": {"init_scale": 3.0},
}
LOOPS = {
    "federated": (FEDERATED, "mlp", "float32"),
    "dp_rsa": (RSA, "dp_rsa_mlp", "float32"),
    "decentralized": (DECENTRALIZED, "decentralized_softmax", "float64"),
}


def _run(config: dict[str, Any], out: Path) -> tuple[Any, Any]:
    """Run ``config``'s single run through the runner; returns (outcome, the loop)."""
    (run,) = expand(config)
    loops: list[Any] = []

    def factory(run: Any, *, device: str | None = None) -> Any:
        loops.append(build_loop(run, device=device))
        return loops[0]

    return run_one(run, out, simulation_factory=factory), loops[0]


@pytest.fixture(scope="module", params=sorted(LOOPS))
def finished(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(loop name, outcome, loop) of a finished run of each loop (run once per module)."""
    config = LOOPS[request.param][0]
    outcome, loop = _run(config, tmp_path_factory.mktemp(request.param))
    return request.param, outcome, loop


def _doc_snippet() -> str:
    """The ``<!-- load-model -->`` code block of docs/simulator.md."""
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(r"<!-- load-model -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/simulator.md lost its load-model snippet"
    return match.group(1)


def _flat_of(loop: Any) -> torch.Tensor:
    """The flat vector each loop evaluates (independent of ``final_model``)."""
    if hasattr(loop, "x0"):
        return loop.x0
    if hasattr(loop, "x"):
        return loop.x.mean(dim=0)
    return loop.model_vector


def _test_inputs(loop: Any) -> torch.Tensor:
    return getattr(loop, "test_inputs", loop.test_set.inputs)


def test_the_documented_snippet_loads_the_final_model_of_every_loop(finished):
    name, outcome, loop = finished
    _, model_name, dtype = LOOPS[name]
    folder = outcome.folder
    meta = json.loads((folder / MODEL_META_FILE).read_text())
    assert meta["model"] == model_name and meta["dtype"] == dtype and meta["loop"] == name
    assert meta["round"] == loop.run.rounds and meta["run_id"] == outcome.run.run_id
    assert meta["input_shape"] == list(loop.test_set.inputs.shape[1:])

    scope: dict[str, Any] = {}
    exec(_doc_snippet(), scope)
    model = scope["load_model"](str(folder))
    arrays = dict(np.load(folder / MODEL_FILE))
    assert {k: v.dtype.name for k, v in arrays.items()} == {k: dtype for k in arrays}
    assert [[p["name"], p["shape"]] for p in meta["parameters"]] == [
        [k, list(v.shape)] for k, v in arrays.items()
    ]

    inputs = _test_inputs(loop)
    with torch.no_grad():
        logits = model(inputs.to(getattr(torch, dtype)))
        expected = loop.model(_flat_of(loop), inputs)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    targets = loop.test_set.targets
    accuracy = int((logits.argmax(1) == targets).sum()) / len(targets)
    loss = float(torch.nn.functional.cross_entropy(logits, targets))
    assert accuracy == pytest.approx(outcome.summary["final_accuracy"], abs=1e-12)
    assert accuracy == pytest.approx(meta["test_accuracy"], abs=1e-12)
    assert loss == pytest.approx(meta["test_loss"], rel=1e-5)


def test_decentralized_runs_keep_every_agent_and_their_mean_is_the_model(finished):
    name, outcome, loop = finished
    agents_path = outcome.folder / AGENTS_FILE
    if name != "decentralized":
        assert not agents_path.exists()
        return
    agents = dict(np.load(agents_path))
    model = dict(np.load(outcome.folder / MODEL_FILE))
    assert set(agents) == set(model)
    for key, stacked in agents.items():
        assert stacked.shape == (len(loop.honest), *model[key].shape)
        np.testing.assert_allclose(stacked.mean(axis=0), model[key], rtol=0, atol=1e-12)
    meta = json.loads((outcome.folder / MODEL_META_FILE).read_text())
    assert meta["agents"] == len(loop.honest)


def _cell(cell: str, value: Any) -> bool:
    """Whether a CSV cell holds a JSON value (numbers compared as floats, exactly)."""
    if value is None:
        return cell == ""
    if isinstance(value, bool):
        return cell == str(value).lower()
    if isinstance(value, int | float):
        x = float(cell)
        return (math.isnan(x) and math.isnan(value)) or x == value
    if isinstance(value, list):
        return json.loads(cell) == value
    return cell == value


def _assert_csv_matches_jsonl(folder: Path) -> list[dict[str, str]]:
    lines = [json.loads(x) for x in (folder / ROUNDS_FILE).read_text().splitlines() if x]
    with (folder / ROUNDS_CSV_FILE).open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        rows = list(reader)
    assert (folder / ROUNDS_CSV_FILE).read_text().count("round,") == 1  # one header
    assert len(rows) == len(lines) > 0
    flat_keys = [k for line in lines for k in _flat(line)]
    assert header == list(dict.fromkeys(flat_keys))
    for row, line in zip(rows, lines, strict=True):
        flat = _flat(line)
        for key in header or []:
            assert _cell(row[key], flat.get(key)), (key, row[key], flat.get(key))
    return rows


def _flat(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_rounds_csv_holds_the_rows_of_rounds_jsonl(finished):
    name, outcome, loop = finished
    rows = _assert_csv_matches_jsonl(outcome.folder)
    evaluated = list(range(loop.run.eval_every, loop.run.rounds + 1, loop.run.eval_every))
    assert [int(r["round"]) for r in rows] == evaluated
    if name == "dp_rsa":
        assert "disagreement" in rows[0] and float(rows[0]["epsilon_round"]) == 0.4


def test_csv_rows_grow_their_header_when_a_new_key_comes(tmp_path):
    writer = RunWriter(tmp_path / "run")
    writer.start({"name": "csv"})
    records = [
        RoundRecord(1, None, None, None, 0.1),  # not evaluated: no row
        RoundRecord(2, 0.5, 1.25, None, 0.2),
        RoundRecord(4, 0.75, float("inf"), 0.6, 0.4, {"disagreement": 1.0, "flag": True}),
        RoundRecord(6, 0.25, float("nan"), 0.7, 0.5, {"share": {"accepted": 3}, "ids": [1, 2]}),
        RoundRecord(8, 0.5, 0.1, 0.8, 0.6, {"disagreement": 0.5}),
    ]
    for r in records:
        writer.record(r)
    rows = _assert_csv_matches_jsonl(writer.folder)
    assert rows[0]["disagreement"] == "" and rows[1]["flag"] == "true"
    assert rows[2]["share.accepted"] == "3" and json.loads(rows[2]["ids"]) == [1, 2]
    assert rows[1]["loss"] == "inf" and rows[2]["loss"] == "nan"
    # a writer made anew for the same folder (a run that goes on) keeps the header
    again = RunWriter(writer.folder)
    again.record(RoundRecord(10, 1.0, 0.0, 0.9, 0.7))
    assert len(_assert_csv_matches_jsonl(writer.folder)) == 5
    assert not list(writer.folder.glob(".*.tmp"))


def test_csv_row_flattens_and_writes_floats_exactly():
    assert csv_row({"a": 0.1, "b": None, "c": {"d": 1e-300}, "e": "x"}) == {
        "a": "0.1",
        "b": "",
        "c.d": "1e-300",
        "e": "x",
    }


def test_a_skipped_run_is_not_rewritten_and_a_summary_implies_a_model(tmp_path):
    outcome, _ = _run(FEDERATED, tmp_path)
    folder = outcome.folder
    names = [MODEL_FILE, MODEL_META_FILE, ROUNDS_CSV_FILE, ROUNDS_FILE, SUMMARY_FILE]
    before = {n: (os.stat(folder / n).st_mtime_ns, (folder / n).read_bytes()) for n in names}
    (run,) = expand(FEDERATED)
    again = run_one(run, tmp_path, simulation_factory=_no_loop)
    assert again.skipped
    assert {n: (os.stat(folder / n).st_mtime_ns, (folder / n).read_bytes()) for n in names} == (
        before
    )

    class Broken:
        """A loop whose model cannot be taken: the run must not look finished."""

        def __init__(self, run: Any, *, device: str | None = None) -> None:
            self.loop = build_loop(run, device=device)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.loop, name)

        def final_model(self) -> Any:
            raise RuntimeError("no model")

    (other,) = expand({**FEDERATED, "seed": 2})
    with pytest.raises(RuntimeError, match="no model"):
        run_one(other, tmp_path, simulation_factory=Broken)
    unfinished = tmp_path / other.run_id
    assert (unfinished / ROUNDS_FILE).is_file() and (unfinished / ROUNDS_CSV_FILE).is_file()
    assert not (unfinished / SUMMARY_FILE).exists() and not (unfinished / MODEL_FILE).exists()


def _no_loop(run: Any, *, device: str | None = None) -> Any:
    raise AssertionError("a finished run was built again")
