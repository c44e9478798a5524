"""Tables of docs/results/dp-filter.md, from the committed run folders.

Every run folder under ``docs/results/dp-filter/`` (``sharefl simulate experiments/<file>
--seeds S --match LABEL --out runs/dp_filter``, then the folder copied there); a cell is
the final test accuracy (%) after the file's 1,500 steps, mean ± sample std over the seeds
that were run with each seed's value after it, the seeds named when they are not 1–3, in
bold when the mean is below 20 % (a model that predicts one class). The paper's figures are
read from the experiment files' ``[paper]`` tables (so a corrected figure needs no re-run).

- ``dp-filter main``: Table 15 (no attack), Figure 1 (label flipping at 60 % and 90 %) and
  Table 3 (the Gaussian attack), the filter with and without its first stage
  (``dp_filter_mnist_table15.toml``, ``dp_filter_mnist_figure1.toml``,
  ``dp_filter_mnist_table3.toml``): ours, the paper's figure with the authors' logged seeds
  where the page compares with them, the difference in points (bold beyond 1.5), wall time.
- ``dp-filter figure1 levels``: Figure 1 as a grid (``dp_filter_mnist_figure1.toml``,
  ``dp_filter_mnist_table15.toml``): label flipping at 20, 40 and 60 % (none: Table 15's
  RA) against every ε, beside the paper's RA, which it says the curves align with.
- ``dp-filter table5``: Table 5, adaptive label flipping (``dp_filter_mnist_table5.toml``):
  per TTBB and ε, ours, the accuracy at the switch step (the last evaluation of the copy
  phase, mean over the seeds), the paper's figure and the mean of the authors' logged seeds.
- ``dp-filter belief``: Tables 10–14, the server's belief γ against a true honest fraction
  of 50 % (``dp_filter_mnist_table11.toml`` for Table 11, ``dp_filter_mnist_tables10_14.toml``
  for the others): every cell run, then per table the cells not run.
- ``dp-filter table2 attacks``: Table 2's ALIE and IPM on MNIST
  (``dp_filter_mnist_table2_mnist.toml``), beside the paper's Fashion-MNIST figures.

``python experiments/results_pages.py`` writes them into the page (``--check`` compares);
this script prints them alone.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from sharefl.simulator.config import load_runs as load_configs
from sharefl.simulator.results import RunRecord, load_runs

RUNS = Path("docs/results/dp-filter")
FILES = (
    "experiments/dp_filter_mnist_table15.toml",
    "experiments/dp_filter_mnist_figure1.toml",
    "experiments/dp_filter_mnist_table3.toml",
    "experiments/dp_filter_mnist_table5.toml",
    "experiments/dp_filter_mnist_table11.toml",
    "experiments/dp_filter_mnist_tables10_14.toml",
    "experiments/dp_filter_mnist_table2_mnist.toml",
)
COLLAPSED = 20.0
FAR = 1.5  # points from the paper beyond which the main table's difference is in bold
_FIG1 = "dp_filter_mnist_figure1"
_WITHOUT, _WITH = "filter without first stage", "filter **with** its first stage (KS + norm tests)"
# the main table's rows: (experiment file's stem, label, the paper's cell, the authors' logs:
# their per-seed final test accuracies, where the paper's figure is their mean)
MAIN_ROWS = (
    ("dp_filter_mnist_table15", "non-DP", "Table 15, no attack, plain mean (RA), non-DP", ""),
    ("dp_filter_mnist_table15", "ε=2", "Table 15, RA, ε = 2", ""),
    ("dp_filter_mnist_table15", "ε=1", "Table 15, RA, ε = 1", ""),
    ("dp_filter_mnist_table15", "ε=0.5", "Table 15, RA, ε = ½", ""),
    ("dp_filter_mnist_table15", "ε=0.25", "Table 15, RA, ε = ¼", ""),
    ("dp_filter_mnist_table15", "ε=0.125", "Table 15, RA, ε = ⅛", ""),
    (
        _FIG1,
        "30 Byzantine, ε=2, noise_filter first_stage=False",
        f"Figure 1, 60% label flipping (30 Byzantine), ε = 2, {_WITHOUT}",
        "authors' logs 96.3, 96.0, 95.9",
    ),
    (
        _FIG1,
        "30 Byzantine, ε=0.125, noise_filter first_stage=False",
        f"Figure 1, 60% label flipping, ε = ⅛, {_WITHOUT}",
        "81.5, 83.9, 83.5",
    ),
    (
        _FIG1,
        "180 Byzantine, ε=2, noise_filter first_stage=False",
        f"Figure 1, 90% label flipping (180 Byzantine), ε = 2, {_WITHOUT}",
        "5 seeds, 95.8–96.1",
    ),
    (
        _FIG1,
        "180 Byzantine, ε=0.125, noise_filter first_stage=False",
        f"Figure 1, 90% label flipping, ε = ⅛, {_WITHOUT}",
        "73.7, 76.1, 74.2, 75.6, 82.9",
    ),
    (
        "dp_filter_mnist_table3",
        "60% Gaussian, ε=0.125, first_stage=False",
        f"Table 3, 60% Gaussian attack, ε = ⅛, {_WITHOUT}",
        "87.1, 85.3, 84.8",
    ),
    (
        _FIG1,
        "30 Byzantine, ε=2, noise_filter first_stage=True",
        f"Figure 1, 60% label flipping, ε = 2, {_WITH}",
        "",
    ),
    (
        _FIG1,
        "30 Byzantine, ε=0.125, noise_filter first_stage=True",
        f"Figure 1, 60% label flipping, ε = ⅛, {_WITH}",
        "",
    ),
    (
        _FIG1,
        "180 Byzantine, ε=2, noise_filter first_stage=True",
        f"Figure 1, 90% label flipping, ε = 2, {_WITH}",
        "",
    ),
    (
        _FIG1,
        "180 Byzantine, ε=0.125, noise_filter first_stage=True",
        f"Figure 1, 90% label flipping, ε = ⅛, {_WITH}",
        "",
    ),
    (
        "dp_filter_mnist_table3",
        "60% Gaussian, ε=0.125, first_stage=True",
        f"Table 3, 60% Gaussian attack, ε = ⅛, {_WITH}",
        "",
    ),
)
# the authors' logs (logs_records/smart_attacker/iid.csv), mean final accuracy of seeds 1-3,
# TTBB 0, .2, .4, .6, .8 (their TTBB = 0 is Figure 1's 60% cell)
AUTHORS_TABLE5 = {
    2.0: (96.1, 95.8, 95.9, 95.8, 95.9),
    0.125: (83.0, 82.0, 81.3, 80.7, 81.6),
}
FIGURE1_LEVELS = ((5, 20), (13, 40), (30, 60))  # (Byzantine next to 20 honest, % of all)
FIGURE1_EPSILONS = (2.0, 1.0, 0.5, 0.25, 0.125)
EPSILON_NAMES = {2.0: "2", 1.0: "1", 0.5: "½", 0.25: "¼", 0.125: "⅛"}
TTBB = (0.0, 0.2, 0.4, 0.6, 0.8)
GAMMAS = (0.2, 0.35, 0.5, 0.65, 0.8)
EPSILONS = (0.125, 2.0)
BELIEF_TABLES = {  # (attack, i.i.d.) -> the paper's table
    ("gaussian", True): 10,
    ("olmp", True): 11,
    ("label_flipping", False): 12,
    ("gaussian", False): 13,
    ("olmp", False): 14,
}
ATTACK_NAMES = {"gaussian": "Gaussian", "olmp": "OLMP", "label_flipping": "label flipping"}
# the paper's Table 2 (Fashion-MNIST, ε = 2): ALIE ("A little") and IPM ("Inner")
FASHION_TABLE2 = {("alie", 30): 79, ("alie", 13): 80, ("ipm", 30): 80, ("ipm", 13): 80}


def _papers(root: Path) -> tuple[dict[tuple[str, str], float], dict[str, str]]:
    """(experiment file's stem, label) → the paper's accuracy (%), and the file's stem →
    its experiment name, from the files."""
    papers, names = {}, {}
    for file in FILES:
        for run in load_configs(root / file):
            names[Path(file).stem] = run.name
            if run.paper is not None:
                papers[(Path(file).stem, run.label)] = 100 * run.paper
    return papers, names


def _paper(papers: dict[tuple[str, str], float], file: str, label: str) -> str:
    value = papers.get((file, label))
    return "—" if value is None else f"{value:.0f}"


def _finished(root: Path) -> dict[tuple, list[RunRecord]]:
    """The finished runs, grouped by what makes a cell (experiment name and label)."""
    cells: dict[tuple, list[RunRecord]] = defaultdict(list)
    for run in load_runs(root / RUNS):
        if run.finished and run.final_accuracy is not None and run.seed is not None:
            cells[(run.name, run.label)].append(run)
    for runs in cells.values():
        runs.sort(key=lambda r: r.seed or 0)
    return cells


def _accuracy(runs: list[RunRecord]) -> str:
    finals = [100 * (r.final_accuracy or 0.0) for r in runs]
    mean = statistics.mean(finals)
    text = f"{mean:.1f}"
    if len(finals) > 1:
        text += f" ± {statistics.stdev(finals):.1f}"
    if mean < COLLAPSED:
        text = f"**{text}**"
    seeds = [r.seed for r in runs]
    if len(finals) > 1:
        text += f" ({', '.join(f'{x:.1f}' for x in finals)})"
    if seeds != [1, 2, 3]:
        text += f" (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
    return text


def _wall(runs: list[RunRecord]) -> str:
    minutes = sorted(r.wall_seconds / 60 for r in runs if r.wall_seconds is not None)
    if not minutes:
        return "—"
    low, high = f"{minutes[0]:.1f}", f"{minutes[-1]:.1f}"
    return low if low == high else f"{low}–{high}"


def _runs_where(
    cells: dict[tuple, list[RunRecord]], experiment: str, **where: tuple[str, object]
) -> list[RunRecord]:
    """The finished runs of the experiment whose name contains ``experiment`` and whose
    configuration has, for each ``where`` value ``(section, value)``, that value under the
    argument's name in that section; in seed order."""
    runs = [
        r
        for (name, _), group in cells.items()
        if experiment in name
        for r in group
        if all(r.config[section][key] == value for key, (section, value) in where.items())
    ]
    return sorted(runs, key=lambda r: r.seed or 0)


def main_table(
    papers: dict[tuple[str, str], float],
    names: dict[str, str],
    cells: dict[tuple, list[RunRecord]],
) -> str:
    lines = [
        "| paper cell (20 honest workers, b_c = 16, β = 0.1, 1500 steps) | ours, 1,500 steps "
        "| paper | Δ (points) | wall time (min) |",
        "|---|---|---|---|---|",
    ]
    for stem, label, cell, authors in MAIN_ROWS:
        value = papers[(stem, label)]
        paper = f"{value:.0f}" if value == round(value) else f"{value:.1f}"
        if authors:
            paper += f" ({authors})"
        runs = cells.get((names[stem], label), [])
        if not runs:
            lines.append(f"| {cell} | not run | {paper} | | |")
            continue
        delta = statistics.mean(100 * (r.final_accuracy or 0.0) for r in runs) - value
        delta_text = f"{delta:+.1f}".replace("-", "−")
        if abs(delta) > FAR:
            delta_text = f"**{delta_text}**"
        lines.append(f"| {cell} | {_accuracy(runs)} | {paper} | {delta_text} | {_wall(runs)} |")
    return "\n".join(lines)


def table5(papers: dict[tuple[str, str], float], cells: dict[tuple, list[RunRecord]]) -> str:
    lines = [
        "| TTBB | ε | ours, 1,500 steps | at the switch step (mean) | paper (Table 5) "
        "| authors' logs (mean) | wall time (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        for i, ttbb in enumerate(TTBB):
            runs = _runs_where(
                cells, "Table 5", start_fraction=("attack", ttbb), epsilon=("privacy", eps)
            )
            paper = _paper(papers, "dp_filter_mnist_table5", f"TTBB={ttbb:g}, ε={eps:g}")
            authors = f"{AUTHORS_TABLE5[eps][i]:.1f}"
            if not runs:
                lines.append(f"| {ttbb:g} | {eps:g} | not run | | {paper} | {authors} | |")
                continue
            switch = round(ttbb * (runs[0].total_rounds or 0))
            at_switch = [
                100 * rec.accuracy for r in runs for rec in r.rounds if rec.round == switch
            ]
            switch_text = f"{statistics.mean(at_switch):.1f} (step {switch})" if at_switch else "—"
            lines.append(
                f"| {ttbb:g} | {eps:g} | {_accuracy(runs)} | {switch_text} | {paper} "
                f"| {authors} | {_wall(runs)} |"
            )
    return "\n".join(lines)


def _belief_key(run: RunRecord) -> tuple[int, float, float, bool] | None:
    """(paper's table, ε, γ, first stage) of a Tables 10-14 run, None for other runs."""
    c = run.config
    table = BELIEF_TABLES.get((c["attack"]["name"], bool(c["data"]["partition_options"]["iid"])))
    options = c["aggregator"]["options"]
    if table is None or "honest_fraction" not in options or c["clients"]["byzantine"] != 20:
        return None
    return table, c["privacy"]["epsilon"], options["honest_fraction"], options["first_stage"]


def _not_run(table: int, done: set[tuple[int, float, float, bool]]) -> str:
    parts = []
    for eps in EPSILONS:
        absent = [g for g in GAMMAS if (table, eps, g, False) not in done]
        if len(absent) == len(GAMMAS):
            parts.append(f"every γ at ε = {eps:g}")
        elif absent:
            parts.append(f"γ = {', '.join(f'{g:g}' for g in absent)} at ε = {eps:g}")
    return f"Table {table}: {'; '.join(parts)}" if parts else ""


def belief(papers: dict[tuple[str, str], float], cells: dict[tuple, list[RunRecord]]) -> str:
    rows: dict[tuple[int, float, float, bool], list[RunRecord]] = {}
    for group in cells.values():
        key = _belief_key(group[0])
        if key is not None:
            rows[key] = group
    lines = [
        "| table | attack, split | γ (true 0.5) | ε | ours, 1,500 steps | best evaluation "
        "| paper | wall time (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {t: (a, iid) for (a, iid), t in BELIEF_TABLES.items()}
    for key in sorted(rows):
        table, eps, gamma, first_stage = key
        runs = rows[key]
        attack, iid = names[table]
        split = "i.i.d." if iid else "non-i.i.d."
        stage = ", **with** first stage" if first_stage else ""
        best = max(100 * (r.best_accuracy or 0.0) for r in runs)
        file = "dp_filter_mnist_table11" if table == 11 else "dp_filter_mnist_tables10_14"
        paper = _paper(papers, file, runs[0].label)
        lines.append(
            f"| {table} | {ATTACK_NAMES[attack]}, {split}{stage} | {gamma:g} | {eps:g} "
            f"| {_accuracy(runs)} | {best:.1f} | {paper} | {_wall(runs)} |"
        )
    missing = [m for table in sorted(names) if (m := _not_run(table, set(rows)))]
    text = "\n".join(lines)
    if missing:
        text += "\n\nNot run (without the first stage): " + ". ".join(missing) + "."
    return text


def figure1_levels(
    papers: dict[tuple[str, str], float],
    names: dict[str, str],
    cells: dict[tuple, list[RunRecord]],
) -> str:
    """Figure 1 as a grid: a row per label-flipping level (none: Table 15's RA), a column per
    ε, the filter without its first stage; then the paper's RA, which it says the curves
    align with."""

    def cell(stem: str, label: str) -> str:
        runs = cells.get((names[stem], label), [])
        return _accuracy(runs) if runs else "not run"

    head = " | ".join(f"ε = {EPSILON_NAMES[e]}" for e in FIGURE1_EPSILONS)
    lines = [
        f"| label flipping (Byzantine next to 20 honest) | {head} |",
        "|---" * (len(FIGURE1_EPSILONS) + 1) + "|",
        "| none (RA, Table 15) | "
        + " | ".join(cell("dp_filter_mnist_table15", f"ε={e:g}") for e in FIGURE1_EPSILONS)
        + " |",
    ]
    for byzantine, share in FIGURE1_LEVELS:
        labels = [
            f"{byzantine} Byzantine, ε={e:g}, noise_filter first_stage=False"
            for e in FIGURE1_EPSILONS
        ]
        lines.append(
            f"| {share}% ({byzantine}) | " + " | ".join(cell(_FIG1, x) for x in labels) + " |"
        )
    lines.append(
        '| paper: RA (Table 15), which Figure 1\'s curves "almost always align with" | '
        + " | ".join(
            _paper(papers, "dp_filter_mnist_table15", f"ε={e:g}") for e in FIGURE1_EPSILONS
        )
        + " |"
    )
    return "\n".join(lines)


def table2_attacks(cells: dict[tuple, list[RunRecord]]) -> str:
    lines = [
        "| attack | Byzantine, next to 20 honest | ε | ours on MNIST, 1,500 steps "
        "| best evaluation | paper (Fashion-MNIST, Table 2) | wall time (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for attack, label in (("alie", "ALIE (z = 1)"), ("ipm", "IPM (ε = 0.1)")):
        for byzantine, share in ((30, 60), (13, 40)):
            runs = _runs_where(
                cells, "Table 2", name=("attack", attack), byzantine=("clients", byzantine)
            )
            paper = FASHION_TABLE2[(attack, byzantine)]
            head = f"| {label} | {byzantine} ({share}%) | 2"
            if not runs:
                lines.append(f"{head} | not run | | {paper} | |")
                continue
            best = max(100 * (r.best_accuracy or 0.0) for r in runs)
            lines.append(f"{head} | {_accuracy(runs)} | {best:.1f} | {paper} | {_wall(runs)} |")
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    (papers, names), cells = _papers(root), _finished(root)  # read once for the five tables
    return {
        "dp-filter main": main_table(papers, names, cells),
        "dp-filter figure1 levels": figure1_levels(papers, names, cells),
        "dp-filter table5": table5(papers, cells),
        "dp-filter belief": belief(papers, cells),
        "dp-filter table2 attacks": table2_attacks(cells),
    }


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
