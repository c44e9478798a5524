"""The two small CNNs the privacy tests and benchmark run on (the simulator's model zoo will
own them later). Architectures only; PyTorch's default initialisation.

- :func:`seed000_mnist_cnn`: the DP filter's MNIST CNN (its Table 7), d = 21,802 parameters, for
  1×28×28 inputs. The count matches only with GroupNorm(affine=False), as the authors' code
  confirms; no padding.
- :func:`seed002_cifar_cnn`: DP-RSA's CIFAR-10 CNN as its code builds it (the paper says
  ~368k parameters; the code has 576,778), for 3×32×32 inputs.
"""

from __future__ import annotations

from torch import nn


def seed000_mnist_cnn(num_classes: int = 10) -> nn.Sequential:
    """Conv(1→16,k5)-ELU-GN(4,16) ×3 (16→16), AdaptiveAvgPool(4,4), Linear(256,32), ELU,
    Linear(32,10): 21,802 parameters."""

    def block(c_in: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, 16, 5), nn.ELU(), nn.GroupNorm(4, 16, affine=False)]

    return nn.Sequential(
        *block(1),
        *block(16),
        *block(16),
        nn.AdaptiveAvgPool2d((4, 4)),
        nn.Flatten(),
        nn.Linear(256, 32),
        nn.ELU(),
        nn.Linear(32, num_classes),
    )


def seed002_cifar_cnn(num_classes: int = 10) -> nn.Sequential:
    """Conv(3→64,k5)-ReLU-MaxPool(3,s2)-Conv(64→64,k5)-ReLU-MaxPool(3,s2)-FC 1024→384→192→10:
    576,778 parameters."""
    return nn.Sequential(
        nn.Conv2d(3, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.Flatten(),
        nn.Linear(1024, 384),
        nn.ReLU(),
        nn.Linear(384, 192),
        nn.ReLU(),
        nn.Linear(192, num_classes),
    )
