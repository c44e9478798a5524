"""Where the protocol's time goes in one SHARE round: a per-stage breakdown.

The simulator reports only each round's wall time (``rounds.jsonl``'s ``seconds``). This
script times the aggregation step alone, with the settings of
``experiments/share_mnist_protocol_cell.toml`` (its ``[secure_aggregation]`` table: m = 3,
R = 10 reclusterings from the safe planner, 32-bit ring, clip 100), on inputs of the cell's
shape (60 clients, the 784-100-10 MLP's d = 79,510 float32 coordinates):

- :func:`sharefl.protocol.driver.secure_sum` with ``protocol=False`` (encode, plan, add each
  cluster's ring vectors in the clear: what the figures run);
- the same call with ``protocol=True`` and an ``observer`` that receives the wall time of
  every client step (``advertise``, ``share``, ``mask``, ``unmask``) and every server stage
  close (by the stage it closes), summed here per stage over the round.

It checks that both calls release the same ring sums (bit for bit), and prints the mean per
round of: the clear and the protocol call's wall and CPU (process) time, the protocol's
overhead per round and per client (wall), and the per-stage wall-time totals (the stages
observed are client and server steps; the rest of the protocol call is encoding, planning
and setting up the clients' sessions). Values are random N(0, 0.01²) floats:
the protocol's work does not depend on them.

    OMP_NUM_THREADS=1 python experiments/share_protocol_stages.py --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import json
import time
import tomllib
from pathlib import Path

import numpy as np

from sharefl.protocol.driver import secure_sum
from sharefl.protocol.settings import SecureAggregationSettings

CELL = Path(__file__).with_name("share_mnist_protocol_cell.toml")
SIMULATOR_ONLY = {"enabled", "clustering"}  # keys of the simulator's table, not the protocol's


def cell_settings(path: Path = CELL) -> SecureAggregationSettings:
    """The protocol's settings of the cell file's ``[secure_aggregation]`` table."""
    table = tomllib.loads(path.read_text())["secure_aggregation"]
    return SecureAggregationSettings(**{k: v for k, v in table.items() if k not in SIMULATOR_ONLY})


def one_round(
    inputs: dict[int, np.ndarray], settings: SecureAggregationSettings, seed: int, round: int
) -> dict[str, float]:
    """Time one round both ways; raise ``AssertionError`` if the released sums differ."""
    start, cpu = time.perf_counter(), time.process_time()
    clear = secure_sum(inputs, settings, seed=seed, round=round, protocol=False)
    clear_s, clear_cpu = time.perf_counter() - start, time.process_time() - cpu
    stages: dict[str, float] = collections.defaultdict(float)

    def observe(stage: str, actor: int | None, seconds: float) -> None:
        stages[f"{'server' if actor is None else 'clients'} {stage}"] += seconds

    start, cpu = time.perf_counter(), time.process_time()
    secure = secure_sum(inputs, settings, seed=seed, round=round, observer=observe)
    secure_s, secure_cpu = time.perf_counter() - start, time.process_time() - cpu
    released = 0
    for a, b in zip(clear.reclusterings, secure.reclusterings, strict=True):
        assert [s.members for s in a.clusters] == [s.members for s in b.clusters]
        for x, y in zip(a.clusters, b.clusters, strict=True):
            assert x.ring_sum.tobytes() == y.ring_sum.tobytes(), "ring sums differ"
            released += 1
    return {
        "clear": clear_s,
        "protocol": secure_s,
        "clear cpu": clear_cpu,
        "protocol cpu": secure_cpu,
        "released_sums": released,
        **stages,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--dim", type=int, default=79_510)
    parser.add_argument("--json", type=Path, help="also write the per-round timings here")
    args = parser.parse_args(argv)
    settings = cell_settings()
    rng = np.random.default_rng(0)
    inputs = {cid: rng.normal(0, 0.01, args.dim).astype(np.float32) for cid in range(args.clients)}
    rounds = [one_round(inputs, settings, seed=r, round=r) for r in range(args.rounds)]
    keys = sorted({k for r in rounds for k in r})
    mean = {k: float(np.mean([r.get(k, 0.0) for r in rounds])) for k in keys}
    overhead = mean["protocol"] - mean["clear"]
    overhead_cpu = mean["protocol cpu"] - mean["clear cpu"]
    print(f"settings: {settings}")
    print(f"{args.clients} clients, d = {args.dim}, {args.rounds} rounds; mean per round (s):")
    for k in keys:
        print(f"  {k:24s} {mean[k]:9.3f}")
    print(
        f"protocol overhead: {overhead:.3f} s per round, "
        f"{overhead / args.clients * 1e3:.1f} ms per client per round, "
        f"{overhead / (args.clients * settings.reclusterings) * 1e3:.2f} ms per client per "
        "reclustering (wall); "
        f"CPU: {overhead_cpu:.3f} s per round, {overhead_cpu / args.clients * 1e3:.1f} ms per "
        "client per round; released ring sums identical in every round"
    )
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "mean": mean}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
