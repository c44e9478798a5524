"""Tables of docs/results/share.md, from the committed run folders.

- ``share figure2 200``: Figure 2 at the paper's 200 rounds (``docs/results/share/runs-200/
  figure2/``, the runs of ``sharefl simulate experiments/share_mnist_figure2.toml --rounds
  200``): final accuracy (%) per rule and cluster size m, mean ± sample std over the seeds;
  the two mean rows (no attack, no defence) with each seed's value.

- ``share figure3b 200`` and ``share figure9 200``: Figures 3b and 9 at 200 rounds
  (``docs/results/share/runs-200/figure3b/``, ``.../figure9/``): per run, its seeds, the
  final accuracy per seed, mean ± sample std, the mean over seeds of each seed's last 5
  evaluations, the audit of the plans, Zeno++'s acceptance (clean / Byzantine-holding
  clusters, and accepted of all; ranges over the seeds), wall time per seed.

``python experiments/results_pages.py`` writes them into the page (``--check`` compares);
this script prints it alone.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

FIGURE2_200 = Path("docs/results/share/runs-200/figure2")
FIGURE3B_200 = Path("docs/results/share/runs-200/figure3b")
FIGURE9_200 = Path("docs/results/share/runs-200/figure9")
ROWS_3B = (
    (
        "zeno safe R=1",
        "Zeno++ R = 1 (one random partition, 15 × 4; the same run under either planner)",
    ),
    ("zeno safe R=2", "Zeno++ safe planner R = 2 (14 clusters: 10 × 4, 4 × 5)"),
    ("zeno safe R=5", "Zeno++ safe planner R = 5"),
    ("zeno safe R=10", "Zeno++ safe planner R = 10"),
    ("zeno random R=2", "Zeno++ paper's random planner R = 2 (15 × 4)"),
    ("zeno random R=5", "Zeno++ paper's random planner R = 5"),
    ("zeno random R=10", "Zeno++ paper's random planner R = 10"),
)
_TM, _ZENO = "trimmed mean (q = 3)", "Zeno++ (q = 6)"
_KINDS = (
    ("reclustering safe R=10", "reclustering every round, safe planner, R = 10"),
    ("fixed clusters", "**fixed clusters** (one partition, R = 1)"),
    (
        "reclustering random R=10",
        "reclustering every round, the paper's random planner, R = 10",
    ),
    ("fixed plan R=10", "fixed plan (round 1's 10 safe clusterings, every round)"),
)
ROWS_9 = tuple(
    (f"{rule} {label}", f"{name}, {text}")
    for rule, name in (("trimmed_mean", _TM), ("zeno", _ZENO))
    for label, text in _KINDS
)
RUN_COLUMNS = (
    "| run | seeds | final acc. (%) per seed | mean ± std (%) | mean of the last 5 "
    "evaluations, rounds 160–200 (%) | audit of the plans (200 rounds) | Zeno++ accepts: "
    "clean / Byzantine-holding clusters (accepted of all) | wall s per run |\n"
    "|---|---|---|---|---|---|---|---|"
)
RULES = (("zeno", "Zeno++"), ("krum", "Krum"), ("trimmed_mean", "trimmed mean"))
MEANS = (("no attack (mean)", "mean, no attack"), ("no defense (mean)", "mean, no defence"))
SIZES = (1, 3, 5, 10)


def _runs(folder: Path) -> dict[tuple[str, int], list[tuple[int, float]]]:
    """(label prefix, m) -> [(seed, final accuracy %)], from every finished run."""
    cells: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for run in sorted(folder.iterdir()):
        path = run / "summary.json"
        if not path.is_file():
            continue
        s = json.loads(path.read_text())
        m = int(s["config"]["secure_aggregation"]["cluster_size"])
        prefix = s["label"].rsplit(" m=", 1)[0]
        cells[(prefix, m)].append((int(s["seed"]), 100 * float(s["final_accuracy"])))
    for values in cells.values():
        values.sort()
    return cells


def _one(x: float) -> str:
    """One decimal, halves up, after removing float noise (91.1499999... from 91.15 is 91.2)."""
    return str(Decimal(f"{x:.6f}").quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def _cell(values: list[tuple[int, float]], first: bool) -> str:
    accs = [a for _, a in values]
    spread = f" ± {_one(statistics.stdev(accs))}" if len(accs) > 1 else ""
    n = len(accs)
    seeds = f"{n} seed{'s' if n > 1 else ''}" if first else str(n)
    return f"{_one(statistics.fmean(accs))}{spread} ({seeds})"


def figure2_200(root: Path) -> str:
    cells = _runs(root / FIGURE2_200)
    lines = ["| rule | m = 1 | m = 3 | m = 5 | m = 10 |", "|---|---|---|---|---|"]
    for key, name in RULES:
        row = [
            _cell(cells[(key, m)], first=i == 0) if cells.get((key, m)) else ""
            for i, m in enumerate(SIZES)
        ]
        lines.append(f"| {name} | {' | '.join(row)} |")
    for key, name in MEANS:
        values = cells.get((key, 3), [])
        accs = [a for _, a in values]
        text = ""
        if values:
            spread = f" ± {_one(statistics.stdev(accs))}" if len(accs) > 1 else ""
            per_seed = ", ".join(f"{a:.2f}" for a in accs)
            text = f"{_one(statistics.fmean(accs))}{spread} ({len(accs)} seeds: {per_seed})"
        lines.append(f"| {name} | | {text} | | |")
    return "\n".join(lines)


def _summaries(folder: Path) -> dict[str, list[tuple[dict, list[float]]]]:
    """label -> [(summary, accuracies of the evaluated rounds)] in seed order."""
    found: dict[str, list[tuple[dict, list[float]]]] = defaultdict(list)
    for run in sorted(folder.iterdir()):
        path = run / "summary.json"
        if not path.is_file():
            continue
        s = json.loads(path.read_text())
        lines = (run / "rounds.jsonl").read_text().splitlines()
        accs = [float(json.loads(line)["accuracy"]) for line in lines if line.strip()]
        found[s["label"]].append((s, accs))
    for runs in found.values():
        runs.sort(key=lambda r: int(r[0]["seed"]))
    return found


def _range(values: list[float], digits: int) -> str:
    def fmt(x: float) -> str:
        q = Decimal(1).scaleb(-digits)
        return str(Decimal(f"{x:.6f}").quantize(q, rounding=ROUND_HALF_UP))

    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def _audit(runs: list[tuple[dict, list[float]]]) -> str:
    audits = [s["share"]["audit"] for s, _ in runs]
    if all(a["verdict"] == "no leak found" for a in audits):
        return "no leak found"
    texts = {
        f"{a['leaking_rounds']}/{a['rounds']} rounds, "
        + (
            f"all {a['max_recoverable_clients']} updates solvable"
            if a["max_recoverable_clients"] == _clients(s)
            else f"up to {a['max_recoverable_clients']} updates solvable"
        )
        for a, (s, _) in zip(audits, runs, strict=True)
    }
    if len(texts) == 1:
        return f"**leaks** in {texts.pop()} (every seed)"
    return "**leaks**: " + "; ".join(sorted(texts))


def _clients(summary: dict) -> int:
    clients = summary["config"]["clients"]
    return int(clients["honest"]) + int(clients.get("byzantine", 0))


def _zeno(runs: list[tuple[dict, list[float]]]) -> str:
    share = [s["share"] for s, _ in runs]
    if any(x.get("zeno_candidates") is None for x in share):
        return "–"
    honest = [100 * x["zeno_honest_acceptance"] for x in share]
    byzantine = [100 * x["zeno_byzantine_acceptance"] for x in share]
    accepted = [100 * x["zeno_accepted"] / x["zeno_candidates"] for x in share]
    return f"{_range(honest, 0)} % / {_range(byzantine, 1)} % ({_range(accepted, 1)} %)"


def runs_table(folder: Path, rows: tuple[tuple[str, str], ...]) -> str:
    found = _summaries(folder)
    lines = [RUN_COLUMNS]
    for label, text in rows:
        runs = found.get(label, [])
        if not runs:
            lines.append(f"| {text} | – | not run | | | | | |")
            continue
        finals = [100 * float(s["final_accuracy"]) for s, _ in runs]
        last5 = [100 * statistics.fmean(accs[-5:]) for _, accs in runs]
        seeds = ",".join(str(s["seed"]) for s, _ in runs)

        def mean_std(values: list[float]) -> str:
            if len(values) == 1:
                return _one(values[0])
            return f"{_one(statistics.fmean(values))} ± {_one(statistics.stdev(values))}"

        walls = " / ".join(str(round(float(s["wall_seconds"]))) for s, _ in runs)
        lines.append(
            f"| {text} | {seeds} | {' / '.join(_one(a) for a in finals)} | "
            f"{mean_std(finals)} | {mean_std(last5)} | {_audit(runs)} | {_zeno(runs)} | "
            f"{walls} |"
        )
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    return {
        "share figure2 200": figure2_200(root),
        "share figure3b 200": runs_table(root / FIGURE3B_200, ROWS_3B),
        "share figure9 200": runs_table(root / FIGURE9_200, ROWS_9),
    }


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
