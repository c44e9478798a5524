"""One model, one plan, across rounds and restarts; late messages never punish their sender.

The server's invariant (:mod:`sharefl.protocol.coordinator`, :mod:`sharefl.deploy.server`):
it never releases sums of one model under two clusterings, and its release audit covers
every sum released on that model, across rounds and restarts. Checked here on the
coordinator (prior releases seed the audit), on a run whose model does not move (every
round reuses the clusterings), and on a run that crashes after its k-th release and is
resumed (the journal holds every release before the next is requested; the union of both
processes' releases leaks nothing). Late messages (of an earlier round, reclustering or
stage) are dropped with a log line: in process, and over gRPC with a ``sharefl client``
process stopped (SIGSTOP) past a stage deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import HANG_S, PYTHON, serving, start_server

from sharefl.crypto.signatures import IdentityKey, stream_hello_message
from sharefl.deploy import wire
from sharefl.deploy.client import ClientRuntime
from sharefl.deploy.config import (
    DeploymentConfig,
    ModelSection,
    SecureAggregationSection,
    ServerSection,
)
from sharefl.deploy.results import (
    RELEASES_FILE,
    ResultsWriter,
    load_checkpoint,
    model_id,
)
from sharefl.deploy.run import ClientLink, ServerRun
from sharefl.deploy.server import serve
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol.audit import audit
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.coordinator import (
    Release,
    RoundCoordinator,
    RoundResult,
    SecureAggregationSettings,
)
from sharefl.protocol.errors import ClientRefusal, RejectedMessage
from sharefl.protocol.plan import RoundPlan

PER_CLIENT = ClientPolicy(require_atoms=False)
"""Clients that accept plans without atoms (these tests are about per-client clusters)."""

LENGTH = 8
SETTINGS = SecureAggregationSettings(cluster_size=4, min_sum_size=3)
"""Eight clients in two clusters of four (t = 3): one drop-out leaves a sum of three."""


def _coordinator(round_index: int, **kwargs) -> RoundCoordinator:
    return RoundCoordinator(
        SETTINGS,
        round=round_index,
        participants=range(8),
        length=LENGTH,
        rng=np.random.default_rng(round_index),
        **kwargs,
    )


def _drive(rc: RoundCoordinator, absent: frozenset[int] = frozenset()) -> RoundResult:
    """Run every reclustering of ``rc`` with in-process clients (input: their id in every
    coordinate); those in ``absent`` never answer. A client that refuses stops answering."""
    while not rc.done:
        assignments = rc.open_reclustering()
        sessions = {
            cid: ClientSession(cid, a, np.full(LENGTH, cid, dtype=np.uint32))
            for cid, a in assignments.items()
            if cid not in absent
        }
        for cid, session in sessions.items():
            rc.receive(cid, session.advertise())
        while not rc.reclustering_done:
            for cid, message in rc.advance().items():
                if cid not in sessions:
                    continue
                try:
                    reply = sessions[cid].handle(message)
                except ClientRefusal:
                    del sessions[cid]
                    continue
                if reply is not None:
                    rc.receive(cid, reply)
        rc.close_reclustering()
    return rc.result()


# --- the coordinator --------------------------------------------------------------------------


def test_prior_releases_seed_the_release_audit_of_a_round_over_the_same_model():
    """Round 0 releases both full clusters. Round 1 runs on the same model (same clusterings)
    and client 3 drops: its cluster's sum over the other three, with round 0's sum of all
    four, would reveal x_3. Seeded with round 0's releases the coordinator withholds it;
    without them (what a coordinator that forgets earlier rounds does) it releases it."""
    records: list[Release] = []
    first = _drive(_coordinator(0, on_release=records.append))
    approvals = [r for r in records if r.sum is None]
    assert len(approvals) == 2 and [r.sum is not None for r in records].count(True) == 2
    assert records.index(approvals[-1]) < min(
        i for i, r in enumerate(records) if r.sum is not None
    )  # every approval of a reclustering is reported before its sums are computed
    clusterings = first.plan.clusterings
    home = next(i for i, c in enumerate(clusterings[0].clusters) if 3 in c)

    seeded = _drive(
        _coordinator(1, clusterings=clusterings, prior_releases=approvals), frozenset({3})
    )
    withheld = seeded.reclusterings[0].withheld
    assert [f.cluster for f in withheld] == [home] and "updates of [3]" in withheld[0].reason
    assert len(seeded.clusters) == 1 and not seeded.realised_audit.leaks

    forgetful = _drive(_coordinator(1, clusterings=clusterings), frozenset({3}))
    assert len(forgetful.clusters) == 2  # the leak the seeded audit prevents


def test_a_failing_release_record_stops_the_unmask_request():
    """``on_release`` runs before the unmask requests leave: if it raises (a journal that
    cannot write), :meth:`advance` raises and no unmask request is handed out."""

    class Crash(Exception):
        pass

    def crash(release: Release) -> None:
        raise Crash(f"cannot record {release.members}")

    rc = _coordinator(0, on_release=crash)
    with pytest.raises(Crash):
        _drive(rc)
    assert rc.stage == "mask"  # the masked inputs are in; the release was never requested


def test_a_message_of_an_earlier_round_is_late_not_misbehaviour():
    old = _coordinator(0)
    assignments = old.open_reclustering()
    stale = ClientSession(5, assignments[5], np.zeros(LENGTH, np.uint32)).advertise()
    rc = _coordinator(1, clusterings=old.plan.clusterings)
    assignment = rc.open_reclustering()[5]
    with pytest.raises(RejectedMessage, match="of round 0 arrived in round 1") as err:
        rc.receive(5, stale)
    assert not err.value.misbehaviour and rc.culprits == {}
    ahead = ClientSession(5, assignment, np.zeros(LENGTH, np.uint32)).advertise()
    forged = dataclasses.replace(ahead, context=dataclasses.replace(ahead.context, round=7))
    with pytest.raises(RejectedMessage) as err:
        rc.receive(5, forged)  # a later round: no honest client sends it
    assert err.value.misbehaviour and 5 in rc.culprits


def _config(**server) -> DeploymentConfig:
    fields = {"clients": 8, "rounds": 1, "connect_timeout_s": HANG_S, "stage_timeout_s": HANG_S}
    return DeploymentConfig(
        server=ServerSection(address="127.0.0.1:0", **{**fields, **server}),
        model=ModelSection(dim=LENGTH, aggregator="sum"),
        secure_aggregation=SecureAggregationSection(cluster_size=4, threshold=3),
    )


def test_a_late_message_reaching_the_server_is_dropped_and_its_stream_stays_open():
    lines: list[str] = []
    run = ServerRun(_config(), log=lines.append)
    old = _coordinator(0)
    stale = ClientSession(5, old.open_reclustering()[5], np.zeros(LENGTH, np.uint32))
    run.round = _coordinator(1, clusterings=old.plan.clusterings)
    current = ClientSession(5, run.round.open_reclustering()[5], np.zeros(LENGTH, np.uint32))
    link = ClientLink(5)
    run.on_message(link, pb.ClientMessage(advertise=wire.advert_to_proto(stale.advertise())))
    assert link.alive and run.round.culprits == {}
    assert any("client 5: late message dropped" in line for line in lines), lines
    run.on_message(link, pb.ClientMessage(advertise=wire.advert_to_proto(current.advertise())))
    assert 5 not in run.round.waiting_for()  # the client goes on in the current round


# --- over gRPC, in process --------------------------------------------------------------------


def _journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / RELEASES_FILE).read_text().splitlines()]


def _audit_per_model(entries: list[dict], clients: int) -> None:
    """Every model's released sums, across rounds and processes, leak nothing."""
    for model in {e["model"] for e in entries}:
        rows = [e["members"] for e in entries if e["kind"] == "release" and e["model"] == model]
        if rows:
            report = audit(
                [Clustering((tuple(r),)) for r in rows], client_ids=range(clients), min_sum_size=3
            )
            assert not report.leaks and report.complete, report.summary()


