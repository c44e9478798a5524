"""Table I of Ye, Zhu and Ling (seed004) on the rebuilt graph: upper bounds on ρ², χ² and
ρ² + χ² of the virtual mixing matrices of trimmed mean, SCC and IOS, beside the paper's
values, with λ and Theorem 1's ρ* = λ/(8√|R|). See
:mod:`sharefl.simulator.decentralized.mixing` for the formulas.

Usage::

    python experiments/decentralized_table1.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sharefl.simulator.decentralized.graph import erdos_renyi_graph
from sharefl.simulator.decentralized.mixing import table_one

#: The paper's Table I: (ρ², χ², ρ² + χ²).
PAPER = {
    "trimmed_mean": (1.9592, 0.1018, 2.0610),
    "scc": (2.7654, 0.0, 2.7654),
    "ios": (0.1111, 0.0, 0.1111),
}


RULE_NAMES = {"trimmed_mean": "trimmed mean", "scc": "SCC", "ios": "IOS"}


def table() -> dict:
    """The graph and one row per rule: the bounds, λ, ρ* and the paper's values."""
    graph = erdos_renyi_graph(12, 0.7, 2, seed=300)
    rows = []
    for bound in table_one(graph):
        row = bound.to_json()
        paper = PAPER[bound.rule]
        row |= {
            "paper_rho_squared": paper[0],
            "paper_chi_squared": paper[1],
            "paper_total": paper[2],
            "rho_squared_reproduced": round(bound.rho_squared, 4) == paper[0],
            "chi_squared_reproduced": round(bound.chi_squared, 4) == paper[1],
        }
        rows.append(row)
    return {"graph": {"edges": graph.edges, "byzantine": list(graph.byzantine)}, "rows": rows}


def markdown(rows: list[dict]) -> str:
    lines = [
        "| rule | ρ² | χ² | ρ²+χ² | paper ρ² / χ² / sum | λ | ρ* = λ/(8√\\|R\\|) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {RULE_NAMES[r['rule']]} | {r['rho_squared']:.4f} | {r['chi_squared']:.4f} | "
            f"{r['rho_squared_plus_chi_squared']:.4f} | {r['paper_rho_squared']:.4f} / "
            f"{r['paper_chi_squared']:.4g} / {r['paper_total']:.4f} | {r['lambda']:.4f} | "
            f"{r['rho_star']:.4f} |"
        )
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    """The page's block (computed from the code: the table is arithmetic on the graph)."""
    return {"decentralized table I": markdown(table()["rows"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    result = table()
    print(json.dumps(result, indent=2))
    print()
    print(markdown(result["rows"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
