"""SHARE (seed001) in the simulator, on small synthetic data: Zeno++ over cluster sums,
fixed vs per-round clusterings, R > 1 through the safe planner with the audit verdict in
the results, client-level DP split over clusters, local momentum and weighted deltas; and
the experiment files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sim_configs import with_overrides

from sharefl.privacy.cluster_noise import (
    ClusterNoiseSplit,
    ClusterPrivacyLedger,
    effective_noise_multipliers,
)
from sharefl.protocol import LeakageError, secure_sum
from sharefl.protocol.client import min_released_members
from sharefl.simulator.config import SimulationConfigError, expand, load_runs
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.federated.share import MIN_SUM_SIZE, delta_weights
from sharefl.simulator.training import LocalTraining, TrainingError


def config(**overrides) -> dict:
    """12 honest + 3 Byzantine clients on synthetic 8×8 images, an MLP, clusters of 3."""
    base = {
        "name": "share",
        "seed": 1,
        "rounds": 4,
        "eval_every": 2,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 1200, "shape": [1, 8, 8], "noise": 0.4},
            "partition": "iid",
            "auxiliary_per_class": 20,
        },
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"honest": 12, "byzantine": 3},
        "training": {"batch_size": 16, "local_steps": 2, "learning_rate": 0.1, "upload": "delta"},
        "attack": {"name": "sign_flipping", "options": {"scale": 10}},
        "secure_aggregation": {"cluster_size": 3, "enabled": False, "clip": 10.0},
        "aggregator": {"name": "zeno", "options": {"rho": 1e-4, "epsilon": 0.0}},
    }
    return with_overrides(base, overrides)


def simulation(**overrides) -> Simulation:
    (run,) = expand(config(**overrides))
    return Simulation(run)


# -- Zeno++ ---------------------------------------------------------------------------------


def test_zeno_rejects_clusters_with_a_minus_10_delta_member_and_accepts_honest_clusters():
    sim = simulation(secure_aggregation={"reclusterings": 2})
    sim.run_rounds()
    zeno = sim.share.zeno
    assert zeno.byzantine_candidates > 0 and zeno.candidates > zeno.byzantine_candidates
    assert zeno.byzantine_accepted == 0
    honest = zeno.candidates - zeno.byzantine_candidates
    assert zeno.accepted - zeno.byzantine_accepted >= 0.9 * honest
    summary = sim.extra_summary()["share"]
    assert summary["zeno_byzantine_acceptance"] == 0.0


def test_zeno_with_every_cluster_accepted_is_the_fedavg_step():
    sim = simulation(clients={"honest": 12, "byzantine": 0}, attack={"name": "none"})
    sim.share.zeno.rule = type(sim.share.zeno.rule)(lr=1.0, rho=0.0, epsilon=1e9)
    uploads = torch.randn(12, sim.model.dim)
    out = sim.server.aggregate(uploads.clone(), sim.honest_ids, sim.round, sim.rng)
    torch.testing.assert_close(out, uploads.mean(0), atol=1e-4, rtol=1e-4)


def test_zeno_needs_the_servers_validation_set():
    with pytest.raises(SimulationConfigError, match="auxiliary_per_class"):
        simulation(data={"auxiliary_per_class": 0})


def test_zeno_without_clusters_filters_individual_uploads():
    sim = simulation(secure_aggregation={"cluster_size": 1})
    sim.run_rounds()
    zeno = sim.share.zeno
    assert zeno.byzantine_accepted == 0 and zeno.byzantine_candidates == 3 * 4
    assert sim.extra_summary()["share"]["audit"]["verdict"].startswith("not audited")


# -- clusterings -----------------------------------------------------------------------------


def _clusterings_per_round(sim: Simulation, rounds: int) -> list[tuple]:
    seen = []
    for _ in range(rounds):
        sim.step()
        seen.append(tuple(c.clusters for c in sim.share.last_clusterings))
    return seen


def test_fixed_plan_keeps_the_same_clusters_across_rounds():
    fixed = simulation(secure_aggregation={"clustering": "fixed_plan", "reclusterings": 2})
    seen = _clusterings_per_round(fixed, 3)
    assert seen[0] == seen[1] == seen[2]
    assert seen[0][0] != seen[0][1]  # two different clusterings inside the round
    fresh = simulation(secure_aggregation={"clustering": "random", "reclusterings": 2})
    seen = _clusterings_per_round(fresh, 3)
    assert len(set(seen)) == 3


def test_fixed_clustering_refuses_client_sampling():
    sim = simulation(
        clients={"honest": 12, "byzantine": 3, "per_round": 12},
        secure_aggregation={"clustering": "fixed"},
    )
    with pytest.raises(SimulationConfigError, match="per_round = 0"):
        for _ in range(4):
            sim.step()


def test_r_above_one_runs_through_the_safe_planner_and_the_verdict_is_recorded():
    sim = simulation(
        secure_aggregation={"reclusterings": 4, "planner": "safe"},
        clients={"honest": 15, "byzantine": 3},
    )
    sim.run_rounds()
    audit = sim.extra_summary()["share"]["audit"]
    assert audit["verdict"] == "no leak found"
    assert audit["rounds"] == 4 and audit["leaking_rounds"] == 0 and audit["min_nullity"] > 0
    assert len(sim.share.last_clusterings) == 4


def test_the_papers_random_reclusterings_leak_and_are_refused_unless_allowed():
    overrides = {
        "clients": {"honest": 15, "byzantine": 3},
        "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
    }
    refused = simulation(secure_aggregation={"reclusterings": 4, "planner": "random"}, **overrides)
    with pytest.raises(LeakageError):
        refused.step()
    allowed = simulation(
        secure_aggregation={"reclusterings": 4, "planner": "random", "allow_leakage": True},
        **overrides,
    )
    allowed.run_rounds()
    audit = allowed.extra_summary()["share"]["audit"]
    assert audit["verdict"] == "leaks" and audit["leaking_rounds"] == 4
    assert audit["max_recoverable_clients"] == 18  # R(c − 1) + 1 = 21 >= n: full rank


# -- client-level DP split over clusters -----------------------------------------------------


def test_cluster_split_released_sum_has_the_target_variance_and_each_share_is_smaller():
    sigma, clip, d = 1.5, 2.0, 200_000
    split = ClusterNoiseSplit(clip_norm=clip, noise_multiplier=sigma, min_survivors=2)
    gen = torch.Generator().manual_seed(7)
    shares = [split.privatize_(torch.zeros(d, dtype=torch.float64), gen) for _ in range(3)]
    target = (sigma * clip) ** 2
    # the minimum number of survivors that still releases (2 of 3): exactly the target
    survivors = shares[0] + shares[1]
    assert survivors.var().item() == pytest.approx(target, rel=0.02)
    # the full cluster carries more (3/2 of it); one share alone carries less
    assert (shares[0] + shares[1] + shares[2]).var().item() == pytest.approx(1.5 * target, rel=0.02)
    assert shares[0].var().item() == pytest.approx(target / 2, rel=0.02)
    assert shares[0].var().item() < target
    assert split.released_variance(2) == pytest.approx(target)


def test_cluster_split_survives_a_dropout_in_the_real_protocol():
    # m = 4: the protocol releases a sum of at least max(threshold 3, min_sum_size 3) = 3
    sigma, clip, d = 1.0, 4.0, 20_000
    assert min_released_members(4, MIN_SUM_SIZE) == 3 == min_released_members(3, MIN_SUM_SIZE)
    assert min_released_members(10, MIN_SUM_SIZE) == 6
    split = ClusterNoiseSplit(clip_norm=clip, noise_multiplier=sigma, min_survivors=3)
    gen = torch.Generator().manual_seed(3)
    inputs = {
        c: split.privatize_(torch.zeros(d, dtype=torch.float64), gen).numpy() for c in range(4)
    }
    result = secure_sum(inputs, cluster_size=4, clip=40.0, seed=5, dropouts={"mask": [3]})
    (released,) = result.clusters
    assert released.members == (0, 1, 2)
    assert np.var(released.sum) == pytest.approx((sigma * clip) ** 2, rel=0.05)
    two_left = secure_sum(inputs, cluster_size=4, clip=40.0, seed=5, dropouts={"mask": [2, 3]})
    assert not two_left.clusters  # fewer than s survivors: nothing is released


def test_per_client_accounting_of_the_split():
    share = 1.0 / math.sqrt(2)  # σ = 1, C = 1, s = 2
    one = effective_noise_multipliers([[0, 1, 2]], [0, 1, 2], share, 1.0)
    assert one[0] == pytest.approx(math.sqrt(3 / 2))  # a full cluster: σ√(m/s) >= σ
    dropped = effective_noise_multipliers([[0, 1]], [0, 1, 2], share, 1.0)
    assert dropped[0] == pytest.approx(1.0) and math.isinf(dropped[2])
    # a Byzantine member (2) adds no noise: the honest pair is all the server cannot see
    assert effective_noise_multipliers([[0, 1, 2]], [0, 1], share, 1.0)[0] == pytest.approx(1.0)
    # released sums from which client 0's update can be solved ({0, 1} − {1}): σ/√s
    leak = effective_noise_multipliers([[0, 1], [1], [0, 2], [2]], [0, 1, 2], share, 1.0)
    assert leak[0] == pytest.approx(share)
    ledger = ClusterPrivacyLedger(ClusterNoiseSplit(1.0, 1.0, 2))
    for _ in range(4):
        ledger.record_round([[0, 1]], [0, 1])
    assert ledger.noise_multiplier(0) == pytest.approx(0.5)  # 4 Gaussians of σ = 1
    eps = ledger.epsilons(1e-5)
    assert eps[0] == eps[1] > 0


def test_simulation_with_cluster_split_dp_reports_per_client_epsilon():
    sim = simulation(
        attack={"name": "none"},
        clients={"honest": 12, "byzantine": 0},
        aggregator={"name": "trimmed_mean", "options": {"f": 1}},
        privacy={
            "enabled": True,
            "level": "client",
            "noise_split": "cluster",
            "epsilon": 2.0,
            "clip": 0.05,
            "delta": 1e-5,
        },
    )
    last = sim.run_rounds()
    dp = sim.extra_summary()["share"]["client_dp"]
    assert dp["min_survivors"] == 3 and dp["rounds"] == 4
    # m = 3 releases only whole clusters: each carries exactly the calibrated noise
    assert dp["epsilon_max"] == pytest.approx(2.0, rel=1e-3)
    assert last.epsilon == pytest.approx(dp["epsilon_max"])


def test_cluster_split_needs_client_level_and_clusters():
    with pytest.raises(SimulationConfigError, match="cluster_size >= 2"):
        simulation(
            secure_aggregation={"cluster_size": 1},
            aggregator={"name": "mean", "options": {}},
            attack={"name": "none"},
            clients={"honest": 12, "byzantine": 0},
            privacy={"enabled": True, "level": "client", "noise_split": "cluster", "epsilon": 1},
        )
    with pytest.raises(SimulationConfigError, match='level = "client"'):
        simulation(privacy={"enabled": True, "noise_split": "cluster", "epsilon": 1})


# -- local training --------------------------------------------------------------------------


def test_local_momentum_and_weighted_deltas():
    with pytest.raises(TrainingError):
        LocalTraining(batch_size=4, momentum=1.0)
    torch.testing.assert_close(delta_weights([1, 3]), torch.tensor([0.5, 1.5]))
    plain = simulation(attack={"name": "none"}, clients={"honest": 12, "byzantine": 0})
    heavy = simulation(
        attack={"name": "none"},
        clients={"honest": 12, "byzantine": 0},
        training={"momentum": 0.9},
    )
    a = plain.honest_clients.clients.train(
        plain.model_vector, [0, 1], torch.Generator().manual_seed(0)
    )
    b = heavy.honest_clients.clients.train(
        heavy.model_vector, [0, 1], torch.Generator().manual_seed(0)
    )
    # two steps: plain moves η(g1 + g2), momentum η(g1 + (0.9 g1 + g2)); same batches, and
    # g1 is taken at the same point, so the difference is about 0.9 η g1
    assert not torch.allclose(a, b) and b.norm() > a.norm()
    with pytest.raises(SimulationConfigError, match="upload"):
        expand(config(training={"momentum": 0.9, "upload": "gradient", "local_steps": 1}))


# -- experiment files ------------------------------------------------------------------------


SHARE_FILES = sorted(Path("experiments").glob("share_*.toml"))


def test_share_experiment_files_expand():
    assert len(SHARE_FILES) >= 8
    for path in SHARE_FILES:
        runs = load_runs(path)
        assert runs, path
        for run in runs:
            assert run.clients.total in (50, 60, 100), path
            # variants merge tables: a rule must not inherit another rule's options
            if run.aggregator.name != "zeno":
                assert "n_s" not in run.aggregator.options, (path, run.label)


def test_the_cifar10_configuration_runs_on_cifar_shaped_synthetic_data():
    """The CIFAR-10 files are not available offline: the same run (McMahan CNN, SHARE's
    clusters, Zeno++) on synthetic 3×32×32 images, shrunk to a few clients and one round."""
    import dataclasses

    (run,) = [
        r
        for r in load_runs("experiments/share_cifar10_figure2.toml")
        if r.seed == 1 and r.label == "zeno m=3"
    ]
    assert run.data.dataset == "cifar10" and run.model.name == "mcmahan_cnn"
    data = dataclasses.replace(
        run.data,
        dataset="synthetic",
        options={"num_examples": 480, "shape": [3, 32, 32], "noise": 0.4},
        auxiliary_per_class=4,
    )
    small = dataclasses.replace(
        run,
        rounds=1,
        eval_every=1,
        data=data,
        clients=dataclasses.replace(run.clients, honest=7, byzantine=2),
        training=dataclasses.replace(run.training, batch_size=4, local_steps=1),
    )
    sim = Simulation(small)
    assert tuple(sim.setup.train.inputs.shape[1:]) == (3, 32, 32)
    record = sim.run_rounds()
    assert record.accuracy is not None and math.isfinite(record.loss)
    assert sim.extra_summary()["share"]["audit"]["rounds"] == 1
