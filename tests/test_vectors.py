"""Known-answer vectors (``tests/vectors/``): every byte format on the wire or under a
signature or MAC is pinned in hex, and a change to any of them fails here until the
protocol version is bumped and the vectors regenerated."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from sharefl.crypto import aead, kdf, shamir, signatures
from sharefl.deploy import wire
from sharefl.protocol import bundles, plan

HERE = Path(__file__).resolve().parent / "vectors"
BUMP = (
    "a wire format changed: bump sharefl.crypto.kdf.PROTOCOL_VERSION and regenerate with "
    "python tests/vectors/generate.py"
)


def _load_generator():
    spec = importlib.util.spec_from_file_location("sharefl_vectors", HERE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def check_vectors(name: str) -> None:
    """Recompute format ``name`` from its stored inputs; raise AssertionError (saying what to
    do) for any output that differs from the stored hex."""
    stored = json.loads(generate.vector_file(name).read_text())
    function, _ = generate.FORMATS[name]
    actual = function(stored["inputs"])
    differing = sorted(
        key
        for key in set(actual) | set(stored["expected"])
        if actual.get(key) != stored["expected"].get(key)
    )
    if differing or stored["protocol_version"] != kdf.PROTOCOL_VERSION:
        raise AssertionError(
            f"{BUMP} (format {name!r}: {differing or 'protocol_version'} differ; stored for "
            f"version {stored['protocol_version']}, code is {kdf.PROTOCOL_VERSION})"
        )


def test_every_format_has_a_vector_file_and_nothing_else_is_stored():
    stored = {p.stem for p in HERE.glob("*.json")}
    assert stored == set(generate.FORMATS)


@pytest.mark.parametrize("name", sorted(generate.FORMATS))
def test_the_code_reproduces_every_stored_vector(name):
    check_vectors(name)


def test_the_stored_inputs_are_the_generators():
    """The files were written by the generator as it stands (no hand-edited inputs)."""
    for name in generate.FORMATS:
        stored = json.loads(generate.vector_file(name).read_text())
        assert stored == json.loads(json.dumps(generate.compute(name))), name


def _flip_last_byte(function: Callable[..., bytes]) -> Callable[..., bytes]:
    def flipped(*args, **kwargs) -> bytes:
        data = function(*args, **kwargs)
        return data[:-1] + bytes([data[-1] ^ 1])

    return flipped


def _flip_header_digest(function):
    def flipped(vector):
        header, chunks = function(vector)
        header.sha256 = header.sha256[:-1] + bytes([header.sha256[-1] ^ 1])
        return header, chunks

    return flipped


MUTATIONS = [
    ("kdf", kdf.KeyContext, "kdf_info", _flip_last_byte),
    ("kdf", kdf.KeyContext, "to_bytes", _flip_last_byte),
    ("kdf", kdf, "derive_key", _flip_last_byte),
    ("aead", aead.Envelope, "associated_data", _flip_last_byte),
    ("aead", aead, "encrypt", _flip_last_byte),
    ("seed_commitment", bundles, "seed_commitment", _flip_last_byte),
    ("signed_statements", signatures, "advertised_keys_message", _flip_last_byte),
    ("signed_statements", signatures, "client_list_message", _flip_last_byte),
    ("signed_statements", signatures.IdentityKey, "sign", _flip_last_byte),
    ("hello", signatures, "stream_hello_message", _flip_last_byte),
    ("plan_digest", plan.RoundPlan, "digest", _flip_last_byte),
    ("shamir_share", shamir.Share, "to_bytes", _flip_last_byte),
    ("shamir_share", bundles.SharePair, "to_plaintext", _flip_last_byte),
    ("chunk_framing", wire, "vector_to_proto", _flip_header_digest),
]


@pytest.mark.parametrize(
    ("name", "owner", "attribute", "mutate"),
    MUTATIONS,
    ids=[f"{name}:{attribute}" for name, _, attribute, _ in MUTATIONS],
)
def test_one_changed_byte_of_any_format_fails_with_the_bump_message(
    monkeypatch, name, owner, attribute, mutate
):
    check_vectors(name)  # passes before the change
    monkeypatch.setattr(owner, attribute, mutate(getattr(owner, attribute)))
    with pytest.raises(AssertionError, match=re.escape(BUMP)):
        check_vectors(name)


def test_a_version_bump_without_regenerating_fails(monkeypatch):
    monkeypatch.setattr(kdf, "PROTOCOL_VERSION", kdf.PROTOCOL_VERSION + 1)
    with pytest.raises(AssertionError, match=re.escape(BUMP)):
        check_vectors("hello")
