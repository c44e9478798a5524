"""The DP-RSA experiment files (seed002): every cell of the paper's Figures 1–7 is a run of
some ``experiments/dp_rsa_*.toml`` with the paper's settings, and the CIFAR-10 files (meant
for a GPU) run end to end on CIFAR-shaped synthetic data."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from sharefl.simulator.config import RunConfig, load_runs
from sharefl.simulator.loops import build_loop

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
EPSILONS = (0.2, 0.4, 1.38)
METHODS = ("sgd", "signsgd", "sgd_gm", "rsa", "dp_rsa_f", "dp_rsa_g")
# (partition, attack) of the three panels of Figures 1–5: two i.i.d. attacks, one non-i.i.d.
PANELS = (
    ("iid", "gaussian"),
    ("iid", "sign_flipping"),
    ("dp_rsa_shared_half", "sample_duplicating"),
)


@dataclass(frozen=True)
class Cell:
    """One curve of a figure: the keys a run must match."""

    dataset: str
    partition: str
    attack: str
    method: str
    epsilon: float | None = None
    byzantine: int | None = None  # None: the dataset's default b
    penalty: float | None = None  # None: the dataset's default λ


# The paper's settings per dataset (section 5, appendix D; note §5).
SETTINGS = {
    "mnist": dict(workers=30, byzantine=3, batch=1, rounds=5000, penalty=0.01, model="dp_rsa_mlp"),
    "cifar10": dict(
        workers=20, byzantine=2, batch=8, rounds=25000, penalty=0.002, model="dp_rsa_cnn"
    ),
}


def _comparison(dataset: str) -> list[Cell]:
    """Figures 1 and 2: every method under the three attacks (DP-RSA at every ε)."""
    cells = []
    for partition, attack in PANELS:
        for method in METHODS:
            eps = EPSILONS if method.startswith("dp_") else (None,)
            cells += [Cell(dataset, partition, attack, method, e) for e in eps]
    return cells


def _epsilon_ablation(dataset: str, method: str) -> list[Cell]:
    return [Cell(dataset, p, a, method, e) for p, a in PANELS for e in EPSILONS]


def _sweep(dataset: str, *, byzantine=(None,), penalty=(None,)) -> list[Cell]:
    """Figures 6 and 7: DP-RSA(G) at ε = 0.4, Sample-Duplicating, non-i.i.d."""
    return [
        Cell(dataset, "dp_rsa_shared_half", "sample_duplicating", "dp_rsa_g", 0.4, b, lam)
        for b in byzantine
        for lam in penalty
    ]


FIGURES = {
    "figure 1 (MNIST comparison)": _comparison("mnist"),
    "figure 2 (CIFAR-10 comparison)": _comparison("cifar10"),
    "figure 3 (MNIST, ε of Sign-Flipping)": _epsilon_ablation("mnist", "dp_rsa_f"),
    "figure 4 (MNIST, ε of Sign-Gaussian)": _epsilon_ablation("mnist", "dp_rsa_g"),
    "figure 5 (CIFAR-10, ε of Sign-Gaussian)": _epsilon_ablation("cifar10", "dp_rsa_g"),
    "figure 6 (b, MNIST)": _sweep("mnist", byzantine=(3, 6, 9)),
    "figure 6 (b, CIFAR-10)": _sweep("cifar10", byzantine=(2, 4, 6)),
    "figure 7 (λ, MNIST)": _sweep("mnist", penalty=(0.001, 0.005, 0.01, 0.02, 0.05)),
    "figure 7 (λ, CIFAR-10)": _sweep("cifar10", penalty=(0.0001, 0.001, 0.002, 0.01, 0.1)),
}


def all_runs() -> list[RunConfig]:
    runs = []
    for path in sorted(EXPERIMENTS.glob("dp_rsa_*.toml")):
        runs += load_runs(path)
    return runs


def matches(run: RunConfig, cell: Cell) -> bool:
    settings = SETTINGS[run.data.dataset]
    epsilon_ok = cell.epsilon is None or math.isclose(run.dp_rsa.epsilon, cell.epsilon)
    return (
        run.data.dataset == cell.dataset
        and run.data.partition == cell.partition
        and run.attack.name == cell.attack
        and run.dp_rsa.method == cell.method
        and epsilon_ok
        and run.clients.byzantine == (cell.byzantine or settings["byzantine"])
        and math.isclose(run.dp_rsa.penalty, cell.penalty or settings["penalty"])
    )


@pytest.mark.parametrize("figure", list(FIGURES))
def test_every_cell_of_the_figure_has_a_run_with_three_seeds(figure):
    runs = [r for r in all_runs() if r.algorithm.name == "dp_rsa"]
    for cell in FIGURES[figure]:
        seeds = {r.seed for r in runs if matches(r, cell)}
        assert seeds >= {1, 2, 3}, f"{figure}: no run (or not 3 seeds) for {cell}"


def test_every_run_has_the_papers_settings():
    for run in all_runs():
        settings = SETTINGS[run.data.dataset]
        algo = run.dp_rsa
        assert run.clients.total == settings["workers"], run.label
        assert run.training.batch_size == settings["batch"], run.label
        assert run.model.name == settings["model"], run.label
        assert (algo.lr, algo.regularization) == (0.01, 0.002), run.label
        if run.name != "dp_rsa_mnist_secure":  # 500 iterations: the protocol costs per round
            assert run.rounds == settings["rounds"], run.label
        if run.data.partition == "dp_rsa_shared_half":
            assert run.data.partition_options == {"shared_fraction": 0.5}, run.label
        if run.attack.name == "gaussian":
            assert run.attack.options.get("std", 1e4) == 1e4, run.label


def test_secure_file_pairs_secure_and_clear_runs():
    runs = load_runs(EXPERIMENTS / "dp_rsa_mnist_secure.toml")
    assert {r.secure_aggregation.enabled for r in runs} == {True, False}
    assert all(r.secure_aggregation.cluster_size >= 2 for r in runs)


CIFAR_SYNTHETIC = {
    "rounds": 2,
    "eval_every": 2,
    "device": "cpu",
    "data": {
        "dataset": "synthetic",
        "options": {"shape": [3, 32, 32], "num_examples": 400},
    },
}


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob("dp_rsa_cifar10_*.toml")), ids=str)
def test_cifar10_files_run_on_cifar_shaped_synthetic_data(path):
    runs = [r for r in load_runs(path) if r.seed == 1]
    assert all(r.data.dataset == "cifar10" and r.device == "cuda" for r in load_runs(path))
    synthetic = [r for r in load_runs(path, CIFAR_SYNTHETIC) if r.seed == 1]
    assert [r.label for r in synthetic] == [r.label for r in runs]
    if len({r.dp_rsa.method for r in synthetic}) > 1:  # comparison: a baseline, DP-RSA(G)
        chosen = [
            next(r for r in synthetic if r.dp_rsa.method == m) for m in ("sgd_gm", "dp_rsa_g")
        ]
    else:  # a sweep: both ends
        chosen = [synthetic[0], synthetic[-1]]
    for run in chosen:
        loop = build_loop(run)
        assert loop.model.dim == 576_778
        record = loop.run_rounds()
        assert record.round == 2 and 0.0 <= record.accuracy <= 1.0
        assert math.isfinite(record.loss), run.label
