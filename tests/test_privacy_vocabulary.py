"""Privacy's vocabulary (`sharefl.privacy.vocabulary`) is the one list of the names a
configuration may choose: each registry of classes covers exactly those names, the
simulator's ``[privacy]`` table refuses any other before torch loads, and the module
itself imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest

from sharefl.privacy import accountant, client_budget, distributed_accounting, vocabulary
from sharefl.privacy.schedules import SCHEDULE_CLASSES, NoiseSchedule
from sharefl.simulator.config import PrivacyConfig, SimulationConfigError


def test_every_schedule_name_builds_its_class_and_no_other_name_does():
    assert tuple(SCHEDULE_CLASSES) == vocabulary.SCHEDULES
    assert all(issubclass(c, NoiseSchedule) for c in SCHEDULE_CLASSES.values())


def test_the_privacy_modules_use_the_vocabularys_words():
    assert accountant.Backend is vocabulary.Backend
    assert accountant.Conversion is vocabulary.Conversion
    assert distributed_accounting.Conversion is vocabulary.Conversion
    assert client_budget.Level is vocabulary.Level
    assert get_args(vocabulary.Level) == vocabulary.LEVELS


@pytest.mark.parametrize(
    ("key", "word"),
    [
        ("schedule", "cosine"),
        ("clipping", "median"),
        ("level", "user"),
        ("noise_split", "clients"),
        ("distributed", "laplace"),
        ("rotation", "dct"),
        ("accountant", "gdp"),
    ],
)
def test_the_privacy_table_refuses_a_word_outside_the_vocabulary_naming_the_key(key, word):
    with pytest.raises(SimulationConfigError, match=f"privacy.{key}"):
        PrivacyConfig(**{key: word})


@pytest.mark.parametrize("name", vocabulary.SCHEDULES)
def test_the_privacy_table_takes_every_schedule_name(name):
    assert PrivacyConfig(schedule=name).schedule == name


def test_the_vocabulary_imports_neither_numpy_nor_torch():
    code = (
        "import sys; import sharefl.privacy.vocabulary; "
        "print(sorted({'numpy', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
