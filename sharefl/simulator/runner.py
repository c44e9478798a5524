"""Runs a grid of simulations, writes their results and shows progress.

Output, one folder per run under ``out`` (``config.json``, ``rounds.jsonl`` and
``rounds.csv`` appended as the run goes, then the final model ``model.npz`` + ``model.json``,
``summary.json`` last), written by :class:`~sharefl.simulator.results.RunWriter` in the
format of :mod:`sharefl.simulator.results`.

A run whose ``summary.json`` exists is skipped (nothing of it is rewritten but a changed
paper value in its summary). An unfinished one with a checkpoint is refused
(:class:`UnfinishedRunError`) unless ``restart`` discards the checkpoint to start it again
or ``resume`` goes on from its ``checkpoint.pkl`` (:mod:`~sharefl.simulator.checkpoint`):
written atomically after the first round that ends ``checkpoint_every`` seconds after the
last one, and after the round that is running when SIGINT or SIGTERM arrives (the run then
stops with ``KeyboardInterrupt``; a second signal stops it at once, keeping the last
checkpoint). The resumed run is the uninterrupted one: the same rounds, records and model,
bit for bit (only the wall-clock ``seconds`` differ). A finished run deletes its checkpoint.

A run whose rounds the command line changed (``sharefl simulate --rounds N``) and whose σ
is calibrated to a target ε says so before its first round (the loop's
:attr:`~sharefl.simulator.loops.LoopEntry.rounds_note`): the same ε over other rounds is
another σ, which the user did not write.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sharefl.machine import StopRequest, stop_at_a_safe_point
from sharefl.simulator.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    LoopCheckpoint,
    LoopState,
)
from sharefl.simulator.config import RunConfig
from sharefl.simulator.loops import Loop, build_loop, rounds_note
from sharefl.simulator.results import (
    RoundRecord,
    RunWriter,
    device_description,
    read_summary,
    run_summary,
)
from sharefl.wording import counted

__all__ = [
    "Progress",
    "RunOutcome",
    "device_description",
    "run_grid",
    "run_one",
    "run_summary",
]


@dataclass(frozen=True)
class RunOutcome:
    """A finished (or skipped) run: its folder and summary."""

    run: RunConfig
    folder: Path
    summary: dict[str, Any]
    skipped: bool


class Progress:
    """A one-line progress display on a terminal (plain lines otherwise), on ``stream``
    (default: ``sys.stderr`` as it is when the display is made)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
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


class UnfinishedRunError(CheckpointError):
    """A run's folder holds a checkpoint, and neither ``resume`` nor ``restart`` said what
    to do with it (exit status 2: the command line must choose)."""


def run_folder(out: Path, run: RunConfig) -> Path:
    """The folder of ``run`` under ``out``: ``out/<run_id>``, or the folder an earlier
    version named (:attr:`~RunConfig.earlier_run_id`) where only that one exists, so a run
    finished (or checkpointed) before the names changed is found, not run again."""
    folder = out / run.run_id
    earlier = out / run.earlier_run_id
    return earlier if not folder.exists() and earlier.is_dir() else folder


def refuse_unfinished(runs: Sequence[RunConfig], out: Path) -> None:
    """Raise :class:`UnfinishedRunError`, naming ``--resume`` and ``--restart``, when a
    run of ``runs`` is unfinished under ``out`` with a checkpoint (no ``summary.json``, a
    ``checkpoint.pkl``); return otherwise. Reads no checkpoint."""
    folders = [run_folder(out, run) for run in runs]
    held = [f for f in folders if (f / CHECKPOINT_FILE).is_file() and read_summary(f) is None]
    if held:
        more = f" and {counted(len(held) - 1, 'other')}" if len(held) > 1 else ""
        raise UnfinishedRunError(
            f"--out {out} holds an unfinished run with a checkpoint ({held[0].name}{more}): "
            "add --resume to continue it, or --restart to discard the checkpoint and start again"
        )


