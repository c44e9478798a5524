"""sharefl inside Flower against Flower's SecAgg+ and plain FedAvg, same process, same updates.

For each N in ``--clients`` (default 10 and 20), one ``flwr.simulation.run_simulation``
(Ray backend, 2 CPUs, one CPU per client actor) runs these fit workflows in turn, each for
one warm-up round and ``--rounds`` measured rounds over the same clients:

- ``sharefl``: :class:`~sharefl.integrations.flower.ShareflWorkflow` (clusters of 5, R = 1,
  32-bit ring, clip 1) with :func:`~sharefl.integrations.flower.sharefl_mod`;
- ``secaggplus_complete``: Flower's ``SecAggPlusWorkflow(num_shares=N,
  reconstruction_threshold=N // 2 + 1)`` with ``secaggplus_mod`` (a complete graph: SecAgg);
- ``secaggplus_sparse``: ``SecAggPlusWorkflow(num_shares=3, reconstruction_threshold=2)``,
  the setting of Flower's own secure-aggregation example;
- ``fedavg``: Flower's ``DefaultWorkflow`` fit round, no secure aggregation.

Every client trains by adding a fixed update (d float32 coordinates, uniform in ±0.5, weight
10 + its partition id) to the parameters it received, so every method averages the same
updates. Per method it prints one JSON line: the round wall time (median over the measured
rounds, from the fit workflow's start to its end on the server), the server's CPU time in
the thread that runs the workflow (the protocol, encoding and Flower's message handling;
Ray's client processes excluded), the client time (the client app's own time over every
message of the round, averaged over the clients), the number of message exchanges, and the
max error of the new parameters against the exact weighted mean of the updates. Ratios
against ``secaggplus_complete`` and ``fedavg`` of the same run follow.

Flower polls: its in-memory grid sleeps ``pull_interval`` (0.1 s) between pulls for replies,
and the simulation runtime looks for new messages every 0.1 s. Every exchange of a
multi-stage protocol therefore waits up to two ticks. ``--tick`` sets both (the second by
replacing ``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue`` with a copy
whose wait is ``--tick``); the tick is printed with the results.

Targets (issue #16), N = 20, d = 10^5: sharefl's round ≥ 4× faster than SecAgg+ complete
graph and ≤ 3× plain FedAvg's. Run:
``python benchmarks/bench_flower.py [--clients 10 20] [--d 100000] [--tick 0.01]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from common import add_smoke_flag, emit, emit_machine, finish, use_smoke
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.default_workflows import default_fit_workflow
from flwr.simulation import run_simulation

from sharefl.integrations.flower import ShareflWorkflow, sharefl_mod

TIMING = "bench.timing"
"""The ConfigRecord a client adds to each reply: its app's seconds for that message."""


# ---- clients ------------------------------------------------------------------------------


def client_update(pid: int, d: int) -> tuple[np.ndarray, int]:
    """Partition ``pid``'s update and weight: the same for every method."""
    rng = np.random.default_rng(1000 + pid)
    return rng.uniform(-0.5, 0.5, d).astype(np.float32), 10 + pid


class AddUpdate(NumPyClient):
    def __init__(self, pid: int, d: int):
        self.update, self.weight = client_update(pid, d)

    def fit(self, parameters, config):
        return [parameters[0] + self.update], self.weight, {}


def route(msg: Message, ctxt: Context, call_next) -> Message:
    """SecAgg+ messages to ``secaggplus_mod`` (which refuses anything else), the rest to
    ``sharefl_mod`` (which passes what is not its own), timing the app's work."""
    start = time.perf_counter()
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        out = secaggplus_mod(msg, ctxt, call_next)
    else:
        out = sharefl_mod(msg, ctxt, call_next)
    if not out.has_error():
        out.content[TIMING] = ConfigRecord({"s": time.perf_counter() - start})
    return out


def client_app(d: int) -> ClientApp:
    def client_fn(context: Context):
        return AddUpdate(int(context.node_config["partition-id"]), d).to_client()

    return ClientApp(client_fn=client_fn, mods=[route])


# ---- the server ---------------------------------------------------------------------------


class TimingGrid:
    """The grid, counting exchanges and summing the clients' reported seconds."""

    def __init__(self, grid):
        self._grid = grid
        self.exchanges = 0
        self.client_s = 0.0

    def send_and_receive(self, messages, *, timeout=None):
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self.exchanges += 1
        for reply in replies:
            if not reply.has_error() and TIMING in reply.content.config_records:
                self.client_s += float(reply.content.config_records.pop(TIMING)["s"])
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


@dataclass
class RoundStats:
    wall_s: float
    server_cpu_s: float
    client_s: float
    exchanges: int
    max_error: float


class Recording(FedAvg):
    """FedAvg that remembers the parameters it sent and those it aggregated."""

    sent: list[np.ndarray] | None = None
    aggregated: list[np.ndarray] | None = None

    def configure_fit(self, server_round, parameters, client_manager):
        self.sent = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        if failures:
            raise RuntimeError(f"{len(failures)} clients failed: {failures[:1]}")
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        self.aggregated = parameters_to_ndarrays(parameters) if parameters else None
        return parameters, metrics


