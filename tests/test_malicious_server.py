"""A malicious server against real ``sharefl client --keys`` processes (TLS, signed mode).

The server here is a test double: a grpc.aio ``Aggregation.Session`` that speaks the real
proto (Challenge, RoundStart with the model's chunks and a round plan, ClusterAssignment,
KeysBroadcast...) but plays one attack per round. Six real client processes take part in
every round (started once for the module); in each attack every targeted client must
answer with a ``Refusal`` naming the reason, and the double must never receive anything
(an advertisement, shares, a masked input, an unmask response) for the forbidden cluster.
The run ends with ``Finished``: every client, having refused every round it took part
in, exits 9 (``ROUNDS_REFUSED``) with one line quoting its last refusal, without a
traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import HANG_S, keyed_client

from sharefl.crypto.encoding import choose_encoding
from sharefl.crypto.kdf import KeyContext
from sharefl.deploy import wire
from sharefl.deploy.keygen import keygen
from sharefl.exit_status import ExitStatus
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.messages import ClusterAssignment
from sharefl.protocol.plan import RoundPlan

CLIENTS = tuple(range(6))
DIM = 16
ENCODING = choose_encoding(1.0, len(CLIENTS))


@dataclasses.dataclass
class Link:
    """One client's stream as the double sees it."""

    outbox: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    inbox: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)


class Double(pb_grpc.AggregationServicer):
    """Accepts any client that says hello; then the scenarios decide what it is sent."""

    def __init__(self) -> None:
        self.links: dict[int, Link] = {}
        self.connected = asyncio.Event()
        self.closed: set[int] = set()
        self.ended = asyncio.Event()
        """Set once every client's stream has ended (its last message written)."""

    async def Session(self, request_iterator, context):
        incoming = request_iterator.__aiter__()
        await context.write(pb.ServerMessage(challenge=pb.Challenge(nonce=os.urandom(32))))
        hello = await incoming.__anext__()
        link = Link()
        client_id = int(hello.hello.client_id)
        self.links[client_id] = link
        if set(self.links) == set(CLIENTS):
            self.connected.set()

        async def read() -> None:
            async for message in incoming:
                await link.inbox.put(message)

        reader = asyncio.create_task(read())
        try:
            while (message := await link.outbox.get()) is not None:
                await context.write(message)
        finally:
            reader.cancel()
            self.closed.add(client_id)
            if self.closed >= set(CLIENTS):
                self.ended.set()


RUN = b"malicious-run-01"


def model_of(index: int) -> np.ndarray:
    """The model of the index-th attack: a new one each round (a client refuses a model it
    already contributed on under other clusterings)."""
    return np.full(DIM, index / 256, dtype=np.float32)


@dataclasses.dataclass
class Attack:
    """One round: a plan (None: no plan at all), the assignments sent to each client, and
    optionally a hook run on the clients' first replies (e.g. to relay tampered keys). The
    round number and the model are the attack's index and :func:`model_of` it unless
    ``number`` / ``model`` say otherwise."""

    name: str
    plan: Callable[[int], RoundPlan | None]
    assignments: Callable[
        [RoundPlan | None], list[tuple[int, ClusterAssignment | pb.ClusterAssignment]]
    ]
    after_adverts: Callable[[dict[int, list[pb.ClientMessage]]], list] | None = None
    number: int | None = None
    model: int | None = None


def plan_of(*clusterings) -> Callable[[int], RoundPlan]:
    return lambda round_index: RoundPlan(round_index, tuple(Clustering(c) for c in clusterings))


def assign(plan: RoundPlan, r: int, k: int, **change) -> ClusterAssignment:
    members = plan.members(r, k)
    threshold = len(members) // 2 + 1
    base = ClusterAssignment(plan.context(r, k), members, threshold, DIM, 32, None, True)
    return dataclasses.replace(base, **change)


def to_all(a: ClusterAssignment, who=None) -> list[tuple[int, ClusterAssignment]]:
    return [(cid, a) for cid in (a.members if who is None else who)]


