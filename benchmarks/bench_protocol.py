"""Benchmark of the in-process secure aggregation against its PRG floor.

Prints JSON lines: the machine, then per scenario the client masking time, the server
unmasking time and the whole round, each with the raw AES-128-CTR keystream time for the
same number of mask bytes (the floor) measured in the same run, and upload bytes per
client over d·b/8. Run: ``python benchmarks/bench_protocol.py`` (``--d`` to change the
vector length, ``--strict`` to exit 1 on a missed target).

Targets (issue #3), n = 100, d = 10^6, b = 32, 10% of clients drop after key sharing:
- clusters of 8: client masking ≤ 2× its PRG floor and ≤ 12 ms; server unmasking ≤ 0.2 s;
  whole in-process round for all 100 clients ≤ 2 s;
- plain SecAgg (one cluster of 100): server unmasking ≤ 3 s. The issue names t = 50; clients
  refuse t ≤ n/2 (two disjoint halves could then be asked for both secrets of a peer), so
  this runs t = 51, one share more per secret.
Flower's SecAgg+ measured on the same kind of machine: client 49 ms, server 1.6 s, round
13.7 s; its full SecAgg server 116 s. Numpy's default allocator; buffers are reused.

``clusters_of_8_keys_once`` runs the same round with ``key_setup = "once"`` (the
two-exchange round, keys made before the round as clients keep them) and reports its
exchanges per round and its time over the per-cluster round of the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import defaultdict

import numpy as np
from common import add_smoke_flag, emit, emit_machine, finish, timeit, use_smoke
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from sharefl.crypto.aead import OVERHEAD_BYTES
from sharefl.crypto.shamir import SHARE_BYTES
from sharefl.protocol import secure_sum
from sharefl.protocol.bundles import SEALED_BYTES, dealt_bytes
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.settings import KeySetup


def keystream_seconds(nbytes: int, repeat: int) -> float:
    """Best time of one AES-128-CTR keystream of ``nbytes`` into a preallocated buffer."""
    zeros, out = bytes(nbytes), bytearray(nbytes + 15)
    key, nonce = os.urandom(16), os.urandom(16)

    def run() -> None:
        Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update_into(zeros, out)

    return timeit(run, repeat=repeat)["best_s"]


def run_scenario(name, n, d, cluster_size, threshold, drop_fraction, floor_one, key_setup=None):
    rng = np.random.default_rng(0)
    inputs = {cid: rng.integers(0, 2**32, size=d, dtype=np.uint32) for cid in range(n)}
    dropped = sorted(rng.choice(n, size=int(drop_fraction * n), replace=False).tolist())
    times: dict[str, list[float]] = defaultdict(list)
    client_mask: list[float] = []
    server_unmask: list[float] = []

    def observer(stage, actor, seconds):
        if actor is None:
            times[f"server_{stage}"].append(seconds)
            if stage == "unmask":
                server_unmask.append(seconds)
        else:
            times[f"client_{stage}"].append(seconds)
            if stage == "mask":
                client_mask.append(seconds)

    setup = KeySetup(key_setup or KeySetup.PER_CLUSTER)
    keys = None
    if setup is KeySetup.ONCE:  # set up once, before the round, as clients keep them
        keys = {cid: ClientKeys.generate(cid) for cid in range(n)}
    start = time.perf_counter()
    result = secure_sum(
        inputs,
        cluster_size=cluster_size,
        threshold=threshold,
        dropouts={"mask": dropped},
        seed=1,
        observer=observer,
        key_setup=setup,
        client_keys=keys,
    )
    round_s = time.perf_counter() - start
    assert not result.failed, result.failed
    total = sum(inputs[c] for c in range(n) if c not in dropped)
    assert np.array_equal(sum(c.ring_sum for c in result.clusters), total), "wrong sum"

    sizes = [len(c) for c in result.reclusterings[0].clustering.clusters]
    peers = statistics.median(s - 1 for s in sizes)
    # Client floor: one keystream per mask it adds (self mask + one per peer that shared).
    client_floor = (1 + peers) * floor_one
    # Server floor: one keystream per survivor (self mask) and per (dropped, survivor) pair.
    server_prgs = 0
    for cluster in result.clusters:
        survivors = len(cluster.members)
        server_prgs += survivors + len(cluster.dropped) * survivors
    server_floor = server_prgs * floor_one
    mask_median = statistics.median(client_mask)
    unmask_total = sum(server_unmask)
    # Upload per client: advertisement + bundles to peers + masked vector + unmask reply.
    if setup is KeySetup.ONCE:  # commitments, bundles of b_u and pair-seed shares, reply
        advert = (1 + peers) * 32
        bundles = peers * dealt_bytes(int(peers))
        unmask = (peers + 1) * SHARE_BYTES * (1 + drop_fraction * peers)
    else:
        advert = 3 * 32  # two X25519 public keys and the seed commitment (unsigned mode)
        bundles = peers * SEALED_BYTES
        unmask = peers * SHARE_BYTES + SHARE_BYTES
    upload = int(advert + bundles + 4 * d + unmask)
    return {
        "name": name,
        "key_setup": setup.value,
        "exchanges_per_round": setup.exchanges(signed=False),
        "n": n,
        "d": d,
        "cluster_sizes": sorted(set(sizes)),
        "threshold": threshold,
        "dropped": len(dropped),
        "client_mask_median_s": mask_median,
        "client_mask_floor_s": client_floor,
        "client_mask_vs_floor": mask_median / client_floor,
        "server_unmask_s": unmask_total,
        "server_unmask_floor_s": server_floor,
        "server_unmask_vs_floor": unmask_total / server_floor,
        "round_s": round_s,
        "upload_bytes_per_client": upload,
        "upload_over_d_b_8": upload / (4 * d),
        "aead_overhead_bytes": OVERHEAD_BYTES,
        "stage_seconds": {k: sum(v) for k, v in sorted(times.items())},
    }


def emit_keystream_floor(d: int) -> float:
    """Time (best of 30) and print the raw AES-128-CTR keystream of one d-word uint32 mask,
    the PRG floor of one mask; returns the seconds."""
    floor_one = keystream_seconds(4 * d, 30)
    emit({"name": "aes128_ctr_keystream", "kind": "baseline", "bytes": 4 * d, "best_s": floor_one})
    return floor_one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=1_000_000)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--quick", action="store_true", help="skip plain SecAgg")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if use_smoke(args):
        args.d, args.quick = 4096, True
    emit_machine("protocol", d=args.d)
    floor_one = emit_keystream_floor(args.d)
    records = []
    r = run_scenario("clusters_of_8", 100, args.d, 8, None, 0.10, floor_one)
    r.update(
        target="client mask <= 2x floor and <= 0.012 s; server unmask <= 0.2 s; round <= 2 s",
        **{
            "pass": r["client_mask_vs_floor"] <= 2.0
            and r["client_mask_median_s"] <= 0.012
            and r["server_unmask_s"] <= 0.2
            and r["round_s"] <= 2.0
        },
    )
    records.append(r)
    emit(r)
    once = run_scenario("clusters_of_8_keys_once", 100, args.d, 8, None, 0.10, floor_one, "once")
    once.update(
        baseline="clusters_of_8",
        round_vs_per_cluster=once["round_s"] / r["round_s"],
        target="2 exchanges a round (unsigned), the in-process round within 1.2x of per-cluster",
        **{"pass": once["exchanges_per_round"] == 2 and once["round_s"] <= 1.2 * r["round_s"]},
    )
    records.append(once)
    emit(once)
    if not args.quick:
        r = run_scenario("plain_secagg", 100, args.d, 100, 51, 0.10, floor_one)
        r.update(target="server unmask <= 3 s", **{"pass": r["server_unmask_s"] <= 3.0})
        records.append(r)
        emit(r)
    finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
