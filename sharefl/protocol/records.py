"""Plain records of every protocol value, for transports that carry key-value records.

A *record* is a flat ``dict[str, RecordValue]`` whose values are ints, floats, bools,
strings, bytes, lists of ints, lists of bytes, or numpy arrays (vectors stay arrays: no
base64, no pickle). Flower's ``ConfigRecord`` / ``ArrayRecord`` hold such values directly
(:mod:`sharefl.integrations.flower`); any other stack with typed key-value messages can do
the same. This module is sans-IO and knows no transport.

:func:`to_record` converts every protocol message (:mod:`sharefl.protocol.messages`), a
:class:`~sharefl.protocol.messages.ClusterAssignment`, a
:class:`~sharefl.crypto.encoding.RingEncoding` and a
:class:`~sharefl.protocol.plan.RoundPlan`; :func:`from_record` converts back, raising
:class:`RecordError`. For a message it translates shapes only — missing keys, values of
the wrong type, parallel lists of different lengths, a key of a map given twice, a list
longer than any message holds — and the message's constructor checks its fields (byte
sizes, id ranges and duplicates, caps, ring width...): its
:class:`~sharefl.protocol.errors.MalformedMessage` becomes a :class:`RecordError` here, as
the gRPC codec (:mod:`sharefl.deploy.wire`) makes it a ``WireError``, so the two refuse
alike. A key context travels as its canonical bytes
(:meth:`KeyContext.to_bytes`); a ``{peer: bytes}`` map as two parallel lists
``<name>.peers`` / ``<name>.values``; a list of key adverts as parallel lists
``keys.<field>``; a ``{(dealer, peer): bytes}`` map as ``<name>.dealers`` /
``<name>.peers`` / ``<name>.values``. ``from_record(to_record(x)) == x`` for every value.

The two-exchange round (protocol version 5) added :class:`~sharefl.protocol.keys.KeyAdvert`,
:class:`~sharefl.protocol.messages.MaskedShares` and fields of three older values
(``ClusterAssignment.keys``, ``UnmaskRequest.bundles``, ``UnmaskResponse.pair_shares`` and
``.complaints``). Those fields are written only when they are not empty and read as empty
when absent, so a four-exchange value has the record it had before (``tests/vectors``
pins both). A two-exchange bundle is :func:`~sharefl.protocol.bundles.dealt_bytes` of its
dealer's neighbour count, so the number of neighbours one dealer may have is capped
(:data:`~sharefl.protocol.fields.MAX_DEALT_PEERS`, a message's limit), which bounds every
bundle and every list of them.

:func:`nest` / :func:`unnest` put one record inside another under a key prefix (a
transport may carry several values in one record; :class:`ClientSession` state uses it).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from typing import Any, TypeAlias

import numpy as np

from sharefl.crypto.encoding import RingEncoding
from sharefl.crypto.errors import EncodingError
from sharefl.crypto.kdf import PLAN_DIGEST_BYTES, KeyContext
from sharefl.protocol import messages as m
from sharefl.protocol.clustering import Clustering, ClusteringError
from sharefl.protocol.errors import ConfigurationError, MalformedMessage, ProtocolError
from sharefl.protocol.fields import DEALT_SIZES as DEALT_SIZES  # re-exported: the limits
from sharefl.protocol.fields import MAX_DEALT_PEERS as MAX_DEALT_PEERS
from sharefl.protocol.fields import MAX_IDS as MAX_IDS
from sharefl.protocol.fields import MAX_PAIR_SHARES as MAX_PAIR_SHARES
from sharefl.protocol.keys import KeyAdvert
from sharefl.protocol.plan import RoundPlan

RecordValue: TypeAlias = int | float | bool | str | bytes | list[int] | list[bytes] | np.ndarray
Record: TypeAlias = dict[str, RecordValue]

TYPE_KEY = "type"
"""The key naming what a record holds (the Python class name, e.g. ``"MaskedInput"``)."""

MAX_PLAN_IDS = 1 << 20
"""Most client ids a round plan may carry in total (R · n)."""

_CONTEXT_HEAD = struct.calcsize(">IQII")


class RecordError(ProtocolError, ValueError):
    """A record is malformed: a missing key, a value of the wrong type, range or size, a
    list longer than its cap, duplicate ids, or an unknown ``type``. The message names the
    key; a receiver treats the sender as having sent something no honest peer sends."""


# ---- small helpers ------------------------------------------------------------------------


def _get(record: Mapping[str, Any], key: str) -> Any:
    try:
        return record[key]
    except KeyError:
        raise RecordError(f"record lacks {key!r}") from None


def get_int(record: Mapping[str, Any], key: str, lo: int = 0, hi: int = 2**64 - 1) -> int:
    """``record[key]`` as an int in [lo, hi]; raises :class:`RecordError`."""
    value = _get(record, key)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise RecordError(f"{key!r} must be an int, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise RecordError(f"{key!r} = {value} is outside [{lo}, {hi}]")
    return int(value)


def get_bool(record: Mapping[str, Any], key: str) -> bool:
    """``record[key]`` as a bool; raises :class:`RecordError`."""
    value = _get(record, key)
    if not isinstance(value, bool | np.bool_):
        raise RecordError(f"{key!r} must be a bool, got {type(value).__name__}")
    return bool(value)


def _float(record: Mapping[str, Any], key: str) -> float:
    value = _get(record, key)
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise RecordError(f"{key!r} must be a float, got {type(value).__name__}")
    return float(value)


def get_bytes(record: Mapping[str, Any], key: str, sizes: tuple[int, ...] | None = None) -> bytes:
    """``record[key]`` as bytes of one of ``sizes`` (any size if None); raises
    :class:`RecordError`."""
    value = _get(record, key)
    if not isinstance(value, bytes | bytearray):
        raise RecordError(f"{key!r} must be bytes, got {type(value).__name__}")
    if sizes is not None and len(value) not in sizes:
        raise RecordError(f"{key!r} must be {' or '.join(map(str, sizes))} bytes, got {len(value)}")
    return bytes(value)


def _list(record: Mapping[str, Any], key: str, cap: int = MAX_IDS) -> list[Any]:
    value = _get(record, key)
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu":
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise RecordError(f"{key!r} must be a list, got {type(value).__name__}")
    if len(value) > cap:
        raise RecordError(f"{key!r} has {len(value)} entries; at most {cap}")
    return list(value)


def get_ids(
    record: Mapping[str, Any], key: str, cap: int = MAX_IDS, unique: bool = True
) -> tuple[int, ...]:
    """``record[key]`` as a tuple of client ids (at most ``cap``, distinct if ``unique``);
    raises :class:`RecordError`."""
    values = _list(record, key, cap)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= v < 2**64:
            raise RecordError(f"{key!r} must hold client ids (ints in [0, 2^64)), got {v!r}")
    ids = tuple(int(v) for v in values)
    if unique and len(set(ids)) != len(ids):
        raise RecordError(f"{key!r} has duplicate client ids")
    return ids


def put_map(record: Record, key: str, values: Mapping[int, bytes]) -> None:
    """Store ``{peer: bytes}`` as the lists ``key.peers`` / ``key.values`` (peers sorted)."""
    items = sorted(values.items())
    record[f"{key}.peers"] = [int(p) for p, _ in items]
    record[f"{key}.values"] = [bytes(v) for _, v in items]


def get_map(
    record: Mapping[str, Any],
    key: str,
    size: int | Collection[int] | None = None,
    cap: int = MAX_IDS,
) -> dict[int, bytes]:
    """The map :func:`put_map` stored: at most ``cap`` entries, no peer twice, every value
    bytes (of ``size`` bytes, or of one of the sizes ``size`` holds, unless ``size`` is
    ``None``: a message's map, whose sizes the message checks); raises
    :class:`RecordError`."""
    peers = get_ids(record, f"{key}.peers", cap)
    values = _list(record, f"{key}.values", cap)
    if len(values) != len(peers):
        raise RecordError(f"{key!r}: {len(peers)} peers but {len(values)} values")
    sizes = (size,) if isinstance(size, int) else size
    result = {}
    for peer, value in zip(peers, values, strict=True):
        if not isinstance(value, bytes | bytearray):
            raise RecordError(f"{key!r}: the entry of client {peer} must be bytes")
        if sizes is not None and len(value) not in sizes:
            raise RecordError(f"{key!r}: the entry of client {peer} has {len(value)} bytes")
        result[peer] = bytes(value)
    return result


def _optional_map(record: Mapping[str, Any], key: str) -> dict[int, bytes]:
    """:func:`get_map`, or ``{}`` when neither list is present (a record of a sender that
    predates the field)."""
    if f"{key}.peers" not in record and f"{key}.values" not in record:
        return {}
    return get_map(record, key)


def _put_pair_map(record: Record, key: str, values: Mapping[tuple[int, int], bytes]) -> None:
    """Store ``{(dealer, peer): bytes}`` as ``key.dealers`` / ``key.peers`` / ``key.values``
    (sorted by dealer, then peer)."""
    items = sorted(values.items())
    record[f"{key}.dealers"] = [int(d) for (d, _), _ in items]
    record[f"{key}.peers"] = [int(p) for (_, p), _ in items]
    record[f"{key}.values"] = [bytes(v) for _, v in items]


def _get_pair_map(record: Mapping[str, Any], key: str, cap: int) -> dict[tuple[int, int], bytes]:
    """The map :func:`_put_pair_map` stored (``{}`` if absent): at most ``cap`` entries, no
    pair twice, every value bytes (the message checks the rest)."""
    names = [f"{key}.{part}" for part in ("dealers", "peers", "values")]
    if not any(name in record for name in names):
        return {}
    dealers = get_ids(record, names[0], cap, unique=False)
    peers = get_ids(record, names[1], cap, unique=False)
    values = _list(record, names[2], cap)
    if not len(dealers) == len(peers) == len(values):
        raise RecordError(f"the {key!r} lists differ in length")
    result: dict[tuple[int, int], bytes] = {}
    for pair, value in zip(zip(dealers, peers, strict=True), values, strict=True):
        if pair in result:
            raise RecordError(f"{key!r}: duplicate pair {pair}")
        if not isinstance(value, bytes | bytearray):
            raise RecordError(f"{key!r}: the entry of pair {pair} must be bytes")
        result[pair] = bytes(value)
    return result


def nest(prefix: str, record: Mapping[str, RecordValue]) -> Record:
    """``record`` with every key prefixed by ``prefix + "/"`` (to merge records)."""
    return {f"{prefix}/{k}": v for k, v in record.items()}


def unnest(prefix: str, record: Mapping[str, Any]) -> Record:
    """The keys of ``record`` under ``prefix + "/"``, without the prefix (empty if none)."""
    head = f"{prefix}/"
    return {k[len(head) :]: v for k, v in record.items() if k.startswith(head)}


# ---- contexts -----------------------------------------------------------------------------


def context_to_bytes(context: KeyContext) -> bytes:
    """The context's canonical bytes (:meth:`KeyContext.to_bytes`)."""
    return context.to_bytes()


def context_from_bytes(data: bytes) -> KeyContext:
    """Parse :meth:`KeyContext.to_bytes` output; raises :class:`RecordError`."""
    if not isinstance(data, bytes | bytearray) or len(data) not in (
        _CONTEXT_HEAD,
        _CONTEXT_HEAD + PLAN_DIGEST_BYTES,
    ):
        raise RecordError(
            f"a key context is {_CONTEXT_HEAD} or {_CONTEXT_HEAD + PLAN_DIGEST_BYTES} bytes"
        )
    version, round_, reclustering, cluster = struct.unpack(">IQII", data[:_CONTEXT_HEAD])
    try:
        return KeyContext(round_, reclustering, cluster, version, bytes(data[_CONTEXT_HEAD:]))
    except ValueError as exc:  # pragma: no cover - struct already bounds every field
        raise RecordError(f"bad key context: {exc}") from exc


def _context(record: Mapping[str, Any], key: str = "context") -> KeyContext:
    return context_from_bytes(get_bytes(record, key))


# ---- values -------------------------------------------------------------------------------


def _assignment_to(a: m.ClusterAssignment, r: Record) -> None:
    r.update(
        context=a.context.to_bytes(),
        members=[int(x) for x in a.members],
        threshold=a.threshold,
        length=a.length,
        bits=a.bits,
        signed=bool(a.signed),
    )
    if a.neighbours is not None:
        ids = sorted(a.neighbours)
        r["neighbours.ids"] = ids
        r["neighbours.degrees"] = [len(a.neighbours[i]) for i in ids]
        r["neighbours.peers"] = [int(p) for i in ids for p in sorted(a.neighbours[i])]
    if a.keys:
        _key_adverts_to(a.keys, r)


def _assignment_from(r: Mapping[str, Any]) -> m.ClusterAssignment:
    members = get_ids(r, "members", unique=False)
    neighbours = None
    if "neighbours.ids" in r:
        ids = get_ids(r, "neighbours.ids")
        degrees = get_ids(r, "neighbours.degrees", len(members), unique=False)
        peers = get_ids(r, "neighbours.peers", len(members) * len(members), unique=False)
        if len(degrees) != len(ids) or sum(degrees) != len(peers):
            raise RecordError("'neighbours.degrees' does not match the ids and peers")
        neighbours, start = {}, 0
        for cid, degree in zip(ids, degrees, strict=True):
            neighbours[cid] = frozenset(peers[start : start + degree])
            if len(neighbours[cid]) != degree:
                raise RecordError(f"the neighbour list of {cid} has duplicates")
            start += degree
    return m.ClusterAssignment(
        context=_context(r),
        members=tuple(sorted(members)),
        threshold=get_int(r, "threshold"),
        length=get_int(r, "length"),
        bits=get_int(r, "bits"),
        neighbours=neighbours or None,  # an empty graph is none, as in protobuf
        signed=get_bool(r, "signed"),
        keys=_key_adverts_from(r),
    )


_KEY_ADVERT_FIELDS = ("scope", "encryption_public", "mask_public", "signature")


def _key_advert_to(a: KeyAdvert, r: Record) -> None:
    r.update(sender=a.sender, **{n: bytes(getattr(a, n)) for n in _KEY_ADVERT_FIELDS})


def _key_advert_from(r: Mapping[str, Any]) -> KeyAdvert:
    """Shapes only (the advert checks its sizes): whether the keys are usable X25519 keys
    (and the signature verifies) is :func:`~sharefl.protocol.keys.check_key_advert`'s to
    say."""
    return KeyAdvert(
        sender=get_int(r, "sender"),
        scope=get_bytes(r, "scope"),
        encryption_public=get_bytes(r, "encryption_public"),
        mask_public=get_bytes(r, "mask_public"),
        signature=get_bytes(r, "signature"),
    )


def _key_adverts_to(adverts: tuple[KeyAdvert, ...], r: Record) -> None:
    r["keys.sender"] = [int(a.sender) for a in adverts]
    for name in _KEY_ADVERT_FIELDS:
        r[f"keys.{name}"] = [bytes(getattr(a, name)) for a in adverts]


def _key_adverts_from(r: Mapping[str, Any]) -> tuple[KeyAdvert, ...]:
    """The ``keys.*`` lists (empty if absent; the assignment bounds them by its members and
    refuses two adverts of one client)."""
    names = ("keys.sender", *(f"keys.{n}" for n in _KEY_ADVERT_FIELDS))
    if not any(name in r for name in names):
        return ()
    senders = get_ids(r, "keys.sender", unique=False)
    columns = {n: _list(r, f"keys.{n}") for n in _KEY_ADVERT_FIELDS}
    if any(len(c) != len(senders) for c in columns.values()):
        raise RecordError("the 'keys.*' lists differ in length")
    adverts = []
    for i, sender in enumerate(senders):
        try:
            adverts.append(
                _key_advert_from({"sender": sender, **{n: c[i] for n, c in columns.items()}})
            )
        except (RecordError, MalformedMessage) as exc:
            raise RecordError(f"the key advert of client {sender}: {exc}") from None
    return tuple(adverts)


def _advert_to(a: m.AdvertiseKeys, r: Record) -> None:
    r.update(
        sender=a.sender,
        context=a.context.to_bytes(),
        encryption_public=a.encryption_public,
        mask_public=a.mask_public,
        commitment=a.commitment,
        signature=a.signature,
    )


def _advert_from(r: Mapping[str, Any]) -> m.AdvertiseKeys:
    return m.AdvertiseKeys(
        sender=get_int(r, "sender"),
        context=_context(r),
        encryption_public=get_bytes(r, "encryption_public"),
        mask_public=get_bytes(r, "mask_public"),
        commitment=get_bytes(r, "commitment"),
        signature=get_bytes(r, "signature"),
    )


_ADVERT_FIELDS = ("sender", "context", "encryption_public", "mask_public", "commitment")


def _keys_to(k: m.KeysBroadcast, r: Record) -> None:
    r["context"] = k.context.to_bytes()
    adverts = list(k.advertisements)
    r["adverts.sender"] = [a.sender for a in adverts]
    for name in (*_ADVERT_FIELDS[1:], "signature"):
        r[f"adverts.{name}"] = [
            a.context.to_bytes() if name == "context" else getattr(a, name) for a in adverts
        ]


def _keys_from(r: Mapping[str, Any]) -> m.KeysBroadcast:
    senders = get_ids(r, "adverts.sender", unique=False)
    columns = {n: _list(r, f"adverts.{n}") for n in (*_ADVERT_FIELDS[1:], "signature")}
    if any(len(c) != len(senders) for c in columns.values()):
        raise RecordError("the 'adverts.*' lists differ in length")
    adverts = tuple(
        _advert_from({"sender": s, **{n: c[i] for n, c in columns.items()}})
        for i, s in enumerate(senders)
    )
    return m.KeysBroadcast(_context(r), adverts)


def _shares_to(s: m.EncryptedShares, r: Record) -> None:
    r.update(sender=s.sender, context=s.context.to_bytes())
    put_map(r, "bundles", s.bundles)


def _shares_from(r: Mapping[str, Any]) -> m.EncryptedShares:
    return m.EncryptedShares(get_int(r, "sender"), _context(r), get_map(r, "bundles"))


def _masking_to(x: m.MaskingRequest, r: Record) -> None:
    r.update(context=x.context.to_bytes(), receiver=x.receiver, survivors=list(x.survivors))
    put_map(r, "bundles", x.bundles)


def _masking_from(r: Mapping[str, Any]) -> m.MaskingRequest:
    return m.MaskingRequest(
        _context(r),
        get_int(r, "receiver"),
        get_ids(r, "survivors", unique=False),
        get_map(r, "bundles"),
    )


def _masked_to(x: m.MaskedInput, r: Record) -> None:
    r.update(sender=x.sender, context=x.context.to_bytes(), vector=x.vector)
    r["complaints"] = list(x.complaints)


def _vector(r: Mapping[str, Any]) -> np.ndarray:
    """The array in native byte order (the message checks its dtype and shape)."""
    vector = _get(r, "vector")
    if not isinstance(vector, np.ndarray):
        raise RecordError(f"'vector' must be a numpy array, got {type(vector).__name__}")
    return vector.astype(vector.dtype.newbyteorder("="), copy=False)


def _masked_from(r: Mapping[str, Any]) -> m.MaskedInput:
    return m.MaskedInput(
        get_int(r, "sender"), _context(r), _vector(r), get_ids(r, "complaints", unique=False)
    )


def _masked_shares_to(x: m.MaskedShares, r: Record) -> None:
    r.update(
        sender=x.sender,
        context=x.context.to_bytes(),
        vector=x.vector,
        seed_commitment=bytes(x.seed_commitment),
    )
    put_map(r, "pair_commitments", x.pair_commitments)
    put_map(r, "bundles", x.bundles)


def _masked_shares_from(r: Mapping[str, Any]) -> m.MaskedShares:
    return m.MaskedShares(
        get_int(r, "sender"),
        _context(r),
        _vector(r),
        get_bytes(r, "seed_commitment"),
        get_map(r, "pair_commitments"),
        get_map(r, "bundles"),
    )


def _consistency_to(x: m.ConsistencyRequest, r: Record) -> None:
    r.update(context=x.context.to_bytes(), survivors=list(x.survivors))


def _consistency_from(r: Mapping[str, Any]) -> m.ConsistencyRequest:
    return m.ConsistencyRequest(_context(r), get_ids(r, "survivors", unique=False))


def _signature_to(x: m.ConsistencySignature, r: Record) -> None:
    r.update(sender=x.sender, context=x.context.to_bytes(), signature=x.signature)


def _signature_from(r: Mapping[str, Any]) -> m.ConsistencySignature:
    return m.ConsistencySignature(get_int(r, "sender"), _context(r), get_bytes(r, "signature"))


def _unmask_request_to(x: m.UnmaskRequest, r: Record) -> None:
    r.update(context=x.context.to_bytes(), survivors=list(x.survivors), dropped=list(x.dropped))
    put_map(r, "signatures", x.signatures)
    if x.bundles:
        put_map(r, "bundles", x.bundles)


def _unmask_request_from(r: Mapping[str, Any]) -> m.UnmaskRequest:
    return m.UnmaskRequest(
        _context(r),
        get_ids(r, "survivors", unique=False),
        get_ids(r, "dropped", unique=False),
        get_map(r, "signatures"),
        _optional_map(r, "bundles"),
    )


def _unmask_response_to(x: m.UnmaskResponse, r: Record) -> None:
    r.update(sender=x.sender, context=x.context.to_bytes())
    put_map(r, "seed_shares", x.seed_shares)
    put_map(r, "key_shares", x.key_shares)
    put_map(r, "pair_seeds", x.pair_seeds)
    if x.pair_shares:
        _put_pair_map(r, "pair_shares", x.pair_shares)
    if x.complaints:
        r["complaints"] = [int(c) for c in x.complaints]


def _unmask_response_from(r: Mapping[str, Any]) -> m.UnmaskResponse:
    return m.UnmaskResponse(
        get_int(r, "sender"),
        _context(r),
        get_map(r, "seed_shares"),
        get_map(r, "key_shares"),
        get_map(r, "pair_seeds"),
        _get_pair_map(r, "pair_shares", MAX_PAIR_SHARES),
        get_ids(r, "complaints", unique=False) if "complaints" in r else (),
    )


def _encoding_to(e: RingEncoding, r: Record) -> None:
    r.update(bits=e.bits, frac_bits=e.frac_bits, clip=e.clip, max_summands=e.max_summands)
    if e.l2_clip is not None:
        r["l2_clip"] = e.l2_clip


def _encoding_from(r: Mapping[str, Any]) -> RingEncoding:
    try:
        return RingEncoding(
            get_int(r, "bits"),
            get_int(r, "frac_bits"),
            _float(r, "clip"),
            get_int(r, "max_summands"),
            _float(r, "l2_clip") if "l2_clip" in r else None,
        )
    except EncodingError as exc:
        raise RecordError(f"bad encoding: {exc}") from exc


def _plan_to(p: RoundPlan, r: Record) -> None:
    r["round"] = p.round
    r["clusters_per_clustering"] = [len(c.clusters) for c in p.clusterings]
    r["cluster_sizes"] = [len(k) for c in p.clusterings for k in c.clusters]
    r["members"] = [int(i) for c in p.clusterings for k in c.clusters for i in k]
    if p.atoms is not None:
        r["atom_sizes"] = [len(a) for a in p.atoms.clusters]
        r["atom_members"] = [int(i) for a in p.atoms.clusters for i in a]


def _plan_from(r: Mapping[str, Any]) -> RoundPlan:
    counts = get_ids(r, "clusters_per_clustering", 1 << 10, unique=False)
    sizes = get_ids(r, "cluster_sizes", MAX_PLAN_IDS, unique=False)
    members = get_ids(r, "members", MAX_PLAN_IDS, unique=False)
    if sum(counts) != len(sizes) or sum(sizes) != len(members):
        raise RecordError("the plan's cluster counts and sizes do not match its members")
    clusterings, k, i = [], 0, 0
    for count in counts:
        clusters = []
        for size in sizes[k : k + count]:
            clusters.append(members[i : i + size])
            i += size
        k += count
        clusterings.append(tuple(clusters))
    atoms = None
    if "atom_sizes" in r:
        atom_sizes = get_ids(r, "atom_sizes", MAX_PLAN_IDS, unique=False)
        atom_members = get_ids(r, "atom_members", MAX_PLAN_IDS, unique=False)
        if sum(atom_sizes) != len(atom_members):
            raise RecordError("the plan's atom sizes do not match its atom members")
        starts = [sum(atom_sizes[:j]) for j in range(len(atom_sizes))]
        try:
            atoms = Clustering(
                tuple(atom_members[a : a + n] for a, n in zip(starts, atom_sizes, strict=True))
            )
        except ClusteringError as exc:
            raise RecordError(f"bad round plan atoms: {exc}") from exc
    try:
        return RoundPlan(get_int(r, "round"), tuple(Clustering(c) for c in clusterings), atoms)
    except (ClusteringError, ConfigurationError, ValueError) as exc:
        raise RecordError(f"bad round plan: {exc}") from exc


_CONVERTERS: dict[type, tuple[Any, Any]] = {
    m.ClusterAssignment: (_assignment_to, _assignment_from),
    m.AdvertiseKeys: (_advert_to, _advert_from),
    m.KeysBroadcast: (_keys_to, _keys_from),
    m.EncryptedShares: (_shares_to, _shares_from),
    m.MaskingRequest: (_masking_to, _masking_from),
    m.MaskedInput: (_masked_to, _masked_from),
    m.MaskedShares: (_masked_shares_to, _masked_shares_from),
    KeyAdvert: (_key_advert_to, _key_advert_from),
    m.ConsistencyRequest: (_consistency_to, _consistency_from),
    m.ConsistencySignature: (_signature_to, _signature_from),
    m.UnmaskRequest: (_unmask_request_to, _unmask_request_from),
    m.UnmaskResponse: (_unmask_response_to, _unmask_response_from),
    RingEncoding: (_encoding_to, _encoding_from),
    RoundPlan: (_plan_to, _plan_from),
}
_BY_NAME = {cls.__name__: cls for cls in _CONVERTERS}

Recordable: TypeAlias = (
    m.ClientMessage | m.ServerMessage | m.ClusterAssignment | KeyAdvert | RingEncoding | RoundPlan
)


def to_record(value: Recordable) -> Record:
    """The record of one protocol message, assignment, key advert, encoding or round plan.

    Raises ``TypeError`` for any other value.
    """
    converter = _CONVERTERS.get(type(value))
    if converter is None:
        raise TypeError(f"no record format for {type(value).__name__}")
    record: Record = {TYPE_KEY: type(value).__name__}
    converter[0](value, record)
    return record


def from_record(record: Mapping[str, Any], expected: type | tuple[type, ...] | None = None) -> Any:
    """The value :func:`to_record` made ``record`` from.

    ``expected`` restricts what is accepted (a class or a tuple of classes, e.g.
    ``ClientMessage.__args__``). Raises :class:`RecordError` for a record that is malformed,
    of an unknown type or not of the ``expected`` type.
    """
    if not isinstance(record, Mapping):
        raise RecordError(f"a record is a mapping, got {type(record).__name__}")
    name = record.get(TYPE_KEY)
    cls = _BY_NAME.get(name) if isinstance(name, str) else None
    if cls is None:
        raise RecordError(f"unknown record type {name!r}; known: {sorted(_BY_NAME)}")
    if expected is not None:
        allowed = expected if isinstance(expected, tuple) else (expected,)
        if cls not in allowed:
            raise RecordError(
                f"a {name} record where {' or '.join(c.__name__ for c in allowed)} was expected"
            )
    try:
        return _CONVERTERS[cls][1](record)
    except RecordError:
        raise
    except MalformedMessage as exc:  # the message refused its fields
        raise RecordError(f"bad {name} record: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise RecordError(f"bad {name} record: {exc}") from exc


CLIENT_MESSAGES: tuple[type, ...] = (
    m.AdvertiseKeys,
    m.EncryptedShares,
    m.MaskedInput,
    m.MaskedShares,
    m.ConsistencySignature,
    m.UnmaskResponse,
)
"""The classes a server accepts from a client within a cluster's round
(``from_record(r, CLIENT_MESSAGES)``). A :class:`~sharefl.protocol.keys.KeyAdvert` is
not one of them: a client sends it once per scope, outside any round, and a receiver asks
for it by name (``from_record(r, KeyAdvert)``)."""

SERVER_MESSAGES: tuple[type, ...] = (
    m.KeysBroadcast,
    m.MaskingRequest,
    m.ConsistencyRequest,
    m.UnmaskRequest,
)
"""The classes a client accepts from the server between assignment and unmasking."""
