"""sharefl against Flower's SecAgg+ and plain FedAvg on Flower's deployment engine: a
SuperLink and N SuperNodes as separate processes on loopback, TLS between them.

For each N in ``--clients`` (default 20 and 50) one deployment comes up (as
``examples/flower_share_message/deploy_local.py`` brings it up: ``sharefl keygen``'s
throwaway CA and server certificate, ``flower-superlink`` with ``--ssl-*``,
``flower-supernode --root-certificates ... --node-config "partition-id=i
num-partitions=N"``) and runs one ``flwr run`` per method, in this order, over the same
SuperNodes, each for one warm-up round and ``--rounds`` measured rounds:

- ``sharefl``: ``ShareflWorkflow(cluster_size=5, clip=1.0)`` with ``sharefl_mod``
  (unsigned, as in ``bench_flower.py``: Flower's SecAgg+ has no signatures either);
- ``sharefl_once``: the same with ``key_setup = "once"`` (the two-exchange round; its key
  stage falls in the warm-up round);
- ``secaggplus_complete``: ``SecAggPlusWorkflow(num_shares=N, reconstruction_threshold=N //
  2 + 1)`` with ``secaggplus_mod`` (a complete graph: SecAgg);
- ``fedavg``: ``DefaultWorkflow``'s fit round, no secure aggregation.

The app is ``bench_flower.py``'s (the legacy API; every client adds a fixed update of d
float32 coordinates, uniform in ±0.5, weight 10 + its partition id, so every method averages
the same updates), written into the work folder as a Flower app. Per method one JSON line:
the round wall time on the server (median over the measured rounds), the server's CPU time
in the workflow's thread, the max error against the exact weighted mean, and the server's
memory: the ServerApp's peak (VmHWM: a fresh process per run), the peak summed RSS of the
SuperLink, its SuperExec and the ServerApp during the run, and the SuperLink's own VmHWM so
far (cumulative over the runs of one deployment: read it in order). Ratios follow.

ClientApps: Flower 1.42's SuperExec starts a ``flwr-clientapp`` process per message and
takes the task back when that process has not reported within 30 s; on a machine with few
cores N concurrent starts exceed that (docs/deployment.md). ``--executor shared`` (the
default) runs one ``warm_superexec.py`` (the example's) for every SuperNode, so the
SuperNodes, the SuperLink and the ServerApp are Flower's and the ClientApps run one at a
time in one warm process; ``--executor flower`` uses Flower's own.

Run: ``python benchmarks/bench_flower_deployment.py [--clients 20 50] [--d 10000]
[--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import add_smoke_flag, emit, emit_machine, finish, use_smoke

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower_share_message"
sys.path.insert(0, str(EXAMPLE))

import deploy_local as dl  # noqa: E402  (the example's deployment helpers)

METHODS = ("sharefl", "sharefl_once", "secaggplus_complete", "fedavg")
BENCH_LINE = re.compile(r"BENCH (\{.*\})")

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "sharefl-bench-deployment"
version = "0.1.0"
description = "bench_flower's app: the same updates under sharefl, SecAgg+ and FedAvg"
license = "Apache-2.0"
dependencies = ["flwr==1.42.0", "sharefl[flower]", "numpy>=1.26"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "sharefl"

[tool.flwr.app.components]
serverapp = "bench_app.server_app:app"
clientapp = "bench_app.client_app:app"

[tool.flwr.app.config]
method = "fedavg"
clients = 4
d = 1000
rounds = 1
"""

CLIENT_APP = '''\
"""bench_flower.py's client: adds a fixed update; SecAgg+ messages go to secaggplus_mod,
the rest to sharefl_mod (which passes what is not its own)."""

import numpy as np
from flwr.app import Context, Message
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

from sharefl.integrations.flower import sharefl_mod


def client_update(pid: int, d: int):
    rng = np.random.default_rng(1000 + pid)
    return rng.uniform(-0.5, 0.5, d).astype(np.float32), 10 + pid


class AddUpdate(NumPyClient):
    def __init__(self, pid: int, d: int):
        self.update, self.weight = client_update(pid, d)

    def fit(self, parameters, config):
        return [parameters[0] + self.update], self.weight, {}


def route(msg: Message, ctxt: Context, call_next) -> Message:
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, ctxt, call_next)
    return sharefl_mod(msg, ctxt, call_next)


def client_fn(context: Context):
    pid = int(context.node_config["partition-id"])
    return AddUpdate(pid, int(context.run_config["d"])).to_client()


app = ClientApp(client_fn=client_fn, mods=[route])
'''

