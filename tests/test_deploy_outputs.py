"""What ``sharefl serve --out`` keeps: one dtype, the last k aggregates, a resumable folder.

The contract (:mod:`sharefl.deploy.results`): ``model.npy``, every ``round-R-aggregate.npy``
and the checkpoint's model are float32 (the model's dtype on the wire); only the aggregate
files of the last ``server.keep_aggregates`` rounds that produced one are kept (0: none,
-1: all), pruned once the displacing round is on disk, never the files ``--resume`` reads.
Checked on the writer alone (fake reports), on in-process gRPC runs against the clear sum
of :func:`~sharefl.deploy.client.demo_trainer` updates (multiples of 1/256: exact in
float32), and across a crash and a resume.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S, PYTHON, serving, start_server
from test_server_resume import Crash, CrashingWriter

from sharefl.deploy.client import ClientRuntime, demo_trainer
from sharefl.deploy.config import (
    DEFAULT_KEEP_AGGREGATES,
    DeploymentConfig,
    ModelSection,
    SecureAggregationSection,
    ServerSection,
    load_config,
)
from sharefl.deploy.results import (
    CHECKPOINT_FILE,
    MODEL_FILE,
    RELEASES_FILE,
    ROUNDS_FILE,
    ResultsWriter,
    aggregate_files,
    load_checkpoint,
    prune_aggregates,
)
from sharefl.deploy.server import serve
from sharefl.protocol.coordinator import Release
from sharefl.protocol.errors import ConfigurationError

DIM = 8


def _config(rounds: int, keep: int, clients: int = 4) -> DeploymentConfig:
    """``clients`` clients in clusters of four (t = 3), sums of demo updates, lr 1/4."""
    return DeploymentConfig(
        server=ServerSection(
            address="127.0.0.1:0",
            clients=clients,
            rounds=rounds,
            connect_timeout_s=HANG_S,
            stage_timeout_s=HANG_S,
            keep_aggregates=keep,
        ),
        model=ModelSection(dim=DIM, aggregator="sum", learning_rate=0.25),
        secure_aggregation=SecureAggregationSection(cluster_size=4, threshold=3),
    )


def _clear_sum(round_index: int, clients) -> np.ndarray:
    """The aggregate a round must produce: the sum of the demo updates (independent of the
    protocol), computed in float64."""
    return sum(
        demo_trainer(np.zeros(DIM, np.float32), round=round_index, client_id=c).astype(np.float64)
        for c in clients
    )


def _rounds(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / ROUNDS_FILE).read_text().splitlines()]


# --- the writer alone ---------------------------------------------------------------------------


@dataclass
class _Report:
    """The fields of a RoundReport the writer reads (``total``: float64, as the server's)."""

    round: int
    total: np.ndarray | None


def _write(writer: ResultsWriter, rounds: range, *, missing: frozenset[int] = frozenset()):
    for r in rounds:
        total = None if r in missing else np.full(DIM, r + 0.1, np.float64)
        writer.round(_Report(r, total), np.full(DIM, -r, np.float32))


@pytest.mark.parametrize(
    ("keep", "kept"),
    [(2, [4, 5]), (1, [5]), (0, []), (-1, [1, 2, 3, 4, 5]), (9, [1, 2, 3, 4, 5])],
)
def test_the_writer_keeps_the_last_k_aggregates_in_float32(tmp_path, keep, kept):
    writer = ResultsWriter(tmp_path, keep_aggregates=keep)
    _write(writer, range(5))
    writer.finish()
    assert sorted(aggregate_files(tmp_path)) == kept
    model = np.load(tmp_path / MODEL_FILE)
    assert model.dtype == np.float32
    for r in kept:
        aggregate = np.load(aggregate_files(tmp_path)[r])
        assert aggregate.dtype == model.dtype
        np.testing.assert_array_equal(aggregate, np.float32(r - 1 + 0.1))
    with np.load(tmp_path / CHECKPOINT_FILE) as data:
        assert data["model"].dtype == np.float32
    assert [row["round"] for row in _rounds(tmp_path)] == [1, 2, 3, 4, 5]


def test_k_counts_the_rounds_that_produced_an_aggregate(tmp_path):
    """Rounds without an aggregate (nothing released, interrupted) displace nothing."""
    writer = ResultsWriter(tmp_path, keep_aggregates=2)
    _write(writer, range(5), missing=frozenset({2, 4}))
    assert sorted(aggregate_files(tmp_path)) == [2, 4]


def test_a_fresh_run_deletes_an_earlier_runs_aggregates_and_a_resumed_one_its_orphans(tmp_path):
    """A fresh writer starts the folder afresh (an old round-7 file would pass for this
    run's); a resumed one deletes only files of rounds after its checkpoint (written by a
    server killed before that round's checkpoint)."""
    old = ResultsWriter(tmp_path, keep_aggregates=-1)
    _write(old, range(7))
    old.finish()
    writer = ResultsWriter(tmp_path, keep_aggregates=-1)
    assert aggregate_files(tmp_path) == {}
    _write(writer, range(3))
    writer.finish()
    np.save(tmp_path / "round-4-aggregate.npy", np.zeros(DIM, np.float32))  # an orphan
    checkpoint = load_checkpoint(tmp_path)
    ResultsWriter(tmp_path, checkpoint).finish()
    assert sorted(aggregate_files(tmp_path)) == [1, 2, 3]


def test_pruning_touches_nothing_but_aggregate_files(tmp_path):
    names = [
        CHECKPOINT_FILE,
        ROUNDS_FILE,
        RELEASES_FILE,
        MODEL_FILE,
        "round-1-aggregate.npy.tmp",
        "round-x-aggregate.npy",
        "releases/round-1-0-0.npy",
    ]
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    for r in (1, 2, 3):
        (tmp_path / f"round-{r}-aggregate.npy").write_bytes(b"")
    assert prune_aggregates(tmp_path, finished=3, keep=1) == [1, 2]
    assert all((tmp_path / name).exists() for name in names)
    assert sorted(aggregate_files(tmp_path)) == [3]


# --- the setting --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-2, -100])
def test_a_bad_keep_aggregates_is_a_configuration_error_saying_what_to_set(value):
    with pytest.raises(ConfigurationError, match=r"server\.keep_aggregates .*0 keeps none"):
        ServerSection(keep_aggregates=value)
    with pytest.raises(ConfigurationError, match=r"server\.keep_aggregates"):
        ResultsWriter("unused", keep_aggregates=value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("keep_aggregates = -3", r"server\.keep_aggregates must be an integer: k >= 1"),
        ('keep_aggregates = "all"', r"server\.keep_aggregates must be an integer, got 'all'"),
        ("keep_aggregates = 2.5", r"server\.keep_aggregates must be an integer"),
    ],
)
def test_a_bad_keep_aggregates_in_the_file_names_the_key(tmp_path, text, message):
    path = tmp_path / "deploy.toml"
    path.write_text(f"[server]\n{text}\n")
    with pytest.raises(ConfigurationError, match=message):
        load_config(path)


