"""SHARE's leak audit alone: how often R reclusterings of n clients into clusters of m leak.

For each cell (cluster size m, reclusterings R, planner) the script draws ``--draws`` plans
of one round — the paper's R independent random partitions
(:func:`~sharefl.protocol.clustering.random_reclusterings`) or the safe planner's
(:func:`~sharefl.protocol.audit.sample_safe_reclusterings`) — and audits each exactly
(:func:`~sharefl.protocol.audit.audit`: rank over the rationals, then the search for sums of
fewer than ``--min-sum-size`` clients the server can solve for). It prints a Markdown table
(draws that leak, median rank, median number of individually solvable updates) and, with
``--json``, writes every draw's figures, the settings, the wall time and the run's
environment. Draw d of a cell is seeded by (``--seed``, m, R, planner, d), so a rerun
prints the same table::

    python experiments/share_audit_draws.py --draws 20 --json docs/results/share/audit-draws.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from sharefl.protocol.audit import audit, sample_safe_reclusterings
from sharefl.protocol.clustering import random_reclusterings
from sharefl.simulator.provenance import run_environment

RANDOM_CELLS = tuple((m, r) for m in (3, 5, 10) for r in (1, 2, 3, 4, 5, 10))
SAFE_CELLS = ((3, 10), (5, 10), (10, 10))
PLANNERS = {"random": 0, "safe": 1}  # the planner's part of a draw's seed


def draw(
    clients: int, m: int, r: int, planner: str, seed: int, index: int, min_sum_size: int
) -> dict:
    """Plan ``index`` of the cell, audited: whether it leaks, its rank, the solvable updates."""
    rng = np.random.default_rng([seed, m, r, PLANNERS[planner], index])
    ids = list(range(clients))
    if planner == "random":
        plan = random_reclusterings(ids, m, r, rng)
    else:
        plan = sample_safe_reclusterings(ids, m, r, rng, min_sum_size=min_sum_size)
    report = audit(plan, min_sum_size=min_sum_size)
    return {
        "leaks": report.leaks,
        "rank": report.rank,
        "solvable": len(report.recoverable_clients),
        "complete": report.complete,
    }


def cells(args: argparse.Namespace) -> list[dict]:
    rows = []
    todo = [(m, r, "random") for m, r in RANDOM_CELLS] + [(m, r, "safe") for m, r in SAFE_CELLS]
    for m, r, planner in todo:
        draws = [
            draw(args.clients, m, r, planner, args.seed, d, args.min_sum_size)
            for d in range(args.draws)
        ]
        rows.append(
            {
                "m": m,
                "R": r,
                "planner": planner,
                "draws": draws,
                "leaking": sum(d["leaks"] for d in draws),
                "median_rank": statistics.median(d["rank"] for d in draws),
                "median_solvable": statistics.median(d["solvable"] for d in draws),
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| m | R | planner | draws that leak | median rank | median updates solvable |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['m']} | {row['R']} | {row['planner']} | {row['leaking']}/{len(row['draws'])} "
            f"| {row['median_rank']:g} | {row['median_solvable']:g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20, help="plans audited per cell")
    parser.add_argument("--clients", type=int, default=60, help="n (the paper's: 60)")
    parser.add_argument("--min-sum-size", type=int, default=3, help="smaller sums leak")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write every draw, with the settings")
    args = parser.parse_args(argv)
    if args.draws < 1:
        parser.error("--draws must be >= 1")
    started = time.perf_counter()
    rows = cells(args)
    document = {
        "experiment": "SHARE leak audit: random and safe reclusterings",
        "settings": vars(args),
        "cells": rows,
        "wall_seconds": round(time.perf_counter() - started, 1),
        "environment": run_environment(),
    }
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1, default=str) + "\n")  # Path: str
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
