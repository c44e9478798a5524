"""Runs a grid of simulations, writes their results and shows progress.

Output, one folder per run under ``out``::

    <run_id>/config.json    the resolved configuration (with name, label, seed)
    <run_id>/rounds.jsonl   one JSON object per evaluated round (round, accuracy, loss,
                            epsilon, seconds), appended as the run goes
    <run_id>/summary.json   written last: final/best accuracy, ε, δ, wall time, device...

A run whose ``summary.json`` exists is skipped; an unfinished one starts again.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from sharefl.simulator.config import RunConfig
from sharefl.simulator.engine import RoundRecord
from sharefl.simulator.loops import Loop, build_loop


@dataclass(frozen=True)
class RunOutcome:
    """A finished (or skipped) run: its folder and summary."""

    run: RunConfig
    folder: Path
    summary: dict[str, Any]
    skipped: bool


def device_description(device: torch.device) -> str:
    """``cpu (N threads)`` or the CUDA device name."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads, {os.cpu_count()} cores)"


class Progress:
    """A one-line progress display on a terminal (plain lines otherwise)."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = 0.0

    def update(self, text: str, *, final: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
            self.stream.flush()
        elif final or now - self.last >= 10.0:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last = now


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / max(1, total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _clock(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def _remaining(elapsed: float, done: int, total: int) -> float:
    """Seconds left if the remaining rounds take as long as the finished ones on average."""
    return elapsed / max(1, done) * max(0, total - done)


def run_summary(
    sim: Loop,
    last: RoundRecord,
    accuracies: Sequence[float],
    *,
    label: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` of a finished run (``label``/``device`` override the run's)."""
    run = sim.run
    delta, privacy = sim.privacy_summary()
    return {
        "run_id": run.run_id,
        "name": run.name,
        "label": run.label if label is None else label,
        "seed": run.seed,
        "final_accuracy": last.accuracy,
        "best_accuracy": max(accuracies) if accuracies else None,
        "epsilon": last.epsilon,
        "delta": delta,
        "rounds": run.rounds,
        "wall_seconds": round(last.seconds, 2),
        "device": device or device_description(sim.device),
        "paper": run.paper,
        "privacy": privacy,
        "config": run.to_dict(),
    }


def run_one(
    run: RunConfig,
    out: Path,
    *,
    device: str | None = None,
    progress: Progress | None = None,
    position: str = "",
    simulation_factory: Callable[..., Loop] = build_loop,
) -> RunOutcome:
    """Run (or skip, if finished) one configuration, writing its folder under ``out``.

    A skipped run's summary takes the configuration's current paper value, which is not
    part of the run's identity (:attr:`RunConfig.run_id`).
    """
    folder = out / run.run_id
    summary_path = folder / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("paper") != run.paper:
            summary["paper"] = run.paper
            summary_path.write_text(json.dumps(summary, indent=2, default=str))
        return RunOutcome(run, folder, summary, True)
    created = folder  # the outermost folder this call creates, removed if the build fails
    while not created.parent.exists():
        created = created.parent
    created = None if folder.exists() else created
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(run.to_dict(), indent=2, default=str))
    try:
        sim = simulation_factory(run, device=device)
    except Exception:  # data, model or rule unusable: leave no folder holding only config.json
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    accuracies: list[float] = []
    last_line = ""

    with (folder / "rounds.jsonl").open("w") as log:

        def on_round(record: RoundRecord) -> None:
            nonlocal last_line
            if record.accuracy is not None:
                accuracies.append(record.accuracy)
                log.write(json.dumps(record.to_json()) + "\n")
                log.flush()
                eps = "" if record.epsilon is None else f" ε {record.epsilon:.3g}"
                last_line = f" acc {record.accuracy:.4f}{eps}"
            if progress is not None:
                progress.update(
                    f"{position}{run.label or run.name} seed {run.seed} "
                    f"{_bar(record.round, run.rounds)} round {record.round}/{run.rounds}"
                    f"{last_line} {_clock(record.seconds)} elapsed, "
                    f"ETA {_clock(_remaining(record.seconds, record.round, run.rounds))}"
                )

        last = sim.run_rounds(on_round)
    summary = run_summary(sim, last, accuracies)
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    if progress is not None:
        progress.update(
            f"{position}{run.label or run.name} seed {run.seed}: accuracy "
            f"{last.accuracy:.4f}{'' if last.epsilon is None else f', ε {last.epsilon:.3g}'}"
            f", {_clock(last.seconds)}",
            final=True,
        )
    return RunOutcome(run, folder, summary, False)


def run_grid(
    runs: Sequence[RunConfig],
    out: str | Path,
    *,
    device: str | None = None,
    progress: Progress | None = None,
) -> list[RunOutcome]:
    """Run every configuration in order, skipping finished ones."""
    out = Path(out)
    outcomes = []
    for i, run in enumerate(runs):
        position = f"[{i + 1}/{len(runs)}] " if len(runs) > 1 else ""
        outcome = run_one(run, out, device=device, progress=progress, position=position)
        if outcome.skipped and progress is not None:
            progress.update(
                f"{position}{run.label or run.name} seed {run.seed}: done already "
                f"({outcome.folder.name})",
                final=True,
            )
        outcomes.append(outcome)
    return outcomes
