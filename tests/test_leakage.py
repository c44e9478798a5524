"""Gradient leakage (seed003): attack network, leaked views, DLG/iDLG/CPL, metrics, trials."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from needs import needs

from sharefl.machine import torch_threads
from sharefl.privacy.per_example import per_example_gradients
from sharefl.simulator.leakage import (
    DEFAULT_SUCCESS_MSE,
    Defence,
    GradientLeakageError,
    LeakageSummary,
    LeakedGradient,
    StopReason,
    attack_succeeded,
    attack_success_rate,
    cpl_attack_network,
    infer_label,
    leaked_gradient,
    leaked_per_example_gradients,
    match_reconstructions,
    reconstruct,
    reconstruction_mse,
    run_leakage_trials,
    ssim,
    ssim_per_image,
)

SHAPE = (1, 16, 16)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: intra-op threads only add synchronisation (and stall on busy cores)."""
    with torch_threads(1):
        yield


def smooth_images(n: int, shape: tuple[int, int, int] = SHAPE, seed: int = 0) -> torch.Tensor:
    """``[n, *shape]`` smooth images in [0, 1] (a 4×4 random grid upsampled bilinearly)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, shape[0], 4, 4, generator=g)
    return F.interpolate(coarse, size=shape[1:], mode="bilinear", align_corners=True)


def one_example(label: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return smooth_images(1, seed=seed), torch.tensor([label])


def noisy_generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def grad_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters())))


def layer_norms(grads) -> list[float]:
    return [float(torch.linalg.vector_norm(g)) for g in grads]


# --- the attack network ---------------------------------------------------------------------


def test_attack_network_matches_the_authors_code():
    mnist = cpl_attack_network((1, 28, 28), 10, seed=1)
    assert mnist.fc.in_features == 588
    convs = [m for m in mnist.body if isinstance(m, torch.nn.Conv2d)]
    assert [c.stride[0] for c in convs] == [2, 2, 1, 1]
    assert all(c.kernel_size == (5, 5) and c.padding == (2, 2) for c in convs)
    assert all(c.out_channels == 12 for c in convs)
    assert sum(isinstance(m, torch.nn.Sigmoid) for m in mnist.body) == 4
    assert cpl_attack_network((3, 32, 32), 62).fc.in_features == 768
    for p in mnist.parameters():
        assert p.abs().max() <= 0.5 and p.std() > 0.2  # U(−0.5, 0.5): std ≈ 0.29
    assert mnist(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_attack_network_is_seeded():
    a, b, c = (cpl_attack_network(SHAPE, seed=s) for s in (7, 7, 8))
    for pa, pb, pc in zip(a.parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb) and not torch.equal(pa, pc)


@pytest.mark.parametrize("shape", [(1, 28), (0, 28, 28), (1, 28, 28.0)])
def test_attack_network_rejects_bad_shapes(shape):
    with pytest.raises(GradientLeakageError, match="input_shape"):
        cpl_attack_network(shape)


# --- what the adversary observes ------------------------------------------------------------


def test_undefended_views_are_the_plain_gradients():
    model = cpl_attack_network(SHAPE, seed=0, dtype=torch.float64)
    x, y = smooth_images(3).double(), torch.tensor([0, 4, 4])
    batch = leaked_gradient(model, x, y, defence="none", attack_type=0)
    for got, want in zip(batch.grads, grad_of(model, x, y), strict=True):
        torch.testing.assert_close(got, want)
    assert batch.batch_size == 3 and batch.noise_std == 0 and math.isnan(batch.sensitivity)
    views = leaked_per_example_gradients(model, x, y)
    for j, view in enumerate(views):
        assert view.batch_size == 1 and view.attack_type == 2
        for got, want in zip(view.grads, grad_of(model, x[j : j + 1], y[j : j + 1]), strict=True):
            torch.testing.assert_close(got, want)


def test_fed_sdp_clips_the_update_and_noises_where_the_paper_says():
    model = cpl_attack_network(SHAPE, seed=0, dtype=torch.float64)
    x, y = smooth_images(2).double(), torch.tensor([1, 2])
    raw = grad_of(model, x, y)
    clip = 0.1 * math.sqrt(sum(n**2 for n in layer_norms(raw)))  # forces clipping
    kwargs = dict(noise_multiplier=0.0, clip=clip)
    clipped = leaked_gradient(model, x, y, defence="fed_sdp", attack_type=0, **kwargs)
    total = math.sqrt(sum(n**2 for n in layer_norms(clipped.grads)))
    assert total == pytest.approx(clip)
    for got, want in zip(clipped.grads, raw, strict=True):
        torch.testing.assert_close(got, want * 0.1)
    # Server-side noise comes after a type-1 leak; client-side noise before it.
    server_type1 = leaked_gradient(model, x, y, defence="fed_sdp", attack_type=1, **kwargs)
    client_type1 = leaked_gradient(model, x, y, defence="fed_sdp_client", attack_type=1, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(server_type1.grads, raw, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(client_type1.grads, clipped.grads, strict=True))
    noisy = leaked_gradient(
        model, x, y, defence="fed_sdp", attack_type=0, noise_multiplier=6.0, clip=clip,
        generator=noisy_generator(),
    )  # fmt: skip
    assert noisy.noise_std == pytest.approx(6.0 * clip) and noisy.sensitivity == clip


def test_alpha_cdp_clips_every_layer_and_uses_the_l2_max_sensitivity():
    model = cpl_attack_network(SHAPE, seed=0, dtype=torch.float64)
    x, y = smooth_images(3).double(), torch.tensor([1, 2, 3])
    per_example = per_example_gradients(model, F.cross_entropy, x, y)
    raw_max = max(
        float(torch.linalg.vector_norm(g[j])) for g in per_example.values() for j in range(3)
    )
    for clip, sensitivity in ((0.05, 0.05), (1e3, raw_max)):
        views = leaked_per_example_gradients(
            model, x, y, defence="fed_alpha_cdp", noise_multiplier=0.0, clip=clip
        )
        for j, view in enumerate(views):
            assert view.sensitivity == pytest.approx(sensitivity)
            for got, (name, _) in zip(view.grads, model.named_parameters(), strict=True):
                raw = per_example[name][j]
                norm = float(torch.linalg.vector_norm(raw))
                torch.testing.assert_close(got, raw * min(1.0, clip / norm))
        update = leaked_gradient(
            model, x, y, defence="fed_alpha_cdp", attack_type=0, noise_multiplier=0.0, clip=clip
        )
        for got, *parts in zip(update.grads, *(v.grads for v in views), strict=True):
            torch.testing.assert_close(got, sum(parts) / 3)
    cdp = leaked_per_example_gradients(model, x, y, defence="fed_cdp", noise_multiplier=0, clip=1e3)
    assert cdp[0].sensitivity == 1e3  # Fed-CDP: S = C


@pytest.mark.parametrize("attack_type,batch", [(2, 1), (0, 4)])
def test_alpha_cdp_noise_has_the_documented_std(attack_type, batch):
    model = cpl_attack_network((1, 28, 28), seed=0)
    x = smooth_images(batch, (1, 28, 28))
    y = torch.arange(batch)
    sigma, clip = 6.0, 4.0
    kwargs = dict(defence="fed_alpha_cdp", attack_type=attack_type, clip=clip)
    clean = leaked_gradient(model, x, y, noise_multiplier=0.0, **kwargs)
    noisy = leaked_gradient(
        model, x, y, noise_multiplier=sigma, generator=noisy_generator(), **kwargs
    )
    noise = noisy.flat() - clean.flat()
    assert noisy.sensitivity == clean.sensitivity <= clip
    assert noisy.noise_std == pytest.approx(sigma * clean.sensitivity / batch)
    assert float(noise.std()) == pytest.approx(noisy.noise_std, rel=0.03)  # d ≈ 17,000
    again = leaked_gradient(
        model, x, y, noise_multiplier=sigma, generator=noisy_generator(), **kwargs
    )
    assert torch.equal(again.flat(), noisy.flat())


def test_noisy_views_need_a_generator_and_clean_ones_do_not():
    model = cpl_attack_network(SHAPE, seed=0)
    x, y = one_example()
    with pytest.raises(GradientLeakageError, match="generator"):
        leaked_gradient(model, x, y, defence="fed_alpha_cdp", noise_multiplier=6.0)
    leaked_gradient(model, x, y, defence="fed_alpha_cdp", noise_multiplier=0.0)
    leaked_gradient(model, x, y, defence="fed_sdp", attack_type=2, noise_multiplier=6.0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(defence="dp"), "unknown defence"),
        (dict(attack_type=3), "unknown attack type"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(clip=0.0), "clip"),
    ],
)
def test_leak_rejects_bad_arguments(kwargs, match):
    model = cpl_attack_network(SHAPE, seed=0)
    x, y = one_example()
    with pytest.raises(GradientLeakageError, match=match):
        leaked_gradient(model, x, y, **kwargs)


def test_type2_view_of_a_batch_is_refused():
    model = cpl_attack_network(SHAPE, seed=0)
    with pytest.raises(GradientLeakageError, match="leaked_per_example_gradients"):
        leaked_gradient(model, smooth_images(2), torch.tensor([1, 2]), attack_type=2)
    with pytest.raises(GradientLeakageError, match="int64"):
        leaked_gradient(model, smooth_images(1), torch.tensor([1], dtype=torch.int32))


# --- label inference and reconstruction -----------------------------------------------------


def test_idlg_label_inference_is_exact_for_single_examples():
    model = cpl_attack_network(SHAPE, seed=2)
    x = smooth_images(10, seed=5)
    for label in range(10):
        leaked = leaked_gradient(model, x[label : label + 1], torch.tensor([label]))
        assert infer_label(leaked) == label
        assert infer_label(list(leaked.grads)) == label


@pytest.mark.parametrize("method", ["cpl", "idlg", "dlg"])
def test_attacks_reconstruct_an_undefended_per_example_gradient(method):
    model = cpl_attack_network(SHAPE, seed=0)
    x, y = one_example(label=6)
    leaked = leaked_gradient(model, x, y, attack_type=2)
    result = reconstruct(
        model, leaked, method=method, input_shape=SHAPE, seed=1, reference=x, max_iterations=100
    )
    assert result.input.shape == (1, *SHAPE) and result.input.dtype == torch.float64
    assert result.label.tolist() == [6] and result.label_inferred
    assert result.stop_reason in (StopReason.CONVERGED, StopReason.STATIONARY)
    assert result.relative_distance < 1e-6
    mse = reconstruction_mse(result.image, x)
    assert mse < DEFAULT_SUCCESS_MSE / 100
    assert attack_succeeded(mse)
    assert ssim(result.image, x, window_size=7) > 0.99
    assert len(result.distance_history) == result.iterations == len(result.mse_history)
    assert result.first_success() is not None and result.first_success() <= result.iterations
    assert result.mse_history[-1] == pytest.approx(mse)


def test_cpl_initialisation_is_a_tiled_patch():
    model = cpl_attack_network(SHAPE, seed=0)
    leaked = leaked_gradient(model, *one_example())
    start = reconstruct(model, leaked, method="cpl", input_shape=SHAPE, max_iterations=1, seed=3)
    again = reconstruct(model, leaked, method="cpl", input_shape=SHAPE, max_iterations=1, seed=3)
    assert torch.equal(start.input, again.input)  # seeded
    from sharefl.simulator.leakage.attacks import Method, _initial_input

    seed = _initial_input(
        Method.CPL, 1, (3, 32, 32), torch.Generator().manual_seed(0), torch.float64
    )
    patch = seed[..., :16, :16]
    assert torch.equal(seed, patch.repeat(1, 1, 2, 2)) and seed.min() >= 0 and seed.max() <= 1


def test_batch_attack_with_known_labels():
    model = cpl_attack_network(SHAPE, seed=4)
    x, y = smooth_images(2, seed=9), torch.tensor([2, 7])
    leaked = leaked_gradient(model, x, y, attack_type=0)
    result = reconstruct(
        model, leaked, method="cpl", input_shape=SHAPE, label=y, reference=x, tolerance=1e-6
    )
    assert not result.label_inferred and result.label.tolist() == [2, 7]
    image = match_reconstructions(result.image, x)
    assert reconstruction_mse(image, x) < DEFAULT_SUCCESS_MSE


def test_alpha_cdp_noise_defeats_the_attack():
    model = cpl_attack_network(SHAPE, seed=0)
    x, y = one_example(label=6)
    leaked = leaked_gradient(
        model, x, y, defence=Defence.FED_ALPHA_CDP, attack_type=2, noise_multiplier=6.0, clip=4.0,
        generator=noisy_generator(1),
    )  # fmt: skip
    assert leaked.noise_std == pytest.approx(6.0 * leaked.sensitivity)
    result = reconstruct(
        model,
        leaked,
        method="cpl",
        input_shape=SHAPE,
        patience=5,
        min_improvement=1e-3,
        max_iterations=40,
        reference=x,
    )
    assert result.stop_reason in (StopReason.STALLED, StopReason.MAX_ITERATIONS)
    assert result.relative_distance > 0.5  # the noise cannot be matched
    mse = reconstruction_mse(result.image, x)
    assert mse > 10 * DEFAULT_SUCCESS_MSE and not attack_succeeded(mse)
    assert result.first_success() is None


def test_reconstruct_rejects_gradients_of_another_model():
    model = cpl_attack_network(SHAPE, seed=0)
    grads = list(leaked_gradient(model, *one_example()).grads)
    with pytest.raises(GradientLeakageError, match="got 9 gradients but the model has 10"):
        reconstruct(model, grads[:-1], input_shape=SHAPE)
    other = cpl_attack_network((1, 28, 28), seed=0)
    with pytest.raises(GradientLeakageError, match="parameter 8 of the model"):
        reconstruct(other, grads, input_shape=(1, 28, 28))
    with pytest.raises(GradientLeakageError, match="split it per parameter"):
        reconstruct(model, torch.cat([g.flatten() for g in grads]), input_shape=SHAPE)
    grads[0] = grads[0] * math.nan
    with pytest.raises(GradientLeakageError, match="finite"):
        reconstruct(model, grads, input_shape=SHAPE)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(method="gradinv"), "unknown attack method"),
        (dict(input_shape=(16, 16)), "input_shape"),
        (dict(input_shape=(3, 16, 16)), "does not accept inputs of shape"),
        (dict(label=[1, 2]), "2 labels for a gradient of 1"),
        (dict(label=10), r"\[0, 10\)"),
        (dict(num_classes=5), "5 but the last-layer weight gradient has 10 rows"),
        (dict(max_iterations=0), "max_iterations"),
        (dict(patience=0), "patience"),
        (dict(tolerance=-1.0), "tolerance"),
        (dict(reference=torch.zeros(1, 1, 8, 8)), "reference must have shape"),
    ],
)
def test_reconstruct_rejects_bad_arguments(kwargs, match):
    model = cpl_attack_network(SHAPE, seed=0)
    leaked = leaked_gradient(model, *one_example())
    arguments = dict(input_shape=SHAPE) | kwargs
    with pytest.raises(GradientLeakageError, match=match):
        reconstruct(model, leaked, **arguments)


@pytest.mark.parametrize("method", ["cpl", "idlg"])
def test_label_inference_refuses_batch_gradients(method):
    model = cpl_attack_network(SHAPE, seed=0)
    leaked = leaked_gradient(model, smooth_images(3), torch.tensor([1, 2, 3]), attack_type=0)
    with pytest.raises(GradientLeakageError, match="pass label="):
        reconstruct(model, leaked, method=method, input_shape=SHAPE)
    with pytest.raises(GradientLeakageError, match="one example's gradient"):
        infer_label(leaked)
    grads = list(leaked.grads)
    with pytest.raises(GradientLeakageError, match="averages 3 examples"):
        reconstruct(model, grads, method=method, input_shape=SHAPE, batch_size=3)


# --- metrics --------------------------------------------------------------------------------


def pattern_pair(c: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic test images (no RNG) for the scikit-image cross-check."""
    i = torch.arange(h, dtype=torch.float64).reshape(1, h, 1)
    j = torch.arange(w, dtype=torch.float64).reshape(1, 1, w)
    k = torch.arange(c, dtype=torch.float64).reshape(c, 1, 1)
    x = (torch.sin(0.3 * i + k) * torch.cos(0.2 * j - 0.5 * k) + 1) / 2
    y = (x + 0.15 * torch.sin(1.7 * i * j + 3 * k)).clamp(0, 1)
    return x, y


