"""Gaussian DP noise from the AES-256-CTR stream (:mod:`sharefl.privacy.secure_noise`), and
the deployment client's trainer drawing its DP-SGD noise from it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F

from sharefl.privacy import DPSGD, DPSGDConfig, FlatClipping
from sharefl.privacy.errors import PrivacyConfigError
from sharefl.privacy.noise import add_gaussian_noise_, gaussian_, standard_normal
from sharefl.privacy.secure_noise import BLOCK, SecureGaussian, SecureGenerator
from sharefl.privacy.secure_random import SecureRandom
from sharefl.simulation_bridge import SimulationTrainer
from sharefl.simulator.config import expand

N = 100_000
# Kolmogorov's asymptotic critical value at level 10⁻³ is 1.949/√n: the fixed seeds below
# pass it, and every wrong transform in test_the_threshold_rejects_wrong_transforms fails.
KS_THRESHOLD = 1.949 / math.sqrt(N)


def seeded(byte: int = 0) -> SecureGaussian:
    return SecureGaussian(SecureRandom.from_seed(bytes([byte]) * 48))


def ks(samples: np.ndarray) -> float:
    return float(scipy.stats.kstest(samples, "norm").statistic)


@pytest.mark.parametrize("byte", [0, 1, 2])
def test_the_samples_are_standard_normal_by_kolmogorov_smirnov(byte):
    samples = seeded(byte).standard_normal(N)
    assert samples.shape == (N,) and samples.dtype == np.float64
    assert ks(samples) < KS_THRESHOLD
    # the cosine and sine halves are independent (Box–Muller's pairs)
    half = N // 2
    assert abs(np.corrcoef(samples[:half], samples[half:])[0, 1]) < 4 / math.sqrt(half)


def test_the_threshold_rejects_wrong_transforms():
    """The KS threshold has power: the same keystream through broken transforms fails."""
    words = SecureRandom.from_seed(bytes(48)).words(N)
    u1 = ((words[: N // 2] >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
    u2 = (words[N // 2 :] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    wrong = {
        "no factor 2": np.sqrt(-np.log(u1)) * np.cos(2 * np.pi * u2),
        "no square root": -2 * np.log(u1) * np.cos(2 * np.pi * u2),
        "half the angle (sine ≥ 0)": np.sqrt(-2 * np.log(u1)) * np.sin(np.pi * u2),
        "uniform": (u1 - 0.5) * math.sqrt(12),
    }
    for name, samples in wrong.items():
        assert ks(samples) > 5 * KS_THRESHOLD, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fill_writes_scaled_noise_of_the_tensors_shape_and_dtype(dtype):
    out = torch.empty(40, 50, 60, dtype=dtype)  # 120 000 values: a block and a partial one
    sampler = seeded(3)
    gaussian = sampler.fill_(out, 3.0)
    assert gaussian is out and out.shape == (40, 50, 60) and out.dtype == dtype
    assert sampler.drawn == out.numel() > BLOCK // 4
    assert ks(out.double().reshape(-1).numpy() / 3.0) < KS_THRESHOLD * (
        4 if dtype == torch.bfloat16 else 1  # 8-bit mantissas: the rounding shows
    )


def test_fill_handles_a_non_contiguous_tensor_and_zero_std():
    base = torch.zeros(300, 400)
    view = base.t()
    assert not view.is_contiguous()
    sampler = seeded(4)
    sampler.fill_(view, 1.0)
    assert ks(base.reshape(-1).double().numpy()) < KS_THRESHOLD * 1.2
    drawn = sampler.drawn
    assert sampler.fill_(view, 0.0).abs().sum() == 0 and sampler.drawn == drawn


def test_fill_refuses_what_is_not_a_noise_tensor_or_std():
    sampler = seeded()
    with pytest.raises(PrivacyConfigError, match="floating"):
        sampler.fill_(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(PrivacyConfigError, match="finite and ≥ 0"):
        sampler.fill_(torch.zeros(3), -1.0)
    with pytest.raises(PrivacyConfigError, match="SecureRandom"):
        SecureGaussian(np.random.default_rng(0))  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fill_writes_on_the_device_of_the_tensor():
    generator = SecureGenerator("cuda")
    out = torch.empty(N, device="cuda")
    gaussian_(out, 2.0, generator)
    assert out.device.type == "cuda" and generator.gaussian.drawn == N
    assert ks(out.cpu().double().numpy() / 2.0) < KS_THRESHOLD
    noise = standard_normal((5, 7), generator, device="cuda")
    assert noise.device.type == "cuda" and noise.shape == (5, 7)


def test_two_samplers_draw_different_streams_and_a_seed_repeats_one():
    a, b = SecureGaussian(), SecureGaussian()
    assert not np.array_equal(a.standard_normal(64), b.standard_normal(64))
    assert np.array_equal(seeded(9).standard_normal(64), seeded(9).standard_normal(64))
    g1, g2 = SecureGenerator(), SecureGenerator()
    assert not torch.equal(standard_normal((64,), g1), standard_normal((64,), g2))


def test_a_secure_generator_routes_the_privacy_noise_and_keeps_torch_sampling():
    generator = SecureGenerator()
    assert isinstance(generator, torch.Generator)
    x = torch.zeros(1000)
    add_gaussian_noise_(x, 0.5, generator)
    assert generator.gaussian.drawn == 1000 and x.std() > 0.4
    torch.rand(10, generator=generator)  # batch sampling uses the torch state
    assert generator.gaussian.drawn == 1000


def test_dpsgd_draws_its_noise_from_the_secure_stream():
    model = torch.nn.Linear(5, 3)
    generator = SecureGenerator()
    config = DPSGDConfig(FlatClipping(1.0), 1.0, expected_batch_size=4.0)
    dp = DPSGD(model, F.cross_entropy, config, generator=generator)
    dp.backward(torch.randn(4, 5), torch.randint(0, 3, (4,)))
    assert generator.gaussian.drawn == sum(p.numel() for p in model.parameters())


def deployment_run(level: str, local_steps: int):
    privacy = {"enabled": True, "level": level, "noise_multiplier": 1.0, "clip": 0.1}
    (run,) = expand(
        {
            "name": "secure-noise",
            "seed": 1,
            "rounds": 1,
            "data": {
                "dataset": "synthetic",
                "options": {"num_examples": 200, "shape": [1, 4, 4]},
                "partition": "iid",
            },
            "model": {"name": "mlp", "options": {"hidden": [8]}},
            "clients": {"honest": 4},
            "training": {"batch_size": 8, "local_steps": local_steps, "upload": "delta"},
            "privacy": privacy,
            "secure_aggregation": {"cluster_size": 1},
            "aggregator": {"name": "mean"},
        }
    )
    return run


@pytest.mark.parametrize(("level", "local_steps"), [("example", 3), ("client", 2)])
def test_a_deployment_clients_trainer_draws_its_dp_noise_from_the_secure_stream(level, local_steps):
    """DP-SGD: one noise vector of d values per local step; client level: one share of d.
    Both come from the trainer's SecureGenerator, which is its client's generator."""
    trainer = SimulationTrainer(deployment_run(level, local_steps), 1)
    assert isinstance(trainer.randomness, SecureGenerator)
    assert trainer.client.generator is trainer.randomness
    sampler = trainer.randomness.gaussian
    model = trainer.client.initial_model().detach().cpu().numpy()
    upload = trainer(model, round=0, client_id=1)
    per_round = local_steps if level == "example" else 1
    assert sampler.drawn == per_round * trainer.client.dim == per_round * upload.size
