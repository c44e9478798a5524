"""ClientMemory (invariant I4): a client never takes part twice in a round number of a run,
never contributes on one model under two different clusterings, and keeps both across
restarts (an atomically written file)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import stat
import subprocess

import grpc
import numpy as np
import pytest
from conftest import HANG_S, keyed_client

from sharefl.crypto.encoding import choose_encoding
from sharefl.deploy import wire
from sharefl.deploy.keygen import keygen
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol import memory as memory_module
from sharefl.protocol.audit import audit
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import (
    MalformedRequest,
    ModelReplayed,
    ReleaseLeaks,
    RoundReplayed,
)
from sharefl.protocol.memory import ClientMemory, ClientMemoryError, memory_path, model_digest
from sharefl.protocol.messages import ClusterAssignment, KeysBroadcast
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, ServerSession

LENGTH = 9
RUN = b"r" * 16
MODEL = model_digest(np.zeros(4, dtype=np.float32))
OTHER_MODEL = model_digest(np.ones(4, dtype=np.float32))


def plan_of(round_index: int, *clusterings) -> RoundPlan:
    return RoundPlan(round_index, tuple(Clustering(c) for c in clusterings))


# Four plans, each one clustering of 0..5 into two clusters of 3: each is safe alone, but
# the sums of {0,1,2}, {0,1,3}, {0,2,3} and {1,2,3} together solve every one of 0..3.
FOUR = [
    [(0, 1, 2), (3, 4, 5)],
    [(0, 1, 3), (2, 4, 5)],
    [(0, 2, 3), (1, 4, 5)],
    [(1, 2, 3), (0, 4, 5)],
]


def assignment_for(plan: RoundPlan, r: int, k: int, **change) -> ClusterAssignment:
    members = plan.members(r, k)
    base = ClusterAssignment(plan.context(r, k), members, len(members) // 2 + 1, LENGTH)
    return dataclasses.replace(base, **change)


def vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, LENGTH, dtype=np.uint32)


def take_part(guard: ClientRound) -> None:
    """The client accepts its cluster of reclustering 0 (what records the round)."""
    plan = guard.plan
    guard.vet(assignment_for(plan, 0, plan.clusterings[0].cluster_index(guard.id)))


def test_the_four_plans_are_each_safe_and_together_leak():
    for clustering in FOUR:
        assert not audit([Clustering(clustering)], min_sum_size=3).leaks
    together = audit([Clustering(c) for c in FOUR], min_sum_size=3)
    assert set(together.recoverable_clients) >= {0, 1, 2, 3}


# --- R1: round numbers strictly increase within a run -----------------------------------


def test_four_round_zeros_are_refused_after_the_first():
    memory = ClientMemory()
    take_part(ClientRound(0, plan_of(0, FOUR[0]), memory=memory, run=RUN, model_digest=MODEL))
    for clustering in FOUR[1:]:
        with pytest.raises(RoundReplayed, match="round 1 or later"):
            ClientRound(0, plan_of(0, clustering), memory=memory, run=RUN, model_digest=MODEL)
        # A new model does not help: the round number is taken.
        with pytest.raises(RoundReplayed):
            ClientRound(0, plan_of(0, clustering), memory=memory, run=RUN, model_digest=OTHER_MODEL)
    assert memory.last_round(RUN) == 0


def test_round_numbers_are_per_run_and_a_lower_one_is_refused():
    memory = ClientMemory()
    take_part(ClientRound(0, plan_of(5, FOUR[0]), memory=memory, run=RUN, model_digest=MODEL))
    with pytest.raises(RoundReplayed, match="round 5 of run"):
        ClientRound(0, plan_of(3, FOUR[0]), memory=memory, run=RUN, model_digest=OTHER_MODEL)
    # Another run starts its own numbering (the model is new).
    ClientRound(0, plan_of(0, FOUR[1]), memory=memory, run=b"s" * 16, model_digest=OTHER_MODEL)
    ClientRound(0, plan_of(6, FOUR[1]), memory=memory, run=RUN, model_digest=OTHER_MODEL)


def test_a_round_is_recorded_only_when_the_client_takes_part():
    memory = ClientMemory()
    ClientRound(0, plan_of(0, FOUR[0]), memory=memory, run=RUN, model_digest=MODEL)
    assert memory.last_round(RUN) is None and memory.clusterings(MODEL) is None
    # Nothing was contributed: the server may use the model under other clusterings.
    take_part(ClientRound(0, plan_of(0, FOUR[1]), memory=memory, run=RUN, model_digest=MODEL))
    assert memory.last_round(RUN) == 0
    assert memory.clusterings(MODEL) == plan_of(0, FOUR[1]).clusterings_digest()


def test_two_guards_of_one_round_cannot_both_take_it():
    """Both pass the check at construction; the first vet takes the round, the second is
    refused when it would record (R1 checked again under the memory's lock)."""
    memory = ClientMemory()
    first = ClientRound(0, plan_of(0, FOUR[0]), memory=memory, run=RUN, model_digest=MODEL)
    second = ClientRound(0, plan_of(0, FOUR[1]), memory=memory, run=RUN, model_digest=OTHER_MODEL)
    take_part(first)
    with pytest.raises(RoundReplayed):
        take_part(second)
    assert second._used == {}


def test_later_reclusterings_of_the_round_belong_to_the_guard():
    plan = plan_of(2, [(0, 1, 2), (3, 4, 5)], [(0, 3, 4), (1, 2, 5)])
    memory = ClientMemory()
    guard = ClientRound(0, plan, memory=memory, run=RUN, model_digest=MODEL)
    guard.vet(assignment_for(plan, 0, 0))
    guard.vet(assignment_for(plan, 1, 0))
    assert memory.last_round(RUN) == 2


def test_an_oversized_run_id_is_malformed():
    with pytest.raises(MalformedRequest, match="at most 64"):
        ClientRound(0, plan_of(0, FOUR[0]), memory=ClientMemory(), run=b"x" * 65)


# --- R2: one model, one set of clusterings ----------------------------------------------


def test_the_same_model_under_increasing_rounds_and_other_clusterings_is_refused():
    memory = ClientMemory()
    take_part(ClientRound(0, plan_of(0, FOUR[0]), memory=memory, run=RUN, model_digest=MODEL))
    for round_index, clustering in enumerate(FOUR[1:], start=1):
        with pytest.raises(ModelReplayed, match="new model, or reuse the clusterings"):
            ClientRound(
                0, plan_of(round_index, clustering), memory=memory, run=RUN, model_digest=MODEL
            )
        # Nor under a new run id.
        with pytest.raises(ModelReplayed):
            ClientRound(0, plan_of(0, clustering), memory=memory, run=b"n" * 16, model_digest=MODEL)


def test_the_same_model_under_the_same_clusterings_is_accepted_in_a_later_round():
    """An honest re-run of a round whose clusters all failed: same model, the plan's
    clusterings, a new round number."""
    memory = ClientMemory()
    take_part(ClientRound(0, plan_of(0, *FOUR[:2]), memory=memory, run=RUN, model_digest=MODEL))
    again = ClientRound(0, plan_of(1, *FOUR[:2]), memory=memory, run=RUN, model_digest=MODEL)
    take_part(again)
    assert memory.last_round(RUN) == 1
    # The order of the clusterings is part of them (positions key the releases).
    with pytest.raises(ModelReplayed):
        ClientRound(0, plan_of(2, FOUR[1], FOUR[0]), memory=memory, run=RUN, model_digest=MODEL)


def test_clusterings_digest_ignores_the_round_and_only_the_round():
    assert plan_of(0, FOUR[0]).clusterings_digest() == plan_of(9, FOUR[0]).clusterings_digest()
    assert plan_of(0, FOUR[0]).digest() != plan_of(9, FOUR[0]).digest()
    assert plan_of(0, FOUR[0]).clusterings_digest() != plan_of(0, FOUR[1]).clusterings_digest()


def test_model_digest_is_bitwise_and_covers_the_length():
    zeros = np.zeros(4, dtype=np.float32)
    assert model_digest(zeros) == model_digest(np.zeros(4, dtype=np.float64))
    assert model_digest(zeros) != model_digest(np.zeros(5, dtype=np.float32))
    assert model_digest(zeros) != model_digest(-zeros)


# --- releases on one model accumulate across rounds -------------------------------------


class Round:
    """Every client of ``plan`` behind a ClientRound with its own memory, one honest
    ServerSession per cluster (as in tests/test_client_round.py)."""

    def __init__(self, plan: RoundPlan, memories: dict[int, ClientMemory], model: bytes):
        self.plan = plan
        policy = ClientPolicy(verify_releases=True)
        self.guards = {
            c: ClientRound(c, plan, policy, memory=memories[c], run=RUN, model_digest=model)
            for c in plan.participants
        }

    def run(self, r: int, k: int, *, skip_mask=()):
        a = assignment_for(self.plan, r, k)
        server = ServerSession(a)
        sessions = {c: self.guards[c].session(a, vector(c)) for c in a.members}
        for session in sessions.values():
            server.receive(session.advertise())
        refusals = {}
        out = server.advance()
        while out:
            for cid, message in out.items():
                if cid in skip_mask and not isinstance(message, KeysBroadcast):
                    continue
                try:
                    server.receive(self.guards[cid].handle(sessions[cid], message))
                except ReleaseLeaks as exc:
                    refusals[cid] = exc
            out = server.advance()
        return server.outcome, refusals


ONE = [(0, 1, 2, 3, 4, 5)]


def test_a_release_that_leaks_with_one_of_an_earlier_round_on_the_model_is_refused():
    """Round 0 releases {0..4} (5 'dropped'); round 1, same model and clusterings, would
    release all six: the difference is x_5. Each release alone is safe."""
    memories = {c: ClientMemory() for c in range(6)}
    outcome, refusals = Round(plan_of(0, ONE), memories, MODEL).run(0, 0, skip_mask=(5,))
    assert refusals == {} and isinstance(outcome, ClusterSum)
    assert memories[0].releases(MODEL) == {(0, 0): frozenset({frozenset(range(5))})}
    outcome, refusals = Round(plan_of(1, ONE), memories, MODEL).run(0, 0)
    assert set(refusals) == set(range(5)) and "clients [5]" in str(refusals[0])
    assert not isinstance(outcome, ClusterSum)
    # The same release on a new model is fine.
    outcome, refusals = Round(plan_of(2, ONE), memories, OTHER_MODEL).run(0, 0)
    assert refusals == {} and isinstance(outcome, ClusterSum)


def test_the_same_full_release_in_a_later_round_is_answered():
    memories = {c: ClientMemory() for c in range(6)}
    for round_index in range(2):
        outcome, refusals = Round(plan_of(round_index, ONE), memories, MODEL).run(0, 0)
        assert refusals == {} and isinstance(outcome, ClusterSum)
    assert memories[3].releases(MODEL) == {(0, 0): frozenset({frozenset(range(6))})}


def test_releases_on_one_model_are_bounded():
    memory = ClientMemory(max_releases=2)
    digest = plan_of(0, ONE).clusterings_digest()
    memory.record_release(MODEL, digest, (0, 0), range(6))
    memory.record_release(MODEL, digest, (0, 0), range(5))
    memory.record_release(MODEL, digest, (0, 0), range(5))  # known: no new entry
    with pytest.raises(ModelReplayed, match="new model"):
        memory.record_release(MODEL, digest, (0, 0), range(4))
    with pytest.raises(ModelReplayed, match="other clusterings"):
        memory.record_release(MODEL, plan_of(0, FOUR[0]).clusterings_digest(), (0, 0), range(3))


def test_the_guard_state_round_trips_with_its_memory():
    memories = {c: ClientMemory() for c in range(6)}
    rnd = Round(plan_of(0, ONE), memories, MODEL)
    rnd.guards[0].vet(assignment_for(rnd.plan, 0, 0))
    restored = ClientRound.from_state(
        rnd.guards[0].export_state(), ClientPolicy(verify_releases=True), memory=memories[0]
    )
    assert (restored.run, restored.model_digest, restored._recorded) == (RUN, MODEL, True)
    assert restored.export_state() == rnd.guards[0].export_state()
    # A record exported before this change (without the memory keys) still loads.
    old = {k: v for k, v in rnd.guards[0].export_state().items() if not k.startswith("memory.")}
    assert ClientRound.from_state(old).model_digest is None


# --- persistence ------------------------------------------------------------------------


def test_memory_survives_a_restart(tmp_path):
    path = memory_path(tmp_path / "state", 3)
    memory = ClientMemory(path, server=b"server identity")
    plan = plan_of(4, ONE)
    guard = ClientRound(3, plan, memory=memory, run=RUN, model_digest=MODEL)
    take_part(guard)
    memory.record_release(MODEL, plan.clusterings_digest(), (0, 0), range(5))
    restarted = ClientMemory(path, server=b"server identity")
    assert restarted.last_round(RUN) == 4
    assert restarted.clusterings(MODEL) == plan.clusterings_digest()
    assert restarted.releases(MODEL) == {(0, 0): frozenset({frozenset(range(5))})}
    with pytest.raises(RoundReplayed):
        ClientRound(3, plan_of(4, ONE), memory=restarted, run=RUN, model_digest=OTHER_MODEL)
    with pytest.raises(ModelReplayed):
        ClientRound(3, plan_of(5, FOUR[0]), memory=restarted, run=RUN, model_digest=MODEL)
    # A second process of the same client sees the first one's records at once.
    memory.record_round(RUN, 7, OTHER_MODEL, plan.clusterings_digest())
    assert restarted.last_round(RUN) == 7


def test_memory_file_and_directory_are_private(tmp_path):
    path = memory_path(tmp_path / "state", 0)
    ClientMemory(path).record_round(RUN, 0, MODEL, b"c" * 32)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".lock"]
    assert json.loads(path.read_text())["runs"] == [[RUN.hex(), 0]]


