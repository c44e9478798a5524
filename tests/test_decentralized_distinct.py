"""The decentralized loop's rules on the distinct messages (sharefl/simulator/decentralized/
distinct.py) against the straight path (the ``[R, N, d]`` copy and the batched rules of
sharefl.robust.decentralized, which tests/test_decentralized.py checks against the per-agent
rules), the attacks' distinct messages, and the cached privacy accountant.

Oracles: trimmed mean and the accountant must equal the straight computation bit for bit;
mean, SCC and IOS compute the same formulas in another order and must agree to float64
rounding (relative 1e-12 after a whole run; the loop's ``x`` stays O(10))."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_decentralized import config as base_config

from sharefl.robust.base import AggregationError
from sharefl.simulator.config import expand
from sharefl.simulator.decentralized.accounting import AgentPrivacy
from sharefl.simulator.decentralized.attacks import NeighbourAttack
from sharefl.simulator.decentralized.distinct import batcher_network
from sharefl.simulator.decentralized.loop import DecentralizedLoop
from sharefl.simulator.decentralized.reference import StraightLoop

RULES = ("mean", "trimmed_mean", "scc", "ios")
ATTACKS = ("none", "gaussian", "sign_flipping", "isolating")


def config(attack: str, rule: str, noise: float = 1.0, rounds: int = 40) -> dict:
    """tests/test_decentralized.py's small run with this rule and noise, ``rounds`` long."""
    return base_config(attack, rule=rule, noise=noise) | {
        "name": "dec_distinct",
        "rounds": rounds,
    }


def pair(attack: str, rule: str, **kw) -> tuple[DecentralizedLoop, StraightLoop]:
    (run,) = expand(config(attack, rule, **kw))
    fast = DecentralizedLoop(run)
    return fast, StraightLoop(run, train=fast.train_set, test=fast.test_set)


@pytest.mark.parametrize("n", range(1, 13))
def test_batcher_network_sorts_every_zero_one_input(n):
    network = batcher_network(n)
    assert all(0 <= i < j < n for i, j in network)
    for bits in itertools.product((0, 1), repeat=n):  # the 0-1 principle
        v = list(bits)
        for i, j in network:
            v[i], v[j] = min(v[i], v[j]), max(v[i], v[j])
        assert v == sorted(v), (n, bits)


@pytest.mark.parametrize("attack", ATTACKS)
@pytest.mark.parametrize("rule", RULES)
def test_one_aggregation_equals_the_batched_rule(attack, rule):
    loop = pair(attack, rule)[0]
    sent = loop.broadcast(loop.x, alpha=0.5)
    state = loop.generator.get_state()
    straight = loop.aggregate(sent, loop.received(sent))
    after_straight = loop.generator.get_state()
    loop.generator.set_state(state)
    fast = loop.mix(sent)
    assert torch.equal(loop.generator.get_state(), after_straight)  # the same draws
    if rule == "trimmed_mean":
        assert torch.equal(fast, straight)
    else:
        torch.testing.assert_close(fast, straight, rtol=1e-13, atol=1e-13)


DEFAULT_RUNS = {("ios", "sign_flipping"), ("trimmed_mean", "gaussian")}
"""The two 40-iteration comparisons of the default run (each takes seconds); the others
are ``slow``."""


@pytest.mark.parametrize(
    ("rule", "attack"),
    [
        (rule, attack)
        if (rule, attack) in DEFAULT_RUNS
        else pytest.param(rule, attack, marks=pytest.mark.slow)
        for rule in RULES
        for attack in ("none", "sign_flipping", "gaussian")
    ],
)
def test_a_run_equals_the_straight_run(rule, attack):
    fast, straight = pair(attack, rule)
    records = [(fast.step(), straight.step()) for _ in range(40)]
    if rule == "trimmed_mean":
        assert torch.equal(fast.x, straight.x)
    else:
        torch.testing.assert_close(fast.x, straight.x, rtol=1e-12, atol=1e-12)
    for a, b in records:
        assert a.accuracy == b.accuracy and a.epsilon == b.epsilon
        if a.loss is not None:
            assert a.loss == pytest.approx(b.loss, rel=1e-12)


@pytest.mark.parametrize("name", ["gaussian", "sign_flipping", "isolating"])
def test_distinct_messages_are_the_messages(name):
    loop = pair(name, "ios")[0]
    attack = NeighbourAttack.from_config(name, {})
    sent = torch.randn(len(loop.honest), loop.model.dim, dtype=torch.float64)
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    messages = attack.messages(sent, loop.view, gen_a)
    distinct = attack.distinct_messages(sent, loop.view, gen_b)
    assert distinct.shape[1] == attack.messages_per_receiver(messages.shape[1])
    assert torch.equal(distinct.expand_as(messages), messages)
    assert torch.equal(gen_a.get_state(), gen_b.get_state())


def test_non_finite_messages_are_refused():
    for rule in RULES:
        loop = pair("sign_flipping", rule)[0]
        sent = loop.broadcast(loop.x, alpha=0.5)
        sent[3, 2] = torch.nan
        with pytest.raises(AggregationError, match="finite"):
            loop.mix(sent)


@pytest.mark.parametrize(
    "noise, examples, iterations, adjacency",
    [
        (2.0, 6000, 1, "add_remove"),
        (2.0, 6000, 50_000, "add_remove"),
        (3.0, 5421, 12_500, "replace_one"),
        (5.0, 6742, 999, "add_remove"),
        (0.5, 600, 300, "replace_one"),
    ],
)
def test_cached_accountant_equals_a_fresh_one_bit_for_bit(noise, examples, iterations, adjacency):
    agent = AgentPrivacy(noise, 10.0, 32, examples, iterations, 1e-4, adjacency)
    assert agent.rdp_epsilon() == agent.rdp_epsilon_uncached()
    assert agent.rdp_epsilon() == agent.rdp_epsilon()  # from the cache


def test_paper_epsilon_at_50000_iterations():
    """The accountant's ε for the paper's C = 2 run (docs/results/decentralized.md: 0.628)."""
    agent = AgentPrivacy(2.0, 10.0, 32, 6000, 50_000, 1e-4, "add_remove")
    assert agent.rdp_epsilon() == pytest.approx(0.628, abs=1e-3)
