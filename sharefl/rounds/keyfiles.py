"""The one checked reader of the files ``sharefl keygen`` writes for the secure layer: a
client's identity (``client-<id>.identity``) and the deployment's directory
(``directory.json``).

Every transport reads them here (``sharefl serve``/``client``/``launch`` and the Flower
integration), so a file one accepts the others accept, and a file one refuses the others
refuse with the same message. A refusal is a :class:`KeyFileError` (a
:class:`~sharefl.protocol.errors.ConfigurationError`: the command exits 2) naming the file
and what to change. It lives in the protocol layer because both transports, which may not
import each other, read these files for :class:`~sharefl.protocol.client.ClientPolicy`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from sharefl.crypto.errors import CryptoError
from sharefl.crypto.kdf import KEY_BYTES
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol.errors import ConfigurationError

MAX_CLIENT_ID = 2**64
"""Client ids are in [0, 2^64): a Flower node id, a protobuf ``uint64``."""

_REMEDY = "use the files sharefl keygen wrote (sharefl keygen --out DIR --clients N)"


class KeyFileError(ConfigurationError):
    """A keygen file that cannot be read or is not what keygen writes; the message names
    the file, what is wrong and what to change."""


def checked_directory(directory: Mapping[int, bytes]) -> dict[int, bytes]:
    """``directory`` as a ``{client id: 32-byte Ed25519 public key}`` dict, checked: ids
    ints in [0, 2^64), keys of 32 bytes, no key under two ids (a client's id is the entry
    of its key: one key under two ids would let its holder take either). Raises
    :class:`KeyFileError`."""
    result: dict[int, bytes] = {}
    for cid, key in directory.items():
        if isinstance(cid, bool) or not isinstance(cid, int) or not 0 <= cid < MAX_CLIENT_ID:
            raise KeyFileError(f"directory ids are ints in [0, 2^64), got {cid!r}; {_REMEDY}")
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            size = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key).__name__
            raise KeyFileError(
                f"the directory key of client {cid} is {size}, not a {KEY_BYTES}-byte Ed25519 "
                f"public key; {_REMEDY}"
            )
        result[cid] = bytes(key)
    owners: dict[bytes, int] = {}
    for cid, key in result.items():
        if key in owners:
            raise KeyFileError(
                f"the directory lists one public key under clients {owners[key]} and {cid}: "
                f"give every client its own identity; {_REMEDY}"
            )
        owners[key] = cid
    return result


def read_directory(path: str | Path) -> dict[int, bytes]:
    """The directory in a keygen ``directory.json`` (``{"identities": {"<id>": "<public
    key hex>"}}``, each id in its decimal form once), checked by
    :func:`checked_directory`. Raises :class:`KeyFileError` for a file that cannot be read,
    is not that shape, or holds a bad id or key."""
    try:
        entries = json.loads(Path(path).read_text(), object_pairs_hook=_unique)["identities"]
        directory: dict[int, bytes] = {}
        for text, key in entries.items():
            cid = int(text)
            if str(cid) != text:
                raise ValueError(f"id {text!r} is not in decimal form")
            directory[cid] = bytes.fromhex(key)
    except OSError as exc:
        raise KeyFileError(
            f"cannot read the directory {path}: {exc.strerror or exc}; {_REMEDY}"
        ) from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyFileError(f"{path} is not a keygen directory.json ({exc}); {_REMEDY}") from exc
    try:
        return checked_directory(directory)
    except KeyFileError as exc:
        raise KeyFileError(f"{path}: {exc}") from None


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose names are distinct (``json`` would keep the last of two)."""
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"a name is listed twice among {sorted(names)[:8]}")
    return dict(pairs)


def read_identity(path: str | Path) -> IdentityKey:
    """The identity in a keygen ``client-<id>.identity`` file (hex of the raw 32-byte
    Ed25519 private key). Raises :class:`KeyFileError` for a file that cannot be read or
    does not hold such a key."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise KeyFileError(
            f"cannot read the identity {path}: {exc.strerror or exc}; {_REMEDY}"
        ) from exc
    try:
        return IdentityKey.from_private(bytes.fromhex(text.strip()))
    except (ValueError, CryptoError) as exc:
        raise KeyFileError(
            f"{path} is not a keygen identity file (hex of a {KEY_BYTES}-byte Ed25519 "
            f"private key: {exc}); {_REMEDY}"
        ) from exc
