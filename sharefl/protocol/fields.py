"""The checks protocol messages make on their own fields, and the limits they enforce.

Every message of :mod:`sharefl.protocol.messages` (and
:class:`~sharefl.protocol.keys.KeyAdvert`) calls these from its constructor, so a message
that exists has fields of the right type, size and range; each raises
:class:`~sharefl.protocol.errors.MalformedMessage` naming the message, the field and what
is expected. They cost a type test and a length per field, and one pass over a list or
map of ids (never over a vector: an array's dtype and shape only).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import pairwise
from typing import Any

import numpy as np

from sharefl.protocol.bundles import dealt_bytes
from sharefl.protocol.errors import MalformedMessage

MAX_IDS = 1 << 16
"""Most client ids (or per-peer entries) one list or map of a cluster's message may carry:
members, survivors, dropped, complaints, advertisements, bundles, signatures, shares."""

MAX_DEALT_PEERS = 256
"""Two-exchange round: most neighbours one dealer may have, hence most pair commitments
and bundles of a :class:`~sharefl.protocol.messages.MaskedShares` and most bundles of an
:class:`~sharefl.protocol.messages.UnmaskRequest` (a holder's dealers are its neighbours).
A bundle is then at most ``dealt_bytes(256)`` = 9,553 bytes and either message at most
about 2.3 MiB of bundles, under gRPC's 4 MiB message limit (``MAX_IDS`` peers would allow
bundles of 2.4 MB each, 158 GB in one message). A complete graph of a two-exchange
cluster therefore has at most 257 members; a larger cluster needs a sparse neighbour
graph of degree at most 256."""

MAX_PAIR_SHARES = MAX_DEALT_PEERS * (MAX_DEALT_PEERS + 1)
"""Two-exchange round: most pair shares one :class:`~sharefl.protocol.messages.
UnmaskResponse` may carry: one per (dealer, dropped peer of the dealer), over at most
``MAX_DEALT_PEERS + 1`` dealers (the holder's neighbours and itself)."""

DEALT_SIZES = frozenset(dealt_bytes(peers) for peers in range(1, MAX_DEALT_PEERS + 1))
"""The sizes a two-exchange bundle may have (a dealer has 1 to ``MAX_DEALT_PEERS``
neighbours)."""

MAX_LENGTH = 1 << 48
"""Most ring elements an assignment may announce per input vector."""

_ID_END = 1 << 64
_INT = {int}
_BYTES = {bytes}
_VECTOR_DTYPES = (np.dtype(np.uint32), np.dtype(np.uint64))


def fail(where: str, expected: str, got: object) -> MalformedMessage:
    """The error for ``where`` (``Message.field``): what it must be, and what it is."""
    return MalformedMessage(f"{where} must be {expected}, got {got}")


def _plain_ids(values: Collection[object]) -> bool:
    """The fast path of the id checks: every value a Python int in [0, 2^64) (one pass in C
    for the types, then min and max). False does not mean refused: numpy ints are ids too."""
    if not values:
        return True
    if set(map(type, values)) != _INT:
        return False
    ints: Collection[int] = values  # type: ignore[assignment]
    return min(ints) >= 0 and max(ints) < _ID_END


def is_id(value: object) -> bool:
    """``value`` is a client id: an int (not a bool) in [0, 2^64)."""
    if type(value) is int:
        return 0 <= value < _ID_END
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        return False
    return 0 <= int(value) < _ID_END


def check_id(where: str, value: object) -> None:
    if not is_id(value):
        raise fail(where, "a client id (an int in [0, 2^64))", repr(value))


def check_int(where: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not lo <= value <= hi:
        raise fail(where, f"an int in [{lo}, {hi}]", repr(value))


def check_flag(where: str, value: object) -> None:
    if not isinstance(value, bool):
        raise fail(where, "a bool", type(value).__name__)


def check_bytes(where: str, value: object, sizes: Collection[int]) -> None:
    """``value`` is bytes of one of ``sizes`` (a tuple for the message, a set for lookup)."""
    if not isinstance(value, bytes):
        raise fail(where, "bytes", type(value).__name__)
    if len(value) not in sizes:
        want = " or ".join(map(str, sizes)) if len(sizes) <= 2 else "of an allowed size"
        raise fail(where, f"{want} bytes", len(value))


def check_count(where: str, values: Collection[Any], cap: int) -> None:
    if len(values) > cap:
        raise MalformedMessage(f"{where} has {len(values)} entries; at most {cap}")


def check_ids(where: str, values: object, cap: int = MAX_IDS, *, ascending: bool = False) -> None:
    """A tuple of at most ``cap`` distinct client ids (in ascending order if ``ascending``)."""
    if not isinstance(values, tuple):
        raise fail(where, "a tuple of client ids", type(values).__name__)
    check_count(where, values, cap)
    if not _plain_ids(values):
        for value in values:
            check_id(f"{where} entry", value)
    if ascending:
        if any(a >= b for a, b in pairwise(values)):
            raise fail(where, "client ids in ascending order without duplicates", values[:16])
    elif len(set(values)) != len(values):
        raise MalformedMessage(f"{where} has duplicate client ids")


def check_peer_map(
    where: str,
    values: object,
    sizes: Collection[int],
    cap: int = MAX_IDS,
    what: str | None = None,
) -> None:
    """A dict of at most ``cap`` entries ``{client id: bytes of one of sizes}``; ``what``
    describes the sizes in the error (default: the sizes themselves)."""
    if not isinstance(values, dict):
        raise fail(where, "a dict of client id -> bytes", type(values).__name__)
    check_count(where, values, cap)
    if _plain_ids(values.keys()) and (
        not values
        or (
            set(map(type, values.values())) == _BYTES
            and not set(map(len, values.values())).difference(sizes)
        )
    ):
        return
    for peer, value in values.items():
        check_id(f"{where} key", peer)
        if not isinstance(value, bytes) or len(value) not in sizes:
            got = len(value) if isinstance(value, bytes) else type(value).__name__
            want = what or f"{' or '.join(map(str, sizes))} bytes"
            raise fail(f"{where}: the entry of client {peer}", want, got)


def check_pair_map(where: str, values: object, size: int, cap: int) -> None:
    """A dict of at most ``cap`` entries ``{(client id, another client id): size bytes}``."""
    if not isinstance(values, dict):
        raise fail(where, "a dict of (client id, client id) -> bytes", type(values).__name__)
    check_count(where, values, cap)
    for pair, value in values.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and is_id(pair[0]) and is_id(pair[1])):
            raise fail(f"{where} key", "a pair of client ids", repr(pair))
        if pair[0] == pair[1]:
            raise MalformedMessage(f"{where}: a pair names client {pair[0]} twice")
        if not isinstance(value, bytes) or len(value) != size:
            got = len(value) if isinstance(value, bytes) else type(value).__name__
            raise fail(f"{where}: the entry of pair {pair}", f"{size} bytes", got)


def check_vector(where: str, vector: object) -> None:
    """A 1-D uint32 or uint64 numpy array (dtype and shape only: the elements are not read)."""
    if (
        not isinstance(vector, np.ndarray)
        or vector.ndim != 1
        or vector.dtype.newbyteorder("=") not in _VECTOR_DTYPES
    ):
        got = f"{getattr(vector, 'dtype', type(vector).__name__)} {getattr(vector, 'shape', '')}"
        raise fail(where, "a 1-D uint32 or uint64 numpy array", got.strip())


def check_type(where: str, value: object, cls: type) -> None:
    if not isinstance(value, cls):
        raise fail(where, f"a {cls.__name__}", type(value).__name__)


def check_all(where: str, values: object, cls: type, cap: int = MAX_IDS) -> None:
    """A tuple of at most ``cap`` instances of ``cls``."""
    if not isinstance(values, tuple):
        raise fail(where, f"a tuple of {cls.__name__}", type(values).__name__)
    check_count(where, values, cap)
    for value in values:
        check_type(f"{where} entry", value, cls)


def check_graph(where: str, graph: object, members: int) -> None:
    """``None`` (complete graph) or a non-empty dict of at most ``members`` entries
    ``{client id: frozenset of at most members client ids}``."""
    if graph is None:
        return
    if not isinstance(graph, dict) or not graph:
        raise fail(where, "None (complete graph) or a non-empty dict", repr(graph)[:40])
    check_count(where, graph, members)
    for client, peers in graph.items():
        check_id(f"{where} key", client)
        if not isinstance(peers, frozenset):
            raise fail(f"{where} of client {client}", "a frozenset", type(peers).__name__)
        check_count(f"{where} of client {client}", peers, members)
        for peer in peers:
            check_id(f"{where} of client {client} entry", peer)
