"""An independent oracle for what a server learns from secure-aggregation traffic.

The oracle answers one question: given everything a (malicious) server holds after any
number of sessions and rounds, which honest inputs, or sums of fewer than
``min_sum_size`` honest inputs, are determined? It shares no code with sharefl's server,
audit or client logic; it uses only the PRG expansion (:func:`sharefl.crypto.prg.expand_mask`),
the Shamir field prime and the X25519 public-key derivation, and does its own share
parsing, Lagrange interpolation and exact linear algebra.

Inputs
------
- :class:`ServerView`: what the server received or controls — every masked input y_u
  (per cluster run), every share revealed in unmask responses (``seed_shares``,
  ``key_shares``, and the two-exchange round's shares of single pair seeds,
  ``pair_shares``) or held by a colluding client, every pair seed revealed directly
  (``pair_seeds`` of an unmask response, or the seeds an older client put in its
  complaints), and the X25519 mask private keys it made or controls.
- :class:`SessionSecrets`, one per session (the test's god view): the session's self-mask
  seed b_u, its mask key pair, the pair seeds it derived with each peer and the peer mask
  public key each was derived from, the threshold, and which input it masked
  (``input_key``; the same key for the same client on the same model, so a replayed
  model is the same unknown; ``None`` for a colluder, whose input the server knows).

Method
------
1. *What the server knows.* b_u when it holds t shares of it that interpolate to b_u
   (every t-subset of the distinct shares it holds is tried), or u colludes; a mask
   private key likewise (or the server made or controls it). A pair seed when revealed,
   when the session's own mask private key is known, when the peer public key the
   session agreed it with belongs to a known private key, or when t shares of it, all
   from one dealer's sharing, interpolate to it.
2. *Decomposition, trusting no description of the masks.* Each received y_u is written as
   y_u = x_u + Σ_k c_k·PRG(stream_k) over Z_2^b with c_k ∈ {−1, 0, 1}, where the candidate
   streams are every stream any party of that cluster run could have used (every b and
   every pair seed of every session of the run). The coefficients are found by exhaustive
   search (the session's own streams first; then all of the run's, by meet in the
   middle on two coordinates), and verified on every coordinate; a y_u with no such
   decomposition is an :class:`UnexplainedInput` (an error, not a leak).
3. *Exact linear algebra,* over the rationals and over GF(2), on rows y_u − (known streams),
   unknowns the inputs and the unknown streams. The inputs' combinations the server can
   compute form the space W of row combinations free of unknown streams (rows with
   stream columns eliminated first: the rows of the reduced echelon form whose pivot is
   an input column). An input x is determined iff e_x ∈ W; a set S of inputs has a
   determined sum iff 1_S ∈ W. GF(2) catches what only the low bit reveals (a stream that
   appears with an even coefficient hides nothing of the parity).

Everything reported is exact: no floating point, no fingerprints.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sharefl.crypto.kdf import x25519_public_key
from sharefl.crypto.prg import expand_mask
from sharefl.crypto.shamir import PRIME

SHARE_X_BYTES = 4
SHARE_Y_BYTES = 33
MAX_CANDIDATE_STREAMS = 22
"""The most candidate streams of one cluster run the meet-in-the-middle search takes
(3^11 sums per half)."""

Column = tuple[str, Hashable]
"""("x", input key) or ("s", seed bytes)."""


class OracleError(AssertionError):
    """The traffic contradicts the god view (a test failure, not a leak)."""


class UnexplainedInput(OracleError):
    """A masked input is not its input plus a ±1/0 combination of the run's PRG streams."""


@dataclass
class SessionSecrets:
    """The god view of one client session in one cluster run.

    Attributes:
        run: the cluster run (unique per set of sessions that talk to each other).
        client: the client id.
        input_key: which input the session masked (same key = same unknown); ``None`` when
            the server knows the input (a colluder).
        threshold: t of the run.
        seed: the self-mask seed b_u.
        mask_private / mask_public: the session's X25519 mask key pair.
        pair_seeds: peer → the pair seed this session derived with it.
        peer_mask_publics: peer → the mask public key the session derived it from.
        colluding: the server knows every secret of this session.
    """

    run: Hashable
    client: int
    input_key: Hashable | None
    threshold: int
    seed: bytes
    mask_private: bytes
    mask_public: bytes
    pair_seeds: dict[int, bytes] = field(default_factory=dict)
    peer_mask_publics: dict[int, bytes] = field(default_factory=dict)
    colluding: bool = False


