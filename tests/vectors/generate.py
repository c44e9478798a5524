"""Known-answer vectors for every byte format on the wire or under a signature or MAC.

Each format is a function from fixed, JSON-serialisable ``inputs`` to a mapping of named
outputs in hex; ``python tests/vectors/generate.py`` writes one ``<format>.json`` per format
next to this file (``{"format", "protocol_version", "inputs", "expected"}``) and
``tests/test_vectors.py`` recomputes each. A difference means a wire format changed:
bump :data:`sharefl.crypto.kdf.PROTOCOL_VERSION` and regenerate.

Every function is reached through its module (``kdf.KeyContext``, ``signatures.
advertised_keys_message``...) at call time, so a test can patch one and see a vector fail.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sharefl.crypto import aead, kdf, shamir, signatures
from sharefl.deploy import wire
from sharefl.protocol import bundles, keys, plan, records
from sharefl.protocol import messages as m
from sharefl.protocol.clustering import Clustering

HERE = Path(__file__).resolve().parent
Inputs = dict[str, Any]
Outputs = dict[str, str]

_PLAN_DIGEST = "5a" * 32
_CONTEXT = {"round": 7, "reclustering": 1, "cluster": 2}


def _context(inputs: Inputs, plan_digest: bool) -> kdf.KeyContext:
    digest = bytes.fromhex(inputs["plan"]) if plan_digest else b""
    return kdf.KeyContext(**inputs["context"], plan=digest)


def kdf_vectors(inputs: Inputs) -> Outputs:
    """KDF info with and without a plan digest, and the derived keys of both purposes for
    two fixed X25519 private keys (as both sides compute them)."""
    out: Outputs = {}
    sk_u, sk_v = bytes.fromhex(inputs["private_u"]), bytes.fromhex(inputs["private_v"])
    u, v = inputs["client_u"], inputs["client_v"]
    out["public_u"] = kdf.x25519_public_key(sk_u).hex()
    out["public_v"] = kdf.x25519_public_key(sk_v).hex()
    for label, with_plan in (("no_plan", False), ("plan", True)):
        context = _context(inputs, with_plan)
        out[f"context_bytes_{label}"] = context.to_bytes().hex()
        for purpose in kdf.Purpose:
            name = purpose.name.lower()
            out[f"info_{name}_{label}"] = context.kdf_info(purpose, u, v).hex()
            key_u = kdf.pairwise_key(sk_u, kdf.x25519_public_key(sk_v), context, purpose, u, v)
            key_v = kdf.pairwise_key(sk_v, kdf.x25519_public_key(sk_u), context, purpose, v, u)
            if key_u != key_v:
                raise AssertionError("the two sides of a pairwise key disagree")
            out[f"key_{name}_{label}"] = key_u.hex()
    return out


def aead_vectors(inputs: Inputs) -> Outputs:
    """The share bundle's associated data and a sealed bundle under a fixed key and nonce."""
    envelope = aead.Envelope(inputs["sender"], inputs["receiver"], _context(inputs, True))
    sealed = aead.encrypt(
        bytes.fromhex(inputs["key"]),
        bytes.fromhex(inputs["plaintext"]),
        envelope,
        nonce=bytes.fromhex(inputs["nonce"]),
    )
    return {"associated_data": envelope.associated_data().hex(), "sealed": sealed.hex()}


def commitment_vectors(inputs: Inputs) -> Outputs:
    """The SHA-256 commitment to a self-mask seed."""
    context = _context(inputs, True)
    seed = bytes.fromhex(inputs["seed"])
    return {"commitment": bundles.seed_commitment(context, inputs["client"], seed).hex()}


def _identity(inputs: Inputs) -> signatures.IdentityKey:
    return signatures.IdentityKey.from_private(bytes.fromhex(inputs["identity_private"]))


def signed_statement_vectors(inputs: Inputs) -> Outputs:
    """The advertised-keys and client-list statements, and their (deterministic) Ed25519
    signatures under a fixed identity key."""
    context = _context(inputs, True)
    advertised = signatures.advertised_keys_message(
        inputs["client"],
        context,
        bytes.fromhex(inputs["encryption_public"]),
        bytes.fromhex(inputs["mask_public"]),
        bytes.fromhex(inputs["commitment"]),
    )
    listed = signatures.client_list_message(context, inputs["ids"], inputs["label"])
    identity = _identity(inputs)
    return {
        "identity_public": identity.public.hex(),
        "advertised_keys_message": advertised.hex(),
        "advertised_keys_signature": identity.sign(advertised).hex(),
        "client_list_message": listed.hex(),
        "client_list_signature": identity.sign(listed).hex(),
    }


