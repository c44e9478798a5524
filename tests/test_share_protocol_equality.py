"""A SHARE run through the real in-process protocol equals the same run in the clear.

``secure_aggregation.enabled = false`` adds each cluster's encoded inputs in the clear;
``true`` runs the double-masking protocol (Bonawitz et al.) in every cluster of every
reclustering. :func:`sharefl.protocol.driver.secure_sum` draws the plan, the encoding and the
stochastic rounding from the same seed either way, so the released ring sums, and therefore
every round's model, must be identical. The oracle is the clear run itself: the files a
user reads (``rounds.jsonl`` without its wall-clock ``seconds``, ``model.npz``) must agree
byte for byte. ``tests/test_simulator.py`` checks this for a plain mean without
reclustering; here the SHARE path runs (R = 2 safe reclusterings, trimmed mean over cluster
means, (n_i/n)-weighted deltas, momentum, Fall-of-Empires clients), the path of
``experiments/share_mnist_protocol_cell.toml`` on a tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sharefl.simulator.config import expand
from sharefl.simulator.runner import run_grid


def share_cell(enabled: bool, *, seed: int = 1, rounds: int = 2) -> dict:
    """The protocol cell's settings on synthetic 8×8 data, 12 clients (2 Byzantine)."""
    return {
        "name": "share protocol equality",
        "seed": seed,
        "rounds": rounds,
        "eval_every": 1,
        "label": f"enabled={enabled}",
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 1200, "shape": [1, 8, 8], "noise": 0.4},
            "partition": "shards",
            "partition_options": {"labels_per_client": 5},
        },
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "clients": {"honest": 10, "byzantine": 2},
        "training": {
            "batch_size": 16,
            "local_steps": 2,
            "learning_rate": 0.05,
            "upload": "delta",
            "momentum": 0.9,
            "weighted": True,
        },
        "attack": {"name": "fall_of_empires", "options": {"beta": -10.0, "reference": "byzantine"}},
        "secure_aggregation": {
            "enabled": enabled,
            "cluster_size": 3,
            "reclusterings": 2,
            "planner": "safe",
            "clustering": "random",
            "clip": 100.0,
        },
        "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
    }


def run(config: dict, out: Path) -> Path:
    (outcome,) = run_grid(expand(config), out)
    return outcome.folder


def without_seconds(folder: Path) -> list[dict]:
    lines = (folder / "rounds.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]


def model_bytes(folder: Path) -> dict[str, bytes]:
    with np.load(folder / "model.npz") as z:
        return {k: z[k].tobytes() for k in z.files}


@pytest.fixture(scope="module")
def clear(tmp_path_factory) -> Path:
    return run(share_cell(False), tmp_path_factory.mktemp("clear"))


def test_the_protocol_run_writes_the_clear_runs_records_and_model(clear, tmp_path):
    secure = run(share_cell(True), tmp_path)
    assert len(without_seconds(clear)) == 2
    assert without_seconds(secure) == without_seconds(clear)
    assert model_bytes(secure) == model_bytes(clear)
    audit = json.loads((secure / "summary.json").read_text())["share"]["audit"]
    assert audit["rounds"] == 2 and audit["leaking_rounds"] == 0


def test_the_comparison_sees_a_different_run(clear, tmp_path):
    """The oracle can fail: another seed's protocol run differs from the clear run."""
    other = run(share_cell(True, seed=2), tmp_path)
    assert model_bytes(other) != model_bytes(clear)
    assert without_seconds(other) != without_seconds(clear)
