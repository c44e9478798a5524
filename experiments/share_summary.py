"""Tables of docs/results/share.md, from the committed run folders.

- ``share figure2 200``: Figure 2 at the paper's 200 rounds (``docs/results/share/runs-200/
  figure2/``, the runs of ``sharefl simulate experiments/share_mnist_figure2.toml --rounds
  200``): final accuracy (%) per rule and cluster size m, mean ± sample std over the seeds;
  the two mean rows (no attack, no defence) with each seed's value.
- ``share figure2``: the same grid at the file's 30 rounds (``docs/results/share/runs-30/
  figure2/``), Zeno++'s acceptance of clean / Byzantine-holding clusters beside its cells,
  and the audit's verdicts over the runs.

- ``share figure3b 200`` and ``share figure9 200``: Figures 3b and 9 at 200 rounds
  (``docs/results/share/runs-200/figure3b/``, ``.../figure9/``): per run, its seeds, the
  final accuracy per seed, mean ± sample std, the mean over seeds of each seed's last 5
  evaluations, the audit of the plans, Zeno++'s acceptance (clean / Byzantine-holding
  clusters, and accepted of all; ranges over the seeds), wall time per seed.

- ``share figure3a``, ``share figure3c``, ``share figure6``, ``share figure7``, ``share
  figure8``, ``share leak audit`` (per run, 30 rounds) and ``share figure5`` (rule × β by
  m): the 30-round runs of ``docs/results/share/runs-30/``
  (``experiments/share_mnist_figure{3a,3c,5,6,7,8}.toml``,
  ``experiments/share_mnist_leak_audit.toml``).

- ``share dp clients``: SHARE with DP-SGD clients against the DP noise filter
  (``docs/results/share/dp-clients/``, the runs of ``experiments/share_mnist_dp_clients.toml``,
  100 rounds): per server, its seeds, final and best accuracy (mean ± std), ε per client,
  the audit of the plans, Zeno++'s acceptance, wall time per seed.

- ``share audit draws``: the leak audit alone on random and safe plans
  (``docs/results/share/audit-draws.json``, ``python experiments/share_audit_draws.py
  --draws 20 --json ...``): per (m, R, planner), the draws that leak, the median rank and
  the median number of solvable updates.

- ``share protocol cell`` and ``share protocol stages``: Figure 9's trimmed-mean cell run in
  the clear and through the protocol (``docs/results/share/protocol-cell/``, the runs of
  ``experiments/share_mnist_protocol_cell.toml``): the two runs compared as
  ``experiments/share_protocol_check.py`` compares them (the files committed: rounds and
  summaries; the models were compared when the runs were made), and the protocol's stages
  timed by ``experiments/share_protocol_stages.py`` (``stages.json``'s mean per round).

``python experiments/results_pages.py`` writes them into the page (``--check`` compares);
this script prints it alone.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections import Counter, defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

from sharefl.simulator.results import RunRecord, load_runs

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
PROTOCOL_CELL = Path("docs/results/share/protocol-cell")
DP_CLIENTS = Path("docs/results/share/dp-clients")
AUDIT_DRAWS = Path("docs/results/share/audit-draws.json")
DP_CLIENT_ROWS = (
    "no attack (mean) m=3",
    "no defense (mean) m=3",
    "noise_filter m=1",
    "trimmed_mean m=3",
    "zeno m=3",
)
CELL_CLIENTS = 60
"""The clients of the protocol cell (Figure 9: 57 honest, 3 Byzantine), all in every round."""


def _by_cluster_size(folder: Path) -> dict[tuple[str, int], list[RunRecord]]:
    """(label prefix, m) -> the finished runs, in seed order (:func:`_by_label`, keyed by
    the label before " m=" and the cluster size of the runs' configuration)."""
    return {
        (label.rsplit(" m=", 1)[0], int(runs[0].config["secure_aggregation"]["cluster_size"])): runs
        for label, runs in _by_label(folder).items()
    }


def _one(x: float) -> str:
    """One decimal, halves up, after removing float noise (91.1499999... from 91.15 is 91.2):
    Figure 2's 200-round table was rounded so by hand."""
    return str(Decimal(f"{x:.6f}").quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def _f1(x: float) -> str:
    """One decimal as Python formats the float (the convention of the scripts that first
    wrote the run tables: 91.6499... from 91.65 prints 91.6)."""
    return f"{x:.1f}"


def _cell(runs: list[RunRecord], first: bool) -> str:
    accs = [_final(r) for r in runs]
    spread = f" ± {_one(statistics.stdev(accs))}" if len(accs) > 1 else ""
    n = len(accs)
    seeds = f"{n} seed{'s' if n > 1 else ''}" if first else str(n)
    return f"{_one(statistics.fmean(accs))}{spread} ({seeds})"


def figure2(folder: Path, acceptance: bool = False) -> str:
    """Figure 2's grid from the runs under ``folder``; with ``acceptance``, Zeno++'s cells
    also give its acceptance of clean / Byzantine-holding clusters (ranges over the seeds)."""
    cells = _by_cluster_size(folder)
    lines = ["| rule | m = 1 | m = 3 | m = 5 | m = 10 |", "|---|---|---|---|---|"]
    for key, name in RULES:
        row = []
        for i, m in enumerate(SIZES):
            runs = cells.get((key, m), [])
            text = _cell(runs, first=i == 0) if runs else ""
            if runs and acceptance and key == "zeno":
                text += f" [{_zeno_30(runs, 'short')}]"
            row.append(text)
        lines.append(f"| {name} | {' | '.join(row)} |")
    for key, name in MEANS:
        accs = [_final(r) for r in cells.get((key, 3), [])]
        text = ""
        if accs:
            spread = f" ± {_one(statistics.stdev(accs))}" if len(accs) > 1 else ""
            per_seed = ", ".join(f"{a:.2f}" for a in accs)
            text = f"{_one(statistics.fmean(accs))}{spread} ({len(accs)} seeds: {per_seed})"
        lines.append(f"| {name} | | {text} | | |")
    if acceptance:
        verdicts = Counter(
            r.extra["share"]["audit"]["verdict"] for runs in cells.values() for r in runs
        )
        lines += [
            "",
            "Audit of the plans: "
            + "; ".join(
                f"{verdict} in {n} run{'s' if n > 1 else ''}"
                for verdict, n in sorted(verdicts.items())
            )
            + ".",
        ]
    return "\n".join(lines)


def _by_label(folder: Path, prefix: str = "") -> dict[str, list[RunRecord]]:
    """label -> the finished runs under ``folder`` whose experiment name starts with
    ``prefix``, in seed order; ``{}`` when ``folder`` is missing."""
    found: dict[str, list[RunRecord]] = defaultdict(list)
    for run in load_runs(folder) if folder.is_dir() else []:
        if run.finished and run.name.startswith(prefix):
            found[run.label].append(run)
    for runs in found.values():
        runs.sort(key=lambda r: r.seed or 0)
    return found


def _final(run: RunRecord) -> float:
    """A finished run's final accuracy in %."""
    return 100 * (run.final_accuracy or 0.0)


def _mean_std(values: list[float]) -> str:
    """Mean ± sample std, one decimal as :func:`_f1` prints it (the mean alone for one value)."""
    spread = f" ± {_f1(statistics.stdev(values))}" if len(values) > 1 else ""
    return f"{_f1(statistics.mean(values))}{spread}"


def _walls(runs: list[RunRecord]) -> str:
    return " / ".join(str(round(r.wall_seconds or 0.0)) for r in runs)


def _range(values: list[float], digits: int) -> str:
    def fmt(x: float) -> str:
        return f"{x:.{digits}f}"

    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def _audit(runs: list[RunRecord]) -> str:
    audits = [r.extra["share"]["audit"] for r in runs]
    if all(a["verdict"] == "no leak found" for a in audits):
        return "no leak found"
    texts = {
        f"{a['leaking_rounds']}/{a['rounds']} rounds, "
        + (
            f"all {a['max_recoverable_clients']} updates solvable"
            if a["max_recoverable_clients"] == _clients(r)
            else f"up to {a['max_recoverable_clients']} updates solvable"
        )
        for a, r in zip(audits, runs, strict=True)
    }
    if len(texts) == 1:
        return f"**leaks** in {texts.pop()} (every seed)"
    return "**leaks**: " + "; ".join(sorted(texts))


def _clients(run: RunRecord) -> int:
    clients = run.config["clients"]
    return int(clients["honest"]) + int(clients.get("byzantine", 0))


def _zeno(runs: list[RunRecord]) -> str:
    share = [r.extra["share"] for r in runs]
    if any(x.get("zeno_candidates") is None for x in share):
        return "–"
    honest = [100 * x["zeno_honest_acceptance"] for x in share]
    byzantine = [100 * x["zeno_byzantine_acceptance"] for x in share]
    accepted = [100 * x["zeno_accepted"] / x["zeno_candidates"] for x in share]
    return f"{_range(honest, 0)} % / {_range(byzantine, 1)} % ({_range(accepted, 1)} %)"


def runs_table(folder: Path, rows: tuple[tuple[str, str], ...]) -> str:
    found = _by_label(folder)
    lines = [RUN_COLUMNS]
    for label, text in rows:
        runs = found.get(label, [])
        if not runs:
            lines.append(f"| {text} | – | not run | | | | | |")
            continue
        finals = [_final(r) for r in runs]
        last5 = [100 * statistics.mean(x.accuracy or 0.0 for x in r.rounds[-5:]) for r in runs]
        seeds = ",".join(str(r.seed) for r in runs)

        lines.append(
            f"| {text} | {seeds} | {' / '.join(_f1(a) for a in finals)} | "
            f"{_mean_std(finals)} | {_mean_std(last5)} | {_audit(runs)} | {_zeno(runs)} | "
            f"{_walls(runs)} |"
        )
    return "\n".join(lines)


RUNS_30 = Path("docs/results/share/runs-30")
_R_ROWS = ("R=1", "R=2", "R=5", "R=10", "safe R=2", "safe R=5", "safe R=10")
_NONIID = ("No SHARE (m=1)", "R=1", "R=2", "R=5", "R=10", "random R=2", "random R=5", "random R=10")
TABLES_30 = {
    # block: (folder, experiment name prefix, labels in order, Zeno++ column)
    "share figure3a": ("figures-3a-3c", "SHARE Figure 3a", [f"zeno {r}" for r in _R_ROWS], "all"),
    "share figure3c": ("figures-3a-3c", "SHARE Figure 3c", [f"zeno {r}" for r in _R_ROWS], "all"),
    "share figure6": (
        "figures-6-7",
        "SHARE Figure 6",
        [f"{rule} {r}" for rule in ("krum", "median") for r in _NONIID],
        None,
    ),
    "share figure7": (
        "figures-6-7",
        "SHARE Figure 7",
        [f"{rule} {r}" for rule in ("krum", "median") for r in _NONIID],
        None,
    ),
    "share leak audit": (
        "leak-audit",
        "SHARE leak audit",
        [f"trimmed_mean R={r} random" for r in (2, 3, 4, 10)] + ["trimmed_mean R=10 safe"],
        None,
    ),
    "share figure8": (
        "figures-5-8",
        "SHARE Figure 8",
        ["trimmed_mean m=1", "trimmed_mean m=3", "zeno m=1", "zeno m=3"],
        "short",
    ),
}


def _audit_30(runs: list[RunRecord]) -> str:
    def one(a: dict) -> str:
        if a["verdict"] != "leaks":
            return str(a["verdict"])
        n = a["max_recoverable_clients"]
        return f"leaks in {a['leaking_rounds']}/{a['rounds']} rounds, up to {n} updates"

    texts = [one(r.extra["share"]["audit"]) for r in runs]
    if len(set(texts)) == 1:
        return texts[0]
    return "; ".join(f"s{r.seed}: {t}" for r, t in zip(runs, texts, strict=True))


def _zeno_30(runs: list[RunRecord], kind: str) -> str:
    share = [r.extra["share"] for r in runs]
    if share[0].get("zeno_candidates") is None:
        return "–"
    honest = [100 * x["zeno_honest_acceptance"] for x in share]
    byzantine = [100 * x["zeno_byzantine_acceptance"] for x in share]
    if kind == "short":
        return f"{_range(honest, 0)} % / {_range(byzantine, 0)} %"
    accepted = [100 * x["zeno_accepted"] / x["zeno_candidates"] for x in share]
    return f"{_range(honest, 1)} % / {_range(byzantine, 1)} % ({_range(accepted, 1)} %)"


def table_30(root: Path, block: str) -> str:
    folder, prefix, labels, zeno = TABLES_30[block]
    found = _by_label(root / RUNS_30 / folder, prefix)
    zeno_head = {
        "all": " Zeno++ accepts: clean / Byzantine-holding clusters (accepted of all) |",
        "short": " Zeno++ accepts: clean / Byzantine-holding clusters |",
        None: "",
    }[zeno]
    columns = 6 + (zeno is not None)
    lines = [
        "| run | seeds | final acc. per seed (%) | mean ± std (%) | audit of the plans "
        f"(30 rounds) |{zeno_head} wall s per run |",
        "|---" * columns + "|",
    ]
    for label in labels:
        runs = found.get(label, [])
        if not runs:
            lines.append(f"| {label} | – | not run |" + " |" * (columns - 3))
            continue
        accs = [_final(r) for r in runs]
        zeno_cell = f" {_zeno_30(runs, zeno)} |" if zeno else ""
        lines.append(
            f"| {label} | {','.join(str(r.seed) for r in runs)} | "
            f"{' / '.join(_f1(a) for a in accs)} | {_mean_std(accs)} | "
            f"{_audit_30(runs)} |{zeno_cell} "
            f"{_walls(runs)} |"
        )
    return "\n".join(lines)


def figure5(root: Path) -> str:
    found = _by_label(root / RUNS_30 / "figures-5-8", "SHARE Figure 5")
    rules = (
        ("zeno", "Zeno++ (q = 6)"),
        ("krum", "Krum (q = 3)"),
        ("trimmed_mean", "trimmed mean (q = 3)"),
    )
    lines = ["| rule | β | m = 1 | m = 3 | m = 5 | m = 10 |", "|---|---|---|---|---|---|"]
    for key, name in rules:
        for beta in (-1, -10):
            cells = []
            for m in SIZES:
                runs = found.get(f"{key} m={m} beta={beta}", [])
                if not runs:
                    cells.append("not run")
                    continue
                accs = [_final(r) for r in runs]
                cell = f"{_mean_std(accs)} ({' / '.join(_f1(a) for a in accs)})"
                share = [r.extra["share"] for r in runs]
                if share[0].get("zeno_candidates") is not None:
                    honest = [100 * x["zeno_honest_acceptance"] for x in share]
                    byz = [100 * x["zeno_byzantine_acceptance"] for x in share]
                    cell += f" [{_range(honest, 0)} / {_range(byz, 0)} %]"
                cells.append(cell)
            lines.append(f"| {name} | −{-beta} | {' | '.join(cells)} |")
    return "\n".join(lines)


def dp_clients(root: Path) -> str:
    folder = root / DP_CLIENTS
    found = _by_label(folder)
    lines = [
        "| run | seeds | final acc. (%) | best (%) | ε per client | audit of the plans "
        "| Zeno++ accepts: honest / Byzantine-holding clusters | wall s per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in DP_CLIENT_ROWS:
        runs = found.get(label, [])
        if not runs:
            lines.append(f"| {label} | – | not run | | | | | |")
            continue
        finals = [_final(r) for r in runs]
        best = statistics.mean(100 * (r.best_accuracy or 0.0) for r in runs)
        eps = max((r.epsilon for r in runs if r.epsilon is not None), default=None)
        audit = zeno = "–"  # a run without SHARE (the filter's, m = 1) has neither
        if all("share" in r.extra for r in runs):
            audit, zeno = _audit_30(runs), _zeno_30(runs, "short")
            if audit == "no leak found":
                audit += f" ({runs[0].total_rounds} rounds)"
        lines.append(
            f"| {label} | {','.join(str(r.seed) for r in runs)} "
            f"| {_mean_std(finals)} | {_f1(best)} "
            f"| {'–' if eps is None else f'{eps:.2f}'} | {audit} | {zeno} "
            f"| {_walls(runs)} |"
        )
    return "\n".join(lines)


def audit_draws(root: Path) -> str:
    path = root / AUDIT_DRAWS
    if not path.is_file():
        return "(not run)"
    document = json.loads(path.read_text())
    settings, env = document["settings"], document["environment"]
    return (
        _sibling("share_audit_draws").markdown(document["cells"])
        + f"\n\nn = {settings['clients']}, sums of fewer than {settings['min_sum_size']} "
        f"clients count as leaks, seed {settings['seed']}; {document['wall_seconds']:.0f} s, "
        f"commit {(env['commit'] or '?')[:7]}."
    )


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def protocol_cell(root: Path) -> str:
    """The clear run against the run through the protocol, from their committed folders."""
    check = _sibling("share_protocol_check")
    runs = check.find_runs(root / PROTOCOL_CELL)
    clear, secure = runs[False], runs[True]
    summaries = {k: json.loads((f / "summary.json").read_text()) for k, f in runs.items()}
    rows = {k: check.rows(f) for k, f in runs.items()}
    same_rows = sum(
        {k: v for k, v in a.items() if k != "seconds"}
        == {k: v for k, v in b.items() if k != "seconds"}
        for a, b in zip(rows[False], rows[True], strict=False)
    )
    verdict = "**identical**" if not check.compare_rows(rows[False], rows[True]) else "differ"
    summary_verdict = (
        "**identical** (but wall time and label)"
        if not check.compare_summaries(clear, secure)
        else "differ"
    )
    a, b = summaries[False], summaries[True]
    return "\n".join(
        [
            "| | clear (`enabled = false`) | protocol (`enabled = true`) |",
            "|---|---|---|",
            f"| rounds.jsonl, {len(rows[False])} lines | accuracy and loss of every round | "
            f"{verdict} ({same_rows} / {len(rows[True])} lines) |",
            f"| summary.json | | {summary_verdict} |",
            f"| final / best accuracy | {_pct(a['final_accuracy'])} / {_pct(a['best_accuracy'])} % "
            f"| {_pct(b['final_accuracy'])} / {_pct(b['best_accuracy'])} % |",
            f"| audit of the plans | {a['share']['audit']['verdict']} ({a['rounds']} rounds) "
            f"| {b['share']['audit']['verdict']} ({b['rounds']} rounds) |",
            f"| wall time (summary.json) | {a['wall_seconds']:.1f} s | {b['wall_seconds']:.1f} s |",
        ]
    )


STAGES = (
    ("clients: advertise (key pairs)", "clients advertise"),
    ("clients: share (key agreement, Shamir shares, encryption)", "clients share"),
    ("clients: mask (pairwise and self masks, d = 79,510)", "clients mask"),
    ("clients: unmask (send shares)", "clients unmask"),
)
SERVER_STAGES = ("server advertise", "server share", "server mask")


def protocol_stages(root: Path) -> str:
    """``stages.json``'s mean per round: the clear sums, the protocol's call, each client
    step (and per client) and server stage close, and the rest of the call."""
    mean = json.loads((root / PROTOCOL_CELL / "stages.json").read_text())["mean"]
    steps = [key for _, key in STAGES] + list(SERVER_STAGES) + ["server unmask"]
    rest = mean["protocol"] - sum(mean[k] for k in steps)
    lines = [
        "| step | wall s per round | per client per round |",
        "|---|---|---|",
        f"| clear sums (encode, plan, add) | {mean['clear']:.2f} (CPU {mean['clear cpu']:.2f}) | |",
        f"| protocol, whole call | {mean['protocol']:.2f} (CPU {mean['protocol cpu']:.2f}) | |",
    ]
    for text, key in STAGES:
        lines.append(f"| {text} | {mean[key]:.2f} | {1000 * mean[key] / CELL_CLIENTS:.1f} ms |")
    closes = " / ".join(f"{mean[k]:.3f}" for k in SERVER_STAGES)
    lines.append(f"| server: close advertise / share / mask | {closes} | |")
    lines.append(
        "| server: close unmask (reconstruct seeds, remove masks) | "
        f"{mean['server unmask']:.2f} | |"
    )
    lines.append(f"| rest of the call (encoding, plan, sessions) | {rest:.2f} | |")
    return "\n".join(lines)


def _sibling(name: str):
    """``experiments/<name>.py`` (``share_protocol_check``'s comparisons,
    ``share_audit_draws``' table), as a module."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blocks(root: Path) -> dict[str, str]:
    return {
        "share protocol cell": protocol_cell(root),
        "share protocol stages": protocol_stages(root),
        "share figure2": figure2(root / RUNS_30 / "figure2", acceptance=True),
        "share figure2 200": figure2(root / FIGURE2_200),
        "share figure3b 200": runs_table(root / FIGURE3B_200, ROWS_3B),
        "share figure9 200": runs_table(root / FIGURE9_200, ROWS_9),
        "share figure5": figure5(root),
        "share dp clients": dp_clients(root),
        "share audit draws": audit_draws(root),
        **{name: table_30(root, name) for name in TABLES_30},
    }


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
