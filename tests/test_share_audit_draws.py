"""experiments/share_audit_draws.py audits random and safe plans (docs/results/share.md's
draws table comes from its JSON): the rank arithmetic of independent random partitions,
the safe planner never leaking, and a rerun giving the same draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "share_audit_draws.py"


def _run(tmp_path: Path, name: str) -> dict:
    out = tmp_path / name
    subprocess.run(
        [sys.executable, str(SCRIPT), "--draws", "2", "--json", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return json.loads(out.read_text())


def test_random_plans_reach_full_rank_and_leak_while_safe_plans_do_not(tmp_path: Path) -> None:
    document = _run(tmp_path, "a.json")
    cells = {(c["m"], c["R"], c["planner"]): c for c in document["cells"]}
    n = document["settings"]["clients"]
    for (m, r, planner), cell in cells.items():
        ranks = {d["rank"] for d in cell["draws"]}
        if planner == "safe":
            assert cell["leaking"] == 0 and all(d["solvable"] == 0 for d in cell["draws"])
            continue
        # R independent partitions into n/m clusters: rank min(n, R(n/m − 1) + 1) for almost
        # every draw, and at full rank every update is solvable
        expected = min(n, r * (n // m - 1) + 1)
        assert max(ranks) <= expected
        if expected == n:
            assert cell["leaking"] == len(cell["draws"])
            assert all(d["solvable"] == n for d in cell["draws"])
    assert cells[(3, 1, "random")]["leaking"] == 0  # one partition into clusters of 3
    assert "share_audit_draws.py --draws 2" in document["environment"]["command"]


def test_a_rerun_draws_the_same_plans(tmp_path: Path) -> None:
    first, second = _run(tmp_path, "a.json"), _run(tmp_path, "b.json")
    assert first["cells"] == second["cells"]
