"""Gradient-leakage (gradient inversion) attacks and their evaluation (Wei et al.).

- :func:`cpl_attack_network` — the attack network of the authors' notebooks.
- :func:`leaked_gradient`, :func:`leaked_per_example_gradients` — what an adversary of
  type 0, 1 or 2 observes under no defence, Fed-SDP (server or client side), Fed-CDP or
  Fed-αCDP (:class:`Defence`), as a :class:`LeakedGradient`.
- :func:`reconstruct` — DLG, iDLG and CPL (:class:`Method`) with L-BFGS, returning a
  :class:`Reconstruction`; :func:`infer_label` is iDLG's label inference.
- Metrics: :func:`reconstruction_mse` (the paper's "RMSE", a mean squared error without the
  root), :func:`ssim`, :func:`attack_succeeded` / :func:`attack_success_rate` (MSE ≤
  :data:`DEFAULT_SUCCESS_MSE` = 0.01, see :mod:`.metrics` for why).
- :func:`run_leakage_trials` → :class:`LeakageSummary`: Table III cells on real data.

Every bad argument raises :class:`GradientLeakageError` (a
:class:`~sharefl.simulator.errors.SimulatorError` and a ``ValueError``) saying what to
change.
"""

from .attacks import (
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_TOLERANCE,
    Method,
    Reconstruction,
    StopReason,
    infer_label,
    reconstruct,
)
from .errors import GradientLeakageError
from .leak import (
    ATTACK_TYPES,
    DEFAULT_CLIP,
    DEFAULT_NOISE_MULTIPLIER,
    Defence,
    LeakedGradient,
    leaked_gradient,
    leaked_per_example_gradients,
)
from .metrics import (
    DEFAULT_SUCCESS_MSE,
    attack_succeeded,
    attack_success_rate,
    gaussian_window,
    match_reconstructions,
    reconstruction_mse,
    ssim,
    ssim_per_image,
)
from .network import CPLAttackNetwork, cpl_attack_network
from .trials import LeakageSummary, LeakageTrial, run_leakage_trials

__all__ = [
    "ATTACK_TYPES",
    "DEFAULT_CLIP",
    "DEFAULT_MAX_ITERATIONS",
    "DEFAULT_NOISE_MULTIPLIER",
    "DEFAULT_SUCCESS_MSE",
    "DEFAULT_TOLERANCE",
    "CPLAttackNetwork",
    "Defence",
    "GradientLeakageError",
    "LeakageSummary",
    "LeakageTrial",
    "LeakedGradient",
    "Method",
    "Reconstruction",
    "StopReason",
    "attack_succeeded",
    "attack_success_rate",
    "cpl_attack_network",
    "gaussian_window",
    "infer_label",
    "leaked_gradient",
    "leaked_per_example_gradients",
    "match_reconstructions",
    "reconstruct",
    "reconstruction_mse",
    "run_leakage_trials",
    "ssim",
    "ssim_per_image",
]