def test_a_crash_mid_write_leaves_the_previous_state(tmp_path, monkeypatch):
    path = tmp_path / "memory.json"
    memory = ClientMemory(path)
    memory.record_round(RUN, 0, MODEL, b"c" * 32)
    before = path.read_bytes()

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(memory_module.os, "replace", crash)
    guard = ClientRound(0, plan_of(1, ONE), memory=memory, run=RUN, model_digest=OTHER_MODEL)
    with pytest.raises(OSError, match="disk gone"):
        take_part(guard)  # the client sends nothing: the advertisement would follow
    assert guard._used == {} and not guard._recorded
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    assert ClientMemory(path).last_round(RUN) == 0 and memory.last_round(RUN) == 0
    take_part(guard)  # the write works again: the round is recorded now
    assert ClientMemory(path).last_round(RUN) == 1


@pytest.mark.parametrize(
    "content", ["{", "[]", '{"version": 99}', '{"version": 1, "runs": [["zz", 1]], "models": []}']
)
def test_an_unreadable_memory_file_is_an_error_not_a_fresh_start(tmp_path, content):
    path = tmp_path / "memory.json"
    path.write_text(content)
    with pytest.raises(ClientMemoryError, match="delete it to start afresh"):
        ClientMemory(path)


def test_the_oldest_models_and_runs_are_dropped_first():
    memory = ClientMemory(max_models=2, max_runs=2)
    digests = [model_digest(np.full(3, i, dtype=np.float32)) for i in range(3)]
    for i, digest in enumerate(digests):
        memory.record_round(bytes([i]), 0, digest, b"c" * 32)
    assert memory.clusterings(digests[0]) is None and memory.last_round(b"\x00") is None
    assert memory.clusterings(digests[2]) == b"c" * 32 and memory.last_round(b"\x02") == 0
    # The consequence: a forgotten model can come back under other clusterings.
    memory.check(b"\x09", 0, digests[0], b"d" * 32)
    with pytest.raises(ModelReplayed):
        memory.check(b"\x09", 0, digests[1], b"d" * 32)


