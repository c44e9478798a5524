"""The security property itself, searched: whatever a malicious server does, it learns no
honest input and no sum of fewer than ``min_sum_size`` honest inputs.

A game (:mod:`malicious_game`) puts real clients (``ClientRound`` + ``ClientSession``, each
with its ``ClientMemory``) against a server whose every choice comes from a tape of bytes;
hypothesis searches the tapes. The verdict comes from :mod:`leak_oracle`, which shares no
code with the server, the audit or the client's own checks: it decomposes every masked
input the server received into PRG streams, works out which of them the server can
remove, and solves exactly (over Q and GF(2)) what the rest determines.

Every failure a search found is kept: as an ``@example`` tape of the search, or as a named
scenario below. Each client invariant has a test that switches it off and sees a focused
search find a leak within a small budget — so the search can fail, and each check is
shown to matter (the module docstring of :mod:`malicious_game` lists the server's means).

Budgets: ``SEARCH_EXAMPLES`` (300 in the default run, 10,000 under the ``slow`` profile:
``SHAREFL_HYPOTHESIS_PROFILE=slow pytest -m slow tests/test_malicious_search.py``).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from conftest import SEARCH_EXAMPLES
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from malicious_game import Outcome, Setting, play, search

import sharefl.protocol.client as client_module
import sharefl.protocol.client_round as client_round_module
from sharefl.protocol.client import ClientSession
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.memory import ClientMemory

TAPE_BYTES = 1024
SEARCH_SETTINGS = (
    Setting(signed=True),
    # Unsigned mode trusts the server with the key exchange and with one survivor list for
    # everybody (no signatures to hold it to one): no key substitution, no split views.
    Setting(signed=False, split_views=False),
    # With a colluder: the plan and release audits count what follows from a colluder's
    # input too (test_a_colluder_and_two_reclusterings_reveal_an_input).
    Setting(signed=True, colluders=1),
    Setting(signed=False, colluders=1, split_views=False),
)
"""The search's settings; the first byte of a tape picks one. Every family of deviations,
sparse neighbour graphs included (their component sums are audited:
test_sparse_graph_split_by_dropouts_reveals_component_sums)."""


ATOM_SETTINGS = (
    Setting(signed=True, atoms=True, constant_updates=True, max_rounds=4),
    Setting(signed=False, atoms=True, constant_updates=True, max_rounds=4, split_views=False),
    Setting(
        signed=True, colluders=1, min_sum_size=2, atoms=True, constant_updates=True, max_rounds=4
    ),
    Setting(
        signed=False,
        colluders=1,
        min_sum_size=2,
        atoms=True,
        constant_updates=True,
        max_rounds=4,
        split_views=False,
    ),
)
"""The search across rounds: clients that require atoms, updates constant across rounds
(the oracle then judges every round together), every family of deviations including
re-formed atoms and drop-outs inside atoms; the first byte of a tape picks one."""


TWO_EXCHANGE_SETTINGS = (
    Setting(signed=True, two_exchange=True),
    Setting(signed=False, split_views=False, two_exchange=True),
    Setting(signed=True, colluders=1, two_exchange=True),
    Setting(signed=False, colluders=1, split_views=False, two_exchange=True),
    Setting(signed=True, atoms=True, constant_updates=True, max_rounds=4, two_exchange=True),
    Setting(
        signed=False,
        atoms=True,
        constant_updates=True,
        max_rounds=4,
        split_views=False,
        two_exchange=True,
    ),
)
"""The two-exchange round (keys set up once, shares with the masked input, bundles with
the unmask request): every family of deviations against its messages — key adverts
altered in the assignment, bundles altered in the unmask request, stories, split views,
second unmask requests — per cluster, and across rounds with atoms."""


def tape(positions: dict[int, int], length: int) -> bytes:
    """A tape that is zero (the honest choice) except at ``positions``."""
    return bytes(positions.get(i, 0) for i in range(length))


def judge(outcome: Outcome) -> None:
    assert not outcome.crashes, f"a client crashed instead of refusing: {outcome.crashes}"
    assert not outcome.findings, f"the server learns {outcome.explain()}"


def play_tape(data: bytes) -> Outcome:
    setting = SEARCH_SETTINGS[data[0] % len(SEARCH_SETTINGS)] if data else SEARCH_SETTINGS[0]
    return play(setting, data[1:])


SEARCH = settings(
    max_examples=SEARCH_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@SEARCH
@given(data=st.binary(min_size=TAPE_BYTES, max_size=TAPE_BYTES))
# Found on the earlier complaint design: client 1 of a signed cluster of three gets no
# share bundle, complains about both peers, left both pair masks out (revealing their
# seeds) and masked with PRG(b_1) alone; b_1 was then rebuilt from the peers' shares.
@example(data=tape({1: 205, 29: 250}, 30))
# Found on the redesigned code: a second unmask request to client 0, with an empty survivor
# list, crashed the release check (ClusteringError) instead of being refused.
@example(data=tape({0: 1, 6: 29, 38: 248, 75: 252}, 76))
def test_no_leak_whatever_the_server_does(data):
    judge(play_tape(data))


@pytest.mark.slow
@SEARCH
@given(data=st.binary(min_size=TAPE_BYTES, max_size=TAPE_BYTES))
def test_no_leak_whatever_the_server_does_long(data):
    """The same search for the ``slow`` run (which deselects the default tests)."""
    judge(play_tape(data))


def play_atom_tape(data: bytes) -> Outcome:
    setting = ATOM_SETTINGS[data[0] % len(ATOM_SETTINGS)] if data else ATOM_SETTINGS[0]
    return play(setting, data[1:])


@SEARCH
@given(data=st.binary(min_size=TAPE_BYTES, max_size=TAPE_BYTES))
# Found when the game gave colluders long-term keys: a colluder drawn among 7 clients, then
# the atom setting redrew 6 clients (the game crashed on the colluder's missing keys).
@example(data=tape({0: 2, 3: 54, 4: 1, 5: 1}, 6))
def test_no_leak_across_rounds_with_atoms(data):
    """The multi-round property: with updates constant across rounds, whatever the server
    plans, re-forms, drops or tells, nothing finer than atom sums is determined."""
    judge(play_atom_tape(data))


@pytest.mark.slow
@SEARCH
@given(data=st.binary(min_size=TAPE_BYTES, max_size=TAPE_BYTES))
def test_no_leak_across_rounds_with_atoms_long(data):
    """The same search for the ``slow`` run."""
    judge(play_atom_tape(data))


def play_two_exchange_tape(data: bytes) -> Outcome:
    settings = TWO_EXCHANGE_SETTINGS
    setting = settings[data[0] % len(settings)] if data else settings[0]
    return play(setting, data[1:])


@SEARCH
@given(data=st.binary(min_size=TAPE_BYTES, max_size=TAPE_BYTES))
def test_no_leak_in_the_two_exchange_round(data):
    """The same property for the two-exchange round: whatever the server relays, drops,
    tells or asks twice, it learns no honest input and no small sum."""
    judge(play_two_exchange_tape(data))


@pytest.mark.slow
@SEARCH
@given(data=st.binary(min_size=TAPE_BYTES, max_size=TAPE_BYTES))
def test_no_leak_in_the_two_exchange_round_long(data):
    """The same search for the ``slow`` run."""
    judge(play_two_exchange_tape(data))


def test_without_atoms_even_an_honest_server_leaks_across_rounds():
    """Why atoms exist: an honest server that reclusters every round on a new model, with
    updates that barely change (constant here), lets the sums of a few rounds solve an
    update — every plan audited safe on its own."""
    setting = Setting(constant_updates=True, attacks=F(), participants=(6, 7), max_rounds=4)
    outcome = search(setting, 40, seed=0, tape_bytes=TAPE_BYTES)
    assert outcome is not None and not outcome.moves, "no leak without atoms"


# --- failures the searches found, as scenarios ------------------------------------------------


def scripted(setting: Setting, **hooks) -> Outcome:
    """An honest game (empty tape) but for the scripted ``hooks``."""
    return play(setting, b"", hooks)


def test_withholding_every_bundle_does_not_strip_the_masks():
    """The complaint-all attack of the earlier design: the server withholds every share
    bundle addressed to client 1, which complains about both peers; the server then runs
    the cluster to the end honestly and rebuilds b_1 from the peers' shares. Client 1 must
    still have masked with both pair masks, so only the cluster sum is learnt."""
    outcome = scripted(
        Setting(signed=True),
        clients=(0, 1, 2),
        rounds=[(0, 0, [[(0, 1, 2)]])],
        bundles=lambda u, bundles: {} if u == 1 else bundles,
    )
    assert outcome.responses == 3
    judge(outcome)


def cycle(members):
    return {
        m: frozenset({members[i - 1], members[(i + 1) % len(members)]})
        for i, m in enumerate(members)
    }


def test_sparse_graph_split_by_dropouts_reveals_component_sums():
    """Found by the search. A cluster of six on a cycle 0-1-2-3-4-5-0 (each client has two
    neighbours: t = 2 of 3 holders). Clients 2 and 5 drop out after masking (the server
    ignores their masked inputs); the survivors {0, 1, 3, 4} are enough for the threshold,
    but their graph falls apart into {0, 1} and {3, 4}: no pair mask links the two halves,
    so each half's sum unmasks on its own. The release checks must audit both halves."""
    outcome = scripted(
        Setting(signed=True),
        clients=tuple(range(6)),
        rounds=[(0, 0, [[tuple(range(6))]])],
        graph=lambda members: cycle(members),
        accepted=lambda run, accepted: [v for v in accepted if v not in (2, 5)],
    )
    judge(outcome)