def hello_vectors(inputs: Inputs) -> Outputs:
    """The statement a client signs to authenticate its stream, and its signature."""
    statement = signatures.stream_hello_message(bytes.fromhex(inputs["nonce"]), inputs["client"])
    return {"statement": statement.hex(), "signature": _identity(inputs).sign(statement).hex()}


def plan_vectors(inputs: Inputs) -> Outputs:
    """The round plan digest (bound into every key context of the round)."""
    clusterings = tuple(
        Clustering(tuple(tuple(c) for c in clusters)) for clusters in inputs["clusterings"]
    )
    return {"digest": plan.RoundPlan(inputs["round"], clusterings).digest().hex()}


def shamir_vectors(inputs: Inputs) -> Outputs:
    """A Shamir share's encoding and the share bundle plaintext of two shares."""
    key_share = shamir.Share(inputs["key_share"]["x"], int(inputs["key_share"]["y"]))
    seed_share = shamir.Share(inputs["seed_share"]["x"], int(inputs["seed_share"]["y"]))
    pair = bundles.SharePair(key_share, seed_share)
    return {
        "key_share": key_share.to_bytes().hex(),
        "seed_share": seed_share.to_bytes().hex(),
        "bundle_plaintext": pair.to_plaintext(inputs["sender"], inputs["receiver"]).hex(),
    }


def chunk_vectors(inputs: Inputs) -> Outputs:
    """A small vector's header and chunk messages, as deterministic protobuf bytes."""
    out: Outputs = {}
    for name, values in inputs["vectors"].items():
        header, chunks = wire.vector_to_proto(np.asarray(values, dtype=name))
        out[f"{name}_header"] = header.SerializeToString(deterministic=True).hex()
        for index, chunk in enumerate(chunks):
            out[f"{name}_chunk_{index}"] = chunk.SerializeToString(deterministic=True).hex()
    return out


# ---- the two codecs of every protocol message (records for Flower, protobuf for gRPC) -------


def _fill(byte: int, size: int) -> bytes:
    return bytes([byte & 0xFF]) * size


