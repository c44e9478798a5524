"""A server run's results, written as the rounds finish so that nothing finished is lost.

Under the results folder:

- ``rounds.jsonl``: one JSON object per finished round (the :class:`~sharefl.deploy.server.
  RoundReport` without its aggregate, its ``round`` numbered from 1 as the log prints it),
  appended, flushed and fsynced before the next round;
- ``round-R-aggregate.npy``: the aggregate of round R (from 1), and ``model.npy``: the model after
  the last finished round, each replaced atomically (write a temporary file, then rename).
  Both are float32 ``[dim]`` (:data:`OUTPUT_DTYPE`, the model's dtype on the wire and in
  the model step, :func:`~sharefl.rounds.model_step.descend`). Only the aggregates of the last
  ``server.keep_aggregates`` rounds that produced one are kept (0: none, -1: all; see
  :func:`prune_aggregates`); the older files are deleted once the round that displaces
  them is on disk. No aggregate file is needed to resume;
- ``checkpoint.npz``: the model after the last finished round with that round's JSON
  object, replaced atomically *before* the line is appended, so that
  :func:`load_checkpoint` can always tell which model goes with which rounds;
- ``result.json``: at the end (or on interruption) every round (as in ``rounds.jsonl``,
  each with its own ``traffic``: bytes per client in that round) and ``traffic_total``
  (bytes per client over the whole run), also written atomically;
- ``releases.jsonl``: the release journal (:class:`ResultsWriter` as the server's
  :class:`~sharefl.deploy.run.RunJournal`): one JSON object per line, appended, flushed
  and fsynced before the server acts on it. ``{"kind": "plan", ...}`` — a round's committed
  clusterings, with the model (its SHA-256, :func:`~sharefl.protocol.memory.model_digest`)
  they were planned on, written before the round's RoundStart leaves; ``{"kind":
  "release", ...}`` — the members of a sum the release check approved, written before the
  unmask request that releases it leaves; ``{"kind": "sum", ...}`` — that sum once computed,
  its values in ``releases/round-R-r-k.npy`` (written atomically first). Every line carries
  the run id. Sum files are kept for the current model only (they are deleted when a plan
  on a new model is committed); the lines stay.

A server killed at any moment leaves the rounds it finished intact and a model that is
that of its last finished round, never a torn file, and a journal that lists every sum it
may have released (a torn last line is the record of a release that was never requested:
it is dropped). ``sharefl serve --resume DIR`` continues from there
(:func:`load_checkpoint`): the run id, the model, the clusterings that model was planned
with and every sum released on it. A round that had committed a plan but not finished is
closed as ``"interrupted": true`` (no model step: the sums it released are audited, not
applied), so the run goes on with the next round number over the same model and therefore
the same clusterings.
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

from sharefl.deploy.config import (
    DEFAULT_KEEP_AGGREGATES,
    KEEP_ALL_AGGREGATES,
    check_keep_aggregates,
)
from sharefl.deploy.errors import DeployError
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.coordinator import Release
from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.memory import model_digest
from sharefl.protocol.plan import RoundPlan
from sharefl.rounds.model_plans import ModelPlan

ROUNDS_FILE = "rounds.jsonl"
MODEL_FILE = "model.npy"
RESULT_FILE = "result.json"
CHECKPOINT_FILE = "checkpoint.npz"
RELEASES_FILE = "releases.jsonl"
SUMS_FOLDER = "releases"
AGGREGATE_SUFFIX = "-aggregate.npy"
OUTPUT_DTYPE = np.float32
"""The dtype of ``model.npy``, ``round-R-aggregate.npy`` and the checkpoint's model: the
model's on the wire (:func:`sharefl.deploy.wire.chunk_frames` of a float32 model)."""


class ResumeError(DeployError, ConfigurationError):
    """A results folder that cannot be resumed (say what is wrong with it)."""


def model_id(model: np.ndarray) -> str:
    """The hex SHA-256 that names a model in the journal: the digest a client's memory
    keys it by (:func:`sharefl.protocol.memory.model_digest`), so both sides agree which
    rounds ran "on the same model"."""
    return model_digest(np.asarray(model, dtype=np.float32)).hex()


