"""The leak oracle on hand-built traffic: it finds leaks that are there, and only those.

Masked inputs here are built by hand from PRG streams (never by the client code), so each
case states exactly which masks a y carries and which secrets the server holds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pytest
from leak_oracle import (
    LeakOracle,
    OracleError,
    ServerView,
    SessionSecrets,
    UnexplainedInput,
    _Streams,
    decompose,
    holds_secret,
)
from malicious_game import Setting, play

from sharefl.crypto.kdf import x25519_public_key
from sharefl.crypto.prg import expand_mask
from sharefl.crypto.shamir import PRIME, Share, split_many

LENGTH = 6
RUN = "run"


def seed() -> bytes:
    return os.urandom(32)


@dataclass
class Hand:
    """A cluster built by hand: members, inputs, secrets, and a server view to fill."""

    members: tuple[int, ...] = (1, 2, 3)
    threshold: int = 2
    run: str = RUN
    label: str = "x"
    inputs: dict = field(default_factory=dict)
    view: ServerView = field(default_factory=ServerView)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(7 if self.label == "x" else 8)
        self.b = {u: seed() for u in self.members}
        self.sk = {u: seed() for u in self.members}
        self.pk = {u: x25519_public_key(self.sk[u]) for u in self.members}
        self.s = {frozenset((u, v)): seed() for u in self.members for v in self.members if u < v}
        for u in self.members:
            self.inputs.setdefault((self.label, u), rng.integers(0, 2**32, LENGTH, dtype=np.uint32))
        xs = list(range(1, len(self.members) + 1))
        self.key_shares, self.seed_shares = {}, {}
        for u in self.members:
            keys, seeds = split_many([self.sk[u], self.b[u]], self.threshold, xs)
            self.key_shares[u] = [k.to_bytes() for k in keys]
            self.seed_shares[u] = [s.to_bytes() for s in seeds]

    def pair(self, u: int, v: int) -> bytes:
        return self.s[frozenset((u, v))]

    def masked(self, u: int, *, leave_out=(), self_mask=True, extra=()) -> np.ndarray:
        """x_u + PRG(b_u) + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv), pairs in ``leave_out``
        left out, plus ``extra`` (seed, sign) masks."""
        acc = self.inputs[(self.label, u)].astype(np.uint64)
        masks = [(self.b[u], 1)] if self_mask else []
        masks += [(self.pair(u, v), 1 if v > u else -1) for v in self.members if v != u]
        masks = [(sd, sg) for sd, sg in masks if sd not in {self.pair(u, v) for v in leave_out}]
        for sd, sg in [*masks, *extra]:
            stream = expand_mask(sd, LENGTH, 32).astype(np.uint64)
            acc = acc + stream if sg > 0 else acc - stream
        return (acc % 2**32).astype(np.uint32)

    def receive(self, u: int, vector: np.ndarray) -> None:
        self.view.masked.append((self.run, u, vector))

    def reveal_seed(self, owner: int, holders: int) -> None:
        for share in self.seed_shares[owner][:holders]:
            self.view.shares[(self.run, owner, "seed")].add(share)

    def reveal_key(self, owner: int, holders: int) -> None:
        for share in self.key_shares[owner][:holders]:
            self.view.shares[(self.run, owner, "key")].add(share)

    def sessions(self) -> list[SessionSecrets]:
        return [
            SessionSecrets(
                run=self.run,
                client=u,
                input_key=(self.label, u),
                threshold=self.threshold,
                seed=self.b[u],
                mask_private=self.sk[u],
                mask_public=self.pk[u],
                pair_seeds={v: self.pair(u, v) for v in self.members if v != u},
                peer_mask_publics={v: self.pk[v] for v in self.members if v != u},
            )
            for u in self.members
        ]

    def analyse(self, min_sum_size: int = 3, extra_sessions=()):
        return LeakOracle(min_sum_size=min_sum_size).analyse(
            self.view, [*self.sessions(), *extra_sessions], self.inputs
        )


def honest(h: Hand) -> Hand:
    for u in h.members:
        h.receive(u, h.masked(u))
        h.reveal_seed(u, h.threshold)
    return h


# --- Shamir ------------------------------------------------------------------------------


def test_t_shares_reveal_a_secret_and_t_minus_one_do_not():
    secret = seed()
    shares = [s.to_bytes() for s in split_many([secret], 3, [1, 2, 3, 4, 5])[0]]
    assert holds_secret(shares[:3], 3, secret)
    assert holds_secret(shares[2:], 3, secret)
    assert not holds_secret(shares[:2], 3, secret)
    forged = Share(4, (int.from_bytes(shares[3][4:], "big") + 1) % PRIME).to_bytes()
    assert not holds_secret([*shares[:2], forged], 3, secret)
    assert holds_secret([*shares[:3], forged], 3, secret)  # a bad share among t good ones
    assert not holds_secret(shares, 3, seed())


# --- decomposition -----------------------------------------------------------------------


@pytest.mark.parametrize("k", [3, 8, 12, 21])
def test_decompose_finds_the_exact_coefficients(k):
    seeds = [seed() for _ in range(k)]
    rng = np.random.default_rng(k)
    coefficients = [int(c) for c in rng.integers(-1, 2, k)]
    streams = _Streams(LENGTH, 32)
    target = np.zeros(LENGTH, dtype=np.uint64)
    for s, c in zip(seeds, coefficients, strict=True):
        target = target + np.uint64(c % 2**64) * streams(s)
    got = decompose(target & np.uint64(2**32 - 1), seeds, streams)
    assert got == {s: c for s, c in zip(seeds, coefficients, strict=True) if c}
    assert decompose(target + np.uint64(1), seeds, streams) is None


def test_a_masked_input_with_a_foreign_stream_is_unexplained():
    h = Hand()
    h.receive(1, h.masked(1, extra=[(seed(), 1)]))
    with pytest.raises(UnexplainedInput):
        h.analyse()


def test_a_masked_input_from_an_unknown_session_is_an_error():
    h = Hand()
    h.view.masked.append(("elsewhere", 1, h.masked(1)))
    with pytest.raises(OracleError, match="no session"):
        h.analyse()


def test_a_stream_of_another_pair_is_found_by_the_wide_search():
    """Client 1 adds the pair mask of (3, 4), not one of its own: its own five streams do
    not explain y_1, the run's fifteen do (meet in the middle), with that stream at +1."""
    h = Hand(members=(1, 2, 3, 4, 5), threshold=3)
    y = h.masked(1, extra=[(h.pair(3, 4), 1)])
    streams = _Streams(LENGTH, 32)
    target = y.astype(np.uint64) - h.inputs[("x", 1)].astype(np.uint64)
    own = [h.b[1], *(h.pair(1, v) for v in (2, 3, 4, 5))]
    assert decompose(target, own, streams) is None
    everything = [*h.b.values(), *h.s.values()]
    got = decompose(target, everything, streams)
    assert got is not None and got[h.pair(3, 4)] == 1 and got[h.b[1]] == 1
    h.receive(1, y)
    assert not h.analyse()  # y_1 alone still hides x_1 behind b_1 and its pair masks