SAFE = plan_of([(0, 1, 2), (3, 4, 5)], [(0, 3, 4), (1, 2, 5)])
ONE = plan_of([CLIENTS])
MATCHING = {0: {1}, 1: {0}, 2: {3}, 3: {2}, 4: {5}, 5: {4}}  # degree 1
DEGREE_4 = {c: frozenset(set(CLIENTS) - {c} - MATCHING[c]) for c in CLIENTS}


def relay_low_order(adverts: dict[int, list[pb.ClientMessage]]) -> list:
    """Relay every advertisement, with client 5's mask key replaced by the point 0."""
    relayed = [m.advertise for cid in CLIENTS for m in adverts[cid] if m.HasField("advertise")]
    for advert in relayed:
        if advert.sender == 5:
            advert.mask_public = bytes(32)
    context = relayed[0].context
    keys = pb.ServerMessage(keys=pb.KeysBroadcast(context=context, advertisements=relayed))
    return [(cid, keys) for cid in CLIENTS]


ATTACKS = [
    Attack(
        "same clients twice",  # {0,1,2}, then {1,2} in the same or in another reclustering
        SAFE,
        lambda p: [
            *to_all(assign(p, 0, 0)),
            *to_all(assign(p, 0, 1)),  # the honest other cluster: a control
            *to_all(assign(p, 0, 0, members=(1, 2), threshold=2), who=(1, 2)),
            *to_all(assign(p, 1, 1, members=(1, 2), threshold=2), who=(1, 2)),
        ],
    ),
    Attack(
        "subtracting plan",  # the plan itself holds {0,1,2} and {1,2}
        plan_of([(0, 1, 2), (3, 4, 5)], [(0, 3, 4, 5), (1, 2)]),
        lambda p: [*to_all(assign(p, 0, 0)), *to_all(assign(p, 0, 1))],
    ),
    Attack(
        "cluster of two",
        plan_of([(0, 1), (2, 3, 4, 5)]),
        lambda p: [*to_all(assign(p, 0, 0, threshold=2)), *to_all(assign(p, 0, 1))],
    ),
    Attack(
        "degree one",
        ONE,
        lambda p: to_all(
            assign(p, 0, 0, threshold=2, neighbours={c: frozenset(v) for c, v in MATCHING.items()})
        ),
    ),
    Attack("downgrade", ONE, lambda p: to_all(assign(p, 0, 0, signed=False, threshold=4))),
    Attack(
        "split view",  # 5 holders, 1 colluder: t >= 4; the old majority floor allowed 3
        ONE,
        lambda p: to_all(assign(p, 0, 0, threshold=3, neighbours=DEGREE_4)),
    ),
    Attack(
        "no plan",
        lambda round_index: None,
        lambda p: to_all(ClusterAssignment(KeyContext(round=6), CLIENTS, 5, DIM, 32, None, True)),
    ),
    Attack("low-order key", ONE, lambda p: to_all(assign(p, 0, 0, threshold=5)), relay_low_order),
    Attack(
        "malformed assignment",  # a 7-bit ring and a 31-byte plan digest
        ONE,
        lambda p: [
            (c, pb.ClusterAssignment(context=pb.Context(plan=b"d" * 31), members=CLIENTS, bits=7))
            for c in CLIENTS
        ],
    ),
    # I4: every client took part in round 7 ("low-order key": ONE, on model_of(7)).
    Attack(
        "replayed round number",  # round 7 again, a new model and another plan
        SAFE,
        lambda p: [*to_all(assign(p, 0, 0)), *to_all(assign(p, 0, 1))],
        number=7,
    ),
    Attack(
        "same model, other clusterings",  # a new round number, the model of round 7
        SAFE,
        lambda p: [*to_all(assign(p, 0, 0)), *to_all(assign(p, 0, 1))],
        model=7,
    ),
    Attack(
        "same model, same clusterings",  # the control: an honest re-run of round 7
        ONE,
        lambda p: to_all(assign(p, 0, 0, threshold=5)),
        model=7,
    ),
]


