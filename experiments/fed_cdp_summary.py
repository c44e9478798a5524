"""Tables of docs/results/fed-cdp.md, from the committed run folders.

- ``fed-cdp table III``: ``docs/results/fed-cdp/table3-leakage.json`` (``python
  experiments/fed_cdp_leakage.py --trials 20 --workers 1 --json ...``): per leaked gradient
  and defence, whether CPL failed on every trial, the mean reconstruction MSE, τ, SSIM and
  the attack success rate, beside the paper's figures; then the budget and the commit.
- ``fed-cdp sigma probe``: ``docs/results/fed-cdp/sigma-probe/`` (``sharefl simulate
  experiments/fed_cdp_sigma_probe.toml --out docs/results/fed-cdp/sigma-probe``): Fed-αCDP in
  Table IV's setting for 10 rounds, one row per (σ, learning rate, C): test accuracy and loss
  at every evaluated round, ε, wall time;
- ``fed-cdp sigma arithmetic``: ``docs/results/fed-cdp/sigma-arithmetic.json`` (``python
  experiments/fed_cdp_sigma_arithmetic.py --json ...``): the noise one local step and one round
  add at initialisation against the model's norm and the most signal a round can carry.

- ``fed-cdp layer noise``: ``docs/results/fed-cdp/layer-noise/`` (``sharefl simulate
  experiments/fed_cdp_layer_noise.toml --out docs/results/fed-cdp/layer-noise``): Fed-CDP at
  σ = 0.5 with our calibration (σ·√3·C) and with the authors' (σ·C per layer).

- ``fed-cdp table10``: ``docs/results/fed-cdp/table10/`` (``sharefl simulate
  experiments/fed_cdp_mnist_table10_small.toml --out docs/results/fed-cdp/table10 --match
  LABEL --rounds R``): Table X's adaptive-clipping baselines (quantile clipping, AdaClip)
  beside fixed flat clipping and Fed-CDP, in Table IV's setting, with the quantile bound C
  of the last round.

- ``fed-cdp table IV (small)``: ``docs/results/fed-cdp/table4-small/`` (``sharefl simulate
  experiments/fed_cdp_mnist_table4_small.toml --out docs/results/fed-cdp/table4-small --match
  LABEL``): Table IV in its CPU-sized setting, one row per method, at the paper's σ = 6,
  the authors' code's σ = 0.5 and any other σ run (our Fed-SDP probe): the accuracy of the
  last round (or the round from which the loss is NaN), the best evaluated accuracy, ε, the
  paper's figure and the wall time.
- ``fed-cdp table VI``: ``docs/results/fed-cdp/table6/`` (``sharefl simulate
  experiments/fed_cdp_mnist_table6.toml --out docs/results/fed-cdp/table6 --match LABEL``):
  Table VI at full scale (N = 1000, K_t = 100), the same rows.

- ``fed-cdp table VIII (small)``: ``docs/results/fed-cdp/table8-small/`` (``sharefl simulate
  experiments/fed_cdp_table8_small.toml --out docs/results/fed-cdp/table8-small --match
  LABEL``): Table VIII's decaying σ_t (linear, staircase, exponential, cyclic) and fixed σ in
  Table IV's setting for 20 rounds: σ_t of the first and last round, test accuracy at every
  evaluated round, final loss, ε, the paper's figure, wall time.
- ``fed-cdp table VIII (100 rounds)``: ``docs/results/fed-cdp/table8-small-100/`` (the same
  command with ``--rounds 100 --out docs/results/fed-cdp/table8-small-100``): the
  exponential schedule at the authors' noise scale against fixed σ = 0.5 over Table VIII's
  T = 100, accuracy at every tenth round.

``python experiments/results_pages.py`` writes them into the page (``--check`` compares).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sharefl.simulator.results import RoundRecord, RunRecord, load_runs

PROBE = Path("docs/results/fed-cdp/sigma-probe")
LAYER_NOISE = Path("docs/results/fed-cdp/layer-noise")
ARITHMETIC = Path("docs/results/fed-cdp/sigma-arithmetic.json")
LEAKAGE = Path("docs/results/fed-cdp/table3-leakage.json")
LEAKED = {0: "type 0, client update", 1: "type 1, client update", 2: "type 2, per example"}
TABLE10 = Path("docs/results/fed-cdp/table10")
TABLE8 = Path("docs/results/fed-cdp/table8-small")
TABLE8_100 = Path("docs/results/fed-cdp/table8-small-100")
TABLE4 = Path("docs/results/fed-cdp/table4-small")
TABLE6 = Path("docs/results/fed-cdp/table6")
PAPER_METHODS = ("non-private", "Fed-SDP", "Fed-CDP", "Fed-αCDP")  # Tables IV and VI's rows


def _loss(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def _finished_runs(folder: Path) -> list[RunRecord]:
    """The finished runs under ``folder`` (:func:`~sharefl.simulator.results.load_runs`, the
    checked reader), in the natural order of their folders; ``[]`` when it is missing."""
    return [r for r in load_runs(folder) if r.finished] if folder.is_dir() else []


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _eps(run: RunRecord) -> str:
    return "—" if run.epsilon is None else f"{run.epsilon:.3g}"


def probe_table(root: Path) -> str:
    runs = []
    for run in _finished_runs(root / PROBE):
        p, t = run.config["privacy"], run.config["training"]
        key = (1, p["noise_multiplier"], -t["learning_rate"], -p["clip"]) if p["enabled"] else (0,)
        runs.append((key, run))
    if not runs:
        return "(not run)"
    rounds = [r.round for r in runs[0][1].rounds]
    head = " | ".join(f"round {r}" for r in rounds)
    lines = [
        f"| run | {head} | final loss | ε (δ = 1e-5) | wall (s) |",
        "|---" * (len(rounds) + 4) + "|",
    ]
    for _, run in sorted(runs, key=lambda r: r[0]):
        accs = " | ".join(_percent(r.accuracy) for r in run.rounds)
        lines.append(
            f"| {run.label} | {accs} | {_loss(run.rounds[-1].loss)} | {_eps(run)} | "
            f"{run.wall_seconds:.0f} |"
        )
    return "\n".join(lines)


def _at(run: RunRecord, rounds: tuple[int, ...] | list[int]) -> str:
    """The run's accuracy (%) at each of ``rounds``, "–" where it was not evaluated."""
    by_round: dict[int, RoundRecord] = {r.round: r for r in run.rounds}
    return " | ".join(_percent(by_round[t].accuracy) if t in by_round else "–" for t in rounds)