def test_memory_path_separates_clients_not_servers(tmp_path):
    paths = {memory_path(tmp_path, c) for c in (0, 1)}
    assert len(paths) == 2 and all(p.parent == tmp_path / "memory" for p in paths)
    assert not os.path.exists(tmp_path / "memory")


def test_one_state_directory_serves_one_server_identity(tmp_path):
    """A memory file records the server identity it serves; another identity (a new CA, a
    new directory) is refused, never given a fresh memory: the server cannot reset it."""
    path = memory_path(tmp_path, 0)
    ClientMemory(path, server=b"ca one").record_round(RUN, 0, MODEL, b"c" * 32)
    with pytest.raises(ClientMemoryError, match="one state directory serves one server"):
        ClientMemory(path, server=b"ca two")
    assert ClientMemory(path, server=b"ca one").last_round(RUN) == 0


def test_a_memory_file_that_disappears_under_a_running_client_is_an_error(tmp_path):
    path = memory_path(tmp_path, 0)
    memory = ClientMemory(path, server=b"s")
    memory.record_round(RUN, 0, MODEL, b"c" * 32)
    path.unlink()
    with pytest.raises(ClientMemoryError, match="disappeared while this client was running"):
        memory.joined()
    fresh = tmp_path / "other.json"  # a memory that never had a file starts empty
    assert ClientMemory(fresh, server=b"s").joined() == 0


