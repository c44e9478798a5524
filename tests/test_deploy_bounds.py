"""Bounds on what peers can cost the server, and per-round client sampling.

Misbehaving parties play against the real server on 127.0.0.1: many connections that never
authenticate (a cap and a Hello deadline; the excess get ``RESOURCE_EXHAUSTED``), a client
flooding refusals (at most ``server.peer_log_lines`` lines per client per round, then one
summary line); the honest clients' rounds complete either way. Sampling: each round draws
``server.clients_per_round`` of the connected clients, checked over real processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess

import grpc
import numpy as np
import pytest
from conftest import HANG_S, PYTHON, serving

from sharefl.deploy.client import ClientRuntime, demo_trainer, retryable
from sharefl.deploy.config import (
    DeploymentConfig,
    ModelSection,
    SecureAggregationSection,
    ServerSection,
    load_config,
)
from sharefl.deploy.run import PeerLog, sample_participants
from sharefl.deploy.server import serve, validate_deployment
from sharefl.deploy.service import BUSY
from sharefl.proto import sharefl_pb2 as pb
from sharefl.proto import sharefl_pb2_grpc as pb_grpc
from sharefl.protocol.errors import ConfigurationError

DIM = 32


def config(*, clients: int = 4, rounds: int = 1, **server) -> DeploymentConfig:
    return DeploymentConfig(
        server=ServerSection(
            address="127.0.0.1:0",  # the OS picks the port at the bind
            clients=clients,
            rounds=rounds,
            connect_timeout_s=HANG_S,
            stage_timeout_s=HANG_S,
            **server,
        ),
        model=ModelSection(dim=DIM, aggregator="sum"),
        secure_aggregation=SecureAggregationSection(cluster_size=4, threshold=3),
    )


def expected_total(round_index: int, clients) -> np.ndarray:
    return sum(demo_trainer(np.zeros(DIM), round=round_index, client_id=c) for c in clients)


# --- unauthenticated streams -----------------------------------------------------------------


async def _idle_stream(address: str) -> tuple[grpc.aio.Channel, object, grpc.StatusCode | None]:
    """Open a stream and read the challenge, never sending a Hello: the channel, the call,
    and the status if the server refused the stream at once (None: it got the challenge)."""
    channel = grpc.aio.insecure_channel(address)
    call = pb_grpc.AggregationStub(channel).Session()
    try:
        first = await call.read()
    except grpc.aio.AioRpcError as exc:
        assert BUSY in exc.details()
        return channel, call, exc.code()
    assert first.WhichOneof("body") == "challenge"
    return channel, call, None


async def _end_of(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    return err.value


def test_idle_unauthenticated_streams_are_capped_and_timed_out_and_honest_clients_finish():
    async def main():
        # The 8 streams are opened at once and the Hello deadline leaves 3 s for it: opened
        # one after the other against a 1 s deadline, the first holders could time out
        # before the last stream was opened, freeing slots (a flake under load).
        cfg = config(max_unauthenticated=3, hello_timeout_s=3.0)
        lines: list[str] = []
        server, address = await serving(serve, cfg, log=lines.append)
        idle = list(await asyncio.gather(*(_idle_stream(address) for _ in range(8))))
        holders = [call for _, call, code in idle if code is None]
        refused = [code for _, _, code in idle if code is not None]
        honest = [ClientRuntime(cid, address, retries=10) for cid in range(4)]
        ends, outcomes = await asyncio.gather(
            asyncio.gather(*(_end_of(call) for call in holders)),
            asyncio.gather(*(c.run() for c in honest)),
        )
        result = await server
        for channel, _, _ in idle:
            await channel.close()
        return holders, refused, ends, outcomes, result

    holders, refused, ends, outcomes, result = asyncio.run(main())
    assert len(holders) == 3 and refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5
    assert all(e.code() == grpc.StatusCode.DEADLINE_EXCEEDED for e in ends), ends
    assert all("no Hello within 3 s" in e.details() for e in ends)
    assert [o.rounds for o in outcomes] == [1, 1, 1, 1]
    (report,) = result.reports
    assert report.participants == [0, 1, 2, 3] and report.failed == []
    np.testing.assert_array_equal(report.total, expected_total(0, range(4)))


def test_the_busy_answer_is_retried_and_other_resource_exhausted_answers_are_not():
    class Error(grpc.aio.AioRpcError):
        def __init__(self, code, details):
            super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    assert retryable(Error(exhausted, f"{BUSY} (3 at once); retry shortly"))
    assert not retryable(Error(exhausted, "Received message larger than max"))
    assert retryable(Error(grpc.StatusCode.UNAVAILABLE, "connection refused"))
    assert not retryable(Error(grpc.StatusCode.PERMISSION_DENIED, BUSY))


# --- log lines taken from peers ------------------------------------------------------------


class _Flooder(ClientRuntime):
    """Sends ``count`` refusals before each of its advertisements, then behaves."""

    count = 40

    async def _send(self, call, message):
        if isinstance(message, pb.ClientMessage) and message.WhichOneof("body") == "advertise":
            for i in range(self.count):
                refusal = pb.Refusal(reason=f"flood {i}\nround 9/9: forged")
                await super()._send(call, pb.ClientMessage(refusal=refusal))
        return await super()._send(call, message)


def test_a_client_flooding_refusals_gets_a_few_lines_a_round_and_one_summary():
    async def main():
        lines: list[str] = []
        cfg = config(rounds=2, peer_log_lines=3)
        server, address = await serving(serve, cfg, log=lines.append)
        clients = [ClientRuntime(cid, address) for cid in range(3)]
        clients.append(_Flooder(3, address, retries=1))
        outcomes = await asyncio.gather(*(c.run() for c in clients))
        return await server, outcomes, lines

    result, outcomes, lines = asyncio.run(main())
    refusals = [line for line in lines if line.startswith("client 3 refused")]
    assert len(refusals) == 2 * 3, refusals  # three lines in each of the two rounds
    assert refusals[0] == "client 3 refused: flood 0\\nround 9/9: forged"
    summaries = [line for line in lines if "more suppressed" in line]
    assert summaries == ["client 3: ... 37 more suppressed"] * 2
    assert not any(line.startswith("round 9/9") for line in lines)
    assert [o.rounds for o in outcomes] == [2, 2, 2, 2]
    for report in result.reports:
        assert report.participants == [0, 1, 2, 3] and report.failed == []


def test_peer_log_counts_per_client_and_resets_every_round():
    lines: list[str] = []
    log = PeerLog(lines.append, limit=2)
    for i in range(5):
        log.line(7, f"a{i}")
    log.line(8, "b0")
    log.end_round()
    log.line(7, "c0")
    log.end_round()
    assert lines == ["a0", "a1", "b0", "client 7: ... 3 more suppressed", "c0"]


# --- per-round client sampling ---------------------------------------------------------------


def test_sampling_draws_k_distinct_eligible_clients_or_all():
    rng = np.random.default_rng(1)
    eligible = [9, 2, 5, 7, 11, 3]
    draws = [sample_participants(eligible, 4, rng) for _ in range(200)]
    assert all(len(d) == 4 and d == sorted(d) and set(d) <= set(eligible) for d in draws)
    assert len({tuple(d) for d in draws}) > 10  # the subsets vary (15 are possible)
    counts = {c: sum(c in d for d in draws) for c in eligible}
    assert all(100 < n < 170 for n in counts.values()), counts  # about 2/3 of 200 each
    assert sample_participants(eligible, 0, rng) == sorted(eligible)
    assert sample_participants(eligible[:3], 4, rng) == [2, 5, 9]
    with pytest.raises(ValueError, match="per_round"):
        sample_participants(eligible, -1, rng)


@pytest.mark.parametrize(
    ("server", "sa", "match"),
    [
        ({"clients": 6, "clients_per_round": 7}, {}, r"clients_per_round must be 0"),
        ({"clients": 6, "clients_per_round": 1}, {}, r"clients_per_round must be 0"),
        ({"clients": 8, "clients_per_round": 3}, {"cluster_size": 4}, r"cluster_size \(4\)"),
        ({"clients": 8, "clients_per_round": 4}, {"cluster_size": 4, "threshold": 5}, "thresh"),
    ],
    ids=["more-than-clients", "one", "below-cluster-size", "threshold-of-the-sample"],
)
def test_sampling_configurations_that_cannot_run_fail_before_listening(tmp_path, server, sa, match):
    path = tmp_path / "deploy.toml"
    server_lines = "\n".join(f"{k} = {v}" for k, v in server.items())
    sa_lines = "\n".join(f"{k} = {v}" for k, v in sa.items())
    path.write_text(f"[server]\n{server_lines}\n[secure_aggregation]\n{sa_lines}\n")
    with pytest.raises(ConfigurationError, match=match):
        validate_deployment(load_config(path))


def test_validation_plans_the_sampled_round_not_every_client():
    """A robust rule's ``f`` that fits the clusters of all clients but not of a sample."""
    cfg = dataclasses.replace(
        config(clients=12, clients_per_round=4),
        secure_aggregation=SecureAggregationSection(cluster_size=4),
    )

    class Strategy:
        def check(self, clusters: int) -> None:
            if clusters < 2:
                raise ValueError(f"needs 2 cluster sums, got {clusters}")

    with pytest.raises(ConfigurationError, match=r"over 1 cluster sums .*4 clients a round"):
        validate_deployment(cfg, strategy=Strategy())
    every_client = dataclasses.replace(cfg, server=config(clients=12).server)
    validate_deployment(every_client, strategy=Strategy())  # 3 clusters of all 12: fine


