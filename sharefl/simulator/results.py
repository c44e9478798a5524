"""One results format for every loop and transport: the writer and the reader.

A run's folder (``sharefl simulate``, ``sharefl launch``; read by ``sharefl report``)::

    <run>/config.json    the expanded run configuration (any JSON object)
    <run>/rounds.jsonl   one JSON object per evaluated round:
                         {"round", "accuracy", "loss", "epsilon", "seconds", <extra keys>}
    <run>/rounds.csv     the same records as CSV (header row, then one row per line of
                         rounds.jsonl; nested keys flattened as "a.b", null as "")
    <run>/model.npz      the final model's state_dict, one array per entry (simulate only)
    <run>/model.json     what rebuilds that model: name, options, input shape, classes,
                         dtype, parameter names and shapes, round (simulate only)
    <run>/agents.npz     the decentralized loop's agents' models, [R, *shape] per entry
    <run>/summary.json   written when the run finished:
                         {"run_id", "name", "label", "seed", "final_accuracy", "best_accuracy",
                          "epsilon", "delta", "rounds", "wall_seconds", "device", "paper",
                          "privacy", "config", "plot_metrics", "environment"}
                         ("environment": the commit, command, threads, CPU kernels and
                         BLAS, :mod:`sharefl.simulator.provenance`)

:class:`RoundRecord` is a round's outcome in memory and on disk (a loop's extra values, e.g.
the RSA loop's ``disagreement``, travel in ``extra`` and come back from the reader);
:class:`RunWriter` writes a folder as the run goes (``rounds.csv`` beside ``rounds.jsonl``;
the final model, :class:`~sharefl.simulator.final_model.FinalModel`, then ``summary.json``,
each file complete or absent: temp file + rename), :func:`run_summary` builds the summary
of a finished loop, and :func:`load_runs` reads folders back (:class:`RunRecord`), checking
every value: a malformed file raises :class:`ResultsError` naming the file (and the line of
``rounds.jsonl``).

A folder with ``rounds.jsonl`` but no ``summary.json`` is an *unfinished* run; its name,
label and seed come from ``config.json`` (keys ``"name"``, ``"label"``, ``"seed"``), else
the name is the parent folder's path relative to the root and the label the folder's name.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sharefl.simulator.errors import SimulatorError
from sharefl.simulator.provenance import run_environment

if TYPE_CHECKING:
    import numpy as np

    from sharefl.simulator.final_model import FinalModel

SUMMARY_FILE = "summary.json"
ROUNDS_FILE = "rounds.jsonl"
ROUNDS_CSV_FILE = "rounds.csv"
CONFIG_FILE = "config.json"
MODEL_FILE = "model.npz"
MODEL_META_FILE = "model.json"
AGENTS_FILE = "agents.npz"
SERVER_LOG_MARKERS = ("checkpoint.npz", "result.json")
"""Files of a deployment server's protocol log (:mod:`sharefl.deploy.results`, whose
``rounds.jsonl`` holds cluster reports, not accuracies): a folder holding one of them and
no ``summary.json`` is not a run. ``sharefl launch --out DIR`` writes that log in ``DIR``
and the run's folder in ``DIR/<run_id>``, so ``sharefl report DIR`` reads the run only."""
ROUND_KEYS = ("round", "accuracy", "loss", "epsilon", "seconds")
"""The fixed keys of a ``rounds.jsonl`` line; any other key is a loop's ``extra`` value."""
SUMMARY_KEYS = (
    *("run_id", "name", "label", "seed", "final_accuracy", "best_accuracy", "epsilon"),
    *("delta", "rounds", "wall_seconds", "device", "paper", "config", "plot_metrics"),
)
"""The keys of ``summary.json`` that :class:`RunRecord` types; the others go to its ``extra``."""


class ResultsError(SimulatorError, ValueError):
    """Results cannot be read: not a directory, or a malformed file (the message names it,
    and the line of a ``rounds.jsonl``)."""


