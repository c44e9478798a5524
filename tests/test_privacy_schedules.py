"""Noise schedules σ_t (seed003's decay policies) and Poisson sampling."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from sharefl.privacy import (
    ConstantSchedule,
    CyclicSchedule,
    ExponentialSchedule,
    LinearSchedule,
    PoissonSampler,
    PrivacyConfigError,
    StaircaseSchedule,
    poisson_sample,
)
from sharefl.privacy.errors import ScheduleError


def test_constant():
    assert ConstantSchedule(6.0).values(3) == [6.0, 6.0, 6.0]


def test_seed003_code_constants_reach_4_85_after_100_rounds():
    """Seed003's code: 15 → 4.85 over T = 100 rounds."""
    assert LinearSchedule(15.0, 0.006767)(100) == pytest.approx(4.85, abs=1e-3)
    assert StaircaseSchedule(15.0, 1.015 / 15, period=10)(100) == pytest.approx(4.85, abs=1e-3)
    assert ExponentialSchedule(math.exp(2.71), 0.0113)(100) == pytest.approx(4.85, abs=0.01)
    assert StaircaseSchedule(15.0, 0.0677, period=10).values(12)[9:] == pytest.approx(
        [15.0, 15 * (1 - 0.0677), 15 * (1 - 0.0677)]
    )


def test_every_policy_starts_at_sigma0_and_decreases():
    schedules = [
        LinearSchedule(15.0, 0.006767),
        StaircaseSchedule(15.0, 0.0677, period=10),
        ExponentialSchedule(15.0, 0.0113),
        CyclicSchedule(15.0, period=100, floor=4.85),
    ]
    for schedule in schedules:
        values = schedule.values(100)
        assert values[0] == 15.0
        assert all(b <= a for a, b in itertools.pairwise(values))


def test_cyclic_restarts_and_respects_its_floor():
    schedule = CyclicSchedule.from_cycles(15.0, total=100, cycles=4, floor=2.0)
    assert schedule.period == 25
    values = schedule.values(100)
    assert values[0] == values[25] == values[50] == 15.0
    assert values[12] == pytest.approx(7.5 * (math.cos(math.pi * 12 / 25) + 1))
    assert min(values) == 2.0  # the cosine goes below 2 near the end of each cycle
    with pytest.raises(ScheduleError, match="floor"):
        CyclicSchedule(15.0, period=10, floor=0.0)


def test_floor_and_no_noise_errors():
    assert LinearSchedule(10.0, 0.1, floor=0.5)(20) == 0.5
    with pytest.raises(ScheduleError, match="positive floor"):
        LinearSchedule(10.0, 0.1)(10)
    with pytest.raises(ScheduleError):
        ConstantSchedule(1.0)(-1)
    with pytest.raises(ScheduleError):
        ExponentialSchedule(-1.0, 0.1)
    with pytest.raises(ScheduleError):
        StaircaseSchedule(1.0, 0.1, period=0)
    with pytest.raises(PrivacyConfigError):  # ScheduleError is a PrivacyConfigError
        ConstantSchedule(float("nan"))


def test_poisson_sample_rate_and_reproducibility():
    gen = torch.Generator().manual_seed(0)
    n, q, steps = 1000, 0.05, 200
    sizes = [len(idx) for idx in PoissonSampler(n, q, steps, gen)]
    mean = sum(sizes) / steps
    assert abs(mean - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)
    a = poisson_sample(50, 0.3, torch.Generator().manual_seed(4))
    b = poisson_sample(50, 0.3, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and a.dtype == torch.int64
    assert torch.all(a[1:] > a[:-1]) and (len(a) == 0 or (int(a[0]) >= 0 and int(a[-1]) < 50))


def test_poisson_sample_can_be_empty_and_validates():
    gen = torch.Generator().manual_seed(1)
    empties = sum(len(poisson_sample(10, 0.05, gen)) == 0 for _ in range(100))
    assert empties > 30  # (0.95)^10 ≈ 0.60
    assert len(poisson_sample(10, 0.0, gen)) == 0 and len(poisson_sample(10, 1.0, gen)) == 10
    assert len(poisson_sample(0, 0.5, gen)) == 0
    sampler = PoissonSampler(3000, 16 / 3000, 5, gen)
    assert len(sampler) == 5 and sampler.expected_size == pytest.approx(16.0)
    with pytest.raises(PrivacyConfigError, match=r"\[0, 1\]"):
        poisson_sample(10, 1.1, gen)
    with pytest.raises(PrivacyConfigError):
        poisson_sample(-1, 0.5, gen)
