"""Every benchmark in benchmarks/ runs once at a tiny size (``--smoke``), so CI notices a
benchmark that no longer runs. The figures of a smoke run mean nothing; what is checked is
that the script exits 0 and prints the JSON lines it promises (a machine line first, a
summary line last)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))


def test_every_benchmark_is_listed():
    assert len(BENCHMARKS) >= 8


SLOW_SMOKES = {"bench_flower_deployment.py"}
"""Smoke runs that take minutes (processes of a real deployment starting): ``pytest -m slow``."""


@pytest.mark.benchmark
@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SMOKES else s for s in BENCHMARKS],
)
def test_the_benchmark_runs_at_a_tiny_size(script):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--smoke"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert records[0]["kind"] == "machine" and records[0]["smoke"] is True
    summary = records[-1]
    assert summary["kind"] == "summary" and summary["smoke"] is True
    assert summary["failed"] is None  # a smoke run judges no target
    assert len(records) >= 3  # at least one measurement between them
