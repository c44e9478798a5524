"""Table I of Ye, Zhu and Ling: the virtual mixing matrices W of trimmed mean, SCC and IOS
on a graph, their contraction constants ρ (Definition 1) and skewness χ².

All three start from the Metropolis-Hastings weights w' of the *full* graph (Byzantine
agents included). Per honest agent n, with R_n / B_n its honest / Byzantine neighbours and
q_n = |B_n| (the code's choice):

* trimmed mean (Lemma 1): w_nm = 1/(|R_n| + 1) on R_n ∪ {n}; ρ² = max_n (2 q_n/|N_n|)²
  (|R_n| + 1) — the note's reading of Eqs. (13)-(14), which gives the paper's 1.9592;
* SCC (Lemma 2): w_nm = w'_nm on R_n, w_nn = w'_nn + Σ_{B_n} w'_nb (doubly stochastic);
  ρ = 4 max_n sqrt(Σ_{B_n} w' · Σ_{R_n ∪ {n}} w') (Eq. 15 as the note reads it);
* IOS (Lemma 3): the same W as SCC; H_n = the q_n neighbours of largest w';
  ρ = max_n s_n/(1 − s_n) with s_n = Σ_{H_n} w' (Eq. 16, every Byzantine message removed).

χ² = (1/|R|)‖Wᵀ1 − 1‖² and λ = 1 − ‖(I − 11ᵀ/|R|) W‖₂ (Assumption 1); ρ* = λ/(8√|R|) is
Theorem 1's condition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.robust.decentralized import metropolis_hastings_weights
from sharefl.simulator.decentralized.graph import AgentGraph

RULES = ("trimmed_mean", "scc", "ios")


@dataclass(frozen=True)
class MixingBound:
    """One row of Table I on a graph: ρ², χ², their sum, and λ, ρ* of Theorem 1."""

    rule: str
    rho_squared: float
    chi_squared: float
    spectral_gap: float  # λ
    rho_star: float  # λ / (8 √|R|)

    @property
    def total(self) -> float:
        return self.rho_squared + self.chi_squared

    def to_json(self) -> dict[str, float | str]:
        return {
            "rule": self.rule,
            "rho_squared": self.rho_squared,
            "chi_squared": self.chi_squared,
            "rho_squared_plus_chi_squared": self.total,
            "lambda": self.spectral_gap,
            "rho_star": self.rho_star,
        }


def _neighbourhoods(graph: AgentGraph) -> list[tuple[int, list[int], list[int]]]:
    """(n, R_n, B_n) of every honest agent n."""
    A, byz = graph.adjacency, set(graph.byzantine)
    out = []
    for n in graph.honest:
        nbrs = torch.nonzero(A[n]).flatten().tolist()
        out.append((n, [m for m in nbrs if m not in byz], [m for m in nbrs if m in byz]))
    return out


def virtual_mixing_matrix(graph: AgentGraph, rule: str) -> Tensor:
    """W ``[|R|, |R|]`` (float64, rows and columns in the order of ``graph.honest``)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    honest = graph.honest
    index = {n: i for i, n in enumerate(honest)}
    Wp = metropolis_hastings_weights(graph.adjacency)
    W = torch.zeros(len(honest), len(honest), dtype=torch.float64)
    for n, Rn, Bn in _neighbourhoods(graph):
        i = index[n]
        if rule == "trimmed_mean":
            for m in [n, *Rn]:
                W[i, index[m]] = 1.0 / (len(Rn) + 1)
        else:
            for m in Rn:
                W[i, index[m]] = Wp[n, m]
            W[i, i] = Wp[n, n] + sum(float(Wp[n, b]) for b in Bn)
    return W


def _rho_squared(graph: AgentGraph, rule: str) -> float:
    Wp = metropolis_hastings_weights(graph.adjacency)
    values = []
    for n, Rn, Bn in _neighbourhoods(graph):
        q = len(Bn)
        if rule == "trimmed_mean":
            values.append((2 * q / (len(Rn) + q)) ** 2 * (len(Rn) + 1))
        elif rule == "scc":
            byz = sum(float(Wp[n, b]) for b in Bn)
            values.append(16 * byz * (float(Wp[n, n]) + sum(float(Wp[n, m]) for m in Rn)))
        else:
            weights = sorted((float(Wp[n, m]) for m in Rn + Bn), reverse=True)
            s = sum(weights[:q])
            values.append((s / (1 - s)) ** 2)
    return max(values)


def mixing_bound(graph: AgentGraph, rule: str) -> MixingBound:
    """Table I's row for ``rule`` on ``graph`` (see the module docstring for the formulas)."""
    W = virtual_mixing_matrix(graph, rule)
    r = W.shape[0]
    ones = torch.ones(r, dtype=torch.float64)
    chi2 = float(((W.T @ ones - ones) ** 2).sum()) / r
    centred = (torch.eye(r, dtype=torch.float64) - torch.full((r, r), 1.0 / r)) @ W
    gap = 1.0 - float(torch.linalg.matrix_norm(centred, ord=2))
    return MixingBound(rule, _rho_squared(graph, rule), chi2, gap, gap / (8 * math.sqrt(r)))


def table_one(graph: AgentGraph) -> list[MixingBound]:
    """Table I on ``graph``: trimmed mean, SCC, IOS."""
    return [mixing_bound(graph, rule) for rule in RULES]
