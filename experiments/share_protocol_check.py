"""Check that a run through the protocol equals the same run in the clear, bit for bit.

``experiments/share_mnist_protocol_cell.toml`` runs one SHARE cell twice, with
``secure_aggregation.enabled = false`` (each cluster's encoded inputs added in the clear) and
``true`` (the double-masking protocol, in process). Both draw the plan, the encoding and the
stochastic rounding from the same seed (:func:`sharefl.protocol.driver.secure_sum`), so the
released ring sums, and with them every round's model, must be identical. This script
compares, for the two runs found under a results folder:

- ``rounds.jsonl``: every line, all keys except the wall-clock ``seconds`` (accuracy and
  loss as written, i.e. the float32 loss's full repr: equal strings, not a tolerance);
- ``model.npz``: every array, byte for byte;
- ``summary.json``: every key except ``wall_seconds``, ``label``, ``run_id`` and
  ``environment`` (the process that finished the run, whose command differs): the audit
  verdict, the final and best accuracy, the device, and its ``config`` except ``label`` and
  ``secure_aggregation.enabled`` (the only two settings the runs may differ in).

Optionally (``--reference FOLDER``) it also compares the clear run's rows with a longer
recorded run of the same cell (e.g. Figure 9's 200-round record) at the rounds both
evaluated. Exit status 0 when everything agrees, 1 otherwise (each difference printed).

    python experiments/share_protocol_check.py /work/runs/share_protocol \
        --reference docs/results/share/runs-200/figure9/<run>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

IGNORED_SUMMARY = {"wall_seconds", "label", "run_id", "folder", "name", "environment"}


def rows(folder: Path) -> list[dict]:
    """The run's ``rounds.jsonl`` as dicts, in order."""
    with open(folder / "rounds.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def find_runs(out: Path) -> dict[bool, Path]:
    """``{enabled: folder}`` of the two runs under ``out`` (by their ``config.json``)."""
    runs: dict[bool, Path] = {}
    for config in sorted(out.glob("*/config.json")):
        c = json.loads(config.read_text())
        enabled = bool(c["secure_aggregation"]["enabled"])
        if enabled in runs:
            raise SystemExit(f"two runs with enabled = {enabled} under {out}: pass one pair")
        runs[enabled] = config.parent
    if set(runs) != {False, True}:
        raise SystemExit(f"need one run with enabled = false and one with true under {out}")
    return runs


def compare_rows(clear: list[dict], secure: list[dict]) -> list[str]:
    problems = []
    if len(clear) != len(secure):
        problems.append(f"rounds.jsonl: {len(clear)} lines in the clear, {len(secure)} secure")
    for a, b in zip(clear, secure, strict=False):
        a2 = {k: v for k, v in a.items() if k != "seconds"}
        b2 = {k: v for k, v in b.items() if k != "seconds"}
        if a2 != b2:
            problems.append(f"round {a.get('round')}: clear {a2} != protocol {b2}")
    return problems


def compare_models(clear: Path, secure: Path) -> list[str]:
    a, b = np.load(clear / "model.npz"), np.load(secure / "model.npz")
    problems = []
    if sorted(a.files) != sorted(b.files):
        return [f"model.npz entries differ: {sorted(a.files)} vs {sorted(b.files)}"]
    for name in a.files:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64)).max()
            problems.append(f"model.npz[{name}]: not bit-identical (max |diff| {diff:g})")
    return problems


def compare_summaries(clear: Path, secure: Path) -> list[str]:
    a = json.loads((clear / "summary.json").read_text())
    b = json.loads((secure / "summary.json").read_text())
    problems = []
    for key in sorted(set(a) | set(b)):
        if key in IGNORED_SUMMARY:
            continue
        x, y = a.get(key), b.get(key)
        if key == "config":
            x, y = _settings(x), _settings(y)
        if x != y:
            problems.append(f"summary.json[{key}]: {x!r} != {y!r}")
    return problems


def _settings(config: dict) -> dict:
    """A run's settings without the two keys the pair differs in."""
    out = {k: v for k, v in config.items() if k != "label"}
    out["secure_aggregation"] = {
        k: v for k, v in config["secure_aggregation"].items() if k != "enabled"
    }
    return out


def compare_reference(clear: list[dict], reference: Path) -> tuple[int, list[str]]:
    """Rows of ``clear`` against a recorded run's rows at the rounds both evaluated."""
    ref = {r["round"]: r for r in rows(reference)}
    problems, common = [], 0
    for row in clear:
        other = ref.get(row["round"])
        if other is None:
            continue
        common += 1
        a = {k: v for k, v in row.items() if k != "seconds"}
        b = {k: v for k, v in other.items() if k != "seconds"}
        if a != b:
            problems.append(f"reference round {row['round']}: {a} != {b}")
    return common, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder holding the two runs")
    parser.add_argument("--reference", type=Path, help="a recorded run of the same cell")
    args = parser.parse_args(argv)
    runs = find_runs(args.out)
    clear, secure = rows(runs[False]), rows(runs[True])
    problems = compare_rows(clear, secure)
    problems += compare_models(runs[False], runs[True])
    problems += compare_summaries(runs[False], runs[True])
    print(f"clear:    {runs[False].name}\nprotocol: {runs[True].name}")
    print(f"rounds.jsonl: {len(clear)} / {len(secure)} lines compared (all keys but seconds)")
    if args.reference is not None:
        common, ref_problems = compare_reference(clear, args.reference)
        print(f"reference {args.reference.name}: {common} common rounds compared")
        problems += ref_problems
    for p in problems:
        print("DIFFERS:", p)
    if not problems:
        print("identical: rounds.jsonl (but seconds), model.npz, summary.json (but wall time)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
