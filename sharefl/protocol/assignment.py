"""Building a cluster's :class:`ClusterAssignment`: threshold and neighbour graph."""

from __future__ import annotations

from collections.abc import Sequence

from sharefl.crypto.kdf import KeyContext
from sharefl.protocol.audit import revealed_sums
from sharefl.protocol.client import default_colluders, threshold_floor
from sharefl.protocol.clustering import ClusteringError, RngLike, random_regular_graph
from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.messages import ClusterAssignment


def plan_assignment(
    context: KeyContext,
    members: Sequence[int],
    *,
    length: int,
    bits: int,
    threshold: int | None = None,
    neighbour_degree: int | None = None,
    signed: bool = False,
    rng: RngLike = None,
    raise_to_floor: bool = False,
    colluders: int | None = None,
) -> ClusterAssignment:
    """The assignment of one cluster, with a threshold its honest clients accept.

    Each client's shares go to its neighbours and itself: all ``members`` (complete graph)
    or ``neighbour_degree + 1`` holders on a random k-regular graph (SecAgg+, drawn from
    ``rng``, redrawn until connected: :func:`connected_regular_graph`). ``threshold=None``
    takes the clients' floor for ``colluders`` colluding clients
    (⌊(holders + colluders)/2⌋ + 1, the same rule the clients apply:
    :func:`~sharefl.protocol.client.threshold_floor`); ``colluders=None`` takes the clients'
    default (:func:`~sharefl.protocol.client.default_colluders`: 0 unsigned, ⌈holders/3⌉ − 1
    signed), so a signed-mode server asks for a threshold clients with the default policy
    accept. ``raise_to_floor`` lifts a smaller threshold to the floor (for deployments whose
    clusters grow as clients drop out).

    Raises :class:`ConfigurationError` when the graph cannot be drawn or the threshold is
    outside [floor, holders].
    """
    graph = None
    holders = len(members)
    if neighbour_degree:
        graph = connected_regular_graph(members, neighbour_degree, rng)
        holders = neighbour_degree + 1
    if colluders is None:
        colluders = default_colluders(holders, signed)
    floor = threshold_floor(holders, colluders)
    t = floor if threshold is None else threshold
    if raise_to_floor:
        t = max(t, floor)
    if not floor <= t <= holders:
        raise ConfigurationError(
            f"threshold {t} does not fit cluster {context.cluster}: with {holders} share "
            f"holders per client and {colluders} colluders, clients accept t in "
            f"[{floor}, {holders}]"
        )
    return ClusterAssignment(context, tuple(members), t, length, bits, graph, signed)


GRAPH_TRIES = 100
"""Draws of a random regular graph before :func:`connected_regular_graph` gives up."""


def connected_regular_graph(
    members: Sequence[int], degree: int, rng: RngLike = None
) -> dict[int, frozenset[int]]:
    """A random ``degree``-regular neighbour graph on ``members`` that is connected.

    Pair masks link neighbours only, so each connected component of the masking graph
    unmasks on its own (:func:`~sharefl.protocol.audit.revealed_sums`) and clients refuse a
    disconnected graph; a random k-regular graph is connected with high probability for
    k >= 3 and often not for k = 2 (a union of cycles), so draws are repeated, at most
    :data:`GRAPH_TRIES` times. Raises :class:`ConfigurationError` when the graph cannot be
    drawn or none of the draws is connected (degree 1 on more than 2 members never is:
    use a larger ``neighbour_degree``)."""
    for _ in range(GRAPH_TRIES):
        try:
            graph = random_regular_graph(members, degree, rng)
        except ClusteringError as exc:
            raise ConfigurationError(str(exc)) from exc
        if len(revealed_sums(members, graph)) == 1:
            return graph
    raise ConfigurationError(
        f"no connected {degree}-regular neighbour graph on {len(members)} members in "
        f"{GRAPH_TRIES} draws: use a larger neighbour_degree"
    )
