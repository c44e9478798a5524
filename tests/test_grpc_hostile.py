"""Hostile clients against the real server, a hostile server against the real client."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc
import numpy as np
import pytest
from conftest import HANG_S, examples, serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharefl.crypto.encoding import choose_encoding
from sharefl.crypto.kdf import KeyContext
from sharefl.deploy import wire
from sharefl.deploy.client import ClientRuntime, demo_trainer, session_method
from sharefl.deploy.config import (
    DeploymentConfig,
    ModelSection,
    SecureAggregationSection,
    ServerSection,
)
from sharefl.deploy.run import ClientLink, ServerRun, StreamError
from sharefl.deploy.server import serve
from sharefl.deploy.service import AggregationService, add_session_handler
from sharefl.deploy.wire import printable
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.coordinator import RoundCoordinator
from sharefl.protocol.messages import ClusterAssignment
from sharefl.protocol.server import ServerSession

DIM = 64


class HostileClient(ClientRuntime):
    """A real client whose outgoing messages pass through ``mutate`` first."""

    def __init__(self, *args, mutate, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mutate = mutate

    def _send(self, call, message):
        if isinstance(message, bytes):  # a vector's chunk, serialized once by the runtime
            message = pb.ClientMessage.FromString(message)
        return super()._send(call, self.mutate(message))


def config(clients: int = 4) -> DeploymentConfig:
    return DeploymentConfig(
        server=ServerSection(
            address="127.0.0.1:0",
            clients=clients,
            connect_timeout_s=HANG_S,
            stage_timeout_s=HANG_S,
        ),
        model=ModelSection(dim=DIM, aggregator="sum"),
        secure_aggregation=SecureAggregationSection(cluster_size=4, threshold=3, atoms=False),
    )


PER_CLIENT = ClientPolicy(require_atoms=False)
"""This module tests hostile messages against per-client clusters (atoms off on both sides:
with 4 clients, one atom, a thrown-out attacker would take every sum with it)."""


async def run_with_attacker(mutate):
    server, address = await serving(serve, config(), log=lambda _: None)
    honest = [ClientRuntime(cid, address, policy=PER_CLIENT) for cid in range(3)]
    attacker = HostileClient(3, address, mutate=mutate, retries=1, policy=PER_CLIENT)
    results = await asyncio.gather(
        *(c.run() for c in honest), attacker.run(), return_exceptions=True
    )
    return await server, results


def _mutator(kind: str, change):
    def mutate(message: pb.ClientMessage) -> pb.ClientMessage:
        if message.WhichOneof("body") == kind:
            message = pb.ClientMessage.FromString(message.SerializeToString())
            change(getattr(message, kind))
        return message

    return mutate


def _truncate_chunk(chunk: pb.VectorChunk) -> None:
    chunk.data = chunk.data[:-1]


def _longer_vector(masked: pb.MaskedInput) -> None:
    masked.vector.length += 1


def _wrong_round(advert: pb.Advertisement) -> None:
    advert.context.round = 7


def _wrong_sender(shares: pb.EncryptedShares) -> None:
    shares.sender = 0


def _short_key(advert: pb.Advertisement) -> None:
    advert.mask_public = b"\x01" * 5


@pytest.mark.parametrize(
    "kind,change,code",
    [
        ("chunk", _truncate_chunk, grpc.StatusCode.INVALID_ARGUMENT),
        ("masked", _longer_vector, grpc.StatusCode.INVALID_ARGUMENT),
        ("advertise", _wrong_round, grpc.StatusCode.FAILED_PRECONDITION),
        ("advertise", _short_key, grpc.StatusCode.INVALID_ARGUMENT),
        ("shares", _wrong_sender, grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_malformed_client_messages_get_a_status_and_the_others_finish(kind, change, code):
    result, outcomes = asyncio.run(run_with_attacker(_mutator(kind, change)))
    *honest, attacker = outcomes
    assert isinstance(attacker, grpc.aio.AioRpcError)
    assert attacker.code() == code and attacker.details()
    (report,) = result.reports
    assert report.failed == []
    (cluster,) = report.clusters
    assert cluster["members"] == [0, 1, 2]
    expected = sum(demo_trainer(np.zeros(DIM), round=0, client_id=c) for c in range(3))
    np.testing.assert_array_equal(report.total, expected)
    assert all(h.rounds == 1 for h in honest)


# --- fuzz the message router with arbitrary field values -------------------------------------

CTX = KeyContext(round=0, reclustering=0, cluster=0)
KINDS = ["advertise", "shares", "masked", "chunk", "consistency", "unmask", "refusal", "hello"]


@st.composite
def client_messages(draw):
    kind = draw(st.sampled_from(KINDS))
    message = pb.ClientMessage()
    body = getattr(message, kind)
    body.SetInParent()
    for descriptor in body.DESCRIPTOR.fields:
        if draw(st.booleans()):
            continue
        name = descriptor.name
        if descriptor.message_type is not None:
            sub = descriptor.message_type.name
            if sub == "Context":
                target = getattr(body, name)
                target.round = draw(st.integers(0, 3))
                target.cluster = draw(st.integers(0, 2))
                target.version = draw(st.sampled_from([0, 1, 1, 1]))
            elif sub == "VectorHeader":
                target = getattr(body, name)
                target.length = draw(st.sampled_from([0, DIM, DIM + 1, 2**40]))
                target.dtype = draw(st.integers(0, 3))
                target.chunks = draw(st.integers(0, 2))
            elif sub in ("Bundle", "PeerShare", "SignatureEntry"):
                for _ in range(draw(st.integers(0, 3))):
                    entry = getattr(body, name).add()
                    setattr(entry, entry.DESCRIPTOR.fields[0].name, draw(st.integers(0, 9)))
                    setattr(entry, entry.DESCRIPTOR.fields[1].name, draw(st.binary(max_size=140)))
            continue
        if descriptor.type == descriptor.TYPE_BYTES:
            value = draw(st.binary(max_size=80))
        elif descriptor.type == descriptor.TYPE_STRING:
            value = draw(st.text(max_size=20))
        else:
            value = draw(st.one_of(st.integers(0, 4), st.integers(0, 2**32 - 1)))
        # protobuf >= 6 has is_repeated; 5.29 (the oldest runtime supported) has the label.
        repeated = getattr(descriptor, "is_repeated", None)
        if repeated is None:
            repeated = descriptor.label == descriptor.LABEL_REPEATED
        if repeated:
            if descriptor.type in (descriptor.TYPE_UINT64, descriptor.TYPE_UINT32):
                getattr(body, name).extend(draw(st.lists(st.integers(0, 9), max_size=5)))
            continue
        setattr(body, name, value)
    return message


def _coordinator() -> tuple[ServerRun, ClientLink]:
    """A server run in the advertise stage of a round of one cluster {0, 1, 2, 3}."""
    run = ServerRun(config(), log=lambda _: None)
    run.round = RoundCoordinator(
        run.settings, round=0, participants=range(4), length=DIM, rng=np.random.default_rng(0)
    )
    run.round.open_reclustering()
    return run, ClientLink(1)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(client_messages(), min_size=1, max_size=4))
def test_fuzzed_messages_get_invalid_argument_or_failed_precondition(messages):
    coordinator, link = _coordinator()
    for message in messages:
        try:
            coordinator.on_message(link, message)
        except StreamError as exc:
            assert exc.code in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.FAILED_PRECONDITION,
            )
            assert str(exc)
            break


# --- a hostile server against the real client ------------------------------------------------


class HostileServer(pb_grpc.AggregationServicer):
    """Runs the first stages honestly with two simulated peers, then asks the real client to
    reveal both secrets of peer 101 (it claims 101 both survived and dropped)."""

    def __init__(self) -> None:
        self.received: list[pb.ClientMessage] = []
        self.done = asyncio.Event()

    async def _read(self, incoming):
        message = await incoming.__anext__()
        self.received.append(message)
        return message

    async def Session(self, request_iterator, context):
        incoming = request_iterator.__aiter__()
        await context.write(pb.ServerMessage(challenge=pb.Challenge(nonce=b"n" * 32)))
        victim = (await self._read(incoming)).hello.client_id
        header, chunks = wire.vector_to_proto(np.zeros(DIM, np.float32))
        await context.write(pb.ServerMessage(round_start=pb.RoundStart(round=0, model=header)))
        for chunk in chunks:
            await context.write(pb.ServerMessage(chunk=chunk))
        members = (victim, 101, 102)
        assignment = ClusterAssignment(CTX, tuple(sorted(members)), 2, DIM, 32)
        encoding = choose_encoding(1.0, 3)
        await context.write(
            pb.ServerMessage(assignment=wire.assignment_to_proto(assignment, encoding))
        )
        server = ServerSession(assignment)
        fakes = {
            cid: ClientSession(cid, assignment, np.zeros(DIM, np.uint32)) for cid in (101, 102)
        }
        for fake in fakes.values():
            server.receive(fake.advertise())
        server.receive(wire.advert_from_proto((await self._read(incoming)).advertise))
        outgoing = server.advance()
        for stage in ("shares", "masked"):
            for cid, message in outgoing.items():
                if cid in fakes:
                    server.receive(fakes[cid].handle(message))
                else:
                    await context.write(wire.server_message_to_proto(message))
            reply = await self._read(incoming)
            if stage == "shares":
                server.receive(wire.shares_from_proto(reply.shares))
            else:
                assembler = wire.VectorAssembler(reply.masked.vector, DIM, np.uint32)
                while not assembler.complete:
                    assembler.add((await self._read(incoming)).chunk)
                server.receive(wire.masked_from_parts(reply.masked, assembler.result()))
            outgoing = server.advance()
        evil = wire.server_message_to_proto(
            dataclasses.replace(outgoing[victim], survivors=members, dropped=(101,))
        )
        await context.write(evil)
        self.received.append(await incoming.__anext__())  # the client's answer
        honest_again = wire.server_message_to_proto(
            dataclasses.replace(outgoing[victim], survivors=(victim, 102), dropped=(101,))
        )
        await context.write(honest_again)
        header, chunks = wire.vector_to_proto(np.zeros(DIM, np.float32))
        await context.write(pb.ServerMessage(finished=pb.Finished(rounds=1, model=header)))
        for chunk in chunks:
            await context.write(pb.ServerMessage(chunk=chunk))
        # Whatever the client answers to the second request comes before it reads Finished
        # and ends its stream: read to the end (a bound on work, not a time window).
        try:
            with contextlib.suppress(StopAsyncIteration, grpc.aio.AioRpcError):
                while True:
                    self.received.append(await incoming.__anext__())
        finally:
            self.done.set()


def test_hostile_server_cannot_get_both_secrets_of_a_peer():
    async def main():
        servicer = HostileServer()
        server = grpc.aio.server()
        pb_grpc.add_AggregationServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        client = ClientRuntime(7, f"127.0.0.1:{port}", retries=1, policy=PER_CLIENT)
        report = await client.run()
        await servicer.done.wait()
        await server.stop(0)
        return servicer.received, report

    received, report = asyncio.run(main())
    kinds = [m.WhichOneof("body") for m in received]
    assert "unmask" not in kinds  # nothing was revealed, not even the survivors' seeds
    assert kinds.count("refusal") == 1
    refusal = next(m.refusal for m in received if m.WhichOneof("body") == "refusal")
    assert "both" in refusal.reason
    assert report.refusals and "InconsistentRequest" in report.refusals[0]


def test_a_leaking_reclustering_plan_is_refused_before_the_server_listens():
    from sharefl.protocol.errors import LeakageError

    cfg = dataclasses.replace(
        config(clients=6),
        secure_aggregation=SecureAggregationSection(
            cluster_size=3,
            reclusterings=10,
            planner="random",
            reproducible_seed=0,
            atoms=False,  # with atoms every plan is safe by structure
        ),
    )
    bound: list[str] = []
    with pytest.raises(LeakageError, match="LEAKS"):
        asyncio.run(serve(cfg, listening=bound.append, log=lambda _: None))
    assert not bound  # validated before the port was bound: no client ever waited


# --- stream-level faults: one client ends only its own stream --------------------------------


def test_printable_escapes_control_characters_and_bounds_the_length():
    forged = "no\nround 1/1: 4 clients ok\r\x1b[2K\u202eevil" + "x" * 10_000
    text = printable(forged, 200)
    assert len(text) <= 200 and text.isprintable()
    assert text.startswith("no\\nround 1/1: 4 clients ok\\r\\x1b[2K\\u202eevil")
    assert text.endswith(f"({len(forged)} characters)")
    assert printable("plain reason") == "plain reason"
    assert printable("\n" * 150, 200).isprintable() and len(printable("\n" * 150, 200)) <= 200


async def _serve_with(coordinator: ServerRun, attacker: ClientRuntime, honest: int = 3):
    """Serve ``coordinator`` over gRPC to ``honest`` real clients and ``attacker``."""
    server = grpc.aio.server()
    add_session_handler(server, AggregationService(coordinator, None))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    attacker.address = address
    run = asyncio.create_task(coordinator.run())
    outcomes = await asyncio.gather(
        *(ClientRuntime(cid, address, policy=PER_CLIENT).run() for cid in range(honest)),
        attacker.run(),
        return_exceptions=True,
    )
    reports = await run
    await server.stop(0)
    return reports, outcomes


def _check_honest_round(reports, outcomes, rounds: int = 1) -> None:
    *honest, _ = outcomes
    assert all(h.rounds == rounds for h in honest), honest
    for r, report in enumerate(reports):
        # no stage deadline waited: every deadline here is HANG_S (a bound on work, not time)
        assert report.failed == [] and report.seconds < HANG_S, report
        members = {m for c in report.clusters for m in c["members"]}
        assert members == {0, 1, 2}
        expected = sum(demo_trainer(np.zeros(DIM), round=r, client_id=c) for c in range(3))
        np.testing.assert_array_equal(report.total, expected)


def test_undecodable_bytes_mid_round_end_that_stream_only_and_cost_no_deadline():
    from byzantine_client import ByzantineClient

    lines: list[str] = []
    cfg = dataclasses.replace(config(), server=dataclasses.replace(config().server, rounds=2))
    attacker = ByzantineClient(3, "", attack="undecodable", retries=1)
    reports, outcomes = asyncio.run(_serve_with(ServerRun(cfg, log=lines.append), attacker))
    error = outcomes[-1]
    assert isinstance(error, grpc.aio.AioRpcError)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "undecodable" in error.details()
    assert any(line.startswith("client 3: INVALID_ARGUMENT: undecodable") for line in lines)
    assert reports[1].participants == [0, 1, 2]  # dropped at once, not a zombie
    _check_honest_round(reports, outcomes, rounds=2)


class _Exploding(ServerRun):
    """A coordinator with a bug that one client's advertisement triggers."""

    def on_message(self, link, envelope):
        if link.client_id == 3 and envelope.WhichOneof("body") == "advertise":
            raise RuntimeError("boom\nround 1/1: forged line")
        super().on_message(link, envelope)