# --- the verdicts ----------------------------------------------------------------------------


def test_an_honest_cluster_reveals_only_its_sum():
    h = honest(Hand())
    assert not h.analyse()
    found = h.analyse(min_sum_size=4)  # the oracle does see the sum of all three
    assert [leak.inputs for leak in found.leaks] == [(("x", 1), ("x", 2), ("x", 3))]


def test_an_honest_cluster_with_a_dropout_reveals_the_survivors_sum():
    h = Hand(members=(1, 2, 3, 4), threshold=3)
    for u in (1, 2, 3):
        h.receive(u, h.masked(u))
        h.reveal_seed(u, 3)
    h.reveal_key(4, 3)  # 4 dropped: its mask key is rebuilt, its pair masks removed
    assert not h.analyse()
    assert h.analyse(min_sum_size=4).leaks[0].inputs == (("x", 1), ("x", 2), ("x", 3))


def test_every_pair_mask_left_out_and_the_self_mask_seed_rebuilt_leaks():
    """The complaint-all attack of the earlier design: y_1 = x_1 + PRG(b_1), b_1 rebuilt."""
    h = Hand()
    h.receive(1, h.masked(1, leave_out=(2, 3)))
    h.view.revealed_seeds |= {h.pair(1, 2), h.pair(1, 3)}
    h.reveal_seed(1, 1)
    assert not h.analyse()  # one share of b_1 is not enough
    h.reveal_seed(1, 2)
    found = h.analyse()
    assert [(leak.inputs, leak.field) for leak in found.leaks] == [((("x", 1),), "Q")]


def test_a_left_out_pair_and_a_rebuilt_peer_key_leak():
    """y_1 leaves out the pair with 3 and reveals it, b_1 is rebuilt, and the mask key of
    2 is rebuilt as well (2 claimed dropped): nothing is left to hide x_1."""
    h = Hand()
    h.receive(1, h.masked(1, leave_out=(3,)))
    h.view.revealed_seeds.add(h.pair(1, 3))
    h.reveal_seed(1, 2)
    assert not h.analyse()
    h.reveal_key(2, 2)
    assert h.analyse().leaks[0].inputs == (("x", 1),)