# skimage.metrics.structural_similarity(x, y, channel_axis=0, gaussian_weights=True,
# sigma=1.5, use_sample_covariance=False, data_range=1.0), scikit-image 0.26.0; the
# authors' pytorch_msssim.ssim gives the same values to 4e-7 (it computes in float32).
SKIMAGE_SSIM = {
    (1, 28, 28): 0.7022883930899149,
    (3, 32, 32): 0.7173865377606526,
    (1, 16, 20): 0.6916758461924595,
}


@pytest.mark.parametrize("shape", list(SKIMAGE_SSIM))
def test_ssim_matches_scikit_image(shape):
    x, y = pattern_pair(*shape)
    assert ssim(x, y) == pytest.approx(SKIMAGE_SSIM[shape], abs=1e-12)


def test_ssim_matches_scikit_image_live_when_installed():
    metrics = needs("skimage.metrics")
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 24, 24, generator=g, dtype=torch.float64)
    y = (x + 0.2 * torch.randn(3, 24, 24, generator=g, dtype=torch.float64)).clamp(0, 1)
    want = metrics.structural_similarity(
        x.numpy(), y.numpy(), channel_axis=0, gaussian_weights=True, sigma=1.5,
        use_sample_covariance=False, data_range=1.0,
    )  # fmt: skip
    assert ssim(x, y) == pytest.approx(want, abs=1e-12)


