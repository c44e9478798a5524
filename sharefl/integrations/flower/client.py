"""The client side of the Flower integration: :func:`make_sharefl_mod` /
:data:`sharefl_mod`, a Flower mod that runs the protocol's client beside any client app.
Imports no torch (a ClientApp process starts without it unless the app itself needs it)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from sharefl.crypto.encoding import RingEncoding, encode
from sharefl.crypto.kdf import TWO_EXCHANGE_VERSION
from sharefl.crypto.signatures import HELLO_NONCE_BYTES, node_hello_message
from sharefl.install_hint import install_command
from sharefl.privacy.distributed import DistributedDPConfig, DistributedEncoder
from sharefl.privacy.secure_random import SecureRandom
from sharefl.protocol import records
from sharefl.protocol.budget import PrivacyCharge
from sharefl.protocol.client import ClientPolicy, ClientSession
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.errors import ConfigurationError, InconsistentRequest
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.memory import ClientMemory, memory_path
from sharefl.protocol.messages import (
    ClientMessage,
    ClusterAssignment,
    MaskingRequest,
    UnmaskRequest,
)
from sharefl.protocol.plan import RoundPlan
from sharefl.rounds.updates import WeightedUpdateCodec

from .common import (
    DIRECTORY_CONFIG,
    IDENTITY_CONFIG,
    MODEL_RECORD,
    PREFIX,
    STAGE_RECORD,
    STATE_DIR_CONFIG,
    FlowerIntegrationError,
    arrays_digest,
    drop_record,
    flower_server_identity,
    get_record,
    has_record,
    put_record,
    read_directory,
    read_identity,
    round_seed,
)

try:  # flwr is the [flower] extra
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import ArrayRecord, Context, Message, RecordDict
    from flwr.app.message_type import MessageType
    from flwr.clientapp.typing import ClientAppCallable, Mod
    from flwr.common import parameters_to_ndarrays
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"sharefl.integrations.flower needs flwr: {install_command('flower')}"
    ) from exc


log = logging.getLogger(__name__)

_FITINS_PARAMS = "fitins.parameters"
_STATE = f"{PREFIX}.state"


def policy_from_node_config(context: Context) -> ClientPolicy:
    """A signed-mode :class:`ClientPolicy` from the SuperNode's node config: the identity
    file under ``sharefl-identity`` and the directory under ``sharefl-directory``, e.g.
    ``flower-supernode --node-config "sharefl-identity='keys/client-3.identity'
    sharefl-directory='keys/directory.json'"``; use it as
    ``make_sharefl_mod(policy_from_node_config)``. The client requires signed mode (no
    downgrade). Raises :class:`FlowerIntegrationError` when a key is missing, and what
    :func:`read_identity` / :func:`read_directory` raise."""
    missing = [k for k in (IDENTITY_CONFIG, DIRECTORY_CONFIG) if k not in context.node_config]
    if missing:
        raise FlowerIntegrationError(f"the node config lacks {missing} (signed mode)")
    return ClientPolicy(
        identity=read_identity(str(context.node_config[IDENTITY_CONFIG])),
        directory=read_directory(str(context.node_config[DIRECTORY_CONFIG])),
        require_signed=True,
        require_atoms=True,
    )


def directory_id(policy: ClientPolicy) -> int:
    """The client id the policy's directory lists for the policy's identity. Raises
    :class:`ConfigurationError` when the policy has no identity or directory, or the
    directory does not list the identity's public key exactly once."""
    if policy.identity is None or policy.directory is None:
        raise ConfigurationError("signed mode needs policy.identity and policy.directory")
    ids = [cid for cid, key in policy.directory.items() if key == policy.identity.public]
    if len(ids) != 1:
        raise ConfigurationError(
            f"the directory lists this client's identity {len(ids)} times; it must list it "
            "once (or pass client_id to make_sharefl_mod)"
        )
    return int(ids[0])


