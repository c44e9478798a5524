"""Complaint attacks of a malicious server, played in full rounds over gRPC against real
``sharefl client --keys`` processes (mutual TLS, signed mode, a directory).

The server is a test double that speaks the real proto and drives a real
:class:`~sharefl.protocol.server.ServerSession`: the session builds every honest server
message, the double converts it with :mod:`sharefl.deploy.wire`, tampers with the ones a
scenario names, and feeds the session every client reply. It keeps everything the clients
send (advertisements, masked inputs, unmask responses with their ``pair_seeds``) and then
plays the attacker: it rebuilds the victim's self-mask seed b_v from the seed shares, every
mask key it holds t shares of, collects every pair seed s_vw it can get, and subtracts
PRG(b_v) and every subset of those pair masks from y_v.

Scenarios (six clients, one cluster of all six, t = 4: the signed floor for 6 holders):

- ``no bundles`` / ``garbage bundles``: the victim's masking request carries no share
  bundle (or random ones of the right size), so it complains about every peer. The design
  this guards against left those pair masks out and revealed their seeds; the server then
  got b_v from the peers and had the victim's update.
- ``one bundle then drop``: the victim gets only peer w's bundle; then the double claims w
  dropped (it hides w's masked input from its session), so the victim reveals its share of
  w's mask key. The double rebuilds sk_w and b_v: the victim masked with the four other
  survivors as well, so their pair masks still hide its update.

The updates are deterministic (:func:`sharefl.deploy.client.demo_trainer`: they depend on
the client and the round only), so the double knows each client's encoded update and checks
both that no candidate equals the victim's and that no candidate is even a plausible
encoding. Every round sends the same ``run``, a larger round number and a new model (the
clients' memory refuses anything else). Six client processes serve all three rounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S, keyed_client
from test_malicious_server import (
    CLIENTS,
    DIM,
    ENCODING,
    Double,
    Link,
    _drain,
    _replies,
    serve_double,
)

from sharefl.crypto import shamir
from sharefl.crypto.encoding import encode
from sharefl.crypto.kdf import KeyContext, Purpose, pairwise_key, x25519_public_key
from sharefl.crypto.prg import combine_masks
from sharefl.deploy import wire
from sharefl.deploy.client import demo_trainer
from sharefl.deploy.keygen import keygen
from sharefl.deploy.server import load_directory
from sharefl.proto import sharefl_pb2 as pb
from sharefl.protocol.bundles import SEALED_BYTES, seed_commitment
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import RejectedMessage
from sharefl.protocol.messages import (
    AdvertiseKeys,
    ClusterAssignment,
    MaskedInput,
    MaskingRequest,
    ServerMessage,
    UnmaskResponse,
)
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, ServerSession

THRESHOLD = 4  # the signed floor for 6 holders: t > (6 + 1 colluder) / 2
RUN = bytes(range(16))  # one training run: round numbers increase within it
MASK = Purpose.MASK_SEED


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One round: the victim, how its masking request is changed, and the client the
    double claims dropped after it sent its masked input (``None``: nobody)."""

    name: str
    victim: int
    bundles: Callable[[dict[int, bytes]], dict[int, bytes]]
    claimed_dropped: int | None = None


W = 4  # the peer whose bundle the victim of "one bundle then drop" gets
SCENARIOS = (
    Scenario("no bundles", 2, lambda bundles: {}),
    Scenario("garbage bundles", 3, lambda bundles: {p: os.urandom(SEALED_BYTES) for p in bundles}),
    Scenario("one bundle then drop", 1, lambda bundles: {W: bundles[W]}, claimed_dropped=W),
)


@dataclasses.dataclass
class Played:
    """What the double saw and did in one scenario's round."""

    scenario: Scenario
    round: int
    model: np.ndarray
    session: ServerSession
    adverts: dict[int, AdvertiseKeys] = dataclasses.field(default_factory=dict)
    masking: dict[int, MaskingRequest] = dataclasses.field(default_factory=dict)
    masked: dict[int, MaskedInput] = dataclasses.field(default_factory=dict)
    unmasked: dict[int, UnmaskResponse] = dataclasses.field(default_factory=dict)
    refusals: dict[int, str] = dataclasses.field(default_factory=dict)
    withheld: set[int] = dataclasses.field(default_factory=set)
    error: str | None = None

    @property
    def context(self) -> KeyContext:
        return self.session.context

    def update(self, client: int) -> np.ndarray:
        """The encoded update ``client`` contributed (the client encodes the same way)."""
        update = demo_trainer(self.model, round=self.round, client_id=client)
        return encode(update, ENCODING, rng=None)  # exact: multiples of 1/256, f = 28


