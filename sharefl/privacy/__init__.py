"""Differential privacy for clients and its accounting.

Example level (DP-SGD on a client's data):

- :class:`DPSGD` / :class:`DPSGDConfig` — per-example gradients (``torch.func``), clipping
  (:class:`FlatClipping`, :class:`PerLayerClipping`, Fed-αCDP's :class:`L2MaxClipping`,
  the DP filter's :class:`Normalization` with per-example momentum), Gaussian noise from an
  explicit generator, σ_t from a :class:`NoiseSchedule`.
- :class:`PerExampleGradients`, :func:`per_example_gradients`,
  :func:`check_per_example_compatible` (rejects BatchNorm).
- :func:`poisson_sample`, :class:`PoissonSampler` — sampling of examples or clients.

Client level (FedAvg under secure aggregation): :class:`ClientDPConfig`,
:func:`privatize_update_`, :func:`clip_update_`.

Gaussian DP noise from an AES-256-CTR stream (a deployment client's):
:class:`SecureGenerator`, :class:`SecureGaussian`.

A client's own budget: :class:`ClientNoise`, :func:`round_rdp` (one round of the noise
the client adds itself), :func:`epsilon_from_rdp`, :func:`client_noise`.

Mechanisms on messages: DP-RSA's :class:`SignFlip` and :class:`SignGaussian`; Ye, Zhu and Ling's
:class:`NoisyModelTransmitter` (σ^k = C·α^k on transmitted models).

Distributed noise inside secure-aggregation clusters that survives discretisation and
the modular sum: :class:`DistributedEncoder` (clip, randomised Hadamard rotation,
conditional randomised rounding, exact :class:`DiscreteGaussian` or :class:`Skellam`
shares from an AES-CTR :class:`SecureRandom`, mod 2^b; the server's decode),
:func:`calibrate_distributed`, and its RDP accounting :class:`DistributedDPLedger` with
:class:`DiscreteGaussianSum` / :class:`SkellamSum`.

Accounting (``dp-accounting``): :class:`PrivacyAccountant` (RDP or PLD; improved or classic
RDP conversion), :func:`compute_epsilon`, :func:`calibrate_noise`.

This package depends on neither :mod:`sharefl.protocol` nor :mod:`sharefl.simulator`. Its
names are imported from their modules on first use: a module that needs no torch
(:mod:`.distributed`, :mod:`.secure_random`, :mod:`.discrete_samplers`, the accounting)
imports without it, e.g. in a Flower ClientApp process.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .accountant import AccountantStep, PrivacyAccountant, classic_rdp_epsilon
    from .calibration import calibrate_noise, compute_epsilon
    from .client_budget import ClientNoise, client_noise, epsilon_from_rdp, round_rdp
    from .client_level import ClientDPConfig, clip_update_, privatize_update_
    from .clipping import ClippingMode, FlatClipping, L2MaxClipping, Normalization, PerLayerClipping
    from .discrete_samplers import DiscreteGaussian, Skellam, discrete_gaussian, skellam
    from .distributed import DistributedDPConfig, DistributedEncoder, calibrate_distributed
    from .distributed_accounting import DiscreteGaussianSum, DistributedDPLedger, SkellamSum
    from .dpsgd import DPSGD, DPSGDConfig, PrivateGradient
    from .errors import (
        AccountantStateError,
        CalibrationError,
        PrivacyConfigError,
        PrivacyError,
        ScheduleError,
        UnsupportedModuleError,
    )
    from .model_noise import ModelNoiseConfig, NoisyModelTransmitter, theorem3_epsilon
    from .noise import add_gaussian_noise_, gaussian_, standard_normal
    from .per_example import (
        PerExampleGradients,
        check_per_example_compatible,
        per_example_gradients,
    )
    from .sampling import PoissonSampler, poisson_sample
    from .schedules import (
        ConstantSchedule,
        CyclicSchedule,
        ExponentialSchedule,
        LinearSchedule,
        NoiseSchedule,
        StaircaseSchedule,
    )
    from .secure_noise import SecureGaussian, SecureGenerator
    from .secure_random import SecureRandom
    from .sign import (
        SignFlip,
        SignGaussian,
        rsa_sensitivity,
        rsa_sign,
        sign_flip_epsilon,
        sign_flip_gamma,
    )
    from .vocabulary import DistributedMechanism, Rotation

EXPORTS: dict[str, tuple[str, ...]] = {
    "accountant": (
        "AccountantStep",
        "PrivacyAccountant",
        "classic_rdp_epsilon",
    ),
    "calibration": (
        "calibrate_noise",
        "compute_epsilon",
    ),
    "client_budget": (
        "ClientNoise",
        "client_noise",
        "epsilon_from_rdp",
        "round_rdp",
    ),
    "client_level": (
        "ClientDPConfig",
        "clip_update_",
        "privatize_update_",
    ),
    "clipping": (
        "ClippingMode",
        "FlatClipping",
        "L2MaxClipping",
        "Normalization",
        "PerLayerClipping",
    ),
    "discrete_samplers": (
        "DiscreteGaussian",
        "Skellam",
        "discrete_gaussian",
        "skellam",
    ),
    "distributed": (
        "DistributedDPConfig",
        "DistributedEncoder",
        "calibrate_distributed",
    ),
    "distributed_accounting": (
        "DiscreteGaussianSum",
        "DistributedDPLedger",
        "SkellamSum",
    ),
    "dpsgd": (
        "DPSGD",
        "DPSGDConfig",
        "PrivateGradient",
    ),
    "errors": (
        "AccountantStateError",
        "CalibrationError",
        "PrivacyConfigError",
        "PrivacyError",
        "ScheduleError",
        "UnsupportedModuleError",
    ),
    "model_noise": (
        "ModelNoiseConfig",
        "NoisyModelTransmitter",
        "theorem3_epsilon",
    ),
    "noise": (
        "add_gaussian_noise_",
        "gaussian_",
        "standard_normal",
    ),
    "per_example": (
        "PerExampleGradients",
        "check_per_example_compatible",
        "per_example_gradients",
    ),
    "sampling": (
        "PoissonSampler",
        "poisson_sample",
    ),
    "schedules": (
        "ConstantSchedule",
        "CyclicSchedule",
        "ExponentialSchedule",
        "LinearSchedule",
        "NoiseSchedule",
        "StaircaseSchedule",
    ),
    "secure_noise": ("SecureGaussian", "SecureGenerator"),
    "vocabulary": ("DistributedMechanism", "Rotation"),
    "secure_random": ("SecureRandom",),
    "sign": (
        "SignFlip",
        "SignGaussian",
        "rsa_sensitivity",
        "rsa_sign",
        "sign_flip_epsilon",
        "sign_flip_gamma",
    ),
}
"""Submodule → the names this package exports from it (imported on first use)."""

_MODULE_OF = {name: module for module, names in EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = sorted(_MODULE_OF)