def test_an_unexpected_exception_in_handling_ends_only_that_clients_stream():
    lines: list[str] = []
    coordinator = _Exploding(config(), log=lines.append)
    reports, outcomes = asyncio.run(
        _serve_with(coordinator, ClientRuntime(3, "", retries=1, policy=PER_CLIENT))
    )
    error = outcomes[-1]
    assert isinstance(error, grpc.aio.AioRpcError)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "RuntimeError" in error.details()
    (line,) = [line for line in lines if line.startswith("client 3: unexpected")]
    assert "boom\\nround 1/1: forged line" in line
    assert not any(line.startswith("round 1/1: forged") for line in lines)
    _check_honest_round(reports, outcomes)


class _Refuser(ClientRuntime):
    """Sends a huge refusal whose reason tries to forge log lines, then behaves."""

    async def _send(self, call, message):
        if isinstance(message, pb.ClientMessage) and message.WhichOneof("body") == "advertise":
            reason = "x\nround 1/1: 9 clients, forged\n" + "y" * 1_000_000
            await super()._send(call, pb.ClientMessage(refusal=pb.Refusal(reason=reason)))
        return await super()._send(call, message)


def test_a_refusal_reason_is_logged_escaped_and_truncated():
    lines: list[str] = []
    coordinator = ServerRun(config(), log=lines.append)
    _, outcomes = asyncio.run(
        _serve_with(coordinator, _Refuser(3, "", retries=1, policy=PER_CLIENT))
    )
    refusals = [line for line in lines if "refused" in line]
    assert len(refusals) == 1 and len(refusals[0]) <= 230
    assert "x\\nround 1/1: 9 clients, forged\\n" in refusals[0]
    assert all("\n" not in line for line in lines)
    assert outcomes[-1].rounds == 1  # a refusal alone costs the client nothing


