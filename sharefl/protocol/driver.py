"""In-process driver: moves messages between the client state machines and the server side.

:func:`secure_sum` runs a whole SHARE round in this process — the
:class:`~sharefl.protocol.coordinator.RoundCoordinator` plans, audits, encodes, routes and
releases; this module only plays the clients (with simulated drop-outs) and carries their
messages (:class:`_Players`), driven by the one drive loop of every transport
(:mod:`sharefl.protocol.drive`). :func:`run_cluster` runs one :class:`ServerSession`
alone, for tests of a single cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from sharefl.crypto.encoding import RingEncoding, encode
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol.atoms import Atoms
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering, as_generator
from sharefl.protocol.coordinator import RoundCoordinator, RoundResult, plan_round
from sharefl.protocol.drive import StageObserver, server_exchanges, stage_messages
from sharefl.protocol.errors import ClientRefusal, ConfigurationError, RejectedMessage
from sharefl.protocol.isolation import Suspicion
from sharefl.protocol.keys import ClientKeys, KeyAdvert
from sharefl.protocol.messages import (
    ClientMessage,
    ClusterAssignment,
    ConsistencyRequest,
    KeysBroadcast,
    MaskingRequest,
    ServerMessage,
    UnmaskRequest,
)
from sharefl.protocol.server import ClusterSum, FailedCluster, ServerSession, ServerState
from sharefl.protocol.settings import (
    KeySetup,
    Planner,
    SecureAggregationSettings,
    settings_from,
)

STAGES = ("advertise", "share", "mask", "consistency", "unmask")
"""Drop-out points: a client listed under a stage vanishes before sending that stage's
message (``consistency`` exists only in signed mode)."""

_REPLY_STAGE = {
    KeysBroadcast: "share",
    MaskingRequest: "mask",
    ConsistencyRequest: "consistency",
    UnmaskRequest: "unmask",
}

Dropouts = Mapping[str, Collection[int]]
Observer = Callable[[str, int | None, float], None]
"""``observer(stage, client_id or None for the server, seconds)``: called after every
client transition and every server stage close, with its wall time (for benchmarks and
progress displays)."""

SecureSumResult = RoundResult
"""What :func:`secure_sum` returns (one round's :class:`RoundResult`)."""


@dataclass(frozen=True)
class ClusterEvents:
    """What happened to the clients of one cluster besides the outcome (for reports)."""

    refusals: dict[int, str] = field(default_factory=dict)
    rejected: dict[int, str] = field(default_factory=dict)


def _check_dropouts(dropouts: Dropouts) -> None:
    unknown = set(dropouts) - set(STAGES)
    if unknown:
        raise ConfigurationError(f"unknown drop-out stages {sorted(unknown)}; use {STAGES}")


def run_cluster(
    assignment: ClusterAssignment,
    vectors: Mapping[int, np.ndarray],
    *,
    dropouts: Dropouts | None = None,
    policies: Mapping[int, ClientPolicy] | None = None,
    directory: Mapping[int, bytes] | None = None,
    observer: Observer | None = None,
) -> tuple[ClusterSum | FailedCluster, ClusterEvents]:
    """Run one cluster's :class:`ServerSession` to its end in this process.

    Args:
        assignment: the cluster (members, threshold, length, bits, mode).
        vectors: each member's input in Z_2^b (1-D uint32/uint64, ``assignment.length``).
        dropouts: stage name → clients that vanish before sending that stage's message.
        policies: each client's policy (default :class:`ClientPolicy()`).
        directory: identity public keys for the server's early signature checks.
        observer: called with the wall time of every client and server step.

    Returns:
        The outcome (:class:`ClusterSum` or :class:`FailedCluster`) and the refusals and
        rejections that happened on the way (the affected clients count as dropped).
    """
    _check_dropouts(dropouts or {})
    server = ServerSession(assignment, directory)
    events = ClusterEvents()
    players = _Players(
        lambda sender, message: server.receive(message),
        dropouts or {},
        observer,
        lambda cid: events,
    )
    assignments = dict.fromkeys(assignment.members, assignment)
    players.open(_sessions(assignments, vectors, policies, lambda cid: events))
    for messages in stage_messages(
        server.advance,
        lambda: server.outcome is not None,
        lambda: server.state.value,
        _server_observer(observer),
    ):
        players.answer(messages)
    assert server.state in (ServerState.DONE, ServerState.FAILED) and server.outcome is not None
    return server.outcome, events


def _server_observer(observer: Observer | None) -> StageObserver | None:
    """``observer`` as the drive loop's stage observer (the server as actor ``None``)."""
    if observer is None:
        return None
    return lambda stage, seconds: observer(stage, None, seconds)


def _sessions(
    assignments: Mapping[int, ClusterAssignment],
    vectors: Mapping[int, np.ndarray],
    policies: Mapping[int, ClientPolicy] | None,
    events_of: Callable[[int], ClusterEvents],
    guards: Mapping[int, ClientRound] | None = None,
    keys: Mapping[int, ClientKeys] | None = None,
) -> dict[int, ClientSession]:
    """A session per assigned client (vetted by its round guard when it has one, with its
    long-term ``keys`` when it has some); a client that refuses its assignment is
    recorded."""
    policies, guards, keys = policies or {}, guards or {}, keys or {}
    clients: dict[int, ClientSession] = {}
    for cid, assignment in assignments.items():
        try:
            if cid in guards:
                clients[cid] = guards[cid].session(assignment, vectors[cid], keys=keys.get(cid))
            elif not guards:
                clients[cid] = ClientSession(
                    cid, assignment, vectors[cid], policies.get(cid), keys=keys.get(cid)
                )
        except ClientRefusal as exc:
            events_of(cid).refusals[cid] = str(exc)
    return clients


class _Players:
    """This process's transport: it plays the clients of one reclustering (or one
    cluster) and hands their messages to the server side at once.

    Drop-outs (stage → clients that vanish before sending that stage's message),
    refusals and rejections are recorded in each client's cluster events; the clients
    concerned count as dropped."""

    def __init__(
        self,
        deliver: Callable[[int, ClientMessage], None],
        dropouts: Dropouts,
        observer: Observer | None,
        events_of: Callable[[int], ClusterEvents],
        guards: Mapping[int, ClientRound] | None = None,
    ) -> None:
        self._deliver = deliver
        self._dropouts = dropouts
        self._observe = observer or (lambda stage, actor, seconds: None)
        self._events_of = events_of
        self._guards = guards or {}
        self._sessions: dict[int, ClientSession] = {}
        self._gone: set[int] = set()

    def open(self, sessions: Mapping[int, ClientSession]) -> None:
        """Play ``sessions`` (client id → its new session); send the first reply (the
        advert, or the two-exchange round's masked input) of those that stay."""
        self._sessions = dict(sessions)
        self._gone = set(self._dropouts.get("advertise", ()))
        for cid, client in self._sessions.items():
            # Two-exchange: the first reply is the masked input, so a client that vanishes
            # before any of the first three stages sends nothing.
            before = ("advertise", "share", "mask") if client.two_exchange else ("advertise",)
            if any(cid in self._dropouts.get(stage, ()) for stage in before):
                self._gone.add(cid)
            if cid in self._gone:
                continue
            stage = "mask" if client.two_exchange else "advertise"
            try:
                start = time.perf_counter()
                reply = client.start()
                self._observe(stage, cid, time.perf_counter() - start)
            except ClientRefusal as exc:
                self._events_of(cid).refusals[cid] = str(exc)
                continue
            self._send(cid, reply)

    def answer(self, messages: Mapping[int, ServerMessage]) -> None:
        """Each addressed client's reply (through its round guard when it has one)."""
        for cid, message in messages.items():
            reply_stage = _REPLY_STAGE[type(message)]
            self._gone |= set(self._dropouts.get(reply_stage, ()))
            if cid in self._gone or cid not in self._sessions:
                continue
            try:
                start = time.perf_counter()
                guard = self._guards.get(cid)
                session = self._sessions[cid]
                reply = guard.handle(session, message) if guard else session.handle(message)
                self._observe(reply_stage, cid, time.perf_counter() - start)
            except ClientRefusal as exc:
                self._events_of(cid).refusals[cid] = str(exc)
                continue
            self._send(cid, reply)

    def _send(self, cid: int, message: ClientMessage) -> None:
        try:
            self._deliver(cid, message)
        except RejectedMessage as exc:
            self._events_of(cid).rejected[cid] = str(exc)


MAX_CLIENT_ID = 2**64 - 1
"""The largest client id: ids are unsigned 64-bit everywhere they are bound (the key
derivation's :class:`~sharefl.crypto.kdf.KeyContext` info, the plan digest, the wire's
``uint64`` fields)."""


def _client_ids(inputs: Mapping[Any, np.ndarray]) -> dict[int, np.ndarray]:
    """``inputs`` keyed by Python ints, or :class:`ConfigurationError` naming every id that
    is not an integer in [0, 2^64) (bools, floats, numpy floats and strings are refused,
    even when they equal an integer: ``True`` or ``3.0`` is a mistake, not an id; numpy
    integers are accepted)."""
    bad = [
        cid
        for cid in inputs
        if isinstance(cid, bool | np.bool_)
        or not isinstance(cid, int | np.integer)
        or not 0 <= int(cid) <= MAX_CLIENT_ID
    ]
    if bad:
        shown = ", ".join(repr(cid) for cid in bad[:10])
        raise ConfigurationError(
            f"client ids must be integers in [0, 2^64); got {shown}"
            + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
            + ": key the inputs by non-negative int ids"
        )
    return {int(cid): x for cid, x in inputs.items()}


def _ring_inputs(
    inputs: Mapping[int, np.ndarray], bits: int | None, encoding: RingEncoding | None
) -> tuple[dict[int, np.ndarray], int, bool]:
    """Check the inputs; return them as arrays, the ring width b, and whether they are
    floats (to be encoded) rather than ring elements."""
    arrays = {cid: np.asarray(x) for cid, x in inputs.items()}
    lengths = {a.shape for a in arrays.values()}
    if any(a.ndim != 1 for a in arrays.values()) or len(lengths) != 1:
        raise ConfigurationError(f"inputs must be 1-D vectors of one length; got {lengths}")
    dtypes = {a.dtype for a in arrays.values()}
    if len(dtypes) != 1:
        raise ConfigurationError(f"inputs must share one dtype; got {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    if dtype in (np.uint32, np.uint64):
        width = dtype.itemsize * 8
        if bits is not None and bits != width:
            raise ConfigurationError(f"{dtype} inputs are summed mod 2^{width}, not 2^{bits}")
        if encoding is not None:
            raise ConfigurationError("integer inputs are not encoded; drop encoding=")
        return arrays, width, False
    if dtype.kind != "f":
        raise ConfigurationError(f"inputs must be uint32, uint64 or float; got {dtype}")
    width = encoding.bits if encoding is not None else bits or 32
    if bits is not None and bits != width:
        raise ConfigurationError(f"the encoding is {width}-bit; bits={bits} disagrees")
    return arrays, width, True


def _per_reclustering_dropouts(
    dropouts: Dropouts | Sequence[Dropouts] | None, reclusterings: int
) -> list[Dropouts]:
    if dropouts is None:
        return [{}] * reclusterings
    if isinstance(dropouts, Mapping):
        return [dropouts] * reclusterings
    if len(dropouts) != reclusterings:
        raise ConfigurationError(
            f"dropouts lists {len(dropouts)} reclusterings; expected {reclusterings}"
        )
    return list(dropouts)


def secure_sum(
    inputs: Mapping[int, np.ndarray],
    settings: SecureAggregationSettings | None = None,
    *,
    dropouts: Dropouts | Sequence[Dropouts] | None = None,
    seed: int | np.random.Generator | None = None,
    encoding: RingEncoding | None = None,
    clusterings: Sequence[Clustering] | None = None,
    round: int = 0,
    observer: Observer | None = None,
    protocol: bool = True,
    policies: Mapping[int, ClientPolicy] | None = None,
    byzantine_inputs: Mapping[int, np.ndarray] | None = None,
    suspicion: Suspicion | None = None,
    atom_partition: Atoms | None = None,
    client_keys: Mapping[int, ClientKeys] | None = None,
    **keywords: Any,
) -> RoundResult:
    """Securely sum ``inputs`` inside random clusters, R times, in this process.

    The round's rules are ``settings`` (:class:`~sharefl.protocol.settings.
    SecureAggregationSettings`), or its keywords (``cluster_size=5, clip=1.0, ...``: every
    field of that type, with its defaults, except two that follow the inputs in this
    form: ``bits`` defaults to the width of integer inputs (32 for floats), and ``clip``
    to none, so float inputs must name their bound: an in-process call never clips at a
    bound it was not given). Pass one of the two forms.

    ``settings.clip`` applies to float inputs only (its contract): integer inputs, and
    float inputs with an explicit ``encoding``, reach the coordinator with ``clip=None``.

    Args:
        inputs: client id → 1-D vector. uint32/uint64 vectors are summed exactly modulo
            2^32/2^64 (``settings.bits`` must be their width); float vectors are encoded
            (``encoding``, or ``settings.clip`` with the largest safe scale) and the sums
            decoded to float64.
        settings: the rules (cluster size m — 1: no secure aggregation; ≥ n: one cluster,
            plain SecAgg —, R reclusterings, threshold, ring, signed mode, SecAgg+ degree,
            min_sum_size, planner, allow_leakage, colluders).
        dropouts: stage → clients that vanish before sending that stage's message (applies
            to every reclustering), or one such mapping per reclustering.
        seed: seeds the clustering and the stochastic rounding (keys are always fresh).
        encoding: the fixed-point encoding of float inputs, instead of one chosen from
            ``clip``.
        clusterings: explicit clusterings (one per reclustering) instead of planned ones.
        round: the round number bound into every key and message.
        observer: called with the wall time of every client and server step.
        protocol: ``False`` adds each cluster's encoded inputs in the clear instead of
            running the protocol (ablations): the plan, encoding and stochastic rounding
            are drawn exactly as with the protocol, so the ring sums are identical, and the
            same release check applies; drop-outs and signing need the protocol.
        policies: each client's :class:`ClientPolicy`. Default: clients that accept what
            the settings ask (clusters and sums of at least ``min_sum_size``, up to R
            reclusterings); signed mode makes fresh identities and a directory. Every
            client checks the round plan and each assignment and unmask request with its
            :class:`~sharefl.protocol.client_round.ClientRound` (not with
            ``allow_leakage``, whose plans honest clients would refuse).
        byzantine_inputs: client id → the ring vector (of the ring's dtype and the inputs'
            length) that Byzantine client masks instead of its encoded input: any value,
            in or out of the honest range.
        suspicion: the history of flagged clusters across rounds
            (:class:`~sharefl.protocol.isolation.Suspicion`): with planner
            :data:`Planner.ISOLATE` the plan spreads its suspects, and the round's outcome
            is recorded into it before this returns (``suspicion.pinned`` then names a
            client the flags point to, if any).
        atom_partition: the round's atoms (:mod:`sharefl.protocol.atoms`), a partition of the
            inputs' client ids that the caller keeps across rounds: every cluster groups
            whole atoms, an atom with a drop-out leaves its cluster's sum whole, and the
            clients check their atoms. ``None``: per-client clusters.
        client_keys: the clients' long-term keys for the two-exchange round
            (``settings.key_setup``; :mod:`sharefl.protocol.keys`), which a caller keeps
            across rounds as clients keep theirs; ``None``: fresh keys for this call. The
            server side gets their adverts (signed with the clients' identities in signed
            mode).
        keywords: the fields of :class:`SecureAggregationSettings` (without ``settings``).

    Returns:
        The :class:`RoundResult`: per reclustering the released (decoded) sums, the failed,
        withheld and corrupted clusters, the audits, and the culprits.

    Raises:
        LeakageError: the planned clusterings leak and ``allow_leakage`` is False.
        ConfigurationError: inconsistent inputs or parameters, both a settings object and
            keywords, an unknown keyword, or client ids that are not integers in [0, 2^64)
            (named in the message); :class:`~sharefl.protocol.settings.SettingsError` for
            a setting that cannot run.
    """
    if not inputs:
        raise ConfigurationError("no inputs")
    inputs = _client_ids(inputs)
    bits, clip, signed, keywords = _requested(settings, keywords)
    if not protocol and (dropouts or signed):
        raise ConfigurationError("dropouts and signed mode need protocol=True")
    arrays, width, floats = _ring_inputs(inputs, bits, encoding)
    settings = _round_settings(
        settings, keywords, clip, width=width, floats=floats, encoding=encoding
    )
    rng = as_generator(seed)
    ids = sorted(arrays)
    accepting = _accepting_policy(settings, len(ids))
    policies, directory = _identities(settings, ids, policies, accepting)
    if suspicion is not None and clusterings is None and settings.planner is Planner.ISOLATE:
        plan, _ = plan_round(round, ids, settings, rng, suspicion=suspicion)
        clusterings = plan.clusterings
    keys = _long_term_keys(settings, ids, client_keys)
    coordinator = RoundCoordinator(
        settings,
        round=round,
        participants=ids,
        length=next(iter(arrays.values())).shape[0],
        rng=rng,
        directory=directory,
        clusterings=clusterings,
        encoding=encoding,
        atom_partition=atom_partition,
        keys=_adverts(keys, policies),
    )
    guards: dict[int, ClientRound] = {}
    plan_refusals: dict[int, str] = {}
    if protocol and settings.secure and not settings.allow_leakage:
        guards, plan_refusals = _round_guards(coordinator, ids, policies, accepting)
    vectors = _encoded(arrays, coordinator, rng) if floats else arrays
    _replace_byzantine(vectors, byzantine_inputs or {})
    clients = _Clients(policies, guards, plan_refusals, keys)
    drops = _per_reclustering_dropouts(dropouts, settings.reclusterings)
    for stage_drops in drops:
        _check_dropouts(stage_drops)
    result = _play_round(coordinator, vectors, drops, protocol, clients, observer)
    if suspicion is not None:
        suspicion.record(result)
    return result


# -- the parts of secure_sum, in the order it runs them ---------------------------------


def _requested(
    settings: SecureAggregationSettings | None, keywords: Mapping[str, Any]
) -> tuple[int | None, float | None, bool, dict[str, Any]]:
    """What the caller asked for before the inputs are seen: the ring width b (``None``:
    the inputs' own), the bound of float inputs (``None``: none given), signed mode, and
    the other keywords. The object form refuses keywords beside it
    (:func:`~sharefl.protocol.settings.settings_from`); the keyword form is validated
    only once the inputs fixed ``bits`` and ``clip`` (:func:`_round_settings`)."""
    if settings is None:
        rest = dict(keywords)
        bits = rest.pop("bits", None)
        clip = rest.pop("clip", None)
        return bits, clip, bool(rest.get("signed", False)), rest
    settings_from(settings, keywords)  # refuses keywords beside the object
    return settings.bits, settings.clip, settings.signed, {}


def _round_settings(
    settings: SecureAggregationSettings | None,
    keywords: Mapping[str, Any],
    clip: float | None,
    *,
    width: int,
    floats: bool,
    encoding: RingEncoding | None,
) -> SecureAggregationSettings:
    """The settings the coordinator gets: ``settings`` (plain type) or the keywords with
    the inputs' ring ``width``; ``clip`` only for float inputs encoded from it (the
    contract of ``settings.clip``), ``None`` otherwise. Raises
    :class:`ConfigurationError` for float inputs with neither a bound nor an encoding."""
    if floats and encoding is None and clip is None:
        raise ConfigurationError(
            "float inputs need clip= (per-coordinate bound) or encoding= to fix the "
            "fixed-point scale"
        )
    clip = clip if floats and encoding is None else None  # clip bounds float inputs only
    if settings is None:
        return settings_from(None, {**keywords, "bits": width, "clip": clip})
    return replace(settings_from(settings), clip=clip)


def _accepting_policy(settings: SecureAggregationSettings, participants: int) -> ClientPolicy:
    """The default client: one that accepts what ``settings`` ask of a round of
    ``participants`` clients (clusters and sums of at least ``min_sum_size``, up to R
    reclusterings)."""
    min_sum_size = settings.min_sum_size
    return ClientPolicy(
        min_cluster_size=min_sum_size,
        min_neighbours=min(ClientPolicy.min_neighbours, min_sum_size - 1),
        min_sum_size=min_sum_size,
        max_reclusterings=max(settings.reclusterings, ClientPolicy.max_reclusterings),
        max_participants=max(participants, ClientPolicy.max_participants),
        max_audit_work=None,  # the coordinator of this process audited the plan unbounded
    )


def _identities(
    settings: SecureAggregationSettings,
    ids: Sequence[int],
    policies: Mapping[int, ClientPolicy] | None,
    accepting: ClientPolicy,
) -> tuple[Mapping[int, ClientPolicy] | None, dict[int, bytes]]:
    """The clients' policies and the identity directory the coordinator signs against:
    in signed mode without ``policies``, fresh identities for ``accepting`` clients;
    otherwise ``policies`` as given and the identities they hold."""
    if settings.signed and not policies:
        identities = {cid: IdentityKey.generate() for cid in ids}
        directory = {cid: key.public for cid, key in identities.items()}
        signed = {
            cid: replace(accepting, identity=key, directory=directory)
            for cid, key in identities.items()
        }
        return signed, directory
    directory = {cid: p.identity.public for cid, p in (policies or {}).items() if p.identity}
    return policies, directory


def _long_term_keys(
    settings: SecureAggregationSettings,
    ids: Sequence[int],
    given: Mapping[int, ClientKeys] | None,
) -> Mapping[int, ClientKeys]:
    """The clients' long-term keys of a two-exchange round: ``given``, or fresh ones; none
    for the four-exchange round. Raises :class:`ConfigurationError` for keys missing or
    held under another client's id."""
    if settings.key_setup is not KeySetup.ONCE or not settings.secure:
        return {}
    if given is None:
        return {cid: ClientKeys.generate(cid) for cid in ids}
    wrong = sorted(cid for cid in ids if cid not in given or given[cid].client_id != cid)
    if wrong:
        raise ConfigurationError(f"client_keys lacks the keys of clients {wrong[:5]}")
    return given


def _adverts(
    keys: Mapping[int, ClientKeys], policies: Mapping[int, ClientPolicy] | None
) -> dict[int, KeyAdvert]:
    """Each client's key advert as the server receives it at key setup (signed with its
    identity when its policy has one)."""
    policies = policies or {}
    return {
        cid: k.advert(policies[cid].identity if cid in policies else None)
        for cid, k in keys.items()
    }


def _round_guards(
    coordinator: RoundCoordinator,
    ids: Sequence[int],
    policies: Mapping[int, ClientPolicy] | None,
    accepting: ClientPolicy,
) -> tuple[dict[int, ClientRound], dict[int, str]]:
    """Each client's check of the committed plan (:class:`ClientRound`, under its policy
    or ``accepting``): the guards of the clients that accept it, and the reasons of those
    that refuse it (they take no part)."""
    guards: dict[int, ClientRound] = {}
    refusals: dict[int, str] = {}
    for cid in ids:
        policy = (policies or {}).get(cid) or accepting
        try:
            guards[cid] = ClientRound(cid, coordinator.plan, policy)
        except ClientRefusal as exc:
            refusals[cid] = str(exc)
    return guards, refusals


def _encoded(
    arrays: Mapping[int, np.ndarray], coordinator: RoundCoordinator, rng: np.random.Generator
) -> dict[int, np.ndarray]:
    """Float inputs as ring vectors, in the coordinator's encoding (stochastic rounding
    from ``rng``, clients in id order)."""
    used = coordinator.encoding
    if used is None:  # the coordinator chooses one whenever settings.clip is set
        raise ConfigurationError("float inputs need settings.clip (it fixes the encoding)")
    return {cid: encode(x, used, rng) for cid, x in sorted(arrays.items())}


def _replace_byzantine(
    vectors: dict[int, np.ndarray], byzantine_inputs: Mapping[int, np.ndarray]
) -> None:
    """Put each Byzantine client's ring vector in place of its encoded input (in place).
    Raises :class:`ConfigurationError` for a client without an input, another dtype or
    another shape."""
    for cid, ring in byzantine_inputs.items():
        like = vectors.get(cid)
        if like is None or not isinstance(ring, np.ndarray) or ring.dtype != like.dtype:
            dtype = next(iter(vectors.values())).dtype
            raise ConfigurationError(
                f"the byzantine input of client {cid} must be a {dtype} vector "
                "of a client that has an input"
            )
        if ring.shape != like.shape:
            raise ConfigurationError(f"the byzantine input of client {cid} has the wrong shape")
        vectors[cid] = ring


@dataclass(frozen=True)
class _Clients:
    """The clients of a :func:`secure_sum` round: their policies, the round guards of
    those that accepted the plan, and the plan refusals of the others."""

    policies: Mapping[int, ClientPolicy] | None
    guards: dict[int, ClientRound]
    plan_refusals: dict[int, str]
    keys: Mapping[int, ClientKeys] = field(default_factory=dict)


def _play_round(
    coordinator: RoundCoordinator,
    vectors: Mapping[int, np.ndarray],
    drops: Sequence[Dropouts],
    protocol: bool,
    clients: _Clients,
    observer: Observer | None,
) -> RoundResult:
    """Drive the round (:func:`~sharefl.protocol.drive.server_exchanges`) with this
    process's clients: per reclustering, the clear sums (clusters of one client, or every
    cluster when not ``protocol``; none for a cluster with a drop-out anywhere), then the
    protocol in every other cluster; each reclustering's result carries its clusters'
    events (plan refusals included)."""
    events: list[dict[int, ClusterEvents]] = []
    players: _Players | None = None
    for outgoing in server_exchanges(coordinator, _server_observer(observer)):
        if not outgoing.opening:
            assert players is not None
            players.answer(cast(Mapping[int, ServerMessage], outgoing.messages))
            continue
        stage_drops = drops[outgoing.reclustering]
        _release_clear(coordinator, vectors, stage_drops, protocol)
        events.append({})
        players = _open_players(
            coordinator,
            cast(Mapping[int, ClusterAssignment], outgoing.messages) if protocol else {},
            vectors,
            stage_drops,
            clients,
            observer,
            events[-1],
        )
    result = coordinator.result()
    for reclustering, cluster_events in zip(result.reclusterings, events, strict=True):
        reclustering.events.update(cluster_events)
    return result


def _release_clear(
    coordinator: RoundCoordinator,
    vectors: Mapping[int, np.ndarray],
    drops: Dropouts,
    protocol: bool,
) -> None:
    """Release the open reclustering's protocol-free sums: the clusters of one client,
    or every cluster when not ``protocol``; ``None`` for one with a drop-out anywhere."""
    clustering = coordinator.plan.clusterings[coordinator.reclustering]
    dropped_anywhere = set().union(*map(set, drops.values())) if drops else set()
    coordinator.release_in_clear(
        {
            index: None if dropped_anywhere & set(members) else _clear_sum(members, vectors)
            for index, members in enumerate(clustering.clusters)
            if len(members) == 1 or not protocol
        }
    )


def _open_players(
    coordinator: RoundCoordinator,
    assignments: Mapping[int, ClusterAssignment],
    vectors: Mapping[int, np.ndarray],
    drops: Dropouts,
    clients: _Clients,
    observer: Observer | None,
    events: dict[int, ClusterEvents],
) -> _Players:
    """The reclustering's players, their sessions started and adverts sent; ``events``
    (cluster index → events) collects what happens to them."""
    cluster_of = {cid: a.context.cluster for cid, a in assignments.items()}

    def events_of(cid: int) -> ClusterEvents:
        return events.setdefault(cluster_of[cid], ClusterEvents())

    for cid in assignments.keys() & clients.plan_refusals.keys():
        events_of(cid).refusals[cid] = clients.plan_refusals[cid]
    players = _Players(coordinator.receive, drops, observer, events_of, clients.guards)
    players.open(
        _sessions(assignments, vectors, clients.policies, events_of, clients.guards, clients.keys)
    )
    return players


def _clear_sum(members: Sequence[int], vectors: Mapping[int, np.ndarray]) -> np.ndarray:
    """The ring sum of ``members``' inputs, added in the clear (wrapping modulo 2^b)."""
    ring = np.zeros_like(vectors[members[0]])
    for cid in members:
        ring += vectors[cid]  # unsigned arithmetic wraps modulo 2^b
    return ring
