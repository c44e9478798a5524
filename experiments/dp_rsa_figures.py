"""Figures 1, 3, 4, 6, 7 of DP-RSA (Zhu & Ling, seed002) on MNIST from finished runs of the
``dp_rsa_mnist_*.toml`` files: one PNG per panel and Markdown tables of final accuracy.

    python experiments/dp_rsa_figures.py RUNS_DIR [--png-dir docs/results] > tables.md

``RUNS_DIR`` holds the run folders of ``sharefl simulate`` (any depth). Each panel selects
runs by experiment name and label (:data:`PANELS`); a panel without runs is listed as not
run. Each table row: the label, the seeds that finished, the mean final accuracy over them
(with min–max when more than one), the wall time per run and the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from sharefl.simulator.report import RunRecord, load_runs, plot_accuracy

IID, NONIID = "dp_rsa_mnist_iid", "dp_rsa_mnist_noniid"
COMPARED = ("rsa", "dp_rsa_f ε=0.4", "dp_rsa_g ε=0.4", "sgd", "signsgd", "sgd_gm")
EPSILON = ("rsa", *(f"dp_rsa_{m} ε={e}" for m in "fg" for e in (0.2, 0.4, 1.38)))

# stem -> (title, experiment name, labels in order)
PANELS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "fig1-gaussian-iid": (
        "Figure 1: Gaussian attack, i.i.d.",
        IID,
        tuple(f"gaussian: {m}" for m in COMPARED),
    ),
    "fig1-sign-flipping-iid": (
        "Figure 1: Sign-Flipping attack, i.i.d.",
        IID,
        tuple(f"sign_flipping: {m}" for m in COMPARED),
    ),
    "fig1-sample-duplicating-noniid": (
        "Figure 1: Sample-Duplicating attack, non-i.i.d.",
        NONIID,
        tuple(f"sample_duplicating: {m}" for m in COMPARED),
    ),
    "fig3-4-epsilon-gaussian-iid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Gaussian attack, i.i.d.",
        IID,
        tuple(f"gaussian: {m}" for m in EPSILON),
    ),
    "fig6-byzantine-noniid": (
        "Figure 6: b, DP-RSA(G) ε=0.4, Sample-Duplicating, non-i.i.d.",
        "dp_rsa_mnist_byzantine_sweep",
        ("b=3", "b=6", "b=9"),
    ),
    "fig7-penalty-noniid": (
        "Figure 7: λ, DP-RSA(G) ε=0.4, Sample-Duplicating, non-i.i.d.",
        "dp_rsa_mnist_penalty_sweep",
        tuple(f"λ={x}" for x in (0.001, 0.005, 0.01, 0.02, 0.05)),
    ),
    "secure-vs-clear": (
        "DP-RSA(G) ε=0.4, Gaussian attack: sign sums through secure_sum vs in the clear",
        "dp_rsa_mnist_secure",
        ("secure_sum protocol=True", "secure_sum protocol=False"),
    ),
}


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def table(runs: list[RunRecord], labels: tuple[str, ...]) -> list[str]:
    """Markdown rows: label | seeds | final accuracy % | wall s per run | device."""
    rows = [
        "| run | seeds | final accuracy (%) | wall time per run (s) | device |",
        "|---|---|---|---|---|",
    ]
    for label in labels:
        done = sorted((r for r in runs if r.label == label and r.finished), key=lambda r: r.seed)
        if not done:
            rows.append(f"| {label} | not run | | | |")
            continue
        accs = [r.final_accuracy for r in done]
        acc = _pct(statistics.fmean(accs))
        if len(accs) > 1:
            acc += f" ({_pct(min(accs))}–{_pct(max(accs))})"
        walls = ", ".join(f"{r.wall_seconds:.0f}" for r in done)
        devices = ", ".join(sorted({str(r.device) for r in done}))
        seeds = ", ".join(str(r.seed) for r in done)
        rows.append(f"| {label} | {seeds} | {acc} | {walls} | {devices} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--png-dir", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    runs = load_runs(args.runs)
    for stem, (title, name, labels) in PANELS.items():
        chosen = [
            dataclasses.replace(r, name=title)
            for label in labels
            for r in runs
            if r.name == name and r.label == label
        ]
        print(f"### {title}\n")
        if chosen:
            png = plot_accuracy(chosen, args.png_dir / f"dp-rsa-{stem}.png", name=title)
            print(f"![{title}]({png.name})\n")
        print("\n".join(table([r for r in runs if r.name == name], labels)) + "\n")


if __name__ == "__main__":
    main()
