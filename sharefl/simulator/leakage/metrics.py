"""Reconstruction quality and attack success (Fed-αCDP §3.2, Tables I and III).

* :func:`reconstruction_mse` — Fed-αCDP's "RMSE"/ReconDist, which the paper writes as
  (1/U)Σ(x − x_rec)² over the U features: a mean squared error, *without* a square root.
* :func:`ssim` — structural similarity (Wang et al. 2004) with the standard Gaussian window
  (11×11, σ = 1.5), K1 = 0.01, K2 = 0.03 and population (co)variances, computed over the
  valid positions only (no padding), per channel, then averaged over channels and images.
  These are the defaults of ``pytorch_msssim.ssim`` (the authors' code) and of
  ``skimage.metrics.structural_similarity(gaussian_weights=True, sigma=1.5,
  use_sample_covariance=False)``.
* :func:`attack_succeeded` / :func:`attack_success_rate` — success means MSE ≤ a threshold.

The success criterion. The paper counts an attack as successful when the reconstruction is
"visually indistinguishable" from the original and gives no number. We use MSE ≤
:data:`DEFAULT_SUCCESS_MSE` = 0.01 on images in [0, 1], i.e. a root-mean-square pixel error
of at most 10% of the range (PSNR ≥ 20 dB). For scale: on MNIST an all-black image scores
≈ 0.11 against the digit (the mean of x² over the test set) and a U(0, 1) image ≈ 0.32,
while CPL on undefended gradients reaches 1e-3 or less and on Fed-αCDP-noised gradients
stays near 0.5, so the verdict does not hinge on the exact value in that gap. Looking at
batch reconstructions of MNIST digits: at MSE ≈ 0.03 they are legible but visibly noisy
(SSIM ≈ 0.66), at ≈ 0.007 nearly indistinguishable from the originals (SSIM ≈ 0.78), at
≈ 0.002 indistinguishable (SSIM ≈ 0.89); 0.01 therefore approximates the paper's
"visually indistinguishable" on the strict side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .errors import GradientLeakageError

#: Default success threshold on the reconstruction MSE of images in [0, 1].
DEFAULT_SUCCESS_MSE = 0.01


def _as_images(name: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise GradientLeakageError(
            f"{name} must be an image [C, H, W] or a batch [N, C, H, W], got {got}"
        )
    if not x.is_floating_point():
        raise GradientLeakageError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise GradientLeakageError(
            f"{name} has non-finite values: clamp a reconstruction to the pixel range first "
            "(Reconstruction.image)"
        )
    return x.unsqueeze(0) if x.dim() == 3 else x


def _pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _as_images("reconstruction", a), _as_images("original", b)
    if x.shape != y.shape:
        raise GradientLeakageError(
            f"reconstruction and original differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}"
        )
    return x.double(), y.to(device=x.device).double()


def reconstruction_mse(reconstruction: torch.Tensor, original: torch.Tensor) -> float:
    """Mean over all features (and images) of (reconstruction − original)²: Fed-αCDP's
    ReconDist ("RMSE" in the paper, but without a square root).

    Args:
        reconstruction, original: ``[C, H, W]`` or ``[N, C, H, W]`` of the same shape.

    Raises:
        GradientLeakageError: shapes differ, not images, not floating point, or non-finite values.
    """
    x, y = _pair(reconstruction, original)
    return float(((x - y) ** 2).mean())


def match_reconstructions(reconstruction: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """``reconstruction`` (``[N, ...]``) reordered so that its i-th image is the one assigned
    to ``original[i]`` by a minimum-total-MSE matching (the order of a batch attack's dummies
    is arbitrary). Identity for N = 1.

    Raises:
        GradientLeakageError: as :func:`reconstruction_mse`.
    """
    x, y = _pair(reconstruction, original)
    if x.shape[0] == 1:
        return reconstruction.reshape(x.shape)
    from scipy.optimize import linear_sum_assignment

    cost = ((y.unsqueeze(1) - x.unsqueeze(0)) ** 2).flatten(2).mean(-1)  # [orig, rec]
    rows, cols = linear_sum_assignment(cost.cpu().numpy())
    order = torch.as_tensor(cols[rows.argsort()], device=reconstruction.device)
    return reconstruction.reshape(x.shape)[order]


def gaussian_window(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """The normalised 1-D Gaussian ``[size]`` (float64) of the SSIM window."""
    if not (isinstance(size, int) and size >= 1 and size % 2 == 1):
        raise GradientLeakageError(f"window_size must be an odd int ≥ 1, got {size!r}")
    if not (math.isfinite(sigma) and sigma > 0):
        raise GradientLeakageError(f"sigma must be a positive finite number, got {sigma!r}")
    coords = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    return g / g.sum()


def _filter(x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Separable 'valid' Gaussian filtering of ``[N, C, H, W]`` per channel."""
    channels = x.shape[1]
    k = window.to(x.device)
    horizontal = k.reshape(1, 1, 1, -1).repeat(channels, 1, 1, 1)
    vertical = k.reshape(1, 1, -1, 1).repeat(channels, 1, 1, 1)
    return F.conv2d(F.conv2d(x, horizontal, groups=channels), vertical, groups=channels)


