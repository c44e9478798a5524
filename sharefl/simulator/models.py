"""The papers' models, by name.

:func:`build_model` builds a registered model for inputs of shape ``input_shape`` (one
example, e.g. ``(1, 28, 28)``; batches are ``[B, *input_shape]``) returning logits
``[B, num_classes]`` (train with cross-entropy). There is no BatchNorm (or any buffer that
mixes examples), so every model works with ``torch.func.vmap`` per-example gradients; models
with dropout need ``randomness="different"``. Their dropout is :class:`GeneratorDropout`:
inside :func:`dropout_generator` it draws its masks from the generator given there (the
simulator passes its training generator, so a run's dropout follows from its seed and its
checkpoints), elsewhere from torch's global generator like ``nn.Dropout``.

========================= ========================================================== ===============
name                      model                                                      parameters*
========================= ========================================================== ===============
``dp_filter_cnn``         Xiang et al.'s MNIST CNN (Table 7), GroupNorm w/o affine   21,802
``dp_filter_mlp``         Xiang et al.'s Fashion/USPS MLP 784-32-10, ELU (Table 8)   25,450
``dp_filter_resnet``      Xiang et al.'s Colorectal residual CNN (their code)        33,736 (8 cl.)
``dp_rsa_mlp``            Zhu & Ling's MNIST MLP 784-50-50-10, tanh                  42,310
``dp_rsa_cnn``            Zhu & Ling's CIFAR-10 CNN as in their code                 576,778 (CIFAR)
``fed_cdp_cnn``           Wei et al.'s CNN (their code), no biases, dropout 0.5      34,720
``decentralized_softmax`` Ye et al.'s softmax regression 784→10                      7,850
``mcmahan_cnn``           McMahan et al.'s CNN (5×5 convs 32, 64; FC 512)            1,663,370
``mlp``                   generic MLP, ``hidden=(200, 200)``, ``activation="relu"``  199,210
========================= ========================================================== ===============

\\* for ``(1, 28, 28)`` inputs and 10 classes unless noted. Other shapes: ``fed_cdp_cnn`` has
42,336 for ``(3, 32, 32)`` and 10 classes, 162,144 with LFW's 62 classes; ``mcmahan_cnn``
2,156,490 for ``(3, 32, 32)``; ``dp_rsa_cnn`` 401,546 for ``(1, 28, 28)``.

The papers' codename forms (``seed000_cnn`` …) are aliases of these names
(:data:`~sharefl.simulator.names.MODEL_ALIASES`); :func:`build_model` accepts both.

Errors (unknown name or option, an input shape a model cannot take) raise
:class:`ModelError`.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from sharefl.privacy.reference_models import seed000_mnist_cnn, seed002_cifar_cnn
from sharefl.simulator.errors import SimulatorError
from sharefl.simulator.names import model_name


class ModelError(SimulatorError, ValueError):
    """A model cannot be built as asked; the message says what to change."""


MODELS: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a factory under ``name`` in :data:`MODELS`.

    The factory takes keyword arguments ``num_classes: int`` and
    ``input_shape: tuple[int, ...]`` plus its own options, and raises :class:`ModelError` if
    the shape does not fit.

    Raises:
        ModelError: if ``name`` is already registered to another factory.
    """

    def decorate(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if MODELS.get(name, factory) is not factory:
            raise ModelError(f"model name {name!r} is already registered")
        MODELS[name] = factory
        return factory

    return decorate


def build_model(
    name: str,
    *,
    num_classes: int = 10,
    input_shape: Sequence[int] = (1, 28, 28),
    seed: int | None = None,
    **options: Any,
) -> nn.Module:
    """Build model ``name`` for examples of shape ``input_shape`` and ``num_classes`` classes.

    Args:
        name: a key of :data:`MODELS`, or its alias (:func:`~sharefl.simulator.names.
            model_name`).
        num_classes: number of output logits, ``>= 1``.
        input_shape: shape of one example, ``(C, H, W)`` for image models; MLPs flatten.
        seed: if given, the initial weights depend only on it (the global torch RNG is
            neither used nor changed); otherwise they are drawn from the global torch RNG.
        **options: passed to the factory (e.g. ``hidden=(200, 200)`` for ``mlp``).

    Returns:
        the model, in training mode, on the CPU, float32.

    Raises:
        ModelError: unknown name or option, ``num_classes < 1``, an input shape the model
            cannot take.
    """
    name = model_name(name)
    factory = MODELS.get(name)
    if factory is None:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ModelError(f"num_classes must be a positive int, got {num_classes!r}")
    shape = tuple(input_shape)
    if not shape or not all(isinstance(s, int) and s >= 1 for s in shape):
        raise ModelError(f"input_shape must be positive ints, got {input_shape!r}")
    kwargs = {"num_classes": num_classes, "input_shape": shape, **options}
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ModelError(f"model {name!r}: bad option(s) {sorted(options)} ({exc})") from exc
    if seed is None:
        return factory(**kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(**kwargs)


def num_parameters(model: nn.Module) -> int:
    """Number of scalar parameters of ``model`` (all, trainable or not)."""
    return sum(p.numel() for p in model.parameters())


def seed000_init(model: nn.Module) -> nn.Module:
    """Xiang et al.'s initialisation (their ``init_model_para``), in place, from the global
    torch RNG: Xavier-normal for ``Linear`` weights, ``N(0, 2/(k_h·k_w·C_out))`` for
    ``Conv2d`` weights; biases keep PyTorch's default initialisation, as in their code.
    (Their code also reseeds with 1234 before each block, giving seven identical residual
    blocks; that is not reproduced.)"""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_normal_(m.weight)
        elif isinstance(m, nn.Conv2d):
            fan = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan))
    return model


