"""Differential privacy for clients and its accounting.

Example level (DP-SGD on a client's data):

- :class:`DPSGD` / :class:`DPSGDConfig` — per-example gradients (``torch.func``), clipping
  (:class:`FlatClipping`, :class:`PerLayerClipping`, seed003's :class:`L2MaxClipping`,
  seed000's :class:`Normalization` with per-example momentum), Gaussian noise from an
  explicit generator, σ_t from a :class:`NoiseSchedule`.
- :class:`PerExampleGradients`, :func:`per_example_gradients`,
  :func:`check_per_example_compatible` (rejects BatchNorm).
- :func:`poisson_sample`, :class:`PoissonSampler` — sampling of examples or clients.

Client level (FedAvg under secure aggregation): :class:`ClientDPConfig`,
:func:`privatize_update_`, :func:`clip_update_`.

Mechanisms on messages: seed002's :class:`SignFlip` and :class:`SignGaussian`; seed004's
:class:`NoisyModelTransmitter` (σ^k = C·α^k on transmitted models).

Distributed noise inside secure-aggregation clusters that survives discretisation and
the modular sum: :class:`DistributedEncoder` (clip, randomised Hadamard rotation,
conditional randomised rounding, exact :class:`DiscreteGaussian` or :class:`Skellam`
shares from an AES-CTR :class:`SecureRandom`, mod 2^b; the server's decode),
:func:`calibrate_distributed`, and its RDP accounting :class:`DistributedDPLedger` with
:class:`DiscreteGaussianSum` / :class:`SkellamSum`.

Accounting (``dp-accounting``): :class:`PrivacyAccountant` (RDP or PLD; improved or classic
RDP conversion), :func:`compute_epsilon`, :func:`calibrate_noise`.

This package depends on neither :mod:`sharefl.protocol` nor :mod:`sharefl.simulator`.
"""

from .accountant import AccountantStep, PrivacyAccountant, classic_rdp_epsilon
from .calibration import calibrate_noise, compute_epsilon
from .client_level import ClientDPConfig, clip_update_, privatize_update_
from .clipping import (
    ClippingMode,
    FlatClipping,
    L2MaxClipping,
    Normalization,
    PerLayerClipping,
)
from .discrete_samplers import DiscreteGaussian, Skellam, discrete_gaussian, skellam
from .distributed import (
    DistributedDPConfig,
    DistributedEncoder,
    DistributedMechanism,
    Rotation,
    calibrate_distributed,
)
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
from .noise import add_gaussian_noise_, gaussian_
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
from .secure_random import SecureRandom
from .sign import (
    SignFlip,
    SignGaussian,
    rsa_sensitivity,
    rsa_sign,
    sign_flip_epsilon,
    sign_flip_gamma,
)

__all__ = [
    "DPSGD",
    "AccountantStateError",
    "AccountantStep",
    "CalibrationError",
    "ClientDPConfig",
    "ClippingMode",
    "ConstantSchedule",
    "CyclicSchedule",
    "DPSGDConfig",
    "DiscreteGaussian",
    "DiscreteGaussianSum",
    "DistributedDPConfig",
    "DistributedDPLedger",
    "DistributedEncoder",
    "DistributedMechanism",
    "ExponentialSchedule",
    "FlatClipping",
    "L2MaxClipping",
    "LinearSchedule",
    "ModelNoiseConfig",
    "NoiseSchedule",
    "NoisyModelTransmitter",
    "Normalization",
    "PerExampleGradients",
    "PerLayerClipping",
    "PoissonSampler",
    "PrivacyAccountant",
    "PrivacyConfigError",
    "PrivacyError",
    "PrivateGradient",
    "Rotation",
    "ScheduleError",
    "SecureRandom",
    "SignFlip",
    "SignGaussian",
    "Skellam",
    "SkellamSum",
    "StaircaseSchedule",
    "UnsupportedModuleError",
    "add_gaussian_noise_",
    "calibrate_distributed",
    "calibrate_noise",
    "check_per_example_compatible",
    "classic_rdp_epsilon",
    "clip_update_",
    "compute_epsilon",
    "discrete_gaussian",
    "gaussian_",
    "per_example_gradients",
    "poisson_sample",
    "privatize_update_",
    "rsa_sensitivity",
    "rsa_sign",
    "sign_flip_epsilon",
    "sign_flip_gamma",
    "skellam",
    "theorem3_epsilon",
]