def test_both_secrets_of_one_client_leak_its_input():
    h = Hand()
    h.receive(2, h.masked(2))
    h.reveal_seed(2, 2)
    h.reveal_key(2, 2)
    assert [leak.inputs for leak in h.analyse().leaks] == [(("x", 2),)]


def test_a_mask_key_the_server_controls_reveals_the_pairs_agreed_with_it():
    """The server substituted client 3's advertised key with its own: client 1's pair seed
    with '3' is the server's; with b_1 and 2's key rebuilt, x_1 is exposed."""
    h = Hand()
    h.receive(1, h.masked(1))
    h.reveal_seed(1, 2)
    h.reveal_key(2, 2)
    assert not h.analyse()
    h.view.control(h.sk[3])
    assert h.analyse().leaks[0].inputs == (("x", 1),)


def test_the_same_input_in_two_runs_is_one_unknown():
    """A replayed model: the same inputs summed over {1, 2, 3} and over {1, 2} (3 claimed
    dropped in the second run) give x_3 and the pair sum."""
    first = honest(Hand(run="first"))
    second = Hand(run="second", inputs=first.inputs, view=first.view)
    for u in (1, 2):
        second.receive(u, second.masked(u))
        second.reveal_seed(u, 2)
    second.reveal_key(3, 2)
    found = LeakOracle().analyse(first.view, [*first.sessions(), *second.sessions()], first.inputs)
    assert {leak.inputs for leak in found.leaks} == {(("x", 3),), (("x", 1), ("x", 2))}


def test_different_models_are_different_unknowns():
    """The same clients on another model: {1, 2} after {1, 2, 3} is a sum of two inputs of
    the new model, and nothing of the first model's x_3."""
    first = honest(Hand(run="first"))
    second = Hand(run="second", label="y", view=first.view)
    for u in (1, 2):
        second.receive(u, second.masked(u))
        second.reveal_seed(u, 2)
    second.reveal_key(3, 2)
    found = LeakOracle().analyse(
        first.view, [*first.sessions(), *second.sessions()], {**first.inputs, **second.inputs}
    )
    assert [leak.inputs for leak in found.leaks] == [(("y", 1), ("y", 2))]


def test_a_parity_only_leak_is_found_over_gf2():
    """y_1 = x_1 + s + t and y_2 = x_2 + s − t: over Q nothing is free of s and t, but
    y_1 + y_2 = x_1 + x_2 + 2s reveals the parity of x_1 + x_2."""
    h = Hand()
    s, t = h.pair(1, 2), h.pair(1, 3)
    h.receive(1, h.masked(1, self_mask=False, leave_out=(2, 3), extra=[(s, 1), (t, 1)]))
    h.receive(2, h.masked(2, self_mask=False, leave_out=(1, 3), extra=[(s, 1), (t, -1)]))
    found = h.analyse()
    assert [(leak.inputs, leak.field) for leak in found.leaks] == [((("x", 1), ("x", 2)), "GF(2)")]


def test_a_difference_is_not_reported_as_a_parity_leak():
    """y_1 = x_1 + s, y_2 = x_2 + s: the server learns x_1 − x_2 (a difference, which the
    plan audit allows); the parity of x_1 + x_2 follows from it and is not a new leak."""
    h = Hand()
    s = h.pair(1, 2)
    h.receive(1, h.masked(1, self_mask=False, leave_out=(2, 3), extra=[(s, 1)]))
    h.receive(2, h.masked(2, self_mask=False, leave_out=(1, 3), extra=[(s, 1)]))
    assert not h.analyse()


def test_a_colluders_input_is_known_and_its_secrets_too():
    h = Hand()
    for u in h.members:
        h.receive(u, h.masked(u))
        h.reveal_seed(u, 2)
    colluder = next(s for s in h.sessions() if s.client == 3)
    colluder.input_key, colluder.colluding = None, True
    others = [s for s in h.sessions() if s.client != 3]
    found = LeakOracle(min_sum_size=3).analyse(h.view, [*others, colluder], h.inputs)
    assert [leak.inputs for leak in found.leaks] == [(("x", 1), ("x", 2))]


@pytest.mark.parametrize("signed", [True, False])
def test_an_honest_game_leaks_nothing(signed):
    outcome = play(Setting(signed=signed), b"")
    assert outcome.masked and outcome.responses and not outcome.crashes
    assert not outcome.findings, outcome.explain()