# ---------------------------------------------------------------------------------------------
# Shape helpers


def _image(name: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise ModelError(f"{name} needs image inputs (C, H, W), got input_shape {shape}")
    return shape[0], shape[1], shape[2]


def _check_side(name: str, shape: tuple[int, ...], side: int, smallest: int) -> None:
    if side < 1:
        raise ModelError(
            f"{name}: input_shape {shape} is too small; height and width must be >= {smallest}"
        )


def _pool(size: int, k: int, stride: int) -> int:
    return (size - k) // stride + 1 if size >= k else 0


# ---------------------------------------------------------------------------------------------
# the DP filter (Xiang et al.)


@register_model("dp_filter_cnn")
def dp_filter_cnn(
    *, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)
) -> nn.Module:
    """Three Conv(16, 5×5)-ELU-GroupNorm(4, affine=False) blocks without padding,
    AdaptiveAvgPool(4×4), Linear(256, 32), ELU, Linear(32, classes); :func:`seed000_init`.
    21,802 parameters for ``(1, 28, 28)`` and 10 classes (+1,200 per extra input channel).
    Needs H, W >= 13."""
    c, h, w = _image("dp_filter_cnn", input_shape)
    _check_side("dp_filter_cnn", input_shape, min(h, w) - 12, 13)
    model = seed000_mnist_cnn(num_classes)
    if c != 1:
        model[0] = nn.Conv2d(c, 16, 5)
    return seed000_init(model)


@register_model("dp_filter_mlp")
def dp_filter_mlp(
    *, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)
) -> nn.Module:
    """Flatten, Linear(F, 32), ELU, Linear(32, classes); :func:`seed000_init`. 25,450
    parameters for F = 784 and 10 classes."""
    features = math.prod(input_shape)
    return seed000_init(
        nn.Sequential(nn.Flatten(), nn.Linear(features, 32), nn.ELU(), nn.Linear(32, num_classes))
    )


