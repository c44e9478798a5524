"""Tables of docs/results/distributed-dp.md, from the committed run folders.

Reads ``docs/results/distributed-dp/runs-20/`` (the folders written by ``sharefl simulate
experiments/distributed_dp_mnist.toml --out docs/results/distributed-dp/runs-20``: each has
``config.json``, ``rounds.jsonl``, ``summary.json`` with the commit, command, threads, CPU
capability and BLAS) and the earlier record ``docs/results/distributed-dp/runs.json``
(final accuracies only, 27 Nov 2026), and returns the page's generated blocks:

- ``distributed-dp results``: final test accuracy per mechanism, b and ε (mean ± sample
  std over the seeds; the seeds of each cell), the calibrated σ, wall time;
- ``distributed-dp pooled``: per ε, the continuous Gaussian against the discrete mechanisms
  pooled over b ≥ 16 (both, each alone) and at b = 12: difference and standard errors;
- ``distributed-dp seeds``: every run's final accuracy, accounted ε and wall time;
- ``distributed-dp changes``: every run of the earlier record beside the re-run of the same
  cell and seed;
- ``distributed-dp provenance``: commits, commands, devices, threads, CPU capability, BLAS.

``python experiments/results_pages.py`` writes them into the page (``--check`` compares).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from sharefl.simulator.results import load_runs

RUNS = Path("docs/results/distributed-dp/runs-20")
EARLIER = Path("docs/results/distributed-dp/runs.json")
MECHANISMS = ("gaussian", "discrete_gaussian", "skellam")
NAMES = {
    "gaussian": "continuous Gaussian (float encoding)",
    "discrete_gaussian": "discrete Gaussian",
    "skellam": "Skellam",
}
EPSILONS = (1.0, 2.0, 4.0)


def load(root: Path) -> list[dict[str, Any]]:
    """One row per finished run under ``root / RUNS``."""
    rows = []
    folder = root / RUNS
    for run in load_runs(folder) if folder.is_dir() else []:
        if not run.finished:
            continue
        privacy = run.config["privacy"]
        mechanism = privacy["distributed"]
        rows.append(
            {
                "run_id": run.run_id,
                "label": run.label,
                "mechanism": mechanism,
                "bits": None if mechanism == "gaussian" else int(privacy["bits"]),
                "target": float(privacy["epsilon"]),
                "seed": run.seed,
                "accuracy": 100 * (run.final_accuracy or 0.0),
                "epsilon": run.epsilon,
                "sigma": float(run.extra["privacy"]["noise_multiplier"]),
                "wall": run.wall_seconds,
                "device": run.device,
                "environment": run.extra.get("environment") or {},
            }
        )
    return rows


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return MECHANISMS.index(row["mechanism"]), row["bits"] or 0


def _cells(rows: list[dict[str, Any]]) -> dict[tuple[str, int | None, float], list[dict]]:
    cells: dict[tuple[str, int | None, float], list[dict]] = defaultdict(list)
    for r in rows:
        cells[(r["mechanism"], r["bits"], r["target"])].append(r)
    for runs in cells.values():
        runs.sort(key=lambda r: r["seed"])
    return cells


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def _seed_list(seeds: list[int]) -> str:
    """``1–3`` for a run of consecutive seeds, else ``1, 2, 5``."""
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(map(str, seeds))


def _seeds(runs: list[dict[str, Any]]) -> str:
    seeds = [r["seed"] for r in runs]
    return ("seeds " if len(seeds) > 1 else "seed ") + _seed_list(seeds)


def _walls(seconds: list[float]) -> str:
    lo, hi = min(seconds), max(seconds)
    return f"{lo:.0f} s" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f} s"


def results_table(rows: list[dict[str, Any]]) -> str:
    cells = _cells(rows)
    lines = [
        "| noise | b | σ (calibrated) at ε = 1 / 2 / 4 | ε = 1 | ε = 2 | ε = 4 "
        "| wall time per run |",
        "|---|---|---|---|---|---|---|",
    ]
    kinds = sorted(
        {(r["mechanism"], r["bits"]) for r in rows},
        key=lambda k: (MECHANISMS.index(k[0]), k[1] or 0),
    )
    for mechanism, bits in kinds:
        sigmas, accs, walls = [], [], []
        for eps in EPSILONS:
            runs = cells.get((mechanism, bits, eps), [])
            if not runs:
                sigmas.append("–")
                # the file leaves out what calibration refuses (12 bits at ε = 1: the least ε
                # over every σ is 1.46 in 20 rounds)
                accs.append("unreachable" if bits == 12 and eps == 1.0 else "not run")
                continue
            sigma = {round(r["sigma"], 3) for r in runs}
            sigmas.append("/".join(f"{s:.3f}" for s in sorted(sigma)))
            accs.append(f"{_mean_std([r['accuracy'] for r in runs])} ({_seeds(runs)})")
            walls += [r["wall"] for r in runs]
        b = "32 (ring)" if bits is None else str(bits)
        lines.append(
            f"| {NAMES[mechanism]} | {b} | {' / '.join(sigmas)} | {' | '.join(accs)} | "
            f"{_walls(walls)} |"
        )
    return "\n".join(lines)


def seeds_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| run (label) | seed | final accuracy (%) | accounted ε | σ | wall (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["target"], *_key(r), r["seed"])):
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['accuracy']:.2f} | {r['epsilon']:.4f} | "
            f"{r['sigma']:.4f} | {r['wall']:.1f} |"
        )
    return "\n".join(lines)


def _earlier(root: Path) -> dict[tuple[str, int], float]:
    path = root / EARLIER
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    return {
        (r["label"], int(r["seed"])): float(r["final_accuracy_percent"]) for r in record["runs"]
    }


def changes_table(rows: list[dict[str, Any]], root: Path) -> str:
    earlier = _earlier(root)
    cells = _cells(rows)
    lines = [
        "| cell | seeds | earlier (%) | re-run (%) | earlier mean | re-run mean | "
        "change (points) |",
        "|---|---|---|---|---|---|---|",
    ]
    diffs: dict[bool, list[float]] = {True: [], False: []}  # continuous?
    for _cell, runs in sorted(cells.items(), key=lambda kv: (kv[0][2], *_key(kv[1][0]))):
        label = runs[0]["label"]
        pairs = [(r["seed"], earlier.get((label, r["seed"])), r["accuracy"]) for r in runs]
        seeds = [k for k, o, _ in pairs if o is not None]
        old = [o for _, o, _ in pairs if o is not None]
        new = [n for _, o, n in pairs if o is not None]
        if not old:
            continue
        diffs[runs[0]["mechanism"] == "gaussian"] += [n - o for o, n in zip(old, new, strict=True)]
        change = statistics.fmean(new) - statistics.fmean(old)
        lines.append(
            f"| {label} | {_seed_list(seeds)} | "
            f"{', '.join(f'{o:.2f}' for o in old)} | "
            f"{', '.join(f'{n:.2f}' for n in new)} | {statistics.fmean(old):.1f} | "
            f"{statistics.fmean(new):.1f} | {change:+.1f} |"
        )
    for continuous, name in ((True, "continuous"), (False, "discrete")):
        d = diffs[continuous]
        if not d:
            continue
        same = sum(abs(x) < 0.005 for x in d)
        line = f"{name.capitalize()} runs in both records: {len(d)}, {same} of them with the "
        line += "same final accuracy"
        if same < len(d):
            sd = statistics.stdev(d) if len(d) > 1 else 0.0
            line += (
                f"; the differences run by run have mean {statistics.fmean(d):+.2f} and "
                f"standard deviation {sd:.2f} points, the largest {max(d, key=abs):+.2f}"
            )
        lines += ["", line + "."]
    return "\n".join(lines)


def provenance(rows: list[dict[str, Any]]) -> str:
    def values(key: str) -> str:
        found = sorted({str(r["environment"].get(key)) for r in rows})
        return ", ".join(found) if found else "–"

    commits: dict[str, int] = defaultdict(int)
    for r in rows:
        commits[(r["environment"].get("commit") or "unknown")[:10]] += 1
    commands = sorted({r["environment"].get("command") or "unknown" for r in rows})
    dirty = sorted(
        {
            p
            for r in rows
            for p in r["environment"].get("uncommitted") or []
            if p.startswith("sharefl/")
        }
    )
    eps = {
        t: [r["epsilon"] for r in rows if r["target"] == t]
        for t in EPSILONS
        if any(r["target"] == t for r in rows)
    }
    lines = [
        f"{len(rows)} runs. Commit in their summaries: "
        + ", ".join(f"`{c}` ({n} run{'s' if n > 1 else ''})" for c, n in sorted(commits.items()))
        + (
            "; files of sharefl/ then differing from it in the checkout: "
            + ", ".join(f"`{p}`" for p in dirty)
            if dirty
            else ""
        )
        + ". Commands as the summaries record them (their --out folder since moved to "
        + f"{RUNS.name}/, see above): "
        + "; ".join(f"“{c}”" for c in commands)
        + ".",
        "",
        f"Device {', '.join(sorted({r['device'] for r in rows}))}; CPU {values('cpu')}; "
        f"torch {values('torch')}, {values('torch_threads')} thread(s), CPU capability "
        f"{values('cpu_capability')}, BLAS {values('torch_blas')} (numpy: "
        f"{values('numpy_blas')}); wall time per run {_walls([r['wall'] for r in rows])}.",
        "",
        "Accounted ε (the worst client's): "
        + ", ".join(f"target {t:g}: {min(v):.4f}–{max(v):.4f}" for t, v in eps.items())
        + ".",
    ]
    return "\n".join(lines)


def pooled_table(rows: list[dict[str, Any]]) -> str:
    """Per ε: the continuous Gaussian against the discrete mechanisms pooled over b ≥ 16 (and
    each mechanism alone, and b = 12), with the difference in standard errors."""

    def pick(eps: float, mechanisms: tuple[str, ...], bits: tuple[int | None, ...]) -> list[float]:
        return [
            r["accuracy"]
            for r in rows
            if r["target"] == eps and r["mechanism"] in mechanisms and r["bits"] in bits
        ]

    groups = (
        ("discrete, b ≥ 16 (both mechanisms)", ("discrete_gaussian", "skellam"), (16, 20, 32)),
        ("discrete Gaussian, b ≥ 16", ("discrete_gaussian",), (16, 20, 32)),
        ("Skellam, b ≥ 16", ("skellam",), (16, 20, 32)),
        ("discrete, b = 12 (both mechanisms)", ("discrete_gaussian", "skellam"), (12,)),
    )
    lines = [
        "| ε | continuous Gaussian | group | group's runs | difference (points) | "
        "in standard errors |",
        "|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        base = pick(eps, ("gaussian",), (None,))
        if len(base) < 2:
            continue
        for name, mechanisms, bits in groups:
            group = pick(eps, mechanisms, bits)
            if len(group) < 2:
                continue
            diff = statistics.fmean(group) - statistics.fmean(base)
            se = statistics.variance(group) / len(group) + statistics.variance(base) / len(base)
            lines.append(
                f"| {eps:g} | {_mean_std(base)} ({len(base)} runs) | {name} | "
                f"{_mean_std(group)} ({len(group)} runs) | {diff:+.1f} | "
                f"{diff / se**0.5:+.1f} |"
            )
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    """The page's generated blocks, by name."""
    rows = load(root)
    return {
        "distributed-dp results": results_table(rows),
        "distributed-dp pooled": pooled_table(rows),
        "distributed-dp seeds": seeds_table(rows),
        "distributed-dp changes": changes_table(rows, root),
        "distributed-dp provenance": provenance(rows),
    }


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
