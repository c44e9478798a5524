"""What every plot of ``sharefl report`` shares: matplotlib's parts (imported only when a
plot is drawn) and a round axis that stays readable with one evaluated round.

A round axis runs from 0 to the run's planned rounds (or the last round drawn, if later),
with integer ticks: one evaluation at round 3 of 3 is a marker at the right end of 0..3,
not a lone dot on ticks 2.84...3.16, and an unfinished run shows how far it got.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sharefl.install_hint import install_command
from sharefl.simulator.results import ResultsError, RunRecord


def matplotlib_parts() -> tuple[Any, Any, Any]:
    """``(Figure, FigureCanvasAgg, MaxNLocator)``; :class:`ResultsError` (the report's
    error) naming the install command without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise ResultsError(
            f"plotting needs matplotlib, which is not installed: {install_command('sim')}"
        ) from e
    return Figure, FigureCanvasAgg, MaxNLocator


def planned_rounds(run: RunRecord) -> int | None:
    """The rounds ``run`` was to run: its summary's count, or, unfinished, its
    ``config.json``'s ``rounds``; ``None`` when neither says."""
    if run.total_rounds:
        return run.total_rounds
    rounds = run.config.get("rounds")
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None


def round_axis(ax: Any, last_round: int, locator: Any) -> None:
    """x from 0 to ``last_round`` (at least 1) with a small margin, integer ticks
    (``locator``: matplotlib's ``MaxNLocator`` class)."""
    right = max(1, last_round)
    ax.set_xlim(0, right + max(0.5, 0.02 * right))
    ax.xaxis.set_major_locator(locator(integer=True))


def last_round(runs: Iterable[RunRecord], drawn: Iterable[int]) -> int:
    """The right end of the round axis: the largest planned or drawn round (0 if none)."""
    return max([*(planned_rounds(r) or 0 for r in runs), *drawn, 0])
