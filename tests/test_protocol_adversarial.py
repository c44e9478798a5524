"""Misbehaving servers and clients: every refusal the protocol promises, played out."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from sharefl.crypto.kdf import KeyContext, X25519KeyPair
from sharefl.crypto.shamir import PRIME, SHARE_BYTES, Share
from sharefl.crypto.signatures import IdentityKey
from sharefl.protocol.client import ClientPolicy, ClientSession, ClientState
from sharefl.protocol.errors import (
    BadAdvertisement,
    ConfigurationError,
    ConsistencyCheckFailed,
    ContextMismatch,
    InconsistentRequest,
    MalformedMessage,
    RejectedMessage,
    ThresholdTooLow,
)
from sharefl.protocol.messages import (
    ClusterAssignment,
    ConsistencyRequest,
    KeysBroadcast,
    MaskedInput,
    UnmaskRequest,
    UnmaskResponse,
)
from sharefl.protocol.server import ClusterSum, FailedCluster, ServerSession, ServerState

CTX = KeyContext(round=1, reclustering=0, cluster=0)
LENGTH = 33


class Cluster:
    """Honest clients and an honest server for one cluster, driven by hand."""

    def __init__(self, n: int = 5, t: int = 3, signed: bool = False, length: int = LENGTH):
        members = tuple(range(n))
        self.identities = {i: IdentityKey.generate() for i in members}
        self.directory = {i: k.public for i, k in self.identities.items()}
        self.assignment = ClusterAssignment(CTX, members, t, length, 32, None, signed)
        rng = np.random.default_rng(n * 100 + t)
        self.vectors = {i: rng.integers(0, 2**32, size=length, dtype=np.uint32) for i in members}
        self.clients = {
            i: ClientSession(
                i,
                self.assignment,
                self.vectors[i],
                ClientPolicy(identity=self.identities[i], directory=self.directory),
            )
            for i in members
        }
        self.server = ServerSession(self.assignment, self.directory)

    def advertise(self):
        for client in self.clients.values():
            self.server.receive(client.advertise())
        return self.server.advance()

    def step(self, outgoing, skip=()):
        for cid, message in outgoing.items():
            if cid not in skip:
                self.server.receive(self.clients[cid].handle(message))
        return self.server.advance()

    def to_unmask(self, skip_mask=()):
        out = self.step(self.step(self.advertise()), skip=skip_mask)
        if self.assignment.signed:
            out = self.step(out)
        return out

    def expected(self, members):
        return sum(self.vectors[i] for i in members)


# --- misbehaving server ----------------------------------------------------------------------


def test_server_asking_for_both_secrets_of_one_peer_is_refused():
    c = Cluster()
    out = c.to_unmask(skip_mask=(4,))
    honest = out[0]
    assert set(honest.survivors) == {0, 1, 2, 3} and honest.dropped == (4,)
    # Claim client 1 both survived (reveal b_1) and dropped (reveal its mask key).
    evil = UnmaskRequest(CTX, survivors=(0, 1, 2, 3), dropped=(1, 4))
    with pytest.raises(InconsistentRequest, match="both"):
        c.clients[0].handle(evil)
    assert c.clients[0].state is ClientState.ABORTED
    with pytest.raises(InconsistentRequest):  # and it stays silent afterwards
        c.clients[0].handle(honest)


def test_second_unmask_request_is_refused():
    c = Cluster()
    out = c.to_unmask()
    first = c.clients[0].handle(out[0])
    assert isinstance(first, UnmaskResponse) and 1 in first.seed_shares
    # Now pretend client 1 dropped, to get the share of its mask key too.
    again = UnmaskRequest(CTX, survivors=(0, 2, 3, 4), dropped=(1,))
    with pytest.raises(InconsistentRequest, match="state done"):
        c.clients[0].handle(again)


@pytest.mark.parametrize(
    "survivors,dropped,match",
    [
        ((0, 1, 2), (4,), "account"),  # client 3 silently missing from both lists
        ((0, 1), (2, 3, 4), "fewer than t"),  # too few survivors
        ((0, 1, 2, 3, 4, 9), (), "did not complete"),  # a stranger among survivors
        ((1, 2, 3, 4), (0,), "omits"),  # the recipient itself called dropped
    ],
)
def test_inconsistent_unmask_lists_are_refused(survivors, dropped, match):
    c = Cluster()
    c.to_unmask()
    with pytest.raises(InconsistentRequest, match=match):
        c.clients[0].handle(UnmaskRequest(CTX, survivors, dropped))


def test_lowered_threshold_is_refused():
    c = Cluster(n=5, t=3)
    low = dataclasses.replace(c.assignment, threshold=2)
    with pytest.raises(ThresholdTooLow, match="floor 3"):
        ClientSession(0, low, c.vectors[0])
    with pytest.raises(ThresholdTooLow):
        ClientSession(0, dataclasses.replace(c.assignment, threshold=1), c.vectors[0])
    strict = ClientPolicy(colluders=2)  # t > (5 + 2)/2: two colluders cannot split views
    with pytest.raises(ThresholdTooLow):
        ClientSession(0, c.assignment, c.vectors[0], strict)


def test_unsigned_mode_is_refused_when_signatures_are_required():
    c = Cluster()
    with pytest.raises(InconsistentRequest, match="signed"):
        ClientSession(0, c.assignment, c.vectors[0], ClientPolicy(require_signed=True))


def test_replayed_messages_from_another_round_or_cluster_are_refused():
    for other in (
        KeyContext(round=2, reclustering=0, cluster=0),
        KeyContext(round=1, reclustering=1, cluster=0),
        KeyContext(round=1, reclustering=0, cluster=7),
    ):
        c = Cluster()
        replay = dataclasses.replace(c.advertise()[1], context=other)
        with pytest.raises(ContextMismatch):
            c.clients[1].handle(replay)
        assert c.clients[1].state is ClientState.ABORTED


def test_replayed_advertisement_inside_a_broadcast_is_refused():
    c = Cluster()
    out = c.advertise()
    adverts = list(out[0].advertisements)
    adverts[2] = dataclasses.replace(adverts[2], context=KeyContext(round=0))
    with pytest.raises(BadAdvertisement):
        c.clients[0].handle(KeysBroadcast(CTX, tuple(adverts)))


def test_substituted_public_key_fails_the_signature_check():
    c = Cluster(t=4, signed=True)
    out = c.advertise()
    adverts = list(out[0].advertisements)
    attacker = X25519KeyPair.generate()
    adverts[1] = dataclasses.replace(adverts[1], mask_public=attacker.public)
    with pytest.raises(BadAdvertisement, match="not signed"):
        c.clients[0].handle(KeysBroadcast(CTX, tuple(adverts)))


def test_server_cannot_replace_a_clients_own_advertisement_even_unsigned():
    c = Cluster()
    out = c.advertise()
    adverts = list(out[0].advertisements)
    adverts[0] = dataclasses.replace(adverts[0], encryption_public=X25519KeyPair.generate().public)
    with pytest.raises(BadAdvertisement, match="different advertisement"):
        c.clients[0].handle(KeysBroadcast(CTX, tuple(adverts)))


def test_different_survivor_lists_fail_the_consistency_check():
    c = Cluster(n=6, t=5, signed=True)
    out = c.step(c.step(c.advertise()))
    assert all(isinstance(m, ConsistencyRequest) for m in out.values())
    full, partial = (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4)
    # The server shows the full list to clients 0-2 and a list without 5 to 3 and 4 (to
    # make 3 and 4 reveal the mask key of 5 while 0-2 reveal its seed).
    signatures = {}
    for cid in range(5):
        shown = full if cid < 3 else partial
        reply = c.clients[cid].handle(ConsistencyRequest(CTX, shown))
        signatures[cid] = reply.signature
    # Whichever list it now claims, fewer than t = 5 clients signed it.
    with pytest.raises(ConsistencyCheckFailed, match="only 3 valid"):
        c.clients[0].handle(UnmaskRequest(CTX, full, (), signatures))
    with pytest.raises(ConsistencyCheckFailed, match="differ"):
        c.clients[3].handle(UnmaskRequest(CTX, full, (), signatures))
    with pytest.raises(ConsistencyCheckFailed, match="only 2 valid"):
        c.clients[4].handle(UnmaskRequest(CTX, partial, (5,), signatures))


def test_forged_consistency_signatures_do_not_count():
    c = Cluster(n=5, t=4, signed=True)
    out = c.to_unmask()
    request = out[0]
    forged = dict.fromkeys(request.survivors, os.urandom(64))
    with pytest.raises(ConsistencyCheckFailed):
        c.clients[0].handle(dataclasses.replace(request, signatures=forged))


# --- misbehaving clients ---------------------------------------------------------------------


def _finish(c: Cluster, out, skip=()):
    while out:
        out = c.step(out, skip=skip)
    return c.server.outcome


def test_wrong_length_masked_vector_is_rejected_and_round_continues():
    c = Cluster()
    out = c.step(c.advertise())
    for cid, message in out.items():
        reply = c.clients[cid].handle(message)
        if cid == 2:
            reply = dataclasses.replace(reply, vector=reply.vector[:-1])
            with pytest.raises(RejectedMessage, match="length") as err:
                c.server.receive(reply)
            assert err.value.sender == 2
            continue
        c.server.receive(reply)
    outcome = _finish(c, c.server.advance())
    assert isinstance(outcome, ClusterSum) and outcome.members == (0, 1, 3, 4)
    np.testing.assert_array_equal(outcome.sum, c.expected(outcome.members))


def _tamper_bundles(c: Cluster, sender: int, tamper) -> None:
    out = c.advertise()
    for cid, message in out.items():
        reply = c.clients[cid].handle(message)
        if cid == sender:
            reply = dataclasses.replace(reply, bundles=tamper(dict(reply.bundles)))
        c.server.receive(reply)


def test_garbage_shares_get_their_sender_left_out_of_the_sum():
    """Every peer disowns 2 (its bundles do not decrypt): 2 is dropped for this sum, which
    goes on exactly without it; being disowned is reported (``excluded``), not proof."""
    c = Cluster()
    _tamper_bundles(c, 2, lambda b: {r: os.urandom(len(v)) for r, v in b.items()})
    outcome = _finish(c, c.server.advance())
    assert isinstance(outcome, ClusterSum)
    assert outcome.excluded == (2,) and outcome.members == (0, 1, 3, 4)
    np.testing.assert_array_equal(outcome.sum, c.expected(outcome.members))


def test_holders_that_complain_and_withhold_shares_name_nobody():
    """Byzantine 0 and 1 claim 3's bundles did not decrypt and withhold their shares of 3;
    honest 2 drops before unmasking. Every holder that answered complained, so 3's seed
    cannot be rebuilt and the cluster fails, but that is two clients' word against 3's:
    nobody is named."""
    c = Cluster(n=4, t=3)
    liars = (0, 1)
    out = c.step(c.advertise())
    for cid, message in out.items():
        reply = c.clients[cid].handle(message)
        if cid in liars:
            reply = dataclasses.replace(reply, complaints=(3,))
        c.server.receive(reply)
    out = c.server.advance()
    assert set(out) == {0, 1, 2, 3}  # 3 is not disowned: 2 did not complain
    for cid, message in out.items():
        if cid == 2:
            continue  # drops
        reply = c.clients[cid].handle(message)
        if cid in liars:
            shares = {o: s for o, s in reply.seed_shares.items() if o != 3}
            reply = dataclasses.replace(reply, seed_shares=shares)
        c.server.receive(reply)
    c.server.advance()
    outcome = c.server.outcome
    assert isinstance(outcome, FailedCluster) and "client 3's seed" in outcome.reason
    assert outcome.culprits == ()


def test_shares_encrypted_to_the_wrong_peer_are_detected():
    c = Cluster()
    _tamper_bundles(c, 2, lambda b: {**b, 3: b[4]})  # 3 gets the bundle meant for 4
    outcome = _finish(c, c.server.advance())
    # 3 complains (it holds none of 2's shares, its mask is unchanged); 2 stays in the sum.
    assert isinstance(outcome, ClusterSum) and outcome.complaints == ((3, 2),)
    assert outcome.members == (0, 1, 2, 3, 4) and outcome.excluded == ()
    np.testing.assert_array_equal(outcome.sum, c.expected(outcome.members))


def test_a_false_complaint_does_not_remove_an_honest_peer():
    """A Byzantine client claims peer 1's bundle did not decrypt: 1's shares have one
    holder fewer, 1 stays in the exact sum and nobody is named."""
    c = Cluster()
    out = c.step(c.advertise())
    for cid, message in out.items():
        reply = c.clients[cid].handle(message)
        if cid == 4:
            reply = dataclasses.replace(reply, complaints=(1,))
        c.server.receive(reply)
    outcome = _finish(c, c.server.advance())
    assert isinstance(outcome, ClusterSum) and outcome.members == (0, 1, 2, 3, 4)
    assert outcome.complaints == ((4, 1),)
    np.testing.assert_array_equal(outcome.sum, c.expected(outcome.members))


def test_advertisement_with_a_bad_signature_is_rejected():
    c = Cluster(t=4, signed=True)
    for cid, client in c.clients.items():
        advert = client.advertise()
        if cid == 1:
            advert = dataclasses.replace(advert, signature=os.urandom(64))
            with pytest.raises(RejectedMessage, match="signature"):
                c.server.receive(advert)
            continue
        c.server.receive(advert)
    out = c.server.advance()
    outcome = _finish(c, out)
    assert isinstance(outcome, ClusterSum) and outcome.members == (0, 2, 3, 4)
    np.testing.assert_array_equal(outcome.sum, c.expected(outcome.members))


def _advertise_with(c: Cluster, attacker: int, tamper, adverts=None):
    """Every member advertises (in id order); the attacker's advert passes ``tamper`` (which
    sees the adverts already sent) and must be rejected. Returns the rejection."""
    adverts = {} if adverts is None else adverts
    rejection = None
    for cid, client in c.clients.items():
        advert = client.advertise()
        if cid == attacker:
            with pytest.raises(RejectedMessage) as err:
                c.server.receive(tamper(advert, adverts))
            rejection = err.value
            continue
        adverts[cid] = advert
        c.server.receive(advert)
    return rejection


LOW_ORDER = bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")


@pytest.mark.parametrize(
    "tamper,match",
    [
        (lambda a, _: dataclasses.replace(a, mask_public=bytes(32)), "mask public key refused"),
        (lambda a, _: dataclasses.replace(a, encryption_public=LOW_ORDER), "low-order"),
        (lambda a, _: dataclasses.replace(a, mask_public=a.encryption_public), "must differ"),
        (lambda a, s: dataclasses.replace(a, encryption_public=s[0].mask_public), "already"),
        (lambda a, s: dataclasses.replace(a, mask_public=s[0].mask_public), "client 0 already"),
    ],
    ids=["zero-key", "order-8-key", "equal-keys", "copied-key", "copied-mask"],
)
def test_advertisements_that_would_break_the_broadcast_are_rejected(tamper, match):
    c = Cluster()
    rejection = _advertise_with(c, 1, tamper)
    assert rejection.sender == 1 and match in str(rejection) and "client 1" in str(rejection)
    outcome = _finish(c, c.server.advance())
    # The broadcast the honest members got is acceptable to them: the cluster finishes.
    assert isinstance(outcome, ClusterSum) and outcome.members == (0, 2, 3, 4)
    np.testing.assert_array_equal(outcome.sum, c.expected(outcome.members))


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(signature=b"s" * 65), "0 or 64 bytes, got 65"),
        (dict(signature=b"s" * 4_000_000), "got 4000000"),
        (dict(mask_public=b"short"), "32 bytes, got 5"),
        (dict(commitment=b""), "32 bytes, got 0"),
    ],
    ids=["sig-65", "sig-4M", "short-key", "no-commitment"],
)
def test_advertisements_of_the_wrong_sizes_do_not_exist(change, match):
    """The sizes are the message's own: its constructor refuses them (a codec turns that
    into its own error), so no server ever receives such an advertisement."""
    advert = Cluster().clients[1].advertise()
    with pytest.raises(MalformedMessage, match=match):
        dataclasses.replace(advert, **change)


def test_signed_mode_rejects_members_missing_from_the_directory():
    c = Cluster(signed=True, t=4)
    del c.directory[3]
    c.server = ServerSession(c.assignment, c.directory)
    rejection = _advertise_with(c, 3, lambda a, _: a)
    assert rejection.sender == 3 and "no identity key" in str(rejection)
    with pytest.raises(ConfigurationError, match="directory"):
        ServerSession(c.assignment)


def test_consistency_signature_of_a_member_missing_from_the_directory_is_rejected():
    c = Cluster(signed=True, t=4)
    out = c.step(c.step(c.advertise()))
    del c.server._directory[2]  # e.g. removed from the directory mid-round
    reply = c.clients[2].handle(out[2])
    with pytest.raises(RejectedMessage, match="no identity key") as err:
        c.server.receive(reply)
    assert err.value.sender == 2


def test_corrupted_unmask_share_is_named_and_skipped():
    c = Cluster(n=7, t=4)
    out = c.to_unmask()
    for cid, message in out.items():
        reply = c.clients[cid].handle(message)
        if cid == 0:  # holder 0 lies about its share of client 1's seed
            share = Share.from_bytes(reply.seed_shares[1])
            wrong = Share(share.x, (share.y + 1) % PRIME).to_bytes()
            reply = dataclasses.replace(reply, seed_shares={**reply.seed_shares, 1: wrong})
        c.server.receive(reply)
    c.server.advance()
    outcome = c.server.outcome
    assert isinstance(outcome, ClusterSum)
    assert outcome.bad_shares == ((0, 1),)
    np.testing.assert_array_equal(outcome.sum, c.expected(range(7)))


def test_malformed_and_misaddressed_messages_are_rejected_without_harm():
    c = Cluster()
    adverts = {cid: client.advertise() for cid, client in c.clients.items()}
    c.server.receive(adverts[0])
    bad = [
        (adverts[0], "duplicate"),
        (dataclasses.replace(adverts[1], context=KeyContext(round=9)), "wrong round"),
        (dataclasses.replace(adverts[1], sender=99), "may not send"),
        (MaskedInput(1, CTX, np.zeros(LENGTH, np.uint32)), "expected AdvertiseKeys"),
    ]
    for message, match in bad:
        with pytest.raises(RejectedMessage, match=match):
            c.server.receive(message)
    for cid in range(1, 5):
        c.server.receive(adverts[cid])
    outcome = _finish(c, c.server.advance())
    assert isinstance(outcome, ClusterSum) and outcome.members == (0, 1, 2, 3, 4)
    np.testing.assert_array_equal(outcome.sum, c.expected(range(5)))


def test_malformed_unmask_shares_are_rejected():
    c = Cluster()
    out = c.to_unmask()
    reply = c.clients[0].handle(out[0])
    with pytest.raises(RejectedMessage, match="malformed share"):
        c.server.receive(dataclasses.replace(reply, seed_shares={1: b"\xff" * SHARE_BYTES}))
    with pytest.raises(MalformedMessage, match=f"{SHARE_BYTES} bytes, got 5"):
        dataclasses.replace(reply, seed_shares={1: b"\x00" * 5})
    with pytest.raises(RejectedMessage, match="outside"):
        c.server.receive(dataclasses.replace(reply, key_shares={1: reply.seed_shares[1]}))
    c.server.receive(reply)


def test_cluster_below_threshold_fails_with_members_named():
    c = Cluster(n=5, t=3)
    out = c.step(c.advertise())
    out = c.step(out, skip=(0, 1, 2))
    assert out == {}
    assert c.server.state is ServerState.FAILED
    assert c.server.outcome.members == (0, 1, 2, 3, 4)
    assert "fewer than t = 3" in c.server.outcome.reason
