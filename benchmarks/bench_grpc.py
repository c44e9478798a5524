"""Benchmark of a real gRPC deployment against the in-process driver on the same inputs.

Starts ``sharefl serve`` and N ``sharefl client`` processes on loopback (the demo trainer),
one round, clusters of 5, and in the same run computes the same round in one process with
:func:`sharefl.protocol.secure_sum` on the same updates. Prints JSON lines: the machine,
then the round times (the server's own measurement of the round, from the model broadcast
to the last unmasked cluster; process start-up excluded), their ratio, and the bytes each
client sent (protobuf message sizes as received by the server) over d·b/8.

The server's round includes the clients' training (the demo trainer), so the in-process
baseline is timed both ways: the protocol alone (``in_process_round_s``, ``ratio``) and the
same work as the server's round, the trainer's updates then the protocol
(``in_process_with_training_s``, ``ratio_with_training``, which the targets use).

Targets (issue #4), 20 clients, d = 10^6: bytes per client ≤ 1.05 × d·b/8 plus the
key/share traffic; gRPC round ≤ 3× the in-process round; with ``key_setup = "once"`` (the
two-exchange round, measured in the same run, keys set up before the rounds) ≤ 2×. Run:
``python benchmarks/bench_grpc.py [--clients 20] [--d 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import add_smoke_flag, emit, emit_machine, finish, use_smoke

from sharefl.deploy.client import demo_trainer
from sharefl.launch import wait_for_address
from sharefl.protocol import secure_sum
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.settings import KeySetup

HANG_S = 1800
"""Seconds a run may take before it counts as hung: a bound against a hang only (a loaded
machine runs the server and its clients many times slower than an idle one)."""

CONFIG = """
[server]
clients = {clients}
rounds = {rounds}
connect_timeout_s = 120.0
stage_timeout_s = 60.0
[model]
dim = {d}
aggregator = "sum"
[secure_aggregation]
cluster_size = 5
clip = 1.0
key_setup = "{key_setup}"
reproducible_seed = 1  # loopback benchmark: the same clusters every run
"""


def grpc_rounds(clients: int, d: int, rounds: int, folder: Path, key_setup: str) -> dict:
    """Run ``rounds`` rounds with real processes; the server's result.json."""
    config = folder / "deploy.toml"
    config.write_text(CONFIG.format(clients=clients, d=d, rounds=rounds, key_setup=key_setup))
    cli = [sys.executable, "-m", "sharefl.cli"]
    out, port_file = folder / "out", folder / "address"
    serve = [*cli, "serve", "--config", str(config), "--address", "127.0.0.1:0"]
    server = subprocess.Popen(
        [*serve, "--port-file", str(port_file), "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    address = wait_for_address(port_file, server)
    if address is None:
        raise RuntimeError(f"server failed:\n{server.communicate()[1]}")
    procs = [
        subprocess.Popen(
            [*cli, "client", "--server", address, "--id", str(cid)],
            stderr=subprocess.DEVNULL,
        )
        for cid in range(clients)
    ]
    _, log = server.communicate(timeout=HANG_S)
    for proc in procs:
        proc.wait(timeout=HANG_S)
    if server.returncode != 0:
        raise RuntimeError(f"server failed:\n{log}")
    return json.loads((out / "result.json").read_text())


def measure(args: argparse.Namespace, key_setup: str) -> dict:
    """The gRPC rounds and the in-process rounds of one key setup, same updates."""
    with tempfile.TemporaryDirectory() as tmp:
        result = grpc_rounds(args.clients, args.d, args.rounds, Path(tmp), key_setup)
    grpc_times = [r["seconds"] for r in result["rounds"]]
    keys = None
    if key_setup == "once":  # set up before the rounds, as the processes did
        keys = {cid: ClientKeys.generate(cid) for cid in range(args.clients)}
    in_process_times, with_training_times = [], []
    for round_index in range(args.rounds):
        start = time.perf_counter()
        updates = {
            cid: demo_trainer(np.zeros(args.d, np.float32), round=round_index, client_id=cid)
            for cid in range(args.clients)
        }
        trained = time.perf_counter()
        local = secure_sum(
            updates, cluster_size=5, clip=1.0, seed=1, key_setup=key_setup, client_keys=keys
        )
        in_process_times.append(time.perf_counter() - trained)
        with_training_times.append(time.perf_counter() - start)
        assert not local.failed
    in_process = min(in_process_times)
    with_training = min(with_training_times)
    best = min(grpc_times)
    ring_bytes = args.d * 4
    sent = [t["bytes_in"] / args.rounds for t in result["traffic_total"].values()]
    # Key/share traffic: the protocol's messages besides the masked vector itself.
    vector_traffic = ring_bytes * 1.05
    limit = 2 if key_setup == "once" else 3
    return {
        "name": f"grpc_round_vs_in_process_{key_setup}",
        "key_setup": key_setup,
        "exchanges_per_round": KeySetup(key_setup).exchanges(signed=False),
        "clients": args.clients,
        "d": args.d,
        "grpc_round_s": best,
        "grpc_round_s_all": grpc_times,
        "in_process_round_s": in_process,
        "ratio": best / in_process,
        "in_process_with_training_s": with_training,
        "ratio_with_training": best / with_training,
        "bytes_sent_per_client_max": max(sent),
        "bytes_sent_over_d_b_8": max(sent) / ring_bytes,
        "flower_int64_bytes_over_d_b_8": 2.0,
        "clusters_ok": [len(r["clusters"]) for r in result["rounds"]],
        "target": (
            f"bytes <= 1.05 d*b/8 + key/share traffic; round <= {limit}x in-process "
            "(the same work: the trainer's updates and the protocol)"
        ),
        "pass": best <= limit * with_training and max(sent) <= vector_traffic + 4096,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="best round of these counts")
    parser.add_argument("--strict", action="store_true")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if use_smoke(args):
        args.clients, args.d, args.rounds = 5, 1000, 1
    emit_machine("grpc", clients=args.clients, d=args.d, cores_used=os.cpu_count())
    records = [measure(args, key_setup) for key_setup in ("per-cluster", "once")]
    records[1]["round_vs_per_cluster_grpc"] = (
        records[1]["grpc_round_s"] / records[0]["grpc_round_s"]
    )
    for record in records:
        emit(record)
    finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