def make_sharefl_mod(
    policy: ClientPolicy | Callable[[Context], ClientPolicy] | None = None,
    *,
    client_id: int | Callable[[Context], int] | None = None,
    randbytes: Callable[[int], bytes] = os.urandom,
    privacy: DistributedDPConfig | None = None,
    single_clustering: bool = True,
    state_dir: str | Callable[[Context], str | None] | None = None,
    ephemeral_memory: bool = False,
    privacy_charge: Callable[[Context], PrivacyCharge | None] | None = None,
) -> Mod:
    """A client mod with this client's :class:`ClientPolicy` (or a function of the
    ``Context`` that returns it, e.g. :func:`policy_from_node_config`); :data:`sharefl_mod`
    uses the default policy.

    In signed rounds the client takes part as ``client_id`` (an int, or a function of the
    ``Context``, e.g. of ``node_config["partition-id"]``); by default as the id its
    policy's directory lists for its identity (:func:`directory_id`). Unsigned rounds use
    the Flower node id. A policy with ``require_signed`` refuses unsigned rounds (an error
    reply: no downgrade).

    ``privacy`` (the client's own :class:`~sharefl.privacy.distributed.DistributedDPConfig`,
    the server's ``ShareflWorkflow(privacy=...)``): the client encodes its unweighted update
    with its noise share drawn from OS entropy into ring words itself, and refuses a round
    that proposes a float encoding (the server would get the update without its noise);
    without it, the client refuses a round that proposes none. Its policy then also
    refuses clusters and sums of fewer than ``privacy.min_survivors`` members and, with
    ``single_clustering`` (σ calibrated for cells of s − t members, one clustering a
    round), plans with more than one clustering.

    The client remembers the rounds and models it took part in (invariant I4,
    :class:`~sharefl.protocol.memory.ClientMemory`): a round number of the run that does not
    increase, and a model it already contributed on under other clusterings, are refused
    (error replies), so a server cannot replay a round or a model to solve an update from
    two plans' sums. The memory is a file under ``state_dir`` (a path, or a function of the
    ``Context``; by default the node config's ``sharefl-state-dir``), kept across restarts
    and runs. Without one, signed rounds keep it under :func:`default_state_dir` (one
    folder per federation: the directory's digest), so a new Flower run never starts from
    an empty memory; ``ephemeral_memory=True`` keeps it in the ``Context`` instead (this
    run only: a new run can then difference this client's updates; a warning is logged).
    Unsigned rounds, whose ids are node ids the SuperLink assigns, keep it in the
    ``Context``.

    The default policy requires atom plans (:mod:`sharefl.protocol.atoms`, what
    ``ShareflWorkflow`` draws by default); a policy with ``require_atoms=False`` accepts
    plans without them (and what leaks then: docs/security.md).

    The client's own budget (:mod:`sharefl.protocol.budget`) is its policy's
    ``max_rounds`` / ``max_epsilon``, kept in the memory: a round past either is refused
    (an error reply, before any key leaves). ``privacy_charge(context)`` tells the Rényi DP
    of one round of the noise the client app adds itself
    (:func:`sharefl.privacy.client_budget.round_rdp` at :data:`sharefl.protocol.budget.
    ORDERS`); ``max_epsilon`` refuses every round without it.
    """

    def state_dir_of(context: Context) -> str | None:
        chosen = state_dir(context) if callable(state_dir) else state_dir
        if chosen is None and STATE_DIR_CONFIG in context.node_config:
            chosen = str(context.node_config[STATE_DIR_CONFIG])
        return chosen

    def policy_of(context: Context) -> ClientPolicy:
        chosen = policy(context) if callable(policy) else policy or ClientPolicy(require_atoms=True)
        if privacy is None:
            return chosen
        single = 1 if single_clustering else None
        return chosen.requiring(privacy.min_survivors, max_reclusterings=single)

    def id_of(context: Context, policy: ClientPolicy) -> int:
        if client_id is None:
            return directory_id(policy)
        return int(client_id(context) if callable(client_id) else client_id)

    def mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN or not has_record(
            msg.content, STAGE_RECORD
        ):
            return call_next(msg, ctxt)
        stage = get_record(msg.content, STAGE_RECORD)
        pol = policy_of(ctxt)
        client = _Client(
            msg.metadata.dst_node_id,
            ctxt,
            pol,
            lambda: id_of(ctxt, pol),
            randbytes,
            int(msg.metadata.run_id).to_bytes(8, "big"),
            state_dir_of(ctxt),
            privacy,
            ephemeral_memory,
            None if privacy_charge is None else privacy_charge(ctxt),
        )
        if stage.get("stage") == "hello":
            out = client.hello(records.get_bytes(stage, "nonce", (HELLO_NONCE_BYTES,)))
        elif stage.get("stage") == "keys":
            out = client.advertise_keys(records.get_bool(stage, "signed"))
        elif stage.get("stage") == "assign":
            out = client.assign(msg, float(stage["max_weight"]), call_next)
        else:
            out = client.step(msg, ctxt, call_next)
        return Message(out, reply_to=msg)

    return mod