@dataclass
class ServerView:
    """Everything the server holds: filled by the test's server as messages arrive."""

    masked: list[tuple[Hashable, int, np.ndarray]] = field(default_factory=list)
    shares: dict[tuple[Hashable, int, str], set[bytes]] = field(
        default_factory=lambda: defaultdict(set)
    )
    revealed_seeds: set[bytes] = field(default_factory=set)
    controlled_privates: set[bytes] = field(default_factory=set)

    def masked_input(self, run: Hashable, message: Any) -> None:
        """A ``MaskedInput`` received in ``run`` (complaint seeds, if any, are revealed)."""
        self.masked.append((run, int(message.sender), np.array(message.vector, copy=True)))
        complaints = getattr(message, "complaints", ())
        if isinstance(complaints, Mapping):
            self.revealed_seeds.update(bytes(s) for s in complaints.values())

    def unmask_response(self, run: Hashable, message: Any) -> None:
        """An ``UnmaskResponse`` received in ``run``."""
        for owner, share in message.seed_shares.items():
            self.shares[(run, int(owner), "seed")].add(bytes(share))
        for owner, share in message.key_shares.items():
            self.shares[(run, int(owner), "key")].add(bytes(share))
        self.revealed_seeds.update(bytes(s) for s in getattr(message, "pair_seeds", {}).values())
        self.pair_shares(run, getattr(message, "pair_shares", {}))

    def pair_shares(self, run: Hashable, shares: Mapping[tuple[int, int], bytes]) -> None:
        """Two-exchange round: shares of pair seeds, (dealer w, peer v) → a share of the
        s_wv that w dealt (revealed in an unmask response or read by a colluding holder)."""
        for (dealer, peer), share in shares.items():
            self.shares[(run, int(dealer), ("pair", int(peer)))].add(bytes(share))

    def held_seed_share(self, run: Hashable, owner: int, seed_share: bytes) -> None:
        """A share of ``owner``'s self-mask seed a colluding holder decrypted."""
        self.shares[(run, owner, "seed")].add(bytes(seed_share))

    def held_shares(self, run: Hashable, owner: int, key_share: bytes, seed_share: bytes) -> None:
        """The shares of ``owner``'s secrets that a colluding holder decrypted."""
        self.shares[(run, owner, "key")].add(bytes(key_share))
        self.shares[(run, owner, "seed")].add(bytes(seed_share))

    def control(self, private: bytes) -> None:
        """An X25519 mask private key the server made (a substituted advertisement)."""
        self.controlled_privates.add(bytes(private))


@dataclass(frozen=True)
class Leak:
    """A determined combination: the sum of ``inputs`` (one input: the input itself), over
    ``field`` ("Q": the whole value; "GF(2)": its low bit)."""

    inputs: tuple[Hashable, ...]
    field: str


@dataclass
class Findings:
    """The oracle's answer."""

    leaks: list[Leak]
    known_seeds: frozenset[bytes]
    rows: int
    unknown_inputs: tuple[Hashable, ...]

    def __bool__(self) -> bool:
        return bool(self.leaks)

    def describe(self) -> str:
        if not self.leaks:
            return f"no leak ({self.rows} masked inputs, {len(self.unknown_inputs)} unknowns)"
        return "; ".join(
            f"{'+'.join(map(str, leak.inputs))} over {leak.field}" for leak in self.leaks[:12]
        )


# --------------------------------------------------------------------------- Shamir


def _parse_share(data: bytes) -> tuple[int, int] | None:
    if len(data) != SHARE_X_BYTES + SHARE_Y_BYTES:
        return None
    x = int.from_bytes(data[:SHARE_X_BYTES], "big")
    y = int.from_bytes(data[SHARE_X_BYTES:], "big")
    return (x, y) if x != 0 and y < PRIME else None


def _interpolate_at_zero(points: Sequence[tuple[int, int]]) -> int:
    total = 0
    for i, (xi, yi) in enumerate(points):
        num, den = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