def test_ssim_properties():
    x = smooth_images(4, (3, 20, 20), seed=1).double()
    g = torch.Generator().manual_seed(0)
    assert ssim(x, x) == pytest.approx(1.0, abs=1e-12)
    y = (x + 0.1 * torch.randn(x.shape, generator=g, dtype=torch.float64)).clamp(0, 1)
    assert ssim(x, y) == pytest.approx(ssim(y, x), abs=1e-12)
    levels = [
        ssim(x, (x + s * torch.randn(x.shape, generator=g, dtype=torch.float64)).clamp(0, 1))
        for s in (0.02, 0.1, 0.4)
    ]
    assert 1 > levels[0] > levels[1] > levels[2]
    per_image = ssim_per_image(x, y)
    assert per_image.shape == (4,) and ssim(x, y) == pytest.approx(float(per_image.mean()))
    channels = [ssim(x[:, c : c + 1], y[:, c : c + 1]) for c in range(3)]
    assert ssim(x, y) == pytest.approx(sum(channels) / 3)
    assert ssim(x[0], y[0]) == pytest.approx(float(per_image[0]))
    assert -1 <= ssim(x, 1 - x) < 0.5


@pytest.mark.parametrize(
    "a,b,kwargs,match",
    [
        (torch.zeros(1, 8, 8), torch.zeros(1, 8, 8), {}, "smaller than the 11×11"),
        (torch.zeros(1, 16, 16), torch.zeros(1, 16, 15), {}, "differ in shape"),
        (torch.zeros(16, 16), torch.zeros(16, 16), {}, r"\[C, H, W\]"),
        (torch.full((1, 16, 16), math.inf), torch.zeros(1, 16, 16), {}, "non-finite"),
        (torch.zeros(1, 16, 16), torch.zeros(1, 16, 16), {"window_size": 4}, "odd"),
        (torch.zeros(1, 16, 16), torch.zeros(1, 16, 16), {"data_range": 0}, "data_range"),
    ],
)
def test_ssim_rejects_bad_inputs(a, b, kwargs, match):
    with pytest.raises(GradientLeakageError, match=match):
        ssim(a, b, **kwargs)


