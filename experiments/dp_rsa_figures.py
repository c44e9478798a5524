"""Draw the PNGs of DP-RSA's Figures 1, 3, 4, 6, 7 (MNIST) from finished run folders.

One PNG per panel (Zhu & Ling, seed002), from runs of the ``dp_rsa_mnist_*.toml`` files.

    python experiments/dp_rsa_figures.py [RUNS_DIR] [--png-dir docs/results]

``RUNS_DIR`` (default ``docs/results/dp-rsa``, the committed folders) holds the run folders
of ``sharefl simulate`` (any depth). Each panel selects runs by experiment name and label
(:data:`PANELS`): the mean accuracy curve over the seeds of each, with its min–max band; a
panel without runs is named as not run. The page's tables of the same runs come from
``experiments/dp_rsa_summary.py`` (``python experiments/results_pages.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dp_rsa_summary import EPSILON_METHODS, FIGURE1_METHODS  # experiments/, the page's tables

from sharefl.simulator.report import RunRecord, load_runs, plot_accuracy

IID, NONIID = "dp_rsa_mnist_iid", "dp_rsa_mnist_noniid"
B_SWEEP, L_SWEEP = "dp_rsa_mnist_byzantine_sweep", "dp_rsa_mnist_penalty_sweep"
# The sweeps' default cell (b = 3, λ = 0.01) is the non-i.i.d. file's DP-RSA(G) ε = 0.4 cell:
# the same configuration but for the experiment name, so it is used when the sweep lacks it.
DEFAULT_CELL = ((NONIID, "sample_duplicating: dp_rsa_g ε=0.4"),)

# A curve: its label in the panel and the (experiment name, label) sources, first found wins.
Curve = tuple[str, tuple[tuple[str, str], ...]]


def _curves(name: str, labels: tuple[str, ...], prefix: str = "") -> tuple[Curve, ...]:
    return tuple((prefix + x, ((name, prefix + x),)) for x in labels)


# stem -> (title, curves in order)
PANELS: dict[str, tuple[str, tuple[Curve, ...]]] = {
    "fig1-gaussian-iid": (
        "Figure 1: Gaussian attack, i.i.d.",
        _curves(IID, FIGURE1_METHODS, "gaussian: "),
    ),
    "fig1-sign-flipping-iid": (
        "Figure 1: Sign-Flipping attack, i.i.d.",
        _curves(IID, FIGURE1_METHODS, "sign_flipping: "),
    ),
    "fig1-sample-duplicating-noniid": (
        "Figure 1: Sample-Duplicating attack, non-i.i.d.",
        _curves(NONIID, FIGURE1_METHODS, "sample_duplicating: "),
    ),
    "fig3-4-epsilon-gaussian-iid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Gaussian attack, i.i.d.",
        _curves(IID, EPSILON_METHODS, "gaussian: "),
    ),
    "fig3-4-epsilon-sign-flipping-iid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Sign-Flipping attack, i.i.d.",
        _curves(IID, EPSILON_METHODS, "sign_flipping: "),
    ),
    "fig3-4-epsilon-sample-duplicating-noniid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Sample-Duplicating attack, non-i.i.d.",
        _curves(NONIID, EPSILON_METHODS, "sample_duplicating: "),
    ),
    "fig6-byzantine-noniid": (
        "Figure 6: b, DP-RSA(G) ε=0.4, Sample-Duplicating, non-i.i.d.",
        (("b=3", ((B_SWEEP, "b=3"), *DEFAULT_CELL)), *_curves(B_SWEEP, ("b=6", "b=9"))),
    ),
    "fig7-penalty-noniid": (
        "Figure 7: λ, DP-RSA(G) ε=0.4, Sample-Duplicating, non-i.i.d.",
        (
            *_curves(L_SWEEP, ("λ=0.001", "λ=0.005")),
            ("λ=0.01", ((L_SWEEP, "λ=0.01"), *DEFAULT_CELL)),
            *_curves(L_SWEEP, ("λ=0.02", "λ=0.05")),
        ),
    ),
    "secure-vs-clear": (
        "DP-RSA(G) ε=0.4, Gaussian attack: sign sums through secure_sum vs in the clear",
        _curves("dp_rsa_mnist_secure", ("protocol=True", "protocol=False"), "secure_sum "),
    ),
}


def select(runs: list[RunRecord], title: str, curve: Curve) -> list[RunRecord]:
    """The runs of one curve (from its first source that has any), renamed to the panel's
    title and the curve's label for plotting."""
    shown, sources = curve
    for name, label in sources:
        found = [r for r in runs if r.name == name and r.label == label]
        if found:
            return [dataclasses.replace(r, name=title, label=shown) for r in found]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="?", default=Path("docs/results/dp-rsa"))
    parser.add_argument("--png-dir", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    runs = load_runs(args.runs)
    for stem, (title, curves) in PANELS.items():
        shown = [r for curve in curves for r in select(runs, title, curve)]
        if shown:
            png = plot_accuracy(shown, args.png_dir / f"dp-rsa-{stem}.png", name=title)
            print(f"{png}: {len({(r.label, r.seed) for r in shown})} runs")
        else:
            print(f"{title}: not run")


if __name__ == "__main__":
    main()