@dataclass(frozen=True)
class RoundRecord:
    """One round's outcome (a line of ``rounds.jsonl`` when it was evaluated).

    ``round`` is 1-based; ``accuracy`` and ``loss`` are set on evaluation rounds only (else
    ``None``; the reader only sees evaluated rounds, accuracy in ``[0, 1]``); ``loss`` may be
    NaN or infinite (a diverged run); ``epsilon`` is the privacy spent so far (``None``: not
    private or not evaluated); ``seconds`` is the wall time since the start of the run;
    ``extra`` holds a loop's further JSON values (written as top-level keys).
    """

    round: int
    accuracy: float | None
    loss: float | None = None
    epsilon: float | None = None
    seconds: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = set(self.extra) & set(ROUND_KEYS)
        if clash:
            raise ResultsError(f"RoundRecord.extra may not redefine {sorted(clash)}")

    def to_json(self) -> dict[str, Any]:
        """The ``rounds.jsonl`` object (``seconds`` rounded to milliseconds)."""
        return {
            "round": self.round,
            "accuracy": self.accuracy,
            "loss": self.loss,
            "epsilon": self.epsilon,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            **self.extra,
        }

    @property
    def evaluated(self) -> bool:
        """Whether the round was evaluated (and so belongs in ``rounds.jsonl``)."""
        return self.accuracy is not None


# ---------------------------------------------------------------------------------------------
# Writing


class FinishedLoop(Protocol):
    """What :func:`run_summary` needs from a loop."""

    @property
    def run(self) -> Any: ...  # RunConfig (this module imports nothing of the simulator)

    @property
    def device(self) -> Any: ...  # torch.device

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]: ...


def device_description(device: Any) -> str:
    """``cpu (N threads, M cores)`` or ``cuda (<device name>)`` for a ``torch.device``."""
    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads, {os.cpu_count()} cores)"