# -- the double's side of a round ------------------------------------------------------------


_CONVERTERS: Mapping[str, Callable] = {
    "advertise": wire.advert_from_proto,
    "shares": wire.shares_from_proto,
    "consistency": wire.signature_from_proto,
    "unmask": wire.unmask_response_from_proto,
}


async def _receive(link: Link):
    """The client's next message as a protocol message (a masked input with its chunks
    assembled as the real server does), or its :class:`pb.Refusal`."""
    (first,) = await _replies(link, 1)
    kind = first.WhichOneof("body")
    if kind == "refusal":
        return first.refusal
    if kind == "masked":
        assembler = wire.VectorAssembler(first.masked.vector, DIM, np.uint32)
        while not assembler.complete:
            (chunk,) = await _replies(link, 1)
            assembler.add(chunk.chunk)
        return wire.masked_from_parts(first.masked, assembler.result())
    return _CONVERTERS[kind](getattr(first, kind))


def _tamper(played: Played, outgoing: dict[int, ServerMessage]) -> dict[int, ServerMessage]:
    """The scenario's change to the victim's masking request; everything else as built.
    Records the peers whose honest bundle the victim did not get (``played.withheld``)."""
    scenario = played.scenario
    request = outgoing.get(scenario.victim)
    if isinstance(request, MaskingRequest):
        bundles = scenario.bundles(dict(request.bundles))
        played.withheld = {p for p, b in request.bundles.items() if bundles.get(p) != b}
        outgoing = {**outgoing, scenario.victim: dataclasses.replace(request, bundles=bundles)}
    played.masking.update({c: m for c, m in outgoing.items() if isinstance(m, MaskingRequest)})
    return outgoing


async def _stages(double: Double, played: Played) -> None:
    """Drive the session from the assignment to its outcome: collect one reply from every
    recipient, feed it to the session (a masked input of the client claimed dropped is
    kept but hidden from it), send what ``advance`` builds, tampered."""
    recipients = CLIENTS
    while recipients:
        replies = await asyncio.wait_for(
            asyncio.gather(*(_receive(double.links[c]) for c in recipients)), HANG_S
        )
        for client, reply in zip(recipients, replies, strict=True):
            if isinstance(reply, pb.Refusal):
                played.refusals[client] = reply.reason
                continue
            store = {
                AdvertiseKeys: played.adverts,
                MaskedInput: played.masked,
                UnmaskResponse: played.unmasked,
            }.get(type(reply))
            if store is not None:
                store[client] = reply
            if isinstance(reply, MaskedInput) and client == played.scenario.claimed_dropped:
                continue  # "it dropped": the session never sees it
            played.session.receive(reply)
        if played.refusals:
            return
        outgoing = _tamper(played, played.session.advance())
        for client, message in outgoing.items():
            double.links[client].outbox.put_nowait(wire.server_message_to_proto(message))
        recipients = tuple(sorted(outgoing))


async def _round(double: Double, round_index: int, scenario: Scenario, directory) -> Played:
    model = np.full(DIM, round_index + 1, dtype=np.float32)  # a new model every round (I4)
    plan = RoundPlan(round_index, (Clustering((CLIENTS,)),))
    assignment = ClusterAssignment(plan.context(0, 0), CLIENTS, THRESHOLD, DIM, 32, None, True)
    played = Played(scenario, round_index, model, ServerSession(assignment, directory))
    header, chunks = wire.vector_to_proto(model)
    start = pb.RoundStart(round=round_index, model=header, reclusterings=1, run=RUN)
    start.plan.CopyFrom(wire.plan_to_proto(plan))
    proto = wire.assignment_to_proto(assignment, ENCODING)
    chunks = list(chunks)
    for cid in CLIENTS:
        outbox = double.links[cid].outbox
        outbox.put_nowait(pb.ServerMessage(round_start=start))
        for chunk in chunks:
            outbox.put_nowait(pb.ServerMessage(chunk=chunk))
        outbox.put_nowait(pb.ServerMessage(assignment=proto))
    try:
        await _stages(double, played)
    except (RejectedMessage, wire.WireError, TimeoutError) as exc:
        played.error = f"{type(exc).__name__}: {exc}"
    await asyncio.gather(*(_drain(double.links[c], 0.2) for c in CLIENTS))
    for cid in CLIENTS:
        double.links[cid].outbox.put_nowait(
            pb.ServerMessage(round_end=pb.RoundEnd(round=round_index))
        )
    return played


