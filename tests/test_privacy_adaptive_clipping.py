"""Adaptive clipping (sharefl.privacy.adaptive_clipping) against the published behaviour of
quantile clipping (Andrew et al., NeurIPS 2021) and AdaClip (Pichapati et al., 2019)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from sharefl.privacy.adaptive_clipping import (
    AdaClip,
    QuantileClipping,
    QuantileState,
    joint_noise_multiplier,
    update_noise_multiplier,
)
from sharefl.privacy.calibration import compute_epsilon
from sharefl.privacy.errors import PrivacyConfigError

# -- quantile clipping -------------------------------------------------------------------------


def _run_estimator(mode: QuantileClipping, norms: torch.Tensor, rounds: int, per_round: int):
    """The bound after ``rounds`` updates, each from ``per_round`` norms drawn from
    ``norms`` (a fixed distribution), through the same calls as the simulator."""
    state = QuantileState(mode.initial_norm)
    generator = torch.Generator().manual_seed(0)
    for _ in range(rounds):
        pick = torch.randint(len(norms), (per_round,), generator=generator)
        drawn = norms[pick]
        count = mode.centred_bits(drawn, torch.tensor(state.norm, dtype=drawn.dtype)).sum()
        counts = mode.noisy_counts_(count.reshape(1), generator)
        state.add(float(counts.sum()), per_round)
        state.update(mode)
    return state.norm


@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("start", [0.1, 40.0])
def test_without_noise_the_bound_converges_to_the_target_quantile(gamma, start):
    # A fixed log-normal distribution of norms (median e^1 ≈ 2.7); the geometric update
    # C ← C·exp(−η(b̄ − γ)) has its fixed point where the unclipped fraction b̄ equals γ.
    norms = torch.from_numpy(np.random.default_rng(1).lognormal(1.0, 0.7, 20_000))
    mode = QuantileClipping(initial_norm=start, count_std=0.0, target_quantile=gamma)
    final = _run_estimator(mode, norms, rounds=400, per_round=2000)
    target = float(np.quantile(norms.numpy(), gamma))
    assert final == pytest.approx(target, rel=0.05)
    assert float((norms <= final).double().mean()) == pytest.approx(gamma, abs=0.02)


def test_the_bound_moves_geometrically_by_at_most_a_factor_exp_eta_gamma_per_update():
    mode = QuantileClipping(initial_norm=1.0, count_std=0.0, target_quantile=0.5)
    state = QuantileState(1.0)
    state.add(-0.5 * 10, 10)  # every contribution clipped: b̄ = 0, C grows by e^(0.2·0.5)
    assert state.update(mode) == 0.0
    assert state.norm == pytest.approx(math.exp(0.1))
    state.add(0.5 * 10, 10)  # none clipped: b̄ = 1, C shrinks by e^(−0.2·0.5)
    assert state.update(mode) == 1.0
    assert state.norm == pytest.approx(1.0)
    # noise can push the centred count past ±m/2: b̄ is clamped to [0, 1] (post-processing)
    state.add(30.0, 10)
    assert state.update(mode) == 1.0
    assert state.norm == pytest.approx(math.exp(-0.1))
    assert math.isnan(state.update(mode)) and state.norm == pytest.approx(math.exp(-0.1))


def test_with_the_papers_count_noise_the_bound_still_finds_the_quantile():
    # Andrew et al.: σ_b = m/20, so the noised fraction has std 0.05 around the truth; the
    # bound then hovers around the quantile (the noise averages out over the updates)
    norms = torch.from_numpy(np.random.default_rng(2).lognormal(0.0, 0.5, 20_000))
    m = 1000
    mode = QuantileClipping(initial_norm=0.1, count_std=m / 20, target_quantile=0.5)
    state = QuantileState(mode.initial_norm)
    generator = torch.Generator().manual_seed(3)
    fractions, bounds = [], []
    for _ in range(600):
        drawn = norms[torch.randint(len(norms), (m,), generator=generator)]
        truth = float((drawn <= state.norm).double().mean())
        count = mode.centred_bits(drawn, torch.tensor(state.norm, dtype=drawn.dtype)).sum()
        state.add(float(mode.noisy_counts_(count.reshape(1), generator)[0]), m)
        fractions.append(state.fraction() - truth)
        state.update(mode)
        bounds.append(state.norm)
    assert float(np.std(fractions[100:])) == pytest.approx(0.05, rel=0.15)
    median = float(np.median(norms.numpy()))
    assert float(np.mean(bounds[200:])) == pytest.approx(median, rel=0.05)


def test_update_noise_multiplier_is_andrew_et_al_theorem_1():
    # σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2)
    assert update_noise_multiplier(6.0, 5.0) == pytest.approx(7.5)  # (1/36 − 1/100)^(−1/2)
    assert update_noise_multiplier(1.0, 5.0) == pytest.approx(1 / math.sqrt(0.99))
    assert update_noise_multiplier(0.5, 11.18) == pytest.approx(0.500125, abs=1e-6)
    assert update_noise_multiplier(6.0, 11.18) == pytest.approx(6.229, abs=1e-3)
    assert update_noise_multiplier(0.0, 0.0) == 0.0  # no privacy, no noise
    for sigma, count_std in [(6.0, 5.0), (1.0, 0.6), (2.0, 100.0)]:
        sigma_update = update_noise_multiplier(sigma, count_std)
        assert sigma_update > sigma  # the update pays for the count
        assert joint_noise_multiplier(sigma_update, count_std) == pytest.approx(sigma)
    with pytest.raises(PrivacyConfigError, match="count_std"):
        update_noise_multiplier(6.0, 3.0)  # 2σ_b = σ: the count spends the whole budget
    with pytest.raises(PrivacyConfigError):
        QuantileClipping(initial_norm=1.0, count_std=1.0, target_quantile=1.5)


def test_the_release_is_one_gaussian_mechanism_of_noise_multiplier_sigma():
    # Adding or removing one contribution g moves the clipped sum by clip_C(g) (norm ≤ C)
    # and the centred count by ±½. Scaled by the noise stds (σ_Δ C, σ_b) the shift has
    # norm √(‖clip_C(g)‖²/(σ_Δ C)² + 1/(4σ_b²)) ≤ 1/σ, with equality when ‖g‖ ≥ C: the pair
    # is never more distinguishable than a Gaussian mechanism with multiplier σ, and is
    # exactly as distinguishable for a clipped contribution.
    sigma, count_std, bound = 6.0, 11.18, 4.0
    mode = QuantileClipping(initial_norm=bound, count_std=count_std)
    sigma_update = mode.update_sigma(sigma)
    for norm in [0.0, 1.0, 3.99, 4.0, 5.0, 100.0]:
        norms = torch.tensor([norm], dtype=torch.float64)
        limit = torch.tensor(bound, dtype=torch.float64)
        clipped = norm * float(mode.factors(norms, limit)[0])
        count = abs(float(mode.centred_bits(norms, limit)[0]))
        assert count == 0.5
        shift = math.hypot(clipped / (sigma_update * bound), count / count_std)
        assert shift <= 1 / sigma + 1e-12
        if norm >= bound:
            assert shift == pytest.approx(1 / sigma, rel=1e-12)


def test_accounting_at_sigma_composes_to_the_fixed_bound_epsilon():
    # The accountant composes (σ, q) per release: ε after T releases is DP-SGD's at σ, the
    # same for every C, and larger than the (unsound) ε of the update's own σ_Δ.
    sigma, count_std, q, delta = 6.0, 11.18, 0.01, 1e-5
    sigma_update = update_noise_multiplier(sigma, count_std)
    for steps, expected in [(10_000, 0.823), (1_000, 0.276)]:  # seed003's Table VI figures
        eps = compute_epsilon(sigma, delta, q, steps, "rdp", conversion="classic")
        assert eps == pytest.approx(expected, abs=5e-4)
        naive = compute_epsilon(sigma_update, delta, q, steps, "rdp", conversion="classic")
        assert naive < eps


# -- AdaClip -----------------------------------------------------------------------------------


def _adaclip_step(mode, state, grads, sigma, generator):
    """One AdaClip release from per-example gradients ``grads`` ``[B, d]`` (one client)."""
    scale = mode.scale(state.variance)
    w = (grads - state.mean) / scale
    factors = (mode.max_norm / torch.linalg.vector_norm(w, dim=1).clamp_min(1e-30)).clamp_max(1)
    summed = (factors[:, None] * w).sum(0, keepdim=True)
    return mode.release(summed, state, scale, sigma, float(len(grads)), generator), factors


def test_constant_gradients_the_mean_estimate_converges_and_the_release_becomes_exact():
    mode = AdaClip()
    d, B = 50, 8
    g = torch.linspace(-0.3, 0.5, d, dtype=torch.float64)
    state = mode.initial_state(1, d, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    errors = []
    for _ in range(3000):
        released, _ = _adaclip_step(mode, state, g.expand(B, d), 0.0, generator)
        errors.append(float(torch.linalg.vector_norm(state.mean[0] - g)))
    assert errors[-1] < 1e-6 * float(torch.linalg.vector_norm(g))
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(errors))  # monotone
    torch.testing.assert_close(released[0], g)  # w = 0 once m = g: nothing is clipped
    # no spread: every variance estimate sits at its floor h₁
    torch.testing.assert_close(state.variance, torch.full_like(state.variance, mode.h1))


def test_every_transformed_contribution_has_norm_at_most_c():
    mode = AdaClip(max_norm=1.0)
    generator = torch.Generator().manual_seed(1)
    state = mode.initial_state(1, 30)
    state.variance.uniform_(mode.h1, mode.h2, generator=generator)
    state.mean.normal_(0.0, 0.01, generator=generator)
    grads = torch.randn(200, 30, generator=generator) * torch.logspace(-3, 1, 200)[:, None]
    scale = mode.scale(state.variance)
    w = (grads - state.mean) / scale
    norms = torch.linalg.vector_norm(w, dim=1)
    factors = (mode.max_norm / norms).clamp_max(1)
    assert float((factors * norms).max()) <= mode.max_norm * (1 + 1e-6)
    assert bool((factors < 1).any()) and bool((factors == 1).any())  # both kinds occur


def test_the_scale_makes_gradients_that_match_the_estimates_of_norm_one_at_least_noise():
    # b_i² = s_i Σ_j s_j (s = √v): E‖(g − m)/b‖² = Σ v_i / b_i² = 1 for g ~ N(m, diag v), and
    # the noise it adds, Σ b_i², is (Σ s_i)² ≤ d Σ v_i, what one common scale would need
    generator = torch.Generator().manual_seed(2)
    d = 400
    variance = torch.logspace(-5, -2, d, dtype=torch.float64)
    scale = AdaClip.scale(variance[None])[0]
    g = torch.randn(20_000, d, generator=generator, dtype=torch.float64) * variance.sqrt()
    assert float((g / scale).square().sum(1).mean()) == pytest.approx(1.0, rel=0.01)
    assert float(scale.square().sum()) == pytest.approx(float(variance.sqrt().sum() ** 2))
    assert float(scale.square().sum()) < d * float(variance.sum())


def test_with_a_uniform_scale_and_no_mean_adaclip_is_flat_clipping_at_c_times_b():
    # m = 0, b = c everywhere: g̃ = c (Σ clip_C(g/c) + σC z)/B = (Σ clip_{cC}(g) + σ cC z)/B,
    # flat DP-SGD with bound cC and the same noise multiplier
    mode = AdaClip(max_norm=2.0)
    d, B = 16, 6
    state = mode.initial_state(1, d, dtype=torch.float64)
    state.variance.fill_(0.09)  # s = 0.3, b = √0.3·√(16·0.3) = 1.2 in every coordinate
    c = math.sqrt(0.3) * math.sqrt(d * 0.3)
    generator = torch.Generator().manual_seed(3)
    grads = torch.randn(B, d, generator=generator, dtype=torch.float64) * 2
    released, _ = _adaclip_step(mode, state, grads, 0.0, generator)
    bound = c * mode.max_norm
    norms = torch.linalg.vector_norm(grads, dim=1, keepdim=True)
    flat = (grads * (bound / norms).clamp_max(1)).sum(0) / B
    torch.testing.assert_close(released[0], flat)


def test_the_noise_on_the_release_is_b_sigma_c_over_b_per_coordinate():
    mode = AdaClip(max_norm=1.5)
    d, B, sigma, rows = 2000, 5, 3.0, 40
    generator = torch.Generator().manual_seed(4)
    state = mode.initial_state(rows, d, dtype=torch.float64)
    state.variance.uniform_(mode.h1, mode.h2, generator=generator)
    scale = mode.scale(state.variance)
    mean = state.mean.clone()
    released = mode.release(
        torch.zeros(rows, d, dtype=torch.float64), state, scale, sigma, B, generator
    )
    expected = mode.noise_std(sigma, scale, B)  # b σ C / B
    torch.testing.assert_close(expected, scale * sigma * 1.5 / B)
    z = (released - mean) / expected  # standardised noise
    assert float(z.mean()) == pytest.approx(0.0, abs=0.01)
    assert float(z.std()) == pytest.approx(1.0, rel=0.01)


def test_the_variance_update_subtracts_the_noise_it_added():
    # pure noise around the mean: (g̃ − m)² − b²σ²C²/B² averages to 0, so the estimates
    # drift down to h₁ instead of learning the noise's variance
    mode = AdaClip(h1=1e-8, h2=1.0)
    d, B, sigma = 500, 5, 2.0
    generator = torch.Generator().manual_seed(5)
    state = mode.initial_state(1, d, dtype=torch.float64)
    state.variance.fill_(1e-3)
    scale = mode.scale(state.variance)
    deviations = []
    for _ in range(50):
        before = state.variance.clone()
        mean = state.mean.clone()
        released = mode.release(
            torch.zeros(1, d, dtype=torch.float64), state, scale, sigma, B, generator
        )
        raw = (released - mean).square() - mode.noise_std(sigma, scale, B).square()
        deviations.append(float(raw.mean() / mode.noise_std(sigma, scale, B).square().mean()))
        expected = mode.beta2 * before + (1 - mode.beta2) * raw.clamp(mode.h1, mode.h2)
        torch.testing.assert_close(state.variance, expected)
    assert float(np.mean(deviations)) == pytest.approx(0.0, abs=0.05)


def test_adaclip_rejects_bad_hyper_parameters():
    with pytest.raises(PrivacyConfigError, match="beta1"):
        AdaClip(beta1=1.0)
    with pytest.raises(PrivacyConfigError, match="h1"):
        AdaClip(h1=1.0, h2=0.1)
    with pytest.raises(PrivacyConfigError, match="max_norm"):
        AdaClip(max_norm=0.0)
    assert AdaClip().v0 == pytest.approx(math.sqrt(1e-5 * 1e-3))
