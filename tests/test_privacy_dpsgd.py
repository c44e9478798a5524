"""DP-SGD: clipping modes against per-example references, noise scale, empty batches,
equality with plain SGD when clipping and noise are off, accountant stepping."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sharefl.privacy import (
    DPSGD,
    DPSGDConfig,
    ExponentialSchedule,
    FlatClipping,
    L2MaxClipping,
    Normalization,
    PerExampleGradients,
    PerLayerClipping,
    PrivacyAccountant,
    PrivacyConfigError,
    poisson_sample,
)

B = 8
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.ELU(),
        nn.GroupNorm(2, 4),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 10),
    )


@pytest.fixture
def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(B, 1, 8, 8, generator=gen), torch.randint(0, 10, (B,), generator=gen)


def per_example_matrix(model, x, y) -> torch.Tensor:
    """[B, d] per-example gradients, parameter order."""
    grads = PerExampleGradients(model, F.cross_entropy)(x, y)
    return torch.cat([g.reshape(x.shape[0], -1) for g in grads.values()], dim=1)


def make(model, clipping, sigma=0.0, seed=0, **kw) -> DPSGD:
    config = DPSGDConfig(clipping, sigma, expected_batch_size=B, **kw)
    return DPSGD(model, F.cross_entropy, config, generator=torch.Generator().manual_seed(seed))


def test_no_clipping_no_noise_equals_plain_sgd_step(data):
    x, y = data
    plain, private = tiny_cnn(), tiny_cnn()
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_private = torch.optim.SGD(private.parameters(), lr=0.1, momentum=0.9)
    dp = make(private, None, 0.0)
    for _ in range(2):
        opt_plain.zero_grad()
        F.cross_entropy(plain(x), y).backward()
        opt_plain.step()
        opt_private.zero_grad()
        result = dp.backward(x, y)
        opt_private.step()
        assert result.noise_std == 0.0 and result.batch_size == B
    for p, q in zip(plain.parameters(), private.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_flat_clipping_matches_reference(data, device):
    x, y = (t.to(device) for t in data)
    model = tiny_cnn().to(device)
    g = per_example_matrix(model, x, y)
    clip = float(g.norm(dim=1).median())  # some examples clipped, some not
    factors = (clip / g.norm(dim=1)).clamp(max=1.0)
    want = (g * factors[:, None]).sum(0) / B
    config = DPSGDConfig(FlatClipping(clip), 0.0, expected_batch_size=B, chunk_size=3)
    dp = DPSGD(model, F.cross_entropy, config, generator=torch.Generator(device))
    result = dp.privatize(x, y)
    assert result.flat.device == x.device
    torch.testing.assert_close(result.flat, want, rtol=1e-5, atol=1e-7)
    assert result.sensitivity == clip


@pytest.mark.parametrize(
    "clipping",
    [FlatClipping(0.05), PerLayerClipping(0.02), Normalization(0.0), Normalization(0.5)],
    ids=["flat", "per-layer", "normalization", "normalization-momentum"],
)
def test_removing_one_example_moves_the_sum_by_at_most_the_sensitivity(data, clipping):
    """Add/remove adjacency: Σ_j contribution_j changes by ≤ Δ when one example is removed
    (σ = 0, same momentum state for both sums)."""
    x, y = data
    model = tiny_cnn()
    dp = make(model, clipping)
    if isinstance(clipping, Normalization):
        dp.privatize(x, y)  # a non-zero momentum state m
    state = copy.deepcopy(dp.state_dict())
    full = dp.privatize(x, y)
    delta = full.sensitivity
    for j in range(B):
        dp.load_state_dict(state)
        keep = torch.arange(B) != j
        without = dp.privatize(x[keep], y[keep])
        moved = float(((full.flat - without.flat) * B).norm())
        assert moved <= delta * (1 + 1e-5)
    assert moved > 0.5 * delta  # the bound is attained up to a constant (clipping is active)


def test_per_layer_clipping_matches_reference(data):
    x, y = data
    model = tiny_cnn()
    grads = PerExampleGradients(model, F.cross_entropy)(x, y)
    bounds = (0.5, 0.1, 0.3, 0.2, 0.4, 0.05)  # conv w, b, GroupNorm w, b, linear w, b
    parts = []
    for g, c in zip(grads.values(), bounds, strict=True):
        flat = g.reshape(B, -1)
        parts.append((flat * (c / flat.norm(dim=1)).clamp(max=1.0)[:, None]).sum(0))
    want = torch.cat(parts) / B
    result = make(model, PerLayerClipping(bounds)).privatize(x, y)
    torch.testing.assert_close(result.flat, want, rtol=1e-5, atol=1e-7)
    assert result.sensitivity == pytest.approx(math.sqrt(sum(c * c for c in bounds)))
    with pytest.raises(PrivacyConfigError, match="one bound per tensor"):
        make(model, PerLayerClipping((1.0, 2.0))).privatize(x, y)


def test_l2max_clipping_seed003(data):
    x, y = data
    model = tiny_cnn()
    grads = PerExampleGradients(model, F.cross_entropy)(x, y)
    norms = torch.stack([g.reshape(B, -1).norm(dim=1) for g in grads.values()])
    for clip in (1e3, 0.05):  # S = largest layer norm; S = C
        dp = make(model, L2MaxClipping(clip), sigma=6.0)
        result = dp.privatize(x, y)
        assert result.sensitivity == pytest.approx(min(clip, float(norms.max())), rel=1e-6)
        assert result.noise_std == pytest.approx(6.0 * result.sensitivity)
    empty = dp.privatize(x[:0], y[:0])
    assert empty.sensitivity == 0.05  # no data: S falls back to C


def test_normalization_with_per_example_momentum_is_algorithm1(data):
    """Seed000 Algorithm 1 written out with explicit per-slot momentum, β = 0.1, σ = 0.5."""
    x, y = data
    model = tiny_cnn()
    beta, sigma = 0.1, 0.5
    dp = make(model, Normalization(beta), sigma=sigma, seed=7)
    ref_gen = torch.Generator().manual_seed(7)
    g = per_example_matrix(model, x, y)
    slots = torch.zeros_like(g)  # φ_i^0 = 0 for each batch slot
    for _ in range(3):
        noise = torch.empty(g.shape[1]).normal_(0.0, sigma, generator=ref_gen)
        slots = (1 - beta) * g + beta * slots
        upload = ((slots / slots.norm(dim=1, keepdim=True)).sum(0) + noise) / B
        slots = upload.expand_as(slots).clone()  # φ_i^t[j] ← g_i^t for all j
        got = dp.privatize(x, y)
        torch.testing.assert_close(got.flat, upload, rtol=1e-4, atol=1e-6)
        assert got.sensitivity == 1.0
    dp.reset_momentum()
    torch.testing.assert_close(
        dp.privatize(x, y).flat * B - torch.empty(g.shape[1]).normal_(0, sigma, generator=ref_gen),
        (g / g.norm(dim=1, keepdim=True)).sum(0),
        rtol=1e-4,
        atol=1e-5,
    )


def test_noise_scale_statistical():
    """Empty batch: the release is pure noise N(0, (σC/B)²) per coordinate. With d = 3,025
    coordinates, the sample variance lies within ±5 standard errors of (σC/B)² (fixed
    seed), and the mean within ±5 standard errors of 0."""
    torch.manual_seed(0)
    model = nn.Linear(60, 50, bias=False)
    d = 3000
    sigma, clip = 1.3, 0.7
    result = make(model, FlatClipping(clip), sigma=sigma, seed=11).privatize(
        torch.zeros(0, 60), torch.zeros(0, dtype=torch.long)
    )
    assert result.batch_size == 0 and result.flat.shape == (d,)
    std = sigma * clip / B
    z = result.flat.double() / std
    assert abs(float(z.mean())) < 5 / math.sqrt(d)
    assert abs(float(z.var()) - 1.0) < 5 * math.sqrt(2 / d)
    # A larger statistic over 50 steps: the sum of squares is χ²(50·d).
    dp = make(model, FlatClipping(clip), sigma=sigma, seed=12)
    total = sum(
        float(
            (dp.privatize(torch.zeros(0, 60), torch.zeros(0, dtype=torch.long)).flat / std)
            .double()
            .square()
            .sum()
        )
        for _ in range(50)
    )
    n = 50 * d
    assert abs(total - n) < 5 * math.sqrt(2 * n)


def test_noise_is_reproducible_from_the_generator(data):
    x, y = data
    a = make(tiny_cnn(), FlatClipping(1.0), sigma=1.0, seed=5).privatize(x, y)
    b = make(tiny_cnn(), FlatClipping(1.0), sigma=1.0, seed=5).privatize(x, y)
    c = make(tiny_cnn(), FlatClipping(1.0), sigma=1.0, seed=6).privatize(x, y)
    assert torch.equal(a.flat, b.flat) and not torch.equal(a.flat, c.flat)


def test_empty_poisson_batches_release_noise_and_are_accounted():
    model = tiny_cnn()
    x_all, y_all = torch.randn(20, 1, 8, 8), torch.randint(0, 10, (20,))
    accountant = PrivacyAccountant()
    config = DPSGDConfig(FlatClipping(1.0), 1.0, expected_batch_size=0.2, sample_rate=0.01)
    gen = torch.Generator().manual_seed(0)
    dp = DPSGD(model, F.cross_entropy, config, generator=gen, accountant=accountant)
    sizes = []
    for _ in range(5):
        idx = poisson_sample(20, 0.01, gen)
        sizes.append(len(idx))
        result = dp.backward(x_all[idx], y_all[idx])
        assert torch.isfinite(result.flat).all() and result.flat.abs().sum() > 0
        assert model[0].weight.grad.shape == model[0].weight.shape
    assert 0 in sizes
    assert accountant.steps == 5 and len(accountant.history) == 1


def test_schedule_steps_the_accountant_with_sigma_t(data):
    x, y = data
    schedule = ExponentialSchedule(sigma0=2.0, rate=0.5, floor=1.0)
    accountant = PrivacyAccountant()
    dp = DPSGD(
        tiny_cnn(),
        F.cross_entropy,
        DPSGDConfig(FlatClipping(1.0), schedule, B, sample_rate=0.1),
        generator=torch.Generator().manual_seed(0),
        accountant=accountant,
    )
    for t in range(4):
        assert dp.privatize(x, y).noise_multiplier == schedule(t)
    dp.privatize(x, y, t=0)
    # σ_2 = σ_3 = floor: consecutive equal steps are merged
    history = [(e.noise_multiplier, e.steps) for e in accountant.history]
    assert history == [(2.0, 1), (schedule(1), 1), (1.0, 2), (2.0, 1)]


def test_write_grads_and_state_round_trip(data):
    x, y = data
    model = tiny_cnn()
    dp = make(model, Normalization(0.1), sigma=1.0)
    result = dp.backward(x, y)
    for p, v in zip(model.parameters(), result.views(), strict=True):
        assert p.grad is not None and p.grad.data_ptr() == v.data_ptr()
    state = copy.deepcopy(dp.state_dict())
    other = make(copy.deepcopy(model), Normalization(0.1), sigma=1.0)
    other.load_state_dict(state)
    dp.generator.manual_seed(9)
    other.generator.manual_seed(9)
    assert torch.equal(dp.privatize(x, y).flat, other.privatize(x, y).flat)


def test_configuration_errors():
    with pytest.raises(PrivacyConfigError, match="clipping mode"):
        DPSGDConfig(None, 1.0, 8)
    with pytest.raises(PrivacyConfigError, match="expected_batch_size"):
        DPSGDConfig(FlatClipping(1.0), 1.0, 0)
    with pytest.raises(PrivacyConfigError, match="noise_multiplier"):
        DPSGDConfig(FlatClipping(1.0), -1.0, 8)
    with pytest.raises(PrivacyConfigError):
        FlatClipping(0.0)
    with pytest.raises(PrivacyConfigError):
        Normalization(1.0)
    with pytest.raises(PrivacyConfigError, match="sample_rate"):
        DPSGD(
            nn.Linear(2, 2),
            F.cross_entropy,
            DPSGDConfig(FlatClipping(1.0), 1.0, 8),
            generator=torch.Generator(),
            accountant=PrivacyAccountant(),
        )
    with pytest.raises(PrivacyConfigError, match=r"torch\.Generator"):
        DPSGD(nn.Linear(2, 2), F.cross_entropy, DPSGDConfig(FlatClipping(1.0), 1.0, 8), generator=0)  # type: ignore[arg-type]
