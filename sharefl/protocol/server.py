"""The server side of per-cluster secure aggregation, as a sans-IO state machine.

A :class:`ServerSession` runs one cluster of one (round, reclustering). The driver feeds it
client messages with :meth:`ServerSession.receive` and calls :meth:`ServerSession.advance`
when a stage is complete or its deadline passed; ``advance`` returns the message for each
client still in the protocol. Clients that did not answer in time are dropped, and the
double-masking recovery carries the cluster as long as t clients reach the end.

States: ``ADVERTISE → SHARE → MASK → [CONSISTENCY] → UNMASK → DONE`` or ``FAILED`` (fewer
than t clients at some stage, a sum the release check withholds, or a secret that cannot be
reconstructed). A rejected message raises :class:`RejectedMessage` and changes nothing else:
the server keeps serving the other clients, and the sender counts as dropped unless it
sends a valid message in time.

Complaints. A client whose share bundle from peer u did not arrive or decrypt names u in
its masked input and masks exactly as if the bundle had arrived (invariant I1 of
:mod:`sharefl.protocol.client`): a complaint reveals nothing and weakens no mask, so a
server that withholds bundles gains nothing. It only says that u's secrets have one holder
fewer. A false complaint removes nobody: the accused stays in the sum as long as t holders
return its shares. Only when *every* (at least two) neighbour of u complains is u
*disowned*: left out of the sum as if it had dropped (:attr:`ClusterSum.excluded`), and its
peers reveal the pair seeds they masked with it (:attr:`UnmaskResponse.pair_seeds`, what
u's mask key would give for a dropped client, never its self-mask seed). A disowned client
is never named: complaints are words, and m − 1 lying peers can all complain about an
honest one. A client whose secrets cannot be rebuilt makes its cluster fail; it is named in
:attr:`FailedCluster.culprits` only when its own dealing is inconsistent with what it
advertised (the shares rebuild no secret matching its commitment or public key), never
because holders complained or too few shares arrived.

Release check. ``approve(members)`` (optional) is asked once the members of the sum are
final, before any unmask request is sent: a refusal ends the cluster as failed at stage
``release``, so the sum is never computed.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

from sharefl.crypto import shamir
from sharefl.crypto.errors import (
    InvalidKeyError,
    ShamirError,
    ShareVerificationError,
    SignatureError,
)
from sharefl.crypto.kdf import (
    TWO_EXCHANGE_VERSION,
    Purpose,
    check_public_key,
    pairwise_key,
    x25519_public_key,
)
from sharefl.crypto.prg import combine_masks, ring_dtype
from sharefl.crypto.signatures import client_list_message, verify
from sharefl.protocol.atoms import Atoms, whole_atoms
from sharefl.protocol.bundles import (
    dealt_bytes,
    pair_commitment,
    seed_commitment,
)
from sharefl.protocol.client import SURVIVORS_LABEL
from sharefl.protocol.errors import ConfigurationError, RejectedMessage, StageError
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

K = TypeVar("K", int, tuple[int, int])


class ServerState(enum.Enum):
    ADVERTISE = "advertise"
    SHARE = "share"
    MASK = "mask"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class ClusterSum:
    """A successful cluster: the exact sum mod 2^b of the inputs of ``members``.

    Two fields, never one that changes meaning: ``ring_sum`` is always the exact sum in
    Z_2^b; ``decoded`` is the float64 sum only when the round encoded float inputs (the
    round coordinator fills it), else ``None``.

    Attributes:
        cluster: the cluster id (``context.cluster``).
        members: clients whose inputs are in the sum (sorted).
        ring_sum: the exact sum in Z_2^b (1-D uint32/uint64 array).
        dropped: assigned clients whose inputs are not in the sum (any stage).
        excluded: clients left out of this sum because every neighbour complained about
            their share bundles (*disowned*): dropped for the round, never named (the
            complainers may be lying; see the module docstring).
        complaints: (complainer, accused) pairs: the accused's share bundle did not decrypt
            for the complainer (both stay in the sum unless the accused is disowned).
        bad_shares: (holder, owner) pairs: shares that did not match the owner's secret.
        decoded: the decoded float64 sum of float inputs; ``None`` for ring inputs.
    """

    cluster: int
    members: tuple[int, ...]
    ring_sum: np.ndarray
    dropped: tuple[int, ...] = ()
    excluded: tuple[int, ...] = ()
    complaints: tuple[tuple[int, int], ...] = ()
    bad_shares: tuple[tuple[int, int], ...] = ()
    decoded: np.ndarray | None = None

    @property
    def sum(self) -> np.ndarray:
        """The sum in the inputs' domain: :attr:`decoded` when the inputs were floats,
        :attr:`ring_sum` when they were ring elements. Prefer the explicit fields."""
        return self.ring_sum if self.decoded is None else self.decoded

    @property
    def float_sum(self) -> np.ndarray:
        """:attr:`decoded`; raises :class:`~sharefl.protocol.errors.StageError` for a
        cluster of ring inputs (there is no float sum to use)."""
        if self.decoded is None:
            raise StageError(
                f"cluster {self.cluster} summed ring elements: use ring_sum (no encoding)"
            )
        return self.decoded


@dataclass(frozen=True)
class FailedCluster:
    """A cluster that could not produce a sum; no partial result is released.

    Attributes:
        cluster: the cluster id.
        members: every client assigned to the cluster.
        stage: the stage at which it failed (``release``: withheld by the release check).
        reason: why (which count fell below t, or which secret could not be rebuilt).
        culprits: the clients that provably made it fail (their shares rebuild no secret
            matching their commitment or public key); empty when it failed for lack of
            clients or of shares (complaints and missing shares prove nothing).
    """

    cluster: int
    members: tuple[int, ...]
    stage: str
    reason: str
    culprits: tuple[int, ...] = ()


@dataclass
class _Collected:
    adverts: dict[int, AdvertiseKeys] = field(default_factory=dict)
    bundles: dict[int, dict[int, bytes]] = field(default_factory=dict)
    masked: dict[int, MaskedInput] = field(default_factory=dict)
    dealt: dict[int, MaskedShares] = field(default_factory=dict)
    signatures: dict[int, bytes] = field(default_factory=dict)
    unmasked: dict[int, UnmaskResponse] = field(default_factory=dict)


class ServerSession:
    """The server's run of one cluster.

    Args:
        assignment: the cluster assignment sent to the members.
        directory: members' Ed25519 public keys; in signed mode, advertisements and
            consistency signatures are checked on receipt (an invalid one, or one from a
            member the directory does not know, is rejected). Required in signed mode:
            raises :class:`ConfigurationError` without it.
        approve: the release check, called with the final members of the sum before any
            unmask request; it returns ``None`` to go on, or the reason to withhold the sum.
        atoms: the plan's atoms (:mod:`sharefl.protocol.atoms`): an atom with a member that
            sent no masked input leaves the sum whole — its other members are listed as
            dropped (their mask keys are rebuilt, never their self-mask seeds), so the sum
            covers complete atoms only. ``None``: per-client sums.
    """

    def __init__(
        self,
        assignment: ClusterAssignment,
        directory: Mapping[int, bytes] | None = None,
        approve: Callable[[tuple[int, ...]], str | None] | None = None,
        *,
        atoms: Atoms | None = None,
    ) -> None:
        if assignment.threshold < 2 or assignment.threshold > len(assignment.members):
            raise ConfigurationError(
                f"threshold {assignment.threshold} must be in [2, {len(assignment.members)}]"
            )
        if assignment.signed and directory is None:
            raise ConfigurationError(
                "a signed cluster needs the members' identity keys: pass directory="
            )
        self.assignment = assignment
        self.context = assignment.context
        self.state = ServerState.ADVERTISE
        self._directory = dict(directory or {})
        self._approve = approve
        self._atoms = atoms
        self._excluded: tuple[int, ...] = ()
        self._dtype = ring_dtype(assignment.bits)
        self._x = {m: i + 1 for i, m in enumerate(assignment.members)}
        self._got = _Collected()
        self._withdrawn: set[int] = set()
        self._u1: tuple[int, ...] = ()
        self._u2: tuple[int, ...] = ()
        self._u3: tuple[int, ...] = ()
        self._recipients: tuple[int, ...] = ()
        self.outcome: ClusterSum | FailedCluster | None = None
        self._two = assignment.context.version == TWO_EXCHANGE_VERSION
        if self._two:
            # Keys were set up once: every member masks with all its neighbours at once.
            if {a.sender for a in assignment.keys} != set(assignment.members):
                raise ConfigurationError(
                    "a two-exchange assignment carries one key advert per member"
                )
            self._adverts_v3 = {a.sender: a for a in assignment.keys}
            self._u1 = self._u2 = assignment.members
            self.state = ServerState.MASK

    # -- receiving ------------------------------------------------------------------------

    def receive(self, message: ClientMessage) -> None:
        """Validate and store one client message.

        Raises :class:`RejectedMessage` (naming the sender) for a message of the wrong
        stage, context, sender or shape; nothing is stored then.
        """
        expected: dict[ServerState, tuple[type, Collection[int], Callable[[Any], None]]] = {
            ServerState.ADVERTISE: (AdvertiseKeys, self.assignment.members, self._on_advert),
            ServerState.SHARE: (EncryptedShares, self._u1, self._on_shares),
            ServerState.MASK: (
                (MaskedShares, self._u2, self._on_masked_shares)
                if self._two
                else (MaskedInput, self._u2, self._on_masked)
            ),
            ServerState.CONSISTENCY: (ConsistencySignature, self._u3, self._on_signature),
            ServerState.UNMASK: (UnmaskResponse, self._recipients, self._on_unmask),
        }
        sender = getattr(message, "sender", None)
        if sender in self._withdrawn:
            raise RejectedMessage(
                f"client {sender} refused cluster {self.context.cluster} and then sent "
                f"{type(message).__name__} for it",
                sender,
            )
        if self.state not in expected:
            raise RejectedMessage(
                f"cluster {self.context.cluster} is {self.state.value}", sender, misbehaviour=False
            )
        kind, allowed, handler = expected[self.state]
        if not isinstance(message, kind):
            raise RejectedMessage(
                f"expected {kind.__name__} in stage {self.state.value}, got "
                f"{type(message).__name__}",
                sender,
                misbehaviour=False,
            )
        if message.context != self.context:
            raise RejectedMessage(
                f"message for {message.context} sent to {self.context}: wrong round, "
                "reclustering or cluster",
                sender,
            )
        if sender not in allowed:
            raise RejectedMessage(
                f"client {sender} may not send {kind.__name__} in stage {self.state.value}",
                sender,
                misbehaviour=sender not in self.assignment.members,
            )
        handler(message)

    def _first(self, store: Mapping[int, object], sender: int) -> None:
        if sender in store:
            raise RejectedMessage(f"duplicate message from client {sender}", sender)

    def _on_advert(self, m: AdvertiseKeys) -> None:
        """Accept an advertisement only if relaying it cannot hurt an honest member.

        Rejected (naming the sender): a low-order or malformed X25519 key, an encryption
        key equal to the mask key, a key another member of this cluster already advertised
        (relayed, either would make every honest peer refuse the whole broadcast), and in
        signed mode a signature that does not verify against the directory.
        """
        self._first(self._got.adverts, m.sender)
        self._check_advertised_keys(m)
        if self.assignment.signed:
            self._check_signature(m.sender, m.statement(), m.signature, "advertisement")
        self._got.adverts[m.sender] = m

    def _check_advertised_keys(self, m: AdvertiseKeys) -> None:
        """Raise :class:`RejectedMessage` for a low-order key, equal keys, or a key that
        another member of this cluster already advertised."""
        for what, key in (("encryption", m.encryption_public), ("mask", m.mask_public)):
            try:
                check_public_key(key)
            except InvalidKeyError as exc:
                raise RejectedMessage(
                    f"client {m.sender}: {what} public key refused: {exc}", m.sender
                ) from exc
        if m.encryption_public == m.mask_public:
            raise RejectedMessage(
                f"client {m.sender}: the encryption and mask public keys must differ", m.sender
            )
        for other in self._got.adverts.values():
            if {m.encryption_public, m.mask_public} & {other.encryption_public, other.mask_public}:
                raise RejectedMessage(
                    f"client {m.sender}: advertised a public key client {other.sender} "
                    "already advertised in this cluster",
                    m.sender,
                )

    def _on_shares(self, m: EncryptedShares) -> None:
        self._first(self._got.bundles, m.sender)
        expected = self.assignment.neighbours_of(m.sender) & set(self._u1)
        if set(m.bundles) != expected:
            raise RejectedMessage(
                f"client {m.sender}: bundles must go to exactly its neighbours that advertised "
                f"{sorted(expected)}; got {sorted(m.bundles)}",
                m.sender,
            )
        self._got.bundles[m.sender] = dict(m.bundles)

    def _on_masked(self, m: MaskedInput) -> None:
        self._first(self._got.masked, m.sender)
        self._check_vector(m.sender, m.vector)
        bad = set(m.complaints) - (self.assignment.neighbours_of(m.sender) & set(self._u2))
        if bad:  # (no complaint twice: the message's own check)
            raise RejectedMessage(
                f"client {m.sender}: complaints must name distinct neighbours that shared keys; "
                f"got {sorted(m.complaints)}",
                m.sender,
            )
        self._got.masked[m.sender] = m

    def _on_masked_shares(self, m: MaskedShares) -> None:
        """Two-exchange round: the vector's type and length, and exactly one pair commitment
        and one bundle (of the size a dealer of that many neighbours seals) per neighbour of
        the sender (the commitments' sizes are the message's own)."""
        self._first(self._got.dealt, m.sender)
        self._check_vector(m.sender, m.vector)
        peers = self.assignment.neighbours_of(m.sender)
        if set(m.pair_commitments) != peers or set(m.bundles) != peers:
            raise RejectedMessage(
                f"client {m.sender}: one pair commitment and one bundle per neighbour "
                f"{sorted(peers)}; got {sorted(m.pair_commitments)} and {sorted(m.bundles)}",
                m.sender,
            )
        size = dealt_bytes(len(peers))
        wrong = sorted(h for h, b in m.bundles.items() if len(b) != size)
        if wrong:
            raise RejectedMessage(
                f"client {m.sender}: bundles for {wrong} are not {size} bytes", m.sender
            )
        self._got.dealt[m.sender] = m

    def _check_vector(self, sender: int, v: object) -> None:
        if (
            not isinstance(v, np.ndarray)
            or v.dtype != self._dtype
            or v.shape != (self.assignment.length,)
        ):
            raise RejectedMessage(
                f"client {sender}: masked vector must be a 1-D {self._dtype} array of length "
                f"{self.assignment.length}; got {getattr(v, 'dtype', type(v).__name__)} "
                f"{getattr(v, 'shape', '')}",
                sender,
            )

    def _on_signature(self, m: ConsistencySignature) -> None:
        self._first(self._got.signatures, m.sender)
        statement = client_list_message(self.context, self._u3, SURVIVORS_LABEL)
        self._check_signature(m.sender, statement, m.signature, "consistency")
        self._got.signatures[m.sender] = m.signature

    def _check_signature(self, sender: int, statement: bytes, signature: bytes, what: str) -> None:
        """Raise :class:`RejectedMessage` unless ``signature`` over ``statement`` verifies
        with the sender's identity key; a sender the directory does not know is rejected."""
        if sender not in self._directory:
            raise RejectedMessage(
                f"client {sender}: no identity key in the server's directory, so its "
                f"{what} signature cannot be checked; add it to the directory",
                sender,
            )
        try:
            verify(self._directory[sender], statement, signature)
        except SignatureError as exc:
            raise RejectedMessage(
                f"client {sender}: {what} signature does not verify", sender
            ) from exc

    def _on_unmask(self, m: UnmaskResponse) -> None:
        self._first(self._got.unmasked, m.sender)
        dropped = set(self._u2) - set(self._u3)
        if self._two:
            self._check_reveal(m, dropped)
            self._got.unmasked[m.sender] = m
            return
        if not set(m.seed_shares) <= set(self._u3) or not set(m.key_shares) <= dropped:
            raise RejectedMessage(
                f"client {m.sender}: shares for clients outside the survivor/dropped lists",
                m.sender,
            )
        complained = (
            set(self._got.masked[m.sender].complaints) if m.sender in self._got.masked else set()
        )
        if not set(m.pair_seeds) <= dropped & complained - set(m.key_shares):
            raise RejectedMessage(
                f"client {m.sender}: pair seeds only for dropped peers it complained about "
                f"({sorted(dropped & complained)})",
                m.sender,
            )
        self._check_shares(m.sender, (*m.seed_shares.values(), *m.key_shares.values()))
        self._got.unmasked[m.sender] = m

    def _check_reveal(self, m: UnmaskResponse, dropped: set[int]) -> None:
        """Two-exchange round: seed shares of survivors the sender holds shares of (its
        surviving neighbours and itself), shares of s_wv only for such a survivor w and a
        dropped neighbour v of w, complaints only about surviving neighbours, and every
        share at the sender's coordinate."""
        survivors = set(self._u3)
        dealers = (self.assignment.neighbours_of(m.sender) | {m.sender}) & survivors
        pairs_ok = all(
            w in dealers and v in dropped and v in self.assignment.neighbours_of(w)
            for w, v in m.pair_shares
        )
        complaints = set(m.complaints)
        if (
            not set(m.seed_shares) <= dealers
            or m.key_shares
            or m.pair_seeds
            or not pairs_ok
            or not complaints <= dealers - {m.sender}
        ):
            raise RejectedMessage(
                f"client {m.sender}: shares only of surviving dealers it holds "
                f"{sorted(dealers)} (pair seeds only with dropped peers), complaints only "
                "about them",
                m.sender,
            )
        self._check_shares(m.sender, (*m.seed_shares.values(), *m.pair_shares.values()))

    def _check_shares(self, sender: int, blobs: Collection[bytes]) -> None:
        try:
            for blob in blobs:
                share = shamir.Share.from_bytes(blob)
                if share.x != self._x[sender]:
                    raise ShamirError(f"share x = {share.x} is not the sender's coordinate")
        except ShamirError as exc:
            raise RejectedMessage(f"client {sender}: malformed share: {exc}", sender) from exc

    # -- advancing ------------------------------------------------------------------------

    def expected_senders(self) -> tuple[int, ...]:
        """Clients the server is waiting for in the current stage (sorted)."""
        return {
            ServerState.ADVERTISE: self.assignment.members,
            ServerState.SHARE: self._u1,
            ServerState.MASK: self._u2,
            ServerState.CONSISTENCY: self._u3,
            ServerState.UNMASK: self._recipients,
        }.get(self.state, ())

    def withdraw(self, member: int) -> None:
        """``member`` refused this cluster: it sends nothing more here, so no stage waits
        for it, and a message it sends for this cluster afterwards is rejected as
        misbehaviour (an honest client drops a cluster it refused).

        The server's view is that of ``member`` falling silent, which a client can always
        do; only the time the server waits changes, so every invariant of the stages
        holds as for a drop-out at this stage. Raises :class:`ValueError` for a client
        that is not a member."""
        if member not in self.assignment.members:
            raise ValueError(f"client {member} is not a member of cluster {self.context.cluster}")
        self._withdrawn.add(member)

    def waiting_for(self) -> frozenset[int]:
        """Expected senders of the current stage whose message has not arrived yet (those
        who refused the cluster are not waited for: :meth:`withdraw`)."""
        stores: dict[ServerState, Mapping[int, object]] = {
            ServerState.ADVERTISE: self._got.adverts,
            ServerState.SHARE: self._got.bundles,
            ServerState.MASK: self._got.dealt if self._two else self._got.masked,
            ServerState.CONSISTENCY: self._got.signatures,
            ServerState.UNMASK: self._got.unmasked,
        }
        received = stores.get(self.state, {})
        return frozenset(self.expected_senders()) - received.keys() - self._withdrawn

    def advance(self) -> dict[int, ServerMessage]:
        """Close the current stage (all messages in, or the deadline passed).

        Returns the next message for every client still in the protocol: empty when the
        cluster finished (see :attr:`outcome`) or failed. Raises :class:`StageError` when
        called after the end.
        """
        steps: dict[ServerState, Callable[[], dict[int, ServerMessage]]] = {
            ServerState.ADVERTISE: self._close_advertise,
            ServerState.SHARE: self._close_share,
            ServerState.MASK: self._close_mask,
            ServerState.CONSISTENCY: self._close_consistency,
            ServerState.UNMASK: self._close_unmask,
        }
        if self.state not in steps:
            raise StageError(f"cluster {self.context.cluster} already {self.state.value}")
        return steps[self.state]()

    def _fail(
        self, stage: ServerState | str, reason: str, culprits: tuple[int, ...] = ()
    ) -> dict[int, ServerMessage]:
        self.state = ServerState.FAILED
        name = stage.value if isinstance(stage, ServerState) else stage
        self.outcome = FailedCluster(
            self.context.cluster, self.assignment.members, name, reason, culprits
        )
        return {}

    def _enough(self, stage: ServerState, clients: tuple[int, ...], what: str) -> bool:
        if len(clients) >= self.assignment.threshold:
            return True
        self._fail(
            stage,
            f"{len(clients)} clients {what}, fewer than t = {self.assignment.threshold}",
        )
        return False

    def _close_advertise(self) -> dict[int, ServerMessage]:
        self._u1 = tuple(sorted(self._got.adverts))
        if not self._enough(ServerState.ADVERTISE, self._u1, "advertised keys"):
            return {}
        broadcast = KeysBroadcast(self.context, tuple(self._got.adverts[u] for u in self._u1))
        self.state = ServerState.SHARE
        return dict.fromkeys(self._u1, broadcast)

    def _close_share(self) -> dict[int, ServerMessage]:
        self._u2 = tuple(sorted(self._got.bundles))
        if not self._enough(ServerState.SHARE, self._u2, "shared keys"):
            return {}
        self.state = ServerState.MASK
        return {
            v: MaskingRequest(
                self.context,
                v,
                self._u2,
                {w: self._got.bundles[w][v] for w in self._u2 if v in self._got.bundles[w]},
            )
            for v in self._u2
        }

    def _close_mask(self) -> dict[int, ServerMessage]:
        if self._two:
            masked = set(self._got.dealt)  # complaints come with the unmask replies
        else:
            masked = set(self._got.masked)
            self._excluded = tuple(sorted(u for u in masked if self._disowned(u, masked)))
        self._u3 = whole_atoms(masked - set(self._excluded), self._atoms)
        if not self._enough(ServerState.MASK, self._u3, "sent masked inputs"):
            return {}
        if self._approve is not None:
            withheld = self._approve(self._u3)
            if withheld is not None:
                return self._fail("release", withheld)
        if self.assignment.signed:
            self.state = ServerState.CONSISTENCY
            return dict.fromkeys(self._u3, ConsistencyRequest(self.context, self._u3))
        return self._request_unmask(self._u3, {})

    def _disowned(self, u: int, masked: set[int]) -> bool:
        """Every one of u's (at least two) neighbours that sent a masked input complained
        that u's share bundle did not decrypt: nobody holds its shares, so u is left out of
        the sum as if it had dropped (its peers reveal the pair seeds they masked with it)
        instead of failing the cluster. Never a reason to name u: the complainers may be
        the m − 1 liars of the cluster."""
        peers = self.assignment.neighbours_of(u) & masked
        return len(peers) >= 2 and all(u in self._got.masked[v].complaints for v in peers)

    def _close_consistency(self) -> dict[int, ServerMessage]:
        signers = tuple(sorted(self._got.signatures))
        if not self._enough(ServerState.CONSISTENCY, signers, "signed the survivor list"):
            return {}
        return self._request_unmask(signers, dict(self._got.signatures))

    def _request_unmask(
        self, recipients: tuple[int, ...], signatures: dict[int, bytes]
    ) -> dict[int, ServerMessage]:
        self._recipients = recipients
        dropped = tuple(sorted(set(self._u2) - set(self._u3)))
        request = UnmaskRequest(self.context, self._u3, dropped, signatures)
        self.state = ServerState.UNMASK
        if not self._two:
            return dict.fromkeys(recipients, request)
        # Each holder gets the bundles the survivors among its neighbours dealt it.
        return {
            h: replace(
                request,
                bundles={
                    w: self._got.dealt[w].bundles[h]
                    for w in self._u3
                    if h in self._got.dealt[w].bundles
                },
            )
            for h in recipients
        }

    def _close_unmask(self) -> dict[int, ServerMessage]:
        responders = tuple(sorted(self._got.unmasked))
        if not self._enough(ServerState.UNMASK, responders, "answered the unmask request"):
            return {}
        if self._two:
            return self._close_reveal()
        survivors = set(self._u3)
        dropped = tuple(sorted(set(self._u2) - survivors))
        # Every survivor masked with each of its neighbours in U2 (complaints change no mask).
        masked_with = {v: self.assignment.neighbours_of(v) & set(self._u2) for v in self._u3}
        # Dropped clients matter only if some survivor masked with them.
        needed_keys = [w for w in dropped if any(w in masked_with[v] for v in self._u3)]
        bad: list[tuple[int, int]] = []
        seeds, lost = self._reconstruct(
            self._u3, lambda r: r.seed_shares, self._seed_ok, bad, "seed"
        )
        keys, lost_keys = self._reconstruct(
            needed_keys, lambda r: r.key_shares, self._key_ok, bad, "key"
        )
        pair_seeds: dict[tuple[int, int], bytes] = {}
        for w, why in lost_keys.items():
            # No key for w: each survivor that masked with w must have revealed s_vw itself.
            revealed = {
                v: self._got.unmasked[v].pair_seeds[w]
                for v in self._u3
                if w in masked_with[v]
                and v in self._got.unmasked
                and w in self._got.unmasked[v].pair_seeds
            }
            if len(revealed) == sum(w in masked_with[v] for v in self._u3):
                pair_seeds.update({(v, w): seed for v, seed in revealed.items()})
            else:
                lost[w] = why
        if lost:
            culprits = tuple(sorted(owner for owner, (_, fault) in lost.items() if fault))
            reasons = "; ".join(why for why, _ in lost.values())
            return self._fail(ServerState.UNMASK, reasons, culprits)
        masks = [(seeds[v], -1) for v in self._u3]
        for w in needed_keys:
            for v in self._u3:
                if w in masked_with[v]:
                    seed = pair_seeds.get((v, w)) or pairwise_key(
                        keys[w],
                        self._got.adverts[v].mask_public,
                        self.context,
                        Purpose.MASK_SEED,
                        w,
                        v,
                    )
                    # v added +PRG(s_vw) if w > v, else subtracted it: undo exactly that.
                    masks.append((seed, -1 if w > v else +1))
        complaints = {v: self._got.masked[v].complaints for v in self._u3}
        total = combine_masks(
            np.empty(self.assignment.length, dtype=self._dtype),
            [self._got.masked[v].vector for v in self._u3],
            masks,
        )
        self.state = ServerState.DONE
        self.outcome = ClusterSum(
            cluster=self.context.cluster,
            members=self._u3,
            ring_sum=total,
            dropped=tuple(sorted(set(self.assignment.members) - survivors)),
            excluded=self._excluded,
            complaints=tuple(sorted((v, u) for v, c in complaints.items() for u in c)),
            bad_shares=tuple(sorted(bad)),
        )
        return {}

    def _close_reveal(self) -> dict[int, ServerMessage]:
        """Two-exchange round: rebuild b_w of every survivor w and s_wv of every survivor
        w with a dropped neighbour v (each checked against the commitment w sent with its
        input), then y_S − Σ PRG(b_w) ∓ Σ PRG(s_wv) is the survivors' exact sum: the pair
        masks between survivors cancel in the sum."""
        survivors, dropped = set(self._u3), set(self._u2) - set(self._u3)
        pairs = [
            (w, v) for w in self._u3 for v in sorted(self.assignment.neighbours_of(w) & dropped)
        ]
        bad: list[tuple[int, int]] = []
        seeds, lost = self._reconstruct(
            self._u3, lambda r: r.seed_shares, self._seed_ok_v3, bad, "seed"
        )
        pair_seeds, lost_pairs = self._reconstruct(
            pairs, lambda r: r.pair_shares, self._pair_ok, bad, "pair seed"
        )
        for (w, v), why in lost_pairs.items():
            lost.setdefault(w, (f"{why[0]} (with dropped {v})", why[1]))
        if lost:
            culprits = tuple(sorted(owner for owner, (_, fault) in lost.items() if fault))
            reasons = "; ".join(why for why, _ in lost.values())
            return self._fail(ServerState.UNMASK, reasons, culprits)
        masks = [(seeds[w], -1) for w in self._u3]
        # w added +PRG(s_wv) if v > w, else subtracted it: undo exactly that.
        masks += [(pair_seeds[(w, v)], -1 if v > w else +1) for w, v in pairs]
        total = combine_masks(
            np.empty(self.assignment.length, dtype=self._dtype),
            [self._got.dealt[w].vector for w in self._u3],
            masks,
        )
        complaints = {h: r.complaints for h, r in self._got.unmasked.items()}
        self.state = ServerState.DONE
        self.outcome = ClusterSum(
            cluster=self.context.cluster,
            members=self._u3,
            ring_sum=total,
            dropped=tuple(sorted(set(self.assignment.members) - survivors)),
            complaints=tuple(sorted((h, w) for h, c in complaints.items() for w in c)),
            bad_shares=tuple(sorted(bad)),
        )
        return {}

    def _seed_ok_v3(self, owner: int, secret: bytes) -> bool:
        committed = self._got.dealt[owner].seed_commitment
        return seed_commitment(self.context, owner, secret) == committed

    def _pair_ok(self, pair: tuple[int, int], secret: bytes) -> bool:
        w, v = pair
        return (
            pair_commitment(self.context, w, v, secret) == (self._got.dealt[w].pair_commitments[v])
        )

    def _seed_ok(self, owner: int, secret: bytes) -> bool:
        return seed_commitment(self.context, owner, secret) == self._got.adverts[owner].commitment

    def _key_ok(self, owner: int, secret: bytes) -> bool:
        return x25519_public_key(secret) == self._got.adverts[owner].mask_public

    def _reconstruct(
        self,
        owners: Sequence[K],
        shares_in: Callable[[UnmaskResponse], Mapping[K, bytes]],
        check: Callable[[K, bytes], bool],
        bad: list[tuple[int, int]],
        what: str,
    ) -> tuple[dict[K, bytes], dict[K, tuple[str, bool]]]:
        """Rebuild one secret per owner (a client, or a (dealer, peer) pair of the
        two-exchange round) from the responders' shares (``shares_in(response)``).

        Fast path: the first t shares of each owner, grouped by holder set so one Lagrange
        computation serves all owners with the same holders; each result is checked
        (commitment or public key). A secret that fails the check is rebuilt with verified
        Shamir over all its shares, which names the bad shares (recorded in ``bad`` as
        (holder, dealer)). Returns the rebuilt secrets and, for each owner whose secret
        cannot be rebuilt (fewer than t shares, or none consistent with its commitment /
        public key), why and whether that is proof against the dealer: only shares that
        rebuild no secret matching what it committed to are; too few shares never are
        (holders that complained or withheld shares may be lying).
        """
        t = self.assignment.threshold
        by_x = {self._x[h]: h for h in self._got.unmasked}
        shares: dict[K, list[shamir.Share]] = {}
        lost: dict[K, tuple[str, bool]] = {}
        for owner in owners:
            shares[owner] = [
                shamir.Share.from_bytes(shares_in(self._got.unmasked[h])[owner])
                for h in sorted(self._got.unmasked)
                if owner in shares_in(self._got.unmasked[h])
            ]
            if len(shares[owner]) < t:
                dealer = _dealer(owner)
                lost[owner] = (
                    f"only {len(shares[owner])} shares of client {dealer}'s {what} arrived, "
                    f"fewer than t = {t} ({len(self._complainers(dealer))} holders could not "
                    "decrypt its bundle)",
                    False,  # complaints and missing shares are words, not proof
                )
        groups: dict[tuple[int, ...], list[K]] = {}
        for owner in owners:
            if owner not in lost:
                groups.setdefault(tuple(s.x for s in shares[owner][:t]), []).append(owner)
        secrets: dict[K, bytes] = {}
        for xs, members in groups.items():
            rebuilt = shamir.Reconstructor(xs, t).reconstruct_many(
                [[s.y for s in shares[o][:t]] for o in members]
            )
            for owner, value in zip(members, rebuilt, strict=True):
                secret = value.to_bytes(33, "big")[1:] if value < 2**256 else None
                if secret is not None and check(owner, secret):
                    secrets[owner] = secret
                    continue
                try:
                    verified = shamir.reconstruct_verified(
                        shares[owner], t, functools.partial(check, owner)
                    )
                except ShareVerificationError as exc:
                    lost[owner] = (
                        f"cannot rebuild client {_dealer(owner)}'s {what}: {exc}",
                        True,
                    )
                    continue
                secrets[owner] = verified.secret
                bad.extend((by_x[x], _dealer(owner)) for x in verified.bad)
        return secrets, lost

    def _complainers(self, dealer: int) -> set[int]:
        """Responders that said they hold none of ``dealer``'s shares: in its masked input
        (four-exchange round) or in its unmask reply (two-exchange round)."""
        answered = (set(self._got.unmasked) & self.assignment.neighbours_of(dealer)) - {dealer}
        if self._two:
            return {h for h in answered if dealer in self._got.unmasked[h].complaints}
        return {
            h
            for h in answered
            if h in self._got.masked and dealer in self._got.masked[h].complaints
        }


def _dealer(owner: int | tuple[int, int]) -> int:
    """The client whose dealing a secret comes from (a pair (w, v): w's share of s_wv)."""
    return owner if isinstance(owner, int) else owner[0]