def test_an_empty_survivor_list_is_refused_not_a_crash():
    """An unmask request with no survivors at all must be refused with a ClientRefusal; the
    release check raised ClusteringError (an empty cluster) instead."""
    outcome = scripted(
        Setting(signed=False, split_views=False),
        clients=(0, 1, 2),
        rounds=[(0, 0, [[(0, 1, 2)]])],
        story=lambda run, story: {u: ([], [0, 1, 2]) for u in story},
    )
    judge(outcome)
    assert len(outcome.refusals) == 3


def test_a_colluder_and_two_reclusterings_reveal_an_input():
    """Found by the search: a plan that holds {0, 3, 4} and {3, 4, 5} passed the audit when
    it counted 0/1 sums only; their difference is x_5 − x_0, and a server colluding with
    client 0 knows x_0. The clients resist one colluder and must refuse the plan."""
    outcome = scripted(
        Setting(signed=True, colluders=1),
        clients=tuple(range(6)),
        colluders={0},
        rounds=[(0, 0, [[(0, 3, 4), (1, 2, 5)], [(0, 1, 2), (3, 4, 5)]])],
    )
    judge(outcome)


# --- each invariant switched off: the search must find a leak ---------------------------------


def _without_overlap_check():
    """_on_unmask without the survivors ∩ dropped check: the overlap is answered with both
    secrets (what the check prevents)."""
    original = ClientSession._on_unmask

    def patched(self, message):
        survivors = set(message.survivors)
        held = dict(self._held)
        rest = tuple(d for d in message.dropped if d not in survivors)
        reply = original(self, dataclasses.replace(message, dropped=rest))
        both = {
            p: held[p].key_share.to_bytes() for p in message.dropped if p in survivors and p in held
        }
        return dataclasses.replace(reply, key_shares={**reply.key_shares, **both})

    return [(ClientSession, "_on_unmask", patched)]


