"""Shared helpers of the benchmark scripts: timing and JSON-lines output.

Each benchmark prints one JSON object per line. Every measurement of ours is paired with a
baseline measured in the same run (the machines are shared and noisy: ratios count, single
absolute times do not).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from sharefl.machine import machine_info

SMOKE_HELP = (
    "tiny sizes and one repetition: checks that the benchmark runs (CI runs every benchmark "
    "so); its figures mean nothing and its targets are not judged"
)
_smoke = False


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    """Give a benchmark the ``--smoke`` flag (see :data:`SMOKE_HELP`)."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def use_smoke(args: argparse.Namespace) -> bool:
    """Switch timing to one run without warm-up when ``args.smoke``; returns it."""
    global _smoke
    _smoke = bool(args.smoke)
    return _smoke


def _measure(calls: list[Callable[[], object]], repeat: int, warmup: int) -> list[dict[str, float]]:
    """Run the calls in turn ``warmup`` + ``repeat`` times; best and median seconds of each.

    The garbage collector is disabled while timing so a collection does not land in one run.
    """
    if _smoke:
        repeat, warmup = 1, 0
    for _ in range(warmup):
        for call in calls:
            call()
    times: list[list[float]] = [[] for _ in calls]
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for sink, call in zip(times, calls, strict=True):
                start = time.perf_counter()
                call()
                sink.append(time.perf_counter() - start)
    finally:
        if enabled:
            gc.enable()
    return [{"best_s": min(t), "median_s": statistics.median(t)} for t in times]


def timeit(fn: Callable[[], object], *, repeat: int = 30, warmup: int = 2) -> dict[str, float]:
    """Best and median wall time in seconds of ``fn`` over ``repeat`` runs."""
    return _measure([fn], repeat, warmup)[0]


def compare(
    fn: Callable[[], object],
    baseline: Callable[[], object],
    *,
    repeat: int = 30,
    warmup: int = 2,
) -> tuple[dict[str, float], dict[str, float]]:
    """Time ``fn`` and ``baseline`` interleaved (fn, baseline, fn, baseline, ...).

    On a shared machine the speed drifts over seconds; alternating the two puts both under
    the same conditions, so the ratio of their best times is meaningful. Returns the
    :func:`timeit`-style summaries of ``fn`` and of ``baseline``.
    """
    measured, base = _measure([fn, baseline], repeat, warmup)
    return measured, base


def emit(record: dict[str, Any]) -> None:
    """Print one JSON line and flush (so a piped consumer sees results as they come)."""
    print(json.dumps(record, sort_keys=False), flush=True)


def emit_machine(benchmark: str, **extra: Any) -> None:
    """The first line of every benchmark: what ran where."""
    emit({"benchmark": benchmark, "kind": "machine", "smoke": _smoke, **machine_info(), **extra})


def finish(records: list[dict[str, Any]], *, strict: bool = False) -> None:
    """Print a summary line; with ``strict``, exit 1 when a target was missed (never in a
    smoke run, whose sizes are not the targets')."""
    targets = sum("pass" in r for r in records)
    if _smoke:  # tiny sizes: the targets are not judged
        emit({"kind": "summary", "smoke": True, "targets": targets, "failed": None})
        return
    failed = [r["name"] for r in records if r.get("pass") is False]
    emit({"kind": "summary", "smoke": False, "targets": targets, "failed": failed})
    if strict and failed:
        sys.exit(1)