SERVER_APP = '''\
"""bench_flower.py's server: one method (run config ``method``) for a warm-up round and
``rounds`` measured rounds; logs one ``BENCH {json}`` line."""

import json
import statistics
import time
from logging import INFO

import numpy as np
from flwr.app import Context
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.server.workflow.default_workflows import default_fit_workflow

from bench_app.client_app import client_update
from sharefl.integrations.flower import ShareflWorkflow


class Recording(FedAvg):
    sent = None
    aggregated = None

    def configure_fit(self, server_round, parameters, client_manager):
        self.sent = parameters_to_ndarrays(parameters)
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        if failures:
            raise RuntimeError(f"{len(failures)} clients failed: {failures[:1]}")
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        self.aggregated = parameters_to_ndarrays(parameters) if parameters else None
        return parameters, metrics


class Counting:
    """The grid, counting the exchanges (sends of a non-empty batch) of a round."""

    def __init__(self, grid):
        self.grid, self.exchanges = grid, 0

    def push_messages(self, messages):
        messages = list(messages)
        self.exchanges += bool(messages)
        return self.grid.push_messages(messages)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.exchanges += bool(messages)
        return self.grid.send_and_receive(messages, timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.grid, name)


def workflow(method: str, n: int):
    if method == "sharefl":
        return ShareflWorkflow(cluster_size=5, clip=1.0)
    if method == "sharefl_once":
        return ShareflWorkflow(cluster_size=5, clip=1.0, key_setup="once")
    if method == "secaggplus_complete":
        return SecAggPlusWorkflow(
            num_shares=n, reconstruction_threshold=n // 2 + 1, clipping_range=2.0
        )
    if method == "fedavg":
        return None
    raise ValueError(f"unknown method {method!r}")


app = ServerApp()


@app.main()
def main(grid, context: Context) -> None:
    cfg = context.run_config
    method, n = str(cfg["method"]), int(cfg["clients"])
    d, rounds = int(cfg["d"]), int(cfg["rounds"])
    updates = [client_update(pid, d) for pid in range(n)]
    total = sum(w for _, w in updates)
    exact = sum(u.astype(np.float64) * w for u, w in updates) / total
    strategy = Recording(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters([np.zeros(d, np.float32)]),
    )
    inner = workflow(method, n)
    stats = []

    def fit(grid_, ctx):
        counting = Counting(grid_)
        wall, cpu = time.perf_counter(), time.thread_time()
        (inner or default_fit_workflow)(counting, ctx)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        error = float(np.abs(strategy.aggregated[0] - strategy.sent[0] - exact).max())
        stats.append((wall, cpu, error, counting.exchanges))

    legacy = LegacyContext(context, config=ServerConfig(num_rounds=rounds + 1), strategy=strategy)
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
    measured = stats[1:]
    summary = {
        "method": method,
        "round_s": statistics.median(s[0] for s in measured),
        "round_s_all": [round(s[0], 3) for s in measured],
        "warmup_round_s": round(stats[0][0], 3),
        "server_cpu_s": statistics.median(s[1] for s in measured),
        "max_error": max(s[2] for s in stats),
        "exchanges": measured[0][3],
    }
    log(INFO, "BENCH %s", json.dumps(summary))
'''


def write_app(target: Path) -> Path:
    (target / "bench_app").mkdir(parents=True)
    (target / "pyproject.toml").write_text(PYPROJECT)
    (target / "bench_app" / "__init__.py").write_text('"""The benchmark\'s Flower app."""\n')
    (target / "bench_app" / "client_app.py").write_text(CLIENT_APP)
    (target / "bench_app" / "server_app.py").write_text(SERVER_APP)
    return target


def bring_up(work: Path, n: int, executor: str, startup_timeout: float):
    """The deployment (TLS SuperLink, N SuperNodes, their executor), all N online."""
    from sharefl.deploy.keygen import keygen

    bin_dir = Path(sys.executable).parent
    env = dl.flower_env(work)
    keys = keygen(work / "keys", range(n), hosts=("127.0.0.1", "localhost"))
    ports = dl.free_ports(n + 1)
    link_port, node_ports = ports[0], ports[1:]
    dl.write_connection(work / "flwr-home", link_port, keys / "ca.pem")
    deployment = dl.Deployment(work, env, ports)
    superlink = deployment.start(
        "superlink",
        [
            str(bin_dir / "flower-superlink"),
            *("--ssl-ca-certfile", str(keys / "ca.pem")),
            *("--ssl-certfile", str(keys / "server.pem")),
            *("--ssl-keyfile", str(keys / "server.key")),
            *("--host", "127.0.0.1", "--port", str(link_port)),
            "--disable-runtime-dependency-installation",
        ],
    )
    try:
        dl.wait_for_port(link_port, superlink, startup_timeout)
        isolation = ["--isolation", "process"] if executor != "flower" else []
        for i, port in enumerate(node_ports):
            deployment.start(
                f"supernode-{i}",
                [
                    str(bin_dir / "flower-supernode"),
                    *("--root-certificates", str(keys / "ca.pem")),
                    *("--superlink", f"127.0.0.1:{link_port}", "--port", str(port)),
                    *("--node-config", f"partition-id={i} num-partitions={n}"),
                    *isolation,
                ],
            )
        if executor == "shared":
            addresses = [x for p in node_ports for x in ("--runtime-api-address", f"127.0.0.1:{p}")]
            deployment.start(
                "executor-shared",
                [sys.executable, str(EXAMPLE / "warm_superexec.py"), *addresses],
            )
        deadline = time.monotonic() + startup_timeout
        while dl.online_supernodes(str(bin_dir / "flwr"), env) < n:
            if time.monotonic() > deadline:
                raise dl.DeploymentError(f"not all {n} SuperNodes online in {startup_timeout} s")
            time.sleep(2)
    except BaseException:
        deployment.stop()
        raise
    return deployment, superlink, env, str(bin_dir / "flwr")


