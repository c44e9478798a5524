"""What both sides of the Flower integration share: the record names and helpers, the
errors, the identity and directory files, and the round's public seed. Imports no torch."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sharefl.install_hint import install_command
from sharefl.protocol import records
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.errors import ProtocolError
from sharefl.protocol.memory import model_digest
from sharefl.protocol.plan import RoundPlan

# The one checked reader of keygen files, re-exported (sharefl.rounds.keyfiles).
from sharefl.rounds.keyfiles import checked_directory as checked_directory
from sharefl.rounds.keyfiles import read_directory as read_directory
from sharefl.rounds.keyfiles import read_identity as read_identity
from sharefl.rounds.round_seed import public_round_seed

try:  # flwr is the [flower] extra
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"sharefl.integrations.flower needs flwr: {install_command('flower')}"
    ) from exc


PREFIX = "sharefl"
STAGE_RECORD = f"{PREFIX}.stage"
"""The ConfigRecord naming the stage (``stage``) and its parameters, in every message."""
_ARRAYS = ".arrays"


class FlowerIntegrationError(ProtocolError, ValueError):
    """A Flower message or context lacks what the sharefl protocol needs (e.g. a stage
    message without the sharefl mod, or fit instructions without parameters), or got
    bad arguments (ids out of range, two clients routed to one node)."""


class NothingReleased(ProtocolError):
    """``max_empty_rounds`` rounds in a row released no cluster sum: the run stops (a run
    that goes on would only look finished, untrained). The message names the last round's
    reasons (the clients' refusals and errors, the clusters' failures)."""


# ---- records <-> Flower records -----------------------------------------------------------


def put_record(content: RecordDict, name: str, record: Mapping[str, Any]) -> None:
    """Store one sharefl record in ``content``: its arrays in the ArrayRecord
    ``name + ".arrays"``, the rest in the ConfigRecord ``name``."""
    arrays = {k: v for k, v in record.items() if isinstance(v, np.ndarray)}
    config = {k: v for k, v in record.items() if not isinstance(v, np.ndarray)}
    content[name] = ConfigRecord(config)
    if arrays:
        content[name + _ARRAYS] = ArrayRecord({k: Array(v) for k, v in arrays.items()})


def has_record(content: RecordDict, name: str) -> bool:
    """Whether ``content`` holds a sharefl record under ``name`` (:func:`put_record`)."""
    # By key, not through ``content.config_records``: that view is rebuilt, every record
    # checked, on each access (a few ms per message of a client's state).
    return isinstance(content.get(name), ConfigRecord)


def get_record(content: RecordDict, name: str) -> dict[str, Any]:
    """The sharefl record :func:`put_record` stored under ``name``; raises
    :class:`~sharefl.protocol.records.RecordError` when there is none."""
    config = content.get(name)
    if not isinstance(config, ConfigRecord):
        raise records.RecordError(f"the message has no {name!r} record")
    record: dict[str, Any] = dict(config)
    arrays = content.get(name + _ARRAYS)
    if isinstance(arrays, ArrayRecord):
        record.update({k: a.numpy() for k, a in arrays.items()})
    return record


def drop_record(content: RecordDict, name: str) -> None:
    content.pop(name, None)
    content.pop(name + _ARRAYS, None)


# ---- identities ---------------------------------------------------------------------------

IDENTITY_CONFIG = "sharefl-identity"
"""The node-config key naming a client's identity file (:func:`policy_from_node_config`)."""
DIRECTORY_CONFIG = "sharefl-directory"
"""The node-config key naming the directory file (:func:`policy_from_node_config`)."""
STATE_DIR_CONFIG = "sharefl-state-dir"
"""The node-config key naming a client's state directory: its memory of the rounds and
models it took part in (invariant I4) is a file there, kept across SuperNode restarts and
runs; without it the memory lives in the client's ``Context`` (one run)."""
MODEL_RECORD = f"{PREFIX}.model"
"""The record of a round's first assignment naming the digest of the model the round
trains on (:func:`arrays_digest`): the client's memory checks it before the advert leaves."""
FLOWER_SERVER = b"flower"
"""The server identity of a Flower client's memory in unsigned rounds (a mod cannot
authenticate its SuperLink: every unsigned Flower server is one identity)."""


def flower_server_identity(policy: ClientPolicy) -> bytes:
    """The server identity a Flower client's memory serves: in signed mode the SHA-256 of
    its directory (client id → Ed25519 key, sorted; the federation the client was given
    from outside the server), else :data:`FLOWER_SERVER`. Never a node id or run id."""
    if policy.directory is None:
        return FLOWER_SERVER
    h = hashlib.sha256(b"sharefl/flower-directory\x00")
    for cid in sorted(policy.directory):
        h.update(int(cid).to_bytes(8, "big") + bytes(policy.directory[cid]))
    return h.digest()


def arrays_digest(arrays: Sequence[np.ndarray]) -> bytes:
    """The model digest (:func:`~sharefl.protocol.memory.model_digest`) of a list of arrays:
    their elements in order, as float32. Both sides use it: the client for its memory, the
    workflow to tell an unchanged model (whose clusterings it must reuse)."""
    flat = [np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays]
    return model_digest(np.concatenate(flat) if flat else np.zeros(0, np.float32))


def round_seed(plan: RoundPlan, model: bytes) -> bytes:
    """The round's public seed (:func:`~sharefl.rounds.round_seed.public_round_seed`)
    of the ring inputs' rotation: the plan's digest and the :func:`arrays_digest` of the
    global arrays the clients received (``model``), which both sides hold."""
    return public_round_seed(plan.digest(), model)
