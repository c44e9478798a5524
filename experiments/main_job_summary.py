"""The main job's table of docs/results/README.md, from the committed run folders.

- ``main job``: one row per way of running ``experiments/quickstart.toml`` — in one process
  (``sharefl simulate``, folder ``docs/results/main-job/simulate/``) and as a server with
  one client process per client over gRPC on loopback (``sharefl launch``, folder
  ``docs/results/main-job/launch/``): the final test accuracy (%), ε at the file's δ, the
  rounds, the run's wall time (the server's, for ``launch``), the device and threads, the
  torch CPU kernels, and the commit and day the run finished (from ``summary.json``'s
  ``environment``). A folder without a finished run gives a row that says so.

``python experiments/results_pages.py`` writes it into the page (``--check`` compares); this
script prints it alone.
"""

from __future__ import annotations

from pathlib import Path

from sharefl.simulator.results import RunRecord, load_runs

MAIN_JOB = Path("docs/results/main-job")
WAYS = (  # folder under MAIN_JOB -> how the run was made
    (
        "simulate",
        "`sharefl simulate experiments/quickstart.toml` (one process, vectorised clients)",
    ),
    (
        "launch",
        "`sharefl launch experiments/quickstart.toml` (server + 20 client processes, gRPC "
        "on loopback)",
    ),
)


def _minutes(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s"


def _row(way: str, runs: list[RunRecord]) -> str:
    finished = [r for r in runs if r.finished and r.final_accuracy is not None]
    if not finished:
        return f"| {way} | not run | | | | | |"
    run = finished[-1]
    env = run.extra.get("environment", {})
    accuracy = f"**{100 * (run.final_accuracy or 0.0):.2f}%**"
    eps = "–" if run.epsilon is None else f"{run.epsilon:.2f} (δ = {run.delta:.2g})"
    wall = "–" if run.wall_seconds is None else _minutes(run.wall_seconds)
    kernels = env.get("cpu_capability", "?")
    made = f"{str(env.get('commit', '?'))[:7]}, {str(env.get('finished', '?'))[:10]}"
    return (
        f"| {way} | {accuracy} | {eps} | {run.total_rounds} | {wall} | {run.device} "
        f"({kernels}) | {made} |"
    )


def main_job_table(root: Path) -> str:
    lines = [
        "| command | test accuracy | ε | rounds | wall time of the run | device (torch "
        "kernels) | commit, day |",
        "|---|---|---|---|---|---|---|",
    ]
    for folder, way in WAYS:
        path = root / MAIN_JOB / folder
        lines.append(_row(way, list(load_runs(path)) if path.is_dir() else []))
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    return {"main job": main_job_table(root)}


if __name__ == "__main__":
    for name, text in blocks(Path(".")).items():
        print(f"## {name}\n\n{text}\n")
