"""A server run's results, written as the rounds finish so that nothing finished is lost.

Under the results folder:

- ``rounds.jsonl``: one JSON object per finished round (the :class:`~sharefl.deploy.server.
  RoundReport` without its aggregate), appended, flushed and fsynced before the next round;
- ``round-R-aggregate.npy``: the aggregate of round R, and ``model.npy``: the model after
  the last finished round, each replaced atomically (write a temporary file, then rename);
- ``result.json``: at the end (or on interruption) every round and the traffic per client,
  also written atomically.

A server killed at any moment leaves the rounds it finished intact and a model that is
that of its last finished round, never a torn file.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

ROUNDS_FILE = "rounds.jsonl"
MODEL_FILE = "model.npy"
RESULT_FILE = "result.json"


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
    """The JSON object of one round report (every field but the aggregate)."""
    return {k: v for k, v in dataclasses.asdict(report).items() if k != "total"}


class ResultsWriter:
    """Writes each finished round at once (see the module docstring).

    Args:
        out: the results folder (created). An existing ``rounds.jsonl`` is started afresh.
    """

    def __init__(self, out: str | Path) -> None:
        self.folder = Path(out)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        self._log = (self.folder / ROUNDS_FILE).open("w")

    def round(self, report: Any, model: np.ndarray) -> None:
        """Record one finished round: its aggregate, the model after it, its JSON line."""
        if report.total is not None:
            atomic_save_npy(self.folder / f"round-{report.round}-aggregate.npy", report.total)
        atomic_save_npy(self.folder / MODEL_FILE, model)
        row = report_row(report)
        self.rows.append(row)
        self._log.write(json.dumps(row) + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())

    def finish(self, traffic: dict | None = None, *, interrupted: bool = False) -> Path:
        """Write ``result.json`` (every round so far, the traffic); returns the folder."""
        summary: dict[str, Any] = {"rounds": self.rows, "traffic": traffic or {}}
        if interrupted:
            summary["interrupted"] = True
        atomic_write_bytes(self.folder / RESULT_FILE, json.dumps(summary, indent=1).encode())
        self._log.close()
        return self.folder
