"""Repeated attacks on real data: the measurements behind Fed-αCDP's Table III.

Trial i draws a batch of ``batch_size`` examples (disjoint across trials: consecutive slices
of one seeded permutation of the dataset), takes the attack network seeded by
``seed + i`` (or the given ``model``), computes what an adversary of ``attack_type`` sees
under ``defence`` (noise from a generator seeded by the trial), attacks it, and scores the
reconstruction clamped to [0, 1] (:attr:`Reconstruction.image`) against the true inputs
(SSIM with the standard 11×11 window, or the largest odd window that fits smaller images).

Per trial τ follows the paper's definition (Table III): the first L-BFGS step at which the
reconstruction succeeds (MSE ≤ the threshold), or ``max_iterations`` if it never does, even
when the attack stopped earlier because it stalled. ``iterations`` is what actually ran.
A defence is *resilient* when no trial succeeded (ASR = 0).

For type 2 the attacked view is the per-example gradient of the batch's first example
(the l2-max S of Fed-αCDP is still computed over the whole batch). For types 0/1 with
``batch_size`` > 1, iDLG/CPL cannot infer the labels: set ``labels_known=True`` (an
attacker that knows the batch's labels, an upper bound) or use ``method="dlg"``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .attacks import DEFAULT_MAX_ITERATIONS, DEFAULT_TOLERANCE, Method, check_method, reconstruct
from .errors import GradientLeakageError
from .leak import (
    DEFAULT_CLIP,
    DEFAULT_NOISE_MULTIPLIER,
    Defence,
    LeakedGradient,
    check_attack_type,
    check_defence,
    leaked_gradient,
    leaked_per_example_gradients,
)
from .metrics import (
    DEFAULT_SUCCESS_MSE,
    attack_succeeded,
    match_reconstructions,
    reconstruction_mse,
    ssim,
)
from .network import cpl_attack_network


@dataclass(frozen=True)
class LeakageTrial:
    """One attack.

    Attributes:
        trial: the trial index.
        indices: dataset indices of the batch.
        true_labels / labels: the attacked examples' labels and the labels the attack used.
        label_correct: the attack's labels equal the true ones (as multisets for a batch).
        mse: reconstruction MSE (images in [0, 1], batch matched to the originals).
        ssim: SSIM of the same images.
        success: mse ≤ the success threshold.
        tau: first successful L-BFGS step, or max_iterations.
        iterations: L-BFGS steps run.
        stop_reason: why the attack stopped.
        relative_distance: final gradient distance / ‖leaked gradient‖².
        noise_std: std of the noise on each coordinate of the leaked gradient.
    """

    trial: int
    indices: tuple[int, ...]
    true_labels: tuple[int, ...]
    labels: tuple[int, ...]
    label_correct: bool
    mse: float
    ssim: float
    success: bool
    tau: int
    iterations: int
    stop_reason: str
    relative_distance: float
    noise_std: float


@dataclass(frozen=True)
class LeakageSummary:
    """Trials of one (defence, attack type) cell and their averages.

    Attributes (configuration): defence, attack_type, method, batch_size,
    noise_multiplier (σ), clip (C), max_iterations (τ bound), success_mse (threshold),
    trials (the :class:`LeakageTrial` list).
    """

    defence: str
    attack_type: int
    method: str
    batch_size: int
    noise_multiplier: float
    clip: float
    max_iterations: int
    success_mse: float
    trials: tuple[LeakageTrial, ...] = field(repr=False)

    @property
    def asr(self) -> float:
        """Attack success rate."""
        return _mean([t.success for t in self.trials])

    @property
    def resilient(self) -> bool:
        """No trial succeeded."""
        return not any(t.success for t in self.trials)

    @property
    def mean_mse(self) -> float:
        return _mean([t.mse for t in self.trials])

    @property
    def mean_ssim(self) -> float:
        return _mean([t.ssim for t in self.trials])

    @property
    def mean_tau(self) -> float:
        return _mean([t.tau for t in self.trials])

    @property
    def mean_iterations(self) -> float:
        return _mean([t.iterations for t in self.trials])

    @property
    def label_accuracy(self) -> float:
        return _mean([t.label_correct for t in self.trials])

    def as_dict(self, *, include_trials: bool = False) -> dict[str, object]:
        """JSON-ready averages (and the trials if asked)."""
        out: dict[str, object] = {
            "defence": self.defence,
            "attack_type": self.attack_type,
            "method": self.method,
            "batch_size": self.batch_size,
            "noise_multiplier": self.noise_multiplier,
            "clip": self.clip,
            "max_iterations": self.max_iterations,
            "success_mse": self.success_mse,
            "trials": len(self.trials),
            "resilient": self.resilient,
            "asr": self.asr,
            "mean_mse": self.mean_mse,
            "median_mse": statistics.median(t.mse for t in self.trials),
            "mean_ssim": self.mean_ssim,
            "mean_tau": self.mean_tau,
            "mean_iterations": self.mean_iterations,
            "label_accuracy": self.label_accuracy,
        }
        if include_trials:
            out["per_trial"] = [asdict(t) for t in self.trials]
        return out

    @classmethod
    def combine(cls, parts: Sequence[LeakageSummary]) -> LeakageSummary:
        """One summary of the trials of ``parts`` (same configuration; e.g. chunks of trials
        run in parallel with different ``first_trial``), ordered by trial index."""
        if not parts:
            raise GradientLeakageError("combine needs at least one summary")
        head = parts[0]
        config = {k: v for k, v in asdict(head).items() if k != "trials"}
        for part in parts[1:]:
            other = {k: v for k, v in asdict(part).items() if k != "trials"}
            if other != config:
                raise GradientLeakageError(f"cannot combine summaries of different cells: {other}")
        trials = sorted((t for p in parts for t in p.trials), key=lambda t: t.trial)
        return cls(**config, trials=tuple(trials))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


def run_leakage_trials(
    dataset_inputs: torch.Tensor,
    dataset_targets: torch.Tensor,
    *,
    defence: str | Defence = Defence.NONE,
    attack_type: int = 2,
    trials: int = 20,
    first_trial: int = 0,
    method: str | Method = Method.CPL,
    batch_size: int = 1,
    noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER,
    clip: float = DEFAULT_CLIP,
    num_classes: int = 10,
    model: nn.Module | None = None,
    labels_known: bool = False,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    tolerance: float = DEFAULT_TOLERANCE,
    patience: int | None = None,
    min_improvement: float = 1e-6,
    success_mse: float = DEFAULT_SUCCESS_MSE,
    seed: int = 0,
) -> LeakageSummary:
    """Attack ``trials`` batches of the dataset and summarise (see the module docstring).

    Args:
        dataset_inputs: ``[N, C, H, W]`` float images in [0, 1].
        dataset_targets: ``[N]`` int64 labels in [0, num_classes).
        defence, attack_type, noise_multiplier, clip: the leaked view
            (:func:`~sharefl.simulator.leakage.leaked_gradient`).
        trials: number of trials; ``first_trial`` offsets their indices (trial i is the
            same whichever chunk runs it, so chunks can run in parallel and be
            :meth:`LeakageSummary.combine`\\ d).
        method: ``"cpl"``, ``"idlg"`` or ``"dlg"``.
        batch_size: B, examples per local iteration.
        num_classes: classes of the attack network.
        model: attack this model in every trial instead of a fresh
            :func:`~sharefl.simulator.leakage.cpl_attack_network` seeded by ``seed + i``.
        labels_known: give the attack the true labels instead of inferring them.
        max_iterations, tolerance, patience, min_improvement: the attack's stopping rules
            (:func:`~sharefl.simulator.leakage.reconstruct`).
        success_mse: the success threshold on the MSE.
        seed: seeds the batch selection, the networks, the noise and the initialisations.

    Raises:
        GradientLeakageError: bad arguments, or fewer than (first_trial + trials)·batch_size
            examples.
    """
    defence, attack_type = check_defence(defence), check_attack_type(attack_type)
    method = check_method(method)
    x_all, y_all = _check_dataset(dataset_inputs, dataset_targets, num_classes)
    for name, value, low in (("trials", trials, 1), ("first_trial", first_trial, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise GradientLeakageError(f"{name} must be an int ≥ {low}, got {value!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise GradientLeakageError(f"batch_size must be an int ≥ 1, got {batch_size!r}")
    needed = (first_trial + trials) * batch_size
    if needed > x_all.shape[0]:
        raise GradientLeakageError(
            f"{trials} trials from trial {first_trial} with batch_size {batch_size} need "
            f"{needed} examples but the dataset has {x_all.shape[0]}: use fewer trials"
        )
    order = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(seed))
    results = []
    for trial in range(first_trial, first_trial + trials):
        indices = order[trial * batch_size : (trial + 1) * batch_size]
        net = model
        if net is None:
            net = cpl_attack_network(tuple(x_all.shape[1:]), num_classes, seed=seed + trial)
        results.append(
            _one_trial(
                net,
                x_all[indices],
                y_all[indices],
                indices,
                trial,
                defence=defence,
                attack_type=attack_type,
                method=method,
                noise_multiplier=noise_multiplier,
                clip=clip,
                labels_known=labels_known,
                max_iterations=max_iterations,
                tolerance=tolerance,
                patience=patience,
                min_improvement=min_improvement,
                success_mse=success_mse,
                seed=seed,
            )
        )
    return LeakageSummary(
        defence=defence.value,
        attack_type=attack_type,
        method=method.value,
        batch_size=batch_size,
        noise_multiplier=float(noise_multiplier),
        clip=float(clip),
        max_iterations=max_iterations,
        success_mse=float(success_mse),
        trials=tuple(results),
    )


def _one_trial(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    indices: torch.Tensor,
    trial: int,
    *,
    defence: Defence,
    attack_type: int,
    method: Method,
    noise_multiplier: float,
    clip: float,
    labels_known: bool,
    max_iterations: int,
    tolerance: float,
    patience: int | None,
    min_improvement: float,
    success_mse: float,
    seed: int,
) -> LeakageTrial:
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    x, y = x.to(device=device, dtype=dtype), y.to(device)
    noise = torch.Generator(device=device).manual_seed(_stream(seed, trial, 1))
    leaked: LeakedGradient
    if attack_type == 2:
        views = leaked_per_example_gradients(
            model, x, y, defence=defence, noise_multiplier=noise_multiplier, clip=clip,
            generator=noise,
        )  # fmt: skip
        leaked, x, y = views[0], x[:1], y[:1]
    else:
        leaked = leaked_gradient(
            model, x, y, defence=defence, attack_type=attack_type,
            noise_multiplier=noise_multiplier, clip=clip, generator=noise,
        )  # fmt: skip
    result = reconstruct(
        model,
        leaked,
        method=method,
        input_shape=tuple(x.shape[1:]),
        max_iterations=max_iterations,
        tolerance=tolerance,
        patience=patience,
        min_improvement=min_improvement,
        label=y if labels_known else None,
        seed=_stream(seed, trial, 2),
        reference=x,
    )
    image = match_reconstructions(result.image, x.to(result.image.dtype))
    mse = reconstruction_mse(image, x)
    first = result.first_success(success_mse)
    true_labels = tuple(int(v) for v in y.tolist())
    labels = tuple(int(v) for v in result.label.tolist())
    return LeakageTrial(
        trial=trial,
        indices=tuple(int(i) for i in indices[: len(true_labels)].tolist()),
        true_labels=true_labels,
        labels=labels,
        label_correct=sorted(labels) == sorted(true_labels),
        mse=mse,
        ssim=ssim(image, x, window_size=_window(x)),
        success=attack_succeeded(mse, success_mse),
        tau=first if first is not None else max_iterations,
        iterations=result.iterations,
        stop_reason=result.stop_reason.value,
        relative_distance=result.relative_distance,
        noise_std=leaked.noise_std,
    )


def _window(x: torch.Tensor) -> int:
    """The standard 11-pixel SSIM window, shrunk to the largest odd size that fits."""
    side = min(11, *x.shape[-2:])
    return side if side % 2 == 1 else side - 1


def _stream(seed: int, trial: int, stream: int) -> int:
    """A distinct non-negative seed for each (seed, trial, stream)."""
    return (seed * 1_000_003 + trial) * 8 + stream


def _check_dataset(
    inputs: torch.Tensor, targets: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 4:
        raise GradientLeakageError("dataset_inputs must be a [N, C, H, W] tensor of images")
    if not inputs.is_floating_point():
        raise GradientLeakageError(
            f"dataset_inputs must be floating point in [0, 1], got {inputs.dtype}"
        )
    if not isinstance(targets, torch.Tensor) or targets.shape != (inputs.shape[0],):
        raise GradientLeakageError(
            f"dataset_targets must be a [{inputs.shape[0]}] tensor of labels"
        )
    if targets.dtype != torch.int64:
        raise GradientLeakageError(f"dataset_targets must be int64, got {targets.dtype}")
    if bool(((targets < 0) | (targets >= num_classes)).any()):
        raise GradientLeakageError(
            f"dataset_targets must lie in [0, {num_classes}): set num_classes"
        )
    return inputs, targets
