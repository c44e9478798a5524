"""The round coordinator: every rule of one secure-aggregation round, sans-IO.

One :class:`RoundCoordinator` runs one round: it plans the R clusterings, audits the plan,
chooses the fixed-point encoding once, builds each cluster's assignment, routes every
received message by its *authenticated* sender to that sender's cluster, closes stages when
the caller says so (all messages in, or the caller's deadline passed), checks every sum
against what was already released before it may be unmasked, and decodes what it releases.
It never touches sockets, threads or clocks: the in-process driver
(:func:`sharefl.protocol.driver.secure_sum`), the gRPC server (:mod:`sharefl.deploy.server`)
and other FL stacks drive the same object, so none of them re-implements planning,
auditing, encoding or decoding.

A round, as a transport drives it::

    rc = RoundCoordinator(settings, round=t, participants=ids, length=d, rng=rng)
    send rc.plan to every participant                   # the committed plan (RoundStart)
    while not rc.done:
        send rc.open_reclustering()                     # client id -> ClusterAssignment
        while not rc.reclustering_done:
            rc.receive(sender, message) for each message  # sender: authenticated by transport
            ... until rc.waiting_for() is empty or the stage deadline passed ...
            send rc.advance()                           # client id -> next server message
        rc.close_reclustering()
    result = rc.result()                                # RoundResult

What the coordinator promises (the threat model of docs/security.md):

- Byzantine clients. Every sum is decoded to its signed representative; a sum outside the
  honest range (cluster size × clip) is *corrupted*: reported with its cluster and left out,
  never an exception. A client whose message no honest client would send (malformed, bad
  key or signature), or whose secrets cannot be rebuilt from its own dealing, is named in
  :attr:`RoundResult.culprits`; :class:`Exclusions` turns those names into exclusion from
  later rounds. A client every peer disowned is left out of the sum, never named (m − 1
  liars could disown an honest peer). Nothing a client sends reaches another cluster.
- Curious server. A sum is released only if everything released so far *on the round's
  model* (this round's sums and the ``prior_releases`` a transport hands in, see below)
  plus this sum still reveals no individual update and no sum of fewer than
  ``min_sum_size`` clients (an exact rational audit, :mod:`sharefl.protocol.audit`); else it
  is *withheld* before any unmask request goes out, so it is never computed. An audit that
  cannot finish withholds too.

Across rounds and restarts. With atoms (``atom_partition``, :mod:`sharefl.protocol.atoms`)
every release is a sum of whole atoms, whatever the round, model or clusterings, so nothing
below needs keeping: a transport may re-plan any model. Without atoms: clients compute their
updates from the model the round broadcasts, so two rounds over one model sum the same
inputs: their releases are equations over the same unknowns. A transport that runs several
rounds keeps this invariant:

    **the server never releases sums of one model under two clusterings, and its release
    audit covers every sum released on that model, across rounds and restarts.**

It does so with two arguments of :class:`RoundCoordinator`: ``clusterings`` (a round over a
model that an earlier round already used takes that round's clusterings, under its own
round number, instead of drawing new ones) and ``prior_releases`` (every :class:`Release`
already approved on that model seeds the :class:`ReleaseAuditor`, so the audit of the new
round's sums is the audit of the union). ``on_release`` reports each approval *before* the
unmask request that releases it is handed to the transport, and each computed sum before
the next reclustering opens: a transport that persists them there (the gRPC server does,
:mod:`sharefl.deploy.results`) loses no release record in a crash at any point.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from sharefl.crypto.encoding import RingEncoding, choose_encoding, decode
from sharefl.crypto.errors import EncodingError, SumOutOfRange
from sharefl.crypto.kdf import TWO_EXCHANGE_VERSION, KeyContext
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.atoms import Atoms, check_plan_atoms, group_atoms, split_atoms
from sharefl.protocol.audit import (
    DEFAULT_SEARCH_BUDGET,
    LeakageReport,
    SafeSamplingError,
    audit,
    audit_rows,
    linked_to,
    revealed_sums,
    sample_safe_reclusterings,
)
from sharefl.protocol.client import default_colluders
from sharefl.protocol.client_round import plan_rows
from sharefl.protocol.clustering import Clustering, ClusteringError, random_clustering
from sharefl.protocol.errors import ConfigurationError, LeakageError, RejectedMessage, StageError
from sharefl.protocol.fields import MAX_DEALT_PEERS
from sharefl.protocol.isolation import Suspicion, isolating_reclusterings
from sharefl.protocol.keys import KeyAdvert
from sharefl.protocol.messages import ClientMessage, ClusterAssignment, ServerMessage
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, FailedCluster, ServerSession
from sharefl.protocol.settings import KeySetup
from sharefl.protocol.settings import Planner as Planner  # re-exported: its old home
from sharefl.protocol.settings import (
    SecureAggregationSettings as SecureAggregationSettings,
)

RANGE_HEADROOM = 2
"""The encoding is chosen for ``RANGE_HEADROOM`` × the largest cluster, so that at least
half of Z_2^b lies outside the honest range of every cluster sum: a Byzantine value there
(e.g. a uniformly random ring element, half the time per coordinate) is detected as
corrupted. It costs one bit of fixed-point precision."""


@dataclass(frozen=True)
class CorruptedCluster:
    """A cluster whose unmasked sum lies outside the honest range: left out of the result.

    Attributes:
        cluster: the cluster id; ``members`` the clients whose inputs it summed;
        ``reason`` what the range check found.
    """

    cluster: int
    members: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Release:
    """One sum the release check approved: from then on the server may learn it.

    Reported twice through ``RoundCoordinator(on_release=...)``: once when the members are
    approved (``sum`` is ``None``; the unmask requests are not yet out), once when the sum
    is computed (``sum`` set: the decoded float64 sum when the round encodes, else the ring
    sum). As ``prior_releases`` only the members and the position count.

    Attributes:
        round: the round that released it.
        reclustering, cluster: its position in that round's plan.
        members: the clients whose inputs it sums (sorted).
        sum: the value, once computed.
    """

    round: int
    reclustering: int
    cluster: int
    members: tuple[int, ...]
    sum: np.ndarray | None = None

    @property
    def position(self) -> tuple[int, int]:
        """(reclustering, cluster)."""
        return (self.reclustering, self.cluster)


@dataclass(frozen=True)
class ReclusteringResult:
    """One reclustering of a round.

    Attributes:
        index: r.
        clustering: its planned clusters.
        clusters: the released sums (``decoded`` holds the float64 sum when the round has
            an encoding; ``ring_sum`` is always the exact sum in Z_2^b).
        failed: clusters that produced no sum (too few clients, a secret that could not be
            rebuilt, or withheld by the release check: ``stage == "release"``).
        corrupted: sums outside the honest range, left out of ``clusters``.
        events: per cluster, what the in-process driver saw (refusals, rejections).
    """

    index: int
    clustering: Clustering
    clusters: list[ClusterSum]
    failed: list[FailedCluster]
    corrupted: list[CorruptedCluster] = field(default_factory=list)
    events: dict[int, Any] = field(default_factory=dict)

    @property
    def withheld(self) -> list[FailedCluster]:
        """The clusters the release check withheld."""
        return [f for f in self.failed if f.stage == "release"]


@dataclass(frozen=True)
class RoundResult:
    """Everything one round produced.

    ``planned_audit`` is the audit of the plan before the round, ``realised_audit`` the
    audit of the sums it released (drop-outs shrink sums) together with the
    ``prior_releases`` on the same model it was given. ``culprits`` maps each client
    that provably misbehaved to the first reason found.
    """

    plan: RoundPlan
    reclusterings: list[ReclusteringResult]
    planned_audit: LeakageReport
    realised_audit: LeakageReport
    encoding: RingEncoding | None
    culprits: dict[int, str]

    @property
    def clusters(self) -> list[ClusterSum]:
        """The released sums of a round with one clustering. A round with R > 1
        reclusterings has R lists (``reclusterings[r].clusters``): then this raises
        :class:`~sharefl.protocol.errors.StageError` instead of returning only the first."""
        return self._only().clusters

    @property
    def failed(self) -> list[FailedCluster]:
        """The failed clusters of a round with one clustering (see :attr:`clusters`)."""
        return self._only().failed

    @property
    def all_clusters(self) -> list[ClusterSum]:
        """The released sums of every reclustering, in order."""
        return [c for rec in self.reclusterings for c in rec.clusters]

    def _only(self) -> ReclusteringResult:
        if len(self.reclusterings) != 1:
            raise StageError(
                f"this round has {len(self.reclusterings)} reclusterings: use "
                "reclusterings[r].clusters / .failed, or all_clusters"
            )
        return self.reclusterings[0]


def round_colluders(clusterings: Sequence[Clustering], settings: SecureAggregationSettings) -> int:
    """The colluders the round's audits resist: ``settings.colluders``, else the largest
    of the clients' defaults (each client takes :func:`~sharefl.protocol.client.
    default_colluders` of its smallest cluster in the plan, in ``settings.signed`` mode;
    the audit is monotone in c, so the largest satisfies every client)."""
    if settings.colluders is not None:
        return settings.colluders
    smallest: dict[int, int] = {}
    for clustering in clusterings:
        for cluster in clustering.clusters:
            for client in cluster:
                smallest[client] = min(smallest.get(client, len(cluster)), len(cluster))
    return max((default_colluders(m, settings.signed) for m in smallest.values()), default=0)


def plan_round(
    round_index: int,
    participants: Sequence[int],
    settings: SecureAggregationSettings,
    rng: np.random.Generator,
    clusterings: Sequence[Clustering] | None = None,
    *,
    suspicion: Suspicion | None = None,
    atom_partition: Atoms | None = None,
) -> tuple[RoundPlan, LeakageReport]:
    """Draw (or take) the round's clusterings and audit them.

    With ``atom_partition`` (a partition of ``participants``, :mod:`sharefl.protocol.atoms`) every
    clustering groups whole atoms (:func:`~sharefl.protocol.atoms.group_atoms`; given
    ``clusterings`` must be unions of them), and the audit is the structural one
    (:func:`atom_audit`): whatever the clusterings, the sums are sums of whole atoms.

    With ``settings.planner`` :data:`Planner.ISOLATE`, ``suspicion`` (the caller's history
    of flagged clusters, updated by the caller with :meth:`Suspicion.record` after each
    round) decides which clients are spread apart; a transport passes the plan's
    clusterings on to :class:`RoundCoordinator` (``clusterings=``). The plan is audited
    like any other.

    Raises :class:`ConfigurationError` when the clusterings cannot be drawn or do not
    partition ``participants``, and :class:`LeakageError` when the plan leaks (or its audit
    cannot finish) and ``settings.allow_leakage`` is off.
    """
    ids = sorted(participants)
    if len(set(ids)) != len(ids) or not ids:
        raise ConfigurationError("participants must be distinct client ids, at least one")
    m, r = settings.cluster_size, settings.reclusterings
    if atom_partition is not None:
        return _plan_atoms(round_index, ids, settings, rng, clusterings, atom_partition)
    # The samplers audit each draw against c colluders; c depends on the drawn cluster
    # sizes (round_colluders), so draw with a guess and redraw with the plan's c when the
    # guess was too low (a plan safe against c is safe against fewer: the audit is monotone).
    guess = settings.colluders
    if guess is None:
        guess = default_colluders(min(m, len(ids)), settings.signed)
    try:
        for _ in range(3):
            if clusterings is not None:
                plan = list(clusterings)
            elif settings.planner is Planner.ISOLATE and settings.secure:
                plan = isolating_reclusterings(
                    ids,
                    m,
                    r,
                    suspicion,
                    rng,
                    min_sum_size=settings.min_sum_size,
                    colluders=guess,
                )
            elif settings.planner is Planner.SAFE and r > 1 and settings.secure:
                plan = sample_safe_reclusterings(
                    ids, m, r, rng, min_sum_size=settings.min_sum_size, colluders=guess
                )
            else:
                plan = [random_clustering(ids, m, rng) for _ in range(r)]
            sampled = clusterings is None and settings.secure and len(plan) > 1
            needed = round_colluders(plan, settings)
            if needed <= guess or not sampled or settings.planner is Planner.RANDOM:
                break
            guess = needed
    except (ClusteringError, SafeSamplingError) as exc:
        raise ConfigurationError(str(exc)) from exc
    if len(plan) != r or any(set(c.members) != set(ids) for c in plan):
        raise ConfigurationError(
            f"each of the {r} clusterings must partition exactly the round's participants"
        )
    report = audit(
        plan,
        client_ids=ids,
        min_sum_size=settings.min_sum_size,
        colluders=round_colluders(plan, settings) if settings.secure else 0,
    )
    if settings.secure and (report.leaks or not report.complete) and not settings.allow_leakage:
        raise LeakageError(
            f"{report.summary()}\nUse fewer reclusterings or larger clusters, the safe "
            "planner, or allow_leakage to run anyway."
        )
    return RoundPlan(round_index, tuple(plan)), report


def _plan_atoms(
    round_index: int,
    ids: list[int],
    settings: SecureAggregationSettings,
    rng: np.random.Generator,
    clusterings: Sequence[Clustering] | None,
    atoms: Atoms,
) -> tuple[RoundPlan, LeakageReport]:
    """:func:`plan_round` over atoms: R groupings of whole atoms (or the given ones), each
    atom at least the settings' floor."""
    if set(atoms.members) != set(ids):
        raise ConfigurationError("the atoms must partition exactly the round's participants")
    floor = settings.atom_floor
    small = [a for a in atoms.clusters if len(a) < floor]
    if small and not settings.allow_leakage:
        raise LeakageError(
            f"atoms {small[:3]} have fewer than {floor} members (min_sum_size "
            f"{settings.min_sum_size} after the colluders an atom resists): form larger atoms"
        )
    if clusterings is None:
        plan = [
            group_atoms(atoms.clusters, settings.cluster_size, rng)
            for _ in range(settings.reclusterings)
        ]
    else:
        plan = list(clusterings)
    if len(plan) != settings.reclusterings:
        raise ConfigurationError(
            f"each of the {settings.reclusterings} clusterings must partition exactly the "
            "round's participants"
        )
    try:
        check_plan_atoms(plan, atoms)
    except ConfigurationError:
        if not settings.allow_leakage:
            raise
        return RoundPlan(round_index, tuple(plan)), audit(
            plan, client_ids=ids, min_sum_size=settings.min_sum_size
        )
    return RoundPlan(round_index, tuple(plan), atoms), atom_audit(
        plan, atoms, settings.min_sum_size
    )


def atom_audit(clusterings: Sequence[Clustering], atoms: Atoms, min_sum_size: int) -> LeakageReport:
    """The audit of a plan whose clusters are unions of ``atoms``, by structure: every sum
    is a sum of whole atoms, so nothing finer than an atom sum is determined, whatever the
    clusterings and however many rounds (the argument of :mod:`sharefl.protocol.atoms`).
    The rank is that of the cluster-by-atom incidence matrix."""
    column = {i: k for k, atom in enumerate(atoms.clusters) for i in atom}
    rows = {frozenset(column[i] for i in cluster) for c in clusterings for cluster in c.clusters}
    matrix = np.zeros((len(rows), len(atoms)), dtype=np.float64)
    for j, row in enumerate(rows):
        matrix[j, sorted(row)] = 1.0
    rank = int(np.linalg.matrix_rank(matrix)) if rows else 0
    return LeakageReport(
        client_ids=atoms.members,
        num_equations=len(rows),
        rank=rank,
        recoverable_clients=(),
        recoverable_small_sums=(),
        min_sum_size=min_sum_size,
        complete=True,
        searched_up_to=0,
    )


class ReleaseAuditor:
    """Decides, sum by sum, whether releasing one more cluster sum stays safe.

    Holds the member sets of the sums approved so far in the round. A new set is approved
    when the plan's audit passed and every approved set is a planned cluster (the released
    row space is then inside the audited one), or else when an exact audit of the
    connected component of the new set (the sums sharing clients with it, transitively;
    the equations are block-diagonal over components) finds no recoverable update and no
    recoverable sum of fewer than ``min_sum_size`` clients, and finishes.

    With ``client_views`` (signed rounds, whose clients verify releases themselves) it also
    runs each member's own check (:meth:`~sharefl.protocol.client_round.ClientRound.
    check_release`: the plan, with the clusters that member saw released as they were) and
    withholds a sum its members would refuse, instead of asking them in vain.

    With ``enforce`` off (``allow_leakage``, or no secure aggregation by design) every sum is
    approved and only recorded, for the realised audit.

    A cluster with a sparse neighbour graph reveals one sum per connected component of the
    graph induced on its survivors (:func:`~sharefl.protocol.audit.revealed_sums`): those
    sums are what is checked and recorded (``approved``), and what the members' views hold.
    Every audit resists ``colluders`` (:func:`round_colluders`).

    ``prior`` seeds it with the sums already released on the same model (earlier rounds,
    or a run that crashed, over the same clusterings): they count as approved, and as seen
    by their members at their positions, so every later check audits the union.

    A plan with atoms is checked by structure instead (A4 of :mod:`sharefl.protocol.atoms`,
    the rule its members apply): a sum is approved exactly when every sum its release
    reveals is a union of the plan's atoms.
    """

    def __init__(
        self,
        plan: RoundPlan,
        min_sum_size: int,
        *,
        plan_is_safe: bool,
        enforce: bool = True,
        client_views: bool = False,
        search_budget: int = DEFAULT_SEARCH_BUDGET,
        prior: Sequence[Release] = (),
        colluders: int = 0,
    ) -> None:
        self._plan = plan
        self._planned = {frozenset(row) for row in plan.rows()}
        self._min = min_sum_size
        self._plan_is_safe = plan_is_safe
        self._enforce = enforce
        self._client_views = client_views
        self._budget = search_budget
        self._colluders = colluders
        # client -> position -> the sums it saw released there (several: all kept)
        self._seen: dict[int, dict[tuple[int, int], tuple[frozenset[int], ...]]] = {}
        self.approved: list[frozenset[int]] = []
        # how many approved sets are not planned clusters: while it is 0 (and the plan
        # passed its audit) the approved row space is inside the audited one
        self._unplanned = 0
        for release in prior:
            row = frozenset(release.members)
            self._approve([row])
            for client in row:
                views = self._seen.setdefault(client, {})
                views[release.position] = (*views.get(release.position, ()), row)

    def check(
        self,
        members: Sequence[int],
        position: tuple[int, int] | None = None,
        neighbours: Mapping[int, frozenset[int]] | None = None,
    ) -> str | None:
        """``None`` (and the sums count as released from now on) or why it is withheld.
        ``position`` is the sum's (reclustering, cluster), needed for the members' views;
        ``neighbours`` its cluster's neighbour graph (``None``: complete)."""
        pieces = revealed_sums(members, neighbours)
        if not self._enforce:
            self._approve(pieces)
            return None
        if self._plan.atoms is not None:
            cut = sorted({a for piece in pieces for a in split_atoms(piece, self._plan.atoms)})
            if cut:
                return (
                    f"withheld: releasing {_sums(pieces)} would cut atoms {cut[:3]}: a sum "
                    "covers whole atoms only"
                )
            self._approve(pieces)
            return None
        planned = self._unplanned == 0 and all(p in self._planned for p in pieces)
        if not (self._plan_is_safe and planned):
            rows = [*self.approved, *pieces]
            report = audit_rows(
                linked_to(pieces, rows), self._min, self._budget, colluders=self._colluders
            )
            if report.leaks or not report.complete:
                return (
                    f"withheld: with the sums released so far, releasing "
                    f"{_sums(pieces)} would reveal {_revealed(report)}"
                )
        if self._client_views and position is not None:
            if pieces != [frozenset(self._plan.members(*position))]:
                for client in sorted(frozenset().union(*pieces)):
                    seen = {**self._seen.get(client, {}), position: tuple(pieces)}
                    report = audit_rows(
                        linked_to(pieces, plan_rows(self._plan, seen)),
                        self._min,
                        colluders=self._colluders,
                    )
                    if report.leaks or not report.complete:
                        return (
                            f"withheld: client {client} would refuse to unmask "
                            f"{_sums(pieces)}: by its own view of the round it would reveal "
                            f"{_revealed(report)}"
                        )
            for piece in pieces:
                for client in piece:
                    self._seen.setdefault(client, {})[position] = tuple(pieces)
        self._approve(pieces)
        return None

    def _approve(self, pieces: Sequence[frozenset[int]]) -> None:
        self._unplanned += sum(piece not in self._planned for piece in pieces)
        self.approved.extend(pieces)


def _sums(pieces: Sequence[frozenset[int]]) -> str:
    if len(pieces) == 1:
        return f"the sum of {sorted(pieces[0])}"
    return f"the sums of {[sorted(p) for p in pieces]} (neighbour graph components)"


def _revealed(report: LeakageReport) -> str:
    """What a leaking (or unfinished) audit found, in a few words."""
    if report.recoverable_clients:
        what = f"updates of {list(report.recoverable_clients)}"
    elif report.recoverable_small_sums:
        what = f"sums {[list(s) for s in report.recoverable_small_sums]}"
    else:
        what = "nothing yet, but the audit could not finish (search budget exhausted)"
    return f"{what} (min_sum_size {report.min_sum_size})"


class RoundCoordinator:
    """One round of secure aggregation over any transport (see the module docstring).

    Args:
        settings: the round's rules.
        round: the round number (bound into every key and message through the plan).
        participants: the clients taking part.
        length: the number of ring elements of every input.
        rng: randomness for the plan and the SecAgg+ graphs (a deployment passes one seeded
            by the operating system; a simulation its seeded generator).
        directory: client id → Ed25519 public key (signed mode: adverts and consistency
            signatures are checked on receipt).
        clusterings: explicit clusterings instead of drawing them (a round over a model an
            earlier round used passes that round's clusterings: see the module docstring).
        encoding: the fixed-point encoding of float inputs; default: chosen from
            ``settings.clip`` for :data:`RANGE_HEADROOM` × the largest planned cluster
            (``None`` when clip is None).
        prior_releases: the sums already released on this round's model (seed the release
            audit, :class:`ReleaseAuditor`); with them, pass the clusterings they were
            released under.
        on_release: called with each :class:`Release` as it is approved (before the unmask
            requests that release it leave :meth:`advance`) and again with its sum once
            computed (in :meth:`close_reclustering`). An exception it raises propagates:
            the release is then never requested (a transport's "persist, then release").
        atom_partition: the round's atoms (a partition of ``participants``; :mod:`sharefl.protocol.
            atoms`): clusters group whole atoms, the plan carries them, an atom with a
            member missing leaves its cluster's sum whole, and releases are checked by
            structure. ``None``: per-client clusters.
        keys: client id → its long-term :class:`~sharefl.protocol.keys.KeyAdvert`, which
            the two-exchange round (``settings.key_setup``) relays in every assignment: each
            participant needs one (checked by the transport when it accepted the advert:
            :func:`~sharefl.protocol.keys.check_key_advert`).

    Raises :class:`ConfigurationError` / :class:`LeakageError` as :func:`plan_round`, and
    :class:`ConfigurationError` for a two-exchange round with a participant without keys.
    """

    def __init__(
        self,
        settings: SecureAggregationSettings,
        *,
        round: int,
        participants: Sequence[int],
        length: int,
        rng: np.random.Generator,
        directory: Mapping[int, bytes] | None = None,
        clusterings: Sequence[Clustering] | None = None,
        encoding: RingEncoding | None = None,
        prior_releases: Sequence[Release] = (),
        on_release: Callable[[Release], None] | None = None,
        atom_partition: Atoms | None = None,
        keys: Mapping[int, KeyAdvert] | None = None,
    ) -> None:
        if length < 0:
            raise ConfigurationError(f"length must be >= 0, got {length}")
        self._keys = dict(keys or {})
        if settings.secure and settings.key_setup is KeySetup.ONCE:
            missing = sorted(set(participants) - set(self._keys))
            if missing:
                raise ConfigurationError(
                    f"the two-exchange round relays every member's long-term keys: clients "
                    f"{missing[:5]} advertised none"
                )
        self.settings = settings
        self.length = length
        self._rng = rng
        self._directory = dict(directory or {})
        self.plan, self.planned_audit = plan_round(
            round, participants, settings, rng, clusterings, atom_partition=atom_partition
        )
        self.colluders = round_colluders(self.plan.clusterings, settings) if settings.secure else 0
        largest = max(max(c.sizes) for c in self.plan.clusterings)
        if encoding is None and settings.clip is not None:
            try:
                encoding = choose_encoding(
                    settings.clip, largest * RANGE_HEADROOM, bits=settings.bits
                )
            except EncodingError as exc:
                raise ConfigurationError(str(exc)) from exc
        if encoding is not None and (
            encoding.bits != settings.bits or encoding.max_summands < largest
        ):
            raise ConfigurationError(
                f"the encoding ({encoding.bits} bits, up to {encoding.max_summands} summands) "
                f"does not fit {settings.bits}-bit clusters of up to {largest} clients"
            )
        self.encoding = encoding
        self._release = ReleaseAuditor(
            self.plan,
            settings.min_sum_size,
            plan_is_safe=not self.planned_audit.leaks,
            enforce=settings.secure and not settings.allow_leakage,
            client_views=settings.signed,
            prior=prior_releases,
            colluders=self.colluders,
        )
        self._on_release = on_release
        self.culprits: dict[int, str] = {}
        self._results: list[ReclusteringResult] = []
        self._sessions: dict[int, ServerSession] = {}
        self._clear: dict[int, ClusterSum | FailedCluster] = {}
        self._cluster_of: dict[int, int] = {}
        self._open = False

    # -- reclusterings ----------------------------------------------------------------------

    @property
    def reclustering(self) -> int:
        """The index of the current (or next) reclustering."""
        return len(self._results)

    @property
    def done(self) -> bool:
        return len(self._results) == self.plan.reclusterings

    @property
    def reclustering_done(self) -> bool:
        """Every cluster of the open reclustering has an outcome."""
        return all(s.outcome is not None for s in self._sessions.values())

    def open_reclustering(self) -> dict[int, ClusterAssignment]:
        """Start the next reclustering; returns each member's assignment (clusters of one
        client, possible only with cluster_size 1, run no protocol: see
        :meth:`release_in_clear`)."""
        if self._open or self.done:
            raise StageError("close the open reclustering first, or the round is done")
        r = self.reclustering
        self._sessions, self._clear, self._cluster_of = {}, {}, {}
        assignments: dict[int, ClusterAssignment] = {}
        for index, members in enumerate(self.plan.clusterings[r].clusters):
            if len(members) == 1:
                continue
            context = replace(self.plan.context(r, index), version=self.settings.version)
            assignment = plan_assignment(
                context,
                members,
                length=self.length,
                bits=self.settings.bits,
                threshold=self.settings.threshold,
                neighbour_degree=self.settings.neighbour_degree,
                signed=self.settings.signed,
                rng=self._rng,
                raise_to_floor=self.settings.raise_threshold_to_floor,
            )
            if context.version == TWO_EXCHANGE_VERSION:
                degree = max(len(assignment.neighbours_of(c)) for c in assignment.members)
                if degree > MAX_DEALT_PEERS:
                    raise ConfigurationError(
                        f"a two-exchange client deals shares to at most {MAX_DEALT_PEERS} "
                        f"neighbours; a cluster of {len(members)} gives {degree}: use smaller "
                        "clusters or secure_aggregation.neighbour_degree"
                    )
                assignment = replace(
                    assignment, keys=tuple(self._keys[c] for c in assignment.members)
                )
            self._sessions[index] = ServerSession(
                assignment,
                self._directory,
                self._approver((r, index), assignment.neighbours),
                atoms=self.plan.atoms,
            )
            for cid in members:
                self._cluster_of[cid] = index
                assignments[cid] = assignment
        self._open = True
        return assignments

    def _approver(
        self,
        position: tuple[int, int],
        neighbours: Mapping[int, frozenset[int]] | None = None,
    ) -> Callable[[Sequence[int]], str | None]:
        """The release check of the cluster at ``position`` (with its neighbour graph): the
        audit, then (approved) ``on_release`` before the session may return its unmask
        requests — once per sum the release reveals (:func:`~sharefl.protocol.audit.
        revealed_sums`: one with a complete graph, one per component of the survivors'
        graph otherwise), so a transport that journals approvals journals what the server
        can learn and seeds later audits with it."""

        def approve(members: Sequence[int]) -> str | None:
            withheld = self._release.check(members, position, neighbours)
            if withheld is None and self._on_release is not None:
                for piece in revealed_sums(members, neighbours):
                    self._on_release(Release(self.plan.round, *position, tuple(sorted(piece))))
            return withheld

        return approve

    def assignment_of(self, client: int) -> ClusterAssignment | None:
        """The open reclustering's assignment of ``client`` (None if it has none)."""
        index = self._cluster_of.get(client)
        return None if index is None else self._sessions[index].assignment

    # -- messages ---------------------------------------------------------------------------

    def receive(self, sender: int, message: ClientMessage) -> None:
        """Route one message from the authenticated ``sender`` to its cluster.

        Raises :class:`RejectedMessage` (and names the sender a culprit when
        ``misbehaviour``) for a message claiming another sender, of another cluster or plan
        of this round, of a later round, or that its cluster's session rejects.

        Late messages are rejected with ``misbehaviour=False`` (the transport drops them,
        nobody is named): a message of an *earlier round* (any context whose round is below
        this plan's), of an earlier reclustering of this plan, or of a stage its cluster
        has closed. An honest client paused past a stage deadline, or behind a network that
        delays its packets, sends exactly these; they cannot reach this round's sums (their
        keys are bound to another round or cluster), so dropping them costs nothing and
        naming their sender would exclude honest clients.
        """
        claimed = getattr(message, "sender", None)
        try:
            if claimed != sender:
                raise RejectedMessage(f"client {sender} sent a message as client {claimed}", sender)
            context = getattr(message, "context", None)
            if context is not None and context.round < self.plan.round:
                raise RejectedMessage(
                    f"client {sender}: a message of round {context.round} arrived in round "
                    f"{self.plan.round} (wire numbers, from 0)",
                    sender,
                    misbehaviour=False,
                )
            index = self._cluster_of.get(sender)
            if not self._open or index is None:
                raise RejectedMessage(
                    f"client {sender} has no open cluster", sender, misbehaviour=False
                )
            if context != self._sessions[index].context:
                stale = (
                    context is not None
                    and context.plan == self.plan.digest()
                    and context.reclustering < self.reclustering
                )
                raise RejectedMessage(
                    f"client {sender}: message for {context}, but its cluster is "
                    f"{self._sessions[index].context}",
                    sender,
                    misbehaviour=not stale,
                )
            self._sessions[index].receive(message)
        except RejectedMessage as exc:
            if exc.misbehaviour:
                self.name_culprit(sender, f"sent a rejected message: {exc}")
            raise

    def withdraw(self, sender: int, context: KeyContext) -> bool:
        """The authenticated ``sender`` refused the cluster of ``context``: if that is its
        open cluster, stop waiting for it there (:meth:`ServerSession.withdraw`) and
        return True; a refusal of anything else (an earlier round or reclustering, a
        cluster it is not in) changes nothing and returns False. A client can only
        withdraw itself, from its own cluster."""
        index = self._cluster_of.get(sender)
        if not self._open or index is None or self._sessions[index].context != context:
            return False
        self._sessions[index].withdraw(sender)
        return True

    def name_culprit(self, client: int, reason: str) -> None:
        """Record ``client`` as misbehaving (the first reason is kept). Transports call this
        for what they alone can see (undecodable bytes, oversized messages)."""
        self.culprits.setdefault(client, reason)

    @property
    def stage(self) -> str:
        """The stage the open clusters are in (that of the first unfinished one)."""
        for session in self._sessions.values():
            if session.outcome is None:
                return session.state.value
        return "done"

    def waiting_for(self) -> frozenset[int]:
        """Clients whose message for the current stage has not arrived yet."""
        return frozenset().union(
            *(s.waiting_for() for s in self._sessions.values() if s.outcome is None)
        )

    def advance(self) -> dict[int, ServerMessage]:
        """Close the current stage of every unfinished cluster (the caller decides when:
        all messages in, or its deadline passed); returns each client's next message."""
        outgoing: dict[int, ServerMessage] = {}
        for session in self._sessions.values():
            if session.outcome is None:
                outgoing.update(session.advance())
        return outgoing

    # -- results ----------------------------------------------------------------------------

    def release_in_clear(self, sums: Mapping[int, np.ndarray | None]) -> None:
        """Protocol-free sums for the open reclustering (cluster_size 1 by design, or an
        ablation that adds encoded inputs in the clear): ``sums[cluster] = ring sum``, or
        ``None`` when a member dropped out. They pass the same release check as protocol
        sums, and replace the cluster's protocol session."""
        if not self._open:
            raise StageError("open a reclustering first")
        r = self.reclustering
        for index, ring in sums.items():
            members = self.plan.clusterings[r].clusters[index]
            if self._sessions.pop(index, None) is not None:
                for cid in members:
                    self._cluster_of.pop(cid, None)
            if ring is None:
                self._clear[index] = FailedCluster(index, members, "advertise", "client dropped")
                continue
            withheld = self._approver((r, index))(members)
            self._clear[index] = (
                FailedCluster(index, members, "release", withheld)
                if withheld is not None
                else ClusterSum(index, members, ring)
            )

    def close_reclustering(self) -> ReclusteringResult:
        """Decode the open reclustering's sums, flag the corrupted ones, collect culprits."""
        if not self._open or not self.reclustering_done:
            raise StageError("the open reclustering has clusters without an outcome")
        r = self.reclustering
        outcomes = {i: s.outcome for i, s in self._sessions.items()} | self._clear
        sums, failed, corrupted = [], [], []
        for index in sorted(outcomes):
            outcome = outcomes[index]
            if isinstance(outcome, FailedCluster):
                failed.append(outcome)
                for culprit in outcome.culprits:
                    self.name_culprit(culprit, f"cluster {r}/{index} failed: {outcome.reason}")
                continue
            assert isinstance(outcome, ClusterSum)
            # outcome.excluded (disowned by every peer) is left out of the sum, not named:
            # m - 1 lying peers can disown an honest member (docs/security.md).
            if self.encoding is not None:
                try:
                    values = decode(outcome.ring_sum, self.encoding, len(outcome.members))
                except SumOutOfRange as exc:
                    corrupted.append(CorruptedCluster(index, outcome.members, str(exc)))
                    continue
                outcome = replace(outcome, decoded=values)
            sums.append(outcome)
            if self._on_release is not None:
                self._on_release(
                    Release(self.plan.round, r, index, tuple(outcome.members), outcome.sum)
                )
        result = ReclusteringResult(r, self.plan.clusterings[r], sums, failed, corrupted)
        self._results.append(result)
        self._open = False
        self._sessions, self._clear, self._cluster_of = {}, {}, {}
        return result

    def result(self) -> RoundResult:
        """The round's results (after the last reclustering closed). The realised audit
        covers every sum released on the model: this round's and ``prior_releases``."""
        if not self.done:
            raise StageError(f"{self.plan.reclusterings - self.reclustering} reclusterings left")
        realised = audit(
            [Clustering((tuple(sorted(row)),)) for row in self._release.approved],
            client_ids=self.plan.participants,
            min_sum_size=self.settings.min_sum_size,
            colluders=self.colluders,
        )
        return RoundResult(
            self.plan, self._results, self.planned_audit, realised, self.encoding, self.culprits
        )


@dataclass
class Exclusions:
    """The exclusion policy across rounds: a client named a culprit in ``after`` rounds is
    left out of every later round (``after = 0``: never exclude).

    Attributes:
        strikes: client id → rounds in which it was named.
        reasons: client id → the last reason.
    """

    after: int = 1
    strikes: dict[int, int] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)

    def record(self, culprits: Mapping[int, str]) -> None:
        for client, reason in culprits.items():
            self.strikes[client] = self.strikes.get(client, 0) + 1
            self.reasons[client] = reason

    @property
    def excluded(self) -> frozenset[int]:
        if self.after <= 0:
            return frozenset()
        return frozenset(c for c, n in self.strikes.items() if n >= self.after)

    def eligible(self, clients: Sequence[int]) -> list[int]:
        """``clients`` without the excluded ones, sorted."""
        return sorted(set(clients) - self.excluded)