class _Seed000Residual(nn.Module):
    """``MaxPool(2, stride 1)(body(x) + x)``, body = 2 × [Conv(16, 3×3, pad 1), ELU, GN]."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(2):
            layers += [
                nn.Conv2d(channels, channels, 3, padding=1),
                nn.ELU(),
                nn.GroupNorm(4, channels, affine=False),
            ]
        self.body = nn.Sequential(*layers)
        self.pool = nn.MaxPool2d(2, stride=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.body(x) + x)


@register_model("dp_filter_resnet")
def dp_filter_resnet(
    *, num_classes: int = 8, input_shape: tuple[int, ...] = (3, 64, 64)
) -> nn.Module:
    """Xiang et al.'s Colorectal network (their code; 64×64 RGB, 8 classes): stem
    Conv(16, 3×3, pad 1)-ELU-GN(4, affine=False), 7 residual blocks
    ``x = MaxPool(2, stride 1)(block(x) + x)`` with block = 2 × [Conv(16, 3×3, pad 1), ELU,
    GN], AdaptiveAvgPool(1), Linear(16, 32), ELU, Linear(32, classes); :func:`seed000_init`.
    33,736 parameters for 3 channels and 8 classes (33,802 with 10). Needs H, W >= 8."""
    c, h, w = _image("dp_filter_resnet", input_shape)
    _check_side("dp_filter_resnet", input_shape, min(h, w) - 7, 8)
    return seed000_init(
        nn.Sequential(
            nn.Conv2d(c, 16, 3, padding=1),
            nn.ELU(),
            nn.GroupNorm(4, 16, affine=False),
            *(_Seed000Residual(16) for _ in range(7)),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, 32),
            nn.ELU(),
            nn.Linear(32, num_classes),
        )
    )


# ---------------------------------------------------------------------------------------------
# DP-RSA (Zhu & Ling)


@register_model("dp_rsa_mlp")
def dp_rsa_mlp(*, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)) -> nn.Module:
    """Flatten, Linear(F, 50), tanh, Linear(50, 50), tanh, Linear(50, classes) (their code
    ends in log-softmax + NLL, which equals cross-entropy on these logits). 42,310
    parameters for F = 784 and 10 classes."""
    features = math.prod(input_shape)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, 50),
        nn.Tanh(),
        nn.Linear(50, 50),
        nn.Tanh(),
        nn.Linear(50, num_classes),
    )


@register_model("dp_rsa_cnn")
def dp_rsa_cnn(*, num_classes: int = 10, input_shape: tuple[int, ...] = (3, 32, 32)) -> nn.Module:
    """Conv(64, 5×5)-ReLU-MaxPool(3, s2) ×2, FC F→384→192→classes, ReLU (their code; the
    paper's "~368k" does not match). 576,778 parameters for ``(3, 32, 32)``; the first
    convolution and FC adapt to other shapes. Needs H, W >= 19."""
    c, h, w = _image("dp_rsa_cnn", input_shape)

    def side(s: int) -> int:
        return _pool(_pool(s - 4, 3, 2) - 4, 3, 2)

    hh, ww = side(h), side(w)
    _check_side("dp_rsa_cnn", input_shape, min(hh, ww), 19)
    model = seed002_cifar_cnn(num_classes)
    if c != 3:
        model[0] = nn.Conv2d(c, 64, 5)
    if hh * ww != 16:
        model[7] = nn.Linear(64 * hh * ww, 384)
    return model


# ---------------------------------------------------------------------------------------------
# Dropout drawn from an explicit generator


class GeneratorDropout(nn.Dropout):
    """``nn.Dropout`` whose masks come from :attr:`generator` when one is set.

    ``nn.Dropout`` always draws from torch's global generator, which nothing in a run seeds:
    two runs of one configuration would train with different masks. With :attr:`generator`
    set (see :func:`dropout_generator`) each element is kept with probability ``1 − p``
    (``torch.bernoulli(…, generator=generator)``) and scaled by ``1/(1 − p)``, the law of
    ``nn.Dropout``; under ``torch.func.vmap(randomness="different")`` every example gets its
    own mask from that generator. With no generator set it is ``nn.Dropout``. It holds no
    parameter or buffer, so state dicts are those of the same model with ``nn.Dropout``.
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__(p, inplace)
        self.generator: torch.Generator | None = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        generator = self.generator
        if generator is None or not self.training or self.p == 0:
            return super().forward(input)
        if self.p == 1:
            return input * 0.0
        keep = torch.bernoulli(torch.full_like(input, 1.0 - self.p), generator=generator)
        return input * keep / (1.0 - self.p)


@contextlib.contextmanager
def dropout_generator(module: nn.Module, generator: torch.Generator | None) -> Iterator[None]:
    """Within the block, every :class:`GeneratorDropout` of ``module`` draws from
    ``generator`` (on the module's device); the previous generators are put back after."""
    layers = [m for m in module.modules() if isinstance(m, GeneratorDropout)]
    before = [m.generator for m in layers]
    for m in layers:
        m.generator = generator
    try:
        yield
    finally:
        for m, g in zip(layers, before, strict=True):
            m.generator = g


# ---------------------------------------------------------------------------------------------
# Fed-αCDP (Wei et al.) and the decentralized paper (Ye et al.)


@register_model("fed_cdp_cnn")
def fed_cdp_cnn(*, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)) -> nn.Module:
    """Fed-αCDP's Keras CNN (their ``Fed_alphaCDP.py``): Conv(32, 3×3, ReLU, no bias),
    MaxPool 2, Conv(64, 3×3, ReLU, no bias), MaxPool 2, Flatten, Dropout(0.5),
    Linear(classes, no bias) (Keras "valid" padding). Parameters: 34,720 for ``(1, 28, 28)``
    and 10 classes; 42,336 for ``(3, 32, 32)``; 162,144 for LFW's ``(3, 32, 32)`` and 62
    classes. Needs H, W >= 10; vmap it with ``randomness="different"``. The dropout is a
    :class:`GeneratorDropout` (the simulator's training draws its masks from the run's
    generator)."""
    c, h, w = _image("fed_cdp_cnn", input_shape)

    def side(s: int) -> int:
        return _pool(_pool(s - 2, 2, 2) - 2, 2, 2)

    hh, ww = side(h), side(w)
    _check_side("fed_cdp_cnn", input_shape, min(hh, ww), 10)
    return nn.Sequential(
        nn.Conv2d(c, 32, 3, bias=False),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, bias=False),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        GeneratorDropout(0.5),
        nn.Linear(64 * hh * ww, num_classes, bias=False),
    )


