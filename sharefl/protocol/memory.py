"""What a client remembers across rounds and restarts, so a server cannot replay them.

What it keeps, for the one server identity it serves (the SHA-256 of the TLS CA the client
trusts, of a signed Flower directory, or :data:`UNAUTHENTICATED`; a file of another
identity is refused, never replaced, and a file that disappears under a running client is
an error):

- **A1 — its atom** (:mod:`sharefl.protocol.atoms`): the roster of the first atom it joins;
  from then on a plan that lists another roster for it, or has no atoms, is refused
  (:class:`AtomRefused`). With atoms every release is a sum of whole atoms whatever the
  round, model or run, so R1 and R2 below are not needed and not applied.
- **B — its budget** (:mod:`sharefl.protocol.budget`): the rounds it joined and the Rényi DP
  of the noise it charged itself, whatever the run id; a round past ``max_rounds`` or
  ``max_epsilon`` is refused (:class:`BudgetExhausted`).

For plans without atoms (``secure_aggregation.atoms = false``): a
:class:`~sharefl.protocol.client_round.ClientRound` checks one round against its plan,
but a round plan says nothing about the rounds before it. Without memory a malicious server
can send four "round 0"s with four plans, each safe on its own: the client's update depends
only on the model it trains on, so four sets of cluster sums of the same update solve it
exactly. Increasing round numbers do not help when the model is sent again unchanged, and a
client that restarts would forget everything. :class:`ClientMemory` is what one client
remembers for one server identity, and the rules it enforces (invariant I4):

- **R1 — rounds strictly increase within a run.** Per run id (the server's identifier of
  one training run, ``RoundStart.run``) the memory keeps the last round number the client
  took part in; a round number at or below it is refused (:class:`RoundReplayed`).
  Argument: taking part twice in one round number is the only way to be shown two plans of
  "the same" round; with R1 a round number, hence the plan bound into every key of that
  round (:meth:`RoundPlan.digest`), is used once.
- **R2 — one model, one set of clusterings.** Per model digest (SHA-256 of the model the
  client trained on, :func:`model_digest`) the memory keeps the clusterings
  (:meth:`RoundPlan.clusterings_digest`, independent of the round number) under which the
  client contributed. The same model is accepted again only under identical clusterings,
  else :class:`ModelReplayed`. Argument: an update is a function of the model (and of the
  client's fixed data), so two rounds on one model are, for the server, more sums of the
  same inputs. Under identical clusterings they are sums over the same clusters of the same
  inputs: nothing new, except where a cluster is released over a different survivor set —
  and every release on a model is remembered (``releases``) and audited together with the
  current round's (:meth:`ClientRound.check_release`), so survivor sets that differ across
  rounds are caught like survivor sets within one round. Under different clusterings the
  sums of the two plans together may solve the update (each plan was audited alone), so
  they are refused. R2 is also what lets an honest server re-run a round whose clusters all
  failed (model unchanged: it reuses the plan's clusterings under a new round number) and
  resume after a crash.
- **Records precede what they justify.** A round (run, round, model, clusterings) is
  recorded when the client accepts its first assignment of the round
  (:meth:`ClientRound.vet`, before the advertisement leaves), and a release before the
  unmask response leaves (:meth:`ClientRound.handle`). The record checks R1 and R2 again
  under the file lock, so two guards (or two processes) cannot both take one round. A
  failed write raises (``OSError``) and the client sends nothing.

With a ``path`` the memory is a JSON file written atomically (a temporary file in the same
directory, fsync, :func:`os.replace`, then the directory is synced), mode 0600, in a
directory created 0700; every change re-reads the file under an exclusive ``flock`` so two
processes of one client do not lose each other's records. A crash mid-write leaves the
previous file. ``ClientMemory(path=None)`` keeps everything in memory (in-process simulation,
tests, a client without a state directory: it is then protected for the life of the process).

What it costs and what remains:

- A client that loses its state directory (or runs without one and restarts) loses the
  protection: it cannot tell a replayed round or model from a new one.
- The file is bounded: the last ``max_runs`` runs and ``max_models`` models (default 1024
  each, least recently used dropped first) and at most ``max_releases`` distinct survivor
  sets per model (default 256; a further release on that model is refused, not dropped).
  A forgotten model can be replayed under new clusterings — but only after the client took
  part on ``max_models`` other models since; a forgotten run's round numbers can be reused,
  but R2 still holds for every remembered model.
- Without atoms only exact replays are caught. A server that perturbs the model slightly
  gets nearly equal updates under new clusterings; a trainer with fresh randomness per call
  makes the updates differ too. Atoms (A1) are what closes this; without them only
  differential-privacy noise on the update bounds that leakage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sharefl.protocol import budget
from sharefl.protocol.errors import (
    AtomRefused,
    BudgetExhausted,
    ConfigurationError,
    MalformedRequest,
    ModelReplayed,
    RoundReplayed,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-process lock
    fcntl = None  # type: ignore[assignment]

Position = tuple[int, int]
"""(reclustering, cluster) of one cluster of a plan."""

MEMORY_VERSION = 2
"""The ``version`` of the JSON file (2: the server identity, the atom and the budget)."""
DEFAULT_MAX_MODELS = 1024
DEFAULT_MAX_RUNS = 1024
DEFAULT_MAX_RELEASES = 256
MAX_RUN_BYTES = 64
"""The longest run id a client records (the file stays bounded)."""
MODEL_TAG = b"sharefl/model\x00"


class ClientMemoryError(ConfigurationError):
    """The memory file cannot be read (corrupt, another version, wrong types) or the bounds
    are invalid. The client does not start afresh silently: that would forget the rounds
    and models it took part in."""


def model_digest(model: np.ndarray) -> bytes:
    """SHA-256 of a model as the client received it: a tag, the number of elements (8 bytes
    big-endian), then the little-endian float32 bytes. Bitwise: -0.0 and 0.0 differ."""
    flat = np.ascontiguousarray(np.asarray(model).reshape(-1), dtype="<f4")
    h = hashlib.sha256(MODEL_TAG)
    h.update(struct.pack(">Q", flat.size))
    h.update(flat.data)  # no copy: the model is megabytes, hashed every round
    return h.digest()


@dataclass
class _Model:
    """What the client did on one model: the clusterings, and each release it saw."""

    clusterings: bytes
    releases: dict[Position, set[frozenset[int]]] = field(default_factory=dict)

    def release_count(self) -> int:
        return sum(len(sets) for sets in self.releases.values())


@dataclass(frozen=True)
class Limits:
    """A client's own budget (:mod:`sharefl.protocol.budget`): at most ``max_rounds``
    rounds joined and ``max_epsilon`` at ``delta`` of its own noise (``None``: no limit)."""

    max_rounds: int | None = None
    max_epsilon: float | None = None
    delta: float = 1e-5


class ClientMemory:
    """What one client remembers for one server identity (see the module docstring).

    Args:
        path: the JSON file (created on the first record); ``None``: in memory only.
        server: the identity of the server this memory serves (the SHA-256 of the TLS CA
            the client trusts, of the signed directory, or :data:`UNAUTHENTICATED`); a file
            that records another identity is refused (:class:`ClientMemoryError`: one
            state directory serves one server identity). ``None``: not checked.
        max_models: models remembered (least recently used dropped first).
        max_runs: runs remembered (least recently used dropped first).
        max_releases: distinct survivor sets kept per model; one more is refused.

    Raises :class:`ClientMemoryError` for an unreadable file, a file of another server
    identity, or bounds below 1.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        server: bytes | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        max_runs: int = DEFAULT_MAX_RUNS,
        max_releases: int = DEFAULT_MAX_RELEASES,
    ) -> None:
        if min(max_models, max_runs, max_releases) < 1:
            raise ClientMemoryError("max_models, max_runs and max_releases must be >= 1")
        self.path = Path(path) if path is not None else None
        self.server = None if server is None else bytes(server)
        self.max_models = max_models
        self.max_runs = max_runs
        self.max_releases = max_releases
        self._runs: dict[bytes, int] = {}
        self._models: dict[bytes, _Model] = {}
        self._server: bytes | None = self.server
        self._atom: tuple[int, ...] | None = None
        self._joined = 0
        self._rdp: tuple[float, ...] = ()
        self._exists = False  # the file was read or written by this object
        with self._transaction(write=False):
            pass

    # -- queries ----------------------------------------------------------------------------

    def last_round(self, run: bytes) -> int | None:
        """The last round number of ``run`` this client took part in (None: none)."""
        with self._transaction(write=False):
            return self._runs.get(bytes(run))

    def clusterings(self, model: bytes) -> bytes | None:
        """The clusterings digest this client contributed under on ``model`` (None: it did
        not contribute on it, or forgot it)."""
        with self._transaction(write=False):
            record = self._models.get(bytes(model))
            return None if record is None else record.clusterings

    def releases(self, model: bytes) -> dict[Position, frozenset[frozenset[int]]]:
        """Every survivor set this client helped release on ``model``, by position (several
        per position when the model was used in several rounds)."""
        with self._transaction(write=False):
            record = self._models.get(bytes(model))
            if record is None:
                return {}
            return {p: frozenset(sets) for p, sets in record.releases.items()}

    def atom(self) -> tuple[int, ...] | None:
        """The roster of the atom this client joined under this server identity (A1 of
        :mod:`sharefl.protocol.atoms`; None: none yet)."""
        with self._transaction(write=False):
            return self._atom

    def joined(self) -> int:
        """The rounds this client joined under this server identity (any run id)."""
        with self._transaction(write=False):
            return self._joined

    def epsilon(self, delta: float) -> float:
        """The ε at ``delta`` of the noise this client charged itself so far."""
        with self._transaction(write=False):
            return budget.epsilon(self._rdp, delta)

    # -- the rules --------------------------------------------------------------------------

    def check(
        self,
        run: bytes,
        round: int,
        model: bytes | None,
        clusterings: bytes,
        *,
        client: int | None = None,
        atom: tuple[int, ...] | None = None,
        limits: Limits | None = None,
        charge: budget.PrivacyCharge | None = None,
    ) -> None:
        """The rules for a round about to start; records nothing. ``atom``: this client's
        atom in the round's plan (``None``: a plan without atoms). With an atom, A1 (the
        roster remembered, if any) — R1 and R2 are not needed then (module docstring);
        without one, R1 and R2 (``model=None``, digest unknown: R1 only), and a client
        that has an atom refuses. Then the budget (``limits``, ``charge``). Raises
        :class:`AtomRefused`, :class:`RoundReplayed`, :class:`ModelReplayed`,
        :class:`BudgetExhausted`."""
        with self._transaction(write=False):
            self._check(bytes(run), round, model, clusterings, client, atom, limits, charge)

    def record_round(
        self,
        run: bytes,
        round: int,
        model: bytes | None,
        clusterings: bytes,
        *,
        client: int | None = None,
        atom: tuple[int, ...] | None = None,
        limits: Limits | None = None,
        charge: budget.PrivacyCharge | None = None,
    ) -> None:
        """Check the rules again (under the lock) and record that this client takes part in
        ``round`` of ``run`` on ``model`` under ``clusterings`` (its atom, one more round
        joined, ``charge`` added to its ledger); persisted before it returns. Raises what
        :meth:`check` raises, ``OSError`` (not recorded)."""
        run = bytes(run)
        with self._transaction(write=True):
            self._check(run, round, model, clusterings, client, atom, limits, charge)
            if atom is not None:
                self._atom = tuple(sorted(atom))
            else:
                self._runs.pop(run, None)
                self._runs[run] = round
                if model is not None:
                    record = self._models.pop(model, None) or _Model(clusterings)
                    self._models[model] = record
            self._joined += 1
            self._rdp = budget.add(self._rdp, charge)
            self._trim()

    def record_release(
        self,
        model: bytes,
        clusterings: bytes,
        position: Position,
        survivors: Iterable[int],
        *,
        client: int | None = None,
    ) -> None:
        """Record that this client helps release the sum of ``survivors`` at ``position`` on
        ``model``; persisted before it returns. Raises :class:`ModelReplayed` when the model
        runs under other clusterings or already has ``max_releases`` survivor sets (the
        release is then not made), ``OSError`` (not recorded)."""
        model, survivors = bytes(model), frozenset(int(i) for i in survivors)
        position = (int(position[0]), int(position[1]))
        with self._transaction(write=True):
            record = self._models.get(model) or _Model(clusterings)
            who = "" if client is None else f"client {client}: "
            if record.clusterings != clusterings:
                raise ModelReplayed(
                    f"{who}a release on model {model.hex()[:16]} under other clusterings than "
                    "those it contributed under; the server must reuse that plan's clusterings"
                )
            known = survivors in record.releases.get(position, ())
            if not known and record.release_count() >= self.max_releases:
                raise ModelReplayed(
                    f"{who}{record.release_count()} sums were already released on model "
                    f"{model.hex()[:16]}; the server must send a new model"
                )
            record.releases.setdefault(position, set()).add(survivors)
            self._models.pop(model, None)
            self._models[model] = record
            self._trim()

    def _check(
        self,
        run: bytes,
        round: int,
        model: bytes | None,
        clusterings: bytes,
        client: int | None,
        atom: tuple[int, ...] | None = None,
        limits: Limits | None = None,
        charge: budget.PrivacyCharge | None = None,
    ) -> None:
        who = "this client" if client is None else f"client {client}"
        self._check_budget(who, limits, charge)
        if atom is not None or self._atom is not None:
            self._check_atom(who, atom)
            return
        if len(run) > MAX_RUN_BYTES:
            raise MalformedRequest(
                f"{who}: a run id of {len(run)} bytes; the server must use at most "
                f"{MAX_RUN_BYTES} (16 random bytes suffice)"
            )
        last = self._runs.get(run)
        if last is not None and round <= last:
            raise RoundReplayed(
                f"{who} already took part in round {last} of run {run.hex()[:16] or '(none)'}; "
                f"round {round} does not increase: the server must start round {last + 1} or "
                "later (a re-run of a failed round too)"
            )
        if model is None:
            return
        record = self._models.get(model)
        if record is not None and record.clusterings != clusterings:
            raise ModelReplayed(
                f"{who} already contributed an update on this model ({model.hex()[:16]}; "
                f"round {round}) under other clusterings; the server must send a new model, "
                "or reuse the clusterings of the plan it used on this model"
            )

    def _check_atom(self, who: str, atom: tuple[int, ...] | None) -> None:
        """A1: the first atom is kept; a plan without atoms, or with another roster, is
        refused from then on."""
        if atom is None:
            raise AtomRefused(
                f"{who} belongs to atom {list(self._atom or ())} of this server; the round "
                "plan has no atoms: the server must plan whole atoms (secure_aggregation."
                "atoms), or this client would let it difference sums across rounds"
            )
        if self._atom is not None and tuple(sorted(atom)) != self._atom:
            raise AtomRefused(
                f"{who} belongs to atom {list(self._atom)} of this server; the round plan "
                f"puts it in {sorted(atom)}: an atom is never re-formed (a member that left "
                "for good retires it)"
            )

    def _check_budget(
        self, who: str, limits: Limits | None, charge: budget.PrivacyCharge | None
    ) -> None:
        if limits is None:
            return
        if limits.max_rounds is not None and self._joined + 1 > limits.max_rounds:
            raise BudgetExhausted(
                f"{who} already joined {self._joined} rounds of this server, its limit "
                f"max_rounds = {limits.max_rounds}: it takes part in no more"
            )
        if limits.max_epsilon is None:
            return
        if charge is None:
            raise BudgetExhausted(
                f"{who} keeps an ε budget ({limits.max_epsilon}) but this round's privacy "
                "cost is unknown (its trainer adds no DP noise it can account): configure "
                "DP training, or drop max_epsilon"
            )
        after = budget.epsilon(budget.add(self._rdp, charge), limits.delta)
        if after > limits.max_epsilon:
            spent = budget.epsilon(self._rdp, limits.delta)
            raise BudgetExhausted(
                f"{who} has spent ε = {spent:.3g} (δ = {limits.delta:g}) of its "
                f"max_epsilon = {limits.max_epsilon:g}; this round would take it to "
                f"{after:.3g}: it takes part in no more"
            )

    def _trim(self) -> None:
        while len(self._models) > self.max_models:
            del self._models[next(iter(self._models))]
        while len(self._runs) > self.max_runs:
            del self._runs[next(iter(self._runs))]

    # -- as text, for a store that is not a file ---------------------------------------------

    def to_json(self) -> str:
        """The memory as JSON text (the file's format), for a store that is not a file (a
        Flower client's ``Context``)."""
        with self._transaction(write=False):
            return json.dumps(self._to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, *, server: bytes | None = None) -> ClientMemory:
        """A memory without a file that holds what :meth:`to_json` wrote (default bounds).
        Raises :class:`ClientMemoryError` for text that is not such a memory, or of another
        ``server`` identity."""
        memory = cls(server=server)
        memory._parse(text, "the client memory", "")
        return memory

    # -- persistence ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, *, write: bool) -> Iterator[None]:
        """Without a path: nothing. With one: hold the lock, re-read the file, run the body,
        and (``write``) replace the file with the result. A body that raises writes nothing;
        the next transaction re-reads the file, so a failed change is forgotten."""
        if self.path is None:
            yield
            return
        with self._locked():
            self._load()
            yield
            if write:
                self._write()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        assert self.path is not None
        _make_private_dir(self.path.parent)
        if fcntl is None:  # pragma: no cover
            yield
            return
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _load(self) -> None:
        assert self.path is not None
        self._runs, self._models = {}, {}
        self._server, self._atom, self._joined, self._rdp = self.server, None, 0, ()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self._exists:
                raise ClientMemoryError(
                    f"the client memory file {self.path} disappeared while this client was "
                    "running; it protects the client's atom and budget: restore it from a "
                    "backup, or restart the client with a fresh --state-dir knowingly"
                ) from None
            return
        self._parse(
            text,
            f"the client memory file {self.path}",
            ": restore it, or delete it to start afresh (the client then forgets the rounds "
            "and models it took part in)",
        )
        self._exists = True

    def _parse(self, text: str, what: str, remedy: str) -> None:
        """Load ``text`` (:meth:`_to_json`'s format); raises :class:`ClientMemoryError`
        naming ``what`` and ``remedy`` for text that is not a memory."""
        try:
            self._from_json(json.loads(text))
        except ClientMemoryError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ClientMemoryError(
                f"{what} is unreadable ({exc}); it protects this client against replayed "
                f"rounds and models{remedy}"
            ) from exc

    def _from_json(self, data: Any) -> None:
        if not isinstance(data, dict) or data.get("version") != MEMORY_VERSION:
            raise ValueError(f"not a version {MEMORY_VERSION} client memory")
        server = data["server"]
        if server is not None:
            recorded = bytes.fromhex(server)
            if self.server is not None and recorded != self.server:
                raise ClientMemoryError(
                    f"the client memory {self.path or ''} serves server identity "
                    f"{recorded.hex()[:16]}, not this server's {self.server.hex()[:16]}: one "
                    "state directory serves one server identity (a new CA or directory is a "
                    "new server); give this client another --state-dir for another server"
                )
            self._server = recorded
        atom = data["atom"]
        if atom is not None:
            if not all(isinstance(i, int) and i >= 0 for i in atom):
                raise ValueError("an atom must be client ids")
            self._atom = tuple(sorted(atom))
        joined, rdp = data["joined"], data["rdp"]
        if not isinstance(joined, int) or isinstance(joined, bool) or joined < 0:
            raise ValueError(f"joined {joined!r} is not a count of rounds")
        if rdp and (len(rdp) != len(budget.ORDERS) or not all(float(v) >= 0 for v in rdp)):
            raise ValueError("rdp must be one value >= 0 per order of sharefl.protocol.budget")
        self._joined, self._rdp = joined, tuple(float(v) for v in rdp)
        for run, round in data["runs"]:
            if not isinstance(round, int) or isinstance(round, bool) or round < 0:
                raise ValueError(f"round {round!r} is not a round number")
            self._runs[bytes.fromhex(run)] = round
        for entry in data["models"]:
            record = _Model(bytes.fromhex(entry["clusterings"]))
            for r, k, members in entry["releases"]:
                if not all(isinstance(i, int) and i >= 0 for i in (r, k, *members)):
                    raise ValueError("a release must be ids")
                record.releases.setdefault((r, k), set()).add(frozenset(members))
            self._models[bytes.fromhex(entry["model"])] = record

    def _to_json(self) -> dict[str, Any]:
        return {
            "version": MEMORY_VERSION,
            "server": None if self._server is None else self._server.hex(),
            "atom": None if self._atom is None else list(self._atom),
            "joined": self._joined,
            "rdp": list(self._rdp),
            "runs": [[run.hex(), round] for run, round in self._runs.items()],
            "models": [
                {
                    "model": model.hex(),
                    "clusterings": record.clusterings.hex(),
                    "releases": [
                        [r, k, sorted(members)]
                        for (r, k), sets in sorted(record.releases.items())
                        for members in sorted(sets, key=sorted)
                    ],
                }
                for model, record in self._models.items()
            ],
        }

    def _write(self) -> None:
        """Replace the file atomically: a temporary file in the same directory (0600),
        written and fsynced, then :func:`os.replace`, then the directory fsynced. Raises
        ``OSError``; the previous file is then intact and the temporary file removed."""
        assert self.path is not None
        data = json.dumps(self._to_json(), separators=(",", ":")).encode()
        fd, temporary = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), 0o600)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
            self._exists = True
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        _fsync_dir(self.path.parent)


def _make_private_dir(directory: Path) -> None:
    """Create ``directory`` (and its parents) if missing; a directory created here is 0700.
    An existing directory is left as it is (it may be the user's keys folder)."""
    if directory.is_dir():
        return
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be
    opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


UNAUTHENTICATED = b"sharefl/unauthenticated-server"
"""The server identity of a client that cannot authenticate its server (no TLS, unsigned
Flower rounds): every such server is one identity, so an address, node id or run id the
server controls never selects a fresh memory."""


def memory_path(state_dir: str | os.PathLike[str], client_id: int) -> Path:
    """The memory file of client ``client_id`` under a state directory:
    ``STATE_DIR/memory/client-<id>.json`` (several clients can share one state directory;
    the file records the one server identity it serves)."""
    return Path(state_dir) / "memory" / f"client-{int(client_id)}.json"
