"""Builds the pieces of a run from its configuration: clipping, noise schedule and robust
rule (the attacks: each loop's ``attacks`` module). Names are the configuration's
vocabulary; each factory raises :class:`~sharefl.simulator.config.SimulationConfigError`
naming the key when a value does not fit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sharefl import robust
from sharefl.privacy.clipping import (
    ClippingMode,
    FlatClipping,
    L2MaxClipping,
    Normalization,
    PerLayerClipping,
)
from sharefl.privacy.schedules import (
    ConstantSchedule,
    CyclicSchedule,
    ExponentialSchedule,
    LinearSchedule,
    NoiseSchedule,
    StaircaseSchedule,
)
from sharefl.robust import registry
from sharefl.robust.registry import RULES
from sharefl.simulator.config import PrivacyConfig, SimulationConfigError

SERVER_RULES = ("noise_filter",)
"""Rules that need the server's auxiliary data and the individual uploads."""


def construct(kind: str, name: str, cls: Callable[..., Any], options: dict[str, Any]) -> Any:
    """``cls(**options)``, or :class:`SimulationConfigError` naming ``kind``, ``name`` and
    the options when they do not fit."""
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise SimulationConfigError(f"{kind} {name!r} with options {options}: {exc}") from exc


def build_clipping(privacy: PrivacyConfig) -> ClippingMode | None:
    """The per-example clipping mode of a private run: ``None`` when privacy is off or at
    client level (Fed-SDP trains without per-example clipping and clips the whole update,
    see :meth:`~sharefl.simulator.federated.loop.Simulation.privatize_uploads`)."""
    if not privacy.enabled or privacy.level == "client":
        return None
    if privacy.clipping == "flat":
        return FlatClipping(privacy.clip)
    if privacy.clipping == "per_layer":
        return PerLayerClipping(privacy.clip)
    if privacy.clipping == "l2max":
        return L2MaxClipping(privacy.clip)
    return Normalization(momentum=privacy.momentum)


def build_schedule(privacy: PrivacyConfig, sigma: float) -> float | NoiseSchedule:
    """σ (constant) or the configured decay schedule starting from ``sigma``; the schedule
    options are those of :mod:`sharefl.privacy.schedules` (``sigma0`` defaults to σ)."""
    kinds = {
        "linear": LinearSchedule,
        "staircase": StaircaseSchedule,
        "exponential": ExponentialSchedule,
        "cyclic": CyclicSchedule,
        "constant": ConstantSchedule,
    }
    if privacy.schedule not in kinds:
        raise SimulationConfigError(f"privacy.schedule must be one of {sorted(kinds)}")
    if privacy.schedule == "constant" and not privacy.schedule_options:
        return sigma
    options = dict(privacy.schedule_options)
    if privacy.schedule == "constant":
        options.setdefault("sigma", sigma)
    else:
        options.setdefault("sigma0", sigma)
    return construct("privacy.schedule", privacy.schedule, kinds[privacy.schedule], options)


def build_rule(name: str, options: dict[str, Any], pre: list[str], generator: torch.Generator):
    """The rule ``name`` of :mod:`sharefl.robust.registry` (optionally behind the
    pre-aggregators ``"nnm"``/``"bucketing"``); raises :class:`SimulationConfigError` with
    the registry's message (naming the key), and lists the server rules too."""
    if name not in RULES:
        raise SimulationConfigError(
            f"aggregator.name must be one of {sorted(RULES) + list(SERVER_RULES)}, got {name!r}"
        )
    try:
        return registry.build_rule(name, options, pre, generator)
    except robust.AggregationError as exc:
        raise SimulationConfigError(str(exc)) from exc


def build_noise_filter(
    options: dict[str, Any], *, noise_multiplier: float, batch_size: int, honest: int, total: int
) -> robust.NoiseAwareFilter:
    """seed000's two-stage filter for the run's σ and b_c; γ defaults to the true honest
    fraction ``honest / total``."""
    options = {
        "honest_fraction": honest / total,
        "batch_size": batch_size,
        **options,
        "noise_multiplier": noise_multiplier,
    }
    return construct("aggregator", "noise_filter", robust.NoiseAwareFilter, options)
