"""Poisson sampling of examples (DP-SGD) and of clients (client-level DP).

Each of the ``population`` items joins a sample independently with probability
``sample_rate``: this is the sampling the accountants assume (add/remove adjacency). The
sample size is random and can be 0; callers must handle an empty sample (DP-SGD still
releases pure noise for it, see :class:`sharefl.privacy.DPSGD`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .accountant import check_sample_rate
from .errors import PrivacyConfigError


def poisson_sample(population: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices (int64, ascending, on the generator's device) of a Poisson sample.

    Args:
        population: number of items, ≥ 0.
        sample_rate: inclusion probability q of each item, in [0, 1].
        generator: source of randomness; the draw uses ``population`` uniforms from it.

    Returns:
        A 1-D tensor of distinct indices in [0, population), possibly empty.
    """
    if population < 0:
        raise PrivacyConfigError(f"population must be ≥ 0, got {population}")
    rate = check_sample_rate(sample_rate)
    draws = torch.rand(population, generator=generator, device=generator.device)
    return torch.nonzero(draws < rate).squeeze(1)


class PoissonSampler:
    """Iterable of ``steps`` independent Poisson samples of ``range(population)``.

    ``len(sampler) == steps`` and ``sampler.expected_size == population * sample_rate``,
    the denominator DP-SGD divides by.
    """

    def __init__(
        self, population: int, sample_rate: float, steps: int, generator: torch.Generator
    ) -> None:
        if steps < 0:
            raise PrivacyConfigError(f"steps must be ≥ 0, got {steps}")
        if population < 0:
            raise PrivacyConfigError(f"population must be ≥ 0, got {population}")
        self.population = population
        self.sample_rate = check_sample_rate(sample_rate)
        self.steps = steps
        self.generator = generator

    @property
    def expected_size(self) -> float:
        return self.population * self.sample_rate

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[torch.Tensor]:
        for _ in range(self.steps):
            yield poisson_sample(self.population, self.sample_rate, self.generator)