def _reveal_every_pair():
    """Two-exchange I2 off: shares of every pair seed revealed, survivors' pairs too."""
    original = ClientSession._reveal

    def patched(self, message, survivors, dropped):
        return original(self, message, survivors, set(self.assignment.members))

    return [(ClientSession, "_reveal", patched)]


def _two_exchange_without_list_checks():
    """Two-exchange: the unmask request's lists not checked against each other (a client
    both survivor and dropped, lists that do not account for the members)."""
    original = ClientSession._on_unmask

    def patched(self, message):
        if not self.two_exchange:
            return original(self, message)
        self._check_survivors(message.survivors, set(self._survivors), "unmask survivor")
        if self.assignment.signed:
            self._check_signatures(message)
        return self._reveal(message, set(message.survivors), set(message.dropped))

    return [(ClientSession, "_on_unmask", patched)]


def _without_reuse_check():
    original = ClientRound.vet

    def patched(self, assignment):
        self._used.pop(assignment.context.reclustering, None)
        return original(self, assignment)

    return [(ClientRound, "vet", patched)]


def _without_memory():
    """I4 off: R1 and R2 not checked, releases on a model under other clusterings accepted
    and not joined to the release check."""
    original = ClientMemory.record_release

    def record_release(self, model, clusterings, position, survivors, *, client=None):
        record = self._models.get(bytes(model))
        if record is not None:
            record.clusterings = clusterings
        return original(self, model, clusterings, position, survivors, client=client)

    return [
        (ClientMemory, "_check", lambda self, *args: None),
        (ClientMemory, "record_release", record_release),
        (ClientRound, "earlier_releases", lambda self: []),
    ]


