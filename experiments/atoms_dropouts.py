"""What atoms cost under drop-outs: the real in-process protocol, with and without atoms.

Drives :func:`sharefl.protocol.secure_sum` (every client and server step of the protocol,
in this process) for n = 60 clients, cluster size m = 3 and m = 10, R = 1, unsigned mode,
min_sum_size 3, with ``atom_partition`` from :func:`sharefl.protocol.atoms.form_atoms`
(atoms of the floor, 3, drawn once per seed and kept for all its rounds) and without atoms
(per-client clusters, planned afresh every round). In each round every client drops out
independently with probability p (0, 5 %, 20 %) before one protocol stage drawn uniformly
from advertise / share / mask / unmask; the same drop-outs hit the atoms run and the
per-client run of that (seed, round, p), so each pair is compared on equal terms.
Drop-outs are transient (a client is back the next round; a deployment would retire an
atom whose member leaves for good, which this does not model).

Per cell (m, atoms, p), over seeds × rounds, per round: clusters planned and released,
clients whose input is in a released sum (``covered``), clients that dropped, clients
that sent their masked input (``sent``: did not drop before advertise, share or mask; a
client that drops before unmask has sent it) and those of them in no released sum
(``lost_sent``), failed clusters (no sum: too few survivors, or ``withheld`` by the
release check), with the stage at which the failed ones failed. Prints one JSON line per
cell and writes them, with the machine, to a JSON file.

    python experiments/atoms_dropouts.py --out docs/results/atoms/dropouts.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from sharefl.protocol import secure_sum
from sharefl.protocol.atoms import form_atoms

STAGES = ("advertise", "share", "mask", "unmask")


def draw_dropouts(ids: list[int], p: float, rng: np.random.Generator) -> dict[str, list[int]]:
    """Each client drops with probability ``p`` before a uniformly drawn stage."""
    out: dict[str, list[int]] = {}
    for i in ids:
        if rng.random() < p:
            out.setdefault(STAGES[int(rng.integers(len(STAGES)))], []).append(i)
    return out


def mean_std(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 3),
        "std": round(statistics.pstdev(values), 3) if len(values) > 1 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/results/atoms/dropouts.json")
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.05, 0.2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--rounds", type=int, default=10, help="rounds per seed")
    parser.add_argument("--length", type=int, default=16, help="input vector length")
    args = parser.parse_args(argv)

    start_wall, start_cpu = time.time(), time.process_time()
    ids = list(range(args.clients))
    lines = []
    for m in args.sizes:
        for p in args.rates:
            cells: dict[bool, dict[str, list[float]]] = {
                a: {
                    k: []
                    for k in (
                        "planned",
                        "released",
                        "covered",
                        "dropped",
                        "sent",
                        "lost_sent",
                        "failed",
                        "withheld",
                    )
                }
                for a in (False, True)
            }
            audit_leaks = {False: 0, True: 0}
            seconds = {False: 0.0, True: 0.0}
            stages: dict[bool, dict[str, int]] = {False: {}, True: {}}
            for seed in args.seeds:
                atoms, left = form_atoms(ids, 3, np.random.default_rng([seed, 7]))
                assert not left
                for r in range(args.rounds):
                    rng = np.random.default_rng([seed, r, int(p * 1000), m])
                    inputs = {
                        i: rng.integers(0, 2**16, size=args.length, dtype=np.uint32) for i in ids
                    }
                    dropouts = draw_dropouts(ids, p, rng)
                    dropped = {i for v in dropouts.values() for i in v}
                    # clients that sent their masked input (a drop-out before unmask has)
                    sent = set(ids) - {
                        i for st in ("advertise", "share", "mask") for i in dropouts.get(st, ())
                    }
                    for use_atoms in (False, True):
                        t0 = time.perf_counter()
                        result = secure_sum(
                            inputs,
                            cluster_size=m,
                            reclusterings=1,
                            signed=False,
                            min_sum_size=3,
                            seed=int(rng.integers(2**31)),
                            round=r,
                            dropouts=dropouts,
                            atom_partition=atoms if use_atoms else None,
                        )
                        seconds[use_atoms] += time.perf_counter() - t0
                        rec = result.reclusterings[0]
                        covered = {i for c in rec.clusters for i in c.members}
                        for c in rec.clusters:  # released sums are exact
                            want = sum(inputs[i].astype(np.uint64) for i in c.members)
                            assert np.array_equal(c.ring_sum, (want % 2**32).astype(np.uint32))
                        cell = cells[use_atoms]
                        cell["planned"].append(len(rec.clustering.clusters))
                        cell["released"].append(len(rec.clusters))
                        cell["covered"].append(len(covered))
                        assert covered <= sent
                        cell["dropped"].append(len(dropped))
                        cell["sent"].append(len(sent))
                        cell["lost_sent"].append(len(sent - covered))
                        cell["failed"].append(len(rec.failed))
                        cell["withheld"].append(len(rec.withheld))
                        for f in rec.failed:
                            stages[use_atoms][f.stage] = stages[use_atoms].get(f.stage, 0) + 1
                        audit_leaks[use_atoms] += int(result.realised_audit.leaks)
            for use_atoms in (False, True):
                cell = cells[use_atoms]
                line = {
                    "n": len(ids),
                    "m": m,
                    "atoms": use_atoms,
                    "dropout_rate": p,
                    "rounds": len(cell["planned"]),
                    "seeds": args.seeds,
                    **{k: mean_std(v) for k, v in cell.items()},
                    "failed_by_stage": stages[use_atoms],
                    "rounds_with_no_release": sum(1 for v in cell["released"] if v == 0),
                    "realised_audit_leaks": audit_leaks[use_atoms],
                    "protocol_seconds": round(seconds[use_atoms], 2),
                }
                print(json.dumps(line), flush=True)
                lines.append(line)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
        "stages": list(STAGES),
        "settings": {
            "reclusterings": 1,
            "signed": False,
            "min_sum_size": 3,
            "atom_size": 3,
            "input_length": args.length,
        },
        "wall_seconds": round(time.time() - start_wall, 1),
        "cpu_seconds": round(time.process_time() - start_cpu, 1),
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "python": platform.python_version(),
        },
        "cells": lines,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("wall_seconds", "cpu_seconds", "max_rss_mib")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