def test_a_model_that_does_not_move_keeps_its_clusterings_and_accumulates_its_releases(tmp_path):
    """learning_rate 0: the strategy leaves the model as it was, so every round runs on the
    same model: same clusterings under new round numbers, and the journal's releases (all
    rounds together) pass the audit."""
    config = dataclasses.replace(
        _config(clients=6, rounds=3),
        model=ModelSection(dim=LENGTH, aggregator="sum", learning_rate=0.0),
        secure_aggregation=SecureAggregationSection(cluster_size=3, atoms=False),
    )
    out = tmp_path / "out"
    lines: list[str] = []

    async def main():
        writer = ResultsWriter(out)
        server, address = await serving(
            serve, config, log=lines.append, on_round=writer.round, journal=writer
        )
        clients = await asyncio.gather(
            *(ClientRuntime(c, address, policy=PER_CLIENT).run() for c in range(6))
        )
        result = await server
        writer.finish(result.traffic)
        return clients

    clients = asyncio.run(main())
    assert [c.rounds for c in clients] == [3] * 6
    entries = _journal(out)
    plans = [e for e in entries if e["kind"] == "plan"]
    assert [p["round"] for p in plans] == [1, 2, 3]
    assert len({json.dumps(p["clusterings"]) for p in plans}) == 1
    assert {p["model"] for p in plans} == {model_id(np.zeros(LENGTH, np.float32))}
    assert sum("clusterings are reused" in line for line in lines) == 2, lines
    assert len([e for e in entries if e["kind"] == "release"]) == 6  # 2 clusters, 3 rounds
    assert len({e["run"] for e in entries}) == 1
    _audit_per_model(entries, 6)


