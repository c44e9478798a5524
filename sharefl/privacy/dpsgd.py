"""DP-SGD gradients: per-example gradients, clipping, Gaussian noise, in one pass.

For a batch of examples (a Poisson sample with rate q of a local dataset of n, so its
expected size is B = q·n), step t releases

    g̃_t = (Σ_j clip(g_j) + N(0, σ_t² Δ² I_d)) / B,

with Δ the clipping mode's sensitivity (:mod:`sharefl.privacy.clipping`) and σ_t the noise
multiplier of the schedule at t. Dividing by the fixed expected size B (not the random
sample size) is what the sampled Gaussian mechanism's accounting assumes; an empty sample
releases pure noise. Each step is one sampled Gaussian mechanism with (σ_t, q) in the
accountant. (Fixed-size batches, as in the DP filter's code, call for replace-one adjacency, under
which the sensitivity doubles: account such runs with σ_t/2.)

Memory: per-example gradients are produced chunk by chunk (:class:`PerExampleGradients`),
scaled and summed into the output by one matrix-vector product per layer, so at most one
chunk of b·d floats is alive. For modes with a static sensitivity the noise is drawn
straight into the output before the sum (no extra pass, no noise buffer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .accountant import PrivacyAccountant, check_sample_rate
from .clipping import ClippingMode, Normalization
from .errors import PrivacyConfigError
from .noise import add_gaussian_noise_, check_generator, gaussian_
from .per_example import DEFAULT_CHUNK_BYTES, LossFn, PerExampleGradients
from .schedules import NoiseSchedule


@dataclass(frozen=True)
class DPSGDConfig:
    """Configuration of :class:`DPSGD`.

    Attributes:
        clipping: a clipping mode, or ``None`` for no clipping, which is only allowed with
            ``noise_multiplier=0`` (a non-private step, for testing against plain SGD).
        noise_multiplier: σ (a number ≥ 0) or a schedule of σ_t. Noise std on the sum of
            clipped gradients = σ_t × the mode's sensitivity.
        expected_batch_size: B, the denominator (q × local dataset size for Poisson
            sampling; the batch size for fixed batches).
        sample_rate: q, needed when an accountant is attached.
        chunk_size: examples per vmap call (``None``: from ``max_chunk_bytes``).
        max_chunk_bytes: memory budget of one chunk of per-example gradients.
    """

    clipping: ClippingMode | None
    noise_multiplier: float | NoiseSchedule
    expected_batch_size: float
    sample_rate: float | None = None
    chunk_size: int | None = None
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self) -> None:
        if not (math.isfinite(self.expected_batch_size) and self.expected_batch_size > 0):
            raise PrivacyConfigError(
                f"expected_batch_size must be > 0, got {self.expected_batch_size!r}"
            )
        if self.sample_rate is not None:
            check_sample_rate(self.sample_rate)
        noisy = True
        if not isinstance(self.noise_multiplier, NoiseSchedule):
            sigma = float(self.noise_multiplier)
            if not (math.isfinite(sigma) and sigma >= 0):
                raise PrivacyConfigError(
                    f"noise_multiplier must be a finite number ≥ 0 or a NoiseSchedule, got "
                    f"{self.noise_multiplier!r}"
                )
            noisy = sigma > 0
        if self.clipping is None and noisy:
            raise PrivacyConfigError(
                "noise is calibrated to the clipping bound: choose a clipping mode "
                "(FlatClipping(max_norm) for standard DP-SGD), or set noise_multiplier=0 "
                "for a non-private step"
            )

    def sigma(self, t: int) -> float:
        """σ_t."""
        if isinstance(self.noise_multiplier, NoiseSchedule):
            return self.noise_multiplier(t)
        return float(self.noise_multiplier)


@dataclass(frozen=True)
class PrivateGradient:
    """One released DP-SGD gradient.

    Attributes:
        flat: ``[d]`` tensor, (Σ_j contributions + noise) / expected_batch_size, laid out as
            the trainable parameters in module order. A fresh tensor, owned by the caller.
        t: schedule index of the step.
        noise_multiplier: σ_t.
        sensitivity: l2 sensitivity Δ of the sum (S_t for Fed-αCDP's l2-max mode).
        noise_std: σ_t·Δ, std of every coordinate of the noise on the sum.
        batch_size: number of examples in the (possibly empty) sample.
    """

    flat: torch.Tensor
    t: int
    noise_multiplier: float
    sensitivity: float
    noise_std: float
    batch_size: int
    parameters: tuple[nn.Parameter, ...] = field(repr=False)

    def views(self) -> list[torch.Tensor]:
        """Views of :attr:`flat` shaped like each trainable parameter."""
        parts = _split(self.flat, [p.numel() for p in self.parameters])
        return [part.view_as(p) for part, p in zip(parts, self.parameters, strict=True)]

    def write_grads(self) -> None:
        """Set every trainable parameter's ``.grad`` to its view of :attr:`flat` (no copy:
        the grads share memory with :attr:`flat`)."""
        for p, g in zip(self.parameters, self.views(), strict=True):
            p.grad = g


class DPSGD:
    """Client-side DP-SGD privatizer for one model.

    Args:
        model: module without batch-coupled layers; its trainable parameters are privatized.
        loss_fn: per-batch loss, applied to one example at a time (``F.cross_entropy``).
        config: see :class:`DPSGDConfig`.
        generator: the source of all noise, on the model's device.
        accountant: if given, stepped once per :meth:`privatize` with (σ_t, q); then
            ``config.sample_rate`` is required.

    Raises:
        UnsupportedModuleError: the model has BatchNorm.
        PrivacyConfigError: inconsistent configuration or generator on another device.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        config: DPSGDConfig,
        *,
        generator: torch.Generator,
        accountant: PrivacyAccountant | None = None,
    ) -> None:
        self.config = config
        self.per_example = PerExampleGradients(
            model, loss_fn, chunk_size=config.chunk_size, max_chunk_bytes=config.max_chunk_bytes
        )
        first = self.per_example.parameters[0]
        check_generator(generator, first.device)
        if accountant is not None and config.sample_rate is None:
            raise PrivacyConfigError(
                "an accountant needs the sampling rate: set DPSGDConfig.sample_rate = q"
            )
        self.generator = generator
        self.accountant = accountant
        self.steps_taken = 0
        self._momentum: torch.Tensor | None = None
        self._scratch: torch.Tensor | None = None

    @property
    def parameters(self) -> tuple[nn.Parameter, ...]:
        return self.per_example.parameters

    @property
    def dim(self) -> int:
        """d, the number of privatized coordinates."""
        return self.per_example.dim

    def reset_momentum(self) -> None:
        """Forget the DP filter's momentum state (the next step starts from m = 0)."""
        self._momentum = None

    def privatize(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, t: int | None = None
    ) -> PrivateGradient:
        """The private gradient of one step on the sampled batch ``(inputs, targets)``.

        Args:
            inputs: ``[b, ...]`` examples of the sample (b may be 0).
            targets: ``[b, ...]`` labels.
            t: schedule index of σ_t; default: the number of earlier calls.

        Returns:
            A :class:`PrivateGradient`; the model is not modified (see
            :meth:`PrivateGradient.write_grads` or :meth:`backward`).
        """
        cfg, mode = self.config, self.config.clipping
        t = self.steps_taken if t is None else t
        sigma = cfg.sigma(t)
        numels = self.per_example.numels
        first = self.parameters[0]
        out = torch.empty(self.dim, dtype=first.dtype, device=first.device)
        out_views = _split(out, numels)
        static = mode is None or not mode.data_dependent
        if static:  # noise drawn straight into the output: no extra pass, no noise buffer
            sensitivity = 0.0 if mode is None else mode.sensitivity(numels)  # None ⇒ σ = 0
            gaussian_(out, sigma * sensitivity, self.generator)
        else:
            out.zero_()
        momentum_views = self._momentum_views() if isinstance(mode, Normalization) else None
        max_norm = torch.full((), math.nan, dtype=first.dtype, device=first.device)

        for grads in self.per_example.chunks(inputs, targets):
            chunk_max = self._accumulate(grads, out_views, momentum_views)
            if chunk_max is not None:
                max_norm = torch.fmax(max_norm, chunk_max)
            del grads  # free this chunk before the next one is computed

        if mode is not None and not static:
            sensitivity = mode.batch_sensitivity(float(max_norm), numels)
            if self._scratch is None or self._scratch.shape != out.shape:
                self._scratch = torch.empty_like(out)
            add_gaussian_noise_(out, sigma * sensitivity, self.generator, scratch=self._scratch)
        out.div_(cfg.expected_batch_size)

        if momentum_views is not None and self._momentum is not None:
            self._momentum.copy_(out)  # Algorithm 1: the state is the last noisy upload
        if self.accountant is not None and cfg.sample_rate is not None:  # checked together
            self.accountant.step(sigma, cfg.sample_rate, 1)
        self.steps_taken += 1
        return PrivateGradient(
            flat=out,
            t=t,
            noise_multiplier=sigma,
            sensitivity=sensitivity,
            noise_std=sigma * sensitivity,
            batch_size=inputs.shape[0],
            parameters=self.parameters,
        )

    def _accumulate(
        self,
        grads: list[torch.Tensor],
        out_views: list[torch.Tensor],
        momentum_views: list[torch.Tensor] | None,
    ) -> torch.Tensor | None:
        """Add the clipped ``[b, numel]`` per-example gradients of one chunk into
        ``out_views``; return the chunk's largest layer norm for data-dependent modes."""
        mode = self.config.clipping
        if mode is None:
            for acc, g in zip(out_views, grads, strict=True):
                acc.add_(g.sum(0))
            return None
        if momentum_views is not None:
            mode.prepare_(grads, momentum_views)  # φ_j = (1 − β)g_j + β·m, in place
        norms = torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads])
        factors = mode.factors(norms)
        per_layer = factors.shape[0] > 1
        for i, (acc, g) in enumerate(zip(out_views, grads, strict=True)):
            acc.addmv_(g.t(), factors[i if per_layer else 0])
        return norms.max() if mode.data_dependent else None

    def backward(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, t: int | None = None
    ) -> PrivateGradient:
        """:meth:`privatize`, then set every trainable parameter's ``.grad`` to the private
        gradient, ready for any ``torch.optim`` optimizer's ``step()``."""
        result = self.privatize(inputs, targets, t=t)
        result.write_grads()
        return result

    def _momentum_views(self) -> list[torch.Tensor]:
        if self._momentum is None:
            first = self.parameters[0]
            self._momentum = torch.zeros(self.dim, dtype=first.dtype, device=first.device)
        return _split(self._momentum, self.per_example.numels)

    def state_dict(self) -> dict[str, object]:
        """Step count and the DP filter's momentum state (the generator's state is the caller's)."""
        return {"steps_taken": self.steps_taken, "momentum": self._momentum}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore :meth:`state_dict`'s output."""
        momentum = state["momentum"]
        if momentum is not None and (
            not isinstance(momentum, torch.Tensor) or momentum.shape != (self.dim,)
        ):
            raise PrivacyConfigError(f"momentum state must be a tensor of shape ({self.dim},)")
        self.steps_taken = int(state["steps_taken"])  # type: ignore[call-overload]
        self._momentum = None if momentum is None else momentum.clone()


def _split(flat: torch.Tensor, numels: Sequence[int]) -> list[torch.Tensor]:
    """Consecutive 1-D views of ``flat``, one per parameter."""
    return list(torch.split(flat, list(numels)))
