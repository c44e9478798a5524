"""experiments/dp_filter_selected.py counts the Byzantine uploads the DP filter selects
(docs/results/dp-filter.md quotes its counts for ALIE)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "dp_filter_selected.py"

CONFIG = """
name = "selected"
seed = 1
rounds = 40
eval_every = 20
label = "{attack.name}, γ={aggregator.options.honest_fraction}"

[data]
dataset = "synthetic"
options = { num_examples = 600, shape = [1, 8, 8], noise = 0.4 }
partition = "iid"
honest_only = true
auxiliary_per_class = 2

[model]
name = "mlp"
options = { hidden = [16] }

[clients]
honest = 6
byzantine = 9

[training]
batch_size = 16
upload = "gradient"

[privacy]
enabled = true
noise_multiplier = 0.5
clipping = "normalize"
momentum = 0.1

[attack]
name = "ipm"
options = { epsilon = 0.5 }

[secure_aggregation]
cluster_size = 1

[aggregator]
name = "noise_filter"
options = { first_stage = false, honest_fraction = 0.4 }

[[variant]]

[[variant]]
aggregator = { options = { honest_fraction = 1.0 } }
"""


def _script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The script run on :data:`CONFIG` in ``tmp_path`` with ``args``."""
    config = tmp_path / "selected.toml"
    config.write_text(CONFIG)
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(config), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def _count(tmp_path: Path, match: str, steps: int) -> dict:
    done = _script(tmp_path, "--match", match, "--steps", str(steps))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == steps
    assert not list(tmp_path.glob("dp_filter_selected-*"))  # its run folder is removed
    return report


@pytest.mark.parametrize(
    ("match", "expected"),
    [
        # γ = 1 selects all 15 rows: every step holds the 9 Byzantine ones
        ("γ=1", [9] * 5),
        # IPM points against the honest mean: below every honest upload's score, never among
        # the top ⌊0.4 · 15⌋ = 6 (this fails if the script took the wrong rows as Byzantine)
        ("γ=0.4", [0] * 5),
    ],
)
def test_it_counts_the_byzantine_rows_among_the_selected(tmp_path, match, expected):
    report = _count(tmp_path, match, steps=5)
    assert report["byzantine_selected_first_20_steps"] == expected
    assert report["steps_with_byzantine_selected"] == sum(1 for c in expected if c)
    assert report["last_step_with_byzantine_selected"] == (5 if any(expected) else 0)
    # the 6 honest rows are selected at every step either way (γ = 1: all 15 rows)
    assert report["honest_selected_per_step_mean"] == 6.0
    assert report["honest_selected_per_step_least"] == 6


def test_a_match_that_picks_no_run_is_refused_naming_the_labels(tmp_path):
    done = _script(tmp_path, "--match", "no such label")
    assert done.returncode == 2  # argparse's usage error
    assert "--match must pick one run of seed 1, got 0" in done.stderr
    assert "ipm, γ=0.4" in done.stderr and "ipm, γ=1" in done.stderr