def run_method(
    app: Path, env, flwr: str, superlink_pid: int, method: str, n: int, d: int, rounds: int
) -> dict[str, Any]:
    config = f"method='{method}' clients={n} d={d} rounds={rounds}"
    with dl.MemoryMonitor(superlink_pid, [], 0.25) as memory:
        started = time.monotonic()
        log = dl.stream(
            [flwr, "run", str(app), dl.CONNECTION, "--stream", "--run-config", config],
            env,
            timeout=3600,
            echo=False,
        )
        run_s = time.monotonic() - started
    match = BENCH_LINE.search(log.text)
    if "Exit Code:" in log.text or not match:
        raise dl.RunFailed(f"{method} at N = {n} failed:\n{log.text[-3000:]}")
    server = memory.server.report()
    return {
        **json.loads(match.group(1)),
        "run_s": round(run_s, 1),
        "serverapp_hwm_mb": server["app_hwm_mb"],
        "server_peak_rss_mb": server["peak_total_rss_mb"],
        "superlink_hwm_mb": server["main_hwm_mb"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--d", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--executor", choices=("shared", "warm", "flower"), default="shared")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS,
        default=list(METHODS),
        help="methods to run (default all); a ratio is printed when both its methods ran",
    )
    add_smoke_flag(parser)
    args = parser.parse_args()
    if use_smoke(args):
        args.clients, args.d, args.rounds = [4], 1000, 1
    emit_machine("bench_flower_deployment", executor=args.executor, tls=True, transport="loopback")
    records = []
    for n in args.clients:
        work = Path(tempfile.mkdtemp(prefix="sharefl-bench-deploy-"))
        try:
            app = write_app(work / "app")
            started = time.monotonic()
            deployment, superlink, env, flwr = bring_up(
                work, n, args.executor, args.startup_timeout
            )
            startup_s = time.monotonic() - started
            try:
                done = {}
                for method in args.methods:
                    record = run_method(
                        app, env, flwr, superlink.pid, method, n, args.d, args.rounds
                    )
                    record = {
                        "kind": "round",
                        "name": f"{method}_n{n}",
                        "clients": n,
                        "d": args.d,
                        "rounds": args.rounds,
                        "startup_s": round(startup_s, 1),
                        **record,
                    }
                    emit(record)
                    done[method] = record
            finally:
                left = deployment.stop()
                if left:
                    raise RuntimeError(f"processes of the deployment survived: {left}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        records += ratio_records(done, n)
    finish(records)


def ratio_records(done: dict[str, dict], n: int) -> list[dict]:
    """The ratio records of one N whose methods all ran (each printed as it is made)."""
    records = []
    if {"sharefl_once", "fedavg"} <= done.keys():
        once = done["sharefl_once"]
        record = {
            "kind": "ratio",
            "name": f"sharefl_once_vs_baselines_deployment_n{n}",
            "clients": n,
            "exchanges": once.get("exchanges"),
            "sharefl_once_over_fedavg_round": once["round_s"] / done["fedavg"]["round_s"],
            "target": "sharefl_once_over_fedavg_round <= 2",
            "pass": once["round_s"] <= 2 * done["fedavg"]["round_s"],
        }
        if "sharefl" in done:
            record["sharefl_over_sharefl_once_round"] = done["sharefl"]["round_s"] / once["round_s"]
        if "secaggplus_complete" in done:
            record["secaggplus_complete_over_sharefl_once_round"] = (
                done["secaggplus_complete"]["round_s"] / once["round_s"]
            )
        emit(record)
        records.append(record)
    if {"sharefl", "secaggplus_complete", "fedavg"} <= done.keys():
        ours = done["sharefl"]
        record = {
            "kind": "ratio",
            "name": f"sharefl_vs_baselines_deployment_n{n}",
            "clients": n,
            "secaggplus_complete_over_sharefl_round": done["secaggplus_complete"]["round_s"]
            / ours["round_s"],
            "sharefl_over_fedavg_round": ours["round_s"] / done["fedavg"]["round_s"],
            "secaggplus_complete_over_sharefl_serverapp_mem": done["secaggplus_complete"][
                "serverapp_hwm_mb"
            ]
            / ours["serverapp_hwm_mb"],
            "sharefl_over_fedavg_serverapp_mem": ours["serverapp_hwm_mb"]
            / done["fedavg"]["serverapp_hwm_mb"],
            "median_round_s": {m: done[m]["round_s"] for m in done},
        }
        emit(record)
        records.append(record)
    return records


if __name__ == "__main__":
    main()