class _RefuserWhoSendsAnyway(ClientRuntime):
    """Refuses its own cluster (the advert's context), then sends the advert all the same:
    a contradiction no honest client sends (it drops a cluster it refused)."""

    async def _send(self, call, message):
        if isinstance(message, pb.ClientMessage) and message.WhichOneof("body") == "advertise":
            refusal = pb.Refusal(context=message.advertise.context, reason="not this round")
            await super()._send(call, pb.ClientMessage(refusal=refusal))
        return await super()._send(call, message)


def test_a_message_after_refusing_the_cluster_ends_that_stream_and_the_others_finish():
    """Over gRPC: the refusal withdraws client 3 from its cluster (no stage waits for it),
    the advert it sends afterwards is refused as misbehaviour (culprit, stream ended with
    FAILED_PRECONDITION), and the other three release their exact sum."""
    lines: list[str] = []
    coordinator = ServerRun(config(), log=lines.append)
    reports, outcomes = asyncio.run(
        _serve_with(coordinator, _RefuserWhoSendsAnyway(3, "", retries=1, policy=PER_CLIENT))
    )
    error = outcomes[-1]
    assert isinstance(error, grpc.aio.AioRpcError)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "refused" in error.details()
    (report,) = reports
    assert "refused" in report.culprits[3]
    _check_honest_round(reports, outcomes)


