"""The part of ``sharefl report`` for a deployment's results folder (``sharefl serve
--out``, ``sharefl launch FILE --out`` of a deployment file): its ``rounds.jsonl`` holds one
JSON object per finished round, written by ``sharefl.deploy.results`` (read here as JSON:
the simulator does not import the transport). A deployment trains what its clients' code
trains, so there is no test accuracy: the report gives, per folder, what the rounds did
(clients that took part, clients whose updates reached a released sum, failed clusters,
culprits, ε, time) in a table and draws the first two per round.

A deployment folder is recognised as :func:`sharefl.simulator.results.load_runs` skips it:
``rounds.jsonl`` beside one of :data:`~sharefl.simulator.results.SERVER_LOG_MARKERS`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from sharefl.simulator.plot_parts import matplotlib_parts, round_axis
from sharefl.simulator.results import ROUNDS_FILE, SERVER_LOG_MARKERS, ResultsError


@dataclass(frozen=True)
class DeploymentRound:
    """One line of a deployment's ``rounds.jsonl``: the round (from 1), how many clients
    took part, how many of them were summed into a released sum, the failed clusters, the
    clients named culprits, ε after the round (``None``: not private) and its seconds."""

    round: int
    participants: int
    contributors: int
    failed: int
    culprits: tuple[int, ...]
    epsilon: float | None
    seconds: float


def deployment_folders(root: Path) -> list[Path]:
    """The deployment results folders at any depth under ``root`` (itself included), in
    path order."""
    found = {
        p.parent
        for p in root.rglob(ROUNDS_FILE)
        if p.is_file() and any((p.parent / m).exists() for m in SERVER_LOG_MARKERS)
    }
    return sorted(found)


def read_deployment(folder: Path) -> list[DeploymentRound]:
    """The rounds of ``folder``'s ``rounds.jsonl``; :class:`ResultsError` naming the file
    and line for a line that is not a round object."""
    path = folder / ROUNDS_FILE
    rounds = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
            rounds.append(
                DeploymentRound(
                    round=int(row["round"]),
                    participants=len(row["participants"]),
                    contributors=int(row["contributors"]),
                    failed=len(row.get("failed") or []),
                    culprits=tuple(sorted(int(c) for c in row.get("culprits") or {})),
                    epsilon=None if row.get("epsilon") is None else float(row["epsilon"]),
                    seconds=float(row["seconds"]),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ResultsError(
                f"{path}:{number}: not a deployment round ({exc!r}); sharefl serve --out "
                "writes one JSON object per round"
            ) from exc
    return rounds


def deployment_name(folder: Path, root: Path) -> str:
    """``"deployment <folder relative to root>"`` (``root``'s own name for ``root``)."""
    return f"deployment {folder.relative_to(root).as_posix() if folder != root else root.name}"


def deployment_section(folder: Path, root: Path, png: Path | None) -> list[str]:
    """Markdown lines for the deployment in ``folder``: a ``## deployment <path>``
    heading, a table, and the plot drawn at ``png`` (``None``: no plot, matplotlib is
    missing) unless no round finished."""
    rounds = read_deployment(folder)
    name = deployment_name(folder, root)
    lines = [f"## {name}", ""]
    if not rounds:
        return [*lines, "No round finished yet.", ""]
    lines += [_table(rounds), ""]
    if png is not None:
        _plot(rounds, png, name)
        lines += [f"![{name}]({png.name})", ""]
    return lines


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}–{high}"


def _table(rounds: list[DeploymentRound]) -> str:
    culprits = sorted({c for r in rounds for c in r.culprits})
    last_epsilon = rounds[-1].epsilon
    cells = [
        str(len(rounds)),
        _span([r.participants for r in rounds]),
        f"{statistics.fmean(r.contributors for r in rounds):.1f}",
        str(sum(r.failed for r in rounds)),
        ", ".join(map(str, culprits)) or "none",
        "—" if last_epsilon is None else f"{last_epsilon:.3g}",
        f"{statistics.fmean(r.seconds for r in rounds):.2f}",
    ]
    return (
        "| rounds | clients per round | summed per round (mean) | failed clusters | culprits "
        "| ε | seconds per round |\n|---|---|---|---|---|---|---|\n| " + " | ".join(cells) + " |\n"
    )


def _plot(rounds: list[DeploymentRound], png: Path, name: str) -> None:
    """Clients that took part and clients summed, per round, as a PNG at ``png``."""
    Figure, FigureCanvasAgg, MaxNLocator = matplotlib_parts()
    fig = Figure(figsize=(7.5, 4.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [r.round for r in rounds]
    ax.plot(xs, [r.participants for r in rounds], marker="o", markersize=3.5, label="took part")
    ax.plot(
        xs,
        [r.contributors for r in rounds],
        marker="s",
        markersize=3.5,
        linestyle="--",
        label="summed into a released sum",
    )
    round_axis(ax, xs[-1], MaxNLocator)
    ax.set_ylim(bottom=0, top=max(r.participants for r in rounds) * 1.1 + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{name}: clients per round", fontsize="medium")
    ax.set_xlabel("round")
    ax.set_ylabel("clients")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")