def ssim_per_image(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    data_range: float = 1.0,
    window_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> torch.Tensor:
    """``[N]`` float64 SSIM of each image pair (mean over channels of the mean SSIM map).

    Raises:
        GradientLeakageError: as :func:`ssim`.
    """
    x, y = _pair(a, b)
    if not (math.isfinite(data_range) and data_range > 0):
        raise GradientLeakageError(
            f"data_range must be a positive finite number, got {data_range!r}"
        )
    window = gaussian_window(window_size, sigma)
    if min(x.shape[-2:]) < window_size:
        raise GradientLeakageError(
            f"images of {x.shape[-2]}×{x.shape[-1]} are smaller than the {window_size}×"
            f"{window_size} SSIM window: pass a smaller odd window_size"
        )
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    mu_x, mu_y = _filter(x, window), _filter(y, window)
    var_x = _filter(x * x, window) - mu_x**2
    var_y = _filter(y * y, window) - mu_y**2
    cov = _filter(x * y, window) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / (
        (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
    )
    return ssim_map.mean(dim=(-2, -1)).mean(dim=1)


def ssim(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    data_range: float = 1.0,
    window_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
) -> float:
    """Mean SSIM of ``a`` and ``b`` (``[C, H, W]`` or ``[N, C, H, W]``, same shape), in
    [−1, 1]; 1 iff the images are equal. Symmetric in ``a`` and ``b``.

    Args:
        data_range: the span of pixel values (1 for images in [0, 1]).
        window_size: side of the Gaussian window (odd, ≤ H and W).
        sigma: the window's standard deviation in pixels.
        k1, k2: the stabilising constants; C1 = (k1·data_range)², C2 = (k2·data_range)².

    Raises:
        GradientLeakageError: shapes differ, images smaller than the window, non-finite values,
            or bad parameters.
    """
    values = ssim_per_image(
        a, b, data_range=data_range, window_size=window_size, sigma=sigma, k1=k1, k2=k2
    )
    return float(values.mean())


def _check_threshold(threshold: float) -> float:
    value = float(threshold)
    if not (math.isfinite(value) and value > 0):
        raise GradientLeakageError(
            f"the success threshold must be a positive MSE, got {threshold!r}"
        )
    return value


def attack_succeeded(mse: float, threshold: float = DEFAULT_SUCCESS_MSE) -> bool:
    """True iff the reconstruction MSE is at most ``threshold`` (a NaN MSE is a failure)."""
    return bool(float(mse) <= _check_threshold(threshold))


def attack_success_rate(mses: Iterable[float], threshold: float = DEFAULT_SUCCESS_MSE) -> float:
    """ASR: the fraction of trials whose reconstruction MSE is at most ``threshold``.

    Raises:
        GradientLeakageError: no trial, or a bad threshold.
    """
    values = [float(m) for m in mses]
    if not values:
        raise GradientLeakageError("attack_success_rate needs at least one trial")
    return sum(attack_succeeded(m, threshold) for m in values) / len(values)