def codec_messages(inputs: Inputs) -> dict[str, Any]:
    """One fixed value of every message and assignment the codecs carry, by label.

    Four-exchange values (version 4 contexts) use only the fields that existed before the
    two-exchange round, so their vectors pin the old formats: a receiver still decodes
    them, and a sender of such a value still writes exactly these bytes (their outputs
    were generated before the two-exchange fields were added to the codecs). The
    two-exchange values (version 5) fill every new field. Bundles, shares and signatures
    are fillers of the right size (a codec checks sizes, never contents)."""
    plan_digest = bytes.fromhex(inputs["plan"])
    v2 = kdf.KeyContext(**inputs["context"], version=kdf.PROTOCOL_VERSION, plan=plan_digest)
    members = tuple(inputs["members"])
    u, v, w = members
    enc, mask = bytes.fromhex(inputs["encryption_public"]), bytes.fromhex(inputs["mask_public"])
    commitment = bytes.fromhex(inputs["commitment"])
    signature = bytes.fromhex(inputs["signature"])
    sealed = bundles.SEALED_BYTES
    share, key = shamir.SHARE_BYTES, kdf.KEY_BYTES
    vector = np.asarray(inputs["vector"], dtype=np.uint32)
    advert = m.AdvertiseKeys(u, v2, enc, mask, commitment, signature)
    values: dict[str, Any] = {
        "assignment_v2": m.ClusterAssignment(
            v2,
            members,
            2,
            len(vector),
            32,
            {u: frozenset({v, w}), v: frozenset({u}), w: frozenset({u})},
            True,
        ),
        "advertise_keys": advert,
        "keys_broadcast": m.KeysBroadcast(
            v2, (advert, m.AdvertiseKeys(v, v2, mask, enc, commitment))
        ),
        "encrypted_shares": m.EncryptedShares(u, v2, {v: _fill(v, sealed), w: _fill(w, sealed)}),
        "masking_request": m.MaskingRequest(v2, u, members, {v: _fill(v, sealed)}),
        "masked_input": m.MaskedInput(u, v2, vector, (w,)),
        "consistency_request": m.ConsistencyRequest(v2, members),
        "consistency_signature": m.ConsistencySignature(u, v2, signature),
        "unmask_request_v2": m.UnmaskRequest(v2, (u, v), (w,), {u: signature, v: signature}),
        "unmask_response_v2": m.UnmaskResponse(
            u,
            v2,
            {u: _fill(u, share), v: _fill(v, share)},
            {w: _fill(w, share)},
            {w: _fill(7, key)},
        ),
    }
    v3 = kdf.KeyContext(**inputs["context"], version=kdf.TWO_EXCHANGE_VERSION, plan=plan_digest)
    scope = bytes.fromhex(inputs["scope"])
    key_adverts = (
        keys.KeyAdvert(u, scope, enc, mask, signature),
        keys.KeyAdvert(v, scope, mask, enc),
        keys.KeyAdvert(w, b"", _fill(w, key), _fill(w + 1, key), signature),
    )
    dealt_u = bundles.dealt_bytes(2)  # u's neighbours: v and w
    dealt_v = bundles.dealt_bytes(1)  # v's neighbour: u
    values |= {
        "key_advert": key_adverts[0],
        "assignment_v3": m.ClusterAssignment(
            v3,
            members,
            2,
            len(vector),
            32,
            {u: frozenset({v, w}), v: frozenset({u}), w: frozenset({u})},
            True,
            key_adverts,
        ),
        "masked_shares": m.MaskedShares(
            u,
            v3,
            vector,
            commitment,
            {v: _fill(v, bundles.COMMITMENT_BYTES), w: _fill(w, bundles.COMMITMENT_BYTES)},
            {v: _fill(v, dealt_u), w: _fill(w, dealt_u)},
        ),
        "unmask_request_v3": m.UnmaskRequest(
            v3, (u, v), (w,), {u: signature, v: signature}, {v: _fill(v, dealt_v)}
        ),
        "unmask_response_v3": m.UnmaskResponse(
            u,
            v3,
            {u: _fill(u, share)},
            {},
            pair_shares={(u, w): _fill(u, share), (v, w): _fill(v, share)},
            complaints=(v,),
        ),
    }
    return values


def _value_bytes(value: Any) -> bytes:
    """One record value as tagged bytes: its type is pinned with its contents."""
    if isinstance(value, bool):
        return b"b" + bytes([value])
    if isinstance(value, int):
        return b"i" + value.to_bytes(8, "big")
    if isinstance(value, float):
        return b"f" + struct.pack(">d", value)
    if isinstance(value, str):
        return b"s" + value.encode()
    if isinstance(value, bytes):
        return b"y" + value
    if isinstance(value, np.ndarray):
        little = value.astype(value.dtype.newbyteorder("<"))
        return b"a" + little.dtype.str.encode() + b":" + little.tobytes()
    if isinstance(value, list) and all(isinstance(x, int) for x in value):
        return b"l" + b"".join(int(x).to_bytes(8, "big") for x in value)
    if isinstance(value, list) and all(isinstance(x, bytes) for x in value):
        return b"L" + b"".join(len(x).to_bytes(4, "big") + x for x in value)
    raise TypeError(f"not a record value: {type(value).__name__}")


def record_vectors(inputs: Inputs) -> Outputs:
    """Every record key of every value of :func:`codec_messages` (``label/key``) and its
    tagged value (:func:`_value_bytes`): a key added, dropped or renamed differs too."""
    out: Outputs = {}
    for label, value in codec_messages(inputs).items():
        for key, item in records.to_record(value).items():
            out[f"{label}/{key}"] = _value_bytes(item).hex()
    return out


