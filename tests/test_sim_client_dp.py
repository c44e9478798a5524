"""Client-level DP (Fed-SDP, ``privacy.level = "client"``) and the accounting sample-rate
override (``privacy.sample_rate``) in the simulator, on small synthetic data; the seed003
experiment files."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
import torch
from sim_configs import with_overrides

from sharefl.privacy.accountant import PrivacyAccountant
from sharefl.privacy.calibration import calibrate_noise, compute_epsilon
from sharefl.simulator.config import SimulationConfigError, expand, load_runs
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.partition import partition

CLIP = 0.05  # small enough that the synthetic runs' raw updates exceed it


def config(**overrides) -> dict:
    """A small synthetic run (8 honest clients, an MLP); tables in ``overrides`` are merged
    one level deep."""
    base = {
        "name": "client-dp",
        "seed": 1,
        "rounds": 6,
        "eval_every": 3,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 800, "shape": [1, 8, 8], "noise": 0.4},
            "partition": "iid",
        },
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"honest": 8},
        "training": {"batch_size": 16, "local_steps": 4, "learning_rate": 0.5, "upload": "delta"},
        "privacy": {
            "enabled": True,
            "level": "client",
            "noise_multiplier": 1.0,
            "clip": CLIP,
            "delta": 1e-5,
        },
        "secure_aggregation": {"cluster_size": 1},
        "aggregator": {"name": "mean"},
    }
    return with_overrides(base, overrides)


def simulation(**overrides) -> Simulation:
    (run,) = expand(config(**overrides))
    return Simulation(run)


def raw_and_private(sim: Simulation, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the clients' unclipped, noiseless updates; what the engine uploads for them) from
    the same generator state, so both come from identical local training."""
    state = sim.generator.get_state()
    raw = sim.honest_clients.clients.train(sim.model_vector, ids, sim.generator, sigma=sim.sigma())
    sim.generator.set_state(state)
    private = sim.honest_clients.train(ids, sim.model_vector, sim.round, sim.generator)
    return raw, private


# -- Fed-SDP mechanics -----------------------------------------------------------------------


def test_client_level_trains_in_the_clear_and_clips_every_honest_update_to_c():
    sim = simulation()
    training = sim.honest_clients.clients.training
    assert training.clipping is None and training.noise == 0.0
    # σ = 0: clipping alone (the configuration refuses σ = 0)
    sim.replace_privacy_plan(dataclasses.replace(sim.ledger.plan, noise_multiplier=0.0))
    ids = sim.honest_ids
    raw, private = raw_and_private(sim, ids)
    raw_norms = torch.linalg.vector_norm(raw, dim=1)
    assert float(raw_norms.max()) > CLIP  # without clipping some updates are larger
    norms = torch.linalg.vector_norm(private, dim=1)
    assert float(norms.max()) <= CLIP + 1e-6
    expected = raw * (CLIP / raw_norms).clamp_max(1.0)[:, None]  # scaled, same direction
    torch.testing.assert_close(private, expected, rtol=1e-5, atol=1e-7)


def test_the_mean_of_the_uploads_carries_noise_of_std_sigma_c_over_k():
    sigma = 4.0
    sim = simulation(privacy={**config()["privacy"], "noise_multiplier": sigma})
    ids = sim.honest_ids
    K = len(ids)
    raw, private = raw_and_private(sim, ids)
    clipped = raw * (CLIP / torch.linalg.vector_norm(raw, dim=1)).clamp_max(1.0)[:, None]
    noise = (private - clipped).double()
    per_client = float(noise.std())
    aggregate = float(noise.mean(0).std())  # the mean over the round's K uploads
    assert per_client == pytest.approx(sigma * CLIP / math.sqrt(K), rel=0.05)
    assert aggregate == pytest.approx(sigma * CLIP / K, rel=0.1)


def test_only_honest_participants_share_the_noise_of_the_round():
    sigma = 4.0
    sim = simulation(  # 6 honest + 4 Byzantine participants: the 6 carry all the noise
        clients={"honest": 6, "byzantine": 4},
        privacy={**config()["privacy"], "noise_multiplier": sigma},
    )
    honest, byzantine = sim.participants()
    assert (len(honest), len(byzantine)) == (6, 4)
    raw, private = raw_and_private(sim, honest)
    clipped = raw * (CLIP / torch.linalg.vector_norm(raw, dim=1)).clamp_max(1.0)[:, None]
    summed = (private - clipped).double().sum(0)  # the honest sum carries N(0, σ²C²)
    assert float(summed.std()) == pytest.approx(sigma * CLIP, rel=0.1)


# -- accounting --------------------------------------------------------------------------------