class Crash(Exception):
    """The server process dies here (simulated)."""


class CrashingWriter(ResultsWriter):
    """Dies at the approval of release number ``after + 1``, before recording it: the
    ``after`` releases before it are on disk (and were requested), it never is."""

    def __init__(self, out: Path, after: int) -> None:
        super().__init__(out)
        self.after = after

    def release(self, model: str, release: Release) -> None:
        if release.sum is None:
            if self.after == 0:
                raise Crash(f"killed before releasing {release.members}")
            self.after -= 1
        super().release(model, release)


def _nine(rounds: int) -> DeploymentConfig:
    return dataclasses.replace(
        _config(clients=9, rounds=rounds),
        secure_aggregation=SecureAggregationSection(cluster_size=3, reclusterings=2),
    )


def test_a_server_crashing_after_its_kth_release_resumes_with_the_same_plan_and_audit(tmp_path):
    """Nine clients in clusters of three, two reclusterings. The server dies at the first
    approval of reclustering 1 of round 1, after reclustering 0's three sums were released.
    Resumed, round 1 is closed as interrupted (no model step), round 2 runs on the same
    model with the same clusterings and the three releases in its audit, round 3 on the new
    model; the clients, whose memory of rounds and models spans both server processes,
    accept every round; and all the releases of both processes together leak nothing."""
    out = tmp_path / "out"
    lines: list[str] = []

    async def first() -> list[ClientRuntime]:
        writer = CrashingWriter(out, after=3)
        server, address = await serving(serve, _nine(3), on_round=writer.round, journal=writer)
        clients = [ClientRuntime(c, address, retries=1, server_timeout_s=HANG_S) for c in range(9)]
        ends = await asyncio.gather(*(c.run() for c in clients), return_exceptions=True)
        with pytest.raises(Crash):
            await server
        assert all(isinstance(e, Exception) for e in ends), ends  # the server is gone
        return clients

    before = asyncio.run(first())
    crashed = _journal(out)
    assert [e["kind"] for e in crashed].count("release") == 3
    assert [e["kind"] for e in crashed].count("sum") == 3

    checkpoint = load_checkpoint(out)
    assert checkpoint.next_round == 1 and checkpoint.rows[0]["interrupted"]
    assert len(checkpoint.rows[0]["clusters"]) == 3
    assert checkpoint.current is not None and len(checkpoint.current.releases) == 3
    assert checkpoint.run is not None and checkpoint.run.hex() == crashed[0]["run"]

    async def second():
        writer = ResultsWriter(out, checkpoint)
        server, address = await serving(
            serve,
            _nine(3),
            log=lines.append,
            on_round=writer.round,
            resume=checkpoint,
            journal=writer,
        )
        clients = [ClientRuntime(c, address) for c in range(9)]
        for client, earlier in zip(clients, before, strict=True):
            client.memory = earlier.memory  # the same client, restarted with its state
        reports = await asyncio.gather(*(c.run() for c in clients))
        result = await server
        writer.finish(result.traffic)
        return reports

    reports = asyncio.run(second())
    assert [r.rounds for r in reports] == [2] * 9 and not any(r.refusals for r in reports)
    assert any("with the model's clusterings and 3 sums released on it" in x for x in lines)
    entries = _journal(out)
    assert len({e["run"] for e in entries}) == 1
    plans = {e["round"]: e for e in entries if e["kind"] == "plan"}
    assert sorted(plans) == [1, 2, 3]
    assert plans[2]["clusterings"] == plans[1]["clusterings"]
    assert plans[2]["model"] == plans[1]["model"] != plans[3]["model"]
    rows = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3] and rows[0]["interrupted"]
    assert not any(r.get("interrupted") for r in rows[1:])
    _audit_per_model(entries, 9)
    first_model = [e for e in entries if e["model"] == plans[1]["model"]]
    assert [e["kind"] for e in first_model].count("release") == 3 + 6


def test_a_run_crashing_in_round_one_resumes_from_the_checkpoint_written_at_its_start(tmp_path):
    """A checkpoint is written before the first round, so a crash in round 1 (after some
    release) is resumed over the same model and plan, never restarted with a fresh one."""
    out = tmp_path / "out"

    async def first():
        writer = CrashingWriter(out, after=0)
        server, address = await serving(serve, _config(rounds=2), journal=writer)
        clients = [ClientRuntime(c, address, retries=1, server_timeout_s=HANG_S) for c in range(8)]
        await asyncio.gather(*(c.run() for c in clients), return_exceptions=True)
        with pytest.raises(Crash):
            await server

    asyncio.run(first())
    checkpoint = load_checkpoint(out)
    assert checkpoint.next_round == 1 and checkpoint.rows[0]["interrupted"]
    assert checkpoint.current is not None and checkpoint.current.releases == []
    np.testing.assert_array_equal(checkpoint.model, np.zeros(LENGTH, np.float32))
    plan = _journal(out)[0]
    assert [list(map(list, c.clusters)) for c in checkpoint.current.clusterings] == (
        plan["clusterings"]
    )
    assert RoundPlan(1, checkpoint.current.clusterings).participants == tuple(range(8))


