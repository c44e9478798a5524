"""A client's own per-round privacy cost (:mod:`sharefl.privacy.client_budget`).

Oracles, computed here and not by the library: the Poisson-subsampled Gaussian's RDP at
integer orders α, (1/(α − 1))·log Σ_k C(α, k)(1 − q)^(α−k) q^k exp((k² − k)/(2σ²))
(Mironov, Talwar, Zhang 2019, Theorem 5 / the exact integer-order expansion), the
Gaussian's α/(2σ²), and the improved RDP → (ε, δ) conversion
ε = min_α RDP_α + ln((α − 1)/α) − (ln δ + ln α)/(α − 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_configs import with_overrides

from sharefl.privacy.client_budget import (
    DEFAULT_ORDERS,
    ClientNoise,
    client_noise,
    epsilon_from_rdp,
    round_rdp,
)
from sharefl.privacy.errors import PrivacyConfigError
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.federated.client_noise import run_client_noise
from sharefl.simulator.federated.share import distributed_encoder

INTEGER_ORDERS = tuple(range(2, 33))


def subsampled_gaussian_rdp(q: float, sigma: float, alpha: int) -> float:
    terms = [
        math.comb(alpha, k) * (1 - q) ** (alpha - k) * q**k * math.exp((k * k - k) / (2 * sigma**2))
        for k in range(alpha + 1)
    ]
    return math.log(math.fsum(terms)) / (alpha - 1)


def improved_epsilon(rdp, orders, delta: float) -> float:
    a = np.asarray(orders, dtype=np.float64)
    eps = np.asarray(rdp) + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return max(0.0, float(eps.min()))


def config(**overrides) -> dict:
    base = {
        "name": "budget",
        "seed": 1,
        "rounds": 10,
        "data": {"dataset": "synthetic", "options": {"num_examples": 320, "shape": [1, 4, 4]}},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "clients": {"honest": 8},
        "training": {"batch_size": 16, "local_steps": 5, "upload": "delta"},
        "privacy": {"enabled": True, "noise_multiplier": 1.1, "clip": 2.0, "delta": 1e-5},
        "secure_aggregation": {"cluster_size": 1},
        "aggregator": {"name": "mean"},
    }
    return with_overrides(base, overrides)


def run_of(**overrides):
    (run,) = expand(config(**overrides))
    return run


def test_dp_sgd_round_is_its_local_steps_of_the_subsampled_gaussian():
    noise = ClientNoise("example", 1.1, sample_rate=0.04, steps=5)
    got = round_rdp(noise, orders=INTEGER_ORDERS)
    expected = [5 * subsampled_gaussian_rdp(0.04, 1.1, a) for a in INTEGER_ORDERS]
    assert got == pytest.approx(expected, rel=1e-9)
    # pinned: α = 2, 5·log(1 + q²(e^(1/σ²) − 1))
    assert got[0] == pytest.approx(0.0102709, abs=1e-7)


def test_dp_sgd_round_from_the_simulators_tables():
    """q = B/n of the client's own sampling (16/400), the run's local steps."""
    run = run_of()
    noise = run_client_noise(run, 400, noise_multiplier=1.1)
    assert (noise.level, noise.sample_rate, noise.steps, noise.noise_multiplier) == (
        "example",
        0.04,
        5,
        1.1,
    )
    assert client_noise(run.privacy, run.training, examples=10).sample_rate == 1.0
    rdp = round_rdp(noise, orders=INTEGER_ORDERS)
    # ten rounds composed
    eps = epsilon_from_rdp([10 * r for r in rdp], INTEGER_ORDERS, 1e-5)
    oracle = [50 * subsampled_gaussian_rdp(0.04, 1.1, a) for a in INTEGER_ORDERS]
    assert eps == pytest.approx(improved_epsilon(oracle, INTEGER_ORDERS, 1e-5), rel=1e-9)
    assert eps == pytest.approx(2.13723, abs=1e-5)  # pinned


def test_a_calibrated_sigma_must_be_passed():
    run = run_of(privacy={"epsilon": 3.0, "noise_multiplier": 0.0})
    with pytest.raises(PrivacyConfigError, match="pass the calibrated σ"):
        client_noise(run.privacy, run.training, examples=400)


def test_the_cluster_split_charges_only_the_clients_own_share():
    """Signed clusters of 4: s = 3, t = 1, so the client's own share is σC/√2: noise
    multiplier σ/√2 = 1/√2 at σ = 1, RDP α/(2·½) = α per round."""
    run = run_of(
        privacy={"level": "client", "noise_split": "cluster", "noise_multiplier": 1.0},
        secure_aggregation={"cluster_size": 4, "signed": True, "clip": 200.0},
        training={"local_steps": 1},
    )
    noise = run_client_noise(run, 40, noise_multiplier=1.0)
    assert noise.level == "client" and noise.share_std == pytest.approx(2.0 / math.sqrt(2))
    rdp = round_rdp(noise, orders=DEFAULT_ORDERS)
    assert rdp == pytest.approx(list(DEFAULT_ORDERS), rel=1e-9)
    eps = epsilon_from_rdp(rdp, DEFAULT_ORDERS, 1e-5)
    assert eps == pytest.approx(improved_epsilon(DEFAULT_ORDERS, DEFAULT_ORDERS, 1e-5), rel=1e-9)
    assert eps == pytest.approx(7.07739, abs=1e-5)  # pinned: one Gaussian with σ = 1/√2


def test_the_participants_split_charges_sigma_c_over_root_h():
    run = run_of(privacy={"level": "client", "noise_multiplier": 2.0})
    noise = run_client_noise(run, 40, noise_multiplier=2.0)  # h = 8 honest participants
    assert noise.share_std == pytest.approx(2.0 * 2.0 / math.sqrt(8))
    assert round_rdp(noise, orders=(2.0, 8.0)) == pytest.approx((2 * 8 / (2 * 4), 8 * 8 / 8))


def test_a_discrete_share_is_charged_by_its_own_mechanism():
    run = run_of(
        privacy={
            "level": "client",
            "noise_split": "cluster",
            "distributed": "skellam",
            "noise_multiplier": 1.0,
        },
        secure_aggregation={"cluster_size": 3, "bits": 32},
    )
    with pytest.raises(SimulationConfigError, match="pass dim"):
        run_client_noise(run, 40, noise_multiplier=1.0)
    noise = run_client_noise(run, 40, noise_multiplier=1.0, dim=16)
    encoder = distributed_encoder(run, 1.0, 16)
    assert encoder is not None
    expected = encoder.released_mechanism(1).rdp(np.asarray(DEFAULT_ORDERS))
    assert round_rdp(noise) == pytest.approx(list(expected), rel=1e-12)
    # one member's share is less than the sum of the s = 3 the split is sized for
    assert round_rdp(noise)[10] > encoder.released_mechanism(3).rdp(np.asarray([2.1]))[0]


def test_no_noise_costs_everything_and_no_sampling_nothing():
    assert round_rdp(ClientNoise("example", 0.0, sample_rate=0.1)) == (math.inf,) * len(
        DEFAULT_ORDERS
    )
    assert epsilon_from_rdp([math.inf] * 3, (2, 3, 4), 1e-5) == math.inf
    assert set(round_rdp(ClientNoise("example", 0.0, sample_rate=0.0))) == {0.0}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"level": "client", "noise_multiplier": 1.0}, "exactly one of share_std"),
        ({"level": "example", "noise_multiplier": 1.0, "share_std": 1.0}, "leave them unset"),
        ({"level": "example", "noise_multiplier": 1.0, "steps": 0}, "steps must be"),
        ({"level": "example", "noise_multiplier": 1.0, "sample_rate": 1.5}, "sample_rate"),
        ({"level": "user", "noise_multiplier": 1.0}, "level must be"),
    ],
)
def test_client_noise_refuses_what_it_cannot_charge(fields, message):
    with pytest.raises(PrivacyConfigError, match=message):
        ClientNoise(**fields)


def test_orders_must_exceed_one():
    with pytest.raises(PrivacyConfigError, match="orders"):
        round_rdp(ClientNoise("example", 1.0), orders=(1.0, 2.0))