def test_mse_and_success():
    x = torch.zeros(2, 1, 4, 4)
    y = torch.full((2, 1, 4, 4), 0.1)
    assert reconstruction_mse(y, x) == pytest.approx(0.01)  # no square root
    assert reconstruction_mse(y[0], x[0]) == pytest.approx(0.01)
    assert attack_succeeded(0.01) and not attack_succeeded(0.0100001)
    assert attack_succeeded(0.05, threshold=0.1)
    assert attack_success_rate([0.0, 0.5, 0.001, 1.0]) == 0.5
    with pytest.raises(GradientLeakageError, match="at least one trial"):
        attack_success_rate([])
    with pytest.raises(GradientLeakageError, match="positive MSE"):
        attack_succeeded(0.1, threshold=0.0)
    with pytest.raises(GradientLeakageError, match="differ in shape"):
        reconstruction_mse(x, x[:1])
    with pytest.raises(GradientLeakageError, match="floating-point"):
        reconstruction_mse(torch.zeros(1, 4, 4, dtype=torch.int64), torch.zeros(1, 4, 4))


def test_match_reconstructions_undoes_a_permutation():
    x = smooth_images(4, seed=3)
    shuffled = x[torch.tensor([2, 0, 3, 1])]
    assert torch.equal(match_reconstructions(shuffled, x), x)
    assert torch.equal(match_reconstructions(x[:1], x[:1]), x[:1])


