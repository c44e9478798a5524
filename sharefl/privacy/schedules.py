"""Noise schedules σ_t for DP-SGD (the decay policies of Fed-αCDP[σ], Wei et al.).

A schedule maps a 0-based index ``t`` (a round or a step, as the caller decides) to the
noise multiplier σ_t > 0. Every policy starts at σ_0 = σ₀; Fed-αCDP's cyclic formula, which
it writes with mod(t − 1, ·) for a 1-based round, is the same curve.

Every schedule has a ``floor``: σ_t = max(floor, formula(t)). A value σ_t ≤ 0 means no
noise at all, so evaluating a schedule there raises :class:`ScheduleError` (raise the floor
or shorten the schedule). Varying σ_t is accounted by stepping the accountant once per
value (:class:`sharefl.privacy.PrivacyAccountant` composes them).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ScheduleError


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ScheduleError(f"{name} must be a positive finite number, got {value!r}")


def _check_non_negative(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ScheduleError(f"{name} must be a finite number ≥ 0, got {value!r}")


class NoiseSchedule(ABC):
    """σ_t as a function of a 0-based index t. Subclasses are frozen dataclasses."""

    floor: float

    @abstractmethod
    def _formula(self, t: int) -> float:
        """The policy's value before the floor is applied."""

    def __call__(self, t: int) -> float:
        """σ_t for the 0-based index ``t`` (raises :class:`ScheduleError` if t < 0 or σ_t ≤ 0)."""
        if t < 0:
            raise ScheduleError(f"schedule index must be ≥ 0, got {t}")
        sigma = max(self.floor, self._formula(t))
        if not sigma > 0:
            raise ScheduleError(
                f"{type(self).__name__} reaches σ_t = {sigma:g} ≤ 0 at t = {t}: no noise means "
                "no privacy; set a positive floor or use fewer rounds"
            )
        return sigma

    def values(self, n: int) -> list[float]:
        """[σ_0, ..., σ_{n-1}]."""
        return [self(t) for t in range(n)]


@dataclass(frozen=True)
class ConstantSchedule(NoiseSchedule):
    """σ_t = sigma."""

    sigma: float
    floor: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("sigma", self.sigma)
        _check_non_negative("floor", self.floor)

    def _formula(self, t: int) -> float:
        return self.sigma


@dataclass(frozen=True)
class LinearSchedule(NoiseSchedule):
    """σ_t = max(floor, σ₀ (1 − decay·t)). Fed-αCDP's code: σ₀ = 15, decay = 0.006767."""

    sigma0: float
    decay: float
    floor: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("sigma0", self.sigma0)
        _check_non_negative("decay", self.decay)
        _check_non_negative("floor", self.floor)

    def _formula(self, t: int) -> float:
        return self.sigma0 * (1.0 - self.decay * t)


@dataclass(frozen=True)
class StaircaseSchedule(NoiseSchedule):
    """σ_t = max(floor, σ₀ (1 − decay·⌊t / period⌋)). Fed-αCDP's code: decay = 0.0677, period 10."""

    sigma0: float
    decay: float
    period: int
    floor: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("sigma0", self.sigma0)
        _check_non_negative("decay", self.decay)
        _check_non_negative("floor", self.floor)
        if not (isinstance(self.period, int) and self.period >= 1):
            raise ScheduleError(f"period must be an integer ≥ 1, got {self.period!r}")

    def _formula(self, t: int) -> float:
        return self.sigma0 * (1.0 - self.decay * (t // self.period))


@dataclass(frozen=True)
class ExponentialSchedule(NoiseSchedule):
    """σ_t = max(floor, σ₀ e^(−rate·t)). Fed-αCDP's code: σ₀ = e^2.71 ≈ 15, rate = 0.0113."""

    sigma0: float
    rate: float
    floor: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("sigma0", self.sigma0)
        _check_non_negative("rate", self.rate)
        _check_non_negative("floor", self.floor)

    def _formula(self, t: int) -> float:
        return self.sigma0 * math.exp(-self.rate * t)


@dataclass(frozen=True)
class CyclicSchedule(NoiseSchedule):
    """Cosine annealing that restarts at σ₀ every ``period`` indices, never below ``floor``.

    σ_t = max(floor, (σ₀/2)(cos(π·(t mod period)/period) + 1)); Fed-αCDP writes
    period = ⌈T/γ₄⌉ (:meth:`from_cycles`). The cosine approaches 0 at the end of every
    cycle, so the floor is required (> 0).
    """

    sigma0: float
    period: int
    floor: float

    def __post_init__(self) -> None:
        _check_positive("sigma0", self.sigma0)
        _check_positive("floor (the cosine decays toward 0 in every cycle)", self.floor)
        if not (isinstance(self.period, int) and self.period >= 1):
            raise ScheduleError(f"period must be an integer ≥ 1, got {self.period!r}")

    @classmethod
    def from_cycles(cls, sigma0: float, total: int, cycles: int, floor: float) -> CyclicSchedule:
        """Fed-αCDP's parametrisation: ``cycles`` = γ₄ restarts over ``total`` = T indices."""
        if total < 1 or cycles < 1:
            raise ScheduleError(f"total and cycles must be ≥ 1, got {total} and {cycles}")
        return cls(sigma0=sigma0, period=math.ceil(total / cycles), floor=floor)

    def _formula(self, t: int) -> float:
        phase = (t % self.period) / self.period
        return 0.5 * self.sigma0 * (math.cos(math.pi * phase) + 1.0)


SCHEDULE_CLASSES: dict[str, type[NoiseSchedule]] = {
    "constant": ConstantSchedule,
    "linear": LinearSchedule,
    "staircase": StaircaseSchedule,
    "exponential": ExponentialSchedule,
    "cyclic": CyclicSchedule,
}
"""``privacy.schedule`` → its class, for every name of
:data:`~sharefl.privacy.vocabulary.SCHEDULES` (tests/test_privacy_vocabulary.py holds them
equal)."""


def schedule_options(name: str, options: Mapping[str, Any], sigma: float) -> dict[str, Any]:
    """The keyword arguments of ``SCHEDULE_CLASSES[name]`` for a run whose configured σ is
    ``sigma``: ``options`` with the starting σ defaulting to it (``sigma`` for the constant
    schedule, ``sigma0`` for the decaying ones)."""
    out = dict(options)
    out.setdefault("sigma" if name == "constant" else "sigma0", sigma)
    return out
