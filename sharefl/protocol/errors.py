"""Named exceptions of :mod:`sharefl.protocol`.

Three families:

- :class:`ClientRefusal` — an honest client refuses a server request that would hurt its
  privacy (both secrets of one peer, overlapping lists, a lowered threshold, a replayed or
  unsigned message, inconsistent survivor lists). The client's session is then aborted and
  reveals nothing more.
- :class:`RejectedMessage` — the server rejects one client's message (wrong stage, wrong
  round or cluster, wrong length, unknown sender, bad signature). The server keeps serving
  the others; the sender is treated as dropped.
- :class:`MalformedMessage` — a protocol message (:mod:`sharefl.protocol.messages`) or key
  advert refused by its own constructor: a field of the wrong type, size or range, a list
  over its cap, duplicate ids. Both codecs turn it into their own error
  (``WireError``, ``RecordError``); code that builds a message in process gets it directly.
"""

from __future__ import annotations

from sharefl.errors import ConfigurationError as ConfigurationError  # the one root, re-exported
from sharefl.errors import ShareflError


class ProtocolError(ShareflError):
    """Base class of every error raised by :mod:`sharefl.protocol` (its configuration
    errors derive from :class:`~sharefl.errors.ConfigurationError`, the root of every
    package's, re-exported here)."""


class ClientRefusal(ProtocolError):
    """An honest client refuses a server request; its session is aborted."""


class ThresholdTooLow(ClientRefusal):
    """The server asked for a threshold below the client's floor."""


class ContextMismatch(ClientRefusal):
    """A message belongs to another round, reclustering or cluster (replay)."""


class InconsistentRequest(ClientRefusal):
    """Overlapping survivor/dropped lists, lists that grew, too few members, or a request
    that would reveal both secrets of one peer."""


class ConsistencyCheckFailed(ClientRefusal):
    """Fewer than t valid signatures on the survivor list this client saw (the server
    showed different lists to different clients, or forged signatures)."""


class BadAdvertisement(ClientRefusal):
    """A relayed key advertisement is malformed, duplicated, not signed by its owner, or
    carries a low-order X25519 public key."""


class VersionRefused(ClientRefusal):
    """The server asked for a protocol version this client does not speak (or one its
    policy does not accept)."""


class MalformedRequest(ClientRefusal):
    """A server message whose fields cannot be used (wrong sizes, bad encodings)."""


class PlanRefused(ClientRefusal):
    """The round plan is unacceptable: missing, without this client, with more
    reclusterings than the client allows, or with cluster sums that leak (or cannot be
    audited within the budget)."""


class OffPlan(InconsistentRequest):
    """An assignment that is not in the committed round plan: another round or plan digest,
    a reclustering or cluster index outside the plan, or members that differ from it."""


class ReclusteringReused(InconsistentRequest):
    """A second cluster for this client in a reclustering where it already took part (the
    server could subtract the two sums)."""


class ClusterTooSmall(ClientRefusal):
    """A cluster smaller than the client's minimum, or a neighbour graph that gives some
    member fewer neighbours than the minimum."""


class ReleaseLeaks(ClientRefusal):
    """Answering this unmask request would let the server solve, from the sums this client
    helped release in the round, an individual update or a sum of too few clients."""


class RoundReplayed(ClientRefusal):
    """A round number that does not strictly increase within the server's run: this client
    already took part in that round or a later one (see :mod:`sharefl.protocol.memory`).
    The server must start a new round with a higher number."""


class ModelReplayed(ClientRefusal):
    """A model this client already contributed an update for, now under other clusterings
    (sums of the same update over different clusters can be subtracted), or with more
    releases on it than the client keeps. The server must send a new model, or reuse the
    clusterings it used on that model."""


class AtomRefused(ClientRefusal):
    """A round plan that breaks this client's atom (:mod:`sharefl.protocol.atoms`): no atoms
    while this client has one, another roster for it than the one it remembers, an atom
    below the floor, a cluster that cuts an atom, or an unmask request whose survivors cut
    one."""


class BudgetExhausted(ClientRefusal):
    """Joining this round would take the client past its own budget
    (:mod:`sharefl.protocol.budget`): ``max_rounds`` rounds, or ``max_epsilon`` of the noise
    it adds itself."""


class RejectedMessage(ProtocolError):
    """The server rejects one client's message; it keeps serving the other clients.

    Attributes:
        sender: the claimed sender id (may be ``None`` if it could not be read).
        misbehaviour: ``True`` when no honest client sends such a message (malformed, bad
            key or signature, contradictory): the round coordinator names the sender as a
            culprit. ``False`` for what an honest but slow client can cause (a message of
            a stage that has closed, of a cluster that ended).
    """

    def __init__(
        self, message: str, sender: int | None = None, *, misbehaviour: bool = True
    ) -> None:
        super().__init__(message)
        self.sender = sender
        self.misbehaviour = misbehaviour


class MalformedMessage(ProtocolError, ValueError):
    """A protocol message's fields are not what the message allows: bytes of the wrong
    length, ids out of range or repeated, a map or list over its cap, a ring width other
    than 32 or 64... Raised by the messages' constructors (so no such message exists); the
    text names the message, the field and what is expected."""


class StageError(ProtocolError):
    """A method was called in a state where it is not allowed (a driver bug)."""


class LeakageError(ProtocolError, ConfigurationError):
    """The planned clusterings let the server solve for individual updates or for sums of
    fewer than m clients; pass ``allow_leakage=True`` only if that is acceptable."""
