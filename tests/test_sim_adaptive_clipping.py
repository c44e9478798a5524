"""The adaptive clipping baselines of seed003's Table X in the federated loop
(``privacy.clipping = "quantile"`` / ``"adaclip"``): configuration, the noise and accounting
of a round, the state the modes keep, short runs that train, and checkpoints."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sim_configs import with_overrides

from sharefl.privacy.adaptive_clipping import AdaClip, QuantileClipping, update_noise_multiplier
from sharefl.privacy.calibration import compute_epsilon
from sharefl.privacy.vocabulary import CLIPPINGS
from sharefl.simulation_bridge import deployment_section
from sharefl.simulator import components
from sharefl.simulator.checkpoint import LoopState
from sharefl.simulator.config import SimulationConfigError, expand, load_runs
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.training import TrainingError

ROOT = Path(__file__).resolve().parents[1]
SIGMA = 1.0
COUNT_STD = 2.0

BASE = {
    "name": "adaptive",
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
    "privacy": {"enabled": True, "noise_multiplier": SIGMA, "clip": 1.0, "delta": 1e-5},
    "secure_aggregation": {"cluster_size": 1},
    "aggregator": {"name": "mean"},
}
QUANTILE = {"clipping": "quantile", "clipping_options": {"count_std": COUNT_STD}}
ADACLIP = {"clipping": "adaclip"}


def config(privacy: dict, **overrides) -> dict:
    return with_overrides(BASE, {"privacy": {**BASE["privacy"], **privacy}, **overrides})


def simulation(privacy: dict, **overrides) -> Simulation:
    (run,) = expand(config(privacy, **overrides))
    return Simulation(run)


# -- configuration ---------------------------------------------------------------------------


def test_every_configured_clipping_name_has_one_builder():
    assert set(components.CLIPPING_BUILDERS) == set(CLIPPINGS)


def test_the_modes_are_built_from_the_configuration():
    (run,) = expand(config({**QUANTILE, "clip": 4.0}))
    mode = components.build_clipping(run.privacy)
    assert mode == QuantileClipping(initial_norm=4.0, count_std=COUNT_STD)
    options = {"count_std": 3.0, "target_quantile": 0.7, "learning_rate": 0.1, "initial_norm": 2}
    (run,) = expand(config({"clipping": "quantile", "clipping_options": options}))
    assert components.build_clipping(run.privacy) == QuantileClipping(**options)
    (run,) = expand(config({**ADACLIP, "clip": 4.0}))
    assert components.build_clipping(run.privacy) == AdaClip()  # max_norm 1: not privacy.clip
    (run,) = expand(config({**ADACLIP, "clipping_options": {"beta1": 0.9, "h2": 1e-2}}))
    assert components.build_clipping(run.privacy) == AdaClip(beta1=0.9, h2=1e-2)


@pytest.mark.parametrize(
    ("privacy", "message"),
    [
        ({"clipping": "quantile"}, "count_std"),
        ({**QUANTILE, "clipping_options": {"count_std": 1, "gamma": 0.5}}, "gamma"),
        ({**ADACLIP, "clipping_options": {"beta1": 1.5}}, "beta1"),
        ({"clipping": "flat", "clipping_options": {"count_std": 1}}, "clipping_options"),
        ({**QUANTILE, "level": "client"}, 'privacy.clipping = "flat"'),
        ({"clipping": "median"}, "privacy.clipping must be one of"),
    ],
)
def test_a_configuration_that_does_not_fit_is_refused_naming_the_key(privacy, message):
    with pytest.raises(SimulationConfigError) as info:
        simulation(privacy)
    assert message in str(info.value)


def test_quantile_count_noise_of_at_most_half_sigma_is_refused_when_the_run_is_built():
    # 2σ_b ≤ σ: the count alone would spend the whole budget, σ_Δ does not exist
    with pytest.raises(TrainingError, match=r"count_std σ_b > σ/2 = 0.5 \(got 0.5\)"):
        simulation({**QUANTILE, "clipping_options": {"count_std": SIGMA / 2}})


def test_the_table10_experiment_file_expands_to_its_variants():
    runs = {
        r.label: r for r in load_runs(ROOT / "experiments" / "fed_cdp_mnist_table10_small.toml")
    }
    assert runs["quantile, σ=0.5"].privacy.clipping == "quantile"
    assert runs["quantile, σ=0.5"].privacy.clipping_options == {"count_std": 11.18}
    assert runs["AdaClip, σ=6"].privacy.noise_multiplier == 6.0
    assert runs["Fed-CDP, σ·C per layer, σ=0.5"].privacy.clipping == "per_layer"
    for run in runs.values():  # every variant builds its mode and, for quantile, its σ_Δ
        mode = components.build_clipping(run.privacy)
        if isinstance(mode, QuantileClipping):
            assert mode.update_sigma(run.privacy.noise_multiplier) > run.privacy.noise_multiplier


# -- one round: noise, counts, accounting ------------------------------------------------------


def _clear_and_private(sim: Simulation, ids: list[int]):
    """(the uploads without noise, the uploads with the run's σ) from the same generator
    state and the same adaptive state (one local step: identical batches)."""
    clients = sim.honest_clients.clients
    state = sim.generator.get_state()
    saved = copy.deepcopy((clients.quantile, clients.adaclip))
    clear = clients.train(sim.model_vector, ids, sim.generator, sigma=0.0)
    sim.generator.set_state(state)
    clients.quantile, clients.adaclip = copy.deepcopy(saved)
    private = clients.train(sim.model_vector, ids, sim.generator, sigma=sim.sigma())
    return clear, private


def test_quantile_noise_on_the_update_is_sigma_delta_c_over_b():
    sim = simulation(
        {**QUANTILE, "clip": 0.3},
        training={"batch_size": 16, "local_steps": 1, "upload": "gradient"},
    )
    clear, private = _clear_and_private(sim, sim.honest_ids)
    sigma_update = update_noise_multiplier(SIGMA, COUNT_STD)
    noise = (private - clear).double()
    assert float(noise.std()) == pytest.approx(sigma_update * 0.3 / 16, rel=0.03)
    assert float(torch.linalg.vector_norm(clear, dim=1).max()) <= 0.3 + 1e-6  # mean of ≤ C


def test_quantile_bound_takes_the_geometric_update_once_per_round_from_the_noisy_counts():
    sim = simulation(QUANTILE)
    mode = sim.honest_clients.clients.training.clipping
    sim.run_rounds()
    summary = sim.extra_summary()["adaptive_clipping"]
    bounds, fractions = summary["clip_norm"], summary["unclipped_fraction"]
    assert len(bounds) == len(fractions) == sim.run.rounds
    assert bounds[0] == 1.0  # C₀ = privacy.clip
    for r in range(1, len(bounds)):
        expected = bounds[r - 1] * math.exp(-mode.learning_rate * (fractions[r - 1] - 0.5))
        assert bounds[r] == pytest.approx(expected, rel=1e-5)
    # at C = 1 the raw gradients of this model are larger: few are unclipped, C grows
    assert fractions[0] < 0.5 and bounds[-1] > bounds[0]
    assert all(0.0 <= f <= 1.0 for f in fractions)


def test_without_noise_the_quantile_bound_approaches_the_median_example_norm(monkeypatch):
    sim = simulation(
        QUANTILE, rounds=30, training={"batch_size": 16, "local_steps": 1, "upload": "gradient"}
    )
    sim.replace_privacy_plan(dataclasses.replace(sim.ledger.plan, noise_multiplier=0.0))
    clients = sim.honest_clients.clients
    monkeypatch.setattr(sim.server, "step", lambda aggregate: None)
    sim.run_rounds()  # the model, hence the distribution of the example norms, is fixed
    x, y = clients.inputs, clients.targets
    grads = clients._per_example_shared(clients.model.unflatten(sim.model_vector), x, y)
    norms = torch.linalg.vector_norm(
        torch.cat([g.reshape(len(y), -1) for g in grads.values()], dim=1), dim=1
    )
    median = float(norms.median())
    assert clients.quantile.norm == pytest.approx(median, rel=0.1)
    fractions = sim.extra_summary()["adaptive_clipping"]["unclipped_fraction"]
    assert float(np.mean(fractions[-10:])) == pytest.approx(0.5, abs=0.1)


@pytest.mark.parametrize("privacy", [QUANTILE, ADACLIP, {"clipping": "flat"}])
def test_the_accountant_sees_sigma_per_local_step_as_for_fixed_clipping(privacy):
    sim = simulation(privacy, rounds=3)
    sim.run_rounds()
    q = 16 / 100  # B / n_i, everybody takes part
    expected = compute_epsilon(SIGMA, 1e-5, q, 3 * 4, "rdp")
    assert sim.epsilon() == pytest.approx(expected, rel=1e-9)


def test_adaclip_noise_is_b_sigma_c_over_b_and_only_participants_update_their_estimates():
    sim = simulation(
        {**ADACLIP, "clipping_options": {"max_norm": 2.0}},
        clients={"honest": 8, "per_round": 4},
        training={"batch_size": 16, "local_steps": 1, "upload": "gradient"},
    )
    clients = sim.honest_clients.clients
    ids = [1, 4, 5, 6]
    scale = AdaClip.scale(clients.adaclip.variance[ids])
    before = copy.deepcopy(clients.adaclip)
    clear, private = _clear_and_private(sim, ids)
    z = (private - clear).double() / (scale.double() * SIGMA * 2.0 / 16)
    assert float(z.std()) == pytest.approx(1.0, rel=0.03)
    others = [0, 2, 3, 7]
    torch.testing.assert_close(clients.adaclip.mean[others], before.mean[others])
    torch.testing.assert_close(clients.adaclip.variance[others], before.variance[others])
    assert not torch.equal(clients.adaclip.mean[ids], before.mean[ids])


# -- short runs --------------------------------------------------------------------------------


@pytest.mark.parametrize("privacy", [QUANTILE, ADACLIP], ids=["quantile", "adaclip"])
def test_a_short_private_run_trains(privacy):
    sim = simulation(privacy)
    first_accuracy, first_loss = sim.server.evaluate()
    record = sim.run_rounds()
    assert record.accuracy is not None and record.loss is not None
    assert record.accuracy > max(0.4, first_accuracy + 0.25)  # 10 classes: chance is 0.1
    assert record.loss < first_loss
    assert record.epsilon is not None and record.epsilon > 0


@pytest.mark.parametrize("privacy", [QUANTILE, ADACLIP], ids=["quantile", "adaclip"])
def test_a_loop_restored_after_a_round_is_the_uninterrupted_loop(privacy):
    (run,) = expand(config(privacy, rounds=4, clients={"honest": 8, "per_round": 5}))
    reference = Simulation(run)
    expected = [reference.step() for _ in range(run.rounds)]
    stopped = Simulation(run)
    state = LoopState(stopped)
    for _ in range(2):
        stopped.step()
    saved = state.capture()
    resumed = Simulation(run)
    LoopState(resumed).restore(saved)
    rest = [resumed.step() for _ in range(run.rounds - 2)]
    key = lambda r: (r.round, r.accuracy, r.loss, r.epsilon)  # noqa: E731
    assert [key(r) for r in rest] == [key(r) for r in expected[2:]]
    assert resumed.extra_summary() == reference.extra_summary()


def test_a_deployment_refuses_quantile_clipping_and_runs_adaclip():
    (run,) = expand(
        config(QUANTILE, secure_aggregation={"cluster_size": 3, "enabled": True, "clip": 1.0})
    )
    with pytest.raises(SimulationConfigError, match="quantile"):
        deployment_section(run)
    (run,) = expand(
        config(ADACLIP, secure_aggregation={"cluster_size": 3, "enabled": True, "clip": 1.0})
    )
    assert deployment_section(run).cluster_size == 3
