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

A second simulation per N runs the Message API (``@app.train()`` clients):

- ``sharefl_message``: ``ShareflStrategy(FedAvg(...))`` with the same options, behind
  ``sharefl_mod``; ``sharefl_message_once`` the same with ``key_setup = "once"`` (the
  two-exchange round; ``sharefl_once`` likewise beside ``sharefl`` in the first
  simulation): its keys are set up in the warm-up round;
- ``fedavg_message``: Flower's Message-API ``FedAvg``, no secure aggregation.

(Flower 1.42 has no Message-API SecAgg+: the Message-API path is compared with the legacy
SecAgg+ of the first simulation, same process and machine, and with its own FedAvg.)

Every client trains by adding a fixed update (d float32 coordinates, uniform in ±0.5, weight
10 + its partition id) to the parameters it received, so every method averages the same
updates. Per method it prints one JSON line: the round wall time (median over the measured
rounds, from the fit workflow's start to its end on the server), the server's CPU time in
the thread that runs the workflow (the protocol, encoding and Flower's message handling;
Ray's client processes excluded), the client time (the client app's own time over every
message of the round, averaged over the clients), the number of message exchanges and the
median time of each (from its send to its last reply), and the max error of the new
parameters against the exact weighted mean of the updates. Ratios against
``secaggplus_complete`` and ``fedavg`` of the same run follow.

Flower polls: its in-memory grid sleeps ``pull_interval`` (0.1 s) between pulls for replies,
and the simulation runtime looks for new messages every 0.1 s. Every exchange of a
multi-stage protocol therefore waits up to two ticks. ``--tick`` sets both (the second by
replacing ``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue`` with a copy
whose wait is ``--tick``); the tick is printed with the results.

Targets, N = 20, d = 10^5, Flower's tick: sharefl's round (either API) ≥ 5× faster than
SecAgg+ complete graph and ≤ 1.5× plain FedAvg's of the same API; the two-exchange round
(``*_once``) ≥ 4× and ≤ 1.5×. Each ratio record carries the steady-state exchanges. Run:
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
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
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
from flwr.serverapp.strategy import FedAvg as MessageFedAvg
from flwr.simulation import run_simulation

from sharefl.integrations.flower import ShareflStrategy, ShareflWorkflow, sharefl_mod

SHAREFL_OPTIONS = {"cluster_size": 5, "clip": 1.0}
KEY_SETUP = {
    "sharefl_once": {"key_setup": "once"},
    "sharefl_message_once": {"key_setup": "once"},
}
"""The two-exchange variants: keys set up once (in the warm-up round, not measured)."""

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


def message_client_app(d: int) -> ClientApp:
    """The same clients written with the Message API: ``@app.train()`` adds the update."""
    app = ClientApp(mods=[route])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        update, weight = client_update(int(context.node_config["partition-id"]), d)
        received = msg.content["arrays"].to_numpy_ndarrays()
        reply = RecordDict(
            {
                "arrays": ArrayRecord([received[0] + update]),
                "metrics": MetricRecord({"num-examples": weight}),
            }
        )
        return Message(reply, reply_to=msg)

    return app


# ---- the server ---------------------------------------------------------------------------


class TimingGrid:
    """The grid, counting exchanges, timing each (from its push to its last reply pulled)
    and summing the clients' reported seconds."""

    def __init__(self, grid):
        self._grid = grid
        self.exchanges = 0
        self.client_s = 0.0
        self.exchange_s: list[float] = []
        self._pushed = 0.0

    def start_round(self) -> None:
        self.exchanges, self.client_s, self.exchange_s = 0, 0.0, []

    def send_and_receive(self, messages, *, timeout=None):
        """Flower's own wait (its workflows and strategies)."""
        messages = list(messages)
        self.exchanges += bool(messages)  # ``Strategy.start`` also sends empty lists
        start = time.perf_counter()
        replies = self._timed(self._grid.send_and_receive(messages, timeout=timeout))
        if messages:
            self.exchange_s.append(time.perf_counter() - start)
        return replies

    def push_messages(self, messages):
        """sharefl's wait (``send_and_collect``) pushes once per exchange, then pulls."""
        messages = list(messages)
        if messages:
            self.exchanges += 1
            self.exchange_s.append(0.0)
            self._pushed = time.perf_counter()
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids):
        replies = self._timed(self._grid.pull_messages(message_ids))
        if replies and self.exchange_s:
            self.exchange_s[-1] = time.perf_counter() - self._pushed
        return replies

    def _timed(self, replies):
        replies = list(replies)
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
    exchange_s: tuple[float, ...] = ()


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
    make: Callable[[], Callable | None] = lambda: None  # the fit workflow; None: FedAvg's
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
            timing.start_round()
            wall, cpu = time.perf_counter(), time.thread_time()
            (inner or default_fit_workflow)(timing, ctx)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            assert strategy.sent is not None and strategy.aggregated is not None
            error = float(np.abs(strategy.aggregated[0] - strategy.sent[0] - exact).max())
            self.stats.append(
                RoundStats(
                    wall,
                    cpu,
                    timing.client_s / n,
                    timing.exchanges,
                    error,
                    tuple(timing.exchange_s),
                )
            )

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
            "exchange_s": [  # the median of each exchange of the round, in order
                med(s.exchange_s[i] for s in measured)
                for i in range(min(len(s.exchange_s) for s in measured))
            ],
            "max_error": max(s.max_error for s in self.stats),
        }