@register_model("decentralized_softmax")
def decentralized_softmax(
    *, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)
) -> nn.Module:
    """Softmax regression: Flatten, Linear(F, classes) with bias. 7,850 parameters for
    F = 784 and 10 classes. (Ye et al. train it in float64: call ``.double()``.)"""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


# ---------------------------------------------------------------------------------------------
# Common baselines


@register_model("mcmahan_cnn")
def mcmahan_cnn(*, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)) -> nn.Module:
    """McMahan et al. (2017)'s CNN: Conv(32, 5×5, "same")-ReLU-MaxPool 2, Conv(64, 5×5,
    "same")-ReLU-MaxPool 2, Linear(512), ReLU, Linear(classes). 1,663,370 parameters for
    ``(1, 28, 28)`` (as in the paper), 2,156,490 for ``(3, 32, 32)``. Needs H, W >= 4."""
    c, h, w = _image("mcmahan_cnn", input_shape)
    hh, ww = h // 4, w // 4
    _check_side("mcmahan_cnn", input_shape, min(hh, ww), 4)
    return nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * hh * ww, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    )


@register_model("dp_cnn")
def dp_cnn(*, num_classes: int = 10, input_shape: tuple[int, ...] = (1, 28, 28)) -> nn.Module:
    """The small tanh CNN of the DP-SGD literature (Papernot et al. 2021, "tempered
    sigmoid"; Opacus's MNIST example): Conv(16, 8×8, stride 2, pad 3)-tanh-MaxPool(2, 1),
    Conv(32, 4×4, stride 2)-tanh-MaxPool(2, 1), Linear(32)-tanh, Linear(classes). 26,010
    parameters on 1×28×28 and about 0.3 M multiply-adds per example (the DP filter's CNN: 4.4 M),
    which makes it the fast choice for private MNIST-sized runs."""
    c, h, w = _image("dp_cnn", input_shape)

    def side(n: int) -> int:
        n = _pool((n + 2 * 3 - 8) // 2 + 1, 2, 1)
        return _pool((n - 4) // 2 + 1, 2, 1) if n >= 4 else 0

    hh, ww = side(h), side(w)
    _check_side("dp_cnn", input_shape, min(hh, ww), 16)
    return nn.Sequential(
        nn.Conv2d(c, 16, 8, stride=2, padding=3),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2),
        nn.Tanh(),
        nn.MaxPool2d(2, 1),
        nn.Flatten(),
        nn.Linear(32 * hh * ww, 32),
        nn.Tanh(),
        nn.Linear(32, num_classes),
    )


_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "sigmoid": nn.Sigmoid,
}


@register_model("mlp")
def mlp(
    *,
    num_classes: int = 10,
    input_shape: tuple[int, ...] = (1, 28, 28),
    hidden: Sequence[int] = (200, 200),
    activation: str = "relu",
    bias: bool = True,
) -> nn.Module:
    """Flatten, then ``Linear(h_i)``-activation for each ``h_i`` in ``hidden``, then
    ``Linear(classes)``. ``activation``: relu, tanh, elu or sigmoid. The default is McMahan
    et al.'s "2NN" (199,210 parameters for F = 784). ``hidden=()`` is softmax regression."""
    if activation not in _ACTIVATIONS:
        raise ModelError(f"mlp: activation must be one of {', '.join(_ACTIVATIONS)}")
    sizes = [math.prod(input_shape), *hidden]
    if not all(isinstance(s, int) and s >= 1 for s in hidden):
        raise ModelError(f"mlp: hidden sizes must be positive ints, got {hidden!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b, bias=bias), _ACTIVATIONS[activation]()]
    layers.append(nn.Linear(sizes[-1], num_classes, bias=bias))
    return nn.Sequential(*layers)
