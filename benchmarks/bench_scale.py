"""Benchmark of one in-process secure round as the number of clients grows.

Prints JSON lines: the machine, then for n = 10^2, 10^3, 10^4 clients (d = 10^3 uint32
words, clusters of 5, R = 1) the whole round (:func:`sharefl.protocol.secure_sum`), its cost
per client, where the time goes (each client step and server stage, summed over the
actors, from the driver's observer), and two baselines measured in the same run:

- the same round with ``protocol=False`` (the same plan and ring sums added in the clear):
  what a round costs without secure aggregation;
- the X25519 floor: the round's number of key agreements (two per pair of cluster members
  and direction: one for the pair's mask seed, one for the key that seals its share
  bundles) times one agreement's best time, the part of the round no implementation of
  this protocol avoids.

Target (issue 27): n = 10^4 in ≤ 15 s on a 2-core machine, and a cost per client that does
not grow with n (clusters are independent). Run: ``python benchmarks/bench_scale.py``
(``--strict`` exits 1 on a missed target).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from common import add_smoke_flag, emit, emit_machine, finish, timeit, use_smoke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from sharefl.protocol import secure_sum

CLUSTER_SIZE = 5
D = 1000


def agreement_seconds() -> float:
    """Best time of one X25519 key agreement."""
    mine, theirs = X25519PrivateKey.generate(), X25519PrivateKey.generate().public_key()
    return timeit(lambda: mine.exchange(theirs), repeat=200)["best_s"]


def run(n: int, d: int, agreement_s: float) -> dict:
    rng = np.random.default_rng(0)
    inputs = {cid: rng.integers(0, 2**32, size=d, dtype=np.uint32) for cid in range(n)}
    stages: dict[str, float] = defaultdict(float)

    def observer(stage: str, actor: int | None, seconds: float) -> None:
        stages[f"{'server' if actor is None else 'client'}_{stage}"] += seconds

    start = time.perf_counter()
    result = secure_sum(inputs, cluster_size=CLUSTER_SIZE, seed=1, observer=observer)
    round_s = time.perf_counter() - start
    total = np.zeros(d, dtype=np.uint32)
    for cid in range(n):
        total += inputs[cid]
    assert np.array_equal(sum(c.ring_sum for c in result.clusters), total), "wrong sum"

    start = time.perf_counter()
    clear = secure_sum(inputs, cluster_size=CLUSTER_SIZE, seed=1, protocol=False)
    clear_s = time.perf_counter() - start
    assert [c.ring_sum.tolist() for c in clear.clusters] == [
        c.ring_sum.tolist() for c in result.clusters
    ], "the clear sums differ"

    sizes = [len(c) for c in result.reclusterings[0].clustering.clusters]
    agreements = sum(2 * s * (s - 1) for s in sizes)  # 2 per ordered pair of members
    floor_s = agreements * agreement_s
    return {
        "name": f"n={n}",
        "n": n,
        "d": d,
        "cluster_sizes": sorted(set(sizes)),
        "round_s": round_s,
        "ms_per_client": 1e3 * round_s / n,
        "clear_round_s": clear_s,
        "round_over_clear": round_s / clear_s,
        "x25519_agreements": agreements,
        "x25519_floor_s": floor_s,
        "round_over_x25519_floor": round_s / floor_s,
        "stage_seconds": {k: round(v, 4) for k, v in sorted(stages.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strict", action="store_true")
    add_smoke_flag(parser)
    args = parser.parse_args()
    sizes, d = ((20, 50), 64) if use_smoke(args) else ((100, 1000, 10_000), D)
    emit_machine("scale", d=d, cluster_size=CLUSTER_SIZE)
    agreement_s = agreement_seconds()
    emit({"name": "x25519_agreement", "kind": "baseline", "best_s": agreement_s})
    records = [run(n, d, agreement_s) for n in sizes]
    for r in records:
        emit(r)
    largest, smallest = records[-1], records[0]
    growth = largest["ms_per_client"] / smallest["ms_per_client"]
    summary = {
        "name": "scale",
        "per_client_growth": growth,
        "target": "n = 10^4 in <= 15 s; cost per client at the largest n <= 1.5x the smallest",
        "pass": largest["n"] == 10_000 and largest["round_s"] <= 15.0 and growth <= 1.5,
    }
    emit(summary)
    finish([summary], strict=args.strict)


if __name__ == "__main__":
    main()