def holds_secret(shares: Iterable[bytes], threshold: int, secret: bytes) -> bool:
    """Whether some ``threshold`` of ``shares`` with distinct x interpolate to ``secret``."""
    points = sorted({p for s in shares if (p := _parse_share(s)) is not None})
    target = int.from_bytes(secret, "big")
    by_x: dict[int, list[int]] = defaultdict(list)
    for x, y in points:
        by_x[x].append(y)
    if len(by_x) < threshold:
        return False
    for xs in itertools.combinations(sorted(by_x), threshold):
        for ys in itertools.product(*(by_x[x] for x in xs)):
            if _interpolate_at_zero(list(zip(xs, ys, strict=True))) == target:
                return True
    return False


# --------------------------------------------------------------------------- decomposition


class _Streams:
    """PRG(seed) as uint64 vectors (wrapping arithmetic; reduced mod 2^bits when compared)."""

    def __init__(self, length: int, bits: int) -> None:
        self.length, self.bits = length, bits
        self.modulus_mask = np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(2**64 - 1)
        self._cache: dict[bytes, np.ndarray] = {}

    def __call__(self, seed: bytes) -> np.ndarray:
        if seed not in self._cache:
            self._cache[seed] = expand_mask(seed, self.length, self.bits).astype(np.uint64)
        return self._cache[seed]


_COEFFS: dict[int, np.ndarray] = {}


def _all_coefficients(k: int) -> np.ndarray:
    """Every vector of {−1, 0, 1}^k as rows (−1 as 2^64 − 1), zero vector first."""
    if k not in _COEFFS:
        grid = np.array(list(itertools.product((0, 1, -1), repeat=k)), dtype=np.int64)
        _COEFFS[k] = grid.reshape(-1, k).astype(np.uint64)
    return _COEFFS[k]


def _as_signed(c: np.ndarray) -> list[int]:
    return [int(v) if v < 2**63 else int(v) - 2**64 for v in c]