def _without_threshold_floor():
    """_check_assignment with the floor check alone left out (membership, the threshold's
    upper bound and the mode are still checked)."""
    original = ClientSession._check_assignment

    def patched(self):
        a = self.assignment
        floor = self.policy.floor(len(a.neighbours_of(self.id)) + 1, a.signed)
        self.assignment = dataclasses.replace(a, threshold=max(a.threshold, floor))
        try:
            original(self)
        finally:
            self.assignment = a

    return [(ClientSession, "_check_assignment", patched)]


def _off(cls, name, value=None):
    return lambda: [(cls, name, value if value is not None else (lambda self, *a: None))]


F = frozenset
DISABLED = {
    # I2: survivor lists contain this client, have t members, lie within U2. Unsigned,
    # without release checks (the server's coordinator is trusted with them): one list
    # "S = {v}" for everybody makes every holder reveal b_v and every other mask key.
    "survivor lists (I2)": (
        _off(ClientSession, "_check_survivors"),
        Setting(
            signed=False,
            verify_releases=False,
            min_sum_size=2,
            max_reclusterings=1,
            split_views=False,
            attacks=F({"stories"}),
        ),
    ),
    # I2: of each peer one secret at most.
    "survivors ∩ dropped (I2)": (_without_overlap_check, Setting(attacks=F({"stories"}))),
    # I2 (signed): the unmask list is the one this client signed, with t signatures. With
    # thresholds that resist no colluder, rotating views around a core give each client a
    # list long enough on its own while only the core's self masks get t shares.
    "consistency signatures (I2)": (
        _off(ClientSession, "_check_signatures"),
        Setting(
            resist=0,
            attacks=F({"stories"}),
            participants=(5, 5),
            max_reclusterings=1,
            rate=128,
        ),
    ),
    # The threshold floor: a lowered threshold lets two disjoint groups each reach it.
    "threshold floor": (
        _without_threshold_floor,
        Setting(
            attacks=F({"thresholds", "stories"}),
            participants=(6, 6),
            max_reclusterings=1,
            rate=128,
        ),
    ),
    # Signed advertisements: a substituted key puts the server between two clients.
    "advertisement signatures": (
        _off(ClientSession, "_verify_advert", lambda self, advert: None),
        Setting(attacks=F({"adverts"})),
    ),
    # I3: the plan's cluster sizes and its audit.
    "plan checks (I3)": (
        _off(ClientRound, "_check_plan", lambda self: None),
        Setting(attacks=F({"plans"})),
    ),
    # I3: releases checked against the plan and what this client saw released.
    "release check (I3)": (
        _off(ClientRound, "check_release"),
        Setting(attacks=F({"dropouts"})),
    ),
    # I3: one cluster per reclustering. Without memory (with it, the release memory
    # catches a cluster run twice on its own).
    "one cluster per reclustering (I3)": (
        _without_reuse_check,
        Setting(memory=False, attacks=F({"reruns"})),
    ),
    # I4: a model again under other clusterings.
    "client memory (I4)": (
        _without_memory,
        Setting(attacks=F({"replay"}), participants=(7, 7), max_reclusterings=1, rate=128),
    ),
    # A1: the roster of a client's first atom is kept; a re-formed atom (a member moved
    # in or out) differenced against the atom sums of earlier rounds gives one input.
    "atom roster (A1)": (
        _off(ClientMemory, "_check_atom", lambda self, who, atom: None),
        Setting(atoms=True, constant_updates=True, attacks=F({"atoms"}), max_rounds=4, rate=128),
    ),
    # A1/A3: plans without atoms refused; accepted, fresh clusterings every round on
    # constant updates solve inputs.
    "atoms required (A1, A3)": (
        lambda: [
            (ClientMemory, "_check_atom", lambda self, who, atom: None),
            (ClientRound, "_check_atoms", lambda self: None),
        ],
        Setting(atoms=True, constant_updates=True, attacks=F({"atoms"}), max_rounds=4, rate=128),
    ),
    # A4: survivors that cut an atom: its other members' sum, against the atom sum.
    "atom releases (A4)": (
        _off(client_round_module, "split_atoms", lambda *args: []),
        Setting(
            atoms=True,
            constant_updates=True,
            attacks=F({"stories", "dropouts"}),
            max_rounds=2,
            rate=128,
        ),
    ),
    # Two-exchange I2: shares of s_wv only for a survivor w and a dropped v.
    "two-exchange: pair shares of survivors (I2)": (
        _reveal_every_pair,
        Setting(two_exchange=True, attacks=F()),
    ),
    # Two-exchange I2: of each peer one secret at most (a victim named survivor and
    # dropped gives b_v and every s_wv).
    "two-exchange: survivors ∩ dropped (I2)": (
        _two_exchange_without_list_checks,
        Setting(two_exchange=True, attacks=F({"stories"}), rate=128),
    ),
    # Signed key adverts of the two-exchange round: a key substituted in the assignment
    # puts the server between two clients for every context.
    "two-exchange: key advert signatures": (
        _off(client_module, "check_advert_fields", lambda advert, identity=None: None),
        Setting(two_exchange=True, attacks=F({"adverts"}), rate=128),
    ),
}
DISABLED_GAMES = 80


