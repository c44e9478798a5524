"""Gaussian DP noise from a cryptographically secure stream (Opacus's ``secure_mode``).

Noise that protects privacy must be unpredictable to the server: torch's Mersenne
Twister, even seeded from the operating system, is not a CSPRNG (its state follows from
624 consecutive outputs). :class:`SecureGaussian` draws N(0, 1) samples from the
AES-256-CTR stream of :class:`~sharefl.privacy.secure_random.SecureRandom` (keyed from
``os.urandom``) by the Box–Muller transform:

    u₁ = (k₁ + 1)·2⁻⁵³ ∈ (0, 1],   u₂ = k₂·2⁻⁵³ ∈ [0, 1),   k₁, k₂ the top 53 bits of two
    keystream words (uniform on the float64 grid, exactly);
    z₁ = √(−2 ln u₁)·cos(2πu₂),   z₂ = √(−2 ln u₁)·sin(2πu₂),

two independent N(0, 1) samples per pair of words (Box and Muller 1958), computed in
float64 and rounded to the tensor's dtype. u₁ > 0, so the logarithm is finite: the
largest |z| is √(2·53·ln 2) ≈ 8.57 (the 53-bit grid truncates the tail beyond 8.5σ, whose
mass is below 10⁻¹⁶, the same as any float64 sampler). Samples are written into the
noise tensor in blocks of :data:`BLOCK` (generated on the CPU, copied to the tensor's
device), so memory stays bounded.

:class:`SecureGenerator` is a ``torch.Generator`` that carries a :class:`SecureGaussian`:
the functions of :mod:`sharefl.privacy.noise` draw their Gaussian noise from it (DP-SGD,
client-level shares, the simulator's vectorised DP-SGD), while whatever else takes a
generator (batch sampling, attacks) uses its torch state, seeded with 64 bits from
``secrets``. A deployment client process uses one
(:func:`sharefl.simulation_bridge.secure_client_generator`); simulations keep seeded
torch generators, reproducible by design.
"""

from __future__ import annotations

import math
import secrets
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

from .errors import PrivacyConfigError
from .secure_random import SecureRandom

__all__ = ["BLOCK", "SecureGaussian", "SecureGenerator"]

BLOCK: Final = 1 << 18
"""Samples generated and copied per block (2 MiB of float64)."""

_TWO_PI: Final = 2.0 * math.pi
_SCALE: Final = 2.0**-53


class SecureGaussian:
    """N(0, 1) samples from an AES-256-CTR stream by Box–Muller (module docstring).

    Args:
        source: the keystream; default a fresh :class:`SecureRandom` keyed from
            ``os.urandom`` (pass ``SecureRandom.from_seed(...)`` only in tests: whoever
            knows the seed knows the noise).

    Attributes:
        drawn: samples produced so far (what a test checks to see the sampler was used).

    Not thread-safe (like :class:`SecureRandom`).
    """

    __slots__ = ("_source", "drawn")

    def __init__(self, source: SecureRandom | None = None) -> None:
        if source is not None and not isinstance(source, SecureRandom):
            raise PrivacyConfigError(
                f"source must be a SecureRandom (an AES-CTR stream), got {type(source).__name__}"
            )
        self._source = SecureRandom() if source is None else source
        self.drawn = 0

    def standard_normal(self, n: int) -> npt.NDArray[np.float64]:
        """``n`` independent N(0, 1) samples as a float64 array (n ≥ 0; raises
        :class:`PrivacyConfigError` otherwise)."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise PrivacyConfigError(f"a sample count must be an int >= 0, got {n!r}")
        pairs = (int(n) + 1) // 2
        words = self._source.words(2 * pairs)
        u1 = ((words[:pairs] >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * _SCALE
        angle = (words[pairs:] >> np.uint64(11)).astype(np.float64) * (_SCALE * _TWO_PI)
        radius = np.sqrt(-2.0 * np.log(u1))
        out = np.empty(2 * pairs, dtype=np.float64)
        np.multiply(radius, np.cos(angle), out=out[:pairs])
        np.multiply(radius, np.sin(angle), out=out[pairs:])
        self.drawn += int(n)
        return out[:n]

    def fill_(self, out: torch.Tensor, std: float = 1.0) -> torch.Tensor:
        """Fill ``out`` (any shape, a floating dtype, any device) with i.i.d. N(0, std²)
        samples, block by block; return ``out``. ``std`` must be finite and ≥ 0 (0 fills
        zeros without drawing). Raises :class:`PrivacyConfigError` otherwise, or for a
        non-floating ``out``."""
        value = float(std)
        if not (math.isfinite(value) and value >= 0):
            raise PrivacyConfigError(
                f"noise standard deviation must be finite and ≥ 0, got {std!r}"
            )
        if not out.is_floating_point():
            raise PrivacyConfigError(f"Gaussian noise needs a floating tensor, got {out.dtype}")
        if value == 0.0:
            return out.zero_()
        target = (
            out
            if out.is_contiguous()
            else torch.empty_like(out, memory_format=torch.contiguous_format)
        )
        flat = target.view(-1)
        for start in range(0, flat.numel(), BLOCK):
            stop = min(start + BLOCK, flat.numel())
            block = self.standard_normal(stop - start)
            if value != 1.0:
                block *= value
            flat[start:stop].copy_(torch.from_numpy(block))
        if target is not out:
            out.copy_(target)
        return out


class SecureGenerator(torch.Generator):
    """A ``torch.Generator`` whose Gaussian DP noise comes from :attr:`gaussian`.

    The functions of :mod:`sharefl.privacy.noise` (``gaussian_``, ``add_gaussian_noise_``,
    ``standard_normal``) and everything built on them (:class:`~sharefl.privacy.DPSGD`,
    the client-level shares, the simulator's vectorised DP-SGD) draw from the AES-CTR
    stream when handed one; every other use of the generator (``torch.rand``, Poisson
    sampling of batches) uses its torch state, seeded with 64 bits from ``secrets``.
    ``torch.randn(..., generator=g)`` called directly does *not* use the secure stream:
    DP noise goes through :mod:`sharefl.privacy.noise`.

    Args:
        device: the device of the tensors it fills (noise is generated on the CPU and
            copied there).
        gaussian: the secure sampler (default: a fresh :class:`SecureGaussian`).
    """

    gaussian: SecureGaussian

    def __new__(
        cls, device: torch.device | str = "cpu", gaussian: SecureGaussian | None = None
    ) -> SecureGenerator:
        return super().__new__(cls, device)  # type: ignore[call-arg]

    def __init__(
        self, device: torch.device | str = "cpu", gaussian: SecureGaussian | None = None
    ) -> None:
        self.gaussian = SecureGaussian() if gaussian is None else gaussian
        self.manual_seed(secrets.randbits(64))
