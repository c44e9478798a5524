"""Tables of docs/results/atoms.md: what atoms cost, from the committed run folders.

Reads (paths relative to the repository root, or ``--root``):

- ``docs/results/atoms/runs-200/``: the runs of ``experiments/share_mnist_atoms.toml`` (atoms
  and this session's per-client twins; labels end in "atoms" / "per-client");
- ``docs/results/share/runs-200/figure2`` and ``.../figure9``: the committed per-client
  runs of the same cells (and Figure 9's fixed clusters), matched by label and seed; the
  script checks that their settings equal the twins' (name, label, and the keys added
  since — ``atoms``, ``atom_size`` unset, the former ``privacy.colluders`` = 0 — aside);
- ``docs/results/atoms/quickstart/``: ``experiments/quickstart_atoms.toml``;
- ``docs/results/atoms/dropouts.json``: ``experiments/atoms_dropouts.py``.

Prints Markdown (final test accuracy, mean ± sample std over seeds, per-seed values, the
audit's smallest nullity, wall time per run); ``python experiments/results_pages.py`` writes
it into the page. Usage::

    python experiments/atoms_summary.py [--root .] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sharefl.simulator.results import RunRecord, load_runs

FIG2_CELLS = [
    ("figure2", "trimmed_mean", "m=3"),
    ("figure2", "trimmed_mean", "m=10"),
    ("figure2", "zeno", "m=3"),
    ("figure2", "zeno", "m=10"),
]
FIG9_CELLS = [
    ("figure9", "trimmed_mean", "reclustering safe R=10"),
    ("figure9", "zeno", "reclustering safe R=10"),
]
RULE = {"trimmed_mean": "trimmed mean", "zeno": "Zeno++"}


def read_runs(folder: Path) -> list[RunRecord]:
    """The finished runs under ``folder`` (the checked reader), ``[]`` when it is missing."""
    return [r for r in load_runs(folder) if r.finished] if folder.is_dir() else []


def _final(run: RunRecord) -> float:
    """The final accuracy of a run :func:`read_runs` returned (finished, so never None)."""
    assert run.final_accuracy is not None
    return run.final_accuracy


def comparable(config: Mapping[str, Any]) -> str:
    """A run's settings without its name and label, the keys added since the committed
    runs (at their defaults) and the former privacy.colluders default."""
    c = json.loads(json.dumps(config))
    c.pop("name", None)
    c.pop("label", None)
    sa = c["secure_aggregation"]
    for key in ("atoms", "atom_size"):
        if sa.get(key) is None:
            sa.pop(key, None)
    defaults = {
        "min_sum_size": 3,
        "threshold": None,
        "colluders": None,
        "neighbour_degree": None,
        "raise_threshold_to_floor": True,
        "signed": False,
    }
    for key, value in defaults.items():
        sa.setdefault(key, value)
    if c["privacy"].get("colluders") in (0, None):
        c["privacy"]["colluders"] = None
    return json.dumps(c, sort_keys=True)


def stats(values: list[float]) -> str:
    if not values:
        return "–"
    pct = [100 * v for v in values]
    if len(pct) == 1:
        return f"{pct[0]:.1f}"
    return f"{statistics.fmean(pct):.1f} ± {statistics.stdev(pct):.1f}"


def per_seed(runs: list[RunRecord]) -> str:
    return " / ".join(f"{100 * _final(r):.1f}" for r in runs) or "–"


def nullity(runs: list[RunRecord]) -> str:
    values = {((r.extra.get("share") or {}).get("audit") or {}).get("min_nullity") for r in runs}
    values.discard(None)
    return "/".join(str(v) for v in sorted(values)) or "–"


def walls(runs: list[RunRecord]) -> str:
    return " / ".join(f"{r.wall_seconds:.0f}" for r in runs) or "–"


def curve(run: RunRecord) -> dict[int, float]:
    return {r.round: r.accuracy for r in run.rounds if r.accuracy is not None}


def largest_gap(runs: list[RunRecord], others: list[RunRecord]) -> float | None:
    """The largest |accuracy difference| at any evaluation between runs of the same seed."""
    gaps = []
    for run in runs:
        for other in others:
            if other.seed == run.seed:
                a, b = curve(run), curve(other)
                gaps += [abs(a[k] - b[k]) for k in a.keys() & b.keys()]
    return max(gaps) if gaps else None


def simulator_table(root: Path, out: dict) -> list[str]:
    mine = read_runs(root / "docs/results/atoms/runs-200")
    committed = {
        "figure2": read_runs(root / "docs/results/share/runs-200/figure2"),
        "figure9": read_runs(root / "docs/results/share/runs-200/figure9"),
    }
    notes: list[str] = []
    lines = [
        "| cell | atoms: final acc. per seed (%) | atoms mean ± std | per-client, this session | "
        "per-client, committed (runs-200) | atoms − per-client, this session (points) | "
        "audit nullity atoms / per-client | wall s per run, atoms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for figure, rule, cell in FIG2_CELLS + FIG9_CELLS:
        base_label = f"{rule} {cell}"

        def pick(kind: str, fig=figure, base=base_label) -> list[RunRecord]:
            label = f"{fig} {base} {kind}"
            return sorted(
                (r for r in mine if r.label == label),
                key=lambda r: r.seed or 0,
            )

        atoms, twins = pick("atoms"), pick("per-client")
        old = sorted(
            (r for r in committed[figure] if r.label == base_label and r.total_rounds == 200),
            key=lambda r: r.seed or 0,
        )
        gap = largest_gap(twins, old)
        if gap is not None:
            notes.append(
                f"- {figure} {base_label}: this session's per-client runs vs the committed ones, "
                f"largest accuracy difference at any evaluation of any seed: {100 * gap:.2f} points"
            )
        for twin in twins:  # the committed run of the same seed has the same settings
            match = [o for o in old if o.seed == twin.seed]
            if match and comparable(match[0].config) != comparable(twin.config):
                raise SystemExit(f"{twin.path.name}: settings differ from {match[0].path.name}")
        reference = twins if len(twins) >= len(atoms) and twins else old
        ref_seeds = {r.seed for r in reference}
        paired = [r for r in atoms if r.seed in ref_seeds]
        delta = "–"
        if paired and reference:
            a = statistics.fmean(_final(r) for r in paired)
            b = statistics.fmean(_final(r) for r in reference if r.seed in {p.seed for p in paired})
            delta = f"{100 * (a - b):+.1f}".replace("-0.0", "+0.0")
        name = f"Figure {figure[-1]}, {RULE[rule]}, {cell}"
        acc = [_final(r) for r in atoms]
        lines.append(
            f"| {name} | {per_seed(atoms)} | {stats(acc)}"
            f" | {stats([_final(r) for r in twins])} ({per_seed(twins)})"
            f" | {stats([_final(r) for r in old])} ({per_seed(old)})"
            f" | {delta} | {nullity(atoms)} / {nullity(twins or old)} | {walls(atoms)} |"
        )
        out.setdefault("simulator", []).append(
            {
                "cell": name,
                "atoms": {r.path.name: _final(r) for r in atoms},
                "per_client_session": {r.path.name: _final(r) for r in twins},
                "per_client_committed": {r.path.name: _final(r) for r in old},
            }
        )
        if figure == "figure9":
            fixed = sorted(
                (r for r in committed[figure] if r.label == f"{rule} fixed clusters"),
                key=lambda r: r.seed or 0,
            )
            lines.append(
                f"| Figure 9, {RULE[rule]}, fixed clusters (committed, for reference) | – | – "
                f"| – | {stats([_final(r) for r in fixed])} "
                f"({per_seed(fixed)}) | – | – / {nullity(fixed)} | – |"
            )
            gap = largest_gap(atoms, fixed)
            if gap is not None:
                notes.append(
                    f"- figure9 {rule}: atoms vs the committed fixed clusters, largest accuracy "
                    f"difference at any evaluation of any seed: {100 * gap:.2f} points"
                )
    return [*lines, "", *notes]


def quickstart_table(root: Path, out: dict) -> list[str]:
    runs = read_runs(root / "docs/results/atoms/quickstart")
    lines = [
        "| run | seed | final acc. (%) | ε | audit nullity | wall s |",
        "|---|---|---|---|---|---|",
        "| README (`experiments/quickstart.toml`, 2026-11-28) | 1 | 95.3 | 2.00 | – | 128 |",
    ]
    for r in sorted(runs, key=lambda r: (r.label, r.seed or 0)):
        kind = "atoms" if r.label.endswith("atoms") else "per-client"
        eps = f"{r.epsilon:.2f}" if r.epsilon is not None else "–"
        lines.append(
            f"| {kind} (`experiments/quickstart_atoms.toml`) | {r.seed} | "
            f"{100 * _final(r):.1f} | {eps} | {nullity([r])} | "
            f"{r.wall_seconds:.0f} |"
        )
        out.setdefault("quickstart", {})[r.path.name] = _final(r)
    for kind in ("per-client", "atoms"):
        acc = [_final(r) for r in runs if r.label.endswith(kind)]
        if len(acc) > 1:
            lines.append(
                f"| {kind}, mean ± std over {len(acc)} seeds | – | {stats(acc)} | – | – | – |"
            )
    return lines


def dropout_table(root: Path, out: dict) -> list[str]:
    path = root / "docs/results/atoms/dropouts.json"
    if not path.is_file():
        return ["(no dropouts.json)"]
    record = json.loads(path.read_text())
    lines = [
        "| m | drop-out rate | clusters | released / planned per round | clients in a released "
        "sum | clients that sent a masked input | of them in no released sum | failed clusters "
        "per round (stage: count over all rounds) | rounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in record["cells"]:
        stages = ", ".join(f"{k}: {v}" for k, v in sorted(c["failed_by_stage"].items())) or "–"
        stages = stages.replace("release", "withheld")
        kind = "atoms" if c["atoms"] else "per-client"
        lines.append(
            f"| {c['m']} | {100 * c['dropout_rate']:g} % | {kind}"
            f" | {c['released']['mean']:.2f} / {c['planned']['mean']:.0f}"
            f" | {c['covered']['mean']:.1f} ± {c['covered']['std']:.1f}"
            f" | {c['sent']['mean']:.1f} | {c['lost_sent']['mean']:.1f}"
            f" | {c['failed']['mean']:.2f} ({stages}) | {c['rounds']} |"
        )
    lines.append("")
    lines.append(
        f"{record['command']}: wall {record['wall_seconds']} s, CPU {record['cpu_seconds']} s, "
        f"peak RSS {record['max_rss_mib']} MiB, {record['machine']['cores']} cores, "
        f"OMP_NUM_THREADS={record['machine']['OMP_NUM_THREADS']}; realised-audit leaks: "
        f"{sum(c['realised_audit_leaks'] for c in record['cells'])}."
    )
    out["dropouts"] = record["cells"]
    return lines


def tables(root: Path, out: dict) -> str:
    """The page's tables (docs/results/atoms.md, block "atoms tables"), numbers into ``out``."""
    return "\n".join(
        [
            "### Accuracy (200 rounds; final test accuracy)\n",
            *simulator_table(root, out),
            "\n### The main job (75 rounds)\n",
            *quickstart_table(root, out),
            "\n### Drop-outs (real protocol, n = 60, R = 1, unsigned)\n",
            *dropout_table(root, out),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=".")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    out: dict = {}
    print(tables(Path(args.root), out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
