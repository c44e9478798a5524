"""A malicious server playing real clients, its every choice read from a tape of bytes.

Honest clients are real :class:`~sharefl.protocol.client_round.ClientRound` +
:class:`~sharefl.protocol.client.ClientSession` objects (signed mode with Ed25519 identities,
or unsigned), each with its own :class:`~sharefl.protocol.memory.ClientMemory`.
The server is :class:`Game`: at every stage of every cluster of every round it
reads its next choice from a :class:`Tape` — the honest move on a zero byte (and past the
end of the tape), a deviation on a high one. The deviations, by family
(``Setting.attacks`` picks the families a game uses):

- ``replay``: round numbers that repeat or go down; a model sent again, under the same
  clusterings, fresh ones, or the old ones with one client moved;
- ``plans``: clusters of two (plans with up to three random reclusterings are drawn
  anyway, safe or not);
- ``graphs``: sparse neighbour graphs (cycles, disjoint cliques, cycles with chords), and
  per-client views of the graph;
- ``assignments``: per-client thresholds lowered or raised, the mode flipped, other
  members, another cluster's context; ``thresholds``: a lowered threshold for a whole
  cluster; ``reruns``: a cluster run twice in one reclustering, one member claimed
  dropped the second time;
- ``adverts``: advertisements omitted, reordered, duplicated, replayed from another run,
  replaced by server keys (a colluder's re-signed; an honest client's only in signed mode,
  where the signature gives it away — in unsigned mode the server is trusted with the
  keys, so that attack is outside the model);
- ``bundles``: share bundles withheld, corrupted, swapped between peers or receivers;
- ``dropouts``: clients not contacted, advertisements, shares or masked inputs "lost"
  (false drop-outs: the server keeps what it received);
- ``stories``: what the whole cluster is told at stages 4–5 — one false survivor/dropped
  split for all, a victim named both survivor and dropped, and (``Setting.split_views``)
  two groups each told that it alone survived, or rotating views around a core;
- ``survivors`` / ``unmask`` (``split_views`` only): per-client U2, U3 and unmask lists,
  signatures left out, a second unmask request;
- ``interleave``: the stages of a round's clusters in any order;
- ``atoms`` (games with ``Setting.atoms``): a plan without atoms, or atoms re-formed — a
  client moved to another atom, two atoms merged, a fresh partition — so that a client's
  roster differs from the one it remembers (every cluster stays a union of the plan's
  atoms: a plan that cuts one cannot be built). Drop-outs inside atoms come from the
  ``dropouts`` and ``stories`` families: the honest server leaves an atom with a missing
  member out whole, a lying one names part of an atom.

With ``Setting.constant_updates`` every client's update is the same on every model (the
worst case across rounds: a model moved by one ulp, or converged training), so the oracle
judges everything the server holds across all rounds as equations in one input per client.

Up to ``Setting.colluders`` clients collude: the server knows their secrets, signs for
them, reads the share bundles sent to them and re-keys their advertisements at will.
Clients' refusals (:class:`~sharefl.protocol.errors.ClientRefusal`) are part of the game:
the server just gets nothing more from that session; any other exception a client raises
is recorded as a crash. The server records everything it receives in a
:class:`~leak_oracle.ServerView`, and the god view (every session's secrets, read from the
sessions as they run, and every input) goes to :class:`~leak_oracle.LeakOracle`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from leak_oracle import Findings, LeakOracle, ServerView, SessionSecrets
from unchecked import unchecked_replace

from sharefl.crypto import aead
from sharefl.crypto.errors import CryptoError
from sharefl.crypto.kdf import (
    KEY_BYTES,
    TWO_EXCHANGE_VERSION,
    KeyContext,
    Purpose,
    X25519KeyPair,
    agree,
    derive_key,
    pairwise_key,
)
from sharefl.crypto.signatures import IdentityKey, client_list_message
from sharefl.protocol.atoms import form_atoms, group_atoms, whole_atoms
from sharefl.protocol.client import SURVIVORS_LABEL, ClientPolicy, ClientSession
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import ClientRefusal, ConfigurationError
from sharefl.protocol.keys import ClientKeys, KeyAdvert
from sharefl.protocol.memory import ClientMemory
from sharefl.protocol.messages import (
    AdvertiseKeys,
    ClusterAssignment,
    ConsistencyRequest,
    EncryptedShares,
    KeysBroadcast,
    MaskedInput,
    MaskedShares,
    MaskingRequest,
    ServerMessage,
    UnmaskRequest,
)
from sharefl.protocol.plan import RoundPlan

BITS = 32
SHARE_BYTES = 37
RUN_ID = b"malicious-search"
FAMILIES = frozenset(
    {
        "replay",
        "plans",
        "graphs",
        "assignments",
        "thresholds",
        "reruns",
        "stories",
        "adverts",
        "bundles",
        "survivors",
        "dropouts",
        "unmask",
        "interleave",
        "atoms",
    }
)
"""Every family of deviations the server knows (see the module docstring)."""

IDENTITIES = {
    i: IdentityKey.from_private(hashlib.sha256(b"identity %d" % i).digest()) for i in range(16)
}
DIRECTORY = {i: key.public for i, key in IDENTITIES.items()}


@dataclass(frozen=True)
class Setting:
    """What kind of game: the clients' mode and policy, and the server's means.

    ``colluders``: at most this many clients collude (their policy resists as many);
    ``attacks``: the deviation families the server uses; ``rate``: how often it deviates
    (out of 256 at each choice); ``memory``: clients keep a ClientMemory.
    """

    signed: bool = True
    colluders: int = 0
    attacks: frozenset[str] = FAMILIES
    rate: int = 40
    verify_releases: bool | None = True
    memory: bool = True
    participants: tuple[int, int] = (3, 7)
    max_rounds: int = 3
    max_reclusterings: int = 3
    min_sum_size: int = 3
    split_views: bool = True
    resist: int | None = None
    atoms: bool = False
    constant_updates: bool = False
    two_exchange: bool = False

    def policy(self, client: int) -> ClientPolicy:
        return ClientPolicy(
            identity=IDENTITIES[client],
            directory=DIRECTORY,
            require_signed=self.signed,
            colluders=self.resist if self.resist is not None else (self.colluders or None),
            min_cluster_size=3,
            min_neighbours=2,
            max_reclusterings=self.max_reclusterings,
            min_sum_size=self.min_sum_size,
            verify_releases=self.verify_releases,
            require_atoms=self.atoms,
        )

    def oracle(self) -> LeakOracle:
        """Sums the server learns legitimately have sum_floor members, colluders included:
        of the honest ones, at least sum_floor − colluders (and one is always a leak)."""
        return LeakOracle(min_sum_size=max(2, self.min_sum_size - self.colluders), bits=BITS)


class Tape:
    """The server's choices: one byte each, 0 (and every byte past the end) the honest one.

    ``deviate(family, what)`` is True for a byte >= 256 − rate when the family is enabled
    (no byte is read when it is not); ``moves`` lists the deviations taken."""

    def __init__(self, data: bytes, attacks: frozenset[str], rate: int) -> None:
        self.data, self.pos, self.attacks, self.rate = bytes(data), 0, attacks, rate
        self.moves: list[str] = []

    def byte(self) -> int:
        b = self.data[self.pos] if self.pos < len(self.data) else 0
        self.pos += 1
        return b

    def below(self, n: int) -> int:
        return self.byte() % n if n > 1 else 0

    def flip(self) -> bool:
        return bool(self.byte() & 1)

    def deviate(self, family: str, what: str | Callable[[], str]) -> bool:
        if family not in self.attacks:
            return False
        hit = self.byte() >= 256 - self.rate
        if hit:
            self.moves.append(what() if callable(what) else what)
        return hit

    def subset(self, items: list[Any]) -> list[Any]:
        return [i for i in items if self.flip()]

    def pick(self, items: list[Any]) -> Any:
        return items[self.below(len(items))]

    def permutation(self, items: list[Any]) -> list[Any]:
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out


@dataclass
class Member:
    """One session of one client in one cluster run, as the server drives it."""

    client: int
    session: ClientSession
    guard: ClientRound | None  # None: a colluder
    secrets: SessionSecrets
    dead: bool = False

    @property
    def colluding(self) -> bool:
        return self.guard is None


@dataclass
class Outcome:
    """What a game produced."""

    findings: Findings
    moves: list[str]
    refusals: list[str]
    setting: Setting
    crashes: list[str] = field(default_factory=list)
    masked: int = 0
    responses: int = 0

    def explain(self) -> str:
        return (
            f"{self.findings.describe()}\n  setting: {self.setting}\n  deviations: "
            f"{self.moves}\n  refusals: {self.refusals[:40]}"
        )


@dataclass
class Game:
    """One game: build with a setting and a tape, then :meth:`play`."""

    setting: Setting
    data: bytes
    hooks: dict[str, Any] = field(default_factory=dict)
    """Scripted choices that override the tape (for named scenarios): ``clients``,
    ``colluders``, ``rounds`` [(round number, model, clusters of each clustering)],
    ``graph(members)``, ``bundles(client, bundles)``, ``accepted(run, accepted)``,
    ``story(run, story)``; ``trace``: keep a readable log in ``Game.trace``."""

    def __post_init__(self) -> None:
        if "rounds" in self.hooks:
            self.hooks = {**self.hooks, "rounds": list(self.hooks["rounds"])}
        s, self.tape = self.setting, Tape(self.data, self.setting.attacks, self.setting.rate)
        self.tape.rate = (s.rate // 8, s.rate // 3, s.rate, 2 * s.rate)[self.tape.below(4)]
        self.random = random.Random(self.data)
        self.view = ServerView()
        self.sessions: list[SessionSecrets] = []
        self.inputs: dict[tuple[int, int], np.ndarray] = {}
        self.refusals: list[str] = []
        self.crashes: list[str] = []
        self.trace: list[str] | None = [] if self.hooks.get("trace") else None
        self.length = 4 + self.tape.below(5)
        lo, hi = s.participants
        self.clients = tuple(range(lo + self.tape.below(hi - lo + 1)))
        self.clients = tuple(self.hooks.get("clients", self.clients))
        count = self.tape.below(s.colluders + 1)
        self.colluders = frozenset(self.tape.permutation(list(self.clients))[:count])
        self.colluders = frozenset(self.hooks.get("colluders", self.colluders))
        if s.atoms:  # two or three atoms of 3, clusters of one or two atoms
            self.clients = tuple(range(3 * (2 + self.tape.below(2))))
            self.clients = tuple(self.hooks.get("clients", self.clients))
        self.atoms = form_atoms(self.clients, 3, np.random.default_rng(len(self.data)))[0]
        self.policies = {u: s.policy(u) for u in self.clients}
        self.memories = {u: ClientMemory() for u in self.clients} if s.memory else {}
        self.enc_privates: dict[bytes, bytes] = {}  # encryption keys the server controls
        self.runs = itertools.count()
        self.adverts_seen: list[AdvertiseKeys] = []
        self.masked_count = self.response_count = 0
        # Two-exchange round: every client's long-term keys, set up once (the colluders'
        # are the server's).
        self.long_term: dict[int, ClientKeys] = {}
        if s.two_exchange:
            self.long_term = {
                u: ClientKeys.generate(u, RUN_ID, self.randbytes) for u in self.clients
            }
        self.key_adverts = {
            u: k.advert(IDENTITIES[u] if s.signed else None) for u, k in self.long_term.items()
        }
        for u in self.colluders & self.long_term.keys():  # (atoms redraw the clients)
            self.enc_privates[self.long_term[u].encryption.public] = self.long_term[
                u
            ].encryption.private
            self.view.control(self.long_term[u].mask.private)

    # -- helpers ----------------------------------------------------------------------------

    def randbytes(self, n: int) -> bytes:
        return self.random.randbytes(n)

    def input_of(self, client: int, model: int) -> np.ndarray:
        key = (client, 0 if self.setting.constant_updates else model)
        if key not in self.inputs:
            rng = np.random.default_rng([client, model, len(self.data)])
            self.inputs[key] = rng.integers(0, 2**BITS, self.length, dtype=np.uint32)
        return self.inputs[key]

    def note(self, line: str) -> None:
        """Add a line to the trace (callers check ``self.trace is not None`` first, so an
        untraced game formats nothing)."""
        if self.trace is not None:
            self.trace.append(line)

    def send(self, member: Member, message: ServerMessage) -> Any:
        """The member's reply, or None when it refuses (it is then out of the run)."""
        if member.dead:
            return None
        try:
            if member.guard is None:
                return member.session.handle(message)
            return member.guard.handle(member.session, message)
        except ClientRefusal as exc:
            member.dead = True
            self.refusals.append(f"{member.client}:{type(exc).__name__}")
            self.note(f"  {member.client} refuses {type(message).__name__}: {exc}")
            return None
        except Exception as exc:  # not a named refusal: a client bug, reported by the test
            member.dead = True
            self.crashes.append(f"client {member.client} on {type(message).__name__}: {exc!r}")
            return None

    # -- rounds -----------------------------------------------------------------------------

    def play(self) -> Outcome:
        tape, s = self.tape, self.setting
        last = -1
        models: dict[int, tuple[Clustering, ...]] = {}
        for _ in range(len(self.hooks.get("rounds", ())) or 1 + tape.below(s.max_rounds)):
            number = last + 1
            if last >= 0 and tape.deviate("replay", "round number replayed"):
                number = tape.below(last + 1)
            model = len(models)
            clusterings = None
            if models and tape.deviate("replay", "model sent again"):
                model = tape.pick(sorted(models))
                kind = tape.below(3)
                if kind == 0:
                    clusterings = models[model]
                elif kind == 1:
                    clusterings = tuple(self.moved(c) for c in models[model])
            plan = self.plan(number, clusterings)
            if "rounds" in self.hooks:  # scripted: (round number, model, clusterings[, atoms])
                if not self.hooks["rounds"]:
                    break
                number, model, scripted, *atoms = self.hooks["rounds"].pop(0)
                plan = RoundPlan(
                    number,
                    tuple(Clustering(c) for c in scripted),
                    Clustering(atoms[0]) if atoms else None,
                )
            if self.trace is not None:
                self.note(f"round {number} model {model}: {[c.clusters for c in plan.clusterings]}")
            models.setdefault(model, plan.clusterings)
            last = max(last, number)
            self.round(plan, model)
        findings = s.oracle().analyse(self.view, self.sessions, self.inputs)
        return Outcome(
            findings,
            tape.moves,
            self.refusals,
            s,
            self.crashes,
            self.masked_count,
            self.response_count,
        )

    def plan(self, number: int, clusterings: tuple[Clustering, ...] | None) -> RoundPlan:
        """The round's plan: without atoms as before; with atoms, R groupings of the
        game's atoms, or (``atoms`` family) no atoms or re-formed ones."""
        tape = self.tape
        if not self.setting.atoms or tape.deviate("atoms", "a plan without atoms"):
            return RoundPlan(number, clusterings or self.clusterings())
        atoms = self.atoms  # the server's current partition: a re-formed one stays
        if tape.deviate("atoms", "atoms re-formed"):
            kind = tape.below(3)
            groups = [list(a) for a in atoms.clusters]
            if kind == 0 and len(groups) > 1:  # one client moved to another atom
                client = groups[0].pop(tape.below(len(groups[0])))
                groups[1 + tape.below(len(groups) - 1)].append(client)
            elif kind == 1 and len(groups) > 1:  # two atoms merged
                groups = [groups[0] + groups[1], *groups[2:]]
            else:  # a fresh partition into threes
                order = tape.permutation(list(self.clients))
                groups = [order[i : i + 3] for i in range(0, len(order), 3)]
            atoms = self.atoms = Clustering(tuple(tuple(g) for g in groups if g))
        size = 3 * (1 + tape.below(2))
        rng = np.random.default_rng([number, tape.byte()])
        drawn = tuple(
            group_atoms(atoms.clusters, size, rng)
            for _ in range(1 + tape.below(self.setting.max_reclusterings))
        )
        try:
            return RoundPlan(number, clusterings or drawn, atoms)
        except ConfigurationError:  # replayed clusterings that cut these atoms
            return RoundPlan(number, clusterings or drawn)

    def clusterings(self) -> tuple[Clustering, ...]:
        tape, n = self.tape, len(self.clients)
        out = []
        for _ in range(1 + tape.below(self.setting.max_reclusterings)):
            order = tape.permutation(list(self.clients))
            count = max(-(-n // 6), 1 + tape.below(max(1, n // 3)))  # clusters of 3 to 6
            sizes = [n // count + (1 if i < n % count else 0) for i in range(count)]
            if n >= 4 and tape.deviate("plans", "a cluster of two"):
                sizes = [2, n - 2]
            chunks, start = [], 0
            for size in sizes:
                chunks.append(tuple(order[start : start + size]))
                start += size
            out.append(Clustering(tuple(chunks)))
        return tuple(out)

    def moved(self, clustering: Clustering) -> Clustering:
        """The clustering with one client moved to another cluster."""
        clusters = [list(c) for c in clustering.clusters]
        if len(clusters) < 2:
            return clustering
        source = self.tape.below(len(clusters))
        client = clusters[source].pop(self.tape.below(len(clusters[source])))
        target = (source + 1 + self.tape.below(len(clusters) - 1)) % len(clusters)
        clusters[target].append(client)
        return Clustering(tuple(tuple(c) for c in clusters if c))

    def round(self, plan: RoundPlan, model: int) -> None:
        tape = self.tape
        guards: dict[int, ClientRound] = {}
        digest = hashlib.sha256(b"model %d" % model).digest()
        for u in self.clients:
            if u in self.colluders:
                continue
            kwargs: dict[str, Any] = {}
            if u in self.memories:
                kwargs = {"memory": self.memories[u], "run": RUN_ID, "model_digest": digest}
            try:
                guards[u] = ClientRound(u, plan, self.policies[u], **kwargs)
            except ClientRefusal as exc:
                self.refusals.append(f"{u}:{type(exc).__name__}")
        runs: list[Iterator[None]] = []
        for r, clustering in enumerate(plan.clusterings):
            for k in range(len(clustering.clusters)):
                cluster = self.cluster_v3 if self.setting.two_exchange else self.cluster
                runs.append(cluster(plan, r, k, model, guards))
                if tape.deviate("reruns", f"cluster ({r},{k}) run twice"):
                    runs.append(cluster(plan, r, k, model, guards, rerun=True))
        while runs:
            i = tape.below(len(runs)) if "interleave" in self.setting.attacks else 0
            try:
                next(runs[i])
            except StopIteration:
                runs.pop(i)

    # -- one cluster ------------------------------------------------------------------------

    def graph(self, members: tuple[int, ...]) -> dict[int, frozenset[int]] | None:
        """None (every member a neighbour of every other), or a sparse graph."""
        m, tape = len(members), self.tape
        if m < 4 or not tape.deviate("graphs", f"sparse graph on {members}"):
            return None
        kind = tape.below(3)
        order = tape.permutation(list(members))
        edges: set[frozenset[int]] = set()
        if kind == 0 or m < 6:  # a cycle
            edges = {frozenset((order[i], order[(i + 1) % m])) for i in range(m)}
        elif kind == 1:  # two disjoint cliques
            half = m // 2
            for part in (order[:half], order[half:]):
                edges |= {frozenset(e) for e in itertools.combinations(part, 2)}
        else:  # a cycle with chords: 3-regular when m is even
            edges = {frozenset((order[i], order[(i + 1) % m])) for i in range(m)}
            if m % 2 == 0:
                edges |= {frozenset((order[i], order[i + m // 2])) for i in range(m // 2)}
        return {u: frozenset(v for e in edges if u in e for v in e if v != u) for u in members}

    def assignment(
        self, context: KeyContext, members: tuple[int, ...], graph: dict | None
    ) -> ClusterAssignment:
        degree = len(members) - 1 if graph is None else min(len(p) for p in graph.values())
        t = self.policies[members[0]].floor(degree + 1, self.setting.signed)
        return ClusterAssignment(context, members, t, self.length, BITS, graph, self.setting.signed)

    def variant(self, base: ClusterAssignment, plan: RoundPlan, u: int) -> ClusterAssignment:
        """What client u is sent: the planned assignment, or a deviation."""
        tape = self.tape
        if not tape.deviate("assignments", f"{u} gets another assignment"):
            if base.neighbours is not None and tape.deviate("graphs", f"{u} sees another graph"):
                other = self.graph(base.members)
                return dataclasses.replace(base, neighbours=other) if other else base
            return base
        kind = tape.below(5)
        if kind == 0:
            return dataclasses.replace(base, threshold=base.threshold - 1)
        if kind == 1:
            return dataclasses.replace(base, threshold=base.threshold + 1)
        if kind == 2:
            return dataclasses.replace(base, signed=not base.signed)
        if kind == 3:  # the members of another cluster, or one member fewer
            others = [c for cl in plan.clusterings for c in cl.clusters if u in c]
            members = tape.pick(others) if tape.flip() else base.members[:-1]
            if u not in members or len(members) < 2:
                return base
            return dataclasses.replace(base, members=tuple(sorted(members)), neighbours=None)
        r = tape.below(plan.reclusterings)
        k = tape.below(len(plan.clusterings[r].clusters))
        return dataclasses.replace(base, context=plan.context(r, k))

    def join(
        self, u: int, a: ClusterAssignment, model: int, guards: dict[int, ClientRound], rid: int
    ) -> Member | None:
        vector = self.input_of(u, model)
        keys = self.long_term[u] if self.setting.two_exchange else None
        try:
            if u in self.colluders:
                guard = None
                session = ClientSession(
                    u, a, vector, self.policies[u], randbytes=self.randbytes, keys=keys
                )
            elif u in guards:
                guard = guards[u]
                session = guard.session(a, vector, randbytes=self.randbytes, keys=keys)
            else:
                return None
        except ClientRefusal as exc:
            self.refusals.append(f"{u}:{type(exc).__name__}")
            return None
        secrets = SessionSecrets(
            run=rid,
            client=u,
            input_key=None if guard is None else (u, 0 if self.setting.constant_updates else model),
            threshold=a.threshold,
            seed=b"",
            mask_private=b"",
            mask_public=b"",
            colluding=guard is None,
        )
        return Member(u, session, guard, secrets)

    def opening(
        self, plan: RoundPlan, r: int, k: int, model: int, guards: dict[int, ClientRound]
    ) -> tuple[int, KeyContext, tuple[int, ...], ClusterAssignment, dict[int, Member]]:
        """A cluster run's start, both rounds: its run id, context (version 5 in two-exchange
        settings), members, planned assignment (a sparse graph, a lowered threshold) and the
        members that joined — each sent its variant of the assignment (two-exchange: with
        the key adverts :meth:`keys_for` chose), unless not contacted."""
        tape, two = self.tape, self.setting.two_exchange
        rid = next(self.runs)
        context, members = plan.context(r, k), plan.members(r, k)
        if two:
            context = dataclasses.replace(context, version=TWO_EXCHANGE_VERSION)
        graph = self.graph(members)
        if "graph" in self.hooks:
            graph = self.hooks["graph"](members)
        base = self.assignment(context, members, graph)
        if base.threshold > 2 and tape.deviate("thresholds", f"threshold lowered in ({r},{k})"):
            base = dataclasses.replace(base, threshold=base.threshold - 1)
        if self.trace is not None:
            self.note(f" run {rid}: ({r},{k}) {members} t={base.threshold} graph={base.neighbours}")
        alive: dict[int, Member] = {}
        for u in members:
            a = base if u in self.colluders else self.variant(base, plan, u)
            if two:  # unchecked: the keys a hostile server sends may be no message's
                a = unchecked_replace(
                    a,
                    context=dataclasses.replace(a.context, version=TWO_EXCHANGE_VERSION),
                    keys=self.keys_for(u, a.members),
                )
            if u not in self.colluders and tape.deviate("dropouts", f"{u} not contacted"):
                continue
            member = self.join(u, a, model, guards, rid)
            if member is not None:
                alive[u] = member
        return rid, context, members, base, alive

    def cluster(
        self,
        plan: RoundPlan,
        r: int,
        k: int,
        model: int,
        guards: dict[int, ClientRound],
        rerun: bool = False,
    ) -> Iterator[None]:
        """One cluster run, a stage per step. ``rerun``: the cluster's second run in the
        reclustering, where the server claims one member dropped (the difference of the two
        sums would be that member's input)."""
        tape, signed = self.tape, self.setting.signed
        rid, context, members, base, alive = self.opening(plan, r, k, model, guards)
        yield

        # Stage 1: advertisements.
        adverts: dict[int, AdvertiseKeys] = {}
        for u, member in alive.items():
            advert = member.session.advertise()
            session = member.session
            member.secrets.seed = session._seed
            member.secrets.mask_private = session._mask.private
            member.secrets.mask_public = session._mask.public
            self.sessions.append(member.secrets)
            if member.colluding:
                self.enc_privates[session._enc.public] = session._enc.private
                self.view.control(session._mask.private)
            self.adverts_seen.append(advert)
            if member.colluding or not tape.deviate("dropouts", f"advert of {u} lost"):
                adverts[u] = advert
        yield

        # Stage 2: the broadcast; encrypted shares back.
        shares: dict[int, EncryptedShares] = {}
        relayed: dict[int, dict[int, AdvertiseKeys]] = {}
        for u in sorted(adverts):
            member = alive[u]
            sent = self.broadcast(member, adverts, context)
            reply = self.send(member, KeysBroadcast(context, tuple(sent)))
            if reply is None:
                continue
            relayed[u] = {a.sender: a for a in sent}
            self.derive(member, relayed[u], context)
            shares[u] = reply
            if not member.colluding:
                self.decrypt_for_colluders(rid, u, reply, relayed[u], context)
        yield

        # Stage 3: masking requests; masked inputs back.
        u2 = [
            v
            for v in sorted(shares)
            if v in self.colluders or not tape.deviate("dropouts", f"shares of {v} lost in {rid}")
        ]
        masked: dict[int, MaskedInput] = {}
        given_u2: dict[int, list[int]] = {}
        for u in sorted(shares):
            member = alive[u]
            listed = self.survivor_list(member, u2, sorted(relayed[u]), "U2")
            bundles = self.bundles(member, listed, shares)
            if "bundles" in self.hooks:
                bundles = self.hooks["bundles"](u, bundles)
            given_u2[u] = listed
            reply = self.send(member, MaskingRequest(context, u, tuple(listed), bundles))
            if reply is None:
                continue
            if self.trace is not None:
                self.note(
                    f"  run {rid}: {u} masked with U2={listed}, bundles from "
                    f"{sorted(bundles)}; complaints {sorted(reply.complaints)}"
                )
            self.view.masked_input(rid, reply)
            self.masked_count += 1
            masked[u] = reply
        yield

        story = self.told(rid, plan, base, sorted(masked), u2, rerun)
        # Stage 4 (signed): consistency signatures.
        signed_lists: dict[int, tuple[tuple[int, ...], bytes]] = {}
        if signed:
            signed_lists = self.signatures(context, alive, sorted(masked), story, given_u2)
            yield

        # Stage 5: unmask requests.
        for u in sorted(masked):
            member = alive[u]
            if member.colluding or member.dead:
                continue
            survivors, dropped = story[u]
            request = self.unmask_request(
                member, context, survivors, dropped, members, signed_lists
            )
            reply = self.send(member, request)
            if reply is not None:
                if self.trace is not None:
                    self.note(
                        f"  run {rid}: {u} unmasks S={request.survivors} "
                        f"D={request.dropped}: b of {sorted(reply.seed_shares)}, sk of "
                        f"{sorted(reply.key_shares)}, seeds "
                        f"{sorted(getattr(reply, 'pair_seeds', {}))}"
                    )
                self.view.unmask_response(rid, reply)
                self.response_count += 1
                if tape.deviate("unmask", f"second unmask request to {u}"):
                    again = self.unmask_request(
                        member, context, survivors, dropped, members, signed_lists, force=True
                    )
                    reply = self.send(member, again)
                    if reply is not None:
                        self.view.unmask_response(rid, reply)

    def cluster_v3(
        self,
        plan: RoundPlan,
        r: int,
        k: int,
        model: int,
        guards: dict[int, ClientRound],
        rerun: bool = False,
    ) -> Iterator[None]:
        """One cluster run of the two-exchange round: the assignment carries the members'
        long-term key adverts (altered per client by the ``adverts`` family); the masked
        inputs come back with their sealed shares; then the (signed) consistency stage and
        the unmask request carrying the bundles (altered by the ``bundles`` family)."""
        tape, signed = self.tape, self.setting.signed
        rid, context, members, base, alive = self.opening(plan, r, k, model, guards)
        yield

        # Exchange 1: the masked inputs with their sealed shares.
        dealt: dict[int, MaskedShares] = {}
        for u, member in alive.items():
            reply = self.start(member)
            if reply is None:
                continue
            session = member.session
            member.secrets.seed = session._seed
            member.secrets.mask_private = self.long_term[u].mask.private
            member.secrets.mask_public = self.long_term[u].mask.public
            member.secrets.pair_seeds = dict(session._mask_seeds)
            member.secrets.peer_mask_publics = {
                a.sender: a.mask_public for a in session.assignment.keys if a.sender != u
            }
            self.sessions.append(member.secrets)
            self.view.masked_input(rid, reply)
            self.masked_count += 1
            if not member.colluding:
                self.open_v3_bundles(rid, member, reply)
            if member.colluding or not tape.deviate("dropouts", f"masked input of {u} lost"):
                dealt[u] = reply
        yield

        masked = sorted(dealt)
        story = self.told(rid, plan, base, masked, list(members), rerun)
        # Signed: consistency signatures.
        signed_lists: dict[int, tuple[tuple[int, ...], bytes]] = {}
        if signed:
            known = {u: list(members) for u in masked}
            signed_lists = self.signatures(context, alive, masked, story, known)
            yield

        # Exchange 2: unmask requests carrying the bundles.
        for u in masked:
            member = alive[u]
            if member.colluding or member.dead:
                continue
            survivors, dropped = story[u]
            request = self.unmask_request(
                member, context, survivors, dropped, members, signed_lists
            )
            listed = [w for w in request.survivors if w != u]
            bundles = self.bundles(member, listed, dealt)  # type: ignore[arg-type]
            if "bundles" in self.hooks:
                bundles = self.hooks["bundles"](u, bundles)
            reply = self.send(member, dataclasses.replace(request, bundles=bundles))
            if reply is not None:
                if self.trace is not None:
                    self.note(
                        f"  run {rid}: {u} unmasks S={request.survivors} D={request.dropped}: "
                        f"b of {sorted(reply.seed_shares)}, pairs {sorted(reply.pair_shares)}"
                    )
                self.view.unmask_response(rid, reply)
                self.response_count += 1
                if tape.deviate("unmask", f"second unmask request to {u}"):
                    again = self.unmask_request(
                        member, context, survivors, dropped, members, signed_lists, force=True
                    )
                    reply = self.send(member, dataclasses.replace(again, bundles=bundles))
                    if reply is not None:
                        self.view.unmask_response(rid, reply)

    def keys_for(self, u: int, members: tuple[int, ...]) -> tuple[KeyAdvert, ...]:
        """The key adverts client u is sent with its assignment: the members' own, or
        (``adverts``) some left out, one repeated, two swapped, or peers' keys replaced by
        the server's (any colluder's, re-signed; an honest peer's only in signed mode,
        where the signature gives it away)."""
        tape = self.tape
        sent = [self.key_adverts[v] for v in members if v in self.key_adverts]
        if u in self.colluders or not tape.deviate("adverts", f"keys sent to {u} altered"):
            return tuple(sent)
        others = [a for a in sent if a.sender != u]
        kind = tape.below(4)
        if kind == 0 and others:
            gone = {a.sender for a in tape.subset(others)}
            return tuple(a for a in sent if a.sender not in gone)
        if kind == 1 and others:
            return (*sent, tape.pick(others))
        if kind == 2 and len(others) >= 2:
            a, b = tape.permutation(others)[:2]
            swapped = {a.sender: dataclasses.replace(b, sender=a.sender), b.sender: a}
            return tuple(swapped.get(x.sender, x) for x in sent)
        victims = {a.sender for a in tape.subset(others) or others[:1]}
        if not self.setting.signed:
            victims &= self.colluders
        return tuple(self.forge(a) if a.sender in victims else a for a in sent)  # type: ignore[arg-type]

    def start(self, member: Member) -> MaskedShares | None:
        """The member's first reply (its masked input), or None when it refuses."""
        try:
            return member.session.start()  # type: ignore[return-value]
        except ClientRefusal as exc:
            member.dead = True
            self.refusals.append(f"{member.client}:{type(exc).__name__}")
            return None
        except Exception as exc:
            member.dead = True
            self.crashes.append(f"client {member.client} on start: {exc!r}")
            return None

    def open_v3_bundles(self, rid: int, member: Member, reply: MaskedShares) -> None:
        """The server opens every bundle u sealed to an encryption key it controls: h's
        shares of b_u and of u's pair seeds."""
        u, session = member.client, member.session
        adverts = {a.sender: a for a in session.assignment.keys}
        peers = sorted(session.assignment.neighbours_of(u))
        own = self.long_term[u].encryption.public
        for holder, sealed in reply.bundles.items():
            advert = adverts.get(holder)
            if advert is None or advert.encryption_public not in self.enc_privates:
                continue
            private = self.enc_privates[advert.encryption_public]
            key = derive_key(
                agree(private, own), session.context, Purpose.SHARE_ENCRYPTION, holder, u
            )
            plain = aead.decrypt(key, sealed, aead.Envelope(u, holder, session.context))
            shares = [
                plain[16 + i * SHARE_BYTES : 16 + (i + 1) * SHARE_BYTES]
                for i in range(1 + len(peers))
            ]
            self.view.held_seed_share(rid, u, shares[0])
            self.view.pair_shares(
                rid, {(u, v): sh for v, sh in zip(peers, shares[1:], strict=True)}
            )

    def told(
        self,
        rid: int,
        plan: RoundPlan,
        base: ClusterAssignment,
        masked: list[int],
        u2: list[int],
        rerun: bool,
    ) -> dict[int, tuple[list[int], list[int]]]:
        """Both rounds: the masked inputs the server accepts (``dropouts`` ignore some; a
        rerun drops one; the honest server leaves incomplete atoms out whole), then what
        each client is told (:meth:`story`)."""
        tape = self.tape
        accepted = [
            v
            for v in masked
            if v in self.colluders
            or not tape.deviate("dropouts", f"masked input of {v} ignored in {rid}")
        ]
        if "accepted" in self.hooks:
            accepted = self.hooks["accepted"](rid, accepted)
        if rerun and accepted:
            accepted.remove(tape.pick(accepted))
        if plan.atoms is not None:
            accepted = list(whole_atoms(accepted, plan.atoms))
        story = self.story(masked, accepted, u2, base.threshold)
        if "story" in self.hooks:
            story = self.hooks["story"](rid, story)
        return story

    def signatures(
        self,
        context: KeyContext,
        alive: dict[int, Member],
        masked: list[int],
        story: dict[int, tuple[list[int], list[int]]],
        known: dict[int, list[int]],
    ) -> dict[int, tuple[tuple[int, ...], bytes]]:
        """Signed mode, both rounds: each honest client's signature over the survivor list
        it is shown (``survivors`` may alter it within ``known``)."""
        signed_lists: dict[int, tuple[tuple[int, ...], bytes]] = {}
        for u in masked:
            member = alive[u]
            if member.colluding:
                continue
            listed = self.survivor_list(member, story[u][0], known[u], "U3")
            reply = self.send(member, ConsistencyRequest(context, tuple(listed)))
            if reply is not None:
                signed_lists[u] = (tuple(sorted(listed)), reply.signature)
        return signed_lists

    def story(
        self, masked: list[int], accepted: list[int], u2: list[int], threshold: int
    ) -> dict[int, tuple[list[int], list[int]]]:
        """What the server tells each client at stages 4 and 5: (survivors, dropped).

        Honest: one list for all (the accepted masked inputs; U2 minus them dropped).
        Consistent lies (one list for all): any survivor/dropped split, or a victim named
        both survivor and dropped. Split views (``Setting.split_views``): two groups each
        told that it alone survived; or a core B told survived to everybody, with each
        client also told that some others survived (each list long enough on its own,
        while only B's self-mask seeds get t shares)."""
        tape = self.tape
        honest = {u: (list(accepted), sorted(set(u2) - set(accepted))) for u in masked}
        if not masked or not tape.deviate("stories", "a story at the unmask stage"):
            return honest
        kind = tape.below(4 if self.setting.split_views else 2)
        if kind == 0:
            survivors = sorted(tape.subset(masked))
            rest = [v for v in u2 if v not in survivors]
            dropped = rest if tape.flip() else sorted(tape.subset(u2))
            tape.moves.append(f"everybody told S={survivors} D={dropped}")
            return {u: (survivors, dropped) for u in masked}
        if kind == 1:
            victim = tape.pick(masked)
            tape.moves.append(f"{victim} both survivor and dropped")
            return {u: (s, sorted({*d, victim})) for u, (s, d) in honest.items()}
        if kind == 2:
            group = {u: tape.flip() for u in masked}
            tape.moves.append(f"split view {sorted(u for u in masked if group[u])}")
            return {
                u: (
                    sorted(v for v in masked if group[v] == group[u]),
                    sorted(v for v in u2 if v not in masked or group[v] != group[u]),
                )
                for u in masked
            }
        core = set(tape.subset(masked))
        tape.moves.append(f"rotating views around the core {sorted(core)}")
        out = {}
        for u in masked:
            survivors = core | {u}
            others = tape.permutation([v for v in masked if v not in survivors])
            survivors |= set(others[: max(0, threshold - len(survivors))])
            out[u] = (sorted(survivors), sorted(set(u2) - survivors))
        return out

    # -- the stages' choices ------------------------------------------------------------------

    def broadcast(
        self, member: Member, adverts: dict[int, AdvertiseKeys], context: KeyContext
    ) -> list[AdvertiseKeys]:
        tape, u = self.tape, member.client
        sent = [adverts[v] for v in sorted(adverts)]
        if member.colluding or not tape.deviate("adverts", f"broadcast to {u} altered"):
            return sent
        kind = tape.below(5)
        others = [a for a in sent if a.sender != u]
        if kind == 0 and others:  # leave some out
            gone = {a.sender for a in tape.subset(others)}
            return [a for a in sent if a.sender not in gone]
        if kind == 1:
            return list(reversed(sent))
        if kind == 2 and others:
            return [*sent, tape.pick(others)]
        if kind == 3 and others:  # peers' keys replaced by the server's
            victims = {a.sender for a in tape.subset(others) or others[:1]}
            if not self.setting.signed:  # the server is trusted with the keys: outside the model
                victims &= self.colluders
            return [self.forge(a) if a.sender in victims else a for a in sent]
        replays = [a for a in self.adverts_seen if a.context != context and a.sender != u]
        if replays:
            old = tape.pick(replays)
            return [a for a in sent if a.sender != old.sender] + [old]
        return sent

    def forge(self, victim: AdvertiseKeys) -> AdvertiseKeys:
        """The victim's advertisement with keys the server made (signed as the victim when
        the server can: a colluder)."""
        enc = X25519KeyPair.from_private(self.randbytes(KEY_BYTES))
        mask = X25519KeyPair.from_private(self.randbytes(KEY_BYTES))
        self.enc_privates[enc.public] = enc.private
        self.view.control(mask.private)
        forged = dataclasses.replace(
            victim, encryption_public=enc.public, mask_public=mask.public, signature=b""
        )
        if self.setting.signed:
            signer = IDENTITIES[victim.sender] if victim.sender in self.colluders else None
            signature = signer.sign(forged.statement()) if signer else victim.signature
            forged = dataclasses.replace(forged, signature=signature)
        return forged

    def derive(
        self, member: Member, relayed: dict[int, AdvertiseKeys], context: KeyContext
    ) -> None:
        """God view: every pair seed the session can have derived from what it was sent."""
        u, secrets = member.client, member.secrets
        for peer, advert in relayed.items():
            if peer == u:
                continue
            try:
                seed = pairwise_key(
                    secrets.mask_private, advert.mask_public, context, Purpose.MASK_SEED, u, peer
                )
            except (CryptoError, ValueError):
                continue
            secrets.pair_seeds[peer] = seed
            secrets.peer_mask_publics[peer] = advert.mask_public

    def decrypt_for_colluders(
        self,
        rid: int,
        u: int,
        reply: EncryptedShares,
        relayed: dict[int, AdvertiseKeys],
        context: KeyContext,
    ) -> None:
        """The server opens every bundle u encrypted to a key it controls."""
        own = relayed[u].encryption_public
        for holder, sealed in reply.bundles.items():
            advert = relayed.get(holder)
            if advert is None or advert.encryption_public not in self.enc_privates:
                continue
            private = self.enc_privates[advert.encryption_public]
            key = pairwise_key(private, own, context, Purpose.SHARE_ENCRYPTION, holder, u)
            plain = aead.decrypt(key, sealed, aead.Envelope(u, holder, context))
            key_share = plain[16 : 16 + SHARE_BYTES]
            seed_share = plain[16 + SHARE_BYTES : 16 + 2 * SHARE_BYTES]
            self.view.held_shares(rid, u, key_share, seed_share)

    def survivor_list(
        self, member: Member, honest: list[int], known: list[int], what: str
    ) -> list[int]:
        tape, u = self.tape, member.client
        if (
            member.colluding
            or not self.setting.split_views
            or not tape.deviate("survivors", f"{what} for {u} altered")
        ):
            return list(honest)
        kind = tape.below(3)
        if kind == 0:  # a subset, this client kept
            return sorted({u, *tape.subset(list(honest))})
        if kind == 1:  # any subset of what it knows
            return sorted(tape.subset(list(known)))
        extra = [v for v in known if v not in honest]
        return sorted({*honest, *(tape.subset(extra) or extra[:1])})

    def bundles(
        self, member: Member, listed: list[int], shares: dict[int, EncryptedShares]
    ) -> dict[int, bytes]:
        tape, u = self.tape, member.client
        neighbours = member.session.assignment.neighbours_of(u)
        honest = {
            p: shares[p].bundles[u]
            for p in listed
            if p != u and p in neighbours and p in shares and u in shares[p].bundles
        }
        if member.colluding or not tape.deviate("bundles", f"bundles to {u} altered"):
            return honest
        kind = tape.below(5)
        if kind == 0:
            return {}
        if kind == 1:
            gone = set(tape.subset(sorted(honest)))
            return {p: b for p, b in honest.items() if p not in gone}
        if kind == 2:
            bad = set(tape.subset(sorted(honest)))
            return {p: (b[:-1] + bytes([b[-1] ^ 1]) if p in bad else b) for p, b in honest.items()}
        if kind == 3 and len(honest) >= 2:  # two peers' bundles swapped
            a, b = tape.permutation(sorted(honest))[:2]
            return {**honest, a: honest[b], b: honest[a]}
        # a bundle for another receiver, from the same sender
        out = dict(honest)
        for p in tape.subset(sorted(honest)):
            other = [w for w in shares[p].bundles if w != u]
            if other:
                out[p] = shares[p].bundles[tape.pick(other)]
        return out

    def unmask_request(
        self,
        member: Member,
        context: KeyContext,
        survivors: list[int],
        dropped: list[int],
        members: tuple[int, ...],
        signed_lists: dict[int, tuple[tuple[int, ...], bytes]],
        force: bool = False,
    ) -> UnmaskRequest:
        tape, u = self.tape, member.client
        if force or (
            self.setting.split_views and tape.deviate("unmask", f"unmask lists for {u} altered")
        ):
            survivors = sorted(tape.subset(list(members)))
            if tape.flip():
                survivors = sorted({u, *survivors})
            rest = [v for v in members if v not in survivors]
            kind = tape.below(3)
            dropped = rest if kind == 0 else sorted(tape.subset(rest if kind == 1 else members))
        listed = tuple(sorted(survivors))
        signatures: dict[int, bytes] = {}
        if self.setting.signed:
            signatures = {v: sig for v, (lst, sig) in signed_lists.items() if lst == listed}
            statement = client_list_message(context, listed, SURVIVORS_LABEL)
            for c in self.colluders & set(listed):
                signatures[c] = IDENTITIES[c].sign(statement)
            if signatures and tape.deviate("unmask", f"signatures to {u} thinned"):
                signatures = {v: s for v, s in signatures.items() if tape.flip()}
        return UnmaskRequest(context, tuple(survivors), tuple(dropped), signatures)


def play(setting: Setting, data: bytes, hooks: dict | None = None) -> Outcome:
    """One game on ``data``."""
    return Game(setting, data, hooks or {}).play()


def search(setting: Setting, games: int, seed: int = 0, tape_bytes: int = 1024) -> Outcome | None:
    """Deterministic search: play ``games`` random tapes; the first leaking outcome."""
    rng = random.Random(seed)
    for _ in range(games):
        outcome = play(setting, rng.randbytes(tape_bytes))
        if outcome.findings:
            return outcome
    return None
