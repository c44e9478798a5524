"""What a gradient-leakage adversary observes under each defence (Fed-αCDP §3.1, §4, §5).

Attack types (where the adversary reads gradients while they are in use):

* **type 0** — a compromised server reads a client's update before aggregation;
* **type 1** — an adversary on the client reads the local update after training, before it
  is encrypted and sent;
* **type 2** — an adversary on the client reads the per-example gradients of a local
  iteration, before the SGD step (the strongest).

As in the authors' attack code, the update of types 0/1 is represented by one local
iteration's batch gradient (L = 1: the update is −η times it, and the unknown scale η is not
part of the observation); an update made of several local steps is not inverted here. All
gradients are of the mean softmax cross-entropy of the batch.

What the adversary observes (g_j: example j's gradient, ḡ = (1/B)Σ_j g_j; B the batch
size; σ the noise multiplier; C the clipping bound; noise i.i.d. per coordinate):

============== ==================================== ==================================
defence        types 0 / 1                          type 2 (example j)
============== ==================================== ==================================
none           ḡ                                    g_j
fed_sdp        type 0: flat_C(ḡ) + N(0, σ²C²);      g_j
               type 1: ḡ (the noise is added at
               the server, after the leak [13])
fed_sdp_client flat_C(ḡ) + N(0, σ²C²) [21]          g_j
fed_cdp        (Σ_j layer_C(g_j) + N(0, σ²C²)) / B  layer_C(g_j) + N(0, σ²C²)
fed_alpha_cdp  (Σ_j layer_C(g_j) + N(0, σ²S²)) / B  layer_C(g_j) + N(0, σ²S²)
============== ==================================== ==================================

``flat_C`` clips the whole vector to l2 norm C (:class:`~sharefl.privacy.FlatClipping`);
``layer_C`` clips every parameter tensor of every example to C
(:class:`~sharefl.privacy.L2MaxClipping`'s factors); S = min(C, the largest raw per-layer
norm of the batch) is Fed-αCDP's l2-max sensitivity (Algorithm 1 line 18), recomputed for
every batch. Fed-CDP [15] is Algorithm 1 with S = C.

Conventions (Fed-αCDP note §6.1, §6.7):

* types 0/1 under Fed-CDP/Fed-αCDP use the DP-SGD scaling of the authors' code and of
  :class:`~sharefl.privacy.DPSGD` (noise on the sum, then divided by B);
* type 2 gives every example its own N(0, σ²S²), the per-example noise of the paper's §5.2,
  which is what makes the per-example view noisy. For B = 1 the paper's three scalings
  coincide, and that is the setting of its Table III;
* Fed-SDP's noise is σC on one client's clipped update. The §6.7 client-side variant whose
  K_t noisy updates add up to the server-side noise has σC/√K_t per client: pass
  ``noise_multiplier = σ/√K_t`` for it.

σ is passed directly, so a decayed σ_t of Fed-αCDP[σ] (e.g. ``ExponentialSchedule(15,
0.0113)(t)`` of :mod:`sharefl.privacy.schedules`) is a number like any other.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sharefl.privacy.clipping import FlatClipping, L2MaxClipping
from sharefl.privacy.noise import gaussian_
from sharefl.privacy.per_example import per_example_gradients, trainable_parameters

from .errors import GradientLeakageError, enum_member

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Default clipping bound C and noise multiplier σ of Fed-αCDP (§7).
DEFAULT_CLIP = 4.0
DEFAULT_NOISE_MULTIPLIER = 6.0


class Defence(enum.StrEnum):
    """The defences of Fed-αCDP's Table III (see the module docstring for what each does)."""

    NONE = "none"
    FED_SDP = "fed_sdp"
    FED_SDP_CLIENT = "fed_sdp_client"
    FED_CDP = "fed_cdp"
    FED_ALPHA_CDP = "fed_alpha_cdp"


#: The attack types of Fed-αCDP §3.1.
ATTACK_TYPES = (0, 1, 2)


def check_defence(defence: str | Defence) -> Defence:
    """``defence`` as a :class:`Defence`, or :class:`GradientLeakageError` naming the valid ones."""
    return enum_member(Defence, defence, "defence")


def check_attack_type(attack_type: int) -> int:
    """``attack_type`` if it is 0, 1 or 2, else :class:`GradientLeakageError`."""
    if isinstance(attack_type, bool) or attack_type not in ATTACK_TYPES:
        raise GradientLeakageError(
            f"unknown attack type {attack_type!r}: use 0 (server reads the update), 1 (client "
            "reads its update) or 2 (client reads per-example gradients)"
        )
    return int(attack_type)


