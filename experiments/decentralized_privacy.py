"""The privacy accounting table of docs/results/decentralized.md (seed004, Theorem 3).

Per honest agent of the MNIST setting (M = 10, B = 32, δ = 1e-4, S = 6,000 examples, the
i.i.d. split): ε after K iterations at noise C, from the RDP accountant under add/remove-one
and replace-one adjacency and from Theorem 3's closed form, beside the paper's Theorem 3
figures (its K = 50,000). Computed from the code
(:class:`~sharefl.simulator.decentralized.accounting.AgentPrivacy`, what every noisy run's
``summary.json`` reports per agent); ``python experiments/results_pages.py`` writes it into
the page, and this script prints it::

    python experiments/decentralized_privacy.py
"""

from __future__ import annotations

from pathlib import Path

from sharefl.simulator.decentralized.accounting import AgentPrivacy

CLIP, BATCH, EXAMPLES, DELTA = 10.0, 32, 6000, 1e-4
NOISES = (2.0, 3.0, 5.0)
ITERATIONS = (1000, 50_000)
#: The paper's Theorem 3 ε at K = 50,000, per C.
PAPER = {2.0: 1.67, 3.0: 1.10, 5.0: 0.65}


def _agent(noise: float, iterations: int, adjacency: str) -> AgentPrivacy:
    return AgentPrivacy(noise, CLIP, BATCH, EXAMPLES, iterations, DELTA, adjacency)


def table() -> str:
    lines = [
        "| C | K | ε RDP add/remove | ε RDP replace-one | ε Theorem 3 |",
        "|---|---|---|---|---|",
    ]
    for noise in NOISES:
        for iterations in ITERATIONS:
            add_remove = _agent(noise, iterations, "add_remove")
            replace_one = _agent(noise, iterations, "replace_one")
            theorem3 = f"{add_remove.theorem3_epsilon():#.3g}"
            if iterations == 50_000:
                theorem3 = f"**{theorem3}** (paper {PAPER[noise]:.2f})"
            lines.append(
                f"| {noise:g} | {iterations:,} | {add_remove.rdp_epsilon():#.3g} "
                f"| {replace_one.rdp_epsilon():#.3g} | {theorem3} |"
            )
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    return {"decentralized privacy": table()}


if __name__ == "__main__":
    print(table())