def _sums(streams: _Streams, seeds: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    coeffs = _all_coefficients(len(seeds))
    if not seeds:
        return coeffs, np.zeros((1, streams.length), dtype=np.uint64)
    matrix = np.stack([streams(s) for s in seeds])
    with np.errstate(over="ignore"):
        return coeffs, (coeffs @ matrix) & streams.modulus_mask


def decompose(
    target: np.ndarray, seeds: Sequence[bytes], streams: _Streams
) -> dict[bytes, int] | None:
    """The c ∈ {−1, 0, 1}^k with target = Σ c_k·PRG(seeds[k]) (mod 2^bits), or None.

    Exhaustive for k <= 8, else meet in the middle on the first two coordinates, then
    verified on every coordinate. Raises :class:`OracleError` if two decompositions fit.
    """
    seeds = list(dict.fromkeys(seeds))
    if len(seeds) > MAX_CANDIDATE_STREAMS:
        raise OracleError(f"{len(seeds)} candidate streams: too many to search")
    mask = streams.modulus_mask
    target = np.asarray(target, dtype=np.uint64) & mask
    if len(seeds) <= 8:
        coeffs, sums = _sums(streams, seeds)
        hits = np.flatnonzero((sums == target).all(axis=1))
        solutions = [coeffs[h] for h in hits]
    else:
        half = len(seeds) // 2
        ca, sa = _sums(streams, seeds[:half])
        cb, sb = _sums(streams, seeds[half:])
        with np.errstate(over="ignore"):
            rest = (target - sa) & mask  # target − A = B
        probe = min(2, streams.length)

        def keys(m: np.ndarray) -> np.ndarray:
            out = m[:, 0].copy()
            if probe == 2 and streams.bits <= 32:
                out = out | (m[:, 1] << np.uint64(32))
            return out

        ka, kb = keys(rest), keys(sb)
        order = np.argsort(kb, kind="stable")
        kb_sorted = kb[order]
        lo = np.searchsorted(kb_sorted, ka, side="left")
        hi = np.searchsorted(kb_sorted, ka, side="right")
        solutions = []
        for i in np.flatnonzero(hi > lo):
            for j in order[lo[i] : hi[i]]:
                if (rest[i] == sb[j]).all():
                    solutions.append(np.concatenate([ca[i], cb[j]]))
    if not solutions:
        return None
    if len(solutions) > 1:
        raise OracleError(f"{len(solutions)} decompositions of one masked input")
    signed = _as_signed(solutions[0])
    return {s: c for s, c in zip(seeds, signed, strict=True) if c}


# --------------------------------------------------------------------------- linear algebra


def _normalise(row: list[int]) -> list[int]:
    g = math.gcd(*row)
    if g > 1:
        row = [v // g for v in row]
    first = next((v for v in row if v), 0)
    return [-v for v in row] if first < 0 else row


def _rref_q(rows: list[list[int]], width: int) -> list[list[int]]:
    """Fraction-free Gauss–Jordan over Q: the nonzero rows of the RREF (each scaled to
    coprime integers), in pivot order; every row is zero in the other rows' pivots."""
    basis: list[tuple[int, list[int]]] = []
    for row in rows:
        v = list(row)
        for p, b in basis:
            if v[p]:
                v = _normalise([v[i] * b[p] - b[i] * v[p] for i in range(width)])
        pivot = next((i for i in range(width) if v[i]), None)
        if pivot is None:
            continue
        v = _normalise(v)
        basis = [
            (p, _normalise([b[i] * v[pivot] - v[i] * b[pivot] for i in range(width)]))
            if b[pivot]
            else (p, b)
            for p, b in basis
        ]
        basis.append((pivot, v))
    basis.sort()
    return [b for _, b in basis]


def _rref_gf2(rows: list[int]) -> dict[int, int]:
    """Gauss–Jordan over GF(2) on bitmask rows: pivot bit (the lowest set bit) → row."""
    basis: dict[int, int] = {}
    for v in rows:
        for p, b in basis.items():
            if v >> p & 1:
                v ^= b
        if not v:
            continue
        pivot = (v & -v).bit_length() - 1
        for p in list(basis):
            if basis[p] >> pivot & 1:
                basis[p] ^= v
        basis[pivot] = v
    return basis


def _stream_free_q(
    rows: list[dict[Column, int]], streams: list[Column], inputs: list[Column]
) -> list[dict[Column, int]]:
    """Basis over Q of the row combinations with no stream column, as input vectors."""
    columns = streams + inputs
    index = {c: i for i, c in enumerate(columns)}
    dense = []
    for row in rows:
        v = [0] * len(columns)
        for c, coef in row.items():
            v[index[c]] += coef
        dense.append(v)
    out = []
    for b in _rref_q(dense, len(columns)):
        pivot = next(i for i, v in enumerate(b) if v)
        if pivot >= len(streams):
            out.append({columns[i]: b[i] for i in range(len(streams), len(columns)) if b[i]})
    return out


def _stream_free_gf2(
    rows: list[dict[Column, int]], streams: list[Column], inputs: list[Column]
) -> list[dict[Column, int]]:
    """The same over GF(2) (stream columns in the low bits, so they are eliminated first)."""
    columns = streams + inputs
    index = {c: i for i, c in enumerate(columns)}
    masks = []
    for row in rows:
        v = 0
        for c, coef in row.items():
            if coef % 2:
                v ^= 1 << index[c]
        masks.append(v)
    out = []
    for pivot, b in _rref_gf2(masks).items():
        if pivot >= len(streams):
            out.append({columns[i]: 1 for i in range(len(streams), len(columns)) if b >> i & 1})
    return out


def _null_columns_q(vectors: list[dict[Column, int]], inputs: list[Column]) -> list[tuple]:
    """For each input column i, row i of an integer null-space basis Z of span(vectors):
    v ∈ span iff Σ_i v_i·Z_i = 0."""
    width = len(inputs)
    index = {c: i for i, c in enumerate(inputs)}
    dense = []
    for vec in vectors:
        v = [0] * width
        for c, coef in vec.items():
            v[index[c]] = coef
        dense.append(v)
    basis = {next(i for i, x in enumerate(b) if x): b for b in _rref_q(dense, width)}
    free = [f for f in range(width) if f not in basis]
    columns = []
    for f in free:
        users = [(p, b) for p, b in basis.items() if b[f]]
        lcm = math.lcm(*(b[p] for p, b in users)) if users else 1
        z = [0] * width
        z[f] = lcm
        for p, b in users:
            z[p] = -b[f] * (lcm // b[p])
        columns.append(z)
    return [tuple(col[i] for col in columns) for i in range(width)]


def _null_columns_gf2(vectors: list[dict[Column, int]], inputs: list[Column]) -> list[int]:
    """Row i of a GF(2) null-space basis (as a bitmask over the null vectors)."""
    index = {c: i for i, c in enumerate(inputs)}
    masks = []
    for vec in vectors:
        v = 0
        for c, coef in vec.items():
            if coef % 2:
                v ^= 1 << index[c]
        masks.append(v)
    basis = _rref_gf2(masks)
    free = [f for f in range(len(inputs)) if f not in basis]
    rows = [0] * len(inputs)
    for k, f in enumerate(free):
        rows[f] |= 1 << k
        for p, b in basis.items():
            if b >> f & 1:
                rows[p] |= 1 << k
    return rows


def _integer_kernel(matrix: list[tuple[int, ...]], width: int) -> list[list[int]]:
    """A Z-basis of {v ∈ Z^width : matrix·v = 0} (``matrix`` given as rows), by unimodular
    column operations (extended Euclid on each row), tracked in U: the columns of U whose
    image is zero span the integer kernel, and U is unimodular, so they are a basis."""
    a = [list(row) for row in matrix]
    u = [[int(i == j) for j in range(width)] for i in range(width)]

    def column_op(dst: int, src: int, q: int) -> None:  # col_dst -= q·col_src
        for m in (a, u):
            for row in m:
                row[dst] -= q * row[src]

    def swap(i: int, j: int) -> None:
        for m in (a, u):
            for row in m:
                row[i], row[j] = row[j], row[i]

    c = 0
    for row in a:
        if c == width:
            break
        while True:
            nonzero = [j for j in range(c, width) if row[j]]
            if not nonzero:
                break
            j = min(nonzero, key=lambda j: abs(row[j]))
            swap(c, j)
            if len(nonzero) == 1:
                c += 1
                break
            for j in range(c + 1, width):
                if row[j]:
                    column_op(j, c, row[j] // row[c])
    return [[u[i][j] for i in range(width)] for j in range(c, width)]


def _zero_sum_sets(columns: list, max_size: int, add, zero) -> list[tuple[int, ...]]:
    """Index sets S (1 <= |S| <= max_size), minimal under inclusion among those found
    first by size, whose columns sum to ``zero``."""
    found: list[tuple[int, ...]] = []
    for size in range(1, max_size + 1):
        for subset in itertools.combinations(range(len(columns)), size):
            if any(set(f) <= set(subset) for f in found):
                continue
            total = columns[subset[0]]
            for i in subset[1:]:
                total = add(total, columns[i])
            if total == zero:
                found.append(subset)
    return found


# --------------------------------------------------------------------------- the oracle


@dataclass
class LeakOracle:
    """Decides what a server's view determines (see the module docstring).

    Args:
        min_sum_size: sums of fewer honest inputs than this are leaks (individual inputs
            always are).
        bits: the ring width (32 or 64).
    """

    min_sum_size: int = 3
    bits: int = 32

    def analyse(
        self,
        view: ServerView,
        sessions: Iterable[SessionSecrets],
        inputs: Mapping[Hashable, np.ndarray],
    ) -> Findings:
        """The leaks in ``view`` given the god view. Raises :class:`UnexplainedInput` when a
        masked input does not decompose, :class:`OracleError` for a masked input of a
        session the god view lacks."""
        by_key = {(s.run, s.client): s for s in sessions}
        by_run: dict[Hashable, list[SessionSecrets]] = defaultdict(list)
        for s in by_key.values():
            by_run[s.run].append(s)
        known = self._known_seeds(view, list(by_key.values()))
        rows: list[dict[Column, int]] = []
        streams_cache: dict[int, _Streams] = {}
        for run, sender, vector in view.masked:
            session = by_key.get((run, sender))
            if session is None:
                raise OracleError(f"a masked input from {sender} in run {run!r} with no session")
            if session.input_key is None:
                continue  # the server knows this input and every one of its streams
            streams = streams_cache.setdefault(len(vector), _Streams(len(vector), self.bits))
            with np.errstate(over="ignore"):
                target = vector.astype(np.uint64) - np.asarray(
                    inputs[session.input_key], dtype=np.uint64
                )
            own = [session.seed, *session.pair_seeds.values()]
            coefficients = decompose(target, own, streams)
            if coefficients is None:
                everything = [s.seed for s in by_run[run]]
                everything += [p for s in by_run[run] for p in s.pair_seeds.values()]
                coefficients = decompose(target, everything, streams)
            if coefficients is None:
                raise UnexplainedInput(
                    f"client {sender}'s masked input in run {run!r} is not its input plus a "
                    "±1 combination of the run's PRG streams"
                )
            row: dict[Column, int] = {("x", session.input_key): 1}
            row.update({("s", seed): c for seed, c in coefficients.items() if seed not in known})
            rows.append(row)
        return self._solve(rows, known)

    def _known_seeds(self, view: ServerView, sessions: list[SessionSecrets]) -> frozenset[bytes]:
        privates = set(view.controlled_privates)
        known: set[bytes] = set(view.revealed_seeds)
        for s in sessions:
            if s.colluding:
                privates.add(s.mask_private)
                known.add(s.seed)
                continue
            if holds_secret(view.shares.get((s.run, s.client, "seed"), ()), s.threshold, s.seed):
                known.add(s.seed)
            if holds_secret(
                view.shares.get((s.run, s.client, "key"), ()), s.threshold, s.mask_private
            ):
                privates.add(s.mask_private)
        publics = {x25519_public_key(p) for p in privates}
        for s in sessions:
            own_known = s.mask_private in privates
            for peer, seed in s.pair_seeds.items():
                if (
                    own_known
                    or s.peer_mask_publics.get(peer) in publics
                    or holds_secret(
                        view.shares.get((s.run, s.client, ("pair", peer)), ()), s.threshold, seed
                    )
                ):
                    known.add(seed)
        return frozenset(known)

    def _solve(self, rows: list[dict[Column, int]], known: frozenset[bytes]) -> Findings:
        inputs = sorted({c for r in rows for c in r if c[0] == "x"}, key=repr)
        # Rows that share an unknown stream are eliminated together (components).
        parent = list(range(len(rows)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[Column, int] = {}
        for i, row in enumerate(rows):
            for c in row:
                if c[0] == "s":
                    if c in owner:
                        parent[find(i)] = find(owner[c])
                    else:
                        owner[c] = i
        groups: dict[int, list[dict[Column, int]]] = defaultdict(list)
        for i, row in enumerate(rows):
            groups[find(i)].append(row)
        free_q: list[dict[Column, int]] = []
        free_2: list[dict[Column, int]] = []
        for group in groups.values():
            streams = sorted({c for r in group for c in r if c[0] == "s"}, key=repr)
            local = sorted({c for r in group for c in r if c[0] == "x"}, key=repr)
            free_q += _stream_free_q(group, streams, local)
            free_2 += _stream_free_gf2(group, streams, local)
        leaks: list[Leak] = []
        keys = [c[1] for c in inputs]
        max_size = max(1, self.min_sum_size - 1)
        z_q = _null_columns_q(free_q, inputs)
        zero_q = tuple(0 for _ in (z_q[0] if z_q else ()))
        for subset in _zero_sum_sets(
            z_q, max_size, lambda a, b: tuple(x + y for x, y in zip(a, b, strict=True)), zero_q
        ):
            leaks.append(Leak(tuple(keys[i] for i in subset), "Q"))
        # GF(2): parities the server learns beyond the integer combinations it learns
        # exactly (a difference x_a − x_b gives the parity of x_a + x_b: not a new leak).
        exact = _rref_gf2(
            [
                sum(1 << i for i, v in enumerate(vec) if v % 2)
                for vec in _integer_kernel(
                    [tuple(z[j] for z in z_q) for j in range(len(zero_q))], len(inputs)
                )
            ]
        )
        z_2 = _null_columns_gf2(free_2, inputs)
        for subset in _zero_sum_sets(z_2, max_size, lambda a, b: a ^ b, 0):
            v = sum(1 << i for i in subset)
            for p, b in exact.items():
                if v >> p & 1:
                    v ^= b
            if v:
                leaks.append(Leak(tuple(keys[i] for i in subset), "GF(2)"))
        return Findings(leaks, known, len(rows), tuple(keys))