@dataclass(frozen=True)
class LeakedGradient:
    """A gradient as the adversary observes it.

    Attributes:
        grads: one detached tensor per trainable parameter of the model, in
            ``model.named_parameters()`` order and with the parameters' shapes and dtype.
        batch_size: number of examples it averages (1 for a per-example gradient).
        attack_type: 0, 1 or 2.
        defence: the defence it went through.
        noise_multiplier: σ used (0 when this view carries no noise).
        sensitivity: the clipping bound C or Fed-αCDP's S the noise is scaled to
            (``nan`` when this view is not clipped).
        noise_std: standard deviation of the noise on every coordinate of ``grads``.
    """

    grads: tuple[torch.Tensor, ...]
    batch_size: int
    attack_type: int
    defence: Defence
    noise_multiplier: float = 0.0
    sensitivity: float = math.nan
    noise_std: float = 0.0

    def flat(self) -> torch.Tensor:
        """All gradients concatenated into one ``[d]`` vector."""
        return torch.cat([g.reshape(-1) for g in self.grads])

    def squared_norm(self) -> float:
        """‖grads‖², the sum of squares over every coordinate."""
        return float(sum(g.double().pow(2).sum() for g in self.grads))


def leaked_gradient(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    defence: str | Defence = Defence.NONE,
    attack_type: int = 2,
    noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER,
    clip: float = DEFAULT_CLIP,
    generator: torch.Generator | None = None,
    loss_fn: LossFn = F.cross_entropy,
) -> LeakedGradient:
    """The gradient an adversary of ``attack_type`` reads from a client that trains
    ``model`` on the batch ``(inputs, targets)`` under ``defence``.

    Args:
        model: the client's model at the first local iteration; not modified.
        inputs: ``[B, ...]`` examples (B ≥ 1; B = 1 for type 2, whose view is one
            example's gradient: use :func:`leaked_per_example_gradients` for a batch).
        targets: ``[B]`` int64 class labels.
        defence: a :class:`Defence` or its name.
        attack_type: 0, 1 or 2.
        noise_multiplier: σ ≥ 0 (a decayed σ_t of Fed-αCDP[σ] is passed the same way).
        clip: C > 0.
        generator: source of the noise (on the model's device); required when the view
            carries noise (σ > 0 and a defence that adds noise to it).
        loss_fn: the mean loss of a batch, ``loss_fn(logits, targets)``.

    Returns:
        A :class:`LeakedGradient` (see the module docstring for the formula per case).

    Raises:
        GradientLeakageError: bad arguments (message says what to change), a type-2 view asked for
            a batch of more than one example, or a missing generator.
    """
    defence, attack_type = check_defence(defence), check_attack_type(attack_type)
    batch = _check_batch(inputs, targets)
    if attack_type == 2 and batch != 1:
        raise GradientLeakageError(
            f"a type-2 view is one example's gradient but the batch has {batch} examples: "
            "pass one example, or call leaked_per_example_gradients for every example"
        )
    if attack_type == 2:
        return leaked_per_example_gradients(
            model,
            inputs,
            targets,
            defence=defence,
            noise_multiplier=noise_multiplier,
            clip=clip,
            generator=generator,
            loss_fn=loss_fn,
        )[0]
    sigma, clip = _check_noise(noise_multiplier, clip)
    if defence in (Defence.FED_CDP, Defence.FED_ALPHA_CDP):
        return _per_example_defended_update(
            model, inputs, targets, defence, attack_type, sigma, clip, generator, loss_fn
        )
    grads = _batch_gradient(model, inputs, targets, loss_fn)
    noisy_sdp = defence == Defence.FED_SDP_CLIENT or (
        defence == Defence.FED_SDP and attack_type == 0
    )
    if not noisy_sdp:
        return LeakedGradient(grads, batch, attack_type, defence)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = FlatClipping(clip).factors(norm.reshape(1, 1))[0, 0]
    std = sigma * clip
    noisy = _add_noise([g * factor for g in grads], std, generator)
    return LeakedGradient(noisy, batch, attack_type, defence, sigma, clip, std)


def leaked_per_example_gradients(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    defence: str | Defence = Defence.NONE,
    noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER,
    clip: float = DEFAULT_CLIP,
    generator: torch.Generator | None = None,
    loss_fn: LossFn = F.cross_entropy,
) -> list[LeakedGradient]:
    """The type-2 views of every example of one local iteration's batch.

    Under Fed-CDP/Fed-αCDP each example's gradient is clipped per layer to C and gets its
    own N(0, σ²S²) noise, with S = C (Fed-CDP) or the l2-max S of the whole batch
    (Fed-αCDP). The other defences leave per-example gradients untouched. Arguments and
    exceptions as in :func:`leaked_gradient`; per-example gradients come from
    :func:`sharefl.privacy.per_example_gradients` (BatchNorm is refused there).

    Returns:
        B :class:`LeakedGradient`, one per example in batch order, each with batch_size 1.
    """
    defence = check_defence(defence)
    _check_batch(inputs, targets)
    sigma, clip = _check_noise(noise_multiplier, clip)
    names_params = trainable_parameters(model)
    per_example = per_example_gradients(model, loss_fn, inputs, targets)
    rows = [per_example[name].detach() for name, _ in names_params]
    if defence not in (Defence.FED_CDP, Defence.FED_ALPHA_CDP):
        return [
            LeakedGradient(tuple(r[j] for r in rows), 1, 2, defence) for j in range(len(inputs))
        ]
    clipped, sensitivity = _clip_per_layer(rows, defence, clip)
    std = sigma * sensitivity
    return [
        LeakedGradient(
            _add_noise([c[j] for c in clipped], std, generator),
            1,
            2,
            defence,
            sigma,
            sensitivity,
            std,
        )
        for j in range(len(inputs))
    ]