# --- trials ---------------------------------------------------------------------------------


def test_trials_summarise_and_combine():
    inputs, targets = smooth_images(6, seed=11), torch.tensor([0, 1, 2, 3, 4, 5])
    kwargs = dict(defence="none", attack_type=2, max_iterations=60, tolerance=1e-6, seed=2)
    whole = run_leakage_trials(inputs, targets, trials=2, **kwargs)
    assert whole.asr == 1.0 and not whole.resilient and whole.label_accuracy == 1.0
    assert whole.mean_mse < DEFAULT_SUCCESS_MSE and whole.mean_ssim > 0.95
    assert 1 <= whole.mean_tau <= whole.mean_iterations <= 60
    parts = [run_leakage_trials(inputs, targets, trials=1, first_trial=i, **kwargs) for i in (1, 0)]
    combined = LeakageSummary.combine(parts)
    assert combined == whole
    summary = whole.as_dict(include_trials=True)
    assert summary["asr"] == 1.0 and len(summary["per_trial"]) == 2
    assert {t.indices[0] for t in whole.trials} <= set(range(6))


def test_trials_under_alpha_cdp_report_tau_300():
    inputs, targets = smooth_images(2, seed=11), torch.tensor([0, 1])
    summary = run_leakage_trials(
        inputs,
        targets,
        defence="fed_alpha_cdp",
        attack_type=2,
        trials=1,
        patience=3,
        min_improvement=1e-3,
        seed=0,
    )
    assert summary.resilient and summary.asr == 0.0 and summary.mean_tau == 300
    assert summary.trials[0].iterations < 300 and summary.trials[0].stop_reason == "stalled"
    assert summary.mean_mse > 10 * DEFAULT_SUCCESS_MSE


def test_trials_reject_bad_arguments():
    inputs, targets = smooth_images(4), torch.tensor([0, 1, 2, 3])
    with pytest.raises(GradientLeakageError, match="need 6 examples but the dataset has 4"):
        run_leakage_trials(inputs, targets, trials=3, batch_size=2, attack_type=0)
    with pytest.raises(GradientLeakageError, match="num_classes"):
        run_leakage_trials(inputs, targets, num_classes=3, trials=1)
    with pytest.raises(GradientLeakageError, match="pass label="):
        run_leakage_trials(inputs, targets, trials=1, batch_size=2, attack_type=0)
    with pytest.raises(GradientLeakageError, match="different cells"):
        a = run_leakage_trials(inputs, targets, trials=1, max_iterations=1)
        b = run_leakage_trials(inputs, targets, trials=1, max_iterations=2)
        LeakageSummary.combine([a, b])


def test_leaked_gradient_flat_and_norm():
    grads = (torch.ones(2, 2), torch.full((3,), 2.0))
    leaked = LeakedGradient(grads, 1, 2, Defence.NONE)
    assert leaked.flat().tolist() == [1, 1, 1, 1, 2, 2, 2]
    assert leaked.squared_norm() == 16.0