def layer_noise_table(root: Path) -> str:
    runs = _finished_runs(root / LAYER_NOISE)
    lines = [
        "| run | noise per coordinate on the sum | round 20 | round 40 | round 60 | round 80 | "
        "round 100 | paper | ε (δ = 1e-5) | wall (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        c = run.config["privacy"]
        noise = c["noise_multiplier"] * math.sqrt(3) * c["clip"]  # 3 layers clipped to C
        lines.append(
            f"| {run.label} | {noise:.2f} | {_at(run, (20, 40, 60, 80, 100))} | "
            f"{_percent(run.paper)} | {_eps(run)} | {run.wall_seconds:.0f} |"
        )
    return "\n".join(lines) if runs else "(not run)"


def _update_noise(privacy: dict) -> str:
    """σ of the noise on the clipped sum, in units of its bound (quantile: σ_Δ of Andrew et
    al.'s Theorem 1; per-layer: σ·√3 for the three layers of the CNN)."""
    sigma = privacy["noise_multiplier"]
    if privacy["clipping"] == "quantile":
        count_std = privacy["clipping_options"]["count_std"]
        return f"σ_Δ = {(sigma**-2 - (2 * count_std) ** -2) ** -0.5:.4g}"
    if privacy["clipping"] == "per_layer":
        return f"σ·√3 = {sigma * math.sqrt(3):.4g}"
    return f"σ = {sigma:g}"


def table10_table(root: Path) -> str:
    rounds = (10, 20, 30, 40, 50)
    lines = [
        "| run | seed | clipping | accounted σ | noise on the sum (× its bound) | "
        + " | ".join(f"round {t}" for t in rounds)
        + " | bound in the last round | ε (δ = 1e-5) | wall (s) |",
        "|---" * (len(rounds) + 8) + "|",
    ]
    last: dict[str, list[float]] = {}  # label -> accuracy at the last round, per seed
    order = ("per_layer", "flat", "quantile", "adaclip")
    runs = []
    for run in _finished_runs(root / TABLE10):
        p = run.config["privacy"]
        key = (p["noise_multiplier"] > 1, order.index(p["clipping"]), run.label, run.seed)
        runs.append((key, run))
    for _, run in sorted(runs, key=lambda item: item[0]):
        p = run.config["privacy"]
        if p["clipping"] == "quantile":
            clip_norm = run.extra["adaptive_clipping"]["clip_norm"][-1]
            bound = f"C = {clip_norm:.3g} (C₀ = {p['clip']:g})"
        elif p["clipping"] == "adaclip":
            bound = f"‖w‖ ≤ {p['clipping_options'].get('max_norm', 1.0):g} (transformed)"
        else:
            bound = f"C = {p['clip']:g} (fixed)"
        lines.append(
            f"| {run.label} | {run.seed} | {p['clipping']} | {p['noise_multiplier']:g} | "
            f"{_update_noise(p)} | {_at(run, rounds)} | {bound} | {_eps(run)} | "
            f"{run.wall_seconds:.0f} |"
        )
        last.setdefault(run.label, []).append(100 * (run.final_accuracy or 0.0))
    if not runs:
        return "(not run)"
    spread = [
        f"{label}: {sum(v) / len(v):.1f} (seeds {', '.join(f'{x:.1f}' for x in v)})"
        for label, v in last.items()
        if len(v) > 1
    ]
    if spread:
        lines += ["", "Mean accuracy at the last round: " + "; ".join(spread) + "."]
    return "\n".join(lines)


def _sigma_range(privacy: dict, rounds: int) -> str:
    """σ_t of the first and the last round (0-based t = 0 and rounds − 1)."""
    from sharefl.privacy.schedules import SCHEDULE_CLASSES, schedule_options

    sigma, name = privacy["noise_multiplier"], privacy["schedule"]
    if name == "constant" and not privacy["schedule_options"]:
        return f"{sigma:g}"
    schedule = SCHEDULE_CLASSES[name](**schedule_options(name, privacy["schedule_options"], sigma))
    return f"{schedule(0):.2f} → {schedule(rounds - 1):.2f}"


def _outcome(run: RunRecord) -> str:
    """The last round's accuracy (%), or where the loss first became NaN."""
    nan = next((r.round for r in run.rounds if r.loss is not None and math.isnan(r.loss)), None)
    if nan is not None:
        return f"diverges (NaN loss from round {nan})"
    return _percent(run.rounds[-1].accuracy)


def methods_table(root: Path, folder: Path = TABLE4) -> str:
    """Table IV (small) or Table VI: a row per method and σ (6, the paper's; 0.5, the
    authors' code's; any other σ run, such as the Fed-SDP probe), "not run" where no folder
    of ``folder`` holds the cell; a method outside the paper's four (a σ schedule) follows
    them when it was run."""
    cells: dict[tuple[str, float | None], RunRecord] = {}
    for run in _finished_runs(root / folder):
        p = run.config["privacy"]
        sigma = p["noise_multiplier"] if p["enabled"] else None
        cells[(run.label.split(",")[0], sigma)] = run
    methods = [*PAPER_METHODS, *sorted({m for m, _ in cells} - set(PAPER_METHODS))]
    lines = [
        "| method | σ | last round (100) | best evaluation | ε (δ = 1e-5) | paper "
        "| wall time (min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in methods:
        run_sigmas = {sigma for m, sigma in cells if m == method and sigma is not None}
        paper_sigmas = {6.0, 0.5} if method in PAPER_METHODS else set()
        sigmas = sorted(paper_sigmas | run_sigmas, reverse=True)
        for sigma in (None,) if method == "non-private" else sigmas:
            name = "—" if sigma is None else f"{sigma:g}"
            if (method, sigma) not in cells:
                lines.append(f"| {method} | {name} | not run | | | | |")
                continue
            run = cells[(method, sigma)]
            paper = "—" if run.paper is None else _percent(run.paper)
            lines.append(
                f"| {method} | {name} | {_outcome(run)} | {_percent(run.best_accuracy)} "
                f"| {_eps(run)} | {paper} | {(run.wall_seconds or 0.0) / 60:.1f} |"
            )
    return "\n".join(lines)


def table8_table(root: Path, folder: Path = TABLE8, every: int = 1) -> str:
    """One row per run of ``folder``; accuracy at every ``every``-th evaluated round."""
    order = ("constant", "linear", "staircase", "exponential", "cyclic")
    runs = []
    for run in _finished_runs(root / folder):
        p = run.config["privacy"]
        key = (p["noise_multiplier"] < 2, order.index(p["schedule"]), run.label, run.seed)
        runs.append((key, run))
    if not runs:
        return "(not run)"
    evaluated = sorted({r.round for _, run in runs for r in run.rounds})
    rounds = evaluated[every - 1 :: every]
    lines = [
        "| run | seed | σ_t, first → last round | "
        + " | ".join(f"round {t}" for t in rounds)
        + " | final loss | ε (δ = 1e-5) | paper (ε = 0.823, T = 100) | wall (s) |",
        "|---" * (len(rounds) + 7) + "|",
    ]
    for _, run in sorted(runs, key=lambda item: item[0]):
        sigmas = _sigma_range(run.config["privacy"], run.total_rounds or 0)
        lines.append(
            f"| {run.label} | {run.seed} | {sigmas} | {_at(run, rounds)} | "
            f"{_loss(run.rounds[-1].loss)} | {_eps(run)} | {_percent(run.paper)} | "
            f"{run.wall_seconds:.0f} |"
        )
    return "\n".join(lines)


def _yn(flag: bool) -> str:
    return "Y" if flag else "N"


def table3_table(root: Path) -> str:
    path = root / LEAKAGE
    if not path.is_file():
        return "(not run)"
    document = json.loads(path.read_text())
    lines = [
        '| leaked gradient | defence | resilient (paper) | MSE (paper\'s "RMSE") | τ (paper) '
        "| SSIM | ASR |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in document["cells"]:
        paper = cell["paper"] or {}
        batch = f" (B = {cell['batch_size']})" if cell["batch_size"] > 1 else ""
        defence = "none" if cell["defence"] == "none" else cell["row"]
        lines.append(
            f"| {LEAKED[cell['attack_type']]}{batch} | {defence} "
            f"| {_yn(cell['resilient'])} ({_yn(paper['resilient']) if paper else '—'}) "
            f"| {cell['mean_mse']:.3g} ({paper.get('recon_dist', '—')}) "
            f"| {cell['mean_tau']:.3g} ({paper.get('tau', '—')}) "
            f"| {cell['mean_ssim']:.3f} | {cell['asr']:.2f} |"
        )
    settings, env = document["settings"], document["environment"]
    workers = f"{settings['workers']} worker{'s' if settings['workers'] > 1 else ''}"
    lines += [
        "",
        f"{settings['trials']} trials per cell (seed {settings['seed']}, MNIST {settings['split']} "
        f"images, σ = {settings['sigma']:g}, C = {settings['clip']:g}, τ ≤ "
        f"{settings['max_iterations']}), {document['wall_seconds'] / 60:.1f} min on "
        f"{workers} of one thread, commit {(env['commit'] or '?')[:7]}, "
        f"CPU kernels {env['cpu_capability']}.",
    ]
    return "\n".join(lines)


def arithmetic_table(root: Path) -> str:
    path = root / ARITHMETIC
    if not path.is_file():
        return "(not run)"
    a = json.loads(path.read_text())
    st = a["setting"]
    lines = [
        f"Model norm at initialisation {a['model_norm_total']:.2f} (per layer: "
        + ", ".join(f"{k} {v:.2f}" for k, v in a["model_norm"].items())
        + f"); largest per-example layer gradient norm over {st['batches']} batches of "
        f"B = {st['B']}: "
        + ", ".join(f"{k} {v:.2f}" for k, v in a["max_example_layer_norm"].items())
        + f"; so S = min(C, max layer norm) = {a['S']:.2f} (range over batches "
        f"{a['S_range'][0]:.2f}–{a['S_range'][1]:.2f}); norm of the clipped mean gradient "
        f"{a['mean_clipped_gradient_norm']:.2f} (mean over batches). d = {st['d']:,}, "
        f"lr = {st['lr']}, L = {st['L']}, K_t = {st['K']}.",
        "",
        "| σ | noise std per coordinate (σS/B) | noise norm, one local step | signal norm, one "
        "local step | noise norm, one round (global model) | signal norm, one round, every step "
        "aligned | round noise / model norm |",
        "|---|---|---|---|---|---|---|",
    ]
    for sigma, v in a["per_sigma"].items():
        lines.append(
            f"| {float(sigma):g} | {v['noise_std_per_coordinate_of_the_gradient']:.3g} | "
            f"{v['step_noise_norm']:.3g} | {v['step_signal_norm']:.3g} | "
            f"{v['round_noise_norm']:.3g} | {v['round_signal_norm_at_most']:.3g} | "
            f"{v['round_noise_over_model_norm']:.3g} |"
        )
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    return {
        "fed-cdp table III": table3_table(root),
        "fed-cdp sigma arithmetic": arithmetic_table(root),
        "fed-cdp sigma probe": probe_table(root),
        "fed-cdp layer noise": layer_noise_table(root),
        "fed-cdp table10": table10_table(root),
        "fed-cdp table IV (small)": methods_table(root),
        "fed-cdp table VI": methods_table(root, TABLE6),
        "fed-cdp table VIII (small)": table8_table(root),
        "fed-cdp table VIII (100 rounds)": table8_table(root, TABLE8_100, every=5),
    }


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