def run_one(
    run: RunConfig,
    out: Path,
    *,
    device: str | None = None,
    progress: Progress | None = None,
    position: str = "",
    simulation_factory: Callable[..., Loop] = build_loop,
    file_rounds: int | None = None,
    resume: bool = False,
    checkpoint_every: float = 60.0,
    restart: bool = False,
) -> RunOutcome:
    """Run (or skip, if finished) one configuration, writing its folder under ``out``.

    A skipped run's summary takes the configuration's current paper value, which is not
    part of the run's identity (:attr:`RunConfig.run_id`). ``file_rounds``: the rounds the
    file gave this run before the command line replaced them (``None``: not replaced);
    when that changed σ, ``progress`` gets one line saying so
    (:func:`~sharefl.simulator.loops.rounds_note`).
    ``resume``: go on from the folder's checkpoint if it has one; ``restart``: delete it
    and start again; neither: a checkpoint is refused (not both: ``ValueError``).
    ``checkpoint_every``: seconds between checkpoints (0: every round).

    Raises:
        KeyboardInterrupt: SIGINT or SIGTERM (after checkpointing the round that ran).
        CheckpointError: ``resume`` and the folder's checkpoint is unreadable or another
            run's.
        UnfinishedRunError: neither ``resume`` nor ``restart``, and the unfinished run
            has a checkpoint (it is left as it was).
    """
    if resume and restart:
        raise ValueError("resume or restart, not both")
    folder = run_folder(out, run)
    writer = RunWriter(folder)
    summary = read_summary(folder)
    if summary is not None:
        if summary.get("paper") != run.paper:
            summary["paper"] = run.paper
            writer.finish(summary)
        return RunOutcome(run, folder, summary, True)
    label = f"{position}{run.label or run.name} seed {run.seed}"
    say = _final_lines(progress)
    checkpoint = LoopCheckpoint.read(folder, run.run_id) if resume else None
    if checkpoint is None and (folder / CHECKPOINT_FILE).is_file():
        if not restart:
            refuse_unfinished([run], out)
        (folder / CHECKPOINT_FILE).unlink()
        say(f"{label}: starting again (--restart discarded its checkpoint)")
    sim = _build(run, writer, fresh=checkpoint is None, factory=simulation_factory, device=device)
    state = LoopState(sim)  # the fresh build: the baseline a checkpoint is relative to
    if checkpoint is not None:
        checkpoint.check_device(sim.device)
        state.restore(checkpoint.state)
        sim.started = time.perf_counter() - checkpoint.elapsed
        writer.resume(checkpoint.round)
        say(f"{label}: resumed after round {checkpoint.round}")
    if progress is not None and file_rounds is not None:
        note = rounds_note(sim, file_rounds)
        if note is not None:
            say(f"{label}: {note}")

    def asked() -> None:
        say(f"{label}: stopping after this round to checkpoint it (again to stop now)")

    with stop_at_a_safe_point(asked) as stop:
        rounds = _AfterEachRound(run, sim, state, writer, label, progress, checkpoint_every, stop)
        last = sim.run_rounds(rounds)
    writer.write_model(
        sim.final_model(), run_id=run.run_id, test_accuracy=last.accuracy, test_loss=last.loss
    )
    summary = run_summary(sim, last, writer.accuracies)
    writer.finish(summary)
    (folder / CHECKPOINT_FILE).unlink(missing_ok=True)
    eps = "" if last.epsilon is None else f", ε {last.epsilon:.3g}"
    say(f"{label}: accuracy {last.accuracy:.4f}{eps}, {_clock(last.seconds or 0.0)}")
    if stop.asked:  # asked during the last round: the run is finished, the grid stops
        raise KeyboardInterrupt
    return RunOutcome(run, folder, summary, False)


def _final_lines(progress: Progress | None) -> Callable[[str], None]:
    """Print a line that stays (``progress.update(..., final=True)``), or nothing."""
    if progress is None:
        return lambda text: None
    return lambda text: progress.update(text, final=True)


