"""Audit of what a curious server learns from the cluster sums of several reclusterings.

Model. Secure aggregation in a cluster reveals to the server only the sum of the updates of
the cluster's surviving clients. SHARE re-aggregates the *same* n updates x_1..x_n R times
with fresh random clusters, so after a round the server holds one linear equation per
(reclustering, cluster): the sum of x_i over the survivors of that cluster. Stacking the
0/1 indicator rows gives an equation matrix A (R·c rows, n columns), and the server can
compute exactly the linear combinations v·x with v in the row space of A (coordinate-wise
for vector-valued updates). In particular

* client i's update is recoverable iff e_i ∈ rowspace(A);
* the sum over a set S is recoverable iff 1_S ∈ rowspace(A).

With Z an n×k matrix whose columns span the null space of A, v ∈ rowspace(A) iff Zᵀv = 0,
so 1_S is recoverable iff Σ_{i∈S} Z_i = 0 over the rows Z_i of Z (and e_i iff Z_i = 0).

For R independent random partitions of n clients into c clusters the rank is at most
min(n, R(c − 1) + 1) (each partition's rows sum to the all-ones vector) and equal to it for
almost every draw. For n = 60, m = 3 (c = 20) that is 20, 39, 58, then full rank 60 from
R = 4, so at SHARE's default R = 10 every single update is recoverable. :func:`audit`
detects this and :func:`sample_safe_reclusterings` draws reclusterings that do not leak.

Exactness. All linear algebra is over the rationals, exactly: fraction-free Gauss–Jordan
elimination on Python integers (numpy object arrays), each row divided by the gcd of its
entries after every update, so no floating-point or modular rank decision is ever made.
Entries are bounded by minors of the 0/1 matrix and Python ints never overflow; the cost
is milliseconds at n = 60 and grows to seconds for near-full-rank plans at n ≈ 300–500.
Rows are solved per connected component (clients linked by a shared sum), since the
matrix is block-diagonal over them. The search for zero-sum subsets hashes each row Z_i
to a fingerprint Σ_j Z_ij w_j mod p (p = 2^61 − 1, fixed pseudo-random weights w): an
exact zero sum always has fingerprint 0, so nothing is missed, and every fingerprint match
is re-checked on the exact integers, so nothing is reported wrongly (a collision only costs
one exact check). Subsets are enumerated by meet in the middle (the first ⌊s/2⌋ and the
last ⌈s/2⌉ elements of each s-set), in increasing size, within a budget.

Work budget. The elimination is not bounded by the search budget: a component of k
clients linked by near k independent sums costs about k³ big-integer operations (seconds
at k ≈ 300, minutes at k ≈ 2000). ``audit(work_budget=W)`` counts the elimination's work
in entry operations (one unit per entry of a row touched: a row built, a row reduced by
another, a basis row updated; the null-space basis and the fingerprints likewise) and
raises :class:`AuditBudgetExceeded` as soon as the count would pass W, so a caller that
must bound its time (a client auditing a plan an untrusted server sent) spends at most
about W units whatever the plan. The default (``None``) is unbounded.

Scope. Without colluders (``colluders=0``) only 0/1 combinations (individual updates and
sums of small groups) count as leaks. As soon as two reclusterings differ the server also
learns other combinations, for example x_a − x_b when clusters {a, c, d} and {b, c, d} both
occur; pairwise differences are listed in :attr:`LeakageReport.difference_classes` for
information.

Colluders. A server colluding with up to c clients knows their inputs x_C, so it learns
x_i as soon as e_i ∈ rowspace(A) + span(e_C), i.e. Z_i ∈ span{Z_j : j ∈ C} (then
e_i − Σ_{j∈C} λ_j e_j is orthogonal to the null space). With ``colluders = c >= 1`` the
audit counts these as leaks (:attr:`LeakageReport.colluder_leaks`), exactly:

* for every c >= 1, two clients with parallel nonzero rows Z_i ∥ Z_j (x_i follows from
  x_j alone): each nonzero row is normalised (divided by the gcd of its entries, the sign
  of its first nonzero entry made positive) and equal normalised rows are parallel;
  linear in the number of clients, whatever the plan;
* for c >= 2, Z_i in the span of some c other rows of its component (rows of different
  components have disjoint supports, so colluders elsewhere never help): a component
  seen through one sum is the uniform matroid (any c of its k clients determine the rest
  iff k <= c + 1); a component whose other hidden rows number at most c, or whose nullity
  is at most c, is decided by one span test of Z_i against all other rows (a spanning set
  of them has at most ``nullity`` members); otherwise every c-subset of the component's
  hidden rows is tested by exact integer elimination, for components of at most
  :data:`COLLUDER_SEARCH_CLIENTS` clients and within the search budget. A larger
  component, or a search that runs out, makes the report incomplete
  (``complete = False``), which every caller treats as a refusal: such plans must be
  built from smaller linked blocks.

What colluders still do not count: sums of several honest inputs determined with the
colluders' help (only individual inputs are checked against colluders; the 0/1 small-sum
search is unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, combinations
from typing import Final

import numpy as np

from sharefl.protocol.clustering import (
    Clustering,
    ClusteringError,
    RngLike,
    as_generator,
    random_clustering,
)
from sharefl.protocol.errors import ProtocolError

DEFAULT_SEARCH_BUDGET: Final = 1_000_000
"""Default cap on subsets (and fingerprint matches) examined by the small-sum search."""

COLLUDER_SEARCH_CLIENTS: Final = 16
"""Largest component whose c-subsets the colluder check (c >= 2) enumerates; a larger one
that no shortcut decides makes the audit incomplete (see the module docstring)."""

DEFAULT_MAX_TRIES: Final = 1_000
"""Default number of draws per block and reclustering in :func:`sample_safe_reclusterings`."""

FINGERPRINT_PRIME: Final = 2**61 - 1
_FINGERPRINT_SEED: Final = 0x5EC0A6


class AuditError(ProtocolError, ValueError):
    """Inconsistent audit input: a clustering or dropout names a client outside
    ``client_ids``, ``dropouts`` does not have one entry per clustering, duplicate ids,
    nothing to audit, or ``min_sum_size < 1``."""


class AuditBudgetExceeded(ProtocolError, RuntimeError):
    """The exact elimination of the audit needs more than the caller's ``work_budget``
    (entry operations, see the module docstring): no verdict was reached. The plan must
    link fewer clients through shared sums (smaller independent blocks, fewer
    reclusterings, fewer participants), or the caller must allow more work.

    Attributes:
        budget: the work budget that was exceeded.
    """

    def __init__(self, message: str, budget: int) -> None:
        super().__init__(message)
        self.budget = budget


class SafeSamplingError(ProtocolError, RuntimeError):
    """No leak-free reclustering was found: either a single clustering already reveals a
    sum of fewer than ``min_sum_size`` clients (e.g. ``cluster_size = 1``), or ``max_tries``
    draws of some block all leaked (make blocks smaller, or allow more tries)."""


@dataclass(frozen=True, slots=True)
class LeakageReport:
    """What the cluster sums of a set of reclusterings reveal to the server.

    Attributes:
        client_ids: The unknowns (sorted client ids).
        num_equations: Distinct non-empty cluster sums revealed.
        rank: Exact rank of the equation matrix (over the rationals).
        recoverable_clients: Ids whose individual update is a linear combination of the
            revealed sums.
        recoverable_small_sums: Sets S (sorted tuples, by size then lexicographically) with
            2 <= |S| < ``min_sum_size`` whose sum is recoverable and that are minimal: no
            client of S is individually recoverable and no proper subset of S has a
            recoverable sum (so S is not a union of smaller reported sets or individuals).
        min_sum_size: Sums of at least this many clients are considered safe.
        complete: False if the search budget ran out; then sets larger than
            ``searched_up_to`` may be missing.
        searched_up_to: Every subset of at most this size was examined.
        difference_classes: Informational, not counted by :attr:`leaks`: maximal groups of
            at least two clients, none individually recoverable, such that the difference
            x_i − x_j of any two members is recoverable (equal rows of Z).
        work: Entry operations the audit spent (what ``work_budget`` counts).
        colluders: c, the clients assumed to collude with the server (their inputs known).
        colluder_leaks: with c >= 1, tuples (i, j_1, ..., j_l), l <= c: x_i follows from
            the sums and x_{j_1}..x_{j_l} (l = 1: parallel null-space rows, which is
            symmetric; a group of g mutually parallel rows is listed as its first member
            paired with each other one). Counted by :attr:`leaks`.
        colluder_search_complete: False when the c >= 2 search could not decide some
            component (too large, or out of search budget); ``complete`` is then False.
    """

    client_ids: tuple[int, ...]
    num_equations: int
    rank: int
    recoverable_clients: tuple[int, ...]
    recoverable_small_sums: tuple[tuple[int, ...], ...]
    min_sum_size: int
    complete: bool
    searched_up_to: int
    difference_classes: tuple[tuple[int, ...], ...] = ()
    work: int = 0
    colluders: int = 0
    colluder_leaks: tuple[tuple[int, ...], ...] = ()
    colluder_search_complete: bool = True

    @property
    def num_clients(self) -> int:
        """The number of unknowns n."""
        return len(self.client_ids)

    @property
    def nullity(self) -> int:
        """n − rank: the dimension of what the server cannot see."""
        return self.num_clients - self.rank

    @property
    def leaks(self) -> bool:
        """True if some individual update or some small sum is recoverable, or (with
        colluders) some update follows from the colluders' inputs."""
        return bool(self.recoverable_clients or self.recoverable_small_sums or self.colluder_leaks)

    def summary(self) -> str:
        """A short human-readable account of the audit."""
        verdict = "LEAKS" if self.leaks else "no leak found"
        lines = [
            f"leakage audit: {verdict}",
            f"  clients n = {self.num_clients}, distinct cluster sums = {self.num_equations}, "
            f"rank = {self.rank} (nullity {self.nullity})",
            f"  individually recoverable: {len(self.recoverable_clients)}"
            + _preview(self.recoverable_clients),
            f"  recoverable sums of 2..{self.min_sum_size - 1} clients: "
            f"{len(self.recoverable_small_sums)}" + _preview(self.recoverable_small_sums),
        ]
        if self.colluders:
            lines.append(
                f"  updates that follow from the inputs of <= {self.colluders} colluder(s): "
                f"{len(self.colluder_leaks)}" + _preview(self.colluder_leaks)
            )
        if self.difference_classes:
            lines.append(
                f"  (informational) classes with recoverable pairwise differences: "
                f"{len(self.difference_classes)}" + _preview(self.difference_classes)
            )
        if not self.colluder_search_complete:
            lines.append(
                f"  INCOMPLETE: the colluder check could not decide a component (more than "
                f"{COLLUDER_SEARCH_CLIENTS} linked clients, or out of search budget)"
            )
        elif not self.complete:
            lines.append(
                f"  INCOMPLETE: search budget exhausted; only subsets of size <= "
                f"{self.searched_up_to} were examined"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _preview(items: Sequence[object], limit: int = 8) -> str:
    if not items:
        return ""
    shown = ", ".join(str(x) for x in items[:limit])
    return f" [{shown}{', ...' if len(items) > limit else ''}]"


# --------------------------------------------------------------------------- input handling


def _resolve_ids(
    clusterings: Sequence[Clustering], client_ids: Sequence[int] | None
) -> tuple[int, ...]:
    """The sorted unknowns; every clustered client must be among them."""
    clustered = set(chain.from_iterable(c.members for c in clusterings))
    if client_ids is None:
        ids = sorted(clustered)
    else:
        ids = sorted(int(i) for i in client_ids)
        if len(set(ids)) != len(ids):
            raise AuditError("duplicate client ids")
        outside = sorted(clustered - set(ids))
        if outside:
            raise AuditError(f"clustered clients missing from client_ids: {outside[:10]}")
    if not ids:
        raise AuditError("nothing to audit: no clients")
    return tuple(ids)


def _equations(
    clusterings: Sequence[Clustering],
    dropouts: Sequence[Collection[int]] | None,
    ids: frozenset[int],
) -> list[frozenset[int]]:
    """Distinct non-empty survivor sets, one per (reclustering, cluster)."""
    if dropouts is None:
        dropouts = [()] * len(clusterings)
    if len(dropouts) != len(clusterings):
        raise AuditError(f"dropouts has {len(dropouts)} entries for {len(clusterings)} clusterings")
    rows: dict[frozenset[int], None] = {}
    for clustering, dropped in zip(clusterings, dropouts, strict=True):
        gone = {int(i) for i in dropped}
        if not gone <= ids:
            raise AuditError(f"dropouts name unknown clients: {sorted(gone - ids)[:10]}")
        for cluster in clustering.clusters:
            survivors = frozenset(cluster) - gone
            if survivors:
                rows[survivors] = None
    return list(rows)


def _resolve_min_sum_size(clusterings: Sequence[Clustering], min_sum_size: int | None) -> int:
    if min_sum_size is None:
        return min((s for c in clusterings for s in c.sizes), default=1)
    if min_sum_size < 1:
        raise AuditError(f"min_sum_size must be >= 1, got {min_sum_size}")
    return min_sum_size


def _components(ids: Sequence[int], rows: Sequence[frozenset[int]]) -> list[list[int]]:
    """Connected components of clients, two clients being linked if they share a row.

    The equation matrix is block-diagonal over these components, so its null space is the
    direct sum of the components' null spaces and every minimal recoverable set lies inside
    one component; each component is solved and searched on its own.
    """
    parent = {i: i for i in ids}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for row in rows:
        first, *rest = row
        root = find(first)
        for other in rest:
            parent[find(other)] = root
    groups: dict[int, list[int]] = {}
    for i in ids:
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


# ------------------------------------------------------------------- exact linear algebra


def _normalised(v: np.ndarray, pivot: int | None = None) -> np.ndarray:
    """``v`` divided by the gcd of its entries, made positive at ``pivot`` if given."""
    g = math.gcd(*v.tolist())
    if g > 1:
        v = v // g
    if pivot is not None and v[pivot] < 0:
        v = -v
    return v


class _Work:
    """A countdown of entry operations (see the module docstring); ``limit=None`` never
    runs out. :meth:`charge` raises :class:`AuditBudgetExceeded` instead of going below 0."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.left = limit
        self.spent = 0

    def charge(self, amount: int) -> None:
        self.spent += amount
        if self.left is None:
            return
        if amount > self.left:
            raise AuditBudgetExceeded(
                f"the exact audit needs more than its work budget of {self.limit} entry "
                "operations (clients linked by too many shared sums)",
                self.limit or 0,
            )
        self.left -= amount


def integer_rref(
    rows: Iterable[Iterable[int]], width: int, work: _Work | None = None
) -> dict[int, np.ndarray]:
    """Exact reduced row echelon form of 0/1 rows given by their supports.

    Each row is the set of column indices (0..width−1) holding a 1. Returns the non-zero
    rows of the RREF, keyed by pivot column, as integer object arrays scaled to coprime
    entries with a positive pivot (the rational RREF row is ``row / row[pivot]``). Every
    returned row is zero in every other row's pivot column. Fraction-free Gauss–Jordan
    elimination on Python ints; the rank is the number of returned rows. ``work`` is
    charged ``width`` per row built, reduced or updated, and one per basis row looked at
    (it raises :class:`AuditBudgetExceeded` before the work is done, not after).
    """
    work = work or _Work(None)
    basis: dict[int, np.ndarray] = {}
    for support in rows:
        if len(basis) == width:
            break
        work.charge(width + len(basis))
        v = np.zeros(width, dtype=object)
        v[list(support)] = 1
        _insert(basis, v, width, work)
    return basis


def _reduced(basis: dict[int, np.ndarray], v: np.ndarray, width: int, work: _Work) -> np.ndarray:
    """``v`` (an integer object array) with every pivot column of the RREF ``basis``
    eliminated, scaled to coprime entries: zero iff ``v`` lies in the span of ``basis``."""
    for col, b in basis.items():
        if v[col]:
            work.charge(width)
            v = _normalised(v * b[col] - b * v[col])
    return v


def _insert(basis: dict[int, np.ndarray], v: np.ndarray, width: int, work: _Work) -> bool:
    """Add the integer row ``v`` to the RREF ``basis`` (keeping every row zero in the
    other rows' pivot columns); False if ``v`` was already in its span."""
    v = _reduced(basis, v, width, work)
    nonzero = np.flatnonzero(v)
    if nonzero.size == 0:
        return False
    pivot = int(nonzero[0])
    v = _normalised(v, pivot)
    work.charge(len(basis))
    for col, b in basis.items():
        if b[pivot]:
            work.charge(width)
            basis[col] = _normalised(b * v[pivot] - v * b[pivot], col)
    basis[pivot] = v
    return True


def null_space_rows(
    basis: dict[int, np.ndarray], width: int, work: _Work | None = None
) -> list[tuple[int, ...]]:
    """Rows Z_0..Z_{width−1} of an integer null-space basis Z (width × nullity).

    One basis vector per free column f: x_f = L and x_p = −b[f]·L / b[p] for each RREF row
    b with pivot p, where L is the lcm of the pivots b[p] of the rows with b[f] ≠ 0.
    ``work`` is charged ``width + rank`` per free column (building it and transposing).
    """
    free = [f for f in range(width) if f not in basis]
    (work or _Work(None)).charge(len(free) * (width + len(basis)))
    columns: list[list[int]] = []
    for f in free:
        users = [(p, b) for p, b in basis.items() if b[f]]
        lcm = math.lcm(*(int(b[p]) for p, b in users)) if users else 1
        z = [0] * width
        z[f] = lcm
        for p, b in users:
            z[p] = -int(b[f]) * (lcm // int(b[p]))
        columns.append(z)
    return [tuple(col[i] for col in columns) for i in range(width)]


# ---------------------------------------------------------------------- zero-sum search


@dataclass(frozen=True, slots=True)
class _Component:
    """One connected component: its clients, rank and integer null-space rows."""

    clients: tuple[int, ...]
    rank: int
    null_rows: tuple[tuple[int, ...], ...]
    num_rows: int = 0

    @property
    def recoverable(self) -> list[int]:
        return [c for c, z in zip(self.clients, self.null_rows, strict=True) if not any(z)]

    @property
    def difference_classes(self) -> list[tuple[int, ...]]:
        """Groups of >= 2 hidden clients with identical null-space rows."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for client, z in zip(self.clients, self.null_rows, strict=True):
            if any(z):
                groups.setdefault(z, []).append(client)
        return [tuple(g) for g in groups.values() if len(g) > 1]

    @property
    def hidden(self) -> list[int]:
        """Local indices of the clients that are not individually recoverable."""
        return [k for k, z in enumerate(self.null_rows) if any(z)]


def _solve(clients: list[int], rows: Sequence[frozenset[int]], work: _Work) -> _Component:
    local = {c: k for k, c in enumerate(clients)}
    basis = integer_rref(([local[c] for c in row] for row in rows), len(clients), work)
    return _Component(
        tuple(clients), len(basis), tuple(null_space_rows(basis, len(clients), work)), len(rows)
    )


def _fingerprints(null_rows: Sequence[tuple[int, ...]]) -> np.ndarray:
    """Σ_j Z_ij w_j mod p for fixed pseudo-random weights w_j ∈ [1, p)."""
    width = len(null_rows[0]) if null_rows else 0
    gen = np.random.default_rng(_FINGERPRINT_SEED)
    weights = [int(w) for w in gen.integers(1, FINGERPRINT_PRIME, size=width)]
    values = [sum(z * w for z, w in zip(row, weights, strict=True)) for row in null_rows]
    return np.array([v % FINGERPRINT_PRIME for v in values], dtype=np.uint64)


def _subset_sums(fp: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """All ``size``-subsets of positions of ``fp`` (lexicographic rows) and their sums mod p."""
    flat = chain.from_iterable(combinations(range(len(fp)), size))
    subsets = np.fromiter(flat, dtype=np.intp).reshape(-1, size)
    sums = np.zeros(len(subsets), dtype=np.uint64)
    prime = np.uint64(FINGERPRINT_PRIME)
    for col in range(size):
        sums = (sums + fp[subsets[:, col]]) % prime
    return subsets, sums


class _Budget:
    """A countdown of examined subsets shared by all components and sizes."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def spend(self, amount: int) -> bool:
        """Deduct ``amount`` and return True if it fits, else leave the budget and say no."""
        if amount > self.left:
            return False
        self.left -= amount
        return True


def _zero_sum_subsets(
    comp: _Component, size: int, found: list[frozenset[int]], budget: _Budget, work: _Work
) -> list[frozenset[int]] | None:
    """New minimal zero-sum sets of exactly ``size`` hidden clients (local indices) of
    ``comp``, given the smaller ones in ``found``; None if the budget does not suffice.

    Meet in the middle: S = U ∪ T with U the first ⌊size/2⌋ elements of S and T the rest,
    matched by fingerprint (fp(U) + fp(T) ≡ 0 mod p, max U < min T), then checked exactly.
    """
    hidden = comp.hidden
    if len(hidden) < size:
        return []
    a, b = size // 2, size - size // 2
    if not budget.spend(math.comb(len(hidden), a) + (math.comb(len(hidden), b) if b != a else 0)):
        return None
    rows = [comp.null_rows[k] for k in hidden]
    work.charge(len(rows) * len(rows[0]))
    fp = _fingerprints(rows)
    left, left_sums = _subset_sums(fp, a)
    right, right_sums = (left, left_sums) if b == a else _subset_sums(fp, b)
    order = np.argsort(left_sums, kind="stable")
    sorted_sums = left_sums[order]
    targets = (np.uint64(FINGERPRINT_PRIME) - right_sums) % np.uint64(FINGERPRINT_PRIME)
    lo = np.searchsorted(sorted_sums, targets, side="left")
    hi = np.searchsorted(sorted_sums, targets, side="right")
    if not budget.spend(int((hi - lo).sum())):
        return None
    new: list[frozenset[int]] = []
    for t in np.flatnonzero(hi > lo):
        t_set = right[t]
        for u in order[lo[t] : hi[t]]:
            u_set = left[u]
            if u_set[-1] >= t_set[0]:
                continue
            members = [int(k) for k in chain(u_set, t_set)]
            if not all(sum(col) == 0 for col in zip(*(rows[k] for k in members), strict=True)):
                continue
            subset = frozenset(hidden[k] for k in members)
            if not any(smaller <= subset for smaller in found):
                new.append(subset)
    return new


def _parallel_groups(comp: _Component) -> list[list[int]]:
    """Groups (local indices, >= 2 each) of hidden clients whose null-space rows are
    parallel: equal once divided by their gcd with the first nonzero entry made positive."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for k in comp.hidden:
        row = comp.null_rows[k]
        g = math.gcd(*row)
        sign = -1 if next(z for z in row if z) < 0 else 1
        groups.setdefault(tuple(sign * z // g for z in row), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def _colluder_leaks(
    comp: _Component, colluders: int, budget: _Budget, work: _Work
) -> tuple[list[tuple[int, ...]], bool]:
    """Clients of ``comp`` whose input follows from the sums and the inputs of at most
    ``colluders`` others (local indices: (i, j_1, ...)), and whether the check finished.
    See the module docstring ("Colluders") for the argument of each case."""
    found: list[tuple[int, ...]] = [(g[0], k) for g in _parallel_groups(comp) for k in g[1:]]
    if colluders < 2 or found:
        return found, True
    hidden = comp.hidden
    width = len(comp.null_rows[0]) if comp.null_rows else 0
    if len(hidden) < 2 or width == 0:
        return found, True
    rows = {k: np.array(comp.null_rows[k], dtype=object) for k in hidden}
    if comp.num_rows == 1:
        # One sum over k clients: any k − 1 of them determine the last one, fewer nothing.
        if len(comp.clients) <= colluders + 1:
            found.append(tuple(range(len(comp.clients))))
        return found, True
    if len(hidden) - 1 <= colluders or width <= colluders:
        # Z_i in the span of c others iff in the span of all others: a spanning subset of
        # them has at most rank <= min(width, len(hidden) − 1) <= c members.
        leak = _in_span_of_all_others(hidden, rows, width, work)
    elif len(comp.clients) > COLLUDER_SEARCH_CLIENTS or not budget.spend(
        math.comb(len(hidden), colluders) * (len(hidden) - colluders)
    ):
        return found, False
    else:
        leak = _in_span_of_some(hidden, rows, colluders, width, work)
    if leak is not None:
        found.append(leak)
    return found, True


def _in_span_of_all_others(
    hidden: Sequence[int], rows: dict[int, np.ndarray], width: int, work: _Work
) -> tuple[int, ...] | None:
    """The first hidden client whose row is in the span of all the others' rows, with a
    spanning subset of them: ``(i, j_1, ...)``; ``None`` if there is none."""
    for i in hidden:
        basis: dict[int, np.ndarray] = {}
        others = [k for k in hidden if k != i]
        for k in others:
            _insert(basis, rows[k].copy(), width, work)
        if not _reduced(basis, rows[i].copy(), width, work).any():
            spanning = _spanning(rows, others, width, work)
            return (i, *(k for k in others if k in spanning))
    return None


def _in_span_of_some(
    hidden: Sequence[int], rows: dict[int, np.ndarray], colluders: int, width: int, work: _Work
) -> tuple[int, ...] | None:
    """The first ``(i, j_1, ..., j_c)`` (c = ``colluders``) with row i in the span of rows
    j_1..j_c, searching every c-subset; ``None`` if there is none."""
    for subset in combinations(hidden, colluders):
        basis: dict[int, np.ndarray] = {}
        for k in subset:
            _insert(basis, rows[k].copy(), width, work)
        for i in hidden:
            if i not in subset and not _reduced(basis, rows[i].copy(), width, work).any():
                return (i, *subset)
    return None


def _spanning(
    rows: dict[int, np.ndarray], candidates: Sequence[int], width: int, work: _Work
) -> set[int]:
    """A maximal independent subset of ``rows[candidates]`` (greedy, in order)."""
    basis: dict[int, np.ndarray] = {}
    return {k for k in candidates if _insert(basis, rows[k].copy(), width, work)}


def _small_sums(
    components: Sequence[_Component], min_sum_size: int, budget: _Budget, work: _Work
) -> tuple[list[tuple[int, ...]], int, bool]:
    """Minimal recoverable sets of 2..min_sum_size−1 clients over all components.

    Sizes are searched in increasing order (so minimality can be checked against the
    smaller sets already found). Returns the sets as sorted id tuples, the largest size
    searched completely, and whether the search was complete.
    """
    found: list[list[frozenset[int]]] = [[] for _ in components]
    # A component covered by one equation (a cluster seen once) reveals exactly that sum:
    # its only minimal zero-sum set is the whole component, so it needs no search.
    searched = [c for c in components if c.num_rows != 1]
    for comp, known in zip(components, found, strict=True):
        if comp.num_rows == 1 and 2 <= len(comp.clients) < min_sum_size:
            known.append(frozenset(range(len(comp.clients))))
    largest = max((len(c.hidden) for c in searched), default=0)
    for size in range(2, min(min_sum_size, largest + 1)):
        for comp, known in zip(components, found, strict=True):
            if comp.num_rows == 1:
                continue
            new = _zero_sum_subsets(comp, size, known, budget, work)
            if new is None:
                return _as_ids(components, found), size - 1, False
            known.extend(new)
    return _as_ids(components, found), max(min_sum_size - 1, 0), True


def _as_ids(
    components: Sequence[_Component], found: Sequence[Sequence[frozenset[int]]]
) -> list[tuple[int, ...]]:
    sets = [
        tuple(sorted(comp.clients[k] for k in subset))
        for comp, subsets in zip(components, found, strict=True)
        for subset in subsets
    ]
    return sorted(sets, key=lambda s: (len(s), s))


# ----------------------------------------------------------------------------- the audit


def audit(
    clusterings: Sequence[Clustering],
    *,
    client_ids: Sequence[int] | None = None,
    dropouts: Sequence[Collection[int]] | None = None,
    min_sum_size: int | None = None,
    search_budget: int = DEFAULT_SEARCH_BUDGET,
    work_budget: int | None = None,
    colluders: int = 0,
) -> LeakageReport:
    """Exactly what the server can recover from the cluster sums of ``clusterings``.

    Args:
        clusterings: The R reclusterings of one round, all over the same updates.
        client_ids: The unknowns; default: every client of some clustering. Clients listed
            here but never clustered contribute nothing and are never recoverable.
        dropouts: ``dropouts[r]`` are the clients whose inputs are missing from the sums of
            ``clusterings[r]`` (one entry per clustering). Each cluster contributes the sum
            over its survivors; a cluster with no survivor contributes nothing.
        min_sum_size: Sums of fewer clients than this count as leaks; default: the smallest
            cluster size in ``clusterings`` (1 if there are none).
        search_budget: Cap on subsets and fingerprint matches examined by the small-sum
            search; when it is exhausted the report has ``complete = False``.
        work_budget: Cap on the entry operations of the exact elimination, null-space
            basis and fingerprints (see the module docstring); ``None``: unbounded.
        colluders: c >= 0 clients whose inputs the server knows (it colludes with them):
            an update that follows from the sums and the inputs of at most c others is a
            leak (:attr:`LeakageReport.colluder_leaks`; exact for c = 1 at any size, for
            c >= 2 on components of at most :data:`COLLUDER_SEARCH_CLIENTS` clients unless
            a shortcut decides: otherwise the report is incomplete; module docstring).

    Returns:
        A :class:`LeakageReport` with the exact rank, the individually recoverable clients
        (e_i in the row space: an exact test, never subject to the budget) and the minimal
        recoverable sums of 2..``min_sum_size`` − 1 clients. See the module docstring for
        the method (exact integer elimination; null-space zero-sum search).

    Raises:
        AuditError: for inconsistent input (see the class).
        AuditBudgetExceeded: the work would pass ``work_budget`` (no verdict).
    """
    if colluders < 0:
        raise AuditError(f"colluders must be >= 0, got {colluders}")
    work = _Work(work_budget)
    ids = _resolve_ids(clusterings, client_ids)
    rows = _equations(clusterings, dropouts, frozenset(ids))
    target = _resolve_min_sum_size(clusterings, min_sum_size)
    rows_by_first: dict[int, list[frozenset[int]]] = {i: [] for i in ids}
    for row in rows:
        rows_by_first[min(row)].append(row)
    components: list[_Component] = []
    for clients in _components(ids, rows):
        comp_rows = [row for c in clients for row in rows_by_first[c]]
        components.append(_solve(clients, comp_rows, work))
    budget = _Budget(search_budget)
    sums, searched, complete = _small_sums(components, target, budget, work)
    colluder_leaks: list[tuple[int, ...]] = []
    colluders_done = True
    if colluders:
        for comp in components:
            local, done = _colluder_leaks(comp, colluders, budget, work)
            colluder_leaks.extend(tuple(comp.clients[k] for k in leak) for leak in local)
            colluders_done = colluders_done and done
    return LeakageReport(
        client_ids=ids,
        num_equations=len(rows),
        rank=sum(c.rank for c in components),
        recoverable_clients=tuple(sorted(chain.from_iterable(c.recoverable for c in components))),
        recoverable_small_sums=tuple(sums),
        min_sum_size=target,
        complete=complete and colluders_done,
        searched_up_to=searched,
        difference_classes=tuple(
            sorted(chain.from_iterable(c.difference_classes for c in components))
        ),
        work=work.spent,
        colluders=colluders,
        colluder_leaks=tuple(sorted(colluder_leaks)),
        colluder_search_complete=colluders_done,
    )


def revealed_sums(
    survivors: Collection[int], neighbours: Mapping[int, Collection[int]] | None
) -> list[frozenset[int]]:
    """What unmasking the survivor set ``survivors`` of a cluster reveals: the sum of each
    connected component of the neighbour graph induced on the survivors (sorted by their
    smallest member; no survivor: nothing).

    Why: a survivor's input carries a pair mask for each neighbour and its self mask. The
    server removes the self masks (b of each survivor) and the pair masks shared with
    dropped clients (their mask keys); what is left are the pair masks between two
    survivors, which cancel only in a sum holding both ends. A sum over a union of
    components of the induced graph holds both ends of every such mask, so each component's
    sum unmasks on its own, and no finer sum does (every strict subset of a connected
    component leaves an edge with one end out, whose PRG mask stays). ``neighbours=None``
    is the complete graph: one sum of all the survivors. Neighbours outside ``survivors``
    (dropped clients) are ignored; a survivor without a neighbour list has none."""
    members = {int(u) for u in survivors}
    if neighbours is None:
        return [frozenset(members)] if members else []
    pieces: list[frozenset[int]] = []
    left = set(members)
    while left:
        start = min(left)
        piece, frontier = {start}, [start]
        while frontier:
            u = frontier.pop()
            for v in neighbours.get(u, ()):
                v = int(v)
                if v in left and v not in piece:
                    piece.add(v)
                    frontier.append(v)
        left -= piece
        pieces.append(frozenset(piece))
    return pieces


def linked_rows(row: frozenset[int], rows: Sequence[frozenset[int]]) -> list[frozenset[int]]:
    """The distinct rows linked to ``row`` through shared clients, transitively (``row``
    first). Leaks never cross such components (the equations are block-diagonal over
    them), so auditing the component of a new sum is auditing what the sum can change."""
    return linked_to([row], rows)


def linked_to(
    seeds: Sequence[frozenset[int]], rows: Sequence[frozenset[int]]
) -> list[frozenset[int]]:
    """The distinct ``seeds`` (first, in order) and the ``rows`` linked to any of them
    through shared clients, transitively (see :func:`linked_rows`)."""
    component = list(dict.fromkeys(seeds))
    clients = set().union(*component) if component else set()
    rest = [r for r in dict.fromkeys(rows) if r not in component]
    grew = True
    while grew:
        grew = False
        for r in list(rest):
            if r & clients:
                component.append(r)
                clients |= r
                rest.remove(r)
                grew = True
    return component


def audit_rows(
    rows: Sequence[frozenset[int]],
    min_sum_size: int,
    search_budget: int = DEFAULT_SEARCH_BUDGET,
    work_budget: int | None = None,
    colluders: int = 0,
) -> LeakageReport:
    """:func:`audit` of arbitrary sums (each row the member set of one released sum, with
    ``colluders`` as there); raises :class:`AuditBudgetExceeded` past ``work_budget``."""
    return audit(
        [Clustering((tuple(sorted(r)),)) for r in rows],
        client_ids=sorted(set().union(*rows)),
        min_sum_size=min_sum_size,
        search_budget=search_budget,
        work_budget=work_budget,
        colluders=colluders,
    )


# ------------------------------------------------------------------------- safe sampling


def sample_safe_reclusterings(
    client_ids: Sequence[int],
    cluster_size: int,
    reclusterings: int,
    rng: RngLike = None,
    *,
    max_tries: int = DEFAULT_MAX_TRIES,
    block_size: int | None = None,
    min_sum_size: int | None = None,
    search_budget: int = DEFAULT_SEARCH_BUDGET,
    blocks: Clustering | None = None,
    colluders: int = 0,
) -> list[Clustering]:
    """``reclusterings`` random clusterings whose cluster sums together do not leak.

    Why unrestricted resampling cannot work: R independent random partitions of n clients
    into c clusters have rank min(n, R(c − 1) + 1), so for n = 60, m = 3 the server can
    solve for everybody from R = 4 on, and rejection sampling over whole random partitions
    almost never finds a safe fourth one. Safe sequences must keep the row space small.

    Construction (block-restricted reclustering): the clients are first split once, at
    random, into fixed blocks of about ``block_size`` clients (default 2m; blocks are
    formed like clusters, so each has at least ``block_size`` clients when n allows).
    Every reclustering then partitions *each block separately* into clusters of m (or
    m + 1) clients, so clients are only ever mixed with members of their own block. The
    equation matrix is then block-diagonal, and the plan leaks iff some block leaks (the
    null space is the direct sum of the blocks' null spaces, so every minimal recoverable
    set lies in one block). A candidate reclustering is therefore assembled block by
    block: the block's part is drawn at random and kept only if :func:`audit` of that
    block's previously accepted parts plus the new one reports no leak (and a complete
    search); otherwise it is redrawn, at most ``max_tries`` times. Redrawing a part already
    accepted adds no new equation and is always safe, so for small blocks the sampler
    practically always succeeds: a 6-block has only 10 splits into two triples, so each
    try repeats an accepted split with probability >= 1/10 and 1000 failed tries have
    probability < 10^-45. (Larger blocks have far more partitions, repeats become rare,
    and :class:`SafeSamplingError` becomes possible.) The assembled plan is audited once
    more as a whole before it is returned.

    What to expect at n = 60, m = 3, R = 10: 10 blocks of 6, reclusterings that in practice
    all differ from each other, and each block accumulates distinct splits greedily until one more
    would leak, ending at rank 5 (nullity 1) per block, rank 50 overall.

    Costs of the construction: a client only ever shares clusters with its block-mates
    (fewer distinct mixtures for the robust aggregator than free reclustering). The
    guarantee is exactly the audit's: no update and no sum of fewer than
    ``min_sum_size`` clients is recoverable. Other combinations are: differences of
    updates inside a block (see :attr:`LeakageReport.difference_classes`), and with
    nullity 1 per block the server knows each block's updates up to one unknown
    direction, so a single client colluding with the server exposes its whole block.

    Args:
        client_ids: The clients of the round (distinct).
        cluster_size: m, the target cluster size.
        reclusterings: R >= 1.
        rng: Generator (advanced in place) or seed; the result is reproducible from a seed.
        max_tries: Draws per block and reclustering before giving up.
        block_size: Target block size (>= ``cluster_size``); default 2·m.
        min_sum_size: Sums of fewer clients count as leaks; default min(m, n).
        search_budget: Passed to :func:`audit`.
        blocks: The block partition to use instead of drawing one (a partition of
            ``client_ids``, e.g. one that spreads suspects over the blocks,
            :mod:`sharefl.protocol.isolation`); ``block_size`` is then ignored. Every
            guarantee above holds for any block partition: each block's parts are audited.
        colluders: c, passed to every :func:`audit` (draws, and the final audit): no update
            may follow from the sums and the inputs of c colluders either. With c >= 1 a
            block keeps no two clients with parallel null-space rows; for blocks of 6
            split into triples any second split already gives a difference x_a − x_b, so
            such blocks only repeat their first split (fewer distinct mixtures, no leak).

    Raises:
        ClusteringError: bad ids, ``cluster_size < 1``, ``reclusterings < 1``,
            ``block_size < cluster_size`` or ``max_tries < 1``.
        SafeSamplingError: a single clustering already leaks (e.g. m = 1), or a block had no
            safe draw within ``max_tries``.
    """
    if reclusterings < 1 or max_tries < 1:
        raise ClusteringError("reclusterings and max_tries must be >= 1")
    if cluster_size < 1:
        raise ClusteringError(f"cluster_size must be >= 1, got {cluster_size}")
    block = 2 * cluster_size if block_size is None else block_size
    if block < cluster_size:
        raise ClusteringError(f"block_size {block} is smaller than cluster_size {cluster_size}")
    gen = as_generator(rng)
    if blocks is None:
        parts = random_clustering(client_ids, block, gen).clusters
    elif set(blocks.members) != {int(i) for i in client_ids}:
        raise ClusteringError("blocks must partition exactly client_ids")
    else:
        parts = blocks.clusters
    ids = tuple(sorted(chain.from_iterable(parts)))
    target = min(cluster_size, len(ids)) if min_sum_size is None else min_sum_size
    history: list[list[Clustering]] = [[] for _ in parts]
    plan: list[Clustering] = []
    for _ in range(reclusterings):
        drawn = [
            _safe_block_part(
                members, cluster_size, accepted, target, gen, max_tries, search_budget, colluders
            )
            for members, accepted in zip(parts, history, strict=True)
        ]
        for accepted, part in zip(history, drawn, strict=True):
            if part not in accepted:
                accepted.append(part)
        plan.append(Clustering(tuple(chain.from_iterable(p.clusters for p in drawn))))
    report = audit(
        plan,
        client_ids=ids,
        min_sum_size=target,
        search_budget=search_budget,
        colluders=colluders,
    )
    if report.leaks or not report.complete:  # pragma: no cover - excluded by construction
        raise SafeSamplingError(f"assembled plan failed the final audit:\n{report}")
    return plan


def _safe_block_part(
    block: Sequence[int],
    cluster_size: int,
    accepted: list[Clustering],
    min_sum_size: int,
    gen: np.random.Generator,
    max_tries: int,
    search_budget: int,
    colluders: int = 0,
) -> Clustering:
    """A random partition of ``block`` that keeps the block's accepted parts leak-free."""
    for _ in range(max_tries):
        part = random_clustering(block, cluster_size, gen)
        if part in accepted:
            return part
        report = audit(
            [*accepted, part],
            client_ids=block,
            min_sum_size=min_sum_size,
            search_budget=search_budget,
            colluders=colluders,
        )
        if not report.leaks and report.complete:
            return part
        if not accepted:
            raise SafeSamplingError(
                f"a single clustering of block {tuple(block)} already leaks "
                f"(cluster sizes {part.sizes}, min_sum_size {min_sum_size}):\n{report}"
            )
    raise SafeSamplingError(
        f"no leak-free partition of block {tuple(block)} in {max_tries} tries "
        f"({len(accepted)} distinct parts accepted so far)"
    )