@dataclass(frozen=True)
class Checkpoint:
    """Where a run stopped: the finished rounds' JSON objects (in order), the model after
    the last of them, the run id (``None`` for a folder written before run ids), and what
    the journal holds about that model (``None``: no round was planned on it yet); the
    next round is ``len(rows)``."""

    rows: list[dict[str, Any]]
    model: np.ndarray
    run: bytes | None = None
    current: ModelPlan | None = None

    @property
    def next_round(self) -> int:
        return len(self.rows)


def load_checkpoint(out: str | Path) -> Checkpoint:
    """The checkpoint of a results folder written by :class:`ResultsWriter`.

    Repairs the gaps a crash can leave: the checkpoint written but its line not yet
    appended (the line is appended); a torn last journal line (dropped: the release it
    would have recorded was never requested); a round that committed its plan but did not
    finish (closed as an ``"interrupted"`` round without a model step, see the module
    docstring). Raises :class:`ResumeError` when there is no checkpoint or it does not
    match ``rounds.jsonl``.
    """
    folder = Path(out)
    path = folder / CHECKPOINT_FILE
    if not path.is_file():
        raise ResumeError(f"{path} is missing: nothing to resume (no run started there)")
    try:
        with np.load(path) as data:
            model = np.array(data["model"])
            last = json.loads(bytes(data["row"]).decode())
            run = bytes(data["run"]) if "run" in data.files else None
        rounds_path = folder / ROUNDS_FILE
        lines = rounds_path.read_text().splitlines() if rounds_path.exists() else []
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError, KeyError) as exc:
        raise ResumeError(f"cannot read the results in {folder}: {exc}") from exc
    if [r["round"] for r in rows] != list(range(1, len(rows) + 1)):
        raise ResumeError(f"{folder / ROUNDS_FILE} does not hold rounds 1, 2, ... in order")
    if last is None:  # the checkpoint a run writes before its first round
        if rows:
            raise ResumeError(
                f"the checkpoint precedes every round but {ROUNDS_FILE} holds {len(rows)}"
            )
    elif last["round"] == len(rows) + 1:  # killed between the checkpoint and its line
        with rounds_path.open("a") as log:
            log.write(json.dumps(last) + "\n")
        rows.append(last)
    elif last["round"] != len(rows):
        raise ResumeError(
            f"the checkpoint is of round {last['round']} but {ROUNDS_FILE} ends with round "
            f"{len(rows)}"
        )
    entries = read_journal(folder, run)
    try:
        unfinished = [e for e in entries if e["kind"] == "plan" and e["round"] == len(rows) + 1]
        row = interrupted_row(len(rows) + 1, unfinished[-1], entries, rows) if unfinished else None
        current = model_record(entries, model_id(model))
    except (KeyError, TypeError, ValueError) as exc:
        raise ResumeError(
            f"{folder / RELEASES_FILE} holds an entry without the expected fields ({exc!r}); "
            "it was not written by sharefl serve"
        ) from exc
    if row is not None:
        write_checkpoint(folder, model, row, run)
        with rounds_path.open("a") as log:
            log.write(json.dumps(row) + "\n")
            log.flush()
            os.fsync(log.fileno())
        rows.append(row)
    return Checkpoint(rows, model, run, current)