class TimedRounds:
    """Mixin for a Message-API strategy: one :class:`RoundStats` per round, from
    ``configure_train`` (where ``ShareflStrategy`` runs its whole secure round) to the end
    of ``aggregate_train`` (where ``FedAvg`` averages the replies it got in between)."""

    def __init__(
        self,
        *args: Any,
        timing: TimingGrid,
        stats: list,
        exact: np.ndarray,
        clients: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._timing, self._stats, self._exact, self._clients = timing, stats, exact, clients

    def configure_train(self, server_round, arrays, config, grid):
        self._timing.start_round()
        self._sent = arrays.to_numpy_ndarrays()[0]
        self._clock = (time.perf_counter(), time.thread_time())
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        wall, cpu = time.perf_counter() - self._clock[0], time.thread_time() - self._clock[1]
        if arrays is None:
            raise RuntimeError(f"round {server_round} aggregated nothing")
        error = float(np.abs(arrays.to_numpy_ndarrays()[0] - self._sent - self._exact).max())
        client_s = self._timing.client_s / self._clients
        self._stats.append(
            RoundStats(
                wall, cpu, client_s, self._timing.exchanges, error, tuple(self._timing.exchange_s)
            )
        )
        return arrays, metrics


class TimedFedAvg(TimedRounds, MessageFedAvg):
    pass


class TimedSharefl(TimedRounds, ShareflStrategy):
    pass


@dataclass
class MessageMethod(Method):
    """A Message-API strategy run by its own ``start`` for a warm-up and ``rounds`` rounds."""

    def run(self, grid, context: Context, n: int, d: int, rounds: int, exact: np.ndarray):
        timing = TimingGrid(grid)
        fedavg = {
            "fraction_train": 1.0,
            "fraction_evaluate": 0.0,
            "min_train_nodes": n,
            "min_available_nodes": n,
        }
        timed = {"timing": timing, "stats": self.stats, "exact": exact, "clients": n}
        if self.name.startswith("sharefl_message"):
            options = {**SHAREFL_OPTIONS, **KEY_SETUP.get(self.name, {})}
            strategy = TimedSharefl(MessageFedAvg(**fedavg), **timed, **options)
        else:
            strategy = TimedFedAvg(**timed, **fedavg)
        initial = ArrayRecord([np.zeros(d, np.float32)])
        strategy.start(grid=timing, initial_arrays=initial, num_rounds=rounds + 1)


def message_methods() -> list[Method]:
    return [
        MessageMethod("sharefl_message"),
        MessageMethod("sharefl_message_once"),
        MessageMethod("fedavg_message"),
    ]


def methods(n: int) -> list[Method]:
    return [
        Method("sharefl", lambda: ShareflWorkflow(**SHAREFL_OPTIONS)),
        Method(
            "sharefl_once", lambda: ShareflWorkflow(**SHAREFL_OPTIONS, **KEY_SETUP["sharefl_once"])
        ),
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


def simulate(n: int, d: int, rounds: int, tick: float, api: str = "legacy") -> list[Method]:
    """One ``run_simulation`` of ``n`` clients running every method of ``api`` in turn."""
    todo = methods(n) if api == "legacy" else message_methods()
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
    clients = client_app(d) if api == "legacy" else message_client_app(d)
    run_simulation(server, clients, num_supernodes=n, backend_config=backend)
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
            for api in ("legacy", "message")
            for m in simulate(n, args.d, args.rounds, args.tick, api)
        }
        for record in done.values():
            emit(record)
        secagg = done["secaggplus_complete"]["round_s"]
        pairs = (
            ("sharefl", "fedavg"),
            ("sharefl_message", "fedavg_message"),
            ("sharefl_once", "fedavg"),
            ("sharefl_message_once", "fedavg_message"),
        )
        for ours, fedavg in pairs:
            vs_secagg = secagg / done[ours]["round_s"]
            vs_fedavg = done[ours]["round_s"] / done[fedavg]["round_s"]
            record = {
                "kind": "ratio",
                "name": f"{ours}_vs_baselines_n{n}",
                "clients": n,
                "tick_s": args.tick,
                f"secaggplus_complete_over_{ours}": vs_secagg,
                f"secaggplus_sparse_over_{ours}": done["secaggplus_sparse"]["round_s"]
                / done[ours]["round_s"],
                f"{ours}_over_{fedavg}": vs_fedavg,
            }
            record["exchanges"] = done[ours]["exchanges"]
            if n == 20:
                least = 4 if ours in KEY_SETUP else 5
                record["targets"] = (
                    f"secaggplus_complete_over_{ours} >= {least}, {ours}_over_{fedavg} <= 1.5"
                )
                record["pass"] = vs_secagg >= least and vs_fedavg <= 1.5
            emit(record)
            records.append(record)
    finish(records)


if __name__ == "__main__":
    main()
