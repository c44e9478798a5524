"""The attack network of Fed-αCDP's (and CPL's) attack notebooks.

Not the model the paper trains: its gradient-leakage evaluation attacks a LeNet-style
network with four 5×5 convolutions of 12 channels (strides 2, 2, 1, 1, padding 2), each
followed by a sigmoid, then one fully connected layer. Every weight and bias is drawn from
U(−0.5, 0.5), as the notebooks' ``weights_init`` does. Sigmoid activations keep the
penultimate features positive, which makes iDLG's label inference exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .errors import GradientLeakageError

#: Channels of every convolution.
CHANNELS = 12
#: Strides of the four convolutions.
STRIDES = (2, 2, 1, 1)
#: Kernel size and padding of every convolution.
KERNEL, PADDING = 5, 2


def _conv_out(size: int, stride: int) -> int:
    return (size + 2 * PADDING - KERNEL) // stride + 1


def check_input_shape(input_shape: Sequence[int]) -> tuple[int, int, int]:
    """``input_shape`` as a ``(channels, height, width)`` tuple of positive ints, or
    :class:`GradientLeakageError`."""
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(s, int) and s > 0 for s in shape):
        raise GradientLeakageError(
            f"input_shape must be (channels, height, width) of positive ints, got {input_shape!r}"
        )
    return shape


class CPLAttackNetwork(nn.Module):
    """``body`` (4 conv + sigmoid) → flatten → ``fc``; input ``[B, C, H, W]``, output
    ``[B, num_classes]`` logits. Its trainable parameters, in order: the weight and bias of
    each convolution, then ``fc.weight`` ``[num_classes, features]`` and ``fc.bias``."""

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        shape = check_input_shape(input_shape)
        channels, height, width = shape
        if not (isinstance(num_classes, int) and num_classes >= 2):
            raise GradientLeakageError(f"num_classes must be an int ≥ 2, got {num_classes!r}")
        layers: list[nn.Module] = []
        c_in = channels
        for stride in STRIDES:
            layers += [nn.Conv2d(c_in, CHANNELS, KERNEL, stride=stride, padding=PADDING)]
            layers += [nn.Sigmoid()]
            c_in = CHANNELS
            height, width = _conv_out(height, stride), _conv_out(width, stride)
        self.input_shape = shape
        self.body = nn.Sequential(*layers)
        self.features = CHANNELS * height * width
        self.fc = nn.Linear(self.features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


def cpl_attack_network(
    input_shape: Sequence[int] = (1, 28, 28),
    num_classes: int = 10,
    *,
    seed: int = 0,
    init_range: float = 0.5,
    dtype: torch.dtype = torch.float32,
) -> CPLAttackNetwork:
    """The attack network for images of ``input_shape`` = (C, H, W), every parameter drawn
    from U(−init_range, init_range) with a generator seeded by ``seed``.

    The fully connected layer has 12·⌈H/4⌉·⌈W/4⌉ inputs: 588 for 28×28 (MNIST), 768 for
    32×32 (CIFAR10, LFW), as in the authors' notebooks.

    Raises:
        GradientLeakageError: a malformed shape, fewer than 2 classes or a non-positive range.
    """
    if not init_range > 0:
        raise GradientLeakageError(f"init_range must be > 0, got {init_range!r}")
    model = CPLAttackNetwork(input_shape, num_classes)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.uniform_(-init_range, init_range, generator=generator)
    return model.to(dtype)
