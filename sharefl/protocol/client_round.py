"""A client's guard over one round: what it checks against the committed round plan.

A malicious server can hurt a client beyond one cluster: run it in two clusters of one
reclustering, or in two clusters of a round whose sums differ by one client, claim a
member dropped so that a sum covers fewer clients than planned, or shrink a cluster or
its neighbour graph. :class:`ClientRound` is built when a round starts, from the
:class:`~sharefl.protocol.plan.RoundPlan` the server committed to (its digest is bound into
every key context of the round, so members shown different plans cannot work together),
and refuses, with a :class:`~sharefl.protocol.errors.ClientRefusal`:

- a plan that does not contain the client, has more than ``policy.max_reclusterings``
  clusterings, puts the client in a cluster smaller than ``policy.min_cluster_size``, or
  whose cluster sums reveal an update or a sum of fewer than ``policy.sum_floor`` clients,
  or an update that follows from them and the inputs of the colluders this client resists
  (:func:`plan_colluders`: ``policy.colluders``, else the default for its smallest cluster)
  (:func:`~sharefl.protocol.audit.audit`; an audit that runs out of budget is a refusal
  too) — :class:`PlanRefused`, :class:`ClusterTooSmall`;
- an assignment of another round or plan, outside the plan, with other members than the
  plan's, or in a reclustering where the client already took part — :class:`OffPlan`,
  :class:`ReclusteringReused`;
- a cluster below the minimum size, a neighbour graph that is malformed, gives any member
  fewer than ``policy.min_neighbours`` neighbours, or is not connected (each component
  would unmask on its own) — :class:`ClusterTooSmall`, :class:`InconsistentRequest`; an
  unsigned assignment when signatures are required —
  :class:`InconsistentRequest`; a threshold below the floor — :class:`ThresholdTooLow`
  (raised by :class:`ClientSession`);
- an unmask request with an empty survivor list (:class:`InconsistentRequest`), or whose
  revealed sums (one per connected component of the neighbour graph induced on the
  survivors: :func:`~sharefl.protocol.audit.revealed_sums`), together with the planned sums
  and the sums this client already helped release in the round, would leak —
  :class:`ReleaseLeaks` (in signed mode, or when ``policy.verify_releases`` asks for it);
  an unmask request the session does not expect (a second one) is refused by the session;
- with a :class:`~sharefl.protocol.memory.ClientMemory` (invariant I4): a round number of
  the server's run that does not increase — :class:`RoundReplayed` — and a model this
  client already contributed on under other clusterings — :class:`ModelReplayed`; the
  releases seen on the same model in earlier rounds join the release check.

:meth:`ClientRound.session` vets an assignment and builds the :class:`ClientSession`;
:meth:`ClientRound.handle` routes every server message of that session through the guard.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sharefl.protocol import records
from sharefl.protocol.atoms import atom_floor, split_atoms
from sharefl.protocol.audit import (
    AuditBudgetExceeded,
    AuditError,
    LeakageReport,
    audit,
    audit_rows,
    linked_to,
    revealed_sums,
)
from sharefl.protocol.budget import PrivacyCharge
from sharefl.protocol.client import ClientPolicy, ClientSession, ClientState, default_colluders
from sharefl.protocol.errors import (
    AtomRefused,
    ClusterTooSmall,
    InconsistentRequest,
    OffPlan,
    PlanRefused,
    ReclusteringReused,
    ReleaseLeaks,
)
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.memory import ClientMemory, Limits
from sharefl.protocol.messages import ClientMessage, ClusterAssignment, ServerMessage, UnmaskRequest
from sharefl.protocol.plan import RoundPlan

Position = tuple[int, int]
"""(reclustering, cluster) of one cluster of the plan."""


def plan_rows(
    plan: RoundPlan, released: Mapping[Position, Sequence[frozenset[int]]] | None = None
) -> list[frozenset[int]]:
    """The member sets of every planned sum, each cluster in ``released`` replaced by the
    sums its release revealed (:func:`~sharefl.protocol.audit.revealed_sums`: one per
    component of the survivors' neighbour graph; empty ones left out): what a party that
    saw those releases must assume the server holds."""
    released = released or {}
    rows: list[frozenset[int]] = []
    for r, clustering in enumerate(plan.clusterings):
        for k, cluster in enumerate(clustering.clusters):
            pieces = released.get((r, k))
            rows.extend(p for p in (pieces or (frozenset(cluster),)) if p)
    return rows


def plan_colluders(plan: RoundPlan, client: int, policy: ClientPolicy) -> int:
    """The colluders ``client`` audits ``plan`` (and its releases) against:
    ``policy.colluders`` when set, else :func:`~sharefl.protocol.client.default_colluders`
    of its smallest cluster in the plan (in the mode it requires: a client that accepts
    unsigned rounds trusts the server's key exchange, 0). The same rule as its threshold
    floor, so the plan's sums resist the colluders its thresholds resist."""
    if policy.colluders is not None:
        return policy.colluders
    sizes = [len(c.cluster_of(client)) for c in plan.clusterings if client in c]
    return default_colluders(min(sizes, default=2), policy.require_signed)


class ClientRound:
    """One client's guard for one round of a committed plan.

    Args:
        client_id: this client.
        plan: the round plan the server committed to (``RoundStart.plan``).
        policy: the client's requirements (:class:`ClientPolicy`).
        memory: what this client remembers of the server's earlier rounds
            (:class:`~sharefl.protocol.memory.ClientMemory`, invariant I4); ``None``: this
            round is checked alone (no protection against replayed rounds or models).
        run: the server's run id (``RoundStart.run``) keying the round numbers in ``memory``.
        model_digest: :func:`~sharefl.protocol.memory.model_digest` of the model this
            client trains on in the round; ``None``: unknown (``memory`` then checks the
            round number only).
        charge: the privacy cost of this round's own noise, for the client's budget
            (:mod:`sharefl.protocol.budget`; ``policy.max_epsilon`` needs it).

    Raises:
        PlanRefused: the plan lacks this client, has too many reclusterings, or its sums
            leak (or the audit could not finish).
        ClusterTooSmall: the plan puts this client in a cluster below the minimum size.
        RoundReplayed: ``memory`` holds this round number of ``run`` or a later one (R1).
        ModelReplayed: ``memory`` holds a contribution on this model under other
            clusterings (R2).
        AtomRefused: a plan without atoms where this client needs them, another roster
            than the one ``memory`` keeps, or an atom below the floor (A1–A3).
        BudgetExhausted: the round would take this client past ``policy.max_rounds`` or
            ``policy.max_epsilon``.
    """

    def __init__(
        self,
        client_id: int,
        plan: RoundPlan,
        policy: ClientPolicy | None = None,
        *,
        memory: ClientMemory | None = None,
        run: bytes = b"",
        model_digest: bytes | None = None,
        charge: PrivacyCharge | None = None,
    ):
        self.id = client_id
        self.plan = plan
        self.policy = policy or ClientPolicy()
        self.digest = plan.digest()
        self.memory = memory
        self.run = bytes(run)
        self.model_digest = model_digest
        self.clusterings = plan.clusterings_digest()
        self._recorded = False  # whether this guard recorded its round in `memory`
        # position -> the sums its accepted release revealed (revealed_sums of its survivors)
        self._released: dict[Position, tuple[frozenset[int], ...]] = {}
        self._used: dict[int, int] = {}  # reclustering -> cluster this client took part in
        self.charge = charge
        self.colluders = plan_colluders(plan, client_id, self.policy)
        self._check_plan()
        if memory is not None:
            memory.check(
                self.run, plan.round, model_digest, self.clusterings, **self._memory_terms()
            )

    @property
    def atom(self) -> tuple[int, ...] | None:
        """This client's atom in the plan (None: a plan without atoms)."""
        atoms = self.plan.atoms
        return None if atoms is None else atoms.cluster_of(self.id)

    def _memory_terms(self) -> dict[str, Any]:
        policy = self.policy
        limits = Limits(policy.max_rounds, policy.max_epsilon, policy.budget_delta)
        return {"client": self.id, "atom": self.atom, "limits": limits, "charge": self.charge}

    # -- the plan ---------------------------------------------------------------------------

    def _check_plan(self) -> None:
        # I3, cheap checks first: R, the number of participants and this client's own
        # clusters cost O(R) (a clustering knows its size and each client's cluster), so a
        # plan too large to audit is refused before the audit, whose cost grows steeply
        # with the plan; the audit itself then runs within the policy's work budget.
        plan, policy = self.plan, self.policy
        if plan.reclusterings > policy.max_reclusterings:
            raise PlanRefused(
                f"client {self.id}: the round plan has {plan.reclusterings} reclusterings; "
                f"this client takes part in at most {policy.max_reclusterings}: the server "
                "must plan fewer"
            )
        participants = plan.clusterings[0].num_clients
        if participants > policy.max_participants:
            raise PlanRefused(
                f"client {self.id}: the round plan has {participants} participants; this "
                f"client audits plans of at most {policy.max_participants}: the server must "
                "split the round into smaller ones"
            )
        if self.id not in plan.clusterings[0]:
            raise PlanRefused(f"client {self.id} is not in the round plan of round {plan.round}")
        for r, clustering in enumerate(plan.clusterings):
            size = len(clustering.cluster_of(self.id))
            if size < policy.min_cluster_size:
                raise ClusterTooSmall(
                    f"client {self.id}: the plan puts it in a cluster of {size} in "
                    f"reclustering {r}; the server must use clusters of at least "
                    f"{policy.min_cluster_size}"
                )
        if plan.atoms is not None or policy.require_atoms:
            self._check_atoms()
            return
        try:
            report = _plan_audit(
                plan,
                policy.sum_floor,
                policy.max_audit_work,
                policy.audit_search_budget,
                self.colluders,
            )
        except AuditError as exc:
            raise PlanRefused(f"client {self.id}: the round plan cannot be audited: {exc}") from exc
        except AuditBudgetExceeded as exc:
            raise PlanRefused(
                f"client {self.id}: auditing the round plan ({participants} participants, "
                f"{plan.reclusterings} reclusterings) needs more than this client's budget of "
                f"{exc.budget} operations: the server must link fewer clients through shared "
                "sums (reclustering within small blocks, as the safe planner does), use fewer "
                "reclusterings or fewer participants"
            ) from exc
        if report.leaks or not report.complete:
            raise PlanRefused(f"client {self.id}: the round plan is unsafe: {_reason(report)}")

    def _check_atoms(self) -> None:
        """A2 and A3 (:mod:`sharefl.protocol.atoms`) instead of the exact audit: the plan has
        atoms (RoundPlan checked that they partition the participants and that no cluster
        cuts one: A3), and this client's has at least the floor. A1 (the roster kept) is
        the memory's. The argument needs no audit: every sum is a sum of whole atoms."""
        atom = self.atom
        if atom is None:
            raise AtomRefused(
                f"client {self.id} requires atoms (its updates must never be differenced "
                f"across rounds); the plan of round {self.plan.round} has none: the server "
                "must plan whole atoms (secure_aggregation.atoms)"
            )
        floor = atom_floor(self.policy.sum_floor, self.policy.colluders, self.policy.require_signed)
        if len(atom) < floor:
            raise AtomRefused(
                f"client {self.id}: its atom {list(atom)} has {len(atom)} members; this client "
                f"needs at least {floor} (min_sum_size {self.policy.sum_floor} honest members "
                "after the colluders it resists): the server must form larger atoms"
            )

    # -- assignments ------------------------------------------------------------------------

    def vet(self, assignment: ClusterAssignment) -> None:
        """Check one assignment against the plan and the policy, and record that this client
        takes part in its reclustering (and, with a memory, in this round on this model
        under these clusterings, persisted before this returns). Raises a
        :class:`ClientRefusal` (see the module docstring; :class:`RoundReplayed` or
        :class:`ModelReplayed` when another guard took the round or the model meanwhile) or
        ``OSError`` (the memory could not be written); a refused assignment records
        nothing."""
        context, plan = assignment.context, self.plan
        r, k = context.reclustering, context.cluster
        if context.round != plan.round or context.plan != self.digest:
            raise OffPlan(
                f"client {self.id}: the assignment is for round {context.round} under plan "
                f"{context.plan.hex()[:16] or 'none'}; the committed plan is round "
                f"{plan.round}, {self.digest.hex()[:16]}: the server must use plan.context(r, k)"
            )
        if r >= plan.reclusterings or k >= len(plan.clusterings[r].clusters):
            raise OffPlan(
                f"client {self.id}: cluster {k} of reclustering {r} is not in the plan "
                f"({plan.reclusterings} reclusterings)"
            )
        if r in self._used:
            raise ReclusteringReused(
                f"client {self.id} already took part in cluster {self._used[r]} of "
                f"reclustering {r}; one cluster per reclustering (the server could subtract "
                "the two sums)"
            )
        if assignment.members != plan.members(r, k):
            raise OffPlan(
                f"client {self.id}: the assignment's members {assignment.members} differ from "
                f"the plan's cluster {k} of reclustering {r}: {plan.members(r, k)}"
            )
        if self.id not in assignment.members:
            raise OffPlan(f"client {self.id} is not a member of cluster {k} of reclustering {r}")
        self._check_shape(assignment)
        if self.policy.require_signed and not assignment.signed:
            raise InconsistentRequest(
                f"client {self.id} requires signed mode (untrusted server); the assignment is "
                "unsigned: the server must set signed = true"
            )
        if self.memory is not None and not self._recorded:
            # I4: the round, model and clusterings are recorded (R1 and R2 checked again
            # under the memory's lock) before the advertisement this assignment leads to
            # leaves; the first vetted assignment takes the round for this guard, later
            # reclusterings of the same round belong to it. Kept if the session then fails
            # to build (conservative: a later round on this model needs the same clusterings).
            self.memory.record_round(
                self.run, plan.round, self.model_digest, self.clusterings, **self._memory_terms()
            )
            self._recorded = True
        self._used[r] = k

    def _check_shape(self, a: ClusterAssignment) -> None:
        policy = self.policy
        if len(a.members) < policy.min_cluster_size:
            raise ClusterTooSmall(
                f"client {self.id}: a cluster of {len(a.members)}; the server must use "
                f"clusters of at least {policy.min_cluster_size}"
            )
        members = set(a.members)
        if a.neighbours is not None:
            if set(a.neighbours) != members:
                raise InconsistentRequest("the neighbour graph does not list exactly the members")
            for member, peers in a.neighbours.items():
                if member in peers or not peers <= members:
                    raise InconsistentRequest(
                        f"the neighbour list of {member} names itself or non-members"
                    )
                if any(member not in a.neighbours[peer] for peer in peers):
                    raise InconsistentRequest(f"the neighbour graph is not symmetric at {member}")
        degrees = {m: len(a.neighbours_of(m)) for m in a.members}
        low = sorted(m for m, d in degrees.items() if d < policy.min_neighbours)
        if low:
            raise ClusterTooSmall(
                f"client {self.id}: members {low} have {min(degrees.values())} neighbour(s); "
                f"the server must give every member at least {policy.min_neighbours}"
            )
        # Pair masks link neighbours only, so each connected component of the graph
        # unmasks on its own even when nobody drops out (revealed_sums): a disconnected
        # graph releases sums of parts of the planned cluster that no audit covered.
        parts = revealed_sums(a.members, a.neighbours)
        if len(parts) > 1:
            raise InconsistentRequest(
                f"client {self.id}: the neighbour graph of cluster {a.context.cluster} "
                f"falls apart into {len(parts)} components {[sorted(p) for p in parts]}, "
                "each of whose sums would be revealed: the server must use a connected graph"
            )

    def session(
        self,
        assignment: ClusterAssignment,
        vector: np.ndarray | None = None,
        *,
        randbytes: Callable[[int], bytes] = os.urandom,
        keys: ClientKeys | None = None,
    ) -> ClientSession:
        """Vet ``assignment`` and build its :class:`ClientSession` (which checks the
        threshold, and the long-term ``keys`` of a two-exchange round); ``vector=None``
        leaves the input for :meth:`ClientSession.set_input`. Raises a
        :class:`ClientRefusal` or ``ConfigurationError``."""
        self.vet(assignment)
        try:
            return ClientSession(
                self.id, assignment, vector, self.policy, randbytes=randbytes, keys=keys
            )
        except Exception:
            self._used.pop(assignment.context.reclustering, None)
            raise

    # -- releases ---------------------------------------------------------------------------

    def earlier_releases(self) -> list[frozenset[int]]:
        """Every sum this client helped release on this round's model, in this round or
        earlier ones (from ``memory``, which holds the revealed sums of each accepted
        release: :func:`~sharefl.protocol.audit.revealed_sums`; empty without a memory or a
        model digest)."""
        if self.memory is None or self.model_digest is None:
            return []
        seen = self.memory.releases(self.model_digest)
        return sorted({s for sets in seen.values() for s in sets}, key=sorted)

    def check_release(self, session: ClientSession, request: UnmaskRequest) -> None:
        """Before ``session`` answers ``request``: the plan's sums, with every cluster this
        client saw released in the round replaced by the sums that release revealed (this
        one by ``request``'s: :func:`~sharefl.protocol.audit.revealed_sums` of its survivors
        on this client's neighbour graph — one sum per connected component of the graph
        induced on the survivors), together with every sum it helped release on the same
        model in earlier rounds (:meth:`earlier_releases`; several per cluster possible: all
        kept, which is conservative), must not leak, with this client's colluders
        (:func:`plan_colluders`). The earlier sets matter because R2 of
        :mod:`~sharefl.protocol.memory` lets a model return under the same clusterings: the
        server then holds sums of the same inputs over every survivor set of every round on
        that model. Raises :class:`ReleaseLeaks`, or :class:`InconsistentRequest` for an
        empty survivor list or one naming non-members (before any audit); records nothing
        (:meth:`handle` records the release before the session answers)."""
        pieces = self.revealed(session, request)
        if self.plan.atoms is not None:
            # A4: every revealed sum is a union of whole atoms; nothing else to audit.
            cut = sorted({a for piece in pieces for a in split_atoms(piece, self.plan.atoms)})
            if cut:
                raise AtomRefused(
                    f"client {self.id}: the unmask request's survivors cut atoms {cut[:3]}: "
                    "an atom is summed whole or left out whole"
                )
            return
        position = (session.context.reclustering, session.context.cluster)
        released = {**self._released, position: pieces}
        rows = plan_rows(self.plan, released)
        planned = set(rows)
        extra = [s for s in self.earlier_releases() if s not in planned]
        if list(pieces) == [frozenset(self.plan.members(*position))] and not extra:
            return  # the view is unchanged since the plan's audit or the last accepted check
        try:
            report = audit_rows(
                linked_to(pieces, rows + extra),
                self.policy.sum_floor,
                self.policy.audit_search_budget,
                self.policy.max_audit_work,
                colluders=self.colluders,
            )
        except AuditBudgetExceeded as exc:
            raise ReleaseLeaks(
                f"client {self.id}: this release cannot be audited within the work budget "
                f"({exc}); the server must release fewer or smaller linked sums"
            ) from exc
        if report.leaks or not report.complete:
            raise ReleaseLeaks(f"client {self.id}: this release is unsafe: {_reason(report)}")

    def revealed(
        self, session: ClientSession, request: UnmaskRequest
    ) -> tuple[frozenset[int], ...]:
        """The sums answering ``request`` would reveal, after the checks that come before
        any audit (the session was vetted here, the survivor list is non-empty and names
        members only; raises :class:`OffPlan`, :class:`InconsistentRequest`)."""
        context = session.context
        if context.plan != self.digest or self._used.get(context.reclustering) != context.cluster:
            raise OffPlan(f"client {self.id}: an unmask request for a cluster it was not vetted in")
        survivors = frozenset(request.survivors)
        if not survivors:
            raise InconsistentRequest(
                f"client {self.id}: an unmask request with an empty survivor list; the server "
                "must list the clients whose masked inputs it sums"
            )
        if not survivors <= set(session.assignment.members):
            raise InconsistentRequest("the unmask survivor list names non-members")
        return tuple(revealed_sums(survivors, session.assignment.neighbours))

    def handle(self, session: ClientSession, message: ServerMessage) -> ClientMessage:
        """Route one server message of ``session`` through the guard and return the reply;
        an unmask request the session expects is checked by :meth:`check_release` first
        and, with a memory, each sum it reveals is recorded there before the reply is built
        (a refusal aborts the session; a recorded release the session then refuses stays
        recorded: conservative). An unmask request the session does not expect (another
        context, a second request, one before the consistency stage) goes straight to the
        session, which refuses it. Raises what :meth:`ClientSession.handle` raises,
        :class:`ReleaseLeaks`, :class:`ModelReplayed` (too many releases on one model) and
        ``OSError`` (the memory could not be written).
        """
        verify = self.policy.verify_releases
        if verify is None:
            verify = session.assignment.signed
        verify = verify or self.plan.atoms is not None
        if not verify or not isinstance(message, UnmaskRequest):
            return session.handle(message)
        expected = ClientState.SIGNED if session.assignment.signed else ClientState.MASKED
        if message.context != session.context or session.state is not expected:
            return session.handle(message)
        context = session.context
        position = (context.reclustering, context.cluster)
        try:
            self.check_release(session, message)
            pieces = self.revealed(session, message)
            if self.memory is not None and self.model_digest is not None and self.atom is None:
                # I4: the release is on record before the response that makes it leaves
                # (with atoms the releases need no memory: each is a union of atoms).
                for piece in pieces:
                    self.memory.record_release(
                        self.model_digest, self.clusterings, position, piece, client=self.id
                    )
        except Exception:
            session.abort()
            raise
        reply = session.handle(message)
        self._released[position] = pieces
        return reply

    # -- state export / import --------------------------------------------------------------

    def export_state(self) -> records.Record:
        """The guard as a plain record (the plan, the reclusterings this client took part
        in, the releases it saw), to keep between messages (see
        :meth:`ClientSession.export_state`). Holds no secret."""
        r: records.Record = {records.TYPE_KEY: ROUND_STATE_TYPE, "id": self.id}
        r.update(records.nest("plan", records.to_record(self.plan)))
        used = sorted(self._used.items())
        r["used.reclusterings"] = [p for p, _ in used]
        r["used.clusters"] = [k for _, k in used]
        # One entry per revealed sum (a position repeats when its release revealed several).
        released = [(p, piece) for p, pieces in sorted(self._released.items()) for piece in pieces]
        r["released.reclusterings"] = [p[0] for p, _ in released]
        r["released.clusters"] = [p[1] for p, _ in released]
        r["released.sizes"] = [len(s) for _, s in released]
        r["released.members"] = [i for _, s in released for i in sorted(s)]
        r["memory.run"] = self.run
        r["memory.model"] = self.model_digest or b""
        r["memory.recorded"] = self._recorded
        return r

    @classmethod
    def from_state(
        cls,
        record: Mapping[str, Any],
        policy: ClientPolicy | None = None,
        *,
        memory: ClientMemory | None = None,
    ) -> ClientRound:
        """The guard :meth:`export_state` saved, with ``memory`` (the same
        :class:`ClientMemory` it was built with; the record keeps the run id, the model
        digest and whether the guard recorded its round, not the memory). The plan was
        audited and the memory checked when the guard was built, and neither is checked
        again: pass only records this client exported itself. Raises
        :class:`~sharefl.protocol.records.RecordError` for a malformed record."""
        if record.get(records.TYPE_KEY) != ROUND_STATE_TYPE:
            raise records.RecordError(f"not a {ROUND_STATE_TYPE} record")
        guard = cls.__new__(cls)
        guard.id = records.get_int(record, "id")
        guard.plan = records.from_record(records.unnest("plan", record), RoundPlan)
        guard.policy = policy or ClientPolicy()
        guard.digest = guard.plan.digest()
        guard.clusterings = guard.plan.clusterings_digest()
        guard.memory = memory
        guard.run = records.get_bytes(record, "memory.run") if "memory.run" in record else b""
        model = (
            records.get_bytes(record, "memory.model", (0, 32)) if "memory.model" in record else b""
        )
        guard.model_digest = model or None
        guard._recorded = (
            records.get_bool(record, "memory.recorded") if "memory.recorded" in record else False
        )
        rs = records.get_ids(record, "used.reclusterings")
        ks = records.get_ids(record, "used.clusters", unique=False)
        if len(rs) != len(ks):
            raise records.RecordError("'used.*' lists differ in length")
        guard._used = dict(zip(rs, ks, strict=True))
        rr = records.get_ids(record, "released.reclusterings", unique=False)
        rk = records.get_ids(record, "released.clusters", unique=False)
        sizes = records.get_ids(record, "released.sizes", unique=False)
        members = records.get_ids(record, "released.members", 1 << 20, unique=False)
        if not len(rr) == len(rk) == len(sizes) or sum(sizes) != len(members):
            raise records.RecordError("'released.*' lists do not match")
        guard._released, start = {}, 0
        for r, k, size in zip(rr, rk, sizes, strict=True):
            piece = frozenset(members[start : start + size])
            guard._released[(r, k)] = (*guard._released.get((r, k), ()), piece)
            start += size
        guard.colluders = plan_colluders(guard.plan, guard.id, guard.policy)
        guard.charge = None  # charged when the round was recorded, before this export
        return guard


ROUND_STATE_TYPE = "ClientRoundState"
"""The ``type`` of a :meth:`ClientRound.export_state` record."""


@functools.lru_cache(maxsize=8)
def _plan_audit(
    plan: RoundPlan,
    min_sum_size: int,
    work_budget: int | None,
    search_budget: int,
    colluders: int = 0,
) -> LeakageReport:
    """The audit of a plan's sums within the budgets, against ``colluders``; remembered, so
    the clients that one process simulates audit each plan once (a real client audits its
    round's plan once anyway). Raises :class:`AuditBudgetExceeded` when the work budget
    runs out."""
    return audit(
        plan.clusterings,
        client_ids=plan.participants,
        min_sum_size=min_sum_size,
        search_budget=search_budget,
        work_budget=work_budget,
        colluders=colluders,
    )


def _reason(report: LeakageReport) -> str:
    if not report.complete and not report.leaks:
        if not report.colluder_search_complete:
            return (
                f"the check against {report.colluders} colluders could not decide a block of "
                "linked clients (too many linked clients or out of budget); the server must "
                "link fewer clients through shared sums (smaller blocks) or fewer reclusterings"
            )
        return (
            f"the audit ran out of budget after sums of {report.searched_up_to} clients; the "
            "server must use fewer reclusterings or smaller rounds"
        )
    parts = []
    if report.recoverable_clients:
        parts.append(f"the updates of clients {list(report.recoverable_clients)[:8]}")
    if report.recoverable_small_sums:
        sums = [list(s) for s in report.recoverable_small_sums[:4]]
        parts.append(f"sums of fewer than {report.min_sum_size} clients {sums}")
    if report.colluder_leaks:
        leaks = [f"x_{i} from {list(given)}" for i, *given in report.colluder_leaks[:4]]
        parts.append(f"with {report.colluders} colluder(s), {', '.join(leaks)}")
    return (
        "the server could recover "
        + " and ".join(parts)
        + "; it must use fewer reclusterings or larger clusters"
    )