def test_launch_samples_k_clients_a_round_and_the_others_sit_out(tmp_path):
    """With atoms (the default, of 3: {0, 1, 2}, {3, 4, 5}, {6, 7, 8}) a round samples whole
    atoms until it holds k = 6 clients: two atoms take part, the third sits out."""
    path = tmp_path / "deploy.toml"
    path.write_text(
        "[server]\nclients = 9\nrounds = 3\nclients_per_round = 6\nconnect_timeout_s = 60\n"
        f'[model]\ndim = {DIM}\naggregator = "sum"\n'
        "[secure_aggregation]\ncluster_size = 3\n"
    )
    out = tmp_path / "out"
    done = subprocess.run(
        [*PYTHON, "launch", "--config", str(path), "--clients", "9", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2, 3]
    atoms = [{0, 1, 2}, {3, 4, 5}, {6, 7, 8}]
    for row in rows:
        assert len(row["participants"]) == 6, row
        assert sum(atom <= set(row["participants"]) for atom in atoms) == 2, row
        assert sorted(row["participants"] + row["sampled_out"]) == list(range(9))
        assert row["failed"] == [] and row["contributors"] == 6
        total = np.load(out / f"round-{row['round']}-aggregate.npy")
        expected = expected_total(row["round"] - 1, row["participants"])  # the wire's index
        np.testing.assert_array_equal(total, expected)
    sat_out = {c: sum(c in row["sampled_out"] for row in rows) for c in range(9)}
    for c in range(9):
        line = f"client {c}: 3 rounds" + (f" ({sat_out[c]} not sampled)" if sat_out[c] else "")
        assert line + "," in done.stderr, (line, done.stderr)
    assert "3 not sampled" in done.stderr  # the server's round line


def test_the_server_binds_its_port_once_and_reports_the_one_it_got():
    """Port 0: the OS picks a free port at the bind; the address reported (and logged) is
    the one bound, never a port checked free earlier and bound later."""
    from sharefl.deploy.server import bound_address

    assert bound_address("127.0.0.1:0", 50123) == "127.0.0.1:50123"
    assert bound_address("[::1]:0", 50123) == "[::1]:50123"
    assert bound_address("0.0.0.0:50051", 50051) == "0.0.0.0:50051"

    async def main():
        lines: list[str] = []
        server, address = await serving(serve, config(), log=lines.append)
        assert not address.endswith(":0")
        assert any(f"listening on {address}" in line for line in lines)
        outcomes = await asyncio.gather(*(ClientRuntime(cid, address).run() for cid in range(4)))
        return await server, outcomes

    result, outcomes = asyncio.run(main())
    assert len(result.reports) == 1 and len(outcomes) == 4