def default_state_dir() -> Path:
    """Where a client keeps its memory when nothing says otherwise: ``$SHAREFL_STATE_DIR``,
    else ``$XDG_STATE_HOME/sharefl``, else ``~/.local/state/sharefl``."""
    if os.environ.get("SHAREFL_STATE_DIR"):
        return Path(os.environ["SHAREFL_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sharefl"


@dataclass
class _Client:
    """One message's worth of a client: loads its state from the Context, runs the step,
    stores the state back."""

    node_id: int
    ctxt: Context
    policy: ClientPolicy
    signed_id: Callable[[], int]
    """This client's id in signed rounds (resolved only when needed)."""
    randbytes: Callable[[int], bytes]
    run: bytes
    """The Flower run id (8 bytes): the memory keys round numbers by it."""
    state_dir: str | None
    """Where the memory file lives; ``None``: the default (see :func:`make_sharefl_mod`)."""
    privacy: DistributedDPConfig | None = None
    ephemeral_memory: bool = False
    charge: PrivacyCharge | None = None

    def _memory(self, cid: int) -> ClientMemory:
        """The memory of client ``cid`` (A1, the budget, I4): its file under
        :attr:`state_dir`; in signed rounds without one, under :func:`default_state_dir`
        (unless :attr:`ephemeral_memory`); else the copy this client's ``Context`` keeps
        (written back by :meth:`_keep`)."""
        server = flower_server_identity(self.policy)
        folder = self.state_dir
        if folder is None and self.policy.directory is not None:
            if self.ephemeral_memory:
                log.warning(
                    "sharefl: client %d keeps its memory for this Flower run only "
                    "(ephemeral_memory): a later run can difference its updates",
                    cid,
                )
            else:
                folder = str(default_state_dir() / "flower" / server.hex()[:32])
        if folder is not None:
            return ClientMemory(memory_path(folder, cid), server=server)
        if has_record(self.ctxt.state, f"{_STATE}.memory"):
            return ClientMemory.from_json(str(self._load("memory")["json"]), server=server)
        return ClientMemory(server=server)

    def _keep(self, memory: ClientMemory) -> None:
        """Store a ``Context``-held memory back (a file memory wrote itself)."""
        if memory.path is None:
            self._save("memory", {"json": memory.to_json()})

    def _load(self, name: str) -> dict[str, Any]:
        return get_record(self.ctxt.state, f"{_STATE}.{name}")

    def _save(self, name: str, record: Mapping[str, Any]) -> None:
        drop_record(self.ctxt.state, f"{_STATE}.{name}")
        put_record(self.ctxt.state, f"{_STATE}.{name}", record)

    def hello(self, nonce: bytes) -> RecordDict:
        """Sign (node id, client id, nonce) with this client's identity. Raises
        :class:`ConfigurationError` when the policy has no identity (an unsigned client
        cannot take part in a signed round)."""
        if self.policy.identity is None:
            raise ConfigurationError("a signed round needs policy.identity and policy.directory")
        cid = self.signed_id()
        signature = self.policy.identity.sign(node_hello_message(self.node_id, cid, nonce))
        out = RecordDict()
        put_record(out, f"{PREFIX}.hello", {"client_id": cid, "signature": signature})
        return out

    def advertise_keys(self, signed: bool) -> RecordDict:
        """``key_setup = "once"``: make this client's long-term keys for this Flower run
        (scope: the run id), keep them in the ``Context`` and reply with their advert
        (signed with the identity in signed rounds). Asked again (a restart lost them, or
        the server lost the advert), it makes new ones."""
        cid = self.signed_id() if signed else self.node_id
        identity = self.policy.identity if signed else None
        if signed and identity is None:
            raise ConfigurationError("a signed round needs policy.identity and policy.directory")
        keys = ClientKeys.generate(cid, self.run, self.randbytes)
        self._save(
            "keys",
            {
                "client_id": cid,
                "scope": keys.scope,
                "encryption": keys.encryption.private,
                "mask": keys.mask.private,
            },
        )
        out = RecordDict()
        put_record(out, f"{PREFIX}.keys", records.to_record(keys.advert(identity)))
        return out

    def _keys(self) -> ClientKeys | None:
        """The long-term keys :meth:`advertise_keys` kept (``None``: none in this
        ``Context``)."""
        if not has_record(self.ctxt.state, f"{_STATE}.keys"):
            return None
        saved = self._load("keys")
        return ClientKeys.from_private(
            records.get_int(saved, "client_id"),
            records.get_bytes(saved, "scope"),
            records.get_bytes(saved, "encryption", (32,)),
            records.get_bytes(saved, "mask", (32,)),
        )

    def assign(self, msg: Message, max_weight: float, call_next: ClientAppCallable) -> RecordDict:
        """Vet the assignment and send the session's first reply: the advert (four-exchange
        round), or — two-exchange round — train on the instructions the first assignment
        brings and send the masked input with its shares (or, when the assignment does not
        relay this client's own keys, a new key advert instead). A new plan starts a new
        round; its first assignment names the digest of the model the round trains on (the
        client trains on that model only), so the memory checks and records the round,
        model and clusterings before anything leaves. Raises :class:`InconsistentRequest`
        for an unsigned assignment when the policy requires signed mode, and the refusals of
        :class:`ClientRound` (with :class:`~sharefl.protocol.errors.RoundReplayed` and
        :class:`~sharefl.protocol.errors.ModelReplayed` from the memory)."""
        content = msg.content
        assignment = records.from_record(
            get_record(content, f"{PREFIX}.assignment"), ClusterAssignment
        )
        if self.policy.require_signed and not assignment.signed:
            raise InconsistentRequest(
                "this client requires signed mode (untrusted server); the round is unsigned: "
                "the server must use ShareflWorkflow(signed=True, directory=...)"
            )
        proposed = has_record(content, f"{PREFIX}.encoding")
        if self.privacy is not None and proposed:
            raise InconsistentRequest(
                "this client adds its distributed-DP noise to ring inputs it encodes itself; "
                "the server proposed a float encoding (it would get the update without the "
                "noise): the server must use ShareflWorkflow(privacy=...)"
            )
        if self.privacy is None and not proposed:
            raise InconsistentRequest(
                "the round proposes no float encoding (ring inputs with distributed DP), but "
                "this client has no privacy config: make_sharefl_mod(privacy=...)"
            )
        encoding = (
            records.from_record(get_record(content, f"{PREFIX}.encoding"), RingEncoding)
            if proposed
            else None
        )
        if has_record(content, f"{PREFIX}.plan"):  # a new round
            plan = records.from_record(get_record(content, f"{PREFIX}.plan"), RoundPlan)
            cid = self.signed_id() if assignment.signed else self.node_id
            drop_record(self.ctxt.state, f"{_STATE}.input")
            try:
                model = records.get_bytes(get_record(content, MODEL_RECORD), "digest", (32,))
            except records.RecordError as exc:
                raise InconsistentRequest(
                    f"the round's first assignment names no model digest ({exc}); the server "
                    "must be a ShareflWorkflow or ShareflStrategy of this version"
                ) from exc
            memory = self._memory(cid)
            # I4: a round number of this run that does not increase, or this model under
            # other clusterings, is refused here; the masking request's model must match.
            guard = ClientRound(
                cid,
                plan,
                self.policy,
                memory=memory,
                run=self.run,
                model_digest=model,
                charge=self.charge,
            )
            if encoding is not None:
                self._save("encoding", {**records.to_record(encoding), "max_weight": max_weight})
        else:
            state = self._load("round")
            memory = self._memory(records.get_int(state, "id"))
            guard = ClientRound.from_state(state, self.policy, memory=memory)
        keys = self._keys()
        if assignment.context.version == TWO_EXCHANGE_VERSION and not _relayed(assignment, keys):
            # Keys lost (a restart) or replaced: nothing of this round is answered; the new
            # advert lets the server include this client from the next round on.
            return self.advertise_keys(assignment.signed)
        session = guard.session(assignment, None, randbytes=self.randbytes, keys=keys)
        out = RecordDict()
        if session.two_exchange:  # the assignment brings the instructions: train, then mask
            out = self._input_for(msg, self.ctxt, call_next, guard, session)
        reply = session.start()  # I4 recorded (by the guard, before this leaves)
        return self._answer(out, guard, session, reply, memory)

    def _input_for(
        self,
        msg: Message,
        ctxt: Context,
        call_next: ClientAppCallable,
        guard: ClientRound,
        session: ClientSession,
    ) -> RecordDict:
        """Give ``session`` this client's input: trained now on the instructions ``msg``
        carries (the round's first message that brings them; their model must be the one
        the round's plan named), else the one kept since; the input leaves the ``Context``
        after the round's last clustering. Returns the training reply (empty without
        training)."""
        out = RecordDict()
        kept = has_record(self.ctxt.state, f"{_STATE}.input")
        if kept:
            ring = self._load("input")["vector"]
        else:
            instructions, received, legacy = _instructions(msg)
            if arrays_digest(received) != guard.model_digest:
                raise InconsistentRequest(
                    "the model this message brings is not the one the round's assignment "
                    "named (and this client's memory recorded): refusing to train on it"
                )
            seed = round_seed(guard.plan, guard.model_digest)  # the digest checked above
            out, ring = self._train(msg, instructions, received, legacy, ctxt, call_next, seed)
        session.set_input(ring)
        if session.context.reclustering + 1 >= guard.plan.reclusterings:
            # The round's last masking: the input (d ring elements) leaves the Context,
            # which Flower ships with every later message of this client.
            drop_record(self.ctxt.state, f"{_STATE}.input")
        elif not kept:  # the round's later reclusterings mask it again
            self._save("input", {"vector": ring})
        return out

    def step(self, msg: Message, ctxt: Context, call_next: ClientAppCallable) -> RecordDict:
        message = records.from_record(
            get_record(msg.content, f"{PREFIX}.message"), records.SERVER_MESSAGES
        )
        state = self._load("round")
        # Only an unmask request touches the memory (a release is recorded before the
        # reply): the other stages neither read nor write it.
        memory = (
            self._memory(records.get_int(state, "id"))
            if isinstance(message, UnmaskRequest)
            else None
        )
        guard = ClientRound.from_state(state, self.policy, memory=memory)
        session = ClientSession.from_state(
            self._load("session"), self.policy, randbytes=self.randbytes, keys=self._keys()
        )
        out = RecordDict()
        if isinstance(message, MaskingRequest):
            out = self._input_for(msg, ctxt, call_next, guard, session)
        reply = guard.handle(session, message)  # a release is recorded in the memory first
        return self._answer(out, guard, session, reply, memory)

    def _answer(
        self,
        out: RecordDict,
        guard: ClientRound,
        session: ClientSession,
        reply: ClientMessage,
        memory: ClientMemory | None,
    ) -> RecordDict:
        """``out`` with ``reply``, after the memory (when this message used it), the round's
        guard and the session are stored back for the next message."""
        if memory is not None:
            self._keep(memory)
        self._save("round", guard.export_state())
        self._save("session", session.export_state())
        put_record(out, f"{PREFIX}.message", records.to_record(reply))
        return out

    def _train(
        self,
        msg: Message,
        instructions: RecordDict,
        received: list[np.ndarray],
        legacy: bool,
        ctxt: Context,
        call_next: ClientAppCallable,
        seed: bytes,
    ) -> tuple[RecordDict, np.ndarray]:
        """Run the client app on the strategy's ``instructions`` (:func:`_instructions`);
        its reply with every array cleared, and its update (trained − received) encoded
        for masking (ring inputs rotate with ``seed``, the round's public seed)."""
        out = call_next(_with_content(msg, instructions), ctxt)
        if out.has_error():
            raise FlowerIntegrationError(f"the client app failed to train: {out.error.reason}")
        trained, weight = _training_reply(out.content, legacy)
        delta = [t.astype(np.float64) - r for t, r in zip(trained, received, strict=True)]
        if self.privacy is not None:
            flat = np.concatenate([d.reshape(-1) for d in delta]) if delta else np.zeros(0)
            encoder = _client_encoder(self.privacy, flat.size)
            ring = encoder.encode(flat, seed, SecureRandom())
        else:
            encoding_record = self._load("encoding")
            max_weight = float(encoding_record.pop("max_weight"))
            encoding = records.from_record(encoding_record, RingEncoding)
            codec = WeightedUpdateCodec.like(received, encoding.clip, max_weight)
            ring = encode(codec.encode(delta, weight), encoding, rng=None)
        content = out.content
        for arrays in content.array_records.values():
            arrays.clear()  # the trained arrays never leave the client in the clear
        return content, ring


def _relayed(assignment: ClusterAssignment, keys: ClientKeys | None) -> bool:
    """Whether ``assignment`` relays ``keys`` as this client's own (two-exchange)."""
    if keys is None:
        return False
    own = [a for a in assignment.keys if a.sender == keys.client_id]
    return len(own) == 1 and (own[0].encryption_public, own[0].mask_public) == (
        keys.encryption.public,
        keys.mask.public,
    )


def _instructions(msg: Message) -> tuple[RecordDict, list[np.ndarray], bool]:
    """The strategy's training instructions in ``msg`` (its records without sharefl's), the
    arrays they carry, and whether they are legacy fit instructions. Raises
    :class:`FlowerIntegrationError` when there are none (neither fit instructions nor one
    ``ArrayRecord``)."""
    inner = RecordDict({k: v for k, v in msg.content.items() if not k.startswith(PREFIX)})
    fitins = inner.get(_FITINS_PARAMS)
    if isinstance(fitins, ArrayRecord):
        parameters = compat.arrayrecord_to_parameters(fitins, True)
        return inner, parameters_to_ndarrays(parameters), True
    arrays = [v for v in inner.values() if isinstance(v, ArrayRecord)]
    if len(arrays) != 1:
        raise FlowerIntegrationError(
            "the round's first masking request carries no training instructions (fit "
            "instructions or one ArrayRecord); the server must be a ShareflWorkflow or "
            "ShareflStrategy"
        )
    return inner, arrays[0].to_numpy_ndarrays(), False


WEIGHT_METRIC = "num-examples"
"""The metric a Message-API training reply weighs its update by (Flower's strategies
aggregate by it by default: ``weighted_by_key``)."""


def _training_reply(content: RecordDict, legacy: bool) -> tuple[list[np.ndarray], float]:
    """(trained arrays, weight) of a client app's training reply. Raises
    :class:`FlowerIntegrationError` for a Message-API reply without exactly one
    ``ArrayRecord`` or without :data:`WEIGHT_METRIC` in its ``MetricRecord``."""
    if legacy:
        fitres = compat.recorddict_to_fitres(content, keep_input=True)
        return parameters_to_ndarrays(fitres.parameters), float(fitres.num_examples)
    if len(content.array_records) != 1:
        raise FlowerIntegrationError(
            f"a training reply needs exactly one ArrayRecord (the trained model); this one has "
            f"{len(content.array_records)}"
        )
    weights = [m[WEIGHT_METRIC] for m in content.metric_records.values() if WEIGHT_METRIC in m]
    if len(weights) != 1:
        raise FlowerIntegrationError(
            f"a training reply needs one MetricRecord with {WEIGHT_METRIC!r} (the number of "
            "examples the update is weighted by, as Flower's strategies expect)"
        )
    trained = next(iter(content.array_records.values())).to_numpy_ndarrays()
    return trained, float(cast(float, weights[0]))


_client_encoder = functools.lru_cache(maxsize=4)(DistributedEncoder)
"""A client's pipeline per (config, model size): the mod keeps no Python state between
Flower messages, so the cache spares rebuilding γ and the sampler's tables every round."""


def _with_content(msg: Message, content: RecordDict) -> Message:
    """``msg`` with ``content`` (the strategy's fit instructions, without sharefl's records)
    for the inner client app."""
    msg.content = content
    return msg


sharefl_mod = make_sharefl_mod()
"""The client mod with the default :class:`ClientPolicy`:
``ClientApp(client_fn=..., mods=[sharefl_mod])``."""