async def _play(double: Double, directory) -> dict[str, Played]:
    await asyncio.wait_for(double.connected.wait(), HANG_S)
    played = {}
    for round_index, scenario in enumerate(SCENARIOS):
        played[scenario.name] = await _round(double, round_index, scenario, directory)
    header, chunks = wire.vector_to_proto(np.zeros(DIM, dtype=np.float32))
    chunks = list(chunks)
    for cid in CLIENTS:
        outbox = double.links[cid].outbox
        outbox.put_nowait(
            pb.ServerMessage(finished=pb.Finished(rounds=len(SCENARIOS), model=header))
        )
        for chunk in chunks:
            outbox.put_nowait(pb.ServerMessage(chunk=chunk))
        outbox.put_nowait(None)
    return played


async def _serve(keys: Path, start: Callable[[str], None]) -> dict[str, Played]:
    server, double, address = await serve_double(keys)
    start(address)
    try:
        played = await _play(double, load_directory(str(keys / "directory.json")))
        await asyncio.wait_for(double.ended.wait(), HANG_S)  # the Finished messages are out
    finally:
        await server.stop(grace=2.0)
    return played


@pytest.fixture(scope="module")
def rounds(tmp_path_factory):
    """Every scenario played once against the same six client processes."""
    keys = keygen(tmp_path_factory.mktemp("complaints") / "keys", CLIENTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs: list[subprocess.Popen] = []

    def start(address: str) -> None:
        procs.extend(
            subprocess.Popen(
                keyed_client(address, c, keys, "--no-atoms"),
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for c in CLIENTS
        )

    try:
        played = asyncio.run(_serve(keys, start))
        logs = [proc.communicate(timeout=HANG_S)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return played, logs, [proc.returncode for proc in procs]


# -- the attacker's computation --------------------------------------------------------------


def _revealed_pair_seeds(played: Played, client: int) -> dict[int, bytes]:
    """The pair seeds ``client`` sent the server in the clear, by peer."""
    response = played.unmasked.get(client)
    return dict(response.pair_seeds) if response is not None else {}


def _rebuilt(played: Played, field: str, owner: int) -> bytes | None:
    """``owner``'s secret (``seed_shares``: b_owner, ``key_shares``: its mask key) from
    every share of it the clients sent, or ``None`` with fewer than t of them."""
    shares = [
        shamir.Share.from_bytes(getattr(r, field)[owner])
        for r in played.unmasked.values()
        if owner in getattr(r, field)
    ]
    if len(shares) < THRESHOLD:
        return None
    return shamir.reconstruct(shares, THRESHOLD)


def _known_pair_seeds(played: Played, victim: int) -> dict[int, bytes]:
    """Every pair seed s_{victim,w} the double can compute: revealed by the victim or by w,
    or derived from a mask key (the victim's or w's) it holds t shares of."""
    known: dict[int, bytes] = {}
    for client in played.unmasked:
        for peer, seed in _revealed_pair_seeds(played, client).items():
            if victim in (client, peer):
                known[peer if client == victim else client] = seed
    adverts, context = played.adverts, played.context
    for owner in CLIENTS:
        key = _rebuilt(played, "key_shares", owner)
        if key is None:
            continue
        assert x25519_public_key(key) == adverts[owner].mask_public  # the real key
        if owner == victim:  # the victim's own mask key would give every pair seed
            for p in CLIENTS:
                if p != victim:
                    mask_public = adverts[p].mask_public
                    known[p] = pairwise_key(key, mask_public, context, MASK, victim, p)
        else:
            mask_public = adverts[victim].mask_public
            known[owner] = pairwise_key(key, mask_public, context, MASK, owner, victim)
    return known


def _candidates(played: Played) -> dict[tuple[int, ...], np.ndarray]:
    """y_v − PRG(b_v) − the pair masks of every subset of the known pair seeds (the double
    does not need to know which of them the victim used)."""
    victim = played.scenario.victim
    seed = _rebuilt(played, "seed_shares", victim)
    assert seed is not None, "the double should hold t shares of the victim's b_v"
    assert seed_commitment(played.context, victim, seed) == played.adverts[victim].commitment
    known = _known_pair_seeds(played, victim)
    y = played.masked[victim].vector
    candidates = {}
    for size in range(len(known) + 1):
        for subset in itertools.combinations(sorted(known), size):
            # The victim added +PRG(s_vw) for w > v and subtracted it for w < v: undo it.
            masks = [(seed, -1)] + [(known[w], -1 if w > victim else +1) for w in subset]
            candidates[subset] = combine_masks(np.empty(DIM, dtype=np.uint32), [y], masks)
    return candidates


def _plausible(vector: np.ndarray) -> bool:
    """Whether ``vector`` could be one client's encoding (every coordinate within the clip);
    a uniformly random vector of 16 coordinates is one with probability about 2^-48."""
    return bool(np.all(np.abs(vector.view(np.int32).astype(np.int64)) <= ENCODING.max_abs_encoded))


# -- the tests -------------------------------------------------------------------------------


BY_NAME = pytest.mark.parametrize("name", [s.name for s in SCENARIOS])


def test_the_clients_play_every_round_and_exit_cleanly(rounds):
    played, logs, codes = rounds
    assert codes == [0] * len(CLIENTS), logs
    assert not any("Traceback" in log for log in logs), logs
    for name, p in played.items():
        assert p.error is None and p.refusals == {}, (name, p.error, p.refusals)


@BY_NAME
def test_the_victim_complains_and_its_peers_do_not(rounds, name):
    p = rounds[0][name]
    victim = p.scenario.victim
    expected = set(CLIENTS) - {victim} - ({W} if p.scenario.claimed_dropped == W else set())
    assert p.withheld == expected  # the tampering reached the victim
    assert {c: set(m.complaints) for c, m in p.masked.items()} == {
        c: expected if c == victim else set() for c in CLIENTS
    }


@BY_NAME
def test_no_pair_seed_of_a_survivor_is_revealed(rounds, name):
    p = rounds[0][name]
    survivors = set(CLIENTS) - {p.scenario.claimed_dropped}
    for client in p.unmasked:
        assert not set(_revealed_pair_seeds(p, client)) & survivors, client
    dropped = {p.scenario.claimed_dropped} - {None}
    assert set(_known_pair_seeds(p, p.scenario.victim)) == dropped


@BY_NAME
def test_the_attack_does_not_recover_the_victims_update(rounds, name):
    p = rounds[0][name]
    update = p.update(p.scenario.victim)
    candidates = _candidates(p)
    recovered = [w for w, c in candidates.items() if np.array_equal(c, update)]
    assert recovered == [], f"y_v - PRG(b_v) - the pair masks with {recovered} is the update"
    assert not any(_plausible(c) for c in candidates.values())
    assert _plausible(update)  # the check can fail


@BY_NAME
def test_the_victim_stays_in_an_exact_sum(rounds, name):
    p = rounds[0][name]
    members = tuple(c for c in CLIENTS if c != p.scenario.claimed_dropped)
    outcome = p.session.outcome
    assert isinstance(outcome, ClusterSum), outcome
    assert outcome.members == members and p.scenario.victim in members
    assert outcome.excluded == ()
    expected = np.sum([p.update(c) for c in members], axis=0, dtype=np.uint32)
    np.testing.assert_array_equal(outcome.ring_sum, expected)


def test_a_claimed_drop_reveals_only_the_dropped_peers_key(rounds):
    p = rounds[0]["one bundle then drop"]
    assert W in p.masked  # w did send its masked input
    assert set(p.unmasked) == set(CLIENTS) - {W}
    assert set(p.unmasked[p.scenario.victim].key_shares) == {W}
    assert all(set(r.key_shares) == {W} for r in p.unmasked.values())
    assert set(_known_pair_seeds(p, p.scenario.victim)) == {W}  # sk_w was rebuilt