async def _replies(link: Link, count: int) -> list[pb.ClientMessage]:
    replies = []
    while len(replies) < count:
        replies.append(await asyncio.wait_for(link.inbox.get(), HANG_S))
    return replies


async def _drain(link: Link, seconds: float) -> list[pb.ClientMessage]:
    """Whatever else a client sends within ``seconds`` (it should send nothing)."""
    extra = []
    try:
        while True:
            extra.append(await asyncio.wait_for(link.inbox.get(), seconds))
    except TimeoutError:
        return extra


def start_round(
    double: Double, round_index: int, model: np.ndarray, plan: RoundPlan | None, run: bytes
) -> None:
    """Send every client a RoundStart of ``run`` (with ``plan`` committed, if any) and the
    model's chunks."""
    header, chunks = wire.vector_to_proto(model)
    chunks = list(chunks)
    start = pb.RoundStart(round=round_index, model=header, run=run)
    if plan is not None:
        start.reclusterings = plan.reclusterings
        start.plan.CopyFrom(wire.plan_to_proto(plan))
    for cid in CLIENTS:
        double.links[cid].outbox.put_nowait(pb.ServerMessage(round_start=start))
        for chunk in chunks:
            double.links[cid].outbox.put_nowait(pb.ServerMessage(chunk=chunk))


def finish_run(double: Double, model: np.ndarray) -> None:
    """Send every client ``Finished`` with ``model``, then end its stream."""
    header, chunks = wire.vector_to_proto(model)
    chunks = list(chunks)
    for cid in CLIENTS:
        link = double.links[cid]
        link.outbox.put_nowait(pb.ServerMessage(finished=pb.Finished(model=header)))
        for chunk in chunks:
            link.outbox.put_nowait(pb.ServerMessage(chunk=chunk))
        link.outbox.put_nowait(None)


async def _play(double: Double) -> dict[str, dict[int, list[pb.ClientMessage]]]:
    await asyncio.wait_for(double.connected.wait(), HANG_S)
    seen: dict[str, dict[int, list[pb.ClientMessage]]] = {}
    for index, attack in enumerate(ATTACKS):
        round_index = index if attack.number is None else attack.number
        model = model_of(index if attack.model is None else attack.model)
        plan = attack.plan(round_index)
        start_round(double, round_index, model, plan, RUN)
        sent = {cid: 0 for cid in CLIENTS}
        for cid, assignment in attack.assignments(plan):
            proto = (
                assignment
                if isinstance(assignment, pb.ClusterAssignment)
                else wire.assignment_to_proto(assignment, ENCODING)
            )
            double.links[cid].outbox.put_nowait(pb.ServerMessage(assignment=proto))
            sent[cid] += 1
        replies = dict(
            zip(
                CLIENTS,
                await asyncio.gather(*(_replies(double.links[c], sent[c]) for c in CLIENTS)),
                strict=True,
            )
        )
        if attack.after_adverts is not None:
            for cid, message in attack.after_adverts(replies):
                double.links[cid].outbox.put_nowait(message)
            more = await asyncio.gather(*(_replies(double.links[c], 1) for c in CLIENTS))
            for cid, extra in zip(CLIENTS, more, strict=True):
                replies[cid] += extra
        extra = await asyncio.gather(*(_drain(double.links[c], 0.2) for c in CLIENTS))
        for cid, messages in zip(CLIENTS, extra, strict=True):
            replies[cid] += messages
        seen[attack.name] = replies
        for cid in CLIENTS:
            end = pb.RoundEnd(round=round_index)
            double.links[cid].outbox.put_nowait(pb.ServerMessage(round_end=end))
    finish_run(double, model_of(len(ATTACKS)))
    return seen