def read_journal(folder: Path, run: bytes | None) -> list[dict[str, Any]]:
    """The journal lines of ``run`` (every line when ``run`` is None), in order. A last
    line without its newline (torn by a crash mid-append) is dropped and cut from the
    file, so later appends start on a line of their own. Raises :class:`ResumeError` for
    any other line that does not parse."""
    path = folder / RELEASES_FILE
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        atomic_write_bytes(path, data)
    entries: list[dict[str, Any]] = []
    for number, line in enumerate(data.decode().splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise ResumeError(f"{path}, line {number}, does not parse: {exc}") from exc
        if run is None or entry.get("run") == run.hex():
            entries.append(entry)
    return entries


def model_record(entries: list[dict[str, Any]], model: str) -> ModelPlan | None:
    """What ``entries`` (the journal of one run) hold about ``model``: the clusterings of
    its first plan and every release approved on it (None: it was never planned)."""
    plans = [e for e in entries if e["kind"] == "plan" and e["model"] == model]
    if not plans:
        return None
    clusterings = tuple(
        Clustering(tuple(tuple(c) for c in clustering)) for clustering in plans[0]["clusterings"]
    )
    releases = [
        Release(e["round"] - 1, e["reclustering"], e["cluster"], tuple(e["members"]))
        for e in entries
        if e["kind"] == "release" and e["model"] == model
    ]
    return ModelPlan(model, clusterings, releases)


def interrupted_row(
    round_number: int,
    plan: dict[str, Any],
    entries: list[dict[str, Any]],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``rounds.jsonl`` object of a round (numbered from 1) that committed ``plan`` but
    did not finish: its participants, the sums it released (as far as the journal knows:
    ``dropped``, ``excluded`` and ``complaints`` are not), no aggregate, no culprits."""
    released = [e for e in entries if e["kind"] == "release" and e["round"] == round_number]
    clusters = [
        {
            "reclustering": e["reclustering"],
            "cluster": e["cluster"],
            "members": e["members"],
            "dropped": [],
            "excluded": [],
            "complaints": [],
        }
        for e in released
    ]
    per_reclustering: dict[int, int] = {}
    for e in released:
        per_reclustering[e["reclustering"]] = per_reclustering.get(e["reclustering"], 0) + len(
            e["members"]
        )
    return {
        "round": round_number,
        "interrupted": True,
        "participants": sorted({c for cluster in plan["clusterings"][0] for c in cluster}),
        "clusters": clusters,
        "failed": [],
        "withheld": [],
        "corrupted": [],
        "culprits": {},
        "excluded": rows[-1]["excluded"] if rows else [],
        "contributors": max(per_reclustering.values(), default=0),
        "seconds": 0.0,
        "sampled_out": [],
        "traffic": {},
    }


def write_checkpoint(
    folder: Path, model: np.ndarray, row: dict[str, Any] | None, run: bytes | None
) -> None:
    """Replace ``checkpoint.npz`` atomically: the model, the JSON object of the round it
    follows (``None`` before the first round) and the run id; the model as
    :data:`OUTPUT_DTYPE`, as ``model.npy``."""
    buffer = io.BytesIO()
    arrays: dict[str, np.ndarray] = {
        "model": np.asarray(model, dtype=OUTPUT_DTYPE),
        "row": np.frombuffer(json.dumps(row).encode(), np.uint8),
    }
    if run is not None:
        arrays["run"] = np.frombuffer(run, np.uint8)
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    atomic_write_bytes(folder / CHECKPOINT_FILE, buffer.getvalue())


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
    """``np.save`` to ``path`` as :func:`atomic_write_bytes` writes: a temporary file,
    fsynced, renamed into place."""
    _put_in_place(_stage_npy(path, array), path)


def _stage_npy(path: Path, array: np.ndarray) -> Path:
    """``array`` saved to ``path``'s temporary sibling, which is returned: neither durable
    nor in place until :func:`_put_in_place`."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.save(handle, array)
    return tmp


def _put_in_place(tmp: Path, path: Path) -> None:
    """fsync ``tmp`` and rename it to ``path``."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def aggregate_path(folder: Path, round_number: int) -> Path:
    """The aggregate file of round ``round_number`` (numbered from 1) under ``folder``."""
    return folder / f"round-{round_number}{AGGREGATE_SUFFIX}"


def aggregate_files(folder: Path) -> dict[int, Path]:
    """Every ``round-R-aggregate.npy`` under ``folder``, by R (temporary files and other
    names are not aggregates and are left out)."""
    found: dict[int, Path] = {}
    for path in folder.glob(f"round-*{AGGREGATE_SUFFIX}"):
        number = path.name[len("round-") : -len(AGGREGATE_SUFFIX)]
        if number.isdecimal():
            found[int(number)] = path
    return found


def prune_aggregates(folder: Path, finished: int, keep: int) -> list[int]:
    """Delete the aggregate files that a folder whose run finished ``finished`` rounds
    does not keep; returns the deleted rounds (from 1), in order.

    Kept: the ``keep`` highest-numbered files of rounds ``1..finished`` (``keep`` -1: all
    of them, 0: none). Deleted: the others, and any file of a round after ``finished``
    (written by a server killed before that round's checkpoint, or by an earlier run in
    the folder): it belongs to no finished round. Only ``round-R-aggregate.npy`` files
    are touched, never ``checkpoint.npz``, ``rounds.jsonl``, the journal or its sums,
    which is all that :func:`load_checkpoint` reads.

    Invariant (a crash at any point): each deletion is one ``unlink``, atomic, and the
    caller prunes only once the round it finished is on disk (aggregate, checkpoint and
    line), oldest file first, so the folder always holds the newest ``keep`` aggregates of
    its finished rounds; a crash mid-prune leaves older files over, never fewer, and the
    next prune removes them.
    """
    check_keep_aggregates(keep)
    files = aggregate_files(folder)
    finished_rounds = sorted(r for r in files if r <= finished)
    kept = set(finished_rounds if keep < 0 else finished_rounds[-keep:] if keep else [])
    deleted = sorted(r for r in files if r not in kept)
    for number in deleted:
        files[number].unlink(missing_ok=True)
    return deleted


def report_row(report: Any) -> dict[str, Any]:
    """The JSON object of one round report: every field but the aggregate, and ``round``
    numbered from 1 (the report's index is from 0, as on the wire)."""
    row = {k: v for k, v in dataclasses.asdict(report).items() if k != "total"}
    row["round"] = report.round + 1
    return row


class ResultsWriter:
    """Writes each finished round at once, and is the server's release journal (see the
    module docstring).

    Args:
        out: the results folder (created). An existing ``rounds.jsonl`` and
            ``releases.jsonl`` are started afresh (and old sum and aggregate files
            deleted) when the run begins, unless ``resume`` gives the checkpoint it
            continues (appended; aggregate files of rounds after it are deleted).
        keep_aggregates: how many of the latest rounds' aggregate files to keep (0: none,
            -1: all; :func:`prune_aggregates`). The server's :meth:`begin` replaces it by
            the deployment's ``server.keep_aggregates``. Raises
            :class:`~sharefl.protocol.errors.ConfigurationError` for a value below -1.
    """

    def __init__(
        self,
        out: str | Path,
        resume: Checkpoint | None = None,
        *,
        keep_aggregates: int = DEFAULT_KEEP_AGGREGATES,
    ) -> None:
        self.keep_aggregates = check_keep_aggregates(keep_aggregates)
        self.folder = Path(out)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = list(resume.rows) if resume else []
        # Delete the aggregates of no finished round of this run (all of them for a fresh
        # run); a resumed run prunes to its keep_aggregates in begin().
        prune_aggregates(self.folder, len(self.rows), KEEP_ALL_AGGREGATES if resume else 0)
        self._resume = resume
        self._log = (self.folder / ROUNDS_FILE).open("a" if resume else "w")
        self.run: bytes | None = resume.run if resume else None
        self._journal: io.TextIOWrapper | None = None
        self._sums_of: str | None = None
        self._staged: list[dict[str, Any]] = []
        """Journal lines recorded since the last :meth:`sync`, in order."""
        self._staged_sums: list[tuple[Path, Path]] = []
        """Sum files written since the last :meth:`sync` (temporary path, final path)."""

    # -- the release journal (sharefl.deploy.run.RunJournal) ----------------------------

    def begin(
        self, run: bytes, model: np.ndarray, *, keep_aggregates: int = DEFAULT_KEEP_AGGREGATES
    ) -> None:
        """Open the journal of ``run`` whose first round will run on ``model``, keeping the
        aggregates of the last ``keep_aggregates`` rounds (the deployment's
        ``server.keep_aggregates``; a resumed run prunes to it at once). A fresh run
        truncates the journal, deletes old sum files and writes a checkpoint before any
        round (so a crash in round 1 can be resumed); a resumed run appends."""
        self.keep_aggregates = check_keep_aggregates(keep_aggregates)
        prune_aggregates(self.folder, len(self.rows), self.keep_aggregates)
        self.run = bytes(run)
        fresh = self._resume is None
        path = self.folder / RELEASES_FILE
        created = not path.exists()
        self._journal = path.open("w" if fresh else "a")
        if fresh:
            self._delete_sums()
            write_checkpoint(self.folder, model, None, self.run)
        if fresh or created:
            _fsync_dir(self.folder)
        current = self._resume.current if self._resume else None
        self._sums_of = current.model if current else None

    def plan(self, model: str, plan: RoundPlan) -> None:
        """Record the committed plan of a round on ``model`` (call before its RoundStart
        leaves), with its atoms when it has them. The sum files of earlier models are
        deleted once it is on disk."""
        entry: dict[str, Any] = {
            "kind": "plan",
            "round": plan.round + 1,
            "model": model,
            "clusterings": [[list(c) for c in k.clusters] for k in plan.clusterings],
        }
        if plan.atoms is not None:
            entry["atoms"] = [list(a) for a in plan.atoms.clusters]
        self._staged.append(entry)
        self.sync()
        if self._sums_of != model:
            self._delete_sums()
            self._sums_of = model

    def release(self, model: str, release: Release) -> None:
        """Record an approved release (``release.sum`` None) or its computed sum, durable
        once :meth:`sync` returns: the server syncs before it sends the unmask requests the
        approvals justify and before the next stage or round, so the approvals of one stage
        cost one fsync. A sum's values are written to ``releases/round-R-r-k.npy`` now and
        put in place by :meth:`sync`, before its line."""
        entry: dict[str, Any] = {
            "kind": "release" if release.sum is None else "sum",
            "round": release.round + 1,
            "model": model,
            "reclustering": release.reclustering,
            "cluster": release.cluster,
            "members": list(release.members),
        }
        if release.sum is not None:
            folder = self.folder / SUMS_FOLDER
            folder.mkdir(exist_ok=True)
            name = f"round-{release.round + 1}-{release.reclustering}-{release.cluster}.npy"
            path = folder / name
            self._staged_sums.append((_stage_npy(path, np.asarray(release.sum)), path))
            entry["file"] = f"{SUMS_FOLDER}/{name}"
        self._staged.append(entry)

    def sync(self) -> None:
        """Make every plan, release and sum recorded so far durable: each sum file fsynced
        and renamed into place (as :func:`atomic_save_npy`), then the lines appended with
        one fsync. Raises :class:`DeployError` before :meth:`begin`."""
        if self._journal is None or self.run is None:
            raise DeployError("the release journal is not open: call begin(run, model) first")
        for tmp, path in self._staged_sums:
            _put_in_place(tmp, path)
        self._staged_sums.clear()
        if not self._staged:
            return
        run = self.run.hex()
        self._journal.write("".join(json.dumps({**e, "run": run}) + "\n" for e in self._staged))
        self._journal.flush()
        os.fsync(self._journal.fileno())
        self._staged.clear()

    def _delete_sums(self) -> None:
        """Delete every sum file (those of the models before the current one)."""
        folder = self.folder / SUMS_FOLDER
        if folder.is_dir():
            for path in folder.glob("round-*.npy"):
                path.unlink(missing_ok=True)

    # -- rounds -----------------------------------------------------------------------------

    def round(self, report: Any, model: np.ndarray) -> None:
        """Record one finished round: its aggregate (unless ``keep_aggregates`` is 0), the
        model after it, its JSON line, in that order; then delete the aggregates it
        displaces (:func:`prune_aggregates`). The aggregate and the model are written as
        :data:`OUTPUT_DTYPE` (float32)."""
        if report.total is not None and self.keep_aggregates != 0:
            total = np.asarray(report.total, dtype=OUTPUT_DTYPE)
            atomic_save_npy(aggregate_path(self.folder, report.round + 1), total)
        model = np.asarray(model, dtype=OUTPUT_DTYPE)
        row = report_row(report)
        write_checkpoint(self.folder, model, row, self.run)
        atomic_save_npy(self.folder / MODEL_FILE, model)
        self.rows.append(row)
        self._log.write(json.dumps(row) + "\n")
        self._log.flush()
        os.fsync(self._log.fileno())
        prune_aggregates(self.folder, len(self.rows), self.keep_aggregates)

    def finish(
        self,
        traffic: dict[int, dict[str, int]] | None = None,
        *,
        interrupted: bool = False,
        error: str = "",
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
        if self._journal is not None:
            self._journal.close()
        return self.folder


def _fsync_dir(directory: Path) -> None:
    """Make a file created (or renamed) in ``directory`` durable: fsync the directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
