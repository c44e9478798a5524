"""How many Byzantine uploads the DP filter selects, step by step, in one cell of a file.

Runs ``sharefl simulate FILE --seeds SEED --match LABEL`` in this process with the filter's
:meth:`~sharefl.robust.noise_filter.NoiseAwareFilter.filter` wrapped to count, at each step,
the selected rows that are Byzantine and those that are honest (the federated loop stacks
the honest uploads first, then the Byzantine ones), and stops after ``--steps`` steps with
one line of JSON: the Byzantine counts of the first 20 steps, the number of steps with any,
the last such step, and the honest uploads selected per step (mean, least)::

    python experiments/dp_filter_selected.py experiments/dp_filter_mnist_table2_mnist.toml \\
        --match "alie, 30 Byzantine" --seed 1 --steps 300

The run's folder goes to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from sharefl.robust import noise_filter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--match", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)

    from sharefl.cli import main as cli
    from sharefl.simulator.config import load_runs

    runs = [r for r in load_runs(args.config) if args.match in r.label and r.seed == args.seed]
    if len(runs) != 1:
        labels = sorted({r.label for r in load_runs(args.config)})
        parser.error(
            f"--match must pick one run of seed {args.seed}, got {len(runs)}; labels: {labels}"
        )
    (run,) = runs
    honest = run.clients.honest
    out = tempfile.mkdtemp(prefix="dp_filter_selected-")
    counts: list[int] = []
    honest_counts: list[int] = []
    filter_ = noise_filter.NoiseAwareFilter.filter

    def counting(self, X, aux):
        result = filter_(self, X, aux)
        selected = result.selected.tolist()
        counts.append(sum(1 for i in selected if i >= honest))
        honest_counts.append(len(selected) - counts[-1])
        if len(counts) >= args.steps:
            last = max((i + 1 for i, c in enumerate(counts) if c), default=0)
            report = {
                "label": run.label,
                "seed": args.seed,
                "steps": len(counts),
                "selected_per_step": int(result.selected.numel()),
                "byzantine_selected_first_20_steps": counts[:20],
                "steps_with_byzantine_selected": sum(1 for c in counts if c),
                "last_step_with_byzantine_selected": last,
                "honest_selected_per_step_mean": sum(honest_counts) / len(honest_counts),
                "honest_selected_per_step_least": min(honest_counts),
            }
            print(json.dumps(report, ensure_ascii=False), flush=True)
            shutil.rmtree(out, ignore_errors=True)
            os._exit(0)  # the rest of the run is not needed
        return result

    noise_filter.NoiseAwareFilter.filter = counting
    try:
        cli(
            [
                "simulate",
                args.config,
                "--seeds",
                str(args.seed),
                "--match",
                args.match,
                "--out",
                out,
            ]
        )
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
