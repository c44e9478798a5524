"""Tables of docs/results/dp-rsa.md, from the committed run folders.

- ``dp-rsa eps``: Figures 3-4 under Sign-Flipping (i.i.d., ``experiments/dp_rsa_mnist_iid.toml``)
  and Sample-Duplicating (non-i.i.d., ``experiments/dp_rsa_mnist_noniid.toml``), every
  method and ε at 5,000 iterations (``docs/results/dp-rsa/runs-eps/``): per cell the final
  test accuracy (%), mean ± sample std over the seeds with each seed's value, and the mean at
  mid-run (iteration 2,500) in brackets; a cell with fewer than three seeds names them. A
  final mean below 20 % (a model that predicts one class) is set in bold.

- ``dp-rsa figure1 gaussian``, ``dp-rsa figure1 sign-flipping``, ``dp-rsa figure1
  sample-duplicating``: Figure 1's panels, RSA and DP-RSA at ε = 0.4 from ``runs-eps/`` and
  the baselines (SGD, SignSGD, geometric median) from ``docs/results/dp-rsa/baselines/``
  (the same two files); ``dp-rsa figure3-4 gaussian``: every ε of DP-RSA(F)/(G) under the
  Gaussian attack beside RSA, from ``runs-eps/``;
  ``dp-rsa figure6``, ``dp-rsa figure7``, ``dp-rsa secure``: one row per run label of
  ``docs/results/dp-rsa/figure6/`` (``experiments/dp_rsa_mnist_byzantine_sweep.toml``, b),
  ``.../figure7/`` (``dp_rsa_mnist_penalty_sweep.toml``, λ) and ``.../secure/``
  (``dp_rsa_mnist_secure.toml --rounds 100``, the sign sums through the protocol and in the
  clear): the seeds, the final accuracy (mean, min–max over the seeds), the mean accuracy at
  mid-run (half the iterations), the composed ε, each run's wall time and the device.

``python experiments/results_pages.py`` writes them into the page (``--check`` compares); this
script prints it alone.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from functools import cache
from pathlib import Path

from sharefl.simulator.results import RunRecord, load_runs

RUNS_EPS = Path("docs/results/dp-rsa/runs-eps")
_BASELINES = ("sgd", "signsgd", "sgd_gm")
FIGURE1_METHODS = ("rsa", "dp_rsa_f ε=0.4", "dp_rsa_g ε=0.4", *_BASELINES)
METHODS = (  # the ε panels' rows: label after the attack's prefix -> row name
    ("rsa", "RSA"),
    *(
        (f"dp_rsa_{m} ε={e}", f"DP-RSA({m.upper()}) ε = {e}")
        for m in "fg"
        for e in ("0.2", "0.4", "1.38")
    ),
)
EPSILON_METHODS = tuple(label for label, _ in METHODS)
RUN_TABLES = {  # block -> (folders, labels in order)
    "dp-rsa figure1 gaussian": (
        ("docs/results/dp-rsa/runs-eps", "docs/results/dp-rsa/baselines"),
        tuple(f"gaussian: {m}" for m in FIGURE1_METHODS),
    ),
    "dp-rsa figure3-4 gaussian": (
        ("docs/results/dp-rsa/runs-eps",),
        tuple(f"gaussian: {m}" for m in EPSILON_METHODS),
    ),
    "dp-rsa figure1 sign-flipping": (
        ("docs/results/dp-rsa/runs-eps", "docs/results/dp-rsa/baselines"),
        tuple(f"sign_flipping: {m}" for m in FIGURE1_METHODS),
    ),
    "dp-rsa figure1 sample-duplicating": (
        ("docs/results/dp-rsa/runs-eps", "docs/results/dp-rsa/baselines"),
        tuple(f"sample_duplicating: {m}" for m in FIGURE1_METHODS),
    ),
    "dp-rsa figure6": (("docs/results/dp-rsa/figure6",), ("b=3", "b=6", "b=9")),
    "dp-rsa figure7": (
        ("docs/results/dp-rsa/figure7",),
        tuple(f"λ={x}" for x in ("0.001", "0.005", "0.01", "0.02", "0.05")),
    ),
    "dp-rsa secure": (
        ("docs/results/dp-rsa/secure",),
        ("secure_sum protocol=True", "secure_sum protocol=False"),
    ),
}
PANELS = (
    ("dp_rsa_mnist_iid", "sign_flipping", "Sign-Flipping, i.i.d."),
    ("dp_rsa_mnist_noniid", "sample_duplicating", "Sample-Duplicating, non-i.i.d."),
)
MID_RUN = 2500
COLLAPSED = 0.20


@cache
def _finished(folder: Path) -> tuple[RunRecord, ...]:
    """The finished runs under ``folder`` (read and checked by :func:`load_runs`; empty when
    it is missing), read once per process: several tables use the same folder."""
    if not folder.is_dir():
        return ()
    return tuple(r for r in load_runs(folder) if r.finished and r.final_accuracy is not None)


def _runs(folder: Path) -> dict[tuple[str, str], dict[int, tuple[float, float | None]]]:
    """(experiment name, label) → seed → (final accuracy, accuracy at :data:`MID_RUN`), from
    the finished runs under ``folder``."""
    found: dict[tuple[str, str], dict[int, tuple[float, float | None]]] = defaultdict(dict)
    for run in _finished(folder):
        if run.seed is None or run.final_accuracy is None:
            continue
        mid = next((r.accuracy for r in run.rounds if r.round == MID_RUN), None)
        found[(run.name, run.label)][run.seed] = (run.final_accuracy, mid)
    return found


def _cell(seeds: dict[int, tuple[float, float | None]]) -> str:
    if not seeds:
        return "not run"
    order = sorted(seeds)
    finals = [100 * seeds[s][0] for s in order]
    mids = [100 * m for s in order if (m := seeds[s][1]) is not None]
    mean = statistics.mean(finals)
    text = f"{mean:.2f}"
    if len(finals) > 1:
        text += f" ± {statistics.stdev(finals):.2f}"
    if mean < 100 * COLLAPSED:
        text = f"**{text}**"
    text += f" ({' / '.join(f'{x:.2f}' for x in finals)})"
    if order != [1, 2, 3]:
        text += f" (seeds {', '.join(map(str, order))})"
    if mids:
        text += f" [{statistics.mean(mids):.2f}]"
    return text


def eps_table(root: Path) -> str:
    runs = _runs(root / RUNS_EPS)
    lines = [
        "| run | " + " | ".join(title for _, _, title in PANELS) + " |",
        "|---|" + "---|" * len(PANELS),
    ]
    for method, name in METHODS:
        cells = [_cell(runs.get((exp, f"{attack}: {method}"), {})) for exp, attack, _ in PANELS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_table(root: Path, block: str) -> str:
    folders, labels = RUN_TABLES[block]
    found: dict[str, list] = defaultdict(list)
    for folder in folders:
        for run in _finished(root / folder):
            found[run.label].append(run)
    lines = [
        "| run | seeds | final accuracy (%) | at mid-run (%) | composed ε "
        "| wall time per run (s) | device |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        runs = sorted(found.get(label, []), key=lambda r: r.seed or 0)
        if not runs:
            lines.append(f"| {label} | – | not run | | | | |")
            continue
        finals = [100 * (r.final_accuracy or 0.0) for r in runs]
        final = f"{statistics.mean(finals):.2f}"
        if len(finals) > 1:
            final += f" ({min(finals):.2f}–{max(finals):.2f})"
        mids = [
            100 * rec.accuracy
            for r in runs
            for rec in r.rounds
            if rec.round == (r.total_rounds or 0) // 2 and rec.accuracy is not None
        ]
        mid = f"{statistics.mean(mids):.2f}" if mids else "–"
        eps = "–" if runs[0].epsilon is None else f"{runs[0].epsilon:.1f}"
        walls = ", ".join(f"{r.wall_seconds:.0f}" for r in runs)
        devices = ", ".join(sorted({r.device or "?" for r in runs}))
        seeds = ", ".join(str(r.seed) for r in runs)
        lines.append(f"| {label} | {seeds} | {final} | {mid} | {eps} | {walls} | {devices} |")
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    return {"dp-rsa eps": eps_table(root), **{b: run_table(root, b) for b in RUN_TABLES}}


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
