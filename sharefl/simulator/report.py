"""Reports of simulator runs: Markdown tables, accuracy curves and a JSON summary.

``sharefl simulate FILE --out DIR`` writes one folder per run, at any depth under ``DIR``::

    <run>/config.json    the expanded run configuration (any JSON object)
    <run>/rounds.jsonl   one JSON object per evaluated round:
                         {"round", "accuracy", "loss", "epsilon", "seconds", ...}
    <run>/summary.json   written when the run finished:
                         {"run_id", "name", "label", "seed", "final_accuracy", "best_accuracy",
                          "epsilon", "delta", "rounds", "wall_seconds", "device", "paper",
                          "config", "plot_metrics" (optional)}

A loop may list, in ``summary.json``'s ``"plot_metrics"``, numeric keys of its
``rounds.jsonl`` lines beyond accuracy and loss (the decentralized loop's
``consensus_error``): the report draws one more plot per listed metric and experiment,
``DIR/<name>_<metric>.png`` (:func:`plot_metric`).

A folder with ``rounds.jsonl`` but no ``summary.json`` is an *unfinished* run: it is drawn
in the plots and counted as unfinished in the tables, but it never enters the final-accuracy
statistics. Its experiment name, label and seed are read from ``config.json`` (keys
``"name"``, ``"label"``, ``"seed"``); without them the name is the parent folder's path
relative to ``DIR`` and the label is the run folder's name.

The files and their reader (:func:`load_runs`, :class:`RunRecord`, :class:`RoundRecord`)
are :mod:`sharefl.simulator.results`, shared with the writers. The pipeline is
:func:`load_runs` → :func:`summarize` → :func:`markdown_table` /
:func:`plot_accuracy`, and :func:`write_report` does all of it::

    DIR/report.md      one section per experiment name: a table and the accuracy plot
    DIR/report.json    the list of :class:`GroupSummary` as JSON objects
    DIR/<name>.png     accuracy vs round, one line per label (mean over seeds, min-max band)

Accuracies are fractions in ``[0, 1]`` in the data and in ``report.json``; the Markdown
tables and the plots show percent. Every malformed input raises :class:`ReportError` (a
``ValueError``) naming the file, and the line for ``rounds.jsonl``.

matplotlib is imported only by the plotting functions (with the non-interactive Agg canvas,
no pyplot state), so importing this module never needs it.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharefl.simulator.deployment_report import (
    deployment_folders,
    deployment_name,
    deployment_section,
)
from sharefl.simulator.plot_parts import last_round, matplotlib_parts, planned_rounds, round_axis
from sharefl.simulator.results import (
    ResultsError,
    RoundRecord,
    RunRecord,
    load_runs,
)

__all__ = [
    "GroupSummary",
    "ReportError",
    "RoundRecord",
    "RunRecord",
    "load_runs",
    "markdown_table",
    "plot_accuracy",
    "plot_metric",
    "sanitize_filename",
    "summarize",
    "write_report",
]

_NONE = "—"

ReportError = ResultsError
"""Runs cannot be reported: the reader's errors (:class:`~sharefl.simulator.results.
ResultsError`, a malformed file), and no runs, inconsistent groups, or matplotlib missing
for a plot. One class, so a caller catches reading and reporting errors alike."""


@dataclass(frozen=True)
class GroupSummary:
    """The runs of one ``(name, label)``: statistics of the finished runs' final accuracies.

    ``seeds`` are the finished runs' seeds (sorted; runs without a seed are counted in
    ``finished`` only). ``std_accuracy`` is the sample standard deviation (``n - 1``; 0 for
    one run). The accuracy statistics, ``epsilon`` (mean over the finished runs that report
    one), ``difference`` (``mean_accuracy - paper``) and ``mean_wall_seconds`` are ``None``
    when they are undefined (no finished run, no paper value, a non-private setting).
    ``devices`` are the finished runs' distinct devices in order of appearance.
    """

    name: str
    label: str
    seeds: tuple[int, ...]
    mean_accuracy: float | None
    std_accuracy: float | None
    min_accuracy: float | None
    max_accuracy: float | None
    epsilon: float | None
    paper: float | None
    difference: float | None
    mean_wall_seconds: float | None
    devices: tuple[str, ...]
    finished: int
    unfinished: int

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-ready object (tuples become lists; key order is stable)."""
        return {
            "name": self.name,
            "label": self.label,
            "seeds": list(self.seeds),
            "mean_accuracy": self.mean_accuracy,
            "std_accuracy": self.std_accuracy,
            "min_accuracy": self.min_accuracy,
            "max_accuracy": self.max_accuracy,
            "epsilon": self.epsilon,
            "paper": self.paper,
            "difference": self.difference,
            "mean_wall_seconds": self.mean_wall_seconds,
            "devices": list(self.devices),
            "finished": self.finished,
            "unfinished": self.unfinished,
        }


# ---------------------------------------------------------------------------------------------
# Grouping


def _group_runs(runs: Iterable[RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    """Runs by ``(name, label)``: names sorted, labels in order of first appearance."""
    by_key: dict[tuple[str, str], list[RunRecord]] = {}
    for run in runs:
        by_key.setdefault((run.name, run.label), []).append(run)
    names = sorted({name for name, _ in by_key})
    return {key: by_key[key] for name in names for key in by_key if key[0] == name}


def summarize(runs: Iterable[RunRecord]) -> list[GroupSummary]:
    """One :class:`GroupSummary` per ``(name, label)``, ordered by name, then by the first
    appearance of the label in ``runs``. Unfinished runs are only counted.

    Raises :class:`ReportError` when two finished runs of a group share a seed (a run
    reported twice would be counted twice; the message names both folders) or when the runs
    of a group report different ``paper`` values.
    """
    groups: list[GroupSummary] = []
    for (name, label), members in _group_runs(runs).items():
        done = [r for r in members if r.finished]
        seen: dict[int, RunRecord] = {}
        for run in done:
            if run.seed is None:
                continue
            if run.seed in seen:
                other = seen[run.seed]
                if other.total_rounds != run.total_rounds:
                    raise ReportError(
                        f"runs {other.path} ({other.total_rounds} rounds) and {run.path} "
                        f"({run.total_rounds} rounds) are both seed {run.seed} of {name!r} / "
                        f"{label!r} but differ in rounds (a --rounds trial beside the full "
                        "run?); move one of them to another folder"
                    )
                raise ReportError(
                    f"runs {other.path} and {run.path} are both seed {run.seed} of "
                    f"{name!r} / {label!r}; remove one"
                )
            seen[run.seed] = run
        papers = [r.paper for r in members if r.paper is not None]
        if any(not math.isclose(p, papers[0], abs_tol=1e-12) for p in papers):
            raise ReportError(
                f"runs of {name!r} / {label!r} report different paper accuracies "
                f"{sorted(set(papers))}"
            )
        paper = papers[0] if papers else None
        accs = [r.final_accuracy for r in done if r.final_accuracy is not None]
        mean = statistics.fmean(accs) if accs else None
        std = (statistics.stdev(accs) if len(accs) > 1 else 0.0) if accs else None
        eps = [r.epsilon for r in done if r.epsilon is not None]
        walls = [r.wall_seconds for r in done if r.wall_seconds is not None]
        devices = tuple(dict.fromkeys(r.device for r in done if r.device))
        groups.append(
            GroupSummary(
                name=name,
                label=label,
                seeds=tuple(sorted(seen)),
                mean_accuracy=mean,
                std_accuracy=std,
                min_accuracy=min(accs) if accs else None,
                max_accuracy=max(accs) if accs else None,
                epsilon=statistics.fmean(eps) if eps else None,
                paper=paper,
                difference=(mean - paper) if mean is not None and paper is not None else None,
                mean_wall_seconds=statistics.fmean(walls) if walls else None,
                devices=devices,
                finished=len(done),
                unfinished=len(members) - len(done),
            )
        )
    return groups


# ---------------------------------------------------------------------------------------------
# Markdown


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped, line breaks flattened."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _percent(x: float) -> str:
    return f"{100 * x:.1f}"


def _signed_points(x: float) -> str:
    points = round(100 * x, 1)
    return f"{points:+.1f}" if points != 0 else "+0.0"


def _epsilon(x: float) -> str:
    return f"{x:.3g}"


def _duration(seconds: float) -> str:
    """``12.3 s``, ``4.5 min``, ``1.2 h``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _accuracy_cell(group: GroupSummary) -> str:
    notes = [f"n={group.finished}"] if group.finished else []
    if group.unfinished:
        notes.append(f"{group.unfinished} unfinished")
    note = f" ({'; '.join(notes)})"
    if group.mean_accuracy is None or group.std_accuracy is None:
        return _NONE + note
    if group.finished < 2:  # a sample std needs two seeds: show the one run alone
        return _percent(group.mean_accuracy) + note
    return f"{_percent(group.mean_accuracy)} ± {_percent(group.std_accuracy)}{note}"


_HEADER = (
    "| setting | accuracy % (mean ± std over n seeds) | paper % | Δ (points) | ε "
    "| wall time | device |\n"
    "|---|---|---|---|---|---|---|"
)


def _one_table(groups: Sequence[GroupSummary]) -> str:
    rows = [_HEADER]
    for g in groups:
        cells = [
            _cell(g.label),
            _accuracy_cell(g),
            _percent(g.paper) if g.paper is not None else _NONE,
            _signed_points(g.difference) if g.difference is not None else _NONE,
            _epsilon(g.epsilon) if g.epsilon is not None else _NONE,
            _duration(g.mean_wall_seconds) if g.mean_wall_seconds is not None else _NONE,
            _cell(", ".join(g.devices)) if g.devices else _NONE,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _by_name(groups: Iterable[GroupSummary]) -> dict[str, list[GroupSummary]]:
    out: dict[str, list[GroupSummary]] = {}
    for g in groups:
        out.setdefault(g.name, []).append(g)
    return out


def markdown_table(groups: Iterable[GroupSummary]) -> str:
    """Markdown: for each experiment name (in the given order), a ``## name`` heading and a
    table with one row per label::

        | setting | accuracy % (mean ± std over n seeds) | paper % | Δ (points) | ε
        | wall time | device |      (one line in the output)

    Accuracies are percent with one decimal; ``n`` counts the finished runs and unfinished
    ones are noted in the accuracy cell; Δ is ``mean - paper`` in percentage points with a
    sign; ε is the mean over the finished runs (3 significant digits); wall time is the mean
    wall time of the finished runs; undefined values print as ``—``. Sections are separated
    by a blank line; the result ends with a newline (empty string for no groups).
    """
    sections = [f"## {name}\n\n{_one_table(members)}" for name, members in _by_name(groups).items()]
    return "\n".join(sections)


# ---------------------------------------------------------------------------------------------
# Plots


def _title(name: str, runs: Sequence[RunRecord]) -> str:
    """``name`` and what the runs share: dataset, model, clients, rounds, seeds."""
    config = next((r.config for r in runs if r.config), {})
    facts = []
    data, model, clients = (config.get(k) or {} for k in ("data", "model", "clients"))
    if isinstance(data, dict) and data.get("dataset"):
        facts.append(str(data["dataset"]))
    if isinstance(model, dict) and model.get("name"):
        facts.append(str(model["name"]))
    if isinstance(clients, dict) and "honest" in clients:
        byz = clients.get("byzantine") or 0
        facts.append(f"{clients['honest']} honest + {byz} Byzantine clients")
    totals = sorted({n for n in map(planned_rounds, runs) if n})
    if totals:
        facts.append(f"{'/'.join(map(str, totals))} rounds")
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    if seeds:
        facts.append(f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}")
    return name + ("\n" + ", ".join(facts) if facts else "")


def plot_accuracy(runs: Iterable[RunRecord], path: str | os.PathLike[str], *, name: str) -> Path:
    """Draw the curves of experiment ``name`` and save them as a PNG at ``path``.

    Accuracy panel: one line per label (labels in order of first appearance): at each
    evaluated round (a marker), the mean accuracy (percent) over the runs of the label that
    reached it, with the min-max band over those runs shaded; unfinished runs are included
    and counted in the legend. A label's paper accuracy, when known, is a dotted horizontal
    line of the same colour. When any run is private, a second panel shows the mean ε spent
    by each evaluated round, in the same colours. The title is ``name`` and what the runs
    share (dataset, model, clients, rounds, seeds); runs without per-round data only appear
    in the legend. Parent folders are created. Uses matplotlib's Agg canvas directly (no
    pyplot, no global backend switch). Returns ``Path(path)``.

    Raises :class:`ReportError` when no run is named ``name`` or matplotlib is missing.
    """
    selected = [r for r in runs if r.name == name]
    if not selected:
        raise ReportError(f"no runs of experiment {name!r} to plot")
    Figure, FigureCanvasAgg, MaxNLocator = matplotlib_parts()

    private = any(rec.epsilon is not None for r in selected for rec in r.rounds)
    fig = Figure(figsize=(7.5, 6.5 if private else 4.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    if private:
        ax, ax_eps = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    else:
        ax, ax_eps = fig.add_subplot(), None
    any_paper = False
    any_points = False
    for index, ((_, label), members) in enumerate(_group_runs(selected).items()):
        per_round: dict[int, list[float]] = {}
        eps_round: dict[int, list[float]] = {}
        for run in members:
            for rec in run.rounds:
                if rec.accuracy is not None:  # the reader keeps evaluated rounds only
                    per_round.setdefault(rec.round, []).append(100 * rec.accuracy)
                if rec.epsilon is not None:
                    eps_round.setdefault(rec.round, []).append(rec.epsilon)
        xs = sorted(per_round)
        unfinished = sum(not r.finished for r in members)
        legend = f"{label} (n={len(members)}" + (
            f", {unfinished} unfinished)" if unfinished else ")"
        )
        means = [statistics.fmean(per_round[x]) for x in xs]
        (line,) = ax.plot(
            xs,
            means,
            label=legend,
            linewidth=1.6,
            marker="o",
            markersize=3.5,
            linestyle=_line_style(index),
        )
        any_points = any_points or bool(xs)
        color = line.get_color()
        if xs:
            ax.fill_between(
                xs,
                [min(per_round[x]) for x in xs],
                [max(per_round[x]) for x in xs],
                color=color,
                alpha=0.18,
                linewidth=0,
            )
        if ax_eps is not None and eps_round:
            ex = sorted(eps_round)
            ax_eps.plot(
                ex,
                [statistics.fmean(eps_round[x]) for x in ex],
                color=color,
                linewidth=1.4,
                marker="o",
                markersize=3,
            )
        paper = next((r.paper for r in members if r.paper is not None), None)
        if paper is not None:
            ax.axhline(100 * paper, color=color, linestyle=":", linewidth=1.2)
            any_paper = True
    if any_paper:
        ax.plot([], [], color="gray", linestyle=":", label="paper (dotted)")
    if not any_points:
        ax.text(
            0.5,
            0.5,
            "no evaluated round yet",
            transform=ax.transAxes,
            ha="center",
            va="center",
            color="gray",
        )
    ax.set_title(_title(name, selected), fontsize="medium")
    drawn = [rec.round for r in selected for rec in r.rounds if rec.accuracy is not None]
    round_axis(ax, last_round(selected, drawn), MaxNLocator)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    _place_legend(ax, "lower right")
    bottom = ax
    if ax_eps is not None:
        ax_eps.set_ylabel("ε spent")
        ax_eps.grid(True, alpha=0.3)
        bottom = ax_eps
    bottom.set_xlabel("round (markers: evaluated rounds)")

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def plot_metric(
    runs: Iterable[RunRecord], path: str | os.PathLike[str], *, name: str, metric: str
) -> Path:
    """Draw the per-round ``metric`` (a key of the runs' ``rounds.jsonl`` lines: ``loss``
    or a loop's extra key) of experiment ``name`` as a PNG at ``path``: one line per
    label, the mean over the runs that logged it, min-max band; a logarithmic y axis when
    every value is positive.

    Raises :class:`ReportError` when no run of ``name`` logged ``metric`` or matplotlib is
    missing.
    """

    def value_of(rec: RoundRecord) -> object:
        return rec.loss if metric == "loss" else rec.extra.get(metric)

    selected = [
        r for r in runs if r.name == name and any(value_of(x) is not None for x in r.rounds)
    ]
    if not selected:
        raise ReportError(f"no run of experiment {name!r} logged {metric!r}")
    Figure, FigureCanvasAgg, MaxNLocator = matplotlib_parts()
    fig = Figure(figsize=(7.5, 4.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positive = True
    for index, ((_, label), members) in enumerate(_group_runs(selected).items()):
        per_round: dict[int, list[float]] = {}
        for run in members:
            for rec in run.rounds:
                value = value_of(rec)
                if isinstance(value, int | float) and math.isfinite(value):
                    per_round.setdefault(rec.round, []).append(float(value))
        xs = sorted(per_round)
        positive = positive and all(v > 0 for x in xs for v in per_round[x])
        means = [statistics.fmean(per_round[x]) for x in xs]
        (line,) = ax.plot(
            xs,
            means,
            label=f"{label} (n={len(members)})",
            linewidth=1.6,
            marker="o",
            markersize=3.5,
            linestyle=_line_style(index),
        )
        ax.fill_between(
            xs,
            [min(per_round[x]) for x in xs],
            [max(per_round[x]) for x in xs],
            color=line.get_color(),
            alpha=0.18,
            linewidth=0,
        )
    if positive:
        ax.set_yscale("log")
    ax.set_title(f"{name}: {metric}")
    drawn = [rec.round for r in selected for rec in r.rounds if value_of(rec) is not None]
    round_axis(ax, last_round(selected, drawn), MaxNLocator)
    ax.set_xlabel("round (markers: evaluated rounds)")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    _place_legend(ax, "best")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


LEGEND_INSIDE_MAX = 10
"""The most legend entries drawn inside the axes; more go beside them (right)."""
LEGEND_ENTRY_INCHES = 0.19
"""The height one legend entry takes (small font); a taller legend makes the figure taller."""


def _line_style(index: int) -> str:
    """Matplotlib's colour cycle has 10 colours: the 11th series on is told apart by its
    line style (solid, dashed, dotted, dash-dotted)."""
    return ("-", "--", ":", "-.")[(index // 10) % 4]


def _place_legend(ax: Any, loc: str) -> None:
    """The legend inside ``ax`` at ``loc``, or, past :data:`LEGEND_INSIDE_MAX` entries
    (where it would cover the curves and the title), beside the axes on the right, the
    figure made tall enough for it; the figure's constrained layout makes room."""
    handles, _ = ax.get_legend_handles_labels()
    if len(handles) <= LEGEND_INSIDE_MAX:
        ax.legend(loc=loc, fontsize="small")
        return
    fig = ax.get_figure()
    width, height = fig.get_size_inches()
    fig.set_size_inches(width, max(height, LEGEND_ENTRY_INCHES * len(handles) + 0.6))
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", borderaxespad=0)


# ---------------------------------------------------------------------------------------------
# Report


def sanitize_filename(name: str, *, max_length: int = 80) -> str:
    """A portable file stem for ``name``: runs of characters outside ``[A-Za-z0-9._-]``
    become ``_``, leading dots/underscores are stripped, the length is capped, and an empty
    result becomes ``experiment``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:max_length].rstrip("._")
    return stem or "experiment"


def _unique_stems(names: Iterable[str], reserved: Iterable[str]) -> dict[str, str]:
    """Distinct sanitised stems (case-insensitively, for case-folding file systems)."""
    taken = {s.lower() for s in reserved}
    stems: dict[str, str] = {}
    for name in names:
        base = sanitize_filename(name)
        stem, k = base, 2
        while stem.lower() in taken:
            stem, k = f"{base}-{k}", k + 1
        taken.add(stem.lower())
        stems[name] = stem
    return stems


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _metric_plots(runs: Sequence[RunRecord], name: str, stem: Path) -> list[str]:
    """Draw the test loss (every loop records it) and every metric the runs of ``name``
    list; the Markdown lines embedding them."""
    named = [r for r in runs if r.name == name]
    has_loss = any(rec.loss is not None for r in named for rec in r.rounds)
    metrics = dict.fromkeys(
        [*(["loss"] if has_loss else []), *(m for r in named for m in r.plot_metrics)]
    )
    lines = []
    for metric in metrics:
        png = stem.with_name(f"{stem.name}_{sanitize_filename(metric)}.png")
        plot_metric(runs, png, name=name, metric=metric)
        lines += [f"![{metric}]({png.name})", ""]
    return lines


def _introduction(runs: Sequence[RunRecord], groups: Sequence[GroupSummary], names: int) -> str:
    n_finished = sum(r.finished for r in runs)
    return (
        f"{_count(len(runs), 'run')} ({n_finished} finished, {len(runs) - n_finished} "
        f"unfinished) in {_count(len(groups), 'setting')} of {_count(names, 'experiment')}. "
        "Accuracies are final test accuracies of the finished runs in percent (mean ± sample "
        "std over seeds); Δ is the difference to the paper in percentage points. Plots show "
        "the mean accuracy at each evaluated round (markers) over all runs, with the min–max "
        "band, and for private runs the ε spent."
    )


def _experiment_plots(runs: Sequence[RunRecord], name: str, stem: Path) -> list[str]:
    """Draw experiment ``name``'s accuracy plot (``<stem>.png``) and its metric plots; the
    Markdown lines embedding them. Before any of its runs reached an evaluated round there
    is nothing to draw: a line says so, and an older ``<stem>.png`` is removed."""
    png = stem.with_name(f"{stem.name}.png")
    named = [r for r in runs if r.name == name]
    if not any(rec.accuracy is not None for r in named for rec in r.rounds):
        png.unlink(missing_ok=True)
        every = next((r.config.get("eval_every") for r in named if r.config), None)
        when = f" (every {every} rounds)" if isinstance(every, int) else ""
        return [
            f"_No plot yet: no run of {name} has reached an evaluated round{when}._",
            "",
        ]
    plot_accuracy(runs, png, name=name)
    alt = name.replace("[", "(").replace("]", ")")
    return [f"![{alt}]({png.name})", "", *_metric_plots(runs, name, stem)]


def write_report(
    directory: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> Path:
    """Write the report of every run under ``directory`` and return the Markdown's path.

    Writes ``out`` (default ``directory/report.md``): a title, then per experiment name a
    ``## name`` section with its :func:`markdown_table` table and its accuracy plot embedded
    by a relative link. Next to ``out`` it writes ``report.json`` (or ``<out stem>.json``:
    the list of :meth:`GroupSummary.to_dict`, strict JSON), one ``<name>.png`` per
    experiment (accuracy and ε; name made file-system safe by :func:`sanitize_filename`,
    de-duplicated) and ``<name>_loss.png`` (test loss) beside it; an experiment none of
    whose runs reached an evaluated round gets a line saying so instead of plots. Each
    deployment results folder under ``directory`` (:mod:`~sharefl.simulator.
    deployment_report`) gets a ``## deployment <path>`` section with its table and plot.
    Without matplotlib the tables and JSON are still written and the report says the plots
    need it (and the command that installs it). Overwrites earlier outputs.

    Raises :class:`ReportError` when ``directory`` holds neither runs nor a deployment's
    results (``"no runs under DIR; run `sharefl simulate ...` first ..."``) or a file is
    malformed (see :func:`load_runs`).
    """
    root = Path(directory)
    runs = load_runs(root)
    deployments = deployment_folders(root)
    if not runs and not deployments:
        raise ReportError(
            f"no runs under {root}; run `sharefl simulate ...` first (or give the --out "
            "folder of sharefl simulate, serve or launch)"
        )
    groups = summarize(runs)
    report = Path(out) if out is not None else root / "report.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    json_path = report.with_suffix(".json")

    by_name = _by_name(groups)
    section_names = [*by_name, *(deployment_name(d, root) for d in deployments)]
    stems = _unique_stems(section_names, reserved=[report.stem, json_path.stem])
    try:
        matplotlib_parts()
        plots_missing = None
    except ReportError as e:
        plots_missing = str(e)
    lines = ["# Simulation report" if runs else "# Deployment report", ""]
    if runs:
        lines += [_introduction(runs, groups, len(by_name)), ""]
    for name, members in by_name.items():
        lines += [f"## {name}", "", _one_table(members)]
        if plots_missing is None:
            lines += _experiment_plots(runs, name, report.parent / stems[name])
    for folder, name in zip(deployments, section_names[len(by_name) :], strict=True):
        png = None if plots_missing else report.parent / f"{stems[name]}.png"
        lines += deployment_section(folder, root, png)
    if plots_missing is not None:
        lines += [f"_Plots were not drawn: {plots_missing}._", ""]

    report.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")
    json_path.write_text(
        json.dumps([g.to_dict() for g in groups], indent=2, ensure_ascii=False, allow_nan=False)
        + "\n",
        encoding="utf-8",
    )
    return report