def _per_example_defended_update(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    defence: Defence,
    attack_type: int,
    sigma: float,
    clip: float,
    generator: torch.Generator | None,
    loss_fn: LossFn,
) -> LeakedGradient:
    """Types 0/1 under Fed-CDP/Fed-αCDP: (Σ_j layer_C(g_j) + N(0, σ²S²)) / B."""
    names_params = trainable_parameters(model)
    per_example = per_example_gradients(model, loss_fn, inputs, targets)
    rows = [per_example[name].detach() for name, _ in names_params]
    clipped, sensitivity = _clip_per_layer(rows, defence, clip)
    batch = len(inputs)
    sums = [c.sum(0) for c in clipped]
    noisy = _add_noise(sums, sigma * sensitivity, generator)
    std = sigma * sensitivity / batch
    return LeakedGradient(
        tuple(g / batch for g in noisy), batch, attack_type, defence, sigma, sensitivity, std
    )


def _clip_per_layer(
    rows: Sequence[torch.Tensor], defence: Defence, clip: float
) -> tuple[list[torch.Tensor], float]:
    """Clip every layer of every example to C (``rows``: ``[B, *shape]`` per parameter);
    return the clipped rows and the noise's sensitivity (C, or Fed-αCDP's S)."""
    mode = L2MaxClipping(clip)
    norms = torch.stack([torch.linalg.vector_norm(r.flatten(1), dim=1) for r in rows])
    factors = mode.factors(norms)  # [L, B]
    clipped = [
        r * f.reshape(-1, *([1] * (r.dim() - 1))).to(r.dtype)
        for r, f in zip(rows, factors, strict=True)
    ]
    if defence == Defence.FED_CDP:
        return clipped, clip
    numels = [r[0].numel() for r in rows]
    return clipped, mode.batch_sensitivity(float(norms.max()), numels)


def _batch_gradient(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, loss_fn: LossFn
) -> tuple[torch.Tensor, ...]:
    params = [p for _, p in trainable_parameters(model)]
    if not params:
        raise GradientLeakageError("the model has no parameter with requires_grad=True")
    with torch.enable_grad():
        loss = loss_fn(model(inputs), targets)
        grads = torch.autograd.grad(loss, params)
    return tuple(g.detach() for g in grads)


def _add_noise(
    grads: Sequence[torch.Tensor], std: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, ...]:
    """``grads`` + N(0, std²) per coordinate, drawn from ``generator`` (new tensors)."""
    if std == 0.0:
        return tuple(g.clone() for g in grads)
    if generator is None:
        raise GradientLeakageError(
            "this view carries noise: pass generator=torch.Generator().manual_seed(seed) "
            "(on the model's device) so that the noise is reproducible"
        )
    return tuple(g + gaussian_(torch.empty_like(g), std, generator) for g in grads)


def _check_noise(noise_multiplier: float, clip: float) -> tuple[float, float]:
    sigma, bound = float(noise_multiplier), float(clip)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise GradientLeakageError(
            f"noise_multiplier must be a finite number ≥ 0, got {noise_multiplier!r}"
        )
    if not (math.isfinite(bound) and bound > 0):
        raise GradientLeakageError(f"clip must be a positive finite number, got {clip!r}")
    return sigma, bound


def _check_batch(inputs: torch.Tensor, targets: torch.Tensor) -> int:
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise GradientLeakageError("inputs and targets must be torch tensors")
    if inputs.dim() < 2 or targets.dim() != 1 or inputs.shape[0] != targets.shape[0]:
        raise GradientLeakageError(
            "inputs must be [B, ...] and targets [B] with the same B, got shapes "
            f"{tuple(inputs.shape)} and {tuple(targets.shape)}"
        )
    if inputs.shape[0] == 0:
        raise GradientLeakageError("the batch is empty: pass at least one example")
    if targets.dtype != torch.int64:
        raise GradientLeakageError(f"targets must be int64 class labels, got {targets.dtype}")
    return int(inputs.shape[0])
