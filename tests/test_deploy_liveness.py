"""Liveness without leaks: a deployment that cannot progress ends, and says why.

A client that corrupts its cluster's sum once and leaves would stall ``sharefl serve``
forever: nothing was released, so the model does not change, so every later round reuses
its plan, and the cluster without that client is withheld (its smaller sum, subtracted from
the corrupted one, would reveal the leaver's input). ``server.max_empty_rounds`` rounds in a
row without a released sum stop the run with :class:`RunStalled` (exit 8) and one line
naming the withheld clusters. A client that took part in no round and refused at least one
exits 9 with its last refusal (:func:`check_took_part`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from byzantine_client import ByzantineClient
from conftest import HANG_S, serving
from test_grpc_processes import Deployment, write_config

from sharefl.deploy.client import ClientReport, ClientRuntime, RoundsRefused, check_took_part
from sharefl.deploy.config import (
    AggregatorSection,
    DeploymentConfig,
    ModelSection,
    SecureAggregationSection,
    ServerSection,
    load_config,
)
from sharefl.deploy.errors import RunStalled
from sharefl.deploy.reports import RoundReport
from sharefl.deploy.server import serve
from sharefl.deploy.strategy import AveragingStrategy
from sharefl.exit_status import ExitStatus
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.errors import ConfigurationError
from sharefl.robust_strategy import RobustStrategy

PER_CLIENT = ClientPolicy(require_atoms=False)
"""Clients that accept plans without atoms (these tests are about per-client clusters)."""

HELPER = Path(__file__).with_name("byzantine_client.py")
ATTACKER = 3
"""Four clients in one cluster of four (t = 3); client 3 masks an out-of-range input."""


def _config(rounds: int) -> DeploymentConfig:
    return DeploymentConfig(
        server=ServerSection(
            clients=4, rounds=rounds, connect_timeout_s=HANG_S, stage_timeout_s=HANG_S
        ),
        model=ModelSection(dim=8, aggregator="sum"),
        secure_aggregation=SecureAggregationSection(cluster_size=4, threshold=3, atoms=False),
    )


class RecordingStrategy(AveragingStrategy):
    """The default strategy, recording (round, whether anything was released) per call."""

    def __init__(self, config: DeploymentConfig) -> None:
        super().__init__(config)
        self.calls: list[tuple[int, bool]] = []

    def apply(self, model, round_index, released):
        self.calls.append((round_index, bool(released)))
        return super().apply(model, round_index, released)


def test_a_client_that_corrupts_its_cluster_once_and_leaves_ends_the_run():
    """Round 1: the attacker's input corrupts the only cluster; it then leaves. Rounds 2
    and 3 reuse the plan of the unchanged model and withhold the three honest clients' sum.
    After 3 empty rounds (the default) the server stops the run, naming the withheld
    cluster, and the honest clients are told so (``FAILED_PRECONDITION``) instead of
    waiting through 10 rounds that cannot release anything."""
    reports: list[RoundReport] = []
    attacker: list[asyncio.Task] = []
    strategy = RecordingStrategy(_config(rounds=10))

    def on_round(report: RoundReport, _model) -> None:
        reports.append(report)
        if report.round == 0:
            attacker[0].cancel()  # leaves after corrupting round 1

    async def main():
        server, address = await serving(
            serve, _config(rounds=10), log=lambda _: None, on_round=on_round, strategy=strategy
        )
        honest = [
            asyncio.create_task(ClientRuntime(c, address, policy=PER_CLIENT).run())
            for c in range(ATTACKER)
        ]
        attacker.append(
            asyncio.create_task(ByzantineClient(ATTACKER, address, attack="out-of-range").run())
        )
        with pytest.raises(RunStalled) as err:
            await server
        ends = await asyncio.gather(*honest, return_exceptions=True)
        return err.value, ends

    stalled, ends = asyncio.run(main())
    assert [bool(r.corrupted) for r in reports] == [True, False, False]
    assert all(r.clusters == [] for r in reports)
    # every round reaches the strategy, with nothing released; the default keeps the model
    assert strategy.calls == [(0, False), (1, False), (2, False)]
    assert all(r.total is None for r in reports)
    assert all(r.withheld and list(r.withheld[0]["members"]) == [0, 1, 2, 3] for r in reports[1:])
    message = str(stalled)
    assert "3 rounds in a row (rounds 1-3) released no cluster sum" in message, message
    assert "round 3: cluster 0/0 withheld" in message and "max_empty_rounds" in message
    assert "\n" not in message
    for end in ends:
        assert isinstance(end, grpc.aio.AioRpcError), end
        assert end.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "released no cluster sum" in end.details()


def test_sharefl_serve_exits_stalled_with_one_line_and_its_clients_are_told(tmp_path):
    """The same stop through the command line: the attacker corrupts every round, the
    server exits 8 after ``max_empty_rounds = 2`` with one ``sharefl serve:`` line, keeps
    the rounds it ran, and its honest clients exit 4 (the server stopped the run)."""
    config = write_config(
        tmp_path, clients=4, rounds=6, dim=16, secure_aggregation={"threshold": 3}
    )
    config.write_text(config.read_text().replace("[model]", "max_empty_rounds = 2\n[model]"))
    run = Deployment(tmp_path, config, 4)
    for cid in range(ATTACKER):
        run.client(cid, "--retries", "1")
    command = [sys.executable, str(HELPER), "--server", run.address, "--id", str(ATTACKER)]
    run.procs[ATTACKER] = subprocess.Popen(
        [*command, "--attack", "out-of-range"], stderr=subprocess.PIPE, text=True
    )
    status, log = run.finish()
    assert status == ExitStatus.STALLED, log
    errors = [line for line in log.splitlines() if line.startswith("sharefl serve:")]
    assert len(errors) == 1 and "2 rounds in a row" in errors[0], log
    assert "cluster 0/0 corrupted" in errors[0], errors
    result = run.result()
    assert len(result["rounds"]) == 2 and "released no cluster sum" in result["error"]
    for cid in range(ATTACKER):
        assert run.procs[cid].returncode == ExitStatus.REFUSED, run.logs[cid]


def test_max_empty_rounds_is_read_from_the_server_table(tmp_path):
    path = tmp_path / "deploy.toml"
    path.write_text("[server]\nmax_empty_rounds = 0\n")
    assert load_config(path).server.max_empty_rounds == 0  # 0: never stop
    assert ServerSection().max_empty_rounds == 3
    path.write_text("[server]\nmax_empty_rounds = -1\n")
    with pytest.raises(ConfigurationError, match=r"server\.max_empty_rounds must be >= 0"):
        load_config(path)


def test_a_client_that_refused_every_round_it_was_offered_fails():
    report = ClientReport(5, rounds=3, refusals=["RoundReplayed: round 2", "ModelReplayed: x"])
    with pytest.raises(RoundsRefused, match="client 5 refused every round") as err:
        check_took_part(report)
    assert "the last: ModelReplayed: x" in str(err.value)
    assert err.value.exit_status == ExitStatus.ROUNDS_REFUSED
    check_took_part(dataclasses.replace(report, contributed=1))  # took part once: fine
    check_took_part(ClientReport(5, rounds=3, sampled_out=3))  # refused nothing: fine


def test_rounds_whose_sums_the_robust_rule_refuses_keep_the_model_and_end_the_run():
    """Nine clients in three clusters of 3 under Median(f=1), which needs 3 sums: client 8
    corrupts its cluster's sum in every round, so each round releases 2. The server keeps
    the model (the rule would otherwise stop the run with its own error, or a weaker rule
    let the corrupted cluster through), its round line says why, and after
    ``max_empty_rounds`` such rounds the run stops with :class:`RunStalled`."""
    config = dataclasses.replace(
        _config(rounds=10),
        server=ServerSection(
            clients=9, rounds=10, connect_timeout_s=HANG_S, stage_timeout_s=HANG_S
        ),
        model=ModelSection(dim=8, aggregator="mean"),
        secure_aggregation=SecureAggregationSection(cluster_size=3, atoms=False),
        aggregator=AggregatorSection(name="median", options={"f": 1}),
    )
    strategy = RobustStrategy(config)
    reports: list[RoundReport] = []
    models: list = []
    lines: list[str] = []

    def on_round(report: RoundReport, model) -> None:
        reports.append(report)
        models.append(model.copy())

    async def main():
        server, address = await serving(
            serve, config, log=lines.append, on_round=on_round, strategy=strategy
        )
        clients = [
            asyncio.create_task(ClientRuntime(c, address, policy=PER_CLIENT).run())
            for c in range(8)
        ]
        clients.append(
            asyncio.create_task(ByzantineClient(8, address, attack="out-of-range").run())
        )
        with pytest.raises(RunStalled) as err:
            await server
        await asyncio.gather(*clients, return_exceptions=True)
        return err.value

    stalled = asyncio.run(main())
    assert len(reports) == 3 and all(len(r.clusters) == 2 for r in reports)
    assert all(m.tobytes() == strategy.initial_model().tobytes() for m in models)
    refusals = [x for x in lines if "the model unchanged" in x]
    assert len(refusals) == 3 and "Median(f=1) needs n >= 2f + 1 = 3 rows, got n = 2" in refusals[0]
    assert "3 rounds in a row (rounds 1-3)" in str(stalled)
