"""Tables of docs/results/share.md, from the committed run folders.

- ``share figure2 200``: Figure 2 at the paper's 200 rounds (``docs/results/share/runs-200/
  figure2/``, the runs of ``sharefl simulate experiments/share_mnist_figure2.toml --rounds
  200``): final accuracy (%) per rule and cluster size m, mean ± sample std over the seeds;
  the two mean rows (no attack, no defence) with each seed's value.

``python experiments/results_pages.py`` writes it into the page (``--check`` compares);
this script prints it alone.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

FIGURE2_200 = Path("docs/results/share/runs-200/figure2")
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


def blocks(root: Path) -> dict[str, str]:
    return {"share figure2 200": figure2_200(root)}


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
