"""The client side of per-cluster secure aggregation, as a sans-IO state machine.

A :class:`ClientSession` is built from the server's :class:`ClusterAssignment`, the
client's own :class:`ClientPolicy` and its input vector (already in Z_2^b). It consumes
server messages and returns the reply to send; it never touches sockets, threads or clocks.

States: ``NEW → ADVERTISED → SHARED → MASKED → [SIGNED] → DONE``, or in the two-exchange
round (protocol version 5, long-term :class:`~sharefl.protocol.keys.ClientKeys`)
``NEW → MASKED → [SIGNED] → DONE``; any refusal moves it to ``ABORTED`` (secrets dropped,
nothing more revealed). The refusals that protect the client
against a misbehaving server:

- a threshold below the policy's floor (:func:`threshold_floor`: t > (holders +
  colluders)/2), or unsigned mode when the policy demands signatures
  (:class:`ThresholdTooLow`, :class:`InconsistentRequest`);
- a message of another round, reclustering or cluster (:class:`ContextMismatch`);
- a relayed advertisement that is malformed, duplicated, substituted, not signed by its
  owner or carrying a low-order X25519 key (:class:`BadAdvertisement`), and any message
  whose fields cannot be used (:class:`MalformedRequest`);
- survivor lists that are not subsets of earlier lists, that have fewer than t members,
  a share-stage survivor list with fewer than ``colluders + 1`` of its neighbours, or
  survivor/dropped lists that overlap (both secrets of one peer), and any second unmask
  request (:class:`InconsistentRequest`);
- in signed mode, fewer than t valid signatures on the exact survivor list this client saw
  (:class:`ConsistencyCheckFailed`).

The two invariants a session enforces before it sends (the argument is in
``docs/security.md``): **I1** (:meth:`ClientSession._on_masking`) the masked input carries a
pair mask with every neighbour in U2, whatever the bundles, and no pair seed is revealed
before unmasking; **I2** (:meth:`ClientSession._on_unmask`) of each peer the server gets
one secret at most, under a survivor list at least t clients long (and, signed, the one
this client signed, with t signatures).

The two-exchange round keeps both invariants in its own form (:meth:`ClientSession.
_mask_and_deal`, :meth:`ClientSession._reveal`): the masked input carries a pair mask with
every neighbour and leaves with sealed Shamir shares of b_u and of each pair seed; at
unmasking a share of b_w leaves only for a survivor w, a share of s_wv only for a survivor
w and a dropped v. A version the client does not speak is refused (:class:`VersionRefused`).

What needs the whole round (one cluster per reclustering, the committed plan, cluster size
and degree, releases that leak across clusters) is
:class:`~sharefl.protocol.client_round.ClientRound`'s job; a session works without it.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sharefl.crypto import aead, shamir
from sharefl.crypto.errors import CryptoError, DecryptionError, SignatureError
from sharefl.crypto.kdf import (
    KEY_BYTES,
    SPOKEN_VERSIONS,
    TWO_EXCHANGE_VERSION,
    Purpose,
    X25519KeyPair,
    pairwise_key,
)
from sharefl.crypto.prg import combine_masks, ring_dtype
from sharefl.crypto.shamir import SHARE_BYTES
from sharefl.crypto.signatures import (
    IdentityKey,
    client_list_message,
    verify,
)
from sharefl.protocol import records
from sharefl.protocol.audit import DEFAULT_SEARCH_BUDGET
from sharefl.protocol.bundles import (
    BundleError,
    DealtShares,
    SharePair,
    pair_commitment,
    seed_commitment,
)
from sharefl.protocol.errors import (
    BadAdvertisement,
    ClientRefusal,
    ConfigurationError,
    ConsistencyCheckFailed,
    ContextMismatch,
    InconsistentRequest,
    MalformedRequest,
    StageError,
    ThresholdTooLow,
    VersionRefused,
)
from sharefl.protocol.keys import (
    ClientKeys,
    adverts_by_sender,
    check_advert_fields,
    check_distinct_keys,
)
from sharefl.protocol.messages import (
    AdvertiseKeys,
    ClientMessage,
    ClusterAssignment,
    ConsistencyRequest,
    ConsistencySignature,
    EncryptedShares,
    KeysBroadcast,
    MaskedInput,
    MaskedShares,
    MaskingRequest,
    ServerMessage,
    UnmaskRequest,
    UnmaskResponse,
)

SURVIVORS_LABEL = "survivors"
SESSION_STATE_TYPE = "ClientSessionState"
"""The ``type`` of a :meth:`ClientSession.export_state` record."""


class ClientState(enum.Enum):
    NEW = "new"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    SIGNED = "signed"
    DONE = "done"
    ABORTED = "aborted"


def threshold_floor(holders: int, colluders: int = 0) -> int:
    """Smallest threshold a client accepts for ``holders`` share holders of whom up to
    ``colluders`` collude with the server: t > (holders + colluders)/2, at least 2 and
    more than ``colluders``.

    The split-view bound: a server that shows two disjoint groups of honest holders
    different survivor lists needs t signatures (t − colluders honest ones) in each; with
    t > (holders + colluders)/2 two such groups cannot both exist among the
    holders − colluders honest ones. A threshold of 1 would hand every secret to any single
    holder, and t <= colluders would hand it to the colluders. Raises
    :class:`ConfigurationError` for negative counts.
    """
    if holders < 0 or colluders < 0:
        raise ConfigurationError(f"holders and colluders must be >= 0; got {holders}, {colluders}")
    return max(2, colluders + 1, (holders + colluders) // 2 + 1)


def min_released_members(cluster_size: int, min_sum_size: int, colluders: int = 0) -> int:
    """The fewest members whose inputs a released sum of a cluster of ``cluster_size`` can
    contain: unmasking needs the threshold (:func:`threshold_floor`) of members alive and
    the release check refuses sums of fewer than ``min_sum_size``, so
    min(m, max(threshold_floor(m, colluders), min_sum_size)): 3 for m = 3, 4 and 5 at
    min_sum_size 3, 6 for m = 10. A noise split sized for this many (s) holds in every
    sum the protocol can release."""
    return min(cluster_size, max(threshold_floor(cluster_size, colluders), min_sum_size))


def default_colluders(holders: int, signed: bool) -> int:
    """The colluders a threshold resists when the policy does not say: 0 against an
    honest-but-curious server (unsigned mode), ⌈holders/3⌉ − 1 in signed mode (Bonawitz et
    al.'s active setting, t > 2·holders/3)."""
    return max(0, -(-holders // 3) - 1) if signed else 0


@dataclass(frozen=True)
class ClientPolicy:
    """What the client insists on, whatever the server asks.

    :class:`ClientSession` enforces the threshold and signing rules of one cluster;
    :class:`~sharefl.protocol.client_round.ClientRound` enforces the rest against the
    committed round plan.

    Attributes:
        identity: this client's Ed25519 identity (needed in signed mode).
        directory: the peers' Ed25519 public keys, from a source the server does not
            control (needed in signed mode).
        require_signed: refuse assignments in unsigned (trusted-server) mode (no downgrade).
        colluders: the number of clients colluding with the server the threshold must
            resist (see :func:`threshold_floor`); ``None`` takes :func:`default_colluders`.
        min_cluster_size: refuse clusters with fewer members (in a cluster of m, m − 1
            colluders always learn the last member).
        min_neighbours: refuse a neighbour graph that gives this client, or any member,
            fewer neighbours.
        max_reclusterings: refuse round plans with more clusterings.
        max_participants: refuse round plans over more clients, before auditing them. The
            plan is the first thing a client must trust an untrusted server about, and its
            audit is the client's costliest check: this bound, ``max_reclusterings`` and
            the client's own cluster sizes are checked first, in O(R) time, so an
            oversized plan is refused at no cost.
        max_audit_work: the work budget of the client's exact audit of the plan, in entry
            operations (:func:`~sharefl.protocol.audit.audit`'s ``work_budget``); a plan
            whose audit needs more is refused (:class:`PlanRefused`) once the budget is
            spent, so the audit's steep part (about k³ for k clients linked by shared
            sums) is cut off. ``None``: unbounded (only for a plan from a trusted process,
            e.g. the in-process driver's, whose coordinator audited it).
            What the defaults cost (``benchmarks/bench_audit.py``, ``client_plan_*``
            records; one core of a shared 2-core AMD EPYC VM): the safe planner's plan at
            the bound, n = 10,000 and R = 10, 0.87 s (4.5·10^5 units: the budget is no
            constraint on such plans); at n = 100, R = 10, 6 ms; the costliest plans
            within the budget, one component of k random clusters of 3 linked by R = 3
            reclusterings, pass up to k = 260 (3.5·10^6 units, 0.53 s); at k = 520 the
            refusal comes after 0.45 s, where the unbounded audit takes 4.8 s (and
            minutes at k = 2000); a plan over ``max_participants`` is refused in about
            10 µs. On this machine 2^22 units are at most about 1.5 s of audit.
        audit_search_budget: the small-sum search budget of that audit
            (:func:`~sharefl.protocol.audit.audit`'s ``search_budget``, subsets examined;
            about 1 s when the default runs out); a search that runs out refuses the plan
            too.
        min_sum_size: sums of fewer clients must not be recoverable from the round plan (and
            from what this client saw released); ``None`` takes ``min_cluster_size``.
        verify_releases: check every unmask request against what this client saw released
            in the round (:meth:`ClientRound.check_release`). ``None``: in signed mode only.
            An unsigned server is trusted to follow the protocol, and its round coordinator
            enforces the same rule with full knowledge; the client's own view must assume
            that every cluster it did not see was released in full, which refuses some
            drop-outs the server's exact check lets through.
        require_atoms: refuse a round plan without atoms (:mod:`sharefl.protocol.atoms`;
            invariants A1–A4). A client that once joined an atom refuses plans without
            atoms anyway (its memory keeps the atom); this also refuses them before.
            Deployment clients (``sharefl client``, the Flower mod) set it by default.
        max_rounds: the most rounds this client joins under one server identity
            (:mod:`sharefl.protocol.budget`; ``None``: no limit).
        max_epsilon: the most ε (at ``budget_delta``) of its own noise this client spends
            under one server identity; ``None``: no limit.
        budget_delta: the δ of ``max_epsilon``.
    """

    identity: IdentityKey | None = None
    directory: Mapping[int, bytes] | None = None
    require_signed: bool = False
    colluders: int | None = None
    min_cluster_size: int = 3
    min_neighbours: int = 2
    max_reclusterings: int = 10
    max_participants: int = 10_000
    max_audit_work: int | None = 1 << 22
    audit_search_budget: int = DEFAULT_SEARCH_BUDGET
    min_sum_size: int | None = None
    verify_releases: bool | None = None
    require_atoms: bool = False
    max_rounds: int | None = None
    max_epsilon: float | None = None
    budget_delta: float = 1e-5

    def __post_init__(self) -> None:
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ConfigurationError(f"max_rounds must be >= 1 (or None), got {self.max_rounds}")
        if self.max_epsilon is not None and not self.max_epsilon > 0:
            raise ConfigurationError(f"max_epsilon must be > 0 (or None), got {self.max_epsilon}")
        if not 0 < self.budget_delta < 1:
            raise ConfigurationError(f"budget_delta must be in (0, 1), got {self.budget_delta}")
        if self.colluders is not None and self.colluders < 0:
            raise ConfigurationError(f"colluders must be >= 0, got {self.colluders}")
        if self.min_cluster_size < 2 or self.min_neighbours < 1 or self.max_reclusterings < 1:
            raise ConfigurationError(
                "min_cluster_size must be >= 2, min_neighbours >= 1, max_reclusterings >= 1"
            )
        if self.min_sum_size is not None and self.min_sum_size < 1:
            raise ConfigurationError(f"min_sum_size must be >= 1, got {self.min_sum_size}")
        if (
            self.max_participants < 1
            or (self.max_audit_work is not None and self.max_audit_work < 1)
            or self.audit_search_budget < 1
        ):
            raise ConfigurationError(
                "max_participants, max_audit_work and audit_search_budget must be >= 1 "
                f"(max_audit_work None: unbounded); got {self.max_participants}, "
                f"{self.max_audit_work}, {self.audit_search_budget}"
            )

    def requiring(self, members: int, max_reclusterings: int | None = None) -> ClientPolicy:
        """This policy, refusing also clusters and recoverable sums of fewer than
        ``members`` clients and plans with more than ``max_reclusterings`` clusterings
        (``None``: as it is): what a client's distributed-DP noise assumes of every round
        (its share is sized for sums of ``members``)."""
        return replace(
            self,
            min_cluster_size=max(self.min_cluster_size, members),
            min_sum_size=max(self.sum_floor, members),
            max_reclusterings=min(
                self.max_reclusterings, max_reclusterings or self.max_reclusterings
            ),
        )

    @property
    def sum_floor(self) -> int:
        """The smallest number of clients whose sum may be recoverable."""
        return self.min_cluster_size if self.min_sum_size is None else self.min_sum_size

    def colluders_for(self, holders: int, signed: bool) -> int:
        """The colluders to resist with ``holders`` share holders in this mode."""
        return default_colluders(holders, signed) if self.colluders is None else self.colluders

    def floor(self, holders: int, signed: bool) -> int:
        """The smallest threshold this client accepts (:func:`threshold_floor`)."""
        return threshold_floor(holders, self.colluders_for(holders, signed))


class ClientSession:
    """One client's run of the protocol in one cluster of one (round, reclustering).

    Args:
        client_id: this client's id (a member of ``assignment.members``).
        assignment: the server's cluster assignment (validated here against ``policy``).
        vector: this client's input, a 1-D uint32/uint64 array of ``assignment.length``
            elements (use :mod:`sharefl.crypto.encoding` for floats). Not modified. ``None``:
            the input comes later, through :meth:`set_input`, before the masking request
            (e.g. a client that trains after key setup). The session drops its reference
            to the input once it has sent the masked input.
        policy: the client's own requirements.
        randbytes: source of secret randomness (keys, seeds, Shamir coefficients).
        keys: this client's long-term keys (:mod:`sharefl.protocol.keys`); required by
            the two-exchange round, unused by the four-exchange one.

    Raises:
        ThresholdTooLow, InconsistentRequest: the assignment violates the policy.
        VersionRefused: the assignment's protocol version is not one this code speaks.
        ConfigurationError: the input does not match the assignment.
    """

    def __init__(
        self,
        client_id: int,
        assignment: ClusterAssignment,
        vector: np.ndarray | None = None,
        policy: ClientPolicy | None = None,
        *,
        randbytes: Callable[[int], bytes] = os.urandom,
        keys: ClientKeys | None = None,
    ) -> None:
        self.id = client_id
        self.keys = keys
        self.assignment = assignment
        self.policy = policy or ClientPolicy()
        self.context = assignment.context
        self.state = ClientState.NEW
        self._randbytes = randbytes
        self._check_assignment()
        self._vector: np.ndarray | None = None
        if vector is not None:
            self._vector = self._checked_input(vector)
        self._neighbours = assignment.neighbours_of(client_id)
        self._x = {m: i + 1 for i, m in enumerate(assignment.members)}
        self._survivors: tuple[int, ...] = ()
        self._signed_survivors: tuple[int, ...] | None = None
        self._held: dict[int, SharePair] = {}
        self._complaints: frozenset[int] = frozenset()
        self._dealt: DealtShares | None = None
        self._share_keys: dict[int, bytes] = {}
        self._mask_seeds: dict[int, bytes] = {}

    # -- the input ------------------------------------------------------------------------

    def _checked_input(self, vector: np.ndarray) -> np.ndarray:
        dtype = ring_dtype(self.assignment.bits)
        if (
            not isinstance(vector, np.ndarray)
            or vector.dtype != dtype
            or vector.shape != (self.assignment.length,)
        ):
            raise ConfigurationError(
                f"client {self.id}: input must be a 1-D {dtype} array of length "
                f"{self.assignment.length}; got "
                f"{getattr(vector, 'dtype', type(vector).__name__)} {getattr(vector, 'shape', '')}"
            )
        return vector

    @property
    def has_input(self) -> bool:
        """Whether the input is set (and not yet masked)."""
        return self._vector is not None

    def set_input(self, vector: np.ndarray) -> None:
        """Supply (or replace) the input before the masking request.

        Raises :class:`ConfigurationError` for an input of the wrong dtype or length, and
        :class:`StageError` once the session has masked, finished or aborted.
        """
        if self.state not in (ClientState.NEW, ClientState.ADVERTISED, ClientState.SHARED):
            raise StageError(
                f"client {self.id}: the input can only be set before masking; the session is "
                f"{self.state.value}"
            )
        self._vector = self._checked_input(vector)

    # -- validation helpers ---------------------------------------------------------------

    @property
    def two_exchange(self) -> bool:
        """Whether this session runs the two-exchange round (keys set up once)."""
        return self.context.version == TWO_EXCHANGE_VERSION

    def _check_assignment(self) -> None:
        a, p = self.assignment, self.policy
        if a.context.version not in SPOKEN_VERSIONS:
            raise VersionRefused(
                f"client {self.id}: the server asks for protocol version {a.context.version}; "
                f"this client speaks versions {list(SPOKEN_VERSIONS)}: upgrade the client, "
                "or run the server at a version it speaks"
            )
        if self.id not in a.members:
            raise InconsistentRequest(f"client {self.id} is not a member of {a.members}")
        # members without duplicates, in order: the assignment's own check (its constructor)
        holders = len(a.neighbours_of(self.id)) + 1
        colluders = p.colluders_for(holders, a.signed)
        floor = threshold_floor(holders, colluders)
        if a.threshold < floor:
            raise ThresholdTooLow(
                f"client {self.id}: threshold {a.threshold} is below this client's floor "
                f"{floor} for {holders} share holders and {colluders} colluders; the server "
                f"must ask for t >= {floor}"
                + (
                    f" and give each client at least {floor} share holders"
                    if floor > holders
                    else ""
                )
            )
        if a.threshold > holders:
            raise InconsistentRequest(
                f"threshold {a.threshold} exceeds the {holders} holders of client {self.id}'s "
                "shares: its secrets could never be reconstructed"
            )
        if p.require_signed and not a.signed:
            raise InconsistentRequest(
                "this client requires signed mode (untrusted server); the assignment is unsigned"
            )
        if a.signed and (p.identity is None or p.directory is None):
            raise ConfigurationError("signed mode needs policy.identity and policy.directory")
        if self.two_exchange:
            self._check_keys()
        elif a.keys:
            raise InconsistentRequest("a four-exchange assignment carries no long-term keys")

    def _check_keys(self) -> None:
        """Two-exchange round: one well-formed advert per member, all of this client's
        scope, no key repeated, this client's own advert its own keys, and (signed) every
        advert signed by its owner's identity in ``policy.directory``."""
        if self.keys is None:
            raise ConfigurationError(
                f"client {self.id}: the two-exchange round needs this client's long-term "
                "keys (ClientKeys): pass keys="
            )
        if self.keys.client_id != self.id:
            raise ConfigurationError(f"client {self.id}: keys of client {self.keys.client_id}")
        adverts = adverts_by_sender(self.assignment.keys)
        if set(adverts) != set(self.assignment.members):
            raise BadAdvertisement(
                f"client {self.id}: the assignment must carry one key advert per member; "
                f"missing {sorted(set(self.assignment.members) - set(adverts))}, extra "
                f"{sorted(set(adverts) - set(self.assignment.members))}"
            )
        directory = self.policy.directory or {}
        for advert in adverts.values():
            if advert.scope != self.keys.scope:
                raise BadAdvertisement(
                    f"client {advert.sender}'s key advert is for another scope than this "
                    "client's keys"
                )
            identity = None
            if self.assignment.signed:
                if advert.sender not in directory:
                    raise BadAdvertisement(f"no identity key known for client {advert.sender}")
                identity = directory[advert.sender]
            check_advert_fields(advert, identity)  # a low-order key: refused by the agreement
        check_distinct_keys(adverts.values())
        own = adverts[self.id]
        if (own.encryption_public, own.mask_public) != (
            self.keys.encryption.public,
            self.keys.mask.public,
        ):
            raise BadAdvertisement(f"the server relayed other keys for client {self.id}")
        self._long_term = adverts

    def _check_context(self, message: ServerMessage) -> None:
        if message.context != self.context:
            raise ContextMismatch(
                f"client {self.id}: message for {message.context} replayed into {self.context}"
            )

    def _check_survivors(self, survivors: tuple[int, ...], superset: set[int], what: str) -> None:
        # no id twice: the request's own check (its constructor)
        if self.id not in survivors:
            raise InconsistentRequest(f"{what} list omits this client {self.id}")
        if not set(survivors) <= superset:
            raise InconsistentRequest(
                f"{what} list names clients that did not complete the previous stage: "
                f"{sorted(set(survivors) - superset)}"
            )
        if len(survivors) < self.assignment.threshold:
            raise InconsistentRequest(
                f"{what} list has {len(survivors)} clients, fewer than t = "
                f"{self.assignment.threshold}"
            )

    # -- transitions ----------------------------------------------------------------------

    def advertise(self) -> AdvertiseKeys:
        """Stage 1: fresh key pairs and seed; returns the (signed) advertisement. The
        two-exchange round has no such stage (:meth:`start`)."""
        self._expect(ClientState.NEW)
        if self.two_exchange:
            raise StageError(f"client {self.id}: a two-exchange session starts with start()")
        self._enc = X25519KeyPair.from_private(self._randbytes(KEY_BYTES))
        self._mask = X25519KeyPair.from_private(self._randbytes(KEY_BYTES))
        self._seed = self._randbytes(KEY_BYTES)
        commitment = seed_commitment(self.context, self.id, self._seed)
        advert = AdvertiseKeys(
            self.id, self.context, self._enc.public, self._mask.public, commitment
        )
        if self.assignment.signed:
            assert self.policy.identity is not None
            advert = replace(advert, signature=self.policy.identity.sign(advert.statement()))
        self._advert = advert
        self.state = ClientState.ADVERTISED
        return self._advert

    def start(self) -> AdvertiseKeys | MaskedShares:
        """The reply to the assignment: the advertisement (four-exchange round) or the
        masked input with its dealt shares (two-exchange round, which needs the input:
        :class:`StageError` without it, the session unchanged)."""
        if not self.two_exchange:
            return self.advertise()
        self._expect(ClientState.NEW)
        if self._vector is None:
            raise StageError(
                f"client {self.id}: call set_input(vector) before starting a two-exchange "
                "session (the session stays as it is)"
            )
        try:
            return self._mask_and_deal()
        except ClientRefusal:
            self._abort()
            raise

    def _mask_and_deal(self) -> MaskedShares:
        """Two-exchange round, invariant I1: y_u carries the self mask and a pair mask with
        *every* neighbour of the assignment (at least ``colluders + 1`` of them, so one pair
        mask is shared with an honest peer), and nothing is revealed but encrypted shares:
        of b_u and of each pair seed s_uv, t-of-(neighbours + 1), one bundle per neighbour
        (this client keeps its own share). The shares of s_uv are what lets the server
        remove the pair mask of a neighbour v that drops before sending its input, even
        when u itself is gone by then; they are revealed only for a survivor u and a
        dropped v (I2), so never for a pair of survivors."""
        assert self.keys is not None and self._vector is not None
        peers = sorted(self._neighbours)
        holders = len(peers) + 1
        floor = self.policy.colluders_for(holders, self.assignment.signed) + 1
        if len(peers) < floor:
            raise InconsistentRequest(
                f"client {self.id}: only {len(peers)} neighbour(s); it masks only with at "
                f"least {floor} (one more than the colluders it resists)"
            )
        self._seed = self._randbytes(KEY_BYTES)
        self._mask_seeds = {
            v: self.keys.derive(self._long_term[v], self.context, Purpose.MASK_SEED) for v in peers
        }
        self._share_keys = {
            v: self.keys.derive(self._long_term[v], self.context, Purpose.SHARE_ENCRYPTION)
            for v in peers
        }
        order = sorted((*peers, self.id))
        rows = shamir.split_many(
            [self._seed, *(self._mask_seeds[v] for v in peers)],
            self.assignment.threshold,
            [self._x[h] for h in order],
            randbytes=self._randbytes,
        )
        bundles: dict[int, bytes] = {}
        for i, holder in enumerate(order):
            dealt = DealtShares(rows[0][i], {v: rows[1 + j][i] for j, v in enumerate(peers)})
            if holder == self.id:
                self._dealt = dealt
                continue
            envelope = aead.Envelope(self.id, holder, self.context)
            bundles[holder] = aead.encrypt(
                self._share_keys[holder], dealt.to_plaintext(self.id, holder), envelope
            )
        masks = [(self._seed, +1)]
        masks += [(self._mask_seeds[v], +1 if v > self.id else -1) for v in peers]
        vector = combine_masks(np.empty_like(self._vector), [self._vector], masks)
        self._vector = None  # no copy of the input once it is masked
        self._survivors = self.assignment.members
        self.state = ClientState.MASKED
        return MaskedShares(
            self.id,
            self.context,
            vector,
            seed_commitment(self.context, self.id, self._seed),
            {v: pair_commitment(self.context, self.id, v, self._mask_seeds[v]) for v in peers},
            bundles,
        )

    def handle(self, message: ServerMessage) -> ClientMessage:
        """Consume one server message and return the reply to send.

        Raises a :class:`ClientRefusal` (and aborts the session) when the message would
        hurt this client's privacy or contradicts what it saw before.
        """
        handlers: dict[type, tuple[ClientState, Callable[[Any], ClientMessage]]] = {
            KeysBroadcast: (ClientState.ADVERTISED, self._on_keys),
            MaskingRequest: (ClientState.SHARED, self._on_masking),
            ConsistencyRequest: (ClientState.MASKED, self._on_consistency),
            UnmaskRequest: (
                ClientState.SIGNED if self.assignment.signed else ClientState.MASKED,
                self._on_unmask,
            ),
        }
        if (
            isinstance(message, MaskingRequest)
            and self.state is ClientState.SHARED
            and self._vector is None
        ):
            raise StageError(
                f"client {self.id}: call set_input(vector) before handing over the masking "
                "request (the session stays as it is)"
            )
        try:
            if type(message) not in handlers:
                raise InconsistentRequest(f"unknown message type {type(message).__name__}")
            state, handler = handlers[type(message)]
            if self.state is not state:
                raise InconsistentRequest(
                    f"client {self.id}: unexpected {type(message).__name__} in state "
                    f"{self.state.value}"
                )
            self._check_context(message)
            return handler(message)
        except ClientRefusal:
            self._abort()
            raise
        except (CryptoError, ValueError, TypeError, KeyError, struct.error) as exc:
            self._abort()
            raise MalformedRequest(
                f"client {self.id}: the server's {type(message).__name__} has unusable "
                f"fields ({type(exc).__name__}: {exc})"
            ) from exc

    def _expect(self, state: ClientState) -> None:
        if self.state is not state:
            raise InconsistentRequest(f"client {self.id} is in state {self.state.value}")

    def abort(self) -> None:
        """Drop every secret; the session answers nothing more (state ``ABORTED``)."""
        self._abort()

    def _abort(self) -> None:
        self.state = ClientState.ABORTED
        self._held.clear()
        self._dealt = None
        for name in ("_enc", "_mask", "_seed", "_share_keys", "_mask_seeds"):
            self.__dict__.pop(name, None)
        self._vector = None

    def _on_keys(self, message: KeysBroadcast) -> EncryptedShares:
        adverts: dict[int, AdvertiseKeys] = {}
        for advert in message.advertisements:
            if advert.sender in adverts:
                raise BadAdvertisement(f"two advertisements for client {advert.sender}")
            if advert.sender not in self.assignment.members or advert.context != self.context:
                raise BadAdvertisement(f"advertisement of {advert.sender} is not for this cluster")
            # the sizes of keys, commitment and signature are the advert's own (its constructor)
            if self.assignment.signed:
                self._verify_advert(advert)
            adverts[advert.sender] = advert
        if adverts.get(self.id) != self._advert:
            raise BadAdvertisement(f"the server relayed a different advertisement for {self.id}")
        keys = [a.encryption_public for a in adverts.values()]
        keys += [a.mask_public for a in adverts.values()]
        if len(set(keys)) != len(keys):
            raise BadAdvertisement("two advertised public keys are equal")
        self._adverts = adverts
        self._agree_with_neighbours()
        holders = sorted((self._neighbours & adverts.keys()) | {self.id})
        if len(holders) < self.assignment.threshold:
            raise InconsistentRequest(
                f"only {len(holders)} holders advertised, fewer than t = "
                f"{self.assignment.threshold}"
            )
        key_shares, seed_shares = shamir.split_many(
            [self._mask.private, self._seed],
            self.assignment.threshold,
            [self._x[h] for h in holders],
            randbytes=self._randbytes,
        )
        bundles: dict[int, bytes] = {}
        for holder, key_share, seed_share in zip(holders, key_shares, seed_shares, strict=True):
            pair = SharePair(key_share, seed_share)
            if holder == self.id:
                self._held[self.id] = pair
                continue
            key = self._share_key(holder)
            envelope = aead.Envelope(self.id, holder, self.context)
            bundles[holder] = aead.encrypt(key, pair.to_plaintext(self.id, holder), envelope)
        self.state = ClientState.SHARED
        return EncryptedShares(self.id, self.context, bundles)

    def _agree_with_neighbours(self) -> None:
        """Both pairwise keys with every advertising neighbour, now: a low-order (or
        otherwise unusable) public key is refused before anything is shared."""
        self._share_keys = {}
        self._mask_seeds = {}
        for peer in sorted(self._neighbours & self._adverts.keys()):
            advert = self._adverts[peer]
            try:
                self._share_keys[peer] = pairwise_key(
                    self._enc,
                    advert.encryption_public,
                    self.context,
                    Purpose.SHARE_ENCRYPTION,
                    self.id,
                    peer,
                )
                self._mask_seeds[peer] = pairwise_key(
                    self._mask,
                    advert.mask_public,
                    self.context,
                    Purpose.MASK_SEED,
                    self.id,
                    peer,
                )
            except (CryptoError, ValueError) as exc:
                raise BadAdvertisement(
                    f"client {peer} advertised an unusable X25519 public key ({exc}); "
                    "refusing this cluster"
                ) from exc

    def _verify_advert(self, advert: AdvertiseKeys) -> None:
        directory = self.policy.directory or {}
        if advert.sender not in directory:
            raise BadAdvertisement(f"no identity key known for client {advert.sender}")
        try:
            verify(directory[advert.sender], advert.statement(), advert.signature)
        except SignatureError as exc:
            raise BadAdvertisement(
                f"advertisement of client {advert.sender} is not signed by its identity key "
                "(substituted key?)"
            ) from exc

    def _share_key(self, peer: int) -> bytes:
        return self._share_keys[peer]

    def _on_masking(self, message: MaskingRequest) -> MaskedInput:
        """Invariant I1 (mask), checked before the masked input leaves: y_u carries the self
        mask and a pair mask with *every* neighbour in the share-stage survivor list U2, and
        U2 holds at least ``colluders + 1`` neighbours, so at least one pair mask is shared
        with an honest peer. No pair seed is revealed here, whatever the bundles.

        Why: the server obtains b_u for a survivor u, so u's input is hidden only by pair
        masks with honest survivors whose mask key the server never rebuilds (Bonawitz et
        al.). A bundle the server withholds or corrupts must therefore cost u nothing but
        the shares it would have held: u complains (the peer's secrets have one holder
        fewer) and masks exactly as if the bundle had arrived. (Leaving the pair out and
        revealing its seed, as an earlier design did, let a server that withheld every
        bundle strip all pair masks from u's input and then subtract b_u.)
        """
        if message.receiver != self.id:
            raise InconsistentRequest(f"masking request for {message.receiver} sent to {self.id}")
        self._check_survivors(message.survivors, set(self._adverts), "share-stage survivor")
        survivors = set(message.survivors)
        unexpected = set(message.bundles) - (survivors & self._neighbours)
        if unexpected:
            raise InconsistentRequest(f"bundles from non-neighbours {sorted(unexpected)}")
        peers = sorted(survivors & self._neighbours)
        holders = len(self._neighbours) + 1
        floor = self.policy.colluders_for(holders, self.assignment.signed) + 1
        if len(peers) < floor:
            raise InconsistentRequest(
                f"client {self.id}: only {len(peers)} neighbour(s) in the share-stage survivor "
                f"list; it masks only with at least {floor} (one more than the colluders it "
                "resists), so that one pair mask is shared with an honest peer"
            )
        complaints: list[int] = []
        masks = [(self._seed, +1)]
        for peer in peers:
            masks.append((self._mask_seeds[peer], +1 if peer > self.id else -1))
            sealed = message.bundles.get(peer)
            try:
                if sealed is None:
                    raise BundleError(f"no bundle from {peer}")
                envelope = aead.Envelope(peer, self.id, self.context)
                plain = aead.decrypt(self._share_key(peer), sealed, envelope)
                self._held[peer] = SharePair.from_plaintext(plain, peer, self.id)
            except (DecryptionError, BundleError, CryptoError):
                complaints.append(peer)  # holds none of peer's shares; the mask is unchanged
        self._survivors = message.survivors
        self._complaints = frozenset(complaints)
        assert self._vector is not None  # checked by handle()
        vector = combine_masks(np.empty_like(self._vector), [self._vector], masks)
        self._vector = None  # the session keeps no copy of the input once it is masked
        self.state = ClientState.MASKED
        return MaskedInput(self.id, self.context, vector, tuple(complaints))

    def _on_consistency(self, message: ConsistencyRequest) -> ConsistencySignature:
        if not self.assignment.signed:
            raise InconsistentRequest("consistency check requested in unsigned mode")
        self._check_survivors(message.survivors, set(self._survivors), "masked-stage survivor")
        self._signed_survivors = tuple(sorted(message.survivors))
        assert self.policy.identity is not None
        signature = self.policy.identity.sign(
            client_list_message(self.context, self._signed_survivors, SURVIVORS_LABEL)
        )
        self.state = ClientState.SIGNED
        return ConsistencySignature(self.id, self.context, signature)

    def _on_unmask(self, message: UnmaskRequest) -> UnmaskResponse:
        """Invariant I2 (unmask), checked before any share leaves: of each peer the server
        gets one secret at most — b_w (seed share) only for w in the survivor list, the mask
        key's share or the pair seed s_uw only for w in the dropped list; the two lists are
        disjoint, account exactly for U2, and the survivors are at least t clients of U2 (in
        signed mode: the list this client signed, with t valid signatures, so no two groups
        of honest holders can be shown different lists). Pair seeds are revealed only for
        dropped peers whose shares this client does not hold: what the server could rebuild
        from the peer's mask key anyway, and never a mask shared with a survivor.
        """
        survivors, dropped = set(message.survivors), set(message.dropped)
        if survivors & dropped:
            raise InconsistentRequest(
                f"clients {sorted(survivors & dropped)} are both survivors and dropped: "
                "revealing both of their secrets would expose their inputs"
            )
        # no id twice in either list: the request's own check (its constructor)
        self._check_survivors(message.survivors, set(self._survivors), "unmask survivor")
        if survivors | dropped != set(self._survivors):
            raise InconsistentRequest(
                "survivor and dropped lists do not account exactly for the clients that "
                "completed key sharing"
            )
        if self.assignment.signed:
            self._check_signatures(message)
        if self.two_exchange:
            return self._reveal(message, survivors, dropped)
        if message.bundles:
            raise InconsistentRequest("a four-exchange unmask request carries no bundles")
        seed_shares = {
            peer: self._held[peer].seed_share.to_bytes()
            for peer in sorted(survivors)
            if peer in self._held
        }
        key_shares = {
            peer: self._held[peer].key_share.to_bytes()
            for peer in sorted(dropped)
            if peer in self._held
        }
        pair_seeds = {
            peer: self._mask_seeds[peer]
            for peer in sorted(dropped & self._complaints)
            if peer not in self._held
        }
        self.state = ClientState.DONE
        self._held.clear()
        return UnmaskResponse(self.id, self.context, seed_shares, key_shares, pair_seeds)

    def _reveal(
        self, message: UnmaskRequest, survivors: set[int], dropped: set[int]
    ) -> UnmaskResponse:
        """Two-exchange round, I2 (the checks above already passed: disjoint lists that
        account for every member, at least t survivors including this client, signed by t
        in signed mode): of each dealer w whose bundle this client holds it reveals the
        share of b_w only for w in the survivor list, and the share of s_wv only for w a
        survivor and v dropped. So the server learns b_w and the pair seeds of survivors
        with dropped peers — what removes every mask of the survivors' sum — and never a
        pair seed of two survivors nor the self-mask seed of a dropped client. Bundles
        come only from survivors that are neighbours; one that does not arrive, decrypt or
        parse is a complaint (this client holds none of those shares)."""
        unexpected = set(message.bundles) - (survivors & self._neighbours)
        if unexpected:
            raise InconsistentRequest(
                f"client {self.id}: bundles from clients that are not surviving neighbours "
                f"{sorted(unexpected)}"
            )
        assert self._dealt is not None
        held = {self.id: self._dealt}
        complaints: list[int] = []
        for dealer in sorted(survivors & self._neighbours):
            sealed = message.bundles.get(dealer)
            peers = tuple(sorted(self.assignment.neighbours_of(dealer)))
            try:
                if sealed is None:
                    raise BundleError(f"no bundle from {dealer}")
                envelope = aead.Envelope(dealer, self.id, self.context)
                plain = aead.decrypt(self._share_keys[dealer], sealed, envelope)
                held[dealer] = DealtShares.from_plaintext(plain, dealer, self.id, peers)
            except (DecryptionError, BundleError, CryptoError):
                complaints.append(dealer)
        seed_shares = {w: held[w].seed_share.to_bytes() for w in sorted(held)}
        pair_shares = {
            (w, v): share.to_bytes()
            for w in sorted(held)
            for v, share in sorted(held[w].pairs.items())
            if v in dropped
        }
        self.state = ClientState.DONE
        self._dealt = None
        return UnmaskResponse(
            self.id,
            self.context,
            seed_shares,
            {},
            pair_shares=pair_shares,
            complaints=tuple(complaints),
        )

    def _check_signatures(self, message: UnmaskRequest) -> None:
        survivors = tuple(sorted(message.survivors))
        if survivors != self._signed_survivors:
            raise ConsistencyCheckFailed(
                f"the unmask request's survivors {survivors} differ from the list this client "
                f"signed {self._signed_survivors}"
            )
        statement = client_list_message(self.context, survivors, SURVIVORS_LABEL)
        directory = self.policy.directory or {}
        valid = 0
        for signer, signature in message.signatures.items():
            if signer not in message.survivors or signer not in directory:
                continue
            try:
                verify(directory[signer], statement, signature)
                valid += 1
            except SignatureError:
                continue
        if valid < self.assignment.threshold:
            raise ConsistencyCheckFailed(
                f"only {valid} valid signatures on the survivor list, fewer than t = "
                f"{self.assignment.threshold}: the server may have shown different lists"
            )

    # -- state export / import --------------------------------------------------------------

    def export_state(self) -> records.Record:
        """The session as a plain record (:mod:`sharefl.protocol.records`: ints, bytes,
        lists, the input as a numpy array), to keep it between messages in a store that
        holds no Python objects (e.g. Flower's ``Context``).

        The record holds this client's secrets (private keys, self-mask seed, pairwise
        keys, the shares it holds, its input): keep it where only this client can read it.
        The policy, the randomness source and the long-term keys of a two-exchange session
        are not part of it; :meth:`from_state` takes them again.
        """
        r: records.Record = {
            records.TYPE_KEY: SESSION_STATE_TYPE,
            "id": self.id,
            "state": self.state.value,
            "survivors": list(self._survivors),
            "complaints": sorted(self._complaints),
        }
        r.update(records.nest("assignment", records.to_record(self.assignment)))
        if self._vector is not None:
            r["vector"] = self._vector
        if self._signed_survivors is not None:
            r["signed_survivors"] = list(self._signed_survivors)
        records.put_map(r, "held_keys", {p: s.key_share.to_bytes() for p, s in self._held.items()})
        records.put_map(
            r, "held_seeds", {p: s.seed_share.to_bytes() for p, s in self._held.items()}
        )
        if "_enc" in self.__dict__:
            r["enc_private"] = self._enc.private
            r["mask_private"] = self._mask.private
            r["seed"] = self._seed
            r.update(records.nest("advert", records.to_record(self._advert)))
        if self._dealt is not None:  # two-exchange: what the unmask answer needs
            r["dealt_seed"] = self._dealt.seed_share.to_bytes()
            records.put_map(
                r, "dealt_pairs", {v: s.to_bytes() for v, s in self._dealt.pairs.items()}
            )
            records.put_map(r, "share_keys", self._share_keys)
        if "_adverts" in self.__dict__ and self.state is not ClientState.ABORTED:
            broadcast = KeysBroadcast(self.context, tuple(self._adverts.values()))
            r.update(records.nest("adverts", records.to_record(broadcast)))
            records.put_map(r, "share_keys", self._share_keys)
            records.put_map(r, "mask_seeds", self._mask_seeds)
        return r

    @classmethod
    def from_state(
        cls,
        record: Mapping[str, object],
        policy: ClientPolicy | None = None,
        *,
        randbytes: Callable[[int], bytes] = os.urandom,
        keys: ClientKeys | None = None,
    ) -> ClientSession:
        """The session :meth:`export_state` saved, with this client's ``policy`` (checked
        against the assignment again), randomness source and, for a two-exchange session,
        its long-term ``keys``.

        Raises :class:`~sharefl.protocol.records.RecordError` for a record that is not a
        complete session state, and what the constructor raises.
        """
        if record.get(records.TYPE_KEY) != SESSION_STATE_TYPE:
            raise records.RecordError(f"not a {SESSION_STATE_TYPE} record")
        assignment = records.from_record(records.unnest("assignment", record), ClusterAssignment)
        vector = record.get("vector")
        if vector is not None and not isinstance(vector, np.ndarray):
            raise records.RecordError("'vector' must be a numpy array")
        session = cls(
            records.get_int(record, "id"),
            assignment,
            vector,
            policy,
            randbytes=randbytes,
            keys=keys,
        )
        try:
            session.state = ClientState(record.get("state"))
        except ValueError as exc:
            raise records.RecordError(f"unknown session state {record.get('state')!r}") from exc
        session._survivors = records.get_ids(record, "survivors")
        session._complaints = frozenset(records.get_ids(record, "complaints"))
        if "signed_survivors" in record:
            session._signed_survivors = records.get_ids(record, "signed_survivors")
        key_shares = records.get_map(record, "held_keys", SHARE_BYTES)
        seed_shares = records.get_map(record, "held_seeds", SHARE_BYTES)
        if key_shares.keys() != seed_shares.keys():
            raise records.RecordError("'held_keys' and 'held_seeds' name different peers")
        try:
            session._held = {
                p: SharePair(
                    shamir.Share.from_bytes(key_shares[p]), shamir.Share.from_bytes(seed_shares[p])
                )
                for p in key_shares
            }
            if "enc_private" in record:
                session._enc = X25519KeyPair.from_private(
                    records.get_bytes(record, "enc_private", (KEY_BYTES,))
                )
                session._mask = X25519KeyPair.from_private(
                    records.get_bytes(record, "mask_private", (KEY_BYTES,))
                )
                session._seed = records.get_bytes(record, "seed", (KEY_BYTES,))
                session._advert = records.from_record(
                    records.unnest("advert", record), AdvertiseKeys
                )
        except CryptoError as exc:
            raise records.RecordError(f"unusable secrets in the session state: {exc}") from exc
        if "adverts/type" in record:
            broadcast = records.from_record(records.unnest("adverts", record), KeysBroadcast)
            session._adverts = {a.sender: a for a in broadcast.advertisements}
            session._share_keys = records.get_map(record, "share_keys", KEY_BYTES)
            session._mask_seeds = records.get_map(record, "mask_seeds", KEY_BYTES)
        if session.two_exchange:
            return session._restore_dealt(record)
        needs_keys = session.state in (
            ClientState.ADVERTISED,
            ClientState.SHARED,
            ClientState.MASKED,
            ClientState.SIGNED,
        )
        if needs_keys and "_enc" not in session.__dict__:
            raise records.RecordError(f"a {session.state.value} session state lacks its keys")
        if (
            session.state is not ClientState.ADVERTISED
            and needs_keys
            and ("_adverts" not in session.__dict__)
        ):
            raise records.RecordError(f"a {session.state.value} session state lacks the adverts")
        return session

    def _restore_dealt(self, record: Mapping[str, object]) -> ClientSession:
        """Two-exchange state: the own shares dealt and the share keys, which a masked or
        signed session needs to answer the unmask request."""
        if "dealt_seed" in record:
            seed = records.get_bytes(record, "dealt_seed", (SHARE_BYTES,))
            pairs = records.get_map(record, "dealt_pairs", SHARE_BYTES)
            if set(pairs) != set(self._neighbours):
                raise records.RecordError("'dealt_pairs' must name exactly the neighbours")
            try:
                self._dealt = DealtShares(
                    shamir.Share.from_bytes(seed),
                    {v: shamir.Share.from_bytes(pairs[v]) for v in sorted(pairs)},
                )
            except CryptoError as exc:
                raise records.RecordError(f"unusable dealt shares: {exc}") from exc
            self._share_keys = records.get_map(record, "share_keys", KEY_BYTES)
        if self.state in (ClientState.MASKED, ClientState.SIGNED) and self._dealt is None:
            raise records.RecordError(f"a {self.state.value} session state lacks its shares")
        return self