def run_summary(
    loop: FinishedLoop,
    last: RoundRecord,
    accuracies: Sequence[float],
    *,
    label: str | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` of a finished run (``label``/``device`` override the run's)."""
    run = loop.run
    delta, privacy = loop.privacy_summary()
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
        "wall_seconds": None if last.seconds is None else round(last.seconds, 2),
        "device": device or device_description(loop.device),
        "paper": run.paper,
        "privacy": privacy,
        "config": run.to_dict(),
        "plot_metrics": list(getattr(loop, "plot_metrics", ())),  # a loop's extra curves
        **(loop.extra_summary() if hasattr(loop, "extra_summary") else {}),  # SHARE's audit
        "environment": run_environment(),  # commit, command, threads, kernels, BLAS
    }


def csv_row(obj: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """One ``rounds.jsonl`` object as ``rounds.csv`` cells: nested objects flattened to
    ``"outer.inner"`` columns, ``None`` as ``""``, booleans as ``true``/``false``, floats by
    ``repr`` (``inf``, ``nan`` included: ``float(cell)`` gives the value back exactly), lists
    as JSON text, strings as they are."""
    row: dict[str, str] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            row |= csv_row(value, f"{name}.")
        elif value is None:
            row[name] = ""
        elif isinstance(value, bool):
            row[name] = "true" if value else "false"
        elif isinstance(value, int | float | str):
            row[name] = repr(value) if isinstance(value, float) else str(value)
        else:
            row[name] = json.dumps(value, default=str)
    return row


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either absent/old or complete: a temp
    file in the same folder, flushed to disk, then renamed over ``path`` (atomic on POSIX
    and Windows, ``os.replace``)."""
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    savez: Any = np.savez  # keyword names are the arrays' keys (numpy's stubs type them)
    savez(buffer, **dict(arrays))
    return buffer.getvalue()


class RunWriter:
    """Writes one run's folder as it goes: :meth:`start` (``config.json``, an empty
    ``rounds.jsonl`` and ``rounds.csv``), :meth:`record` per round (evaluated rounds are
    appended and flushed to both, so an interrupted run stays readable), :meth:`write_model`
    (``model.npz``, ``model.json``), :meth:`finish` (``summary.json``, last: its presence
    marks the run finished). The model and the summary are written atomically
    (:func:`write_atomically`), so a folder with ``summary.json`` has its whole model.

    ``rounds.csv`` holds the rows of ``rounds.jsonl`` (:func:`csv_row`); its header is the
    union of the keys seen, in order of first appearance: a record with a key the header
    lacks rewrites the file (atomically) with the longer header, earlier rows leaving that
    cell empty; otherwise a row is appended."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.accuracies: list[float] = []
        self._csv_header: list[str] | None = None  # None: not read yet

    @property
    def summary_path(self) -> Path:
        return self.folder / SUMMARY_FILE

    @property
    def csv_path(self) -> Path:
        return self.folder / ROUNDS_CSV_FILE

    def start(self, config: Mapping[str, Any]) -> None:
        """Create the folder, write ``config.json`` and truncate ``rounds.jsonl`` and
        ``rounds.csv``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / CONFIG_FILE).write_text(json.dumps(dict(config), indent=2, default=str))
        (self.folder / ROUNDS_FILE).write_text("")
        self.csv_path.write_text("")
        self._csv_header = []
        self.accuracies = []

    def resume(self, rounds_done: int) -> None:
        """Continue the folder of a run resumed after ``rounds_done`` rounds: keep the rows
        of ``rounds.jsonl`` up to that round and drop later ones (the resumed run writes
        them again), rewrite ``rounds.csv`` from the kept rows, and recount
        :attr:`accuracies`. ``config.json`` is left as it is."""
        path = self.folder / ROUNDS_FILE
        lines = path.read_text().splitlines() if path.is_file() else []
        kept = [obj for obj in map(json.loads, filter(None, lines)) if obj["round"] <= rounds_done]
        text = "".join(json.dumps(obj, default=str) + "\n" for obj in kept)
        write_atomically(path, text.encode("utf-8"))
        rows = [csv_row(obj) for obj in kept]
        self._csv_header = list(dict.fromkeys(k for row in rows for k in row))
        self._write_csv(self._csv_header, rows)
        self.accuracies = [obj["accuracy"] for obj in kept]

    def record(self, record: RoundRecord) -> bool:
        """Append ``record`` if it was evaluated; returns whether it was written."""
        if not record.evaluated:
            return False
        assert record.accuracy is not None
        self.accuracies.append(record.accuracy)
        obj = record.to_json()
        with (self.folder / ROUNDS_FILE).open("a") as log:
            log.write(json.dumps(obj, default=str) + "\n")
        self._append_csv(csv_row(obj))
        return True

    def _append_csv(self, row: dict[str, str]) -> None:
        header = self._read_csv_header() if self._csv_header is None else self._csv_header
        new = [k for k in row if k not in header]
        if not header or new:
            rows = self._read_csv_rows() if header else []
            header = [*header, *new]
            self._write_csv(header, [*rows, row])
        else:
            with self.csv_path.open("a", newline="", encoding="utf-8") as f:
                csv.DictWriter(f, header, restval="", lineterminator="\n").writerow(row)
        self._csv_header = header

    def _write_csv(self, header: list[str], rows: list[dict[str, str]]) -> None:
        """Rewrite ``rounds.csv`` atomically (empty when there is no header yet)."""
        text = io.StringIO()
        if header:
            out = csv.DictWriter(text, header, restval="", lineterminator="\n")
            out.writeheader()
            out.writerows(rows)
        write_atomically(self.csv_path, text.getvalue().encode("utf-8"))

    def _read_csv_header(self) -> list[str]:
        """The header of an existing ``rounds.csv`` (a writer made for a folder whose run
        goes on), ``[]`` if there is none."""
        if not self.csv_path.is_file():
            return []
        with self.csv_path.open(newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])

    def _read_csv_rows(self) -> list[dict[str, str]]:
        with self.csv_path.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))

    def write_model(self, model: FinalModel, **extra: Any) -> Path:
        """Write ``model.npz`` (``model.state``), ``agents.npz`` (``model.agents``, if any)
        and then ``model.json`` (:meth:`FinalModel.metadata` plus ``extra``, e.g. the
        final accuracy), each atomically; returns the path of ``model.npz``."""
        path = self.folder / MODEL_FILE
        write_atomically(path, _npz_bytes(model.state))
        if model.agents is not None:
            write_atomically(self.folder / AGENTS_FILE, _npz_bytes(model.agents))
        meta = {**model.metadata(), **extra}
        text = json.dumps(meta, indent=2, default=str)
        write_atomically(self.folder / MODEL_META_FILE, text.encode("utf-8"))
        return path

    def finish(self, summary: Mapping[str, Any]) -> Path:
        """Write ``summary.json`` atomically; returns its path."""
        text = json.dumps(dict(summary), indent=2, default=str)
        write_atomically(self.summary_path, text.encode("utf-8"))
        return self.summary_path


def read_summary(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``summary.json`` object of a run folder, or ``None`` if the run is unfinished."""
    path = Path(folder) / SUMMARY_FILE
    return _read_json_object(path) if path.is_file() else None


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class RunRecord:
    """One run: the fields of its ``summary.json`` and its rounds.

    ``finished`` is ``False`` for a run without ``summary.json``; its summary-only fields
    (``final_accuracy``, ``best_accuracy``, ``delta``, ``total_rounds``, ``wall_seconds``,
    ``device``, ``paper``) are then ``None``, and ``epsilon`` is that of its last round.
    ``total_rounds`` is the summary's ``"rounds"`` count; ``rounds`` the per-round records in
    increasing round order. ``config`` is the summary's ``"config"``, else ``config.json``,
    else ``{}`` (excluded from hashing). ``extra`` holds the summary's other keys as read
    (:data:`SUMMARY_KEYS` are the typed ones): ``privacy``, ``environment`` and a loop's own
    results such as ``adaptive_clipping`` or ``share``; ``{}`` for an unfinished run;
    excluded from hashing and comparison (two records of the same results are equal whatever
    machine produced them).
    """

    path: Path
    run_id: str
    name: str
    label: str
    seed: int | None
    finished: bool
    final_accuracy: float | None
    best_accuracy: float | None
    epsilon: float | None
    delta: float | None
    total_rounds: int | None
    wall_seconds: float | None
    device: str | None
    paper: float | None
    rounds: tuple[RoundRecord, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)
    plot_metrics: tuple[str, ...] = ()  # keys of the rounds' ``extra`` the loop asks to plot
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)


def _natural_key(path: Path) -> tuple[Any, ...]:
    """Sort key ordering ``run2`` before ``run10`` (digits compared as numbers)."""
    parts: list[Any] = []
    for piece in path.as_posix().split("/"):
        for token in re.split(r"(\d+)", piece):
            if token:
                parts.append((0, int(token), "") if token.isdigit() else (1, 0, token))
        parts.append((-1, 0, ""))  # folder boundary sorts before any token
    return tuple(parts)


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: cannot read: {e}") from e
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}:{e.lineno}: invalid JSON (column {e.colno}): {e.msg}") from e
    if not isinstance(obj, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(
    obj: Mapping[str, Any],
    key: str,
    where: str,
    *,
    required: bool = False,
    nullable: bool = True,
    unit_interval: bool = False,
    nonnegative: bool = False,
    finite: bool = True,
) -> float | None:
    """``obj[key]`` as a float, checked; ``None`` when absent or null (if allowed)."""
    if key not in obj:
        if required:
            raise ResultsError(f"{where}: missing key {key!r}")
        return None
    value = obj[key]
    if value is None:
        if not nullable:
            raise ResultsError(f"{where}: {key!r} must be a number, got null")
        return None
    if not _is_number(value):
        raise ResultsError(f"{where}: {key!r} must be a number, got {value!r}")
    x = float(value)
    if finite and not math.isfinite(x):
        raise ResultsError(f"{where}: {key!r} must be finite, got {value!r}")
    if unit_interval and not 0.0 <= x <= 1.0:
        raise ResultsError(f"{where}: {key!r} must be a fraction in [0, 1], got {value!r}")
    if nonnegative and x < 0:
        raise ResultsError(f"{where}: {key!r} must be >= 0, got {value!r}")
    return x


def _int(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> int | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise ResultsError(f"{where}: missing key {key!r}")
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ResultsError(f"{where}: {key!r} must be an integer, got {value!r}")
    return value


def _str(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise ResultsError(f"{where}: missing key {key!r}")
        return None
    if not isinstance(value, str):
        raise ResultsError(f"{where}: {key!r} must be a string, got {value!r}")
    return value


def _load_rounds(path: Path) -> tuple[RoundRecord, ...]:
    """Parse ``rounds.jsonl``: blank lines are skipped; rounds must strictly increase."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: cannot read: {e}") from e
    records: list[RoundRecord] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{where}: invalid JSON (column {e.colno}): {e.msg}") from e
        if not isinstance(obj, dict):
            raise ResultsError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        number = _int(obj, "round", where, required=True)
        assert number is not None
        if number < 1:
            raise ResultsError(f"{where}: 'round' must be >= 1 (1-based), got {number}")
        if records and number <= records[-1].round:
            raise ResultsError(f"{where}: round {number} does not follow round {records[-1].round}")
        accuracy = _number(
            obj, "accuracy", where, required=True, nullable=False, unit_interval=True
        )
        assert accuracy is not None
        records.append(
            RoundRecord(
                round=number,
                accuracy=accuracy,
                loss=_number(obj, "loss", where, finite=False),
                epsilon=_number(obj, "epsilon", where, nonnegative=True),
                seconds=_number(obj, "seconds", where, nonnegative=True),
                extra={k: v for k, v in obj.items() if k not in ROUND_KEYS},
            )
        )
    return tuple(records)


def _metric_names(summary: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The summary's ``"plot_metrics"`` (absent: none)."""
    names = summary.get("plot_metrics", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ResultsError(f"{where}: 'plot_metrics' must be a list of strings")
    return tuple(names)


def _load_run(folder: Path, root: Path) -> RunRecord:
    summary_path = folder / SUMMARY_FILE
    rounds_path = folder / ROUNDS_FILE
    config_path = folder / CONFIG_FILE
    rounds = _load_rounds(rounds_path) if rounds_path.is_file() else ()
    file_config = _read_json_object(config_path) if config_path.is_file() else {}

    if not summary_path.is_file():
        where = str(config_path)
        try:
            parent = folder.parent.relative_to(root).as_posix()
        except ValueError:
            parent = "."
        default_name = parent if parent != "." else root.resolve().name or "runs"
        return RunRecord(
            path=folder,
            run_id=folder.name,
            name=_str(file_config, "name", where) or default_name,
            label=_str(file_config, "label", where) or folder.name,
            seed=_int(file_config, "seed", where),
            finished=False,
            final_accuracy=None,
            best_accuracy=None,
            epsilon=rounds[-1].epsilon if rounds else None,
            delta=None,
            total_rounds=None,
            wall_seconds=None,
            device=None,
            paper=None,
            rounds=rounds,
            config=file_config,
        )

    summary = _read_json_object(summary_path)
    where = str(summary_path)
    final = _number(
        summary, "final_accuracy", where, required=True, nullable=False, unit_interval=True
    )
    best = _number(summary, "best_accuracy", where, unit_interval=True)
    assert final is not None
    if best is None:
        best = max([final, *(r.accuracy for r in rounds if r.accuracy is not None)])
    total_rounds = _int(summary, "rounds", where)
    config = summary.get("config", file_config)
    if config is None:
        config = file_config
    if not isinstance(config, dict):
        raise ResultsError(f"{where}: 'config' must be a JSON object")
    return RunRecord(
        path=folder,
        run_id=_str(summary, "run_id", where) or folder.name,
        name=_str(summary, "name", where, required=True) or "",
        label=_str(summary, "label", where, required=True) or "",
        seed=_int(summary, "seed", where),
        finished=True,
        final_accuracy=final,
        best_accuracy=best,
        epsilon=_number(summary, "epsilon", where, nonnegative=True),
        delta=_number(summary, "delta", where, nonnegative=True),
        total_rounds=total_rounds,
        wall_seconds=_number(summary, "wall_seconds", where, nonnegative=True),
        device=_str(summary, "device", where),
        paper=_number(summary, "paper", where, unit_interval=True),
        rounds=rounds,
        config=config,
        plot_metrics=_metric_names(summary, where),
        extra={k: v for k, v in summary.items() if k not in SUMMARY_KEYS},
    )


def load_runs(directory: str | os.PathLike[str]) -> list[RunRecord]:
    """Every run folder at any depth under ``directory`` (``directory`` itself included).

    A run folder holds ``summary.json`` (finished) or ``rounds.jsonl`` (unfinished, when it
    has no summary; a deployment server's protocol log, :data:`SERVER_LOG_MARKERS`, is
    skipped). Runs are returned in natural order of their paths (``run2`` before
    ``run10``), so the result is deterministic. Returns ``[]`` for a directory without runs.

    Raises :class:`ResultsError` if ``directory`` is not a directory, or naming the file (and
    the line of ``rounds.jsonl``) when a file is malformed: invalid JSON, not an object, a
    missing ``name``/``label``/``final_accuracy``/``round``/``accuracy``, a value of the
    wrong type, an accuracy outside ``[0, 1]``, rounds not strictly increasing.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ResultsError(f"{root}: not a directory")
    folders = {p.parent for p in root.rglob(SUMMARY_FILE) if p.is_file()}
    folders |= {
        p.parent
        for p in root.rglob(ROUNDS_FILE)
        if p.is_file() and not any((p.parent / m).exists() for m in SERVER_LOG_MARKERS)
    }
    ordered = sorted(folders, key=lambda f: _natural_key(f.relative_to(root)))
    return [_load_run(folder, root) for folder in ordered]
