"""What the docs and comments promise, checked against what the code does: the σ in
quickstart.toml's comment is the σ its run calibrates; the input scaling ``load_model``'s
docstring states is the one runs train on; the Flower examples' READMEs promise a bar,
not an exact accuracy a run does not reproduce, and never advise ``pkill -f``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from sharefl.simulator.config import load_runs
from sharefl.simulator.federated.setup import privacy_plan
from sharefl.simulator.setup import load_data

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "experiments" / "quickstart.toml"
EXAMPLE_READMES = sorted((ROOT / "examples").glob("flower_share*/README.md"))


def readme_bar(readme: str) -> float:
    """The accuracy an example's README promises after the last round ("at least X")."""
    (bar,) = re.findall(r"accuracy after round 5 of at least (0\.[0-9]+)", readme)
    return float(bar)


def test_quickstarts_sigma_comment_is_the_sigma_its_run_calibrates():
    text = QUICKSTART.read_text(encoding="utf-8")
    (comment,) = re.findall(r"^epsilon = .*#(.*)$", text, re.MULTILINE)
    (examples,) = map(int, re.findall(r"δ = 1/(\d+)\^1\.1", comment))
    (stated,) = map(float, re.findall(r"σ ≈ ([0-9.]+)", comment))
    (run,) = load_runs(QUICKSTART)
    total = run.clients.honest + run.clients.byzantine
    assert examples == 60_000 // total  # MNIST's training set split iid over the clients
    plan = privacy_plan(run, examples, dim=1)
    assert round(plan.noise_multiplier, 2) == stated, plan.noise_multiplier


def _load_model_docstring() -> str:
    text = (ROOT / "docs" / "simulator.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- load-model -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/simulator.md lost its load-model snippet"
    (function,) = [n for n in ast.parse(match.group(1)).body if isinstance(n, ast.FunctionDef)]
    return ast.get_docstring(function) or ""


def test_load_models_docstring_states_the_scaling_runs_train_on():
    docstring = " ".join(_load_model_docstring().split())
    assert "images in [0, 1] (pixel bytes / 255, no mean/std normalisation)" in docstring
    assert "(x - mean) / std per channel if the run set data.input_mean" in docstring
    few = {"train_examples": 50, "test_examples": 50}
    (run,) = load_runs(QUICKSTART, {"data": few})
    _, test = load_data(run, torch.device("cpu"))
    pixels = test.inputs * 255
    assert test.inputs.min() >= 0 and test.inputs.max() == 1
    torch.testing.assert_close(pixels, pixels.round(), rtol=0, atol=1e-4)
    override = {"data": {**few, "input_mean": [0.5], "input_std": [0.25]}}
    (standardised,) = load_runs(QUICKSTART, override)
    _, scaled = load_data(standardised, torch.device("cpu"))
    torch.testing.assert_close(scaled.inputs, (test.inputs - 0.5) / 0.25)


@pytest.mark.parametrize("readme", EXAMPLE_READMES, ids=lambda p: p.parent.name)
def test_an_example_readme_promises_a_bar_not_an_exact_accuracy(readme):
    text = readme.read_text(encoding="utf-8")
    assert 0.5 < readme_bar(text) < 1
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL)
    exact = [
        line
        for block in blocks
        for line in block.splitlines()
        if "accuracy" in line and re.search(r"\b[0-9]\.[0-9]+", line)
    ]
    assert exact == [], "expected output with an exact accuracy a run does not reproduce"


@pytest.mark.parametrize("readme", EXAMPLE_READMES, ids=lambda p: p.parent.name)
def test_an_example_readme_advises_no_pkill(readme):
    """``pkill -f`` is named only to warn against it ("(Not `pkill -f ...`")."""
    text = " ".join(readme.read_text(encoding="utf-8").split())
    for match in re.finditer("pkill", text):
        before = text[max(0, match.start() - 6) : match.start()]
        assert before == "(Not `", text[match.start() - 80 : match.end() + 80]
