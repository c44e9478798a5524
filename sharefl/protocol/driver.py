"""In-process driver: moves messages between the client and server state machines.

:func:`run_cluster` runs one cluster with simulated drop-outs; :func:`secure_sum` runs a
whole SHARE round (random clusters, R reclusterings, leakage audit) for simulation, tests
and as the reference the gRPC runtime must agree with.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from sharefl.crypto.encoding import RingEncoding, choose_encoding, decode, encode
from sharefl.crypto.kdf import KeyContext
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.audit import LeakageReport, audit
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.clustering import (
    Clustering,
    ClusteringError,
    as_generator,
    random_clustering,
)
from sharefl.protocol.errors import ClientRefusal, ConfigurationError, LeakageError, RejectedMessage
from sharefl.protocol.messages import (
    ClusterAssignment,
    ConsistencyRequest,
    KeysBroadcast,
    MaskingRequest,
    UnmaskRequest,
)
from sharefl.protocol.server import ClusterSum, FailedCluster, ServerSession, ServerState

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
    """Run one cluster to its end in this process.

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
    dropouts = dropouts or {}
    _check_dropouts(dropouts)
    policies = policies or {}
    events = ClusterEvents()
    server = ServerSession(assignment, directory)
    clients: dict[int, ClientSession] = {}
    for cid in assignment.members:
        try:
            clients[cid] = ClientSession(cid, assignment, vectors[cid], policies.get(cid))
        except ClientRefusal as exc:
            events.refusals[cid] = str(exc)
    observe = observer or (lambda stage, actor, seconds: None)
    gone = set(dropouts.get("advertise", ()))
    for cid, client in clients.items():
        if cid not in gone:
            start = time.perf_counter()
            advert = client.advertise()
            observe("advertise", cid, time.perf_counter() - start)
            _deliver(server, advert, events)
    stage = server.state.value
    start = time.perf_counter()
    outgoing = server.advance()
    observe(stage, None, time.perf_counter() - start)
    while outgoing:
        for cid, message in outgoing.items():
            reply_stage = _REPLY_STAGE[type(message)]
            gone |= set(dropouts.get(reply_stage, ()))
            if cid in gone or cid not in clients:
                continue
            try:
                start = time.perf_counter()
                reply = clients[cid].handle(message)
                observe(reply_stage, cid, time.perf_counter() - start)
            except ClientRefusal as exc:
                events.refusals[cid] = str(exc)
                continue
            _deliver(server, reply, events)
        stage = server.state.value
        start = time.perf_counter()
        outgoing = server.advance()
        observe(stage, None, time.perf_counter() - start)
    assert server.state in (ServerState.DONE, ServerState.FAILED) and server.outcome is not None
    return server.outcome, events


def _deliver(server: ServerSession, message, events: ClusterEvents) -> None:
    try:
        server.receive(message)
    except RejectedMessage as exc:
        events.rejected[message.sender] = str(exc)


@dataclass(frozen=True)
class ReclusteringResult:
    """One reclustering of a round: its clusters, the successful sums and the failures."""

    index: int
    clustering: Clustering
    clusters: list[ClusterSum]
    failed: list[FailedCluster]
    events: dict[int, ClusterEvents]


@dataclass(frozen=True)
class SecureSumResult:
    """The outcome of :func:`secure_sum`.

    ``clusters`` / ``failed`` are those of the first reclustering; ``reclusterings[r]``
    holds each one. ``planned_audit`` is the leakage audit of the clusterings before the
    run, ``realised_audit`` the audit of the sums actually released (drop-outs shrink
    sums). ``encoding`` is the fixed-point encoding used for float inputs (else ``None``);
    then each :attr:`ClusterSum.sum` is the decoded float64 sum and ``ring_sum`` the exact
    sum in Z_2^b.
    """

    reclusterings: list[ReclusteringResult]
    planned_audit: LeakageReport
    realised_audit: LeakageReport
    encoding: RingEncoding | None

    @property
    def clusters(self) -> list[ClusterSum]:
        return self.reclusterings[0].clusters

    @property
    def failed(self) -> list[FailedCluster]:
        return self.reclusterings[0].failed