# --- a real `sharefl client --keys` process, restarted ----------------------------------

DIM = 8


class Script(pb_grpc.AggregationServicer):
    """A server double for one client: each session plays its list of rounds (run id,
    round number, model, plan), sends the assignment of the client's cluster of
    reclustering 0, collects the first reply, and ends the run with Finished."""

    def __init__(self, sessions: list[list[tuple[int, np.ndarray, RoundPlan]]]) -> None:
        self.sessions = list(sessions)
        self.replies: list[list[pb.ClientMessage]] = []

    async def Session(self, request_iterator, context):
        incoming = request_iterator.__aiter__()
        await context.write(pb.ServerMessage(challenge=pb.Challenge(nonce=os.urandom(32))))
        await incoming.__anext__()  # Hello
        replies: list[pb.ClientMessage] = []
        self.replies.append(replies)
        encoding = choose_encoding(1.0, 4)
        for round_index, model, plan in self.sessions.pop(0):
            await self._vector(context, "round_start", model, round=round_index, plan=plan)
            a = assignment_for(plan, 0, plan.clusterings[0].cluster_index(0))
            a = dataclasses.replace(a, length=DIM, signed=True)
            assignment = wire.assignment_to_proto(a, encoding)
            await context.write(pb.ServerMessage(assignment=assignment))
            replies.append(await asyncio.wait_for(incoming.__anext__(), HANG_S))
            await context.write(pb.ServerMessage(round_end=pb.RoundEnd(round=round_index)))
        await self._vector(context, "finished", np.zeros(DIM, dtype=np.float32))
        with contextlib.suppress(StopAsyncIteration):
            await asyncio.wait_for(incoming.__anext__(), HANG_S)

    @staticmethod
    async def _vector(context, kind, model, round=0, plan=None):
        header, chunks = wire.vector_to_proto(model)
        if kind == "finished":
            message = pb.ServerMessage(finished=pb.Finished(model=header))
        else:
            start = pb.RoundStart(round=round, model=header, run=RUN)
            start.reclusterings = plan.reclusterings
            start.plan.CopyFrom(wire.plan_to_proto(plan))
            message = pb.ServerMessage(round_start=start)
        await context.write(message)
        for chunk in chunks:
            await context.write(pb.ServerMessage(chunk=chunk))