def test_the_file_sets_keep_aggregates_and_the_default_is_small(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text("[server]\nkeep_aggregates = -1\n")
    assert load_config(path).server.keep_aggregates == -1
    path.write_text("")
    assert load_config(path).server.keep_aggregates == DEFAULT_KEEP_AGGREGATES == 3


# --- over gRPC, in process ----------------------------------------------------------------------


def test_a_short_run_with_k_2_leaves_the_last_two_aggregates_equal_to_the_clear_sum(tmp_path):
    """Four rounds, server.keep_aggregates = 2, the writer left at its default (3): the
    server's setting reaches the writer (as ``sharefl serve --out`` builds it) and only
    rounds 3 and 4 remain, float32 like model.npy, each the clear sum of its round."""
    out = tmp_path / "out"

    async def main() -> None:
        writer = ResultsWriter(out)
        server, address = await serving(
            serve, _config(rounds=4, keep=2), on_round=writer.round, journal=writer
        )
        await asyncio.gather(*(ClientRuntime(c, address).run() for c in range(4)))
        writer.finish((await server).traffic)

    asyncio.run(main())
    rows = _rounds(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    files = aggregate_files(out)
    assert sorted(files) == [3, 4]
    model = np.load(out / MODEL_FILE)
    assert model.dtype == np.float32
    for r in (3, 4):
        aggregate = np.load(files[r])
        assert aggregate.dtype == model.dtype and aggregate.shape == (DIM,)
        np.testing.assert_array_equal(aggregate, _clear_sum(r - 1, rows[r - 1]["participants"]))
    expected = -0.25 * sum(_clear_sum(r, range(4)) for r in range(4))  # lr 1/4, exact
    np.testing.assert_array_equal(model, expected.astype(np.float32))


def test_a_pruned_folder_resumes_after_a_crash_and_keeps_pruning(tmp_path):
    """Eight clients in two clusters, k = 2. The server dies at the first approval of
    round 4 (rounds 1-3 finished: round 1's aggregate already pruned). The folder resumes:
    round 4 is closed as interrupted (no aggregate), round 5 runs on the same model and
    clusterings, and the last two aggregates are those of rounds 3 and 5."""
    out = tmp_path / "out"
    config = _config(rounds=5, keep=2, clients=8)

    async def first() -> list[ClientRuntime]:
        writer = CrashingWriter(out, after=6)  # two sums a round: dies in round 4
        server, address = await serving(serve, config, on_round=writer.round, journal=writer)
        clients = [ClientRuntime(c, address, retries=1, server_timeout_s=HANG_S) for c in range(8)]
        await asyncio.gather(*(c.run() for c in clients), return_exceptions=True)
        with pytest.raises(Crash):
            await server
        return clients

    before = asyncio.run(first())
    assert sorted(aggregate_files(out)) == [2, 3]
    checkpoint = load_checkpoint(out)
    assert checkpoint.next_round == 4 and checkpoint.rows[-1]["interrupted"]
    assert checkpoint.model.dtype == np.float32
    np.testing.assert_array_equal(checkpoint.model, np.load(out / MODEL_FILE))

    async def second() -> None:
        writer = ResultsWriter(out, checkpoint)
        server, address = await serving(
            serve, config, on_round=writer.round, resume=checkpoint, journal=writer
        )
        clients = [ClientRuntime(c, address) for c in range(8)]
        for client, earlier in zip(clients, before, strict=True):
            client.memory = earlier.memory  # the same client, restarted with its state
        reports = await asyncio.gather(*(c.run() for c in clients))
        assert [r.rounds for r in reports] == [1] * 8 and not any(r.refusals for r in reports)
        writer.finish((await server).traffic)

    asyncio.run(second())
    rows = _rounds(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5] and rows[3]["interrupted"]
    assert sorted(aggregate_files(out)) == [3, 5]
    aggregate = np.load(aggregate_files(out)[5])
    assert aggregate.dtype == np.float32
    np.testing.assert_array_equal(aggregate, _clear_sum(4, range(8)))
    journal = [json.loads(x) for x in (out / RELEASES_FILE).read_text().splitlines()]
    assert sorted({e["round"] for e in journal if e["kind"] == "plan"}) == [1, 2, 3, 4, 5]
    assert load_checkpoint(out).next_round == 5


def test_a_resume_with_a_smaller_k_prunes_at_once(tmp_path):
    """keep_aggregates is read from the file on every start: a run resumed with k = 1
    drops the older aggregates before its first round."""
    writer = ResultsWriter(tmp_path, keep_aggregates=-1)
    writer.begin(b"r" * 16, np.zeros(DIM, np.float32), keep_aggregates=-1)
    _write(writer, range(4))
    writer.finish()
    resumed = ResultsWriter(tmp_path, load_checkpoint(tmp_path))
    assert sorted(aggregate_files(tmp_path)) == [1, 2, 3, 4]
    resumed.begin(b"r" * 16, np.zeros(DIM, np.float32), keep_aggregates=1)
    assert sorted(aggregate_files(tmp_path)) == [4]
    resumed.finish()


def test_sharefl_serve_out_keeps_what_the_file_says(tmp_path):
    """``sharefl serve --out`` (the command, three ``sharefl client`` processes) with
    ``keep_aggregates = 1`` in the deployment file: round 3's aggregate only, float32."""
    config = tmp_path / "deploy.toml"
    config.write_text(
        f"[server]\nclients = 3\nrounds = 3\nkeep_aggregates = 1\n"
        f"connect_timeout_s = {HANG_S}\nstage_timeout_s = {HANG_S}\n"
        '[model]\ndim = 16\naggregator = "sum"\n[secure_aggregation]\ncluster_size = 3\n'
    )
    out = tmp_path / "out"
    log = (tmp_path / "server.log").open("w")
    server, address = start_server(
        config, "--out", str(out), folder=tmp_path, stderr=log, stdout=log
    )
    clients = [
        subprocess.Popen([*PYTHON, "client", "--server", address, "--id", str(c)]) for c in range(3)
    ]
    try:
        assert server.wait(timeout=HANG_S) == 0, (tmp_path / "server.log").read_text()
        assert [c.wait(timeout=HANG_S) for c in clients] == [0, 0, 0]
    finally:
        for process in (*clients, server):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert len(_rounds(out)) == 3
    assert sorted(aggregate_files(out)) == [3]
    aggregate = np.load(aggregate_files(out)[3])
    assert aggregate.dtype == np.load(out / MODEL_FILE).dtype == np.float32
    clear = sum(demo_trainer(np.zeros(16), round=2, client_id=c) for c in range(3))
    np.testing.assert_array_equal(aggregate, clear)


def test_releases_become_durable_together_at_sync_sum_files_before_their_lines(tmp_path):
    """The server syncs once per stage: until then nothing of the stage's approvals or sums
    is in the journal and no sum file is in place; after it, the files are, then the lines
    in the order recorded."""
    writer = ResultsWriter(tmp_path)
    writer.begin(b"r" * 16, np.zeros(DIM, np.float32))
    journal = tmp_path / RELEASES_FILE
    before = journal.read_text()
    approvals = [Release(0, 0, k, (2 * k, 2 * k + 1)) for k in range(3)]
    for release in approvals:
        writer.release("model", release)
    summed = dataclasses.replace(approvals[1], sum=np.full(DIM, 7.0))
    writer.release("model", summed)
    assert journal.read_text() == before
    assert not list((tmp_path / "releases").glob("*.npy"))
    writer.sync()
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [(e["kind"], e["cluster"]) for e in lines] == [
        ("release", 0),
        ("release", 1),
        ("release", 2),
        ("sum", 1),
    ]
    np.testing.assert_array_equal(np.load(tmp_path / lines[-1]["file"]), np.full(DIM, 7.0))
    assert not list((tmp_path / "releases").glob("*.tmp"))
    writer.sync()  # nothing new: nothing written twice
    assert len(journal.read_text().splitlines()) == len(lines)
    writer.finish()