async def serve_double(keys: Path) -> tuple[grpc.aio.Server, Double, str]:
    """A started :class:`Double` behind mutual TLS with the ``keygen`` folder ``keys``, on a
    loopback port the OS picks; returns the server, the double and its address."""
    credentials = grpc.ssl_server_credentials(
        [((keys / "server.key").read_bytes(), (keys / "server.pem").read_bytes())],
        root_certificates=(keys / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    double = Double()
    pb_grpc.add_AggregationServicer_to_server(double, server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, double, f"127.0.0.1:{port}"


async def _serve(keys: Path, started: Callable[[str], list[subprocess.Popen]]):
    """Serve the double; ``started(address)`` starts the clients."""
    server, double, address = await serve_double(keys)
    procs = started(address)
    try:
        seen = await _play(double)
        await asyncio.wait_for(double.ended.wait(), HANG_S)  # the Finished messages are out
    finally:
        await server.stop(grace=2.0)
    return seen, procs


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """Every attack played once against the same six client processes."""
    keys = keygen(tmp_path_factory.mktemp("malicious") / "keys", CLIENTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def start(address: str) -> list[subprocess.Popen]:
        return [
            subprocess.Popen(
                keyed_client(address, c, keys, "--no-atoms"),
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for c in CLIENTS
        ]

    procs: list[subprocess.Popen] = []

    def started(address: str) -> list[subprocess.Popen]:
        procs.extend(start(address))
        return procs

    try:
        seen, _ = asyncio.run(_serve(keys, started))
        logs = [proc.communicate(timeout=HANG_S)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return seen, logs, [proc.returncode for proc in procs], keys


def _position(message: pb.ClientMessage) -> tuple[int, int, int] | None:
    body = message.WhichOneof("body")
    context = getattr(message, body).context
    return context.round, context.reclustering, context.cluster


def _refusals(replies: list[pb.ClientMessage]) -> list[pb.Refusal]:
    return [m.refusal for m in replies if m.HasField("refusal")]


def _revealing(replies: list[pb.ClientMessage]) -> list[pb.ClientMessage]:
    return [m for m in replies if not m.HasField("refusal")]


def test_clients_say_they_refused_every_round_after_every_attack(attacked):
    seen, logs, codes, _ = attacked
    assert list(seen) == [a.name for a in ATTACKS]
    assert codes == [ExitStatus.ROUNDS_REFUSED] * len(CLIENTS), logs
    assert not any("Traceback" in log for log in logs), logs
    for cid, log in zip(CLIENTS, logs, strict=True):
        lines = [line for line in log.splitlines() if line.startswith("sharefl client:")]
        assert len(lines) == 1 and f"client {cid} refused every round" in lines[0], log
        assert "the last: " in lines[0], lines


def test_same_clients_in_two_clusters_of_a_round_are_refused(attacked):
    replies = attacked[0]["same clients twice"]
    for cid in CLIENTS:  # each took part in its own honest cluster of reclustering 0
        (advert,) = _revealing(replies[cid])
        assert advert.HasField("advertise") and advert.advertise.context.reclustering == 0
        assert advert.advertise.context.cluster == (0 if cid < 3 else 1)
    for cid in (1, 2):
        second, third = _refusals(replies[cid])
        assert (second.context.reclustering, second.context.cluster) == (0, 0)
        assert second.reason.startswith("ReclusteringReused")
        assert (third.context.reclustering, third.context.cluster) == (1, 1)
        assert third.reason.startswith("OffPlan") and "differ" in third.reason
    for cid in (0, 3, 4, 5):
        assert _refusals(replies[cid]) == []


def test_a_plan_that_subtracts_to_one_client_is_refused_by_everybody(attacked):
    replies = attacked[0]["subtracting plan"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        if cid in (1, 2):  # their own cluster of reclustering 1 has two members
            assert refusal.reason.startswith("ClusterTooSmall") and "cluster of 2" in refusal.reason
        else:
            assert refusal.reason.startswith("PlanRefused") and "clients [0" in refusal.reason


def test_a_cluster_below_the_minimum_size_is_refused(attacked):
    replies = attacked[0]["cluster of two"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        expected = "ClusterTooSmall" if cid < 2 else "PlanRefused"
        assert refusal.reason.startswith(expected), refusal.reason


def test_a_degree_one_graph_is_refused(attacked):
    replies = attacked[0]["degree one"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("ClusterTooSmall") and "neighbour" in refusal.reason


def test_a_downgrade_to_unsigned_is_refused(attacked):
    replies = attacked[0]["downgrade"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("InconsistentRequest") and "signed" in refusal.reason


def test_a_split_view_threshold_is_refused(attacked):
    replies = attacked[0]["split view"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("ThresholdTooLow") and "t >= 4" in refusal.reason


def test_a_round_without_a_plan_is_refused(attacked):
    replies = attacked[0]["no plan"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("PlanRefused") and "without a committed plan" in (
            refusal.reason
        )


def test_a_malformed_assignment_gets_a_refusal_not_a_crash(attacked):
    replies = attacked[0]["malformed assignment"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("WireError") and refusal.reason.isprintable()


def test_a_relayed_low_order_key_is_refused_before_any_share(attacked):
    replies = attacked[0]["low-order key"]
    for cid in CLIENTS:
        advert, refusal = replies[cid]
        assert advert.HasField("advertise") and refusal.HasField("refusal")
        reason = refusal.refusal.reason
        assert reason.startswith("BadAdvertisement"), reason
        assert "advertisement of client 5 is not signed" in reason  # 5 itself included
        assert not any(m.HasField("shares") for m in replies[cid])


def test_a_replayed_round_number_is_refused(attacked):
    replies = attacked[0]["replayed round number"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("RoundReplayed"), refusal.reason
        assert "already took part in round 7" in refusal.reason


def test_a_model_sent_again_under_other_clusterings_is_refused(attacked):
    replies = attacked[0]["same model, other clusterings"]
    for cid in CLIENTS:
        assert _revealing(replies[cid]) == []
        (refusal,) = _refusals(replies[cid])
        assert refusal.reason.startswith("ModelReplayed"), refusal.reason


def test_a_model_sent_again_under_the_same_clusterings_is_accepted(attacked):
    replies = attacked[0]["same model, same clusterings"]
    for cid in CLIENTS:
        (advert,) = replies[cid]
        assert advert.HasField("advertise"), advert
        assert advert.advertise.context.round == len(ATTACKS) - 1


def test_clients_keep_their_memory_in_the_keys_folder(attacked):
    keys = attacked[3]
    files = sorted(p.name for p in (keys / "memory").glob("*.json"))
    assert len(files) == len(CLIENTS) and all(f.startswith("client-") for f in files)


async def _oversized_model(keys: Path) -> subprocess.CompletedProcess:
    """One client; the double announces a model of 2^40 elements."""

    class Liar(pb_grpc.AggregationServicer):
        async def Session(self, request_iterator, context):
            await context.write(pb.ServerMessage(challenge=pb.Challenge(nonce=os.urandom(32))))
            await request_iterator.__aiter__().__anext__()
            header = pb.VectorHeader(length=1 << 40, dtype=pb.DTYPE_FLOAT32, chunks=1 << 20)
            await context.write(pb.ServerMessage(round_start=pb.RoundStart(model=header)))
            await asyncio.sleep(HANG_S)  # until the client hangs up (server.stop below)

    credentials = grpc.ssl_server_credentials(
        [((keys / "server.key").read_bytes(), (keys / "server.pem").read_bytes())],
        root_certificates=(keys / "ca.pem").read_bytes(),
        require_client_auth=True,
    )
    server = grpc.aio.server()
    pb_grpc.add_AggregationServicer_to_server(Liar(), server)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    command = keyed_client(f"127.0.0.1:{port}", 0, keys, "--no-atoms")
    try:
        proc = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
        _, stderr = await asyncio.wait_for(proc.communicate(), HANG_S)
    finally:
        await server.stop(grace=0)
    return subprocess.CompletedProcess(command, proc.returncode, None, stderr.decode())


def test_a_model_longer_than_the_bound_ends_the_client_cleanly(tmp_path):
    keys = keygen(tmp_path / "keys", [0])
    done = asyncio.run(_oversized_model(keys))
    assert done.returncode == 5, done.stderr
    assert "bad model stream" in done.stderr and "at most" in done.stderr
    assert "Traceback" not in done.stderr