@pytest.mark.parametrize("name", list(DISABLED))
def test_each_invariant_switched_off_lets_the_search_find_a_leak(name, monkeypatch):
    patches, setting = DISABLED[name]
    for cls, attribute, value in patches():
        monkeypatch.setattr(cls, attribute, value)
    outcome = search(setting, DISABLED_GAMES, seed=0, tape_bytes=TAPE_BYTES)
    assert outcome is not None, f"no leak in {DISABLED_GAMES} games with {name} off"


def test_an_atom_below_the_floor_is_refused_and_without_the_check_leaks(monkeypatch):
    """A2: a server that forms an atom of two at first contact, then groups it with
    different atoms in two rounds, solves the two members' sum (the difference of two
    cluster sums), below min_sum_size 3. With the floor, its members refuse both rounds."""
    atoms = [(0, 1), (2, 3, 4, 5), (6, 7, 8)]
    rounds = [
        (0, 0, [[(0, 1, 6, 7, 8), (2, 3, 4, 5)]], atoms),
        (1, 1, [[(0, 1, 2, 3, 4, 5), (6, 7, 8)]], atoms),
    ]
    setting = Setting(atoms=True, constant_updates=True, attacks=F())
    outcome = scripted(setting, clients=range(9), rounds=rounds)
    refused = [r for r in outcome.refusals if r.endswith("AtomRefused")]
    assert sorted(refused) == ["0:AtomRefused", "0:AtomRefused", "1:AtomRefused", "1:AtomRefused"]
    judge(outcome)
    monkeypatch.setattr(client_round_module, "atom_floor", lambda *args: 2)
    outcome = scripted(setting, clients=range(9), rounds=rounds)
    assert outcome.findings, "without A2 the sum of the atom of two is determined"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(DISABLED))
def test_the_focused_searches_find_nothing_with_every_invariant_on(name):
    """The control of each focused search: with every invariant on, 250 games (the ``slow``
    profile; three times the ``DISABLED_GAMES`` within which a switched-off invariant is
    found) find nothing. The 10,000-game searches above are the long ones."""
    _, setting = DISABLED[name]
    outcome = search(setting, SEARCH_EXAMPLES // 40, seed=1, tape_bytes=TAPE_BYTES)
    assert outcome is None, outcome.explain()


def test_the_oracle_judges_the_game_it_is_given():
    """A tape whose every choice is honest gives clients that all answer, and no leak; a
    search with no deviation at all is the honest protocol."""
    honest = play(Setting(), tape({}, 64))
    assert honest.masked == honest.responses > 0 and not honest.moves
    judge(honest)
    assert search(Setting(attacks=F()), 3) is None


def test_tapes_replay_exactly():
    data = bytes(itertools.islice(itertools.cycle(range(7, 251, 13)), TAPE_BYTES))
    first, second = play_tape(data), play_tape(data)
    assert first.moves == second.moves and first.refusals == second.refusals
    assert first.findings.describe() == second.findings.describe()
