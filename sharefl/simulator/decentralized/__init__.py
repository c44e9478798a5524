"""Decentralized learning with privacy and Byzantine robustness (Ye, Zhu and Ling).

- :mod:`.graph` — the agents' graph (the authors' Erdős–Rényi draw, or an edge list);
- :mod:`.mixing` — Table I: ρ², χ² of the virtual mixing matrices of TM, SCC and IOS;
- :mod:`.attacks` — Byzantine messages computed per receiving agent;
- :mod:`.accounting` — ε per agent, RDP accountant and Theorem 3;
- :mod:`.loop` — :class:`~.loop.DecentralizedLoop`, ``[algorithm] name = "decentralized"``;
- :mod:`.reference` — the same iteration with a Python loop over agents (tests, benchmark).
"""