async def _raw_session(port: int, *messages: bytes) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = session_method(channel)()  # its serializer passes raw bytes through
        await call.read()  # the challenge
        for message in messages:
            await call.write(message)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
        return err.value


@pytest.mark.parametrize(
    "hello,words",
    [
        (b"\xff\xff\xff\xff\x0fgarbage", "undecodable"),
        (pb.Hello(client_id=1, identity_public=b"k" * 100, signature=b"s" * 64), "identity_public"),
        (pb.Hello(client_id=1, identity_public=b"k" * 32, signature=b"s" * 65), "signature must"),
    ],
    ids=["garbage", "long-identity", "long-signature"],
)
def test_malformed_hellos_get_invalid_argument_and_the_server_serves_on(hello, words):
    async def main():
        coordinator = ServerRun(config(), log=lambda _: None)
        server = grpc.aio.server()
        add_session_handler(server, AggregationService(coordinator, None))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        raw = hello if isinstance(hello, bytes) else pb.ClientMessage(hello=hello)
        error = await _raw_session(port, raw if isinstance(raw, bytes) else raw.SerializeToString())
        honest = ClientRuntime(5, f"127.0.0.1:{port}", retries=1, policy=PER_CLIENT)
        task = asyncio.create_task(honest.run())

        async def registered() -> None:
            while 5 not in coordinator.alive():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(registered(), HANG_S)  # the next client is still served
        task.cancel()
        await server.stop(0)
        return error, coordinator

    error, coordinator = asyncio.run(main())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and words in error.details()
    assert 1 not in coordinator.links
