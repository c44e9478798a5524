"""Gaussian noise drawn from an explicit :class:`torch.Generator`, written in place.

Nothing here uses the global RNG: a run is reproducible from the generator's seed. The
generator must live on the device of the tensor it fills (``torch.Generator("cuda")`` for a
CUDA tensor); a mismatch raises :class:`PrivacyConfigError` instead of torch's opaque error.
A :class:`~sharefl.privacy.secure_noise.SecureGenerator` (a deployment client's) makes
every function here draw from its AES-256-CTR stream instead of torch's Mersenne Twister.
"""

from __future__ import annotations

import math

import torch

from .errors import PrivacyConfigError
from .secure_noise import SecureGenerator


def check_generator(generator: torch.Generator, device: torch.device) -> None:
    """Raise :class:`PrivacyConfigError` unless ``generator`` can draw on ``device``."""
    if not isinstance(generator, torch.Generator):
        raise PrivacyConfigError(
            f"pass an explicit torch.Generator (got {type(generator).__name__}): DP noise must "
            "be reproducible from a seed and never come from the global RNG"
        )
    gen_device = generator.device
    if gen_device.type != device.type or (
        gen_device.index is not None
        and device.index is not None
        and gen_device.index != device.index
    ):
        raise PrivacyConfigError(
            f"the generator is on {gen_device} but the tensors are on {device}: create it with "
            f"torch.Generator(device={str(device)!r})"
        )


def check_std(std: float) -> float:
    """``std`` as a float, or :class:`PrivacyConfigError` if it is negative or not finite."""
    value = float(std)
    if not (math.isfinite(value) and value >= 0):
        raise PrivacyConfigError(f"noise standard deviation must be finite and ≥ 0, got {std!r}")
    return value


def gaussian_(out: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Fill ``out`` with i.i.d. N(0, std²) samples (zeros when std = 0); return ``out``."""
    std = check_std(std)
    check_generator(generator, out.device)
    if std == 0.0:
        return out.zero_()
    if isinstance(generator, SecureGenerator):
        return generator.gaussian.fill_(out, std)
    return out.normal_(0.0, std, generator=generator)


def standard_normal(
    shape: tuple[int, ...] | torch.Size,
    generator: torch.Generator,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """A new tensor of ``shape`` of i.i.d. N(0, 1) samples on ``device`` (default: the
    generator's) in ``dtype`` (default: torch's default dtype): ``torch.randn`` with
    ``generator``, or its secure stream when it is a
    :class:`~sharefl.privacy.secure_noise.SecureGenerator`."""
    out = torch.empty(shape, device=generator.device if device is None else device, dtype=dtype)
    return gaussian_(out, 1.0, generator)


def add_gaussian_noise_(
    x: torch.Tensor,
    std: float,
    generator: torch.Generator,
    *,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """x += N(0, std² I) in place; return ``x``.

    Args:
        x: floating tensor, modified in place.
        std: standard deviation of every coordinate's noise (≥ 0; 0 leaves ``x`` unchanged
            and draws nothing).
        generator: on ``x``'s device.
        scratch: optional tensor of ``x``'s shape, dtype and device that receives the noise
            before it is added (pass one to avoid allocating a temporary on every call).
    """
    std = check_std(std)
    if std == 0.0:
        return x
    if scratch is None:
        scratch = torch.empty_like(x)
    elif scratch.shape != x.shape or scratch.dtype != x.dtype or scratch.device != x.device:
        raise PrivacyConfigError("scratch must have the shape, dtype and device of x")
    return x.add_(gaussian_(scratch, std, generator))