def _ring_inputs(
    inputs: Mapping[int, np.ndarray],
    bits: int | None,
    encoding: RingEncoding | None,
    clip: float | None,
    max_summands: int,
    rng: np.random.Generator,
) -> tuple[dict[int, np.ndarray], int, RingEncoding | None]:
    """Check the inputs; encode float inputs; return ring vectors, b and the encoding."""
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
        return arrays, width, None
    if dtype.kind != "f":
        raise ConfigurationError(f"inputs must be uint32, uint64 or float; got {dtype}")
    if encoding is None:
        if clip is None:
            raise ConfigurationError(
                "float inputs need clip= (per-coordinate bound) or encoding= to fix the "
                "fixed-point scale"
            )
        encoding = choose_encoding(clip, max_summands, bits=bits or 32)
    elif encoding.max_summands < max_summands:
        raise ConfigurationError(
            f"encoding allows {encoding.max_summands} summands; clusters have up to "
            f"{max_summands} clients"
        )
    encoded = {cid: encode(x, encoding, rng) for cid, x in sorted(arrays.items())}
    return encoded, encoding.bits, encoding


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
    *,
    cluster_size: int,
    threshold: int | None = None,
    reclusterings: int = 1,
    dropouts: Dropouts | Sequence[Dropouts] | None = None,
    seed: int | None = None,
    bits: int | None = None,
    clip: float | None = None,
    encoding: RingEncoding | None = None,
    signed: bool = False,
    neighbour_degree: int | None = None,
    clusterings: Sequence[Clustering] | None = None,
    allow_leakage: bool = False,
    round: int = 0,
    observer: Observer | None = None,
    protocol: bool = True,
) -> SecureSumResult:
    """Securely sum ``inputs`` inside random clusters, R times, in this process.

    Args:
        inputs: client id → 1-D vector. uint32/uint64 vectors are summed exactly modulo
            2^32/2^64; float vectors are encoded (``encoding``, or ``clip`` with the largest
            safe scale) and the sums decoded to float64.
        cluster_size: m (1: no secure aggregation; ≥ n: one cluster, plain SecAgg).
        threshold: t for every cluster (default ⌊size/2⌋ + 1, at least 2).
        reclusterings: R, the number of fresh clusterings of the same inputs.
        dropouts: stage → clients that vanish before sending that stage's message (applies
            to every reclustering), or one such mapping per reclustering.
        seed: seeds the clustering and the stochastic rounding (keys are always fresh).
        bits: ring width for float inputs (32 default, or 64).
        signed: untrusted-server mode (signed advertisements and consistency check).
        neighbour_degree: SecAgg+ sparse masking with a random k-regular graph per cluster.
        clusterings: explicit clusterings (one per reclustering) instead of random ones.
        allow_leakage: run even if the audit finds recoverable updates or small sums.
        round: the round number bound into every key and message.
        observer: passed to :func:`run_cluster` (wall time of every step).
        protocol: ``False`` adds each cluster's encoded inputs in the clear instead of
            running the protocol (ablations): the clusterings, encoding and stochastic
            rounding are drawn exactly as with the protocol, so the ring sums are
            identical; drop-outs and signing need the protocol.

    Raises:
        LeakageError: the planned clusterings leak and ``allow_leakage`` is False.
        ConfigurationError: inconsistent inputs or parameters.
    """
    if not inputs:
        raise ConfigurationError("no inputs")
    if cluster_size < 1 or reclusterings < 1:
        raise ConfigurationError("cluster_size and reclusterings must be >= 1")
    if not protocol and (dropouts or signed):
        raise ConfigurationError("dropouts and signed mode need protocol=True")
    rng = as_generator(seed)
    ids = sorted(inputs)
    try:
        plan = (
            list(clusterings)
            if clusterings is not None
            else [random_clustering(ids, cluster_size, rng) for _ in range(reclusterings)]
        )
    except ClusteringError as exc:
        raise ConfigurationError(str(exc)) from exc
    if len(plan) != reclusterings or any(set(c.members) != set(ids) for c in plan):
        raise ConfigurationError("each clustering must partition exactly the input clients")
    planned = audit(plan, client_ids=ids)
    by_design = min(min(c.sizes) for c in plan) == 1  # m = 1: no secure aggregation asked
    if planned.leaks and not by_design and not allow_leakage:
        raise LeakageError(
            f"{planned.summary()}\nUse fewer reclusterings or larger clusters, draw them with "
            "sharefl.protocol.audit.sample_safe_reclusterings, or pass allow_leakage=True."
        )
    largest = max(max(c.sizes) for c in plan)
    vectors, width, used_encoding = _ring_inputs(inputs, bits, encoding, clip, largest, rng)
    length = next(iter(vectors.values())).shape[0]
    identities = {cid: IdentityKey.generate() for cid in ids} if signed else {}
    directory = {cid: key.public for cid, key in identities.items()}
    policies = {
        cid: ClientPolicy(identity=key, directory=directory) for cid, key in identities.items()
    }
    results = []
    for r, (clustering, drops) in enumerate(
        zip(plan, _per_reclustering_dropouts(dropouts, reclusterings), strict=True)
    ):
        _check_dropouts(drops)
        dropped_anywhere = set().union(*map(set, drops.values())) if drops else set()
        sums, failed, events = [], [], {}
        for index, members in enumerate(clustering.clusters):
            context = KeyContext(round=round, reclustering=r, cluster=index)
            if len(members) == 1:  # m = 1: no secure aggregation, the input is the sum
                (cid,) = members
                if cid in dropped_anywhere:
                    failed.append(FailedCluster(index, members, "advertise", "client dropped"))
                else:
                    sums.append(ClusterSum(index, members, vectors[cid], vectors[cid]))
                continue
            if not protocol:
                ring = np.zeros(length, dtype=vectors[members[0]].dtype)
                for cid in members:
                    ring += vectors[cid]  # unsigned arithmetic wraps modulo 2^b
                sums.append(ClusterSum(index, tuple(sorted(members)), ring, ring))
                continue
            assignment = plan_assignment(
                context,
                members,
                length=length,
                bits=width,
                threshold=threshold,
                neighbour_degree=neighbour_degree,
                signed=signed,
                rng=rng,
            )
            outcome, events[index] = run_cluster(
                assignment,
                {cid: vectors[cid] for cid in members},
                dropouts=drops,
                policies=policies,
                directory=directory,
                observer=observer,
            )
            (sums if isinstance(outcome, ClusterSum) else failed).append(outcome)
        if used_encoding is not None:
            sums = [replace(s, sum=decode(s.ring_sum, used_encoding, len(s.members))) for s in sums]
        results.append(ReclusteringResult(r, clustering, sums, failed, events))
    realised = audit(
        plan,
        client_ids=ids,
        dropouts=[_not_in_sums(res) for res in results],
        min_sum_size=planned.min_sum_size,
    )
    return SecureSumResult(results, planned, realised, used_encoding)


def _not_in_sums(result: ReclusteringResult) -> set[int]:
    released = {cid for s in result.clusters for cid in s.members}
    return set(result.clustering.members) - released
