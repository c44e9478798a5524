"""The names a privacy configuration chooses among, in one place.

Every module of :mod:`sharefl.privacy` that takes one of these names, and the simulator's
``[privacy]`` table that checks them, import them from here. This module imports nothing
heavy (no numpy, no torch), so a configuration is checked before torch loads; the classes
each name builds are registered beside their code (:data:`sharefl.privacy.schedules.
SCHEDULE_CLASSES`; the clipping modes in ``sharefl.simulator.components.CLIPPING_BUILDERS``,
which also reads the configuration's options), and tests hold those registries to these
names.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

Backend = Literal["rdp", "pld"]
"""The accountant: Rényi DP (Opacus/TF-Privacy's curves) or privacy loss distributions
(``dp-accounting``)."""
Conversion = Literal["improved", "classic"]
"""RDP → (ε, δ): the improved bound (Balle et al. 2020), or TF-Privacy's classic moments
accountant bound (which Fed-αCDP's ε use)."""
Level = Literal["example", "client"]
"""What is protected: one training example (DP-SGD) or one client's whole update."""

CLIPPINGS: tuple[str, ...] = ("flat", "per_layer", "l2max", "normalize", "quantile", "adaclip")
"""The per-example clipping modes: flat, per-layer, Fed-αCDP's l2-max, the DP filter's
normalisation, and the adaptive baselines of Fed-αCDP's Table X, quantile clipping (Andrew
et al.) and AdaClip (Pichapati et al.)."""
ADAPTIVE_CLIPPINGS: tuple[str, ...] = ("quantile", "adaclip")
"""The modes of :data:`CLIPPINGS` that adapt their bound (and take options)."""
SCHEDULES: tuple[str, ...] = ("constant", "linear", "staircase", "exponential", "cyclic")
"""The noise schedules σ_t (:mod:`sharefl.privacy.schedules`; Fed-αCDP's Table VIII)."""
LEVELS: tuple[Level, ...] = ("example", "client")
NOISE_SPLITS: tuple[str, ...] = ("participants", "cluster")
"""How client-level noise is shared: over the round's honest participants, or over each
cluster's members so that every released sum carries the whole noise
(:mod:`sharefl.privacy.cluster_noise`)."""


class DistributedMechanism(StrEnum):
    """The noise the members of a cluster add (``privacy.distributed``): continuous Gaussian
    shares (float encoding, :mod:`sharefl.privacy.cluster_noise`) or a discrete mechanism
    on integers mod 2^b (:mod:`sharefl.privacy.distributed`)."""

    GAUSSIAN = "gaussian"
    DISCRETE_GAUSSIAN = "discrete_gaussian"
    SKELLAM = "skellam"

    @property
    def discrete(self) -> bool:
        return self is not DistributedMechanism.GAUSSIAN


class Rotation(StrEnum):
    """The random rotation before quantisation (``privacy.rotation``)."""

    HADAMARD = "hadamard"
    NONE = "none"


DISTRIBUTED_MECHANISMS: tuple[str, ...] = tuple(DistributedMechanism)
ROTATIONS: tuple[str, ...] = tuple(Rotation)
