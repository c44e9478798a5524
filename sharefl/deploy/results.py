"""A server run's results, written as the rounds finish so that nothing finished is lost.

Under the results folder:

- ``rounds.jsonl``: one JSON object per finished round (the :class:`~sharefl.deploy.server.
  RoundReport` without its aggregate, its ``round`` numbered from 1 as the log prints it),
  appended, flushed and fsynced before the next round;
- ``round-R-aggregate.npy``: the aggregate of round R (from 1), and ``model.npy``: the model after
  the last finished round, each replaced atomically (write a temporary file, then rename);
- ``checkpoint.npz``: the model after the last finished round with that round's JSON
  object, replaced atomically *before* the line is appended, so that
  :func:`load_checkpoint` can always tell which model goes with which rounds;
- ``result.json``: at the end (or on interruption) every round (as in ``rounds.jsonl``,
  each with its own ``traffic``: bytes per client in that round) and ``traffic_total``
  (bytes per client over the whole run), also written atomically.

A server killed at any moment leaves the rounds it finished intact and a model that is
that of its last finished round, never a torn file; ``sharefl serve --resume DIR``
continues from there (:func:`load_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sharefl.deploy.errors import DeployError

ROUNDS_FILE = "rounds.jsonl"
MODEL_FILE = "model.npy"
RESULT_FILE = "result.json"
CHECKPOINT_FILE = "checkpoint.npz"


class ResumeError(DeployError, ValueError):
    """A results folder that cannot be resumed (say what is wrong with it)."""


@dataclass(frozen=True)
class Checkpoint:
    """Where a run stopped: the finished rounds' JSON objects (in order) and the model
    after the last of them; the next round is ``len(rows)``."""

    rows: list[dict]
    model: np.ndarray

    @property
    def next_round(self) -> int:
        return len(self.rows)


def load_checkpoint(out: str | Path) -> Checkpoint:
    """The checkpoint of a results folder written by :class:`ResultsWriter`.

    Repairs the one gap a crash can leave (the checkpoint written, its line not yet
    appended) by appending that line. Raises :class:`ResumeError` when there is no
    checkpoint or it does not match ``rounds.jsonl``.
    """
    folder = Path(out)
    path = folder / CHECKPOINT_FILE
    if not path.is_file():
        raise ResumeError(f"{path} is missing: nothing to resume (no round finished there)")
    try:
        with np.load(path) as data:
            model = np.array(data["model"])
            last = json.loads(bytes(data["row"]).decode())
        lines = (folder / ROUNDS_FILE).read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError, KeyError) as exc:
        raise ResumeError(f"cannot read the results in {folder}: {exc}") from exc
    if [r["round"] for r in rows] != list(range(1, len(rows) + 1)):
        raise ResumeError(f"{folder / ROUNDS_FILE} does not hold rounds 1, 2, ... in order")
    if last["round"] == len(rows) + 1:  # killed between the checkpoint and its line
        with (folder / ROUNDS_FILE).open("a") as log:
            log.write(json.dumps(last) + "\n")
        rows.append(last)
    elif last["round"] != len(rows):
        raise ResumeError(
            f"the checkpoint is of round {last['round']} but {ROUNDS_FILE} ends with round "
            f"{len(rows)}"
        )
    return Checkpoint(rows, model)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` so that a reader (or a crash) sees the old file or the
    new one, never a part: write ``path.tmp``, fsync it, rename it over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_save_npy(path: Path, array: np.ndarray) -> None:
    """``np.save`` through :func:`atomic_write_bytes`."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.save(handle, array)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def report_row(report: Any) -> dict:
    """The JSON object of one round report: every field but the aggregate, and ``round``
    numbered from 1 (the report's index is from 0, as on the wire)."""
    row = {k: v for k, v in dataclasses.asdict(report).items() if k != "total"}
    row["round"] = report.round + 1
    return row


class ResultsWriter:
    """Writes each finished round at once (see the module docstring).

    Args:
        out: the results folder (created). An existing ``rounds.jsonl`` is started afresh,
            unless ``resume`` gives the checkpoint it continues (rounds appended).
    """

    def __init__(self, out: str | Path, resume: Checkpoint | None = None) -> None:
        self.folder = Path(out)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = list(resume.rows) if resume else []
        self._log = (self.folder / ROUNDS_FILE).open("a" if resume else "w")

    def round(self, report: Any, model: np.ndarray) -> None:
        """Record one finished round: its aggregate, the model after it, its JSON line."""
        if report.total is not None:
            atomic_save_npy(self.folder / f"round-{report.round + 1}-aggregate.npy", report.total)
        row = report_row(report)
        buffer = io.BytesIO()
        np.savez(buffer, model=model, row=np.frombuffer(json.dumps(row).encode(), np.uint8))
        atomic_write_bytes(self.folder / CHECKPOINT_FILE, buffer.getvalue())
        atomic_save_npy(self.folder / MODEL_FILE, model)
        self.rows.append(row)
        self._log.write(json.dumps(row) + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    def finish(
        self, traffic: dict | None = None, *, interrupted: bool = False, error: str = ""
    ) -> Path:
        """Write ``result.json`` (every round so far, ``traffic_total``: bytes per client
        over the run; ``"interrupted": true``
        after a signal, ``"error"`` for a run the server stopped); returns the folder."""
        summary: dict[str, Any] = {"rounds": self.rows, "traffic_total": traffic or {}}
        if interrupted:
            summary["interrupted"] = True
        if error:
            summary["error"] = error
        atomic_write_bytes(self.folder / RESULT_FILE, json.dumps(summary, indent=1).encode())
        self._log.close()
        return self.folder
