"""The named exception of :mod:`sharefl.simulator.leakage`."""

from __future__ import annotations

import enum
from typing import TypeVar

from sharefl.simulator.errors import SimulatorError

E = TypeVar("E", bound=enum.Enum)


class GradientLeakageError(SimulatorError, ValueError):
    """A gradient-leakage call got bad input: gradients that do not match the model's
    trainable parameters, an unknown attack method or defence, a batch gradient given to
    iDLG's single-example label inference, images of the wrong shape for a metric... The
    message says what to change."""


def enum_member(cls: type[E], value: object, what: str) -> E:
    """``value`` (a member or its value) as a member of ``cls``, or :class:`GradientLeakageError`
    naming ``what`` and the valid values."""
    try:
        return cls(value)
    except ValueError:
        names = ", ".join(repr(m.value) for m in cls)
        raise GradientLeakageError(f"unknown {what} {value!r}: use one of {names}") from None