@dataclass
class Method:
    """One fit workflow measured over ``rounds`` rounds after a warm-up round."""

    name: str
    make: Callable[[], Callable | None]
    stats: list[RoundStats] = field(default_factory=list)

    def run(self, grid, context: Context, n: int, d: int, rounds: int, exact: np.ndarray):
        strategy = Recording(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=n,
            min_available_clients=n,
            initial_parameters=ndarrays_to_parameters([np.zeros(d, np.float32)]),
        )
        inner = self.make()
        timing = TimingGrid(grid)

        def fit(grid_, ctx):
            timing.exchanges, timing.client_s = 0, 0.0
            wall, cpu = time.perf_counter(), time.thread_time()
            (inner or default_fit_workflow)(timing, ctx)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            assert strategy.sent is not None and strategy.aggregated is not None
            error = float(np.abs(strategy.aggregated[0] - strategy.sent[0] - exact).max())
            self.stats.append(RoundStats(wall, cpu, timing.client_s / n, timing.exchanges, error))

        fresh = Context(context.run_id, 0, {}, RecordDict(), {})
        legacy = LegacyContext(fresh, config=ServerConfig(num_rounds=rounds + 1), strategy=strategy)
        DefaultWorkflow(fit_workflow=fit)(grid, legacy)

    def summary(self, n: int, d: int, tick: float) -> dict[str, Any]:
        measured = self.stats[1:]  # the first round warms up
        med = statistics.median
        return {
            "kind": "round",
            "name": f"{self.name}_n{n}",
            "method": self.name,
            "clients": n,
            "d": d,
            "tick_s": tick,
            "rounds": len(measured),
            "round_s": med(s.wall_s for s in measured),
            "round_s_all": [round(s.wall_s, 4) for s in measured],
            "server_cpu_s": med(s.server_cpu_s for s in measured),
            "client_s": med(s.client_s for s in measured),
            "exchanges": measured[0].exchanges,
            "max_error": max(s.max_error for s in self.stats),
        }


def methods(n: int) -> list[Method]:
    return [
        Method("sharefl", lambda: ShareflWorkflow(cluster_size=5, clip=1.0)),
        Method(
            "secaggplus_complete",
            lambda: SecAggPlusWorkflow(
                num_shares=n, reconstruction_threshold=n // 2 + 1, clipping_range=2.0
            ),
        ),
        Method(
            "secaggplus_sparse",
            lambda: SecAggPlusWorkflow(
                num_shares=3, reconstruction_threshold=2, clipping_range=2.0
            ),
        ),
        Method("fedavg", lambda: None),
    ]


def exact_mean(n: int, d: int) -> np.ndarray:
    updates = [client_update(pid, d) for pid in range(n)]
    total = sum(w for _, w in updates)
    return sum(u.astype(np.float64) * w for u, w in updates) / total


# ---- Flower's polling ---------------------------------------------------------------------


def set_tick(tick: float) -> None:
    """The simulation runtime's wait between looks for new messages (0.1 s in Flower)."""

    def add_messages_to_queue(state, queue, nodes_mapping, f_stop: threading.Event) -> None:
        while not f_stop.is_set():
            for node_id in nodes_mapping:
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
            f_stop.wait(tick)

    vce_api.add_messages_to_queue = add_messages_to_queue


def simulate(n: int, d: int, rounds: int, tick: float) -> list[Method]:
    todo = methods(n)
    exact = exact_mean(n, d)
    server = ServerApp()

    @server.main()
    def main(grid, context: Context) -> None:
        grid.pull_interval = tick
        for method in todo:
            method.run(grid, context, n, d, rounds, exact)

    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": 2, "num_gpus": 0, "include_dashboard": False},
    }
    run_simulation(server, client_app(d), num_supernodes=n, backend_config=backend)
    return todo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--d", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tick", type=float, default=0.1)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if use_smoke(args):
        args.clients, args.d, args.rounds = [4], 1000, 1
    logging.getLogger("flwr").setLevel(logging.WARNING)
    if args.tick != 0.1:
        set_tick(args.tick)
    emit_machine("bench_flower", tick_s=args.tick, ray_cpus=2, client_cpus=1)
    records = []
    for n in args.clients:
        done = {
            m.name: m.summary(n, args.d, args.tick)
            for m in simulate(n, args.d, args.rounds, args.tick)
        }
        for record in done.values():
            emit(record)
        ours = done["sharefl"]["round_s"]
        vs_secagg = done["secaggplus_complete"]["round_s"] / ours
        vs_fedavg = ours / done["fedavg"]["round_s"]
        record = {
            "kind": "ratio",
            "name": f"sharefl_vs_baselines_n{n}",
            "clients": n,
            "tick_s": args.tick,
            "secaggplus_complete_over_sharefl": vs_secagg,
            "secaggplus_sparse_over_sharefl": done["secaggplus_sparse"]["round_s"] / ours,
            "sharefl_over_fedavg": vs_fedavg,
        }
        if n == 20:
            record["targets"] = "secaggplus_complete_over_sharefl >= 4, sharefl_over_fedavg <= 3"
            record["pass"] = vs_secagg >= 4 and vs_fedavg <= 3
        emit(record)
        records.append(record)
    finish(records)


if __name__ == "__main__":
    main()
