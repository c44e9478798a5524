"""Mechanisms on messages: seed002's sign randomisers, seed004's noisy transmitted models,
client-level DP's noise split."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sharefl.privacy import (
    ClientDPConfig,
    ModelNoiseConfig,
    NoisyModelTransmitter,
    PerExampleGradients,
    PrivacyAccountant,
    PrivacyConfigError,
    SignFlip,
    SignGaussian,
    clip_update_,
    privatize_update_,
    rsa_sensitivity,
    rsa_sign,
    sign_flip_epsilon,
    sign_flip_gamma,
)


@pytest.mark.parametrize(("eps", "gamma"), [(0.2, 0.5498), (0.4, 0.5987), (1.38, 0.7990)])
def test_seed002_epsilon_gamma_table(eps, gamma):
    assert sign_flip_gamma(eps) == pytest.approx(gamma, abs=5e-5)
    assert sign_flip_epsilon(sign_flip_gamma(eps)) == pytest.approx(eps)
    assert SignFlip(eps).gamma == sign_flip_gamma(eps)


def test_rsa_sign_of_zero_is_plus_one():
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0])
    assert rsa_sign(x).tolist() == [-1.0, 1.0, 1.0, 1.0]


def test_rsa_and_dp_rsa_share_one_sign_and_privacy_loads_no_robust():
    """One definition of sign(0) = +1 (``sharefl.sign``), which privacy's randomisers use
    without importing robust (the import contract checks the code; this, what a fresh
    interpreter loads)."""
    import sharefl.privacy.sign
    import sharefl.robust
    import sharefl.sign

    assert sharefl.privacy.sign.rsa_sign is sharefl.sign.rsa_sign
    assert rsa_sign is sharefl.robust.rsa_sign is sharefl.sign.rsa_sign
    probe = (
        "import sys, torch\n"
        "from sharefl.privacy import SignFlip, SignGaussian\n"
        "SignFlip(1.0)(torch.zeros(3), torch.Generator().manual_seed(0))\n"
        "SignGaussian(1.0, 0.1)(torch.zeros(3), torch.Generator().manual_seed(0))\n"
        "print(sorted(m for m in sys.modules if m.startswith('sharefl.robust')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("eps", [0.2, 1.38])
def test_sign_flip_empirical_keep_rate_matches_gamma(eps):
    n = 200_000
    u = torch.randn(n, generator=torch.Generator().manual_seed(0))
    out = SignFlip(eps)(u, torch.Generator().manual_seed(1))
    assert set(out.unique().tolist()) <= {-1.0, 1.0}
    gamma = sign_flip_gamma(eps)
    kept = float((out == rsa_sign(u)).double().mean())
    assert abs(kept - gamma) < 5 * math.sqrt(gamma * (1 - gamma) / n)
    assert SignFlip(eps).vector_epsilon(1000) == pytest.approx(1000 * eps)


def test_sign_gaussian_sigma_rule_and_agreement_rate():
    delta_u = rsa_sensitivity(lr=0.01, grad_bound=0.01)
    assert delta_u == pytest.approx(2e-4)
    mech = SignGaussian(epsilon=0.4, sensitivity=delta_u)
    assert mech.noise_floor == pytest.approx(0.002)
    small = torch.full((8,), 1e-4)
    assert float(mech.sigma(small)) > 0.002 and float(mech.sigma(small)) == pytest.approx(0.002)
    u = torch.tensor([0.006, -0.003, 0.0])  # max 2|u|/3 = 0.004 dominates the floor
    assert float(mech.sigma(u)) == pytest.approx(0.004) and float(mech.sigma(u)) > 0.004
    per = SignGaussian(0.4, delta_u, per_coordinate=True).sigma(u)
    assert per.tolist() == pytest.approx([0.004, 0.002, 0.002])
    # empirical Pr[output = sign(u_i)] matches Φ(|u_i|/σ), coordinate-wise
    n = 100_000
    base = torch.tensor([0.0015, -0.0005, 0.0])
    rep = base.repeat(n)
    sigma = float(mech.sigma(rep))
    out = mech(rep, torch.Generator().manual_seed(2)).view(n, 3)
    rate = (out == rsa_sign(base)).double().mean(0)
    want = torch.special.ndtr(base.abs().double() / sigma)
    assert torch.all((rate - want).abs() < 5 * torch.sqrt(want * (1 - want) / n))
    torch.testing.assert_close(mech.keep_probability(base), want.float(), rtol=1e-5, atol=1e-6)
    with pytest.raises(PrivacyConfigError, match=r"\(0, 8\)"):
        SignGaussian(epsilon=8.0, sensitivity=1.0)


def test_client_noise_split_sums_to_the_full_variance():
    config = ClientDPConfig(clip_norm=2.0, noise_multiplier=1.5, cluster_size=10)
    assert config.client_noise_std**2 * 10 == pytest.approx((1.5 * 2.0) ** 2)
    colluding = ClientDPConfig(clip_norm=2.0, noise_multiplier=1.5, cluster_size=10, colluders=2)
    assert colluding.client_noise_std**2 * 8 == pytest.approx((1.5 * 2.0) ** 2)
    # empirical: the sum of the m clients' zero updates carries N(0, σ²C²) per coordinate
    d, gen = 20_000, torch.Generator().manual_seed(3)
    scratch = torch.empty(d)
    total = torch.zeros(d)
    for _ in range(10):
        total += privatize_update_(torch.zeros(d), config, gen, scratch=scratch)
    var = float(total.double().var())
    assert abs(var / 9.0 - 1.0) < 5 * math.sqrt(2 / d)


def test_client_update_is_clipped_before_noise():
    config = ClientDPConfig(clip_norm=1.0, noise_multiplier=0.0, cluster_size=4)
    big = torch.full((100,), 3.0)
    out = privatize_update_(big, config, torch.Generator())
    assert out is big and float(out.norm()) == pytest.approx(1.0)
    small = torch.full((4,), 0.1)
    assert torch.equal(clip_update_(small.clone(), 1.0), small)


def test_client_noise_multiplier_for_accounting():
    config = ClientDPConfig(clip_norm=1.0, noise_multiplier=2.0, cluster_size=9, colluders=1)
    assert config.noise_multiplier_for() == 2.0
    assert config.noise_multiplier_for(survivors=5) == pytest.approx(2.0 * math.sqrt(4 / 8))
    assert config.noise_multiplier_for(survivors=1) == 0.0  # only the colluder's share left
    assert config.noise_multiplier_for(reclusterings=3) == pytest.approx(2.0 / math.sqrt(8))
    with pytest.raises(PrivacyConfigError, match="honest member"):
        ClientDPConfig(clip_norm=1.0, noise_multiplier=1.0, cluster_size=3, colluders=3)
    acc = PrivacyAccountant()
    acc.step(config.noise_multiplier_for(survivors=8), sample_rate=0.1, steps=50)
    assert 0 < acc.get_epsilon(1e-5) < math.inf


def test_seed004_transmitted_model_noise_is_c_times_alpha():
    torch.manual_seed(0)
    model = nn.Linear(40, 25)
    x, y = torch.randn(4, 40), torch.randint(0, 25, (4,))
    config = ModelNoiseConfig(noise_scale=0.2, clip_norm=1.0, batch_size=4, dataset_size=6000)
    assert config.noise_multiplier == pytest.approx(0.8) and config.sample_rate == 4 / 6000
    assert config.noise_std(0.05) == pytest.approx(0.01)
    accountant = PrivacyAccountant()
    sender = NoisyModelTransmitter(
        model,
        F.cross_entropy,
        config,
        generator=torch.Generator().manual_seed(1),
        accountant=accountant,
    )
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    grads = PerExampleGradients(model, F.cross_entropy)(x, y)
    g = torch.cat([v.reshape(4, -1) for v in grads.values()], dim=1)
    clipped_mean = (g * (1.0 / g.norm(dim=1)).clamp(max=1.0)[:, None]).mean(0)
    lr, residual = 0.05, []
    for _ in range(20):
        sent = sender.transmit(x, y, lr)
        residual.append(sent - (before - lr * clipped_mean))
    noise = torch.stack(residual).double()
    std = config.noise_std(lr)
    assert abs(float(noise.var()) / std**2 - 1.0) < 5 * math.sqrt(2 / noise.numel())
    assert torch.equal(before, torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert accountant.history[0].noise_multiplier == pytest.approx(0.8)
    assert accountant.steps == 20