def test_client_level_accounts_one_mechanism_per_round_at_rate_per_round_over_total():
    sigma, rounds = 1.5, 6
    sim = simulation(
        rounds=rounds,
        clients={"honest": 8, "per_round": 2},
        privacy={**config()["privacy"], "noise_multiplier": sigma, "conversion": "classic"},
    )
    records = []
    sim.run_rounds(records.append)
    assert sim.ledger.plan.sample_rate == 2 / 8 and sim.ledger.plan.steps_per_round == 1
    direct = PrivacyAccountant("rdp", conversion="classic")
    direct.step(sigma, 2 / 8, rounds)
    assert records[-1].epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-9)
    assert records[-1].accuracy is not None


def test_client_level_with_everybody_taking_part_accounts_q_one_and_default_delta():
    sim = simulation(privacy={**config()["privacy"], "delta": 0.0})
    assert sim.ledger.plan.sample_rate == 1.0
    assert sim.ledger.plan.delta == pytest.approx(1 / 8**1.1)  # 1/N^1.1 over the clients


def test_client_level_calibrates_sigma_over_the_rounds():
    privacy = {**config()["privacy"], "epsilon": 8.0, "noise_multiplier": 0.0}
    sim = simulation(rounds=20, clients={"honest": 8, "per_round": 4}, privacy=privacy)
    expected = calibrate_noise(8.0, 1e-5, 0.5, 20, "rdp", conversion="improved")
    assert sim.ledger.plan.noise_multiplier == pytest.approx(expected, rel=1e-9)


def seed003_instance_level(**privacy) -> Simulation:
    """seed003's MNIST accounting shape (σ = 6, T = 100 rounds of L = 100 steps, δ = 1e-5,
    classic conversion) on synthetic data; nothing is trained."""
    return simulation(
        rounds=100,
        training={"batch_size": 5, "local_steps": 100, "sampling": "shuffle"},
        clients={"honest": 8, "per_round": 4},
        privacy={
            "enabled": True,
            "level": "example",
            "noise_multiplier": 6.0,
            "clipping": "l2max",
            "clip": 4.0,
            "delta": 1e-5,
            "conversion": "classic",
            **privacy,
        },
    )


def account_all_rounds(sim: Simulation) -> float:
    for t in range(sim.run.rounds):
        sim.round = t
        sim.accountant_step()
    eps = sim.epsilon()
    assert eps is not None
    return eps


def test_the_sample_rate_override_gives_seed003s_epsilon():
    computed = seed003_instance_level()
    assert computed.ledger.plan.sample_rate == pytest.approx(5 / 100 * 4 / 8)  # B/n_i · K/N
    paper = seed003_instance_level(sample_rate=0.01)
    assert paper.ledger.plan.sample_rate == 0.01
    eps = account_all_rounds(paper)
    assert eps == pytest.approx(compute_epsilon(6.0, 1e-5, 0.01, 10_000, conversion="classic"))
    assert eps == pytest.approx(0.823, abs=0.005)  # seed003 Table VI, Fed-CDP/Fed-αCDP
    assert account_all_rounds(computed) > eps + 0.5  # q = 0.025 spends much more


def test_the_sample_rate_override_drives_the_calibration():
    sim = seed003_instance_level(sample_rate=0.01, epsilon=0.823, noise_multiplier=0.0)
    expected = calibrate_noise(0.823, 1e-5, 0.01, 10_000, conversion="classic")
    assert sim.ledger.plan.noise_multiplier == pytest.approx(expected, rel=1e-9)
    assert sim.ledger.plan.noise_multiplier == pytest.approx(6.0, rel=0.01)


# -- configuration -----------------------------------------------------------------------------