def _wire_messages(label: str, value: Any) -> dict[str, Any]:
    if isinstance(value, m.ClusterAssignment):
        return {label: wire.assignment_to_proto(value, None)}
    if isinstance(value, m.MaskedInput | m.MaskedShares):
        header = (
            wire.masked_to_proto(value)
            if isinstance(value, m.MaskedInput)
            else wire.masked_shares_to_proto(value)
        )
        _, chunks = wire.vector_to_proto(value.vector)
        return {label: header, **{f"{label}/chunk_{i}": c for i, c in enumerate(chunks)}}
    converters: dict[type, Callable[[Any], Any]] = {
        keys.KeyAdvert: wire.key_advert_to_proto,
        m.AdvertiseKeys: wire.advert_to_proto,
        m.KeysBroadcast: wire.keys_to_proto,
        m.EncryptedShares: wire.shares_to_proto,
        m.MaskingRequest: wire.masking_to_proto,
        m.ConsistencyRequest: wire.consistency_request_to_proto,
        m.ConsistencySignature: wire.signature_to_proto,
        m.UnmaskRequest: wire.unmask_request_to_proto,
        m.UnmaskResponse: wire.unmask_response_to_proto,
    }
    return {label: converters[type(value)](value)}


def wire_vectors(inputs: Inputs) -> Outputs:
    """The deterministic protobuf bytes of every value of :func:`codec_messages` (a masked
    vector's header message and its chunks)."""
    out: Outputs = {}
    for label, value in codec_messages(inputs).items():
        for name, message in _wire_messages(label, value).items():
            out[name] = message.SerializeToString(deterministic=True).hex()
    return out


_CODEC_INPUTS: Inputs = {
    "context": _CONTEXT,
    "plan": _PLAN_DIGEST,
    "members": [3, 9, 12],
    "encryption_public": "66" * 32,
    "mask_public": "77" * 32,
    "commitment": "88" * 32,
    "signature": "99" * 64,
    "vector": [1, 4294967295, 7],
    "scope": "73636f7065",
}


FORMATS: dict[str, tuple[Callable[[Inputs], Outputs], Inputs]] = {
    "kdf": (
        kdf_vectors,
        {
            "context": _CONTEXT,
            "plan": _PLAN_DIGEST,
            "private_u": "11" * 32,
            "private_v": "22" * 32,
            "client_u": 3,
            "client_v": 9,
        },
    ),
    "aead": (
        aead_vectors,
        {
            "context": _CONTEXT,
            "plan": _PLAN_DIGEST,
            "sender": 3,
            "receiver": 9,
            "key": "33" * 32,
            "nonce": "44" * 12,
            "plaintext": "0001020304050607",
        },
    ),
    "seed_commitment": (
        commitment_vectors,
        {"context": _CONTEXT, "plan": _PLAN_DIGEST, "client": 3, "seed": "55" * 32},
    ),
    "signed_statements": (
        signed_statement_vectors,
        {
            "context": _CONTEXT,
            "plan": _PLAN_DIGEST,
            "client": 3,
            "encryption_public": "66" * 32,
            "mask_public": "77" * 32,
            "commitment": "88" * 32,
            "ids": [9, 3, 12],
            "label": "survivors",
            "identity_private": "99" * 32,
        },
    ),
    "hello": (
        hello_vectors,
        {"nonce": "aa" * 32, "client": 3, "identity_private": "99" * 32},
    ),
    "plan_digest": (
        plan_vectors,
        {"round": 7, "clusterings": [[[0, 1, 2], [3, 4, 5]], [[0, 3, 4], [1, 2, 5]]]},
    ),
    "shamir_share": (
        shamir_vectors,
        {
            "sender": 3,
            "receiver": 9,
            "key_share": {"x": 2, "y": str(2**255 + 12345)},
            "seed_share": {"x": 5, "y": "987654321"},
        },
    ),
    "chunk_framing": (
        chunk_vectors,
        {
            "vectors": {
                "float32": [0.5, -1.25, 3.0],
                "uint32": [1, 4294967295, 7],
                "uint64": [2, 18446744073709551615],
            }
        },
    ),
    "record_codec": (record_vectors, _CODEC_INPUTS),
    "wire_messages": (wire_vectors, _CODEC_INPUTS),
}


def vector_file(name: str) -> Path:
    """Where the vectors of format ``name`` are stored."""
    return HERE / f"{name}.json"


def compute(name: str) -> dict[str, Any]:
    """The vector document of format ``name`` as the code computes it now."""
    function, inputs = FORMATS[name]
    return {
        "format": name,
        "protocol_version": kdf.PROTOCOL_VERSION,
        "inputs": inputs,
        "expected": function(inputs),
    }


def main() -> int:
    """Write every vector file; returns the exit status."""
    for name in FORMATS:
        vector_file(name).write_text(json.dumps(compute(name), indent=2, sort_keys=True) + "\n")
        print(f"wrote {vector_file(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
