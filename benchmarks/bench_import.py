"""What importing sharefl costs a process, against the library it embeds in, same run.

A Flower ClientApp process imports its app module for every message it serves when its
SuperExec starts one process per message, so the client side of the integration must
import what a client needs and nothing more (torch and the robust rules are the server's).
Each case runs ``--repeat`` fresh interpreters (``python -c "import ..."``), interleaved
with its baseline, and reports the CPU seconds (user + system, the child's rusage) of the
best and median run:

- ``flower_client``: ``from sharefl.integrations.flower import sharefl_mod`` against
  ``import flwr.clientapp`` (what every Flower ClientApp imports anyway) — the ratio is
  what the mod adds to a Flower client process;
- ``flower_server``: ``from sharefl.integrations.flower import ShareflStrategy`` (the robust
  rules and torch) against ``import flwr.serverapp``;
- ``protocol``: ``import sharefl.protocol`` (numpy and cryptography only) against
  ``import numpy, cryptography.hazmat.primitives.asymmetric.x25519``;
- ``privacy``: ``import sharefl.privacy`` (lazy: nothing heavy until a name is used)
  against ``import numpy``.

Each line also says whether torch was imported (``torch_loaded``). Target: the client side
of the integration costs at most 1.5× ``import flwr.clientapp`` (the mod adds at most half
of what a Flower client process pays anyway) and loads no torch.
Run: ``python benchmarks/bench_import.py [--repeat 7]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from typing import Any

from common import add_smoke_flag, emit, emit_machine, finish, use_smoke

CASES: dict[str, tuple[str, str]] = {
    "flower_client": (
        "from sharefl.integrations.flower import sharefl_mod",
        "import flwr.clientapp",
    ),
    "flower_server": (
        "from sharefl.integrations.flower import ShareflStrategy",
        "import flwr.serverapp",
    ),
    "protocol": (
        "import sharefl.protocol",
        "import numpy, cryptography.hazmat.primitives.asymmetric.x25519",
    ),
    "privacy": ("import sharefl.privacy", "import numpy"),
}
CLIENT_TARGET = 1.5
"""The client side of the integration against ``import flwr.clientapp``."""

_REPORT = "import json, sys; print(json.dumps({'torch_loaded': 'torch' in sys.modules}))"


def one_import(statement: str) -> tuple[float, bool]:
    """CPU seconds (user + system) of a fresh interpreter running ``statement``, and
    whether torch ended up imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", f"{statement}\n{_REPORT}"],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, bool(json.loads(done.stdout.splitlines()[-1])["torch_loaded"])


def measure(name: str, statement: str, baseline: str, repeat: int) -> dict[str, Any]:
    ours, base, torch_loaded = [], [], False
    one_import(statement)  # warm the file cache for both
    one_import(baseline)
    for _ in range(repeat):
        cpu, torch_loaded = one_import(statement)
        ours.append(cpu)
        base.append(one_import(baseline)[0])
    record: dict[str, Any] = {
        "kind": "import",
        "name": name,
        "statement": statement,
        "cpu_s_best": min(ours),
        "cpu_s_median": statistics.median(ours),
        "baseline": baseline,
        "baseline_cpu_s_best": min(base),
        "baseline_cpu_s_median": statistics.median(base),
        "ratio_best": min(ours) / min(base),
        "torch_loaded": torch_loaded,
    }
    if name == "flower_client":
        record["target"] = f"ratio_best <= {CLIENT_TARGET} and no torch"
        record["pass"] = record["ratio_best"] <= CLIENT_TARGET and not torch_loaded
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    add_smoke_flag(parser)
    args = parser.parse_args()
    smoke = use_smoke(args)
    emit_machine("bench_import")
    repeat = 1 if smoke else args.repeat
    cases = ["protocol"] if smoke else args.cases
    records = []
    for name in cases:
        statement, baseline = CASES[name]
        records.append(measure(name, statement, baseline, repeat))
        emit(records[-1])
    finish(records)


if __name__ == "__main__":
    main()
