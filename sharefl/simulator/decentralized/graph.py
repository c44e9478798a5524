"""The communication graph of a decentralized run (Ye, Zhu and Ling §4).

:func:`erdos_renyi_graph` rebuilds the authors' topology: ``random.Random(seed)`` drives
networkx's ``fast_gnp_random_graph(N, p)`` (re-implemented here, draw for draw, so the
graph does not depend on an installed networkx), resampled with the same generator until
the graph is connected, then ``rng.sample(range(N), b)`` picks the Byzantine agents. With
N = 12, p = 0.7, seed 300 and b = 2 this gives the note's 47 edges and Byzantine agents
{6, 7}. :func:`graph_from_edges` takes an explicit edge list instead.

An :class:`AgentGraph` also checks Assumption 1 (the honest subgraph is connected), which
the authors' code does not.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.simulator.errors import SimulatorError


class GraphError(SimulatorError, ValueError):
    """A graph that cannot be used: the message says what to change."""


def _connected(adjacency: Tensor, nodes: Sequence[int]) -> bool:
    """Whether the subgraph induced by ``nodes`` is connected (breadth-first search)."""
    if not nodes:
        return False
    allowed = set(nodes)
    seen, frontier = {nodes[0]}, [nodes[0]]
    while frontier:
        n = frontier.pop()
        for m in torch.nonzero(adjacency[n]).flatten().tolist():
            if m in allowed and m not in seen:
                seen.add(m)
                frontier.append(m)
    return len(seen) == len(allowed)


@dataclass(frozen=True)
class AgentGraph:
    """An undirected graph of ``N`` agents and which of them are Byzantine.

    Attributes:
        adjacency: symmetric boolean ``[N, N]``, no self-loops.
        byzantine: sorted indices of the Byzantine agents.
    """

    adjacency: Tensor
    byzantine: tuple[int, ...]

    def __post_init__(self) -> None:
        A = self.adjacency
        if A.dim() != 2 or A.shape[0] != A.shape[1] or A.dtype != torch.bool:
            raise GraphError("adjacency must be a square boolean matrix")
        if bool(A.diagonal().any()) or not bool((A == A.T).all()):
            raise GraphError("adjacency must be symmetric without self-loops")
        if any(not 0 <= b < self.size for b in self.byzantine):
            raise GraphError(f"Byzantine agents must be in [0, {self.size})")
        if not _connected(A, self.honest):
            raise GraphError(
                "the honest agents' subgraph is not connected (Assumption 1): choose another "
                "graph seed, a larger edge probability, or other Byzantine agents"
            )

    @property
    def size(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def honest(self) -> list[int]:
        """The non-Byzantine agents R, in increasing order."""
        return [n for n in range(self.size) if n not in self.byzantine]

    @property
    def edges(self) -> int:
        return int(self.adjacency.sum()) // 2

    def degrees(self) -> list[int]:
        return self.adjacency.sum(dim=1).tolist()

    def without_byzantine(self) -> AgentGraph:
        """The graph of the honest agents alone (the paper's "no attack" setting),
        re-indexed 0 … |R| − 1 in the order of :attr:`honest`."""
        keep = torch.tensor(self.honest)
        return AgentGraph(self.adjacency[keep][:, keep].clone(), ())


def fast_gnp_edges(n: int, p: float, rng: random.Random) -> list[tuple[int, int]]:
    """The edges networkx's ``fast_gnp_random_graph(n, p, seed=rng)`` draws (Batagelj and
    Brandes' geometric skipping), consuming ``rng`` exactly as networkx does, 0 < p < 1."""
    if not 0 < p < 1:
        raise GraphError(f"edge probability must be in (0, 1), got {p}")
    edges: list[tuple[int, int]] = []
    lp = math.log(1.0 - p)
    v, w = 1, -1
    while v < n:
        lr = math.log(1.0 - rng.random())
        w = w + 1 + int(lr / lp)
        while w >= v and v < n:
            w, v = w - v, v + 1
        if v < n:
            edges.append((v, w))
    return edges


def _adjacency(n: int, edges: Iterable[tuple[int, int]]) -> Tensor:
    A = torch.zeros(n, n, dtype=torch.bool)
    for a, b in edges:
        if not (0 <= a < n and 0 <= b < n) or a == b:
            raise GraphError(f"edge ({a}, {b}) must join two distinct agents in [0, {n})")
        A[a, b] = A[b, a] = True
    return A


def erdos_renyi_graph(
    agents: int, probability: float, byzantine: int, *, seed: int = 300, max_tries: int = 1000
) -> AgentGraph:
    """The authors' topology: G(N, p) from ``random.Random(seed)``, redrawn until connected,
    then ``byzantine`` agents drawn with ``rng.sample``.

    Raises:
        GraphError: no connected graph in ``max_tries`` draws, ``byzantine >= agents``, or
            an honest subgraph that is not connected.
    """
    if not 0 <= byzantine < agents:
        raise GraphError(f"byzantine must be in [0, {agents}), got {byzantine}")
    rng = random.Random(seed)
    for _ in range(max_tries):
        A = _adjacency(agents, fast_gnp_edges(agents, probability, rng))
        if _connected(A, list(range(agents))):
            break
    else:
        raise GraphError(f"no connected G({agents}, {probability}) in {max_tries} draws")
    chosen = rng.sample(list(range(agents)), byzantine)
    return AgentGraph(A, tuple(sorted(chosen)))


def graph_from_edges(
    agents: int, edges: Iterable[Sequence[int]], byzantine: Iterable[int]
) -> AgentGraph:
    """A graph from an explicit edge list ``[[a, b], …]`` and Byzantine agent indices."""
    pairs = []
    for e in edges:
        if len(e) != 2:
            raise GraphError(f"an edge is a pair [a, b], got {list(e)}")
        pairs.append((int(e[0]), int(e[1])))
    return AgentGraph(_adjacency(agents, pairs), tuple(sorted(int(b) for b in byzantine)))
