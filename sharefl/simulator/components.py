"""Builds the pieces of a run from its configuration: clipping, noise schedule and robust
rule (the attacks: each loop's ``attacks`` module). Names are the configuration's
vocabulary; each factory raises :class:`~sharefl.simulator.config.SimulationConfigError`
naming the key when a value does not fit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sharefl import robust
from sharefl.privacy.adaptive_clipping import AdaClip, AdaptiveClipping, QuantileClipping
from sharefl.privacy.clipping import (
    ClippingMode,
    FlatClipping,
    L2MaxClipping,
    Normalization,
    PerLayerClipping,
)
from sharefl.privacy.schedules import SCHEDULE_CLASSES, NoiseSchedule, schedule_options
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


def _quantile(privacy: PrivacyConfig) -> QuantileClipping:
    options = dict(privacy.clipping_options)
    if "count_std" not in options:
        raise SimulationConfigError(
            'privacy.clipping = "quantile" needs privacy.clipping_options.count_std, σ_b: the '
            "std of the noise on one release's count (one client's local step), > σ/2 so that "
            "the update keeps a finite noise multiplier σ_Δ = (σ⁻² − (2σ_b)⁻²)^(−1/2). Andrew "
            "et al. take σ_b = m/20 for m expected contributions: per round, with K clients "
            "of L steps of B examples, σ_b = 0.05·B·√(K·L) gives b̄ that noise"
        )
    options.setdefault("initial_norm", privacy.clip)
    return construct("privacy.clipping", "quantile", QuantileClipping, options)


def _adaclip(privacy: PrivacyConfig) -> AdaClip:
    # the bound of the transformed gradient is its own (the paper's 1), not privacy.clip:
    # AdaClip's scale b makes gradients that fit its estimates of norm 1 on average
    return construct("privacy.clipping", "adaclip", AdaClip, dict(privacy.clipping_options))


CLIPPING_BUILDERS: dict[str, Callable[[PrivacyConfig], ClippingMode | AdaptiveClipping]] = {
    "flat": lambda p: FlatClipping(p.clip),
    "per_layer": lambda p: PerLayerClipping(p.clip),
    "l2max": lambda p: L2MaxClipping(p.clip),
    "normalize": lambda p: Normalization(momentum=p.momentum),
    "quantile": _quantile,
    "adaclip": _adaclip,
}
"""``privacy.clipping`` → its mode, for every name of
:data:`~sharefl.privacy.vocabulary.CLIPPINGS` (tests/test_sim_adaptive_clipping.py holds
them equal)."""


def build_clipping(privacy: PrivacyConfig) -> ClippingMode | AdaptiveClipping | None:
    """The per-example clipping mode of a private run: ``None`` when privacy is off or at
    client level (Fed-SDP trains without per-example clipping and clips the whole update,
    see :meth:`~sharefl.simulator.federated.loop.Simulation.privatize_uploads`). The
    adaptive modes take ``privacy.clipping_options``; the initial bound defaults to
    ``privacy.clip`` for quantile clipping (Fed-αCDP §7.6 starts at C₀ = 4); AdaClip's is its
    ``max_norm`` option (default 1, the paper's)."""
    if not privacy.enabled or privacy.level == "client":
        return None
    return CLIPPING_BUILDERS[privacy.clipping](privacy)


def build_schedule(privacy: PrivacyConfig, sigma: float) -> float | NoiseSchedule:
    """σ (constant) or the configured decay schedule starting from ``sigma``; the schedule
    options are those of :mod:`sharefl.privacy.schedules` (``sigma0`` defaults to σ)."""
    if privacy.schedule == "constant" and not privacy.schedule_options:
        return sigma
    options = schedule_options(privacy.schedule, privacy.schedule_options, sigma)
    kind = SCHEDULE_CLASSES[privacy.schedule]  # a name the configuration checked
    return construct("privacy.schedule", privacy.schedule, kind, options)


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
    """The DP filter's two-stage filter for the run's σ and b_c; γ defaults to the true honest
    fraction ``honest / total``."""
    options = {
        "honest_fraction": honest / total,
        "batch_size": batch_size,
        **options,
        "noise_multiplier": noise_multiplier,
    }
    return construct("aggregator", "noise_filter", robust.NoiseAwareFilter, options)