def test_seed003_experiment_files_parse_with_paper_values():
    table6 = {r.label: r for r in load_runs("experiments/fed_cdp_mnist_table6.toml")}
    assert {k: r.paper for k, r in table6.items()} == {
        "non-private": 0.980,
        "Fed-SDP": 0.928,
        "Fed-CDP": 0.956,
        "Fed-αCDP": 0.979,
        "Fed-αCDP[σ] exponential": 0.983,
        "Fed-αCDP, σ=0.5 (authors' code)": 0.979,
        "Fed-CDP, σ=0.5 (authors' code)": 0.956,
        "Fed-SDP, σ=0.5 (authors' code)": 0.928,
    }
    small = {r.label: r for r in load_runs("experiments/fed_cdp_mnist_table4_small.toml")}
    assert {k: r.paper for k, r in small.items()} == {
        "non-private": 0.959,
        "Fed-SDP": 0.834,
        "Fed-CDP": 0.858,
        "Fed-αCDP": 0.892,
        "Fed-αCDP, σ=0.5 (authors' code)": 0.892,
        "Fed-CDP, σ=0.5 (authors' code)": 0.858,
        "Fed-SDP, σ=0.5 (authors' code)": 0.834,
        "Fed-SDP, σ=0.05 (our probe)": None,  # not a paper cell
    }
    assert small["Fed-SDP, σ=0.05 (our probe)"].privacy.noise_multiplier == 0.05
    del small["Fed-SDP, σ=0.05 (our probe)"]
    for runs in (table6, small):
        for label, run in runs.items():
            assert run.privacy.noise_multiplier == (0.5 if "σ=0.5" in label else 6.0)
    assert not table6["non-private"].privacy.enabled
    for label in ("Fed-SDP", "Fed-SDP, σ=0.5 (authors' code)"):
        sdp = table6[label].privacy
        assert (sdp.level, sdp.clipping, sdp.sample_rate, sdp.clip) == ("client", "flat", 0.0, 4.0)
    assert table6["Fed-CDP"].privacy.clipping == "per_layer"
    assert table6["Fed-αCDP"].privacy.clipping == "l2max"
    for run in (table6["Fed-CDP"], table6["Fed-αCDP"], table6["Fed-αCDP[σ] exponential"]):
        p = run.privacy
        assert (p.level, p.sample_rate, p.noise_multiplier) == ("example", 0.01, 6.0)
        assert (p.conversion, p.delta) == ("classic", 1e-5)
    decay = table6["Fed-αCDP[σ] exponential"].privacy
    assert decay.schedule == "exponential"
    assert decay.schedule_options["sigma0"] == pytest.approx(math.exp(2.71), rel=1e-4)
    assert decay.schedule_options["rate"] == 0.0113
    for runs, honest, per_round in ((table6, 1000, 100), (small, 100, 20)):
        for run in runs.values():
            assert (run.clients.honest, run.clients.per_round) == (honest, per_round)
            assert (run.training.batch_size, run.training.local_steps) == (5, 100)
            assert (run.rounds, run.model.name, run.data.partition) == (
                100,
                "fed_cdp_cnn",
                "fed_cdp_replicated_shards",
            )


@pytest.mark.parametrize(("clients", "replicas"), [(1000, 10), (100, 1)])
def test_the_seed003_split_of_the_files_gives_500_examples_per_client(clients, replicas):
    (run, *_) = load_runs("experiments/fed_cdp_mnist_table6.toml")
    labels = np.repeat(np.arange(10), run.data.train_examples // 10)
    parts = partition(labels, clients, run.data.partition, seed=1, **run.data.partition_options)
    assert {len(p) for p in parts} == {500}
    counts = np.bincount(np.concatenate(parts), minlength=len(labels))
    assert set(counts.tolist()) == {replicas}  # every image, N/100 times


@pytest.mark.parametrize(
    ("privacy", "other", "message"),
    [
        ({"level": "server"}, {}, "privacy.level must be"),
        ({"clipping": "normalize"}, {}, 'privacy.clipping = "flat"'),
        ({"clipping": "l2max"}, {}, 'privacy.clipping = "flat"'),
        ({"momentum": 0.1}, {}, "privacy.momentum = 0"),
        ({}, {"aggregator": {"name": "noise_filter"}}, 'aggregator.name = "mean"'),
        ({}, {"aggregator": {"name": "median"}}, 'aggregator.name = "mean"'),
        ({}, {"aggregator": {"name": "mean", "pre": ["nnm"]}}, "no aggregator.pre"),
        ({}, {"secure_aggregation": {"cluster_size": 3}}, "cluster_size = 1"),
        ({"sample_rate": 1.5}, {}, "privacy.sample_rate must be in (0, 1]"),
        ({"sample_rate": -0.01}, {}, "privacy.sample_rate must be in (0, 1]"),
        ({"conversion": "tight"}, {}, 'privacy.conversion must be "improved" or "classic"'),
        ({"accountant": "pld", "conversion": "classic"}, {}, 'privacy.accountant = "rdp"'),
    ],
)
def test_unsupported_combinations_raise_config_errors(privacy, other, message):
    patched = config(privacy={**config()["privacy"], **privacy}, **other)
    with pytest.raises(SimulationConfigError, match=re.escape(message)):
        expand(patched)


def test_client_level_options_are_ignored_without_privacy():
    off = {**config()["privacy"], "enabled": False}
    (run,) = expand(config(privacy=off, aggregator={"name": "median"}))
    assert Simulation(run).honest_clients.clients.training.clipping is None
