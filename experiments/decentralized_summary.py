"""Tables of the decentralized MNIST runs (seed004) for docs/results/decentralized.md.

Reads the run folders written by ``sharefl simulate experiments/decentralized_mnist_*.toml
--out DIR`` and prints Markdown: per split, one row per (attack, rule, C) with the test
accuracy and loss of the average honest model x̄ and the consensus error H at iteration
``--at`` (default 1,000: the attacked runs' last; the no-attack runs ran 2,000 and their
iteration-1,000 record is the same computation), their final values, wall time and device,
and the largest ε per honest agent (RDP accountant and Theorem 3). With ``--last N`` it adds
the lowest and highest accuracy of the last N evaluations (how steady the end of a run is)
and prints the seed of every row (the 50,000-iteration runs have seeds 1-3 for some cells).

Usage::

    python experiments/decentralized_summary.py DIR [--at 1000] [--last 20] [--json out.json]
    python experiments/decentralized_summary.py docs/results/decentralized/runs-50k \
        --at 50000 --last 20
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sharefl.simulator.report import load_runs

RUNS_50K = Path("docs/results/decentralized/runs-50k")  # the page's table: --at 1000 --last 20
ATTACKS = ("none", "gaussian", "sign_flipping", "isolating")
RULES = ("mean", "trimmed_mean", "scc", "ios")


def rows_of(directory: Path, at: int, last_n: int = 0) -> list[dict]:
    rows = []
    for run in load_runs(directory):
        if not run.finished or not run.name.startswith("decentralized_mnist_"):
            continue
        cfg = run.config
        dec, attack = cfg["decentralized"], cfg["attack"]["name"]
        point = next((r for r in run.rounds if r.round == at), None)
        last = run.rounds[-1]
        tail = [r.accuracy for r in run.rounds[-last_n:]] if last_n else []
        agents = (run.extra.get("privacy") or {}).get("agents") or {}
        rows.append(
            {
                "split": "iid" if dec["split"] == "iid" else "non-iid",
                "attack": attack,
                "rule": dec["rule"],
                "seed": cfg["seed"],
                "tail_min": min(tail) if tail else None,
                "tail_max": max(tail) if tail else None,
                "C": dec["noise"],
                "accuracy": point.accuracy if point else None,
                "loss": point.loss if point else None,
                "H": point.extra.get("consensus_error") if point else None,
                "rounds": last.round,
                "final_accuracy": last.accuracy,
                "final_loss": last.loss,
                "final_H": last.extra.get("consensus_error"),
                "wall_s": run.wall_seconds,
                "device": run.device,
                "eps_rdp": max((a["epsilon_rdp"] for a in agents.values()), default=None),
                "eps_thm3": max((a["epsilon_theorem3"] for a in agents.values()), default=None),
            }
        )
    order = {(a, r): i for i, (a, r) in enumerate((a, r) for a in ATTACKS for r in RULES)}
    rows.sort(key=lambda r: (r["split"], order[(r["attack"], r["rule"])], r["C"], r["seed"]))
    return rows


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def print_tables(rows: list[dict], at: int, last: int) -> None:
    for split in ("iid", "non-iid"):
        print(f"\n#### {split}\n")
        tail = f" acc range, last {last} evals |" if last else ""
        print(
            f"| attack | rule | C | seed | acc @{at} | loss @{at} | H @{at} | "
            f"iterations | final acc | final loss | final H |{tail} ε RDP / Thm 3 | wall (s) |"
        )
        print("|---" * (13 + bool(last)) + "|")
        for r in (r for r in rows if r["split"] == split):
            eps = "—" if r["eps_rdp"] is None else f"{r['eps_rdp']:.3g} / {r['eps_thm3']:.3g}"
            spread = f" {fmt(r['tail_min'], '.4f')}–{fmt(r['tail_max'], '.4f')} |" if last else ""
            print(
                f"| {r['attack']} | {r['rule']} | {r['C']:g} | {r['seed']} | "
                f"{fmt(r['accuracy'], '.4f')} | "
                f"{fmt(r['loss'], '.3g')} | {fmt(r['H'], '.3g')} | {r['rounds']} | "
                f"{fmt(r['final_accuracy'], '.4f')} | {fmt(r['final_loss'], '.3g')} | "
                f"{fmt(r['final_H'], '.3g')} |{spread} {eps} | "
                f"{fmt(r['wall_s'], '.0f')} |"
            )
    devices = sorted({r["device"] for r in rows if r["device"]})
    print(f"\n{len(rows)} finished runs; devices: {', '.join(devices)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--at", type=int, default=1000)
    parser.add_argument("--last", type=int, default=0, help="accuracy range of the last N evals")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = rows_of(args.directory, args.at, args.last)
    print_tables(rows, args.at, args.last)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