def _build(
    run: RunConfig,
    writer: RunWriter,
    *,
    fresh: bool,
    factory: Callable[..., Loop],
    device: str | None,
) -> Loop:
    """Build the run's loop; a ``fresh`` run (no checkpoint to go on from) first starts its
    folder again. If the build fails (data, model or rule unusable), the folders this call
    created are removed, so none is left holding only ``config.json``."""
    folder = writer.folder
    outermost = folder
    while not outermost.parent.exists():
        outermost = outermost.parent
    created = None if folder.exists() else outermost
    if fresh:
        writer.start(run.to_dict())
        (folder / CHECKPOINT_FILE).unlink(missing_ok=True)
    try:
        return factory(run, device=device)
    except Exception:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise


@dataclass
class _AfterEachRound:
    """What :func:`run_one` does after each round: record it, show progress, and checkpoint
    when ``checkpoint_every`` seconds passed or a stop was asked (then stop)."""

    run: RunConfig
    sim: Loop
    state: LoopState
    writer: RunWriter
    label: str
    progress: Progress | None
    checkpoint_every: float
    stop: StopRequest
    last_line: str = ""
    last_checkpoint: float = dataclasses.field(default_factory=time.monotonic)

    def __call__(self, record: RoundRecord) -> None:
        if self.writer.record(record):
            eps = "" if record.epsilon is None else f" ε {record.epsilon:.3g}"
            self.last_line = f" acc {record.accuracy:.4f}{eps}"
        total = self.run.rounds
        if self.progress is not None:
            elapsed = record.seconds or 0.0
            self.progress.update(
                f"{self.label} {_bar(record.round, total)} round {record.round}/{total}"
                f"{self.last_line} {_clock(elapsed)} elapsed, "
                f"ETA {_clock(_remaining(elapsed, record.round, total))}"
            )
        if record.round == total:
            return  # finished: the model and summary follow, no checkpoint is needed
        if self.stop.asked or time.monotonic() - self.last_checkpoint >= self.checkpoint_every:
            capture = self.state.capture()
            sim = self.sim
            LoopCheckpoint(
                self.run.run_id, sim.round, sim.elapsed(), capture, str(sim.device)
            ).write(self.writer.folder)
            self.last_checkpoint = time.monotonic()
        if self.stop.asked:
            _final_lines(self.progress)(f"{self.label}: checkpointed after round {record.round}")
            raise KeyboardInterrupt


def run_grid(
    runs: Sequence[RunConfig],
    out: str | Path,
    *,
    device: str | None = None,
    progress: Progress | None = None,
    file_rounds: Mapping[str, int] | None = None,
    resume: bool = False,
    checkpoint_every: float = 60.0,
    restart: bool = False,
) -> list[RunOutcome]:
    """Run every configuration in order, skipping finished ones. ``file_rounds`` maps the
    :attr:`~RunConfig.run_id` of a run whose rounds the command line replaced to the
    file's rounds; ``resume``, ``restart`` and ``checkpoint_every`` as in :func:`run_one`
    (without ``resume`` or ``restart`` a checkpoint of any run is refused before the first
    run starts)."""
    if not (resume or restart):
        refuse_unfinished(runs, Path(out))
    out = Path(out)
    outcomes = []
    for i, run in enumerate(runs):
        position = f"[{i + 1}/{len(runs)}] " if len(runs) > 1 else ""
        outcome = run_one(
            run,
            out,
            device=device,
            progress=progress,
            position=position,
            file_rounds=(file_rounds or {}).get(run.run_id),
            resume=resume,
            checkpoint_every=checkpoint_every,
            restart=restart,
        )
        if outcome.skipped and progress is not None:
            progress.update(
                f"{position}{run.label or run.name} seed {run.seed}: done already "
                f"({outcome.folder.name})",
                final=True,
            )
        outcomes.append(outcome)
    return outcomes
