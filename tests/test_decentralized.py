"""The decentralized loop (seed004) on small synthetic data: the graph and Table I, the
batched rules against the per-agent ones, one noise draw per sender, attacks computed from
what the receiver sees, consensus and learning, the isolating attack, accounting, and the
report's extra-metric plot."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sharefl.robust.base import AggregationError
from sharefl.robust.decentralized import (
    IOS,
    DecentralizedTrimmedMean,
    SelfCenteredClipping,
    batched_ios,
    batched_self_centered_clipping,
    batched_trimmed_mean,
    batched_weighted_mean,
)
from sharefl.simulator import report
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.decentralized.accounting import AgentPrivacy
from sharefl.simulator.decentralized.attacks import NeighbourAttack
from sharefl.simulator.decentralized.graph import (
    GraphError,
    erdos_renyi_graph,
    graph_from_edges,
)
from sharefl.simulator.decentralized.loop import DecentralizedLoop
from sharefl.simulator.decentralized.mixing import mixing_bound, table_one
from sharefl.simulator.decentralized.reference import PerAgentLoop
from sharefl.simulator.loops import build_loop
from sharefl.simulator.runner import run_one


def config(attack: str = "none", **decentralized) -> dict:
    return {
        "name": "dec_test",
        "seed": 1,
        "rounds": 60,
        "eval_every": 20,
        "data": {
            "dataset": "synthetic",
            "options": {"shape": [1, 4, 4], "num_examples": 1200, "num_classes": 4},
        },
        "model": {"name": "decentralized_softmax", "init_seed": 100},
        "clients": {"honest": 10, "byzantine": 2},
        "training": {"batch_size": 8},
        "algorithm": {"name": "decentralized"},
        "attack": {"name": attack},
        "decentralized": {"init_scale": 3.0, **decentralized},
    }


def loop_of(data: dict, cls: type[DecentralizedLoop] = DecentralizedLoop) -> DecentralizedLoop:
    (run,) = expand(data)
    return cls(run)


# -- graph and Table I --------------------------------------------------------------------


def test_the_authors_graph_is_rebuilt():
    g = erdos_renyi_graph(12, 0.7, 2, seed=300)
    assert g.edges == 47 and g.byzantine == (6, 7)
    byz = g.adjacency[:, [6, 7]].sum(dim=1).tolist()
    profile = {n: (g.degrees()[n], int(byz[n])) for n in g.honest}
    assert profile[0] == (10, 2) and profile[10] == (7, 2) and profile[1] == (7, 1)


def test_an_honest_subgraph_that_is_not_connected_is_refused():
    with pytest.raises(GraphError, match="Assumption 1"):
        graph_from_edges(3, [[0, 1], [1, 2]], [1])  # 0 and 2 only meet through Byzantine 1


def test_table_one_ios_and_scc_reproduce_the_paper():
    rows = {b.rule: b for b in table_one(erdos_renyi_graph(12, 0.7, 2, seed=300))}
    assert rows["ios"].rho_squared == pytest.approx(1 / 9, abs=1e-12)  # 0.1111
    assert round(rows["ios"].rho_squared, 4) == 0.1111
    assert rows["scc"].rho_squared == pytest.approx(224 / 81, abs=1e-12)  # 2.7654
    assert rows["trimmed_mean"].rho_squared == pytest.approx(96 / 49, abs=1e-12)  # 1.9592
    assert rows["scc"].chi_squared < 1e-20 and rows["ios"].chi_squared < 1e-20
    assert rows["trimmed_mean"].chi_squared > 1e-3  # not doubly stochastic


def test_a_graph_without_byzantine_agents_has_rho_zero():
    g = erdos_renyi_graph(12, 0.7, 0, seed=300)
    assert mixing_bound(g, "ios").rho_squared == 0 and mixing_bound(g, "scc").rho_squared == 0


# -- batched rules --------------------------------------------------------------------------


def neighbourhoods(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    R, N, d = 5, 8, 6
    mask = torch.rand(R, N, generator=gen) < 0.7
    mask[:, :4] = True  # at least 4 neighbours each
    weights = torch.where(mask, torch.rand(R, N, generator=gen, dtype=torch.float64) / 10, 0.0)
    own = torch.randn(R, d, generator=gen, dtype=torch.float64)
    received = torch.randn(R, N, d, generator=gen, dtype=torch.float64) * 3
    q = torch.tensor([0, 1, 2, 1, 2])
    return own, received, mask, weights, q


def test_batched_rules_equal_the_per_agent_rules():
    own, received, mask, weights, q = neighbourhoods()
    tm = batched_trimmed_mean(own, received, mask, q)
    scc = batched_self_centered_clipping(own, received, weights, 0.5)
    ios = batched_ios(own, received, weights, mask, q)
    mean = batched_weighted_mean(own, received, weights)
    for n in range(own.shape[0]):
        slots = torch.nonzero(mask[n]).flatten()
        msgs, w = received[n, slots], weights[n, slots]
        torch.testing.assert_close(tm[n], DecentralizedTrimmedMean(q=int(q[n]))(own[n], msgs))
        torch.testing.assert_close(scc[n], SelfCenteredClipping(tau=0.5)(own[n], msgs, w))
        torch.testing.assert_close(ios[n], IOS(q=int(q[n]))(own[n], msgs, w))
        torch.testing.assert_close(mean[n], own[n] * (1 - w.sum()) + w @ msgs)


def test_batched_rules_refuse_too_large_q_and_non_finite_messages():
    own, received, mask, weights, q = neighbourhoods()
    with pytest.raises(AggregationError, match="2q"):
        batched_trimmed_mean(own, received, mask, q + 10)
    received[0, 0, 0] = math.nan
    with pytest.raises(AggregationError, match="finite"):
        batched_ios(own, received, weights, mask, q)


@pytest.mark.parametrize("rule", ["mean", "trimmed_mean", "scc", "ios"])
def test_vectorised_loop_equals_the_per_agent_loop(rule):
    data = config("sign_flipping", rule=rule, noise=1.0)
    fast, slow = loop_of(data), loop_of(data, PerAgentLoop)
    for _ in range(3):
        fast.step(), slow.step()
    torch.testing.assert_close(fast.x, slow.x, rtol=1e-9, atol=1e-9)


# -- noise and attacks --------------------------------------------------------------------


def test_one_noise_draw_per_sender_every_receiver_sees_the_same_model():
    loop = loop_of(config("gaussian", rule="ios", noise=2.0))
    gen_state = loop.generator.get_state()
    sent = loop.broadcast(loop.x, alpha=0.5)
    received = loop.received(sent)
    for i, m in enumerate(loop.honest):
        seen = received[loop.mask[:, m], m]
        assert len(seen) >= 2
        torch.testing.assert_close(seen, sent[i].expand_as(seen), rtol=0, atol=0)
    # the noise is there, with std C·α = 1
    loop.generator.set_state(gen_state)
    clean = loop.x - 0.5 * (loop.clipped_gradients(loop.x) + loop.cfg.weight_decay * loop.x)
    assert float((sent - clean).std()) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize(
    "name, options",
    [("sign_flipping", {"scale": 10.0}), ("isolating", {}), ("gaussian", {"center": "neighbours"})],
)
def test_per_receiver_attacks_use_only_what_the_receiver_sees(name, options):
    loop = loop_of(config(name, rule="ios"))
    attack = NeighbourAttack.from_config(name, options)
    sent = torch.randn(len(loop.honest), loop.model.dim, dtype=torch.float64)
    base = attack.messages(sent, loop.view, torch.Generator().manual_seed(0))
    seen = loop.view.honest_neighbours | torch.eye(len(loop.honest), dtype=torch.bool)
    n = int(torch.nonzero(~seen.all(dim=1))[0])  # a receiver that does not see everybody
    unseen = int(torch.nonzero(~seen[n])[0])
    changed = sent.clone()
    changed[unseen] += 100.0
    other = attack.messages(changed, loop.view, torch.Generator().manual_seed(0))
    torch.testing.assert_close(other[n], base[n], rtol=0, atol=0)
    visible = int(torch.nonzero(loop.view.honest_neighbours[n])[0])  # a neighbour
    changed[visible] += 100.0
    assert not torch.equal(
        attack.messages(changed, loop.view, torch.Generator().manual_seed(0))[n], base[n]
    )


def test_isolating_makes_the_mean_return_the_own_model():
    loop = loop_of(config("isolating", rule="mean"))
    sent = loop.broadcast(loop.x, alpha=0.1)
    torch.testing.assert_close(loop.aggregate(sent, loop.received(sent)), sent)


def test_unknown_attack_and_options_are_refused():
    with pytest.raises(SimulationConfigError, match=r"attack\.name"):
        NeighbourAttack.from_config("label_flipping", {})
    with pytest.raises(SimulationConfigError, match="do not apply"):
        NeighbourAttack.from_config("isolating", {"scale": 2})


# -- training -------------------------------------------------------------------------------


def run_loop(data: dict) -> tuple[float, list]:
    """(H before the first iteration, the evaluated records)."""
    loop = loop_of(data)
    start = loop.consensus_error()
    records: list = []
    loop.run_rounds(lambda r: records.append(r) if r.accuracy is not None else None)
    return start, records


def test_without_attack_and_noise_agents_reach_consensus_and_learn():
    data = config("none", rule="mean", init_scale=1.0)
    data["rounds"] = 100
    start, records = run_loop(data)
    assert start > 30  # N(0, I) per agent, d = 68
    errors = [r.extra["consensus_error"] for r in records]
    assert errors[-1] < 1e-4 * start and errors[-1] < errors[0]
    assert records[-1].accuracy > 0.8  # 4 classes: chance is 0.25
    assert records[-1].epsilon is None


def test_isolating_attack_breaks_the_mean_but_not_ios():
    runs = []
    for rule in ("mean", "ios"):
        data = config("isolating", rule=rule, init_scale=1.0)
        data["rounds"] = 100
        runs.append(run_loop(data)[1][-1])
    mean, ios = runs
    assert mean.extra["consensus_error"] > 1e3 * ios.extra["consensus_error"]
    assert ios.accuracy > 0.8


def test_no_attack_deletes_the_byzantine_agents():
    loop = loop_of(config("none", rule="ios"))
    assert loop.graph.size == 10 and loop.graph.byzantine == () and int(loop.q.sum()) == 0
    attacked = loop_of(config("gaussian", rule="ios"))
    assert attacked.graph.size == 12 and int(attacked.q.sum()) == 14


def test_config_refuses_federated_dp_and_picks_the_loop():
    data = config("none")
    assert isinstance(build_loop(expand(data)[0]), DecentralizedLoop)
    data["privacy"] = {"enabled": True, "noise_multiplier": 1.0}
    with pytest.raises(SimulationConfigError, match=r"decentralized\.noise"):
        expand(data)
    with pytest.raises(SimulationConfigError, match=r"decentralized\.rule"):
        expand(config("none", rule="median"))


# -- accounting and results ---------------------------------------------------------------


def test_accounting_theorem3_matches_the_paper_and_rdp_shrinks_with_noise():
    paper = AgentPrivacy(2.0, 10.0, 32, 6000, 50_000, 1e-4, "add_remove")
    assert paper.theorem3_epsilon() == pytest.approx(1.669, abs=1e-3)
    eps = [
        AgentPrivacy(c, 10.0, 32, 6000, 2000, 1e-4, "add_remove").rdp_epsilon()
        for c in (0.5, 1.0, 2.0)
    ]
    assert eps[0] > eps[1] > eps[2] > 0
    replace = AgentPrivacy(1.0, 10.0, 32, 6000, 2000, 1e-4, "replace_one")
    assert replace.noise_multiplier == pytest.approx(1.6) and replace.rdp_epsilon() > eps[1]


def test_results_carry_h_and_privacy_and_the_report_plots_accuracy_loss_and_h(tmp_path):
    data = config("gaussian", rule="ios", noise=0.5)
    data["rounds"] = 20
    outcome = run_one(expand(data)[0], tmp_path / "runs")
    lines = [json.loads(s) for s in (outcome.folder / "rounds.jsonl").read_text().splitlines()]
    assert all("consensus_error" in line for line in lines)
    summary = outcome.summary
    assert summary["plot_metrics"] == ["loss", "consensus_error"]
    agent = summary["privacy"]["agents"]["0"]
    assert {"epsilon_rdp", "epsilon_theorem3", "M", "B", "S", "adjacency"} <= set(agent)
    path = report.write_report(tmp_path / "runs")
    for png in ("dec_test.png", "dec_test_loss.png", "dec_test_consensus_error.png"):
        assert (path.parent / png).is_file(), png
    assert "consensus_error" in path.read_text() and "dec_test_loss.png" in path.read_text()


@pytest.mark.parametrize("clip", [1e-3, 1e6])  # every example clipped / none clipped
def test_softmax_regression_closed_form_equals_the_vmap_path(clip):
    from sharefl.simulator.decentralized.gradients import (
        SoftmaxRegressionClippedMean,
        VmapClippedMean,
        clipped_mean_gradients,
    )
    from sharefl.simulator.models import build_model
    from sharefl.simulator.training import FlatModel

    module = build_model("decentralized_softmax", num_classes=10, input_shape=(1, 6, 6), seed=3)
    module = module.double()
    model = FlatModel(module)
    gen = torch.Generator().manual_seed(0)
    R, B = 4, 5
    x = torch.randn(R, model.dim, generator=gen, dtype=torch.float64)
    inputs = torch.randn(R, B, 1, 6, 6, generator=gen, dtype=torch.float64)
    targets = torch.randint(0, 10, (R, B), generator=gen)
    fast = clipped_mean_gradients(model, module)
    assert isinstance(fast, SoftmaxRegressionClippedMean)
    reference = VmapClippedMean(model, module)
    torch.testing.assert_close(
        fast(x, inputs, targets, clip), reference(x, inputs, targets, clip), rtol=1e-10, atol=1e-12
    )
    mlp = build_model("mlp", num_classes=10, input_shape=(1, 6, 6), seed=3)
    assert isinstance(clipped_mean_gradients(FlatModel(mlp), mlp), VmapClippedMean)