async def _serve_script(keys, script: Script) -> list[subprocess.CompletedProcess]:
    credentials = grpc.ssl_server_credentials(
        [((keys / "server.key").read_bytes(), (keys / "server.pem").read_bytes())],
        root_certificates=(keys / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    pb_grpc.add_AggregationServicer_to_server(script, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    command = keyed_client(f"127.0.0.1:{port}", 0, keys, "--no-atoms")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = []
    try:
        for _ in range(len(script.sessions)):  # one client process per session: a restart
            proc = await asyncio.create_subprocess_exec(
                *command, stderr=asyncio.subprocess.PIPE, env=env
            )
            _, stderr = await asyncio.wait_for(proc.communicate(), HANG_S)
            done.append(
                subprocess.CompletedProcess(command, proc.returncode, None, stderr.decode())
            )
    finally:
        await server.stop(grace=0)
    return done


def test_a_restarted_client_process_still_refuses_replays(tmp_path):
    keys = keygen(tmp_path / "keys", range(4))
    first, second = np.full(DIM, 0.5, dtype=np.float32), np.full(DIM, 0.25, dtype=np.float32)
    trio = [(0, 1, 2)]
    script = Script(
        [
            [(0, first, plan_of(0, trio))],  # the client takes part in round 0 on `first`
            [
                (0, second, plan_of(0, trio)),  # round 0 again (a new model)
                (1, first, plan_of(1, [(0, 1, 3)])),  # `first` again, another cluster
                (2, first, plan_of(2, trio)),  # `first` again under its plan: accepted
            ],
        ]
    )
    done = asyncio.run(_serve_script(keys, script))
    # The second process advertised in round 2 but sent no masked input and refused twice:
    # it took part in no round, so it exits 9 (ROUNDS_REFUSED).
    assert [d.returncode for d in done] == [0, 9], [d.stderr for d in done]
    (taken,) = script.replies[0]
    assert taken.HasField("advertise") and taken.advertise.context.round == 0
    replayed, remodelled, rerun = script.replies[1]
    assert replayed.refusal.reason.startswith("RoundReplayed"), replayed
    assert remodelled.refusal.reason.startswith("ModelReplayed"), remodelled
    assert rerun.HasField("advertise") and rerun.advertise.context.round == 2
    assert (keys / "memory" / "client-0.json").is_file()
