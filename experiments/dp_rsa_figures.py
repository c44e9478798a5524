"""Figures 1, 3, 4, 6, 7 of DP-RSA (Zhu & Ling, seed002) on MNIST from finished runs of the
``dp_rsa_mnist_*.toml`` files: one PNG per panel and Markdown tables of final accuracy.

    python experiments/dp_rsa_figures.py RUNS_DIR [--png-dir docs/results] > tables.md

``RUNS_DIR`` holds the run folders of ``sharefl simulate`` (any depth). Each panel selects
runs by experiment name and label (:data:`PANELS`); a panel without runs is listed as not
run. Each table row: the label, the seeds that finished, the mean final accuracy over them
(with min–max when more than one) and at mid-run, the composed per-coordinate ε, the wall
time per run and the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from sharefl.simulator.report import RunRecord, load_runs, plot_accuracy

IID, NONIID = "dp_rsa_mnist_iid", "dp_rsa_mnist_noniid"
B_SWEEP, L_SWEEP = "dp_rsa_mnist_byzantine_sweep", "dp_rsa_mnist_penalty_sweep"
COMPARED = ("rsa", "dp_rsa_f ε=0.4", "dp_rsa_g ε=0.4", "sgd", "signsgd", "sgd_gm")
EPSILON = ("rsa", *(f"dp_rsa_{m} ε={e}" for m in "fg" for e in (0.2, 0.4, 1.38)))
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
        _curves(IID, COMPARED, "gaussian: "),
    ),
    "fig1-sign-flipping-iid": (
        "Figure 1: Sign-Flipping attack, i.i.d.",
        _curves(IID, COMPARED, "sign_flipping: "),
    ),
    "fig1-sample-duplicating-noniid": (
        "Figure 1: Sample-Duplicating attack, non-i.i.d.",
        _curves(NONIID, COMPARED, "sample_duplicating: "),
    ),
    "fig3-4-epsilon-gaussian-iid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Gaussian attack, i.i.d.",
        _curves(IID, EPSILON, "gaussian: "),
    ),
    "fig3-4-epsilon-sign-flipping-iid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Sign-Flipping attack, i.i.d.",
        _curves(IID, EPSILON, "sign_flipping: "),
    ),
    "fig3-4-epsilon-sample-duplicating-noniid": (
        "Figures 3-4: ε of DP-RSA(F)/(G), Sample-Duplicating attack, non-i.i.d.",
        _curves(NONIID, EPSILON, "sample_duplicating: "),
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


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _mid_run(run: RunRecord) -> float:
    """Accuracy at the evaluated round nearest half of the run (2,500 of 5,000)."""
    half = (run.total_rounds or run.rounds[-1].round) / 2
    return min(run.rounds, key=lambda rec: abs(rec.round - half)).accuracy


def table(curves: dict[str, list[RunRecord]]) -> list[str]:
    """Markdown rows: label | seeds | final accuracy % | wall s per run | device."""
    rows = [
        "| run | seeds | final accuracy (%) | at mid-run (%) | composed ε | wall time per run (s) "
        "| device |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, runs in curves.items():
        done = sorted((r for r in runs if r.finished), key=lambda r: r.seed or 0)
        if not done:
            rows.append(f"| {label} | not run | | | | | |")
            continue
        accs = [r.final_accuracy or 0.0 for r in done]
        acc = _pct(statistics.fmean(accs))
        if len(accs) > 1:
            acc += f" ({_pct(min(accs))}–{_pct(max(accs))})"
        walls = ", ".join(f"{r.wall_seconds:.0f}" for r in done)
        devices = ", ".join(sorted({str(r.device) for r in done}))
        seeds = ", ".join(str(r.seed) for r in done)
        mid = _pct(statistics.fmean(_mid_run(r) for r in done))
        eps = f"{done[0].epsilon:.1f}" if done[0].epsilon is not None else "–"
        rows.append(f"| {label} | {seeds} | {acc} | {mid} | {eps} | {walls} | {devices} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--png-dir", type=Path, default=Path("docs/results"))
    args = parser.parse_args()
    runs = load_runs(args.runs)
    for stem, (title, curves) in PANELS.items():
        chosen = {curve[0]: select(runs, title, curve) for curve in curves}
        print(f"### {title}\n")
        if any(chosen.values()):
            shown = [r for rs in chosen.values() for r in rs]
            png = plot_accuracy(shown, args.png_dir / f"dp-rsa-{stem}.png", name=title)
            print(f"![{title}]({png.name})\n")
        print("\n".join(table(chosen)) + "\n")


if __name__ == "__main__":
    main()