# --- streams end with their reason -------------------------------------------------------------


def test_a_client_still_writing_when_its_stream_ends_reads_the_reason(tmp_path):
    """A client that sends a message no honest client sends (a vector chunk without its
    header), then goes on writing for a while before it reads, gets INVALID_ARGUMENT and the
    reason (a Goodbye, then the same status), not gRPC's "Internal error from Core" (its
    writes meet an open stream)."""
    identity = IdentityKey.generate()

    async def main():
        server, address = await serving(serve, _config(clients=4))
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.AggregationStub(channel).Session()
            nonce = (await call.read()).challenge.nonce
            await call.write(
                pb.ClientMessage(
                    hello=pb.Hello(
                        client_id=1,
                        identity_public=identity.public,
                        signature=identity.sign(stream_hello_message(nonce, 1)),
                    )
                )
            )
            chunk = pb.ClientMessage(chunk=pb.VectorChunk(index=0, data=b"\0" * 4))
            for _ in range(6):
                await call.write(chunk)
                await asyncio.sleep(0.05)
            goodbye = (await call.read()).goodbye
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
        server.cancel()
        with pytest.raises(BaseException):  # noqa: B017 - the server task is cancelled
            await server
        return goodbye, err.value

    goodbye, error = asyncio.run(main())
    assert goodbye.code == "INVALID_ARGUMENT", goodbye
    assert "chunk without a vector header" in goodbye.reason
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert "chunk without a vector header" in error.details()


# --- over gRPC, with a client process stopped past a stage deadline --------------------------


def test_a_client_stopped_past_a_stage_deadline_is_not_excluded_and_finishes(tmp_path):
    """``sharefl client`` 3 is stopped (SIGSTOP) after round 1 until a round has finished
    without it (the server passed a stage deadline), then continued: it answers the messages
    of the rounds it missed, the server drops them as late (a log line, no culprit), and the
    client takes part again and finishes (exit 0). The stop lasts until that round is in
    ``rounds.jsonl`` (work), not a fixed time; the deadline the stopped client misses is
    the only clock in the test."""
    config = tmp_path / "deploy.toml"
    config.write_text(
        f"[server]\nclients = 4\nrounds = 6\nconnect_timeout_s = {HANG_S}\nstage_timeout_s = 3.0\n"
        '[model]\ndim = 16\naggregator = "sum"\n'
        "[secure_aggregation]\ncluster_size = 4\nthreshold = 3\n"
    )
    out = tmp_path / "out"
    log = (tmp_path / "server.log").open("w")
    server, address = start_server(
        config, "--out", str(out), folder=tmp_path, stderr=log, stdout=log
    )
    command = [*PYTHON, "client", "--server", address]
    clients = [
        subprocess.Popen([*command, "--id", str(c)], stderr=subprocess.PIPE, text=True)
        for c in range(4)
    ]
    try:
        rounds = out / "rounds.jsonl"
        deadline = time.monotonic() + HANG_S
        while not (rounds.exists() and rounds.read_text().count("\n") >= 1):
            assert time.monotonic() < deadline, "round 1 never finished"
            time.sleep(0.02)
        os.kill(clients[3].pid, signal.SIGSTOP)
        while not any(  # a round whose sums leave client 3 out
            all(3 not in c["members"] for c in json.loads(row)["clusters"])
            for row in rounds.read_text().splitlines()
        ):
            assert time.monotonic() < deadline, "no round finished without client 3"
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            time.sleep(0.02)
        os.kill(clients[3].pid, signal.SIGCONT)
        codes = [c.wait(timeout=HANG_S) for c in clients]
        assert server.wait(timeout=HANG_S) == 0
    finally:
        for process in (*clients, server):
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.wait()
    text = (tmp_path / "server.log").read_text()
    assert codes == [0, 0, 0, 0], (clients[3].stderr.read() if clients[3].stderr else "", text)
    assert "client 3: late message dropped" in text, text
    rows = [json.loads(x) for x in rounds.read_text().splitlines()]
    assert all(r["culprits"] == {} and r["excluded"] == [] for r in rows), rows
    assert 3 in rows[-1]["participants"] and rows[-1]["contributors"] == 4
