"""The two-exchange round (protocol version 5): keys set up once, shares with the masked
input, bundles with the unmask request.

Drop-outs at every exchange give the exact sum of the survivors (or a failed cluster, never
a wrong sum); the client refuses versions it does not speak, keys it cannot trust and
requests that would reveal two secrets of one peer; the server rejects malformed replies
and keeps serving the others. The property across every server behaviour is searched in
``test_malicious_search.py`` (``test_no_leak_in_the_two_exchange_round``).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from unchecked import unchecked_replace

from sharefl.crypto.kdf import TWO_EXCHANGE_VERSION, KeyContext, Purpose
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol.client import ClientPolicy, ClientSession, ClientState
from sharefl.protocol.driver import secure_sum
from sharefl.protocol.errors import (
    BadAdvertisement,
    ConfigurationError,
    InconsistentRequest,
    MalformedMessage,
    RejectedMessage,
    StageError,
    VersionRefused,
)
from sharefl.protocol.keys import ClientKeys, KeyAdvert, check_key_advert
from sharefl.protocol.messages import ClusterAssignment, MaskedShares, UnmaskRequest
from sharefl.protocol.server import ClusterSum, FailedCluster, ServerSession
from sharefl.protocol.settings import KeySetup, SecureAggregationSettings

LENGTH = 64
MEMBERS = (2, 5, 7, 11, 13)
CONTEXT = KeyContext(round=4, version=TWO_EXCHANGE_VERSION)


def _keys(members=MEMBERS, scope=b"run"):
    return {c: ClientKeys.generate(c, scope) for c in members}


def _assignment(keys, threshold=3, signed=False, identities=None, neighbours=None):
    adverts = tuple(keys[c].advert(identities[c] if identities else None) for c in sorted(keys))
    return ClusterAssignment(
        CONTEXT, tuple(sorted(keys)), threshold, LENGTH, 32, neighbours, signed, adverts
    )


def _inputs(members=MEMBERS, seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.integers(0, 2**32, LENGTH, dtype=np.uint32) for c in members}


def _ring_sum(inputs, members):
    total = np.zeros(LENGTH, dtype=np.uint32)
    for c in members:
        total += inputs[c]
    return total


def _run(assignment, keys, inputs, *, gone_first=(), gone_unmask=(), policies=None, tamper=None):
    """One cluster: ``gone_first`` never send their masked input, ``gone_unmask`` never
    answer the unmask request; ``tamper(holder, request)`` may alter a request."""
    policies = policies or {}
    server = ServerSession(assignment, directory=_directory(policies))
    sessions = {
        c: ClientSession(c, assignment, inputs[c], policies.get(c), keys=keys[c])
        for c in assignment.members
    }
    for c, session in sessions.items():
        if c not in gone_first:
            server.receive(session.start())
    requests = server.advance()
    while requests:
        for c, request in requests.items():
            if isinstance(request, UnmaskRequest) and c in gone_unmask:
                continue
            if tamper is not None:
                request = tamper(c, request)
            server.receive(sessions[c].handle(request))
        requests = server.advance()
    return server.outcome, sessions


def _directory(policies):
    return {c: p.identity.public for c, p in policies.items() if p.identity is not None}


DROPS = [
    ((), ()),
    ((5,), ()),
    ((), (7,)),
    ((5,), (7,)),  # a peer gone before its input, another before unmasking: pair-seed shares
    ((2, 13), ()),
    ((), (5, 11)),
]


@pytest.mark.parametrize(("gone_first", "gone_unmask"), DROPS)
def test_drop_outs_at_every_exchange_give_the_exact_sum_of_the_survivors(gone_first, gone_unmask):
    keys, inputs = _keys(), _inputs()
    outcome, _ = _run(
        _assignment(keys), keys, inputs, gone_first=gone_first, gone_unmask=gone_unmask
    )
    survivors = tuple(c for c in MEMBERS if c not in gone_first)
    assert isinstance(outcome, ClusterSum), outcome
    assert outcome.members == survivors
    assert np.array_equal(outcome.ring_sum, _ring_sum(inputs, survivors))
    assert outcome.dropped == tuple(gone_first)


def test_too_few_answers_fail_the_cluster_never_a_wrong_sum():
    keys, inputs = _keys(), _inputs()
    outcome, _ = _run(_assignment(keys), keys, inputs, gone_first=(5, 7), gone_unmask=(11,))
    assert isinstance(outcome, FailedCluster) and outcome.stage == "unmask"


def test_signed_mode_with_drop_outs_at_every_exchange():
    identities = {c: IdentityKey.generate() for c in MEMBERS}
    directory = {c: k.public for c, k in identities.items()}
    policies = {
        c: ClientPolicy(identity=identities[c], directory=directory, require_signed=True)
        for c in MEMBERS
    }
    keys, inputs = _keys(), _inputs(seed=1)
    assignment = _assignment(keys, threshold=4, signed=True, identities=identities)
    for gone_first, gone_unmask in (((13,), ()), ((), (2,))):
        outcome, _ = _run(
            assignment,
            keys,
            inputs,
            gone_first=gone_first,
            gone_unmask=gone_unmask,
            policies=policies,
        )
        assert isinstance(outcome, ClusterSum)
        survivors = tuple(c for c in MEMBERS if c not in gone_first)
        assert np.array_equal(outcome.ring_sum, _ring_sum(inputs, survivors))


def test_a_sparse_neighbour_graph_sums_exactly_with_drop_outs():
    ring = {c: frozenset({MEMBERS[i - 1], MEMBERS[(i + 1) % 5]}) for i, c in enumerate(MEMBERS)}
    ring = {c: peers | {MEMBERS[(i + 2) % 5]} - {c} for i, (c, peers) in enumerate(ring.items())}
    graph = {c: frozenset(v for v in MEMBERS if c in ring[v] or v in ring[c]) for c in MEMBERS}
    keys, inputs = _keys(), _inputs(seed=2)
    assignment = _assignment(keys, threshold=3, neighbours=graph)
    outcome, _ = _run(assignment, keys, inputs, gone_first=(7,), gone_unmask=(13,))
    assert isinstance(outcome, ClusterSum)
    assert np.array_equal(outcome.ring_sum, _ring_sum(inputs, (2, 5, 11, 13)))


def test_the_round_driver_sums_every_cluster_with_keys_kept_across_rounds():
    ids = range(12)
    keys = {c: ClientKeys.generate(c) for c in ids}
    rng = np.random.default_rng(3)
    for round_number in range(2):
        inputs = {c: rng.normal(size=20).clip(-1, 1) for c in ids}
        result = secure_sum(
            inputs,
            SecureAggregationSettings(cluster_size=4, clip=1.0, key_setup="once"),
            seed=round_number,
            round=round_number,
            client_keys=keys,
            dropouts={"mask": [3], "unmask": [8]},
        )
        assert not result.failed
        members = {m for c in result.clusters for m in c.members}
        assert 3 not in members and 8 in members
        for cluster in result.clusters:
            expected = sum(inputs[m] for m in cluster.members)
            assert np.allclose(cluster.decoded, expected, atol=1e-3)


def test_the_setting_names_its_exchanges():
    assert KeySetup("once").exchanges(signed=False) == 2
    assert KeySetup("once").exchanges(signed=True) == 3
    assert KeySetup.PER_CLUSTER.exchanges(signed=False) == 4
    with pytest.raises(ConfigurationError, match="key_setup must be one of"):
        SecureAggregationSettings(key_setup="twice")


def test_a_version_the_client_does_not_speak_is_refused_by_name():
    keys = _keys()
    assignment = _assignment(keys)
    unknown = dataclasses.replace(assignment, context=dataclasses.replace(CONTEXT, version=9))
    with pytest.raises(VersionRefused, match="speaks versions"):
        ClientSession(2, unknown, _inputs()[2], keys=keys[2])


def test_the_client_refuses_keys_it_cannot_trust():
    keys, inputs = _keys(), _inputs()
    assignment = _assignment(keys)
    stranger = ClientKeys.generate(2, b"run").advert()
    cases = {
        "missing": assignment.keys[1:],
        "duplicated": (*assignment.keys, assignment.keys[1]),
        "another scope": (
            *assignment.keys[:1],
            ClientKeys.generate(5, b"other").advert(),
            *assignment.keys[2:],
        ),
        "own keys replaced": (stranger, *assignment.keys[1:]),  # client 2's advert
        "a key repeated": (
            assignment.keys[0],
            dataclasses.replace(assignment.keys[1], mask_public=assignment.keys[0].mask_public),
            *assignment.keys[2:],
        ),
        "low order": (
            assignment.keys[0],
            dataclasses.replace(assignment.keys[1], mask_public=bytes(32)),
            *assignment.keys[2:],
        ),
    }
    with pytest.raises(MalformedMessage, match="6 entries; at most 5"):  # no such message
        dataclasses.replace(assignment, keys=tuple(cases["duplicated"]))
    for name, adverts in cases.items():
        # what a hostile server could send all the same: the client refuses it too
        bad = unchecked_replace(assignment, keys=tuple(adverts))
        with pytest.raises(BadAdvertisement):
            # a low-order key is refused by the agreement, before the reply exists
            ClientSession(2, bad, inputs[2], keys=keys[2]).start()
            pytest.fail(f"keys {name}: accepted")
    # the server, which agrees with no key, probes each key's order
    with pytest.raises(BadAdvertisement, match="low-order"):
        check_key_advert(cases["low order"][1])


def test_signed_adverts_bind_the_identity_the_scope_and_the_keys():
    identity = IdentityKey.generate()
    advert = ClientKeys.generate(4, b"scope").advert(identity)
    check_key_advert(advert, identity.public)
    for changed in (
        dataclasses.replace(advert, scope=b"other"),
        dataclasses.replace(advert, sender=5),
        dataclasses.replace(advert, mask_public=ClientKeys.generate(4).mask.public),
    ):
        with pytest.raises(BadAdvertisement, match="not signed"):
            check_key_advert(changed, identity.public)
    with pytest.raises(MalformedMessage, match="scope"):  # no such advert exists
        dataclasses.replace(advert, scope=bytes(65))


def test_the_client_needs_its_input_and_keys_before_it_starts():
    keys = _keys()
    assignment = _assignment(keys)
    with pytest.raises(ConfigurationError, match="keys="):
        ClientSession(2, assignment, _inputs()[2])
    session = ClientSession(2, assignment, keys=keys[2])
    with pytest.raises(StageError, match="set_input"):
        session.start()
    assert session.state is ClientState.NEW
    session.set_input(_inputs()[2])
    assert isinstance(session.start(), MaskedShares)


@pytest.mark.parametrize(
    "change",
    [
        "survivor and dropped",
        "lists miss a member",
        "bundle from a dropped client",
        "second request",
    ],
)
def test_the_client_refuses_unmask_requests_that_would_reveal_two_secrets(change):
    keys, inputs = _keys(), _inputs()
    assignment = _assignment(keys)
    server = ServerSession(assignment)
    sessions = {c: ClientSession(c, assignment, inputs[c], keys=keys[c]) for c in MEMBERS}
    for c in MEMBERS:
        if c != 13:
            server.receive(sessions[c].start())
    request = server.advance()[2]
    assert request.dropped == (13,)
    if change == "survivor and dropped":
        request = dataclasses.replace(request, dropped=(5, 13))
    elif change == "lists miss a member":
        request = dataclasses.replace(request, dropped=())
    elif change == "bundle from a dropped client":
        bundle = next(iter(request.bundles.values()))  # of a size a dealer seals
        request = dataclasses.replace(request, bundles={**request.bundles, 13: bundle})
    else:
        sessions[2].handle(request)
    with pytest.raises(InconsistentRequest):
        sessions[2].handle(request)


def test_a_withheld_or_corrupted_bundle_is_a_complaint_and_the_sum_survives():
    keys, inputs = _keys(), _inputs(seed=4)

    def tamper(holder, request):
        if holder == 2 and 5 in request.bundles:
            bundles = dict(request.bundles)
            bundles[5] = bundles[5][:-1] + bytes([bundles[5][-1] ^ 1])
            bundles.pop(7, None)
            return dataclasses.replace(request, bundles=bundles)
        return request

    outcome, _ = _run(_assignment(keys), keys, inputs, tamper=tamper)
    assert isinstance(outcome, ClusterSum)
    assert np.array_equal(outcome.ring_sum, _ring_sum(inputs, MEMBERS))
    assert {(2, 5), (2, 7)} <= set(outcome.complaints)


def test_the_server_rejects_malformed_replies_and_keeps_serving():
    keys, inputs = _keys(), _inputs()
    assignment = _assignment(keys)
    server = ServerSession(assignment)
    replies = {c: ClientSession(c, assignment, inputs[c], keys=keys[c]).start() for c in MEMBERS}
    good = replies[2]
    for change in (  # sizes are the message's own: no such message exists
        dict(seed_commitment=b"short"),
        dict(bundles={**good.bundles, 5: good.bundles[5] + b"x"}),
        dict(pair_commitments={**good.pair_commitments, 99: bytes(32)}),  # bundles too small
    ):
        with pytest.raises(MalformedMessage):
            dataclasses.replace(good, **change)
    stranger = {99 if k == 5 else k: v for k, v in good.pair_commitments.items()}
    hostile = [
        dataclasses.replace(good, vector=good.vector[:-1]),
        dataclasses.replace(good, bundles={k: v for k, v in list(good.bundles.items())[1:]}),
        dataclasses.replace(good, pair_commitments=stranger),
    ]
    for message in hostile:
        with pytest.raises(RejectedMessage):
            server.receive(message)
    for reply in replies.values():
        server.receive(reply)
    with pytest.raises(RejectedMessage, match="duplicate"):
        server.receive(good)
    assert server.waiting_for() == frozenset()


def test_pair_seeds_of_distinct_contexts_are_independent_and_keys_agree():
    a, b = ClientKeys.generate(1), ClientKeys.generate(2)
    adverts = {1: a.advert(), 2: b.advert()}

    seeds = set()
    for round_number, cluster in itertools.product(range(3), range(2)):
        context = KeyContext(round_number, 0, cluster, TWO_EXCHANGE_VERSION)
        mine = a.derive(adverts[2], context, Purpose.MASK_SEED)
        assert mine == b.derive(adverts[1], context, Purpose.MASK_SEED)
        seeds.add(mine)
    assert len(seeds) == 6
    with pytest.raises(BadAdvertisement):
        a.derive(KeyAdvert(2, b"", bytes(32), bytes(32)), CONTEXT, Purpose.MASK_SEED)
