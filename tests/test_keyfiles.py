"""Every reader of the files ``sharefl keygen`` writes refuses the same files with the same
message: ``sharefl serve``'s directory (``deploy.server.load_directory``), the identity
of ``sharefl client``/``launch`` (``deploy.keygen.load_identity``, and through
``launch.client_runtime`` both files of a keys folder), and the Flower integration's
(``read_directory``/``read_identity``, ``ShareflWorkflow(directory=...)``,
``policy_from_node_config``). They all call :mod:`sharefl.rounds.keyfiles`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("grpc")

from flwr.app import Context, RecordDict

from sharefl.crypto.signatures import IdentityKey
from sharefl.deploy.keygen import keygen, load_identity
from sharefl.deploy.server import load_directory
from sharefl.integrations.flower import ShareflWorkflow, read_directory, read_identity
from sharefl.integrations.flower.client import policy_from_node_config
from sharefl.launch import client_runtime
from sharefl.protocol.errors import ConfigurationError
from sharefl.rounds.keyfiles import KeyFileError


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    return keygen(tmp_path_factory.mktemp("keys") / "keys", range(3))


def identities(keys: Path) -> dict[str, str]:
    return json.loads((keys / "directory.json").read_text())["identities"]


def _flower_policy(folder: Path) -> object:
    node_config = {
        "sharefl-identity": str(folder / "client-0.identity"),
        "sharefl-directory": str(folder / "directory.json"),
    }
    context = Context(
        run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config={}
    )
    return policy_from_node_config(context)


def _client(folder: Path) -> object:
    return client_runtime(0, "127.0.0.1:1", keys=str(folder))


DIRECTORY_READERS = {
    "serve": lambda folder: load_directory(str(folder / "directory.json")),
    "flower read_directory": lambda folder: read_directory(folder / "directory.json"),
    "flower workflow": lambda folder: ShareflWorkflow(
        signed=True, directory=folder / "directory.json", clip=1.0
    ),
    "flower node config": _flower_policy,
    "client --keys": _client,
}
"""Each reader of a keys folder's ``directory.json``, given the folder."""
IDENTITY_READERS = {
    "launch load_identity": lambda folder: load_identity(folder / "client-0.identity"),
    "flower read_identity": lambda folder: read_identity(folder / "client-0.identity"),
    "flower node config": _flower_policy,
    "client --keys": _client,
}
"""Each reader of a keys folder's ``client-0.identity``, given the folder."""


def hostile_directories(keys: Path) -> dict[str, tuple[str, str]]:
    """name → (the file's text, a fragment of the message every reader gives)."""
    good = identities(keys)
    first = good["0"]
    return {
        "a 16-byte key": (json.dumps({"identities": {**good, "1": first[:32]}}), "16 bytes"),
        "one key under two ids": (
            json.dumps({"identities": {**good, "2": first}}),
            "one public key under clients 0 and 2",
        ),
        "an id in two spellings": (
            json.dumps({"identities": {**good, "01": good["1"]}}),
            "decimal form",
        ),
        "an id listed twice": (
            f'{{"identities": {{"0": "{first}", "0": "{good["1"]}"}}}}',
            "listed twice",
        ),
        "an id beyond 2^64": (
            json.dumps({"identities": {str(2**64): first}}),
            "[0, 2^64)",
        ),
        "a negative id": (json.dumps({"identities": {"-1": first}}), "[0, 2^64)"),
        "a key that is not hex": (json.dumps({"identities": {"0": "zz" * 32}}), "not a keygen"),
        "no identities": (json.dumps({"keys": good}), "not a keygen"),
        "not JSON": ("identities: 0", "not a keygen"),
        "no file": ("", "cannot read the directory"),
    }


def hostile_identities() -> dict[str, tuple[str, str]]:
    private = IdentityKey.generate().private.hex()
    return {
        "a 16-byte key": (private[:32], "32-byte Ed25519 private key"),
        "a 33-byte key": (private + "00", "32-byte Ed25519 private key"),
        "not hex": ("z" * 64, "not a keygen identity"),
        "no file": ("", "cannot read the identity"),
    }


def _folder_with(keys: Path, tmp_path: Path, name: str, text: str) -> Path:
    """A copy of ``keys`` whose file ``name`` holds ``text`` (empty: no such file)."""
    folder = shutil.copytree(keys, tmp_path / "keys")
    (folder / name).unlink()
    if text:
        (folder / name).write_text(text)
    return folder


def _refusals(readers, folder: Path, case: str) -> dict[str, str]:
    """Each reader's refusal of ``folder``'s files (``client --keys`` names a missing file
    of its folder before it reads any)."""
    messages = {}
    for caller, read in readers.items():
        if case == "no file" and caller == "client --keys":
            continue
        with pytest.raises(KeyFileError) as refused:
            read(folder)
        messages[caller] = str(refused.value)
    return messages


DIRECTORY_CASES = [
    "a 16-byte key",
    "one key under two ids",
    "an id in two spellings",
    "an id listed twice",
    "an id beyond 2^64",
    "a negative id",
    "a key that is not hex",
    "no identities",
    "not JSON",
    "no file",
]


@pytest.mark.parametrize("case", DIRECTORY_CASES)
def test_every_reader_refuses_a_hostile_directory_with_the_same_message(keys, tmp_path, case):
    text, fragment = hostile_directories(keys)[case]
    folder = _folder_with(keys, tmp_path, "directory.json", text)
    path = folder / "directory.json"
    messages = _refusals(DIRECTORY_READERS, folder, case)
    assert len(set(messages.values())) == 1, messages
    message = next(iter(messages.values()))
    assert fragment in message and str(path) in message and "sharefl keygen" in message


@pytest.mark.parametrize("case", ["a 16-byte key", "a 33-byte key", "not hex", "no file"])
def test_every_reader_refuses_a_hostile_identity_with_the_same_message(keys, tmp_path, case):
    text, fragment = hostile_identities()[case]
    folder = _folder_with(keys, tmp_path, "client-0.identity", text)
    path = folder / "client-0.identity"
    messages = _refusals(IDENTITY_READERS, folder, case)
    assert len(set(messages.values())) == 1, messages
    message = next(iter(messages.values()))
    assert fragment in message and str(path) in message and "sharefl keygen" in message


def test_every_reader_accepts_keygens_files_alike(keys, tmp_path):
    want = {int(cid): bytes.fromhex(key) for cid, key in identities(keys).items()}
    assert load_directory(str(keys / "directory.json")) == want
    assert read_directory(keys / "directory.json") == want
    identity = keys / "client-0.identity"
    assert load_identity(identity) == read_identity(identity)
    assert load_identity(identity).public == want[0]
    policy = _flower_policy(keys)
    runtime = client_runtime(0, "127.0.0.1:1", keys=str(keys))
    assert policy.directory == runtime.policy.directory == want
    assert policy.identity == runtime.identity == load_identity(identity)


def test_the_cases_are_the_hostile_files(keys):
    assert sorted(DIRECTORY_CASES) == sorted(hostile_directories(keys))
    assert issubclass(KeyFileError, ConfigurationError)  # the command exits 2
